/* Axiswise (per-row or per-column) FP8 scaling as torchao's float8 rowwise recipes
 * (torchao/float8/float8_utils.py amax_to_scale, float8_scaling_utils.py): the scale is the
 * fp32 rounding of fp8_max / max(amax, 1e-12) divided in float64, optionally rounded down to
 * a power of two as exp2(floor(log2(scale))) with log2 rounded to fp32; elements are
 * fp8_RNE(clamp(fp32(x * scale), -max, max)). amax propagates NaN (torch.amax). The
 * element passes run on the chosen kernel table (numerics/mx_internal.h). */
#include <math.h>
#include <omp.h>
#include <stdbool.h>

#include "mxtrain/scaled.h"
#include "numerics/mx_internal.h"

/* torchao's EPS: amax is clamped to at least this before the division. */
#define TORCHAO_AMAX_EPS 1e-12

/* The scale of amax for format t (the public function's, without the lookup). */
static float scale_from_amax(float amax, const mx_elem_traits *t, mx_tscale_mode mode) {
    double a = (double)amax;
    if (a < TORCHAO_AMAX_EPS) a = TORCHAO_AMAX_EPS;   // false for NaN: NaN stays (torch.clamp)
    float scale = (float)((double)t->max / a);       // Inf amax gives 0
    if (mode != MX_TSCALE_POW2 || isnan(scale)) return scale;
    // log2 of an fp32 tensor is an fp32: just below 2^k it rounds up to k, and the scale
    // becomes 2^k (above the fp32 scale, as torchao's). log2(0) = -Inf gives exp2 = 0.
    // A normal scale 2^e * m whose m is below 2 - 2^-15 has log2 at least 2^-16 below e + 1,
    // more than half an fp32 ulp of any |e + 1| <= 128: its floor is e, without the log2.
    uint32_t b = mxi_f32_bits(scale);
    if ((b & 0x7F800000u) != 0 && (b & 0x7F800000u) != 0x7F800000u && (b & 0x7FFFFFu) < 0x7FFF00u)
        return mxi_bits_f32(b & 0x7F800000u);
    float l = (float)log2((double)scale);
    return exp2f(floorf(l));
}

float mx_torchao_scale_from_amax(float amax, mx_elem elem, mx_tscale_mode mode) {
    const mx_elem_traits *t = mx_elem_traits_of(elem);
    return t ? scale_from_amax(amax, t, mode) : NAN;
}

/* The amax from amax_bits' result b for the n values x: the first NaN's if there is one
 * (torch.amax), looked for again when b says so. */
static float amax_nan(uint32_t b, const float *x, int64_t n) {
    if (b <= 0x7F800000u) return mxi_bits_f32(b);
    for (int64_t i = 0; i < n; i++)
        if (isnan(x[i])) return fabsf(x[i]);
    return NAN;   // not reached: the kernel saw one
}

/* torchao's to_fp8_saturated: clamp to +/-max (NaN passes), then the RNE cast. The kernels'
 * saturating casts give the same codes where the scale is positive and finite; a scale of
 * 0 (an Inf amax) or NaN (a NaN amax) goes through this. */
static uint8_t cast(float v, float max, mx_elem elem) {
    if (v > max) v = max;
    else if (v < -max) v = -max;
    return mx_f32_to_fp8(v, elem);
}

static bool kernel_scale(float s) { return s > 0.0f && !isinf(s); }

/* Row r of x (rows, cols) encoded with quantization scale s. */
static void encode_row(const float *x, int64_t cols, int64_t r, mx_elem elem, const mx_elem_traits *t, float s,
                       uint8_t *q, const mxi_mx_kernels *k) {
    const float *xr = x + r * cols;
    if (kernel_scale(s) && cols > (1 << 16)) {   // a long line (a whole tensor) splits over threads
        mx_fp8_encode_f32(xr, cols, elem, s, q + r * cols);   // cannot fail: s is positive and finite
        return;
    }
    if (kernel_scale(s)) {
        k->encode_fp8(q + r * cols, xr, cols, s, t);
        return;
    }
    for (int64_t c = 0; c < cols; c++) q[r * cols + c] = cast(xr[c] * s, t->max, elem);
}

/* Where the elements go: codes into q, or (y16 set) their values as bf16 with the scales
 * taken off (values16_fp8_*), when the scales fit (mxi_values16_fit). */
