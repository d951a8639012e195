// Block-quantized matmul body, included once per instruction set by quant.cpp
// inside a `#pragma GCC target` region (FD_VNNI selects the int8 dot product).
//
// y[m, n] = sum_b (wd[n, b] * xd[m, b]) * isum(n, m, b)  [+ sum_b wm[n, b] * xs[m, b] for q4]
// where isum is the exact int32 dot product of block b (32 values) of weight
// row n and activation row m. Every (m, n) runs the same float operations in
// the same order whatever the tile shape, so a row's result does not depend
// on M, and the AVX2 and VNNI paths and the PyTorch twin in
// quant/reference.py give bit-identical results.

#include "simd.h"

// q4 blocks come in pairs: 32 bytes hold block 2p's values in their low
// nibbles and block 2p+1's in their high ones; an odd last block has 16 bytes,
// values j and j+16 in the low and high nibbles of byte j.
static inline __m256i q4_low(__m256i v) { return _mm256_and_si256(v, _mm256_set1_epi8(0x0F)); }
static inline __m256i q4_high(__m256i v) { return _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0F)); }

static inline __m256i q4_block(const uint8_t* row, int64_t b, int64_t nb) {
  if ((nb & 1) && b == nb - 1) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + b * 16));
    const __m128i m = _mm_set1_epi8(0x0F);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m), _mm_and_si128(v, m));
  }
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + (b & ~int64_t(1)) * 16));
  return (b & 1) ? q4_high(v) : q4_low(v);
}

static inline __m256i load32(const void* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// unsigned w x signed x, 4 bytes per int32 lane. maddubs cannot saturate here:
// |w| <= 128 and |x| <= 127, so a pair sums to at most 32512.
static inline __m256i dot_u8s8(__m256i w, __m256i x) {
#if FD_VNNI
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), w, x);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1));
#endif
}

static inline __m256i dot_s8s8(__m256i w, __m256i x) {
  return dot_u8s8(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
}

// Eight blocks' int32 lane vectors -> their eight exact block sums, block i in lane i.
static inline __m256i block_sums(const __m256i* s) {
  const __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3]));
  const __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(s[4], s[5]), _mm256_hadd_epi32(s[6], s[7]));
  return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}

static inline int32_t block_sum(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_hadd_epi32(s, s);
  return _mm_cvtsi128_si32(_mm_hadd_epi32(s, s));
}

template <typename S>
static inline float scale_at(const S* p);
template <>
inline float scale_at<float>(const float* p) { return *p; }
template <>
inline float scale_at<uint16_t>(const uint16_t* p) { return _cvtsh_ss(*p); }

