// The float32 kernels' math (see kernels.h): GEMV, RMSNorm, RoPE, the gated products (SwiGLU, GeGLU)
// and argmax rows (attention: attention.cpp).
// Plain C++ on raw pointers, no torch headers; ops.cpp checks the arguments,
// allocates and splits the rows across threads.
#include <immintrin.h>
#include <sleef.h>  // torch's copy, its symbols in libtorch_cpu
#include <cmath>

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

void fd::rope_rows(const int64_t* pos, const float* f, float* cos, float* sin, int64_t H, int64_t m0, int64_t m1) {
  for (int64_t m = m0; m < m1; ++m) {
    const float p = static_cast<float>(pos[m]);
    for (int64_t h = 0; h < H; ++h) {
      const double angle = p * f[h];  // a float32 product, then widened
      cos[m * H + h] = static_cast<float>(std::cos(angle));
      sin[m * H + h] = static_cast<float>(std::sin(angle));
    }
  }
}

namespace {

// y = act(g) * u for the rows of h = [g | u], in torch's loop: 8-lane vectors while two fit (16
// values), then scalars (its vector and scalar activations may differ in the last bit).
template <class Vec, class Scalar>
void glu_rows(const float* h, float* y, int64_t F, int64_t m0, int64_t m1, Vec act, Scalar act1) {
  for (int64_t m = m0; m < m1; ++m) {
    const float *g = h + m * 2 * F, *u = g + F;
    float* out = y + m * F;
    const int64_t vec = F / 16 * 16;
    for (int64_t f = 0; f < vec; f += 8)
      _mm256_storeu_ps(out + f, _mm256_mul_ps(act(_mm256_loadu_ps(g + f)), _mm256_loadu_ps(u + f)));
    for (int64_t f = vec; f < F; ++f) out[f] = act1(g[f]) * u[f];
  }
}

}  // namespace

void fd::silu_mul_rows(const float* h, float* y, int64_t F, int64_t m0, int64_t m1) {
  const __m256 one = _mm256_set1_ps(1.0f);
  glu_rows(
      h, y, F, m0, m1,
      [&](__m256 x) {
        return _mm256_div_ps(x, _mm256_add_ps(one, Sleef_expf8_u10avx2(_mm256_sub_ps(_mm256_setzero_ps(), x))));
      },
      [](float x) { return x / (1.0f + std::exp(-x)); });
}

void fd::gelu_tanh_mul_rows(const float* h, float* y, int64_t F, int64_t m0, int64_t m1) {
  // torch's GELU, tanh form; its build computes x + kappa x^3 in one fused multiply-add.
  const float beta = static_cast<float>(M_SQRT2 * M_2_SQRTPI * 0.5), kappa = static_cast<float>(0.044715);
  const __m256 half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
  const __m256 vbeta = _mm256_set1_ps(beta), vkappa = _mm256_set1_ps(kappa);
  glu_rows(
      h, y, F, m0, m1,
      [&](__m256 x) {
        const __m256 inner = _mm256_mul_ps(vbeta, _mm256_fmadd_ps(vkappa, _mm256_mul_ps(_mm256_mul_ps(x, x), x), x));
        return _mm256_mul_ps(_mm256_mul_ps(half, x), _mm256_add_ps(one, Sleef_tanhf8_u10avx2(inner)));
      },
      [&](float x) { return 0.5f * x * (1.0f + std::tanh(beta * std::fma(kappa, x * x * x, x))); });
}

// Two passes, as a row of logits (V = 49,152: 192 KiB) stays in L2: the largest value in 8 lanes,
// then the first index that holds it. A NaN anywhere makes the first NaN the answer, found by a
// scalar pass; -0 and +0 compare equal, so the first of either wins, as in torch.
void fd::first_max_rows(const float* xp, int64_t* idx, int64_t V, int64_t m0, int64_t m1) {
  for (int64_t m = m0; m < m1; ++m) {
    const float* x = xp + m * V;
    __m256 best = _mm256_set1_ps(-INFINITY), nan = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= V; k += 8) {
      const __m256 v = _mm256_loadu_ps(x + k);
      best = _mm256_max_ps(best, v);
      nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, best);
    float top = lanes[0];
    for (int i = 1; i < 8; ++i) top = lanes[i] > top ? lanes[i] : top;
    bool any_nan = _mm256_movemask_ps(nan) != 0;
    for (; k < V; ++k) {
      any_nan |= std::isnan(x[k]);
      top = x[k] > top ? x[k] : top;
    }
    int64_t at = 0;
    if (any_nan) {
      while (!std::isnan(x[at])) ++at;
    } else {
      const __m256 t = _mm256_set1_ps(top);
      for (k = 0; k + 8 <= V; k += 8) {
        const int hits = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + k), t, _CMP_EQ_OQ));
        if (hits) break;
      }
      while (x[k] != top) ++k;  // within the block that matched, or the tail
      at = k;
    }
    idx[m] = at;
  }
}
