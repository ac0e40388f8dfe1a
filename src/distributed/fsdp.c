/* FSDP2-style sharding over MPI (see fsdp.h). Shape letters: G groups of a tensor (experts,
 * else 1), R rows per group, K elements per row, S rows per rank, KB = ceil(K/32) blocks per
 * row, W ranks. */
#include "distributed/fsdp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/diag.h"
#include "model/units.h"
#include "ops/nn_kernels.h"

#define CEIL_DIV(a, b) (((a) + (b) - 1) / (b))

typedef struct {
    int64_t G, R, K, S;     // shape as sharded; S rows per rank per group
    int64_t R_model;        // rows of one group as the model indexes the tensor (one expert's: R
                            // is G_full of them when shard_groups cuts the experts as one group)
    int64_t shard_off;      // first element in the local shard buffers
    int64_t unit_off;       // first element in the unit's unsharded layout (gradients)
    int unit;
    int dom;                // its layout: DOM_DENSE, or DOM_EXPERTS (fused experts under EP)
    int64_t g0, G_full;     // the whole tensor's groups (of R rows) g0 .. g0 + G are held here (experts:
                            // this EP rank's); G_full: the tensor's experts (1: not experts)
    bool mx;                // travels as MX planes
    bool decay;
    // unit buffer layout (bytes from the slot start)
    size_t f32_at;          // (G, R, K) fp32, when !mx
    size_t row_q, row_s, col_q, col_s, tiles;   // when mx: (G,R,K) (G,R,KB) (G,R,K) (G,ceil(R/32),K) (G,ceil(R/32),KB)
    // MX planes of the local shard (bytes from mx_cache)
    size_t c_row_q, c_row_s, c_col_q, c_col_s, c_tiles;
    mxi_mx_weight planes;   // as bound to the model while resident
} shard_tensor;

/* Two layouts: the dense parameters, sharded over the FSDP group and replicated over the
 * replicas (HSDP), and with EP > 1 the experts: an EP rank's experts sharded over its expert
 * shard group (EFSDP ranks) and replicated over its expert replica group (EDP ranks). A unit
 * gathers and reduces each layout's part with its own collectives. */
enum { DOM_DENSE, DOM_EXPERTS, N_DOMS };

typedef struct {
    mxi_comm *comm;         // the shard group (NULL in mxi_fsdp_expected)
    mxi_comm *replicas;     // the replica group, or NULL with one replica
    int W, rank;            // ranks of the shard group, and this rank's place in it
    int D, replica;         // replicas, and this rank's
} domain;

typedef struct {
    int n, *tensors;        // tensor indices, the dense ones first
    int64_t shard_numel, shard_off;   // its part of the shard buffers
    int64_t part_numel[N_DOMS], part_off[N_DOMS];   // of which each layout's (contiguous, dense first)
    int64_t full_numel;     // unsharded fp32 elements (gradient buffer: experts this rank's only)
    size_t slot_bytes, expert_slot;   // its unit buffer, and the fused experts' part of it
} shard_unit;

enum { SEG_F32, SEG_BF16, SEG_BYTES };
enum { KIND_PARAM, KIND_MX_DATA, KIND_MX_SCALE };

/* A piece of one rank's all-gather block: G groups of S rows of W elements from the local
 * shard, landing as G groups of R rows in the unit buffer. */
typedef struct {
    int type, kind;
    int64_t G, S, R, W;
    size_t src_at;          // (G, S, W) from byte src_at of the fp32 master (F32, BF16) or of the MX planes (BYTES)
    size_t wire_off;        // offset in one rank's block
    size_t dst_off;         // offset in the unit buffer
    int64_t bf16_equiv;     // bytes this piece stands for gathered in bf16 (MX codes only)
} segment;

typedef struct {            // one all-gather per layout with something to gather
    uint8_t *send, *recv;
    mxi_request req;
    segment *segs;
    int n_segs;
    size_t block;           // bytes per rank
} gather_part;

typedef struct {
    int unit;               // -1: free
    int slot;
    bool row, col;
    gather_part part[N_DOMS];
} gather_op;

enum { RED_IDLE, RED_SCATTER, RED_ALL_REDUCE };
typedef struct {
    int unit;               // -1: free
    struct reduce_part {    // one reduce-scatter (then all-reduce across replicas) per layout
        int stage;          // RED_IDLE (done or nothing to do), RED_SCATTER or RED_ALL_REDUCE in flight
        uint8_t *send, *recv;
        mxi_request req;
    } part[N_DOMS];
} reduce_op;

struct mxi_fsdp {
    mx_model *model;
    mxi_comm *world;
    mxi_comm *comm;         // this rank's FSDP group: the world, or shard_group
    mxi_comm *shard_group, *replica_group;   // split from the world with replicas > 1, else NULL
    mxi_comm *eshard_group, *ereplica_group, *emesh_group;   // EP: split from the world (emesh: one expert replica)
    domain dom[N_DOMS];     // [DOM_DENSE] mirrors comm, W, rank, replicas, replica
    int EP, El, ep_rank;    // expert parallelism: EP ranks, El = E / EP experts each, this rank's place
    mxi_fsdp_options opt;
    const mxi_linear_mx *spec;
    int W, rank;            // ranks of the FSDP group, and this rank's place in it
    int replicas, replica;  // FSDP groups, and this rank's
    int n_tensors, n_units;
    shard_tensor *t;
    shard_unit *u;
    int64_t shard_numel;
    float *master, *grads, *moments;      // (shard), (shard), (2, shard): one allocation each
    double *grad_sums;    // (shard) with reduce_dtype fp64: the sums, before finish_grads
    uint8_t *mx_cache;
    // unit buffers: slot 0 for the root, the others shared by the blocks
    int n_slots;
    uint8_t **slots;
    size_t slot_bytes;
    int *slot_unit;         // (n_slots) resident unit or -1
    int *resident;          // (n_units) slot or -1
    bool *has_row, *has_col;// (n_units) planes present in the resident buffer
    int *pending;           // (n_units) gather op or -1
    gather_op *gathers;
    int n_gathers;
    segment *seg_pool;      // n_gathers * max segments
    float *root_grad, *block_grad;        // unsharded gradients of the root and of one block
    reduce_op reduces[2];
    int next_reduce;        // the one to use next: the older of the two when both are in flight
    bool backward;          // the pass running: what a gather is for, in the watchdog's message
    mxi_fsdp_counters counters;
    mxi_fsdp_memory mem;
    void *block_mem;        // one allocation for every communication buffer
};

/* ---- layout ---- */

static int64_t rows_per_rank(int64_t R, int W) { return CEIL_DIV(CEIL_DIV(R, 32), W) * 32; }

