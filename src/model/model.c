/* The transformer (SPEC §7): parameters, activations, forward and backward.
 *
 * Memory is one allocation per category, made at create time: parameters (fp32 master
 * weights), gradients, and activations (what backward needs, per layer, plus scratch shared
 * by all layers). Nothing is allocated per step. Shape letters: see include/mxtrain/model.h;
 * N = B*T token rows, QD = NH*HD, KVD = NKV*HD, R = N*K routed rows of an MoE layer. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "core/diag.h"
#include "model/layers.h"
#include "ops/attention.h"
#include "ops/nn_kernels.h"
#include "model/linear.h"
#include "model/profile.h"
#include "model/units.h"
#include "mxtrain/model.h"

// `omp simd` below is a request: where the optimizer leaves such a loop scalar (clang at
// -O1, the fuzzing build), that is fine, not an error
#ifdef __clang__
#pragma clang diagnostic ignored "-Wpass-failed"
#endif

/* ---- configuration ---- */

bool mx_model_layer_is_moe(const mx_model_config *c, int layer) {
    return c->type == MX_MODEL_QWEN3_MOE && c->num_experts > 0 && layer >= 0 && layer < MX_MAX_LAYERS &&
           !c->mlp_only_layers[layer] && c->decoder_sparse_step > 0 && (layer + 1) % c->decoder_sparse_step == 0;
}

int mx_model_config_check(const mx_model_config *c, mx_diag *diag) {
    if (!c) return MX_ENULL;
    struct { const char *key; long long value; long long min, max; } sizes[] = {
        {"vocab_size", c->vocab_size, 1, 1 << 24},
        {"hidden_size", c->hidden_size, 1, 1 << 16},
        {"intermediate_size", c->intermediate_size, 1, 1 << 18},
        {"num_hidden_layers", c->num_hidden_layers, 1, MX_MAX_LAYERS},
        {"num_attention_heads", c->num_attention_heads, 1, 1024},
        {"num_key_value_heads", c->num_key_value_heads, 1, 1024},
        {"head_dim", c->head_dim, 2, 4096},
        {"max_position_embeddings", c->max_position_embeddings, 1, 1 << 20},
    };
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        if (sizes[i].value < sizes[i].min || sizes[i].value > sizes[i].max)
            return mxi_diag(diag, MX_ECONFIG, "model.%s: %lld is out of range (allowed: %lld to %lld)", sizes[i].key,
                            sizes[i].value, sizes[i].min, sizes[i].max);
    if (c->head_dim % 2)
        return mxi_diag(diag, MX_ECONFIG, "model.head_dim: %d is odd (allowed: an even number, for rotary embeddings)",
                        c->head_dim);
    if (c->num_attention_heads % c->num_key_value_heads)
        return mxi_diag(diag, MX_ECONFIG,
                        "model.num_key_value_heads: %d does not divide num_attention_heads %d (allowed: a divisor)",
                        c->num_key_value_heads, c->num_attention_heads);
    if (!(c->rms_norm_eps > 0))
        return mxi_diag(diag, MX_ECONFIG, "model.rms_norm_eps: %g is not allowed (allowed: > 0)", c->rms_norm_eps);
    if (!(c->rope_theta > 0))
        return mxi_diag(diag, MX_ECONFIG, "model.rope_theta: %g is not allowed (allowed: > 0)", c->rope_theta);
    if (c->type == MX_MODEL_QWEN3_MOE) {
        if (c->num_experts < 1 || c->num_experts > 4096)
            return mxi_diag(diag, MX_ECONFIG, "model.num_experts: %d is out of range (allowed: 1 to 4096)", c->num_experts);
        if (c->num_experts_per_tok < 1 || c->num_experts_per_tok > c->num_experts)
            return mxi_diag(diag, MX_ECONFIG,
                            "model.num_experts_per_tok: %d is not allowed (allowed: 1 to num_experts = %d)",
                            c->num_experts_per_tok, c->num_experts);
        if (c->moe_intermediate_size < 1 || c->moe_intermediate_size > (1 << 18))
            return mxi_diag(diag, MX_ECONFIG, "model.moe_intermediate_size: %d is out of range (allowed: 1 to %d)",
                            c->moe_intermediate_size, 1 << 18);
        if (c->decoder_sparse_step < 1)
            return mxi_diag(diag, MX_ECONFIG, "model.decoder_sparse_step: %d is not allowed (allowed: >= 1)",
                            c->decoder_sparse_step);
    }
    return MX_OK;
}

/* ---- parameters ---- */

typedef enum { P_EMBED, P_NORM, P_LINEAR, P_BIAS, P_EXPERTS } param_kind;

typedef struct {
    char name[128];
    char module[112];
    param_kind kind;
    int ndim;
    int64_t shape[3];
    int64_t numel, offset; // offset in the flat buffers: the root unit's tensors first, then each layer's
    int unit;              // FSDP unit: 0 the root (embedding, final norm, lm_head), l + 1 layer l
    int tensor;            // Hugging Face table only: the tensor this is a slice of
    int64_t within;        // Hugging Face table only: its first element in that tensor
} param_info;

/* One layer's tensors, as indices into the tensor table (-1 when absent). */
typedef struct {
    int ln1, q, q_b, k, k_b, v, v_b, o, o_b, q_norm, k_norm, ln2;
    int gate, up, down;                       /* dense MLP */
    int router, experts_gate_up, experts_down; /* MoE: (E, C), (E, 2FE, C), (E, C, FE) */
} layer_offsets;

/* The MX spec of each linear module of a layer; NULL where the plan does not convert it. */
typedef struct {
    const mxi_linear_mx *q, *k, *v, *o, *gate, *up, *down, *router, *experts;
} layer_mx;

/* Pointers to one layer's saved activations. */
typedef struct {
    float *x;            // (N, C) layer input
    float *rstd1;        // (N)
    float *ln1;          // (N, C)
    float *q_raw, *k_raw;// (N, QD), (N, KVD) before the per-head norms (qwen3)
    float *rstd_q;       // (N*NH)
    float *rstd_k;       // (N*NKV)
    float *q, *k, *v;    // (N, QD), (N, KVD), (N, KVD) as attention sees them
    float *att;          // (B, NH, T, T)
    float *a;            // (N, QD) attention output, o_proj input
    float *x2;           // (N, C) after the attention residual
    float *rstd2;        // (N)
    float *ln2;          // (N, C)
    float *gate, *up, *h;// (N, F) dense MLP
    float *probs;        // (N, E) router probabilities
    float *z;            // (N) logsumexp of the router logits (z-loss on)
    float *route_w;      // (N, K)
    int32_t *idx;        // (N, K) chosen experts
    int32_t *perm_tok;   // (R) token row of each routed row, grouped by expert
    int32_t *pos_of;     // (N*K) routed row of (token, slot)
    int32_t *group_off;  // (E+1) first routed row of each expert
    float *xe;           // (R, C) gathered expert inputs
    float *gu;           // (R, 2FE) gate | up
    float *he;           // (R, FE) expert hidden
    float *ye;           // (R, C) expert outputs
    // With expert parallelism (EP > 1) xe, gu, he and ye are this rank's experts' side, of
    // up to EP R rows grouped by local expert (xoff), each group in (source rank, token)
    // order; ys holds the outputs back on the source side, in the order of group_off.
    float *ys;           // (R, C)
    int32_t *ep_cnt;     // (EP, E/EP) rows each source rank sent to each local expert
    int32_t *xoff;       // (E/EP + 1) first expert-side row of each local expert
    // Inputs of linear layers as backward keeps them: colwise MX planes where every consumer
    // is converted (SPEC §5), bf16 roundings where none is at bf16 compute on a native bf16
    // matmul (what its weight-gradient product reads). A site that keeps one of them (q or
    // bf16 != NULL) has its fp32 buffer above at scratch shared by all layers, needed only
    // during the layer's forward.
    mxi_saved_input ln1_sv;  // (N, C) for q/k/v_proj
    mxi_saved_input a_sv;    // (N, QD) for o_proj
    mxi_saved_input ln2_sv;  // (N, C) for gate_proj/up_proj, or the MoE router
    mxi_saved_input h_sv;    // (N, F) for down_proj
    mxi_saved_input xe_sv;   // (R, C) for the experts' gate_up, one plane per expert group
    mxi_saved_input he_sv;   // (R, FE) for the experts' down, one plane per expert group
} layer_acts;

