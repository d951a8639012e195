// The float32 kernels' math (see kernels.h): GEMV, RMSNorm and attention rows.
// Plain C++ on raw pointers, no torch headers; ops.cpp checks the arguments,
// allocates and splits the rows across threads.
#include <immintrin.h>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels.h"
#include "simd.h"

// ---------------------------------------------------------------------------
// fp32 matrix-vector product for decode: y[m, n] = sum_k x[m, k] * w[n, k].
//
// At batch 1 stock F.linear runs a single-threaded GEMV that reaches about half
// of the memory bandwidth. This kernel splits the output rows across threads
// and streams four weight rows at a time with FMA accumulators; for the few
// activation rows of a decode batch the four weight rows stay in L1.

namespace {

// Dot products of one activation row with weight rows w[0..R).
template <int R>
inline void dot_rows(const float* x, const float* w, int64_t K, float* out) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    __m256 xv = _mm256_loadu_ps(x + k);
    for (int r = 0; r < R; ++r) acc[r] = _mm256_fmadd_ps(_mm256_loadu_ps(w + r * K + k), xv, acc[r]);
  }
  for (int r = 0; r < R; ++r) {
    float s = hsum(acc[r]);
    for (int64_t j = k; j < K; ++j) s += x[j] * w[r * K + j];
    out[r] = s;
  }
}

}  // namespace

void fd::gemv_rows(const float* xp, const float* wp, float* yp, int64_t M, int64_t K, int64_t N, int64_t begin,
                   int64_t end) {
  float out[4];
  int64_t n = begin;
  for (; n + 4 <= end; n += 4) {
    for (int64_t m = 0; m < M; ++m) {
      dot_rows<4>(xp + m * K, wp + n * K, K, out);
      for (int r = 0; r < 4; ++r) yp[m * N + n + r] = out[r];
    }
  }
  for (; n < end; ++n) {
    for (int64_t m = 0; m < M; ++m) {
      dot_rows<1>(xp + m * K, wp + n * K, K, out);
      yp[m * N + n] = out[0];
    }
  }
}

// ---------------------------------------------------------------------------
// RMSNorm for float32 rows: y = x / sqrt(mean(x^2) + eps) * w.
//
// One fused op instead of five (pow, mean, add, rsqrt, mul): fewer dispatches
// per decode step, and, because torch.compile calls the same code as eager
// (an opaque custom op), compiled and eager activations stay bit-identical,
// which the int8 activation quantization of the quantized matmuls needs for
// compiled and eager tokens to agree.

namespace {

void norm_row(const float* x, const float* w, float* y, int64_t K, float eps) {
  // Sum of squares in 8 lanes, then a fixed pairwise order: the same for every row and M.
  __m256 acc = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    const __m256 v = _mm256_loadu_ps(x + k);
    acc = _mm256_add_ps(acc, _mm256_mul_ps(v, v));
  }
  float ss = hsum(acc);
  for (; k < K; ++k) ss += x[k] * x[k];
  const float r = 1.f / std::sqrt(ss / static_cast<float>(K) + eps);
  const __m256 rv = _mm256_set1_ps(r);
  k = 0;
  for (; k + 8 <= K; k += 8)
    _mm256_storeu_ps(y + k, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + k), rv), _mm256_loadu_ps(w + k)));
  for (; k < K; ++k) y[k] = x[k] * r * w[k];
}

}  // namespace

void fd::rms_norm_rows(const float* xp, const float* wp, float* yp, int64_t K, float eps, int64_t m0, int64_t m1) {
  for (int64_t m = m0; m < m1; ++m) norm_row(xp + m * K, wp, yp + m * K, K, eps);
}

// ---------------------------------------------------------------------------
// Attention over a KV cache for float32 CPU models, grouped-query aware.
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
// threads, so a row sums in a different order alone than in a batch. Here each
// query row is one task that visits its allowed keys in slot order, so its
// result is the same at any batch size, padding or thread count, in eager and
// compiled code alike.

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
// format: float32 as is; float16 (F16C) and bfloat16 widen exactly; q8_0 (blocks of
// 32 int8 with one float16 scale ahead of each, 34 bytes, as llama.cpp's) is
// dequantized as scale * q, also exact in float32 (11 x 7 significant bits). So
// each format computes what the float32 path computes on its K/V converted to
// float32, in the same order.
struct F32 {
  using T = float;
  static __m256 load(const T* p, int64_t d) { return _mm256_loadu_ps(p + d); }
};
struct F16 {
  using T = uint16_t;
  static __m256 load(const T* p, int64_t d) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + d)));
  }
};
struct BF16 {
  using T = uint16_t;
  static __m256 load(const T* p, int64_t d) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + d)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
};
struct Q8_0 {
  using T = int8_t;
  static __m256 load(const T* p, int64_t d) {
    const T* blk = p + (d / 32) * fd::kQ8Block;
    uint16_t h;
    std::memcpy(&h, blk, 2);
    const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 2 + d % 32));
    return _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(h)), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)));
  }
};

