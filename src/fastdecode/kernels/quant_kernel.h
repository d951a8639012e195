// Block-quantized matmul body, included once per instruction set, by
// quant_avx2.cpp and quant_vnni.cpp, inside a `#pragma GCC target` region
// (FD_VNNI selects the int8 dot product).
//
// y[m, n] = hsum_j sum_b isum_j(n, m, b) * (wd[n, b] * xd[m, b])  [+ sum_b wm[n, b] * xs[m, b] for q4]
// where isum_j is the exact int32 dot product of values 4j..4j+3 of block b
// (32 values) of weight row n and activation row m, j = 0..7 (one lane each).
// Every (m, n) runs the same float operations in the same order whatever the
// tile shape, so a row's result does not depend on M, and the AVX2 and VNNI paths and the PyTorch twin in
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

// R weight rows x C activation rows on 256-bit registers (the AVX2 path, and
// the VNNI path's odd last weight row). w points at row n's data (row stride
// ws bytes), d/mn at its scales/mins (stride nb); x at row m (stride K).
//
// Each block's integer dot product stays in its 8 int32 lanes (lane j: values
// 4j..4j+3, exact), is converted to float, multiplied by w_scale * x_scale
// (one float product) and added to the (n, m) lane accumulator; blocks go in
// order. The lanes are summed once at the end (hsum), then (q4) the minimum
// term is added. The 512-bit tile below and the PyTorch twin in
// quant/reference.py repeat these operations exactly.
template <bool Q4, typename S, int R, int C>
static void tile(const uint8_t* w, int64_t ws, const S* d, const S* mn, int64_t nb,
                 const int8_t* xq, const float* xd, const float* xs, int64_t K,
                 float* y, int64_t ldy) {
  __m256 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  float sc[R][C][8];  // w_scale * x_scale of blocks b & ~7 .. + 7
  for (int64_t b = 0; b < nb; ++b) {
    if (b % 8 == 0) {
      for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) {
          if (b + 8 <= nb) _mm256_storeu_ps(sc[r][c], _mm256_mul_ps(scales8<S>(d + r * nb + b), _mm256_loadu_ps(xd + c * nb + b)));
          else for (int64_t j = b; j < nb; ++j) sc[r][c][j - b] = scale_at<S>(d + r * nb + j) * xd[c * nb + j];
        }
    }
    __m256i wv[R];
    for (int r = 0; r < R; ++r) {
      const uint8_t* wr = w + r * ws;
      wv[r] = Q4 ? q4_block(wr, b, nb) : load32(wr + b * 32);
    }
    for (int c = 0; c < C; ++c) {
      const __m256i xv = load32(xq + c * K + b * 32);
      for (int r = 0; r < R; ++r) {
        const __m256i p = Q4 ? dot_u8s8(wv[r], xv) : dot_s8s8(wv[r], xv);
        const __m256 scale = _mm256_broadcast_ss(&sc[r][c][b % 8]);
        acc[r][c] = _mm256_add_ps(acc[r][c], _mm256_mul_ps(_mm256_cvtepi32_ps(p), scale));
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      float s = hsum(acc[r][c]);
      if (Q4) s = s + min_term<S>(mn + r * nb, xs + c * nb, nb);  // block minimum x activation block sum
      y[c * ldy + r] = s;
    }
}

#if FD_VNNI
// Weight rows r and r + 1 of block b side by side: [row r | row r + 1], 32 bytes each.
static inline __m512i pair512(__m256i lo, __m256i hi) { return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); }

static inline __m256 half256(__m512 v, int h) {
  return h ? _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)) : _mm512_castps512_ps256(v);
}

// n (1..16) scales as floats, the rest of the register zero.
template <typename S>
static inline __m512 scales16(const S* p, int64_t n);
template <>
inline __m512 scales16<float>(const float* p, int64_t n) {
  return _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << n) - 1), p);
}
template <>
inline __m512 scales16<uint16_t>(const uint16_t* p, int64_t n) {
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(static_cast<__mmask16>((1u << n) - 1), p));
}

// permutex2var indices: lane j of the first register in the low 8 lanes, of the second in the high 8.
static inline __m512i spread_idx(int64_t j) {
  return _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(j)),
                          _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 16, 16, 16, 16, 16, 16, 16, 16));
}