struct mx_model {
    mx_model_config cfg;
    int B, T, N;
    int QD, KVD;
    int n_params;
    param_info *params;   // tensor table
    int n_hf;
    param_info *hf;       // the same parameters under Hugging Face checkpoint names
    int *hf_first;        // (n_params + 1) tensor i's HF tensors are [hf_first[i], hf_first[i + 1])
    layer_offsets layers[MX_MAX_LAYERS];
    layer_mx mx[MX_MAX_LAYERS];
    const mxi_linear_mx *lm_head_mx;
    mxi_linear_mx mx_spec;  // the recipe's formats and the plan's scale mode
    int n_converted;
    int embed, final_norm, lm_head;   // tensor indices; lm_head == embed when tied
    int64_t num_params;   // P
    float *w;             // (P) master weights; NULL when an FSDP engine binds the units
    float *g;             // (P) gradients; likewise
    float **tw, **tg;     // (n_params) where each tensor's weights and gradients are now
    const mxi_mx_weight **wq;  // (n_params) pre-quantized planes of converted weights, or NULL
    bool *wq_converted;   // (n_params) whether the plan converts the tensor's module
    int n_units;
    bool recompute[MX_MAX_LAYERS];   // layers whose forward re-runs in backward
    bool recomputing;     // inside such a re-run: MoE statistics are not counted again
    mxi_model_hooks hooks;
    int hook_error;
    mx_diag hook_diag;
    // activations
    float *act_mem;
    layer_acts acts[MX_MAX_LAYERS];
    float *x_final;       // (N, C) output of the last layer
    float *rstd_f;        // (N)
    float *ln_f;          // (N, C)
    float *logits;        // (N, V), then dlogits
    float *cos_t, *sin_t; // (T, HD/2)
    int32_t *inputs, *targets; // (N)
    // backward scratch, shared by all layers
    float *d_res;         // (N, C) gradient of the residual stream
    float *d_ln;          // (N, C)
    float *d_q, *d_k, *d_v, *d_a;  // (N, QD), (N, KVD), (N, KVD), (N, QD)
    float *d_qraw, *d_kraw;        // (N, QD), (N, KVD)
    float *d_gate, *d_up, *d_h;    // (N, F)
    float *d_mlp;                  // (N, C)
    float *datt_scratch;           // (mxi_attention_scratch) dS of one block of query rows; bf16 operands
    float *d_ye, *d_he, *d_gu, *d_xe;  // (R, C), (R, FE), (R, 2FE), (R, C)
    float *d_rw;                   // (N, K)
    float *d_router;               // (N, E)
    float *aux_dprob;              // (E)
    double *aux_count, *aux_prob;  // (E)
    int32_t *group_next;           // (E) fill cursor of the expert grouping
    size_t act_bytes, act_bytes_unsaved;  // activations, and what they would be without saved planes
    double ce_loss, aux_loss;
    double z_loss_coef;            // mx_model_options.z_loss_coef
    double z_sum, z_loss;          // the forward's sum of z^2 over layers and tokens; its mean
    float z_dscale;                // backward: d(coef z_loss) / d(z^2) for one token, times the loss scale
    mxi_linear_ctx *lin;
    // expert parallelism (EP = ep_size > 1)
    int ep_size;
    mxi_model_ep ep;
    bool ep_overlap;               // mx_model_options.ep_overlap
    bool ep_in_flight;             // an exchange started by ep_start, not yet finished
    float *ep_xs;                  // (R, C) routed rows grouped by expert, to send
    float *ep_buf;                 // (EP R, C) rows as they travel: by source rank, then expert
    float *d_ys, *d_xs;            // (R, C) source-side gradients of ys and of xs
    int32_t *ep_send, *ep_recv;    // (EP) rows to and from each rank of the group
    int32_t *ep_cnt_send;          // (E) this rank's routed rows per expert
    bool ep_layer[MX_MAX_LAYERS];  // MoE layers that exchange tokens (parallel.ep_plan.apply_modules)
    mxi_ep_wire ep_wire[MX_MAX_LAYERS][MXI_EP_EXCHANGES];   // how each exchange's rows travel
    bool bf16;                     // GEMM operands rounded to bf16 (mx_model_options.bf16)
    bool keep_bf16;                // unconverted layers' inputs may be kept as bf16 (see layer_acts)
    uint8_t *ep_pack;              // (R, max wire row bytes) rows packed for sending, when not fp32
    uint8_t *ep_xq, *ep_xsc;       // (EP R, C), (EP R, ceil(C/32)) mxfp8 dispatch: the experts' rowwise input plane
    mxi_model_ep_bytes ep_bytes;   // what left this rank (mxi_model_take_ep_bytes)
    bool local_experts;            // EP layers' bound expert tensors hold this rank's E / EP experts only
                                   // (external params: what the FSDP engine binds under EP)
    bool fixed_expert_shapes;      // benchmarks: expert GEMMs of fixed shapes (mxi_model_fixed_expert_shapes)
    bool prof_on;                  // time the ops (model/profile.h)
    mxi_model_profile prof;
};

/* ---- profile (model/profile.h) ---- */

/* A moment by the wall clock and by this thread's CPU clock. */
typedef struct {
    double wall, cpu;
} prof_t;

static double thread_cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static prof_t prof_start(const mx_model *m) {
    return m->prof_on ? (prof_t){mxi_now_seconds(), thread_cpu_seconds()} : (prof_t){0, 0};
}

/* The time since t0 as op's, when profiling. */
static void prof_stop(mx_model *m, mxi_model_op op, prof_t t0) {
    if (!m->prof_on) return;
    m->prof.seconds[op] += mxi_now_seconds() - t0.wall;
    m->prof.cpu_seconds[op] += thread_cpu_seconds() - t0.cpu;
}
/* Time one statement as op. */
#define TIMED(op, stmt) do { prof_t t0_ = prof_start(m); stmt; prof_stop(m, op, t0_); } while (0)

void mxi_model_profile_enable(mx_model *m, bool on) {
    m->prof_on = on;
    memset(&m->prof, 0, sizeof m->prof);
}

mxi_model_profile mxi_model_profile_get(const mx_model *m) { return m->prof; }

const char *mxi_model_op_name(mxi_model_op op) {
    static const char *const names[MXI_OPS] = {
        "attention (products, softmax)", "linear layers (q, k, v, o, dense MLP, lm_head)", "router GEMMs",
        "routing (softmax, top-k, aux loss)", "token permutation (sort, gather, combine)", "expert GEMMs (grouped)",
        "expert SwiGLU"};
    return op >= 0 && op < MXI_OPS ? names[op] : "?";
}

mxi_gemm_ctx *mxi_model_gemm(mx_model *m) { return mxi_linear_ctx_gemm(m->lin); }

void mxi_model_fixed_expert_shapes(mx_model *m, bool yes) { m->fixed_expert_shapes = yes; }

static int keep_bf16_override = -1;   // mxi_model_keep_bf16_inputs

void mxi_model_keep_bf16_inputs(int yes) { keep_bf16_override = yes; }

bool mx_model_bf16_native(mx_model *m) { return mxi_gemm_bf16_native(mxi_linear_ctx_gemm(m->lin)); }

int mxi_model_bf16_kept_sites(const mx_model *m) {
    int n = 0;
    for (int l = 0; l < m->cfg.num_hidden_layers; l++) {
        const layer_acts *s = &m->acts[l];
        n += (s->ln1_sv.bf16 != NULL) + (s->a_sv.bf16 != NULL) + (s->ln2_sv.bf16 != NULL) + (s->h_sv.bf16 != NULL);
    }
    return n;
}

enum { MAX_TENSORS_PER_LAYER = 20 };

static int add_param(mx_model *m, const char *module, const char *suffix, param_kind kind, int ndim, int64_t d0,
                     int64_t d1, int64_t d2) {
    int index = m->n_params;
    param_info *p = &m->params[m->n_params++];
    snprintf(p->module, sizeof p->module, "%s", module);
    snprintf(p->name, sizeof p->name, "%s%s", module, suffix);
    p->kind = kind;
    p->ndim = ndim;
    p->shape[0] = d0, p->shape[1] = d1, p->shape[2] = d2;
    p->numel = d0 * (ndim > 1 ? d1 : 1) * (ndim > 2 ? d2 : 1);
    // units (model/units.h): blocks 1..L, the embedding L + 1 unless lm_head shares it, the root 0
    bool own_embedding = strcmp(module, "model.embed_tokens") == 0 && !m->cfg.tie_word_embeddings;
    p->unit = strncmp(module, "model.layers.", 13) == 0 ? atoi(module + 13) + 1
            : own_embedding ? m->cfg.num_hidden_layers + 1 : 0;
    return index;
}

/* Flat offsets unit by unit (the root first), so that each unit is one contiguous range. */
static void assign_offsets(mx_model *m) {
    m->n_units = m->cfg.num_hidden_layers + 1 + !m->cfg.tie_word_embeddings;
    m->num_params = 0;
    for (int u = 0; u < m->n_units; u++)
        for (int i = 0; i < m->n_params; i++)
            if (m->params[i].unit == u) m->params[i].offset = m->num_params, m->num_params += m->params[i].numel;
}

/* Every tensor in Hugging Face's module order; m->params has room for all of them. */
static void layout_params(mx_model *m) {
    const mx_model_config *c = &m->cfg;
    int64_t C = c->hidden_size, V = c->vocab_size, HD = c->head_dim, QD = m->QD, KVD = m->KVD;
    int64_t F = c->intermediate_size, E = c->num_experts, FE = c->moe_intermediate_size;
    bool qk_norm = c->type != MX_MODEL_LLAMA, bias = c->attention_bias;
    char mod[112];
    m->n_params = 0;
    m->num_params = 0;
    m->embed = add_param(m, "model.embed_tokens", ".weight", P_EMBED, 2, V, C, 0);
    for (int l = 0; l < c->num_hidden_layers; l++) {
        layer_offsets *o = &m->layers[l];
        memset(o, 0xFF, sizeof *o);   // -1 everywhere
#define MOD(fmt) (snprintf(mod, sizeof mod, "model.layers.%d." fmt, l), mod)
        o->ln1 = add_param(m, MOD("input_layernorm"), ".weight", P_NORM, 1, C, 0, 0);
        o->q = add_param(m, MOD("self_attn.q_proj"), ".weight", P_LINEAR, 2, QD, C, 0);
        if (bias) o->q_b = add_param(m, MOD("self_attn.q_proj"), ".bias", P_BIAS, 1, QD, 0, 0);
        o->k = add_param(m, MOD("self_attn.k_proj"), ".weight", P_LINEAR, 2, KVD, C, 0);
        if (bias) o->k_b = add_param(m, MOD("self_attn.k_proj"), ".bias", P_BIAS, 1, KVD, 0, 0);
        o->v = add_param(m, MOD("self_attn.v_proj"), ".weight", P_LINEAR, 2, KVD, C, 0);
        if (bias) o->v_b = add_param(m, MOD("self_attn.v_proj"), ".bias", P_BIAS, 1, KVD, 0, 0);
        o->o = add_param(m, MOD("self_attn.o_proj"), ".weight", P_LINEAR, 2, C, QD, 0);
        if (bias) o->o_b = add_param(m, MOD("self_attn.o_proj"), ".bias", P_BIAS, 1, C, 0, 0);
        if (qk_norm) {
            o->q_norm = add_param(m, MOD("self_attn.q_norm"), ".weight", P_NORM, 1, HD, 0, 0);
            o->k_norm = add_param(m, MOD("self_attn.k_norm"), ".weight", P_NORM, 1, HD, 0, 0);
        }
        o->ln2 = add_param(m, MOD("post_attention_layernorm"), ".weight", P_NORM, 1, C, 0, 0);
        if (mx_model_layer_is_moe(c, l)) {
            o->router = add_param(m, MOD("mlp.gate"), ".weight", P_LINEAR, 2, E, C, 0);
            o->experts_gate_up = add_param(m, MOD("mlp.experts"), ".gate_up_proj", P_EXPERTS, 3, E, 2 * FE, C);
            o->experts_down = add_param(m, MOD("mlp.experts"), ".down_proj", P_EXPERTS, 3, E, C, FE);
        } else {
            o->gate = add_param(m, MOD("mlp.gate_proj"), ".weight", P_LINEAR, 2, F, C, 0);
            o->up = add_param(m, MOD("mlp.up_proj"), ".weight", P_LINEAR, 2, F, C, 0);
            o->down = add_param(m, MOD("mlp.down_proj"), ".weight", P_LINEAR, 2, C, F, 0);
        }
#undef MOD
    }
    m->final_norm = add_param(m, "model.norm", ".weight", P_NORM, 1, C, 0, 0);
    m->lm_head = c->tie_word_embeddings ? m->embed : add_param(m, "lm_head", ".weight", P_LINEAR, 2, V, C, 0);
    assign_offsets(m);
}

