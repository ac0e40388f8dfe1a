/* The per-tensor and per-block scalings (mxtrain/scaled.h): TransformerEngine's current
 * scaling (recipe_common.cuh) and MindSpeed's HiF8 per-tensor scaling. The scales are
 * computed here; the element passes and the amax run on the chosen kernel table
 * (numerics/mx_internal.h), over chunks in parallel when the tensor is large (every
 * element is encoded on its own and a maximum does not depend on the order, so the result
 * is the same for any number of threads). */
#include <float.h>
#include <math.h>
#include <omp.h>

#include "core/bits.h"
#include "mxtrain/scaled.h"
#include "numerics/mx_internal.h"

enum { CHUNK = 1 << 16 };   // elements per parallel piece

static const mxi_mx_kernels *kernels(void) { return mxi_mx_kernels_of(MX_KERNEL_AUTO); }

static int64_t chunks_of(int64_t n) { return (n + CHUNK - 1) / CHUNK; }

float mx_amax_f32(const float *x, int64_t n) {
    const mxi_mx_kernels *k = kernels();
    int64_t chunks = chunks_of(n);
    if (chunks <= 1 || omp_in_parallel()) return n > 0 ? k->amax(x, n) : 0.0f;
    float amax = 0.0f;
    #pragma omp parallel for schedule(static) reduction(max : amax)
    for (int64_t c = 0; c < chunks; c++) {
        int64_t i = c * CHUNK, m = n - i < CHUNK ? n - i : CHUNK;
        float a = k->amax(x + i, m);
        if (a > amax) amax = a;
    }
    return amax;
}

/* q[0..n) from x[0..n) by one scale, FP8 or HiF8. A small tensor, or a call from inside a
 * parallel region, runs on the calling thread without opening a region (an OpenMP region
 * of one thread still costs futex calls in libgomp). */
static void encode(uint8_t *q, const float *x, int64_t n, float scale, const mx_elem_traits *fp8) {
    const mxi_mx_kernels *k = kernels();
    int64_t chunks = chunks_of(n);
    if (chunks <= 1 || omp_in_parallel()) {
        if (fp8) k->encode_fp8(q, x, n, scale, fp8);
        else k->encode_hif8(q, x, n, scale);
        return;
    }
    #pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < chunks; c++) {
        int64_t i = c * CHUNK, m = n - i < CHUNK ? n - i : CHUNK;
        if (fp8) k->encode_fp8(q + i, x + i, m, scale, fp8);
        else k->encode_hif8(q + i, x + i, m, scale);
    }
}

/* Pieces of the fused pass below: an amax brings a piece into L1, where its encode reads it. */
enum { L1_PIECE = 4096 };

static float encode_amax_range(uint8_t *q, const float *x, int64_t n, float scale, const mx_elem_traits *fp8,
                               const mxi_mx_kernels *k) {
    float amax = 0.0f;
    for (int64_t i = 0; i < n; i += L1_PIECE) {
        int64_t m = n - i < L1_PIECE ? n - i : L1_PIECE;
        float a = k->amax(x + i, m);
        if (a > amax) amax = a;
        if (fp8) k->encode_fp8(q + i, x + i, m, scale, fp8);
        else k->encode_hif8(q + i, x + i, m, scale);
    }
    return amax;
}

float mxi_encode_amax(uint8_t *q, const float *x, int64_t n, float scale, const mx_elem_traits *fp8) {
    const mxi_mx_kernels *k = kernels();
    int64_t chunks = chunks_of(n);
    if (chunks <= 1 || omp_in_parallel()) return encode_amax_range(q, x, n, scale, fp8, k);
    float amax = 0.0f;
    #pragma omp parallel for schedule(static) reduction(max : amax)
    for (int64_t c = 0; c < chunks; c++) {
        int64_t i = c * CHUNK, m = n - i < CHUNK ? n - i : CHUNK;
        float a = encode_amax_range(q + i, x + i, m, scale, fp8, k);
        if (a > amax) amax = a;
    }
    return amax;
}

/* The checks of the element pass alone. */
static int check_encode(const float *x, int64_t n, float scale, const uint8_t *q) {
    if (n > 0 && (!x || !q)) return MX_ENULL;
    if (n < 0) return MX_ESIZE;
    if (!(scale > 0.0f) || isinf(scale)) return MX_EINVAL;
    return 0;
}