// The 512-bit VNNI tile: R (even) weight rows x C activation rows, two weight
// rows per register (rows r and r + 1 in the low and high 256 bits), so every
// 8-lane half does exactly what the 256-bit tile does for its row.
template <bool Q4, typename S, int R, int C>
static void tile512(const uint8_t* w, int64_t ws, const S* d, const S* mn, int64_t nb,
                    const int8_t* xq, const float* xd, const float* xs, int64_t K,
                    float* y, int64_t ldy) {
  constexpr int P = R / 2;
  __m512 acc[P][C];
  for (int p = 0; p < P; ++p)
    for (int c = 0; c < C; ++c) acc[p][c] = _mm512_setzero_ps();
  const __m512i nib = _mm512_set1_epi8(0x0F);
  __m512 dwv[P][2];  // the scales of rows 2p and 2p + 1 for the 16 blocks from g0
  for (int64_t b0 = 0; b0 < nb; b0 += 2) {
    const int nbk = b0 + 2 <= nb ? 2 : 1;
    if (b0 % 16 == 0) {
      const int64_t g = std::min<int64_t>(16, nb - b0);
      for (int p = 0; p < P; ++p)
        for (int h = 0; h < 2; ++h) dwv[p][h] = scales16<S>(d + (2 * p + h) * nb + b0, g);
    }
    __m512i wv[P][2];
    __m512 dw[P][2];
    for (int p = 0; p < P; ++p) {
      const uint8_t* w0 = w + (2 * p) * ws;
      const uint8_t* w1 = w0 + ws;
      if (Q4) {
        if (nbk == 2) {
          const __m512i v = pair512(load32(w0 + b0 * 16), load32(w1 + b0 * 16));
          wv[p][0] = _mm512_and_si512(v, nib);
          wv[p][1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
        } else {
          wv[p][0] = pair512(q4_block(w0, b0, nb), q4_block(w1, b0, nb));
        }
      } else {
        // signed weights as unsigned w + 128 for dpbusd; the 128 * sum(x) it adds is taken off below
        const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
        for (int k = 0; k < nbk; ++k)
          wv[p][k] = _mm512_xor_si512(pair512(load32(w0 + (b0 + k) * 32), load32(w1 + (b0 + k) * 32)), flip);
      }
      for (int k = 0; k < nbk; ++k) dw[p][k] = _mm512_permutex2var_ps(dwv[p][0], spread_idx(b0 % 16 + k), dwv[p][1]);
    }
    for (int k = 0; k < nbk; ++k) {
      for (int c = 0; c < C; ++c) {
        const __m512i xv = _mm512_broadcast_i64x4(load32(xq + c * K + (b0 + k) * 32));
        __m512i base = _mm512_setzero_si512();
        if (!Q4) base = _mm512_sub_epi32(base, _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(static_cast<char>(0x80)), xv));
        const __m512 dx = _mm512_set1_ps(xd[c * nb + b0 + k]);
        for (int p = 0; p < P; ++p) {
          const __m512i s = _mm512_dpbusd_epi32(base, wv[p][k], xv);
          acc[p][c] = _mm512_add_ps(acc[p][c], _mm512_mul_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw[p][k], dx)));
        }
      }
    }
  }
  for (int p = 0; p < P; ++p) {
    // q4: the minimum term of rows 2p and 2p + 1 in the two halves, as min_term sums it for one row
    __m512 macc[C];
    const int64_t full = nb / 8 * 8;
    if (Q4) {
      for (int c = 0; c < C; ++c) macc[c] = _mm512_setzero_ps();
      for (int64_t b = 0; b < full; b += 8) {
        const __m512 mv = _mm512_castpd_ps(_mm512_insertf64x4(
            _mm512_castps_pd(_mm512_castps256_ps512(scales8<S>(mn + (2 * p) * nb + b))),
            _mm256_castps_pd(scales8<S>(mn + (2 * p + 1) * nb + b)), 1));
        for (int c = 0; c < C; ++c) {
          const __m512 xv = _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(xs + c * nb + b))));
          macc[c] = _mm512_add_ps(macc[c], _mm512_mul_ps(mv, xv));
        }
      }
    }
    for (int c = 0; c < C; ++c)
      for (int h = 0; h < 2; ++h) {
        const int r = 2 * p + h;
        float s = hsum(half256(acc[p][c], h));
        if (Q4) {  // block minimum x activation block sum
          float t = hsum(half256(macc[c], h));
          for (int64_t b = full; b < nb; ++b) t = t + scale_at<S>(mn + r * nb + b) * xs[c * nb + b];
          s = s + t;
        }
        y[c * ldy + r] = s;
      }
  }
}
#endif