/* How G groups of R rows (fused experts: G experts) are cut: each group on its own, so that
 * no 32-row block, and no piece, straddles two experts. When R is a multiple of 32 no block
 * can straddle, so the G R rows are cut as one group instead: the same MX blocks, with
 * padding after the last expert only rather than after each (at 64 ranks an expert's 1536
 * rows would be 24 a rank, padded to 32). *G_out, *R_out: the groups and rows to cut. */
static void shard_groups(int64_t G, int64_t R, int64_t *G_out, int64_t *R_out) {
    bool whole = G > 1 && R % 32 == 0;
    *G_out = whole ? 1 : G;
    *R_out = whole ? G * R : R;
}

/* Lay out tensor t's part of a unit buffer from *at on; returns the bytes it takes. With
 * one_plane the unit never holds both planes at once (on-demand, resharded after forward,
 * not recomputed): they share one region. With tiles both planes share the codes. */
static size_t layout_slot(shard_tensor *t, size_t at, bool one_plane, bool tiles) {
    size_t start = at;
    int64_t n = t->G * t->R * t->K, KB = CEIL_DIV(t->K, 32), RB = CEIL_DIV(t->R, 32);
    int64_t row_scales = t->G * t->R * KB, col_scales = t->G * RB * t->K;
#define PLACE(field, bytes) (t->field = at, at += ((size_t)(bytes) + 63) & ~(size_t)63)
    if (!t->mx) {
        PLACE(f32_at, n * 4);
    } else if (tiles) {
        PLACE(row_q, n);
        t->col_q = t->row_q;
        PLACE(row_s, row_scales);
        PLACE(col_s, col_scales);
        PLACE(tiles, t->G * RB * KB);
    } else if (one_plane) {
        PLACE(row_q, n);
        t->col_q = t->row_q;
        PLACE(row_s, row_scales > col_scales ? row_scales : col_scales);
        t->col_s = t->row_s;
    } else {
        PLACE(row_q, n);
        PLACE(row_s, row_scales);
        PLACE(col_q, n);
        PLACE(col_s, col_scales);
    }
#undef PLACE
    return at - start;
}

static size_t layout_cache(shard_tensor *t, const mxi_linear_mx *spec, size_t at) {
    size_t start = at;
    int64_t n = t->G * t->S * t->K, KB = CEIL_DIV(t->K, 32), SB = t->S / 32;
#define PLACE(field, bytes) (t->field = at, at += ((size_t)(bytes) + 63) & ~(size_t)63)
    if (spec->weight_tiles) {
        PLACE(c_row_q, n);
        PLACE(c_tiles, t->G * SB * KB);
    } else {
        PLACE(c_row_q, n);
        PLACE(c_row_s, t->G * t->S * KB);
        PLACE(c_col_q, n);
        PLACE(c_col_s, t->G * SB * t->K);
    }
#undef PLACE
    return at - start;
}

#define ALIGN8(x) (((x) + 7) & ~(size_t)7)

/* The pieces of the all-gather of unit u's tensors of layout d carrying the wanted planes,
 * each at a multiple of 8 bytes of the rank's block; returns bytes per rank. */
static size_t build_segments(const mxi_fsdp *f, int u, int d, bool row, bool col, segment *segs, int *n_segs) {
    const shard_unit *su = &f->u[u];
    size_t off = 0;
    int n = 0;
    for (int i = 0; i < su->n; i++) {
        const shard_tensor *t = &f->t[su->tensors[i]];
        if (t->dom != d) continue;
        int64_t KB = CEIL_DIV(t->K, 32), SB = t->S / 32, RB = CEIL_DIV(t->R, 32);
        segment s = {0};
        s.G = t->G;
        if (!t->mx) {
            s.type = f->opt.param_bf16 ? SEG_BF16 : SEG_F32, s.kind = KIND_PARAM;
            s.S = t->S, s.R = t->R, s.W = t->K;
            s.src_at = (size_t)t->shard_off * sizeof(float), s.dst_off = t->f32_at;
            s.wire_off = off = ALIGN8(off), off += (size_t)(t->G * t->S * t->K) * (f->opt.param_bf16 ? 2 : 4);
            segs[n++] = s;
            continue;
        }
        int64_t codes = t->G * t->S * t->K;
        s.type = SEG_BYTES;
        if (f->spec->weight_tiles) {   // one tiled plane serves both GEMMs
            segment q = s, sc = s;
            q.kind = KIND_MX_DATA, q.S = t->S, q.R = t->R, q.W = t->K, q.src_at = t->c_row_q, q.dst_off = t->row_q;
            q.bf16_equiv = 2 * codes;
            q.wire_off = off = ALIGN8(off), off += (size_t)codes, segs[n++] = q;
            sc.kind = KIND_MX_SCALE, sc.S = SB, sc.R = RB, sc.W = KB, sc.src_at = t->c_tiles, sc.dst_off = t->tiles;
            sc.wire_off = off = ALIGN8(off), off += (size_t)(t->G * SB * KB), segs[n++] = sc;
            continue;
        }
        if (row) {
            segment q = s, sc = s;
            q.kind = KIND_MX_DATA, q.S = t->S, q.R = t->R, q.W = t->K, q.src_at = t->c_row_q, q.dst_off = t->row_q;
            q.bf16_equiv = 2 * codes;
            q.wire_off = off = ALIGN8(off), off += (size_t)codes, segs[n++] = q;
            sc.kind = KIND_MX_SCALE, sc.S = t->S, sc.R = t->R, sc.W = KB, sc.src_at = t->c_row_s, sc.dst_off = t->row_s;
            sc.wire_off = off = ALIGN8(off), off += (size_t)(t->G * t->S * KB), segs[n++] = sc;
        }
        if (col) {
            segment q = s, sc = s;
            q.kind = KIND_MX_DATA, q.S = t->S, q.R = t->R, q.W = t->K, q.src_at = t->c_col_q, q.dst_off = t->col_q;
            q.bf16_equiv = row ? 0 : 2 * codes;   // both planes of one gather stand for one bf16 gather
            q.wire_off = off = ALIGN8(off), off += (size_t)codes, segs[n++] = q;
            sc.kind = KIND_MX_SCALE, sc.S = SB, sc.R = RB, sc.W = t->K, sc.src_at = t->c_col_s, sc.dst_off = t->col_s;
            sc.wire_off = off = ALIGN8(off), off += (size_t)(t->G * SB * t->K), segs[n++] = sc;
        }
    }
    *n_segs = n;
    return ALIGN8(off);   // rank r's block starts at r times this: aligned too
}

/* The planes a gather of unit u carries: forward the rowwise plane, backward the colwise
 * plane, and the rowwise one too when the unit's forward runs again inside its backward
 * (recompute: that one gather serves the re-run forward and dx = dy W); both in `all` mode,
 * for the root and for units kept after forward (gathered once). Without low-precision
 * gathers there are no planes and both flags just say "everything". */
