/* Internal: the intrinsics of the AVX-512 kernels (numerics/x86/mx_avx512.c,
 * ops/x86/ops_avx512.c, ops/x86/nn_avx512.c).
 *
 * Normally <immintrin.h>, and the files are compiled with AVX-512 flags. A build with
 * MXI_AVX512_SIMDE (`make SIMDE=1`) compiles the same kernels for AVX2 instead, on SIMDe's
 * portable implementations of the AVX-512 intrinsics (Debian's libsimde-dev), so that the
 * kernels' algorithm runs, and is tested, on CPUs without AVX-512. The few intrinsics
 * SIMDe 0.7 lacks are written below, lane by lane, from Intel's definitions: narrowing
 * conversions, fp32 to fp64 widening, zero/sign extensions (bytes to words and dwords), masked loads and stores,
 * 16-bit (signed and unsigned) and unsigned 8-bit compares, vshufi64x2, vpgatherdd. */
#ifndef MXI_SIMD512_H
#define MXI_SIMD512_H

#ifndef MXI_AVX512_SIMDE

#include <immintrin.h>

#else

#include <stdint.h>
#include <string.h>

#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>

/* Lane views of a vector, for the definitions below. */
typedef union { __m512i v; int8_t i8[64]; uint8_t u8[64]; int16_t i16[32]; uint16_t u16[32]; int32_t i32[16]; uint32_t u32[16]; } mxe_512;
typedef union { __m256i v; int8_t i8[32]; uint8_t u8[32]; int16_t i16[16]; uint16_t u16[16]; } mxe_256;
typedef union { __m128i v; int8_t i8[16]; uint8_t u8[16]; } mxe_128;
typedef union { __m256 v; float f32[8]; } mxe_256f;
typedef union { __m512d v; double f64[8]; } mxe_512d;

/* vpmovdb, vpmovdw: truncate each lane. */
static inline __m128i mxe_mm512_cvtepi32_epi8(__m512i a) {
    mxe_512 x = {a}; mxe_128 r;
    for (int i = 0; i < 16; i++) r.u8[i] = (uint8_t)x.u32[i];
    return r.v;
}
static inline __m256i mxe_mm512_cvtepi32_epi16(__m512i a) {
    mxe_512 x = {a}; mxe_256 r;
    for (int i = 0; i < 16; i++) r.u16[i] = (uint16_t)x.u32[i];
    return r.v;
}
/* vpmovuswb: each lane as an unsigned 16-bit number, saturated to 0..255. */
static inline __m256i mxe_mm512_cvtusepi16_epi8(__m512i a) {
    mxe_512 x = {a}; mxe_256 r;
    for (int i = 0; i < 32; i++) r.u8[i] = x.u16[i] > 255 ? 255 : (uint8_t)x.u16[i];
    return r.v;
}
/* vcvtps2pd: 8 fp32 to 8 fp64, exactly. */
static inline __m512d mxe_mm512_cvtps_pd(__m256 a) {
    mxe_256f x = {a}; mxe_512d r;
    for (int i = 0; i < 8; i++) r.f64[i] = (double)x.f32[i];
    return r.v;
}
/* vpmovzxwd, vpmovzxbd, vpmovsxbd */
static inline __m512i mxe_mm512_cvtepu16_epi32(__m256i a) {
    mxe_256 x = {a}; mxe_512 r;
    for (int i = 0; i < 16; i++) r.u32[i] = x.u16[i];
    return r.v;
}
static inline __m512i mxe_mm512_cvtepu8_epi32(__m128i a) {
    mxe_128 x = {a}; mxe_512 r;
    for (int i = 0; i < 16; i++) r.u32[i] = x.u8[i];
    return r.v;
}
static inline __m512i mxe_mm512_cvtepu8_epi16(__m256i a) {
    mxe_256 x = {a}; mxe_512 r;
    for (int i = 0; i < 32; i++) r.u16[i] = x.u8[i];
    return r.v;
}
static inline __m512i mxe_mm512_cvtepi8_epi32(__m128i a) {
    mxe_128 x = {a}; mxe_512 r;
    for (int i = 0; i < 16; i++) r.i32[i] = x.i8[i];
    return r.v;
}
/* vshufi64x2: 128-bit chunks 0, 1 of the result from a, 2, 3 from b, each chosen by two
 * bits of imm. */
static inline __m512i mxe_mm512_shuffle_i64x2(__m512i a, __m512i b, int imm) {
    mxe_512 x = {a}, y = {b}, r;
    for (int c = 0; c < 4; c++) memcpy(&r.u8[16 * c], &(c < 2 ? x : y).u8[16 * (imm >> (2 * c) & 3)], 16);
    return r.v;
}
/* Masked loads (zero where the mask is clear) and stores (memory untouched there): only
 * the selected elements are read or written. */
