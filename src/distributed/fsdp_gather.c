/* The FSDP engine's all-gathers (see fsdp_internal.h): a unit's weights gathered from every
 * rank's shard into a unit buffer before its forward and backward, the next units of the pass
 * prefetched, and the buffer bound to the model. */
#include <string.h>

#include "core/diag.h"
#include "distributed/fsdp_internal.h"
#include "ops/nn_kernels.h"

static int free_slot(const mxi_fsdp *f, int u) {
    if (u == 0) return f->slot_unit[0] < 0 ? 0 : -1;
    for (int s = 1; s < f->n_slots; s++)
        if (f->slot_unit[s] < 0) return s;
    return -1;
}

/* What a gather of these segments costs each rank of a group of W. */
void mxi_fsdp_count_gather(mxi_fsdp_counters *c, const segment *segs, int n_segs, int W) {
    for (int i = 0; i < n_segs; i++) {
        const segment *s = &segs[i];
        uint64_t n = (uint64_t)(s->G * s->S * s->cols);
        uint64_t bytes = n * (s->type == SEG_F32 ? 4 : s->type == SEG_BF16 ? 2 : 1) * (uint64_t)W;
        if (s->kind == KIND_PARAM) c->ag_param_bytes += bytes;
        else if (s->kind == KIND_MX_DATA) c->ag_mx_data_bytes += bytes;
        else c->ag_mx_scale_bytes += bytes;
        c->ag_bf16_equiv += (uint64_t)s->bf16_equiv * (uint64_t)W;
    }
    c->all_gathers++;
}

/* The plane whose codes are segment s, of a shard not cached, quantized at once into q and
 * scales (the destinations of s and of the scales segment after it, which then has nothing
 * left to do). rows: of each group at the destination. */
static int quantize_plane(const mxi_fsdp *f, const segment *s, int64_t rows, uint8_t *q, uint8_t *scales, mx_diag *diag) {
    int rc = mxi_fsdp_quantize_shard(f, s->tensor, s->plane, rows, q, scales);
    if (rc) return mxi_diag(diag, rc, "quantizing the shard of %s failed: %s", mxi_model_tensor_shape(f->model, s->tensor).name,
                            mx_strerror(rc));
    return MX_OK;
}

/* Pack this rank's block and start unit u's all-gather; false when no buffer is free (a
 * prefetch then waits for its turn). */
static int start_gather(mxi_fsdp *f, int u, bool row, bool col, bool *started, mx_diag *diag) {
    *started = false;
    if (f->resident[u] >= 0 || f->pending[u] >= 0) return MX_OK;
    int slot = free_slot(f, u), g = -1;
    for (int i = 0; i < f->n_gathers && g < 0; i++)
        if (f->gathers[i].unit < 0) g = i;
    if (slot < 0 || g < 0) return MX_OK;
    gather_op *op = &f->gathers[g];
    for (int d = 0; d < N_DOMS; d++) {
        gather_part *pt = &op->part[d];
        pt->block = mxi_fsdp_segments(f, u, d, row, col, pt->segs, &pt->n_segs);
        if (!pt->n_segs) continue;
        mxi_fsdp_count_gather(&f->counters, pt->segs, pt->n_segs, f->dom[d].W);
        if (f->dom[d].W == 1) {   // one rank: nothing to send; unpack_part copies from the shard itself
            pt->req.active = false;
            continue;
        }
        uint8_t *own = pt->recv + (size_t)f->dom[d].rank * pt->block;   // packed in place
        for (int i = 0; i < pt->n_segs; i++) {
            const segment *s = &pt->segs[i];
            int64_t n = s->G * s->S * s->cols;
            uint8_t *dst = own + s->wire_off;
            if (s->type == SEG_BYTES && f->t[s->tensor].cached) {
                memcpy(dst, f->mx_cache + s->src_at, (size_t)n);
            } else if (s->type == SEG_BYTES) {
                int rc = s->kind != KIND_MX_DATA ? MX_OK
                         : quantize_plane(f, s, f->t[s->tensor].S, dst, own + pt->segs[i + 1].wire_off, diag);
                if (rc) return rc;
            } else {
                const float *src = (const float *)(const void *)((const uint8_t *)f->master + s->src_at);
                if (s->type == SEG_F32) memcpy(dst, src, (size_t)n * 4);
                else mxi_bf16_round((uint16_t *)(void *)dst, src, n);
            }
        }
        int rc = mxi_comm_iallgather(f->dom[d].comm, NULL, pt->recv, pt->block, &pt->req, diag);
        if (rc) return rc;
        mxi_fsdp_label(f, &pt->req, true, u, d);
    }
    op->unit = u, op->slot = slot, op->row = row, op->col = col;
    f->slot_unit[slot] = u;
    f->pending[u] = g;
    *started = true;
    return MX_OK;
}