static void planes_for(const mxi_fsdp *f, int u, bool forward, bool *row, bool *col) {
    bool lp = f->opt.low_precision, all = f->opt.gather_all;
    *row = forward || all || !lp || mxi_model_unit_recomputes(f->model, u);
    *col = !forward || all || !lp || !f->opt.reshard_after_forward || u == 0;
}

/* ---- create ---- */

static int on_unit(void *ctx, int unit, mxi_unit_event event, mx_diag *diag);

/* The options as the engine applies them. */
static void set_options(mxi_fsdp *f, const mxi_fsdp_options *opt) {
    f->opt = *opt;
    f->spec = mxi_model_mx_spec(f->model);
    if (!f->spec) f->opt.low_precision = false;
    f->n_tensors = mx_model_num_tensors(f->model);
    f->n_units = mxi_model_num_units(f->model);
    f->EP = opt->expert_parallel > 1 ? opt->expert_parallel : 1;
    // prefetching past the last unit gathers nothing more: deeper settings are the same
    int NB = f->n_units - 1;   // the units besides the root
    if (f->opt.forward_prefetch < 0) f->opt.forward_prefetch = 0;
    if (f->opt.backward_prefetch < 0) f->opt.backward_prefetch = 0;
    if (f->opt.forward_prefetch > NB) f->opt.forward_prefetch = NB;
    if (f->opt.backward_prefetch > NB) f->opt.backward_prefetch = NB;
}

/* Lay out every tensor's shard (f->W ranks per group) and unit buffer: f->t, f->u (and
 * their tensor lists), f->shard_numel, f->slot_bytes; *cache receives the bytes of the MX
 * planes of the shards. Nothing else is allocated. */
static int lay_out(mxi_fsdp *f, size_t *cache_out) {
    f->t = calloc((size_t)f->n_tensors, sizeof *f->t);
    f->u = calloc((size_t)f->n_units, sizeof *f->u);
    int *tensor_ids = calloc((size_t)f->n_tensors ? (size_t)f->n_tensors : 1, sizeof *tensor_ids);
    if (!f->t || !f->u || !tensor_ids) {
        free(tensor_ids);
        return MX_ENOMEM;
    }
    // tensors by unit; shard buffers unit by unit so that each unit's reduce-scatter lands in one range
    int next_id = 0;
    int64_t shard = 0;
    size_t cache = 0;
    for (int u = 0; u < f->n_units; u++) {
        shard_unit *su = &f->u[u];
        su->tensors = tensor_ids + next_id;
        su->shard_off = shard;
        su->full_numel = 0;
        size_t slot = 0;
        for (int d = 0; d < N_DOMS; d++) {
            su->part_off[d] = shard;
            for (int i = 0; i < f->n_tensors; i++) {
                mxi_tensor_shape s = mxi_model_tensor_shape(f->model, i);
                // under EP the fused experts (E groups) of an EP layer are laid out by expert rank;
                // those of a layer ep_plan.apply_modules leaves out stay dense (every rank computes them)
                int dom = f->EP > 1 && s.groups > 1 && mxi_model_ep_layer(f->model, s.unit - 1) ? DOM_EXPERTS : DOM_DENSE;
                if (s.unit != u || dom != d) continue;
                shard_tensor *t = &f->t[i];
                t->dom = dom, t->G_full = s.groups;
                if (dom == DOM_EXPERTS) f->El = (int)(s.groups / f->EP);
                shard_groups(dom == DOM_EXPERTS ? f->El : s.groups, s.rows, &t->G, &t->R);
                t->g0 = dom == DOM_EXPERTS ? (int64_t)f->ep_rank * t->G : 0;   // in groups of t->R rows
                t->R_model = s.rows, t->K = s.cols, t->S = rows_per_rank(t->R, f->dom[d].W);
                t->unit = u, t->decay = s.decay, t->mx = s.converted && f->opt.low_precision;
                t->shard_off = shard, t->unit_off = su->full_numel;   // the unit's gradients: its held groups only
                shard += t->G * t->S * t->K;
                su->full_numel += t->G * t->R * t->K;
                bool one_plane = f->opt.low_precision && !f->opt.gather_all && f->opt.reshard_after_forward && u != 0 &&
                                 !mxi_model_unit_recomputes(f->model, u);
                size_t took = layout_slot(t, slot, one_plane, f->spec && f->spec->weight_tiles);
                slot += took;
                if (s.groups > 1) su->expert_slot += took;
                if (t->mx) cache += layout_cache(t, f->spec, cache);
                su->tensors[su->n++] = i;
                next_id++;
            }
            su->part_numel[d] = shard - su->part_off[d];
        }
        su->shard_numel = shard - su->shard_off;
        su->slot_bytes = slot;
        if (u > 0 && slot > f->slot_bytes) f->slot_bytes = slot;
    }
    f->shard_numel = shard;
    *cache_out = cache;
    return MX_OK;
}

/* The communication buffers: their sizes, and where each piece goes in one allocation. */
typedef struct {
    int block_slots, max_segs;
    size_t block[N_DOMS];   // largest all-gather block per rank (any unit, any phase), by layout
    size_t rs_elems[N_DOMS], rs_elem;   // largest unit shard, by layout; bytes per reduce_dtype element
    int64_t root_full, block_full;
    size_t slot0, slotn, total;
} buffer_sizes;

#define ROUND64(x) (((x) + (size_t)63) & ~(size_t)63)

static int size_buffers(mxi_fsdp *f, buffer_sizes *b) {
    memset(b, 0, sizeof *b);
    int NB = f->n_units - 1;   // the blocks, and the embedding's unit unless lm_head shares it
    // unit buffers: the root's own, and enough for the other units in flight
    int pf = f->opt.forward_prefetch > f->opt.backward_prefetch ? f->opt.forward_prefetch : f->opt.backward_prefetch;
    b->block_slots = f->opt.reshard_after_forward ? 1 + pf : NB;
    if (b->block_slots > NB) b->block_slots = NB;
    f->n_slots = 1 + b->block_slots;
    f->n_gathers = 1 + pf;
    // wire buffers sized by the largest gather of any unit (both planes) and reduce-scatter
    for (int u = 0; u < f->n_units; u++) {
        b->max_segs = f->u[u].n * 4 > b->max_segs ? f->u[u].n * 4 : b->max_segs;   // at most 2 planes x (codes, scales)
        for (int d = 0; d < N_DOMS; d++)
            if ((size_t)f->u[u].part_numel[d] > b->rs_elems[d]) b->rs_elems[d] = (size_t)f->u[u].part_numel[d];
    }
    segment *tmp = calloc((size_t)b->max_segs ? (size_t)b->max_segs : 1, sizeof *tmp);
    if (!tmp) return MX_ENOMEM;
    for (int u = 0; u < f->n_units; u++)   // the gathers this mode makes: forward and backward
        for (int forward = 0; forward < 2; forward++)
            for (int d = 0; d < N_DOMS; d++) {
                bool row, col;
                int n;
                planes_for(f, u, forward, &row, &col);
                size_t bytes = build_segments(f, u, d, row, col, tmp, &n);
                if (bytes > b->block[d]) b->block[d] = bytes;
            }
    free(tmp);
    b->rs_elem = f->opt.reduce == MXI_WIRE_BF16 ? 2 : f->opt.reduce == MXI_WIRE_F64 ? 8 : 4;
    b->root_full = f->u[0].full_numel;
    for (int u = 1; u < f->n_units; u++) b->block_full = f->u[u].full_numel > b->block_full ? f->u[u].full_numel : b->block_full;
    // one allocation for every communication buffer, 64-byte aligned pieces
    b->slot0 = ROUND64(f->u[0].slot_bytes), b->slotn = ROUND64(f->slot_bytes);
    size_t total = b->slot0 + (size_t)b->block_slots * b->slotn;
    for (int d = 0; d < N_DOMS; d++) {
        size_t W = (size_t)f->dom[d].W;
        total += (size_t)f->n_gathers * (ROUND64(b->block[d]) + ROUND64(b->block[d] * W));
        total += 2 * (ROUND64(b->rs_elems[d] * b->rs_elem * W) + ROUND64(b->rs_elems[d] * b->rs_elem));
    }
    total += ROUND64((size_t)b->root_full * 4) + ROUND64((size_t)b->block_full * 4);
    b->total = total;
    return MX_OK;
}

