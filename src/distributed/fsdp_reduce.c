/* The FSDP engine's gradient reduction (see fsdp_internal.h): after a unit's backward its
 * gradients are reduce-scattered to the shards and, across replicas, all-reduced, then summed
 * into the gradient shards over the micro-batches of a step. */
#include <string.h>

#include "distributed/fsdp_internal.h"
#include "ops/nn_kernels.h"

size_t mxi_fsdp_reduce_elem(const mxi_fsdp *f) {
    return f->opt.reduce == MXI_WIRE_BF16 ? 2 : f->opt.reduce == MXI_WIRE_F64 ? 8 : 4;
}

bool mxi_fsdp_reduce_direct(const mxi_fsdp *f, int d) {
    return f->dom[d].W == 1 && f->dom[d].D <= 1 && f->opt.reduce == MXI_WIRE_F32;
}

/* Elements the bf16 gradient shards are summed into a piece at a time (through fp32). */
enum { PIECE = 4096 };

void mxi_fsdp_add_grads(mxi_fsdp *f, int64_t at, const float *src, const uint16_t *src16, int64_t n) {
    if (f->grads && src16) {
        mxi_bf16_widen(f->grads + at, src16, n, 1);
    } else if (f->grads) {
        float *g = f->grads + at;
        #pragma omp parallel for schedule(static) if (n > 65536)
        for (int64_t i = 0; i < n; i++) g[i] += src[i];
    } else {
        const mxi_nn_kernels *k = mxi_nn_kernels_active();
        int64_t pieces = (n + PIECE - 1) / PIECE;
        #pragma omp parallel for schedule(static) if (pieces > 16)
        for (int64_t p = 0; p < pieces; p++) {
            float sum[PIECE];
            int64_t i0 = p * PIECE, len = n - i0 < PIECE ? n - i0 : PIECE;
            uint16_t *g = f->grads16 + at + i0;
            if (src16) k->bf16_widen(sum, src16 + i0, len, 0);
            else memcpy(sum, src + i0, (size_t)len * sizeof(float));
            k->bf16_widen(sum, g, len, 1);
            k->bf16_round(g, sum, len);
        }
    }
}

/* The reduced shard recv of layout d's part of unit u into the gradient shards (or their fp64
 * sums), tensor by tensor: a sunk one has no place in it. */
static void accumulate(mxi_fsdp *f, int u, int d, const uint8_t *recv) {
    const shard_unit *su = &f->u[u];
    for (int k = 0; k < su->n; k++) {
        const shard_tensor *t = &f->t[su->tensors[k]];
        if (t->dom != d || t->sunk) continue;
        int64_t n = t->G * t->S * t->cols, at = t->shard_off;
        if (f->opt.reduce == MXI_WIRE_F64) {
            const double *r = (const double *)(const void *)recv + t->red_off;
            double *g = f->grad_sums + at;
            #pragma omp parallel for schedule(static) if (n > 65536)
            for (int64_t i = 0; i < n; i++) g[i] += r[i];
        } else if (f->opt.reduce == MXI_WIRE_BF16) {
            mxi_fsdp_add_grads(f, at, NULL, (const uint16_t *)(const void *)recv + t->red_off, n);
        } else {
            mxi_fsdp_add_grads(f, at, (const float *)(const void *)recv + t->red_off, NULL, n);
        }
    }
}

/* Move layout d's part of op on as far as it goes: when its reduce-scatter has finished, start
 * the all-reduce of its shard across the replicas (HSDP, expert replicas; only when
 * may_all_reduce); when that has finished too, add the result to the gradient shards. With
 * wait, block until all of it is done; without, take only what has finished (never blocks). */
