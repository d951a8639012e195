// The matmul of the layouts stored in panels of 16 weight rows (q4, q8, q4s, q4k, q5k, q6k;
// quant/formats.py), included after quant_kernel.h in each per-ISA translation unit.
//
// A 64-byte unit of a panel holds 4 values of each of its 16 rows, so a dot product against 4
// broadcast activation bytes leaves each row's block sum I_b in its own 32-bit lane (VNNI: one
// 512-bit register; AVX2: two 256-bit halves of 8 rows). The float scaling then runs once per 16
// outputs and no output needs a horizontal sum. For each (activation row m, weight row n), q4,
// q8 and q4s take blocks in order:
//
//   acc  = acc  + float(I_b) * (w_scale_b * x_scale_b)
//   macc = macc + w_min_b * x_sum_b                      (q4)
//   y = acc [+ macc]
//
// The K-quants (q4k, q5k, q6k), whose activations take one scale per 256 values, fold their integer
// block scales into the sums and scale in float once per group of 8 blocks (super_tile, q4k_tile,
// q6k_tile).
// Either way the result does not depend on the tile, M, thread count or instruction set;
// quant/reference.py repeats it. I_b = sum q x (q4, q4k: q in 0..15; q5k: 0..31; q8: signed w, which VNNI
// takes as w + 128, less 128 sum x; q4s: sum q x - 8 sum x; q6k: sc_lo (sum_lo q x - 32 sum_lo x)
// + sc_hi (sum_hi q x - 32 sum_hi x) over the block's values 0-15 and 16-31, |I_b| < 2^24).
// With AMX (Args::xa set, 32+ activation rows, q8 16+: ops.cpp), q4, q4s, q8, q4k and q5k take
// each block's I_b from tile products instead (amx_rows), and the same float steps (scale_steps,
// group_steps).
// Against the lane-order tiles (Zen 4, 2 threads, benchmarks/batch_tiles/panels.md): q4, q8, q4s
// on VNNI 1.2-2.5x from two activation rows and level to 1.3x at one; AVX2 1.3-1.8x at K = 576,
// level at K = 2048. The K-quants: benchmarks/batch_tiles/kquant_groups.md.

using ::fd::kPanelRows;

typedef int32_t PanelWord __attribute__((may_alias, aligned(1)));

// 4-byte units per row and block of qweight: q4's, q4s', q4k's and q6k's 32 nibbles, q8's 32 bytes,
// q5k's 32 nibbles and their fifth bits.
template <int L>
constexpr int kUnits = L == kQ8 ? 8 : L == kQ5K ? 5 : 4;
// Per-256 activations (kernels.h's in_super): the K-quants.
template <int L>
constexpr bool kSuper = ::fd::in_super(static_cast<::fd::Layout>(L));
template <int L>
constexpr bool kPanelMins = L == kQ4 || L == kQ4K || L == kQ5K;
// Bytes of sc (and mn) per row and block: float16 scales, q4k's and q5k's 6-bit scale bytes, q6k's
// two int8 half scales.
template <int L>
constexpr int kPanelScaleBytes = L == kQ4K || L == kQ5K ? 1 : 2;
template <int L>
constexpr bool kPanelD = kSuper<L>;  // float16 d (and q4k's and q5k's dmin) per 8 blocks

// A panel of 16 rows: values [nb][kUnits][16 rows][4 bytes] (q6k: their low 4 bits, and the top 2 in
// qh [nb][2][16][4]; q5k: unit 4 their fifth bits); scales (and minima) [nb][16] float16, or q4k's
// and q5k's bytes, or q6k's [nb][2][16] int8; the K-quants' float16 d (and dmin) [nb / 8][16].
struct Panel {
  const uint8_t *q, *qh, *sc, *mn;
  const uint16_t *d, *dmin;
  const uint8_t* u = nullptr;  // AVX2, several tiles of rows: q6k's values unpacked (unpack_q6k)
};

// Activation row m's block b: its first word in quantize_rows' lane order, the panel layouts'
// [G, M, 256], so that row m + c's is 256 c bytes further on.
static FD_INLINE const int8_t* xblock(const Args& a, int64_t m, int64_t b) {
  return a.xq + 256 * ((b / 8) * a.M + m) + 4 * (b % 8);
}
// The 4 activation bytes of values 4w..4w+3 of a block (xb: xblock's), `row` bytes further on.
static FD_INLINE int32_t xword(const int8_t* xb, int64_t row, int w) {
  return reinterpret_cast<const PanelWord*>(xb + row)[8 * w];
}

// The integer sums of activation row m's block b's values 0..15 (h = 0) and 16..31 (h = 1), from
// quantize_rows, and of the whole block.
static FD_INLINE int32_t half_sum(const Args& a, int64_t m, int64_t b, int h) {
  return a.xsums[m * ((a.nb + 7) / 8) * 16 + 16 * (b / 8) + 8 * h + b % 8];
}
static FD_INLINE int32_t block_sum(const Args& a, int64_t m, int64_t b) {
  return half_sum(a, m, b, 0) + half_sum(a, m, b, 1);
}
// Activation row m's integer block sums S_b of group g (K a multiple of 256) as int16 pairs: word k
// holds (S_8g+2k, S_8g+2k+1); |S_b| <= 32 x 127.
static FD_INLINE void sum_pairs(const Args& a, int64_t m, int64_t g, int32_t (&pairs)[4]) {
  const int32_t* s = a.xsums + 16 * (m * (a.nb / 8) + g);
  const __m256i S = _mm256_add_epi32(load32(s), load32(s + 8));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(pairs),
                   _mm_packs_epi32(_mm256_castsi256_si128(S), _mm256_extracti128_si256(S, 1)));
}

// Activation row m's half sums of group g's blocks as int16 pairs (q6k's -32 terms): word k holds
// (S_lo, S_hi) of block 8g + k, its values 0..15 and 16..31; |S| <= 16 x 127.
static FD_INLINE void half_pairs(const Args& a, int64_t m, int64_t g, int32_t (&pairs)[8]) {
  const int32_t* s = a.xsums + 16 * (m * (a.nb / 8) + g);
  const __m256i lo = _mm256_and_si256(load32(s), _mm256_set1_epi32(0xFFFF));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(pairs), _mm256_or_si256(lo, _mm256_slli_epi32(load32(s + 8), 16)));
}