static mxi_fsdp_memory memory_of(const mxi_fsdp *f, size_t cache, size_t gathered) {
    uint64_t shard = (uint64_t)f->shard_numel, per = f->opt.reduce == MXI_WIRE_F64 ? 24 : 16;
    mxi_fsdp_memory m = {shard * 4, shard * (per - 12), shard * 8, cache, gathered, 0, 0, 0};
    // the experts' part (fused expert tensors, with or without EP): their shards, and the
    // most one unit holds of them gathered and as unsharded gradients
    for (int u = 0; u < f->n_units; u++) {
        uint64_t unit = 0, grad = 0;
        for (int i = 0; i < f->u[u].n; i++) {
            int id = f->u[u].tensors[i];
            const shard_tensor *t = &f->t[id];
            if (t->G_full < 2) continue;
            m.expert_shards += (uint64_t)(t->G * t->S * t->K) * per;
            grad += (uint64_t)(t->G * t->R * t->K) * 4;
        }
        unit = f->u[u].expert_slot;
        if (unit > m.expert_unit) m.expert_unit = unit;
        if (grad > m.expert_grad) m.expert_grad = grad;
    }
    return m;
}

/* This rank's FSDP group and replica group: rank r of W is rank r % F of group r / F (the
 * groups are consecutive ranks, as torch's DeviceMesh(dp, shard) lays them out) and rank
 * r / F of the replica group of ranks r % F + k F. */
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
    f->dom[DOM_DENSE] = (domain){f->comm, f->replica_group, f->W, f->rank, f->replicas, f->replica};
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
    if (!f) return mxi_diag(diag, MX_ENOMEM, "out of memory");
    f->model = model;
    set_options(f, opt);
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
    if (!f->resident || !f->pending || !f->has_row || !f->has_col || lay_out(f, &cache)) goto nomem;
    for (int u = 0; u < f->n_units; u++) f->resident[u] = f->pending[u] = -1;
    int64_t shard = f->shard_numel;
    f->master = calloc((size_t)shard ? (size_t)shard : 1, sizeof(float));
    f->grads = calloc((size_t)shard ? (size_t)shard : 1, sizeof(float));
    f->moments = calloc((size_t)shard ? 2 * (size_t)shard : 1, sizeof(float));
    f->mx_cache = cache ? calloc(cache, 1) : NULL;
    if (f->opt.reduce == MXI_WIRE_F64) f->grad_sums = calloc((size_t)shard ? (size_t)shard : 1, sizeof(double));
    if (!f->master || !f->grads || !f->moments || (cache && !f->mx_cache) ||
        (f->opt.reduce == MXI_WIRE_F64 && !f->grad_sums))
        goto nomem;
    buffer_sizes b;
    if (size_buffers(f, &b)) goto nomem;
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
            f->gathers[g].part[d].send = p, p += ROUND64(b.block[d]);
            f->gathers[g].part[d].recv = p, p += ROUND64(b.block[d] * (size_t)f->dom[d].W);
            f->gathers[g].part[d].segs = f->seg_pool + (g * N_DOMS + d) * b.max_segs;
        }
    }
    for (int r = 0; r < 2; r++) {
        f->reduces[r].unit = -1;
        for (int d = 0; d < N_DOMS; d++) {
            f->reduces[r].part[d].send = p, p += ROUND64(b.rs_elems[d] * b.rs_elem * (size_t)f->dom[d].W);
            f->reduces[r].part[d].recv = p, p += ROUND64(b.rs_elems[d] * b.rs_elem);
        }
    }
    f->root_grad = (float *)(void *)p, p += ROUND64((size_t)b.root_full * 4);
    f->block_grad = (float *)(void *)p, p += ROUND64((size_t)b.block_full * 4);
    f->mem = memory_of(f, cache, b.total);
    mxi_model_hooks hooks = {f, on_unit};
    mxi_model_set_hooks(model, &hooks);
    *out = f;
    return MX_OK;
nomem:
    mxi_fsdp_free(f);
    return mxi_diag(diag, MX_ENOMEM, "out of memory for the FSDP shards and buffers");
}

void mxi_fsdp_free(mxi_fsdp *f) {
    if (!f) return;
    if (f->u) free(f->u[0].tensors);
    free(f->t), free(f->u), free(f->resident), free(f->pending), free(f->has_row), free(f->has_col);
    free(f->seg_pool), free(f->block_mem), free(f->slots), free(f->slot_unit), free(f->gathers);
    free(f->master), free(f->grads), free(f->moments), free(f->mx_cache), free(f->grad_sums);
    mxi_comm_free(f->replica_group), mxi_comm_free(f->shard_group);
    mxi_comm_free(f->emesh_group), mxi_comm_free(f->ereplica_group), mxi_comm_free(f->eshard_group);
    free(f);
}

int64_t mxi_fsdp_shard_numel(const mxi_fsdp *f) { return f->shard_numel; }
float *mxi_fsdp_master(mxi_fsdp *f) { return f->master; }
float *mxi_fsdp_grads(mxi_fsdp *f) { return f->grads; }
float *mxi_fsdp_moments(mxi_fsdp *f) { return f->moments; }
mxi_fsdp_memory mxi_fsdp_memory_of(const mxi_fsdp *f) { return f->mem; }
mxi_fsdp_counters mxi_fsdp_counters_of(const mxi_fsdp *f) { return f->counters; }

mxi_shard_span mxi_fsdp_span(const mxi_fsdp *f, int i) {
    const shard_tensor *t = &f->t[i];
    return (mxi_shard_span){t->shard_off, t->G * t->S * t->K, t->decay};
}

