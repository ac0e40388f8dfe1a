/* Internal: the FP8 rounding step of the AVX-512 kernels (numerics/x86/mx_avx512.c,
 * scaled_avx512.c): fp8_grid_codes8 of numerics/x86/fp8_avx2.h on 16 lanes; and the 16-bit
 * halves of fp32 lanes, which their 16-bit encoders read. */
#ifndef MXI_FP8_AVX512_H
#define MXI_FP8_AVX512_H

#include <stdint.h>

#include "numerics/x86/simd512.h"

static inline __attribute__((always_inline)) __m512i fp8_grid_codes16(__m512 a, int mbits, int bias) {
    __m512i e = _mm512_max_epi32(_mm512_and_si512(_mm512_castps_si512(a), _mm512_set1_epi32(0x7F800000)),
                                 _mm512_set1_epi32((128 - bias) << 23));
    __m512i c = _mm512_add_epi32(e, _mm512_set1_epi32((23 - mbits) << 23));
    __m512i steps = _mm512_and_si512(_mm512_castps_si512(_mm512_add_ps(a, _mm512_castsi512_ps(c))),
                                     _mm512_set1_epi32(0x7FFFFF));
    return _mm512_add_epi32(steps, _mm512_sub_epi32(_mm512_srli_epi32(e, 23 - mbits), _mm512_set1_epi32((128 - bias) << mbits)));
}

/* The high 16-bit halves of 32 fp32 lanes (v0's 16, then v1's), in lane order; with
 * high false, the low halves. One vpermt2w. */
static inline __attribute__((always_inline)) __m512i fp8_halves32(__m512i v0, __m512i v1, int high) {
    static const uint16_t words[2][32] __attribute__((aligned(64))) = {   // the low words, the high words
        {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30,
         32, 34, 36, 38, 40, 42, 44, 46, 48, 50, 52, 54, 56, 58, 60, 62},
        {1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31,
         33, 35, 37, 39, 41, 43, 45, 47, 49, 51, 53, 55, 57, 59, 61, 63}};
    return _mm512_permutex2var_epi16(v0, _mm512_load_si512(words[high != 0]), v1);
}

#endif