// Prefetch `ahead` bytes ahead in the values' stream, and in the other streams in proportion: q6k's
// top bits, 128 bytes a block; the scales' (and minima's), 16 x kPanelScaleBytes bytes a block; d
// (and dmin), 4 bytes a block.
// far (Args::far, or q4k and q5k anywhere): the values again with prefetcht2, 4x as far. q4k's AVX2
// stream at one row fell behind without it (1.06-1.1x on Zen 4, where q6k and q4 lost 3-11% with
// it); on a Xeon every panel layout gained 1.1-1.35x at M = 1 and 8
// (benchmarks/batch_tiles/far_prefetch.md).
template <int L>
static FD_INLINE void panel_prefetch(const Panel& p, const uint8_t* pb, int64_t b, int64_t ahead, bool far) {
  constexpr int64_t S = 16 * kPanelScaleBytes<L>, V = 64 * kUnits<L>;
  auto fetch = [](const void* at) { _mm_prefetch(static_cast<const char*>(at), _MM_HINT_T0); };
  for (int l = 0; l < V; l += 64) fetch(pb + ahead + l);
  if (L == kQ4K || L == kQ5K || far)
    for (int l = 0; l < V; l += 64) _mm_prefetch(reinterpret_cast<const char*>(pb + 4 * ahead + l), _MM_HINT_T2);
  if constexpr (L == kQ6K)
    for (int l = 0; l < 128; l += 64) fetch(p.qh + 128 * b + ahead / 2 + l);
  if (b % (64 / S) == 0) {
    fetch(p.sc + S * b + ahead * S / V);
    if (kPanelMins<L>) fetch(p.mn + S * b + ahead * S / V);
  }
  if constexpr (kPanelD<L>) {
    if (b % 16) return;
    fetch(reinterpret_cast<const uint8_t*>(p.d + 2 * b) + ahead * 4 / V);
    if (kPanelMins<L>) fetch(reinterpret_cast<const uint8_t*>(p.dmin + 2 * b) + ahead * 4 / V);
  }
}

// q6k's values 4u..4u+3 of a block's two halves (lo: values 0-15, hi: 16-31) in Ops' registers,
// from a unit v of their low 4 bits and the units h0, h1 of their top bits (bits 2u, 2u + 1 of each
// byte, moved to bits 4 and 5; shifts are in 16-bit lanes, and what crosses into the next byte
// is masked).
template <int u, class O>
static FD_INLINE void q6k_values(typename O::V v, typename O::V h0, typename O::V h1, typename O::V& lo,
                                 typename O::V& hi) {
  using V = typename O::V;
  auto top = [](V h) {
    if constexpr (u < 2) return O::and_(O::template shl<4 - 2 * u>(h), O::bytes(0x30));
    else return O::and_(O::template shr<2 * u - 4>(h), O::bytes(0x30));
  };
  lo = O::or_(O::and_(v, O::bytes(0x0F)), top(h0));
  hi = O::or_(O::and_(O::template shr<4>(v), O::bytes(0x0F)), top(h1));
}

// q5k's fifth bits of unit u's values (lo: 4u..4u+3, hi: 16+4u..), bits u and 4 + u of each byte
// of `top` (the block's unit 4), moved to bit 4 (shifts in 16-bit lanes; what crosses into the
// next byte is masked).
template <int u, class O>
static FD_INLINE void fifth_bits(typename O::V top, typename O::V& lo, typename O::V& hi) {
  lo = O::or_(lo, O::and_(O::template shl<4 - u>(top), O::bytes(0x10)));
  hi = O::or_(hi, O::and_(O::template shr<u>(top), O::bytes(0x10)));
}

#if FD_VNNI
// I += v . (the 4 bytes at x, broadcast), the broadcast folded into vpdpbusd's memory operand.
static FD_INLINE void dpbusd_b(__m512i& I, __m512i v, const int8_t* x) {
  asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(I) : "v"(v), "m"(*reinterpret_cast<const PanelWord*>(x)));
}
static FD_INLINE __m512 halves16_ps(const uint16_t* p) { return _mm512_cvtph_ps(load32(p)); }  // 16 float16 -> float

// The dot products of a block of nibbles (4 units at pb; H5: q5k's, with their fifth bits in unit
// 4) with activation rows m..m+C-1 (xb: xblock's): values 0-15 into I, 16-31 into Ih (two chains:
// 1.03x at M = 8).
template <int C, bool H5 = false>
static FD_INLINE void nibble_dots(const uint8_t* pb, const int8_t* xb, __m512i (&I)[C], __m512i (&Ih)[C]) {
  const __m512i low = _mm512_set1_epi8(0x0F);
  __m512i top = low;
  if constexpr (H5) top = _mm512_loadu_si512(pb + 256);
  for (int c = 0; c < C; ++c) I[c] = Ih[c] = _mm512_setzero_si512();
  auto unit = [&]<int u>() __attribute__((always_inline)) {
    const __m512i v = _mm512_loadu_si512(pb + 64 * u);
    __m512i lo = _mm512_and_si512(v, low), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
    if constexpr (H5) fifth_bits<u, V512>(top, lo, hi);
    for (int c = 0; c < C; ++c) {
      dpbusd_b(I[c], lo, xb + 256 * c + 32 * u);
      dpbusd_b(Ih[c], hi, xb + 256 * c + 32 * (4 + u));
    }
  };
  each_chunk(unit);
}

// The K-quants' float steps of group g for activation rows m..m+C-1 from their integer sums I_g
// (super_tile's, below), the one order super_tile and amx_rows share and the twin repeats.
template <int L, int C>
static FD_INLINE void group_steps(const Panel& p, const Args& a, int64_t m, int64_t g, const __m512i (&Ig)[C],
                                  __m512 (&acc)[C]) {
  const int64_t G = a.nb / 8;
  const __m512 dg = halves16_ps(p.d + 16 * g);
  for (int c = 0; c < C; ++c) {
    const __m512 scale = _mm512_mul_ps(dg, _mm512_set1_ps(a.xd[(m + c) * G * 8 + 8 * g]));
    acc[c] = _mm512_add_ps(acc[c], _mm512_mul_ps(_mm512_cvtepi32_ps(Ig[c]), scale));
  }
  if constexpr (kPanelMins<L>) {
    const __m512i dmin = _mm512_castps_si512(halves16_ps(p.dmin + 16 * g));
    const __m512 neg = _mm512_castsi512_ps(_mm512_xor_si512(dmin, _mm512_set1_epi32(INT32_MIN)));
    __m512i mn[4];  // lane i: rows i's (mn_b, mn_b+1), b = 8g + 2k, int16
    for (int k = 0; k < 4; ++k) {
      const __m128i m0 = load16(p.mn + 16 * (8 * g + 2 * k)), m1 = load16(p.mn + 16 * (8 * g + 2 * k + 1));
      mn[k] = _mm512_cvtepu8_epi16(_mm256_set_m128i(_mm_unpackhi_epi8(m0, m1), _mm_unpacklo_epi8(m0, m1)));
    }
    for (int c = 0; c < C; ++c) {
      int32_t S[4];
      sum_pairs(a, m + c, g, S);
      __m512i Mg = _mm512_setzero_si512();
      for (int k = 0; k < 4; ++k) Mg = _mm512_dpwssd_epi32(Mg, mn[k], _mm512_set1_epi32(S[k]));
      const __m512 scale = _mm512_mul_ps(neg, _mm512_set1_ps(a.xd[(m + c) * G * 8 + 8 * g]));
      acc[c] = _mm512_add_ps(acc[c], _mm512_mul_ps(_mm512_cvtepi32_ps(Mg), scale));
    }
  }
}

