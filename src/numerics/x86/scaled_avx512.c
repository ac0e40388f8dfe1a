/* AVX-512 (F, BW, VL) kernels of the per-tensor element pass and amax, bit-identical to the
 * references (numerics/ref/scaled_ref.c); the algorithms are the AVX2 kernels'
 * (numerics/x86/scaled_avx2.c, whose comments explain them) on 16 lanes, with masked loads
 * and stores for the last partial vector. Built on SIMDe with MXI_AVX512_SIMDE, as the MX
 * kernels (numerics/x86/simd512.h). */
#include <string.h>

#include "core/bits.h"
#include "mxtrain/scaled.h"
#include "numerics/mx_internal.h"
#include "numerics/x86/fp8_avx512.h"

#define ALWAYS_INLINE static inline __attribute__((always_inline))
#define I32(v) _mm512_set1_epi32(v)

ALWAYS_INLINE __m512i abs16(__m512i v) { return _mm512_and_si512(v, I32(0x7FFFFFFF)); }

ALWAYS_INLINE __mmask16 first16(int64_t n) { return (__mmask16)(n >= 16 ? 0xFFFF : (1u << n) - 1); }

/* a > b on lanes without the sign bit (|x| bits, small indices): the signed compare. */
ALWAYS_INLINE __mmask16 gt16(__m512i a, __m512i b) { return _mm512_cmpgt_epi32_mask(a, b); }

/* The first n < 16 of 16 codes to dst. */
ALWAYS_INLINE void store_tail(uint8_t *dst, __m128i v, int64_t n) {
    uint8_t tmp[16];
    _mm_storeu_si128((__m128i *)tmp, v);
    memcpy(dst, tmp, (size_t)n);
}

/* ---- FP8 ---- */

typedef struct {
    int mbits, bias, max_code;
    float clamp;   // twice the largest value: saturates, and keeps the rounding constant finite
    float max;     // the largest value
} fp8_spec;

ALWAYS_INLINE __m128i fp8_codes16(__m512i x, __m512 scale, fp8_spec f) {
    __m512 a = _mm512_min_ps(_mm512_mul_ps(_mm512_castsi512_ps(abs16(x)), scale), _mm512_set1_ps(f.clamp));
    __m512i mag = _mm512_min_epu32(fp8_grid_codes16(a, f.mbits, f.bias), I32(f.max_code));
    __m512i code = _mm512_or_si512(mag, _mm512_and_si512(_mm512_srli_epi32(x, 24), I32(0x80)));
    code = _mm512_mask_mov_epi32(code, gt16(abs16(x), I32(0x7F800000)), I32(0x7F));
    return _mm512_cvtepi32_epi8(code);
}

/* One scale for all (sv NULL) or one per element (sv[i]). */
ALWAYS_INLINE void encode_fp8(uint8_t *q, const float *x, int64_t n, float scale, const float *sv, fp8_spec f) {
    __m512 s = _mm512_set1_ps(scale);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm_storeu_si128((__m128i *)(q + i), fp8_codes16(_mm512_loadu_si512(x + i), sv ? _mm512_loadu_ps(sv + i) : s, f));
    if (i < n) {
        __mmask16 m = first16(n - i);
        __m512 si = sv ? _mm512_castsi512_ps(_mm512_maskz_loadu_epi32(m, sv + i)) : s;
        store_tail(q + i, fp8_codes16(_mm512_maskz_loadu_epi32(m, x + i), si, f), n - i);
    }
}

#define E4M3 ((fp8_spec){.mbits = 3, .bias = 7, .max_code = 0x7E, .clamp = 896.0f, .max = 448.0f})
#define E5M2 ((fp8_spec){.mbits = 2, .bias = 15, .max_code = 0x7B, .clamp = 114688.0f, .max = 57344.0f})

void mxi_encode_fp8_avx512(uint8_t *q, const float *x, int64_t n, float scale, const mx_elem_traits *t) {
    if (t->mbits == 3) encode_fp8(q, x, n, scale, NULL, E4M3);
    else encode_fp8(q, x, n, scale, NULL, E5M2);
}

/* Row after row, each row's loop inlined: short rows (a head's or a hidden state's width)
 * pay no call each; the same for the next. */
void mxi_encode_fp8_rows_avx512(uint8_t *q, const float *x, int64_t rows, int64_t cols, const float *scale,
                                const mx_elem_traits *t) {
    if (t->mbits == 3)
        for (int64_t r = 0; r < rows; r++) encode_fp8(q + r * cols, x + r * cols, cols, scale[r], NULL, E4M3);
    else
        for (int64_t r = 0; r < rows; r++) encode_fp8(q + r * cols, x + r * cols, cols, scale[r], NULL, E5M2);
}

