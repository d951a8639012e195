// Block-quantized matmul body, included once per instruction set, by
// quant_avx2.cpp and quant_vnni.cpp, inside a `#pragma GCC target` region
// (FD_VNNI selects the int8 dot product).
//
// Every layout but q4, q8, q4s and the K-quants (quant/formats.py; those are stored in panels:
// quant_panel.h) stores a row's blocks in groups of 8, one
// block per 32-bit lane, values by sub-step (values 4i..4i+3 of each block), so
// that a 32-byte register holds the next 4 values of 8 blocks. Summing the
// integer dot products of the 8 sub-steps in int32 leaves each block's exact
// sum I_b in its own lane; then, for each (activation row m, weight row n):
//
//   acc[j]  = acc[j]  + float(I_b) * (w_scale_b * x_scale_b)      lane j = b mod 8
//   macc[j] = macc[j] + w_min_b * x_sum_b                          (layouts with minima)
//   y = hsum(acc) [+ hsum(macc)]
//
// groups in order. Every (m, n) runs these float operations in this order
// whatever the tile shape, M, thread count or instruction set, so results do
// not depend on them, and the PyTorch twin in quant/reference.py gives the
// same bits. A last group of g < 8 blocks is read with masked loads (and the
// activations are padded with zeros), so its empty lanes add +0.
//
// I_b per layout (q: the stored unsigned values; x: int8 activations):
//   q5 (0..31): sum q x;  q5s: sum q x - 16 sum x
//   q4nl, q4xs: sum v[q] x, v IQ4_NL's 16 int8 values (value_table), q the stored index 0..15
//   q4mx: the same with MXFP4's 16 values (E2M1's doubled, -12..12), its block scale 2^(e - 128)

// (the including file has <cstring>, <algorithm>, <immintrin.h>)
#include "simd.h"

using Args = ::fd::QuantArgs;
constexpr int kQ4 = ::fd::kQ4, kQ8 = ::fd::kQ8, kQ4K = ::fd::kQ4K, kQ5K = ::fd::kQ5K, kQ6K = ::fd::kQ6K,
              kQ5 = ::fd::kQ5, kQ5S = ::fd::kQ5S, kQ4S = ::fd::kQ4S, kQ4NL = ::fd::kQ4NL,
              kQ4XS = ::fd::kQ4XS, kQ4MX = ::fd::kQ4MX;

template <int L>
constexpr bool kPlane5 = L == kQ5 || L == kQ5S;
template <int L>
constexpr bool kMins = L == kQ5;
template <int L>
constexpr bool kKQuant = L == kQ4XS;  // as the K-quants: per-256 d, 8-bit block scales
template <int L>
constexpr bool kNonLinear = L == kQ4NL || L == kQ4XS || L == kQ4MX;  // nibbles index a table (value_table)
// Bytes per group and row of qweight (nibbles), qhigh, and of one per-block scale.
template <int L>
constexpr int64_t kGroupBytes = 128;
template <int L>
constexpr int64_t kHighBytes = kPlane5<L> ? 32 : 0;
template <int L>
constexpr int64_t kScaleBytes = kKQuant<L> || L == kQ4MX ? 1 : 2;  // q4xs' 8-bit sc, q4mx's e; the others' float16
// Layouts whose weights are signed bytes by the time they meet the activations (q4nl, q4xs and
// q4mx after their table lookup).
template <int L>
constexpr bool kSigned = kNonLinear<L>;
// log2 of the offset of layouts whose stored values are offset (q5s: q - 16; the signed layouts
// on VNNI, whose unsigned operand is w + 128): I_b takes it off through the activations' block
// sums.
template <int L>
constexpr int kOffsetShift = L == kQ5S ? 4 : (kSigned<L> && FD_VNNI) ? 7 : 0;
#if !FD_VNNI
// AVX2: maddubs's int16 pair sums are added in int16 for this many sub-steps before
// madd widens them (each pair is at most 2 * qmax * 127; the run stays below 2^15: q4mx's
// |v| <= 12 gives 8 x 3048).
template <int L>
constexpr int kRun = L == kQ4MX ? 8 : kSigned<L> ? 1 : 4;
#endif

#define FD_INLINE inline __attribute__((always_inline))

static inline __m256i load32(const void* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
static inline __m128i load16(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }
static inline __m128i load8(const void* p) { return _mm_loadl_epi64(static_cast<const __m128i*>(p)); }  // upper half 0

static inline __m256 scales8(const void* p) {  // 8 float16 -> float
  return _mm256_cvtph_ps(_mm_loadu_si128(static_cast<const __m128i*>(p)));
}
static inline __m256 sbytes8_ps(const void* p) {  // 8 int8 -> float
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(static_cast<const __m128i*>(p))));
}

// One weight row: where its bytes start; group G's are at q + G * kGroupBytes and so on.
struct Row {
  const uint8_t *q, *qh, *sc, *mn;
  const uint16_t* d;  // q4xs' per-group d
};

template <int L>
static inline Row row_at(const Args& a, int64_t n) {
  constexpr int64_t es = kScaleBytes<L>;
  return Row{a.q + n * a.qs, kHighBytes<L> > 0 ? a.qh + n * a.qhs : nullptr, a.sc + es * n * a.scs,
             kMins<L> ? a.mn + es * n * a.scs : nullptr, kKQuant<L> ? a.d + n * (a.nb / 8) : nullptr};
}

