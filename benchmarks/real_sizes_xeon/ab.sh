cd /work/main
for m in Q4_K_M Q4_0; do
  f=/work/models/llama-1b-$m.gguf
  for r in 1 2; do
    echo "== $m round $r $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
    echo "ours B=1: $(FASTDECODE_CACHE=/tmp/fdd_new PYTHONPATH=src .venv/bin/python benchmarks/batch_tiles/decode_batch.py $f 1 3 2>&1 | tail -1)"
    echo "llama-bench native tg64: $(/work/tools/bin/llama-bench -m $f -p 0 -n 64 -t 2 -r 3 -o csv 2>/dev/null | tail -1 | awk -F, '{print $(NF-1)}')"
    echo "llama-bench no-AMX tg64: $(/work/tools/bin/noamx/llama-bench -m $f -p 0 -n 64 -t 2 -r 3 -o csv 2>/dev/null | tail -1 | awk -F, '{print $(NF-1)}')"
    echo "ours B=8: $(FASTDECODE_CACHE=/tmp/fdd_new PYTHONPATH=src .venv/bin/python benchmarks/batch_tiles/decode_batch.py $f 8 2 2>&1 | tail -1)"
    echo "llama-batched-bench no-AMX B=8:"; /work/tools/bin/noamx/llama-batched-bench -m $f -c 1024 -b 512 -ub 512 -npp 32 -ntg 64 -npl 8 -t 2 -fa on 2>/dev/null | grep "^|"
  done
done
