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
#include <torch/library.h>
#include <torch/csrc/inductor/aoti_torch/utils.h>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <cmath>
#include <limits>
#include <vector>

#include "simd.h"

namespace {

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

struct Args {
  const float *q, *k, *v;
  const int64_t *pos, *rows;  // [B, T] contiguous, [B]
  float* y;
  int64_t T, H, Hkv, D, window;  // window 0: every key up to the position
  int64_t qs[4], ks[3];  // strides: q [B, T, H, D] (elements), k/v [B_cache, Hkv, S] (D contiguous)
  float scale;
};

// One query row (b, t, h): scores into s[L], softmax, weighted sum of values into y.
void row(const Args& a, int64_t b, int64_t t, int64_t h, std::vector<float>& s) {
  const int64_t D = a.D, kvh = h / (a.H / a.Hkv);
  const float* q = a.q + b * a.qs[0] + t * a.qs[1] + h * a.qs[2];
  const int64_t slot = a.rows[b];
  const float* kb = a.k + slot * a.ks[0] + kvh * a.ks[1];
  const float* vb = a.v + slot * a.ks[0] + kvh * a.ks[1];
  const int64_t L = a.pos[b * a.T + t] + 1;
  const int64_t first = a.window > 0 ? std::max<int64_t>(0, L - a.window) : 0;
  kb += first * a.ks[2];
  vb += first * a.ks[2];
  int64_t n = 0;
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < L - first; ++j) {
    const float* kj = kb + j * a.ks[2];
    __m256 acc = _mm256_setzero_ps();
    for (int64_t d = 0; d < D; d += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(kj + d), acc);
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
      const float* vj = vb + i * a.ks[2] + d0;
      for (int64_t c = 0; c < w; ++c) acc[c] = _mm256_fmadd_ps(p, _mm256_loadu_ps(vj + 8 * c), acc[c]);
    }
    const __m256 iv = _mm256_set1_ps(inv);
    for (int64_t c = 0; c < w; ++c) _mm256_storeu_ps(y + d0 + 8 * c, _mm256_mul_ps(acc[c], iv));
  }
}

at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& input_pos,
                     const at::Tensor& rows, int64_t window, double scale) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "attention: 4-d q, k, v");
  TORCH_CHECK(q.scalar_type() == at::kFloat && k.scalar_type() == at::kFloat && v.scalar_type() == at::kFloat,
              "attention: float32 q, k, v");
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), D = q.size(3);
  const int64_t Hkv = k.size(1), S = k.size(2);
  TORCH_CHECK(D % 8 == 0 && D <= 256 && H % Hkv == 0, "attention: head_dim a multiple of 8 up to 256");
  TORCH_CHECK(q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1 && k.strides() == v.strides(),
              "attention: head_dim must be contiguous, k and v alike");
  TORCH_CHECK(v.sizes() == k.sizes() && input_pos.dim() == 2 && input_pos.size(0) == B && input_pos.size(1) == T &&
              rows.dim() == 1 && rows.size(0) == B,
              "attention: shapes q [B, T, H, D], k/v [B_cache, Hkv, S, D], input_pos [B, T], rows [B]");
  const at::Tensor pos = input_pos.to(at::kLong).contiguous(), slots = rows.to(at::kLong).contiguous();
  const int64_t *pp = pos.data_ptr<int64_t>(), *rp = slots.data_ptr<int64_t>();
  int64_t L = 0;
  for (int64_t i = 0; i < B * T; ++i) {
    TORCH_CHECK(pp[i] >= 0 && pp[i] < S, "attention: position ", pp[i], " outside the cache [0, ", S, ")");
    L = std::max(L, pp[i] + 1);
  }
  for (int64_t i = 0; i < B; ++i)
    TORCH_CHECK(rp[i] >= 0 && rp[i] < k.size(0), "attention: slot ", rp[i], " outside the cache's ", k.size(0));
  TORCH_CHECK(window >= 0, "attention: window must be >= 0 (0: no window), got ", window);
  if (window > 0) L = std::min(L, window);  // scores per query row
  at::Tensor y = at::empty({B, T, H, D}, q.options());
  Args a{q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(), pp, rp, y.data_ptr<float>(),
         T, H, Hkv, D, window,
         {q.stride(0), q.stride(1), q.stride(2), 1}, {k.stride(0), k.stride(1), k.stride(2)},
         static_cast<float>(scale)};
  at::parallel_for(0, B * T * H, 1, [&](int64_t r0, int64_t r1) {
    std::vector<float> s(L + 8);
    for (int64_t r = r0; r < r1; ++r) row(a, r / (T * H), (r / H) % T, r % H, s);
  });
  return y;
}

}  // namespace

extern "C" AOTITorchError aoti_torch_cpu_attention(AtenTensorHandle q, AtenTensorHandle k, AtenTensorHandle v,
                                                   AtenTensorHandle pos, AtenTensorHandle rows, int64_t window,
                                                   double scale, AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({
    using torch::aot_inductor::tensor_handle_to_tensor_pointer;
    *ret0 = torch::aot_inductor::new_tensor_handle(
        attention(*tensor_handle_to_tensor_pointer(q), *tensor_handle_to_tensor_pointer(k),
                  *tensor_handle_to_tensor_pointer(v), *tensor_handle_to_tensor_pointer(pos),
                  *tensor_handle_to_tensor_pointer(rows), window, scale));
  });
}

TORCH_LIBRARY_FRAGMENT(fastdecode, m) {
  m.def("attention(Tensor q, Tensor k, Tensor v, Tensor input_pos, Tensor rows, int window, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(fastdecode, CPU, m) {
  m.impl("attention", &attention);
}
