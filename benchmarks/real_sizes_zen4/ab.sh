#!/usr/bin/env bash
# Issue 23's files against llama.cpp on an AMD EPYC Zen 4, each figure twice, alternating:
# ours B=1 and llama-bench tg64; ours B=8 and llama-batched-bench B=8; our 512-token prefill and
# llama-bench pp512. LLAMA: the folder with llama.cpp's binaries; BATCHED: the folder whose
# binaries run the multi-token batches, llama-batched-bench and pp512 (default LLAMA; on AMX
# Xeons a build without AMX: the native one segfaults on any multi-token batch there,
# benchmarks/real_sizes_xeon.md); CACHE: fastdecode's cache.
#
#   LLAMA=/work/build/b/bin bash benchmarks/real_sizes_zen4/ab.sh /work/models/llama-1b-Q4_K_M.gguf ...
cd "$(dirname "$0")/../.."
LLAMA=${LLAMA:-/work/build/b/bin}
BATCHED=${BATCHED:-$LLAMA}
export FASTDECODE_CACHE=${CACHE:-${FASTDECODE_CACHE:-$HOME/.cache/fastdecode}}
py() { PYTHONPATH=src .venv/bin/python "$@" 2>&1 | tail -1; }
for f in "$@"; do
  for r in 1 2; do
    echo "== $(basename "$f") round $r $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
    echo "ours B=1: $(py benchmarks/batch_tiles/decode_batch.py "$f" 1 3)"
    echo "llama-bench tg64: $("$LLAMA/llama-bench" -m "$f" -p 0 -n 64 -t 2 -r 3 -o csv 2>/dev/null | tail -1 | awk -F, '{print $(NF-1)}')"
    echo "ours B=8: $(py benchmarks/batch_tiles/decode_batch.py "$f" 8 2)"
    echo "llama-batched-bench B=8:"; "$BATCHED/llama-batched-bench" -m "$f" -c 1024 -b 512 -ub 512 -npp 32 -ntg 64 -npl 8 -t 2 -fa on 2>/dev/null | grep "^|"
    echo "ours prefill 512: $(py benchmarks/real_sizes_zen4/prefill.py "$f" 512 3)"
    echo "llama-bench pp512: $("$BATCHED/llama-bench" -m "$f" -p 512 -n 0 -t 2 -r 3 -o csv 2>/dev/null | tail -1 | awk -F, '{print $(NF-1)}')"
  done
done
