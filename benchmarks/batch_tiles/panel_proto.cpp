// A prototype, not the engine's kernel: q4 weights (Q4_1's 4-bit values, float16 scale and
// minimum per block of 32), and on VNNI q4k and q6k weights too, repacked in panels of 16 rows
// (each layout's own bytes, transposed), so that one 512-bit register holds 4 values of each of
// 16 rows and vpdpbusd against 4 broadcast activation bytes leaves each
// row's block sum in its own lane. The per-block float scaling then runs once per 16 outputs,
// and no output needs a horizontal sum. Timed against the engine's tiles (quant_kernel.h at
// HEAD, the same weights in their own layout) and checked against them to rounding (the float
// sums run in another order, so the bits differ).
//
//   panel_proto.sh -- M N K [ROUNDS [LAYOUT]]   (LAYOUT 2 q4k, 4 q6k: VNNI only; THREADS, COPIES as
//                                               tile_ab.sh; ISA=avx2: both on AVX2)
#include <immintrin.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>
#include "kernels.h"

#include "isa_begin.h"  // (AB_AVX2: both builds on AVX2)
namespace A {
#include QK_A_KERNEL
#include QK_A_DISPATCH
}

// q4's panel layout: [N / 16][nb][256 value bytes | 16 float16 scales | 16 float16 minima]. Unit u
// (64 bytes) of a block: row i's 4 bytes at 4 i, low nibbles values 4u..4u+3, high 16+4u..16+4u+3.
constexpr int64_t kPanelBlock = 256 + 64, kPanelBlockK = 256, kPanelBlock6 = 256 + 128;

// Activations: [M][nb][32] int8 in natural order, d and d * sum(q) per block [M][nb].
struct XNat {
  const int8_t* q;
  const float *d, *s;
  int64_t nb;
  const int32_t* h32;  // q6k: 32 x the sums of each block's two halves (values 0-15, 16-31) [M][nb][2]
};

typedef int32_t Word __attribute__((may_alias, aligned(1)));