void mxi_encode_fp8_cols_avx512(uint8_t *q, const float *x, int64_t rows, int64_t cols, const float *scale,
                                const mx_elem_traits *t) {
    if (t->mbits == 3)
        for (int64_t r = 0; r < rows; r++) encode_fp8(q + r * cols, x + r * cols, cols, 1.0f, scale, E4M3);
    else
        for (int64_t r = 0; r < rows; r++) encode_fp8(q + r * cols, x + r * cols, cols, 1.0f, scale, E5M2);
}

void mxi_encode_fp8_vec_avx512(uint8_t *q, const float *x, int64_t n, const float *scale, const mx_elem_traits *t) {
    if (t->mbits == 3) encode_fp8(q, x, n, 1.0f, scale, E4M3);
    else encode_fp8(q, x, n, 1.0f, scale, E5M2);
}

/* ---- FP8 values as bf16 (values16_fp8_*) ----
 *
 * The code's rounding without the code: a = min(|x| s, clamp) goes to the format's grid by
 * fp8_grid_codes16's constant c (a power of two whose ulp is the grid's step there, so a + c
 * rounds to nearest even onto the grid and the - c after is exact), saturates at the largest
 * value, and the scale comes off exactly: 1/s is a power of two whose bits are 0x7F000000 less
 * s's, and the product has at most 4 significant bits, normal by the kernels' contract. Then
 * the sign, the canonical NaN, and the top halves (exact). */
ALWAYS_INLINE __m512i value_bits16(__m512i x, __m512 s, __m512 sinv, fp8_spec f) {
    __m512 a = _mm512_min_ps(_mm512_mul_ps(_mm512_castsi512_ps(abs16(x)), s), _mm512_set1_ps(f.clamp));
    __m512i e = _mm512_max_epi32(_mm512_and_si512(_mm512_castps_si512(a), I32(0x7F800000)), I32((128 - f.bias) << 23));
    __m512 c = _mm512_castsi512_ps(_mm512_add_epi32(e, I32((23 - f.mbits) << 23)));
    __m512 r = _mm512_min_ps(_mm512_sub_ps(_mm512_add_ps(a, c), c), _mm512_set1_ps(f.max));
    __m512i v = _mm512_or_si512(_mm512_castps_si512(_mm512_mul_ps(r, sinv)), _mm512_and_si512(x, I32((int)0x80000000)));
    return _mm512_mask_mov_epi32(v, gt16(abs16(x), I32(0x7F800000)), I32((int)MXI_CANONICAL_NAN));
}

ALWAYS_INLINE __m512 inverse_pow2(__m512 s) {
    return _mm512_castsi512_ps(_mm512_sub_epi32(I32(0x7F000000), _mm512_castps_si512(s)));
}

/* n values of x with one scale (sv NULL) or one per element (sv[i]); 32 a store. */
ALWAYS_INLINE void values16(uint16_t *y, const float *x, int64_t n, float scale, const float *sv, fp8_spec f) {
    __m512 s = _mm512_set1_ps(scale), sinv = inverse_pow2(s);
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512 s0 = s, s1 = s, i0 = sinv, i1 = sinv;
        if (sv) {
            s0 = _mm512_loadu_ps(sv + i), s1 = _mm512_loadu_ps(sv + i + 16);
            i0 = inverse_pow2(s0), i1 = inverse_pow2(s1);
        }
        __m512i v0 = value_bits16(_mm512_loadu_si512(x + i), s0, i0, f);
        __m512i v1 = value_bits16(_mm512_loadu_si512(x + i + 16), s1, i1, f);
        _mm512_storeu_si512(y + i, fp8_halves32(v0, v1, 1));
    }
    for (; i < n; i += 16) {   // the last 16 or fewer
        __mmask16 m = first16(n - i);
        __m512 si = s, ii = sinv;
        if (sv) si = _mm512_castsi512_ps(_mm512_maskz_loadu_epi32(m, sv + i)), ii = inverse_pow2(si);
        __m512i v = value_bits16(_mm512_maskz_loadu_epi32(m, x + i), si, ii, f);
        _mm256_mask_storeu_epi16(y + i, m, _mm512_cvtepi32_epi16(_mm512_srli_epi32(v, 16)));
    }
}