int mx_fp8_encode_f32(const float *x, int64_t n, mx_elem elem, float scale, uint8_t *q) {
    int rc = check_encode(x, n, scale, q);
    if (rc) return rc;
    const mx_elem_traits *t = mx_elem_traits_of(elem);
    if (!t) return MX_EENUM;
    encode(q, x, n, scale, t);
    return 0;
}

int mx_hif8_encode_f32(const float *x, int64_t n, float scale, uint8_t *q) {
    int rc = check_encode(x, n, scale, q);
    if (rc) return rc;
    encode(q, x, n, scale, NULL);
    return 0;
}

/* The scale of amax for format t (the public function's, without the lookup). */
static float fp8_scale_from_amax(float amax, const mx_elem_traits *t, mx_tscale_mode mode) {
    if (!t || !(amax > 0.0f) || isinf(amax)) return 1.0f;   // 0, Inf, NaN (and no format)
    float scale = t->max / amax;
    if (isinf(scale)) scale = FLT_MAX;
    // Power of two: keep the sign and exponent bits, an exact floor (scale >= 448/FLT_MAX
    // is normal, so the exponent is never zero).
    if (mode == MX_TSCALE_POW2) scale = mxi_bits_f32(mxi_f32_bits(scale) & 0xFF800000u);
    return scale;
}

float mx_fp8_scale_from_amax(float amax, mx_elem elem, mx_tscale_mode mode) {
    return fp8_scale_from_amax(amax, mx_elem_traits_of(elem), mode);
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
    const mx_elem_traits *t = mx_elem_traits_of(elem);
    if (!t || (mode != MX_TSCALE_FP32 && mode != MX_TSCALE_POW2)) return MX_EENUM;
    float scale = mx_fp8_scale_from_amax(mx_amax_f32(x, n), elem, mode);
    encode(q, x, n, scale, t);
    *scale_inv = 1.0f / scale;
    return 0;
}

/* Where a band's elements go: codes into q, or (y16 set) their values as bf16 with the
 * scales taken off (values16_fp8_*), when the scales fit (mxi_values16_fit). */
typedef struct {
    uint8_t *q;
    uint16_t *y16;
} band_out;

/* Rows [r0, r0 + brows) of x (rows, cols) in brows x 1 blocks: each column's amax over the
 * band (NaN ignored, as the amax kernel), its scale, the rows' codes (or values) with the
 * band's scales, then the dequantization scales into sinv (cols). False: values asked for and
 * a scale out of their range (nothing written but sinv). */
static bool column_band(const float *x, int64_t rows, int64_t cols, int64_t r0, int64_t brows, mx_tscale_mode mode,
                        const mxi_mx_kernels *k, const mx_elem_traits *t, const band_out *out, float *sinv) {
    int64_t r1 = r0 + brows < rows ? r0 + brows : rows;
    uint32_t *bits = (uint32_t *)(void *)sinv;   // the same storage: each column read before written
    k->amax_bits_cols(bits, x + r0 * cols, r1 - r0, cols);
    for (int64_t c = 0; c < cols; c++) {
        float a = mxi_bits_f32(bits[c]);   // magnitudes order as their bits: the amax, unless a NaN is there
        if (bits[c] > 0x7F800000u) {       // then the largest of the others
            a = 0.0f;
            for (int64_t r = r0; r < r1; r++) a = fabsf(x[r * cols + c]) > a ? fabsf(x[r * cols + c]) : a;   // false for NaN
        }
        sinv[c] = fp8_scale_from_amax(a, t, mode);
    }
    if (out->y16 && !mxi_values16_fit(t, sinv, cols)) return false;
    if (out->y16) k->values16_fp8_cols(out->y16 + r0 * cols, x + r0 * cols, r1 - r0, cols, sinv, t);
    else k->encode_fp8_cols(out->q + r0 * cols, x + r0 * cols, r1 - r0, cols, sinv, t);
    for (int64_t c = 0; c < cols; c++) sinv[c] = 1.0f / sinv[c];
    return true;
}

/* Block b (row-major over the (ceil(rows/brows), ceil(cols/bcols)) blocks) of x: its amax,
 * scale, codes and dequantization scale. */
static void block(const float *x, int64_t rows, int64_t cols, int64_t brows, int64_t bcols, int64_t b,
                  mx_tscale_mode mode, const mxi_mx_kernels *k, const mx_elem_traits *t, uint8_t *q, float *scale_inv) {
    int64_t nbc = (cols + bcols - 1) / bcols, r0 = (b / nbc) * brows, c0 = (b % nbc) * bcols;
    int64_t r1 = r0 + brows < rows ? r0 + brows : rows, c1 = c0 + bcols < cols ? c0 + bcols : cols;
    float amax = 0.0f;
    for (int64_t r = r0; r < r1; r++) {
        float a = k->amax(x + r * cols + c0, c1 - c0);
        if (a > amax) amax = a;
    }
    float scale = fp8_scale_from_amax(amax, t, mode);
    for (int64_t r = r0; r < r1; r++) k->encode_fp8(q + r * cols + c0, x + r * cols + c0, c1 - c0, scale, t);
    scale_inv[b] = 1.0f / scale;
}

