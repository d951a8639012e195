// Throughput of 512-bit vpdpbusd on one thread: 12 independent chains, no loads.
//   gcc -O2 -mavx512f -mavx512vnni -mavx512bw -o vnni_peak vnni_peak.c && ./vnni_peak
// (benchmarks/serve/README.md, 2026-12-05 (later): 6.4-6.6 G/s on the Intel Xeon VM, i.e. two a
// cycle at its ~3.3 GHz; two copies at once 6.35 + 5.06 G/s.)
#include <immintrin.h>
#include <stdio.h>
#include <time.h>
#define R(i) __m512i c##i = _mm512_set1_epi32(i);
#define D(i) c##i = _mm512_dpbusd_epi32(c##i, a, b);
#define S(i) x += _mm512_reduce_add_epi32(c##i);
int main() {
  R(0) R(1) R(2) R(3) R(4) R(5) R(6) R(7) R(8) R(9) R(10) R(11)
  __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(5);
  long n = 200000000;
  struct timespec t0, t1; clock_gettime(CLOCK_MONOTONIC, &t0);
  for (long i = 0; i < n; ++i) {
    D(0) D(1) D(2) D(3) D(4) D(5) D(6) D(7) D(8) D(9) D(10) D(11)
    __asm__ volatile("" : "+v"(a), "+v"(b));
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double s = (t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec);
  int x = 0; S(0) S(1) S(2) S(3) S(4) S(5) S(6) S(7) S(8) S(9) S(10) S(11)
  printf("%.2f G vpdpbusd zmm/s one thread (%d)\n", 12.0 * n / s / 1e9, x & 1);
  return 0;
}
