// The kernels' math on raw pointers, shared by the translation units that hold
// it (math.cpp, attention.cpp, quant_avx2.cpp, quant_vnni.cpp: no torch headers, so each
// compiles in a second or two) and the one that wraps it for PyTorch (ops.cpp:
// checks, allocation, at::parallel_for, the op registrations and the
// AOTInductor C shims). Each function computes one range of output rows, which
// ops.cpp hands out to threads; they are the bodies of those parallel loops.
#pragma once

#include <atomic>
#include <cstdint>

namespace fd {

// Rows [begin, end) of y [M, N] = x [M, K] w [N, K]^T (the GEMV, for a few rows M), all contiguous.
void gemv_rows(const float* x, const float* w, float* y, int64_t M, int64_t K, int64_t N, int64_t begin,
               int64_t end);

// Rows [m0, m1) of y [M, K] = rms_norm(x [M, K]) * w [K].
void rms_norm_rows(const float* x, const float* w, float* y, int64_t K, float eps, int64_t m0, int64_t m1);

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
  KvFormat kv;
  int64_t L;  // the most keys any query row visits
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

// The quantized matmuls (quant_kernel.h), once per instruction set.
struct QuantArgs {
  const uint8_t* w;  // weight row 0; ws bytes per row
  int64_t ws;
  const void *d, *mn;  // [N, nb] scales and (q4) mins, float or fp16 bits (half); mn null for q8
  int64_t nb;
  const int8_t* xq;  // activations quantized by quantize_rows: [M, K] int8
  const float *xd, *xs;  // [M, nb] block scales, scale * sum(q)
  int64_t M, K;
  float* y;  // [M, N]
  int64_t N;
};

// Tiles of weight rows x activation rows, one rows<> instantiation of quant_kernel.h each.
enum Tiles : int {
  kTiles4x2 = 0,        // AVX2
  kTiles4x1Narrow = 1,  // VNNI, one activation row: 256-bit tiles
  kTiles8x2 = 2,        // VNNI, q4, two activation rows
  kTiles4x8 = 3,        // VNNI
};

// The layouts beyond q4/q8 (quant/formats.py): q4k, q5k (q4's nibbles, per-32 uint8 scales
// and mins, fp16 d and dmin per 256; q5k adds a high-bit plane), q6k (Q6_K's bytes), and
// q5 / q5s (q4's nibbles plus q5k's high-bit plane, fp16 scales [and mins] per 32).
enum KLayout : int { kQ4K = 0, kQ5K = 1, kQ6K = 2, kQ5 = 3, kQ5S = 4 };

struct KQuantArgs {
  const uint8_t* q;  // nibbles (q6k: ql), qs bytes per row
  int64_t qs;
  const uint8_t* qh;  // high bits (q5k, q6k), qhs bytes per row
  int64_t qhs;
  const uint8_t* sc;  // uint8 [N, nb] (q6k: int8 [N, 2 nb]; q5, q5s: fp16 [N, nb]), scs elements per row
  const uint8_t* mn;  // uint8 [N, nb] (q4k, q5k; q5: fp16 [N, nb])
  int64_t scs;
  const uint16_t *d, *dmin;  // fp16 bits [N, nb / 8]
  int64_t nb;
  const int8_t* xq;  // activations quantized by quantize_rows: [M, K] int8
  const float *xd, *xs;  // [M, nb] block scales, scale * sum(q)
  int64_t M, K;
  float* y;  // [M, N]
  int64_t N;
};

namespace avx2 {
void krows(KLayout layout, const KQuantArgs& a, int64_t n0, int64_t n1);
void quantize_rows(const float* x, int64_t M, int64_t K, int8_t* q, float* d, float* s);
void rows(bool q4, bool half, Tiles tiles, const QuantArgs& a, int64_t n0, int64_t n1);
}  // namespace avx2

namespace vnni {
void krows(KLayout layout, bool narrow, const KQuantArgs& a, int64_t n0, int64_t n1);
void quantize_rows(const float* x, int64_t M, int64_t K, int8_t* q, float* d, float* s);
void rows(bool q4, bool half, Tiles tiles, const QuantArgs& a, int64_t n0, int64_t n1);
}  // namespace vnni

}  // namespace fd
