// The PyTorch side of the kernels: argument checks, allocation, threads
// (at::parallel_for over the row functions of kernels.h), the
// `torch.ops.fastdecode` registrations and the C entry points that AOTInductor
// packages call directly (see fastdecode/aot.py): through the boxed proxy
// executor each of the ~120 calls per decode step would cost tens of
// microseconds. The only translation unit with torch headers, which take most
// of its compile time; the math is in math.cpp and quant_*.cpp.
#include <torch/library.h>
#include <torch/csrc/inductor/aoti_torch/utils.h>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <memory>
#include <tuple>
#include <vector>

#include "kernels.h"

namespace {

// ---------------------------------------------------------------------------
// gemv (math.cpp): y[m, n] = sum_k x[m, k] * w[n, k] for the few rows of a decode batch.

constexpr int64_t kMaxRows = 8;

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
  at::parallel_for(0, N, 64, [&](int64_t begin, int64_t end) { fd::gemv_rows(xp, wp, yp, M, K, N, begin, end); });
  return y;
}

// ---------------------------------------------------------------------------
// rms_norm (math.cpp): y = x / sqrt(mean(x^2) + eps) * w.

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat && x.device().is_cpu(),
              "rms_norm: float32 CPU tensors only");
  TORCH_CHECK(w.dim() == 1 && x.size(-1) == w.size(0), "rms_norm: weight must be [K] for x [..., K]");
  const at::Tensor xc = x.contiguous(), wc = w.contiguous();
  at::Tensor y = at::empty_like(xc);
  const int64_t K = w.size(0), M = xc.numel() / K;
  const float *xp = xc.data_ptr<float>(), *wp = wc.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, M, 64, [&](int64_t m0, int64_t m1) {
    fd::rms_norm_rows(xp, wp, yp, K, static_cast<float>(eps), m0, m1);
  });
  return y;
}

// rope (math.cpp): cos and sin [*pos.shape, H] of positions pos (int64) x inv_freq [H], once a step
// for every layer: as elementwise code inside each layer's rotation, Inductor recomputed them (in
// float64) per head and layer.

std::tuple<at::Tensor, at::Tensor> rope(const at::Tensor& pos, const at::Tensor& inv_freq) {
  TORCH_CHECK(pos.scalar_type() == at::kLong && inv_freq.scalar_type() == at::kFloat && inv_freq.dim() == 1 &&
                  pos.device().is_cpu() && inv_freq.device().is_cpu(),
              "rope: int64 positions and float32 inverse frequencies [H], CPU tensors");
  const at::Tensor pc = pos.contiguous(), fc = inv_freq.contiguous();
  const int64_t M = pc.numel(), H = fc.numel();
  std::vector<int64_t> shape(pc.sizes().begin(), pc.sizes().end());
  shape.push_back(H);
  at::Tensor cos = at::empty(shape, fc.options()), sin = at::empty(shape, fc.options());
  const int64_t* pp = pc.data_ptr<int64_t>();
  const float* fp = fc.data_ptr<float>();
  float *cp = cos.data_ptr<float>(), *sp = sin.data_ptr<float>();
  at::parallel_for(0, M, 64, [&](int64_t m0, int64_t m1) { fd::rope_rows(pp, fp, cp, sp, H, m0, m1); });
  return {cos, sin};
}

// silu_mul, gelu_tanh_mul (math.cpp): SwiGLU's silu(g) * u and GeGLU's gelu_tanh(g) * u [..., F] of
// h [..., 2F] = [g | u], one parallel loop of ours (as elementwise code it is a loop of the exported
// step's, which runs those on one thread).

template <void (*Rows)(const float*, float*, int64_t, int64_t, int64_t)>
at::Tensor glu(const at::Tensor& h) {
  TORCH_CHECK(h.scalar_type() == at::kFloat && h.device().is_cpu() && h.dim() >= 1 && h.size(-1) % 2 == 0,
              "glu: a float32 CPU tensor [..., 2F]");
  const at::Tensor hc = h.contiguous();
  const int64_t F = hc.size(-1) / 2, M = F ? hc.numel() / (2 * F) : 0;
  std::vector<int64_t> shape(hc.sizes().begin(), hc.sizes().end());
  shape.back() = F;
  at::Tensor y = at::empty(shape, hc.options());
  const float* hp = hc.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, M, std::max<int64_t>(1, 16384 / std::max<int64_t>(F, 1)),
                   [&](int64_t m0, int64_t m1) { Rows(hp, yp, F, m0, m1); });
  return y;
}

at::Tensor silu_mul(const at::Tensor& h) { return glu<fd::silu_mul_rows>(h); }
at::Tensor gelu_tanh_mul(const at::Tensor& h) { return glu<fd::gelu_tanh_mul_rows>(h); }

// first_max (math.cpp): [M, V] float32 -> [M] int64, each row's argmax.

at::Tensor first_max(const at::Tensor& x) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.device().is_cpu() && x.dim() == 2 && x.size(1) > 0,
              "first_max: a float32 CPU tensor [M, V], V > 0");
  const at::Tensor xc = x.contiguous();
  const int64_t M = xc.size(0), V = xc.size(1);
  at::Tensor idx = at::empty({M}, xc.options().dtype(at::kLong));
  const float* xp = xc.data_ptr<float>();
  int64_t* ip = idx.data_ptr<int64_t>();
  at::parallel_for(0, M, 1, [&](int64_t m0, int64_t m1) { fd::first_max_rows(xp, ip, V, m0, m1); });
  return idx;
}

// The instruction set of the quantized matmuls and of the attention's wide path: what the
// CPU reports, or what fastdecode_set_isa() forces (tests run both).
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

