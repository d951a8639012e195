#!/usr/bin/env bash
# alternate base (704b65c) and HEAD servers, VNNI/AMX path, 1 and 16 clients
set -euo pipefail
cd /work/main
out=/tmp/ab24/final
for r in 1 2 3; do
  for tree in base new; do
    if [ $tree = base ]; then src=/tmp/ab24/base/src cache=/tmp/ab24/out/cache-base-vnni ind=/tmp/ab24/out/inductor-base-vnni
    else src=/work/main/src cache=/tmp/fdc_x ind=/tmp/ab24/out/inductor-final; fi
    FASTDECODE="env FASTDECODE_CACHE=$cache TORCHINDUCTOR_CACHE_DIR=$ind PYTHONPATH=$src /work/main/.venv/bin/python -m fastdecode" \
      PYTHON=.venv/bin/python benchmarks/serve/run.sh fastdecode load "$out/$tree-vnni-$r.json" --clients 1 16 --rounds 4 --ignore-eos
    sleep 3
  done
done
