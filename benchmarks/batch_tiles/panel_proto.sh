#!/usr/bin/env bash
# Builds and runs panel_proto.cpp against the kernel headers at HEAD (see that file).
#
#   THREADS=2 COPIES=12 benchmarks/batch_tiles/panel_proto.sh -- M N K [ROUNDS]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
[ "${1:-}" = -- ] && shift
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
kernels=src/fastdecode/kernels
for f in quant_kernel.h quant_dispatch.h simd.h; do git -C "$root" show "HEAD:$kernels/$f" > "$tmp/$f"; done
c++ ${CXXFLAGS_EXTRA:-} -DAB_AVX2=$([ "${ISA:-vnni}" = avx2 ] && echo 1 || echo 0) -O3 -std=c++20 -mavx2 -mfma -mf16c -fopenmp -ffp-contract=off -I"$root/$kernels" \
  -DQK_A_KERNEL="\"$tmp/quant_kernel.h\"" -DQK_A_DISPATCH="\"$tmp/quant_dispatch.h\"" \
  "$root/benchmarks/batch_tiles/panel_proto.cpp" -o "$tmp/panel_proto"
"$tmp/panel_proto" "$@"