// The K-quants' tile: activations with one scale per group of 8 blocks (per256), so that each
// block's integer sums take the weights' integer scales and the float scaling runs once a group g:
//   q4k, q5k: I_g = sum_b sc_b I_b, M_g = sum_b mn_b S_b (S_b: the activations' integer block sum);
//        acc = acc + float(I_g) * (d_g * xd_g);  acc = acc + float(M_g) * ((-dmin_g) * xd_g)
//   q6k: I_g = sum_b I_b;  acc = acc + float(I_g) * (d_g * xd_g), the -32 terms of I_b taken as
//        -32 (sc_lo S_lo + sc_hi S_hi) through one vpdpwssd a block (S: the halves' activation sums)
// |I_g| < 2^31 (q5k: 8 x 63 x 32 x 31 x 127; q6k: 8 x 2 x 128 x 16 x 63 x 127 before its -32
// terms); float(I_g) rounds to nearest, as the twin's conversion does. mn_b S_b pairs go through
// one vpdpwssd per 2 blocks.
template <int L, int C>
static FD_INLINE void super_tile(const Panel& p, const Args& a, int64_t m, float* y, int64_t ldy, int64_t ahead) {
  const int64_t G = a.nb / 8;
  __m512 acc[C];
  for (int c = 0; c < C; ++c) acc[c] = _mm512_setzero_ps();
  for (int64_t g = 0; g < G; ++g) {
    __m512i Ig[C];
    for (int c = 0; c < C; ++c) Ig[c] = _mm512_setzero_si512();
    int32_t S[C][8];  // q6k: half_pairs
    if constexpr (L == kQ6K)
      for (int c = 0; c < C; ++c) half_pairs(a, m + c, g, S[c]);
    for (int64_t b = 8 * g; b < 8 * g + 8; ++b) {
      const uint8_t* pb = p.q + 64 * kUnits<L> * b;
      if (ahead) panel_prefetch<L>(p, pb, b, ahead, a.far);
      const int8_t* xb = xblock(a, m, b);
      __m512i I[C];
      for (int c = 0; c < C; ++c) I[c] = _mm512_setzero_si512();
      if constexpr (L == kQ6K) {
        const __m512i h0 = _mm512_loadu_si512(p.qh + 128 * b), h1 = _mm512_loadu_si512(p.qh + 128 * b + 64);
        __m512i Ih[C];  // the second half's sums (I: the first's)
        for (int c = 0; c < C; ++c) Ih[c] = _mm512_setzero_si512();
        auto unit = [&]<int u>() __attribute__((always_inline)) {
          __m512i lo, hi;
          q6k_values<u, V512>(_mm512_loadu_si512(pb + 64 * u), h0, h1, lo, hi);
          for (int c = 0; c < C; ++c) {
            I[c] = _mm512_dpbusd_epi32(I[c], lo, _mm512_set1_epi32(xword(xb, 256 * c, u)));
            Ih[c] = _mm512_dpbusd_epi32(Ih[c], hi, _mm512_set1_epi32(xword(xb, 256 * c, 4 + u)));
          }
        };
        each_chunk(unit);
        const __m128i s0 = load16(p.sc + 32 * b), s1 = load16(p.sc + 32 * b + 16);
        const __m512i slo = _mm512_cvtepi8_epi32(s0), shi = _mm512_cvtepi8_epi32(s1);
        // lane i: row i's (-32 sc_lo, -32 sc_hi), int16 (|32 sc| <= 4096)
        const __m512i off = _mm512_mullo_epi16(
            _mm512_cvtepi8_epi16(_mm256_set_m128i(_mm_unpackhi_epi8(s0, s1), _mm_unpacklo_epi8(s0, s1))),
            _mm512_set1_epi16(-32));
        for (int c = 0; c < C; ++c) {
          const __m512i w = _mm512_add_epi32(_mm512_mullo_epi32(I[c], slo), _mm512_mullo_epi32(Ih[c], shi));
          Ig[c] = _mm512_dpwssd_epi32(_mm512_add_epi32(Ig[c], w), off, _mm512_set1_epi32(S[c][b % 8]));
        }
      } else {
        __m512i Ih[C];
        nibble_dots<C, L == kQ5K>(pb, xb, I, Ih);
        const __m512i sc = _mm512_cvtepu8_epi32(load16(p.sc + 16 * b));
        for (int c = 0; c < C; ++c) Ig[c] = _mm512_add_epi32(Ig[c], _mm512_mullo_epi32(_mm512_add_epi32(I[c], Ih[c]), sc));
      }
    }
    group_steps<L, C>(p, a, m, g, Ig, acc);
  }
  for (int c = 0; c < C; ++c) _mm512_storeu_ps(y + c * ldy, acc[c]);
}

// q4, q8 and q4s: block b's float steps from the integer sums I of C activation rows (q4s: less
// its 8 sum x already), the one order panel_tile and amx_rows share and the twin repeats. xd, xs:
// the first row's block scale and scale x sum, the next rows' rs floats apart. (Indexing each
// row's scale from Args inside the block loop instead ran the VNNI tiles 1.35-1.54x slower from 8
// rows: the compiled loop redid that arithmetic per row and block; benchmarks/serve/README.md.)
template <int L, int C>
static FD_INLINE void scale_steps(const Panel& p, int64_t b, const __m512i (&I)[C], const float* xd, const float* xs,
                                  int64_t rs, __m512 (&acc)[C], __m512 (&macc)[C]) {
  const __m512 ws = _mm512_cvtph_ps(load32(p.sc + 32 * b));
  for (int c = 0; c < C; ++c) {
    const __m512 scale = _mm512_mul_ps(ws, _mm512_set1_ps(xd[c * rs]));
    acc[c] = _mm512_add_ps(acc[c], _mm512_mul_ps(_mm512_cvtepi32_ps(I[c]), scale));
  }
  if constexpr (L == kQ4) {
    const __m512 mv = _mm512_cvtph_ps(load32(p.mn + 32 * b));
    for (int c = 0; c < C; ++c) macc[c] = _mm512_add_ps(macc[c], _mm512_mul_ps(mv, _mm512_set1_ps(xs[c * rs])));
  }
}
// The same for activation rows m..m+C-1 in quantize_rows' layout, I before q4s' -8 sum x.
template <int L, int C>
static FD_INLINE void block_steps(const Panel& p, const Args& a, int64_t m, int64_t b, const __m512i (&I)[C],
                                  __m512 (&acc)[C], __m512 (&macc)[C]) {
  const int64_t rs = (a.nb + 7) / 8 * 8;
  __m512i Ic[C];
  for (int c = 0; c < C; ++c)
    Ic[c] = L == kQ4S ? _mm512_sub_epi32(I[c], _mm512_set1_epi32(8 * block_sum(a, m + c, b))) : I[c];
  scale_steps<L, C>(p, b, Ic, a.xd + m * rs + b, a.xs + m * rs + b, rs, acc, macc);
}
template <int L, int C>
static FD_INLINE void store_rows(const __m512 (&acc)[C], const __m512 (&macc)[C], float* y, int64_t ldy) {
  for (int c = 0; c < C; ++c) _mm512_storeu_ps(y + c * ldy, L == kQ4 ? _mm512_add_ps(acc[c], macc[c]) : acc[c]);
}

