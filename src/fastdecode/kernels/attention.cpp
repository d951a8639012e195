// Attention over a KV cache for float32 CPU models, grouped-query aware (see kernels.h).
// Plain C++ on raw pointers, no torch headers; ops.cpp checks the arguments,
// allocates and runs attention_run on each thread.
//
// y[b, t, h] = softmax_j(scale * q[b, t, h] . k[r, h / n_rep, j]) v[r, h / n_rep, j]
// (with softcap > 0, each score s is first softcap tanh(s / softcap), Gemma 2's capping;
// with sinks, head h's softmax also counts e^sinks[h] in its sum, a key of no value: gpt-oss)
// over the keys j <= input_pos[b, t] of cache slot r = rows[b]: each row reads
// its own slot up to its own position, so cost follows the length in use. With
// window > 0 (sliding-window layers) only keys input_pos - window < j <= input_pos
// are visited, so those layers cost the window, not the context.
//
// Why not scaled_dot_product_attention: it spans the whole cache buffer, not
// the positions in use; it needs the query heads folded and a mask repeated per
// group; and at decode its CPU kernel splits a batch-1 step's keys across
// threads, so a row sums in a different order alone than in a batch.
//
// The arithmetic of one query row is fixed, so its result is the same at any
// batch size, padding or thread count, in eager and compiled code alike: score
// j is an 8-lane FMA chain over d reduced in hsum's order, times scale; the
// softmax runs 8 scores at a time from the row's first key; y accumulates
// p_j v_j over the keys in order, 8 dims per lane, then times 1 / sum. What
// varies is only how rows share work. A token's query heads of one kv head read
// the same K/V rows, so they run together, three at a time: each chunk of K or
// V is loaded and converted to float32 once for the three, each head's scores
// come 4 keys at a time (12 independent FMA chains, then one transposing
// reduction for 8 scores instead of an hsum per key), and its y accumulates in
// registers. A tile is a few such tokens, which take the keys block by block,
// so a block read from memory serves the others from L1/L2. For q8_0, whose
// dequantizing load costs more than the FMAs it feeds, a tile of 2+ tokens first
// converts each block to float32 once and all its tokens read that (the same
// values, so the same result), and its tiles are larger (up to 16 tokens) to share
// that. Threads take tiles from a shared counter, so a busy core takes fewer; a decode step
// with fewer tiles than threads splits each tile's work over them instead (attention_split).
// Where AVX-512 is in use (ops.cpp's instruction set), the same arithmetic runs
// in zmm registers (namespace wide): p v and the softmax 16 lanes at a time, and
// the scores of a tile of 2+ tokens from K transposed a block at a time, 16 keys
// a register, so that no horizontal sums are left; so a row's bits do not depend
// on the instruction set either.
#include <immintrin.h>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels.h"
#include "simd.h"

namespace {

using Args = fd::AttentionArgs;

// e^x for x <= 0 (scores minus their maximum): 2^n * p(r), x = n ln2 + r, |r| <= ln2 / 2,
// a degree-6 polynomial (relative error ~2e-7); underflows to 0 below -87. The constants are
// shared by the 16-lane version (wide::exp_neg), which runs the same operations per lane.
constexpr float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kExpPoly[] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                              4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

inline __m256 exp_neg(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.f));
  const __m256 n =
      _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kExpPoly[0]);
  for (int i = 1; i < 6; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpPoly[i]));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

// Loads of 8 consecutive K/V values (d a multiple of 8) as float32, one per storage
// format: float16 (F16C) and bfloat16 widen exactly; q8_0 (blocks of 32 int8 with one
// float16 scale ahead of each, 34 bytes, as llama.cpp's) is dequantized as scale * q,
// also exact in float32 (11 x 7 significant bits). So each format computes what the
// float32 path computes on its K/V converted to float32, in the same order.
// row_bytes: the storage of one position's D values.
struct F32 {
  using T = float;
  static int64_t row_bytes(int64_t D) { return 4 * D; }
  static __m256 load(const T* p, int64_t d) { return _mm256_loadu_ps(p + d); }
};
struct F16 {
  using T = uint16_t;
  static int64_t row_bytes(int64_t D) { return 2 * D; }
  static __m256 load(const T* p, int64_t d) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + d)));
  }
};
struct BF16 {
  using T = uint16_t;
  static int64_t row_bytes(int64_t D) { return 2 * D; }
  static __m256 load(const T* p, int64_t d) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + d)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
};
struct Q8_0 {
  using T = int8_t;
  static int64_t row_bytes(int64_t D) { return D / 32 * fd::kQ8Block; }
  static __m256 load(const T* p, int64_t d) {
    const T* blk = p + (d / 32) * fd::kQ8Block;
    uint16_t h;
    std::memcpy(&h, blk, 2);
    const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 2 + d % 32));
    return _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(h)), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)));
  }
};

// Keys per pass of qk for R rows, and chunks of 8 dims per pass of pv: R x J and
// R x C accumulators, 8 or 12 of the 16 registers, with the R rows' q (or p) and one
// converted chunk of K (or V) beside them.
template <int R>
constexpr int kKeys = R == 1 ? 8 : 4;
template <int R>
constexpr int kChunks = R == 1 ? 8 : 4;

// scale * q_r . k_j for R rows (one token's heads) and J keys k_j (storage format
// Fmt), into s_r[j] for the lanes j in [j0, j1): each chunk of k_j is loaded and
// converted once for the R rows. A score is an 8-lane FMA chain over d reduced as
// hsum does, as one key alone would have. D8: D / 8 when known at compile time.
template <class Fmt, int R, int J, int64_t D8 = 0>
inline void qk(const float* const* q, const typename Fmt::T* const* k, int64_t D, __m256 scale, float* const* s,
               int j0, int j1) {
  __m256 acc[R * J];
  for (int i = 0; i < R * J; ++i) acc[i] = _mm256_setzero_ps();
  const int64_t n8 = D8 ? D8 : D / 8;
  for (int64_t c = 0; c < n8; ++c) {
    __m256 qv[R];
    for (int r = 0; r < R; ++r) qv[r] = _mm256_loadu_ps(q[r] + 8 * c);
    for (int j = 0; j < J; ++j) {
      const __m256 x = Fmt::load(k[j], 8 * c);
      for (int r = 0; r < R; ++r) acc[r * J + j] = _mm256_fmadd_ps(qv[r], x, acc[r * J + j]);
    }
  }
  const __m256 v = _mm256_mul_ps(hsum8(acc), scale);  // lanes in (r, j) order
  __m128 w = _mm_setzero_ps();
  if constexpr (R * J == 12) w = _mm_mul_ps(hsum4(acc + 8), _mm256_castps256_ps128(scale));
  if (j0 == 0 && j1 == J) {
    if constexpr (J == 8) {
      _mm256_storeu_ps(s[0], v);
    } else {
      _mm_storeu_ps(s[0], _mm256_castps256_ps128(v));
      _mm_storeu_ps(s[1], _mm256_extractf128_ps(v, 1));
      if constexpr (R == 3) _mm_storeu_ps(s[2], w);
    }
  } else {
    alignas(32) float out[12];
    _mm256_store_ps(out, v);
    _mm_store_ps(out + 8, w);
    for (int r = 0; r < R; ++r) std::memcpy(s[r] + j0, out + r * J + j0, (j1 - j0) * sizeof(float));
  }
}

