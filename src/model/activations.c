/* The activation arena: what backward needs of each layer, and the scratch all layers
 * share, in one allocation made at create time; nothing is allocated per step. */
#include <stdlib.h>
#include <string.h>

#include "model/model_internal.h"
#include "ops/attention.h"

/* A bump allocator: a first pass with base NULL measures, the second hands out pointers. */
typedef struct {
    char *base;
    size_t used;
} arena;

static void *take(arena *a, size_t count, size_t elem_size) {
    size_t bytes = (count * elem_size + 63) & ~(size_t)63;   // 64-byte aligned pieces
    void *p = a->base ? a->base + a->used : NULL;
    a->used += bytes;
    return p;
}
#define TAKE_F(a, n) ((float *)take(a, (size_t)(n), sizeof(float)))
#define TAKE_I(a, n) ((int32_t *)take(a, (size_t)(n), sizeof(int32_t)))

/* How a site keeps its value for backward; see layer_acts. */
typedef enum { KEEP_F32, KEEP_PLANE, KEEP_BF16 } site_keep;

/* Whether a converted layer's backward reads its input as a saved colwise MX plane: an MX
 * recipe whose wgrad is quantized (high_precision_gemms: wgrad reads the fp32 input). */
static bool saves_plane(const mxi_linear_mx *x) {
    return x->scaling == MXI_SCALE_BLOCKS && !(x->high_precision & MX_GEMM_WGRAD);
}

/* Or as the per-tensor codes forward multiplies: with current scaling the codes of an input
 * are the same for every layer that reads it and for wgrad (one scale for the whole tensor),
 * so forward's serve backward; delayed scaling gives each layer its own scale, and its codes. */
static bool saves_codes(const mx_model *m, const mxi_linear_mx *x) {
    return x->scaling == MXI_SCALE_TENSOR && !m->delayed && !(x->high_precision & MX_GEMM_WGRAD);
}

/* A site the layout saves (bit set in its mask): a plane (or per-tensor codes) when all its
 * consumers are converted, its bf16 rounding when none is converted and the model may keep
 * bf16, else fp32. */
static site_keep keep_of(const mx_model *m, bool save, bool all_converted, bool none_converted) {
    if (!save) return KEEP_F32;
    if (all_converted) return saves_plane(&m->mx_spec) || saves_codes(m, &m->mx_spec) ? KEEP_PLANE : KEEP_F32;
    return none_converted && m->keep_bf16 ? KEEP_BF16 : KEEP_F32;
}

/* Take a site's storage: per layer in fp32, or, when saved (a plane or bf16), that per
 * layer and the fp32 buffer from the shared scratch *shared (taken once). Per-group planes
 * (expert groups) have room for one partial block of scales per group. */
typedef struct {
    float *buf;
    bool taken;
    int64_t least;   // elements it holds at least (the largest layer's, when layers differ)
} shared_site;

static float *take_site(arena *a, arena *main, site_keep keep, int64_t rows, int64_t cols, int64_t groups,
                        shared_site *shared, mxi_saved_input *sv) {
    memset(sv, 0, sizeof *sv);
    if (keep == KEEP_F32) return TAKE_F(a, rows * cols);
    if (keep == KEEP_BF16) {
        sv->bf16 = take(a, (size_t)(rows * cols), sizeof(uint16_t));
    } else {
        sv->q = take(a, (size_t)(rows * cols), 1);
        sv->scales = take(a, (size_t)(((rows + MX_BLOCK - 1) / MX_BLOCK + groups) * cols), 1);
    }
    if (!shared->taken) shared->buf = TAKE_F(main, rows * cols > shared->least ? rows * cols : shared->least), shared->taken = true;
    return shared->buf;
}

