// What broadcasting the activations costs the AVX2 nibble tiles (quant_panel.h's nibble_sums),
// everything in L1: one panel half (8 weight rows) against C activation rows, 8 panels x 8 blocks,
// repeated. (a) each activation word broadcast from a compact [row][K] buffer (vpbroadcastd m32,
// as the tiles do); (b) the words stored 8x replicated, read by vpmaddubsw as a memory operand.
// No scales, no float steps. benchmarks/real_sizes_zen3.md ("What the q4k tile loses to").
//
//   for c in 2 4 8; do sed "s/#define C 4/#define C $c/" benchmarks/batch_tiles/broadcast_l1.c > /tmp/b.c &&
//     gcc -O3 -mavx2 -mfma /tmp/b.c -o /tmp/b && /tmp/b; done
#include <immintrin.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define C 4
#define P 8          /* panels per sweep */
#define NB 8         /* blocks per group */
static uint8_t W[P][NB][4][32] __attribute__((aligned(64)));  /* unit-half: 8 rows x 4 bytes */
static int8_t X[C][NB][32] __attribute__((aligned(64)));       /* compact activations: 32 values a block */
static int32_t XB[NB][8][C][8] __attribute__((aligned(64)));   /* prebroadcast: [block][word][c][8 lanes] */
static __m256i sink[P][C];

// One panel half's sums against C rows; X0, X1: the activation words of units u and 4 + u of row c.
#define BODY(X0, X1) \
  const __m256i low = _mm256_set1_epi8(15); \
  for (long r = 0; r < reps; r++) \
    for (int p = 0; p < P; p++) { \
      __m256i acc[C]; \
      for (int c = 0; c < C; c++) acc[c] = _mm256_setzero_si256(); \
      for (int b = 0; b < NB; b++) { \
        __m256i Pc[C]; \
        _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++) { \
          __m256i v = _mm256_load_si256((const __m256i*)W[p][b][u]); \
          __m256i lo = _mm256_and_si256(v, low), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low); \
          _Pragma("GCC unroll 8") for (int c = 0; c < C; c++) { \
            __m256i t = _mm256_add_epi16(_mm256_maddubs_epi16(lo, X0), _mm256_maddubs_epi16(hi, X1)); \
            Pc[c] = u ? _mm256_add_epi16(Pc[c], t) : t; \
            __asm__("" : "+x"(Pc[c])); \
          } \
        } \
        for (int c = 0; c < C; c++) acc[c] = _mm256_add_epi32(acc[c], _mm256_madd_epi16(Pc[c], _mm256_set1_epi16(1))); \
      } \
      for (int c = 0; c < C; c++) sink[p][c] = _mm256_add_epi32(sink[p][c], acc[c]); \
    }

static inline __m256i bc(int c, int b, int w) { return _mm256_set1_epi32(((const int32_t*)X[c][b])[w]); }
static inline __m256i rep(int c, int b, int w) { return _mm256_load_si256((const __m256i*)XB[b][w][c]); }
__attribute__((noinline)) void run_a(long reps) { BODY(bc(c, b, u), bc(c, b, 4 + u)) }
__attribute__((noinline)) void run_b(long reps) { BODY(rep(c, b, u), rep(c, b, 4 + u)) }

int main(){
  memset(W,0x35,sizeof W); memset(X,3,sizeof X); memset(XB,3,sizeof XB);
  long reps=400000; double macs=(double)reps*P*NB*4*C*2*32;
  for(int k=0;k<3;k++){
    double t=now(); run_a(reps); double ta=now()-t;
    t=now(); run_b(reps); double tb=now()-t;
    printf("broadcast %.0f GMAC/s   prebroadcast %.0f GMAC/s   ratio %.2f\n", macs/ta/1e9, macs/tb/1e9, ta/tb);
  }
  int32_t s[8]; _mm256_storeu_si256((__m256i*)s,sink[0][0]); return s[0]==12345;
}