// y_r[d0, d0 + 8 C) += sum_i p_r[i] v_i for R rows over the same n keys v_i = v + i vs
// (storage format Fmt), in key order: each chunk of v_i is loaded and converted once
// for the R rows.
template <class Fmt, int R, int C>
inline void pv(float* const* y, const float* const* p, const typename Fmt::T* v, int64_t vs, int64_t d0, int64_t n) {
  __m256 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_loadu_ps(y[r] + d0 + 8 * c);
  for (int64_t i = 0; i < n; ++i) {
    __m256 pi[R];
    for (int r = 0; r < R; ++r) pi[r] = _mm256_set1_ps(p[r][i]);
    const typename Fmt::T* vi = v + i * vs;
    for (int c = 0; c < C; ++c) {
      const __m256 x = Fmt::load(vi, d0 + 8 * c);
      for (int r = 0; r < R; ++r) acc[r][c] = _mm256_fmadd_ps(pi[r], x, acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) _mm256_storeu_ps(y[r] + d0 + 8 * c, acc[r][c]);
}

// pv for the last K < kChunks<R> chunks of the dims, as one pass.
template <class Fmt, int R, int K = 1>
void pv_rest(int64_t rest, float* const* y, const float* const* p, const typename Fmt::T* v, int64_t vs, int64_t d0,
             int64_t n) {
  if constexpr (K < kChunks<R>) {
    if (rest == K) return pv<Fmt, R, K>(y, p, v, vs, d0, n);
    pv_rest<Fmt, R, K + 1>(rest, y, p, v, vs, d0, n);
  }
}

// One query row of a tile: keys [first, first + n), their scores (then probabilities) in s.
struct Row {
  const float* q;
  float* y;
  float* s;  // n rounded up to 8
  int64_t first, n;
  float sink;  // the head's sink logit (AttentionArgs::sinks), -inf without
};

inline float sink_of(const Args& a, int64_t head) {
  return a.sinks ? a.sinks[head] : -std::numeric_limits<float>::infinity();
}

// 1 / the sum of the exponentials, with the sink's e^(sink - max) added last where there is one.
inline float inverse_sum(float sum, float sink, float mx) {
  return 1.f / (sink == -std::numeric_limits<float>::infinity() ? sum : sum + std::exp(sink - mx));
}

// Keys ahead of the scores that a decode tile prefetches. A decode step's tiles each read their
// slot's K and then V once, from memory: without prefetching, 16 rows over 30 layers of 200-300
// positions read at 13-19 GB/s where the machine reads 28 (benchmarks/serve/README.md,
// 2026-12-05 (night)).
constexpr int64_t kAheadKeys = 16;

// Prefetch the row_bytes from p into the cache level Hint.
template <int Hint>
inline void prefetch_row(const char* p, int64_t row_bytes) {
  for (int64_t o = 0; o < row_bytes; o += 64) _mm_prefetch(p + o, static_cast<_mm_hint>(Hint));
}
// A decode tile's key: its K row (at k) into L1 for the scores, and (V) its V row (vdiff further)
// into L2 for pv_rows, which reads it after the softmax.
template <bool V = true, class T>
inline void prefetch_key(const T* k, int64_t vdiff, int64_t row_bytes) {
  prefetch_row<_MM_HINT_T0>(reinterpret_cast<const char*>(k), row_bytes);
  if constexpr (V) prefetch_row<_MM_HINT_T1>(reinterpret_cast<const char*>(k + vdiff), row_bytes);
}

// Scores of R rows that share their keys (one token's heads; rs[0]'s first and n) for
// keys [c0, c1) (key j at kb + (j - k0) ks), J at a time from lo + J m (lo: the tile's
// first key). vdiff: 0, or (a decode tile's) V row j's offset from K row j, when each key
// kAheadKeys ahead is prefetched (prefetch_key<V>).
template <class Fmt, int R, bool V = true>
void qk_rows(const Row* rs, const typename Fmt::T* kb, int64_t ks, int64_t k0, int64_t lo, int64_t c0, int64_t c1,
             int64_t D, __m256 scale, int64_t vdiff) {
  constexpr int J = kKeys<R>;
  const int64_t r0 = std::max(c0, rs->first), r1 = std::min(c1, rs->first + rs->n);
  const float* q[R];
  float* s[R];
  for (int r = 0; r < R; ++r) q[r] = rs[r].q;
  const typename Fmt::T* k[J];
  auto group = [&](int64_t g, int j0, int j1) {
    for (int r = 0; r < R; ++r) s[r] = rs[r].s + (g - rs->first);
    if (D == 64) qk<Fmt, R, J, 8>(q, k, D, scale, s, j0, j1);
    else qk<Fmt, R, J>(q, k, D, scale, s, j0, j1);
  };
  auto partial = [&](int64_t g) {  // lanes outside [r0, r1) repeat a key inside and are dropped
    for (int j = 0; j < J; ++j) k[j] = kb + (std::clamp(g + j, r0, r1 - 1) - k0) * ks;
    group(g, static_cast<int>(std::max<int64_t>(0, r0 - g)), static_cast<int>(std::min<int64_t>(J, r1 - g)));
  };
  int64_t g = r0 - (r0 - lo) % J;
  if (g < r0) {
    partial(g);
    g += J;
  }
  const int64_t row_bytes = Fmt::row_bytes(D);
  for (; g + J <= r1; g += J) {
    for (int j = 0; j < J; ++j) k[j] = kb + (g + j - k0) * ks;
    if (vdiff)
      for (int j = 0; j < J; ++j) prefetch_key<V>(k[j] + kAheadKeys * ks, vdiff, row_bytes);
    group(g, 0, J);
  }
  if (g < r1) partial(g);
}

// y += p v for R rows that share their keys, over keys [r0, r1) (key j at vb + (j - k0) vs), in
// dims [d0, d1) (multiples of 8; each dim's sum is its own chain over the keys, so any range
// gives the same bits).
template <class Fmt, int R>
void pv_rows(const Row* rs, const typename Fmt::T* vb, int64_t vs, int64_t k0, int64_t r0, int64_t r1, int64_t d0,
             int64_t d1) {
  constexpr int64_t W = 8 * kChunks<R>;
  float* y[R];
  const float* p[R];
  for (int r = 0; r < R; ++r) y[r] = rs[r].y, p[r] = rs[r].s + (r0 - rs->first);
  const typename Fmt::T* v = vb + (r0 - k0) * vs;
  for (int64_t d = d0; d < d1; d += W) {
    if (d + W <= d1) pv<Fmt, R, kChunks<R>>(y, p, v, vs, d, r1 - r0);
    else pv_rest<Fmt, R>((d1 - d) / 8, y, p, v, vs, d, r1 - r0);
  }
}

// A token's nh heads in groups of 3 rows, then 2 (4 as 2 + 2: measured faster than
// 4 x 2 keys), then 1.
template <class F>
void head_groups(int64_t nh, F&& f) {
  for (int64_t h = 0; h < nh;) {
    const int64_t left = nh - h, m = left == 4 || left == 2 ? 2 : std::min<int64_t>(3, left);
    f(h, m);
    h += m;
  }
}

// Softmax of r.s in place, 8 at a time from the row's first key, the tail padded
// with -inf (exp -> 0); returns 1 / the sum. The maximum is the largest score
// that is not NaN, as std::max from -inf finds it in any order (only the sign
// of a zero maximum can differ, and s - (+-0) are the same values).
float softmax(Row& r) {
  float* s = r.s;
  const int64_t n = r.n, n8 = (n + 7) / 8 * 8;
  for (int64_t i = n; i < n8; ++i) s[i] = -std::numeric_limits<float>::infinity();
  __m256 m = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t i = 0; i < n8; i += 8) m = _mm256_max_ps(_mm256_loadu_ps(s + i), m);  // keeps m on NaN
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m);
  float mx = std::max(lanes[0], r.sink);
  for (int i = 1; i < 8; ++i) mx = std::max(mx, lanes[i]);
  const __m256 mv = _mm256_set1_ps(mx);
  __m256 sumv = _mm256_setzero_ps();
  for (int64_t i = 0; i < n8; i += 8) {
    const __m256 p = exp_neg(_mm256_sub_ps(_mm256_loadu_ps(s + i), mv));
    _mm256_storeu_ps(s + i, p);
    sumv = _mm256_add_ps(sumv, p);
  }
  return inverse_sum(hsum(sumv), r.sink, mx);
}

