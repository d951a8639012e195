#!/usr/bin/env bash
# Batch-1 decode, ours and llama-bench tg64 alternating, ROUNDS rounds per file (real_sizes_zen5.md):
#   LLAMA=/work/build/b/bin CACHE=/tmp/fdc_z5 ROUNDS=5 bash benchmarks/real_sizes_zen5/b1_rounds.sh MODEL.gguf ...
cd "$(dirname "$0")/../.."
LLAMA=${LLAMA:-/work/build/b/bin}
export FASTDECODE_CACHE=${CACHE:-${FASTDECODE_CACHE:-$HOME/.cache/fastdecode}}
for f in "$@"; do
  for r in $(seq "${ROUNDS:-5}"); do
    ours=$(PYTHONPATH=src .venv/bin/python benchmarks/batch_tiles/decode_batch.py "$f" 1 3 2>&1 | tail -1 | awk '{print $2}')
    theirs=$("$LLAMA/llama-bench" -m "$f" -p 0 -n 64 -t 2 -r 3 -o csv 2>/dev/null | tail -1 | awk -F, '{print $(NF-1)}' | tr -d '"')
    echo "$(basename "$f") round $r $(date +%T) load $(cut -d' ' -f1 /proc/loadavg): ours $ours llama.cpp $theirs ratio $(python3 -c "print(round($ours / $theirs, 2))")"
  done
done