// Rows [n0, n1) of y = x w^T for all M activation rows.
// The tile for R weight rows and c (1..CT) activation rows: 512-bit on the
// VNNI path for an even R, else 256-bit.
template <bool Q4, typename S, int R, int CT, bool Wide>
static inline void tiles(int c, const uint8_t* w, int64_t ws, const S* d, const S* mn, int64_t nb,
                         const int8_t* xq, const float* xd, const float* xs, int64_t K, float* y, int64_t ldy) {
  if constexpr (CT > 1) {
    if (c < CT) return tiles<Q4, S, R, CT - 1, Wide>(c, w, ws, d, mn, nb, xq, xd, xs, K, y, ldy);
  }
#if FD_VNNI
  if constexpr (Wide && R % 2 == 0) return tile512<Q4, S, R, CT>(w, ws, d, mn, nb, xq, xd, xs, K, y, ldy);
#endif
  tile<Q4, S, R, CT>(w, ws, d, mn, nb, xq, xd, xs, K, y, ldy);
}

// Rows [n0, n1) of y = x w^T for all M activation rows, in tiles of RT weight
// rows (the last few two or one at a time) x up to CT activation rows.
template <bool Q4, typename S, int RT, int CT, bool Wide = true>
static void rows(const uint8_t* w, int64_t ws, const S* d, const S* mn, int64_t nb, int64_t n0, int64_t n1,
                 const int8_t* xq, const float* xd, const float* xs, int64_t M, int64_t K, float* y, int64_t N) {
  constexpr int64_t kAhead = 32;  // rows
  // Activation rows in panels that stay in L2 while the weight rows stream past.
  constexpr int64_t kPanel = 64;
  for (int64_t m0 = 0; m0 < M; m0 += kPanel) {
    const int64_t m1 = std::min(M, m0 + kPanel);
    for (int64_t n = n0; n < n1;) {
      const int r = n + RT <= n1 ? RT : n + 2 <= n1 ? 2 : 1;
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
        const int c = static_cast<int>(std::min<int64_t>(CT, m1 - m));
        const int8_t* xr = xq + m * K;
        const float* xdr = xd + m * nb;
        const float* xsr = xs + m * nb;
        float* yr = y + m * N + n;
        if (r == RT) tiles<Q4, S, RT, CT, Wide>(c, wr, ws, dr, mr, nb, xr, xdr, xsr, K, yr, N);
        else if (r == 2) tiles<Q4, S, 2, CT, Wide>(c, wr, ws, dr, mr, nb, xr, xdr, xsr, K, yr, N);
        else tiles<Q4, S, 1, CT, Wide>(c, wr, ws, dr, mr, nb, xr, xdr, xsr, K, yr, N);
        m += c;
      }
      n += r;
    }
  }
}

// ---------------------------------------------------------------------------
// The K-quant layouts (q4k, q5k, q6k; see quant/formats.py), on 256-bit tiles.
//
// q4k/q5k are q4 whose block scales d * sc and minima -(dmin * mn) are formed
// here from the stored bytes: exact float32 products, the very values a float32
// q4 repack holds, so the float operations (and results) are the q4 tile's. q6k:
// lane j of block b is sc * (sum q x - 32 sum x) over values 4j..4j+3, sc the
// scale of the lane's 16-value sub-block (lanes 0-3: sub-block 2b, 4-7: 2b + 1),
// exact in int32 (|lane| < 2^22), converted to float, times d * x_scale.

using KArgs = ::fd::KQuantArgs;
constexpr int kQ4K = ::fd::kQ4K, kQ5K = ::fd::kQ5K, kQ6K = ::fd::kQ6K, kQ5 = ::fd::kQ5, kQ5S = ::fd::kQ5S;

static inline const uint16_t* khalf(const uint8_t* p) { return reinterpret_cast<const uint16_t*>(p); }