// The wide paths, each the same bits as the 256-bit code it replaces: the attention's
// (attention.cpp) and the quantized matmuls' two groups a register (quant_kernel.h's
// two_groups). On where the AVX-512 set is in use and the CPU runs 512-bit operations at
// full width, AMD Zen 5 and later (attention 1.2-1.5x, benchmarks/prefix_cache.md 1h; matmuls
// benchmarks/wide_tiles.md). Zen 4 splits them in two, and on a Xeon an attention of the same
// design measured 0.92-1.07x (1f), so those keep the 256-bit paths unless fastdecode_set_wide(1)
// forces them (tests). 0: automatic, 1: on, -1: off.
std::atomic<int> g_wide{0};

// CPUID's vendor string ("AuthenticAMD", "GenuineIntel") is `id`.
bool vendor_is(const char (&id)[13]) {
  unsigned a, b, c, d;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return false;
  const unsigned words[3] = {b, d, c};  // the string's order
  return std::memcmp(words, id, 12) == 0;
}

bool full_width_zmm() {
  if (!vendor_is("AuthenticAMD")) return false;
  unsigned a, b, c, d;
  __get_cpuid(1, &a, &b, &c, &d);  // family = base + extended
  const unsigned base = (a >> 8) & 0xF, family = base + (base == 0xF ? (a >> 20) & 0xFF : 0);
  return family >= 0x1A;
}

// Intel's cores: every panel layout prefetches its values a second time, 4x as far (QuantArgs::far;
// on a Xeon 1.1-1.35x at M = 1 and 8, where on Zen 4 q6k and q4 lost 3-11% by it).
bool far_prefetch() { return vendor_is("GenuineIntel"); }

bool wide() {
  static const bool full = full_width_zmm();
  const int mode = g_wide.load(std::memory_order_relaxed);
  return active_isa() == kVnni && (mode > 0 || (mode == 0 && full));
}

// ---------------------------------------------------------------------------
// attention (attention.cpp) over a KV cache, in tiles of query rows that share K/V rows.

// K/V storage: float32, float16 or bfloat16 [B_cache, Hkv, S, D], or q8_0 as int8
// [B_cache, Hkv, S, D / 32 * 34] (kernels.h): each is read as float32 in the kernel.
fd::KvFormat kv_format(const at::Tensor& k, int64_t D) {
  switch (k.scalar_type()) {
    case at::kFloat: return fd::kKvF32;
    case at::kHalf: return fd::kKvF16;
    case at::kBFloat16: return fd::kKvBF16;
    case at::kChar:
      TORCH_CHECK(D % 32 == 0 && k.size(3) == D / 32 * fd::kQ8Block, "attention: q8_0 k/v need head_dim ", D,
                  " a multiple of 32 and ", D / 32 * fd::kQ8Block, " bytes per row, got ", k.size(3));
      return fd::kKvQ8_0;
    default:
      TORCH_CHECK(false, "attention: k/v must be float32, float16, bfloat16 or q8_0 (int8), got ",
                  k.scalar_type());
  }
}

// One attention call's work on the threads: split in phases (attention_split) or in tiles.
void run_attention(const fd::AttentionArgs& a) {
  const int threads = at::get_num_threads();
  thread_local fd::AttentionSplit kept;  // its buffers kept between calls
  fd::AttentionSplit& split = kept;  // the caller's, not each worker's own thread_local
  if (fd::attention_split(a, threads, split)) {
    for (int phase = 0; phase < fd::kAttentionPhases; ++phase) {
      std::atomic<int64_t> next{0};
      at::parallel_for(0, std::min<int64_t>(threads, split.parts(phase)), 1,
                       [&](int64_t, int64_t) { fd::attention_split_run(a, split, phase, next); });
    }
    return;
  }
  const fd::AttentionTiles tiles = fd::attention_tiles(a, threads);
  // One task per thread, each taking tiles from a shared counter until none are left.
  std::atomic<int64_t> next{0};
  at::parallel_for(0, std::min<int64_t>(threads, tiles.count), 1,
                   [&](int64_t, int64_t) { fd::attention_run(a, tiles, next); });
}

// Rows b, b + 1 of one token each that continue one sequence (same slot, next position).
inline bool continues(const fd::AttentionArgs& a, int64_t b) {
  return a.rows[b + 1] == a.rows[b] && a.pos[b + 1] == a.pos[b] + 1;
}

// A step of rows of one token each ([B, 1]) may carry a prompt chunk as consecutive rows of its
// slot, beside other sequences' decode rows (the engine's mixed steps). Each such run is
// computed as the one row of T tokens it is, [1, T]: its tokens share tiles and so each K/V
// block read (at 3,000 positions, rows of one apart took 1.4x as long). A row's result is
// the same either way: only which rows share a tile changes.
void run_in_runs(const fd::AttentionArgs& a) {
  const int64_t row = a.H * a.D;  // y's elements per row
  for (int64_t b0 = 0, b1; b0 < a.B; b0 = b1) {
    const bool run = b0 + 1 < a.B && continues(a, b0);
    b1 = b0 + 1;
    if (run) {
      while (b1 < a.B && continues(a, b1 - 1)) ++b1;
    } else {  // rows of their own, up to the next run's first
      while (b1 < a.B && !(b1 + 1 < a.B && continues(a, b1))) ++b1;
    }
    if (b0 == 0 && b1 == a.B && !run) return run_attention(a);
    fd::AttentionArgs s = a;
    s.q = a.q + b0 * a.qs[0];
    s.pos = a.pos + b0;
    s.rows = a.rows + b0;
    s.y = a.y + b0 * row;
    if (run) {
      s.B = 1, s.T = b1 - b0;
      s.qs[0] = s.T * a.qs[0], s.qs[1] = a.qs[0];
    } else {
      s.B = b1 - b0;
    }
    s.L = 0;
    for (int64_t b = b0; b < b1; ++b) s.L = std::max(s.L, a.pos[b] + 1);
    if (a.window > 0) s.L = std::min(s.L, a.window);
    run_attention(s);
  }
}

