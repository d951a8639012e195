#!/usr/bin/env bash
# A/B of the packed matmul tiles: the kernel headers at REV (A) against the working tree's (B).
#
#   benchmarks/batch_tiles/tile_ab.sh REV [avx2] -- M N K [LAYOUT [ROUNDS]]
#   COPIES=100 benchmarks/batch_tiles/tile_ab.sh HEAD -- 16 3072 576 0 150
#
# Builds with the flags of the kernels' own build (fastdecode/kernels/__init__.py), without torch;
# CXXFLAGS_EXTRA adds flags (say -DNAME for a variant behind #ifdef NAME in the working tree).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
rev=$1; shift
isa=vnni
if [ "${1:-}" = avx2 ]; then isa=avx2; shift; fi
[ "${1:-}" = -- ] && shift
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
kernels=src/fastdecode/kernels
mkdir "$tmp/a"
# (kernels.h, with QuantArgs, is the working tree's for both)
for f in quant_kernel.h quant_dispatch.h simd.h; do git -C "$root" show "$rev:$kernels/$f" > "$tmp/a/$f"; done
c++ ${CXXFLAGS_EXTRA:-} -O3 -std=c++20 -mavx2 -mfma -mf16c -fopenmp -ffp-contract=off -I"$root/$kernels" \
  -DAB_AVX2=$([ $isa = avx2 ] && echo 1 || echo 0) \
  -DQK_A_KERNEL="\"$tmp/a/quant_kernel.h\"" -DQK_A_DISPATCH="\"$tmp/a/quant_dispatch.h\"" \
  -DQK_B_KERNEL="\"$root/$kernels/quant_kernel.h\"" -DQK_B_DISPATCH="\"$root/$kernels/quant_dispatch.h\"" \
  "$root/benchmarks/batch_tiles/tile_ab.cpp" -o "$tmp/tile_ab"
"$tmp/tile_ab" "$@"