static int progress_part(mxi_fsdp *f, reduce_op *op, int d, bool wait, bool may_all_reduce, mx_diag *diag) {
    struct reduce_part *p = &op->part[d];
    const domain *dm = &f->dom[d];
    int rc;
    if (p->stage == RED_SCATTER) {
        if (!wait) {
            mxi_comm_poke(dm->comm, &p->req);
            if (p->req.active) return MX_OK;
        }
        if ((rc = mxi_comm_wait(dm->comm, &p->req, diag))) return rc;
        if (dm->replicas) {
            if (!may_all_reduce) return MX_OK;
            size_t n = (size_t)f->u[op->unit].red_numel[d];
            f->counters.ar_bytes += (uint64_t)n * mxi_fsdp_reduce_elem(f);
            f->counters.all_reduces++;
            if ((rc = mxi_comm_iallreduce(dm->replicas, p->recv, n, f->opt.reduce, &p->req, diag))) return rc;
            mxi_fsdp_label(f, &p->req, false, op->unit, d);
            p->stage = RED_ALL_REDUCE;
        } else {
            accumulate(f, op->unit, d, p->recv);
            p->stage = RED_IDLE;
            return MX_OK;
        }
    }
    if (p->stage == RED_ALL_REDUCE) {
        if (!wait) {
            mxi_comm_poke(dm->replicas, &p->req);
            if (p->req.active) return MX_OK;
        }
        if ((rc = mxi_comm_wait(dm->replicas, &p->req, diag))) return rc;
        accumulate(f, op->unit, d, p->recv);
        p->stage = RED_IDLE;
    }
    return MX_OK;
}

/* Every part of op; op is free once all are done. may_all_reduce: by layout. */
static int progress_reduce(mxi_fsdp *f, reduce_op *op, bool wait, const bool *may_all_reduce, mx_diag *diag) {
    if (op->unit < 0) return MX_OK;
    for (int d = 0; d < N_DOMS; d++) {
        int rc = progress_part(f, op, d, wait, may_all_reduce[d], diag);
        if (rc) return rc;
    }
    bool busy = false;
    for (int d = 0; d < N_DOMS; d++) busy |= op->part[d].stage != RED_IDLE;
    if (!busy) op->unit = -1;
    return MX_OK;
}

/* Both reduce ops, the older first. The younger starts an all-reduce only after the older
 * has started its own of the same layout: every rank then starts them in the same order
 * (unit order), as MPI requires of the collectives on one communicator. */
int mxi_fsdp_progress_reduces(mxi_fsdp *f, bool wait, mx_diag *diag) {
    reduce_op *older = &f->reduces[f->next_reduce], *younger = &f->reduces[f->next_reduce ^ 1];
    const bool yes[N_DOMS] = {true, true};
    int rc = progress_reduce(f, older, wait, yes, diag);
    if (rc) return rc;
    bool may[N_DOMS];
    for (int d = 0; d < N_DOMS; d++) may[d] = older->unit < 0 || older->part[d].stage != RED_SCATTER;
    return progress_reduce(f, younger, wait, may, diag);
}

void mxi_fsdp_finish_grads(mxi_fsdp *f, double count) {
    int64_t n = f->shard_numel;
    float *g = f->grads;
    if (!f->grad_sums && count == 1.0) return;   // x / 1 is x: one rank, one micro-batch
    if (g && f->grad_sums) {
        const double *s = f->grad_sums;
        #pragma omp parallel for schedule(static) if (n > 65536)
        for (int64_t i = 0; i < n; i++) g[i] = (float)(s[i] / count);
    } else if (g) {
        float c = (float)count;
        #pragma omp parallel for schedule(static) if (n > 65536)
        for (int64_t i = 0; i < n; i++) g[i] /= c;
    } else {   // bf16 shards: the same quotients, rounded
        const mxi_nn_kernels *k = mxi_nn_kernels_active();
        const double *s = f->grad_sums;
        float c = (float)count;
        int64_t pieces = (n + PIECE - 1) / PIECE;
        #pragma omp parallel for schedule(static) if (pieces > 16)
        for (int64_t p = 0; p < pieces; p++) {
            float q[PIECE];
            int64_t i0 = p * PIECE, len = n - i0 < PIECE ? n - i0 : PIECE;
            if (s) {
                for (int64_t i = 0; i < len; i++) q[i] = (float)(s[i0 + i] / count);
            } else {
                k->bf16_widen(q, f->grads16 + i0, len, 0);
                for (int64_t i = 0; i < len; i++) q[i] /= c;
            }
            k->bf16_round(f->grads16 + i0, q, len);
        }
    }
}

/* Pack layout d's part of unit u's unsharded gradients rank by rank in shard layout and
 * start its reduce-scatter. */
