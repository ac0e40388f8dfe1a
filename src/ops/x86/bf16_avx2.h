/* The AVX2 form of the reference's bf16 rounding (mxi_bf16_bits, core/bits.h),
 * shared by the AVX2 kernel files (include after immintrin.h). */
#ifndef MXI_BF16_AVX2_H
#define MXI_BF16_AVX2_H

/* 8 fp32 to their bf16 values in the top halves (the low halves zero): nearest even, a NaN
 * quieted with its sign and top payload bits. */
static inline __m256i mxi_bf16_bits8(__m256 x) {
    __m256i u = _mm256_castps_si256(x);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), lsb);
    __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF)), _mm256_set1_epi32(0x7F800000));
    r = _mm256_blendv_epi8(r, _mm256_or_si256(u, _mm256_set1_epi32(0x00400000)), nan);
    return _mm256_and_si256(r, _mm256_set1_epi32((int)0xFFFF0000u));
}

#endif
