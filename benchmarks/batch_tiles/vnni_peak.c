// The int8 dot-product peak of one core: 12 independent chains of 512-bit vpdpbusd (64
// multiply-adds each), so neither latency nor anything else limits them.
//
//   cc -O2 -mavx512f -mavx512vnni benchmarks/batch_tiles/vnni_peak.c -o /tmp/vnni_peak && /tmp/vnni_peak
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(void) {
  __m512i acc[12], w = _mm512_set1_epi8(3), x = _mm512_set1_epi8(5);
  for (int i = 0; i < 12; i++) acc[i] = _mm512_setzero_si512();
  const long n = 200000000;
  const double t = now();
  for (long k = 0; k < n; k++) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; i++) acc[i] = _mm512_dpbusd_epi32(acc[i], w, x);
    __asm__ volatile("" : "+v"(w));  // keeps the loop from being folded
  }
  const double dt = now() - t;
  __m512i s = acc[0];
  for (int i = 1; i < 12; i++) s = _mm512_add_epi32(s, acc[i]);
  printf("%.2f vpdpbusd (512-bit) per ns, %.0f GMAC/s on one core (checksum %d)\n", n * 12 / dt / 1e9,
         n * 12 * 64 / dt / 1e9, _mm512_reduce_add_epi32(s) & 1);
  return 0;
}