// Block b of row n as 32 unsigned values (q4k: 0..15, q5k: 0..31, q6k: 0..63).
template <int L>
static inline __m256i kblock(const KArgs& a, int64_t n, int64_t b) {
  const uint8_t* q = a.q + n * a.qs;
  if constexpr (L == kQ6K) {
    // Q6_K: value 128 h + 32 g + l: low bits in byte 64 h + 32 (g % 2) + l (nibble g / 2),
    // top two in bits 2g of qh byte 32 h + l.
    const int64_t j = b & 7, h = j >> 2, g = j & 3;
    const __m256i lo = load32(q + (b >> 3) * 128 + h * 64 + (g & 1) * 32);
    const __m256i l4 = (g & 2) ? q4_high(lo) : q4_low(lo);
    const __m256i hb = load32(a.qh + n * a.qhs + (b >> 3) * 64 + h * 32);
    const __m256i h2 = _mm256_and_si256(_mm256_srl_epi16(hb, _mm_cvtsi32_si128(static_cast<int>(2 * g))),
                                        _mm256_set1_epi8(3));
    return _mm256_or_si256(l4, _mm256_slli_epi16(h2, 4));
  } else {
    __m256i v = q4_block(q, b, a.nb);
    if constexpr (L != kQ4K) {  // bit b % 8 of qh byte l: the fifth bit of value l
      const __m256i hb = load32(a.qh + n * a.qhs + (b >> 3) * 32);
      const __m256i h1 = _mm256_and_si256(_mm256_srl_epi16(hb, _mm_cvtsi32_si128(static_cast<int>(b & 7))),
                                          _mm256_set1_epi8(1));
      v = _mm256_or_si256(v, _mm256_slli_epi16(h1, 4));
    }
    return v;
  }
}

// The float scales of blocks b..b+7 (b % 8 == 0, one super-block) of row n: d * sc (q6k: d;
// q5, q5s: the stored fp16 scales).
template <int L>
static inline __m256 kscales8(const KArgs& a, int64_t n, int64_t b) {
  if constexpr (L == kQ5 || L == kQ5S) return scales8<uint16_t>(khalf(a.sc) + n * a.scs + b);
  const __m256 d = _mm256_set1_ps(_cvtsh_ss(a.d[n * (a.nb / 8) + b / 8]));
  if constexpr (L == kQ6K) {
    return d;
  } else {
    const __m128i s = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(a.sc + n * a.scs + b));
    return _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(s)));
  }
}

// q4k/q5k: the minima -(dmin * mn) of blocks b..b+7 of row n.
static inline __m256 kmins8(const KArgs& a, int64_t n, int64_t b) {
  const __m256 dm = _mm256_set1_ps(_cvtsh_ss(a.dmin[n * (a.nb / 8) + b / 8]));
  const __m128i m = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(a.mn + n * a.scs + b));
  return _mm256_xor_ps(_mm256_mul_ps(dm, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(m))), _mm256_set1_ps(-0.f));
}

// min_term's sum for q4k/q5k row n (nb a multiple of 8: no tail).
static inline float kmin_term(const KArgs& a, int64_t n, const float* xs) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < a.nb; b += 8) acc = _mm256_add_ps(acc, _mm256_mul_ps(kmins8(a, n, b), _mm256_loadu_ps(xs + b)));
  return hsum(acc);
}

// q6k: the sub-block scales of block b of row n in lanes 0-3 and 4-7.
static inline __m256i ksub_scales(const KArgs& a, int64_t n, int64_t b) {
  const int8_t* s = reinterpret_cast<const int8_t*>(a.sc + n * a.scs + 2 * b);
  return _mm256_set_m128i(_mm_set1_epi32(s[1]), _mm_set1_epi32(s[0]));
}