// A last group of g < 8 blocks (q4nl, q4mx, q5, q5s only: q4xs' K is a multiple of 256)
// is stored packed: its 32-byte units hold 4 g bytes each, one 4-byte lane per block. It is
// read with masked loads, so the empty lanes hold zeros, as the twin's zero padding does.
static FD_INLINE __m256i lanes_below(int g) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(g), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// 32-byte unit i of a row's group: a full group's, or a tail's (T) g lanes.
template <bool T>
static FD_INLINE __m256i wload(const uint8_t* q, int i, int g) {
  if constexpr (T) return _mm256_maskload_epi32(reinterpret_cast<const int*>(q + 4 * g * i), lanes_below(g));
  else return load32(q + 32 * i);
}

// The 8 per-block float16 scales (or minima) at p; a tail's g of them, the other lanes 0.
template <bool T>
static FD_INLINE __m256 scales8_at(const void* p, int g) {
  if constexpr (!T) {
    return scales8(p);
  } else {  // g halves: their 32-bit pairs, the odd one's upper half cleared
    const __m128i pairs = _mm_cmpgt_epi32(_mm_set1_epi32((g + 1) / 2), _mm_setr_epi32(0, 1, 2, 3));
    const __m128i halves = _mm_cmpgt_epi16(_mm_set1_epi16(static_cast<short>(g)), _mm_setr_epi16(0, 1, 2, 3, 4, 5, 6, 7));
    const __m128i v = _mm_maskload_epi32(static_cast<const int*>(p), pairs);
    return _mm256_cvtph_ps(_mm_and_si128(v, halves));
  }
}

// The byte operations of wchunk on 256-bit registers, and on VNNI on 512-bit ones too
// (two_groups: two groups a register).
struct V256 {
  using V = __m256i;
  static FD_INLINE V bytes(int b) { return _mm256_set1_epi8(static_cast<char>(b)); }
  static FD_INLINE V and_(V a, V b) { return _mm256_and_si256(a, b); }
  static FD_INLINE V or_(V a, V b) { return _mm256_or_si256(a, b); }
  static FD_INLINE V xor_(V a, V b) { return _mm256_xor_si256(a, b); }
  template <int n>
  static FD_INLINE V shl(V a) { return n ? _mm256_slli_epi16(a, n) : a; }  // in 16-bit lanes
  template <int n>
  static FD_INLINE V shr(V a) { return n ? _mm256_srli_epi16(a, n) : a; }
  static FD_INLINE V lookup(__m128i t, V i) { return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(t), i); }
};
#if FD_VNNI
struct V512 {
  using V = __m512i;
  static FD_INLINE V bytes(int b) { return _mm512_set1_epi8(static_cast<char>(b)); }
  static FD_INLINE V and_(V a, V b) { return _mm512_and_si512(a, b); }
  static FD_INLINE V or_(V a, V b) { return _mm512_or_si512(a, b); }
  static FD_INLINE V xor_(V a, V b) { return _mm512_xor_si512(a, b); }
  template <int n>
  static FD_INLINE V shl(V a) { return n ? _mm512_slli_epi16(a, n) : a; }
  template <int n>
  static FD_INLINE V shr(V a) { return n ? _mm512_srli_epi16(a, n) : a; }
  static FD_INLINE V lookup(__m128i t, V i) { return _mm512_shuffle_epi8(_mm512_broadcast_i32x4(t), i); }
};
#endif

// The 16 values the nibbles index, for vpshufb in each 128-bit lane: IQ4_NL's (ggml's
// kvalues_iq4nl; q4nl, q4xs) or MXFP4's (formats.MXFP4_VALUES; q4mx); on VNNI each + 128
// (x ^ 0x80), the unsigned operand. All lie in [-127, 127], as AVX2's sign trick needs.
template <int L>
static FD_INLINE __m128i value_table() {
  const __m128i v = L == kQ4MX
                        ? _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)
                        : _mm_setr_epi8(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113);
#if FD_VNNI
  return _mm_xor_si128(v, _mm_set1_epi8(static_cast<char>(0x80)));
#else
  return v;
#endif
}

// Sub-steps c and c + 4 (c = 0..3) of a row's group as 8 lanes of 4 bytes: unsigned
// values (q4nl, q4xs, q4mx: VNNI w ^ 0x80, i.e. w + 128; AVX2 the signed bytes).
// ld(plane, i): the group's 32-byte unit i of the values (plane 0) or of their high bits (1),
// in a register of Ops (two groups' units in a 512-bit one).
template <int L, int c, class Ops = V256, class Ld>
static FD_INLINE void wchunk(const Ld& ld, typename Ops::V& lo, typename Ops::V& hi) {
  using O = Ops;
  using V = typename Ops::V;
  const V v = ld(0, c);
  lo = O::and_(v, O::bytes(0x0F));
  hi = O::and_(O::template shr<4>(v), O::bytes(0x0F));
  if constexpr (kNonLinear<L>) {  // index -> value (masked tail lanes: index 0, against zero activations)
    lo = O::lookup(value_table<L>(), lo);
    hi = O::lookup(value_table<L>(), hi);
  } else if constexpr (kPlane5<L>) {  // bit i of each byte: the fifth bit of sub-step i, moved to bit 4
    const V p = ld(1, 0), b4 = O::bytes(0x10);
    lo = O::or_(lo, O::and_(O::template shl<4 - c>(p), b4));
    hi = O::or_(hi, O::and_(O::template shr<c>(p), b4));
  }
}

