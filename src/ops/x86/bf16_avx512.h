/* The AVX-512 form of the reference's bf16 rounding (mxi_bf16_bits, core/bits.h),
 * shared by the AVX-512 kernel files (include after numerics/x86/simd512.h). */
#ifndef MXI_BF16_AVX512_H
#define MXI_BF16_AVX512_H

/* 16 fp32 to their bf16 values in the top halves (the low halves zero): nearest even, a
 * NaN quieted with its sign and top payload bits. */
static inline __m512i mxi_bf16_bits16(__m512 x) {
    __m512i u = _mm512_castps_si512(x);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), lsb);
    __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)),
                                            _mm512_set1_epi32(0x7F800000));
    r = _mm512_mask_blend_epi32(nan, r, _mm512_or_si512(u, _mm512_set1_epi32(0x00400000)));
    return _mm512_and_si512(r, _mm512_set1_epi32((int)0xFFFF0000u));
}

#endif