// R weight rows from n x C activation rows from m, as `tile` does for q4/q8.
template <int L, int R, int C>
static void ktile(const KArgs& a, int64_t n, int64_t m, float* y, int64_t ldy) {
  constexpr bool Q6 = L == kQ6K;
  const int64_t nb = a.nb, K = a.K;
  const int8_t* xq = a.xq + m * K;
  const float* xd = a.xd + m * nb;
  __m256 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  float sc[R][C][8];  // w_scale * x_scale of blocks b & ~7 .. + 7
  for (int64_t b = 0; b < nb; ++b) {
    if (b % 8 == 0) {
      for (int r = 0; r < R; ++r) {
        if (b + 8 <= nb) {
          const __m256 ws = kscales8<L>(a, n + r, b);
          for (int c = 0; c < C; ++c) _mm256_storeu_ps(sc[r][c], _mm256_mul_ps(ws, _mm256_loadu_ps(xd + c * nb + b)));
        } else {  // q5, q5s: a last group of fewer than 8 blocks, as `tile` does
          for (int c = 0; c < C; ++c)
            for (int64_t j = b; j < nb; ++j) sc[r][c][j - b] = scale_at<uint16_t>(khalf(a.sc) + (n + r) * a.scs + j) * xd[c * nb + j];
        }
      }
    }
    __m256i wv[R], sub[R];
    for (int r = 0; r < R; ++r) {
      wv[r] = kblock<L>(a, n + r, b);
      if constexpr (Q6) sub[r] = ksub_scales(a, n + r, b);
    }
    for (int c = 0; c < C; ++c) {
      const __m256i xv = load32(xq + c * K + b * 32);
      __m256i off = _mm256_setzero_si256();
      if constexpr (Q6) off = dot_u8s8(_mm256_set1_epi8(32), xv);  // 32 * sum(x) per lane
      if constexpr (L == kQ5S) off = dot_u8s8(_mm256_set1_epi8(16), xv);  // 16 * sum(x) per lane
      for (int r = 0; r < R; ++r) {
        __m256i p = dot_u8s8(wv[r], xv);
        if constexpr (Q6) p = _mm256_mullo_epi32(_mm256_sub_epi32(p, off), sub[r]);
        if constexpr (L == kQ5S) p = _mm256_sub_epi32(p, off);  // sum (q - 16) x, exact: q8's lanes for Q5_0
        const __m256 scale = _mm256_broadcast_ss(&sc[r][c][b % 8]);
        acc[r][c] = _mm256_add_ps(acc[r][c], _mm256_mul_ps(_mm256_cvtepi32_ps(p), scale));
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      float s = hsum(acc[r][c]);
      if constexpr (L == kQ4K || L == kQ5K) s = s + kmin_term(a, n + r, a.xs + (m + c) * nb);
      if constexpr (L == kQ5) s = s + min_term<uint16_t>(khalf(a.mn) + (n + r) * a.scs, a.xs + (m + c) * nb, nb);
      y[c * ldy + r] = s;
    }
}

// q6k on its own tile, a super-block (8 blocks) per step: ql (128 bytes), qh (64) and the
// 16 sub-scales of each row are loaded once per step, every shift is an immediate. The
// lane sums are ktile's: with w = q - 32 (signed, |w| <= 32), maddubs(|w|, sign(x, w))
// gives exact int16 pair sums (|pair| <= 8128) and madd with the sub-scale in both
// halves of each int32 lane gives sc * (sum q x - 32 sum x) exactly, without a mullo.
template <int G, int R, int C>
static inline void q6_group(const __m256i (&lo)[R][2], const __m256i (&hi)[R], const __m256i (&sub)[R], __m256 (&acc)[R][C],
                            const float (&sc)[R][C][8], int j, const int8_t* xq, int64_t K) {
  __m256i wa[R], ws[R], sv[R];
  const __m256i idx = _mm256_setr_epi32(2 * G, 2 * G, 2 * G, 2 * G, 2 * G + 1, 2 * G + 1, 2 * G + 1, 2 * G + 1);
  for (int r = 0; r < R; ++r) {
    const __m256i l4 = (G & 2) ? q4_high(lo[r][G & 1]) : q4_low(lo[r][G & 1]);
    // bits 2G, 2G + 1 of each qh byte moved to bits 4, 5 (bits crossing bytes are masked off)
    const __m256i hs = G < 2 ? _mm256_slli_epi16(hi[r], 4 - 2 * G) : G == 2 ? hi[r] : _mm256_srli_epi16(hi[r], 2);
    const __m256i h2 = _mm256_and_si256(hs, _mm256_set1_epi8(0x30));
    const __m256i w = _mm256_sub_epi8(_mm256_or_si256(l4, h2), _mm256_set1_epi8(32));
    wa[r] = _mm256_abs_epi8(w);
    ws[r] = w;
    sv[r] = _mm256_permutevar8x32_epi32(sub[r], idx);
  }
  for (int c = 0; c < C; ++c) {
    const __m256i xv = load32(xq + c * K);
    for (int r = 0; r < R; ++r) {
      const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(wa[r], _mm256_sign_epi8(xv, ws[r])), sv[r]);
      const __m256 scale = _mm256_broadcast_ss(&sc[r][c][j]);
      acc[r][c] = _mm256_add_ps(acc[r][c], _mm256_mul_ps(_mm256_cvtepi32_ps(p), scale));
    }
  }
}

template <int R, int C>
static void ktile_q6(const KArgs& a, int64_t n, int64_t m, float* y, int64_t ldy) {
  const int64_t nb = a.nb, K = a.K, ns = nb / 8;
  const int8_t* xq = a.xq + m * K;
  const float* xd = a.xd + m * nb;
  __m256 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  for (int64_t s = 0; s < ns; ++s) {
    float sc[R][C][8];  // d * x_scale of the super-block's 8 blocks
    __m256i subs[R][2];  // its 16 sub-scales, each in both int16 halves of an int32 lane
    for (int r = 0; r < R; ++r) {
      const __m256 d = _mm256_set1_ps(_cvtsh_ss(a.d[(n + r) * ns + s]));
      for (int c = 0; c < C; ++c) _mm256_storeu_ps(sc[r][c], _mm256_mul_ps(d, _mm256_loadu_ps(xd + c * nb + 8 * s)));
      const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a.sc + (n + r) * a.scs + 16 * s));
      for (int h = 0; h < 2; ++h) {
        const __m256i v = _mm256_cvtepi8_epi32(h ? _mm_srli_si128(raw, 8) : raw);
        subs[r][h] = _mm256_or_si256(_mm256_slli_epi32(v, 16), _mm256_and_si256(v, _mm256_set1_epi32(0xFFFF)));
      }
    }
    for (int h = 0; h < 2; ++h) {
      __m256i lo[R][2], hi[R], sub[R];
      for (int r = 0; r < R; ++r) {
        const uint8_t* ql = a.q + (n + r) * a.qs + s * 128 + h * 64;
        lo[r][0] = load32(ql);
        lo[r][1] = load32(ql + 32);
        hi[r] = load32(a.qh + (n + r) * a.qhs + s * 64 + h * 32);
        sub[r] = subs[r][h];
      }
      const int8_t* xb = xq + (8 * s + 4 * h) * 32;
      q6_group<0, R, C>(lo, hi, sub, acc, sc, 4 * h + 0, xb, K);
      q6_group<1, R, C>(lo, hi, sub, acc, sc, 4 * h + 1, xb + 32, K);
      q6_group<2, R, C>(lo, hi, sub, acc, sc, 4 * h + 2, xb + 64, K);
      q6_group<3, R, C>(lo, hi, sub, acc, sc, 4 * h + 3, xb + 96, K);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) y[c * ldy + r] = hsum(acc[r][c]);
}