#if AB_AVX2
// 16 rows as two halves of 8 (one 256-bit register each), C activation rows at a time: each
// half's 8 sub-steps of maddubs pairs stay below 2^15 in int16 (15 * 127 * 2 * 8 = 30480).
template <int C>
static inline void panel_tile(const uint8_t* panel, const XNat& x, int64_t m, float* y, int64_t N, int64_t n,
                              int64_t ahead) {
  const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  for (int h = 0; h < 2; ++h) {
    __m256 acc[C], macc[C];
    for (int c = 0; c < C; ++c) acc[c] = macc[c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < x.nb; ++b) {
      const uint8_t* pb = panel + b * kPanelBlock;
      if (ahead && h == 0)
        for (int l = 0; l < kPanelBlock; l += 64) _mm_prefetch(reinterpret_cast<const char*>(pb + ahead + l), _MM_HINT_T0);
      __m256i P[C];
      for (int u = 0; u < 4; ++u) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pb + 64 * u + 32 * h));
        const __m256i lo = _mm256_and_si256(v, low), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
        for (int c = 0; c < C; ++c) {
          const int8_t* xb = x.q + ((m + c) * x.nb + b) * 32;
          const __m256i t = _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_set1_epi32(reinterpret_cast<const Word*>(xb)[u])),
                                             _mm256_maddubs_epi16(hi, _mm256_set1_epi32(reinterpret_cast<const Word*>(xb)[4 + u])));
          P[c] = u ? _mm256_add_epi16(P[c], t) : t;
        }
      }
      const __m256 ws = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(pb + 256 + 16 * h)));
      const __m256 mv = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(pb + 288 + 16 * h)));
      for (int c = 0; c < C; ++c) {
        const int64_t at = (m + c) * x.nb + b;
        const __m256 I = _mm256_cvtepi32_ps(_mm256_madd_epi16(P[c], ones));
        acc[c] = _mm256_add_ps(acc[c], _mm256_mul_ps(I, _mm256_mul_ps(ws, _mm256_set1_ps(x.d[at]))));
        macc[c] = _mm256_add_ps(macc[c], _mm256_mul_ps(mv, _mm256_set1_ps(x.s[at])));
      }
    }
    for (int c = 0; c < C; ++c) _mm256_storeu_ps(y + (m + c) * N + n + 8 * h, _mm256_add_ps(acc[c], macc[c]));
  }
}
#else
// KQ: q4k's panel: the blocks' values (kPanelBlockK, so that units stay 64-byte aligned), then per
// block the 16 rows' 6-bit scales and minima as bytes [nb][16 | 16], then per 8 blocks their
// float16 d and dmin [nb / 8][16 | 16].
template <int C, bool KQ = false>
static inline void panel_tile(const uint8_t* panel, const XNat& x, int64_t m, float* y, int64_t N, int64_t n,
                              int64_t ahead) {
  __m512 acc[C], macc[C];
  for (int c = 0; c < C; ++c) acc[c] = macc[c] = _mm512_setzero_ps();
  const __m512i low = _mm512_set1_epi8(0x0F);
  const int64_t stride = KQ ? kPanelBlockK : kPanelBlock;
  const uint8_t* spart = panel + x.nb * stride;  // KQ: [nb][16 sc | 16 mn]
  const uint8_t* dpart = spart + x.nb * 32;       // KQ: [nb / 8][16 d | 16 dmin]
  __m512 d = _mm512_setzero_ps(), ndmin = d;
  for (int64_t b = 0; b < x.nb; ++b) {
    const uint8_t* pb = panel + b * stride;
    if (ahead) {
      for (int l = 0; l < stride; l += 64) _mm_prefetch(reinterpret_cast<const char*>(pb + ahead + l), _MM_HINT_T0);
      if (KQ && b % 2 == 0) _mm_prefetch(reinterpret_cast<const char*>(spart + 32 * b + ahead), _MM_HINT_T0);
      if (KQ && b % 16 == 0) _mm_prefetch(reinterpret_cast<const char*>(dpart + 4 * b + ahead), _MM_HINT_T0);
    }
    __m512i I[C];
    for (int c = 0; c < C; ++c) I[c] = _mm512_setzero_si512();
    for (int u = 0; u < 4; ++u) {
      const __m512i v = _mm512_loadu_si512(pb + 64 * u);
      const __m512i lo = _mm512_and_si512(v, low), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
      for (int c = 0; c < C; ++c) {
        const int8_t* xb = x.q + ((m + c) * x.nb + b) * 32;
        const int32_t a0 = reinterpret_cast<const Word*>(xb)[u], a1 = reinterpret_cast<const Word*>(xb)[4 + u];
        I[c] = _mm512_dpbusd_epi32(I[c], lo, _mm512_set1_epi32(a0));
        I[c] = _mm512_dpbusd_epi32(I[c], hi, _mm512_set1_epi32(a1));
      }
    }
    __m512 ws, mv;
    if constexpr (KQ) {
      if (b % 8 == 0) {
        const uint8_t* dp = dpart + (b / 8) * 64;
        d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(dp)));
        ndmin = _mm512_castsi512_ps(_mm512_xor_si512(  // -dmin
            _mm512_castps_si512(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(dp + 32)))),
            _mm512_set1_epi32(static_cast<int>(0x80000000u))));
      }
      ws = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(spart + 32 * b)))));
      mv = _mm512_mul_ps(ndmin, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(spart + 32 * b + 16)))));
    } else {
      ws = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(pb + 256)));
      mv = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(pb + 288)));
    }
    for (int c = 0; c < C; ++c) {
      const int64_t at = (m + c) * x.nb + b;
      acc[c] = _mm512_add_ps(acc[c], _mm512_mul_ps(_mm512_cvtepi32_ps(I[c]), _mm512_mul_ps(ws, _mm512_set1_ps(x.d[at]))));
      macc[c] = _mm512_add_ps(macc[c], _mm512_mul_ps(mv, _mm512_set1_ps(x.s[at])));
    }
  }
  for (int c = 0; c < C; ++c) _mm512_storeu_ps(y + (m + c) * N + n, _mm512_add_ps(acc[c], macc[c]));
}
#endif

