#!/usr/bin/env bash
# A cold load while another process's background export runs (benchmarks/load_time.md).
#
#   benchmarks/load_beside_export.sh SRC BG_MODEL MODEL KERNELS
#
# Runs `fastdecode generate` on BG_MODEL in an empty cache, so that a background export of its
# package starts when that process exits; then times, with SRC's fastdecode (a src folder), a
# load of MODEL into another empty cache; then stops the export. KERNELS: a cache's built
# kernels folder, linked into both caches so that nothing is compiled.
set -u
src=$1 bg_model=$2 model=$3 kernels=$4
root=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-$root/.venv/bin/python}
bg=$(mktemp -d) me=$(mktemp -d)
trap 'pkill -f "fastdecode.cli.export import export_job"; rm -rf "$bg" "$me"' EXIT
ln -s "$kernels" "$bg/kernels"
ln -s "$kernels" "$me/kernels"
FASTDECODE_CACHE=$bg PYTHONPATH=$root/src "$py" -m fastdecode generate model="$bg_model" max_new_tokens=2 "Hi" >/dev/null 2>&1
sleep 6  # the exporter sees its parent gone, loads the model and starts exporting
pgrep -f "fastdecode.cli.export import export_job" >/dev/null && echo "background export: running" \
  || echo "background export: not running"
FASTDECODE_CACHE=$me PYTHONPATH=$src "$py" -c "
import sys, time
t = time.perf_counter()
import fastdecode
fastdecode.load(sys.argv[1], compiled=None)
print(f'cold load, imports included: {time.perf_counter() - t:.2f} s')
" "$model"