// Gemma 2's soft-capping of r.s in place: s <- cap tanh(s / cap), bounding every score to
// (-cap, cap). tanh(|x|) = (1 - e) / (1 + e) with e = e^(-2|x|) from exp_neg; the sign put back.
// 8 lanes on either path (it is not where time goes), so a row's bits do not depend on it.
void softcap(Row& r, float cap) {
  const __m256 c = _mm256_set1_ps(cap), inv = _mm256_set1_ps(1.f / cap), one = _mm256_set1_ps(1.f);
  const __m256 sign = _mm256_set1_ps(-0.f);
  auto f = [&](__m256 s) {
    const __m256 x = _mm256_mul_ps(s, inv), ax = _mm256_andnot_ps(sign, x);
    const __m256 e = exp_neg(_mm256_mul_ps(ax, _mm256_set1_ps(-2.f)));
    const __m256 t = _mm256_div_ps(_mm256_sub_ps(one, e), _mm256_add_ps(one, e));
    return _mm256_mul_ps(_mm256_or_ps(t, _mm256_and_ps(sign, x)), c);
  };
  const int64_t n = r.n, n8 = n / 8 * 8;
  for (int64_t i = 0; i < n8; i += 8) _mm256_storeu_ps(r.s + i, f(_mm256_loadu_ps(r.s + i)));
  if (n8 < n) {
    alignas(32) float tail[8] = {};
    std::copy(r.s + n8, r.s + n, tail);
    _mm256_store_ps(tail, f(_mm256_load_ps(tail)));
    std::copy(tail, tail + (n - n8), r.s + n8);
  }
}

// The wide path (Args::wide: AVX-512 F/BW/VL), the same bits as the narrow one. p v is
// per element a chain over the keys in order, so 16 dims a zmm give what 8 a ymm give. The
// scores keep each key's 8 lane chains (lane l: the FMA chain over dims l, l + 8, ...) and
// hsum's tree over them, but with 16 keys a zmm, from a block of K converted and transposed
// once per tile into kt [key / 16][D][16]: chain l of 16 keys is then D / 8 FMAs of a
// broadcast q value and one kt row, with no horizontal sums. The transposition pays for itself
// over a tile of several tokens (prefill); a decode tile (one token) keeps the narrow qk.
// Zen 5, which issues 512-bit FMAs as fast as 256-bit ones: 1.2-1.5x the narrow kernel on prefill chunks over
// a long cache, 1.1-1.3x at decode (benchmarks/prefix_cache.md, 1h).
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")
namespace wide {

// 16 consecutive K/V values as float32, as Fmt::load gives them 8 at a time.
template <class Fmt>
inline __m512 load16(const typename Fmt::T* p, int64_t d) {
  if constexpr (std::is_same_v<Fmt, F32>) {
    return _mm512_loadu_ps(p + d);
  } else if constexpr (std::is_same_v<Fmt, F16>) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + d)));
  } else if constexpr (std::is_same_v<Fmt, BF16>) {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + d)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  } else {
    const typename Fmt::T* blk = p + (d / 32) * fd::kQ8Block;
    uint16_t h;
    std::memcpy(&h, blk, 2);
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2 + d % 32));
    return _mm512_mul_ps(_mm512_set1_ps(_cvtsh_ss(h)), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)));
  }
}

// r[i] <- column i of the 16 x 16 matrix whose rows are r[0..15].
inline void transpose16(__m512 (&r)[16]) {
  __m512 t[16], u[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {  // u[i + k], 128-bit lane L: column 4 L + k of rows i..i+3
    const __m512d a = _mm512_castps_pd(t[i]), b = _mm512_castps_pd(t[i + 1]);
    const __m512d c = _mm512_castps_pd(t[i + 2]), e = _mm512_castps_pd(t[i + 3]);
    u[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    u[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    u[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, e));
    u[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, e));
  }
  for (int k = 0; k < 4; ++k) {
    const __m512 v0 = _mm512_shuffle_f32x4(u[k], u[4 + k], 0x88), v1 = _mm512_shuffle_f32x4(u[k], u[4 + k], 0xdd);
    const __m512 v2 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0x88);
    const __m512 v3 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0xdd);
    r[k] = _mm512_shuffle_f32x4(v0, v2, 0x88);
    r[8 + k] = _mm512_shuffle_f32x4(v0, v2, 0xdd);
    r[4 + k] = _mm512_shuffle_f32x4(v1, v3, 0x88);
    r[12 + k] = _mm512_shuffle_f32x4(v1, v3, 0xdd);
  }
}