#if !AB_AVX2
// q6k's panel: per block 4 units of low nibbles (as q4's) and 2 of top bits (half h: byte t of
// lane i holds, in bits 2s and 2s + 1, value 4s + t's top bits of that half), kPanelBlock6 bytes;
// then per block the 16 rows' int8 half scales [nb][16 lo | 16 hi]; then per 8 blocks their
// float16 d [nb / 8][16]. I_b = sc_lo (I_lo - 32 sum_lo x) + sc_hi (I_hi - 32 sum_hi x), as the
// engine's q6k.
template <int C>
static inline void panel_tile6(const uint8_t* panel, const XNat& x, int64_t m, float* y, int64_t N, int64_t n,
                               int64_t ahead) {
  __m512 acc[C];
  for (int c = 0; c < C; ++c) acc[c] = _mm512_setzero_ps();
  const __m512i low = _mm512_set1_epi8(0x0F), top = _mm512_set1_epi8(0x30);
  const uint8_t* spart = panel + x.nb * kPanelBlock6;
  const uint8_t* dpart = spart + x.nb * 32;
  __m512 d = _mm512_setzero_ps();
  for (int64_t b = 0; b < x.nb; ++b) {
    const uint8_t* pb = panel + b * kPanelBlock6;
    if (ahead) {
      for (int l = 0; l < kPanelBlock6; l += 64) _mm_prefetch(reinterpret_cast<const char*>(pb + ahead + l), _MM_HINT_T0);
      // the scales' and d's streams, which the values' (ahead in memory) reach only at the panel's end
      if (b == 0)
        for (int l = 0; l < 1024; l += 64) _mm_prefetch(reinterpret_cast<const char*>(spart + l), _MM_HINT_T0);
      if (b % 2 == 0) _mm_prefetch(reinterpret_cast<const char*>(spart + 32 * b + 1024), _MM_HINT_T0);
      if (b % 16 == 0) _mm_prefetch(reinterpret_cast<const char*>(dpart + 4 * b), _MM_HINT_T0);
    }
    if (b % 8 == 0) d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(dpart + 4 * b)));
    const __m512i h0 = _mm512_loadu_si512(pb + 256), h1 = _mm512_loadu_si512(pb + 320);
    __m512i Ilo[C], Ihi[C];
    for (int c = 0; c < C; ++c) Ilo[c] = Ihi[c] = _mm512_setzero_si512();
    auto unit = [&](int u) __attribute__((always_inline)) {
      const __m512i v = _mm512_loadu_si512(pb + 64 * u);
      const int sh = 2 * u;  // top bits of sub-step u at bits 2u, 2u + 1 -> bits 4, 5
      const __m512i t0 = sh <= 4 ? _mm512_slli_epi16(h0, 4 - sh) : _mm512_srli_epi16(h0, sh - 4);
      const __m512i t1 = sh <= 4 ? _mm512_slli_epi16(h1, 4 - sh) : _mm512_srli_epi16(h1, sh - 4);
      const __m512i lo = _mm512_or_si512(_mm512_and_si512(v, low), _mm512_and_si512(t0, top));
      const __m512i hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v, 4), low), _mm512_and_si512(t1, top));
      for (int c = 0; c < C; ++c) {
        const int8_t* xb = x.q + ((m + c) * x.nb + b) * 32;
        Ilo[c] = _mm512_dpbusd_epi32(Ilo[c], lo, _mm512_set1_epi32(reinterpret_cast<const Word*>(xb)[u]));
        Ihi[c] = _mm512_dpbusd_epi32(Ihi[c], hi, _mm512_set1_epi32(reinterpret_cast<const Word*>(xb)[4 + u]));
      }
    };
    unit(0);
    unit(1);
    unit(2);
    unit(3);
    const __m512i slo = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(spart + 32 * b)));
    const __m512i shi = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(spart + 32 * b + 16)));
    for (int c = 0; c < C; ++c) {
      const int64_t at = (m + c) * x.nb + b;
      const __m512i I = _mm512_add_epi32(
          _mm512_mullo_epi32(_mm512_sub_epi32(Ilo[c], _mm512_set1_epi32(x.h32[2 * at])), slo),
          _mm512_mullo_epi32(_mm512_sub_epi32(Ihi[c], _mm512_set1_epi32(x.h32[2 * at + 1])), shi));
      acc[c] = _mm512_add_ps(acc[c], _mm512_mul_ps(_mm512_cvtepi32_ps(I), _mm512_mul_ps(d, _mm512_set1_ps(x.d[at]))));
    }
  }
  for (int c = 0; c < C; ++c) _mm512_storeu_ps(y + (m + c) * N + n, acc[c]);
}
#endif