/* Hugging Face names: fused expert tensors become per-expert slices (rows of gate_up are
 * gate_proj then up_proj for each expert; down_proj is one (C, FE) matrix per expert). */
static int build_hf_table(mx_model *m) {
    int n = 0;
    for (int i = 0; i < m->n_params; i++) n += m->params[i].kind == P_EXPERTS ? m->cfg.num_experts * 2 : 1;
    m->hf = calloc((size_t)n, sizeof *m->hf);
    m->hf_first = calloc((size_t)m->n_params + 1, sizeof *m->hf_first);
    if (!m->hf || !m->hf_first) return MX_ENOMEM;
    m->n_hf = 0;
    for (int i = 0; i < m->n_params; i++) {
        const param_info *p = &m->params[i];
        m->hf_first[i] = m->n_hf;
        if (p->kind != P_EXPERTS) {
            m->hf[m->n_hf] = *p;
            m->hf[m->n_hf].tensor = i, m->hf[m->n_hf++].within = 0;
            continue;
        }
        bool gate_up = strstr(p->name, ".gate_up_proj") != NULL;
        int64_t rows = gate_up ? p->shape[1] / 2 : p->shape[1], cols = p->shape[2];
        for (int e = 0; e < p->shape[0]; e++)
            for (int half = 0; half < (gate_up ? 2 : 1); half++) {
                param_info *h = &m->hf[m->n_hf++];
                const char *proj = gate_up ? (half ? "up_proj" : "gate_proj") : "down_proj";
                // names are far below the buffer sizes: FQNs of at most MX_MAX_LAYERS layers
                if (snprintf(h->module, sizeof h->module, "%s.%d.%s", p->module, e, proj) < 0 ||
                    snprintf(h->name, sizeof h->name, "%s.weight", h->module) < 0)
                    return MX_EINVAL;
                h->kind = P_LINEAR;
                h->ndim = 2;
                h->shape[0] = rows, h->shape[1] = cols;
                h->numel = rows * cols;
                h->within = ((int64_t)e * (gate_up ? 2 : 1) + half) * rows * cols;
                h->offset = p->offset + h->within;
                h->tensor = i;
                h->unit = p->unit;
            }
    }
    m->hf_first[m->n_params] = m->n_hf;
    return MX_OK;
}

/* ---- activations ---- */

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

/* A site the layout saves (bit set in its mask): a plane when all its consumers are
 * converted, its bf16 rounding when none is and the model may keep bf16, else fp32. */
static site_keep keep_of(const mx_model *m, bool save, bool all_converted, bool none_converted) {
    if (!save) return KEEP_F32;
    if (all_converted) return KEEP_PLANE;
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
 * the largest. rc_base: where that region starts (NULL while measuring).
 *
 * Which converted inputs keep an MX plane instead of fp32: bit SITE_x of save (plus
 * SITE_KINDS for recomputed layers). A plane costs 1 + 1/32 bytes per element in its layer
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
        unsigned sv = save >> (m->recompute[l] ? SITE_KINDS : 0);
        s->x = TAKE_F(main, N * C);
        arena *a = main;
        if (m->recompute[l]) rc.used = 0, a = &rc;
        s->rstd1 = TAKE_F(a, N);
        s->ln1 = take_site(a, main, keep_of(m, sv >> SITE_LN1 & 1, x->q && x->k && x->v, !x->q && !x->k && !x->v), N, C, 0,
                           &shared[0], &s->ln1_sv);
        if (qk_norm) {
            s->q_raw = TAKE_F(a, N * QD), s->k_raw = TAKE_F(a, N * KVD);
            s->rstd_q = TAKE_F(a, N * NH), s->rstd_k = TAKE_F(a, N * NKV);
        }
        s->q = TAKE_F(a, N * QD), s->k = TAKE_F(a, N * KVD), s->v = TAKE_F(a, N * KVD);
        s->att = TAKE_F(a, B * NH * T * T);
        s->a = take_site(a, main, keep_of(m, sv >> SITE_A & 1, x->o, !x->o), N, QD, 0, &shared[1], &s->a_sv);
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
            site_keep ke = (sv >> SITE_EXPERTS & 1) && x->experts ? KEEP_PLANE : KEEP_F32;
            s->xe = take_site(a, main, ke, RX, C, E, &shared[4], &s->xe_sv);
            s->gu = TAKE_F(a, RX * 2 * FE);
            s->he = take_site(a, main, ke, RX, FE, E, &shared[5], &s->he_sv);
            s->ye = TAKE_F(a, RX * C);
            if (ep) s->ys = TAKE_F(a, R * C), s->ep_cnt = TAKE_I(a, E), s->xoff = TAKE_I(a, E / P + 1);
        } else {
            s->gate = TAKE_F(a, N * F), s->up = TAKE_F(a, N * F);
            s->h = take_site(a, main, keep_of(m, sv >> SITE_H & 1, x->down, !x->down), N, F, 0, &shared[3], &s->h_sv);
        }
        if (rc.used > rc_size) rc_size = rc.used;
    }
    arena *a = main;
    size_t region = a->used;
    take(a, rc_size, 1);
    m->x_final = TAKE_F(a, N * C), m->rstd_f = TAKE_F(a, N), m->ln_f = TAKE_F(a, N * C);
    m->logits = TAKE_F(a, N * c->vocab_size);
    m->cos_t = TAKE_F(a, T * c->head_dim / 2), m->sin_t = TAKE_F(a, T * c->head_dim / 2);
    m->inputs = TAKE_I(a, N), m->targets = TAKE_I(a, N);
    m->d_res = TAKE_F(a, N * C), m->d_ln = TAKE_F(a, N * C), m->d_mlp = TAKE_F(a, N * C);
    m->d_q = TAKE_F(a, N * QD), m->d_k = TAKE_F(a, N * KVD), m->d_v = TAKE_F(a, N * KVD), m->d_a = TAKE_F(a, N * QD);
    if (qk_norm) m->d_qraw = TAKE_F(a, N * QD), m->d_kraw = TAKE_F(a, N * KVD);
    if (any_dense) m->d_gate = TAKE_F(a, N * F), m->d_up = TAKE_F(a, N * F), m->d_h = TAKE_F(a, N * F);
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

/* ---- quantization plan ---- */

/* Point each module the plan converts at the model's MX spec. */
static int apply_plan(mx_model *m, const mx_plan *plan, mx_diag *diag) {
    if (!plan || !plan->enabled) return MX_OK;
    // the plan only lets implemented recipes through: dynamic mx, blocks 1-1-32 or 1-32-32
    m->mx_spec = (mxi_linear_mx){plan->recipe.inputs, plan->recipe.weight, plan->recipe.grads, plan->scale_mode,
                                 plan->recipe.block[1] == 32};
    mx_module *mods = NULL;
    int n = 0;
    mx_selection sel;
    if (mx_model_modules(&m->cfg, &mods, &n) || mx_plan_select(plan, mods, n, &sel)) {
        mx_model_modules_free(mods, n);
        return mxi_diag(diag, MX_ENOMEM, "out of memory selecting modules");
    }
    for (int i = 0; i < n; i++) {
        if (!sel.decisions[i].converted) continue;
        m->n_converted++;
        const char *fqn = mods[i].fqn;
        if (strcmp(fqn, "lm_head") == 0) {
            m->lm_head_mx = &m->mx_spec;
            continue;
        }
        int l, used = 0;
        if (sscanf(fqn, "model.layers.%d.%n", &l, &used) != 1 || used == 0 || l < 0 || l >= m->cfg.num_hidden_layers)
            continue;
        const char *rest = fqn + used;
        layer_mx *x = &m->mx[l];
        const mxi_linear_mx *spec = &m->mx_spec;
        if (!strcmp(rest, "self_attn.q_proj")) x->q = spec;
        else if (!strcmp(rest, "self_attn.k_proj")) x->k = spec;
        else if (!strcmp(rest, "self_attn.v_proj")) x->v = spec;
        else if (!strcmp(rest, "self_attn.o_proj")) x->o = spec;
        else if (!strcmp(rest, "mlp.gate_proj")) x->gate = spec;
        else if (!strcmp(rest, "mlp.up_proj")) x->up = spec;
        else if (!strcmp(rest, "mlp.down_proj")) x->down = spec;
        else if (!strcmp(rest, "mlp.gate")) x->router = spec;
        else if (!strcmp(rest, "mlp.experts")) x->experts = spec;
    }
    mx_selection_free(&sel);
    mx_model_modules_free(mods, n);
    for (int l = 0; l < m->cfg.num_hidden_layers; l++) {
        const layer_mx *x = &m->mx[l];
        const layer_offsets *o = &m->layers[l];
        const struct { const mxi_linear_mx *spec; int tensor; } marks[] = {
            {x->q, o->q}, {x->k, o->k}, {x->v, o->v}, {x->o, o->o}, {x->gate, o->gate}, {x->up, o->up},
            {x->down, o->down}, {x->router, o->router}, {x->experts, o->experts_gate_up}, {x->experts, o->experts_down}};
        for (size_t i = 0; i < sizeof marks / sizeof marks[0]; i++)
            if (marks[i].spec && marks[i].tensor >= 0) m->wq_converted[marks[i].tensor] = true;
    }
    if (m->lm_head_mx) m->wq_converted[m->lm_head] = true;
    return MX_OK;
}

/* Which MoE layers exchange tokens, and how each exchange's rows travel: exactly (bf16 only
 * where the receiving GEMMs round them to bf16 anyway: unconverted experts at bf16 compute)
 * unless dispatch_dtype asks for bf16 or mxfp8 on the forward dispatch. The combines are
 * always fp32: their receiver sums the rows in fp32 (docs/distributed.md#expert-parallelism). */