static inline __m512i mxe_mm512_maskz_loadu_epi32(__mmask16 k, const void *p) {
    mxe_512 r;
    memset(&r, 0, sizeof r);
    for (int i = 0; i < 16; i++)
        if (k >> i & 1) memcpy(&r.u32[i], (const uint8_t *)p + 4 * i, 4);
    return r.v;
}
static inline __m256i mxe_mm256_maskz_loadu_epi16(__mmask16 k, const void *p) {
    mxe_256 r;
    memset(&r, 0, sizeof r);
    for (int i = 0; i < 16; i++)
        if (k >> i & 1) memcpy(&r.u16[i], (const uint8_t *)p + 2 * i, 2);
    return r.v;
}
static inline __m256i mxe_mm256_maskz_loadu_epi8(__mmask32 k, const void *p) {
    mxe_256 r;
    memset(&r, 0, sizeof r);
    for (int i = 0; i < 32; i++)
        if (k >> i & 1) r.u8[i] = ((const uint8_t *)p)[i];
    return r.v;
}
static inline __m128i mxe_mm_maskz_loadu_epi8(__mmask16 k, const void *p) {
    mxe_128 r;
    memset(&r, 0, sizeof r);
    for (int i = 0; i < 16; i++)
        if (k >> i & 1) r.u8[i] = ((const uint8_t *)p)[i];
    return r.v;
}
static inline void mxe_mm256_mask_storeu_epi8(void *p, __mmask32 k, __m256i a) {
    mxe_256 x = {a};
    for (int i = 0; i < 32; i++)
        if (k >> i & 1) ((uint8_t *)p)[i] = x.u8[i];
}
static inline void mxe_mm256_mask_storeu_epi16(void *p, __mmask16 k, __m256i a) {
    mxe_256 x = {a};
    for (int i = 0; i < 16; i++)
        if (k >> i & 1) memcpy((uint8_t *)p + 2 * i, &x.u16[i], 2);
}
static inline void mxe_mm512_mask_storeu_epi32(void *p, __mmask16 k, __m512i a) {
    mxe_512 x = {a};
    for (int i = 0; i < 16; i++)
        if (k >> i & 1) memcpy((uint8_t *)p + 4 * i, &x.u32[i], 4);
}
static inline void mxe_mm512_mask_storeu_ps(void *p, __mmask16 k, __m512 a) {
    mxe_mm512_mask_storeu_epi32(p, k, _mm512_castps_si512(a));
}
/* Signed 16-bit compares into a mask (the masked form: clear where k is clear). */
static inline __mmask32 mxe_mm512_cmpgt_epi16_mask(__m512i a, __m512i b) {
    mxe_512 x = {a}, y = {b};
    uint32_t k = 0;
    for (int i = 0; i < 32; i++) k |= (uint32_t)(x.i16[i] > y.i16[i]) << i;
    return k;
}
static inline __mmask32 mxe_mm512_cmpeq_epi16_mask(__m512i a, __m512i b) {
    mxe_512 x = {a}, y = {b};
    uint32_t k = 0;
    for (int i = 0; i < 32; i++) k |= (uint32_t)(x.i16[i] == y.i16[i]) << i;
    return k;
}
static inline __mmask32 mxe_mm512_mask_cmplt_epi16_mask(__mmask32 m, __m512i a, __m512i b) {
    return m & mxe_mm512_cmpgt_epi16_mask(b, a);
}
/* Unsigned 16-bit compares into a mask. */
static inline __mmask32 mxe_mm512_cmpge_epu16_mask(__m512i a, __m512i b) {
    mxe_512 x = {a}, y = {b};
    uint32_t k = 0;
    for (int i = 0; i < 32; i++) k |= (uint32_t)(x.u16[i] >= y.u16[i]) << i;
    return k;
}
static inline __mmask32 mxe_mm512_cmpgt_epu16_mask(__m512i a, __m512i b) {
    mxe_512 x = {a}, y = {b};
    uint32_t k = 0;
    for (int i = 0; i < 32; i++) k |= (uint32_t)(x.u16[i] > y.u16[i]) << i;
    return k;
}
/* Unsigned 8-bit compares into a mask. */
static inline __mmask16 mxe_mm_cmpge_epu8_mask(__m128i a, __m128i b) {
    mxe_128 x = {a}, y = {b};
    uint32_t k = 0;
    for (int i = 0; i < 16; i++) k |= (uint32_t)(x.u8[i] >= y.u8[i]) << i;
    return (__mmask16)k;
}
static inline __mmask32 mxe_mm256_cmpge_epu8_mask(__m256i a, __m256i b) {
    mxe_256 x = {a}, y = {b};
    uint32_t k = 0;
    for (int i = 0; i < 32; i++) k |= (uint32_t)(x.u8[i] >= y.u8[i]) << i;
    return k;
}