template <typename S>
static inline __m256 scales8(const S* p);
template <>
inline __m256 scales8<float>(const float* p) { return _mm256_loadu_ps(p); }
template <>
inline __m256 scales8<uint16_t>(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// sum_b mn[b] * xs[b]: 8 blocks per step in lanes (b mod 8), the lanes' hsum, then the tail in order.
template <typename S>
static inline float min_term(const S* mn, const float* xs, int64_t nb) {
  __m256 a = _mm256_setzero_ps();
  int64_t b = 0;
  for (; b + 8 <= nb; b += 8) a = _mm256_add_ps(a, _mm256_mul_ps(scales8<S>(mn + b), _mm256_loadu_ps(xs + b)));
  float t = hsum(a);
  for (; b < nb; ++b) t = t + scale_at<S>(mn + b) * xs[b];
  return t;
}

// R weight rows x C activation rows. w points at row n's data (row stride ws
// bytes), d/mn at its scales/mins (stride nb); x at row m (stride K).
//
// Blocks go in groups of 8: their exact int32 sums land in one vector (block i
// in lane i), which is scaled by w_scale * x_scale and added to the lanes'
// float accumulator; the lanes are summed at the end, then the leftover
// blocks one by one, then (q4) the minimum term. The PyTorch twin in
// quant/reference.py repeats this order.
template <bool Q4, typename S, int R, int C>
static void tile(const uint8_t* w, int64_t ws, const S* d, const S* mn, int64_t nb,
                 const int8_t* xq, const float* xd, const float* xs, int64_t K,
                 float* y, int64_t ldy) {
  __m256 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  const int64_t full = nb / 8 * 8;
  for (int64_t b0 = 0; b0 < full; b0 += 8) {
    for (int r = 0; r < R; ++r) {
      const uint8_t* wr = w + r * ws;
      __m256i wv[8];
      if (Q4) {
        for (int i = 0; i < 4; ++i) {
          const __m256i v = load32(wr + (b0 + 2 * i) * 16);
          wv[2 * i] = q4_low(v);
          wv[2 * i + 1] = q4_high(v);
        }
      } else {
        for (int i = 0; i < 8; ++i) wv[i] = load32(wr + (b0 + i) * 32);
      }
      const __m256 dw = scales8<S>(d + r * nb + b0);
      for (int c = 0; c < C; ++c) {
        const int8_t* xc = xq + c * K + b0 * 32;
        __m256i sv[8];
        for (int i = 0; i < 8; ++i) sv[i] = Q4 ? dot_u8s8(wv[i], load32(xc + 32 * i)) : dot_s8s8(wv[i], load32(xc + 32 * i));
        const __m256 scale = _mm256_mul_ps(dw, _mm256_loadu_ps(xd + c * nb + b0));
        acc[r][c] = _mm256_add_ps(acc[r][c], _mm256_mul_ps(_mm256_cvtepi32_ps(block_sums(sv)), scale));
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    const uint8_t* wr = w + r * ws;
    for (int c = 0; c < C; ++c) {
      float s = hsum(acc[r][c]);
      for (int64_t b = full; b < nb; ++b) {
        const __m256i xv = load32(xq + c * K + b * 32);
        const int32_t isum = Q4 ? block_sum(dot_u8s8(q4_block(wr, b, nb), xv)) : block_sum(dot_s8s8(load32(wr + b * 32), xv));
        s = s + static_cast<float>(isum) * (scale_at<S>(d + r * nb + b) * xd[c * nb + b]);
      }
      if (Q4) s = s + min_term<S>(mn + r * nb, xs + c * nb, nb);  // block minimum x activation block sum
      y[c * ldy + r] = s;
    }
  }
}

// Rows [n0, n1) of y = x w^T for all M activation rows.
template <bool Q4, typename S, int CT>
static void rows(const uint8_t* w, int64_t ws, const S* d, const S* mn, int64_t nb, int64_t n0, int64_t n1,
                 const int8_t* xq, const float* xd, const float* xs, int64_t M, int64_t K, float* y, int64_t N) {
  constexpr int RT = 4;
  constexpr int64_t kAhead = 32;  // rows
  // Activation rows in panels that stay in L2 while the weight rows stream past.
  constexpr int64_t kPanel = 64;
  for (int64_t m0 = 0; m0 < M; m0 += kPanel) {
    const int64_t m1 = std::min(M, m0 + kPanel);
    for (int64_t n = n0; n < n1;) {
      const int r = n + RT <= n1 ? RT : 1;
      const uint8_t* wr = w + n * ws;
      const S* dr = d + n * nb;
      const S* mr = Q4 ? mn + n * nb : nullptr;
      // Decode streams each weight byte once from DRAM: ask for the rows a few
      // tiles ahead now, since a core's own prefetcher keeps too few misses in flight.
      if (m0 == 0 && n + kAhead + RT <= n1) {
        const char* p = reinterpret_cast<const char*>(wr + kAhead * ws);
        for (int64_t off = 0; off < RT * ws; off += 64) _mm_prefetch(p + off, _MM_HINT_T0);
        const char* ps = reinterpret_cast<const char*>(dr + kAhead * nb);
        for (int64_t off = 0; off < int64_t(RT * nb * sizeof(S)); off += 64) _mm_prefetch(ps + off, _MM_HINT_T0);
        if (Q4) {
          const char* pm = reinterpret_cast<const char*>(mr + kAhead * nb);
          for (int64_t off = 0; off < int64_t(RT * nb * sizeof(S)); off += 64) _mm_prefetch(pm + off, _MM_HINT_T0);
        }
      }
      for (int64_t m = m0; m < m1;) {
        const int c = m + CT <= m1 ? CT : 1;
        const int8_t* xr = xq + m * K;
        const float* xdr = xd + m * nb;
        const float* xsr = xs + m * nb;
        float* yr = y + m * N + n;
        if (r == RT && c == CT) tile<Q4, S, RT, CT>(wr, ws, dr, mr, nb, xr, xdr, xsr, K, yr, N);
        else if (r == RT) tile<Q4, S, RT, 1>(wr, ws, dr, mr, nb, xr, xdr, xsr, K, yr, N);
        else if (c == CT) tile<Q4, S, 1, CT>(wr, ws, dr, mr, nb, xr, xdr, xsr, K, yr, N);
        else tile<Q4, S, 1, 1>(wr, ws, dr, mr, nb, xr, xdr, xsr, K, yr, N);
        m += c;
      }
      n += r;
    }
  }
}

// Per row and block of 32: d = amax / 127, q = round-half-even(x / d), s = d * sum(q).
static void quantize_rows(const float* x, int64_t M, int64_t K, int8_t* q, float* d, float* s) {
  const int64_t nb = K / 32;
  const __m256 sign = _mm256_set1_ps(-0.f);
  for (int64_t i = 0; i < M * nb; ++i) {
    const float* xb = x + i * 32;
    __m256 v[4];
    __m256 amax = _mm256_setzero_ps();
    for (int j = 0; j < 4; ++j) {
      v[j] = _mm256_loadu_ps(xb + 8 * j);
      amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[j]));
    }
    __m128 a = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    a = _mm_max_ps(a, _mm_movehl_ps(a, a));
    a = _mm_max_ss(a, _mm_movehdup_ps(a));
    const float dm = _mm_cvtss_f32(a) / 127.f;
    const float id = dm > 0.f ? 1.f / dm : 0.f;
    const __m256 idv = _mm256_set1_ps(id);
    __m256i qi[4];
    for (int j = 0; j < 4; ++j) qi[j] = _mm256_cvtps_epi32(_mm256_mul_ps(v[j], idv));  // nearest-even
    // Sum of the 32 ints, then pack to bytes; packs interleave 128-bit lanes, the permute undoes it.
    __m256i sum = _mm256_add_epi32(_mm256_add_epi32(qi[0], qi[1]), _mm256_add_epi32(qi[2], qi[3]));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
    s4 = _mm_hadd_epi32(s4, s4);
    s4 = _mm_hadd_epi32(s4, s4);
    const __m256i p16a = _mm256_packs_epi32(qi[0], qi[1]);
    const __m256i p16b = _mm256_packs_epi32(qi[2], qi[3]);
    __m256i p8 = _mm256_packs_epi16(p16a, p16b);
    p8 = _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + i * 32), p8);
    d[i] = dm;
    s[i] = dm * static_cast<float>(_mm_cvtsi128_si32(s4));
  }
}