static int start_reduce_part(mxi_fsdp *f, reduce_op *op, int u, int d, const float *full, mx_diag *diag) {
    const mxi_nn_kernels *kern = mxi_nn_kernels_active();
    const shard_unit *su = &f->u[u];
    mxi_wire_dtype wire = f->opt.reduce;
    bool direct = mxi_fsdp_reduce_direct(f, d);
    int64_t block = direct ? su->part_numel[d] : su->red_numel[d];
    struct reduce_part *p = &op->part[d];
    int W = f->dom[d].W;
    if (!block) return MX_OK;   // every gradient of it went to the shards by slices (sunk)
    f->counters.rs_bytes += (uint64_t)block * (uint64_t)W * mxi_fsdp_reduce_elem(f);
    f->counters.reduce_scatters++;
    if (f->grads_direct) return MX_OK;   // the model added them into the shard itself
    if (direct) {
        // the unit's gradients go straight into the shard (the same additions accumulate
        // would make; the traffic was counted above as if sent, as the accounting of every
        // layout is)
        for (int i = 0; i < su->n; i++) {
            const shard_tensor *t = &f->t[su->tensors[i]];
            if (t->dom != d || t->sunk) continue;   // a sunk one is there already
            for (int64_t grp = 0; grp < t->G; grp++)   // (R, cols) of each group into its (S, cols), S >= R
                mxi_fsdp_add_grads(f, t->shard_off + grp * t->S * t->cols, full + t->unit_off + grp * t->R * t->cols,
                                   NULL, t->R * t->cols);
        }
        return MX_OK;
    }
    for (int i = 0; i < su->n; i++) {
        const shard_tensor *t = &f->t[su->tensors[i]];
        if (t->dom != d || t->sunk) continue;
        int64_t local = t->red_off;
        #pragma omp parallel for collapse(2) schedule(static)
        for (int r = 0; r < W; r++)
            for (int64_t grp = 0; grp < t->G; grp++) {
                int64_t r0 = (int64_t)r * t->S, rows = t->R - r0 < t->S ? t->R - r0 : t->S;
                if (rows < 0) rows = 0;   // a rank with padding only
                const float *src = rows > 0 ? full + t->unit_off + (grp * t->R + r0) * t->cols : full;
                int64_t at = (int64_t)r * block + local + grp * t->S * t->cols, n = rows * t->cols, all = t->S * t->cols;
                if (wire == MXI_WIRE_BF16) {
                    uint16_t *o = (uint16_t *)(void *)p->send + at;
                    kern->bf16_round(o, src, n);
                    memset(o + n, 0, (size_t)(all - n) * 2);
                } else if (wire == MXI_WIRE_F64) {
                    double *o = (double *)(void *)p->send + at;
                    for (int64_t j = 0; j < n; j++) o[j] = src[j];
                    memset(o + n, 0, (size_t)(all - n) * 8);
                } else {
                    float *o = (float *)(void *)p->send + at;
                    memcpy(o, src, (size_t)n * 4);
                    memset(o + n, 0, (size_t)(all - n) * 4);
                }
            }
    }
    int rc = mxi_comm_ireduce_scatter(f->dom[d].comm, p->send, p->recv, (size_t)block, wire, &p->req, diag);
    if (rc) return rc;
    mxi_fsdp_label(f, &p->req, false, u, d);
    p->stage = RED_SCATTER;
    op->unit = u;
    return MX_OK;
}

/* Unit u's reduce-scatters, one per layout it has tensors of, in a free reduce op. */
int mxi_fsdp_start_reduce(mxi_fsdp *f, int u, const float *full, mx_diag *diag) {
    reduce_op *op = &f->reduces[f->next_reduce];   // the older: free once it is finished
    const bool yes[N_DOMS] = {true, true};
    int rc = progress_reduce(f, op, true, yes, diag);
    if (rc) return rc;
    f->next_reduce ^= 1;
    for (int d = 0; d < N_DOMS && !rc; d++)
        if (f->u[u].part_numel[d]) rc = start_reduce_part(f, op, u, d, full, diag);
    return rc;
}

int mxi_fsdp_end_backward(mxi_fsdp *f, mx_diag *diag) { return mxi_fsdp_progress_reduces(f, true, diag); }
