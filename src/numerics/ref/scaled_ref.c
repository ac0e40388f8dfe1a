/* Scalar references of the per-tensor and per-block scalings (include/mxtrain/scaled.h):
 * TransformerEngine's current scaling (recipe_common.cuh) and MindSpeed's HiF8 per-tensor
 * scaling. */
#include <float.h>
#include <math.h>

#include "core/bits.h"
#include "mxtrain/scaled.h"

float mx_amax_f32(const float *x, int64_t n) {
    float amax = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        if (a > amax) amax = a;   // false for NaN: NaN is ignored, as TE's fmaxf
    }
    return amax;
}

float mx_fp8_scale_from_amax(float amax, mx_elem elem, mx_tscale_mode mode) {
    const mx_elem_traits *t = mx_elem_traits_of(elem);
    if (!t || !(amax > 0.0f) || isinf(amax)) return 1.0f;   // 0, Inf, NaN (and no format)
    float scale = t->max / amax;
    if (isinf(scale)) scale = FLT_MAX;
    // Power of two: keep the sign and exponent bits, an exact floor (scale >= 448/FLT_MAX
    // is normal, so the exponent is never zero).
    if (mode == MX_TSCALE_POW2) scale = mxi_bits_f32(mxi_f32_bits(scale) & 0xFF800000u);
    return scale;
}

static int check_sizes(int64_t rows, int64_t cols) {
    if (rows < 0 || cols < 0) return MX_ESIZE;
    if (cols > 0 && rows > INT64_MAX / cols) return MX_ESIZE;
    return 0;
}

int mx_fp8_quantize_tensor_f32(const float *x, int64_t n, mx_elem elem, mx_tscale_mode mode,
                               uint8_t *q, float *scale_inv) {
    if (!scale_inv || (n > 0 && (!x || !q))) return MX_ENULL;
    if (n < 0) return MX_ESIZE;
    if (!mx_elem_traits_of(elem) || (mode != MX_TSCALE_FP32 && mode != MX_TSCALE_POW2)) return MX_EENUM;
    float scale = mx_fp8_scale_from_amax(mx_amax_f32(x, n), elem, mode);
    for (int64_t i = 0; i < n; i++) q[i] = mx_f32_to_fp8(x[i] * scale, elem);
    *scale_inv = 1.0f / scale;
    return 0;
}

int mx_fp8_quantize_blocks_f32(const float *x, int64_t rows, int64_t cols, int64_t brows,
                               int64_t bcols, mx_elem elem, mx_tscale_mode mode, uint8_t *q,
                               float *scale_inv) {
    int rc = check_sizes(rows, cols);
    if (rc) return rc;
    if (brows < 1 || bcols < 1) return MX_ESIZE;
    if (rows * cols > 0 && (!x || !q || !scale_inv)) return MX_ENULL;
    if (!mx_elem_traits_of(elem) || (mode != MX_TSCALE_FP32 && mode != MX_TSCALE_POW2)) return MX_EENUM;
    int64_t nbc = (cols + bcols - 1) / bcols;
    for (int64_t r0 = 0; r0 < rows; r0 += brows) {
        int64_t r1 = r0 + brows < rows ? r0 + brows : rows;
        for (int64_t c0 = 0; c0 < cols; c0 += bcols) {
            int64_t c1 = c0 + bcols < cols ? c0 + bcols : cols;
            float amax = 0.0f;
            for (int64_t r = r0; r < r1; r++) {
                float a = mx_amax_f32(x + r * cols + c0, c1 - c0);
                if (a > amax) amax = a;
            }
            float scale = mx_fp8_scale_from_amax(amax, elem, mode);
            for (int64_t r = r0; r < r1; r++)
                for (int64_t c = c0; c < c1; c++) q[r * cols + c] = mx_f32_to_fp8(x[r * cols + c] * scale, elem);
            scale_inv[(r0 / brows) * nbc + c0 / bcols] = 1.0f / scale;
        }
    }
    return 0;
}

float mx_hif8_scale_from_amax(float amax, float target) {
    // MindSpeed multiplies by the fp32 reciprocal of the target; a scale of 0 or a
    // non-finite one would turn every element into NaN, so those tensors keep scale 1.
    float scale = amax * (1.0f / target);
    return !(scale > 0.0f) || isinf(scale) ? 1.0f : scale;
}

int mx_hif8_quantize_tensor_f32(const float *x, int64_t n, float target, uint8_t *q,
                                float *scale_inv) {
    if (!scale_inv || (n > 0 && (!x || !q))) return MX_ENULL;
    if (n < 0) return MX_ESIZE;
    uint8_t tc = mx_f32_to_hif8(target, MX_HIF8_OVERFLOW_INF);
    if (!(target > 0.0f) || isinf(target) || mx_hif8_to_f32(tc) != target) return MX_EINVAL;
    float scale = mx_hif8_scale_from_amax(mx_amax_f32(x, n), target);
    for (int64_t i = 0; i < n; i++) q[i] = mx_f32_to_hif8(x[i] / scale, MX_HIF8_SATURATE);
    *scale_inv = scale;
    return 0;
}
