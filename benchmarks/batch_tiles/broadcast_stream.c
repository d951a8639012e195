// broadcast_l1.c's two loops over a 2048 x 2048 nibble matrix (2 MB: L3) against 8 activation
// rows (two tiles of 4 a panel half), walked as the q4k kernel walks it, with the rows' whole K
// in the activation buffer: (b)'s replicated buffer is then 128 KB and lives in L2.
// Arguments: any first one prefetches 2 KB ahead; a second, N, rotates over N copies of the
// matrix (16: 32 MB, streamed from DRAM).
//
//   gcc -O3 -mavx2 -mfma benchmarks/batch_tiles/broadcast_stream.c -o /tmp/bs && /tmp/bs && /tmp/bs 1 && /tmp/bs 1 16
#include <immintrin.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define C 4
#define M 8
#define N 2048
#define K 2048
#define NB (K/32)
#define NP (N/16)
static uint8_t *W;            /* [NP][NB][4 units][2 halves][32] */
static int8_t X[M][K] __attribute__((aligned(64)));
static int32_t *XB;           /* [NB][8 words][M][8] prebroadcast */
static float Y[M][N];
static int PF = 0;
static inline __m256i bc(const int8_t* x, int w){ return _mm256_set1_epi32(((const int32_t*)x)[w]); }
#define BODY(LOADX0, LOADX1) \
  for(int p=0;p<NP;p++) for(int h=0;h<2;h++) for(int m0=0;m0<M;m0+=C){ \
    __m256i acc[C]; for(int c=0;c<C;c++) acc[c]=_mm256_setzero_si256(); \
    for(int b=0;b<NB;b++){ \
      const uint8_t* pb=W+((size_t)(p*NB+b))*256; \
      if(PF) _mm_prefetch((const char*)pb+2048,_MM_HINT_T0); \
      __m256i Pc[C]; \
      _Pragma("GCC unroll 4") for(int u=0;u<4;u++){ \
        __m256i v=_mm256_loadu_si256((const __m256i*)(pb+64*u+32*h)); \
        __m256i lo=_mm256_and_si256(v,low), hi=_mm256_and_si256(_mm256_srli_epi16(v,4),low); \
        _Pragma("GCC unroll 8") for(int c=0;c<C;c++){ \
          __m256i t=_mm256_add_epi16(_mm256_maddubs_epi16(lo,LOADX0),_mm256_maddubs_epi16(hi,LOADX1)); \
          Pc[c]= u? _mm256_add_epi16(Pc[c],t):t; __asm__("":"+x"(Pc[c])); } } \
      for(int c=0;c<C;c++) acc[c]=_mm256_add_epi32(acc[c],_mm256_madd_epi16(Pc[c],_mm256_set1_epi16(1))); } \
    for(int c=0;c<C;c++) _mm256_storeu_ps(&Y[m0+c][16*p+8*h],_mm256_cvtepi32_ps(acc[c])); }
__attribute__((noinline)) void run_a(void){ const __m256i low=_mm256_set1_epi8(15);
  BODY(bc(X[m0+c]+32*b,u), bc(X[m0+c]+32*b,4+u)) }
__attribute__((noinline)) void run_b(void){ const __m256i low=_mm256_set1_epi8(15);
  BODY(_mm256_load_si256((const __m256i*)(XB+((size_t)(b*8+u)*M+m0+c)*8)), _mm256_load_si256((const __m256i*)(XB+((size_t)(b*8+4+u)*M+m0+c)*8))) }
int main(int argc,char**argv){
  PF = argc>1; size_t wb=(size_t)NP*NB*256; int copies = argc>2? atoi(argv[2]):1;
  uint8_t* base=aligned_alloc(64,wb*copies); for(size_t i=0;i<wb*copies;i++) base[i]=rand();
  XB=aligned_alloc(64,(size_t)NB*8*M*32); memset(XB,3,(size_t)NB*8*M*32); memset(X,3,sizeof X);
  double macs=(double)M*N*K;
  for(int k=0;k<5;k++){ double ta=0,tb=0; for(int i=0;i<copies*4;i++){ W=base+wb*(i%copies);
    double t=now(); run_a(); ta+=now()-t; t=now(); run_b(); tb+=now()-t; }
    printf("broadcast %.0f GMAC/s   prebroadcast %.0f GMAC/s   ratio %.2f\n", macs*copies*4/ta/1e9, macs*copies*4/tb/1e9, ta/tb); }
  return Y[0][0]==1.2345f;
}
