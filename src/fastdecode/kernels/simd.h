// AVX helpers shared by the kernels. quant_kernel.h includes it inside the
// per-ISA `#pragma GCC target` regions of quant_avx2.cpp and quant_vnni.cpp,
// so it has no include guard and holds only static inline code.

// The sum of 8 lanes as ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)), an order
// quant/reference.py repeats to match the quantized kernels bit for bit.
static inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
