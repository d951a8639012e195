// quant_kernel.h compiled for AVX-512 VNNI (vpdpbusd on 256-bit registers, 32 of them);
// see quant_avx2.cpp. No torch headers.
#include <immintrin.h>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels.h"

namespace fd_vnni {
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,amx-tile,amx-int8")
#define FD_VNNI 1
#include "quant_kernel.h"
#include "quant_panel.h"
#include "quant_dispatch.h"
#undef FD_VNNI
#pragma GCC pop_options
}  // namespace fd_vnni

void fd::vnni::quantize_rows(const float* x, int64_t M, int64_t K, bool per256, int8_t* q, int64_t qrow,
                                 int64_t qgroup, float* d, float* s, int32_t* sums) {
  fd_vnni::quantize_rows(x, M, K, per256, q, qrow, qgroup, d, s, sums);
}

void fd::vnni::rows(const QuantArgs& a, int64_t n0, int64_t n1) { fd_vnni::dispatch(a, n0, n1); }