/* Rows [r0, r1) of x in 1 x bcols blocks (nbc a row): the blocks' amaxes, then their scales,
 * codes (or values) and dequantization scales, each in one loop (short rows: few calls a
 * block). False as column_band. */
static bool row_blocks(const float *x, int64_t cols, int64_t bcols, int64_t r0, int64_t r1, mx_tscale_mode mode,
                       const mxi_mx_kernels *k, const mx_elem_traits *t, const band_out *out, float *scale_inv) {
    int64_t nbc = (cols + bcols - 1) / bcols, b0 = r0 * nbc, b1 = r1 * nbc;
    if (nbc == 1) {   // a block a row: the row kernels' amax
        uint32_t *bits = (uint32_t *)(void *)(scale_inv + r0);   // the amaxes' bits, for now
        k->amax_bits_rows(bits, x + r0 * cols, r1 - r0, cols);
        for (int64_t i = 0; i < r1 - r0; i++) {   // a NaN's bits exceed Inf's: then the amax without it
            float a = bits[i] <= 0x7F800000u ? mxi_bits_f32(bits[i]) : k->amax(x + (r0 + i) * cols, cols);
            scale_inv[r0 + i] = fp8_scale_from_amax(a, t, mode);
        }
    } else {
        for (int64_t b = b0; b < b1; b++) {   // the amax, for now
            int64_t r = b / nbc, c0 = (b % nbc) * bcols, c1 = c0 + bcols < cols ? c0 + bcols : cols;
            scale_inv[b] = k->amax(x + r * cols + c0, c1 - c0);
        }
        for (int64_t b = b0; b < b1; b++) scale_inv[b] = fp8_scale_from_amax(scale_inv[b], t, mode);   // the scale
    }
    if (out->y16) {
        if (!mxi_values16_fit(t, scale_inv + b0, b1 - b0)) return false;
        k->values16_fp8_blocks(out->y16 + r0 * cols, x + r0 * cols, r1 - r0, cols, bcols, scale_inv + b0, t);
    } else if (nbc == 1) {
        k->encode_fp8_rows(out->q + r0 * cols, x + r0 * cols, r1 - r0, cols, scale_inv + r0, t);
    } else {
        for (int64_t b = b0; b < b1; b++) {
            int64_t r = b / nbc, c0 = (b % nbc) * bcols, c1 = c0 + bcols < cols ? c0 + bcols : cols;
            k->encode_fp8(out->q + r * cols + c0, x + r * cols + c0, c1 - c0, scale_inv[b], t);
        }
    }
    for (int64_t b = b0; b < b1; b++) scale_inv[b] = 1.0f / scale_inv[b];
    return true;
}

/* The bands of 1 x bcols or brows x 1 blocks (the rows' or the columns' kernels), over the
 * threads when large; false as column_band. */
static bool line_blocks(const float *x, int64_t rows, int64_t cols, int64_t brows, int64_t bcols, mx_tscale_mode mode,
                        const mx_elem_traits *t, const band_out *out, float *scale_inv) {
    const mxi_mx_kernels *k = kernels();
    // small or nested: no OpenMP region (libgomp costs a futex call per region, even one whose
    // if clause is false)
    bool threads = rows * cols > CHUNK && !omp_in_parallel(), ok = true;
    if (brows > 1) {   // column blocks: a band of rows at a time, in memory order
        int64_t nbr = (rows + brows - 1) / brows;
        if (!threads) {
            for (int64_t b = 0; b < nbr && ok; b++)
                ok = column_band(x, rows, cols, b * brows, brows, mode, k, t, out, scale_inv + b * cols);
            return ok;
        }
        #pragma omp parallel for schedule(static) reduction(&& : ok)
        for (int64_t b = 0; b < nbr; b++)
            ok = column_band(x, rows, cols, b * brows, brows, mode, k, t, out, scale_inv + b * cols) && ok;
        return ok;
    }
    enum { BAND = 64 };   // row blocks: bands of rows
    int64_t bands = (rows + BAND - 1) / BAND;
    if (!threads) return row_blocks(x, cols, bcols, 0, rows, mode, k, t, out, scale_inv);
    #pragma omp parallel for schedule(static) reduction(&& : ok)
    for (int64_t i = 0; i < bands; i++) {
        int64_t r0 = i * BAND, r1 = r0 + BAND < rows ? r0 + BAND : rows;
        ok = row_blocks(x, cols, bcols, r0, r1, mode, k, t, out, scale_inv) && ok;
    }
    return ok;
}