// Keys [c0, c1) (key j at kp + (j - k0) st) as float32 in kt [(c1 - c0) / 16 rounded up][D][16];
// the last vector's lanes past c1 hold zeros.
template <class Fmt>
void transpose_keys(const typename Fmt::T* kp, int64_t st, int64_t k0, int64_t c0, int64_t c1, int64_t D,
                    float* kt) {
  using T = typename Fmt::T;
  for (int64_t j0 = c0; j0 < c1; j0 += 16) {
    const int64_t n = std::min<int64_t>(16, c1 - j0);
    float* out = kt + (j0 - c0) * D;  // (j0 - c0) / 16 vectors of D x 16
    const T* row[16];
    for (int64_t i = 0; i < 16; ++i) row[i] = kp + (j0 + std::min(i, n - 1) - k0) * st;
    const int64_t D16 = D / 16 * 16;
    for (int64_t d0 = 0; d0 < D16; d0 += 16) {
      __m512 r[16];
      for (int i = 0; i < 16; ++i) r[i] = load16<Fmt>(row[i], d0);
      if (n < 16)
        for (int i = 0; i < 16; ++i) r[i] = i < n ? r[i] : _mm512_setzero_ps();
      transpose16(r);
      for (int i = 0; i < 16; ++i) _mm512_storeu_ps(out + (d0 + i) * 16, r[i]);
    }
    if (D16 < D) {  // D % 16 == 8: the last 8 dims
      __m512 r[16];
      for (int i = 0; i < 16; ++i) r[i] = i < n ? _mm512_zextps256_ps512(Fmt::load(row[i], D16)) : _mm512_setzero_ps();
      transpose16(r);
      for (int i = 0; i < 8; ++i) _mm512_storeu_ps(out + (D16 + i) * 16, r[i]);
    }
  }
}

// The scores of R rows against J vectors of 16 keys (vector j at kt + j D 16), times scale:
// per key, chains l = 0..7 as qk's lanes, summed as hsum8 does, ((0+4)+(2+6))+((1+5)+(3+7)).
template <int R, int J, int64_t D8 = 0>
inline void qk(const float* const* q, const float* kt, int64_t D, __m512 scale, __m512 (&s)[R][J]) {
  if constexpr (D8 > 0) D = 8 * D8;
  const int64_t n8 = D / 8;
  // Chains l and l + 4 side by side, then their sum, into out.
  auto pair = [&](int l, __m512 (&out)[R][J]) __attribute__((always_inline)) {
    __m512 a[R][J], b[R][J];
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < J; ++j) a[r][j] = b[r][j] = _mm512_setzero_ps();
    for (int64_t c = 0; c < n8; ++c) {
      const int64_t d = 8 * c + l;
      __m512 ka[J], kb[J];
      for (int j = 0; j < J; ++j) {
        ka[j] = _mm512_loadu_ps(kt + (j * D + d) * 16);
        kb[j] = _mm512_loadu_ps(kt + (j * D + d + 4) * 16);
        // In registers: folded into each row's FMA, a vector would be loaded R times.
        asm("" : "+v"(ka[j]), "+v"(kb[j]));
      }
      for (int r = 0; r < R; ++r) {
        const __m512 qa = _mm512_set1_ps(q[r][d]), qb = _mm512_set1_ps(q[r][d + 4]);
        for (int j = 0; j < J; ++j) {
          a[r][j] = _mm512_fmadd_ps(qa, ka[j], a[r][j]);
          b[r][j] = _mm512_fmadd_ps(qb, kb[j], b[r][j]);
        }
      }
    }
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < J; ++j) out[r][j] = _mm512_add_ps(a[r][j], b[r][j]);
  };
  __m512 p[R][J], t[R][J];
  pair(0, p);
  pair(2, t);
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < J; ++j) p[r][j] = _mm512_add_ps(p[r][j], t[r][j]);
  pair(1, s);
  pair(3, t);
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < J; ++j)
      s[r][j] = _mm512_mul_ps(_mm512_add_ps(p[r][j], _mm512_add_ps(s[r][j], t[r][j])), scale);
}

// Row r keeps the lanes of s[r][j] (keys j0 + 16 j + lane) that are its own keys in [c0, c1).
template <int R, int J>
inline void keep(const Row* rs, int64_t j0, int64_t c0, int64_t c1, const __m512 (&s)[R][J]) {
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < J; ++j) {
      const int64_t g = j0 + 16 * j, lo = std::max({g, c0, rs[r].first}),
                    hi = std::min({g + 16, c1, rs[r].first + rs[r].n});
      if (hi - lo == 16) {
        _mm512_storeu_ps(rs[r].s + (g - rs[r].first), s[r][j]);
      } else if (lo < hi) {
        const __mmask16 m = static_cast<__mmask16>(((1u << (hi - lo)) - 1) << (lo - g));
        _mm512_mask_storeu_ps(rs[r].s + (g - rs[r].first), m, s[r][j]);
      }
    }
}

// The scores of R rows (each with its own keys [first, first + n)) for the J vectors of keys
// from j0 in kt (from key c0; keys past c1 are padding). D8: D / 8 when known at compile time.
template <int R, int J, int64_t D8>
inline void qk_rows(const Row* rs, const float* kt, int64_t j0, int64_t c0, int64_t c1, int64_t D, __m512 scale) {
  const float* q[R];
  for (int r = 0; r < R; ++r) q[r] = rs[r].q;
  __m512 s[R][J];
  qk<R, J, D8>(q, kt + (j0 - c0) * D, D, scale, s);
  keep<R, J>(rs, j0, c0, c1, s);
}

template <int R, int J>
inline void qk_rows_d(const Row* rs, const float* kt, int64_t j0, int64_t c0, int64_t c1, int64_t D,
                      __m512 scale) {
  if (D == 64) qk_rows<R, J, 8>(rs, kt, j0, c0, c1, D, scale);
  else if (D == 128) qk_rows<R, J, 16>(rs, kt, j0, c0, c1, D, scale);
  else qk_rows<R, J, 0>(rs, kt, j0, c0, c1, D, scale);
}

