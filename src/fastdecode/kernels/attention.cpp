// Attention over a KV cache for float32 CPU models, grouped-query aware (see kernels.h).
// Plain C++ on raw pointers, no torch headers; ops.cpp checks the arguments,
// allocates and runs attention_run on each thread.
//
// y[b, t, h] = softmax_j(scale * q[b, t, h] . k[r, h / n_rep, j]) v[r, h / n_rep, j]
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
// that. Threads take tiles from a shared counter, so a busy core takes fewer.
#include <immintrin.h>
#include <algorithm>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels.h"
#include "simd.h"

namespace {

using Args = fd::AttentionArgs;

// e^x for x <= 0 (scores minus their maximum): 2^n * p(r), x = n ln2 + r, |r| <= ln2 / 2,
// a degree-6 polynomial (relative error ~2e-7); underflows to 0 below -87.
inline __m256 exp_neg(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
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

// Lane i: hsum(a[i]), with hsum's pairing ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)), so
// each sum is bit for bit the one hsum gives.
inline __m256 hsum8(const __m256* a) {
  __m256 x[4];
  for (int i = 0; i < 4; ++i)  // lanes 0-3: a[i]'s l_k + l_k+4; lanes 4-7: a[i + 4]'s
    x[i] = _mm256_add_ps(_mm256_permute2f128_ps(a[i], a[i + 4], 0x20), _mm256_permute2f128_ps(a[i], a[i + 4], 0x31));
  // Per 128-bit half: [P_i, P_i+1, Q_i, Q_i+1], P = (l0+l4)+(l2+l6), Q = (l1+l5)+(l3+l7).
  const __m256 u = _mm256_add_ps(_mm256_unpacklo_ps(x[0], x[1]), _mm256_unpackhi_ps(x[0], x[1]));
  const __m256 w = _mm256_add_ps(_mm256_unpacklo_ps(x[2], x[3]), _mm256_unpackhi_ps(x[2], x[3]));
  return _mm256_add_ps(_mm256_shuffle_ps(u, w, _MM_SHUFFLE(1, 0, 1, 0)), _mm256_shuffle_ps(u, w, _MM_SHUFFLE(3, 2, 3, 2)));
}

// Lanes 0-3: hsum(a[i]) as hsum8 pairs them, for 4 accumulators.
inline __m128 hsum4(const __m256* a) {
  // lanes 0-3: a[i]'s l_k + l_k+4; lanes 4-7: a[i + 2]'s
  const __m256 x0 = _mm256_add_ps(_mm256_permute2f128_ps(a[0], a[2], 0x20), _mm256_permute2f128_ps(a[0], a[2], 0x31));
  const __m256 x1 = _mm256_add_ps(_mm256_permute2f128_ps(a[1], a[3], 0x20), _mm256_permute2f128_ps(a[1], a[3], 0x31));
  // Per 128-bit half: [P_i, P_i+1, Q_i, Q_i+1]; then P + Q in its lanes 0-1.
  const __m256 u = _mm256_add_ps(_mm256_unpacklo_ps(x0, x1), _mm256_unpackhi_ps(x0, x1));
  const __m256 s = _mm256_add_ps(u, _mm256_shuffle_ps(u, u, _MM_SHUFFLE(3, 2, 3, 2)));
  return _mm_castpd_ps(_mm_unpacklo_pd(_mm_castps_pd(_mm256_castps256_ps128(s)),
                                       _mm_castps_pd(_mm256_extractf128_ps(s, 1))));
}

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
};

// Scores of R rows that share their keys (one token's heads; rs[0]'s first and n) for
// keys [c0, c1) (key j at kb + (j - k0) ks), J at a time from lo + J m (lo: the tile's
// first key).
template <class Fmt, int R>
void qk_rows(const Row* rs, const typename Fmt::T* kb, int64_t ks, int64_t k0, int64_t lo, int64_t c0, int64_t c1,
             int64_t D, __m256 scale) {
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
  for (; g + J <= r1; g += J) {
    for (int j = 0; j < J; ++j) k[j] = kb + (g + j - k0) * ks;
    group(g, 0, J);
  }
  if (g < r1) partial(g);
}

// y += p v for R rows that share their keys, over keys [r0, r1) (key j at vb + (j - k0) vs).
template <class Fmt, int R>
void pv_rows(const Row* rs, const typename Fmt::T* vb, int64_t vs, int64_t k0, int64_t r0, int64_t r1, int64_t D) {
  constexpr int64_t W = 8 * kChunks<R>;
  float* y[R];
  const float* p[R];
  for (int r = 0; r < R; ++r) y[r] = rs[r].y, p[r] = rs[r].s + (r0 - rs->first);
  const typename Fmt::T* v = vb + (r0 - k0) * vs;
  for (int64_t d0 = 0; d0 < D; d0 += W) {
    if (d0 + W <= D) pv<Fmt, R, kChunks<R>>(y, p, v, vs, d0, r1 - r0);
    else pv_rest<Fmt, R>((D - d0) / 8, y, p, v, vs, d0, r1 - r0);
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
  float mx = lanes[0];
  for (int i = 1; i < 8; ++i) mx = std::max(mx, lanes[i]);
  const __m256 mv = _mm256_set1_ps(mx);
  __m256 sumv = _mm256_setzero_ps();
  for (int64_t i = 0; i < n8; i += 8) {
    const __m256 p = exp_neg(_mm256_sub_ps(_mm256_loadu_ps(s + i), mv));
    _mm256_storeu_ps(s + i, p);
    sumv = _mm256_add_ps(sumv, p);
  }
  return 1.f / hsum(sumv);
}

struct Buffers {
  std::vector<Row> rows;
  std::vector<float> s, inv, kv;  // kv: one block of K or V as float32 (kCopy)
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
  // Each row's scores in cap floats; a cap that is a multiple of 1 KB moves by a
  // cache line, or the rows' scores would share L1 sets (4 KB apart).
  int64_t cap = (a.L + 7) / 8 * 8;
  if (cap % 256 == 0) cap += 16;
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
                             buf.s.data() + buf.rows.size() * cap, first, L - first});
  }
  const int64_t n_rows = static_cast<int64_t>(buf.rows.size());
  // Keys per block: 16 KB of K or V as the rows read it, which the tile's tokens read
  // in turn from L1/L2. A format whose loads cost more than the FMAs they feed (q8_0)
  // is first converted, a block at a time, into float32 rows for all the tile's tokens
  // (the same values, so the same result as loading them one chunk at a time).
  const bool copy = kCopy<Fmt> && t1 - t0 > 1;
  const int64_t jb = std::max<int64_t>(16, 16384 / (copy ? 4 * D : Fmt::row_bytes(D)) / 8 * 8);
  if (copy) buf.kv.resize(jb * D);
  const __m256 scale = _mm256_set1_ps(a.scale);

  // f over each block of keys [c0, c1) that some row visits, read from src (K or V) as
  // stored, or (copy) first converted to float32 rows D apart.
  auto each_block = [&](const T* src, auto&& f) {
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
  auto scores = [&]<class U>(const typename U::T* kp, int64_t st, int64_t k0, int64_t c0, int64_t c1) {
    for (int64_t r = 0; r < n_rows; r += nh) {
      const Row* rs = &buf.rows[r];
      if (std::max(c0, rs->first) >= std::min(c1, rs->first + rs->n)) continue;
      head_groups(nh, [&](int64_t h, int64_t m) {
        switch (m) {
          case 3: return qk_rows<U, 3>(rs + h, kp, st, k0, lo, c0, c1, D, scale);
          case 2: return qk_rows<U, 2>(rs + h, kp, st, k0, lo, c0, c1, D, scale);
          default: return qk_rows<U, 1>(rs + h, kp, st, k0, lo, c0, c1, D, scale);
        }
      });
    }
  };
  each_block(kb, scores);
  buf.inv.resize(n_rows);
  for (int64_t r = 0; r < n_rows; ++r) {
    buf.inv[r] = softmax(buf.rows[r]);
    std::fill(buf.rows[r].y, buf.rows[r].y + D, 0.f);
  }
  // y = sum_j p_j v_j, block by block into y (float32, so stopping between blocks is exact):
  // each token's keys of [c0, c1) of V (format U, key j at vp + (j - k0) st).
  auto values = [&]<class U>(const typename U::T* vp, int64_t st, int64_t k0, int64_t c0, int64_t c1) {
    for (int64_t r = 0; r < n_rows; r += nh) {
      const Row* rs = &buf.rows[r];
      const int64_t r0 = std::max(c0, rs->first), r1 = std::min(c1, rs->first + rs->n);
      if (r0 >= r1) continue;
      head_groups(nh, [&](int64_t h, int64_t m) {
        switch (m) {
          case 3: return pv_rows<U, 3>(rs + h, vp, st, k0, r0, r1, D);
          case 2: return pv_rows<U, 2>(rs + h, vp, st, k0, r0, r1, D);
          default: return pv_rows<U, 1>(rs + h, vp, st, k0, r0, r1, D);
        }
      });
    }
  };
  each_block(vb, values);
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

}  // namespace

fd::AttentionTiles fd::attention_tiles(const AttentionArgs& a, int threads) {
  const int64_t groups = a.B * a.Hkv;
  AttentionTiles p{0, 0};
  if (a.kv != kKvQ8_0) {
    // Two tokens per tile: on one thread 2 to 16 ran alike (a tile's tokens read each
    // K/V block from L1/L2 after the first), and small tiles even out the threads'
    // shares; one when two leave under four tiles per thread.
    int64_t blocks = (a.T + 1) / 2;
    while (blocks < a.T && groups * blocks < 4 * static_cast<int64_t>(threads)) ++blocks;
    p.tokens = (a.T + blocks - 1) / blocks;
  } else {
    // q8_0 converts each K/V block once per tile (tile, kCopy), so more tokens share that,
    // up to a cap that keeps the tile's scores (tokens x heads x L floats) within 512 KB
    // of L2. Among the splits under the cap, the one whose busiest thread has the least
    // work, counting a tile's conversion as one more token.
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
