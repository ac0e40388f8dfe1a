/* Expert parallelism's token exchanges (docs/distributed.md#expert-parallelism): which
 * MoE layers exchange tokens and in which wire format, packing and unpacking rows, the
 * group's alltoallv through the engine's hooks (in the background where overlapping), and
 * counting what left the rank. */
#include <stdio.h>
#include <string.h>

#include "model/model_internal.h"
#include "ops/nn_kernels.h"

/* Which MoE layers exchange tokens, and how each exchange's rows travel: exactly (bf16 only
 * where the receiving GEMMs round them to bf16 anyway: unconverted experts at bf16 compute)
 * unless dispatch_dtype asks for bf16 or mxfp8 on the forward dispatch. The combines are
 * always fp32: their receiver sums the rows in fp32 (docs/distributed.md#expert-parallelism). */
int mxi_model_plan_ep(mx_model *m, const mx_model_options *o, mx_diag *diag) {
    m->bf16 = o->bf16;
    if (m->ep_size <= 1) return MX_OK;
    for (int l = 0; l < m->cfg.num_hidden_layers; l++) {
        if (!mx_model_layer_is_moe(&m->cfg, l)) continue;
        char name[48];
        snprintf(name, sizeof name, "model.layers.%d.mlp.experts", l);
        bool ep = o->n_ep_modules == 0;
        for (int i = 0; i < o->n_ep_modules && !ep; i++) ep = mx_pattern_match_module(o->ep_modules[i].compiled, name, NULL);
        m->ep_layer[l] = ep;
        if (!ep) continue;
        bool converted = m->mx[l].experts != NULL, exact_bf16 = m->bf16 && !converted;
        mxi_ep_wire exact = o->ep_dispatch != MX_EP_DISPATCH_FP32 && exact_bf16 ? MXI_EP_WIRE_BF16 : MXI_EP_WIRE_FP32;
        mxi_ep_wire *w = m->ep_wire[l];
        w[MXI_EP_FWD_DISPATCH] = w[MXI_EP_BWD_DISPATCH] = exact;
        w[MXI_EP_FWD_COMBINE] = w[MXI_EP_BWD_COMBINE] = MXI_EP_WIRE_FP32;
        if (o->ep_dispatch == MX_EP_DISPATCH_BF16) w[MXI_EP_FWD_DISPATCH] = MXI_EP_WIRE_BF16;
        if (o->ep_dispatch == MX_EP_DISPATCH_MXFP8) {
            if (!converted || m->mx[l].experts->scaling != MXI_SCALE_BLOCKS)
                return mxi_diag(diag, MX_ECONFIG, "parallel.ep_plan.dispatch_dtype: mxfp8 needs %s converted by the "
                                "quantization plan with an mx recipe (allowed: auto, fp32, bf16, or convert it with "
                                "quantize.moe.mx)", name);
            if (m->mx[l].experts->high_precision & MX_GEMM_FPROP)   // fprop would read the fp32 tokens
                return mxi_diag(diag, MX_ECONFIG, "parallel.ep_plan.dispatch_dtype: mxfp8 does not go with "
                                "training.quantization_plan.high_precision_gemms listing fprop (allowed: auto, fp32, "
                                "bf16, or quantize fprop)");
            w[MXI_EP_FWD_DISPATCH] = MXI_EP_WIRE_MXFP8;
        }
    }
    return MX_OK;
}

bool mxi_model_ep_layer(const mx_model *m, int l) { return l >= 0 && l < m->cfg.num_hidden_layers && m->ep_layer[l]; }
mxi_ep_wire mxi_model_ep_wire(const mx_model *m, int l, mxi_ep_exchange x) { return m->ep_wire[l][x]; }
uint64_t mxi_ep_row_bytes(mxi_ep_wire w, int64_t C) {
    return (uint64_t)(w == MXI_EP_WIRE_FP32 ? 4 * C : w == MXI_EP_WIRE_BF16 ? 2 * C : C + (C + MX_BLOCK - 1) / MX_BLOCK);
}

void mxi_model_set_ep(mx_model *m, const mxi_model_ep *ep) { m->ep = *ep; }