// The scores of every row of the tile for keys [c0, c1) from kt: 32 keys at a time (16 at the
// end), each against the rows 3 at a time, so that those keys' kt (8 KB at D = 64) stays in L1
// while the rows pass.
inline void scores(const Row* rows, int64_t n_rows, const float* kt, int64_t c0, int64_t c1, int64_t D, float scale) {
  const __m512 sv = _mm512_set1_ps(scale);
  for (int64_t j0 = c0; j0 < c1; j0 += 32) {
    const bool two = j0 + 16 < c1;
    for (int64_t r = 0; r < n_rows; r += 3) {
      const Row* rs = rows + r;
      const int64_t m = std::min<int64_t>(3, n_rows - r);
      bool any = false;  // does some row of the group visit these keys?
      for (int64_t i = 0; i < m; ++i)
        any |= std::max(j0, rs[i].first) < std::min({j0 + 32, c1, rs[i].first + rs[i].n});
      if (!any) continue;
      if (m == 3) two ? qk_rows_d<3, 2>(rs, kt, j0, c0, c1, D, sv) : qk_rows_d<3, 1>(rs, kt, j0, c0, c1, D, sv);
      else if (m == 2) two ? qk_rows_d<2, 2>(rs, kt, j0, c0, c1, D, sv) : qk_rows_d<2, 1>(rs, kt, j0, c0, c1, D, sv);
      else two ? qk_rows_d<1, 2>(rs, kt, j0, c0, c1, D, sv) : qk_rows_d<1, 1>(rs, kt, j0, c0, c1, D, sv);
    }
  }
}

// exp_neg on 16 lanes, each lane's operations as exp_neg's.
inline __m512 exp_neg(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.f));
  const __m512 n =
      _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
  __m512 p = _mm512_set1_ps(kExpPoly[0]);
  for (int i = 1; i < 6; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpPoly[i]));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.f)));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

inline __m256 high(__m512 v) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)); }

// softmax, 16 scores at a time: the same maximum, and the same sum (8 lanes, each adding its
// scores in order: a zmm's low 8 and then its high 8).
inline float softmax(Row& r) {
  float* s = r.s;
  const int64_t n = r.n, n8 = (n + 7) / 8 * 8, n16 = n8 / 16 * 16;
  for (int64_t i = n; i < n8; ++i) s[i] = -std::numeric_limits<float>::infinity();
  __m512 m = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t i = 0; i < n16; i += 16) m = _mm512_max_ps(_mm512_loadu_ps(s + i), m);  // keeps m on NaN
  __m256 m8 = _mm256_max_ps(_mm512_castps512_ps256(m), high(m));
  if (n16 < n8) m8 = _mm256_max_ps(_mm256_loadu_ps(s + n16), m8);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m8);
  float mx = std::max(lanes[0], r.sink);
  for (int i = 1; i < 8; ++i) mx = std::max(mx, lanes[i]);
  const __m512 mv = _mm512_set1_ps(mx);
  __m256 sumv = _mm256_setzero_ps();
  for (int64_t i = 0; i < n16; i += 16) {
    const __m512 p = exp_neg(_mm512_sub_ps(_mm512_loadu_ps(s + i), mv));
    _mm512_storeu_ps(s + i, p);
    sumv = _mm256_add_ps(sumv, _mm512_castps512_ps256(p));
    sumv = _mm256_add_ps(sumv, high(p));
  }
  if (n16 < n8) {
    const __m256 p = ::exp_neg(_mm256_sub_ps(_mm256_loadu_ps(s + n16), _mm512_castps512_ps256(mv)));
    _mm256_storeu_ps(s + n16, p);
    sumv = _mm256_add_ps(sumv, p);
  }
  return inverse_sum(hsum(sumv), r.sink, mx);
}