void mxi_values16_fp8_blocks_avx512(uint16_t *y, const float *x, int64_t rows, int64_t cols, int64_t bcols,
                                    const float *scale, const mx_elem_traits *t) {
    int64_t nbc = (cols + bcols - 1) / bcols;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0, b = r * nbc; c < cols; c += bcols, b++) {
            int64_t n = cols - c < bcols ? cols - c : bcols;
            if (t->mbits == 3) values16(y + r * cols + c, x + r * cols + c, n, scale[b], NULL, E4M3);
            else values16(y + r * cols + c, x + r * cols + c, n, scale[b], NULL, E5M2);
        }
}

void mxi_values16_fp8_cols_avx512(uint16_t *y, const float *x, int64_t rows, int64_t cols, const float *scale,
                                  const mx_elem_traits *t) {
    if (t->mbits == 3)
        for (int64_t r = 0; r < rows; r++) values16(y + r * cols, x + r * cols, cols, 1.0f, scale, E4M3);
    else
        for (int64_t r = 0; r < rows; r++) values16(y + r * cols, x + r * cols, cols, 1.0f, scale, E5M2);
}

/* ---- HiF8 ----
 *
 * HiF8 rounds ties away from zero, so a code depends on the kept bits and the first dropped
 * one only: at most 3 mantissa bits are kept, so the top 16 bits of y (bf16's 7 fraction
 * bits) decide it, exponents and all; y is a quotient, and a NaN quotient is quiet (bit 22
 * set), so its top bits are a NaN's too. The rounding tables (mxi_hif8_rounding) then work
 * on 16-bit lanes, 32 values a vector: with a = |y|'s top bits, step16[a >> 7] =
 * (1 << (sh - 1)) | sh where sh = 7 - the mantissa bits kept (the 32-bit table's sh less
 * 16, at least 4: the low 3 bits hold it), r = a + (1 << (sh - 1)), code = code[r >> 7] |
 * ((r & 0x7F) >> sh); r >= MXI_HIF8_OVER_BITS >> 16 saturates. */

typedef struct {
    __m512i step;                // step16 for the exponent fields 111 + i, i = 0..31 (2^-16 and below: the same)
    __m512i code_lo, code_hi;    // code[104 + j], j = 0..63
} hif8_regs;

ALWAYS_INLINE __m256i hif8_codes32(__m512i y0, __m512i y1, const hif8_regs *t) {
    __m512i y = fp8_halves32(y0, y1, true);
    __m512i ab = _mm512_and_si512(y, _mm512_set1_epi16(0x7FFF));
    __m512i i = _mm512_max_epi16(_mm512_sub_epi16(_mm512_srli_epi16(ab, 7), _mm512_set1_epi16(111)), _mm512_setzero_si512());
    __m512i step = _mm512_permutexvar_epi16(i, t->step);   // from 2^16 up: any, it saturates
    __m512i r = _mm512_add_epi16(ab, _mm512_andnot_si512(_mm512_set1_epi16(7), step));
    __m512i j = _mm512_sub_epi16(_mm512_srli_epi16(r, 7), _mm512_set1_epi16(104));   // outside 0..38: overwritten below
    __m512i code = _mm512_permutex2var_epi16(t->code_lo, j, t->code_hi);
    code = _mm512_or_si512(code, _mm512_srlv_epi16(_mm512_and_si512(r, _mm512_set1_epi16(0x7F)),
                                                   _mm512_and_si512(step, _mm512_set1_epi16(7))));
    code = _mm512_mask_mov_epi16(code, _mm512_cmpge_epu16_mask(r, _mm512_set1_epi16(MXI_HIF8_OVER_BITS >> 16)),
                                 _mm512_set1_epi16(0x6E));
    code = _mm512_ternarylogic_epi32(code, _mm512_srli_epi16(y, 8), _mm512_set1_epi16(0x80), 0xF8);   // code | (sign & 0x80)
    code = _mm512_maskz_mov_epi16(_mm512_cmpge_epu16_mask(ab, _mm512_set1_epi16(MXI_HIF8_ZERO_BITS >> 16)), code);
    code = _mm512_mask_mov_epi16(code, _mm512_cmpgt_epu16_mask(ab, _mm512_set1_epi16(0x7F80)), _mm512_set1_epi16(MX_HIF8_NAN));
    return _mm512_cvtepi16_epi8(code);
}