/* Point the model's tensors of unit u at its buffer. */
static void bind_unit(mxi_fsdp *f, int u) {
    uint8_t *slot = f->slots[f->resident[u]];
    const shard_unit *su = &f->u[u];
    for (int i = 0; i < su->n; i++) {
        int id = su->tensors[i];
        shard_tensor *t = &f->t[id];
        if (!t->mx) {
            mxi_fsdp_bind_weights(f, id, slot, NULL);
            mxi_model_bind_planes(f->model, id, NULL);
            continue;
        }
        const mx_elem e = f->spec->weight;
        mxi_mx_plane none = {0};
        if (t->tensor_scaled || t->block_scaled) {   // the codes, and the scales every rank computed
            const float *s = (const float *)(const void *)(f->mx_cache + t->c_row_s);
            t->planes = (mxi_mx_weight){.row = {.q = slot + t->row_q, .rows = t->R_model, .cols = t->cols,
                                                .axis = MX_ROWWISE, .elem = e},
                                        .tscale = t->tensor_scaled ? s : NULL, .bscale = t->block_scaled ? s : NULL};
            mxi_model_bind_tensor(f->model, id, NULL, NULL);
            mxi_model_bind_planes(f->model, id, &t->planes);
            continue;
        }
        if (t->row_scaled) {   // the codes with the row scales gathered and the column scales of the cache
            bool r = f->has_row[u], c = f->has_col[u];
            t->planes = (mxi_mx_weight){
                .row = r ? (mxi_mx_plane){.q = slot + t->row_q, .rows = t->R_model, .cols = t->cols, .axis = MX_ROWWISE, .elem = e}
                         : none,
                .col = c ? (mxi_mx_plane){.q = slot + t->col_q, .rows = t->R_model, .cols = t->cols, .axis = MX_COLWISE, .elem = e}
                         : none,
                .row_scales = r ? (const float *)(const void *)(slot + t->row_s) : NULL,
                .col_scales = c ? (const float *)(const void *)(f->mx_cache + t->c_col_s) : NULL,
                .col_per_group = f->spec->dgrad_weight_tensor ? 1 : t->cols};
            mxi_model_bind_tensor(f->model, id, NULL, NULL);
            mxi_model_bind_planes(f->model, id, &t->planes);
            continue;
        }
        mxi_mx_plane row = {.q = slot + t->row_q, .scales = slot + t->row_s, .rows = t->R_model, .cols = t->cols,
                            .axis = MX_ROWWISE, .elem = e};
        mxi_mx_plane col = {.q = slot + t->col_q, .scales = slot + t->col_s, .rows = t->R_model, .cols = t->cols,
                            .axis = MX_COLWISE, .elem = e};
        t->planes.row = f->has_row[u] ? row : none;
        t->planes.col = f->has_col[u] ? col : none;
        mxi_model_bind_tensor(f->model, id, NULL, NULL);
        mxi_model_bind_planes(f->model, id, &t->planes);
    }
}