// y_r[d0, d0 + 16 C) += sum_i p_r[i] v_i, as narrow pv does 8 dims at a time.
template <class Fmt, int R, int C>
inline void pv(float* const* y, const float* const* p, const typename Fmt::T* v, int64_t vs, int64_t d0, int64_t n) {
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_loadu_ps(y[r] + d0 + 16 * c);
  for (int64_t i = 0; i < n; ++i) {
    __m512 pi[R];
    for (int r = 0; r < R; ++r) pi[r] = _mm512_set1_ps(p[r][i]);
    const typename Fmt::T* vi = v + i * vs;
    for (int c = 0; c < C; ++c) {
      const __m512 x = load16<Fmt>(vi, d0 + 16 * c);
      for (int r = 0; r < R; ++r) acc[r][c] = _mm512_fmadd_ps(pi[r], x, acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(y[r] + d0 + 16 * c, acc[r][c]);
}

// Chunks of 16 dims per pass: 3 rows x 8 = 24 accumulators of the 32 registers.
template <int R>
constexpr int kChunks = R == 3 ? 8 : 12;

template <class Fmt, int R, int K = 1>
void pv_rest(int64_t rest, float* const* y, const float* const* p, const typename Fmt::T* v, int64_t vs, int64_t d0,
             int64_t n) {
  if constexpr (K < kChunks<R>) {
    if (rest == K) return pv<Fmt, R, K>(y, p, v, vs, d0, n);
    pv_rest<Fmt, R, K + 1>(rest, y, p, v, vs, d0, n);
  }
}

// y += p v for R rows that share their keys, over keys [r0, r1) (key j at vb + (j - k0) vs), in
// dims [d0, d1) (d0 a multiple of 16); a last 8 dims (d1 % 16 == 8) go through the narrow pv.
template <class Fmt, int R>
void pv_rows(const Row* rs, const typename Fmt::T* vb, int64_t vs, int64_t k0, int64_t r0, int64_t r1, int64_t d0,
             int64_t d1) {
  constexpr int64_t W = 16 * kChunks<R>;
  float* y[R];
  const float* p[R];
  for (int r = 0; r < R; ++r) y[r] = rs[r].y, p[r] = rs[r].s + (r0 - rs->first);
  const typename Fmt::T* v = vb + (r0 - k0) * vs;
  const int64_t d16 = d1 / 16 * 16;
  for (int64_t d = d0; d < d16; d += W) {
    if (d + W <= d16) pv<Fmt, R, kChunks<R>>(y, p, v, vs, d, r1 - r0);
    else pv_rest<Fmt, R>((d16 - d) / 16, y, p, v, vs, d, r1 - r0);
  }
  if (d16 < d1) ::pv<Fmt, R, 1>(y, p, v, vs, d16, r1 - r0);
}

}  // namespace wide
#pragma GCC pop_options

// One group of m rows (head_groups' 3, 2 or 1) of a tile: its scores (qk_rows, prefetching V
// where V) and its p v over dims [d0, d1) on the narrow or the wide path (pv_rows).
template <class Fmt, bool V = true>
inline void qk_group(int64_t m, const Row* rs, const typename Fmt::T* kb, int64_t ks, int64_t k0, int64_t lo,
                     int64_t c0, int64_t c1, int64_t D, __m256 scale, int64_t vdiff) {
  switch (m) {
    case 3: return qk_rows<Fmt, 3, V>(rs, kb, ks, k0, lo, c0, c1, D, scale, vdiff);
    case 2: return qk_rows<Fmt, 2, V>(rs, kb, ks, k0, lo, c0, c1, D, scale, vdiff);
    default: return qk_rows<Fmt, 1, V>(rs, kb, ks, k0, lo, c0, c1, D, scale, vdiff);
  }
}
template <class Fmt>
inline void pv_group(bool wide_path, int64_t m, const Row* rs, const typename Fmt::T* vb, int64_t vs, int64_t k0,
                     int64_t r0, int64_t r1, int64_t d0, int64_t d1) {
  if (wide_path) {
    switch (m) {
      case 3: return wide::pv_rows<Fmt, 3>(rs, vb, vs, k0, r0, r1, d0, d1);
      case 2: return wide::pv_rows<Fmt, 2>(rs, vb, vs, k0, r0, r1, d0, d1);
      default: return wide::pv_rows<Fmt, 1>(rs, vb, vs, k0, r0, r1, d0, d1);
    }
  }
  switch (m) {
    case 3: return pv_rows<Fmt, 3>(rs, vb, vs, k0, r0, r1, d0, d1);
    case 2: return pv_rows<Fmt, 2>(rs, vb, vs, k0, r0, r1, d0, d1);
    default: return pv_rows<Fmt, 1>(rs, vb, vs, k0, r0, r1, d0, d1);
  }
}

struct Buffers {
  std::vector<Row> rows;
  std::vector<float> s, inv, kv;  // kv: one block of K or V as float32 (kCopy)
  std::vector<float> kt;  // the wide scores' block of K, transposed (wide::transpose_keys)
};

// Formats converted to float32 a block at a time for tiles of 2+ tokens: q8_0, whose
// load (a scale, widening, a conversion and a multiply per 8 values) otherwise costs
// more than the FMAs it feeds (measured 1.4-1.7x on 18 tokens; float16 and bfloat16
// loads are cheap enough that the copy measured no faster).
template <class Fmt>
constexpr bool kCopy = std::is_same_v<Fmt, Q8_0>;

// Rows [c0, c1) of K or V (format Fmt, row j at p + j ks) as float32 rows D apart in out.
template <class Fmt>
void to_f32(const typename Fmt::T* p, int64_t ks, int64_t c0, int64_t c1, int64_t D, float* out) {
  for (int64_t j = c0; j < c1; ++j)
    for (int64_t d = 0; d < D; d += 8) _mm256_storeu_ps(out + (j - c0) * D + d, Fmt::load(p + j * ks, d));
}

// The keys of [j0, j1) that some row visits.
void block_span(const std::vector<Row>& rows, int64_t j0, int64_t j1, int64_t& lo, int64_t& hi) {
  lo = j1;
  hi = j0;
  for (const Row& r : rows) {
    const int64_t a = std::max(j0, r.first), b = std::min(j1, r.first + r.n);
    if (a < b) lo = std::min(lo, a), hi = std::max(hi, b);
  }
}

// Floats for each row's scores: a multiple of 1 KB moves by a cache line, or the rows' scores
// would share L1 sets (4 KB apart).
inline int64_t score_cap(int64_t L) {
  const int64_t cap = (L + 7) / 8 * 8;
  return cap % 256 == 0 ? cap + 16 : cap;
}
// Keys per block: 16 KB of K or V as the rows read them (row_bytes a key).
inline int64_t key_block(int64_t row_bytes) { return std::max<int64_t>(16, 16384 / row_bytes / 8 * 8); }

// A query row's softmax (soft-capped first where a.softcap is set); returns 1 / the sum.
float row_softmax(const Args& a, Row& r) {
  if (a.softcap > 0) softcap(r, a.softcap);
  return a.wide ? wide::softmax(r) : softmax(r);
}

template <class Fmt>
void tile(const Args& a, const fd::AttentionTiles& p, int64_t i, Buffers& buf) {
  using T = typename Fmt::T;
  const int64_t D = a.D, nh = a.H / a.Hkv;
  const int64_t blocks = (a.T + p.tokens - 1) / p.tokens;
  const int64_t b = i / blocks / a.Hkv, kvh = i / blocks % a.Hkv;
  const int64_t t0 = (blocks - 1 - i % blocks) * p.tokens, t1 = std::min(a.T, t0 + p.tokens);  // longest first
  const int64_t slot = a.rows[b], ks = a.ks[2];
  const T* kb = static_cast<const T*>(a.k) + slot * a.ks[0] + kvh * a.ks[1];
  const T* vb = static_cast<const T*>(a.v) + slot * a.ks[0] + kvh * a.ks[1];

  // Rows token-major: the nh heads of one token share their keys [first, first + n).
  const int64_t cap = score_cap(a.L);
  buf.rows.clear();
  buf.s.resize((t1 - t0) * nh * cap);
  int64_t lo = std::numeric_limits<int64_t>::max(), hi = 0;  // the keys any row visits
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t L = a.pos[b * a.T + t] + 1;
    const int64_t first = a.window > 0 ? std::max<int64_t>(0, L - a.window) : 0;
    lo = std::min(lo, first);
    hi = std::max(hi, L);
    for (int64_t h = kvh * nh; h < (kvh + 1) * nh; ++h)
      buf.rows.push_back(Row{a.q + b * a.qs[0] + t * a.qs[1] + h * a.qs[2], a.y + ((b * a.T + t) * a.H + h) * D,
                             buf.s.data() + buf.rows.size() * cap, first, L - first, sink_of(a, h)});
  }
  const int64_t n_rows = static_cast<int64_t>(buf.rows.size());
  // Keys per block: 16 KB of K or V as the rows read it, which the tile's tokens read
  // in turn from L1/L2. A format whose loads cost more than the FMAs they feed (q8_0)
  // is first converted, a block at a time, into float32 rows for all the tile's tokens
  // (the same values, so the same result as loading them one chunk at a time).
  // The wide path's tiles of 2+ tokens take their scores from K transposed a block at a time
  // (wide::transpose_keys, which converts it too), so K needs no copy there; V as stored (a
  // float32 copy of float16 V measured slower).
  const bool wide_tile = a.wide && t1 - t0 > 1;
  const bool copy_k = kCopy<Fmt> && t1 - t0 > 1 && !wide_tile, copy_v = kCopy<Fmt> && t1 - t0 > 1;
  const int64_t jb = key_block(copy_k || copy_v ? 4 * D : Fmt::row_bytes(D));
  if (copy_k || copy_v) buf.kv.resize(jb * D);
  const __m256 scale = _mm256_set1_ps(a.scale);

  // f over each block of keys [c0, c1) that some row visits, read from src (K or V) as
  // stored, or (copy) first converted to float32 rows D apart.
  auto each_block = [&](const T* src, bool copy, auto&& f) {
    for (int64_t j0 = lo; j0 < hi; j0 += jb) {
      int64_t c0, c1;
      block_span(buf.rows, j0, std::min(hi, j0 + jb), c0, c1);
      if (c0 >= c1) continue;
      if (copy) {
        to_f32<Fmt>(src, ks, c0, c1, D, buf.kv.data());
        f.template operator()<F32>(buf.kv.data(), D, c0, c0, c1);
      } else {
        f.template operator()<Fmt>(src, ks, 0, c0, c1);
      }
    }
  };
  // The scores of keys [c0, c1) of K (format U, key j at kp + (j - k0) st) for every token.
  if (wide_tile) buf.kt.resize((jb + 15) / 16 * 16 * D);
  // A decode tile prefetches (qk_rows); tiles of several tokens read each block of K from L1/L2
  // after their first token.
  const int64_t vdiff = t1 - t0 == 1 ? vb - kb : 0;
  if (vdiff)  // the first keys, which qk_rows' prefetches do not reach
    for (int64_t j = lo; j < std::min(hi, lo + kAheadKeys); ++j)
      prefetch_key(kb + j * ks, vdiff, Fmt::row_bytes(D));
  auto scores = [&]<class U>(const typename U::T* kp, int64_t st, int64_t k0, int64_t c0, int64_t c1) {
    if (wide_tile) {
      wide::transpose_keys<U>(kp, st, k0, c0, c1, D, buf.kt.data());
      return wide::scores(buf.rows.data(), n_rows, buf.kt.data(), c0, c1, D, a.scale);
    }
    for (int64_t r = 0; r < n_rows; r += nh) {
      const Row* rs = &buf.rows[r];
      if (std::max(c0, rs->first) >= std::min(c1, rs->first + rs->n)) continue;
      head_groups(nh, [&](int64_t h, int64_t m) {
        const int64_t pf = h == 0 ? vdiff : 0;  // the token's first group of heads prefetches for all
        qk_group<U>(m, rs + h, kp, st, k0, lo, c0, c1, D, scale, pf);
      });
    }
  };
  each_block(kb, copy_k, scores);
  buf.inv.resize(n_rows);
  for (int64_t r = 0; r < n_rows; ++r) {
    buf.inv[r] = row_softmax(a, buf.rows[r]);
    std::fill(buf.rows[r].y, buf.rows[r].y + D, 0.f);
  }
  // y = sum_j p_j v_j, block by block into y (float32, so stopping between blocks is exact):
  // each token's keys of [c0, c1) of V (format U, key j at vp + (j - k0) st).
  auto values = [&]<class U>(const typename U::T* vp, int64_t st, int64_t k0, int64_t c0, int64_t c1) {
    for (int64_t r = 0; r < n_rows; r += nh) {
      const Row* rs = &buf.rows[r];
      const int64_t r0 = std::max(c0, rs->first), r1 = std::min(c1, rs->first + rs->n);
      if (r0 >= r1) continue;
      head_groups(nh, [&](int64_t h, int64_t m) { pv_group<U>(a.wide, m, rs + h, vp, st, k0, r0, r1, 0, D); });
    }
  };
  each_block(vb, copy_v, values);
  for (int64_t r = 0; r < n_rows; ++r) {
    float* y = buf.rows[r].y;
    const __m256 iv = _mm256_set1_ps(buf.inv[r]);
    for (int64_t d = 0; d < D; d += 8) _mm256_storeu_ps(y + d, _mm256_mul_ps(_mm256_loadu_ps(y + d), iv));
  }
}

template <class Fmt>
void run(const Args& a, const fd::AttentionTiles& p, std::atomic<int64_t>& next) {
  thread_local Buffers buf;  // kept between calls: no allocation per layer once warm
  for (int64_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < p.count;) tile<Fmt>(a, p, i, buf);
}

// -- Split decode tiles (kernels.h: attention_split) --

// Dims per part of the split p v: a multiple of 16 (the wide pv's step); 128 bytes of a float16
// row, so that the threads share few of V's cache lines.
constexpr int64_t kSplitDims = 64;
constexpr int64_t kMaxHeadsPerKv = 64;  // a tile's rows on the stack; more do not split
// The bytes of K a row must read before a split's two extra rounds of the threads pay for
// themselves: on an Intel Xeon, Gemma 3 270M's shape (one kv head, head_dim 256, float16) broke
// even at 256 keys and gained 1.2x at 512 (benchmarks/attention/split.md).
constexpr int64_t kSplitMinBytes = 256 << 10;

// Decode tile i's rows (batch row i / Hkv, kv head i % Hkv; one token), scores in plan.s, and
// its slot's K and V rows of that kv head.
template <class Fmt>
struct SplitTile {
  Row rows[kMaxHeadsPerKv];
  int64_t nh, lo, hi;
  const typename Fmt::T *kb, *vb;
};

template <class Fmt>
SplitTile<Fmt> split_tile(const Args& a, fd::AttentionSplit& plan, int64_t i) {
  SplitTile<Fmt> t;
  t.nh = a.H / a.Hkv;
  const int64_t b = i / a.Hkv, kvh = i % a.Hkv, L = a.pos[b] + 1;
  t.lo = a.window > 0 ? std::max<int64_t>(0, L - a.window) : 0;
  t.hi = L;
  for (int64_t h = 0; h < t.nh; ++h) {
    const int64_t head = kvh * t.nh + h;
    t.rows[h] = Row{a.q + b * a.qs[0] + head * a.qs[2], a.y + (b * a.H + head) * a.D,
                    plan.s.data() + (i * t.nh + h) * plan.cap, t.lo, L - t.lo, sink_of(a, head)};
  }
  const int64_t at = a.rows[b] * a.ks[0] + kvh * a.ks[1];
  t.kb = static_cast<const typename Fmt::T*>(a.k) + at;
  t.vb = static_cast<const typename Fmt::T*>(a.v) + at;
  return t;
}

// Phase 0, part (tile, block m): the scores of the block's keys, as tile's scores make them.
template <class Fmt>
void split_scores(const Args& a, fd::AttentionSplit& plan, int64_t part) {
  using T = typename Fmt::T;
  const SplitTile<Fmt> t = split_tile<Fmt>(a, plan, part / plan.blocks);
  const int64_t c0 = t.lo + part % plan.blocks * plan.jb, c1 = std::min(t.hi, c0 + plan.jb);
  if (c0 >= c1) return;
  const T* kb = t.kb;
  const int64_t ks = a.ks[2], vdiff = t.vb - t.kb;
  // This block's first keys (the block before, maybe another thread's, prefetched them for
  // itself). Not V: phase 2's parts may run on another core (1.1x on Gemma 3 270M's shape).
  for (int64_t j = c0; j < std::min(c1, c0 + kAheadKeys); ++j)
    prefetch_key<false>(kb + j * ks, vdiff, Fmt::row_bytes(a.D));
  const __m256 scale = _mm256_set1_ps(a.scale);
  head_groups(t.nh, [&](int64_t h, int64_t m) {
    qk_group<Fmt, false>(m, t.rows + h, kb, ks, 0, t.lo, c0, c1, a.D, scale, h == 0 ? vdiff : 0);
  });
}

// Phase 1, part r: query row r's softmax; its y zeroed for phase 2.
template <class Fmt>
void split_softmax(const Args& a, fd::AttentionSplit& plan, int64_t r) {
  SplitTile<Fmt> t = split_tile<Fmt>(a, plan, r / (a.H / a.Hkv));
  Row& row = t.rows[r % t.nh];
  plan.inv[r] = row_softmax(a, row);
  std::fill(row.y, row.y + a.D, 0.f);
}

// Phase 2, part (tile, chunk c): y = p v / sum in dims [64 c, 64 c + 64), block by block, as
// tile's values make it.
template <class Fmt>
void split_values(const Args& a, fd::AttentionSplit& plan, int64_t part) {
  using T = typename Fmt::T;
  const int64_t i = part / plan.chunks, d0 = part % plan.chunks * kSplitDims, d1 = std::min(a.D, d0 + kSplitDims);
  const SplitTile<Fmt> t = split_tile<Fmt>(a, plan, i);
  const T* vb = t.vb;
  const int64_t vs = a.ks[2];
  for (int64_t c0 = t.lo; c0 < t.hi; c0 += plan.jb) {
    const int64_t c1 = std::min(t.hi, c0 + plan.jb);
    for (int64_t j = c1; j < std::min(t.hi, c1 + plan.jb); ++j)  // the next block's rows, meanwhile
      prefetch_row<_MM_HINT_T1>(reinterpret_cast<const char*>(vb + j * vs), Fmt::row_bytes(a.D));
    head_groups(t.nh, [&](int64_t h, int64_t m) { pv_group<Fmt>(a.wide, m, t.rows + h, vb, vs, 0, c0, c1, d0, d1); });
  }
  for (int64_t h = 0; h < t.nh; ++h) {
    float* y = t.rows[h].y;
    const __m256 iv = _mm256_set1_ps(plan.inv[i * t.nh + h]);
    for (int64_t d = d0; d < d1; d += 8) _mm256_storeu_ps(y + d, _mm256_mul_ps(_mm256_loadu_ps(y + d), iv));
  }
}

template <class Fmt>
void split_run(const Args& a, fd::AttentionSplit& plan, int phase, std::atomic<int64_t>& next) {
  const int64_t n = plan.parts(phase);
  for (int64_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < n;) {
    if (phase == 0) split_scores<Fmt>(a, plan, i);
    else if (phase == 1) split_softmax<Fmt>(a, plan, i);
    else split_values<Fmt>(a, plan, i);
  }
}

}  // namespace

