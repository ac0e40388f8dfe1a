/* The MoE blocks of Qwen3-MoE: route, group tokens by expert, each expert's SwiGLU MLP
 * as GEMMs over its group (quantize.moe.mx: per expert group), combine; and backward. With
 * expert parallelism the groups of this rank's experts gather the EP group's tokens
 * (expert_exchange.c). */
#include <string.h>

#include "model/model_internal.h"

/* Expert group e's slice of a per-group saved plane of width cols (scales after the partial
 * blocks of the groups before it). */
static mxi_saved_input group_plane(const mxi_saved_input *sv, const int32_t *off, int e, int64_t cols) {
    if (!sv->q) return (mxi_saved_input){0};   // no plane saved (the experts not converted)
    int64_t blocks = 0;
    for (int g = 0; g < e; g++) blocks += (off[g + 1] - off[g] + MX_BLOCK - 1) / MX_BLOCK;
    return (mxi_saved_input){.q = sv->q + (int64_t)off[e] * cols, .scales = sv->scales + blocks * cols};
}

/* An expert group's input as backward reads it: its fp32 rows where the site keeps fp32
 * (sv), else the group's slice of the saved plane. */
static mxi_linear_input expert_input(const float *fp32, const mxi_saved_input *sv, const mxi_saved_input *group) {
    return (mxi_linear_input){mxi_site_kept(fp32, sv), mxi_site_saved(group)};
}

/* Expert e's slice of the planes bound to a fused expert tensor (E, rows, cols). */
static const mxi_mx_weight *expert_planes(mxi_mx_weight *out, const mxi_mx_weight *w, int e) {
    if (!w) return NULL;
    *out = *w;
    int64_t rows = w->row.q ? w->row.rows : w->col.rows, cols = w->row.q ? w->row.cols : w->col.cols;
    if (out->tscale) {   // a per-tensor recipe's codes, and one scale per expert
        out->row.q += e * rows * cols, out->tscale += e;
        return out;
    }
    if (out->bscale) {   // the blockwise recipe's codes, and each expert's 128x128 tiles' scales
        out->row.q += e * rows * cols, out->bscale += e * ((rows + 127) / 128) * ((cols + 127) / 128);
        return out;
    }
    if (out->row_scales || out->col_scales) {   // a rowwise recipe's: a scale per row, per column or per expert
        if (out->row.q) out->row.q += e * rows * cols, out->row_scales += e * rows;
        if (out->col.q) out->col.q += e * rows * cols, out->col_scales += e * out->col_per_group;
        return out;
    }
    if (out->row.q) out->row.q += e * rows * cols, out->row.scales += e * rows * ((cols + MX_BLOCK - 1) / MX_BLOCK);
    if (out->col.q) out->col.q += e * rows * cols, out->col.scales += e * ((rows + MX_BLOCK - 1) / MX_BLOCK) * cols;
    return out;
}

/* The colwise planes the backward reads of expert group j's inputs (FC1's and FC2's), in
 * blocks along the tokens of this group only. */
static void save_expert_inputs(mx_model *m, int l, layer_acts *s, const int32_t *xoff, int j) {
    int C = m->cfg.hidden_size, FE = m->cfg.moe_intermediate_size;
    int64_t r0 = xoff[j], ne = xoff[j + 1] - xoff[j];
    if (ne == 0) return;
    mxi_saved_input gx = group_plane(&s->xe_sv, xoff, j, C), gh = group_plane(&s->he_sv, xoff, j, FE);
    mxi_linear_save_input(m->lin, m->mx[l].experts, &gx, s->xe + r0 * C, ne, C);
    if (gh.q) mxi_linear_save_input(m->lin, m->mx[l].experts, &gh, s->he + r0 * FE, ne, FE);   // selective: none
}

/* The MoE block of layer l on s->ln2: route, group tokens by expert, run each expert's
 * SwiGLU MLP as GEMMs over its group, and combine with the routing weights into out. With
 * EP, the groups of this rank's experts gather the EP group's tokens (ep_dispatch) and
 * their outputs go back (ep_combine). */
