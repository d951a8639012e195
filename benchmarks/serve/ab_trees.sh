#!/usr/bin/env bash
# Two source trees' `fastdecode serve`, on both kernel paths of this CPU (the AVX-512 one, and the
# AVX2 proxy: ATEN_CPU_CAPABILITY=avx2 FASTDECODE_ISA=avx2), 1 and 16 streaming clients, in
# alternating rounds. Each tree and path has its own conversion cache and package: a first,
# unmeasured round exports the packages (named *-warm.json), and every run waits until no
# background export is running.
#
#   benchmarks/serve/ab_trees.sh BASE_SRC NEW_SRC OUTDIR [ROUNDS]
#
# BASE_SRC and NEW_SRC are `src` folders (e.g. of `git archive` copies). Results:
# OUTDIR/{base,new}-{vnni,avx2}-{warm,1..ROUNDS}.json, as run.sh writes them.
set -euo pipefail
base=$1 new=$2 out=$3 rounds=${4:-2}
here=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$out"
cd "$here"
run() {  # tree path tag
  local src=$base; [ "$1" = new ] && src=$new
  local env=""; [ "$2" = avx2 ] && env="ATEN_CPU_CAPABILITY=avx2 FASTDECODE_ISA=avx2"
  FASTDECODE="env $env FASTDECODE_CACHE=$out/cache-$1-$2 TORCHINDUCTOR_CACHE_DIR=$out/inductor-$1-$2 PYTHONPATH=$src $here/.venv/bin/python -m fastdecode" \
    PYTHON=.venv/bin/python benchmarks/serve/run.sh fastdecode load "$out/$1-$2-$3.json" --clients 1 16 --rounds 4 --ignore-eos
}
idle() { while pgrep -f export_job >/dev/null; do sleep 5; done; sleep 3; }
for tree in base new; do for path in vnni avx2; do run $tree $path warm; idle; done; done
for r in $(seq "$rounds"); do for tree in base new; do for path in vnni avx2; do idle; run $tree $path "$r"; done; done; done