// sinks: [H] float32, each head's sink logit (attention_sinks), or undefined for none.
at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& input_pos,
                  const at::Tensor& rows, int64_t window, double scale, double softcap, const at::Tensor& sinks) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "attention: 4-d q, k, v");
  TORCH_CHECK(q.scalar_type() == at::kFloat && k.scalar_type() == v.scalar_type(),
              "attention: float32 q, and k, v of one dtype");
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), D = q.size(3);
  const int64_t Hkv = k.size(1), S = k.size(2);
  TORCH_CHECK(D % 8 == 0 && D <= 256 && H % Hkv == 0, "attention: head_dim a multiple of 8 up to 256");
  const fd::KvFormat kv = kv_format(k, D);
  TORCH_CHECK(kv == fd::kKvQ8_0 || k.size(3) == D, "attention: k/v head_dim ", k.size(3), " for q's ", D);
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
  TORCH_CHECK(softcap >= 0 && std::isfinite(softcap), "attention: softcap must be >= 0 (0: none), got ", softcap);
  if (window > 0) L = std::min(L, window);  // scores per query row
  at::Tensor sink;
  if (sinks.defined()) {
    TORCH_CHECK(sinks.dim() == 1 && sinks.size(0) == H, "attention: sinks must be [", H, "] (one per head)");
    sink = sinks.to(at::kFloat).contiguous();
  }
  at::Tensor y = at::empty({B, T, H, D}, q.options());
  const fd::AttentionArgs a{q.data_ptr<float>(), k.data_ptr(), v.data_ptr(), pp, rp, y.data_ptr<float>(),
                            B, T, H, Hkv, D, window,
                            {q.stride(0), q.stride(1), q.stride(2), 1}, {k.stride(0), k.stride(1), k.stride(2)},
                            static_cast<float>(scale), static_cast<float>(softcap), kv, L, wide(),
                            sink.defined() ? sink.data_ptr<float>() : nullptr};
  if (T == 1 && B > 1) {
    run_in_runs(a);
  } else {
    run_attention(a);
  }
  return y;
}

at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& input_pos,
                     const at::Tensor& rows, int64_t window, double scale, double softcap) {
  return attend(q, k, v, input_pos, rows, window, scale, softcap, at::Tensor());
}

// A separate op, not an argument of attention's: attention's C entry point (the AOTInductor shim
// below) stays as exported packages call it; the models with sinks (gpt-oss) run eagerly.
at::Tensor attention_sinks(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& input_pos,
                           const at::Tensor& rows, int64_t window, double scale, double softcap,
                           const at::Tensor& sinks) {
  return attend(q, k, v, input_pos, rows, window, scale, softcap, sinks);
}

// ---------------------------------------------------------------------------
// Matmuls on block-quantized weights, for every M (decode, batches, prefill).
//
// Layouts: fastdecode/quant/formats.py (q4, q8, q4k, q5k, q6k, q5, q5s, q4s, q4nl, q4xs, q4mx), K a
// multiple of 32; q4's, q8's, q4s', q4k's, q5k's and q6k's rows in panels of 16, the others' blocks in
// groups of 8 lanes. Activations are quantized once per call to int8 blocks of 32, as llama.cpp does,
// so the inner loop is an int8 dot product: one scale per block, or per 256 values for the K-quants,
// whose integer sums then take their weights' 6- and 8-bit block scales before any float operation.
//
// Two instruction sets share one body (quant_kernel.h, compiled by quant_avx2.cpp and
// quant_vnni.cpp): AVX2 (maddubs) and AVX-512 VNNI (vpdpbusd), with exact integer sums
// and the same float operations in the same order. Chosen at run time from what the
// CPU reports; fastdecode_set_isa() forces one (tests run both).

// A buffer that only grows, 64-byte aligned as at::empty's: a thread's quantized activations,
// kept from one matmul call to the next.
class Scratch {
 public:
  template <class T>
  T* get(int64_t n) {
    const size_t bytes = (static_cast<size_t>(n) * sizeof(T) + 63) / 64 * 64;
    if (bytes > size_) {
      buf_.reset(static_cast<uint8_t*>(std::aligned_alloc(64, bytes)));
      TORCH_CHECK(buf_, "out of memory for ", bytes, " bytes of quantized activations");
      size_ = bytes;
    }
    return reinterpret_cast<T*>(buf_.get());
  }

 private:
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  std::unique_ptr<uint8_t, Free> buf_;
  size_t size_ = 0;
};

