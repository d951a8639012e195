// The kernels' math on raw pointers, shared by the translation units that hold
// it (math.cpp, attention.cpp, quant_avx2.cpp, quant_vnni.cpp: no torch headers, so each
// compiles in a second or two) and the one that wraps it for PyTorch (ops.cpp:
// checks, allocation, at::parallel_for, the op registrations and the
// AOTInductor C shims). Each function computes one range of output rows, which
// ops.cpp hands out to threads; they are the bodies of those parallel loops.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

namespace fd {

// Rows [begin, end) of y [M, N] = x [M, K] w [N, K]^T (the GEMV, for a few rows M), all contiguous.
void gemv_rows(const float* x, const float* w, float* y, int64_t M, int64_t K, int64_t N, int64_t begin,
               int64_t end);

// Rows [m0, m1) of y [M, K] = rms_norm(x [M, K]) * w [K].
void rms_norm_rows(const float* x, const float* w, float* y, int64_t K, float eps, int64_t m0, int64_t m1);

// Rows [m0, m1) of RoPE's cos and sin [M, H] (each its own array) of the angles pos[m] x f[h]:
// the angle in float32, its cos and sin in float64, rounded (the model's rope_angles, same bits).
void rope_rows(const int64_t* pos, const float* f, float* cos, float* sin, int64_t H, int64_t m0, int64_t m1);

// Rows [m0, m1) of y [M, F] = silu(g) * u for h [M, 2F] = [g | u] (SwiGLU): the same bits as
// torch's F.silu(g) * u on CPU (Sleef's vectorized exp while two 8-lane vectors fit, then std::exp,
// as torch's AVX2 loop; its AVX-512 loop agrees wherever F is a multiple of 32).
void silu_mul_rows(const float* h, float* y, int64_t F, int64_t m0, int64_t m1);

// The same for GeGLU with GELU's tanh form (Gemma): y = gelu_tanh(g) * u, torch's F.gelu(g,
// approximate="tanh") * u bit for bit (its operation order, Sleef's vectorized tanh).
void gelu_tanh_mul_rows(const float* h, float* y, int64_t F, int64_t m0, int64_t m1);

// Rows [m0, m1) of x [M, V]: idx[m] = the index of row m's first largest value, a NaN counting as
// largest (torch's argmax and max(dim).indices).
void first_max_rows(const float* x, int64_t* idx, int64_t V, int64_t m0, int64_t m1);

// K/V storage formats of the attention kernel. q8_0: per (slot, position, kv head) row,
// D / 32 blocks of kQ8Block bytes, each a float16 scale then 32 int8 values.
enum KvFormat : int { kKvF32 = 0, kKvF16 = 1, kKvBF16 = 2, kKvQ8_0 = 3 };
constexpr int64_t kQ8Block = 34;

struct AttentionArgs {
  const float* q;
  const void *k, *v;  // KvFormat kv; strides ks in elements of the storage type (bytes for q8_0)
  const int64_t *pos, *rows;  // [B, T] contiguous, [B]
  float* y;
  int64_t B, T, H, Hkv, D, window;  // window 0: every key up to the position
  int64_t qs[4], ks[3];  // strides: q [B, T, H, D] (elements), k/v [B_cache, Hkv, S] (D contiguous)
  float scale;
  float softcap;  // > 0: scores s become softcap tanh(s / softcap) before the softmax (Gemma 2); 0: none
  KvFormat kv;
  int64_t L;  // the most keys any query row visits
  bool wide = false;  // AVX-512 (F, BW, VL) may be used: the same bits, in wider registers
  const float* sinks = nullptr;  // [H] each head's sink logit, in its softmax's sum only (gpt-oss); nullptr: none
};

// The attention's work in tiles (attention.cpp): the query rows of one batch row
// and kv head (the heads of its group x `tokens` consecutive tokens), which read
// the same K/V rows. Which rows share a tile never changes any row's result.
struct AttentionTiles {
  int64_t tokens;  // per tile
  int64_t count;
};
AttentionTiles attention_tiles(const AttentionArgs& a, int threads);

// Runs tiles taken from `next` (shared by the threads that call it) until none are left.
void attention_run(const AttentionArgs& a, const AttentionTiles& tiles, std::atomic<int64_t>& next);

// A decode step (one token a row) with fewer tiles than threads (Gemma 3's one kv head at batch
// 1, or a few kv heads on many cores), over enough keys to pay for two more rounds of the
// threads: each tile's work runs in three phases instead, each phase's parts shared by all the
// threads: the scores by blocks of keys, the softmax by query row, p v by chunks of dims. The
// same bits as attention_run.
constexpr int kAttentionPhases = 3;
struct AttentionSplit {
  int64_t tiles = 0, heads = 0;  // tiles, query heads per tile
  int64_t blocks = 0, chunks = 0;  // per tile: key blocks (phase 0), dim chunks (phase 2)
  int64_t cap = 0, jb = 0;  // floats for a row's scores; keys per block
  std::vector<float> s, inv;  // rows' scores, then probabilities [tiles x heads, cap]; 1 / their sums
  int64_t parts(int phase) const;
};
// Whether `a` splits on `threads`; if so, `plan` is sized for it.
bool attention_split(const AttentionArgs& a, int threads, AttentionSplit& plan);
// Runs `phase`'s parts taken from `next` until none are left; phase p + 1 starts after every part of p.
void attention_split_run(const AttentionArgs& a, AttentionSplit& plan, int phase, std::atomic<int64_t>& next);

// The quantized matmuls (quant_kernel.h), once per instruction set. Layouts: quant/formats.py.
enum Layout : int {
  kQ4 = 0, kQ8 = 1, kQ4K = 2, kQ5K = 3, kQ6K = 4, kQ5 = 5, kQ5S = 6, kQ4S = 7, kQ4NL = 8, kQ4XS = 9, kQ4MX = 10
};

struct QuantArgs {
  Layout layout;
  const uint8_t* q;  // qweight, qs bytes per row
  int64_t qs;
  const uint8_t* qh;  // qhigh (q6k, q5, q5s), qhs bytes per row
  int64_t qhs;
  // per-block scales and minima (float16; q4k/q5k: sc, mn; q6k, q4xs: sc; q4mx: its E8M0 bytes e), scs elements per row
  const uint8_t *sc, *mn;
  int64_t scs;
  const uint16_t *d, *dmin;  // the K-quants' float16 d, dmin [N, nb / 8]
  int64_t nb;  // blocks of 32 per row: K / 32
  // The activations from quantize_rows, each row padded to G = ceil(nb / 8) groups: int8 in the lane
  // order, [M, G, 256] (the panel layouts: [G, M, 256], so that a tile's rows lie 256 bytes apart),
  // block scales and scale * sum(q) [M, G, 8], and the integer sums of each block's values 0..15 and
  // 16..31 [M, G, 2, 8]. The K-quant panels (q4k, q5k, q6k: in_super) take one scale per group of 256
  // values, which each of its 8 blocks repeats.
  const int8_t* xq;
  const float *xd, *xs;
  const int32_t* xsums;
  int64_t M;
  float* y;  // [M, N]
  int64_t N;
  bool wide = false;  // (VNNI) 512-bit registers at full width: 4-row tiles take two groups a register
  bool far = false;   // the panel layouts prefetch their values a second time, 4x as far (Intel; q4k always)
  // (VNNI with AMX) the activations row by row, [M, K] int8, for AMX tiles (on_amx); else null.
  // With it, but for the K-quants (null), xt: the first M16 = M - M % 16 rows' block scales and
  // scale x sums by tiles of kAmxTileRows, [2][M16 / 16][nb][16], so that a tile's rows' values of
  // one block are side by side.
  const int8_t* xa = nullptr;
  const float* xt = nullptr;
};

namespace avx2 {
void quantize_rows(const float* x, int64_t M, int64_t K, bool per256, int8_t* q, int64_t qrow, int64_t qgroup,
                   float* d, float* s, int32_t* sums);
void rows(const QuantArgs& a, int64_t n0, int64_t n1);
}  // namespace avx2

namespace vnni {
void quantize_rows(const float* x, int64_t M, int64_t K, bool per256, int8_t* q, int64_t qrow, int64_t qgroup,
                   float* d, float* s, int32_t* sums);
void rows(const QuantArgs& a, int64_t n0, int64_t n1);
}  // namespace vnni

// Weight rows per tile on each instruction set (ops.cpp splits rows across threads in whole tiles),
// and rows per panel of the layouts stored in panels (quant_panel.h).
constexpr int64_t kTileRows = 4, kPanelRows = 16;
constexpr int64_t kAmxTileRows = 16;  // activation rows of an AMX tile (QuantArgs::xt)
constexpr bool in_panels(Layout l) { return l == kQ4 || l == kQ8 || l == kQ4S || l == kQ4K || l == kQ5K || l == kQ6K; }
constexpr bool in_super(Layout l) { return l == kQ4K || l == kQ5K || l == kQ6K; }
// The layouts whose matmuls take AMX tiles where the CPU has them (quant_panel.h's amx_rows).
constexpr bool on_amx(Layout l) { return l == kQ4 || l == kQ4S || l == kQ8 || l == kQ4K || l == kQ5K; }

}  // namespace fd
