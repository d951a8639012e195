#!/usr/bin/env bash
# Two trees' steps.py alternating, ROUNDS rounds, each tree with its own cache (its package exported
# beforehand by `fastdecode export`, so no background export runs beside a measurement):
#   BASE=/tmp/base/src NEW=src MODEL=smollm2-135m-instruct ROUNDS=3 bash benchmarks/serial_loops/ab.sh
cd "$(dirname "$0")/../.."
MODEL=${MODEL:-smollm2-135m-instruct}
for tree in base new; do
  src=$([ $tree = base ] && echo "$BASE" || echo "${NEW:-src}")
  FASTDECODE_CACHE=/tmp/serial_loops_$tree PYTHONPATH=$src .venv/bin/python -m fastdecode export model="$MODEL" 2>&1 | tail -1
done
for r in $(seq "${ROUNDS:-3}"); do
  for tree in base new; do
    src=$([ $tree = base ] && echo "$BASE" || echo "${NEW:-src}")
    echo "$tree round $r $(date +%T) load $(cut -d' ' -f1 /proc/loadavg): $(FASTDECODE_CACHE=/tmp/serial_loops_$tree \
      PYTHONPATH=$src .venv/bin/python benchmarks/serial_loops/steps.py "$MODEL" 2>&1 | tail -1)"
  done
done