int64_t fd::AttentionSplit::parts(int phase) const {
  return phase == 0 ? tiles * blocks : phase == 1 ? tiles * heads : tiles * chunks;
}

bool fd::attention_split(const AttentionArgs& a, int threads, AttentionSplit& plan) {
  const int64_t tiles = a.B * a.Hkv, nh = a.H / a.Hkv;
  const int64_t row_bytes = a.kv == kKvF32    ? F32::row_bytes(a.D)
                            : a.kv == kKvF16  ? F16::row_bytes(a.D)
                            : a.kv == kKvBF16 ? BF16::row_bytes(a.D)
                                              : Q8_0::row_bytes(a.D);
  if (a.T != 1 || tiles >= threads || a.L * row_bytes < kSplitMinBytes || nh > kMaxHeadsPerKv) return false;
  plan.tiles = tiles;
  plan.heads = nh;
  plan.cap = score_cap(a.L);
  plan.jb = key_block(row_bytes);
  plan.blocks = (a.L + plan.jb - 1) / plan.jb;
  plan.chunks = (a.D + kSplitDims - 1) / kSplitDims;
  plan.s.resize(tiles * nh * plan.cap);
  plan.inv.resize(tiles * nh);
  return true;
}

void fd::attention_split_run(const AttentionArgs& a, AttentionSplit& plan, int phase, std::atomic<int64_t>& next) {
  switch (a.kv) {
    case fd::kKvF32: return split_run<F32>(a, plan, phase, next);
    case fd::kKvF16: return split_run<F16>(a, plan, phase, next);
    case fd::kKvBF16: return split_run<BF16>(a, plan, phase, next);
    case fd::kKvQ8_0: return split_run<Q8_0>(a, plan, phase, next);
  }
}