void mxi_encode_hif8_avx512(uint8_t *q, const float *x, int64_t n, float scale) {
    const mxi_hif8_rounding *rt = mxi_hif8_rounding_table();
    uint16_t step[32], code[64];
    for (int i = 0; i < 32; i++) {
        uint32_t st = rt->step[111 + i];
        step[i] = (uint16_t)((st & ~31u) >> 16 | ((st & 31u) - 16));
    }
    for (int j = 0; j < 64; j++) code[j] = (uint16_t)rt->code[104 + j];
    hif8_regs t = {.step = _mm512_loadu_si512(step), .code_lo = _mm512_loadu_si512(code),
                   .code_hi = _mm512_loadu_si512(code + 32)};
    __m512 s = _mm512_set1_ps(scale);
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512i y0 = _mm512_castps_si512(_mm512_div_ps(_mm512_loadu_ps(x + i), s));
        __m512i y1 = _mm512_castps_si512(_mm512_div_ps(_mm512_loadu_ps(x + i + 16), s));
        _mm256_storeu_si256((__m256i *)(q + i), hif8_codes32(y0, y1, &t));
    }
    if (i < n) {   // zero-filled lanes past the end make codes that are not stored
        uint8_t tmp[32];
        __m512i y0 = _mm512_castps_si512(_mm512_div_ps(_mm512_castsi512_ps(_mm512_maskz_loadu_epi32(first16(n - i), x + i)), s));
        __m512i y1 = _mm512_castps_si512(_mm512_div_ps(
            _mm512_castsi512_ps(_mm512_maskz_loadu_epi32(n - i > 16 ? first16(n - i - 16) : 0, x + i + 16)), s));
        _mm256_storeu_si256((__m256i *)tmp, hif8_codes32(y0, y1, &t));
        memcpy(q + i, tmp, (size_t)(n - i));
    }
}

/* ---- amax ---- */

/* The largest of 16 lanes' bits (no sign bits). */
ALWAYS_INLINE uint32_t max16(__m512i m) {
    __m256i h = _mm256_max_epu32(_mm512_castsi512_si256(m), _mm512_extracti64x4_epi64(m, 1));
    __m128i v = _mm_max_epu32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    v = _mm_max_epu32(v, _mm_shuffle_epi32(v, 0x4E));
    v = _mm_max_epu32(v, _mm_shuffle_epi32(v, 0xB1));
    return (uint32_t)_mm_cvtsi128_si32(v);
}

ALWAYS_INLINE uint32_t amax_bits(const float *x, int64_t n) {
    __m512i m = _mm512_setzero_si512();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) m = _mm512_max_epu32(m, abs16(_mm512_loadu_si512(x + i)));
    if (i < n) m = _mm512_max_epu32(m, abs16(_mm512_maskz_loadu_epi32(first16(n - i), x + i)));
    return max16(m);
}

uint32_t mxi_amax_bits_avx512(const float *x, int64_t n) { return amax_bits(x, n); }

void mxi_amax_bits_rows_avx512(uint32_t *m, const float *x, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) m[r] = amax_bits(x + r * cols, cols);
}

/* Four vectors of columns at a time down all rows, the accumulators in registers; the last
 * columns with masked loads. */
void mxi_amax_bits_cols_avx512(uint32_t *m, const float *x, int64_t rows, int64_t cols) {
    int64_t c = 0;
    for (; c + 64 <= cols; c += 64) {
        __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
        for (int64_t r = 0; r < rows; r++) {
            const float *p = x + r * cols + c;
            a0 = _mm512_max_epu32(a0, abs16(_mm512_loadu_si512(p)));
            a1 = _mm512_max_epu32(a1, abs16(_mm512_loadu_si512(p + 16)));
            a2 = _mm512_max_epu32(a2, abs16(_mm512_loadu_si512(p + 32)));
            a3 = _mm512_max_epu32(a3, abs16(_mm512_loadu_si512(p + 48)));
        }
        _mm512_storeu_si512(m + c, a0), _mm512_storeu_si512(m + c + 16, a1);
        _mm512_storeu_si512(m + c + 32, a2), _mm512_storeu_si512(m + c + 48, a3);
    }
    for (; c < cols; c += 16) {
        __mmask16 k = first16(cols - c);
        __m512i a = _mm512_setzero_si512();
        for (int64_t r = 0; r < rows; r++) a = _mm512_max_epu32(a, abs16(_mm512_maskz_loadu_epi32(k, x + r * cols + c)));
        _mm512_mask_storeu_epi32(m + c, k, a);
    }
}

float mxi_amax_avx512(const float *x, int64_t n) {
    __m512i m = _mm512_setzero_si512();
    for (int64_t i = 0; i < n; i += 16) {
        __m512i v = abs16(i + 16 <= n ? _mm512_loadu_si512(x + i) : _mm512_maskz_loadu_epi32(first16(n - i), x + i));
        m = _mm512_max_epu32(m, _mm512_maskz_mov_epi32(~gt16(v, I32(0x7F800000)), v));   // NaN: 0
    }
    return mxi_bits_f32(max16(m));
}
