#!/usr/bin/env bash
# Two source trees, one quantized matmul each, alternating (two rounds), two threads, weights
# rotated over COPIES copies (8 streams a 1B shape from DRAM):
#
#   BASE_CACHE=... NEW_CACHE=... bash ops_ab.sh BASE_SRC NEW_SRC COPIES "TYPE MxNxK" ...
#
# ISA=avx2 with ATEN_CPU_CAPABILITY=avx2 runs the AVX2 kernels.
cd "$(dirname "$0")/../../.."
base=$1 new=$2 copies=$3
shift 3
for c in "$@"; do for r in 1 2; do for tree in base new; do
  src=$base cache=$BASE_CACHE; [ $tree = new ] && src=$new cache=$NEW_CACHE
  echo "$tree $(FASTDECODE_CACHE=$cache THREADS=2 .venv/bin/python benchmarks/batch_tiles/linear_rate.py $src $c $copies 2.5 2>&1 | tail -1)"
done; done; done