/* The group's alltoallv; false (the pass stops at the next unit) when it failed. */
static bool ep_exchange(mx_model *m, const void *send, const int *send_rows, void *recv, const int *recv_rows,
                        size_t row_bytes, const char *what) {
    if (m->hook_error) return false;
    if (!m->ep.alltoallv) {   // an EP model whose engine installed no exchange
        m->hook_error = mxi_diag(&m->hook_diag, MX_EINVAL, "expert parallelism: no exchange installed");
        return false;
    }
    int rc = m->ep.alltoallv(m->ep.ctx, send, send_rows, recv, recv_rows, row_bytes, what, &m->hook_diag);
    if (rc) m->hook_error = rc;
    return rc == 0;
}

/* Whether exchanges run beside the work that does not need them (ep_start returns at once). */
bool mxi_ep_overlapping(const mx_model *m) { return m->ep_overlap && m->ep.start && m->ep.poke && m->ep.wait; }

/* Start the group's exchange: in the background where overlapping, finished by ep_finish;
 * else at once (ep_exchange). False when it failed. */
static bool ep_start(mx_model *m, const void *send, const int *send_rows, void *recv, const int *recv_rows,
                     size_t row_bytes, const char *what) {
    if (!mxi_ep_overlapping(m)) return ep_exchange(m, send, send_rows, recv, recv_rows, row_bytes, what);
    if (m->hook_error) return false;
    int rc = m->ep.start(m->ep.ctx, send, send_rows, recv, recv_rows, row_bytes, what, &m->hook_diag);
    if (rc) m->hook_error = rc;
    else m->ep_in_flight = true;
    return rc == 0;
}

/* Between the GEMMs that run beside an exchange: let it progress. */
void mxi_ep_poke(mx_model *m) {
    if (m->ep_in_flight) m->ep.poke(m->ep.ctx);
}

/* The started exchange done (its buffers the model's again); false when it, or anything
 * before, failed. */
static bool ep_finish(mx_model *m) {
    if (m->ep_in_flight) {
        m->ep_in_flight = false;
        int rc = m->ep.wait(m->ep.ctx, &m->hook_diag);
        if (rc && !m->hook_error) m->hook_error = rc;
    }
    return !m->hook_error;
}

/* Rows this rank sends to each rank of the group (its routed rows for that rank's experts,
 * s->group_off) and receives from each (s->ep_cnt). */
static void ep_rows(mx_model *m, const layer_acts *s) {
    int P = m->ep_size, El = m->cfg.num_experts / P;
    for (int d = 0; d < P; d++) {
        int n = 0;
        for (int j = 0; j < El; j++) n += s->ep_cnt[d * El + j];
        m->ep_send[d] = s->group_off[(d + 1) * El] - s->group_off[d * El], m->ep_recv[d] = n;
    }
}

/* The first expert-side row (s->xe's order: by local expert, then source rank) of the rows
 * source rank r sent to local expert j. */
static int64_t ep_expert_row(const mx_model *m, const layer_acts *s, int r, int j) {
    int El = m->cfg.num_experts / m->ep_size;
    int64_t x = s->xoff[j];
    for (int q = 0; q < r; q++) x += s->ep_cnt[q * El + j];
    return x;
}

/* Expert-side rows src (s->xe's order) into the order they travel back in (by source rank,
 * then local expert), fp32. */
static void ep_to_wire_order(const mx_model *m, const layer_acts *s, float *dst, const float *src, int64_t cols) {
    int P = m->ep_size, El = m->cfg.num_experts / P;
    int64_t t = 0;
    for (int r = 0; r < P; r++)
        for (int j = 0; j < El; j++) {
            int64_t n = s->ep_cnt[r * El + j];
            if (n) memcpy(dst + t * cols, src + ep_expert_row(m, s, r, j) * cols, (size_t)(n * cols) * 4);
            t += n;
        }
}

/* Rows (R, C) as they go on the wire: fp32 as they are, bf16 rounded to nearest even, or
 * (mxfp8) the rowwise MX plane of the experts' FC1 input, quantized by the kernel the
 * expert GEMM uses and packed per row as C codes then ceil(C/32) scales. */