static int plan_ep(mx_model *m, const mx_model_options *o, mx_diag *diag) {
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
            if (!converted)
                return mxi_diag(diag, MX_ECONFIG, "parallel.ep_plan.dispatch_dtype: mxfp8 needs %s converted by the "
                                "quantization plan (allowed: auto, fp32, bf16, or convert it with quantize.moe.mx)", name);
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

int mx_model_converted_modules(const mx_model *m) { return m->n_converted; }

size_t mx_model_activation_bytes(const mx_model *m, size_t *without_saved_planes) {
    if (without_saved_planes) *without_saved_planes = m->act_bytes_unsaved;
    return m->act_bytes;
}

/* ---- create / free ---- */

int mx_model_create(const mx_model_config *config, const mx_model_options *options, mx_model **out, mx_diag *diag) {
    if (!config || !options || !out) return mxi_diag(diag, MX_ENULL, "mx_model_create: NULL argument");
    *out = NULL;
    int rc = mx_model_config_check(config, diag);
    if (rc) return rc;
    if (options->batch < 1 || options->seq < 1)
        return mxi_diag(diag, MX_EINVAL, "micro-batch %d x sequence %d is not allowed (allowed: both >= 1)",
                        options->batch, options->seq);
    if (options->seq > config->max_position_embeddings)
        return mxi_diag(diag, MX_ECONFIG, "data.seq_length: %d exceeds model.max_position_embeddings %d",
                        options->seq, config->max_position_embeddings);
    if ((int64_t)options->batch * options->seq > MX_MAX_BATCH_TOKENS)
        return mxi_diag(diag, MX_EINVAL, "training.micro_batch_size %d x data.seq_length %d = %lld tokens per "
                        "micro-batch (allowed: at most %d = 2^24)", options->batch, options->seq,
                        (long long)options->batch * options->seq, MX_MAX_BATCH_TOKENS);
    int ep = options->expert_parallel;
    if (ep > 1 && (config->type != MX_MODEL_QWEN3_MOE || config->num_experts % ep))   // the trainer says why first
        return mxi_diag(diag, MX_ECONFIG, "parallel.expert_parallel_size: %d does not divide model.num_experts "
                        "(allowed: a divisor of the number of experts of an MoE model)", ep);
    mx_model *m = calloc(1, sizeof *m);
    if (!m) return mxi_diag(diag, MX_ENOMEM, "out of memory for the model");
    m->cfg = *config;
    m->B = options->batch, m->T = options->seq, m->N = options->batch * options->seq;
    m->QD = config->num_attention_heads * config->head_dim;
    m->KVD = config->num_key_value_heads * config->head_dim;
    m->ep_size = options->expert_parallel > 1 ? options->expert_parallel : 1;
    m->ep_overlap = options->ep_overlap;
    m->z_loss_coef = options->z_loss_coef;
    m->params = calloc((size_t)config->num_hidden_layers * MAX_TENSORS_PER_LAYER + 3, sizeof *m->params);
    if (!m->params) goto nomem;
    layout_params(m);
    if (build_hf_table(m)) goto nomem;
    m->tw = calloc((size_t)m->n_params, sizeof *m->tw);
    m->tg = calloc((size_t)m->n_params, sizeof *m->tg);
    m->wq = calloc((size_t)m->n_params, sizeof *m->wq);
    m->wq_converted = calloc((size_t)m->n_params, sizeof *m->wq_converted);
    if (!m->tw || !m->tg || !m->wq || !m->wq_converted) goto nomem;
    m->local_experts = options->external_params;
    if (!options->external_params) {
        m->w = calloc((size_t)m->num_params, sizeof(float));
        m->g = calloc((size_t)m->num_params, sizeof(float));
        if (!m->w || !m->g) goto nomem;
        for (int i = 0; i < m->n_params; i++)
            m->tw[i] = m->w + m->params[i].offset, m->tg[i] = m->g + m->params[i].offset;
    }
    for (int l = 0; l < config->num_hidden_layers; l++) {
        char name[32];
        snprintf(name, sizeof name, "model.layers.%d", l);
        for (int i = 0; i < options->n_recompute && !m->recompute[l]; i++)
            m->recompute[l] = mx_pattern_match(options->recompute[i].compiled, name);
    }
    rc = apply_plan(m, options->plan, diag);
    if (!rc) rc = plan_ep(m, options, diag);
    if (rc) {
        mx_model_free(m);
        return rc;
    }
    rc = mxi_linear_ctx_create(&m->lin, options->bf16);
    if (rc) {
        mx_model_free(m);
        return mxi_diag(diag, rc, "could not set up matrix products: %s", mx_strerror(rc));
    }
    // bf16 inputs save backward a rounding pass where the products take bf16 as it is
    m->keep_bf16 = m->bf16 && mx_model_bf16_native(m) && keep_bf16_override != 0;
    arena a = {NULL, 0};
    layout_activations(m, &a, 0, NULL);
    m->act_bytes_unsaved = a.used;
    // the smallest layout over which kinds of inputs keep planes or bf16: among equals the
    // first from the top (the most kinds), and with bf16 copies possible any over none (each
    // copy also spares backward a rounding pass)
    unsigned save = 0;
    size_t least = a.used;
    for (unsigned mask = m->n_converted || m->keep_bf16 ? (1u << 2 * SITE_KINDS) - 1 : 0; mask > 0; mask--) {
        a = (arena){NULL, 0};
        layout_activations(m, &a, mask, NULL);
        if (a.used < least || (a.used == least && save == 0 && m->keep_bf16)) save = mask, least = a.used;
    }
    a = (arena){NULL, 0};
    size_t region = layout_activations(m, &a, save, NULL);
    m->act_bytes = a.used;
    m->act_mem = malloc(a.used);
    if ((!options->external_params && (!m->w || !m->g)) || !m->act_mem) goto nomem;
    a = (arena){(char *)m->act_mem, 0};
    layout_activations(m, &a, save, (char *)m->act_mem + region);
    rope_tables(m->cos_t, m->sin_t, m->T, config->head_dim, config->rope_theta);
    *out = m;
    return MX_OK;
nomem:;
    // what it needed: weights and gradients of its own (none with external_params), and
    // activations (sized once the plan is applied)
    double own = options->external_params ? 0 : (double)m->num_params * 8 / (1 << 20), act = m->act_bytes / 1048576.0;
    mx_model_free(m);
    if (act > 0 && own == 0)
        return mxi_diag(diag, MX_ENOMEM, "out of memory for the model's activations (%.1f MiB)", act);
    if (act > 0)
        return mxi_diag(diag, MX_ENOMEM, "out of memory for the model: %.1f MiB of weights and gradients, %.1f MiB of "
                        "activations", own, act);
    if (own > 0)
        return mxi_diag(diag, MX_ENOMEM, "out of memory for the model: %.1f MiB of weights and gradients, then its "
                        "activations", own);
    return mxi_diag(diag, MX_ENOMEM, "out of memory for the model's tables");
}

void mx_model_free(mx_model *m) {
    if (!m) return;
    mxi_linear_ctx_free(m->lin);
    free(m->params), free(m->hf), free(m->hf_first), free(m->w), free(m->g), free(m->act_mem);
    free(m->tw), free(m->tg), free(m->wq), free(m->wq_converted);
    free(m);
}

int mx_model_num_tensors(const mx_model *m) { return m->n_params; }
int64_t mx_model_num_params(const mx_model *m) { return m->num_params; }
float *mx_model_params(mx_model *m) { return m->w; }
float *mx_model_grads(mx_model *m) { return m->g; }

static mx_tensor_view view_of(const mx_model *m, const param_info *p) {
    mx_tensor_view v = {0};
    v.name = p->name, v.module = p->module, v.ndim = p->ndim, v.numel = p->numel;
    memcpy(v.shape, p->shape, sizeof v.shape);
    if (m->w) v.data = m->w + p->offset, v.grad = m->g + p->offset;
    return v;
}

mx_tensor_view mx_model_tensor(const mx_model *m, int i) {
    if (i < 0 || i >= m->n_params) return (mx_tensor_view){0};
    return view_of(m, &m->params[i]);
}

int mx_model_num_hf_tensors(const mx_model *m) { return m->n_hf; }

mx_tensor_view mx_model_hf_tensor(const mx_model *m, int i) {
    if (i < 0 || i >= m->n_hf) return (mx_tensor_view){0};
    return view_of(m, &m->hf[i]);
}

void mx_model_zero_grad(mx_model *m) {
    if (m->g) memset(m->g, 0, (size_t)m->num_params * sizeof(float));
}

/* ---- initialisation ---- */

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void mxi_model_init_tensor(const mx_model *m, int i, uint64_t seed, float *w) {
    const param_info *p = &m->params[i];
    float std = m->cfg.initializer_range;
    // each tensor its own stream, so the values do not depend on the other tensors
    uint64_t s = seed ^ (0xD1B54A32D192ED03ull * (uint64_t)(i + 1));
    for (int64_t j = 0; j < p->numel; j++) {
        if (p->kind == P_NORM) {
            w[j] = 1.0f;
        } else if (p->kind == P_BIAS) {
            w[j] = 0.0f;
        } else {   // Box-Muller
            double u1 = ((splitmix(&s) >> 11) + 0.5) * 0x1.0p-53, u2 = ((splitmix(&s) >> 11) + 0.5) * 0x1.0p-53;
            w[j] = (float)(std * sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2));
        }
    }
}

void mx_model_init(mx_model *m, uint64_t seed) {
    if (!m->w) return;
    for (int i = 0; i < m->n_params; i++) mxi_model_init_tensor(m, i, seed, m->w + m->params[i].offset);
}

/* ---- forward ---- */

/* A site's saved input (plane or bf16), or NULL where the site keeps fp32. */
static const mxi_saved_input *saved(const mxi_saved_input *sv) { return sv->q || sv->bf16 ? sv : NULL; }

/* The fp32 input backward should read: NULL where the site saved a plane or bf16 instead. */
static const float *kept(const float *fp32, const mxi_saved_input *sv) { return saved(sv) ? NULL : fp32; }

/* Before the forward products that read site x: where it keeps bf16, the rounding they
 * share goes there, for backward. */
