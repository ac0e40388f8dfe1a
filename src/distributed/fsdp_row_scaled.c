/* The low-precision all-gather of the rowwise recipes (torchao's rowwise and
 * rowwise_with_gw_hp, model/linear_rowwise.c). A weight W (N, K) is two operands there:
 * fprop's, one scale per row (along K), and dgrad's, one scale per column (along N) or, with
 * rowwise_with_gw_hp, one per tensor. Each rank holds S rows of W. So, once a step:
 *  - fprop's plane: each row's scale depends on that row alone, so each rank quantizes its
 *    own rows; codes and the fp32 dequantization scale of each row travel;
 *  - dgrad's plane: a column's scale is the amax of the whole column, but the amax of a union
 *    is the max of the amaxes: each rank takes the amax of each column (each expert's: scales
 *    never cross experts) over its rows, one all-reduce with MAX per weight over its shard
 *    group makes them the whole columns', and each rank quantizes its rows with those scales.
 *    Only codes travel: every rank has the scales. Per tensor, the same with one amax.
 * Both gathered planes are byte for byte one rank's quantization of the whole weight (padding
 * rows are never unpacked). The amaxes go over the wire as the bit patterns of |amax|, whose
 * order as integers is the values' order with NaN above +Inf: a column holding a NaN stays
 * NaN (its payload the largest one's, where one rank quantizing it takes the first's). */
#include <string.h>

#include "core/diag.h"
#include "distributed/fsdp_internal.h"
#include "mxtrain/scaled.h"
#include "ops/kernels.h"

static float amax_of(double key) {
    uint32_t b = (uint32_t)key;
    float a;
    memcpy(&a, &b, sizeof a);
    return a;
}

/* Lines of dgrad's weight operand per expert: columns, or the whole tensor. */
static int64_t lines_of(const mxi_fsdp *f, const shard_tensor *t) { return f->spec->dgrad_weight_tensor ? 1 : t->cols; }

/* The expert of group grp's local rows [i0, *i1) (row r0 + i at local row i), the longest
 * run from i0 that one expert holds; -1 from the padding rows on (they end a group). */
static int64_t expert_run(const shard_tensor *t, int64_t grp, int64_t r0, int64_t i0, int64_t *i1) {
    int64_t e = mxi_fsdp_expert_of(t, grp, r0 + i0);
    *i1 = i0 + 1;
    while (e >= 0 && *i1 < t->S && mxi_fsdp_expert_of(t, grp, r0 + *i1) == e) ++*i1;
    return e;
}

/* This rank's rows of tensor t (row r0 + i of each group at local row i): the amax keys of
 * dgrad's lines of each expert into key (n_ts * lines), as doubles for the all-reduce. Each
 * expert's rows at a time through the amax kernels (keys are |x|'s bits) into m (lines). */
static void local_keys(const mxi_fsdp *f, const shard_tensor *t, int64_t r0, double *key, uint32_t *m) {
    const mxi_mx_kernels *k = &mxi_kernels_of(MX_KERNEL_AUTO)->mx;
    int64_t lines = lines_of(f, t);
    for (int64_t i = 0; i < t->n_ts * lines; i++) key[i] = 0.0;
    for (int64_t grp = 0; grp < t->G; grp++) {
        for (int64_t i0 = 0, i1, e; i0 < t->S && (e = expert_run(t, grp, r0, i0, &i1)) >= 0; i0 = i1) {
            const float *w = f->master + t->shard_off + (grp * t->S + i0) * t->cols;
            double *ke = key + e * lines;
            if (lines == 1) m[0] = k->amax_bits(w, (i1 - i0) * t->cols);
            else k->amax_bits_cols(m, w, i1 - i0, t->cols);
            for (int64_t c = 0; c < lines; c++) ke[c] = (uint32_t)ke[c] > m[c] ? ke[c] : m[c];
        }
    }
}

/* Both planes of this rank's rows of tensor t, the dgrad scales from the whole weight's keys. */
static int quantize_planes(const mxi_fsdp *f, const shard_tensor *t, int64_t r0, const double *key) {
    const mxi_linear_mx *spec = f->spec;
    int64_t lines = lines_of(f, t);
    uint8_t *c = f->mx_cache;
    float *dequant = (float *)(void *)(c + t->c_col_s), *scale = (float *)(void *)(c + t->c_qscale);
    for (int64_t i = 0; i < t->n_ts * lines; i++) {   // the same arithmetic as the layer's quantizer
        scale[i] = mx_torchao_scale_from_amax(amax_of(key[i]), spec->weight, spec->tmode);
        dequant[i] = 1.0f / scale[i];
    }
    float *row_s = (float *)(void *)(c + t->c_row_s);
    for (int64_t grp = 0; grp < t->G; grp++) {   // fprop: each row on its own
        int64_t at = grp * t->S, valid = t->R - r0 < t->S ? t->R - r0 : t->S;
        if (valid < 0) valid = 0;
        int rc = mx_fp8_quantize_axiswise_f32(f->master + t->shard_off + at * t->cols, valid, t->cols, MX_ROWWISE,
                                              spec->weight, spec->tmode, c + t->c_row_q + at * t->cols, row_s + at);
        if (rc) return rc;
        // padding rows are never unpacked: zeros, for bits that do not depend on the memory
        memset(c + t->c_row_q + (at + valid) * t->cols, 0, (size_t)((t->S - valid) * t->cols));
        memset(c + t->c_col_q + (at + valid) * t->cols, 0, (size_t)((t->S - valid) * t->cols));
        for (int64_t i = valid; i < t->S; i++) row_s[at + i] = 0.0f;
    }
    // dgrad: each expert's rows with its column (or tensor) scales, one call a run of rows
    // (which takes the threads for a large one)
    for (int64_t grp = 0; grp < t->G; grp++)
        for (int64_t i0 = 0, i1, e; i0 < t->S && (e = expert_run(t, grp, r0, i0, &i1)) >= 0; i0 = i1) {
            int64_t at = (grp * t->S + i0) * t->cols, n = i1 - i0;
            const float *w = f->master + t->shard_off + at;
            int rc = lines == 1 ? mx_fp8_encode_axiswise_f32(w, 1, n * t->cols, MX_ROWWISE, spec->weight, scale + e,
                                                             c + t->c_col_q + at)
                                : mx_fp8_encode_axiswise_f32(w, n, t->cols, MX_COLWISE, spec->weight, scale + e * lines,
                                                             c + t->c_col_q + at);
            if (rc) return rc;
        }
    return MX_OK;
}

int mxi_fsdp_quantize_row_scaled(mxi_fsdp *f, mx_diag *diag) {
    for (int i = 0; i < f->n_tensors; i++) {
        const shard_tensor *t = &f->t[i];
        if (!t->row_scaled) continue;
        const domain *dm = &f->dom[t->dom];
        double *key = (double *)(void *)(f->mx_cache + t->c_keys);
        int64_t r0 = (int64_t)dm->rank * t->S;
        local_keys(f, t, r0, key, (uint32_t *)(void *)(f->mx_cache + t->c_qscale));   // scales not made yet: scratch
        int rc = mxi_fsdp_max_over_shards(f, i, key, t->n_ts * lines_of(f, t), "the column amaxes", diag);
        if (rc) return rc;
        rc = quantize_planes(f, t, r0, key);
        if (rc)
            return mxi_diag(diag, rc, "quantizing the shard of %s failed: %s", mxi_model_tensor_shape(f->model, i).name,
                            mx_strerror(rc));
    }
    return MX_OK;
}
