// q4's, q8's and q4s' matmul on their panels of 16 weight rows (quant/formats.py), included after
// quant_kernel.h in each per-ISA translation unit.
//
// A 64-byte unit of a panel holds 4 values of each of its 16 rows, so a dot product against 4
// broadcast activation bytes leaves each row's block sum I_b in its own 32-bit lane (VNNI: one
// 512-bit register; AVX2: two 256-bit halves of 8 rows). The per-block float scaling then runs
// once per 16 outputs and no output needs a horizontal sum; for each (activation row m, weight
// row n), blocks in order:
//
//   acc  = acc  + float(I_b) * (w_scale_b * x_scale_b)
//   macc = macc + w_min_b * x_sum_b                      (q4)
//   y = acc [+ macc]
//
// whatever the tile, M, thread count or instruction set; quant/reference.py repeats it.
// I_b = sum q x (q4: q in 0..15; q8: signed w, which VNNI takes as w + 128, less 128 sum x;
// q4s: sum q x - 8 sum x).
// Against the lane-order tiles (Zen 4, 2 threads): VNNI 1.2-2.5x from two activation rows and
// level to 1.3x at one; AVX2 1.3-1.8x at K = 576, level at K = 2048 (benchmarks/batch_tiles/panels.md).

using ::fd::kPanelRows;

typedef int32_t PanelWord __attribute__((may_alias, aligned(1)));

// 4-byte units per row and block: q4's and q4s' 32 nibbles, q8's 32 bytes.
template <int L>
constexpr int kUnits = L == kQ8 ? 8 : 4;

// A panel of 16 rows: values [nb][kUnits][16 rows][4 bytes], float16 scales (and q4's minima) [nb][16].
struct Panel {
  const uint8_t* q;
  const uint16_t *sc, *mn;
};

// The 4 activation bytes of values 4w..4w+3 of a block (xb: the block's first word in
// quantize_rows' lane order), `row` bytes further on.
static FD_INLINE int32_t xword(const int8_t* xb, int64_t row, int w) {
  return reinterpret_cast<const PanelWord*>(xb + row)[8 * w];
}

// The integer sum of activation row m's block b (quantize_rows' sums of values 0..15 and 16..31).
static FD_INLINE int32_t block_sum(const Args& a, int64_t m, int64_t b) {
  const int32_t* s = a.xsums + m * ((a.nb + 7) / 8) * 16 + 16 * (b / 8) + b % 8;
  return s[0] + s[8];
}

// Prefetch `ahead` bytes ahead in the values' stream, and in the scales' (and minima's), which
// move 32 bytes a block, in proportion.
template <int L>
static FD_INLINE void panel_prefetch(const Panel& p, const uint8_t* pb, int64_t b, int64_t ahead) {
  for (int l = 0; l < 64 * kUnits<L>; l += 64) _mm_prefetch(reinterpret_cast<const char*>(pb + ahead + l), _MM_HINT_T0);
  if (b % 2 == 0) {
    const int64_t at = ahead / (2 * kUnits<L>);
    _mm_prefetch(reinterpret_cast<const char*>(p.sc + 16 * b) + at, _MM_HINT_T0);
    if (L == kQ4) _mm_prefetch(reinterpret_cast<const char*>(p.mn + 16 * b) + at, _MM_HINT_T0);
  }
}