// Activation rows a tile: 2 x 8 accumulators of 32 registers. q6k's three (two sums a block, and
// the group's) took 4 while its -32 terms were one subtraction per half: with them in one vpdpwssd
// a block, 8 rows ran 1.2-1.4x 4 at M = 8 to 512 (Xeon, 1B shapes, benchmarks/batch_tiles/kquant_groups.md).
template <int L>
constexpr int kPanelCols = 8;
template <int L, int C>
static FD_INLINE void panel_tile(const Panel& p, const Args& a, int64_t m, float* y, int64_t ldy, int64_t ahead) {
  if constexpr (kSuper<L>) return super_tile<L, C>(p, a, m, y, ldy, ahead);
  __m512 acc[C], macc[C];
  for (int c = 0; c < C; ++c) acc[c] = macc[c] = _mm512_setzero_ps();
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int64_t b = 0; b < a.nb; ++b) {
    const uint8_t* pb = p.q + 64 * kUnits<L> * b;
    if (ahead) panel_prefetch<L>(p, pb, b, ahead, a.far);
    const int8_t* xb = xblock(a, m, b);
    __m512i I[C];
    for (int c = 0; c < C; ++c) I[c] = _mm512_setzero_si512();
    if constexpr (L == kQ8) {
      for (int u = 0; u < 8; ++u) {
        const __m512i v = _mm512_xor_si512(_mm512_loadu_si512(pb + 64 * u), flip);  // w + 128
        for (int c = 0; c < C; ++c) I[c] = _mm512_dpbusd_epi32(I[c], v, _mm512_set1_epi32(xword(xb, 256 * c, u)));
      }
      for (int c = 0; c < C; ++c) I[c] = _mm512_sub_epi32(I[c], _mm512_set1_epi32(128 * block_sum(a, m + c, b)));
    } else {
      __m512i Ih[C];
      nibble_dots<C>(pb, xb, I, Ih);
      for (int c = 0; c < C; ++c) I[c] = _mm512_add_epi32(I[c], Ih[c]);
    }
    block_steps<L, C>(p, a, m, b, I, acc, macc);
  }
  store_rows<L, C>(acc, macc, y, ldy);
}

// AMX (Args::xa): per block one tile product (tdpbssd) of 16 activation rows (A: their 32 bytes of
// the block, from xa) and a panel's 16 rows (B: 8 rows of 4 values x 16 weight rows, amx_b's) into
// C [16][16] int32: each I_b exactly as panel_tile's, then the same float steps in the same order,
// so the same bits. A block a product, as each block has its own scales. The tile unit runs its
// loads, products and stores one after another, at about a tile row a cycle for loads, so what
// bounds it is the rows moved per product: 16 activation rows a tile ran 1.7x the rate of 8, and
// two panels sharing each A tile 1.07x more (benchmarks/serve/amx2/amx_seq.c). Two blocks'
// products go out before their stores (the default model's matmuls 1.03-1.05x). Tiles: 0-3 C
// ([block][panel]), 4-5 A (block), 6-7 B (panel). amx_config is loaded at each panel_rows call:
// other code on the thread, such as oneDNN's, may configure tiles its own way.
constexpr int kAmxRows = ::fd::kAmxTileRows, kAmxGroup = 8;
template <int L>
constexpr bool kAmx = ::fd::on_amx(static_cast<::fd::Layout>(L));
struct AmxConfig {
  uint8_t palette, start;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};