// 2^(e - 128) for 8 E8M0 bytes e (MXFP4's block scales, halved as its values are doubled): the
// float with bits (e - 1) << 23, and for e < 2, where that exponent field would be -1 or 0, the
// subnormals 2^-128 and 2^-127 (bits 0x00200000 << e), as formats.e8m0_half. As a signed max:
// (e - 1) << 23 is negative for e = 0, 0 for e = 1, and from e = 2 at least 0x00200000 << 2.
// (The blend of the two it replaced ran q4mx at 0.78x q4nl's speed at M = 1, this ~0.9x: a Xeon
// with AVX-512 VNNI, one thread, 2880 x 2880 weights hot.)
static FD_INLINE __m256 e8m0_half8(__m128i bytes) {
  const __m256i e = _mm256_cvtepu8_epi32(bytes);
  const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
  const __m256i small = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), _mm256_min_epu32(e, _mm256_set1_epi32(2)));
  return _mm256_castsi256_ps(_mm256_max_epi32(normal, small));
}

// The 8 bytes at p; a tail's g of them (byte by byte: a masked load of whole words could run past
// the tensor's end; a memcpy of g bytes, a library call per row, cost q4mx ~20% at K = 2880), the
// others 0.
template <bool T>
static FD_INLINE __m128i bytes8_at(const uint8_t* p, int g) {
  if constexpr (!T) return load8(p);
  uint64_t v = 0;
  for (int i = 0; i < g; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return _mm_cvtsi64_si128(static_cast<long long>(v));
}

// The 8 blocks' weight scales (and minima) of group G of a row.
template <int L, bool T>
static inline __m256 wscales(const Row& w, int64_t G, int g) {
  constexpr int64_t es = kScaleBytes<L>;
  if constexpr (kKQuant<L>)  // d * (ls - 32): sc holds the signed ls - 32
    return _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(w.d[G])), sbytes8_ps(w.sc + 8 * G));
  else if constexpr (L == kQ4MX) return e8m0_half8(bytes8_at<T>(w.sc + 8 * G, g));
  else return scales8_at<T>(w.sc + es * 8 * G, g);
}

template <int L, bool T>
static inline __m256 wmins(const Row& w, int64_t G, int g) {
  return scales8_at<T>(w.mn + kScaleBytes<L> * 8 * G, g);
}

// ld(plane, i) for wchunk: group G's unit i of row w's values (plane 0) or high bits (1); a
// tail group (T) of g < 8 blocks read with masked loads.
template <int L, bool T>
static FD_INLINE auto units(const Row& w, int64_t G, int g) {
  static_assert(!(T && kKQuant<L>), "q4xs has no tail groups");
  const uint8_t* q = w.q + G * kGroupBytes<L>;
  const uint8_t* qh = kHighBytes<L> > 0 ? w.qh + G * kHighBytes<L> : nullptr;
  return [=](int plane, int i) __attribute__((always_inline)) { return wload<T>(plane ? qh : q, i, g); };
}

// f.template operator()<c>() for c = 0..3: a group's four chunks (sub-steps c and c + 4) in order.
template <class F>
static FD_INLINE void each_chunk(F& f) {
  f.template operator()<0>();
  f.template operator()<1>();
  f.template operator()<2>();
  f.template operator()<3>();
}
// f.template operator()<u>() for u = U0..U0+N-1, in order.
template <int U0, int N, class F>
static FD_INLINE void each_unit(F& f) {
  if constexpr (N > 0) {
    f.template operator()<U0>();
    each_unit<U0 + 1, N - 1>(f);
  }
}

// Activation rows: the lane-ordered int8 values, the block scales, scale * sum(q) and the
// halves' integer sums, each row padded to whole groups (gx of them).
struct XRows {
  const int8_t* q;
  const float *d, *s;
  const int32_t* sums;
  int64_t gx;
  const int8_t* qrow(int64_t m, int64_t G) const { return q + (m * gx + G) * 256; }
  int64_t at(int64_t m, int64_t G) const { return (m * gx + G) * 8; }
};

#ifndef FD_AHEAD_BYTES
#define FD_AHEAD_BYTES 8192
#endif
#ifndef FD_BURST_BYTES
#define FD_BURST_BYTES 8192
#endif
#ifndef FD_STREAM_BYTES
#define FD_STREAM_BYTES 2048
#endif
// T0, not NTA: on a 2-core Xeon (Sapphire Rapids class) prefetchnta held an M = 1 stream to
// ~13 GB/s against ~45 with prefetcht0 (benchmarks/real_sizes_xeon.md); on Zen 4 the two did
// not differ measurably.
#ifndef FD_HINT
#define FD_HINT _MM_HINT_T0
#endif

// Group G of the weight stream at q (with its high bits at qh), into the cache.
template <int L>
static FD_INLINE void prefetch_group(const uint8_t* q, const uint8_t* qh, int64_t G) {
  const char* p = reinterpret_cast<const char*>(q + G * kGroupBytes<L>);
  for (int64_t off = 0; off < kGroupBytes<L>; off += 64) _mm_prefetch(p + off, FD_HINT);
  if constexpr (kHighBytes<L> > 0) _mm_prefetch(reinterpret_cast<const char*>(qh + G * kHighBytes<L>), FD_HINT);
}