/* Recomputed layers keep only their input x; everything else of theirs lives in one region
 * (arena *rc, rewound for each of them) that the main arena takes once at the end, sized by
 * the largest. Under selective recompute a layer keeps everything but the internals it makes
 * again in backward (mxi_recompute), which live in that region: always fp32 there, since a
 * plane or bf16 copy would sit beside its fp32 scratch and take more. rc_base: where that
 * region starts (NULL while measuring).
 *
 * Which converted inputs keep an MX plane (or per-tensor codes) instead of fp32: bit SITE_x
 * of save (plus SITE_KINDS for recomputed layers). A plane costs 1 + 1/32 bytes per element in its layer
 * plus one fp32 scratch per kind shared by all layers (4 bytes per element), against 4 bytes
 * per element in each layer, so planes pay only for a kind that several layers keep, and
 * hardly in recomputed layers, whose region is reused anyway: mx_model_create picks the
 * smallest layout. The experts' two inputs go together (the expert loops handle both). */
enum { SITE_LN1, SITE_A, SITE_LN2, SITE_H, SITE_EXPERTS, SITE_KINDS };
static size_t layout_activations(mx_model *m, arena *main, unsigned save, char *rc_base) {
    arena rc = {rc_base, 0};
    size_t rc_size = 0;
    const mx_model_config *c = &m->cfg;
    int64_t N = m->N, C = c->hidden_size, QD = m->QD, KVD = m->KVD, F = c->intermediate_size;
    int64_t E = c->num_experts, K = c->num_experts_per_tok, FE = c->moe_intermediate_size, R = N * K;
    int64_t NH = c->num_attention_heads, NKV = c->num_key_value_heads, T = m->T, B = m->B;
    int64_t P = m->ep_size, RX;   // expert-side rows: every token of the EP group may come here (EP layers)
    bool any_ep = false, any_pack = false, any_mx = false;
    bool qk_norm = c->type != MX_MODEL_LLAMA, any_moe = false, any_dense = false;
    shared_site shared[6] = {{0}};   // scratch of saved sites: ln1, a, ln2, h, xe, he
    for (int l = 0; l < c->num_hidden_layers; l++)   // the experts' scratch: for the largest layer
        if (m->ep_layer[l]) shared[4].least = R * P * C, shared[5].least = R * P * FE;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        layer_acts *s = &m->acts[l];
        const layer_mx *x = &m->mx[l];
        bool moe = mx_model_layer_is_moe(c, l);
        any_moe |= moe, any_dense |= !moe;
        bool full = m->recompute[l] == MXI_RECOMPUTE_FULL, sel = m->recompute[l] == MXI_RECOMPUTE_SELECTIVE;
        unsigned sv = save >> (full ? SITE_KINDS : 0);
        s->x = TAKE_F(main, N * C);
        arena *a = main;
        if (full || sel) rc.used = 0;
        if (full) a = &rc;
        arena *ri = sel ? &rc : a;   // what selective recompute makes again
        arena *rqk = qk_norm ? ri : a;   // llama's q and k are products' outputs: kept
        s->rstd1 = TAKE_F(a, N);
        s->ln1 = take_site(a, main, keep_of(m, sv >> SITE_LN1 & 1, x->q && x->k && x->v, !x->q && !x->k && !x->v), N, C, 0,
                           &shared[0], &s->ln1_sv);
        if (qk_norm) {
            s->q_raw = TAKE_F(a, N * QD), s->k_raw = TAKE_F(a, N * KVD);
            s->rstd_q = TAKE_F(ri, N * NH), s->rstd_k = TAKE_F(ri, N * NKV);
        }
        s->q = TAKE_F(rqk, N * QD), s->k = TAKE_F(rqk, N * KVD), s->v = TAKE_F(a, N * KVD);
        s->att_stats = TAKE_F(a, B * NH * T * 2);
        // attention's backward reads its output (ops/attention.h): a plane is too coarse for
        // it, so at bf16 compute a rounded copy goes beside the plane; at fp32 the fp32 stays
        site_keep ka = keep_of(m, (sv >> SITE_A & 1) && m->bf16, x->o, !x->o);
        s->a = take_site(a, main, ka, N, QD, 0, &shared[1], &s->a_sv);
        s->a16 = ka == KEEP_PLANE ? take(a, (size_t)(N * QD), sizeof(uint16_t)) : NULL;
        s->x2 = TAKE_F(a, N * C), s->rstd2 = TAKE_F(a, N);
        bool mlp_all = moe ? x->router != NULL : x->gate && x->up, mlp_none = !moe && !x->gate && !x->up;
        s->ln2 = take_site(a, main, keep_of(m, sv >> SITE_LN2 & 1, mlp_all, mlp_none), N, C, 0, &shared[2], &s->ln2_sv);
        if (moe) {
            bool ep = m->ep_layer[l];
            RX = ep ? R * P : R;
            any_ep |= ep;
            for (int k = 0; k < MXI_EP_EXCHANGES && ep; k++)
                any_pack |= m->ep_wire[l][k] != MXI_EP_WIRE_FP32, any_mx |= m->ep_wire[l][k] == MXI_EP_WIRE_MXFP8;
            s->probs = TAKE_F(a, N * E), s->route_w = TAKE_F(a, N * K), s->idx = TAKE_I(a, N * K);
            if (m->z_loss_coef > 0) s->z = TAKE_F(a, N);
            s->perm_tok = TAKE_I(a, R), s->pos_of = TAKE_I(a, N * K), s->group_off = TAKE_I(a, E + 1);
            site_keep ke = (sv >> SITE_EXPERTS & 1) && x->experts && saves_plane(x->experts) ? KEEP_PLANE
                                                                                                         : KEEP_F32;
            s->xe = take_site(a, main, ke, RX, C, E, &shared[4], &s->xe_sv);
            s->gu = TAKE_F(a, RX * 2 * FE);
            s->he = take_site(ri, main, sel ? KEEP_F32 : ke, RX, FE, E, &shared[5], &s->he_sv);
            s->ye = TAKE_F(a, RX * C);
            if (ep) s->ys = TAKE_F(a, R * C), s->ep_cnt = TAKE_I(a, E), s->xoff = TAKE_I(a, E / P + 1);
        } else {
            s->gate = TAKE_F(a, N * F), s->up = TAKE_F(a, N * F);
            s->h = take_site(ri, main, keep_of(m, !sel && (sv >> SITE_H & 1), x->down, !x->down), N, F, 0, &shared[3],
                             &s->h_sv);
        }
        if (rc.used > rc_size) rc_size = rc.used;
    }
    arena *a = main;
    size_t region = a->used;
    take(a, rc_size, 1);
    m->x_final = TAKE_F(a, N * C), m->rstd_f = TAKE_F(a, N), m->ln_f = TAKE_F(a, N * C);
    m->logits = TAKE_F(a, (int64_t)m->ce_rows * c->vocab_size);
    m->ce_lse = TAKE_F(a, N), m->ce_dscale = TAKE_F(a, N);
    m->emb_order = take(a, (size_t)N, sizeof(int64_t));
    m->cos_t = TAKE_F(a, T * c->head_dim / 2), m->sin_t = TAKE_F(a, T * c->head_dim / 2);
    m->inputs = TAKE_I(a, N), m->targets = TAKE_I(a, N);
    if (m->docs.reset_attention_mask) m->doc_start = TAKE_I(a, N);
    if (m->docs.reset_position_ids) m->positions = TAKE_I(a, N);
    if (m->docs.eod_mask_loss) m->loss_keep = TAKE_I(a, N);
    m->d_res = TAKE_F(a, N * C), m->d_ln = TAKE_F(a, N * C), m->d_mlp = TAKE_F(a, N * C);
    m->d_q = TAKE_F(a, N * QD), m->d_k = TAKE_F(a, N * KVD), m->d_v = TAKE_F(a, N * KVD), m->d_a = TAKE_F(a, N * QD);
    if (qk_norm) m->d_qraw = TAKE_F(a, N * QD), m->d_kraw = TAKE_F(a, N * KVD);
    // d_up in d_h's place: SwiGLU's backward reads each element of d_h before it writes d_up's
    if (any_dense) m->d_gate = TAKE_F(a, N * F), m->d_h = m->d_up = TAKE_F(a, N * F);
    m->datt_scratch = TAKE_F(a, mxi_attention_scratch(B, T, NH, NKV, c->head_dim, m->bf16));
    if (any_moe) {
        RX = any_ep ? R * P : R;
        m->d_ye = TAKE_F(a, RX * C), m->d_he = TAKE_F(a, RX * FE), m->d_gu = TAKE_F(a, RX * 2 * FE);
        if (any_ep) {
            int64_t S = (C + MX_BLOCK - 1) / MX_BLOCK;
            m->ep_xs = TAKE_F(a, R * C), m->ep_buf = TAKE_F(a, RX * C);   // any wire row fits in 4 C bytes
            m->d_ys = TAKE_F(a, R * C), m->d_xs = TAKE_F(a, R * C);
            m->ep_send = TAKE_I(a, P), m->ep_recv = TAKE_I(a, P), m->ep_cnt_send = TAKE_I(a, E);
            if (any_pack) m->ep_pack = take(a, (size_t)(R * (2 * C > C + S ? 2 * C : C + S)), 1);
            if (any_mx) m->ep_xq = take(a, (size_t)(RX * C), 1), m->ep_xsc = take(a, (size_t)(RX * S), 1);
        }
        m->d_xe = TAKE_F(a, RX * C), m->d_rw = TAKE_F(a, N * K), m->d_router = TAKE_F(a, N * E);
        m->aux_dprob = TAKE_F(a, E), m->group_next = TAKE_I(a, E);
        m->aux_count = (double *)take(a, (size_t)E, sizeof(double));
        m->aux_prob = (double *)take(a, (size_t)E, sizeof(double));
    }
    return region;
}

