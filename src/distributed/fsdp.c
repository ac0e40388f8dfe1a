/* FSDP2-style sharding over MPI (see fsdp.h): the engine's creation, its step, and the unit
 * hooks through which the model's passes drive its gathers and reductions. The rest of the
 * engine is in the files fsdp_internal.h lists. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/diag.h"
#include "distributed/fsdp_internal.h"

/* ---- create ---- */

static int on_unit(void *ctx, int unit, mxi_unit_event event, mx_diag *diag);

/* This rank's FSDP group and replica group: rank r of W is rank r % F of group r / F (the
 * groups are consecutive ranks, as torch's DeviceMesh(dp, shard) lays them out) and rank
 * r / F of the replica group of ranks r % F + k F. */
static int on_unit(void *ctx, int u, mxi_unit_event event, mx_diag *diag);
static int add_grad(void *ctx, int id, int64_t row0, int64_t rows, float *src, mx_diag *diag);

static int join_groups(mxi_fsdp *f, mxi_comm *world, mx_diag *diag) {
    int W = mxi_comm_world(world), r = mxi_comm_rank(world), D = f->opt.replicas > 1 ? f->opt.replicas : 1;
    if (W % D)
        return mxi_diag(diag, MX_EINVAL, "mxi_fsdp_create: %d replicas do not divide the %d ranks", D, W);
    f->world = world, f->replicas = D;
    if (D == 1) {
        f->comm = world;
    } else {
        int F = W / D, rc = mxi_comm_split(world, r / F, r % F, &f->shard_group, diag);
        if (!rc) rc = mxi_comm_split(world, r % F, r / F, &f->replica_group, diag);
        if (rc) return rc;
        f->comm = f->shard_group, f->replica = r / F;
    }
    f->W = mxi_comm_world(f->comm), f->rank = mxi_comm_rank(f->comm);
    f->dom[DOM_DENSE] = (domain){.comm = f->comm, .replicas = f->replica_group, .W = f->W, .rank = f->rank,
                                 .D = f->replicas, .replica = f->replica};
    if (f->EP == 1) return MX_OK;
    // the experts: rank r is EP rank r % EP (its EP group: EP consecutive ranks), rank
    // (r / EP) % EF of its expert shard group and replica r / (EP EF) of its experts
    int EP = f->EP, ED = f->opt.expert_replicas > 1 ? f->opt.expert_replicas : 1;
    if (W % (EP * ED))
        return mxi_diag(diag, MX_EINVAL, "mxi_fsdp_create: %d EP ranks x %d expert replicas do not divide the %d ranks",
                        EP, ED, W);
    int EF = W / (EP * ED), rc;
    f->ep_rank = r % EP;
    domain *x = &f->dom[DOM_EXPERTS];
    x->D = ED, x->replica = r / (EP * EF);
    rc = mxi_comm_split(world, x->replica * EP + f->ep_rank, (r / EP) % EF, &f->eshard_group, diag);
    if (!rc && ED > 1) rc = mxi_comm_split(world, r % (EP * EF), x->replica, &f->ereplica_group, diag);
    if (!rc && ED > 1) rc = mxi_comm_split(world, x->replica, r, &f->emesh_group, diag);
    if (rc) return rc;
    x->comm = f->eshard_group, x->replicas = f->ereplica_group;
    x->W = mxi_comm_world(x->comm), x->rank = mxi_comm_rank(x->comm);
    return MX_OK;
}

