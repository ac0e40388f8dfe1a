/* AVX2 kernels of the per-tensor element pass and amax (numerics/mx_internal.h),
 * bit-identical to the references (numerics/ref/scaled_ref.c). Eight lanes at a time; the
 * last partial vector goes through a zero-padded copy.
 *
 * FP8: fp32(|x| * scale) is the scalar product's magnitude (the same single rounding), and
 * fp8_grid_codes8 rounds it to the grid once it is clamped at twice the format's largest
 * value (Inf included), which still saturates and keeps the rounding constant finite. The
 * sign comes from x; NaN gets the format's NaN code without sign, as the reference.
 *
 * HiF8: y = fp32(x / scale), then the rounding tables (mxi_hif8_rounding, which explain the
 * arithmetic) by two gathers: |y|'s step by its binade, the code by the rounded binade. */
#include <immintrin.h>
#include <string.h>

#include "mxtrain/scaled.h"
#include "numerics/mx_internal.h"
#include "numerics/x86/fp8_avx2.h"

#define ALWAYS_INLINE static inline __attribute__((always_inline))
#define I32(v) _mm256_set1_epi32(v)

ALWAYS_INLINE __m256i abs8(__m256i v) { return _mm256_and_si256(v, I32(0x7FFFFFFF)); }

/* Unsigned a > b and a >= b on 32-bit lanes (no sign bit set in either here). */
ALWAYS_INLINE __m256i gt8(__m256i a, __m256i b) { return _mm256_cmpgt_epi32(a, b); }

/* Eight 32-bit codes (0..255) to 8 bytes. */
ALWAYS_INLINE uint64_t narrow8(__m256i c) {
    __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1));
    return (uint64_t)_mm_cvtsi128_si64(_mm_packus_epi16(w, w));
}

/* Runs codes8 over x[0..n), the tail through a padded copy. */
#define FOR_EACH_8(q, x, n, codes8)                                       \
    do {                                                                  \
        int64_t i_ = 0;                                                   \
        for (; i_ + 8 <= (n); i_ += 8) {                                  \
            uint64_t b_ = narrow8(codes8(_mm256_loadu_ps((x) + i_)));     \
            memcpy((q) + i_, &b_, 8);                                     \
        }                                                                 \
        if (i_ < (n)) {                                                   \
            float pad_[8] = {0};                                          \
            memcpy(pad_, (x) + i_, (size_t)((n) - i_) * sizeof(float));   \
            uint64_t b_ = narrow8(codes8(_mm256_loadu_ps(pad_)));         \
            memcpy((q) + i_, &b_, (size_t)((n) - i_));                    \
        }                                                                 \
    } while (0)

/* ---- FP8 ---- */

typedef struct {
    int mbits, bias, max_code;
    float clamp;
} fp8_spec;

ALWAYS_INLINE __m256i fp8_codes8(__m256 xf, __m256 scale, fp8_spec f) {
    __m256i x = _mm256_castps_si256(xf);
    __m256 a = _mm256_min_ps(_mm256_mul_ps(_mm256_castsi256_ps(abs8(x)), scale), _mm256_set1_ps(f.clamp));
    __m256i mag = _mm256_min_epu32(fp8_grid_codes8(a, f.mbits, f.bias), I32(f.max_code));
    __m256i code = _mm256_or_si256(mag, _mm256_and_si256(_mm256_srli_epi32(x, 24), I32(0x80)));
    return _mm256_blendv_epi8(code, I32(0x7F), gt8(abs8(x), I32(0x7F800000)));
}

#define E4M3_CODES(v) fp8_codes8(v, s, (fp8_spec){.mbits = 3, .bias = 7, .max_code = 0x7E, .clamp = 896.0f})
#define E5M2_CODES(v) fp8_codes8(v, s, (fp8_spec){.mbits = 2, .bias = 15, .max_code = 0x7B, .clamp = 114688.0f})

void mxi_encode_fp8_avx2(uint8_t *q, const float *x, int64_t n, float scale, const mx_elem_traits *t) {
    __m256 s = _mm256_set1_ps(scale);
    if (t->mbits == 3) FOR_EACH_8(q, x, n, E4M3_CODES);
    else FOR_EACH_8(q, x, n, E5M2_CODES);
}

/* Per-element scales: eight at a time, the tail's scales padded with ones. */
ALWAYS_INLINE void encode_fp8_vec(uint8_t *q, const float *x, int64_t n, const float *sv, fp8_spec f) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t b = narrow8(fp8_codes8(_mm256_loadu_ps(x + i), _mm256_loadu_ps(sv + i), f));
        memcpy(q + i, &b, 8);
    }
    if (i < n) {
        float xp[8] = {0}, sp[8] = {1, 1, 1, 1, 1, 1, 1, 1};
        memcpy(xp, x + i, (size_t)(n - i) * sizeof(float));
        memcpy(sp, sv + i, (size_t)(n - i) * sizeof(float));
        uint64_t b = narrow8(fp8_codes8(_mm256_loadu_ps(xp), _mm256_loadu_ps(sp), f));
        memcpy(q + i, &b, (size_t)(n - i));
    }
}