// Sets a's activation fields (xq, xd, xs, xsums: quantize_rows' outputs, kernels.h, rows padded to
// whole groups of 8 blocks; by_rows: xa and xt) to x quantized into the calling thread's scratch
// slot `slot`, valid until that slot is quantized into again. A matmul call's activations live
// only for the call, so a thread reuses them: as tensors they were 4 of each matmul's 5 tensors
// (y the fifth), ~120 matmuls a decode step (benchmarks/step_overhead.md: batch 1 1.05-1.13x).
// by_rows (panels only): also q row by row (QuantArgs::xa) and, but for the K-quants (per256, whose
// AMX steps read d once a group), d and s by tiles of 16 rows (QuantArgs::xt); each chunk of rows
// is copied right after it is quantized. The panel layout [G, M, 256] interleaves a group's blocks
// (block 8 g + j's values 4 w..4 w + 3 at byte 4 j + 32 w of a row's group). grouped_linear holds
// one slot per matmul of its region.
void quantize(fd::QuantArgs& a, const at::Tensor& x, bool by_rows, size_t slot) {
  const bool per256 = fd::in_super(a.layout), panels = fd::in_panels(a.layout);
  const int64_t M = x.size(0), K = x.size(1), G = (K / 32 + 7) / 8;
  const int64_t qrow = panels ? 256 : G * 256, qgroup = panels ? M * 256 : 256;
  thread_local std::vector<std::array<Scratch, 6>> scratch;
  if (scratch.size() <= slot) scratch.resize(slot + 1);
  auto& buf = scratch[slot];
  auto f = active_isa() == kVnni ? fd::vnni::quantize_rows : fd::avx2::quantize_rows;
  const float* xp = x.data_ptr<float>();
  int8_t* qp = buf[0].get<int8_t>(M * G * 256);
  float *dp = buf[1].get<float>(M * G * 8), *sp = buf[2].get<float>(M * G * 8);
  int32_t* up = buf[3].get<int32_t>(M * G * 16);
  const int64_t nb = K / 32;
  const int64_t T = fd::kAmxTileRows, M16 = M / T * T;
  int8_t* rp = by_rows ? buf[4].get<int8_t>(M * K) : nullptr;
  float* tp = by_rows && !per256 ? buf[5].get<float>(2 * M16 * nb) : nullptr;
  at::parallel_for(0, M, 16, [&](int64_t m0, int64_t m1) {
    f(xp + m0 * K, m1 - m0, K, per256, qp + m0 * qrow, qrow, qgroup, dp + m0 * G * 8, sp + m0 * G * 8, up + m0 * G * 16);
    for (int64_t m = m0; rp && m < m1; ++m)
      for (int64_t b = 0; b < nb; ++b) {
        const int8_t* from = qp + ((b / 8) * M + m) * 256 + 4 * (b % 8);
        for (int w = 0; w < 8; ++w) std::memcpy(rp + m * K + 32 * b + 4 * w, from + 32 * w, 4);
        if (!tp || m >= M16) continue;
        const int64_t at = ((m / T) * nb + b) * T + m % T;
        tp[at] = dp[m * G * 8 + b];
        tp[M16 * nb + at] = sp[m * G * 8 + b];
      }
  });
  a.xq = qp;
  a.xd = dp;
  a.xs = sp;
  a.xsums = up;
  a.xa = rp;
  a.xt = tp;
}

// y = x w^T for a packed weight described by `a` (its weight fields set): quantizes x,
// then one task per thread takes chunks of whole tiles from a shared counter: about
// kChunksPerThread chunks a thread, at least 64 rows each (that splits even a 256-row
// projection across two cores). A static half each left the faster core waiting at the
// join on these shared VMs (libgomp 14% of both threads' samples in 1B decode); taking
// chunks measured 3-5% more tokens/s at B = 1 and 8 (benchmarks/real_sizes.md). Each row's
// arithmetic does not depend on the thread that runs it.
constexpr int64_t kChunksPerThread = 4;

// AMX: the CPU has tile int8 products and Linux lets this process keep tile state (arch_prctl
// ARCH_REQ_XCOMP_PERM for XTILEDATA, 18); FASTDECODE_NO_AMX=1 keeps the VNNI tiles. On the VNNI
// path the on_amx layouts' matmuls of kAmxMinRows rows or more take AMX tiles (quant_panel.h's
// amx_rows; the same bits). Against the VNNI tiles on an Intel Xeon (benchmarks/serve/README.md,
// 2026-12-05 (evening)): prefill of 1B Q4_0 1.56-1.65x, of 1B Q4_K_M 1.18-1.23x, of 1B Q5_K_M
// 1.23-1.26x, of the default model 1.10-1.11x. At 16 rows the VNNI tiles stay ahead (AMX's
// matmuls 0.83x: each panel's B tiles are unpacked for too few rows); at 32 to 48 rows the two are
// level. q8's B tiles are its panels as stored, so q8 takes AMX from 16 rows (the default model's
// Q8_0 head at 16 rows: 1.30-1.38x).
constexpr int64_t kAmxMinRows = 32, kAmxMinRowsQ8 = fd::kAmxTileRows;
bool amx() {
  static const bool ok = [] {
    const char* off = std::getenv("FASTDECODE_NO_AMX");
    if (off && *off && std::strcmp(off, "0") != 0) return false;
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("amx-tile") || !__builtin_cpu_supports("amx-int8")) return false;
    return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
  }();
  return ok;
}

// Sets a's activation and output fields for x (its quantized rows in scratch slot `slot`, which
// must not be quantized into again while a is in use) and allocates y [M, N].
void prepare(fd::QuantArgs& a, const at::Tensor& x, int64_t N, at::Tensor& y, size_t slot = 0) {
  const bool vnni = active_isa() == kVnni;
  const bool by_rows = vnni && x.size(0) >= (a.layout == fd::kQ8 ? kAmxMinRowsQ8 : kAmxMinRows) &&
                       fd::on_amx(a.layout) && amx();
  quantize(a, x.contiguous(), by_rows, slot);
  y = at::empty({x.size(0), N}, x.options());
  a.M = x.size(0);
  a.y = y.data_ptr<float>();
  a.N = N;
  a.wide = wide();
  static const bool far = far_prefetch();
  a.far = far;
}