int mxi_fsdp_create(mx_model *model, mxi_comm *comm, const mxi_fsdp_options *opt, mxi_fsdp **out, mx_diag *diag) {
    *out = NULL;
    if (mx_model_params(model))
        return mxi_diag(diag, MX_EINVAL, "mxi_fsdp_create: the model owns its parameters (create it with external_params)");
    mxi_fsdp *f = calloc(1, sizeof *f);
    if (!f) return mxi_diag(diag, MX_ENOMEM, "out of memory (%zu bytes for the FSDP engine)", sizeof *f);
    f->model = model;
    mxi_fsdp_set_options(f, opt);
    int rc = join_groups(f, comm, diag);
    if (rc) {
        mxi_fsdp_free(f);
        return rc;
    }
    mxi_model_weights_bf16(model, f->opt.param_bf16);   // gathered bf16, widened: already bf16 values
    f->resident = malloc((size_t)f->n_units * sizeof *f->resident);
    f->pending = malloc((size_t)f->n_units * sizeof *f->pending);
    f->has_row = calloc((size_t)f->n_units, sizeof *f->has_row);
    f->has_col = calloc((size_t)f->n_units, sizeof *f->has_col);
    size_t cache = 0;
    const char *what = "the unit tables";   // what the allocation that failed was for, and its size
    size_t asked = (size_t)f->n_units * (sizeof *f->resident + sizeof *f->pending + sizeof *f->has_row + sizeof *f->has_col);
    if (!f->resident || !f->pending || !f->has_row || !f->has_col || mxi_fsdp_lay_out(f, &cache)) goto nomem;
    for (int u = 0; u < f->n_units; u++) f->resident[u] = f->pending[u] = -1;
    int64_t shard = f->shard_numel;
    what = "the shards (master weights, gradients, MX cache)";
    bool bf16 = f->opt.grads == MXI_WIRE_BF16;
    asked = (size_t)shard * (4 + (bf16 ? 2 : 4) + (f->opt.reduce == MXI_WIRE_F64 ? sizeof(double) : 0)) + cache;
    f->master = calloc((size_t)shard ? (size_t)shard : 1, sizeof(float));
    if (bf16) f->grads16 = calloc((size_t)shard ? (size_t)shard : 1, sizeof(uint16_t));
    else f->grads = calloc((size_t)shard ? (size_t)shard : 1, sizeof(float));
    f->mx_cache = cache ? calloc(cache, 1) : NULL;
    if (f->opt.reduce == MXI_WIRE_F64) f->grad_sums = calloc((size_t)shard ? (size_t)shard : 1, sizeof(double));
    if (!f->master || !(f->grads || f->grads16) || (cache && !f->mx_cache) ||
        (f->opt.reduce == MXI_WIRE_F64 && !f->grad_sums))
        goto nomem;
    buffer_sizes b;
    if (mxi_fsdp_size_buffers(f, &b)) goto nomem;
    what = "the gather buffers";
    asked = b.total;
    f->seg_pool = calloc((size_t)(f->n_gathers * N_DOMS * b.max_segs), sizeof *f->seg_pool);
    f->block_mem = aligned_alloc(64, b.total ? b.total : 64);
    f->slots = calloc((size_t)f->n_slots, sizeof *f->slots);
    f->slot_unit = malloc((size_t)f->n_slots * sizeof *f->slot_unit);
    f->gathers = calloc((size_t)f->n_gathers, sizeof *f->gathers);
    if (!f->seg_pool || !f->block_mem || !f->slots || !f->slot_unit || !f->gathers) goto nomem;
    uint8_t *p = f->block_mem;
    memset(p, 0, b.total);   // touch it now: the memory counted is memory held
    f->slots[0] = p, p += b.slot0;
    for (int s = 1; s < f->n_slots; s++) f->slots[s] = p, p += b.slotn;
    for (int s = 0; s < f->n_slots; s++) f->slot_unit[s] = -1;
    for (int g = 0; g < f->n_gathers; g++) {
        f->gathers[g].unit = -1;
        for (int d = 0; d < N_DOMS; d++) {
            f->gathers[g].part[d].recv = p, p += ROUND64(b.block[d] * (size_t)f->dom[d].W);
            f->gathers[g].part[d].segs = f->seg_pool + (g * N_DOMS + d) * b.max_segs;
        }
    }
    for (int r = 0; r < 2; r++) {
        f->reduces[r].unit = -1;
        for (int d = 0; d < N_DOMS; d++) {
            f->reduces[r].part[d].send = p, p += ROUND64(b.rs_elems[d] * b.rs_elem * (size_t)f->dom[d].W);
            f->reduces[r].part[d].recv = f->reduces[r].part[d].send;   // reduced in place: the first block
        }
    }
    f->root_grad = (float *)(void *)p, p += ROUND64((size_t)b.root_full * 4);
    f->block_grad = (float *)(void *)p, p += ROUND64((size_t)b.block_full * 4);
    f->mem = mxi_fsdp_count_memory(f, cache, b.total);
    if (f->sink_reduces && !(f->sink_counts = calloc((size_t)f->W, sizeof *f->sink_counts))) goto nomem;
    mxi_model_hooks hooks = {.ctx = f, .on_unit = on_unit, .add_grad = f->any_sunk ? add_grad : NULL,
                             .collective = f->sink_reduces};
    what = "the model's gradient slices";
    asked = (size_t)mxi_model_sink_bytes(model);
    if (mxi_model_set_hooks(model, &hooks)) goto nomem;
    *out = f;
    return MX_OK;
nomem:
    mxi_fsdp_free(f);
    return mxi_diag(diag, MX_ENOMEM, "out of memory for the FSDP shards and buffers: %s, %zu bytes", what, asked);
}