void mxi_encode_fp8_vec_avx2(uint8_t *q, const float *x, int64_t n, const float *scale, const mx_elem_traits *t) {
    if (t->mbits == 3) encode_fp8_vec(q, x, n, scale, (fp8_spec){.mbits = 3, .bias = 7, .max_code = 0x7E, .clamp = 896.0f});
    else encode_fp8_vec(q, x, n, scale, (fp8_spec){.mbits = 2, .bias = 15, .max_code = 0x7B, .clamp = 114688.0f});
}

/* ---- HiF8 ---- */

ALWAYS_INLINE __m256i hif8_codes8(__m256 xf, __m256 scale, const mxi_hif8_rounding *t) {
    __m256i y = _mm256_castps_si256(_mm256_div_ps(xf, scale));
    __m256i ab = abs8(y);
    __m256i step = _mm256_i32gather_epi32((const int *)t->step, _mm256_srli_epi32(ab, 23), 4);
    __m256i r = _mm256_add_epi32(ab, _mm256_andnot_si256(I32(31), step));
    __m256i code = _mm256_i32gather_epi32((const int *)t->code, _mm256_srli_epi32(r, 23), 4);
    code = _mm256_or_si256(code, _mm256_srlv_epi32(_mm256_and_si256(r, I32(0x7FFFFF)), _mm256_and_si256(step, I32(31))));
    code = _mm256_blendv_epi8(code, I32(0x6E), gt8(r, I32(MXI_HIF8_OVER_BITS - 1)));   // a NaN's r: blended below
    code = _mm256_or_si256(code, _mm256_and_si256(_mm256_srli_epi32(y, 24), I32(0x80)));
    code = _mm256_and_si256(code, gt8(ab, I32(MXI_HIF8_ZERO_BITS - 1)));
    return _mm256_blendv_epi8(code, I32(MX_HIF8_NAN), gt8(ab, I32(0x7F800000)));
}

#define HIF8_CODES(v) hif8_codes8(v, s, table)

void mxi_encode_hif8_avx2(uint8_t *q, const float *x, int64_t n, float scale) {
    const mxi_hif8_rounding *table = mxi_hif8_rounding_table();
    __m256 s = _mm256_set1_ps(scale);
    FOR_EACH_8(q, x, n, HIF8_CODES);
}

/* ---- amax ---- */

uint32_t mxi_amax_bits_avx2(const float *x, int64_t n) {
    __m256i m = _mm256_setzero_si256();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) m = _mm256_max_epi32(m, abs8(_mm256_loadu_si256((const __m256i *)(x + i))));
    uint32_t r[8], best = 0;
    _mm256_storeu_si256((__m256i *)r, m);
    for (int k = 0; k < 8; k++) best = r[k] > best ? r[k] : best;
    for (; i < n; i++) {
        uint32_t v = mxi_f32_bits(x[i]) & 0x7FFFFFFFu;
        best = v > best ? v : best;
    }
    return best;
}

/* Four vectors of columns at a time down all rows, the accumulators in registers. */
void mxi_amax_bits_cols_avx2(uint32_t *m, const float *x, int64_t rows, int64_t cols) {
    int64_t c = 0;
    for (; c + 32 <= cols; c += 32) {
        __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
        for (int64_t r = 0; r < rows; r++) {
            const __m256i *p = (const __m256i *)(x + r * cols + c);
            a0 = _mm256_max_epu32(a0, abs8(_mm256_loadu_si256(p)));
            a1 = _mm256_max_epu32(a1, abs8(_mm256_loadu_si256(p + 1)));
            a2 = _mm256_max_epu32(a2, abs8(_mm256_loadu_si256(p + 2)));
            a3 = _mm256_max_epu32(a3, abs8(_mm256_loadu_si256(p + 3)));
        }
        __m256i *o = (__m256i *)(m + c);
        _mm256_storeu_si256(o, a0), _mm256_storeu_si256(o + 1, a1), _mm256_storeu_si256(o + 2, a2), _mm256_storeu_si256(o + 3, a3);
    }
    for (; c + 8 <= cols; c += 8) {
        __m256i a = _mm256_setzero_si256();
        for (int64_t r = 0; r < rows; r++) a = _mm256_max_epu32(a, abs8(_mm256_loadu_si256((const __m256i *)(x + r * cols + c))));
        _mm256_storeu_si256((__m256i *)(m + c), a);
    }
    for (; c < cols; c++) {
        uint32_t a = 0;
        for (int64_t r = 0; r < rows; r++) {
            uint32_t v = mxi_f32_bits(x[r * cols + c]) & 0x7FFFFFFFu;
            a = v > a ? v : a;
        }
        m[c] = a;
    }
}

float mxi_amax_avx2(const float *x, int64_t n) {
    __m256i m = _mm256_setzero_si256();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i v = abs8(_mm256_loadu_si256((const __m256i *)(x + i)));
        m = _mm256_max_epi32(m, _mm256_andnot_si256(gt8(v, I32(0x7F800000)), v));   // NaN: 0
    }
    uint32_t r[8];
    _mm256_storeu_si256((__m256i *)r, m);
    uint32_t best = 0;
    for (int k = 0; k < 8; k++) best = r[k] > best ? r[k] : best;
    for (; i < n; i++) {
        uint32_t v = mxi_f32_bits(x[i]) & 0x7FFFFFFFu;
        if (v <= 0x7F800000u && v > best) best = v;
    }
    return mxi_bits_f32(best);
}

/* ---- rows: the row kernels above, row by row ---- */

MXI_ROWS_BY_ROW(avx2)
