/* Quantization statistics of the weights the engine gathers already quantized (the
 * low-precision all-gather, model/quant_stats.h): every rank measures the planes or codes of
 * its shard against its fp32 master rows, so that the sums over the ranks are the whole
 * weights' figures. With quant_stats on, every such shard is quantized into mx_cache once a
 * step (fsdp_layout.c), which holds the bytes the step's gathers carry. */
#include "distributed/fsdp_internal.h"
#include "model/quant_stats.h"

/* The per-tensor recipes' codes, row by row with the scale of the row's expert. */
static void tensor_scaled(const mxi_fsdp *f, mxi_quant_stats *qs, int id, const shard_tensor *t, int64_t r0) {
    const float *dequant = (const float *)(const void *)(f->mx_cache + t->c_row_s);
    for (int64_t grp = 0; grp < t->G; grp++)
        for (int64_t i = 0; i < t->S && r0 + i < t->R; i++) {   // rows past R are padding
            int64_t e = (grp * t->R + r0 + i) / t->R_model, at = (grp * t->S + i) * t->cols;
            mxi_qs_operand op = {.q = f->mx_cache + t->c_row_q + at, .rows = 1, .cols = t->cols, .elem = f->spec->weight,
                                 .scaling = MXI_QS_TENSOR, .scale = &dequant[e]};
            // one set of codes serves both products
            mxi_quant_stats_record(qs, id, MXI_QS_FPROP_W, f->master + t->shard_off + at, &op);
            mxi_quant_stats_record(qs, id, MXI_QS_DGRAD_W, f->master + t->shard_off + at, &op);
        }
}

/* The blockwise recipe's codes, row by row with the scales of the row's tiles (a row of them:
 * blocks of 1 x 128 over the row); one tensor of codes serves both products. */
static void block_scaled(const mxi_fsdp *f, mxi_quant_stats *qs, int id, const shard_tensor *t, int64_t r0) {
    const float *dequant = (const float *)(const void *)(f->mx_cache + t->c_row_s);
    int64_t TR = (t->R_model + 127) / 128, TC = (t->cols + 127) / 128;
    for (int64_t grp = 0; grp < t->G; grp++)
        for (int64_t i = 0; i < t->S; i++) {
            int64_t e = mxi_fsdp_expert_of(t, grp, r0 + i), at = (grp * t->S + i) * t->cols;
            if (e < 0) continue;   // padding
            int64_t row = grp * t->R + r0 + i - e * t->R_model;
            mxi_qs_operand op = {.q = f->mx_cache + t->c_row_q + at, .rows = 1, .cols = t->cols, .elem = f->spec->weight,
                                 .scaling = MXI_QS_FP32_BLOCKS, .scale = dequant + (e * TR + row / 128) * TC,
                                 .brows = 1, .bcols = 128};
            mxi_quant_stats_record(qs, id, MXI_QS_FPROP_W, f->master + t->shard_off + at, &op);
            mxi_quant_stats_record(qs, id, MXI_QS_DGRAD_W, f->master + t->shard_off + at, &op);
        }
}

/* The rowwise recipes' two planes, row by row: fprop's with the row's scale, dgrad's with its
 * expert's column (or tensor) scales (fsdp_row_scaled.c); padding rows left out. */
static void row_scaled(const mxi_fsdp *f, mxi_quant_stats *qs, int id, const shard_tensor *t, int64_t r0) {
    const uint8_t *c = f->mx_cache;
    const float *row_s = (const float *)(const void *)(c + t->c_row_s), *col_s = (const float *)(const void *)(c + t->c_col_s);
    bool whole = f->spec->dgrad_weight_tensor;
    int64_t lines = whole ? 1 : t->cols;
    for (int64_t grp = 0; grp < t->G; grp++)
        for (int64_t i = 0; i < t->S; i++) {
            int64_t e = mxi_fsdp_expert_of(t, grp, r0 + i), at = (grp * t->S + i) * t->cols;
            if (e < 0) continue;
            const float *w = f->master + t->shard_off + at;
            mxi_qs_operand op = {.q = c + t->c_row_q + at, .rows = 1, .cols = t->cols, .elem = f->spec->weight,
                                 .scaling = MXI_QS_TENSOR, .scale = &row_s[grp * t->S + i]};
            mxi_quant_stats_record(qs, id, MXI_QS_FPROP_W, w, &op);
            op.q = c + t->c_col_q + at, op.scaling = whole ? MXI_QS_TENSOR : MXI_QS_COLS, op.scale = col_s + e * lines;
            mxi_quant_stats_record(qs, id, MXI_QS_DGRAD_W, w, &op);
        }
}

/* MX planes: the rowwise one for forward, the colwise one for dgrad, or 32x32 tiles for both;
 * a group's rows past R (padding) left out (blocks start at the shard's first row). */
static void mx_planes(const mxi_fsdp *f, mxi_quant_stats *qs, int id, const shard_tensor *t, int64_t rows) {
    int64_t CB = (t->cols + 31) / 32, SB = t->S / 32;
    const uint8_t *c = f->mx_cache;
    for (int64_t grp = 0; grp < t->G; grp++) {
        int64_t at = grp * t->S * t->cols;
        const float *w = f->master + t->shard_off + at;
        mxi_qs_operand op = {.q = c + t->c_row_q + at, .rows = rows, .cols = t->cols, .elem = f->spec->weight};
        if (f->spec->weight_tiles) {
            op.scaling = MXI_QS_TILES, op.e8m0 = c + t->c_tiles + grp * SB * CB;
            mxi_quant_stats_record(qs, id, MXI_QS_FPROP_W, w, &op);
            mxi_quant_stats_record(qs, id, MXI_QS_DGRAD_W, w, &op);
            continue;
        }
        op.scaling = MXI_QS_BLOCKS, op.axis = MX_ROWWISE, op.e8m0 = c + t->c_row_s + grp * t->S * CB;
        mxi_quant_stats_record(qs, id, MXI_QS_FPROP_W, w, &op);
        op.q = c + t->c_col_q + at, op.axis = MX_COLWISE, op.e8m0 = c + t->c_col_s + grp * SB * t->cols;
        mxi_quant_stats_record(qs, id, MXI_QS_DGRAD_W, w, &op);
    }
}

void mxi_fsdp_weight_stats(const mxi_fsdp *f, mxi_quant_stats *qs) {
    if (!mxi_quant_stats_on(qs) || !f->opt.low_precision) return;
    for (int id = 0; id < f->n_tensors; id++) {
        const shard_tensor *t = &f->t[id];
        const domain *d = &f->dom[t->dom];
        if (!t->mx || !t->cached || d->replica != 0) continue;   // a replica's shard is counted once
        int64_t r0 = (int64_t)d->rank * t->S, rows = t->R - r0 < t->S ? t->R - r0 : t->S;
        if (rows <= 0) continue;
        if (t->tensor_scaled) tensor_scaled(f, qs, id, t, r0);
        else if (t->row_scaled) row_scaled(f, qs, id, t, r0);
        else if (t->block_scaled) block_scaled(f, qs, id, t, r0);
        else mx_planes(f, qs, id, t, rows);
    }
}