static void amx_config() {
  AmxConfig c{};
  c.palette = 1;
  for (int t = 0; t < 8; ++t) {
    c.rows[t] = t < 6 ? kAmxRows : 8;
    c.colsb[t] = t == 4 || t == 5 ? 32 : 64;  // C [16][16] int32, A [16][32] int8, B [8][64] int8
  }
  _tile_loadconfig(&c);
}
// The B tiles of a panel's nb blocks [nb][8][64] (slot: one buffer per panel of a pair): q8's units
// as stored (signed, as tdpbssd takes them); q4's, q4s', q4k's and q5k's unit u's low nibbles
// (values 4u..4u+3; q5k's with their fifth bits) as row u and high nibbles (16 + 4u..) as row 4 + u,
// unpacked once for all the activation rows; q4s' as q - 8 (-8..7), so that the products hold its
// I_b = sum q x - 8 sum x.
template <int L>
static const uint8_t* amx_b(const Panel& p, int64_t nb, int slot) {
  if constexpr (L == kQ8) return p.q;
  thread_local std::vector<uint8_t> bt[2];
  bt[slot].resize(512 * nb);
  uint8_t* to = bt[slot].data();
  const __m512i low = _mm512_set1_epi8(0x0F), off = _mm512_set1_epi8(L == kQ4S ? 8 : 0);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* pb = p.q + 64 * kUnits<L> * b;
    __m512i top = low;
    if constexpr (L == kQ5K) top = _mm512_loadu_si512(pb + 256);
    auto unit = [&]<int u>() __attribute__((always_inline)) {
      const __m512i v = _mm512_loadu_si512(pb + 64 * u);
      __m512i lo = _mm512_and_si512(v, low), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
      if constexpr (L == kQ5K) fifth_bits<u, V512>(top, lo, hi);
      _mm512_storeu_si512(to + 512 * b + 64 * u, _mm512_sub_epi8(lo, off));
      _mm512_storeu_si512(to + 512 * b + 64 * (4 + u), _mm512_sub_epi8(hi, off));
    };
    each_chunk(unit);
  }
  return to;
}
// The products of blocks b and (two) b + 1 of the activation rows at x (block b's first byte, rows
// K bytes apart) with P panels' B tiles, into to[j][panel] [16][16]. (The tile intrinsics take
// their tile numbers as literals.)
template <int P>
static FD_INLINE void amx_products(const int8_t* x, int64_t K, const uint8_t* const (&bt)[P], int64_t b, bool two,
                                   int32_t (*to)[P][256]) {
  _tile_zero(0);
  _tile_loadd(4, x, K);
  _tile_loadd(6, bt[0] + 512 * b, 64);
  _tile_dpbssd(0, 4, 6);
  if constexpr (P == 2) {
    _tile_zero(1);
    _tile_loadd(7, bt[1] + 512 * b, 64);
    _tile_dpbssd(1, 4, 7);
  }
  if (two) {
    _tile_zero(2);
    _tile_loadd(5, x + 32, K);
    _tile_loadd(6, bt[0] + 512 * (b + 1), 64);
    _tile_dpbssd(2, 5, 6);
    if constexpr (P == 2) {
      _tile_zero(3);
      _tile_loadd(7, bt[1] + 512 * (b + 1), 64);
      _tile_dpbssd(3, 5, 7);
    }
  }
  _tile_stored(0, to[0][0], 64);
  if constexpr (P == 2) _tile_stored(1, to[0][1], 64);
  if (two) {
    _tile_stored(2, to[1][0], 64);
    if constexpr (P == 2) _tile_stored(3, to[1][1], 64);
  }
}
// P panels (y: the first one's column; panel i's are 16 i further) against activation rows in
// tiles of 16: a group of kAmxGroup blocks' products, then their float steps for 8 rows of one
// panel at a time, whose accumulators wait in memory between groups. (The tile unit and the vector
// units did not overlap when the passes went between the next group's products: 0.9x.) Returns
// the rows done (a multiple of 16; the VNNI tiles take the rest).
template <int L, int P>
static int64_t amx_rows(const Panel (&p)[P], const Args& a, float* y, int64_t ldy) {
  const int64_t K = 32 * a.nb, rows = a.M / kAmxRows * kAmxRows;
  const uint8_t* bt[P];
  for (int i = 0; i < P; ++i) bt[i] = amx_b<L>(p[i], a.nb, i);
  alignas(64) int32_t sums[kAmxGroup][P][256];
  // [panel][rows 0-7, 8-15][acc, macc][row][column]; only q4 has minima (macc), so only q4's move
  constexpr bool mins = L == kQ4;
  alignas(64) float accs[P][2][2][8][16];
  __m512 acc[8], macc[8];
  for (int c = 0; c < 8; ++c) macc[c] = _mm512_setzero_ps();
  auto load = [&](int i, int h) __attribute__((always_inline)) {
    for (int c = 0; c < 8; ++c) {
      acc[c] = _mm512_load_ps(accs[i][h][0][c]);
      if constexpr (mins) macc[c] = _mm512_load_ps(accs[i][h][1][c]);
    }
  };
  for (int64_t m = 0; m < rows; m += kAmxRows) {
    std::memset(accs, 0, sizeof accs);
    for (int64_t g = 0; g < a.nb; g += kAmxGroup) {
      const int64_t n = std::min<int64_t>(kAmxGroup, a.nb - g);
      for (int64_t j = 0; j < n; j += 2)
        amx_products<P>(a.xa + m * K + 32 * (g + j), K, bt, g + j, j + 1 < n, sums + j);
      for (int i = 0; i < P; ++i)
        for (int h = 0; h < 2; ++h) {
          load(i, h);
          if constexpr (kSuper<L>) {  // q4k, q5k: the group is the K-quants' group g / 8
            static_assert(kAmxGroup == 8, "the K-quants' steps take their groups of 8 blocks");
            __m512i Ig[8];
            for (int c = 0; c < 8; ++c) Ig[c] = _mm512_setzero_si512();
            for (int64_t b = g; b < g + n; ++b) {
              const __m512i sc = _mm512_cvtepu8_epi32(load16(p[i].sc + 16 * b));  // I_g = sum_b sc_b I_b
              for (int c = 0; c < 8; ++c) {
                const __m512i I = _mm512_load_si512(sums[b - g][i] + 16 * (8 * h + c));
                Ig[c] = _mm512_add_epi32(Ig[c], _mm512_mullo_epi32(I, sc));
              }
            }
            group_steps<L, 8>(p[i], a, m + 8 * h, g / 8, Ig, acc);
          } else {
            for (int64_t b = g; b < g + n; ++b) {
              __m512i I[8];
              for (int c = 0; c < 8; ++c) I[c] = _mm512_load_si512(sums[b - g][i] + 16 * (8 * h + c));
              const int64_t at = ((m / kAmxRows) * a.nb + b) * kAmxRows + 8 * h;  // xt's [tile][block][row]
              scale_steps<L, 8>(p[i], b, I, a.xt + at, a.xt + at + rows * a.nb, 1, acc, macc);
            }
          }
          for (int c = 0; c < 8; ++c) {
            _mm512_store_ps(accs[i][h][0][c], acc[c]);
            if constexpr (mins) _mm512_store_ps(accs[i][h][1][c], macc[c]);
          }
        }
    }
    for (int i = 0; i < P; ++i)
      for (int h = 0; h < 2; ++h) {
        load(i, h);
        store_rows<L, 8>(acc, macc, y + (m + 8 * h) * ldy + kPanelRows * i, ldy);
      }
  }
  return rows;
}
#else
// AVX2, q6k's panels against several tiles of activation rows: the values unpacked once per call,
// one byte each ([nb][4 units][2 halves][lo, hi][32]), which each tile's loop would otherwise
// rebuild from the low nibbles and the top bits (~5 vector operations a unit and half), so that
// the tiles load them. The sums and float steps are the same, so are the bits. From 12 rows, one
// thread: 1.08-1.10x at 12 to 16 rows, 1.18-1.2x at 160 (benchmarks/batch_tiles/unpacked.md). q4, q4s,
// q4k and q5k, whose nibbles take 3 operations a unit (q5k's fifth bits 4 more), ran level or slower.
constexpr int64_t kUnpackedUnit = 128, kUnpackedBlock = 4 * kUnpackedUnit, kUnpackMinRows = 12;
static void unpack_q6k(const Panel& p, const Args& a, int64_t ahead, uint8_t* u) {
  for (int64_t b = 0; b < a.nb; ++b) {
    const uint8_t* pb = p.q + 256 * b;
    if (ahead) panel_prefetch<kQ6K>(p, pb, b, ahead, a.far);
    for (int h = 0; h < 2; ++h) {
      const __m256i h0 = load32(p.qh + 128 * b + 32 * h), h1 = load32(p.qh + 128 * b + 64 + 32 * h);
      auto unit = [&]<int w>() __attribute__((always_inline)) {
        __m256i lo, hi;
        q6k_values<w, V256>(load32(pb + 64 * w + 32 * h), h0, h1, lo, hi);
        uint8_t* to = u + kUnpackedBlock * b + kUnpackedUnit * w + 64 * h;
        _mm256_store_si256(reinterpret_cast<__m256i*>(to), lo);
        _mm256_store_si256(reinterpret_cast<__m256i*>(to + 32), hi);
      };
      each_unit<0, 4>(unit);
    }
  }
}

// The int16 pair sums P[i][c] of units U0..U0+NU-1 of a block of nibbles (at pb; H5: q5k's, with
// their fifth bits in unit 4) for the panel's rows 8h..8h+7, h = H0 + i for NH halves, against
// activation rows m..m+C-1 (xb: xblock's). maddubs's pair sums over a block's 4 units stay below
// 2^15 (2 x 15 x 127 x 2 x 4 = 30480); with fifth bits, over 2 units (2 x 31 x 127 x 2 x 2 = 31496).
template <int C, int U0 = 0, int NU = 4, bool H5 = false, int NH = 2>
static FD_INLINE void nibble_sums(const uint8_t* pb, const int8_t* xb, __m256i (&P)[NH][C], int H0 = 0) {
  static_assert(NU <= (H5 ? 2 : 4), "the int16 pair sums would overflow");
  const __m256i low = _mm256_set1_epi8(0x0F);
  __m256i top[NH];
  if constexpr (H5)
    for (int i = 0; i < NH; ++i) top[i] = load32(pb + 256 + 32 * (H0 + i));
  auto unit = [&]<int u>() __attribute__((always_inline)) {
    for (int i = 0; i < NH; ++i) {
      const __m256i v = load32(pb + 64 * u + 32 * (H0 + i));
      __m256i lo = _mm256_and_si256(v, low), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
      if constexpr (H5) fifth_bits<u, V256>(top[i], lo, hi);
      for (int c = 0; c < C; ++c) {
        const __m256i t = _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_set1_epi32(xword(xb, 256 * c, u))),
                                           _mm256_maddubs_epi16(hi, _mm256_set1_epi32(xword(xb, 256 * c, 4 + u))));
        P[i][c] = u == U0 ? t : _mm256_add_epi16(P[i][c], t);
        // Unit by unit: left free, GCC computed every unit's products first and spilled them
        // (a fifth of q4k's samples at C = 4 were on stack loads and stores).
        __asm__("" : "+x"(P[i][c]));
      }
    }
  };
  each_unit<U0, NU>(unit);
}

