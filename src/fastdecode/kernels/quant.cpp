// Matmuls on block-quantized weights, for every M (decode, batches, prefill).
//
// Layouts (see fastdecode/quant/formats.py), K a multiple of 32, per weight row n:
//   q4: qweight uint8 [N, K/2], 16 bytes of nibbles per block of 32 values;
//       scales, mins [N, K/32] fp16 or fp32; w = scale * q + min, q in 0..15
//   q8: qweight int8 [N, K]; scales [N, K/32] fp16 or fp32; w = scale * q
// Activations are quantized once per call to int8 blocks of 32 (one scale per
// block), as llama.cpp does, so the inner loop is an int8 dot product.
//
// Two instruction sets share one body (quant_kernel.h): AVX2 (maddubs, 256-bit
// tiles) and AVX-512 VNNI (dpbusd, 512-bit tiles holding two weight rows per
// register), with the same float operations in the same order. Chosen at run time from what the
// CPU reports; fastdecode_set_isa() forces one (tests run both).
#include <torch/library.h>
#include <torch/csrc/inductor/aoti_torch/utils.h>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <algorithm>
#include <atomic>
#include <cstdint>

namespace fd_avx2 {
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#define FD_VNNI 0
#include "quant_kernel.h"
#undef FD_VNNI
#pragma GCC pop_options
}  // namespace fd_avx2

namespace fd_vnni {
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")
#define FD_VNNI 1
#include "quant_kernel.h"
#undef FD_VNNI
#pragma GCC pop_options
}  // namespace fd_vnni

namespace {

enum Isa : int { kAvx2 = 1, kVnni = 2 };

int detect_isa() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512bw"))
    return kVnni;
  return kAvx2;
}

std::atomic<int> g_isa{0};

int active_isa() {
  int isa = g_isa.load(std::memory_order_relaxed);
  if (isa == 0) {
    isa = detect_isa();
    g_isa.store(isa, std::memory_order_relaxed);
  }
  return isa;
}

struct Act {
  at::Tensor q, d, s;  // int8 [M, K], float [M, K/32] scales, float [M, K/32] scale * sum(q)
};

Act quantize(const at::Tensor& x) {
  const int64_t M = x.size(0), K = x.size(1);
  Act a{at::empty({M, K}, x.options().dtype(at::kChar)), at::empty({M, K / 32}, x.options()),
        at::empty({M, K / 32}, x.options())};
  auto f = active_isa() == kVnni ? fd_vnni::quantize_rows : fd_avx2::quantize_rows;
  const float* xp = x.data_ptr<float>();
  int8_t* qp = a.q.data_ptr<int8_t>();
  float *dp = a.d.data_ptr<float>(), *sp = a.s.data_ptr<float>();
  at::parallel_for(0, M, 16, [&](int64_t m0, int64_t m1) {
    f(xp + m0 * K, m1 - m0, K, qp + m0 * K, dp + m0 * (K / 32), sp + m0 * (K / 32));
  });
  return a;
}

template <bool Q4, typename S>
void run(const Act& a, const at::Tensor& w, const at::Tensor& d, const at::Tensor* mn, at::Tensor& y) {
  const int64_t M = a.q.size(0), K = a.q.size(1), N = w.size(0), nb = K / 32;
  const uint8_t* wp = static_cast<const uint8_t*>(w.data_ptr());
  const S* dp = static_cast<const S*>(d.data_ptr());
  const S* mp = mn ? static_cast<const S*>(mn->data_ptr()) : nullptr;
  const int8_t* xq = a.q.data_ptr<int8_t>();
  const float *xd = a.d.data_ptr<float>(), *xs = a.s.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const int64_t ws = w.size(1);
  const bool vnni = active_isa() == kVnni;
  // Tiles of RT weight rows, in chunks of at least 64 rows: that splits even
  // the 192-row k/v projections across two cores. With two activation rows
  // (q4) the VNNI path takes 8 weight rows at a time, for more independent
  // accumulators (and activation loads shared by more rows).
  auto split = [&](int64_t rt, auto&& f) {
    at::parallel_for(0, (N + rt - 1) / rt, 64 / rt, [&](int64_t t0, int64_t t1) {
      f(t0 * rt, std::min(N, t1 * rt));
    });
  };
  // One activation row (batch-1 decode) streams the weights best on 256-bit
  // tiles; their float operations are the 512-bit tiles' (the same results).
  if (vnni && M == 1)
    split(4, [&](int64_t n0, int64_t n1) { fd_vnni::rows<Q4, S, 4, 1, false>(wp, ws, dp, mp, nb, n0, n1, xq, xd, xs, M, K, yp, N); });
  else if (vnni && Q4 && M <= 2)
    split(8, [&](int64_t n0, int64_t n1) { fd_vnni::rows<Q4, S, 8, 2>(wp, ws, dp, mp, nb, n0, n1, xq, xd, xs, M, K, yp, N); });
  else if (vnni)
    split(4, [&](int64_t n0, int64_t n1) { fd_vnni::rows<Q4, S, 4, 8>(wp, ws, dp, mp, nb, n0, n1, xq, xd, xs, M, K, yp, N); });
  else
    split(4, [&](int64_t n0, int64_t n1) { fd_avx2::rows<Q4, S, 4, 2>(wp, ws, dp, mp, nb, n0, n1, xq, xd, xs, M, K, yp, N); });
}