// Runs the prepared matmuls `as` in one parallel region: each one's tiles in chunks, the threads
// taking chunks of any of them from one shared counter (several small matmuls, an MoE layer's
// experts, then stream their weights as one large one would instead of each its own fork, join
// and prefetch ramp).
void run(const fd::QuantArgs* as, int64_t count) {
  const bool vnni = active_isa() == kVnni;
  const int64_t threads = at::get_num_threads();
  struct Task {
    int64_t i, n0, n1;
  };
  thread_local std::vector<Task> tasks;  // the caller's, kept: no allocation per call
  tasks.clear();
  for (int64_t i = 0; i < count; ++i) {
    const fd::QuantArgs& a = as[i];
    const int64_t rt = fd::in_panels(a.layout) ? fd::kPanelRows : fd::kTileRows;
    const int64_t tiles = (a.N + rt - 1) / rt;
    const int64_t chunk = std::max<int64_t>(64 / rt, tiles / (threads * kChunksPerThread));
    for (int64_t t0 = 0; t0 < tiles; t0 += chunk) tasks.push_back({i, t0 * rt, std::min(a.N, (t0 + chunk) * rt)});
  }
  const int64_t n = static_cast<int64_t>(tasks.size());
  std::atomic<int64_t> next{0};
  const Task* all = tasks.data();  // not `tasks` in the workers: their own thread_local is another
  at::parallel_for(0, std::min(threads, n), 1, [&](int64_t, int64_t) {
    for (int64_t t; (t = next.fetch_add(1, std::memory_order_relaxed)) < n;) {
      const Task& k = all[t];
      if (vnni) fd::vnni::rows(as[k.i], k.n0, k.n1);
      else fd::avx2::rows(as[k.i], k.n0, k.n1);
    }
  });
}

at::Tensor launch(fd::QuantArgs a, const at::Tensor& x, int64_t N) {
  at::Tensor y;
  prepare(a, x, N, y);
  run(&a, 1);
  return y;
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
    TORCH_CHECK(t->scalar_type() == at::kHalf, op, ": scales/mins must be float16");
  }
}

fd::QuantArgs qlinear_args(const at::Tensor& x, const at::Tensor& w, const at::Tensor& d, const at::Tensor* mn,
                           bool q4) {
  check(x, w, d, mn, q4);
  fd::QuantArgs a{};
  a.layout = q4 ? fd::kQ4 : fd::kQ8;
  a.q = static_cast<const uint8_t*>(w.data_ptr());
  a.qs = w.size(1);
  a.sc = static_cast<const uint8_t*>(d.data_ptr());
  a.mn = mn ? static_cast<const uint8_t*>(mn->data_ptr()) : nullptr;
  a.scs = d.size(1);
  a.nb = x.size(1) / 32;
  return a;
}

at::Tensor qlinear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& d, const at::Tensor* mn, bool q4) {
  return launch(qlinear_args(x, w, d, mn, q4), x, w.size(0));
}

at::Tensor q4_linear(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scales,
                     const at::Tensor& mins) {
  return qlinear(x, qweight, scales, &mins, true);
}

at::Tensor q8_linear(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scales) {
  return qlinear(x, qweight, scales, nullptr, false);
}

// The layouts beyond q4/q8 (quant/formats.py): q4k and q5k (qweight, sc, mn, d, dmin; q5k's qweight
// holds the fifth bits too, 5 units a block),
// q6k (qweight, qhigh, sc, d), q4xs (qweight, sc, d), K a multiple of 256; q5 (qweight, qhigh, scales, mins), q5s
// (qweight, qhigh, scales), q4s (qweight, scales), q4nl (qweight, d) and q4mx (qweight, e), K a multiple of 32.
fd::QuantArgs klinear_args(fd::Layout layout, const at::Tensor& x, const at::Tensor& q, const at::Tensor* qh,
                           const at::Tensor& sc, const at::Tensor* mn, const at::Tensor& d, const at::Tensor* dmin) {
  const char* op = layout == fd::kQ4K   ? "q4k_linear"
                   : layout == fd::kQ5K ? "q5k_linear"
                   : layout == fd::kQ6K ? "q6k_linear"
                   : layout == fd::kQ5  ? "q5_linear"
                   : layout == fd::kQ5S ? "q5s_linear"
                   : layout == fd::kQ4S ? "q4s_linear"
                   : layout == fd::kQ4NL ? "q4nl_linear"
                   : layout == fd::kQ4XS ? "q4xs_linear"
                                         : "q4mx_linear";
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.device().is_cpu(), op,
              ": x must be a float32 CPU matrix [M, K]");
  const int64_t K = x.size(1), N = q.size(0), nb = K / 32;
  const bool q5 = layout == fd::kQ5 || layout == fd::kQ5S || layout == fd::kQ4S || layout == fd::kQ4NL;  // float16 per block
  const bool mx = layout == fd::kQ4MX;  // an E8M0 byte per block
  const int64_t mult = q5 || mx ? 32 : 256;
  TORCH_CHECK(K % mult == 0, op, ": K=", K, " must be a multiple of ", mult);
  auto expect = [&](const at::Tensor* t, const char* name, at::ScalarType dtype, int64_t cols) {
    TORCH_CHECK(t->dim() == 2 && t->is_contiguous() && t->device().is_cpu() && t->size(0) == N && t->size(1) == cols &&
                    t->scalar_type() == dtype,
                op, ": ", name, " must be a contiguous ", c10::toString(dtype), " CPU tensor [", N, ", ", cols,
                "], got ", t->sizes(), " ", c10::toString(t->scalar_type()));
  };
  expect(&q, "qweight", at::kByte, layout == fd::kQ5K ? 5 * K / 8 : K / 2);
  const bool q6 = layout == fd::kQ6K, signed_sc = q6 || layout == fd::kQ4XS;
  if (qh) expect(qh, "qhigh", at::kByte, q6 ? K / 4 : K / 8);
  if (q5) {
    expect(&sc, layout == fd::kQ4NL ? "d" : "scales", at::kHalf, nb);
    if (mn) expect(mn, "mins", at::kHalf, nb);
  } else if (mx) {
    expect(&sc, "e", at::kByte, nb);
  } else {
    expect(&sc, "sc", signed_sc ? at::kChar : at::kByte, q6 ? K / 16 : nb);
    if (mn) expect(mn, "mn", at::kByte, nb);
    expect(&d, "d", at::kHalf, K / 256);
    if (dmin) expect(dmin, "dmin", at::kHalf, K / 256);
  }
  fd::QuantArgs a{};
  a.layout = layout;
  a.q = q.data_ptr<uint8_t>();
  a.qs = q.size(1);
  a.qh = qh ? qh->data_ptr<uint8_t>() : nullptr;
  a.qhs = qh ? qh->size(1) : 0;
  a.sc = static_cast<const uint8_t*>(sc.data_ptr());
  a.mn = mn ? static_cast<const uint8_t*>(mn->data_ptr()) : nullptr;
  a.scs = sc.size(1);
  a.d = q5 || mx ? nullptr : static_cast<const uint16_t*>(d.data_ptr());
  a.dmin = dmin ? static_cast<const uint16_t*>(dmin->data_ptr()) : nullptr;
  a.nb = nb;
  return a;
}