static void share_site(mx_model *m, const float *x, const mxi_saved_input *sv) {
    if (sv->bf16) linear_share_input_into(m->lin, x, sv->bf16);
    else linear_share_input(m->lin, x);
}

/* Expert group e's slice of a per-group saved plane of width cols (scales after the partial
 * blocks of the groups before it). */
static mxi_saved_input group_plane(const mxi_saved_input *sv, const int32_t *off, int e, int64_t cols) {
    if (!sv->q) return (mxi_saved_input){0};   // no plane saved (the experts not converted)
    int64_t blocks = 0;
    for (int g = 0; g < e; g++) blocks += (off[g + 1] - off[g] + MX_BLOCK - 1) / MX_BLOCK;
    return (mxi_saved_input){.q = sv->q + (int64_t)off[e] * cols, .scales = sv->scales + blocks * cols};
}

#define W(i) ((i) >= 0 ? m->tw[i] : NULL)
#define G(i) ((i) >= 0 ? m->tg[i] : NULL)
#define WQ(i) ((i) >= 0 ? m->wq[i] : NULL)

/* Expert e's slice of the planes bound to a fused expert tensor (E, R, K). */
static const mxi_mx_weight *expert_planes(mxi_mx_weight *out, const mxi_mx_weight *w, int e) {
    if (!w) return NULL;
    *out = *w;
    int64_t R = w->row.q ? w->row.rows : w->col.rows, K = w->row.q ? w->row.cols : w->col.cols;
    if (out->row.q) out->row.q += e * R * K, out->row.scales += e * R * ((K + MX_BLOCK - 1) / MX_BLOCK);
    if (out->col.q) out->col.q += e * R * K, out->col.scales += e * ((R + MX_BLOCK - 1) / MX_BLOCK) * K;
    return out;
}

/* Tell the engine (if any) about a unit; false when it failed and the pass must stop. */
static bool unit_event(mx_model *m, int unit, mxi_unit_event event) {
    if (m->hook_error) return false;
    if (!m->hooks.on_unit) return true;
    int rc = m->hooks.on_unit(m->hooks.ctx, unit, event, &m->hook_diag);
    if (rc) m->hook_error = rc;
    return rc == 0;
}

/* ---- expert parallelism (EP > 1) ---- */

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
static bool ep_overlapping(const mx_model *m) { return m->ep_overlap && m->ep.start && m->ep.poke && m->ep.wait; }

/* Start the group's exchange: in the background where overlapping, finished by ep_finish;
 * else at once (ep_exchange). False when it failed. */
static bool ep_start(mx_model *m, const void *send, const int *send_rows, void *recv, const int *recv_rows,
                     size_t row_bytes, const char *what) {
    if (!ep_overlapping(m)) return ep_exchange(m, send, send_rows, recv, recv_rows, row_bytes, what);
    if (m->hook_error) return false;
    int rc = m->ep.start(m->ep.ctx, send, send_rows, recv, recv_rows, row_bytes, what, &m->hook_diag);
    if (rc) m->hook_error = rc;
    else m->ep_in_flight = true;
    return rc == 0;
}