// Panels [p0, p1) for all M rows: each panel against tiles of up to 8 activation rows. L: the
// layout (kernels.h: kQ4, kQ4K or kQ6K).
template <int L = fd::kQ4>
static void panel_rows(const uint8_t* w, const XNat& x, int64_t M, float* y, int64_t N, int64_t p0, int64_t p1) {
  const int64_t bytes = L == fd::kQ4K   ? x.nb * (kPanelBlockK + 32) + x.nb / 8 * 64
                        : L == fd::kQ6K ? x.nb * (kPanelBlock6 + 32) + x.nb / 8 * 32
                                        : x.nb * kPanelBlock;
  for (int64_t p = p0; p < p1; ++p) {
    const uint8_t* panel = w + p * bytes;
    const int64_t ahead = p + 1 < p1 ? 4096 : 0;
    for (int64_t m = 0; m < M;) {
      const int64_t left = M - m, first = m == 0 ? ahead : 0;
      const int64_t n = 16 * p;
#if AB_AVX2
      if (left >= 4) { panel_tile<4>(panel, x, m, y, N, n, first); m += 4; }
      else if (left >= 2) { panel_tile<2>(panel, x, m, y, N, n, first); m += 2; }
      else { panel_tile<1>(panel, x, m, y, N, n, first); m += 1; }
#else
      auto run = [&]<int C>() {
        if constexpr (L == fd::kQ6K) panel_tile6<C>(panel, x, m, y, N, n, first);
        else panel_tile<C, L == fd::kQ4K>(panel, x, m, y, N, n, first);
        m += C;
      };
      if (left >= 8) run.template operator()<8>();
      else if (left >= 4) run.template operator()<4>();
      else if (left >= 2) run.template operator()<2>();
      else run.template operator()<1>();
#endif
    }
  }
}
#pragma GCC pop_options

#include "harness.h"

