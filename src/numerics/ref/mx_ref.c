/* Reference MX quantization: plain scalar code, one element at a time, exact integer
 * rounding. It is the oracle every other kernel must match bit for bit. */
#include "numerics/mx_internal.h"

static uint32_t load_bits(const mxi_quant_job *job, int64_t r, int64_t c) {
    int64_t i = r * job->cols + c;
    if (job->src == MXI_SRC_F32) return mxi_f32_bits(((const float *)job->x)[i]);
    return (uint32_t)((const uint16_t *)job->x)[i] << 16;   // bf16 is the top half of fp32
}

/* Quantize one block: n elements starting at (r, c), stepping (dr, dc). */
static void quantize_block(const mxi_quant_job *job, int64_t r, int64_t c, int64_t dr, int64_t dc,
                           int64_t n, uint8_t *q, uint8_t *scale) {
    uint32_t amax = 0;
    for (int64_t k = 0; k < n; k++) {
        uint32_t a = load_bits(job, r + k * dr, c + k * dc) & 0x7FFFFFFFu;
        if (a > amax) amax = a;    // magnitudes order like their bits; NaN/Inf bits are largest
    }
    uint8_t code = mxi_scale_code_bits(amax, job->elem->emax, job->elem->max, job->mode);
    *scale = code;
    for (int64_t k = 0; k < n; k++) {
        int64_t i = (r + k * dr) * job->cols + (c + k * dc);
        q[i] = code == MX_E8M0_NAN
                   ? job->elem->nan_code
                   : mxi_encode_scaled_ref(load_bits(job, r + k * dr, c + k * dc), 127 - code, job->elem);
    }
}

/* Quantize one tile of nr x nc elements at (r, c) with one scale: the 1-32-32 weight
 * layout. Zero padding of a partial tile leaves its maximum unchanged, so nothing to pad. */
static void quantize_tile(const mxi_quant_job *job, int64_t r, int64_t c, int64_t nr, int64_t nc,
                          uint8_t *scale) {
    uint32_t amax = 0;
    for (int64_t i = 0; i < nr; i++)
        for (int64_t j = 0; j < nc; j++) {
            uint32_t a = load_bits(job, r + i, c + j) & 0x7FFFFFFFu;
            if (a > amax) amax = a;
        }
    uint8_t code = mxi_scale_code_bits(amax, job->elem->emax, job->elem->max, job->mode);
    *scale = code;
    for (int64_t i = 0; i < nr; i++)
        for (int64_t j = 0; j < nc; j++)
            job->q_tile[(r + i) * job->cols + c + j] =
                code == MX_E8M0_NAN ? job->elem->nan_code
                                    : mxi_encode_scaled_ref(load_bits(job, r + i, c + j), 127 - code, job->elem);
}

static void ref_quantize_rows(const mxi_quant_job *job, int64_t r0, int64_t r1) {
    int64_t cols = job->cols, cb = (cols + MX_BLOCK - 1) / MX_BLOCK;
    if (job->q_row) {
        for (int64_t r = r0; r < r1; r++)
            for (int64_t b = 0; b < cb; b++) {
                int64_t c = b * MX_BLOCK, n = cols - c < MX_BLOCK ? cols - c : MX_BLOCK;
                quantize_block(job, r, c, 0, 1, n, job->q_row, &job->s_row[r * cb + b]);
            }
    }
    if (job->q_col) {
        for (int64_t r = r0; r < r1; r += MX_BLOCK) {
            int64_t n = r1 - r < MX_BLOCK ? r1 - r : MX_BLOCK;
            for (int64_t c = 0; c < cols; c++)
                quantize_block(job, r, c, 1, 0, n, job->q_col, &job->s_col[(r / MX_BLOCK) * cols + c]);
        }
    }
    if (job->q_tile) {
        for (int64_t r = r0; r < r1; r += MX_BLOCK) {
            int64_t nr = r1 - r < MX_BLOCK ? r1 - r : MX_BLOCK;
            for (int64_t b = 0; b < cb; b++) {
                int64_t c = b * MX_BLOCK, nc = cols - c < MX_BLOCK ? cols - c : MX_BLOCK;
                quantize_tile(job, r, c, nr, nc, &job->s_tile[(r / MX_BLOCK) * cb + b]);
            }
        }
    }
}

const mxi_mx_kernels mxi_mx_kernels_ref = {.name = "ref", .quantize_rows = ref_quantize_rows,
                                           .encode_fp8 = mxi_encode_fp8_ref,
                                           .encode_fp8_vec = mxi_encode_fp8_vec_ref, .encode_hif8 = mxi_encode_hif8_ref,
                                           .amax = mxi_amax_ref, .amax_bits = mxi_amax_bits_ref,
                                           .amax_bits_cols = mxi_amax_bits_cols_ref,
                                           .amax_bits_rows = mxi_amax_bits_rows_ref,
                                           .encode_fp8_rows = mxi_encode_fp8_rows_ref,
                                           .encode_fp8_cols = mxi_encode_fp8_cols_ref,
                                           .values16_fp8_blocks = mxi_values16_fp8_blocks_ref,
                                           .values16_fp8_cols = mxi_values16_fp8_cols_ref};