// Group G of R weight rows x the same group of C activation rows from m, added to the
// float accumulators; T: the rows' last group, of g < 8 blocks.
template <int L, int R, int C, bool T = false>
static FD_INLINE void group(const Row (&w)[R], const XRows& x, int64_t m, int64_t G,
                            __m256 (&acc)[R][C], __m256 (&macc)[R][C], int g = 8) {
  __m256i ilo[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) ilo[r][c] = _mm256_setzero_si256();
#if !FD_VNNI
  __m256i plo[R][C];  // int16 runs
  const __m256i ones = _mm256_set1_epi16(1);
#endif
  auto chunk = [&]<int ch>() __attribute__((always_inline)) {
    __m256i lo[R], hi[R];
    for (int r = 0; r < R; ++r) wchunk<L, ch>(units<L, T>(w[r], G, g), lo[r], hi[r]);
    for (int c = 0; c < C; ++c) {
      const int8_t* xp = x.qrow(m + c, G);
      const __m256i xlo = load32(xp + 32 * ch), xhi = load32(xp + 32 * (ch + 4));
      for (int r = 0; r < R; ++r) {
#if FD_VNNI
        ilo[r][c] = _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(ilo[r][c], lo[r], xlo), hi[r], xhi);
#else
        __m256i a, b;
        if constexpr (kSigned<L>) {
          a = _mm256_maddubs_epi16(_mm256_sign_epi8(lo[r], lo[r]), _mm256_sign_epi8(xlo, lo[r]));
          b = _mm256_maddubs_epi16(_mm256_sign_epi8(hi[r], hi[r]), _mm256_sign_epi8(xhi, hi[r]));
        } else {
          a = _mm256_maddubs_epi16(lo[r], xlo);
          b = _mm256_maddubs_epi16(hi[r], xhi);
        }
        constexpr int K = kRun<L>;
        if constexpr (K == 1) {
          ilo[r][c] = _mm256_add_epi32(ilo[r][c], _mm256_add_epi32(_mm256_madd_epi16(a, ones),
                                                                   _mm256_madd_epi16(b, ones)));
        } else {  // one run over sub-steps c, c + 4 in chunk order; K / 2 chunks per run
          const __m256i ab = _mm256_add_epi16(a, b);
          plo[r][c] = (2 * ch) % K == 0 ? ab : _mm256_add_epi16(plo[r][c], ab);
          if constexpr ((2 * ch + 2) % K == 0)
            ilo[r][c] = _mm256_add_epi32(ilo[r][c], _mm256_madd_epi16(plo[r][c], ones));
        }
#endif
      }
    }
  };
  each_chunk(chunk);

  __m256 ws[R], mv[R];
  for (int r = 0; r < R; ++r) {
    ws[r] = wscales<L, T>(w[r], G, g);
    if constexpr (kMins<L>) mv[r] = wmins<L, T>(w[r], G, g);
  }
  for (int c = 0; c < C; ++c) {
    const int64_t at = x.at(m + c, G);
    const __m256 xd = _mm256_loadu_ps(x.d + at);
    __m256i slo = _mm256_setzero_si256(), shi = slo;
    if constexpr (kOffsetShift<L> > 0) {
      slo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.sums + 2 * at));
      shi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.sums + 2 * at + 8));
    }
    for (int r = 0; r < R; ++r) {
      __m256i I = ilo[r][c];
      if constexpr (kOffsetShift<L> > 0) {
        I = _mm256_sub_epi32(I, _mm256_slli_epi32(_mm256_add_epi32(slo, shi), kOffsetShift<L>));
      }
      acc[r][c] = _mm256_add_ps(acc[r][c], _mm256_mul_ps(_mm256_cvtepi32_ps(I), _mm256_mul_ps(ws[r], xd)));
      if constexpr (kMins<L>) macc[r][c] = _mm256_add_ps(macc[r][c], _mm256_mul_ps(mv[r], _mm256_loadu_ps(x.s + at)));
    }
  }
}

#if FD_VNNI
// 512-bit registers as two 256-bit halves.
static FD_INLINE __m512i pair(__m256i lo, __m256i hi) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}
static FD_INLINE __m512 pair(__m256 lo, __m256 hi) {
  return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(lo)), _mm256_castps_pd(hi), 1));
}
static FD_INLINE __m512i both(const void* p) { return _mm512_broadcast_i64x4(load32(p)); }  // the same 8 lanes twice
static FD_INLINE __m512 both(const float* p) { return _mm512_castsi512_ps(both(static_cast<const void*>(p))); }
static FD_INLINE __m256 upper(__m512 v) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)); }
// ld(plane, i) for wchunk on V512: u0's unit in the low half, u1's in the high (units' loaders).
template <class U>
static FD_INLINE auto paired(const U& u0, const U& u1) {
  return [&](int plane, int i) __attribute__((always_inline)) { return pair(u0(plane, i), u1(plane, i)); };
}

// [f(p[0]) x 8 | f(p[1]) x 8] of two float16 at p: two groups' d.
static FD_INLINE __m512 halves2(const uint16_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  const __m128 f = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(v)));
  return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
                               _mm512_castps128_ps512(f));
}