/* vpgatherdd: lane i = the 32 bits at base + idx[i] * scale. */
static inline __m512i mxe_mm512_i32gather_epi32(__m512i idx, const void *base, int scale) {
    mxe_512 x = {idx}, r;
    for (int i = 0; i < 16; i++) memcpy(&r.u32[i], (const char *)base + (int64_t)x.i32[i] * scale, 4);
    return r.v;
}

/* The compiler's <immintrin.h> declares these too (as AVX-512 functions the AVX2 code
 * here could not call): the macros send every use to the definitions above. */
#define MXE_USE(name) mxe##name
#undef _mm512_cvtepi32_epi8
#define _mm512_cvtepi32_epi8 MXE_USE(_mm512_cvtepi32_epi8)
#undef _mm512_cvtepi32_epi16
#define _mm512_cvtepi32_epi16 MXE_USE(_mm512_cvtepi32_epi16)
#undef _mm512_cvtusepi16_epi8
#define _mm512_cvtusepi16_epi8 MXE_USE(_mm512_cvtusepi16_epi8)
#undef _mm512_cvtps_pd
#define _mm512_cvtps_pd MXE_USE(_mm512_cvtps_pd)
#undef _mm512_cvtepu16_epi32
#define _mm512_cvtepu16_epi32 MXE_USE(_mm512_cvtepu16_epi32)
#undef _mm512_cvtepu8_epi32
#define _mm512_cvtepu8_epi32 MXE_USE(_mm512_cvtepu8_epi32)
#undef _mm512_cvtepi8_epi32
#define _mm512_cvtepi8_epi32 MXE_USE(_mm512_cvtepi8_epi32)
#undef _mm512_cvtepu8_epi16
#define _mm512_cvtepu8_epi16 MXE_USE(_mm512_cvtepu8_epi16)
#undef _mm512_shuffle_i64x2
#define _mm512_shuffle_i64x2 MXE_USE(_mm512_shuffle_i64x2)
#undef _mm512_maskz_loadu_epi32
#define _mm512_maskz_loadu_epi32 MXE_USE(_mm512_maskz_loadu_epi32)
#undef _mm256_maskz_loadu_epi16
#define _mm256_maskz_loadu_epi16 MXE_USE(_mm256_maskz_loadu_epi16)
#undef _mm256_maskz_loadu_epi8
#define _mm256_maskz_loadu_epi8 MXE_USE(_mm256_maskz_loadu_epi8)
#undef _mm_maskz_loadu_epi8
#define _mm_maskz_loadu_epi8 MXE_USE(_mm_maskz_loadu_epi8)
#undef _mm256_mask_storeu_epi8
#define _mm256_mask_storeu_epi8 MXE_USE(_mm256_mask_storeu_epi8)
#undef _mm256_mask_storeu_epi16
#define _mm256_mask_storeu_epi16 MXE_USE(_mm256_mask_storeu_epi16)
#undef _mm512_mask_storeu_epi32
#define _mm512_mask_storeu_epi32 MXE_USE(_mm512_mask_storeu_epi32)
#undef _mm512_mask_storeu_ps
#define _mm512_mask_storeu_ps MXE_USE(_mm512_mask_storeu_ps)
#undef _mm512_cmpgt_epi16_mask
#define _mm512_cmpgt_epi16_mask MXE_USE(_mm512_cmpgt_epi16_mask)
#undef _mm512_cmpge_epu16_mask
#define _mm512_cmpge_epu16_mask MXE_USE(_mm512_cmpge_epu16_mask)
#undef _mm512_cmpgt_epu16_mask
#define _mm512_cmpgt_epu16_mask MXE_USE(_mm512_cmpgt_epu16_mask)
#undef _mm512_cmpeq_epi16_mask
#define _mm512_cmpeq_epi16_mask MXE_USE(_mm512_cmpeq_epi16_mask)
#undef _mm512_mask_cmplt_epi16_mask
#define _mm512_mask_cmplt_epi16_mask MXE_USE(_mm512_mask_cmplt_epi16_mask)
#undef _mm_cmpge_epu8_mask
#define _mm_cmpge_epu8_mask MXE_USE(_mm_cmpge_epu8_mask)
#undef _mm256_cmpge_epu8_mask
#define _mm256_cmpge_epu8_mask MXE_USE(_mm256_cmpge_epu8_mask)
#undef _mm512_i32gather_epi32
#define _mm512_i32gather_epi32 MXE_USE(_mm512_i32gather_epi32)

#endif   /* MXI_AVX512_SIMDE */

#endif
