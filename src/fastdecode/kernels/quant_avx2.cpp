// quant_kernel.h compiled for AVX2 (maddubs, 256-bit tiles); quant_vnni.cpp
// compiles the same body for AVX-512 VNNI. No torch headers: ops.cpp calls in
// through kernels.h.
#include <immintrin.h>
#include <algorithm>
#include <cstdint>

#include "kernels.h"

namespace fd_avx2 {
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#define FD_VNNI 0
#include "quant_kernel.h"
#undef FD_VNNI
#pragma GCC pop_options
}  // namespace fd_avx2

namespace {

template <bool Q4, typename S>
void rows_as(fd::Tiles tiles, const fd::QuantArgs& a, int64_t n0, int64_t n1) {
  const S* d = static_cast<const S*>(a.d);
  const S* mn = static_cast<const S*>(a.mn);
  (void)tiles;  // one shape on this path: 4 weight rows x 2 activation rows
  fd_avx2::rows<Q4, S, 4, 2>(a.w, a.ws, d, mn, a.nb, n0, n1, a.xq, a.xd, a.xs, a.M, a.K, a.y, a.N);
}

}  // namespace

void fd::avx2::quantize_rows(const float* x, int64_t M, int64_t K, int8_t* q, float* d, float* s) {
  fd_avx2::quantize_rows(x, M, K, q, d, s);
}

void fd::avx2::rows(bool q4, bool half, Tiles tiles, const QuantArgs& a, int64_t n0, int64_t n1) {
  if (q4 && half) rows_as<true, uint16_t>(tiles, a, n0, n1);
  else if (q4) rows_as<true, float>(tiles, a, n0, n1);
  else if (half) rows_as<false, uint16_t>(tiles, a, n0, n1);
  else rows_as<false, float>(tiles, a, n0, n1);
}

void fd::avx2::krows(KLayout layout, const KQuantArgs& a, int64_t n0, int64_t n1) {
  if (layout == kQ4K) fd_avx2::krows<kQ4K, 4, 2>(a, n0, n1);
  else if (layout == kQ5K) fd_avx2::krows<kQ5K, 4, 2>(a, n0, n1);
  else if (layout == kQ6K) fd_avx2::krows<kQ6K, 2, 2>(a, n0, n1);  // 4 rows of q6k spill 16 registers
  else if (layout == kQ5) fd_avx2::krows<kQ5, 4, 2>(a, n0, n1);
  else fd_avx2::krows<kQ5S, 4, 2>(a, n0, n1);
}
