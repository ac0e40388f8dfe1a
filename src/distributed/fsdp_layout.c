/* The FSDP engine's layout (see fsdp_internal.h): how each tensor is cut into shards, where
 * it lands in its unit's buffer and in the MX planes of the shards, the pieces of each
 * all-gather, and the sizes of every buffer. Both mxi_fsdp_create and mxi_fsdp_expected lay
 * out with this code, so that a prediction is what a run holds. */
#include <stdlib.h>
#include <string.h>

#include "distributed/fsdp_internal.h"

int64_t mxi_fsdp_rows_per_rank(int64_t R, int W) { return CEIL_DIV(CEIL_DIV(R, 32), W) * 32; }

/* How G groups of R rows (fused experts: G experts) are cut: each group on its own, so that
 * no 32-row block, and no piece, straddles two experts. When R is a multiple of 32 no block
 * can straddle, so the G R rows are cut as one group instead: the same MX blocks, with
 * padding after the last expert only rather than after each (at 64 ranks an expert's 1536
 * rows would be 24 a rank, padded to 32). *G_out, *R_out: the groups and rows to cut. */
void mxi_fsdp_shard_groups(int64_t G, int64_t R, int64_t *G_out, int64_t *R_out) {
    bool whole = G > 1 && R % 32 == 0;
    *G_out = whole ? 1 : G;
    *R_out = whole ? G * R : R;
}

/* Lay out tensor t's part of a unit buffer from *at on; returns the bytes it takes. With
 * one_plane the unit never holds both planes at once (on-demand, resharded after forward,
 * not recomputed): they share one region. With tiles both planes share the codes. */