void mxi_fsdp_free(mxi_fsdp *f) {
    if (!f) return;
    if (f->u) free(f->u[0].tensors);
    free(f->t), free(f->u), free(f->resident), free(f->pending), free(f->has_row), free(f->has_col);
    free(f->sink_counts), free(f->seg_pool), free(f->block_mem), free(f->slots), free(f->slot_unit), free(f->gathers);
    free(f->master), free(f->grads), free(f->grads16), free(f->mx_cache), free(f->grad_sums);
    mxi_comm_free(f->replica_group), mxi_comm_free(f->shard_group);
    mxi_comm_free(f->emesh_group), mxi_comm_free(f->ereplica_group), mxi_comm_free(f->eshard_group);
    free(f);
}

int64_t mxi_fsdp_shard_numel(const mxi_fsdp *f) { return f->shard_numel; }
float *mxi_fsdp_master(mxi_fsdp *f) { return f->master; }
float *mxi_fsdp_grads(mxi_fsdp *f) { return f->grads; }
uint16_t *mxi_fsdp_grads_bf16(mxi_fsdp *f) { return f->grads16; }
mxi_fsdp_memory mxi_fsdp_memory_of(const mxi_fsdp *f) { return f->mem; }
mxi_fsdp_counters mxi_fsdp_counters_of(const mxi_fsdp *f) { return f->counters; }

mxi_shard_span mxi_fsdp_span(const mxi_fsdp *f, int i) {
    const shard_tensor *t = &f->t[i];
    return (mxi_shard_span){.offset = t->shard_off, .numel = t->G * t->S * t->cols, .decay = t->decay};
}

bool mxi_fsdp_norm_span(const mxi_fsdp *f, int k, mxi_shard_span *out) {
    int found = -1;
    int64_t start = 0, end = -1;
    for (int u = 0; u < f->n_units; u++)
        for (int d = 0; d < N_DOMS; d++) {
            const shard_unit *su = &f->u[u];
            if (f->dom[d].replica != 0 || !su->part_numel[d]) continue;   // the replicas hold the same shards
            if (su->part_off[d] == end) {   // contiguous with the span so far
                end += su->part_numel[d];
                continue;
            }
            if (found == k) goto done;
            found++, start = su->part_off[d], end = start + su->part_numel[d];
        }
    if (found != k) return false;
done:
    *out = (mxi_shard_span){.offset = start, .numel = end - start, .decay = false};
    return true;
}

int mxi_fsdp_replica(const mxi_fsdp *f) { return f->replica; }
int mxi_fsdp_replicas(const mxi_fsdp *f) { return f->replicas; }

/* ---- step ---- */