int mxi_model_bf16_kept_sites(const mx_model *m) {
    int n = 0;
    for (int l = 0; l < m->cfg.num_hidden_layers; l++) {
        const layer_acts *s = &m->acts[l];
        n += (s->ln1_sv.bf16 != NULL) + (s->a_sv.bf16 != NULL) + (s->ln2_sv.bf16 != NULL) + (s->h_sv.bf16 != NULL);
    }
    return n;
}

size_t mx_model_activation_bytes(const mx_model *m, size_t *without_saved_planes) {
    if (without_saved_planes) *without_saved_planes = m->act_bytes_unsaved;
    return m->act_bytes;
}

static int save_override = -1;   // mxi_model_save_inputs

void mxi_model_save_inputs(int yes) { save_override = yes; }

int mxi_model_alloc_activations(mx_model *m, mxi_acts_mode mode) {
    arena a = {NULL, 0};
    layout_activations(m, &a, 0, NULL);
    m->act_bytes_unsaved = a.used;
    // the smallest layout over which kinds of inputs keep planes or bf16: among equals the
    // first from the top (the most kinds), and with bf16 copies possible any over none (each
    // copy also spares backward a rounding pass)
    unsigned save = 0;
    size_t least = a.used;
    bool may = (m->n_converted || m->keep_bf16) && save_override != 0;
    for (unsigned mask = may ? (1u << 2 * SITE_KINDS) - 1 : 0; mask > 0; mask--) {
        a = (arena){NULL, 0};
        layout_activations(m, &a, mask, NULL);
        if (a.used < least || (a.used == least && save == 0 && m->keep_bf16)) save = mask, least = a.used;
    }
    a = (arena){NULL, 0};
    size_t region = layout_activations(m, &a, save, NULL);
    m->act_bytes = a.used;
    if (mode == MXI_ACTS_MEASURE) return MX_OK;
    m->act_mem = malloc(a.used);
    if (!m->act_mem) return MX_ENOMEM;
    a = (arena){(char *)m->act_mem, 0};
    layout_activations(m, &a, save, (char *)m->act_mem + region);
    return MX_OK;
}
