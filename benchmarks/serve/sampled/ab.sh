#!/bin/bash
# sampled server A/B: 874867b (/tmp/head_src) against HEAD's src (/tmp/new_src), temperature 1.0
cd /work/main
out=/tmp/sab; mkdir -p $out
run() {  # tree tag
  local src=/tmp/head_src/src; [ "$1" = new ] && src=/tmp/new_src/src
  FASTDECODE="env FASTDECODE_CACHE=$out/cache-$1 TORCHINDUCTOR_CACHE_DIR=$out/inductor-$1 PYTHONPATH=$src /work/main/.venv/bin/python -m fastdecode" \
    PYTHON=.venv/bin/python benchmarks/serve/run.sh fastdecode load "$out/$1-$2.json" --clients 1 16 --rounds 2 --ignore-eos --temperature 1.0
}
idle() { while pgrep -f export_job >/dev/null; do sleep 5; done; sleep 3; }
for tree in base new; do run $tree warm; idle; done
for r in 1 2; do for tree in base new; do idle; run $tree $r; done; done