void check(const at::Tensor& x, const at::Tensor& w, const at::Tensor& d, const at::Tensor* mn, bool q4) {
  const char* op = q4 ? "q4_linear" : "q8_linear";
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.device().is_cpu(), op,
              ": x must be a float32 CPU matrix [M, K]");
  TORCH_CHECK(x.size(1) % 32 == 0, op, ": K=", x.size(1), " must be a multiple of 32");
  TORCH_CHECK(w.dim() == 2 && w.is_contiguous() && w.device().is_cpu(), op, ": qweight must be contiguous [N, *]");
  TORCH_CHECK(w.scalar_type() == (q4 ? at::kByte : at::kChar), op, ": qweight must be ", q4 ? "uint8" : "int8");
  TORCH_CHECK(w.size(1) == (q4 ? x.size(1) / 2 : x.size(1)), op, ": qweight has ", w.size(1),
              " columns for K=", x.size(1));
  const int64_t nb = x.size(1) / 32;
  for (const at::Tensor* t : {&d, mn}) {
    if (!t) continue;
    TORCH_CHECK(t->dim() == 2 && t->is_contiguous() && t->size(0) == w.size(0) && t->size(1) == nb, op,
                ": scales/mins must be contiguous [N, K/32]");
    TORCH_CHECK(t->scalar_type() == at::kHalf || t->scalar_type() == at::kFloat, op,
                ": scales/mins must be float16 or float32");
    TORCH_CHECK(t->scalar_type() == d.scalar_type(), op, ": scales and mins must share a dtype");
  }
}

at::Tensor qlinear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& d, const at::Tensor* mn, bool q4) {
  check(x, w, d, mn, q4);
  const Act a = quantize(x.contiguous());
  at::Tensor y = at::empty({x.size(0), w.size(0)}, x.options());
  const bool half = d.scalar_type() == at::kHalf;
  if (q4 && half) run<true, uint16_t>(a, w, d, mn, y);
  else if (q4) run<true, float>(a, w, d, mn, y);
  else if (half) run<false, uint16_t>(a, w, d, nullptr, y);
  else run<false, float>(a, w, d, nullptr, y);
  return y;
}

at::Tensor q4_linear(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scales,
                     const at::Tensor& mins) {
  return qlinear(x, qweight, scales, &mins, true);
}

at::Tensor q8_linear(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scales) {
  return qlinear(x, qweight, scales, nullptr, false);
}

}  // namespace

// Plain C entry points: the ISA switch for tests and benchmarks (0 = detect,
// 1 = AVX2, 2 = VNNI; returns the active one, or -1 if the CPU lacks it), and
// shims that AOTInductor packages call directly instead of through the boxed
// dispatcher (see fastdecode/aot.py).
extern "C" int fastdecode_set_isa(int isa) {
  if (isa == kVnni && detect_isa() != kVnni) return -1;
  g_isa.store(isa == 0 ? detect_isa() : isa);
  return g_isa.load();
}

extern "C" int fastdecode_get_isa() { return active_isa(); }

extern "C" AOTITorchError aoti_torch_cpu_q4_linear(AtenTensorHandle x, AtenTensorHandle w, AtenTensorHandle s,
                                                   AtenTensorHandle m, AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({
    using torch::aot_inductor::tensor_handle_to_tensor_pointer;
    *ret0 = torch::aot_inductor::new_tensor_handle(
        q4_linear(*tensor_handle_to_tensor_pointer(x), *tensor_handle_to_tensor_pointer(w),
                  *tensor_handle_to_tensor_pointer(s), *tensor_handle_to_tensor_pointer(m)));
  });
}

extern "C" AOTITorchError aoti_torch_cpu_q8_linear(AtenTensorHandle x, AtenTensorHandle w, AtenTensorHandle s,
                                                   AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({
    using torch::aot_inductor::tensor_handle_to_tensor_pointer;
    *ret0 = torch::aot_inductor::new_tensor_handle(q8_linear(
        *tensor_handle_to_tensor_pointer(x), *tensor_handle_to_tensor_pointer(w), *tensor_handle_to_tensor_pointer(s)));
  });
}

TORCH_LIBRARY_FRAGMENT(fastdecode, m) {
  m.def("q4_linear(Tensor x, Tensor qweight, Tensor scales, Tensor mins) -> Tensor");
  m.def("q8_linear(Tensor x, Tensor qweight, Tensor scales) -> Tensor");
}

TORCH_LIBRARY_IMPL(fastdecode, CPU, m) {
  m.impl("q4_linear", &q4_linear);
  m.impl("q8_linear", &q8_linear);
}