#if FD_VNNI
constexpr int kPanelCols = 8;  // activation rows a tile: 2 x 8 accumulators of 32 registers
template <int L, int C>
static FD_INLINE void panel_tile(const Panel& p, const Args& a, int64_t m, float* y, int64_t ldy, int64_t ahead) {
  const int64_t G = (a.nb + 7) / 8, xrow = G * 256;
  __m512 acc[C], macc[C];
  for (int c = 0; c < C; ++c) acc[c] = macc[c] = _mm512_setzero_ps();
  const __m512i low = _mm512_set1_epi8(0x0F), flip = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int64_t b = 0; b < a.nb; ++b) {
    const uint8_t* pb = p.q + 64 * kUnits<L> * b;
    if (ahead) panel_prefetch<L>(p, pb, b, ahead);
    const int8_t* xb = a.xq + m * xrow + 256 * (b / 8) + 4 * (b % 8);
    __m512i I[C];
    for (int c = 0; c < C; ++c) I[c] = _mm512_setzero_si512();
    if constexpr (L == kQ8) {
      for (int u = 0; u < 8; ++u) {
        const __m512i v = _mm512_xor_si512(_mm512_loadu_si512(pb + 64 * u), flip);  // w + 128
        for (int c = 0; c < C; ++c) I[c] = _mm512_dpbusd_epi32(I[c], v, _mm512_set1_epi32(xword(xb, c * xrow, u)));
      }
      for (int c = 0; c < C; ++c) I[c] = _mm512_sub_epi32(I[c], _mm512_set1_epi32(128 * block_sum(a, m + c, b)));
    } else {
      for (int u = 0; u < 4; ++u) {
        const __m512i v = _mm512_loadu_si512(pb + 64 * u);
        const __m512i lo = _mm512_and_si512(v, low), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
        for (int c = 0; c < C; ++c) {
          I[c] = _mm512_dpbusd_epi32(I[c], lo, _mm512_set1_epi32(xword(xb, c * xrow, u)));
          I[c] = _mm512_dpbusd_epi32(I[c], hi, _mm512_set1_epi32(xword(xb, c * xrow, 4 + u)));
        }
      }
      if constexpr (L == kQ4S)  // q - 8
        for (int c = 0; c < C; ++c) I[c] = _mm512_sub_epi32(I[c], _mm512_set1_epi32(8 * block_sum(a, m + c, b)));
    }
    const __m512 ws = _mm512_cvtph_ps(load32(p.sc + 16 * b));
    for (int c = 0; c < C; ++c) {
      const int64_t at = (m + c) * G * 8 + b;
      const __m512 scale = _mm512_mul_ps(ws, _mm512_set1_ps(a.xd[at]));
      acc[c] = _mm512_add_ps(acc[c], _mm512_mul_ps(_mm512_cvtepi32_ps(I[c]), scale));
    }
    if constexpr (L == kQ4) {
      const __m512 mv = _mm512_cvtph_ps(load32(p.mn + 16 * b));
      for (int c = 0; c < C; ++c)
        macc[c] = _mm512_add_ps(macc[c], _mm512_mul_ps(mv, _mm512_set1_ps(a.xs[(m + c) * G * 8 + b])));
    }
  }
  for (int c = 0; c < C; ++c) _mm512_storeu_ps(y + c * ldy, L == kQ4 ? _mm512_add_ps(acc[c], macc[c]) : acc[c]);
}
#else
constexpr int kPanelCols = 2;  // 16 registers: both halves' 2 x 2 x 2 accumulators, the unpacked weights
// Rows 8h..8h+7 of the panel in each half h, both halves per block, so that each activation word
// is broadcast once. q4: maddubs's int16 pair sums over a block's 4 units stay below 2^15
// (2 x 15 x 127 x 2 x 4 = 30480) before madd widens them. q8: |w| against x signed as w (the
// pairs reach 2 x 128 x 127), widened every unit.
template <int L, int C>
static FD_INLINE void panel_tile(const Panel& p, const Args& a, int64_t m, float* y, int64_t ldy, int64_t ahead) {
  const int64_t G = (a.nb + 7) / 8, xrow = G * 256;
  const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  __m256 acc[2][C], macc[2][C];
  for (int h = 0; h < 2; ++h)
    for (int c = 0; c < C; ++c) acc[h][c] = macc[h][c] = _mm256_setzero_ps();
  for (int64_t b = 0; b < a.nb; ++b) {
    const uint8_t* pb = p.q + 64 * kUnits<L> * b;
    if (ahead) panel_prefetch<L>(p, pb, b, ahead);
    const int8_t* xb = a.xq + m * xrow + 256 * (b / 8) + 4 * (b % 8);
    __m256i I[2][C];
    if constexpr (L == kQ8) {
      for (int u = 0; u < 8; ++u) {
        __m256i x[C];
        for (int c = 0; c < C; ++c) x[c] = _mm256_set1_epi32(xword(xb, c * xrow, u));
        for (int h = 0; h < 2; ++h) {
          const __m256i v = load32(pb + 64 * u + 32 * h), w = _mm256_abs_epi8(v);
          for (int c = 0; c < C; ++c) {
            const __m256i t = _mm256_madd_epi16(_mm256_maddubs_epi16(w, _mm256_sign_epi8(x[c], v)), ones);
            I[h][c] = u ? _mm256_add_epi32(I[h][c], t) : t;
          }
        }
      }
    } else {
      __m256i P[2][C];
      for (int u = 0; u < 4; ++u) {
        __m256i xl[C], xh[C];
        for (int c = 0; c < C; ++c) {
          xl[c] = _mm256_set1_epi32(xword(xb, c * xrow, u));
          xh[c] = _mm256_set1_epi32(xword(xb, c * xrow, 4 + u));
        }
        for (int h = 0; h < 2; ++h) {
          const __m256i v = load32(pb + 64 * u + 32 * h);
          const __m256i lo = _mm256_and_si256(v, low), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
          for (int c = 0; c < C; ++c) {
            const __m256i t = _mm256_add_epi16(_mm256_maddubs_epi16(lo, xl[c]), _mm256_maddubs_epi16(hi, xh[c]));
            P[h][c] = u ? _mm256_add_epi16(P[h][c], t) : t;
          }
        }
      }
      for (int c = 0; c < C; ++c) {
        const __m256i off = _mm256_set1_epi32(L == kQ4S ? 8 * block_sum(a, m + c, b) : 0);  // q4s: q - 8
        for (int h = 0; h < 2; ++h) I[h][c] = _mm256_sub_epi32(_mm256_madd_epi16(P[h][c], ones), off);
      }
    }
    for (int h = 0; h < 2; ++h) {
      const __m256 ws = scales8(p.sc + 16 * b + 8 * h);
      for (int c = 0; c < C; ++c) {
        const int64_t at = (m + c) * G * 8 + b;
        const __m256 scale = _mm256_mul_ps(ws, _mm256_set1_ps(a.xd[at]));
        acc[h][c] = _mm256_add_ps(acc[h][c], _mm256_mul_ps(_mm256_cvtepi32_ps(I[h][c]), scale));
      }
      if constexpr (L == kQ4) {
        const __m256 mv = scales8(p.mn + 16 * b + 8 * h);
        for (int c = 0; c < C; ++c)
          macc[h][c] = _mm256_add_ps(macc[h][c], _mm256_mul_ps(mv, _mm256_set1_ps(a.xs[(m + c) * G * 8 + b])));
      }
    }
  }
  for (int h = 0; h < 2; ++h)
    for (int c = 0; c < C; ++c)
      _mm256_storeu_ps(y + c * ldy + 8 * h, L == kQ4 ? _mm256_add_ps(acc[h][c], macc[h][c]) : acc[h][c]);
}
#endif

