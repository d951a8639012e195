// One core's throughput of the instructions the kernels are built from, from registers or L1
// (benchmarks/real_sizes_zen5.md):
//   gcc -O3 -march=native benchmarks/real_sizes_zen5/peaks.c -o /tmp/peaks && /tmp/peaks
// fp32 FMA and int8 dot products (vpdpbusd) in ymm and zmm with 12-16 independent chains, and
// two inner loops of the attention's scores: the kernel's (3 query rows x 4 keys in ymm, float16
// keys widened per chunk) and one with two keys per zmm register (3 rows x 8 keys).
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static float buf[8192] __attribute__((aligned(64)));
volatile float sink;  // keeps every accumulator live

int main(void) {
  for (int i = 0; i < 8192; i++) buf[i] = 1e-6f * (i % 100);
  const long N = 100000000;
  const float* q = buf;
  const unsigned short* kh = (const unsigned short*)(buf + 4096);
  double t;

  __m256 y[12];
  __m512 z[16];
  __m256i yi[12];
  __m512i zi[12];
#define ZERO(a, n, v) _Pragma("GCC unroll 16") for (int i = 0; i < n; i++) a[i] = v;
  ZERO(y, 12, _mm256_set1_ps((float)i));  // distinct, or the compiler keeps one chain
  __m256 x8 = _mm256_set1_ps(1.0000001f), w8 = _mm256_set1_ps(0.999999f);
  t = now();
  for (long n = 0; n < N; n++) {
    _Pragma("GCC unroll 12") for (int i = 0; i < 12; i++) y[i] = _mm256_fmadd_ps(x8, w8, y[i]);
    __asm__ volatile("" ::"v"(x8));
  }
  printf("ymm FMA:       %.2f G/s (%.1f GMAC/s)\n", N * 12 / (now() - t) / 1e9, N * 12 * 8 / (now() - t) / 1e9);
  for (int i = 0; i < 12; i++) sink += _mm256_cvtss_f32(y[i]);

  ZERO(z, 16, _mm512_set1_ps((float)i));
  __m512 x16 = _mm512_set1_ps(1.0000001f), w16 = _mm512_set1_ps(0.999999f);
  t = now();
  for (long n = 0; n < N; n++) {
    _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++) z[i] = _mm512_fmadd_ps(x16, w16, z[i]);
    __asm__ volatile("" ::"v"(x16));
  }
  printf("zmm FMA:       %.2f G/s (%.1f GMAC/s)\n", N * 16 / (now() - t) / 1e9, N * 16 * 16 / (now() - t) / 1e9);
  for (int i = 0; i < 16; i++) sink += _mm512_reduce_add_ps(z[i]);

  ZERO(yi, 12, _mm256_set1_epi32(i));
  __m256i a8 = _mm256_set1_epi8(3), b8 = _mm256_set1_epi8(5);
  t = now();
  for (long n = 0; n < N; n++) {
    _Pragma("GCC unroll 12") for (int i = 0; i < 12; i++) yi[i] = _mm256_dpbusd_epi32(yi[i], a8, b8);
    __asm__ volatile("" ::"v"(a8));
  }
  printf("ymm vpdpbusd:  %.2f G/s (%.1f G int8 MAC/s)\n", N * 12 / (now() - t) / 1e9, N * 12 * 32 / (now() - t) / 1e9);

  ZERO(zi, 12, _mm512_set1_epi32(i));
  __m512i a16 = _mm512_set1_epi8(3), b16 = _mm512_set1_epi8(5);
  t = now();
  for (long n = 0; n < N; n++) {
    _Pragma("GCC unroll 12") for (int i = 0; i < 12; i++) zi[i] = _mm512_dpbusd_epi32(zi[i], a16, b16);
    __asm__ volatile("" ::"v"(a16));
  }
  printf("zmm vpdpbusd:  %.2f G/s (%.1f G int8 MAC/s)\n", N * 12 / (now() - t) / 1e9, N * 12 * 64 / (now() - t) / 1e9);

  // Scores as attention.cpp's qk<F16, 3, 4>: per chunk of 8 dims, 3 q loads, 4 key loads widened
  // from float16, 12 FMAs.
  ZERO(y, 12, _mm256_setzero_ps());
  t = now();
  for (long n = 0; n < N; n++) {
    const int c = (n & 7) * 8;
    const __m256 q0 = _mm256_load_ps(q + c), q1 = _mm256_load_ps(q + 64 + c), q2 = _mm256_load_ps(q + 128 + c);
    _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {
      const __m256 k = _mm256_cvtph_ps(_mm_load_si128((const __m128i*)(kh + 64 * j + c)));
      y[j] = _mm256_fmadd_ps(q0, k, y[j]);
      y[4 + j] = _mm256_fmadd_ps(q1, k, y[4 + j]);
      y[8 + j] = _mm256_fmadd_ps(q2, k, y[8 + j]);
    }
  }
  printf("scores, ymm 3 rows x 4 keys:      %.1f GMAC/s\n", N * 96 / (now() - t) / 1e9);
  for (int i = 0; i < 12; i++) sink += _mm256_cvtss_f32(y[i]);

  // The same scores with keys j, j + 1 in the halves of a zmm register, q broadcast to both:
  // per chunk 3 q broadcasts, 8 key loads (2 a register), 12 FMAs for 8 keys.
  ZERO(z, 12, _mm512_setzero_ps());
  t = now();
  for (long n = 0; n < N; n++) {
    const int c = (n & 7) * 8;
    const __m512 q0 = _mm512_broadcast_f32x8(_mm256_load_ps(q + c));
    const __m512 q1 = _mm512_broadcast_f32x8(_mm256_load_ps(q + 64 + c));
    const __m512 q2 = _mm512_broadcast_f32x8(_mm256_load_ps(q + 128 + c));
    _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {
      const __m256i h = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_load_si128((const __m128i*)(kh + 128 * j + c))),
                                                _mm_load_si128((const __m128i*)(kh + 128 * j + 64 + c)), 1);
      const __m512 k = _mm512_cvtph_ps(h);
      z[j] = _mm512_fmadd_ps(q0, k, z[j]);
      z[4 + j] = _mm512_fmadd_ps(q1, k, z[4 + j]);
      z[8 + j] = _mm512_fmadd_ps(q2, k, z[8 + j]);
    }
  }
  printf("scores, zmm 3 rows x 8 keys (2 a register): %.1f GMAC/s\n", N * 192 / (now() - t) / 1e9);

  for (int i = 0; i < 12; i++)
    sink += _mm512_reduce_add_ps(z[i]) + (float)_mm256_extract_epi32(yi[i], 0) + (float)_mm512_reduce_add_epi32(zi[i]);
  return 0;
}
