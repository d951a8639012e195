#!/usr/bin/env bash
# A base tree's server and this checkout's, VNNI/AMX path, 1 and 16 clients, three alternating
# rounds (the "server after both" table in ../README.md; run there with BASE_SRC a `git archive`
# copy of 704b65c and each tree's package already exported into its cache):
#
#   benchmarks/serve/mixed/final_ab.sh BASE_SRC BASE_CACHE NEW_CACHE OUTDIR
set -euo pipefail
base_src=$1 base_cache=$2 new_cache=$3 out=$4
here=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$here"
mkdir -p "$out"
for r in 1 2 3; do
  for tree in base new; do
    if [ $tree = base ]; then src=$base_src cache=$base_cache; else src=$here/src cache=$new_cache; fi
    FASTDECODE="env FASTDECODE_CACHE=$cache PYTHONPATH=$src $here/.venv/bin/python -m fastdecode" \
      PYTHON=.venv/bin/python benchmarks/serve/run.sh fastdecode load "$out/$tree-vnni-$r.json" --clients 1 16 --rounds 4 --ignore-eos
    sleep 3
  done
done