// pair(wscales(w, G), wscales(w, G + 1)) (and wmins) from one load: two full groups' scales
// are adjacent. Each lane is the same product.
template <int L>
static FD_INLINE __m512 wscales2(const Row& w, int64_t G) {
  if constexpr (kKQuant<L>) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w.sc + 8 * G));
    return _mm512_mul_ps(halves2(w.d + G), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)));
  } else if constexpr (L == kQ4MX) {  // e8m0_half8's bits for 16 bytes
    const __m512i e = _mm512_cvtepu8_epi32(load16(w.sc + 8 * G));
    const __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
    const __mmask16 small = _mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2));
    return _mm512_castsi512_ps(_mm512_mask_sllv_epi32(normal, small, _mm512_set1_epi32(0x00200000), e));
  } else {
    return _mm512_cvtph_ps(load32(w.sc + 2 * 8 * G));
  }
}
template <int L>
static FD_INLINE __m512 wmins2(const Row& w, int64_t G) {
  return _mm512_cvtph_ps(load32(w.mn + 2 * 8 * G));
}

// I_b (the header's) from the int32 sums and the activations' half sums slo, shi.
template <int L>
static FD_INLINE __m512i block_sums(__m512i lo, __m512i slo, __m512i shi) {
  if constexpr (kOffsetShift<L> > 0)
    return _mm512_sub_epi32(lo, _mm512_slli_epi32(_mm512_add_epi32(slo, shi), kOffsetShift<L>));
  else return lo;
}

// Groups G and G + 1 of R weight rows x C activation rows, in the halves of 512-bit registers
// (group G low): the integer sums and the products per block at once for both, then the
// accumulators take group G's terms and then group G + 1's, as two calls of group<L, R, C>
// add them, so the bits are the same. Zen 5 runs 512-bit vpdpbusd at full width.
template <int L, int R, int C>
static FD_INLINE void two_groups(const Row (&w)[R], const XRows& x, int64_t m, int64_t G, __m256 (&acc)[R][C],
                                 __m256 (&macc)[R][C]) {
  __m512i ilo[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) ilo[r][c] = _mm512_setzero_si512();
  auto chunk = [&]<int ch>() __attribute__((always_inline)) {
    __m512i lo[R], hi[R];
    for (int r = 0; r < R; ++r) {
      const auto u0 = units<L, false>(w[r], G, 8), u1 = units<L, false>(w[r], G + 1, 8);
      wchunk<L, ch, V512>(paired(u0, u1), lo[r], hi[r]);
    }
    for (int c = 0; c < C; ++c) {
      const int8_t* xp = x.qrow(m + c, G);
      const __m512i xlo = pair(load32(xp + 32 * ch), load32(xp + 256 + 32 * ch));
      const __m512i xhi = pair(load32(xp + 32 * (ch + 4)), load32(xp + 256 + 32 * (ch + 4)));
      for (int r = 0; r < R; ++r) {
        ilo[r][c] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(ilo[r][c], lo[r], xlo), hi[r], xhi);
      }
    }
  };
  each_chunk(chunk);

  __m512 ws[R], mv[R];
  for (int r = 0; r < R; ++r) {
    ws[r] = wscales2<L>(w[r], G);
    if constexpr (kMins<L>) mv[r] = wmins2<L>(w[r], G);
  }
  for (int c = 0; c < C; ++c) {
    const int64_t at = x.at(m + c, G), at1 = x.at(m + c, G + 1);  // at1 = at + 8
    const __m512 xd = _mm512_loadu_ps(x.d + at);
    __m512i slo = _mm512_setzero_si512(), shi = slo;
    if constexpr (kOffsetShift<L> > 0) {
      slo = pair(load32(x.sums + 2 * at), load32(x.sums + 2 * at1));
      shi = pair(load32(x.sums + 2 * at + 8), load32(x.sums + 2 * at1 + 8));
    }
    __m512 xs;
    if constexpr (kMins<L>) xs = _mm512_loadu_ps(x.s + at);
    for (int r = 0; r < R; ++r) {
      const __m512i I = block_sums<L>(ilo[r][c], slo, shi);
      const __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(I), _mm512_mul_ps(ws[r], xd));
      acc[r][c] = _mm256_add_ps(_mm256_add_ps(acc[r][c], _mm512_castps512_ps256(t)), upper(t));
      if constexpr (kMins<L>) {
        const __m512 u = _mm512_mul_ps(mv[r], xs);
        macc[r][c] = _mm256_add_ps(_mm256_add_ps(macc[r][c], _mm512_castps512_ps256(u)), upper(u));
      }
    }
  }
}
#endif

#if FD_VNNI
// The tiles that take two groups a register: 4 x 4.
template <int R, int C>
constexpr bool kTwoGroups = C == 4 && R == 4;
#endif

