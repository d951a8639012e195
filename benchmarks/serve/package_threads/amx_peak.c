// Throughput of AMX's int8 tile product (tdpbssd: C[16 x 16 int32] += A[16 x 64 s8] B, 16 x 64 x 16
// MACs) on one thread, four independent accumulator tiles, operands already in tiles.
//   gcc -O2 -mamx-tile -mamx-int8 -o amx_peak amx_peak.c && ./amx_peak
// (benchmarks/serve/README.md, 2026-12-05 (later): 3,100-3,300 GMAC/s a thread on the Intel Xeon
// VM, also with two copies at once.)
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
typedef struct { uint8_t palette, start; uint8_t r0[14]; uint16_t colsb[16]; uint8_t rows[16]; } cfg_t;
int main() {
  if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)) { printf("no AMX permission\n"); return 1; }
  cfg_t cfg; memset(&cfg, 0, sizeof cfg); cfg.palette = 1;
  for (int t = 0; t < 8; ++t) { cfg.colsb[t] = 64; cfg.rows[t] = 16; }
  _tile_loadconfig(&cfg);
  static int8_t a[16 * 64], b[16 * 64]; static int32_t c[16 * 16];
  for (int i = 0; i < 1024; ++i) a[i] = i % 7 - 3, b[i] = i % 5 - 2;
  _tile_loadd(4, a, 64); _tile_loadd(5, b, 64); _tile_loadd(6, a, 64); _tile_loadd(7, b, 64);
  _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
  long n = 20000000;
  struct timespec t0, t1; clock_gettime(CLOCK_MONOTONIC, &t0);
  for (long i = 0; i < n; ++i) {
    _tile_dpbssd(0, 4, 5); _tile_dpbssd(1, 4, 7); _tile_dpbssd(2, 6, 5); _tile_dpbssd(3, 6, 7);
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  _tile_stored(0, c, 64);
  _tile_release();
  double s = (t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec);
  printf("%.1f G tdpbssd/s, %.0f GMAC/s one thread (c0 %d)\n", 4.0 * n / s / 1e9, 4.0 * n * 16 * 16 * 64 / s / 1e9, c[0]);
  return 0;
}