// One panel against all M activation rows, in tiles of up to kPanelCols rows; y [M, ldy] from
// its first column. `ahead`: bytes to prefetch ahead in the values' stream (0: none).
template <int L>
static void panel_all_rows(const Panel& p, const Args& a, float* y, int64_t ldy, int64_t ahead) {
  for (int64_t m = 0; m < a.M;) {
    const int64_t left = a.M - m, first = m == 0 ? ahead : 0;
    float* ym = y + m * ldy;
    if (left >= kPanelCols) { panel_tile<L, kPanelCols>(p, a, m, ym, ldy, first); m += kPanelCols; }
#if FD_VNNI
    else if (left >= 4) { panel_tile<L, 4>(p, a, m, ym, ldy, first); m += 4; }
#endif
    else if (left >= 2) { panel_tile<L, 2>(p, a, m, ym, ldy, first); m += 2; }
    else { panel_tile<L, 1>(p, a, m, ym, ldy, first); m += 1; }
  }
}

// Output rows [n0, n1) of a matmul in panels: n0 a multiple of 16, n1 one too or N. A last panel
// of r < 16 rows (stored [nb][U][r][4] and [nb][r]) is copied into a zero-padded full one first;
// its outputs go through a buffer [M, 16].
template <int L>
static void panel_rows(const Args& a, int64_t n0, int64_t n1) {
  constexpr int64_t U = kUnits<L>;
  const int64_t nb = a.nb, last = n1 == a.N && a.N % kPanelRows ? n1 - a.N % kPanelRows : n1;
  const uint16_t *sc = reinterpret_cast<const uint16_t*>(a.sc), *mn = reinterpret_cast<const uint16_t*>(a.mn);
  for (int64_t n = n0; n < last; n += kPanelRows) {
    const Panel p{a.q + n * a.qs, sc + n * nb, L == kQ4 ? mn + n * nb : nullptr};
    // 16 blocks ahead (q8 at 8 blocks ran 0.88x the lane tiles at M = 4, streamed from DRAM)
    panel_all_rows<L>(p, a, a.y + n, a.N, n + kPanelRows < last ? 1024 * U : 0);
  }
  if (last == n1) return;
  const int64_t r = n1 - last;
  thread_local std::vector<uint8_t> q;
  thread_local std::vector<uint16_t> s;
  thread_local std::vector<float> y;
  q.assign(64 * U * nb, 0);
  s.assign(2 * kPanelRows * nb, 0);
  y.resize(kPanelRows * a.M);
  const uint8_t* src = a.q + last * a.qs;
  for (int64_t b = 0; b < nb; ++b) {
    for (int u = 0; u < U; ++u) std::memcpy(&q[64 * (U * b + u)], src + 4 * r * (U * b + u), 4 * r);
    std::memcpy(&s[kPanelRows * b], sc + last * nb + r * b, 2 * r);
    if (L == kQ4) std::memcpy(&s[kPanelRows * (nb + b)], mn + last * nb + r * b, 2 * r);
  }
  panel_all_rows<L>(Panel{q.data(), s.data(), s.data() + kPanelRows * nb}, a, y.data(), kPanelRows, 0);
  for (int64_t m = 0; m < a.M; ++m) std::memcpy(a.y + m * a.N + last, &y[kPanelRows * m], 4 * r);
}
