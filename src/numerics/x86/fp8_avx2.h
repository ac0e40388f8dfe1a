/* Internal: the FP8 rounding step of the AVX2 kernels (numerics/x86/mx_avx2.c,
 * scaled_avx2.c). */
#ifndef MXI_FP8_AVX2_H
#define MXI_FP8_AVX2_H

#include <immintrin.h>

/* FP8 magnitude codes (one per 32-bit lane, not yet saturated) of a >= 0, a finite and
 * below 2^(emax+2). With E the exponent of max(a, min normal), adding C = 2^(E+23-mbits)
 * rounds a to the FP8 grid (spacing 2^(E-mbits)) with the FPU's round-to-nearest-even, and
 * the mantissa field of a + C counts grid steps; adding E's code offset gives the FP8 code
 * for normals and subnormals alike, a carry into the next binade included. */
static inline __attribute__((always_inline)) __m256i fp8_grid_codes8(__m256 a, int mbits, int bias) {
    __m256i e = _mm256_max_epi32(_mm256_and_si256(_mm256_castps_si256(a), _mm256_set1_epi32(0x7F800000)),
                                 _mm256_set1_epi32((128 - bias) << 23));
    __m256i c = _mm256_add_epi32(e, _mm256_set1_epi32((23 - mbits) << 23));
    __m256i steps = _mm256_and_si256(_mm256_castps_si256(_mm256_add_ps(a, _mm256_castsi256_ps(c))),
                                     _mm256_set1_epi32(0x7FFFFF));
    return _mm256_add_epi32(steps, _mm256_sub_epi32(_mm256_srli_epi32(e, 23 - mbits), _mm256_set1_epi32((128 - bias) << mbits)));
}

#endif
