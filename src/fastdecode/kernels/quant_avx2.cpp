// quant_kernel.h compiled for AVX2 (maddubs, 16 registers); quant_vnni.cpp compiles
// the same body for AVX-512 VNNI. No torch headers: ops.cpp calls in through kernels.h.
#include <immintrin.h>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels.h"

namespace fd_avx2 {
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#define FD_VNNI 0
#include "quant_kernel.h"
#include "quant_panel.h"
#include "quant_dispatch.h"
#undef FD_VNNI
#pragma GCC pop_options
}  // namespace fd_avx2

void fd::avx2::quantize_rows(const float* x, int64_t M, int64_t K, bool per256, int8_t* q, int64_t qrow,
                                 int64_t qgroup, float* d, float* s, int32_t* sums) {
  fd_avx2::quantize_rows(x, M, K, per256, q, qrow, qgroup, d, s, sums);
}

void fd::avx2::rows(const QuantArgs& a, int64_t n0, int64_t n1) { fd_avx2::dispatch(a, n0, n1); }
