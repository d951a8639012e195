#!/bin/bash
# Sampled-request server A/B (temperature 1.0): two source trees, alternating rounds.
#   mkdir -p /tmp/head_src /tmp/new_src
#   git archive 874867b src | tar -x -C /tmp/head_src; git archive b196779 src | tar -x -C /tmp/new_src
#   benchmarks/serve/sampled/ab.sh        (results in /tmp/sab/{base,new}-{warm,1,2}.json)
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
