/* Internal: the FP8 rounding step of the AVX-512 kernels (numerics/x86/mx_avx512.c,
 * scaled_avx512.c): fp8_grid_codes8 of numerics/x86/fp8_avx2.h on 16 lanes. */
#ifndef MXI_FP8_AVX512_H
#define MXI_FP8_AVX512_H

#include "numerics/x86/simd512.h"

static inline __attribute__((always_inline)) __m512i fp8_grid_codes16(__m512 a, int mbits, int bias) {
    __m512i e = _mm512_max_epi32(_mm512_and_si512(_mm512_castps_si512(a), _mm512_set1_epi32(0x7F800000)),
                                 _mm512_set1_epi32((128 - bias) << 23));
    __m512i c = _mm512_add_epi32(e, _mm512_set1_epi32((23 - mbits) << 23));
    __m512i steps = _mm512_and_si512(_mm512_castps_si512(_mm512_add_ps(a, _mm512_castsi512_ps(c))),
                                     _mm512_set1_epi32(0x7FFFFF));
    return _mm512_add_epi32(steps, _mm512_sub_epi32(_mm512_srli_epi32(e, 23 - mbits), _mm512_set1_epi32((128 - bias) << mbits)));
}

#endif