at::Tensor klinear(fd::Layout layout, const at::Tensor& x, const at::Tensor& q, const at::Tensor* qh,
                   const at::Tensor& sc, const at::Tensor* mn, const at::Tensor& d, const at::Tensor* dmin) {
  return launch(klinear_args(layout, x, q, qh, sc, mn, d, dmin), x, q.size(0));
}

at::Tensor q4k_linear(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& sc, const at::Tensor& mn,
                      const at::Tensor& d, const at::Tensor& dmin) {
  return klinear(fd::kQ4K, x, qweight, nullptr, sc, &mn, d, &dmin);
}

at::Tensor q5k_linear(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& sc, const at::Tensor& mn,
                      const at::Tensor& d, const at::Tensor& dmin) {
  return klinear(fd::kQ5K, x, qweight, nullptr, sc, &mn, d, &dmin);
}

at::Tensor q6k_linear(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& qhigh, const at::Tensor& sc,
                      const at::Tensor& d) {
  return klinear(fd::kQ6K, x, qweight, &qhigh, sc, nullptr, d, nullptr);
}

at::Tensor q5_linear(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& qhigh, const at::Tensor& scales,
                     const at::Tensor& mins) {
  return klinear(fd::kQ5, x, qweight, &qhigh, scales, &mins, scales, nullptr);
}

at::Tensor q5s_linear(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& qhigh,
                      const at::Tensor& scales) {
  return klinear(fd::kQ5S, x, qweight, &qhigh, scales, nullptr, scales, nullptr);
}

at::Tensor q4s_linear(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scales) {
  return klinear(fd::kQ4S, x, qweight, nullptr, scales, nullptr, scales, nullptr);
}

at::Tensor q4nl_linear(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& d) {
  return klinear(fd::kQ4NL, x, qweight, nullptr, d, nullptr, d, nullptr);
}

at::Tensor q4xs_linear(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& sc, const at::Tensor& d) {
  return klinear(fd::kQ4XS, x, qweight, nullptr, sc, nullptr, d, nullptr);
}

at::Tensor q4mx_linear(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& e) {
  return klinear(fd::kQ4MX, x, qweight, nullptr, e, nullptr, e, nullptr);
}

// y_i = x_i w_i^T for G matmuls of one layout in one parallel region (run): w holds each one's
// packed tensors in turn, in the order of its layout's op above (quant/formats.py LAYOUT_TENSORS).
// Each row's arithmetic is that of the single op's.
std::vector<at::Tensor> grouped_linear(c10::string_view layout, at::TensorList xs, at::TensorList w) {
  static const char* names[] = {"q4", "q8", "q4k", "q5k", "q6k", "q5", "q5s", "q4s", "q4nl", "q4xs", "q4mx"};
  static const int counts[] = {3, 2, 5, 5, 4, 4, 3, 2, 2, 3, 2};
  static_assert(std::size(names) == std::size(counts) && std::size(names) == fd::kQ4MX + 1, "one entry per Layout");
  int L = -1;
  for (int i = 0; i < static_cast<int>(std::size(names)); ++i)
    if (layout == names[i]) L = i;
  TORCH_CHECK(L >= 0, "grouped_linear: unknown layout ", layout);
  const int64_t n = counts[L], G = static_cast<int64_t>(xs.size());
  TORCH_CHECK(static_cast<int64_t>(w.size()) == G * n, "grouped_linear: ", G, " inputs need ", G * n,
              " packed tensors for ", layout, ", got ", w.size());
  std::vector<fd::QuantArgs> as(G);
  std::vector<at::Tensor> ys(G);
  for (int64_t i = 0; i < G; ++i) {
    const at::Tensor& x = xs[i];
    const at::Tensor* t = &w[i * n];
    switch (static_cast<fd::Layout>(L)) {
      case fd::kQ4: as[i] = qlinear_args(x, t[0], t[1], &t[2], true); break;
      case fd::kQ8: as[i] = qlinear_args(x, t[0], t[1], nullptr, false); break;
      case fd::kQ4K:
      case fd::kQ5K: as[i] = klinear_args(static_cast<fd::Layout>(L), x, t[0], nullptr, t[1], &t[2], t[3], &t[4]); break;
      case fd::kQ6K: as[i] = klinear_args(fd::kQ6K, x, t[0], &t[1], t[2], nullptr, t[3], nullptr); break;
      case fd::kQ5: as[i] = klinear_args(fd::kQ5, x, t[0], &t[1], t[2], &t[3], t[2], nullptr); break;
      case fd::kQ5S: as[i] = klinear_args(fd::kQ5S, x, t[0], &t[1], t[2], nullptr, t[2], nullptr); break;
      case fd::kQ4S: as[i] = klinear_args(fd::kQ4S, x, t[0], nullptr, t[1], nullptr, t[1], nullptr); break;
      case fd::kQ4NL: as[i] = klinear_args(fd::kQ4NL, x, t[0], nullptr, t[1], nullptr, t[1], nullptr); break;
      case fd::kQ4XS: as[i] = klinear_args(fd::kQ4XS, x, t[0], nullptr, t[1], nullptr, t[2], nullptr); break;
      case fd::kQ4MX: as[i] = klinear_args(fd::kQ4MX, x, t[0], nullptr, t[1], nullptr, t[1], nullptr); break;
    }
    prepare(as[i], x, t[0].size(0), ys[i], i);
  }
  run(as.data(), G);
  return ys;
}

}  // namespace