static const void *ep_pack_rows(mx_model *m, int l, mxi_ep_wire w, const float *x, int64_t rows) {
    int64_t C = m->cfg.hidden_size, S = (C + MX_BLOCK - 1) / MX_BLOCK, rb = (int64_t)mxi_ep_row_bytes(w, C);
    if (w == MXI_EP_WIRE_FP32) return x;
    if (w == MXI_EP_WIRE_BF16) {
        mxi_bf16_round((uint16_t *)m->ep_pack, x, rows * C);
        return m->ep_pack;
    }
    const mxi_linear_mx *mx = m->mx[l].experts;   // ep_xq, ep_xsc: scratch until the rows come in
    int rc = mx_quantize_f32(x, rows, C, MX_ROWWISE, mx->inputs, mx->mode, m->ep_xq, m->ep_xsc);
    if (rc) m->hook_error = mxi_diag(&m->hook_diag, rc, "expert parallelism: quantizing the tokens: %s", mx_strerror(rc));
    if (!rc && mxi_quant_stats_on(m->qstats)) {   // FC1's input, quantized here rather than by the expert GEMM
        mxi_qs_operand op = {.q = m->ep_xq, .rows = rows, .cols = C, .elem = mx->inputs, .scaling = MXI_QS_BLOCKS,
                             .axis = MX_ROWWISE, .e8m0 = m->ep_xsc};
        mxi_quant_stats_record(m->qstats, m->layers[l].experts_gate_up, MXI_QS_FPROP_X, x, &op);
    }
    #pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < rows; p++) {
        memcpy(m->ep_pack + p * rb, m->ep_xq + p * C, (size_t)C);
        memcpy(m->ep_pack + p * rb + C, m->ep_xsc + p * S, (size_t)S);
    }
    return m->ep_pack;
}

/* Rows received in m->ep_buf (by source rank, then local expert, in wire format w) into dst
 * (RX, C) in the experts' order, as fp32; with mxfp8 the plane itself goes to m->ep_xq /
 * m->ep_xsc in that order, and dst gets its dequantized values. */
static void ep_unpack_rows(mx_model *m, const layer_acts *s, int l, mxi_ep_wire w, float *dst) {
    int P = m->ep_size, El = m->cfg.num_experts / P;
    int64_t C = m->cfg.hidden_size, S = (C + MX_BLOCK - 1) / MX_BLOCK, rb = (int64_t)mxi_ep_row_bytes(w, C), t = 0;
    const uint8_t *src = (const uint8_t *)m->ep_buf;
    for (int r = 0; r < P; r++)
        for (int j = 0; j < El; j++) {
            int64_t n = s->ep_cnt[r * El + j], x = ep_expert_row(m, s, r, j);
            const uint8_t *in = src + t * rb;
            if (n && w == MXI_EP_WIRE_FP32) memcpy(dst + x * C, in, (size_t)(n * rb));
            else if (n && w == MXI_EP_WIRE_BF16) mxi_bf16_widen(dst + x * C, (const uint16_t *)in, n * C, 0);
            else
                for (int64_t i = 0; i < n; i++) {
                    memcpy(m->ep_xq + (x + i) * C, in + i * rb, (size_t)C);
                    memcpy(m->ep_xsc + (x + i) * S, in + i * rb + C, (size_t)S);
                }
            t += n;
        }
    if (w == MXI_EP_WIRE_MXFP8) {
        int rc = mx_dequantize_f32(m->ep_xq, m->ep_xsc, s->xoff[El], C, MX_ROWWISE, m->mx[l].experts->inputs, dst);
        if (rc) m->hook_error = mxi_diag(&m->hook_diag, rc, "expert parallelism: the tokens' MX plane: %s", mx_strerror(rc));
    }
}

/* Count rows sent to the other ranks of the group (rows[r] to rank r) in wire format w. */
static void ep_count(mx_model *m, const int32_t *rows, mxi_ep_wire w, bool dispatch, bool forward) {
    uint64_t n = 0, C = (uint64_t)m->cfg.hidden_size;
    for (int r = 0; r < m->ep_size; r++) n += r == m->ep.rank ? 0 : (uint64_t)rows[r];
    mxi_model_ep_bytes *b = &m->ep_bytes;
    if (!dispatch) b->combine_fp32 += n * mxi_ep_row_bytes(w, (int64_t)C);
    else if (w == MXI_EP_WIRE_FP32) b->dispatch_fp32 += n * 4 * C;
    else if (w == MXI_EP_WIRE_BF16) b->dispatch_bf16 += n * 2 * C;
    else b->dispatch_mx_data += n * C, b->dispatch_mx_scale += n * ((C + MX_BLOCK - 1) / MX_BLOCK);
    if (forward) *(dispatch ? &b->dispatch_rows : &b->combine_rows) += n;
}