// q6k's block sums I [C] of block b for the panel's rows 8h..8h+7 (one per lane) against
// activation rows m..m+C-1. maddubs's pairs reach 2 x 63 x 127, so two units' sums stay below
// 2^15; madd against the half's scale (in both 16-bit halves of each row's lane) widens them, and
// 32 (sc_lo sum_lo x + sc_hi sum_hi x) comes off from one madd of the (sc_lo, sc_hi) pairs and
// the activations' half sums (S: the group's half_pairs).
template <int C, bool Un = false>
static FD_INLINE void q6k_sums(const Panel& p, const Args& a, int64_t m, int64_t b, int h, const int32_t (&S)[C][8],
                                __m256i (&I)[C]) {
  const int8_t* xb = xblock(a, m, b);
  const uint8_t* pb = p.q + 256 * b + 32 * h;
  static_assert(!Un || C > 1, "unpacked values serve tiles of several rows (unpacked_rows)");
  const uint8_t* ub = Un ? p.u + kUnpackedBlock * b + 64 * h : nullptr;
  const __m256i h0 = load32(p.qh + 128 * b + 32 * h), h1 = load32(p.qh + 128 * b + 64 + 32 * h);
  const __m128i s0 = load8(p.sc + 32 * b + 8 * h), s1 = load8(p.sc + 32 * b + 16 + 8 * h);
  const __m256i sc0 = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(s0, s0));
  const __m256i sc1 = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(s1, s1));
  __m256i Pl[C], Ph[C];
  auto unit = [&]<int u>() __attribute__((always_inline)) {
    __m256i lo, hi;
    q6k_values<u, V256>(load32(pb + 64 * u), h0, h1, lo, hi);
    for (int c = 0; c < C; ++c) {
      const __m256i tl = _mm256_maddubs_epi16(lo, _mm256_set1_epi32(xword(xb, 256 * c, u)));
      const __m256i th = _mm256_maddubs_epi16(hi, _mm256_set1_epi32(xword(xb, 256 * c, 4 + u)));
      Pl[c] = u % 2 ? _mm256_add_epi16(Pl[c], tl) : tl;
      Ph[c] = u % 2 ? _mm256_add_epi16(Ph[c], th) : th;
      if constexpr (u % 2 == 1) {
        const __m256i w = _mm256_add_epi32(_mm256_madd_epi16(Pl[c], sc0), _mm256_madd_epi16(Ph[c], sc1));
        I[c] = u == 1 ? w : _mm256_add_epi32(I[c], w);
      }
    }
  };
  if constexpr (C == 1) {
    each_chunk(unit);
  } else {  // values 0-15 over the 4 units, then 16-31: C rows' pair sums live at a time, not 2 C
    // (Pl and Ph for 4 rows spilled; this ran the 1B shapes' q6k 1.4x faster at M = 8 on a Zen 3)
    auto part = [&]<int half>() __attribute__((always_inline)) {
      const __m256i top = half ? h1 : h0, sc = half ? sc1 : sc0;
      __m256i P[C];
      auto part_unit = [&]<int u>() __attribute__((always_inline)) {
        __m256i v;
        if constexpr (Un) {
          v = load32(ub + kUnpackedUnit * u + 32 * half);
        } else {
          __m256i lo, hi;
          q6k_values<u, V256>(load32(pb + 64 * u), top, top, lo, hi);
          v = half ? hi : lo;
        }
        for (int c = 0; c < C; ++c) {
          const __m256i t = _mm256_maddubs_epi16(v, _mm256_set1_epi32(xword(xb, 256 * c, 4 * half + u)));
          P[c] = u % 2 ? _mm256_add_epi16(P[c], t) : t;
          if constexpr (u % 2 == 1) {
            const __m256i w = _mm256_madd_epi16(P[c], sc);
            I[c] = half == 0 && u == 1 ? w : _mm256_add_epi32(I[c], w);
          }
        }
      };
      each_chunk(part_unit);
    };
    part.template operator()<0>();
    part.template operator()<1>();
  }
  const __m256i pairs = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(s0, s1));  // lane i: (sc_lo, sc_hi) of row i
  for (int c = 0; c < C; ++c) {
    const __m256i off = _mm256_madd_epi16(pairs, _mm256_set1_epi32(S[c][b % 8]));
    I[c] = _mm256_sub_epi32(I[c], _mm256_slli_epi32(off, 5));
  }
}

// The K-quants' tiles' loops. One activation row (H = 2): both halves of the panel per block, so
// that the weights stream (and are prefetched) throughout (q6k half after half: 0.6x). Several
// (H = 1): one half of the panel's rows over all its blocks, then the other, so that C rows'
// sums fit the 16 registers (q6k with both halves at once, 2 rows a tile, spilled: 0.8x the lane
// tiles at M = 8; q4k's 4 rows with both halves had a third of its samples on stack loads and
// stores, and half by half ran the 1B shapes 1.26-1.44x faster at M = 8 on a Zen 3). Per pass
// (halves h0..h0+H-1) and group g: sums(h0, g, Ig) adds the group's integer sums into Ig [H][C]
// (zeroed), then steps(h0, g, Ig, acc) scales them into the float accumulators acc [H][C];
// y [C][16] at the end.
template <int C>
constexpr int kHalves = C == 1 ? 2 : 1;
template <int C, class Sums, class Steps>
static FD_INLINE void half_passes(const Args& a, float* y, int64_t ldy, const Sums& sums, const Steps& steps) {
  constexpr int H = kHalves<C>;
  for (int h0 = 0; h0 < 2; h0 += H) {
    __m256 acc[H][C];
    for (int i = 0; i < H; ++i)
      for (int c = 0; c < C; ++c) acc[i][c] = _mm256_setzero_ps();
    for (int64_t g = 0; g < a.nb / 8; ++g) {
      __m256i Ig[H][C];
      for (int i = 0; i < H; ++i)
        for (int c = 0; c < C; ++c) Ig[i][c] = _mm256_setzero_si256();
      sums(h0, g, Ig);
      steps(h0, g, Ig, acc);
    }
    for (int i = 0; i < H; ++i)
      for (int c = 0; c < C; ++c) _mm256_storeu_ps(y + c * ldy + 8 * (h0 + i), acc[i][c]);
  }
}

// q6k's tile (super_tile's sums on VNNI).
template <int C, bool Un>
static FD_INLINE void q6k_tile(const Panel& p, const Args& a, int64_t m, float* y, int64_t ldy, int64_t ahead) {
  constexpr int H = kHalves<C>;
  const int64_t G = a.nb / 8;
  auto sums = [&](int h0, int64_t g, __m256i (&Ig)[H][C]) __attribute__((always_inline)) {
    int32_t S[C][8];
    for (int c = 0; c < C; ++c) half_pairs(a, m + c, g, S[c]);
    for (int64_t b = 8 * g; b < 8 * g + 8; ++b) {
      if (ahead && h0 == 0) panel_prefetch<kQ6K>(p, p.q + 256 * b, b, ahead, a.far);
      for (int i = 0; i < H; ++i) {
        __m256i I[C];
        q6k_sums<C, Un>(p, a, m, b, h0 + i, S, I);
        for (int c = 0; c < C; ++c) Ig[i][c] = _mm256_add_epi32(Ig[i][c], I[c]);
      }
    }
  };
  auto steps = [&](int h0, int64_t g, const __m256i (&Ig)[H][C], __m256 (&acc)[H][C]) __attribute__((always_inline)) {
    for (int i = 0; i < H; ++i) {
      const __m256 dg = scales8(p.d + 16 * g + 8 * (h0 + i));
      for (int c = 0; c < C; ++c) {
        const __m256 scale = _mm256_mul_ps(dg, _mm256_set1_ps(a.xd[(m + c) * G * 8 + 8 * g]));
        acc[i][c] = _mm256_add_ps(acc[i][c], _mm256_mul_ps(_mm256_cvtepi32_ps(Ig[i][c]), scale));
      }
    }
  };
  half_passes<C>(a, y, ldy, sums, steps);
}