void mxi_moe_forward(mx_model *m, int l, float *out /* (N, C) */) {
    const mx_model_config *c = &m->cfg;
    layer_acts *s = &m->acts[l];
    const layer_offsets *o = &m->layers[l];
    int N = m->N, C = c->hidden_size, E = c->num_experts, K = c->num_experts_per_tok, FE = c->moe_intermediate_size;
    TIMED(MXI_OP_ROUTER, mxi_linear_forward(m->lin, m->mx[l].router, s->probs, s->ln2, PARAMS(o->router, -1),
                                            SHAPE(N, C, E)));   // logits, then probabilities
    if (s->z) {   // the z-loss needs the logits, which the softmax overwrites
        double sum;
        TIMED(MXI_OP_ROUTING, sum = mxi_moe_z_forward(s->z, s->probs, N, E));
        if (!m->recomputing) m->z_sum += sum;
    }
    TIMED(MXI_OP_ROUTING, mxi_moe_route_forward(s->idx, s->route_w, s->probs, s->probs, N, E, K, c->norm_topk_prob));
    // counting sort of (token, slot) by expert; tokens stay in ascending order within a group
    mxi_prof_t t0 = mxi_prof_start(m);
    int32_t *off = s->group_off;
    memset(off, 0, (size_t)(E + 1) * sizeof *off);
    for (int i = 0; i < N * K; i++) off[s->idx[i] + 1]++;
    for (int e = 0; e < E; e++) off[e + 1] += off[e];
    int32_t *next = m->group_next;
    memcpy(next, off, (size_t)E * sizeof *off);
    for (int n = 0; n < N; n++)
        for (int j = 0; j < K; j++) {
            int32_t p = next[s->idx[n * K + j]]++;
            s->perm_tok[p] = n;
            s->pos_of[n * K + j] = p;
        }
    int R = N * K, P = m->ep_layer[l] ? m->ep_size : 1, El = E / P, e0 = P > 1 ? m->ep.rank * El : 0;
    float *xs = P > 1 ? m->ep_xs : s->xe;   // this rank's routed rows, grouped by expert
    #pragma omp parallel for schedule(static)
    for (int p = 0; p < R; p++) memcpy(xs + (int64_t)p * C, s->ln2 + (int64_t)s->perm_tok[p] * C, (size_t)C * 4);
    const int32_t *xoff = off;   // expert-side groups of the experts computed here: e0 + j
    if (P > 1) mxi_ep_dispatch(m, l, s), xoff = s->xoff;
    bool given = P > 1 && m->ep_wire[l][MXI_EP_FWD_DISPATCH] == MXI_EP_WIRE_MXFP8;   // FC1's input plane came with the rows
    int64_t S = (C + MX_BLOCK - 1) / MX_BLOCK;
    mxi_prof_stop(m, MXI_OP_PERMUTE, t0);
    const float *wgu0 = W(o->experts_gate_up), *wd0 = W(o->experts_down);
    // with the exchanges in the background, the saved planes wait for the combine to start
    bool save_now = s->xe_sv.q && !(P > 1 && mxi_ep_overlapping(m));
    mxi_linear_vary_tokens(m->lin, !m->fixed_expert_shapes);   // one primitive per GEMM kind, whatever the group sizes
    for (int j = 0; j < El; j++) {
        int e = P > 1 && m->local_experts ? j : e0 + j;   // the bound expert tensors' index of expert e0 + j
        int64_t r0 = xoff[j], ne = xoff[j + 1] - xoff[j];
        if (ne == 0) continue;
        const float *wgu = wgu0 ? wgu0 + (int64_t)e * 2 * FE * C : NULL, *wd = wd0 ? wd0 + (int64_t)e * C * FE : NULL;
        mxi_mx_weight qgu, qd;
        if (given)
            mxi_linear_given_input(m->lin, s->xe + r0 * C, &(mxi_mx_plane){m->ep_xq + r0 * C, m->ep_xsc + r0 * S, ne, C,
                                                                       MX_ROWWISE, m->mx[l].experts->inputs},
                               m->mx[l].experts->mode);
        mxi_linear_params pgu = {.w = wgu, .wq = expert_planes(&qgu, WQ(o->experts_gate_up), e),
                                 .delayed = mxi_delayed_site_of(m->delayed, o->experts_gate_up, e0 + j),
                                 .tensor = o->experts_gate_up},
                          pd = {.w = wd, .wq = expert_planes(&qd, WQ(o->experts_down), e),
                                .delayed = mxi_delayed_site_of(m->delayed, o->experts_down, e0 + j),
                                .tensor = o->experts_down};
        TIMED(MXI_OP_EXPERT_GEMM, mxi_linear_forward(m->lin, m->mx[l].experts, s->gu + r0 * 2 * FE, s->xe + r0 * C,
                                                     pgu, SHAPE(ne, C, 2 * FE)));
        if (given) mxi_linear_share_input(m->lin, NULL);
        TIMED(MXI_OP_EXPERT_SWIGLU,
              mxi_swiglu_forward(s->he + r0 * FE, s->gu + r0 * 2 * FE, s->gu + r0 * 2 * FE + FE, ne, FE, 2 * FE));
        t0 = mxi_prof_start(m);
        mxi_linear_forward(m->lin, m->mx[l].experts, s->ye + r0 * C, s->he + r0 * FE, pd, SHAPE(ne, FE, C));
        if (save_now) save_expert_inputs(m, l, s, xoff, j);
        mxi_prof_stop(m, MXI_OP_EXPERT_GEMM, t0);
    }
    mxi_linear_vary_tokens(m->lin, false);
    const float *ys = s->ye;   // the outputs of this rank's routed rows, in the order of off
    t0 = mxi_prof_start(m);
    if (P > 1) mxi_ep_combine(m, s, MXI_EP_FWD_COMBINE, s->ys, s->ye), ys = s->ys;
    mxi_prof_stop(m, MXI_OP_PERMUTE, t0);
    // beside the combine (where it runs in the background): what does not need it
    if (s->xe_sv.q && !save_now) {
        t0 = mxi_prof_start(m);
        for (int j = 0; j < El; j++) save_expert_inputs(m, l, s, xoff, j), mxi_ep_poke(m);
        mxi_prof_stop(m, MXI_OP_EXPERT_GEMM, t0);
    }
    if (!m->recomputing) TIMED(MXI_OP_ROUTING, mxi_moe_aux_accumulate(m->aux_count, m->aux_prob, s->idx, s->probs, N, E, K));
    t0 = mxi_prof_start(m);
    if (P > 1) mxi_ep_combined(m, l, MXI_EP_FWD_COMBINE);
    // the rows' loops vectorised (omp simd: the library is built for baseline x86-64, where
    // -O2 leaves them scalar); each element's sum keeps its order over j
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *y = out + (int64_t)n * C;
        #pragma omp simd
        for (int i = 0; i < C; i++) y[i] = 0.0f;
        for (int j = 0; j < K; j++) {
            float w = s->route_w[n * K + j];
            const float *ye = ys + (int64_t)s->pos_of[n * K + j] * C;
            #pragma omp simd
            for (int i = 0; i < C; i++) y[i] += w * ye[i];
        }
    }
    mxi_prof_stop(m, MXI_OP_PERMUTE, t0);
}