int main(int argc, char** argv) {
  if (argc < 4) return fprintf(stderr, "usage: panel_proto M N K [ROUNDS [LAYOUT]]\n"), 2;
  const int64_t M = atoi(argv[1]), N = atoi(argv[2]), K = atoi(argv[3]);
  const int rounds = argc > 4 ? atoi(argv[4]) : 100;
  const int lay = argc > 5 ? atoi(argv[5]) : fd::kQ4;
  const bool kq = lay == fd::kQ4K, k6 = lay == fd::kQ6K;
  if (lay != fd::kQ4 && !kq && !k6) return fprintf(stderr, "LAYOUT: 0 (q4), 2 (q4k) or 4 (q6k)\n"), 2;
  if ((kq || k6) && (AB_AVX2 || K % 256)) return fprintf(stderr, "q4k, q6k: VNNI only, K a multiple of 256\n"), 2;
  threads = getenv("THREADS") ? atoi(getenv("THREADS")) : 1;
  const int copies = getenv("COPIES") ? atoi(getenv("COPIES")) : 1;
  if (N % 16 || K % 32) return fprintf(stderr, "N must be a multiple of 16, K of 32\n"), 2;
  const int64_t nb = K / 32, G = (nb + 7) / 8, tail = nb % 8;
  std::mt19937 g(1);
  std::vector<float> xf(M * K);
  for (auto& v : xf) v = std::uniform_real_distribution<float>(-1, 1)(g);
  std::vector<int8_t> xq(M * G * 256);
  std::vector<float> xd(M * G * 8), xs(M * G * 8);
  std::vector<int32_t> xsums(M * G * 16);
  A::quantize_rows(xf.data(), M, K, xq.data(), xd.data(), xs.data(), xsums.data());
  std::vector<int8_t> xn(M * nb * 32);  // the same int8 values in natural order
  for (int64_t m = 0; m < M; ++m)
    for (int64_t b = 0; b < nb; ++b)
      for (int k = 0; k < 32; ++k) xn[(m * nb + b) * 32 + k] = xq[m * G * 256 + (b / 8) * 256 + 32 * (k / 4) + 4 * (b % 8) + k % 4];
  std::vector<float> xdn(M * nb), xsn(M * nb);  // per block, without the padding of a last group
  for (int64_t m = 0; m < M; ++m)
    for (int64_t b = 0; b < nb; ++b) xdn[m * nb + b] = xd[m * G * 8 + b], xsn[m * nb + b] = xs[m * G * 8 + b];
  std::vector<int32_t> h32(M * nb * 2);
  for (int64_t i = 0; i < M * nb * 2; ++i) {
    int32_t t = 0;
    for (int k = 0; k < 16; ++k) t += xn[i * 16 + k];
    h32[i] = 32 * t;
  }
  const XNat x{xn.data(), xdn.data(), xsn.data(), nb, h32.data()};

  std::vector<uint8_t> q(N * K / 2);
  for (auto& v : q) v = g();
  // q4: float16 scale and minimum per block. q4k: 6-bit scale and minimum bytes per block, float16
  // d and dmin per 8 blocks. q6k: top bits [N][K/4], int8 half scales [N][2 nb] (the engine's lane
  // order: 16 G + 8 h + j), float16 d per 8 blocks.
  std::vector<uint16_t> sc(N * nb), mn(N * nb), d(N * nb / 8), dm(N * nb / 8);
  for (auto& v : sc) v = kq ? g() & 0x3f : 0x2000 + (g() & 0xff);
  for (auto& v : mn) v = kq ? g() & 0x3f : 0xa000 + (g() & 0xff);
  for (auto& v : d) v = 0x2000 + (g() & 0xff);
  for (auto& v : dm) v = 0x2000 + (g() & 0xff);
  std::vector<uint8_t> sc8(sc.begin(), sc.end()), mn8(mn.begin(), mn.end()), qh(k6 ? N * K / 4 : 0), sc6(k6 ? N * 2 * nb : 0);
  for (auto& v : qh) v = g();
  for (auto& v : sc6) v = g();
  const int64_t block = kq ? kPanelBlockK : k6 ? kPanelBlock6 : kPanelBlock;
  const int64_t scales_at = nb * block, d_at = scales_at + nb * 32;  // (q4k, q6k)
  const int64_t panel_bytes = kq ? d_at + nb / 8 * 64 : k6 ? d_at + nb / 8 * 32 : nb * block;
  std::vector<uint8_t> panel(N / 16 * panel_bytes);
  for (int64_t n = 0; n < N; ++n) {
    const int i = n % 16;
    uint8_t* pn = panel.data() + (n / 16) * panel_bytes;
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* pb = pn + b * block;
      const int64_t unit = tail && b / 8 == nb / 8 ? 4 * tail : 32;  // a last group of g < 8 blocks is packed 4 g bytes a unit
      for (int u = 0; u < 4; ++u) std::memcpy(pb + 64 * u + 4 * i, q.data() + n * K / 2 + (b / 8) * 128 + unit * u + 4 * (b % 8), 4);
      if (kq) {
        pn[scales_at + 32 * b + i] = sc8[n * nb + b];
        pn[scales_at + 32 * b + 16 + i] = mn8[n * nb + b];
      } else if (k6) {
        for (int h = 0; h < 2; ++h) {
          std::memcpy(pb + 256 + 64 * h + 4 * i, qh.data() + n * K / 4 + 64 * (b / 8) + 32 * h + 4 * (b % 8), 4);
          pn[scales_at + 32 * b + 16 * h + i] = sc6[n * 2 * nb + 16 * (b / 8) + 8 * h + b % 8];
        }
      } else {
        std::memcpy(pb + 256 + 2 * i, &sc[n * nb + b], 2);
        std::memcpy(pb + 288 + 2 * i, &mn[n * nb + b], 2);
      }
    }
    for (int64_t s8 = 0; s8 < nb / 8 && (kq || k6); ++s8) {
      std::memcpy(pn + d_at + s8 * (kq ? 64 : 32) + 2 * i, &d[n * nb / 8 + s8], 2);
      if (kq) std::memcpy(pn + d_at + s8 * 64 + 32 + 2 * i, &dm[n * nb / 8 + s8], 2);
    }
  }
  std::vector<std::vector<uint8_t>> qc(copies, q), pc(copies, panel);
  std::vector<std::vector<uint16_t>> scc(copies, sc), mnc(copies, mn);
  std::vector<std::vector<uint8_t>> sc8c(copies, sc8), mn8c(copies, mn8), qhc(copies, qh), sc6c(copies, sc6);

  fd::QuantArgs a{};
  a.layout = static_cast<fd::Layout>(lay);
  a.qhs = K / 4;
  a.scs = k6 ? 2 * nb : nb;
  a.d = d.data();
  a.dmin = dm.data();
  a.qs = K / 2;
  a.nb = nb;
  a.xq = xq.data(); a.xd = xd.data(); a.xs = xs.data(); a.xsums = xsums.data();
  a.M = M; a.N = N; a.wide = !AB_AVX2;
  std::vector<float> ya(M * N), yp(M * N);
  std::vector<double> ta, tp;
  for (int r = 0; r < rounds; ++r) {
    const int k = r % copies;
    a.q = qc[k].data();
    a.sc = kq ? sc8c[k].data() : k6 ? sc6c[k].data() : reinterpret_cast<const uint8_t*>(scc[k].data());
    a.qh = qhc[k].data();
    a.mn = kq ? mn8c[k].data() : reinterpret_cast<const uint8_t*>(mnc[k].data());
    a.y = ya.data();
    double t0 = now();
    split((N + 3) / 4, 16, [&](int64_t t0_, int64_t t1_) { A::dispatch(a, 4 * t0_, std::min(N, 4 * t1_)); });
    ta.push_back(now() - t0);
    const uint8_t* w = pc[(r + copies / 2) % copies].data();
    t0 = now();
    split(N / 16, 4, [&](int64_t p0, int64_t p1) {
      if (kq) panel_rows<fd::kQ4K>(w, x, M, yp.data(), N, p0, p1);
      else if (k6) panel_rows<fd::kQ6K>(w, x, M, yp.data(), N, p0, p1);
      else panel_rows(w, x, M, yp.data(), N, p0, p1);
    });
    tp.push_back(now() - t0);
  }
  double worst = 0, scale = 0;
  for (int64_t i = 0; i < M * N; ++i) {
    worst = std::max(worst, double(std::fabs(ya[i] - yp[i])));
    scale = std::max(scale, double(std::fabs(ya[i])));
  }
  std::sort(ta.begin(), ta.end());
  std::sort(tp.begin(), tp.end());
  const double mac = double(M) * N * K, qa = ta[rounds / 4], qp = tp[rounds / 4];
  printf("%s M=%ld N=%ld K=%ld  tiles q1 %.1f us (%.1f GMAC/s)  panels q1 %.1f us (%.1f GMAC/s)  panels/tiles speed %.3f  "
         "max |diff| %.2e of max |y| %.2e\n",
         kq ? "q4k" : k6 ? "q6k" : "q4", M, N, K, qa * 1e6, mac / qa / 1e9, qp * 1e6, mac / qp / 1e9, qa / qp, worst, scale);
}