/* ---- step ---- */

static void release(mxi_fsdp *f, int u);

int mxi_fsdp_begin_step(mxi_fsdp *f, mx_diag *diag) {
    for (int u = 0; u < f->n_units; u++) release(f, u);   // last step's weights are stale
    memset(f->grads, 0, (size_t)f->shard_numel * sizeof(float));
    if (f->grad_sums) memset(f->grad_sums, 0, (size_t)f->shard_numel * sizeof(double));
    memset(&f->counters, 0, sizeof f->counters);
    if (!f->opt.low_precision) return MX_OK;
    const mxi_linear_mx *spec = f->spec;
    for (int i = 0; i < f->n_tensors; i++) {
        const shard_tensor *t = &f->t[i];
        if (!t->mx) continue;
        int64_t KB = CEIL_DIV(t->K, 32), SB = t->S / 32;
        for (int64_t g = 0; g < t->G; g++) {
            const float *w = f->master + t->shard_off + g * t->S * t->K;   // (S, K)
            uint8_t *c = f->mx_cache;
            int rc;
            if (spec->weight_tiles) {
                rc = mx_quantize_tiles_f32(w, t->S, t->K, spec->weight, spec->mode, c + t->c_row_q + g * t->S * t->K,
                                           c + t->c_tiles + g * SB * KB);
            } else {
                rc = mx_quantize_f32(w, t->S, t->K, MX_ROWWISE, spec->weight, spec->mode,
                                     c + t->c_row_q + g * t->S * t->K, c + t->c_row_s + g * t->S * KB);
                if (!rc)
                    rc = mx_quantize_f32(w, t->S, t->K, MX_COLWISE, spec->weight, spec->mode,
                                         c + t->c_col_q + g * t->S * t->K, c + t->c_col_s + g * SB * t->K);
            }
            if (rc) return mxi_diag(diag, rc, "quantizing the shard of %s failed: %s", mxi_model_tensor_shape(f->model, i).name,
                                    mx_strerror(rc));
        }
    }
    return MX_OK;
}

/* ---- all-gather ---- */

static int free_slot(const mxi_fsdp *f, int u) {
    if (u == 0) return f->slot_unit[0] < 0 ? 0 : -1;
    for (int s = 1; s < f->n_slots; s++)
        if (f->slot_unit[s] < 0) return s;
    return -1;
}

/* What a gather of these segments costs each rank of a group of W. */
static void count_gather(mxi_fsdp_counters *c, const segment *segs, int n_segs, int W) {
    for (int i = 0; i < n_segs; i++) {
        const segment *s = &segs[i];
        uint64_t n = (uint64_t)(s->G * s->S * s->W);
        uint64_t bytes = n * (s->type == SEG_F32 ? 4 : s->type == SEG_BF16 ? 2 : 1) * (uint64_t)W;
        if (s->kind == KIND_PARAM) c->ag_param_bytes += bytes;
        else if (s->kind == KIND_MX_DATA) c->ag_mx_data_bytes += bytes;
        else c->ag_mx_scale_bytes += bytes;
        c->ag_bf16_equiv += (uint64_t)s->bf16_equiv * (uint64_t)W;
    }
    c->all_gathers++;
}

/* Whether unit u is the embedding's own (L + 1; none when lm_head shares the embedding and
 * the root holds it). Its backward, a scatter-add of the output gradient into the table's
 * rows, reads no weights, so it is not gathered for backward. */
static bool is_embedding_unit(const mxi_fsdp *f, int u) { return u > 0 && u == mxi_model_embedding_unit(f->model); }

/* What request req of unit u (its layout d's part) carries, for the watchdog's message. */
static void label(const mxi_fsdp *f, mxi_request *req, bool weights, int u, int d) {
    const char *what = d == DOM_EXPERTS ? (weights ? "expert weights" : "expert gradients") : weights ? "weights" : "gradients";
    const char *phase = !weights ? "" : f->backward ? ", for backward" : ", for forward";
    if (u == 0) mxi_comm_label(req, "%s of the root unit%s", what, phase);   // final norm, lm_head (tied: embedding)
    else if (is_embedding_unit(f, u)) mxi_comm_label(req, "%s of unit 'model.embed_tokens'%s", what, phase);
    else mxi_comm_label(req, "%s of unit 'model.layers.%d'%s", what, u - 1, phase);
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
        pt->block = build_segments(f, u, d, row, col, pt->segs, &pt->n_segs);
        if (!pt->n_segs) continue;
        count_gather(&f->counters, pt->segs, pt->n_segs, f->dom[d].W);
        if (f->dom[d].W == 1) {   // one rank: nothing to send; unpack_part copies from the shard itself
            pt->req.active = false;
            continue;
        }
        for (int i = 0; i < pt->n_segs; i++) {
            const segment *s = &pt->segs[i];
            int64_t n = s->G * s->S * s->W;
            uint8_t *dst = pt->send + s->wire_off;
            if (s->type == SEG_BYTES) {
                memcpy(dst, f->mx_cache + s->src_at, (size_t)n);
            } else {
                const float *src = (const float *)(const void *)((const uint8_t *)f->master + s->src_at);
                if (s->type == SEG_F32) memcpy(dst, src, (size_t)n * 4);
                else mxi_bf16_round((uint16_t *)(void *)dst, src, n);
            }
        }
        int rc = mxi_comm_iallgather(f->dom[d].comm, pt->send, pt->recv, pt->block, &pt->req, diag);
        if (rc) return rc;
        label(f, &pt->req, true, u, d);
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
            mxi_model_bind_tensor(f->model, id, (float *)(void *)(slot + t->f32_at), NULL);
            mxi_model_bind_planes(f->model, id, NULL);
            continue;
        }
        const mx_elem e = f->spec->weight;
        mxi_mx_plane none = {0};
        mxi_mx_plane row = {slot + t->row_q, slot + t->row_s, t->R_model, t->K, MX_ROWWISE, e};
        mxi_mx_plane col = {slot + t->col_q, slot + t->col_s, t->R_model, t->K, MX_COLWISE, e};
        t->planes.row = f->has_row[u] ? row : none;
        t->planes.col = f->has_col[u] ? col : none;
        mxi_model_bind_tensor(f->model, id, NULL, NULL);
        mxi_model_bind_planes(f->model, id, &t->planes);
    }
}