bool mxi_moe_aux_enabled(const mx_model *m) {
    return m->cfg.type == MX_MODEL_QWEN3_MOE && m->cfg.output_router_logits;
}

int mxi_moe_layer_count(const mx_model *m) {
    int n = 0;
    for (int l = 0; l < m->cfg.num_hidden_layers; l++) n += mx_model_layer_is_moe(&m->cfg, l);
    return n;
}

/* Backward of moe_forward: from dout (N, C) to m->d_ln (N, C), the gradient of s->ln2. */
void mxi_moe_backward(mx_model *m, int l, const float *dout /* (N, C) */) {
    const mx_model_config *c = &m->cfg;
    layer_acts *s = &m->acts[l];
    const layer_offsets *o = &m->layers[l];
    int N = m->N, C = c->hidden_size, E = c->num_experts, K = c->num_experts_per_tok, FE = c->moe_intermediate_size;
    int P = m->ep_layer[l] ? m->ep_size : 1, El = E / P, e0 = P > 1 ? m->ep.rank * El : 0;
    const float *ys = P > 1 ? s->ys : s->ye;
    float *d_ys = P > 1 ? m->d_ys : m->d_ye;
    // out[n] = sum_j w[n,j] ye[pos(n,j)]
    mxi_prof_t t0 = mxi_prof_start(m);
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *d = dout + (int64_t)n * C;
        for (int j = 0; j < K; j++) {
            int64_t p = s->pos_of[n * K + j];
            const float *ye = ys + p * C;
            float *dye = d_ys + p * C, w = s->route_w[n * K + j], dot = 0.0f;
            #pragma omp simd reduction(+ : dot)
            for (int i = 0; i < C; i++) {
                dot += d[i] * ye[i];
                dye[i] = w * d[i];
            }
            m->d_rw[n * K + j] = dot;
        }
    }
    const int32_t *off = P > 1 ? s->xoff : s->group_off;
    // with the exchanges in the background, the weight gradients that need none of their
    // rows run beside them: the router's beside the dispatch, the experts' (FC1's and FC2's,
    // split from their input gradients) beside the combine
    bool beside = P > 1 && mxi_ep_overlapping(m);
    if (P > 1)   // the output gradients go where the outputs came from, as the inputs went
        mxi_ep_send_to_experts(m, s, l, MXI_EP_BWD_DISPATCH, m->d_ys, "the output gradients to the experts");
    mxi_prof_stop(m, MXI_OP_PERMUTE, t0);
    if (beside) {
        TIMED(MXI_OP_ROUTING, mxi_moe_route_backward(m->d_router, m->d_rw, s->probs, s->idx,
                                                 mxi_moe_aux_enabled(m) ? m->aux_dprob : NULL, N, E, K, c->norm_topk_prob));
        if (s->z) TIMED(MXI_OP_ROUTING, mxi_moe_z_backward(m->d_router, s->probs, s->z, N, E, m->z_dscale));
        mxi_ep_poke(m);
        TIMED(MXI_OP_ROUTER, mxi_linear_backward(m->lin, m->mx[l].router, (mxi_linear_grads){.dw = G(o->router)},
                                                 m->d_router, mxi_site_input(s->ln2, &s->ln2_sv),
                                                 PARAMS(o->router, -1), SHAPE(N, C, E)));
    }
    t0 = mxi_prof_start(m);
    if (P > 1) mxi_ep_arrive_at_experts(m, s, l, MXI_EP_BWD_DISPATCH, m->d_ye);
    mxi_prof_stop(m, MXI_OP_PERMUTE, t0);
    const float *wgu0 = W(o->experts_gate_up), *wd0 = W(o->experts_down);
    mxi_linear_vary_tokens(m->lin, !m->fixed_expert_shapes);
    for (int jj = 0; jj < El; jj++) {
        int e = P > 1 && m->local_experts ? jj : e0 + jj;   // the bound expert tensors' index of expert e0 + jj
        int64_t r0 = off[jj], ne = off[jj + 1] - off[jj];
        if (ne == 0) continue;
        const float *wgu = wgu0 ? wgu0 + (int64_t)e * 2 * FE * C : NULL, *wd = wd0 ? wd0 + (int64_t)e * C * FE : NULL;
        float *gwgu = G(o->experts_gate_up) + (int64_t)e * 2 * FE * C, *gwd = G(o->experts_down) + (int64_t)e * C * FE;
        mxi_saved_input gx = group_plane(&s->xe_sv, off, jj, C), gh = group_plane(&s->he_sv, off, jj, FE);
        mxi_linear_input xin = expert_input(s->xe + r0 * C, &s->xe_sv, &gx), hin = expert_input(s->he + r0 * FE, &s->he_sv, &gh);
        mxi_mx_weight qgu, qd;
        mxi_linear_params pgu = {.w = wgu, .wq = expert_planes(&qgu, WQ(o->experts_gate_up), e),
                                 .delayed = mxi_delayed_site_of(m->delayed, o->experts_gate_up, e0 + jj),
                                 .tensor = o->experts_gate_up},
                          pd = {.w = wd, .wq = expert_planes(&qd, WQ(o->experts_down), e),
                                .delayed = mxi_delayed_site_of(m->delayed, o->experts_down, e0 + jj),
                                .tensor = o->experts_down};
        if (m->recompute[l] == MXI_RECOMPUTE_SELECTIVE)   // the group's he as forward made it (fp32 there)
            TIMED(MXI_OP_EXPERT_SWIGLU, mxi_swiglu_forward(s->he + r0 * FE, s->gu + r0 * 2 * FE,
                                                           s->gu + r0 * 2 * FE + FE, ne, FE, 2 * FE));
        TIMED(MXI_OP_EXPERT_GEMM,
              mxi_linear_backward(m->lin, m->mx[l].experts, (mxi_linear_grads){.dinp = m->d_he + r0 * FE, .dw = beside ? NULL : gwd},
                                  m->d_ye + r0 * C, hin, pd, SHAPE(ne, FE, C)));
        TIMED(MXI_OP_EXPERT_SWIGLU,
              mxi_swiglu_backward(m->d_gu + r0 * 2 * FE, m->d_gu + r0 * 2 * FE + FE, m->d_he + r0 * FE,
                              s->gu + r0 * 2 * FE, s->gu + r0 * 2 * FE + FE, ne, FE, 2 * FE));
        TIMED(MXI_OP_EXPERT_GEMM,
              mxi_linear_backward(m->lin, m->mx[l].experts, (mxi_linear_grads){.dinp = m->d_xe + r0 * C, .dw = beside ? NULL : gwgu},
                                  m->d_gu + r0 * 2 * FE, xin, pgu, SHAPE(ne, C, 2 * FE)));
    }
    t0 = mxi_prof_start(m);
    const float *d_xs = m->d_xe;
    if (P > 1) mxi_ep_combine(m, s, MXI_EP_BWD_COMBINE, m->d_xs, m->d_xe), d_xs = m->d_xs;
    mxi_prof_stop(m, MXI_OP_PERMUTE, t0);
    for (int jj = 0; beside && jj < El; jj++) {   // the experts' weight gradients, beside the combine
        int e = m->local_experts ? jj : e0 + jj;   // as above, with P > 1
        int64_t r0 = off[jj], ne = off[jj + 1] - off[jj];
        if (ne == 0) continue;
        mxi_saved_input gx = group_plane(&s->xe_sv, off, jj, C), gh = group_plane(&s->he_sv, off, jj, FE);
        mxi_linear_input xin = expert_input(s->xe + r0 * C, &s->xe_sv, &gx), hin = expert_input(s->he + r0 * FE, &s->he_sv, &gh);
        float *gwgu = G(o->experts_gate_up) + (int64_t)e * 2 * FE * C, *gwd = G(o->experts_down) + (int64_t)e * C * FE;
        // the weight gradient alone reads no weight (a delayed recipe's scales all the same)
        mxi_linear_params nd = {.delayed = mxi_delayed_site_of(m->delayed, o->experts_down, e0 + jj),
                                .tensor = o->experts_down},
                          ngu = {.delayed = mxi_delayed_site_of(m->delayed, o->experts_gate_up, e0 + jj),
                                 .tensor = o->experts_gate_up};
        TIMED(MXI_OP_EXPERT_GEMM, mxi_linear_backward(m->lin, m->mx[l].experts, (mxi_linear_grads){.dw = gwd},
                                                      m->d_ye + r0 * C, hin, nd, SHAPE(ne, FE, C)));
        mxi_ep_poke(m);
        TIMED(MXI_OP_EXPERT_GEMM, mxi_linear_backward(m->lin, m->mx[l].experts, (mxi_linear_grads){.dw = gwgu},
                                                      m->d_gu + r0 * 2 * FE, xin, ngu, SHAPE(ne, C, 2 * FE)));
        mxi_ep_poke(m);
    }
    mxi_linear_vary_tokens(m->lin, false);
    t0 = mxi_prof_start(m);
    if (P > 1) mxi_ep_combined(m, l, MXI_EP_BWD_COMBINE);
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *d = m->d_ln + (int64_t)n * C;
        #pragma omp simd
        for (int i = 0; i < C; i++) d[i] = 0.0f;
        for (int j = 0; j < K; j++) {
            const float *dx = d_xs + (int64_t)s->pos_of[n * K + j] * C;
            #pragma omp simd
            for (int i = 0; i < C; i++) d[i] += dx[i];
        }
    }
    mxi_prof_stop(m, MXI_OP_PERMUTE, t0);
    if (!beside) {
        TIMED(MXI_OP_ROUTING, mxi_moe_route_backward(m->d_router, m->d_rw, s->probs, s->idx,
                                                 mxi_moe_aux_enabled(m) ? m->aux_dprob : NULL, N, E, K, c->norm_topk_prob));
        if (s->z) TIMED(MXI_OP_ROUTING, mxi_moe_z_backward(m->d_router, s->probs, s->z, N, E, m->z_dscale));
    }
    mxi_linear_grads router = {.dinp = m->d_ln, .dinp_write = MXI_WRITE_ADD, .dw = beside ? NULL : G(o->router)};
    TIMED(MXI_OP_ROUTER, mxi_linear_backward(m->lin, m->mx[l].router, router, m->d_router,
                                             mxi_site_input(s->ln2, &s->ln2_sv), PARAMS(o->router, -1), SHAPE(N, C, E)));
}