typedef struct {
    uint8_t *q;
    uint16_t *y16;
} line_out;

/* Rows [r0, r1) of x (rows, cols): each row's amax, then the scales, the codes (or values)
 * and the dequantization scales, each a pass over the rows (the kernels take all rows in one
 * call). False: values asked for and a scale that does not fit (only the scales written). */
static bool quantize_rows(const float *x, int64_t cols, int64_t r0, int64_t r1, mx_elem elem, mx_tscale_mode mode,
                          const line_out *out, float *scale_inv) {
    const mx_elem_traits *t = mx_elem_traits_of(elem);
    const mxi_mx_kernels *k = mxi_mx_kernels_of(MX_KERNEL_AUTO);
    float *s = scale_inv + r0;
    uint32_t *bits = (uint32_t *)(void *)s;   // the amaxes' bits, for now
    k->amax_bits_rows(bits, x + r0 * cols, r1 - r0, cols);
    bool all_kernel = cols <= (1 << 16);
    for (int64_t i = 0; i < r1 - r0; i++) {
        s[i] = scale_from_amax(amax_nan(bits[i], x + (r0 + i) * cols, cols), t, mode);
        all_kernel = all_kernel && kernel_scale(s[i]);
    }
    if (out->y16 && !(all_kernel && mxi_values16_fit(t, s, r1 - r0))) return false;
    if (out->y16) k->values16_fp8_blocks(out->y16 + r0 * cols, x + r0 * cols, r1 - r0, cols, cols, s, t);
    else if (all_kernel) k->encode_fp8_rows(out->q + r0 * cols, x + r0 * cols, r1 - r0, cols, s, t);
    else
        for (int64_t r = r0; r < r1; r++) encode_row(x, cols, r, elem, t, scale_inv[r], out->q, k);
    for (int64_t r = r0; r < r1; r++) scale_inv[r] = 1.0f / scale_inv[r];   // torchao hands torch._scaled_mm the reciprocal
    return true;
}

/* Rows [r, r + n) of x (rows, cols) with one scale per column into out (every scale one the
 * kernels take). */
static void cols_band(const float *x, int64_t r, int64_t n, int64_t cols, const mx_elem_traits *t, const float *scale,
                      const line_out *out) {
    const mxi_mx_kernels *k = mxi_mx_kernels_of(MX_KERNEL_AUTO);
    if (out->y16) k->values16_fp8_cols(out->y16 + r * cols, x + r * cols, n, cols, scale, t);
    else k->encode_fp8_cols(out->q + r * cols, x + r * cols, n, cols, scale, t);
}

/* x (rows, cols) encoded with one scale per column into out (values: every scale fitting). */
static void encode_cols(const float *x, int64_t rows, int64_t cols, mx_elem elem, const float *scale,
                        const line_out *out) {
    const mx_elem_traits *t = mx_elem_traits_of(elem);
    bool all_kernel = true;
    for (int64_t c = 0; c < cols; c++) all_kernel = all_kernel && kernel_scale(scale[c]);
    // small or nested: no OpenMP region at all (libgomp costs a futex call per region, even
    // one whose if clause is false)
    if (!all_kernel) {   // a scale of 0 or NaN (an Inf or NaN amax): torchao's clamp, then the cast
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++) out->q[r * cols + c] = cast(x[r * cols + c] * scale[c], t->max, elem);
    } else if (rows * cols > (1 << 16) && !omp_in_parallel()) {   // bands of rows over the threads
        enum { BAND = 16 };
        #pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < rows; r += BAND) cols_band(x, r, r + BAND < rows ? BAND : rows - r, cols, t, scale, out);
    } else {
        cols_band(x, 0, rows, cols, t, scale, out);
    }
}

static int check_args(int64_t rows, int64_t cols, mx_axis axis, mx_elem elem) {
    if (rows < 0 || cols < 0 || (cols > 0 && rows > INT64_MAX / cols)) return MX_ESIZE;
    if (!mx_elem_traits_of(elem) || (axis != MX_ROWWISE && axis != MX_COLWISE)) return MX_EENUM;
    return 0;
}