int mx_fp8_quantize_blocks_f32(const float *x, int64_t rows, int64_t cols, int64_t brows,
                               int64_t bcols, mx_elem elem, mx_tscale_mode mode, uint8_t *q,
                               float *scale_inv) {
    int rc = check_sizes(rows, cols);
    if (rc) return rc;
    if (brows < 1 || bcols < 1) return MX_ESIZE;
    if (rows * cols > 0 && (!x || !q || !scale_inv)) return MX_ENULL;
    const mx_elem_traits *t = mx_elem_traits_of(elem);
    if (!t || (mode != MX_TSCALE_FP32 && mode != MX_TSCALE_POW2)) return MX_EENUM;
    if (bcols == 1 || brows == 1) {
        band_out out = {.q = q};
        line_blocks(x, rows, cols, brows, bcols, mode, t, &out, scale_inv);   // true: codes take any scale
        return 0;
    }
    const mxi_mx_kernels *k = kernels();
    int64_t nbr = (rows + brows - 1) / brows, nbc = (cols + bcols - 1) / bcols;
    if (rows * cols > CHUNK && !omp_in_parallel()) {
        #pragma omp parallel for schedule(static)
        for (int64_t b = 0; b < nbr * nbc; b++) block(x, rows, cols, brows, bcols, b, mode, k, t, q, scale_inv);
    } else {
        for (int64_t b = 0; b < nbr * nbc; b++) block(x, rows, cols, brows, bcols, b, mode, k, t, q, scale_inv);
    }
    return 0;
}

bool mxi_fp8_quantize_blocks_values16(uint16_t *y, float *scale_inv, const float *x, int64_t rows, int64_t cols,
                                      int64_t brows, int64_t bcols, mx_elem elem) {
    const mx_elem_traits *t = mx_elem_traits_of(elem);
    if (!t || (brows != 1 && bcols != 1)) return false;
    band_out out = {.y16 = y};
    return line_blocks(x, rows, cols, brows, bcols, MX_TSCALE_POW2, t, &out, scale_inv);
}

float mx_hif8_scale_from_amax(float amax, float target) {
    // MindSpeed multiplies by the fp32 reciprocal of the target; a scale of 0 or a
    // non-finite one would turn every element into NaN, so those tensors keep scale 1.
    float scale = amax * (1.0f / target);
    return !(scale > 0.0f) || isinf(scale) ? 1.0f : scale;
}

float mx_hif8_scale_from_amax_ex(float amax, float target, mx_tscale_mode mode) {
    float scale = mx_hif8_scale_from_amax(amax, target);
    if (mode != MX_TSCALE_POW2) return scale;
    // the power of two at or above it (exact: frexpf's m is 0.5 only for a power of two), so
    // that x / scale stays within the target; 2^127 at most
    int e;
    float m = frexpf(scale, &e);
    if (m == 0.5f) return scale;
    return e > 127 ? ldexpf(1.0f, 127) : ldexpf(1.0f, e);
}

int mx_hif8_quantize_tensor_f32(const float *x, int64_t n, float target, uint8_t *q,
                                float *scale_inv) {
    return mx_hif8_quantize_tensor_ex_f32(x, n, target, MX_TSCALE_FP32, q, scale_inv);
}

int mx_hif8_quantize_tensor_ex_f32(const float *x, int64_t n, float target, mx_tscale_mode mode, uint8_t *q,
                                   float *scale_inv) {
    if (!scale_inv || (n > 0 && (!x || !q))) return MX_ENULL;
    if (n < 0) return MX_ESIZE;
    if (mode != MX_TSCALE_FP32 && mode != MX_TSCALE_POW2) return MX_EENUM;
    uint8_t tc = mx_f32_to_hif8(target, MX_HIF8_OVERFLOW_INF);
    if (!(target > 0.0f) || isinf(target) || mx_hif8_to_f32(tc) != target) return MX_EINVAL;
    float scale = mx_hif8_scale_from_amax_ex(mx_amax_f32(x, n), target, mode);
    encode(q, x, n, scale, NULL);
    *scale_inv = scale;
    return 0;
}
