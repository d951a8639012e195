#!/usr/bin/env bash
# Issue 24's check that the package move and the construction changes cost nothing: default
# decode (`fastdecode bench`, static mode, batch 1), the engine at N=8 (`bench-engine`) and the
# serve load (benchmarks/serve_load.py at 1 and 8 clients), for an old commit and this tree,
# interleaved (old, new, old, new) in one run, all eager (FASTDECODE_NO_PACKAGE=1: a package
# is per commit and would be exported in between).
#
#   benchmarks/architecture/rerun.sh OLD_COMMIT OUT_DIR
set -euo pipefail
old=$1 out=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
py=$root/.venv/bin/python
mkdir -p "$out"
tree=$(mktemp -d)
git -C "$root" archive "$old" | tar -x -C "$tree"
trap 'rm -rf "$tree"' EXIT
export FASTDECODE_NO_PACKAGE=1
for round in 1 2; do
  for side in old new; do
    if [ "$side" = old ]; then export PYTHONPATH=$tree/src; else export PYTHONPATH=$root/src; fi
    echo "== $side ($([ "$side" = old ] && echo "$old" || git -C "$root" rev-parse --short HEAD)) round $round; uptime:$(uptime)"
    "$py" -m fastdecode bench modes=static peers= batch_sizes=1 new_tokens=64 prompt_lengths=32 runs=5 \
      out="$out/bench-$side-$round" | grep -E "^fastdecode +static"
    "$py" -m fastdecode bench-engine concurrency=8 rounds=2 long_prompt=0 compiled=none \
      out="$out/engine-$side-$round.json" | grep -E "^ *8 " || true
    FASTDECODE="$py -m fastdecode" PYTHON=$py "$root/benchmarks/serve/run.sh" fastdecode load \
      "$out/serve-$side-$round.json" --clients 1 8 --rounds 2 --ignore-eos | tail -3
  done
done
