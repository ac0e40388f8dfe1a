/* Reference kernels of the ops layer: plain scalar code, one element at a time. The AVX2
 * and AVX-512 kernels (ops/x86/) must match them bit for bit. */
#include <math.h>

#include "ops/ops_kernels.h"

static void ref_dequant_rows(const mxi_dequant_job *job, int64_t r0, int64_t r1) {
    const mxi_mx_plane *p = job->p;
    int64_t cols = p->cols, cb = (cols + MX_BLOCK - 1) / MX_BLOCK;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *q = p->q + r * cols;
        for (int64_t c = 0; c < cols; c++) {
            uint8_t s = p->axis == MX_ROWWISE ? p->scales[r * cb + c / MX_BLOCK]   // (rows, CB): one per 32 columns
                                              : p->scales[(r / MX_BLOCK) * cols + c];   // (RB, cols): one per column per strip
            float v = mxi_dequant_one(job->values, q[c], s);
            if (job->y16) job->y16[r * cols + c] = mxi_f32_to_bf16(v);
            else job->y[r * cols + c] = v;
        }
    }
}

static void ref_widen_bf16(float *y, const uint16_t *x, int64_t ld, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        const uint16_t *xr = x + r * ld;
        float *yr = y + r * cols;
        for (int64_t c = 0; c < cols; c++) yr[c] = mxi_bf16_to_f32(xr[c]);
    }
}

static void ref_lut32(uint32_t *y, const uint8_t *q, int64_t n, const uint32_t table[256]) {
    for (int64_t i = 0; i < n; i++) y[i] = table[q[i]];
}

static void ref_lut16(uint16_t *y, const uint8_t *q, int64_t n, const uint32_t table[256]) {
    for (int64_t i = 0; i < n; i++) y[i] = (uint16_t)table[q[i]];
}

static void ref_pow2_rows16(uint16_t *y, const uint8_t *q, int64_t rows, int64_t cols, const int16_t *e, int64_t brows,
                            int64_t bcols, const mxi_code_values *v) {
    int64_t nbc = (cols + bcols - 1) / bcols;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            float value = mxi_bits_f32(v->f32[q[r * cols + c]]);
            y[r * cols + c] = mxi_f32_to_bf16(ldexpf(value, e[(r / brows) * nbc + c / bcols]));
        }
}

static void ref_scale_row(float *c, const float *acc, int64_t n, float sa, const float *sb, float s, mxi_row_write w) {
    for (int64_t j = 0; j < n; j++) {
        float t = (sa * (sb ? sb[j] : s)) * acc[j];
        c[j] = w == MXI_ROW_ADD ? c[j] + t : t;
    }
}

const mxi_ops_kernels mxi_ops_kernels_ref = {.name = "ref", .dequant_rows = ref_dequant_rows,
                                             .widen_bf16 = ref_widen_bf16, .lut32 = ref_lut32, .lut16 = ref_lut16,
                                             .pow2_rows16 = ref_pow2_rows16, .scale_row = ref_scale_row};
