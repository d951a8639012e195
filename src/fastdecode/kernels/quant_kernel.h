// Block-quantized matmul body, included once per instruction set by quant.cpp
// inside a `#pragma GCC target` region (FD_VNNI selects the int8 dot product).
//
// y[m, n] = sum_b (wd[n, b] * xd[m, b]) * isum(n, m, b)  [+ sum_b wm[n, b] * xs[m, b] for Q4]
// where isum is the exact int32 dot product of block b (32 values) of weight
// row n and activation row m, held as 8 lanes of 4 products. Every (m, n) runs
// the same float operations in the same order whatever the tile shape, so a
// row's result does not depend on M, and the AVX2 and VNNI paths and the
// PyTorch twin in quant/reference.py give bit-identical results.

static inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// 16 bytes of nibbles -> 32 unsigned bytes: low nibbles are values 0..15, high ones 16..31.
static inline __m256i load_q4(const uint8_t* p) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i m = _mm_set1_epi8(0x0F);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m), _mm_and_si128(b, m));
}

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

template <typename S>
static inline float scale_at(const S* p);
template <>
inline float scale_at<float>(const float* p) { return *p; }
template <>
inline float scale_at<uint16_t>(const uint16_t* p) { return _cvtsh_ss(*p); }

// R weight rows x C activation rows. w points at row n's data (row stride ws
// bytes), d/mn at its scales/mins (stride nb); x at row m (stride K).
template <bool Q4, typename S, int R, int C>
static void tile(const uint8_t* w, int64_t ws, const S* d, const S* mn, int64_t nb,
                 const int8_t* xq, const float* xd, const float* xs, int64_t K,
                 float* y, int64_t ldy) {
  __m256 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    __m256i wv[R];
    float dw[R];
    for (int r = 0; r < R; ++r) {
      wv[r] = Q4 ? load_q4(w + r * ws + b * 16)
                 : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + r * ws + b * 32));
      dw[r] = scale_at<S>(d + r * nb + b);
    }
    for (int c = 0; c < C; ++c) {
      const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + c * K + b * 32));
      const float dx = xd[c * nb + b];
      for (int r = 0; r < R; ++r) {
        const __m256i isum = Q4 ? dot_u8s8(wv[r], xv) : dot_s8s8(wv[r], xv);
        // mul then add, not FMA: the PyTorch twin (quant/reference.py) repeats these exact roundings.
        acc[r][c] = _mm256_add_ps(acc[r][c], _mm256_mul_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(dw[r] * dx)));
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) {
      float s = hsum(acc[r][c]);
      if (Q4) {
        // The block minimum times the activation block's sum, in a fixed order.
        float t = 0.f;
        for (int64_t b = 0; b < nb; ++b) t += scale_at<S>(mn + r * nb + b) * xs[c * nb + b];
        s += t;
      }
      y[c * ldy + r] = s;
    }
  }
}

// Rows [n0, n1) of y = x w^T for all M activation rows.
template <bool Q4, typename S, int CT>
static void rows(const uint8_t* w, int64_t ws, const S* d, const S* mn, int64_t nb, int64_t n0, int64_t n1,
                 const int8_t* xq, const float* xd, const float* xs, int64_t M, int64_t K, float* y, int64_t N) {
  constexpr int RT = 4;
  // Activation rows in panels that stay in L2 while the weight rows stream past.
  constexpr int64_t kPanel = 64;
  for (int64_t m0 = 0; m0 < M; m0 += kPanel) {
    const int64_t m1 = std::min(M, m0 + kPanel);
    for (int64_t n = n0; n < n1;) {
      const int r = n + RT <= n1 ? RT : 1;
      const uint8_t* wr = w + n * ws;
      const S* dr = d + n * nb;
      const S* mr = Q4 ? mn + n * nb : nullptr;
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