/* Wait for layout d's part of a gather and copy every rank's pieces into the unit buffer. */
static int unpack_part(mxi_fsdp *f, gather_part *pt, int d, uint8_t *slot, mx_diag *diag) {
    const mxi_nn_kernels *kern = mxi_nn_kernels_active();
    if (f->dom[d].W == 1) {   // the unit is this rank's shard: one pass from it, no wire buffers
        for (int i = 0; i < pt->n_segs; i++) {
            const segment *s = &pt->segs[i];
            if (s->type == SEG_BYTES && !f->t[s->tensor].cached) {   // quantized straight into the unit buffer
                int rc = s->kind != KIND_MX_DATA ? MX_OK
                         : quantize_plane(f, s, s->R, slot + s->dst_off, slot + pt->segs[i + 1].dst_off, diag);
                if (rc) return rc;
                continue;
            }
            bool half = s->type == SEG_BF16 && f->t[s->tensor].half;
            size_t src_elem = s->type == SEG_BYTES ? 1 : 4, out_elem = half ? 2 : src_elem;
            const uint8_t *base = s->type == SEG_BYTES ? f->mx_cache : (const uint8_t *)f->master;
            for (int64_t grp = 0; grp < s->G; grp++) {   // (R, cols) of each group from its (S, cols), S >= R
                const uint8_t *src = base + s->src_at + (size_t)(grp * s->S * s->cols) * src_elem;
                uint8_t *dst = slot + s->dst_off + (size_t)(grp * s->R * s->cols) * out_elem;
                int64_t n = s->R * s->cols;
                if (half) mxi_bf16_round((uint16_t *)(void *)dst, (const float *)(const void *)src, n);
                else if (s->type == SEG_BF16) mxi_bf16_round_f32((float *)(void *)dst, (const float *)(const void *)src, n);
                else MXI_PARALLEL_CHUNKS((int64_t)((size_t)n * src_elem), memcpy(dst + i0, src + i0, (size_t)len));
            }
        }
        return MX_OK;
    }
    int rc = mxi_comm_wait(f->dom[d].comm, &pt->req, diag), W = f->dom[d].W;
    if (rc) return rc;
    for (int i = 0; i < pt->n_segs; i++) {
        const segment *s = &pt->segs[i];
        bool half = s->type == SEG_BF16 && f->t[s->tensor].half;   // bf16 on the wire and in the buffer
        size_t in_elem = s->type == SEG_F32 ? 4 : s->type == SEG_BF16 ? 2 : 1;
        size_t out_elem = s->type == SEG_BYTES || half ? in_elem : 4;
        #pragma omp parallel for collapse(2) schedule(static)
        for (int r = 0; r < W; r++)
            for (int64_t grp = 0; grp < s->G; grp++) {
                int64_t r0 = (int64_t)r * s->S, rows = s->R - r0 < s->S ? s->R - r0 : s->S;
                if (rows <= 0) continue;
                const uint8_t *src =
                    pt->recv + (size_t)r * pt->block + s->wire_off + (size_t)(grp * s->S * s->cols) * in_elem;
                uint8_t *dst = slot + s->dst_off + (size_t)((grp * s->R + r0) * s->cols) * out_elem;
                int64_t n = rows * s->cols;
                if (s->type == SEG_BF16 && !half) {
                    kern->bf16_widen((float *)(void *)dst, (const uint16_t *)(const void *)src, n, 0);
                } else {
                    memcpy(dst, src, (size_t)n * in_elem);
                }
            }
    }
    return MX_OK;
}