// R weight rows from n x C activation rows from m: y[m + c, n + r]. ahead > 0 (bytes, one
// row: M = 1) or rows (R > 1): while streaming group G, prefetch the weights that far on.
template <int L, int R, int C>
static void tile(const Args& a, const XRows& x, int64_t n, int64_t m, int64_t ahead) {
  __m256 acc[R][C], macc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = macc[r][c] = _mm256_setzero_ps();
  const int64_t full = a.nb / 8;
  const int g = static_cast<int>(a.nb % 8);
  Row w[R];
  for (int r = 0; r < R; ++r) w[r] = row_at<L>(a, n + r);
  if (ahead) {
    // One row: the bytes `ahead` further on in its (contiguous) stream. R rows: group G of
    // the rows `ahead` rows further on.
    Row p = R == 1 ? w[0] : row_at<L>(a, n + ahead);
    int64_t qa = 0, qha = 0;
    if constexpr (R == 1) {
      qa = ahead;
      qha = ahead * a.qhs / a.qs;
    }
    int64_t G = 0;
#if FD_VNNI
    if constexpr (kTwoGroups<R, C>)  // (fewer activation rows: a remainder; not worth their build time)
      for (; a.wide && G + 2 <= full; G += 2) {
        for (int r = 0; r < R; ++r) {
          prefetch_group<L>(p.q + r * a.qs + qa, p.qh + r * a.qhs + qha, G);
          prefetch_group<L>(p.q + r * a.qs + qa, p.qh + r * a.qhs + qha, G + 1);
        }
        two_groups<L, R, C>(w, x, m, G, acc, macc);
      }
#endif
    for (; G < full; ++G) {
      for (int r = 0; r < R; ++r) prefetch_group<L>(p.q + r * a.qs + qa, p.qh + r * a.qhs + qha, G);
      group<L, R, C>(w, x, m, G, acc, macc);
    }
  } else {
    int64_t G = 0;
#if FD_VNNI
    if constexpr (kTwoGroups<R, C>)
      for (; a.wide && G + 2 <= full; G += 2) two_groups<L, R, C>(w, x, m, G, acc, macc);
#endif
    for (; G < full; ++G) group<L, R, C>(w, x, m, G, acc, macc);
  }
  if constexpr (!kKQuant<L>) {  // q4xs' K is a multiple of 256
    if (g) group<L, R, C, true>(w, x, m, full, acc, macc, g);
  }
  for (int c = 0; c < C; ++c) {
    if constexpr (R == 4) {  // the 4 rows' sums at once, each hsum's bits (simd.h), one store
      __m128 s;
      if constexpr (kMins<L>) {
        const __m256 v[8] = {acc[0][c], acc[1][c], acc[2][c], acc[3][c], macc[0][c], macc[1][c], macc[2][c], macc[3][c]};
        const __m256 h = hsum8(v);
        s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
      } else {
        const __m256 v[4] = {acc[0][c], acc[1][c], acc[2][c], acc[3][c]};
        s = hsum4(v);
      }
      _mm_storeu_ps(a.y + (m + c) * a.N + n, s);
    } else {
      for (int r = 0; r < R; ++r) {
        float s = hsum(acc[r][c]);
        if constexpr (kMins<L>) s = s + hsum(macc[r][c]);
        a.y[(m + c) * a.N + n + r] = s;
      }
    }
  }
}

#if FD_VNNI
// Two weight rows in the halves of 512-bit registers (row n low, n + 1 high) against C
// activation rows: each activation load and dot-product instruction serves both rows. Every
// lane runs group<L, 1, C>'s operations in its order, so y is the same bits as tile<L, 1, C>.
// 1B Q4_K_M / Q4_0 decode at B = 8 on a 2-core Xeon (VNNI): 109 -> 140 / 126 -> 169 tokens/s
// against single rows (benchmarks/real_sizes_xeon.md).
template <int L, int C, bool T = false>
static FD_INLINE void group2(const Row (&w)[2], const XRows& x, int64_t m, int64_t G, __m512 (&acc)[C],
                             __m512 (&macc)[C], int g = 8) {
  __m512i ilo[C];
  for (int c = 0; c < C; ++c) ilo[c] = _mm512_setzero_si512();
  auto chunk = [&]<int ch>() __attribute__((always_inline)) {
    const auto u0 = units<L, T>(w[0], G, g), u1 = units<L, T>(w[1], G, g);
    __m512i wlo, whi;
    wchunk<L, ch, V512>(paired(u0, u1), wlo, whi);
    for (int c = 0; c < C; ++c) {
      const int8_t* xp = x.qrow(m + c, G);
      ilo[c] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(ilo[c], wlo, both(xp + 32 * ch)), whi, both(xp + 32 * (ch + 4)));
    }
  };
  each_chunk(chunk);

  const __m512 ws = pair(wscales<L, T>(w[0], G, g), wscales<L, T>(w[1], G, g));
  __m512 mv = ws;
  if constexpr (kMins<L>) mv = pair(wmins<L, T>(w[0], G, g), wmins<L, T>(w[1], G, g));
  for (int c = 0; c < C; ++c) {
    const int64_t at = x.at(m + c, G);
    __m512i slo = _mm512_setzero_si512(), shi = slo;
    if constexpr (kOffsetShift<L> > 0) {
      slo = both(x.sums + 2 * at);
      shi = both(x.sums + 2 * at + 8);
    }
    const __m512i I = block_sums<L>(ilo[c], slo, shi);
    acc[c] = _mm512_add_ps(acc[c], _mm512_mul_ps(_mm512_cvtepi32_ps(I), _mm512_mul_ps(ws, both(x.d + at))));
    if constexpr (kMins<L>) macc[c] = _mm512_add_ps(macc[c], _mm512_mul_ps(mv, both(x.s + at)));
  }
}