/* Wait for unit u's gather, then lay every rank's rows out in the unit buffer. */
/* Wait for layout d's part of a gather and copy every rank's pieces into the unit buffer. */
static int unpack_part(mxi_fsdp *f, gather_part *pt, int d, uint8_t *slot, mx_diag *diag) {
    const mxi_nn_kernels *kern = mxi_nn_kernels_active();
    if (f->dom[d].W == 1) {   // the unit is this rank's shard: one pass from it, no wire buffers
        for (int i = 0; i < pt->n_segs; i++) {
            const segment *s = &pt->segs[i];
            size_t src_elem = s->type == SEG_BYTES ? 1 : 4, out_elem = src_elem;
            const uint8_t *base = s->type == SEG_BYTES ? f->mx_cache : (const uint8_t *)f->master;
            for (int64_t grp = 0; grp < s->G; grp++) {   // (R, W) of each group from its (S, W), S >= R
                const uint8_t *src = base + s->src_at + (size_t)(grp * s->S * s->W) * src_elem;
                uint8_t *dst = slot + s->dst_off + (size_t)(grp * s->R * s->W) * out_elem;
                int64_t n = s->R * s->W;
                if (s->type == SEG_BF16) mxi_bf16_round_f32((float *)(void *)dst, (const float *)(const void *)src, n);
                else MXI_PARALLEL_CHUNKS((int64_t)((size_t)n * src_elem), memcpy(dst + i0, src + i0, (size_t)len));
            }
        }
        return MX_OK;
    }
    int rc = mxi_comm_wait(f->dom[d].comm, &pt->req, diag), W = f->dom[d].W;
    if (rc) return rc;
    for (int i = 0; i < pt->n_segs; i++) {
        const segment *s = &pt->segs[i];
        size_t in_elem = s->type == SEG_F32 ? 4 : s->type == SEG_BF16 ? 2 : 1, out_elem = s->type == SEG_BYTES ? 1 : 4;
        #pragma omp parallel for collapse(2) schedule(static)
        for (int r = 0; r < W; r++)
            for (int64_t grp = 0; grp < s->G; grp++) {
                int64_t r0 = (int64_t)r * s->S, rows = s->R - r0 < s->S ? s->R - r0 : s->S;
                if (rows <= 0) continue;
                const uint8_t *src = pt->recv + (size_t)r * pt->block + s->wire_off + (size_t)(grp * s->S * s->W) * in_elem;
                uint8_t *dst = slot + s->dst_off + (size_t)((grp * s->R + r0) * s->W) * out_elem;
                int64_t n = rows * s->W;
                if (s->type == SEG_BF16) {
                    kern->bf16_widen((float *)(void *)dst, (const uint16_t *)(const void *)src, n, 0);
                } else {
                    memcpy(dst, src, (size_t)n * in_elem);
                }
            }
    }
    return MX_OK;
}

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
            int64_t KB = CEIL_DIV(t->K, 32), RB = CEIL_DIV(t->R, 32);
            for (int64_t grp = 0; grp < t->G; grp++) {
                const uint8_t *tiles = slot + t->tiles + grp * RB * KB;
                mxi_tiles_spread(slot + t->row_s + grp * t->R * KB, tiles, t->R, t->K, MX_ROWWISE);
                mxi_tiles_spread(slot + t->col_s + grp * RB * t->K, tiles, t->R, t->K, MX_COLWISE);
            }
        }
    }
    f->resident[u] = op->slot;
    f->has_row[u] = op->row || (f->spec && f->spec->weight_tiles);
    f->has_col[u] = op->col || (f->spec && f->spec->weight_tiles);
    f->pending[u] = -1;
    op->unit = -1;
    bind_unit(f, u);
    return MX_OK;
}

static void release(mxi_fsdp *f, int u) {
    if (f->resident[u] < 0) return;
    f->slot_unit[f->resident[u]] = -1;
    f->resident[u] = -1;
    f->has_row[u] = f->has_col[u] = false;
}

/* ---- reduce-scatter ---- */

static size_t reduce_elem(const mxi_fsdp *f) {
    return f->opt.reduce == MXI_WIRE_BF16 ? 2 : f->opt.reduce == MXI_WIRE_F64 ? 8 : 4;
}