/* Send this rank's routed rows src (R, C; grouped by expert, s->group_off) of exchange x to
 * their experts' ranks (ep_start); ep_arrive_at_experts then puts those of this rank's
 * experts into dst (RX, C) in s->xe's order. src must stay as it is until then. */
void mxi_ep_send_to_experts(mx_model *m, layer_acts *s, int l, mxi_ep_exchange x, const float *src,
                               const char *what) {
    mxi_ep_wire w = m->ep_wire[l][x];
    int64_t C = m->cfg.hidden_size;
    ep_rows(m, s);
    const void *send = ep_pack_rows(m, l, w, src, s->group_off[m->cfg.num_experts]);
    ep_start(m, send, m->ep_send, m->ep_buf, m->ep_recv, (size_t)mxi_ep_row_bytes(w, C), what);
}

void mxi_ep_arrive_at_experts(mx_model *m, layer_acts *s, int l, mxi_ep_exchange x, float *dst) {
    if (!ep_finish(m)) return;
    ep_count(m, m->ep_send, m->ep_wire[l][x], true, x == MXI_EP_FWD_DISPATCH);
    ep_unpack_rows(m, s, l, m->ep_wire[l][x], dst);
}

/* Send this rank's routed rows m->ep_xs (grouped by expert, s->group_off) to their experts'
 * ranks: s->xe gets the rows of this rank's experts, each group in (source rank, token)
 * order, s->xoff their offsets, s->ep_cnt who sent how many. */
void mxi_ep_dispatch(mx_model *m, int l, layer_acts *s) {
    int P = m->ep_size, E = m->cfg.num_experts, El = E / P;
    for (int e = 0; e < E; e++) m->ep_cnt_send[e] = s->group_off[e + 1] - s->group_off[e];
    for (int r = 0; r < P; r++) m->ep_send[r] = m->ep_recv[r] = 1;
    if (!ep_exchange(m, m->ep_cnt_send, m->ep_send, s->ep_cnt, m->ep_recv, (size_t)El * sizeof(int32_t),
                     "the experts' token counts")) return;
    s->xoff[0] = 0;
    for (int j = 0; j < El; j++) {
        int n = 0;
        for (int r = 0; r < P; r++) n += s->ep_cnt[r * El + j];
        s->xoff[j + 1] = s->xoff[j] + n;
    }
    mxi_ep_send_to_experts(m, s, l, MXI_EP_FWD_DISPATCH, m->ep_xs, "the tokens' dispatch to their experts");
    mxi_ep_arrive_at_experts(m, s, l, MXI_EP_FWD_DISPATCH, s->xe);   // the experts need them all
}

/* The way back (exchange x, fp32): expert-side rows src (s->xe's order) to their source
 * ranks, dst (R, C) in the order of s->group_off, once ep_combined has returned true. */
void mxi_ep_combine(mx_model *m, layer_acts *s, mxi_ep_exchange x, float *dst, const float *src) {
    int C = m->cfg.hidden_size;
    ep_to_wire_order(m, s, m->ep_buf, src, C);
    ep_rows(m, s);
    ep_start(m, m->ep_buf, m->ep_recv, dst, m->ep_send, (size_t)C * 4,
             x == MXI_EP_FWD_COMBINE ? "the experts' outputs back to their tokens"
                                     : "the experts' input gradients back to their tokens");
}

bool mxi_ep_combined(mx_model *m, int l, mxi_ep_exchange x) {
    if (!ep_finish(m)) return false;
    ep_count(m, m->ep_recv, m->ep_wire[l][x], false, x == MXI_EP_FWD_COMBINE);
    return true;
}

void mxi_model_take_ep_bytes(mx_model *m, mxi_model_ep_bytes *bytes) {
    *bytes = m->ep_bytes;
    memset(&m->ep_bytes, 0, sizeof m->ep_bytes);
}
