#!/bin/bash
# Run from the kernels checkout; main at /work/main. Caches are per tree (the conversion key did not include LAYOUT_VERSION when this ran).
export FASTDECODE_NO_PACKAGE=1
lscpu | grep "Model name"; date +%T
for f in llama-1b-Q4_K_M llama-1b-Q4_0 llama-3b-Q4_K_M; do
  F=/work/models/$f.gguf
  for e in main kernels llama.cpp; do
    cache=/tmp/fd-cache-main; src=/work/main/src
    [ $e = kernels ] && { cache=/tmp/fd-cache-kernels; src=/work/wt-kernels/src; }
    FASTDECODE_CACHE=$cache PYTHONPATH=$src timeout 400 nice -n 10 /work/main/.venv/bin/python benchmarks/decode_steps.py $e $F 2>&1 | tail -1
  done
done
date +%T; echo STEPSDONE