/* The reduced shard recv of layout d's part of unit u into the gradient shards (or their fp64 sums). */
static void accumulate(mxi_fsdp *f, int u, int d, const uint8_t *recv) {
    const shard_unit *su = &f->u[u];
    int64_t n = su->part_numel[d], at = su->part_off[d];
    if (f->opt.reduce == MXI_WIRE_F64) {
        const double *r = (const double *)(const void *)recv;
        double *g = f->grad_sums + at;
        #pragma omp parallel for schedule(static) if (n > 65536)
        for (int64_t i = 0; i < n; i++) g[i] += r[i];
    } else if (f->opt.reduce == MXI_WIRE_BF16) {
        mxi_bf16_widen(f->grads + at, (const uint16_t *)(const void *)recv, n, 1);
    } else {
        const float *r = (const float *)(const void *)recv;
        float *g = f->grads + at;
        #pragma omp parallel for schedule(static) if (n > 65536)
        for (int64_t i = 0; i < n; i++) g[i] += r[i];
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
            size_t n = (size_t)f->u[op->unit].part_numel[d];
            f->counters.ar_bytes += (uint64_t)n * reduce_elem(f);
            f->counters.all_reduces++;
            if ((rc = mxi_comm_iallreduce(dm->replicas, p->recv, n, f->opt.reduce, &p->req, diag))) return rc;
            label(f, &p->req, false, op->unit, d);
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
static int progress_reduces(mxi_fsdp *f, bool wait, mx_diag *diag) {
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
    if (f->grad_sums) {
        const double *s = f->grad_sums;
        #pragma omp parallel for schedule(static) if (n > 65536)
        for (int64_t i = 0; i < n; i++) g[i] = (float)(s[i] / count);
    } else {
        float c = (float)count;
        #pragma omp parallel for schedule(static) if (n > 65536)
        for (int64_t i = 0; i < n; i++) g[i] /= c;
    }
}

/* Pack layout d's part of unit u's unsharded gradients rank by rank in shard layout and
 * start its reduce-scatter. */
static int start_reduce_part(mxi_fsdp *f, reduce_op *op, int u, int d, const float *full, mx_diag *diag) {
    const mxi_nn_kernels *kern = mxi_nn_kernels_active();
    const shard_unit *su = &f->u[u];
    mxi_wire_dtype wire = f->opt.reduce;
    int64_t block = su->part_numel[d];
    struct reduce_part *p = &op->part[d];
    int W = f->dom[d].W;
    f->counters.rs_bytes += (uint64_t)block * (uint64_t)W * reduce_elem(f);
    f->counters.reduce_scatters++;
    if (W == 1 && !f->dom[d].replicas && wire == MXI_WIRE_F32) {
        // one rank and no replicas: the reduce-scatter is the identity, so the unit's
        // gradients go straight into the shard (the same additions accumulate would make;
        // the traffic was counted above as if sent, as the accounting of every layout is)
        for (int i = 0; i < su->n; i++) {
            const shard_tensor *t = &f->t[su->tensors[i]];
            if (t->dom != d) continue;
            for (int64_t grp = 0; grp < t->G; grp++) {   // (R, K) of each group into its (S, K), S >= R
                int64_t n = t->R * t->K;
                const float *src = full + t->unit_off + grp * t->R * t->K;
                float *g = f->grads + t->shard_off + grp * t->S * t->K;
                #pragma omp parallel for schedule(static) if (n > 65536)
                for (int64_t j = 0; j < n; j++) g[j] += src[j];
            }
        }
        return MX_OK;
    }
    for (int i = 0; i < su->n; i++) {
        const shard_tensor *t = &f->t[su->tensors[i]];
        if (t->dom != d) continue;
        int64_t local = t->shard_off - su->part_off[d];
        #pragma omp parallel for collapse(2) schedule(static)
        for (int r = 0; r < W; r++)
            for (int64_t grp = 0; grp < t->G; grp++) {
                int64_t r0 = (int64_t)r * t->S, rows = t->R - r0 < t->S ? t->R - r0 : t->S;
                if (rows < 0) rows = 0;   // a rank with padding only
                const float *src = rows > 0 ? full + t->unit_off + (grp * t->R + r0) * t->K : full;
                int64_t at = (int64_t)r * block + local + grp * t->S * t->K, n = rows * t->K, all = t->S * t->K;
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
    label(f, &p->req, false, u, d);
    p->stage = RED_SCATTER;
    op->unit = u;
    return MX_OK;
}

/* Unit u's reduce-scatters, one per layout it has tensors of, in a free reduce op. */
static int start_reduce(mxi_fsdp *f, int u, const float *full, mx_diag *diag) {
    reduce_op *op = &f->reduces[f->next_reduce];   // the older: free once it is finished
    const bool yes[N_DOMS] = {true, true};
    int rc = progress_reduce(f, op, true, yes, diag);
    if (rc) return rc;
    f->next_reduce ^= 1;
    for (int d = 0; d < N_DOMS && !rc; d++)
        if (f->u[u].part_numel[d]) rc = start_reduce_part(f, op, u, d, full, diag);
    return rc;
}

int mxi_fsdp_end_backward(mxi_fsdp *f, mx_diag *diag) { return progress_reduces(f, true, diag); }

/* ---- the unit hooks ---- */

/* The k-th unit a pass visits, or -1 past its end. With an embedding unit (L + 1), forward
 * visits it, blocks 1..L, then the root; backward the root, blocks L..1, then it. Without
 * (lm_head shares the embedding, which the root then holds), the root comes first both ways. */
static int visit(const mxi_fsdp *f, bool forward, int k) {
    bool embedding = is_embedding_unit(f, f->n_units - 1);
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

static int ensure(mxi_fsdp *f, int u, bool forward, mx_diag *diag) {
    bool row, col;
    planes_for(f, u, forward, &row, &col);
    if (f->resident[u] >= 0 && (!row || f->has_row[u]) && (!col || f->has_col[u])) {
        bind_unit(f, u);
    } else {
        if (f->resident[u] >= 0) release(f, u);   // resident without the plane needed: gather again
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
        if (v < 0 || (!forward && is_embedding_unit(f, v))) break;
        bool prow, pcol, started;
        planes_for(f, v, forward, &prow, &pcol);
        int rc = start_gather(f, v, prow, pcol, &started, diag);
        if (rc) return rc;
    }
    if (f->pending[u] >= 0) return finish_gather(f, u, diag);
    return MX_OK;
}

static int on_unit(void *ctx, int u, mxi_unit_event event, mx_diag *diag) {
    mxi_fsdp *f = ctx;
    f->backward = event == MXI_PRE_BACKWARD || event == MXI_POST_BACKWARD;
    for (int g = 0; g < f->n_gathers; g++)
        for (int d = 0; d < N_DOMS; d++)
            if (f->gathers[g].part[d].n_segs) mxi_comm_poke(f->dom[d].comm, &f->gathers[g].part[d].req);
    int rc = progress_reduces(f, false, diag);
    if (rc) return rc;
    switch (event) {
    case MXI_PRE_FORWARD:
        return ensure(f, u, true, diag);
    case MXI_POST_FORWARD:
        if (u != 0 && f->opt.reshard_after_forward) release(f, u);
        return MX_OK;
    case MXI_PRE_BACKWARD: {
        if (!is_embedding_unit(f, u) && (rc = ensure(f, u, false, diag))) return rc;
        float *g = u == 0 ? f->root_grad : f->block_grad;
        memset(g, 0, (size_t)f->u[u].full_numel * sizeof(float));
        const shard_unit *su = &f->u[u];
        for (int i = 0; i < su->n; i++) {
            int id = su->tensors[i];
            const shard_tensor *t = &f->t[id];
            uint8_t *slot = f->resident[u] >= 0 ? f->slots[f->resident[u]] : NULL;
            mxi_model_bind_tensor(f->model, id, t->mx || !slot ? NULL : (float *)(void *)(slot + t->f32_at),
                                  g + t->unit_off);
        }
        return MX_OK;
    }
    case MXI_POST_BACKWARD: {
        rc = start_reduce(f, u, u == 0 ? f->root_grad : f->block_grad, diag);
        release(f, u);
        return rc;
    }
    }
    return MX_OK;
}

/* ---- whole tensors ---- */

void mxi_fsdp_scatter_tensor(const mxi_fsdp *f, int i, const float *full, float *dst) {
    mxi_shard_piece p;
    for (int k = 0; mxi_fsdp_piece(f, i, k, true, &p); k++) {
        if (p.count) memcpy(dst + p.offset, full + p.start, (size_t)p.count * sizeof(float));   // none past the last row
        memset(dst + p.offset + p.count, 0, (size_t)(p.slot - p.count) * sizeof(float));
    }
}

bool mxi_fsdp_piece(const mxi_fsdp *f, int i, int k, bool every_replica, mxi_shard_piece *p) {
    const shard_tensor *t = &f->t[i];
    const domain *dm = &f->dom[t->dom];
    if ((dm->replica != 0 && !every_replica) || k < 0 || k >= t->G) return false;
    int64_t r0 = (int64_t)dm->rank * t->S, rows = t->R - r0 < t->S ? t->R - r0 : t->S;
    if (rows < 0) rows = 0;
    *p = (mxi_shard_piece){((t->g0 + k) * t->R + r0) * t->K, rows * t->K, t->shard_off + k * t->S * t->K,
                           t->S * t->K};
    return true;
}

int mxi_fsdp_gather_tensor(mxi_fsdp *f, int i, const float *src, float *full, mx_diag *diag) {
    const shard_tensor *t = &f->t[i];
    const domain *dm = &f->dom[t->dom];
    if (dm->replica != 0) return MX_OK;   // the other replicas hold the same rows
    // dense: the FSDP group of world rank 0; experts: the EP x EF ranks of expert replica 0,
    // rank q holding EP rank q % EP's experts, rows of expert shard rank q / EP
    bool experts = t->dom == DOM_EXPERTS;
    mxi_comm *comm = !experts ? dm->comm : f->emesh_group ? f->emesh_group : f->world;
    int n_ranks = experts ? f->EP * dm->W : dm->W, me = mxi_comm_rank(comm);
    size_t n = (size_t)(t->G * t->S * t->K);
    float *all = me == 0 ? malloc(n * (size_t)n_ranks * 4 + 1) : NULL;
    if (me == 0 && !all) return mxi_diag(diag, MX_ENOMEM, "out of memory assembling a tensor");
    char why[160];
    snprintf(why, sizeof why, "%s for a checkpoint", mxi_model_tensor_shape(f->model, i).name);
    int rc = mxi_comm_gather(comm, src + t->shard_off, all, n * 4, 0, why, diag);
    if (!rc && me == 0)
        for (int q = 0; q < n_ranks; q++) {
            int r = experts ? q / f->EP : q;
            int64_t g0 = experts ? (int64_t)(q % f->EP) * t->G : 0;
            for (int64_t g = 0; g < t->G; g++) {
                int64_t r0 = (int64_t)r * t->S, rows = t->R - r0 < t->S ? t->R - r0 : t->S;
                if (rows > 0)
                    memcpy(full + ((g0 + g) * t->R + r0) * t->K, all + (size_t)q * n + (size_t)(g * t->S * t->K),
                           (size_t)(rows * t->K) * 4);
            }
        }
    free(all);
    return rc;
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
    *out = (mxi_shard_span){start, end - start, false};
    return true;
}

const mxi_mx_weight *mxi_fsdp_gathered_planes(const mxi_fsdp *f, int i) {
    const shard_tensor *t = &f->t[i];
    if (!t->mx || f->resident[t->unit] < 0) return NULL;
    return &t->planes;
}

/* ---- expected bytes ---- */

void mxi_fsdp_expected_gather(const mx_model *m, int world_W, int EP, int EF, bool reshard, uint64_t *bf16,
                              uint64_t *on_demand, uint64_t *all) {
    *bf16 = *on_demand = *all = 0;
    const mxi_linear_mx *spec = mxi_model_mx_spec(m);
    for (int i = 0; i < mx_model_num_tensors(m); i++) {
        mxi_tensor_shape s = mxi_model_tensor_shape(m, i);
        if (!s.converted || !spec) continue;
        int W = world_W;
        if (EP > 1 && s.groups > 1 && mxi_model_ep_layer(m, s.unit - 1))   // an EP rank's experts, over its expert shard group
            s.groups /= EP, W = EF;
        shard_groups(s.groups, s.rows, &s.groups, &s.rows);
        int64_t S = rows_per_rank(s.rows, W), KB = CEIL_DIV(s.cols, 32);
        uint64_t codes = (uint64_t)(s.groups * S * s.cols) * (uint64_t)W;
        uint64_t row = codes + (uint64_t)(s.groups * S * KB) * (uint64_t)W;
        uint64_t col = codes + (uint64_t)(s.groups * (S / 32) * s.cols) * (uint64_t)W;
        uint64_t tiled = codes + (uint64_t)(s.groups * (S / 32) * KB) * (uint64_t)W;
        if (spec->weight_tiles) row = col = tiled;
        bool twice = reshard && s.unit != 0;   // gathered in forward and again in backward
        uint64_t both = spec->weight_tiles ? tiled : row + col;
        // on-demand's backward gather of a recomputed block carries both planes (tiles: the one)
        uint64_t backward = mxi_model_unit_recomputes(m, s.unit) ? both : col;
        *bf16 += 2 * codes * (twice ? 2 : 1);
        *on_demand += twice ? row + backward : both;
        *all += twice ? 2 * both : both;
    }
}

int mxi_fsdp_expected(const mx_model *m, const mxi_fsdp_options *opt, int world, mxi_fsdp_counters *c,
                      mxi_fsdp_memory *mem, mx_diag *diag) {
    memset(c, 0, sizeof *c);
    memset(mem, 0, sizeof *mem);
    int D = opt->replicas > 1 ? opt->replicas : 1;
    if (world < 1 || world % D)
        return mxi_diag(diag, MX_EINVAL, "mxi_fsdp_expected: %d replicas do not divide %d ranks", D, world);
    mxi_fsdp f = {0};
    f.model = (mx_model *)(uintptr_t)m;   // only read
    set_options(&f, opt);
    int ED = opt->expert_replicas > 1 ? opt->expert_replicas : 1;
    if (f.EP > 1 && world % (f.EP * ED))
        return mxi_diag(diag, MX_EINVAL, "mxi_fsdp_expected: %d EP ranks x %d expert replicas do not divide %d ranks",
                        f.EP, ED, world);
    f.W = world / D, f.replicas = D;
    f.dom[DOM_DENSE] = (domain){NULL, NULL, f.W, 0, D, 0};
    if (f.EP > 1) f.dom[DOM_EXPERTS] = (domain){NULL, NULL, world / (f.EP * ED), 0, ED, 0};
    size_t cache = 0;
    buffer_sizes b;
    segment *segs = NULL;
    int rc = lay_out(&f, &cache);
    if (!rc) rc = size_buffers(&f, &b);
    if (!rc && !(segs = calloc((size_t)b.max_segs ? (size_t)b.max_segs : 1, sizeof *segs))) rc = MX_ENOMEM;
    // one micro-batch: every unit gathered for forward and, resharded after it, again for
    // backward (the root stays; the embedding's backward reads no weights), then
    // reduce-scattered, then all-reduced across replicas
    for (int u = 0; u < f.n_units && !rc; u++)
        for (int d = 0; d < N_DOMS; d++) {
            const domain *dm = &f.dom[d];
            uint64_t n = (uint64_t)f.u[u].part_numel[d];
            if (!n) continue;   // one gather and reduce per layout the unit has tensors of
            for (int forward = 1; forward >= 0; forward--) {
                if (!forward && (u == 0 || !f.opt.reshard_after_forward || is_embedding_unit(&f, u))) break;
                bool row, col;
                int k;
                planes_for(&f, u, forward, &row, &col);
                build_segments(&f, u, d, row, col, segs, &k);
                count_gather(c, segs, k, dm->W);
            }
            c->rs_bytes += n * (uint64_t)dm->W * reduce_elem(&f);
            c->reduce_scatters++;
            if (dm->D > 1) c->ar_bytes += n * reduce_elem(&f), c->all_reduces++;
        }
    if (!rc) *mem = memory_of(&f, cache, b.total);
    free(segs);
    if (f.u) free(f.u[0].tensors);
    free(f.t), free(f.u);
    return rc ? mxi_diag(diag, MX_ENOMEM, "out of memory laying out the shards") : MX_OK;
}

int mxi_fsdp_replica(const mxi_fsdp *f) { return f->replica; }
int mxi_fsdp_replicas(const mxi_fsdp *f) { return f->replicas; }