// q4k's and q5k's tile: panel_tile's q4 sums (q5k's per 2 units), each block's taken through madd
// against its 6-bit scales (in both 16-bit halves of each row's lane), then super_tile's float
// steps once a group.
template <int L, int C>
static FD_INLINE void q4k_tile(const Panel& p, const Args& a, int64_t m, float* y, int64_t ldy, int64_t ahead) {
  constexpr int H = kHalves<C>;
  const int64_t G = a.nb / 8;
  auto sums = [&](int h0, int64_t g, __m256i (&Ig)[H][C]) __attribute__((always_inline)) {
    for (int64_t b = 8 * g; b < 8 * g + 8; ++b) {
      const uint8_t* pb = p.q + 64 * kUnits<L> * b;
      if (ahead && h0 == 0) panel_prefetch<L>(p, pb, b, ahead, a.far);
      const int8_t* xb = xblock(a, m, b);
      __m256i scp[H];
      for (int i = 0; i < H; ++i) {
        const __m128i sc = load8(p.sc + 16 * b + 8 * (h0 + i));
        scp[i] = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(sc, sc));
      }
      __m256i P[H][C];
      auto add = [&]() __attribute__((always_inline)) {
        for (int i = 0; i < H; ++i)
          for (int c = 0; c < C; ++c) Ig[i][c] = _mm256_add_epi32(Ig[i][c], _mm256_madd_epi16(P[i][c], scp[i]));
      };
      if constexpr (L == kQ5K) {
        nibble_sums<C, 0, 2, true, H>(pb, xb, P, h0);
        add();
        nibble_sums<C, 2, 2, true, H>(pb, xb, P, h0);
      } else {
        nibble_sums<C, 0, 4, false, H>(pb, xb, P, h0);
      }
      add();
    }
  };
  auto steps = [&](int h0, int64_t g, const __m256i (&Ig)[H][C], __m256 (&acc)[H][C]) __attribute__((always_inline)) {
    int32_t S[C][4];
    for (int c = 0; c < C; ++c) sum_pairs(a, m + c, g, S[c]);
    for (int i = 0; i < H; ++i) {
      const int h = h0 + i;
      const __m256 dg = scales8(p.d + 16 * g + 8 * h);
      const __m256 neg = _mm256_xor_ps(scales8(p.dmin + 16 * g + 8 * h), _mm256_set1_ps(-0.f));
      __m256i mn[4];  // lane i: row 8h + i's (mn_b, mn_b+1), b = 8g + 2k, int16
      for (int k = 0; k < 4; ++k)
        mn[k] = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(load8(p.mn + 16 * (8 * g + 2 * k) + 8 * h),
                                                         load8(p.mn + 16 * (8 * g + 2 * k + 1) + 8 * h)));
      for (int c = 0; c < C; ++c) {
        const __m256 xd = _mm256_set1_ps(a.xd[(m + c) * G * 8 + 8 * g]);
        acc[i][c] = _mm256_add_ps(acc[i][c], _mm256_mul_ps(_mm256_cvtepi32_ps(Ig[i][c]), _mm256_mul_ps(dg, xd)));
        __m256i Mg = _mm256_madd_epi16(mn[0], _mm256_set1_epi32(S[c][0]));
        for (int k = 1; k < 4; ++k) Mg = _mm256_add_epi32(Mg, _mm256_madd_epi16(mn[k], _mm256_set1_epi32(S[c][k])));
        acc[i][c] = _mm256_add_ps(acc[i][c], _mm256_mul_ps(_mm256_cvtepi32_ps(Mg), _mm256_mul_ps(neg, xd)));
      }
    }
  };
  half_passes<C>(a, y, ldy, sums, steps);
}