// Rows n, n + 1 x C activation rows from m, as tile<L, 1, C> twice; ahead > 0: bytes, each
// row's stream prefetched that far on.
template <int L, int C>
static void tile2(const Args& a, const XRows& x, int64_t n, int64_t m, int64_t ahead) {
  __m512 acc[C], macc[C];
  for (int c = 0; c < C; ++c) acc[c] = macc[c] = _mm512_setzero_ps();
  const int64_t full = a.nb / 8;
  const int g = static_cast<int>(a.nb % 8);
  const Row w[2] = {row_at<L>(a, n), row_at<L>(a, n + 1)};
  if (ahead) {
    const int64_t qha = ahead * a.qhs / a.qs;
    for (int64_t G = 0; G < full; ++G) {
      for (int r = 0; r < 2; ++r) prefetch_group<L>(w[r].q + ahead, w[r].qh + qha, G);
      group2<L, C>(w, x, m, G, acc, macc);
    }
  } else {
    for (int64_t G = 0; G < full; ++G) group2<L, C>(w, x, m, G, acc, macc);
  }
  if constexpr (!kKQuant<L>) {
    if (g) group2<L, C, true>(w, x, m, full, acc, macc, g);
  }
  for (int c = 0; c < C; ++c) {
    float s0 = hsum(_mm512_castps512_ps256(acc[c])), s1 = hsum(upper(acc[c]));
    if constexpr (kMins<L>) {
      s0 = s0 + hsum(_mm512_castps512_ps256(macc[c]));
      s1 = s1 + hsum(upper(macc[c]));
    }
    a.y[(m + c) * a.N + n] = s0;
    a.y[(m + c) * a.N + n + 1] = s1;
  }
}
#endif

// c <= CT activation rows. CT = 8 has only the C = 8 tile: fewer rows go at most 4 at a time
// (tiles of C <= 4 exist anyway; C = 5..7 would add compile time to every first run).
template <int L, int R, int CT>
static inline void tiles(int c, const Args& a, const XRows& x, int64_t n, int64_t m, int64_t ahead) {
  if constexpr (CT == 8) {
    if (c < 8) return tiles<L, R, 4>(c, a, x, n, m, ahead);
  } else if constexpr (CT > 1) {
    if (c < CT) return tiles<L, R, CT - 1>(c, a, x, n, m, ahead);
  }
  tile<L, R, CT>(a, x, n, m, ahead);
}

// Rows n, n + 1 x c activation rows (c = 1..4 or 8, from tile_cols<8>): the pair tiles exist
// for C = 4 and 8 only (each C adds to the first kernel build); fewer go a row at a time.
template <int L, int CT>
static inline void pair_tiles(int c, const Args& a, const XRows& x, int64_t n, int64_t m, int64_t ahead) {
#if FD_VNNI
  static_assert(CT == 8);
  if (c == 8) return tile2<L, 8>(a, x, n, m, ahead);
  if (c == 4) return tile2<L, 4>(a, x, n, m, ahead);
#endif
  tiles<L, 1, CT>(c, a, x, n, m, ahead);
  tiles<L, 1, CT>(c, a, x, n + 1, m, ahead);
}

template <int CT>
static inline int tile_cols(int64_t left) {
  return static_cast<int>(CT == 8 && left < 8 ? std::min<int64_t>(4, left) : std::min<int64_t>(CT, left));
}

static inline void prefetch(const void* p, int64_t bytes) {
  for (int64_t off = 0; off < bytes; off += 64) _mm_prefetch(static_cast<const char*>(p) + off, FD_HINT);
}

// Rows [n0, n1) of y = x w^T for all M activation rows, in tiles of RT weight rows
// (a remainder one at a time) x up to CT activation rows.
template <int L, int RT, int CT, bool Pairs = false>
static void rows(const Args& a, int64_t n0, int64_t n1) {
  constexpr int64_t kPanel = 64;  // activation rows that stay in L2 while the weight rows stream past
  const XRows x{a.xq, a.xd, a.xs, a.xsums, (a.nb + 7) / 8};
  constexpr int64_t es = kScaleBytes<L>;
  // The first panel streams each weight byte once from DRAM, and one core's hardware
  // prefetchers fall behind (measured on Zen 4, benchmarks/real_sizes.md, and on a Xeon): one
  // row at a time (decode), its stream is prefetched FD_STREAM_BYTES ahead group by group; RT
  // rows side by side, the tile FD_AHEAD_BYTES ahead, at once (a burst) where it is short, else
  // group by group.
  const int64_t row_bytes = a.qs + a.qhs;
  const int64_t kAhead = RT == 1 ? std::max<int64_t>(1, FD_STREAM_BYTES / row_bytes)
                                 : std::max<int64_t>(RT, FD_AHEAD_BYTES / row_bytes / RT * RT);
  const bool burst = RT > 1 && RT * row_bytes <= FD_BURST_BYTES;
  for (int64_t m0 = 0; m0 < a.M; m0 += kPanel) {
    const int64_t m1 = std::min(a.M, m0 + kPanel);
    for (int64_t n = n0; n < n1;) {
      const int r = Pairs && n + 2 <= n1 ? 2 : n + RT <= n1 ? RT : 1;  // Pairs: RT == 1, two rows a tile
      const bool ahead = m0 == 0 && n + kAhead + r <= n1;
      if (ahead) {  // the scales' streams (the weights' too in a burst)
        const int64_t na = n + kAhead;
        if (burst) {
          prefetch(a.q + na * a.qs, r * a.qs);
          if constexpr (kHighBytes<L> > 0) prefetch(a.qh + na * a.qhs, r * a.qhs);
        }
        prefetch(a.sc + es * na * a.scs, es * r * a.scs);
        if constexpr (kMins<L>) prefetch(a.mn + es * na * a.scs, es * r * a.scs);
        if constexpr (kKQuant<L>) prefetch(a.d + na * (a.nb / 8), 2 * r * (a.nb / 8));
      }
      // In the first activation tile; RT == 1 streams through the rows' end (prefetches do not fault).
      int64_t first = m0 != 0 || burst ? 0 : RT == 1 ? int64_t(FD_STREAM_BYTES) : ahead ? kAhead : 0;
      for (int64_t m = m0; m < m1;) {
        const int c = tile_cols<CT>(m1 - m);
        if constexpr (Pairs) {
          if (r == 2) pair_tiles<L, CT>(c, a, x, n, m, first);
          else tiles<L, 1, CT>(c, a, x, n, m, first);
        } else if (r == RT) tiles<L, RT, CT>(c, a, x, n, m, first);
        else tiles<L, 1, CT>(c, a, x, n, m, RT == 1 ? first : 0);  // (bytes for one row)
        first = 0;
        m += c;
      }
      n += r;
    }
  }
}