fd::AttentionTiles fd::attention_tiles(const AttentionArgs& a, int threads) {
  const int64_t groups = a.B * a.Hkv;
  AttentionTiles p{0, 0};
  if (a.kv != kKvQ8_0 && !(a.wide && a.T > 1)) {
    // Two tokens per tile: on one thread 2 to 16 ran alike (a tile's tokens read each
    // K/V block from L1/L2 after the first), and small tiles even out the threads'
    // shares; one when two leave under four tiles per thread.
    int64_t blocks = (a.T + 1) / 2;
    while (blocks < a.T && groups * blocks < 4 * static_cast<int64_t>(threads)) ++blocks;
    p.tokens = (a.T + blocks - 1) / blocks;
  } else {
    // q8_0 converts each K/V block once per tile (tile, kCopy), and the wide path transposes
    // each K block once per tile, so more tokens share that, up to a cap that keeps the
    // tile's scores (tokens x heads x L floats) within 512 KB of L2. Among the splits under
    // the cap, the one whose busiest thread has the least work, counting a tile's conversion
    // as one more token.
    const int64_t nh = a.H / a.Hkv, th = std::max(1, threads);
    const int64_t cap = std::clamp<int64_t>(131072 / (nh * std::max<int64_t>(a.L, 1)), 1, 16);
    int64_t best = std::numeric_limits<int64_t>::max();
    p.tokens = a.T;
    for (int64_t blocks = (a.T + cap - 1) / cap; blocks <= a.T; ++blocks) {
      const int64_t tokens = (a.T + blocks - 1) / blocks, tiles = groups * ((a.T + tokens - 1) / tokens);
      const int64_t cost = (tiles + th - 1) / th * (tokens + 1);
      if (cost < best) best = cost, p.tokens = tokens;
    }
  }
  p.count = groups * ((a.T + p.tokens - 1) / p.tokens);
  return p;
}

void fd::attention_run(const AttentionArgs& a, const AttentionTiles& p, std::atomic<int64_t>& next) {
  switch (a.kv) {
    case fd::kKvF32: return run<F32>(a, p, next);
    case fd::kKvF16: return run<F16>(a, p, next);
    case fd::kKvBF16: return run<BF16>(a, p, next);
    case fd::kKvQ8_0: return run<Q8_0>(a, p, next);
  }
}
