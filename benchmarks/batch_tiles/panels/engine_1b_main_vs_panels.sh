#!/usr/bin/env bash
# Two source trees on the 1B files, alternating: B = 1 and B = 8 decode (decode_batch.py, the
# compiled package) and a 512-token prefill (real_sizes_zen4/prefill.py). Convert and export
# each tree's package for each file first (one decode_batch.py run, then wait for the export).
#
#   bash engine_1b_main_vs_panels.sh BASE_SRC NEW_SRC MODEL_DIR CACHE [FILE ...]
#
# FILE: a model file's name without .gguf (default llama-1b-Q4_0 llama-1b-Q8_0). BASE_CACHE, if
# set, is the base tree's cache (CACHE then the new tree's).
cd "$(dirname "$0")/../../.."
base=$1 new=$2 models=$3 cache=$4
shift 4
files=${*:-llama-1b-Q4_0 llama-1b-Q8_0}
for r in 1 2; do for f in $files; do for tree in base new; do
  src=$base c=${BASE_CACHE:-$cache}; [ $tree = new ] && src=$new c=$cache
  echo "== $f $tree round $r $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
  echo "B=1: $(FASTDECODE_CACHE=$c PYTHONPATH=$src .venv/bin/python benchmarks/batch_tiles/decode_batch.py $models/$f.gguf 1 3 2>&1 | tail -1)"
  echo "B=8: $(FASTDECODE_CACHE=$c PYTHONPATH=$src .venv/bin/python benchmarks/batch_tiles/decode_batch.py $models/$f.gguf 8 2 2>&1 | tail -1)"
  echo "prefill: $(FASTDECODE_CACHE=$c PYTHONPATH=$src .venv/bin/python benchmarks/real_sizes_zen4/prefill.py $models/$f.gguf 512 3 2>&1 | tail -1)"
done; done; done
