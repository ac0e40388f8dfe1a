/* Reference kernels of the per-tensor and per-block scalings' element pass and amax
 * (numerics/mx_internal.h): plain scalar code, one element at a time, through the codecs
 * of numerics/formats.c and numerics/hif8.c. Every other kernel must match them bit for
 * bit. */
#include <math.h>

#include "core/bits.h"
#include "mxtrain/scaled.h"
#include "numerics/mx_internal.h"

void mxi_encode_fp8_ref(uint8_t *q, const float *x, int64_t n, float scale, const mx_elem_traits *t) {
    for (int64_t i = 0; i < n; i++) q[i] = t->from_f32(x[i] * scale);
}

void mxi_encode_fp8_vec_ref(uint8_t *q, const float *x, int64_t n, const float *scale, const mx_elem_traits *t) {
    for (int64_t i = 0; i < n; i++) q[i] = t->from_f32(x[i] * scale[i]);
}

/* The bf16 of the value of x's code at scale s, the scale taken off again (values16_fp8_*). */
static uint16_t value16(float x, float s, const mx_elem_traits *t) {
    float v = t->to_f32(t->from_f32(x * s));
    return v != v ? (uint16_t)(MXI_CANONICAL_NAN >> 16) : mxi_f32_to_bf16(v / s);
}

void mxi_values16_fp8_blocks_ref(uint16_t *y, const float *x, int64_t rows, int64_t cols, int64_t bcols,
                                 const float *scale, const mx_elem_traits *t) {
    int64_t nbc = (cols + bcols - 1) / bcols;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) y[r * cols + c] = value16(x[r * cols + c], scale[r * nbc + c / bcols], t);
}

void mxi_values16_fp8_cols_ref(uint16_t *y, const float *x, int64_t rows, int64_t cols, const float *scale,
                               const mx_elem_traits *t) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) y[r * cols + c] = value16(x[r * cols + c], scale[c], t);
}

void mxi_encode_hif8_ref(uint8_t *q, const float *x, int64_t n, float scale) {
    for (int64_t i = 0; i < n; i++) q[i] = mx_f32_to_hif8(x[i] / scale, MX_HIF8_SATURATE);
}

uint32_t mxi_amax_bits_ref(const float *x, int64_t n) {
    uint32_t amax = 0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t a = mxi_f32_bits(x[i]) & 0x7FFFFFFFu;
        if (a > amax) amax = a;
    }
    return amax;
}

void mxi_amax_bits_cols_ref(uint32_t *m, const float *x, int64_t rows, int64_t cols) {
    for (int64_t c = 0; c < cols; c++) m[c] = 0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            uint32_t a = mxi_f32_bits(x[r * cols + c]) & 0x7FFFFFFFu;
            if (a > m[c]) m[c] = a;
        }
}

float mxi_amax_ref(const float *x, int64_t n) {
    float amax = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        if (a > amax) amax = a;   // false for NaN: NaN is ignored, as TE's fmaxf
    }
    return amax;
}

MXI_ROWS_BY_ROW(ref)