int mxi_fsdp_begin_step(mxi_fsdp *f, mx_diag *diag) {
    for (int u = 0; u < f->n_units; u++) mxi_fsdp_release(f, u);   // last step's weights are stale
    if (f->grads) memset(f->grads, 0, (size_t)f->shard_numel * sizeof(float));
    if (f->grads16) memset(f->grads16, 0, (size_t)f->shard_numel * sizeof(uint16_t));
    if (f->grad_sums) memset(f->grad_sums, 0, (size_t)f->shard_numel * sizeof(double));
    memset(&f->counters, 0, sizeof f->counters);
    for (int i = 0; i < f->n_tensors; i++) {
        const shard_tensor *t = &f->t[i];
        if (!t->cached || t->tensor_scaled || t->row_scaled || t->block_scaled) continue;
        uint8_t *c = f->mx_cache;
        int rc = f->spec->weight_tiles ? mxi_fsdp_quantize_shard(f, i, PLANE_TILES, t->S, c + t->c_row_q, c + t->c_tiles)
                                       : mxi_fsdp_quantize_shard(f, i, PLANE_ROW, t->S, c + t->c_row_q, c + t->c_row_s);
        if (!rc && !f->spec->weight_tiles) rc = mxi_fsdp_quantize_shard(f, i, PLANE_COL, t->S, c + t->c_col_q, c + t->c_col_s);
        if (rc) return mxi_diag(diag, rc, "quantizing the shard of %s failed: %s", mxi_model_tensor_shape(f->model, i).name,
                                mx_strerror(rc));
    }
    if (f->opt.low_precision && f->spec->scaling == MXI_SCALE_TENSOR) return mxi_fsdp_quantize_tensor_scaled(f, diag);
    if (f->opt.low_precision && f->spec->scaling == MXI_SCALE_ROWS) return mxi_fsdp_quantize_row_scaled(f, diag);
    if (f->opt.low_precision && f->spec->scaling == MXI_SCALE_BLOCKS128) return mxi_fsdp_quantize_block_scaled(f, diag);
    return MX_OK;
}

int mxi_fsdp_begin_micro(mxi_fsdp *f, mx_diag *diag) {
    if (!f->opt.low_precision || f->spec->scaling != MXI_SCALE_TENSOR || !mxi_model_delayed(f->model)) return MX_OK;
    for (int u = 0; u < f->n_units; u++) mxi_fsdp_release(f, u);   // gathered with the last forward's scales
    return mxi_fsdp_quantize_tensor_scaled(f, diag);
}

int mxi_fsdp_quantize_shard(const mxi_fsdp *f, int id, int plane, int64_t rows, uint8_t *q, uint8_t *scales) {
    const shard_tensor *t = &f->t[id];
    const mxi_linear_mx *spec = f->spec;
    int64_t CB = CEIL_DIV(t->cols, 32), RB = CEIL_DIV(rows, 32);
    int64_t per_group = plane == PLANE_ROW ? rows * CB : plane == PLANE_COL ? RB * t->cols : RB * CB;
    for (int64_t g = 0; g < t->G; g++) {
        const float *w = f->master + t->shard_off + g * t->S * t->cols;   // (S, cols)
        uint8_t *qg = q + g * rows * t->cols, *sg = scales + g * per_group;
        int rc = plane == PLANE_TILES
                     ? mx_quantize_tiles_f32(w, rows, t->cols, spec->weight, spec->mode, qg, sg)
                     : mx_quantize_f32(w, rows, t->cols, plane == PLANE_ROW ? MX_ROWWISE : MX_COLWISE, spec->weight,
                                       spec->mode, qg, sg);
        if (rc) return rc;
    }
    return MX_OK;
}

/* ---- the unit hooks ---- */

void mxi_fsdp_bind_weights(mxi_fsdp *f, int id, uint8_t *slot, float *grads) {
    const shard_tensor *t = &f->t[id];
    mxi_model_bind_tensor(f->model, id, slot && !t->half ? (float *)(void *)(slot + t->f32_at) : NULL, grads);
    if (slot && t->half) mxi_model_bind_tensor_bf16(f->model, id, (const uint16_t *)(const void *)(slot + t->f32_at));
}

/* Whether unit u is the embedding's own (L + 1; none when lm_head shares the embedding and
 * the root holds it). Its backward, a scatter-add of the output gradient into the table's
 * rows, reads no weights, so it is not gathered for backward. */
bool mxi_fsdp_is_embedding_unit(const mxi_fsdp *f, int u) { return u > 0 && u == mxi_model_embedding_unit(f->model); }

/* What request req of unit u (its layout d's part) carries, for the watchdog's message. */
void mxi_fsdp_label(const mxi_fsdp *f, mxi_request *req, bool weights, int u, int d) {
    const char *what = d == DOM_EXPERTS ? (weights ? "expert weights" : "expert gradients") : weights ? "weights" : "gradients";
    const char *phase = !weights ? "" : f->backward ? ", for backward" : ", for forward";
    if (u == 0) mxi_comm_label(req, "%s of the root unit%s", what, phase);   // final norm, lm_head (tied: embedding)
    else if (mxi_fsdp_is_embedding_unit(f, u)) mxi_comm_label(req, "%s of unit 'model.embed_tokens'%s", what, phase);
    else mxi_comm_label(req, "%s of unit 'model.layers.%d'%s", what, u - 1, phase);
}