static size_t layout_slot(shard_tensor *t, size_t at, bool one_plane, bool tiles) {
    if (t->mx && (t->tensor_scaled || t->block_scaled)) {   // one code tensor serves both products; the scales are the cache's
        t->row_q = t->col_q = at;
        t->row_s = t->col_s = t->tiles = 0;
        return ((size_t)(t->G * t->R * t->cols) + 63) & ~(size_t)63;
    }
    size_t start = at;
    int64_t n = t->G * t->R * t->cols, CB = CEIL_DIV(t->cols, 32), RB = CEIL_DIV(t->R, 32);
    int64_t row_scales = t->G * t->R * CB, col_scales = t->G * RB * t->cols;
#define PLACE(field, bytes) (t->field = at, at += ((size_t)(bytes) + 63) & ~(size_t)63)
    if (t->row_scaled) {   // fprop's codes and fp32 row scales, dgrad's codes (its scales are the cache's)
        PLACE(row_q, n);
        PLACE(row_s, t->G * t->R * (int64_t)sizeof(float));
        if (one_plane) t->col_q = t->row_q;
        else PLACE(col_q, n);
        t->col_s = t->tiles = 0;
    } else if (!t->mx) {
        PLACE(f32_at, n * (t->half ? 2 : 4));
    } else if (tiles) {
        PLACE(row_q, n);
        t->col_q = t->row_q;
        PLACE(row_s, row_scales);
        PLACE(col_s, col_scales);
        PLACE(tiles, t->G * RB * CB);
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
    int64_t n = t->G * t->S * t->cols, CB = CEIL_DIV(t->cols, 32), SB = t->S / 32;
#define PLACE(field, bytes) (t->field = at, at += ((size_t)(bytes) + 63) & ~(size_t)63)
    if (t->tensor_scaled || t->block_scaled) {   // codes, the dequantization scales, the amaxes
        int64_t scales = t->block_scaled ? t->n_tiles : t->n_ts;
        PLACE(c_row_q, n);
        PLACE(c_row_s, scales * (int64_t)sizeof(float));
        PLACE(c_col_s, scales * (int64_t)sizeof(double));
    } else if (t->row_scaled) {   // both planes' codes, their scales, the amaxes of dgrad's lines
        int64_t lines = t->n_ts * (spec->dgrad_weight_tensor ? 1 : t->cols);
        PLACE(c_row_q, n);
        PLACE(c_row_s, t->G * t->S * (int64_t)sizeof(float));
        PLACE(c_col_q, n);
        PLACE(c_col_s, lines * (int64_t)sizeof(float));
        PLACE(c_qscale, lines * (int64_t)sizeof(float));
        PLACE(c_keys, lines * (int64_t)sizeof(double));
    } else if (spec->weight_tiles) {
        PLACE(c_row_q, n);
        PLACE(c_tiles, t->G * SB * CB);
    } else {
        PLACE(c_row_q, n);
        PLACE(c_row_s, t->G * t->S * CB);
        PLACE(c_col_q, n);
        PLACE(c_col_s, t->G * SB * t->cols);
    }
#undef PLACE
    return at - start;
}

/* Whether unit u's converted shards are worth keeping quantized for the whole step: only
 * where a plane would otherwise be quantized more than once a step. Every micro-batch gathers
 * again; within one, resharded blocks gather twice, and carry a plane twice with `all` and
 * with 32x32 tiles (one plane for both). A recomputed block's backward carries the rowwise
 * plane again too, but recompute is asked for to save memory: that plane is quantized again
 * rather than kept. */
static bool cache_pays(const mxi_fsdp *f, int u) {
    // per tensor and rowwise: the scales need the step's all-reduce
    if (f->opt.micro_batches > 1 || f->spec->scaling != MXI_SCALE_BLOCKS) return true;
    if (u == 0 || !f->opt.reshard_after_forward || mxi_fsdp_is_embedding_unit(f, u)) return false;
    return f->opt.gather_all || f->spec->weight_tiles;
}

#define ALIGN8(x) (((x) + 7) & ~(size_t)7)

/* Piece p appended at the next multiple of 8 bytes of the rank's block: G x S x cols
 * elements of its type. */
static void append(segment *segs, int *n, size_t *off, segment p) {
    size_t width = p.type == SEG_F32 ? 4 : p.type == SEG_BF16 ? 2 : 1;
    p.wire_off = *off = ALIGN8(*off);
    *off += (size_t)(p.G * p.S * p.cols) * width;
    segs[(*n)++] = p;
}

/* Tensor t's codes of plane, from src (mx_cache) to dst (the unit buffer), standing for
 * bf16_equiv bytes of a bf16 gather. */
static segment codes(segment s, const shard_tensor *t, int plane, size_t src, size_t dst, int64_t bf16_equiv) {
    s.plane = plane, s.kind = KIND_MX_DATA, s.S = t->S, s.R = t->R, s.cols = t->cols;
    s.src_at = src, s.dst_off = dst, s.bf16_equiv = bf16_equiv;
    return s;
}

/* A plane's scales: S of R rows of cols bytes a group, from src to dst. */
static segment scales(segment s, int plane, int64_t S, int64_t R, int64_t cols, size_t src, size_t dst) {
    s.plane = plane, s.kind = KIND_MX_SCALE, s.S = S, s.R = R, s.cols = cols, s.src_at = src, s.dst_off = dst;
    return s;
}

/* The pieces of the all-gather of unit u's tensors of layout d carrying the wanted planes,
 * each at a multiple of 8 bytes of the rank's block; returns bytes per rank. */
size_t mxi_fsdp_segments(const mxi_fsdp *f, int u, int d, bool row, bool col, segment *segs, int *n_segs) {
    const shard_unit *su = &f->u[u];
    size_t off = 0;
    int n = 0;
    for (int i = 0; i < su->n; i++) {
        const shard_tensor *t = &f->t[su->tensors[i]];
        if (t->dom != d) continue;
        int64_t CB = CEIL_DIV(t->cols, 32), SB = t->S / 32, RB = CEIL_DIV(t->R, 32);
        segment s = {.tensor = su->tensors[i], .G = t->G};
        if (!t->mx) {
            s.type = f->opt.param_bf16 ? SEG_BF16 : SEG_F32, s.kind = KIND_PARAM;
            s.S = t->S, s.R = t->R, s.cols = t->cols;
            s.src_at = (size_t)t->shard_off * sizeof(float), s.dst_off = t->f32_at;
            append(segs, &n, &off, s);
            continue;
        }
        int64_t bf16 = 2 * t->G * t->S * t->cols;   // the bytes of the codes' bf16 gather
        s.type = SEG_BYTES;
        if (t->tensor_scaled || t->block_scaled) {   // the codes, for both products; every rank has the scales already
            append(segs, &n, &off, codes(s, t, PLANE_ROW, t->c_row_q, t->row_q, bf16));
        } else if (t->row_scaled) {   // fprop's codes with their row scales; dgrad's codes (every rank has their scales)
            if (row) {
                append(segs, &n, &off, codes(s, t, PLANE_ROW, t->c_row_q, t->row_q, bf16));
                // one fp32 scale a row: a row of 4 bytes
                append(segs, &n, &off, scales(s, PLANE_ROW, t->S, t->R, 4, t->c_row_s, t->row_s));
            }
            // both planes of one gather stand for one bf16 gather
            if (col) append(segs, &n, &off, codes(s, t, PLANE_COL, t->c_col_q, t->col_q, row ? 0 : bf16));
        } else if (f->spec->weight_tiles) {   // one tiled plane serves both GEMMs
            append(segs, &n, &off, codes(s, t, PLANE_TILES, t->c_row_q, t->row_q, bf16));
            append(segs, &n, &off, scales(s, PLANE_TILES, SB, RB, CB, t->c_tiles, t->tiles));
        } else {
            if (row) {
                append(segs, &n, &off, codes(s, t, PLANE_ROW, t->c_row_q, t->row_q, bf16));
                append(segs, &n, &off, scales(s, PLANE_ROW, t->S, t->R, CB, t->c_row_s, t->row_s));
            }
            if (col) {
                append(segs, &n, &off, codes(s, t, PLANE_COL, t->c_col_q, t->col_q, row ? 0 : bf16));
                append(segs, &n, &off, scales(s, PLANE_COL, SB, RB, t->cols, t->c_col_s, t->col_s));
            }
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
void mxi_fsdp_planes_for(const mxi_fsdp *f, int u, bool forward, bool *row, bool *col) {
    bool lp = f->opt.low_precision, all = f->opt.gather_all;
    *row = forward || all || !lp || mxi_model_unit_recomputes(f->model, u);
    *col = !forward || all || !lp || !f->opt.reshard_after_forward || u == 0;
}

/* The options as the engine applies them. */
void mxi_fsdp_set_options(mxi_fsdp *f, const mxi_fsdp_options *opt) {
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
int mxi_fsdp_lay_out(mxi_fsdp *f, size_t *cache_out) {
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
                mxi_fsdp_shard_groups(dom == DOM_EXPERTS ? f->El : s.groups, s.rows, &t->G, &t->R);
                t->g0 = dom == DOM_EXPERTS ? (int64_t)f->ep_rank * t->G : 0;   // in groups of t->R rows
                t->R_model = s.rows, t->cols = s.cols, t->S = mxi_fsdp_rows_per_rank(t->R, f->dom[d].W);
                t->unit = u, t->decay = s.decay, t->mx = s.converted && f->opt.low_precision;
                t->tensor_scaled = t->mx && f->spec->scaling == MXI_SCALE_TENSOR;
                t->row_scaled = t->mx && f->spec->scaling == MXI_SCALE_ROWS;
                t->block_scaled = t->mx && f->spec->scaling == MXI_SCALE_BLOCKS128;
                t->n_ts = t->G * t->R / t->R_model;
                t->n_tiles = t->n_ts * CEIL_DIV(t->R_model, 128) * CEIL_DIV(t->cols, 128);
                t->half = !t->mx && f->opt.param_bf16 && f->opt.hold_bf16 && mxi_model_takes_bf16(f->model, i);
                t->sunk = mxi_fsdp_sinks(f, i, dom, t->G);
                f->any_sunk |= t->sunk;
                f->sink_reduces |= t->sunk && !mxi_fsdp_reduce_direct(f, dom);
                t->shard_off = shard, t->unit_off = t->sunk ? -1 : su->full_numel;   // the unit's gradients: its held groups only
                t->red_off = t->sunk ? -1 : su->red_numel[d];
                shard += t->G * t->S * t->cols;
                if (!t->sunk) su->full_numel += t->G * t->R * t->cols, su->red_numel[d] += t->G * t->S * t->cols;
                bool one_plane = f->opt.low_precision && !f->opt.gather_all && f->opt.reshard_after_forward && u != 0 &&
                                 !mxi_model_unit_recomputes(f->model, u);
                size_t took = layout_slot(t, slot, one_plane, f->spec && f->spec->weight_tiles);
                slot += took;
                if (s.groups > 1) su->expert_slot += took;
                t->cached = t->mx && (cache_pays(f, u) || f->opt.quant_stats);
                if (t->cached) cache += layout_cache(t, f->spec, cache);
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

bool mxi_fsdp_sinks(const mxi_fsdp *f, int i, int dom, int64_t G) {
    if (f->opt.grads != MXI_WIRE_BF16 || G != 1 || !mxi_model_sinks_grad(f->model, i)) return false;
    if (mxi_fsdp_reduce_direct(f, dom)) return true;
    // on more ranks the vocabulary tables only, whose unsharded fp32 gradient and reduce-scatter
    // buffers would each be V x C: their slices are summed over the shard group in fp32 (not
    // across replicas)
    return f->opt.reduce == MXI_WIRE_F32 && f->dom[dom].D <= 1 && mxi_model_vocab_table(f->model, i);
}

int mxi_fsdp_size_buffers(mxi_fsdp *f, buffer_sizes *b) {
    memset(b, 0, sizeof *b);
    int NB = f->n_units - 1;   // the blocks, and the embedding's unit unless lm_head shares it
    // a group of one rank gathers by copying from its shard when the unit is needed: a
    // prefetch would only hold a buffer early
    if (f->dom[DOM_DENSE].W == 1 && (f->EP <= 1 || f->dom[DOM_EXPERTS].W == 1))
        f->opt.forward_prefetch = f->opt.backward_prefetch = 0;
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
            if (!mxi_fsdp_reduce_direct(f, d) && (size_t)f->u[u].red_numel[d] > b->rs_elems[d])
                b->rs_elems[d] = (size_t)f->u[u].red_numel[d];
    }
    segment *tmp = calloc((size_t)b->max_segs ? (size_t)b->max_segs : 1, sizeof *tmp);
    if (!tmp) return MX_ENOMEM;
    for (int u = 0; u < f->n_units; u++)   // the gathers this mode makes: forward and backward
        for (int forward = 0; forward < 2; forward++)
            for (int d = 0; d < N_DOMS; d++) {
                bool row, col;
                int n;
                mxi_fsdp_planes_for(f, u, forward, &row, &col);
                size_t bytes = mxi_fsdp_segments(f, u, d, row, col, tmp, &n);
                if (f->dom[d].W > 1 && bytes > b->block[d]) b->block[d] = bytes;
            }
    free(tmp);
    b->rs_elem = mxi_fsdp_reduce_elem(f);
    // a gradient added straight into the shard lands where the unit's own buffer would put it
    // only when the reduction is the identity and nothing is summed over micro-batches first
    f->grads_direct = f->opt.micro_batches <= 1 && f->opt.grads == MXI_WIRE_F32;
    for (int i = 0; i < f->n_tensors; i++) {
        const shard_tensor *t = &f->t[i];
        f->grads_direct &= mxi_fsdp_reduce_direct(f, t->dom) && (t->G == 1 || t->S == t->R);
    }
    if (!f->grads_direct) {
        b->root_full = f->u[0].full_numel;
        for (int u = 1; u < f->n_units; u++) b->block_full = f->u[u].full_numel > b->block_full ? f->u[u].full_numel : b->block_full;
    }
    // one allocation for every communication buffer, 64-byte aligned pieces
    b->slot0 = ROUND64(f->u[0].slot_bytes), b->slotn = ROUND64(f->slot_bytes);
    size_t total = b->slot0 + (size_t)b->block_slots * b->slotn;
    for (int d = 0; d < N_DOMS; d++) {
        size_t W = (size_t)f->dom[d].W;
        // in place: a gather's own block packed into its receive buffer, a reduction's sum in
        // the first block of its send buffer
        total += (size_t)f->n_gathers * ROUND64(b->block[d] * W);
        total += 2 * ROUND64(b->rs_elems[d] * b->rs_elem * W);
    }
    total += ROUND64((size_t)b->root_full * 4) + ROUND64((size_t)b->block_full * 4);
    b->total = total;
    return MX_OK;
}

mxi_fsdp_memory mxi_fsdp_count_memory(const mxi_fsdp *f, size_t cache, size_t gathered) {
    // per element: master 4, gradients 4 or 2 (and fp64 sums 8), and the moments per 32 (every
    // tensor's span of the shard is whole 32s) and per span
    uint64_t grad_bytes = (f->opt.grads == MXI_WIRE_BF16 ? 2 : 4) + (f->opt.reduce == MXI_WIRE_F64 ? 8 : 0);
    uint64_t shard = (uint64_t)f->shard_numel, per = 4 + grad_bytes;
    uint64_t mom32 = f->opt.moment_bytes32 ? f->opt.moment_bytes32 : 256, mom_span = f->opt.moment_bytes_span;
    mxi_fsdp_memory m = {.master = shard * 4, .grads = shard * grad_bytes,
                         .optimizer = shard / 32 * mom32 + (uint64_t)f->n_tensors * mom_span,
                         .mx_shards = cache, .gathered = gathered + (f->any_sunk ? mxi_model_sink_bytes(f->model) : 0)};
    // the experts' part (fused expert tensors, with or without EP): their shards, and the
    // most one unit holds of them gathered and as unsharded gradients
    for (int u = 0; u < f->n_units; u++) {
        uint64_t unit = 0, grad = 0;
        for (int i = 0; i < f->u[u].n; i++) {
            int id = f->u[u].tensors[i];
            const shard_tensor *t = &f->t[id];
            if (t->G_full < 2) continue;
            m.expert_shards +=
                (uint64_t)(t->G * t->S * t->cols) * per + (uint64_t)(t->G * t->S * t->cols) / 32 * mom32 + mom_span;
            grad += (uint64_t)(t->G * t->R * t->cols) * 4;
        }
        unit = f->u[u].expert_slot;
        if (unit > m.expert_unit) m.expert_unit = unit;
        if (grad > m.expert_grad) m.expert_grad = grad;
    }
    return m;
}
