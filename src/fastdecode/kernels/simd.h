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

// Lane i: hsum(a[i]), with hsum's pairing ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)), so
// each sum is bit for bit the one hsum gives.
static inline __m256 hsum8(const __m256* a) {
  __m256 x[4];
  for (int i = 0; i < 4; ++i)  // lanes 0-3: a[i]'s l_k + l_k+4; lanes 4-7: a[i + 4]'s
    x[i] = _mm256_add_ps(_mm256_permute2f128_ps(a[i], a[i + 4], 0x20), _mm256_permute2f128_ps(a[i], a[i + 4], 0x31));
  // Per 128-bit half: [P_i, P_i+1, Q_i, Q_i+1], P = (l0+l4)+(l2+l6), Q = (l1+l5)+(l3+l7).
  const __m256 u = _mm256_add_ps(_mm256_unpacklo_ps(x[0], x[1]), _mm256_unpackhi_ps(x[0], x[1]));
  const __m256 w = _mm256_add_ps(_mm256_unpacklo_ps(x[2], x[3]), _mm256_unpackhi_ps(x[2], x[3]));
  return _mm256_add_ps(_mm256_shuffle_ps(u, w, _MM_SHUFFLE(1, 0, 1, 0)), _mm256_shuffle_ps(u, w, _MM_SHUFFLE(3, 2, 3, 2)));
}

// Lanes 0-3: hsum(a[i]) as hsum8 pairs them, for 4 accumulators.
static inline __m128 hsum4(const __m256* a) {
  // lanes 0-3: a[i]'s l_k + l_k+4; lanes 4-7: a[i + 2]'s
  const __m256 x0 = _mm256_add_ps(_mm256_permute2f128_ps(a[0], a[2], 0x20), _mm256_permute2f128_ps(a[0], a[2], 0x31));
  const __m256 x1 = _mm256_add_ps(_mm256_permute2f128_ps(a[1], a[3], 0x20), _mm256_permute2f128_ps(a[1], a[3], 0x31));
  // Per 128-bit half: [P_i, P_i+1, Q_i, Q_i+1]; then P + Q in its lanes 0-1.
  const __m256 u = _mm256_add_ps(_mm256_unpacklo_ps(x0, x1), _mm256_unpackhi_ps(x0, x1));
  const __m256 s = _mm256_add_ps(u, _mm256_shuffle_ps(u, u, _MM_SHUFFLE(3, 2, 3, 2)));
  return _mm_castpd_ps(_mm_unpacklo_pd(_mm_castps_pd(_mm256_castps256_ps128(s)),
                                       _mm_castps_pd(_mm256_extractf128_ps(s, 1))));
}
