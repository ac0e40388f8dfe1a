/* The low-precision all-gather of the per-tensor recipes (tensorwise FP8, HiF8): a weight's
 * one scale must be the whole weight's, but each rank holds S rows of it. So, once a step
 * (the master weights change only at the optimizer step), every rank takes the amax of its
 * rows of each weight (of each expert: scales never cross experts), one all-reduce with MAX
 * per weight over its shard group makes them the whole weights' amaxes, and each rank quantizes its rows with the
 * scale from that amax: the gathered codes are byte for byte one rank's quantization of the
 * whole weight (the amax of a union is the max of the amaxes; padding rows are zeros). */
#include <stdio.h>
#include <string.h>

#include "core/diag.h"
#include "distributed/fsdp_internal.h"
#include "mxtrain/scaled.h"

int64_t mxi_fsdp_expert_of(const shard_tensor *t, int64_t grp, int64_t r) {
    if (r >= t->R) return -1;
    return (grp * t->R + r) / t->R_model;
}

int mxi_fsdp_max_over_shards(const mxi_fsdp *f, int id, double *x, int64_t n, const char *what, mx_diag *diag) {
    const domain *d = &f->dom[f->t[id].dom];
    if (d->W <= 1) return MX_OK;
    char name[160];
    snprintf(name, sizeof name, "%s of %s", what, mxi_model_tensor_shape(f->model, id).name);
    return mxi_comm_allreduce_max(d->comm, x, (int)n, name, diag);
}

/* This rank's rows of tensor t: group grp, local row i is row r0 + i of the group's R. */
static void local_amax(const mxi_fsdp *f, const shard_tensor *t, int64_t r0, double *amax) {
    for (int64_t e = 0; e < t->n_ts; e++) amax[e] = 0.0;
    for (int64_t grp = 0; grp < t->G; grp++)
        for (int64_t i = 0; i < t->S; i++) {
            int64_t e = mxi_fsdp_expert_of(t, grp, r0 + i);
            if (e < 0) break;
            float a = mx_amax_f32(f->master + t->shard_off + (grp * t->S + i) * t->cols, t->cols);
            if (a > amax[e]) amax[e] = a;
        }
}

/* Codes of this rank's rows of tensor t with the scales of amax, and its dequantization scales. */
static void quantize_rows(const mxi_fsdp *f, const shard_tensor *t, int64_t r0, const double *amax) {
    const mxi_linear_mx *spec = f->spec;
    bool hif8 = spec->weight == MX_HIF8;
    float *dequant = (float *)(void *)(f->mx_cache + t->c_row_s);
    for (int64_t e = 0; e < t->n_ts; e++)   // the same arithmetic as the layer's own quantizer (scaled.h)
        dequant[e] = hif8 ? mx_hif8_scale_from_amax_ex((float)amax[e], MXI_HIF8_TARGET_ACT, spec->tmode)
                          : 1.0f / mx_fp8_scale_from_amax((float)amax[e], spec->weight, spec->tmode);
    uint8_t *q = f->mx_cache + t->c_row_q;
    #pragma omp parallel for collapse(2) schedule(static)
    for (int64_t grp = 0; grp < t->G; grp++)
        for (int64_t i = 0; i < t->S; i++) {
            int64_t e = mxi_fsdp_expert_of(t, grp, r0 + i), at = (grp * t->S + i) * t->cols;
            const float *w = f->master + t->shard_off + at;
            if (e < 0) {
                memset(q + at, 0, (size_t)t->cols);   // padding: zeros, whose code is 0 in every format
                continue;
            }
            // a scale from an amax is positive and finite, so neither call can fail
            if (hif8) mx_hif8_encode_f32(w, t->cols, dequant[e], q + at);
            else mx_fp8_encode_f32(w, t->cols, spec->weight, mx_fp8_scale_from_amax((float)amax[e], spec->weight, spec->tmode), q + at);
        }
}

/* Delayed scaling: each weight's scale (per expert) is known before the step, so each rank
 * quantizes its rows with it, no all-reduce; its rows' amax goes into the weight's history
 * (the history's MAX all-reduce after the forward makes it the whole weight's). */
static void quantize_rows_delayed(const mxi_fsdp *f, int id, const shard_tensor *t, int64_t r0, mxi_delayed *d) {
    float *dequant = (float *)(void *)(f->mx_cache + t->c_row_s);
    double *amax = (double *)(void *)(f->mx_cache + t->c_col_s);
    int64_t base = mxi_model_expert_base(f->model, id);
    for (int64_t e = 0; e < t->n_ts; e++) amax[e] = 0.0;
    uint8_t *q = f->mx_cache + t->c_row_q;
    for (int64_t grp = 0; grp < t->G; grp++)
        for (int64_t i = 0; i < t->S; i++) {
            int64_t e = mxi_fsdp_expert_of(t, grp, r0 + i), at = (grp * t->S + i) * t->cols;
            if (e < 0) {
                memset(q + at, 0, (size_t)t->cols);   // padding: zeros, whose code is 0 in every format
                continue;
            }
            mxi_delayed_site site = mxi_delayed_site_of(d, id, base + e);
            float sinv, a;   // sinv: the same for every row of the expert, set below
            mxi_delayed_encode(f->master + t->shard_off + at, t->cols, f->spec->weight,
                               mxi_delayed_next_scale(&site, MXI_DELAYED_WEIGHT), q + at, &sinv, &a);
            if (a > amax[e]) amax[e] = a;
        }
    for (int64_t e = 0; e < t->n_ts; e++) {
        mxi_delayed_site site = mxi_delayed_site_of(d, id, base + e);
        dequant[e] = f->spec->weight == MX_HIF8 ? mxi_delayed_next_scale(&site, MXI_DELAYED_WEIGHT)
                                                 : 1.0f / mxi_delayed_next_scale(&site, MXI_DELAYED_WEIGHT);
        mxi_delayed_note_shard(&site, MXI_DELAYED_WEIGHT, (float)amax[e]);
    }
}

int mxi_fsdp_quantize_tensor_scaled(mxi_fsdp *f, mx_diag *diag) {
    mxi_delayed *delayed = mxi_model_delayed(f->model);
    for (int i = 0; delayed && i < f->n_tensors; i++)
        if (f->t[i].tensor_scaled) quantize_rows_delayed(f, i, &f->t[i], (int64_t)f->dom[f->t[i].dom].rank * f->t[i].S, delayed);
    if (delayed) return MX_OK;
    for (int d = 0; d < N_DOMS; d++) {
        for (int i = 0; i < f->n_tensors; i++) {
            const shard_tensor *t = &f->t[i];
            if (!t->tensor_scaled || t->dom != d) continue;
            double *amax = (double *)(void *)(f->mx_cache + t->c_col_s);
            local_amax(f, t, (int64_t)f->dom[d].rank * t->S, amax);
            int rc = mxi_fsdp_max_over_shards(f, i, amax, t->n_ts, "the amax", diag);
            if (rc) return rc;
        }
    }
    for (int i = 0; i < f->n_tensors; i++) {
        const shard_tensor *t = &f->t[i];
        if (t->tensor_scaled)
            quantize_rows(f, t, (int64_t)f->dom[t->dom].rank * t->S, (const double *)(const void *)(f->mx_cache + t->c_col_s));
    }
    return MX_OK;
}