// 16 registers: both halves' 2 x 2 x 2 accumulators, the unpacked weights. The K-quants' tiles take
// 4 rows, one half of the panel at a time (q4k_tile, q6k_tile; q4 at 4 rows: 0.98-1.08x, left at 2).
template <int L>
constexpr int kPanelCols = kSuper<L> ? 4 : 2;
// Rows 8h..8h+7 of the panel in each half h, both halves per block, so that each activation word
// is broadcast once. q4: maddubs's int16 pair sums over a block's 4 units stay below 2^15
// (2 x 15 x 127 x 2 x 4 = 30480) before madd widens them. q8: |w| against x signed as w (the
// pairs reach 2 x 128 x 127), widened every unit.
template <int L, int C, bool Un = false>
static FD_INLINE void panel_tile(const Panel& p, const Args& a, int64_t m, float* y, int64_t ldy, int64_t ahead) {
  if constexpr (L == kQ6K) return q6k_tile<C, Un>(p, a, m, y, ldy, ahead);
  if constexpr (L == kQ4K || L == kQ5K) return q4k_tile<L, C>(p, a, m, y, ldy, ahead);
  const int64_t G = (a.nb + 7) / 8;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[2][C], macc[2][C];
  for (int h = 0; h < 2; ++h)
    for (int c = 0; c < C; ++c) acc[h][c] = macc[h][c] = _mm256_setzero_ps();
  for (int64_t b = 0; b < a.nb; ++b) {
    const uint8_t* pb = p.q + 64 * kUnits<L> * b;
    if (ahead) panel_prefetch<L>(p, pb, b, ahead, a.far);
    const int8_t* xb = xblock(a, m, b);
    __m256i I[2][C];
    if constexpr (L == kQ8) {
      for (int u = 0; u < 8; ++u) {
        __m256i x[C];
        for (int c = 0; c < C; ++c) x[c] = _mm256_set1_epi32(xword(xb, 256 * c, u));
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
      nibble_sums<C>(pb, xb, P);
      for (int c = 0; c < C; ++c) {
        const __m256i off = _mm256_set1_epi32(L == kQ4S ? 8 * block_sum(a, m + c, b) : 0);  // q4s: q - 8
        for (int h = 0; h < 2; ++h) I[h][c] = _mm256_sub_epi32(_mm256_madd_epi16(P[h][c], ones), off);
      }
    }
    for (int h = 0; h < 2; ++h) {
      const __m256 ws = scales8(p.sc + 32 * b + 16 * h);
      for (int c = 0; c < C; ++c) {
        const int64_t at = (m + c) * G * 8 + b;
        const __m256 scale = _mm256_mul_ps(ws, _mm256_set1_ps(a.xd[at]));
        acc[h][c] = _mm256_add_ps(acc[h][c], _mm256_mul_ps(_mm256_cvtepi32_ps(I[h][c]), scale));
      }
      if constexpr (kPanelMins<L>) {
        const __m256 mv = scales8(p.mn + 32 * b + 16 * h);
        for (int c = 0; c < C; ++c)
          macc[h][c] = _mm256_add_ps(macc[h][c], _mm256_mul_ps(mv, _mm256_set1_ps(a.xs[(m + c) * G * 8 + b])));
      }
    }
  }
  for (int h = 0; h < 2; ++h)
    for (int c = 0; c < C; ++c)
      _mm256_storeu_ps(y + c * ldy + 8 * h, kPanelMins<L> ? _mm256_add_ps(acc[h][c], macc[h][c]) : acc[h][c]);
}
#endif

#if !FD_VNNI
// q6k's whole tiles of rows m.. on the panel's unpacked values; returns the first row left. Not
// inlined: in one function with the packed tiles, GCC spilled the one-row tile's registers
// (0.86-0.9x at M = 1 and 8 when q5k took this path too).
__attribute__((noinline)) static int64_t unpacked_rows(const Panel& p, const Args& a, float* y, int64_t ldy,
                                                       int64_t ahead, int64_t m) {
  struct alignas(32) Chunk {
    uint8_t b[32];
  };
  thread_local std::vector<Chunk> buf;  // 512 bytes a block: 1 MB at K = 65536
  buf.resize(kUnpackedBlock / 32 * a.nb);
  Panel up = p;
  up.u = buf.data()->b;
  unpack_q6k(p, a, m == 0 ? ahead : 0, buf.data()->b);
  constexpr int C = kPanelCols<kQ6K>;
  for (; a.M - m >= C; m += C) panel_tile<kQ6K, C, true>(up, a, m, y + m * ldy, ldy, 0);
  return m;
}
#endif

// One panel against activation rows m.. in tiles of up to kPanelCols rows; y [M, ldy] from its
// first column. `ahead`: bytes to prefetch ahead in the values' stream (0: none).
template <int L>
static void tile_rows(const Panel& p, const Args& a, float* y, int64_t ldy, int64_t ahead, int64_t m) {
#if !FD_VNNI
  if constexpr (L == kQ6K)
    if (a.M - m >= kUnpackMinRows) m = unpacked_rows(p, a, y, ldy, ahead, m);
#endif
  for (; m < a.M;) {
    const int64_t left = a.M - m, first = m == 0 ? ahead : 0;
    float* ym = y + m * ldy;
    if (left >= kPanelCols<L>) { panel_tile<L, kPanelCols<L>>(p, a, m, ym, ldy, first); m += kPanelCols<L>; }
    else if (kPanelCols<L> > 4 && left >= 4) { panel_tile<L, 4>(p, a, m, ym, ldy, first); m += 4; }
    else if (left >= 2) { panel_tile<L, 2>(p, a, m, ym, ldy, first); m += 2; }
    else { panel_tile<L, 1>(p, a, m, ym, ldy, first); m += 1; }
  }
}

// One panel against all M activation rows (AMX first where Args::xa is set).
template <int L>
static void panel_all_rows(const Panel& p, const Args& a, float* y, int64_t ldy, int64_t ahead) {
  int64_t m = 0;
#if FD_VNNI
  if constexpr (kAmx<L>)
    if (a.xa) m = amx_rows<L, 1>({p}, a, y, ldy);
#endif
  tile_rows<L>(p, a, y, ldy, ahead, m);
}

// Panel p of row n (a multiple of 16): each stream where row n's would start.
template <int L>
static FD_INLINE Panel panel_at(const Args& a, int64_t n) {
  const int64_t ns = a.nb / 8;
  return Panel{a.q + n * a.qs, L == kQ6K ? a.qh + n * a.qhs : nullptr, a.sc + kPanelScaleBytes<L> * n * a.nb,
               kPanelMins<L> ? a.mn + kPanelScaleBytes<L> * n * a.nb : nullptr, kPanelD<L> ? a.d + n * ns : nullptr,
               kPanelMins<L> && kPanelD<L> ? a.dmin + n * ns : nullptr};
}

// Output rows [n0, n1) of a matmul in panels: n0 a multiple of 16, n1 one too or N. A last panel
// of r < 16 rows (each stream stored [w][r] for w entries a row) is copied into a zero-padded full
// one ([w][16]) first; its outputs go through a buffer [M, 16].
template <int L>
static void panel_rows(const Args& a, int64_t n0, int64_t n1) {
  constexpr int64_t U = kUnits<L>, es = kPanelScaleBytes<L>;
  const int64_t nb = a.nb, last = n1 == a.N && a.N % kPanelRows ? n1 - a.N % kPanelRows : n1;
  // Prefetch 16 blocks ahead (q8 at 8 blocks ran 0.88x the lane tiles at M = 4, streamed from DRAM).
#if FD_VNNI
  if (a.xa) amx_config();
#endif
  for (int64_t n = n0; n < last; n += kPanelRows) {
#if FD_VNNI
    if constexpr (kAmx<L>)
      if (a.xa && n + 2 * kPanelRows <= last) {  // two panels a pass
        const Panel two[2] = {panel_at<L>(a, n), panel_at<L>(a, n + kPanelRows)};
        const int64_t m = amx_rows<L, 2>(two, a, a.y + n, a.N);
        for (int i = 0; i < 2; ++i) tile_rows<L>(two[i], a, a.y + n + kPanelRows * i, a.N, 0, m);
        n += kPanelRows;
        continue;
      }
#endif
    panel_all_rows<L>(panel_at<L>(a, n), a, a.y + n, a.N, n + kPanelRows < last ? 1024 * U : 0);
  }
  if (last == n1) return;
  const int64_t r = n1 - last, ns = nb / 8;
  thread_local std::vector<uint8_t> q, qh, s;
  thread_local std::vector<float> y;
  q.assign(64 * U * nb, 0);
  qh.assign(L == kQ6K ? 128 * nb : 0, 0);
  // sc, mn (nb entries of es bytes), d, dmin (ns of 2)
  s.assign(2 * kPanelRows * (es * nb + 2 * ns), 0);
  y.resize(kPanelRows * a.M);
  // entries of `bytes` each, w a row: [w][r] at src -> [w][16] at dst
  auto pad = [r](uint8_t* dst, const void* src, int64_t bytes, int64_t w) {
    for (int64_t i = 0; i < w; ++i)
      std::memcpy(dst + kPanelRows * bytes * i, static_cast<const uint8_t*>(src) + r * bytes * i, r * bytes);
  };
  const Panel from = panel_at<L>(a, last);
  pad(q.data(), from.q, 4, U * nb);
  if (L == kQ6K) pad(qh.data(), from.qh, 4, 2 * nb);
  uint8_t *sc = s.data(), *mn = sc + kPanelRows * es * nb, *d = mn + kPanelRows * es * nb;
  uint8_t* dmin = d + kPanelRows * 2 * ns;
  if (L == kQ6K) pad(sc, from.sc, 1, 2 * nb);  // int8 [2 nb][r]
  else pad(sc, from.sc, es, nb);
  if (kPanelMins<L>) pad(mn, from.mn, es, nb);
  if (kPanelD<L>) pad(d, from.d, 2, ns);
  if (kPanelMins<L> && kPanelD<L>) pad(dmin, from.dmin, 2, ns);
  const Panel p{q.data(), qh.data(), sc, mn, reinterpret_cast<const uint16_t*>(d),
                reinterpret_cast<const uint16_t*>(dmin)};
  panel_all_rows<L>(p, a, y.data(), kPanelRows, 0);
  for (int64_t m = 0; m < a.M; ++m) std::memcpy(a.y + m * a.N + last, &y[kPanelRows * m], 4 * r);
}