// One query row (b, t, h): scores into s[L], softmax, weighted sum of values into y.
template <class Fmt>
void row(const Args& a, int64_t b, int64_t t, int64_t h, std::vector<float>& s) {
  using T = typename Fmt::T;
  const int64_t D = a.D, kvh = h / (a.H / a.Hkv);
  const float* q = a.q + b * a.qs[0] + t * a.qs[1] + h * a.qs[2];
  const int64_t slot = a.rows[b];
  const T* kb = static_cast<const T*>(a.k) + slot * a.ks[0] + kvh * a.ks[1];
  const T* vb = static_cast<const T*>(a.v) + slot * a.ks[0] + kvh * a.ks[1];
  const int64_t L = a.pos[b * a.T + t] + 1;
  const int64_t first = a.window > 0 ? std::max<int64_t>(0, L - a.window) : 0;
  kb += first * a.ks[2];
  vb += first * a.ks[2];
  int64_t n = 0;
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < L - first; ++j) {
    const T* kj = kb + j * a.ks[2];
    __m256 acc = _mm256_setzero_ps();
    for (int64_t d = 0; d < D; d += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), Fmt::load(kj, d), acc);
    const float sc = hsum(acc) * a.scale;
    s[n++] = sc;
    mx = std::max(mx, sc);
  }
  float* y = a.y + ((b * a.T + t) * a.H + h) * D;
  if (n == 0) {
    for (int64_t d = 0; d < D; ++d) y[d] = 0.f;
    return;
  }
  // Probabilities, 8 at a time, then the tail padded with -inf (exp -> 0).
  const __m256 mv = _mm256_set1_ps(mx);
  __m256 sumv = _mm256_setzero_ps();
  const int64_t n8 = (n + 7) / 8 * 8;
  for (int64_t i = n; i < n8; ++i) s[i] = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n8; i += 8) {
    const __m256 p = exp_neg(_mm256_sub_ps(_mm256_loadu_ps(&s[i]), mv));
    _mm256_storeu_ps(&s[i], p);
    sumv = _mm256_add_ps(sumv, p);
  }
  const float inv = 1.f / hsum(sumv);
  // y = sum_j p_j v_j, 8 dims per register; D <= 256 keeps 32 accumulators at most.
  for (int64_t d0 = 0; d0 < D; d0 += 64) {
    const int64_t w = std::min<int64_t>(64, D - d0) / 8;
    __m256 acc[8];
    for (int i = 0; i < 8; ++i) acc[i] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; ++i) {
      const __m256 p = _mm256_set1_ps(s[i]);
      const T* vj = vb + i * a.ks[2];
      for (int64_t c = 0; c < w; ++c) acc[c] = _mm256_fmadd_ps(p, Fmt::load(vj, d0 + 8 * c), acc[c]);
    }
    const __m256 iv = _mm256_set1_ps(inv);
    for (int64_t c = 0; c < w; ++c) _mm256_storeu_ps(y + d0 + 8 * c, _mm256_mul_ps(acc[c], iv));
  }
}

template <class Fmt>
void rows_of(const Args& a, int64_t r0, int64_t r1, int64_t L) {
  const int64_t T = a.T, H = a.H;
  std::vector<float> s(L + 8);
  for (int64_t r = r0; r < r1; ++r) row<Fmt>(a, r / (T * H), (r / H) % T, r % H, s);
}

}  // namespace

void fd::attention_rows(const AttentionArgs& a, int64_t r0, int64_t r1, int64_t L) {
  switch (a.kv) {
    case fd::kKvF32: return rows_of<F32>(a, r0, r1, L);
    case fd::kKvF16: return rows_of<F16>(a, r0, r1, L);
    case fd::kKvBF16: return rows_of<BF16>(a, r0, r1, L);
    case fd::kKvQ8_0: return rows_of<Q8_0>(a, r0, r1, L);
  }
}