// ---------------------------------------------------------------------------
// Plain C entry points: the ISA switch for tests and benchmarks (0 = detect,
// 1 = AVX2, 2 = VNNI; returns the active one, or -1 if the CPU lacks it), and
// the AOTInductor shims.

extern "C" int fastdecode_set_isa(int isa) {
  if (isa == kVnni && detect_isa() != kVnni) return -1;
  g_isa.store(isa == 0 ? detect_isa() : isa);
  return g_isa.load();
}

extern "C" int fastdecode_get_isa() { return active_isa(); }

// The wide paths: 0 automatic, 1 forced on, -1 off; returns whether they are in use.
extern "C" int fastdecode_set_wide(int mode) {
  g_wide.store(mode < 0 ? -1 : mode > 0 ? 1 : 0);
  return wide();
}

using torch::aot_inductor::new_tensor_handle;
using torch::aot_inductor::tensor_handle_to_tensor_pointer;

extern "C" AOTITorchError aoti_torch_cpu_gemv(AtenTensorHandle x, AtenTensorHandle w, AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({
    at::Tensor* xt = tensor_handle_to_tensor_pointer(x);
    at::Tensor* wt = tensor_handle_to_tensor_pointer(w);
    *ret0 = new_tensor_handle(gemv(*xt, *wt));
  });
}

extern "C" AOTITorchError aoti_torch_cpu_rms_norm(AtenTensorHandle x, AtenTensorHandle w, double eps,
                                                  AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({
    *ret0 = new_tensor_handle(rms_norm(*tensor_handle_to_tensor_pointer(x), *tensor_handle_to_tensor_pointer(w), eps));
  });
}

extern "C" AOTITorchError aoti_torch_cpu_silu_mul(AtenTensorHandle h, AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE(
      { *ret0 = new_tensor_handle(silu_mul(*tensor_handle_to_tensor_pointer(h))); });
}

extern "C" AOTITorchError aoti_torch_cpu_gelu_tanh_mul(AtenTensorHandle h, AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE(
      { *ret0 = new_tensor_handle(gelu_tanh_mul(*tensor_handle_to_tensor_pointer(h))); });
}

extern "C" AOTITorchError aoti_torch_cpu_rope(AtenTensorHandle pos, AtenTensorHandle inv_freq, AtenTensorHandle* ret0,
                                              AtenTensorHandle* ret1) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({
    auto [cos, sin] = rope(*tensor_handle_to_tensor_pointer(pos), *tensor_handle_to_tensor_pointer(inv_freq));
    *ret0 = new_tensor_handle(std::move(cos));
    *ret1 = new_tensor_handle(std::move(sin));
  });
}

extern "C" AOTITorchError aoti_torch_cpu_attention(AtenTensorHandle q, AtenTensorHandle k, AtenTensorHandle v,
                                                   AtenTensorHandle pos, AtenTensorHandle rows, int64_t window,
                                                   double scale, double softcap, AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({
    *ret0 = new_tensor_handle(
        attention(*tensor_handle_to_tensor_pointer(q), *tensor_handle_to_tensor_pointer(k),
                  *tensor_handle_to_tensor_pointer(v), *tensor_handle_to_tensor_pointer(pos),
                  *tensor_handle_to_tensor_pointer(rows), window, scale, softcap));
  });
}

extern "C" AOTITorchError aoti_torch_cpu_q4_linear(AtenTensorHandle x, AtenTensorHandle w, AtenTensorHandle s,
                                                   AtenTensorHandle m, AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({
    *ret0 = new_tensor_handle(q4_linear(*tensor_handle_to_tensor_pointer(x), *tensor_handle_to_tensor_pointer(w),
                                        *tensor_handle_to_tensor_pointer(s), *tensor_handle_to_tensor_pointer(m)));
  });
}

extern "C" AOTITorchError aoti_torch_cpu_q8_linear(AtenTensorHandle x, AtenTensorHandle w, AtenTensorHandle s,
                                                   AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({
    *ret0 = new_tensor_handle(q8_linear(*tensor_handle_to_tensor_pointer(x), *tensor_handle_to_tensor_pointer(w),
                                        *tensor_handle_to_tensor_pointer(s)));
  });
}

#define FD_T(h) (*tensor_handle_to_tensor_pointer(h))

extern "C" AOTITorchError aoti_torch_cpu_q4k_linear(AtenTensorHandle x, AtenTensorHandle w, AtenTensorHandle sc,
                                                    AtenTensorHandle mn, AtenTensorHandle d, AtenTensorHandle dmin,
                                                    AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE(
      { *ret0 = new_tensor_handle(q4k_linear(FD_T(x), FD_T(w), FD_T(sc), FD_T(mn), FD_T(d), FD_T(dmin))); });
}

extern "C" AOTITorchError aoti_torch_cpu_q5k_linear(AtenTensorHandle x, AtenTensorHandle w, AtenTensorHandle sc,
                                                    AtenTensorHandle mn, AtenTensorHandle d, AtenTensorHandle dmin,
                                                    AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE(
      { *ret0 = new_tensor_handle(q5k_linear(FD_T(x), FD_T(w), FD_T(sc), FD_T(mn), FD_T(d), FD_T(dmin))); });
}

