// What a block's AMX work costs on one thread, by how it is shaped: per block (32 values of K) a
// product of an A tile (R activation rows x 32 bytes) and a B tile (8 rows x 64 bytes: 16 weight
// rows), its C tile zeroed before and stored after, over 256 activation rows x K = 2048.
//   gcc -O2 -mamx-tile -mamx-int8 -o amx_seq amx_seq.c && for m in 0 3 4 10 13 14 20 22; do ./amx_seq $m; done
// Modes: 0 / 10: 8 / 16 rows, one panel, a block at a time (zero, load A, load B, product, store);
// 3 / 13: the loads alone; 4 / 14: zero and store alone; 20: 16 rows, two panels sharing each A
// tile; 22: as 20, two blocks' products before their four stores (what quant_panel.h's amx_rows
// does). benchmarks/serve/README.md, 2026-12-05 (evening).
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
typedef struct { uint8_t palette, start; uint8_t r0[14]; uint16_t colsb[16]; uint8_t rows[16]; } cfg_t;
#define K 2048
#define NB (K / 32)
static int8_t A[256 * K] __attribute__((aligned(64)));
static int8_t B[NB * 1024] __attribute__((aligned(64)));  // two panels' B tiles a block
static int32_t out[16][256] __attribute__((aligned(64)));
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
int main(int argc, char** argv) {
  if (argc < 2 || syscall(SYS_arch_prctl, 0x1023, 18)) { printf("usage: amx_seq MODE (needs AMX)\n"); return 1; }
  const int mode = atoi(argv[1]), R = mode >= 10 ? 16 : 8, panels = mode >= 20 ? 2 : 1;
  for (int i = 0; i < 256 * K; ++i) A[i] = i % 7 - 3;
  for (int i = 0; i < NB * 1024; ++i) B[i] = i % 5 - 2;
  cfg_t c; memset(&c, 0, sizeof c); c.palette = 1;
  for (int t = 0; t < 8; ++t) { c.rows[t] = t < 6 ? R : 8; c.colsb[t] = t == 4 || t == 5 ? 32 : 64; }  // C 0-3, A 4-5, B 6-7
  _tile_loadconfig(&c);
  const long reps = 200;
  const double t0 = now();
  for (long r = 0; r < reps; ++r)
    for (int m = 0; m < 256; m += R) {
      const int8_t* x = A + m * K;
      for (int b = 0; b < NB; b += 2) {
        const uint8_t* w = (const uint8_t*)B + 1024 * b;
        switch (mode) {
          case 0: case 10:
            _tile_zero(0); _tile_loadd(4, x + 32 * b, K); _tile_loadd(6, w, 64); _tile_dpbssd(0, 4, 6); _tile_stored(0, out[0], 64);
            _tile_zero(1); _tile_loadd(5, x + 32 * b + 32, K); _tile_loadd(7, w + 1024, 64); _tile_dpbssd(1, 5, 7); _tile_stored(1, out[1], 64);
            break;
          case 3: case 13:
            _tile_loadd(4, x + 32 * b, K); _tile_loadd(6, w, 64); _tile_loadd(5, x + 32 * b + 32, K); _tile_loadd(7, w + 1024, 64);
            break;
          case 4: case 14:
            _tile_zero(0); _tile_stored(0, out[0], 64); _tile_zero(1); _tile_stored(1, out[1], 64);
            break;
          case 20:
            for (int j = 0; j < 2; ++j) {
              _tile_zero(0); _tile_zero(1);
              _tile_loadd(4, x + 32 * (b + j), K); _tile_loadd(6, w + 1024 * j, 64); _tile_loadd(7, w + 1024 * j + 512, 64);
              _tile_dpbssd(0, 4, 6); _tile_dpbssd(1, 4, 7);
              _tile_stored(0, out[0], 64); _tile_stored(1, out[1], 64);
            }
            break;
          case 22:
            _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
            _tile_loadd(4, x + 32 * b, K); _tile_loadd(6, w, 64); _tile_loadd(7, w + 512, 64);
            _tile_dpbssd(0, 4, 6); _tile_dpbssd(1, 4, 7);
            _tile_loadd(5, x + 32 * b + 32, K); _tile_loadd(6, w + 1024, 64); _tile_loadd(7, w + 1536, 64);
            _tile_dpbssd(2, 5, 6); _tile_dpbssd(3, 5, 7);
            _tile_stored(0, out[0], 64); _tile_stored(1, out[1], 64); _tile_stored(2, out[2], 64); _tile_stored(3, out[3], 64);
            break;
          default: printf("unknown mode\n"); return 1;
        }
      }
    }
  const double s = now() - t0, products = (double)reps * (256 / R) * NB * panels;
  _tile_release();
  printf("mode %2d, %2d rows x %d panel(s): %5.1f ns a block and panel, %4.0f GMAC/s\n", mode, R, panels,
         s / products * 1e9, products * R * 16 * 32 / s / 1e9);
  return 0;
}