/* Between the GEMMs that run beside an exchange: let it progress. */
static void ep_poke(mx_model *m) {
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
static void ep_send_to_experts(mx_model *m, layer_acts *s, int l, mxi_ep_exchange x, const float *src,
                               const char *what) {
    mxi_ep_wire w = m->ep_wire[l][x];
    int64_t C = m->cfg.hidden_size;
    ep_rows(m, s);
    const void *send = ep_pack_rows(m, l, w, src, s->group_off[m->cfg.num_experts]);
    ep_start(m, send, m->ep_send, m->ep_buf, m->ep_recv, (size_t)mxi_ep_row_bytes(w, C), what);
}

static void ep_arrive_at_experts(mx_model *m, layer_acts *s, int l, mxi_ep_exchange x, float *dst) {
    if (!ep_finish(m)) return;
    ep_count(m, m->ep_send, m->ep_wire[l][x], true, x == MXI_EP_FWD_DISPATCH);
    ep_unpack_rows(m, s, l, m->ep_wire[l][x], dst);
}

/* Send this rank's routed rows m->ep_xs (grouped by expert, s->group_off) to their experts'
 * ranks: s->xe gets the rows of this rank's experts, each group in (source rank, token)
 * order, s->xoff their offsets, s->ep_cnt who sent how many. */
static void ep_dispatch(mx_model *m, int l, layer_acts *s) {
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
    ep_send_to_experts(m, s, l, MXI_EP_FWD_DISPATCH, m->ep_xs, "the tokens' dispatch to their experts");
    ep_arrive_at_experts(m, s, l, MXI_EP_FWD_DISPATCH, s->xe);   // the experts need them all
}

/* The way back (exchange x, fp32): expert-side rows src (s->xe's order) to their source
 * ranks, dst (R, C) in the order of s->group_off, once ep_combined has returned true. */
static void ep_combine(mx_model *m, layer_acts *s, mxi_ep_exchange x, float *dst, const float *src) {
    int C = m->cfg.hidden_size;
    ep_to_wire_order(m, s, m->ep_buf, src, C);
    ep_rows(m, s);
    ep_start(m, m->ep_buf, m->ep_recv, dst, m->ep_send, (size_t)C * 4,
             x == MXI_EP_FWD_COMBINE ? "the experts' outputs back to their tokens"
                                     : "the experts' input gradients back to their tokens");
}

static bool ep_combined(mx_model *m, int l, mxi_ep_exchange x) {
    if (!ep_finish(m)) return false;
    ep_count(m, m->ep_recv, m->ep_wire[l][x], false, x == MXI_EP_FWD_COMBINE);
    return true;
}

void mxi_model_take_ep_bytes(mx_model *m, mxi_model_ep_bytes *bytes) {
    *bytes = m->ep_bytes;
    memset(&m->ep_bytes, 0, sizeof m->ep_bytes);
}

/* The colwise planes the backward reads of expert group j's inputs (FC1's and FC2's), in
 * blocks along the tokens of this group only. */
static void save_expert_inputs(mx_model *m, int l, layer_acts *s, const int32_t *xoff, int j) {
    int C = m->cfg.hidden_size, FE = m->cfg.moe_intermediate_size;
    int64_t r0 = xoff[j], ne = xoff[j + 1] - xoff[j];
    if (ne == 0) return;
    mxi_saved_input gx = group_plane(&s->xe_sv, xoff, j, C), gh = group_plane(&s->he_sv, xoff, j, FE);
    linear_save_input(m->lin, m->mx[l].experts, &gx, s->xe + r0 * C, ne, C);
    linear_save_input(m->lin, m->mx[l].experts, &gh, s->he + r0 * FE, ne, FE);
}

/* The MoE block of layer l on s->ln2: route, group tokens by expert, run each expert's
 * SwiGLU MLP as GEMMs over its group, and combine with the routing weights into out. With
 * EP, the groups of this rank's experts gather the EP group's tokens (ep_dispatch) and
 * their outputs go back (ep_combine). */
static void moe_forward(mx_model *m, int l, float *out /* (N, C) */) {
    const mx_model_config *c = &m->cfg;
    layer_acts *s = &m->acts[l];
    const layer_offsets *o = &m->layers[l];
    int N = m->N, C = c->hidden_size, E = c->num_experts, K = c->num_experts_per_tok, FE = c->moe_intermediate_size;
    TIMED(MXI_OP_ROUTER, linear_forward(m->lin, m->mx[l].router, s->probs, s->ln2, W(o->router), WQ(o->router), NULL,
                                        N, C, E));   // logits, then probabilities
    if (s->z) {   // the z-loss needs the logits, which the softmax overwrites
        double sum;
        TIMED(MXI_OP_ROUTING, sum = moe_z_forward(s->z, s->probs, N, E));
        if (!m->recomputing) m->z_sum += sum;
    }
    TIMED(MXI_OP_ROUTING, moe_route_forward(s->idx, s->route_w, s->probs, s->probs, N, E, K, c->norm_topk_prob));
    // counting sort of (token, slot) by expert; tokens stay in ascending order within a group
    prof_t t0 = prof_start(m);
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
    if (P > 1) ep_dispatch(m, l, s), xoff = s->xoff;
    bool given = P > 1 && m->ep_wire[l][MXI_EP_FWD_DISPATCH] == MXI_EP_WIRE_MXFP8;   // FC1's input plane came with the rows
    int64_t S = (C + MX_BLOCK - 1) / MX_BLOCK;
    prof_stop(m, MXI_OP_PERMUTE, t0);
    const float *wgu0 = W(o->experts_gate_up), *wd0 = W(o->experts_down);
    // with the exchanges in the background, the saved planes wait for the combine to start
    bool save_now = s->xe_sv.q && !(P > 1 && ep_overlapping(m));
    linear_vary_tokens(m->lin, !m->fixed_expert_shapes);   // one primitive per GEMM kind, whatever the group sizes
    for (int j = 0; j < El; j++) {
        int e = P > 1 && m->local_experts ? j : e0 + j;   // the bound expert tensors' index of expert e0 + j
        int64_t r0 = xoff[j], ne = xoff[j + 1] - xoff[j];
        if (ne == 0) continue;
        const float *wgu = wgu0 ? wgu0 + (int64_t)e * 2 * FE * C : NULL, *wd = wd0 ? wd0 + (int64_t)e * C * FE : NULL;
        mxi_mx_weight qgu, qd;
        if (given)
            linear_given_input(m->lin, s->xe + r0 * C, &(mxi_mx_plane){m->ep_xq + r0 * C, m->ep_xsc + r0 * S, ne, C,
                                                                       MX_ROWWISE, m->mx[l].experts->inputs},
                               m->mx[l].experts->mode);
        TIMED(MXI_OP_EXPERT_GEMM, linear_forward(m->lin, m->mx[l].experts, s->gu + r0 * 2 * FE, s->xe + r0 * C, wgu,
                                                 expert_planes(&qgu, WQ(o->experts_gate_up), e), NULL, ne, C, 2 * FE));
        if (given) linear_share_input(m->lin, NULL);
        TIMED(MXI_OP_EXPERT_SWIGLU,
              swiglu_forward(s->he + r0 * FE, s->gu + r0 * 2 * FE, s->gu + r0 * 2 * FE + FE, ne, FE, 2 * FE));
        t0 = prof_start(m);
        linear_forward(m->lin, m->mx[l].experts, s->ye + r0 * C, s->he + r0 * FE, wd,
                       expert_planes(&qd, WQ(o->experts_down), e), NULL, ne, FE, C);
        if (save_now) save_expert_inputs(m, l, s, xoff, j);
        prof_stop(m, MXI_OP_EXPERT_GEMM, t0);
    }
    linear_vary_tokens(m->lin, false);
    const float *ys = s->ye;   // the outputs of this rank's routed rows, in the order of off
    t0 = prof_start(m);
    if (P > 1) ep_combine(m, s, MXI_EP_FWD_COMBINE, s->ys, s->ye), ys = s->ys;
    prof_stop(m, MXI_OP_PERMUTE, t0);
    // beside the combine (where it runs in the background): what does not need it
    if (s->xe_sv.q && !save_now) {
        t0 = prof_start(m);
        for (int j = 0; j < El; j++) save_expert_inputs(m, l, s, xoff, j), ep_poke(m);
        prof_stop(m, MXI_OP_EXPERT_GEMM, t0);
    }
    if (!m->recomputing) TIMED(MXI_OP_ROUTING, moe_aux_accumulate(m->aux_count, m->aux_prob, s->idx, s->probs, N, E, K));
    t0 = prof_start(m);
    if (P > 1) ep_combined(m, l, MXI_EP_FWD_COMBINE);
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
    prof_stop(m, MXI_OP_PERMUTE, t0);
}

static bool aux_enabled(const mx_model *m) {
    return m->cfg.type == MX_MODEL_QWEN3_MOE && m->cfg.output_router_logits;
}

static int moe_layer_count(const mx_model *m) {
    int n = 0;
    for (int l = 0; l < m->cfg.num_hidden_layers; l++) n += mx_model_layer_is_moe(&m->cfg, l);
    return n;
}

/* Transformer block l: from its input s->x to its output (the next block's input). */
static void layer_forward(mx_model *m, int l) {
    const mx_model_config *c = &m->cfg;
    int B = m->B, T = m->T, N = m->N, C = c->hidden_size, L = c->num_hidden_layers;
    int NH = c->num_attention_heads, NKV = c->num_key_value_heads, HD = c->head_dim, QD = m->QD, KVD = m->KVD;
    int F = c->intermediate_size;
    float eps = c->rms_norm_eps;
    bool qk_norm = c->type != MX_MODEL_LLAMA;
    layer_acts *s = &m->acts[l];
    const layer_offsets *o = &m->layers[l];
    const layer_mx *x = &m->mx[l];
    float *out = l + 1 < L ? m->acts[l + 1].x : m->x_final;   // (N, C) this layer's output
    // attention
    rmsnorm_forward(s->ln1, s->rstd1, s->x, W(o->ln1), N, C, eps);
    prof_t t0 = prof_start(m);
    if (s->ln1_sv.q) linear_save_input(m->lin, x->q, &s->ln1_sv, s->ln1, N, C);
    float *q_out = qk_norm ? s->q_raw : s->q, *k_out = qk_norm ? s->k_raw : s->k;
    share_site(m, s->ln1, &s->ln1_sv);
    linear_forward(m->lin, x->q, q_out, s->ln1, W(o->q), WQ(o->q), W(o->q_b), N, C, QD);
    linear_forward(m->lin, x->k, k_out, s->ln1, W(o->k), WQ(o->k), W(o->k_b), N, C, KVD);
    linear_forward(m->lin, x->v, s->v, s->ln1, W(o->v), WQ(o->v), W(o->v_b), N, C, KVD);
    linear_share_input(m->lin, NULL);
    prof_stop(m, MXI_OP_LINEAR, t0);
    if (qk_norm) {
        rmsnorm_forward(s->q, s->rstd_q, s->q_raw, W(o->q_norm), N * NH, HD, eps);
        rmsnorm_forward(s->k, s->rstd_k, s->k_raw, W(o->k_norm), N * NKV, HD, eps);
    }
    rope_forward(s->q, m->cos_t, m->sin_t, B, T, NH, HD);
    rope_forward(s->k, m->cos_t, m->sin_t, B, T, NKV, HD);
    mx_diag ad = {{0}};
    t0 = prof_start(m);
    int arc = mxi_attention_forward(mxi_linear_ctx_gemm(m->lin), s->a, s->att, m->datt_scratch, s->q, s->k, s->v, B, T,
                                    NH, NKV, HD, m->bf16, &ad);
    prof_stop(m, MXI_OP_ATTENTION, t0);
    if (arc) mxi_linear_ctx_record(m->lin, arc, &ad);
    t0 = prof_start(m);
    if (s->a_sv.q) linear_save_input(m->lin, x->o, &s->a_sv, s->a, N, QD);
    share_site(m, s->a, &s->a_sv);
    linear_forward(m->lin, x->o, s->x2, s->a, W(o->o), WQ(o->o), W(o->o_b), N, QD, C);
    linear_share_input(m->lin, NULL);
    prof_stop(m, MXI_OP_LINEAR, t0);
    add_inplace(s->x2, s->x, (int64_t)N * C);
    // MLP
    rmsnorm_forward(s->ln2, s->rstd2, s->x2, W(o->ln2), N, C, eps);
    if (s->ln2_sv.q)
        TIMED(o->router >= 0 ? MXI_OP_ROUTER : MXI_OP_LINEAR,
              linear_save_input(m->lin, o->router >= 0 ? x->router : x->gate, &s->ln2_sv, s->ln2, N, C));
    if (o->router >= 0) {
        moe_forward(m, l, out);
    } else {
        t0 = prof_start(m);
        share_site(m, s->ln2, &s->ln2_sv);
        linear_forward(m->lin, x->gate, s->gate, s->ln2, W(o->gate), WQ(o->gate), NULL, N, C, F);
        linear_forward(m->lin, x->up, s->up, s->ln2, W(o->up), WQ(o->up), NULL, N, C, F);
        linear_share_input(m->lin, NULL);
        prof_stop(m, MXI_OP_LINEAR, t0);
        swiglu_forward(s->h, s->gate, s->up, N, F, F);
        t0 = prof_start(m);
        if (s->h_sv.q) linear_save_input(m->lin, x->down, &s->h_sv, s->h, N, F);
        share_site(m, s->h, &s->h_sv);
        linear_forward(m->lin, x->down, out, s->h, W(o->down), WQ(o->down), NULL, N, F, C);
        linear_share_input(m->lin, NULL);
        prof_stop(m, MXI_OP_LINEAR, t0);
    }
    add_inplace(out, s->x2, (int64_t)N * C);
}

static double model_forward(mx_model *m, const int32_t *inputs, const int32_t *targets);

double mx_model_forward(mx_model *m, const int32_t *inputs, const int32_t *targets) {
    prof_t t0 = prof_start(m);
    double loss = model_forward(m, inputs, targets);
    if (m->prof_on) {
        m->prof.forward_s += mxi_now_seconds() - t0.wall, m->prof.forward_cpu_s += thread_cpu_seconds() - t0.cpu;
        m->prof.forwards++;
    }
    return loss;
}

static double model_forward(mx_model *m, const int32_t *inputs, const int32_t *targets) {
    const mx_model_config *c = &m->cfg;
    int N = m->N, C = c->hidden_size, V = c->vocab_size, L = c->num_hidden_layers, E = c->num_experts;
    memcpy(m->inputs, inputs, (size_t)N * sizeof *inputs);
    memcpy(m->targets, targets, (size_t)N * sizeof *targets);
    if (m->aux_count) {
        memset(m->aux_count, 0, (size_t)E * sizeof(double));
        memset(m->aux_prob, 0, (size_t)E * sizeof(double));
    }
    m->z_sum = 0;
    int eu = mxi_model_embedding_unit(m);   // the root's when lm_head shares the embedding
    if (!unit_event(m, eu, MXI_PRE_FORWARD)) return NAN;
    embedding_forward(m->acts[0].x, m->inputs, W(m->embed), N, C);
    if (eu && !unit_event(m, eu, MXI_POST_FORWARD)) return NAN;
    for (int l = 0; l < L; l++) {
        if (!unit_event(m, l + 1, MXI_PRE_FORWARD)) return NAN;
        layer_forward(m, l);
        if (!unit_event(m, l + 1, MXI_POST_FORWARD)) return NAN;
    }
    if (eu && !unit_event(m, 0, MXI_PRE_FORWARD)) return NAN;
    rmsnorm_forward(m->ln_f, m->rstd_f, m->x_final, W(m->final_norm), N, C, c->rms_norm_eps);
    TIMED(MXI_OP_LINEAR,
          linear_forward(m->lin, m->lm_head_mx, m->logits, m->ln_f, W(m->lm_head), WQ(m->lm_head), NULL, N, C, V));
    if (!unit_event(m, 0, MXI_POST_FORWARD)) return NAN;
    m->ce_loss = cross_entropy_forward_backward(NULL, m->logits, m->targets, N, V, 0.0f);
    m->aux_loss = 0.0;
    if (aux_enabled(m) && m->ep_size > 1 && !m->hook_error && m->ep.sum) {
        // the statistics of the EP group's concatenated micro-batches, as its experts see them
        int rc = m->ep.sum(m->ep.ctx, m->aux_count, E, "the router's expert counts", &m->hook_diag);
        if (!rc) rc = m->ep.sum(m->ep.ctx, m->aux_prob, E, "the router's expert probabilities", &m->hook_diag);
        if (rc) m->hook_error = rc;
    }
    if (aux_enabled(m))
        m->aux_loss = moe_aux_loss(m->aux_count, m->aux_prob, E, (double)N * m->ep_size * moe_layer_count(m));
    m->z_loss = m->z_sum / N;   // per layer a mean over the tokens, summed over the layers
    return m->ce_loss + (aux_enabled(m) ? c->router_aux_loss_coef * m->aux_loss : 0.0) + m->z_loss_coef * m->z_loss;
}

double mx_model_last_ce_loss(const mx_model *m) { return m->ce_loss; }
double mx_model_last_aux_loss(const mx_model *m) { return m->aux_loss; }
double mx_model_last_z_loss(const mx_model *m) { return m->z_loss; }

/* ---- backward ---- */

/* Backward of moe_forward: from dout (N, C) to m->d_ln (N, C), the gradient of s->ln2. */
static void moe_backward(mx_model *m, int l, const float *dout /* (N, C) */) {
    const mx_model_config *c = &m->cfg;
    layer_acts *s = &m->acts[l];
    const layer_offsets *o = &m->layers[l];
    int N = m->N, C = c->hidden_size, E = c->num_experts, K = c->num_experts_per_tok, FE = c->moe_intermediate_size;
    int P = m->ep_layer[l] ? m->ep_size : 1, El = E / P, e0 = P > 1 ? m->ep.rank * El : 0;
    const float *ys = P > 1 ? s->ys : s->ye;
    float *d_ys = P > 1 ? m->d_ys : m->d_ye;
    // out[n] = sum_j w[n,j] ye[pos(n,j)]
    prof_t t0 = prof_start(m);
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
    bool beside = P > 1 && ep_overlapping(m);
    if (P > 1)   // the output gradients go where the outputs came from, as the inputs went
        ep_send_to_experts(m, s, l, MXI_EP_BWD_DISPATCH, m->d_ys, "the output gradients to the experts");
    prof_stop(m, MXI_OP_PERMUTE, t0);
    if (beside) {
        TIMED(MXI_OP_ROUTING, moe_route_backward(m->d_router, m->d_rw, s->probs, s->idx,
                                                 aux_enabled(m) ? m->aux_dprob : NULL, N, E, K, c->norm_topk_prob));
        if (s->z) TIMED(MXI_OP_ROUTING, moe_z_backward(m->d_router, s->probs, s->z, N, E, m->z_dscale));
        ep_poke(m);
        TIMED(MXI_OP_ROUTER, linear_backward(m->lin, m->mx[l].router, NULL, false, G(o->router), NULL, m->d_router,
                                             kept(s->ln2, &s->ln2_sv), saved(&s->ln2_sv), W(o->router), WQ(o->router),
                                             N, C, E));
    }
    t0 = prof_start(m);
    if (P > 1) ep_arrive_at_experts(m, s, l, MXI_EP_BWD_DISPATCH, m->d_ye);
    prof_stop(m, MXI_OP_PERMUTE, t0);
    const float *wgu0 = W(o->experts_gate_up), *wd0 = W(o->experts_down);
    linear_vary_tokens(m->lin, !m->fixed_expert_shapes);
    for (int jj = 0; jj < El; jj++) {
        int e = P > 1 && m->local_experts ? jj : e0 + jj;   // the bound expert tensors' index of expert e0 + jj
        int64_t r0 = off[jj], ne = off[jj + 1] - off[jj];
        if (ne == 0) continue;
        const float *wgu = wgu0 ? wgu0 + (int64_t)e * 2 * FE * C : NULL, *wd = wd0 ? wd0 + (int64_t)e * C * FE : NULL;
        float *gwgu = G(o->experts_gate_up) + (int64_t)e * 2 * FE * C, *gwd = G(o->experts_down) + (int64_t)e * C * FE;
        mxi_saved_input gx = group_plane(&s->xe_sv, off, jj, C), gh = group_plane(&s->he_sv, off, jj, FE);
        mxi_mx_weight qgu, qd;
        TIMED(MXI_OP_EXPERT_GEMM,
              linear_backward(m->lin, m->mx[l].experts, m->d_he + r0 * FE, false, beside ? NULL : gwd, NULL,
                              m->d_ye + r0 * C, kept(s->he + r0 * FE, &s->he_sv), saved(&gh), wd,
                              expert_planes(&qd, WQ(o->experts_down), e), ne, FE, C));
        TIMED(MXI_OP_EXPERT_SWIGLU,
              swiglu_backward(m->d_gu + r0 * 2 * FE, m->d_gu + r0 * 2 * FE + FE, m->d_he + r0 * FE,
                              s->gu + r0 * 2 * FE, s->gu + r0 * 2 * FE + FE, ne, FE, 2 * FE));
        TIMED(MXI_OP_EXPERT_GEMM,
              linear_backward(m->lin, m->mx[l].experts, m->d_xe + r0 * C, false, beside ? NULL : gwgu, NULL,
                              m->d_gu + r0 * 2 * FE, kept(s->xe + r0 * C, &s->xe_sv), saved(&gx), wgu,
                              expert_planes(&qgu, WQ(o->experts_gate_up), e), ne, C, 2 * FE));
    }
    t0 = prof_start(m);
    const float *d_xs = m->d_xe;
    if (P > 1) ep_combine(m, s, MXI_EP_BWD_COMBINE, m->d_xs, m->d_xe), d_xs = m->d_xs;
    prof_stop(m, MXI_OP_PERMUTE, t0);
    for (int jj = 0; beside && jj < El; jj++) {   // the experts' weight gradients, beside the combine
        int e = m->local_experts ? jj : e0 + jj;   // as above, with P > 1
        int64_t r0 = off[jj], ne = off[jj + 1] - off[jj];
        if (ne == 0) continue;
        mxi_saved_input gx = group_plane(&s->xe_sv, off, jj, C), gh = group_plane(&s->he_sv, off, jj, FE);
        TIMED(MXI_OP_EXPERT_GEMM,
              linear_backward(m->lin, m->mx[l].experts, NULL, false, G(o->experts_down) + (int64_t)e * C * FE, NULL,
                              m->d_ye + r0 * C, kept(s->he + r0 * FE, &s->he_sv), saved(&gh), NULL, NULL, ne, FE, C));
        ep_poke(m);
        TIMED(MXI_OP_EXPERT_GEMM,
              linear_backward(m->lin, m->mx[l].experts, NULL, false, G(o->experts_gate_up) + (int64_t)e * 2 * FE * C,
                              NULL, m->d_gu + r0 * 2 * FE, kept(s->xe + r0 * C, &s->xe_sv), saved(&gx), NULL, NULL, ne,
                              C, 2 * FE));
        ep_poke(m);
    }
    linear_vary_tokens(m->lin, false);
    t0 = prof_start(m);
    if (P > 1) ep_combined(m, l, MXI_EP_BWD_COMBINE);
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
    prof_stop(m, MXI_OP_PERMUTE, t0);
    if (!beside) {
        TIMED(MXI_OP_ROUTING, moe_route_backward(m->d_router, m->d_rw, s->probs, s->idx,
                                                 aux_enabled(m) ? m->aux_dprob : NULL, N, E, K, c->norm_topk_prob));
        if (s->z) TIMED(MXI_OP_ROUTING, moe_z_backward(m->d_router, s->probs, s->z, N, E, m->z_dscale));
    }
    TIMED(MXI_OP_ROUTER, linear_backward(m->lin, m->mx[l].router, m->d_ln, true, beside ? NULL : G(o->router), NULL,
                                         m->d_router, kept(s->ln2, &s->ln2_sv), saved(&s->ln2_sv), W(o->router),
                                         WQ(o->router), N, C, E));
}

/* Backward of block l: m->d_res holds the gradient of its output on entry, of its input on
 * return; its weight gradients are accumulated. */
static void layer_backward(mx_model *m, int l) {
    const mx_model_config *c = &m->cfg;
    int B = m->B, T = m->T, N = m->N, C = c->hidden_size;
    int NH = c->num_attention_heads, NKV = c->num_key_value_heads, HD = c->head_dim, QD = m->QD, KVD = m->KVD;
    int F = c->intermediate_size;
    bool qk_norm = c->type != MX_MODEL_LLAMA;
    layer_acts *s = &m->acts[l];
    const layer_offsets *o = &m->layers[l];
    const layer_mx *x = &m->mx[l];
    // d_res: gradient of this layer's output = x2 + mlp(ln2(x2))
    if (o->router >= 0) {
        moe_backward(m, l, m->d_res);
    } else {
        TIMED(MXI_OP_LINEAR, linear_backward(m->lin, x->down, m->d_h, false, G(o->down), NULL, m->d_res,
                                             kept(s->h, &s->h_sv), saved(&s->h_sv), W(o->down), WQ(o->down), N, F, C));
        swiglu_backward(m->d_gate, m->d_up, m->d_h, s->gate, s->up, N, F, F);
        prof_t t0 = prof_start(m);
        linear_share_input(m->lin, kept(s->ln2, &s->ln2_sv));   // gate and up read one input
        linear_backward(m->lin, x->gate, m->d_ln, false, G(o->gate), NULL, m->d_gate, kept(s->ln2, &s->ln2_sv),
                        saved(&s->ln2_sv), W(o->gate), WQ(o->gate), N, C, F);
        linear_backward(m->lin, x->up, m->d_ln, true, G(o->up), NULL, m->d_up, kept(s->ln2, &s->ln2_sv),
                        saved(&s->ln2_sv), W(o->up), WQ(o->up), N, C, F);
        linear_share_input(m->lin, NULL);
        prof_stop(m, MXI_OP_LINEAR, t0);
    }
    rmsnorm_backward(m->d_mlp, G(o->ln2), m->d_ln, s->x2, W(o->ln2), s->rstd2, N, C);
    add_inplace(m->d_res, m->d_mlp, (int64_t)N * C);   // now the gradient of x2 = x + o_proj(a)
    TIMED(MXI_OP_LINEAR, linear_backward(m->lin, x->o, m->d_a, false, G(o->o), G(o->o_b), m->d_res,
                                         kept(s->a, &s->a_sv), saved(&s->a_sv), W(o->o), WQ(o->o), N, QD, C));
    mx_diag ad = {{0}};
    prof_t t0 = prof_start(m);
    int arc = mxi_attention_backward(mxi_linear_ctx_gemm(m->lin), m->d_q, m->d_k, m->d_v, m->datt_scratch, m->d_a,
                                     s->att, s->q, s->k, s->v, B, T, NH, NKV, HD, m->bf16, &ad);
    prof_stop(m, MXI_OP_ATTENTION, t0);
    if (arc) mxi_linear_ctx_record(m->lin, arc, &ad);
    rope_backward(m->d_q, m->cos_t, m->sin_t, B, T, NH, HD);
    rope_backward(m->d_k, m->cos_t, m->sin_t, B, T, NKV, HD);
    float *dq = m->d_q, *dk = m->d_k;
    if (qk_norm) {
        rmsnorm_backward(m->d_qraw, G(o->q_norm), m->d_q, s->q_raw, W(o->q_norm), s->rstd_q, N * NH, HD);
        rmsnorm_backward(m->d_kraw, G(o->k_norm), m->d_k, s->k_raw, W(o->k_norm), s->rstd_k, N * NKV, HD);
        dq = m->d_qraw, dk = m->d_kraw;
    }
    t0 = prof_start(m);
    linear_share_input(m->lin, kept(s->ln1, &s->ln1_sv));   // q, k and v read one input
    linear_backward(m->lin, x->q, m->d_ln, false, G(o->q), G(o->q_b), dq, kept(s->ln1, &s->ln1_sv), saved(&s->ln1_sv),
                    W(o->q), WQ(o->q), N, C, QD);
    linear_backward(m->lin, x->k, m->d_ln, true, G(o->k), G(o->k_b), dk, kept(s->ln1, &s->ln1_sv), saved(&s->ln1_sv),
                    W(o->k), WQ(o->k), N, C, KVD);
    linear_backward(m->lin, x->v, m->d_ln, true, G(o->v), G(o->v_b), m->d_v, kept(s->ln1, &s->ln1_sv),
                    saved(&s->ln1_sv), W(o->v), WQ(o->v), N, C, KVD);
    linear_share_input(m->lin, NULL);
    prof_stop(m, MXI_OP_LINEAR, t0);
    rmsnorm_backward(m->d_mlp, G(o->ln1), m->d_ln, s->x, W(o->ln1), s->rstd1, N, C);
    add_inplace(m->d_res, m->d_mlp, (int64_t)N * C);   // the gradient of this layer's input
}

static void model_backward(mx_model *m, float scale);

void mx_model_backward(mx_model *m, float scale) {
    prof_t t0 = prof_start(m);
    model_backward(m, scale);
    if (m->prof_on) {
        m->prof.backward_s += mxi_now_seconds() - t0.wall, m->prof.backward_cpu_s += thread_cpu_seconds() - t0.cpu;
        m->prof.backwards++;
    }
}

static void model_backward(mx_model *m, float scale) {
    const mx_model_config *c = &m->cfg;
    int N = m->N, C = c->hidden_size, V = c->vocab_size, L = c->num_hidden_layers;
    float *dlogits = m->logits;   // in place: backward needs only the gradient
    if (!unit_event(m, 0, MXI_PRE_BACKWARD)) return;
    cross_entropy_forward_backward(dlogits, m->logits, m->targets, N, V, scale / N);
    m->z_dscale = (float)(m->z_loss_coef * scale / N);
    // with EP, the gradient of the group's loss: the trainer's mean over ranks divides it by EP again
    if (aux_enabled(m))
        TIMED(MXI_OP_ROUTING, moe_aux_dprob(m->aux_dprob, m->aux_count, c->num_experts,
                                            (double)N * m->ep_size * moe_layer_count(m),
                                            (double)c->router_aux_loss_coef * scale * m->ep_size));
    TIMED(MXI_OP_LINEAR, linear_backward(m->lin, m->lm_head_mx, m->d_ln, false, G(m->lm_head), NULL, dlogits, m->ln_f,
                                         NULL, W(m->lm_head), WQ(m->lm_head), N, C, V));
    rmsnorm_backward(m->d_res, G(m->final_norm), m->d_ln, m->x_final, W(m->final_norm), m->rstd_f, N, C);
    int eu = mxi_model_embedding_unit(m);
    if (eu && !unit_event(m, 0, MXI_POST_BACKWARD)) return;
    for (int l = L - 1; l >= 0; l--) {
        if (!unit_event(m, l + 1, MXI_PRE_BACKWARD)) return;
        if (m->recompute[l]) {   // the block's activations were not kept: run its forward again
            m->recomputing = true;
            layer_forward(m, l);
            m->recomputing = false;
        }
        layer_backward(m, l);
        if (!unit_event(m, l + 1, MXI_POST_BACKWARD)) return;
    }
    if (eu && !unit_event(m, eu, MXI_PRE_BACKWARD)) return;
    embedding_backward(G(m->embed), m->d_res, m->inputs, N, C);
    unit_event(m, eu, MXI_POST_BACKWARD);
}

int mx_model_error(const mx_model *m, mx_diag *diag) {
    if (m->hook_error) {
        if (diag) *diag = m->hook_diag;
        return m->hook_error;
    }
    return mxi_linear_ctx_error(m->lin, diag);
}

/* ---- FSDP units (model/units.h) ---- */

int mxi_model_num_units(const mx_model *m) { return m->n_units; }
int mxi_model_embedding_unit(const mx_model *m) { return m->cfg.tie_word_embeddings ? 0 : m->cfg.num_hidden_layers + 1; }

int64_t mxi_model_largest_tensor(const mx_model *m) {
    int64_t n = 1;
    for (int i = 0; i < m->n_params; i++) n = m->params[i].numel > n ? m->params[i].numel : n;
    return n;
}

bool mxi_model_unit_recomputes(const mx_model *m, int unit) {
    return unit > 0 && unit <= m->cfg.num_hidden_layers && m->recompute[unit - 1];
}

mxi_tensor_shape mxi_model_tensor_shape(const mx_model *m, int i) {
    const param_info *p = &m->params[i];
    mxi_tensor_shape t = {p->unit, 1, p->shape[0], 1, p->offset, m->wq_converted ? m->wq_converted[i] : false,
                          p->ndim >= 2, p->name};
    if (p->kind == P_EXPERTS) t.groups = p->shape[0], t.rows = p->shape[1], t.cols = p->shape[2];
    else if (p->ndim == 2) t.cols = p->shape[1];
    return t;
}

const mxi_linear_mx *mxi_model_mx_spec(const mx_model *m) { return m->n_converted ? &m->mx_spec : NULL; }
void mxi_model_set_hooks(mx_model *m, const mxi_model_hooks *hooks) { m->hooks = *hooks; }
void mxi_model_bind_tensor(mx_model *m, int i, float *w, float *g) { m->tw[i] = w, m->tg[i] = g; }
void mxi_model_bind_planes(mx_model *m, int i, const mxi_mx_weight *planes) { m->wq[i] = planes; }

void mxi_model_weights_bf16(mx_model *m, bool yes) { mxi_linear_ctx_weights_bf16(m->lin, yes); }

void mx_model_round_weights_bf16(mx_model *m, bool mx_from_fp32) {
    if (!m->w) return;
    for (int i = 0; i < m->n_params; i++) {
        mxi_tensor_shape t = mxi_model_tensor_shape(m, i);
        if (!(mx_from_fp32 && t.converted)) mxi_bf16_round_f32(m->w + t.offset, m->w + t.offset, t.groups * t.rows * t.cols);
    }
    mxi_model_weights_bf16(m, true);
}

void mxi_model_hf_slice(const mx_model *m, int hf_index, int *tensor, int64_t *within) {
    *tensor = m->hf[hf_index].tensor, *within = m->hf[hf_index].within;
}

void mxi_model_hf_range(const mx_model *m, int tensor, int *first, int *end) {
    *first = m->hf_first[tensor], *end = m->hf_first[tensor + 1];
}

/* ---- module list for the quantization plan ---- */

static int push_module(mx_module *list, int *n, mx_module_kind kind, const char *fmt, int layer) {
    char name[128];
    snprintf(name, sizeof name, fmt, layer);
    char *copy = malloc(strlen(name) + 1);
    if (!copy) return MX_ENOMEM;
    strcpy(copy, name);
    list[*n].fqn = copy;
    list[*n].kind = kind;
    (*n)++;
    return MX_OK;
}

int mx_model_modules(const mx_model_config *c, mx_module **out, int *count) {
    if (!c || !out || !count) return MX_ENULL;
    *out = NULL, *count = 0;
    int L = c->num_hidden_layers;
    if (L < 0 || L > MX_MAX_LAYERS) return MX_EINVAL;
    mx_module *list = calloc((size_t)L * 14 + 3, sizeof *list);
    if (!list) return MX_ENOMEM;
    int n = 0, rc = 0;
    const mx_module_kind LIN = MX_MODULE_LINEAR, OTH = MX_MODULE_OTHER;
    rc |= push_module(list, &n, OTH, "model.embed_tokens", 0);
    for (int l = 0; l < L && !rc; l++) {
        rc |= push_module(list, &n, OTH, "model.layers.%d.input_layernorm", l);
        rc |= push_module(list, &n, LIN, "model.layers.%d.self_attn.q_proj", l);
        rc |= push_module(list, &n, LIN, "model.layers.%d.self_attn.k_proj", l);
        rc |= push_module(list, &n, LIN, "model.layers.%d.self_attn.v_proj", l);
        if (c->type != MX_MODEL_LLAMA) {
            rc |= push_module(list, &n, OTH, "model.layers.%d.self_attn.q_norm", l);
            rc |= push_module(list, &n, OTH, "model.layers.%d.self_attn.k_norm", l);
        }
        rc |= push_module(list, &n, LIN, "model.layers.%d.self_attn.o_proj", l);
        rc |= push_module(list, &n, OTH, "model.layers.%d.post_attention_layernorm", l);
        if (mx_model_layer_is_moe(c, l)) {
            rc |= push_module(list, &n, LIN, "model.layers.%d.mlp.gate", l);
            rc |= push_module(list, &n, MX_MODULE_EXPERTS, "model.layers.%d.mlp.experts", l);
        } else {
            rc |= push_module(list, &n, LIN, "model.layers.%d.mlp.gate_proj", l);
            rc |= push_module(list, &n, LIN, "model.layers.%d.mlp.up_proj", l);
            rc |= push_module(list, &n, LIN, "model.layers.%d.mlp.down_proj", l);
        }
    }
    rc |= push_module(list, &n, OTH, "model.norm", 0);
    if (!c->tie_word_embeddings) rc |= push_module(list, &n, LIN, "lm_head", 0);
    if (rc) {
        mx_model_modules_free(list, n);
        return MX_ENOMEM;
    }
    *out = list, *count = n;
    return MX_OK;
}

void mx_model_modules_free(mx_module *modules, int count) {
    if (!modules) return;
    for (int i = 0; i < count; i++) free((char *)modules[i].fqn);
    free(modules);
}

void mx_model_trace_mx(mx_model *m, const char *dir) { mxi_linear_ctx_trace(m->lin, dir); }