// Per row and block of 32: d = amax / 127 (per256: the amax of the block's group of 8 blocks, as
// llama.cpp's Q8_K takes for its K-quants), q = round-half-even(x / d), s = d * sum(q), and the
// integer sums of values 0..15 and 16..31; written in the lane order, rows padded to whole groups, row m's
// group G of q at q + m qrow + G qgroup.
static FD_INLINE float amax_ps(const float* x, int64_t n) {  // n a multiple of 8
  const __m256 sign = _mm256_set1_ps(-0.f);
  __m256 amax = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 8) amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)));
  __m128 a = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  a = _mm_max_ps(a, _mm_movehl_ps(a, a));
  a = _mm_max_ss(a, _mm_movehdup_ps(a));
  return _mm_cvtss_f32(a);
}
static void quantize_rows(const float* x, int64_t M, int64_t K, bool per256, int8_t* q, int64_t qrow,
                          int64_t qgroup, float* d, float* s, int32_t* sums) {
  const int64_t nb = K / 32, gx = (nb + 7) / 8;
  for (int64_t m = 0; m < M; ++m) {
    int8_t* qr = q + m * qrow;
    float *dr = d + m * gx * 8, *sr = s + m * gx * 8;
    int32_t* ur = sums + m * gx * 16;
    if (nb % 8) {  // the padding of the last group
      const int64_t G = nb / 8;
      std::memset(qr + G * qgroup, 0, 256);
      std::memset(dr + G * 8, 0, 8 * sizeof(float));
      std::memset(sr + G * 8, 0, 8 * sizeof(float));
      std::memset(ur + G * 16, 0, 16 * sizeof(int32_t));
    }
    float group_max = 0.f;
    for (int64_t b = 0; b < nb; ++b) {
      const float* xb = x + m * K + b * 32;
      if (per256 && b % 8 == 0) group_max = amax_ps(xb, 32 * std::min<int64_t>(8, nb - b));
      __m256 v[4];
      for (int j = 0; j < 4; ++j) v[j] = _mm256_loadu_ps(xb + 8 * j);
      const float dm = (per256 ? group_max : amax_ps(xb, 32)) / 127.f;
      const float id = dm > 0.f ? 1.f / dm : 0.f;
      const __m256 idv = _mm256_set1_ps(id);
      __m256i qi[4];
      for (int j = 0; j < 4; ++j) qi[j] = _mm256_cvtps_epi32(_mm256_mul_ps(v[j], idv));  // nearest-even
      auto sum8 = [](__m256i t) {
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
        s4 = _mm_hadd_epi32(s4, s4);
        s4 = _mm_hadd_epi32(s4, s4);
        return _mm_cvtsi128_si32(s4);
      };
      const int32_t lo = sum8(_mm256_add_epi32(qi[0], qi[1])), hi = sum8(_mm256_add_epi32(qi[2], qi[3]));
      // Pack to bytes; packs interleave 128-bit lanes, the permute undoes it.
      const __m256i p16a = _mm256_packs_epi32(qi[0], qi[1]);
      const __m256i p16b = _mm256_packs_epi32(qi[2], qi[3]);
      __m256i p8 = _mm256_packs_epi16(p16a, p16b);
      p8 = _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
      alignas(32) int32_t words[8];
      _mm256_store_si256(reinterpret_cast<__m256i*>(words), p8);
      const int64_t G = b / 8, j = b % 8;
      for (int i = 0; i < 8; ++i) std::memcpy(qr + G * qgroup + 32 * i + 4 * j, &words[i], 4);
      dr[G * 8 + j] = dm;
      sr[G * 8 + j] = dm * static_cast<float>(lo + hi);
      ur[G * 16 + j] = lo;
      ur[G * 16 + 8 + j] = hi;
    }
  }
}