/* A sunk tensor's gradient rows [row0, row0 + rows), from the model, into the bf16 shard. On
 * one rank the shard is the tensor, padded after its last row. On more, the rows are summed
 * over the shard group in fp32, each rank receiving those of its own rows [rank S, rank S + S)
 * (every rank makes this call with the same rows: mxi_model_hooks.collective). */
static int add_grad(void *ctx, int id, int64_t row0, int64_t rows, float *src, mx_diag *diag) {
    mxi_fsdp *f = ctx;
    const shard_tensor *t = &f->t[id];
    const domain *dm = &f->dom[t->dom];
    if (mxi_fsdp_reduce_direct(f, t->dom)) {
        mxi_fsdp_add_grads(f, t->shard_off + row0 * t->cols, src, NULL, rows * t->cols);
        return MX_OK;
    }
    int64_t lo_mine = 0;
    for (int r = 0; r < dm->W; r++) {
        int64_t first = (int64_t)r * t->S, end = first + t->S < t->R ? first + t->S : t->R;
        int64_t lo = row0 > first ? row0 : first, hi = row0 + rows < end ? row0 + rows : end;
        f->sink_counts[r] = hi > lo ? (int)((hi - lo) * t->cols) : 0;
        if (r == dm->rank) lo_mine = lo - first;
    }
    f->counters.rs_bytes += (uint64_t)(rows * t->cols) * 4;
    f->counters.reduce_scatters++;
    char what[96];
    snprintf(what, sizeof what, "gradient rows %lld to %lld of a vocabulary table", (long long)row0,
             (long long)(row0 + rows - 1));
    int rc = mxi_comm_reduce_scatter_f32(dm->comm, src, f->sink_counts, what, diag);
    if (rc) return rc;
    if (f->sink_counts[dm->rank]) mxi_fsdp_add_grads(f, t->shard_off + lo_mine * t->cols, src, NULL, f->sink_counts[dm->rank]);
    return MX_OK;
}

static int on_unit(void *ctx, int u, mxi_unit_event event, mx_diag *diag) {
    mxi_fsdp *f = ctx;
    f->backward = event == MXI_PRE_BACKWARD || event == MXI_POST_BACKWARD;
    for (int g = 0; g < f->n_gathers; g++)
        for (int d = 0; d < N_DOMS; d++)
            if (f->gathers[g].part[d].n_segs) mxi_comm_poke(f->dom[d].comm, &f->gathers[g].part[d].req);
    int rc = mxi_fsdp_progress_reduces(f, false, diag);
    if (rc) return rc;
    switch (event) {
    case MXI_PRE_FORWARD:
        return mxi_fsdp_ensure(f, u, true, diag);
    case MXI_POST_FORWARD:
        if (u != 0 && f->opt.reshard_after_forward) mxi_fsdp_release(f, u);
        return MX_OK;
    case MXI_PRE_BACKWARD: {
        if (!mxi_fsdp_is_embedding_unit(f, u) && (rc = mxi_fsdp_ensure(f, u, false, diag))) return rc;
        float *g = u == 0 ? f->root_grad : f->block_grad;
        if (!f->grads_direct) memset(g, 0, (size_t)f->u[u].full_numel * sizeof(float));
        const shard_unit *su = &f->u[u];
        for (int i = 0; i < su->n; i++) {
            int id = su->tensors[i];
            const shard_tensor *t = &f->t[id];
            uint8_t *slot = f->resident[u] >= 0 && !t->mx ? f->slots[f->resident[u]] : NULL;
            mxi_fsdp_bind_weights(f, id, slot, f->grads_direct ? f->grads + t->shard_off : t->sunk ? NULL : g + t->unit_off);
        }
        return MX_OK;
    }
    case MXI_POST_BACKWARD: {
        rc = mxi_fsdp_start_reduce(f, u, u == 0 ? f->root_grad : f->block_grad, diag);
        mxi_fsdp_release(f, u);
        return rc;
    }
    }
    return MX_OK;
}