template <int L, int R, int CT>
static inline void ktiles(int c, const KArgs& a, int64_t n, int64_t m, float* y, int64_t ldy) {
  if constexpr (CT > 1) {
    if (c < CT) return ktiles<L, R, CT - 1>(c, a, n, m, y, ldy);
  }
  if constexpr (L == kQ6K) ktile_q6<R, CT>(a, n, m, y, ldy);
  else ktile<L, R, CT>(a, n, m, y, ldy);
}

static inline void prefetch_rows(const uint8_t* p, int64_t bytes) {
  for (int64_t off = 0; off < bytes; off += 64) _mm_prefetch(reinterpret_cast<const char*>(p + off), _MM_HINT_T0);
}

// Rows [n0, n1) of y = x w^T, as `rows` does for q4/q8.
template <int L, int RT, int CT>
static void krows(const KArgs& a, int64_t n0, int64_t n1) {
  constexpr int64_t kAhead = 32;
  constexpr int64_t kPanel = 64;
  for (int64_t m0 = 0; m0 < a.M; m0 += kPanel) {
    const int64_t m1 = std::min(a.M, m0 + kPanel);
    for (int64_t n = n0; n < n1;) {
      const int r = n + RT <= n1 ? RT : n + 2 <= n1 ? 2 : 1;
      if (m0 == 0 && n + kAhead + RT <= n1) {
        const int64_t na = n + kAhead;
        prefetch_rows(a.q + na * a.qs, RT * a.qs);
        if (L != kQ4K) prefetch_rows(a.qh + na * a.qhs, RT * a.qhs);
        constexpr int64_t es = (L == kQ5 || L == kQ5S) ? 2 : 1;  // bytes per scale
        prefetch_rows(a.sc + es * na * a.scs, es * RT * a.scs);
        if (a.mn) prefetch_rows(a.mn + es * na * a.scs, es * RT * a.scs);
      }
      for (int64_t m = m0; m < m1;) {
        const int c = static_cast<int>(std::min<int64_t>(CT, m1 - m));
        float* yr = a.y + m * a.N + n;
        if (r == RT) ktiles<L, RT, CT>(c, a, n, m, yr, a.N);
        else if (r == 2) ktiles<L, 2, CT>(c, a, n, m, yr, a.N);
        else ktiles<L, 1, CT>(c, a, n, m, yr, a.N);
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
