// Read-only streaming bandwidth, the roofline of batch-1 decode (benchmarks/batch_tiles.md):
//   gcc -O2 -mavx2 -fopenmp read_bandwidth.c -o rd && ./rd [GiB]   (OMP_NUM_THREADS=1 for one core)
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
// 2 threads each sum their half of a buffer of GiB (default 1; more where the L3 the VM reports
// could hold part of 1 GiB) with AVX2 loads.
int main(int argc,char**argv){ size_t n=(argc>1?strtoul(argv[1],0,10):1ul)<<30;
 if(!n){ fprintf(stderr,"read_bandwidth: the size must be a whole number of GiB >= 1, got '%s'\n",argv[1]); return 2; }
 char*b=aligned_alloc(64,n); memset(b,1,n); double best=1e9; long long tot=0;
 for(int rep=0;rep<5;rep++){ double t=omp_get_wtime(); long long s=0;
 #pragma omp parallel reduction(+:s)
 { int id=omp_get_thread_num(), nt=omp_get_num_threads(); size_t lo=n/nt*id, hi=n/nt*(id+1); __m256i a0=_mm256_setzero_si256(),a1=a0,a2=a0,a3=a0;
   for(size_t i=lo;i<hi;i+=128){ a0=_mm256_add_epi8(a0,_mm256_load_si256((void*)(b+i))); a1=_mm256_add_epi8(a1,_mm256_load_si256((void*)(b+i+32))); a2=_mm256_add_epi8(a2,_mm256_load_si256((void*)(b+i+64))); a3=_mm256_add_epi8(a3,_mm256_load_si256((void*)(b+i+96)));}
   a0=_mm256_add_epi8(_mm256_add_epi8(a0,a1),_mm256_add_epi8(a2,a3)); s+=_mm256_extract_epi8(a0,0);}
 t=omp_get_wtime()-t; if(t<best)best=t; tot+=s;}
 printf("read bandwidth %.1f GB/s (threads %d) %lld\n", n/best/1e9, omp_get_max_threads(), tot);}
