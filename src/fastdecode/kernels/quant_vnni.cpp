// quant_kernel.h compiled for AVX-512 VNNI (dpbusd, 512-bit tiles holding two
// weight rows per register); see quant_avx2.cpp. No torch headers.
#include <immintrin.h>
#include <algorithm>
#include <cstdint>

#include "kernels.h"

namespace fd_vnni {
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")
#define FD_VNNI 1
#include "quant_kernel.h"
#undef FD_VNNI
#pragma GCC pop_options
}  // namespace fd_vnni

namespace {

template <bool Q4, typename S>
void rows_as(fd::Tiles tiles, const fd::QuantArgs& a, int64_t n0, int64_t n1) {
  const S* d = static_cast<const S*>(a.d);
  const S* mn = static_cast<const S*>(a.mn);
  // One activation row (batch-1 decode) streams the weights best on 256-bit
  // tiles; their float operations are the 512-bit tiles' (the same results).
  if (tiles == fd::kTiles4x1Narrow)
    fd_vnni::rows<Q4, S, 4, 1, false>(a.w, a.ws, d, mn, a.nb, n0, n1, a.xq, a.xd, a.xs, a.M, a.K, a.y, a.N);
  else if (tiles == fd::kTiles8x2)
    fd_vnni::rows<Q4, S, 8, 2>(a.w, a.ws, d, mn, a.nb, n0, n1, a.xq, a.xd, a.xs, a.M, a.K, a.y, a.N);
  else
    fd_vnni::rows<Q4, S, 4, 8>(a.w, a.ws, d, mn, a.nb, n0, n1, a.xq, a.xd, a.xs, a.M, a.K, a.y, a.N);
}

}  // namespace

void fd::vnni::quantize_rows(const float* x, int64_t M, int64_t K, int8_t* q, float* d, float* s) {
  fd_vnni::quantize_rows(x, M, K, q, d, s);
}

void fd::vnni::rows(bool q4, bool half, Tiles tiles, const QuantArgs& a, int64_t n0, int64_t n1) {
  if (q4 && half) rows_as<true, uint16_t>(tiles, a, n0, n1);
  else if (q4) rows_as<true, float>(tiles, a, n0, n1);
  else if (half) rows_as<false, uint16_t>(tiles, a, n0, n1);
  else rows_as<false, float>(tiles, a, n0, n1);
}

// The K-quant layouts on 256-bit tiles: 4 weight rows x 1 activation row (decode) or x 4.
void fd::vnni::krows(KLayout layout, bool narrow, const KQuantArgs& a, int64_t n0, int64_t n1) {
  if (narrow) {
    if (layout == kQ4K) fd_vnni::krows<kQ4K, 4, 1>(a, n0, n1);
    else if (layout == kQ5K) fd_vnni::krows<kQ5K, 4, 1>(a, n0, n1);
    else if (layout == kQ6K) fd_vnni::krows<kQ6K, 4, 1>(a, n0, n1);
    else if (layout == kQ5) fd_vnni::krows<kQ5, 4, 1>(a, n0, n1);
    else fd_vnni::krows<kQ5S, 4, 1>(a, n0, n1);
  } else {
    if (layout == kQ4K) fd_vnni::krows<kQ4K, 4, 4>(a, n0, n1);
    else if (layout == kQ5K) fd_vnni::krows<kQ5K, 4, 4>(a, n0, n1);
    else if (layout == kQ6K) fd_vnni::krows<kQ6K, 4, 4>(a, n0, n1);
    else if (layout == kQ5) fd_vnni::krows<kQ5, 4, 4>(a, n0, n1);
    else fd_vnni::krows<kQ5S, 4, 4>(a, n0, n1);
  }
}
