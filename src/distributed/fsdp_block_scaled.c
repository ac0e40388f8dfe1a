/* The low-precision all-gather of the blockwise recipe: a weight's 128x128 tiles each have
 * one scale, but a rank's rows (a multiple of 32) need not start or end on a tile's. So, once
 * a step, every rank takes the amax of its rows of each tile (0 for a tile it holds none of;
 * tiles never cross experts), one all-reduce with MAX per weight over its shard group makes
 * them the whole tiles' amaxes, and each rank quantizes its rows with its tiles' scales: the
 * gathered codes are byte for byte one rank's quantization of the whole weight (the amax of a
 * union is the max of the amaxes; padding rows are zeros). Every rank holds every tile's
 * scale, so only the codes travel, one tensor of them for both products. */
#include <string.h>

#include "core/diag.h"
#include "distributed/fsdp_internal.h"
#include "mxtrain/scaled.h"

enum { TILE = 128 };

/* Local row i of group grp of tensor t (this rank's rows start at r0): its expert, and the
 * first of its tiles (a row of TC tiles); -1 for a padding row. */
static int64_t first_tile(const shard_tensor *t, int64_t grp, int64_t r0, int64_t i) {
    int64_t e = mxi_fsdp_expert_of(t, grp, r0 + i);
    if (e < 0) return -1;
    int64_t row = grp * t->R + r0 + i - e * t->R_model, TR = CEIL_DIV(t->R_model, TILE), TC = CEIL_DIV(t->cols, TILE);
    return (e * TR + row / TILE) * TC;
}

static void local_amax(const mxi_fsdp *f, const shard_tensor *t, int64_t r0, double *amax) {
    for (int64_t k = 0; k < t->n_tiles; k++) amax[k] = 0.0;
    for (int64_t grp = 0; grp < t->G; grp++)
        for (int64_t i = 0; i < t->S; i++) {
            int64_t k = first_tile(t, grp, r0, i);
            if (k < 0) break;
            const float *w = f->master + t->shard_off + (grp * t->S + i) * t->cols;
            for (int64_t c = 0; c < t->cols; c += TILE, k++) {
                float a = mx_amax_f32(w + c, t->cols - c < TILE ? t->cols - c : TILE);   // NaN ignored, as the layer's
                if (a > amax[k]) amax[k] = a;
            }
        }
}

/* Codes of this rank's rows of tensor t with its tiles' scales, and the tiles' dequantization
 * scales: the arithmetic of the layer's own quantizer (mx_fp8_quantize_blocks_f32). */
static void quantize_rows(const mxi_fsdp *f, const shard_tensor *t, int64_t r0, const double *amax) {
    const mxi_linear_mx *spec = f->spec;
    float *dequant = (float *)(void *)(f->mx_cache + t->c_row_s);
    for (int64_t k = 0; k < t->n_tiles; k++)
        dequant[k] = 1.0f / mx_fp8_scale_from_amax((float)amax[k], spec->weight, spec->tmode);
    uint8_t *q = f->mx_cache + t->c_row_q;
    #pragma omp parallel for collapse(2) schedule(static)
    for (int64_t grp = 0; grp < t->G; grp++)
        for (int64_t i = 0; i < t->S; i++) {
            int64_t k = first_tile(t, grp, r0, i), at = (grp * t->S + i) * t->cols;
            if (k < 0) {
                memset(q + at, 0, (size_t)t->cols);   // padding: zeros, whose code is 0 in every format
                continue;
            }
            const float *w = f->master + t->shard_off + at;
            for (int64_t c = 0; c < t->cols; c += TILE, k++)   // a scale from an amax is positive and finite
                mx_fp8_encode_f32(w + c, t->cols - c < TILE ? t->cols - c : TILE, spec->weight,
                                  mx_fp8_scale_from_amax((float)amax[k], spec->weight, spec->tmode), q + at + c);
        }
}

int mxi_fsdp_quantize_block_scaled(mxi_fsdp *f, mx_diag *diag) {
    for (int i = 0; i < f->n_tensors; i++) {
        const shard_tensor *t = &f->t[i];
        if (!t->block_scaled) continue;
        const domain *d = &f->dom[t->dom];
        double *amax = (double *)(void *)(f->mx_cache + t->c_col_s);
        int64_t r0 = (int64_t)d->rank * t->S;
        local_amax(f, t, r0, amax);
        int rc = mxi_fsdp_max_over_shards(f, i, amax, t->n_tiles, "the tile amaxes", diag);
        if (rc) return rc;
        quantize_rows(f, t, r0, amax);
    }
    return MX_OK;
}
