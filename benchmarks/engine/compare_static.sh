#!/bin/bash
# same-run comparison: the old static-batch loop (5b17c64) against the engine, default mode (package), greedy
cd /work/main
ARGS="modes=default peers= batch_sizes=1 batch_sizes=4 batch_sizes=8 new_tokens=128 prompt_lengths=32 runs=3 plots=false"
for round in 1 2; do
  PYTHONPATH=/tmp/oldtree/src .venv/bin/python -m fastdecode bench $ARGS out=/tmp/cmp/old$round > /tmp/cmp/old$round.log 2>&1
  .venv/bin/python -m fastdecode bench $ARGS out=/tmp/cmp/new$round > /tmp/cmp/new$round.log 2>&1
done
