// fp32 matrix-vector product for decode: y[m, n] = sum_k x[m, k] * w[n, k].
//
// At batch 1 stock F.linear runs a single-threaded GEMV that reaches about half
// of the memory bandwidth. This kernel splits the output rows across threads
// and streams four weight rows at a time with FMA accumulators; for the few
// activation rows of a decode batch the four weight rows stay in L1.
#include <torch/library.h>
#include <torch/csrc/inductor/aoti_torch/utils.h>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include "simd.h"

namespace {

constexpr int64_t kMaxRows = 8;

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

at::Tensor gemv(const at::Tensor& x, const at::Tensor& w) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "gemv: x [M, K] and w [N, K] expected");
  TORCH_CHECK(x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat, "gemv: float32 only");
  TORCH_CHECK(x.device().is_cpu() && w.device().is_cpu(), "gemv: CPU tensors only");
  // Past a few rows (prefill) the product is a real GEMM: leave it to BLAS.
  if (x.size(0) > kMaxRows) return at::linear(x, w);
  at::Tensor xc = x.contiguous(), wc = w.contiguous();
  const int64_t M = xc.size(0), K = xc.size(1), N = wc.size(0);
  at::Tensor y = at::empty({M, N}, xc.options());
  const float* xp = xc.data_ptr<float>();
  const float* wp = wc.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  // Grain of 64 rows: large enough to amortize scheduling, small enough to split
  // the 576-row projections across cores.
  at::parallel_for(0, N, 64, [&](int64_t begin, int64_t end) {
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
  });
  return y;
}

}  // namespace

// C entry point for AOTInductor packages (see fastdecode/aot.py): the exported
// graph calls it directly; through the boxed proxy executor each of the ~120
// calls per decode step would cost tens of microseconds.
extern "C" AOTITorchError aoti_torch_cpu_gemv(AtenTensorHandle x, AtenTensorHandle w, AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({
    at::Tensor* xt = torch::aot_inductor::tensor_handle_to_tensor_pointer(x);
    at::Tensor* wt = torch::aot_inductor::tensor_handle_to_tensor_pointer(w);
    *ret0 = torch::aot_inductor::new_tensor_handle(gemv(*xt, *wt));
  });
}

TORCH_LIBRARY_FRAGMENT(fastdecode, m) {
  m.def("gemv(Tensor x, Tensor w) -> Tensor");
}

TORCH_LIBRARY_IMPL(fastdecode, CPU, m) {
  m.impl("gemv", &gemv);
}
