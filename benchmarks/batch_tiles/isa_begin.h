// Opens the target region the kernel headers are compiled in (as quant_avx2.cpp and
// quant_vnni.cpp do): AB_AVX2=1 at build time for AVX2, else AVX-512 VNNI. Close it with
// `#pragma GCC pop_options`.
#pragma GCC push_options
#if AB_AVX2
#pragma GCC target("avx2,fma,f16c")
#define FD_VNNI 0
#else
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")
#define FD_VNNI 1
#endif