extern "C" AOTITorchError aoti_torch_cpu_q6k_linear(AtenTensorHandle x, AtenTensorHandle w, AtenTensorHandle qh,
                                                    AtenTensorHandle sc, AtenTensorHandle d, AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE(
      { *ret0 = new_tensor_handle(q6k_linear(FD_T(x), FD_T(w), FD_T(qh), FD_T(sc), FD_T(d))); });
}

extern "C" AOTITorchError aoti_torch_cpu_q5_linear(AtenTensorHandle x, AtenTensorHandle w, AtenTensorHandle qh,
                                                   AtenTensorHandle s, AtenTensorHandle m, AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE(
      { *ret0 = new_tensor_handle(q5_linear(FD_T(x), FD_T(w), FD_T(qh), FD_T(s), FD_T(m))); });
}

extern "C" AOTITorchError aoti_torch_cpu_q5s_linear(AtenTensorHandle x, AtenTensorHandle w, AtenTensorHandle qh,
                                                    AtenTensorHandle s, AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE(
      { *ret0 = new_tensor_handle(q5s_linear(FD_T(x), FD_T(w), FD_T(qh), FD_T(s))); });
}

extern "C" AOTITorchError aoti_torch_cpu_q4s_linear(AtenTensorHandle x, AtenTensorHandle w, AtenTensorHandle s,
                                                    AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({ *ret0 = new_tensor_handle(q4s_linear(FD_T(x), FD_T(w), FD_T(s))); });
}

extern "C" AOTITorchError aoti_torch_cpu_q4nl_linear(AtenTensorHandle x, AtenTensorHandle w, AtenTensorHandle d,
                                                     AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({ *ret0 = new_tensor_handle(q4nl_linear(FD_T(x), FD_T(w), FD_T(d))); });
}

extern "C" AOTITorchError aoti_torch_cpu_q4xs_linear(AtenTensorHandle x, AtenTensorHandle w, AtenTensorHandle sc,
                                                     AtenTensorHandle d, AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE(
      { *ret0 = new_tensor_handle(q4xs_linear(FD_T(x), FD_T(w), FD_T(sc), FD_T(d))); });
}

extern "C" AOTITorchError aoti_torch_cpu_q4mx_linear(AtenTensorHandle x, AtenTensorHandle w, AtenTensorHandle e,
                                                     AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({ *ret0 = new_tensor_handle(q4mx_linear(FD_T(x), FD_T(w), FD_T(e))); });
}

#undef FD_T

TORCH_LIBRARY_FRAGMENT(fastdecode, m) {
  m.def("gemv(Tensor x, Tensor w) -> Tensor");
  m.def("q4_linear(Tensor x, Tensor qweight, Tensor scales, Tensor mins) -> Tensor");
  m.def("q8_linear(Tensor x, Tensor qweight, Tensor scales) -> Tensor");
  m.def("q4k_linear(Tensor x, Tensor qweight, Tensor sc, Tensor mn, Tensor d, Tensor dmin) -> Tensor");
  m.def("q5k_linear(Tensor x, Tensor qweight, Tensor sc, Tensor mn, Tensor d, Tensor dmin) -> Tensor");
  m.def("q6k_linear(Tensor x, Tensor qweight, Tensor qhigh, Tensor sc, Tensor d) -> Tensor");
  m.def("q5_linear(Tensor x, Tensor qweight, Tensor qhigh, Tensor scales, Tensor mins) -> Tensor");
  m.def("q5s_linear(Tensor x, Tensor qweight, Tensor qhigh, Tensor scales) -> Tensor");
  m.def("q4s_linear(Tensor x, Tensor qweight, Tensor scales) -> Tensor");
  m.def("q4nl_linear(Tensor x, Tensor qweight, Tensor d) -> Tensor");
  m.def("q4xs_linear(Tensor x, Tensor qweight, Tensor sc, Tensor d) -> Tensor");
  m.def("q4mx_linear(Tensor x, Tensor qweight, Tensor e) -> Tensor");
  m.def("grouped_linear(str layout, Tensor[] x, Tensor[] w) -> Tensor[]");
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("rope(Tensor pos, Tensor inv_freq) -> (Tensor, Tensor)");
  m.def("silu_mul(Tensor h) -> Tensor");
  m.def("gelu_tanh_mul(Tensor h) -> Tensor");
  m.def("first_max(Tensor x) -> Tensor");
  m.def("attention(Tensor q, Tensor k, Tensor v, Tensor input_pos, Tensor rows, int window, float scale, "
        "float softcap=0.) -> Tensor");
  m.def("attention_sinks(Tensor q, Tensor k, Tensor v, Tensor input_pos, Tensor rows, int window, float scale, "
        "float softcap, Tensor sinks) -> Tensor");
}

TORCH_LIBRARY_IMPL(fastdecode, CPU, m) {
  m.impl("gemv", &gemv);
  m.impl("q4_linear", &q4_linear);
  m.impl("q8_linear", &q8_linear);
  m.impl("q4k_linear", &q4k_linear);
  m.impl("q5k_linear", &q5k_linear);
  m.impl("q6k_linear", &q6k_linear);
  m.impl("q5_linear", &q5_linear);
  m.impl("q5s_linear", &q5s_linear);
  m.impl("q4s_linear", &q4s_linear);
  m.impl("q4nl_linear", &q4nl_linear);
  m.impl("q4xs_linear", &q4xs_linear);
  m.impl("q4mx_linear", &q4mx_linear);
  m.impl("grouped_linear", &grouped_linear);
  m.impl("rms_norm", &rms_norm);
  m.impl("rope", &rope);
  m.impl("silu_mul", &silu_mul);
  m.impl("gelu_tanh_mul", &gelu_tanh_mul);
  m.impl("first_max", &first_max);
  m.impl("attention", &attention);
  m.impl("attention_sinks", &attention_sinks);
}