int mx_fp8_encode_axiswise_f32(const float *x, int64_t rows, int64_t cols, mx_axis axis, mx_elem elem,
                               const float *scale, uint8_t *q) {
    int rc = check_args(rows, cols, axis, elem);
    if (rc || rows * cols == 0) return rc;
    if (!x || !q || !scale) return MX_ENULL;
    if (axis == MX_COLWISE) {
        encode_cols(x, rows, cols, elem, scale, &(line_out){.q = q});
        return 0;
    }
    const mx_elem_traits *t = mx_elem_traits_of(elem);
    const mxi_mx_kernels *k = mxi_mx_kernels_of(MX_KERNEL_AUTO);
    if (rows > 1 && rows * cols > (1 << 16) && !omp_in_parallel()) {
        #pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < rows; r++) encode_row(x, cols, r, elem, t, scale[r], q, k);
    } else {
        for (int64_t r = 0; r < rows; r++) encode_row(x, cols, r, elem, t, scale[r], q, k);
    }
    return 0;
}

/* The amax of each column of x (rows, cols), NaN propagating (torch.amax: the column's
 * first NaN), into amax (cols), through the kernel's bit maxima (bits, cols). */
static void amax_cols(const float *x, int64_t rows, int64_t cols, float *amax) {
    uint32_t *bits = (uint32_t *)(void *)amax;   // the same storage: each column read before written
    mxi_mx_kernels_of(MX_KERNEL_AUTO)->amax_bits_cols(bits, x, rows, cols);
    for (int64_t c = 0; c < cols; c++) {
        uint32_t b = bits[c];
        float a = mxi_bits_f32(b);
        for (int64_t r = 0; b > 0x7F800000u && r < rows; r++)
            if (isnan(x[r * cols + c])) {
                a = fabsf(x[r * cols + c]);
                break;
            }
        amax[c] = a;
    }
}

/* mx_fp8_quantize_axiswise_f32 into out (its arguments checked); false as quantize_rows. */
static bool axiswise(const float *x, int64_t rows, int64_t cols, mx_axis axis, mx_elem elem, mx_tscale_mode mode,
                     const line_out *out, float *scale_inv) {
    const mx_elem_traits *t = mx_elem_traits_of(elem);
    if (axis == MX_ROWWISE) {
        // one row (a per-tensor line) parallelises inside the element pass; many rows, by
        // bands of rows
        enum { BAND = 64 };
        int64_t bands = (rows + BAND - 1) / BAND;
        if (rows == 1 || rows * cols <= (1 << 16) || omp_in_parallel())
            return quantize_rows(x, cols, 0, rows, elem, mode, out, scale_inv);
        bool ok = true;
        #pragma omp parallel for schedule(static) reduction(&& : ok)
        for (int64_t b = 0; b < bands; b++)
            ok = quantize_rows(x, cols, b * BAND, (b + 1) * BAND < rows ? (b + 1) * BAND : rows, elem, mode, out,
                               scale_inv) && ok;
        return ok;
    }
    // per column: the columns' amaxes row by row (in order in memory), then the codes; the
    // scales wait in scale_inv meanwhile
    float *scale = scale_inv;
    amax_cols(x, rows, cols, scale);
    for (int64_t c = 0; c < cols; c++) scale[c] = scale_from_amax(scale[c], t, mode);
    if (out->y16 && !mxi_values16_fit(t, scale, cols)) return false;
    encode_cols(x, rows, cols, elem, scale, out);
    for (int64_t c = 0; c < cols; c++) scale_inv[c] = 1.0f / scale[c];
    return true;
}

int mx_fp8_quantize_axiswise_f32(const float *x, int64_t rows, int64_t cols, mx_axis axis, mx_elem elem,
                                 mx_tscale_mode mode, uint8_t *q, float *scale_inv) {
    int rc = check_args(rows, cols, axis, elem);
    if (rc) return rc;
    if (mode != MX_TSCALE_FP32 && mode != MX_TSCALE_POW2) return MX_EENUM;
    if (rows * cols == 0) return 0;   // no element, no scale (a group without tokens)
    if (!x || !q || !scale_inv) return MX_ENULL;
    line_out out = {.q = q};
    axiswise(x, rows, cols, axis, elem, mode, &out, scale_inv);   // true: codes take any scale
    return 0;
}

bool mxi_fp8_quantize_axiswise_values16(uint16_t *y, float *scale_inv, const float *x, int64_t rows, int64_t cols,
                                        mx_axis axis, mx_elem elem) {
    if (check_args(rows, cols, axis, elem) || rows * cols == 0) return false;
    line_out out = {.y16 = y};
    return axiswise(x, rows, cols, axis, elem, MX_TSCALE_POW2, &out, scale_inv);
}