/* Wait for unit u's gather, then lay every rank's rows out in the unit buffer. */
static int finish_gather(mxi_fsdp *f, int u, mx_diag *diag) {
    int g = f->pending[u];
    gather_op *op = &f->gathers[g];
    uint8_t *slot = f->slots[op->slot];
    for (int d = 0; d < N_DOMS; d++) {
        int rc = op->part[d].n_segs ? unpack_part(f, &op->part[d], d, slot, diag) : MX_OK;
        if (rc) return rc;
    }
    if (f->spec && f->spec->weight_tiles && f->opt.low_precision) {   // spread tile scales for both GEMMs
        const shard_unit *su = &f->u[u];
        for (int i = 0; i < su->n; i++) {
            const shard_tensor *t = &f->t[su->tensors[i]];
            if (!t->mx) continue;
            int64_t CB = CEIL_DIV(t->cols, 32), RB = CEIL_DIV(t->R, 32);
            for (int64_t grp = 0; grp < t->G; grp++) {
                const uint8_t *tiles = slot + t->tiles + grp * RB * CB;
                mxi_tiles_spread(slot + t->row_s + grp * t->R * CB, tiles, t->R, t->cols, MX_ROWWISE);
                mxi_tiles_spread(slot + t->col_s + grp * RB * t->cols, tiles, t->R, t->cols, MX_COLWISE);
            }
        }
    }
    f->resident[u] = op->slot;
    // one plane for both products: 32x32 tiles, and a per-tensor or the blockwise recipe's codes
    bool one = f->spec && (f->spec->weight_tiles || f->spec->scaling == MXI_SCALE_TENSOR ||
                           f->spec->scaling == MXI_SCALE_BLOCKS128);
    f->has_row[u] = op->row || one;
    f->has_col[u] = op->col || one;
    f->pending[u] = -1;
    op->unit = -1;
    bind_unit(f, u);
    return MX_OK;
}

void mxi_fsdp_release(mxi_fsdp *f, int u) {
    if (f->resident[u] < 0) return;
    f->slot_unit[f->resident[u]] = -1;
    f->resident[u] = -1;
    f->has_row[u] = f->has_col[u] = false;
}

/* ---- a pass's order, and prefetching ---- */

/* The k-th unit a pass visits, or -1 past its end. With an embedding unit (L + 1), forward
 * visits it, blocks 1..L, then the root; backward the root, blocks L..1, then it. Without
 * (lm_head shares the embedding, which the root then holds), the root comes first both ways. */
static int visit(const mxi_fsdp *f, bool forward, int k) {
    bool embedding = mxi_fsdp_is_embedding_unit(f, f->n_units - 1);
    int L = f->n_units - 1 - embedding;
    if (k < 0 || k >= f->n_units) return -1;
    if (k == 0) return forward && embedding ? L + 1 : 0;
    if (k <= L) return forward ? k : L + 1 - k;
    return forward ? 0 : L + 1;
}

/* The unit `ahead` places after u in this pass, or -1. */
static int next_unit(const mxi_fsdp *f, int u, bool forward, int ahead) {
    for (int k = 0; k < f->n_units; k++)
        if (visit(f, forward, k) == u) return visit(f, forward, k + ahead);
    return -1;
}

int mxi_fsdp_ensure(mxi_fsdp *f, int u, bool forward, mx_diag *diag) {
    bool row, col;
    mxi_fsdp_planes_for(f, u, forward, &row, &col);
    if (f->resident[u] >= 0 && (!row || f->has_row[u]) && (!col || f->has_col[u])) {
        bind_unit(f, u);
    } else {
        if (f->resident[u] >= 0) mxi_fsdp_release(f, u);   // resident without the plane needed: gather again
        bool started;
        int rc = start_gather(f, u, row, col, &started, diag);
        if (rc) return rc;
        if (f->pending[u] < 0)
            return mxi_diag(diag, MX_EINVAL, "no free buffer to gather unit %d (an FSDP bookkeeping bug)", u);
    }
    // prefetch the next units of this pass while this one computes
    int ahead = forward ? f->opt.forward_prefetch : f->opt.backward_prefetch;
    for (int a = 1; a <= ahead; a++) {
        int v = next_unit(f, u, forward, a);
        if (v < 0 || (!forward && mxi_fsdp_is_embedding_unit(f, v))) break;
        bool prow, pcol, started;
        mxi_fsdp_planes_for(f, v, forward, &prow, &pcol);
        int rc = start_gather(f, v, prow, pcol, &started, diag);
        if (rc) return rc;
    }
    if (f->pending[u] >= 0) return finish_gather(f, u, diag);
    return MX_OK;
}

const mxi_mx_weight *mxi_fsdp_gathered_planes(const mxi_fsdp *f, int i) {
    const shard_tensor *t = &f->t[i];
    if (!t->mx || f->resident[t->unit] < 0) return NULL;
    return &t->planes;
}
