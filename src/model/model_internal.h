/* Internal: the model's state, shared by its files (model.c: creation and the dense
 * forward/backward; params.c: the tensor table and names; activations.c: the activation
 * arena; modules.c: the module list and the plan's conversions; moe.c: MoE blocks;
 * expert_exchange.c: expert parallelism's token exchanges; profile.c: op timing; units.c:
 * the FSDP engine's view). Shape letters: see include/mxtrain/model.h; N = B*T token rows,
 * QD = NH*HD, KVD = NKV*HD, R = N*K routed rows of an MoE layer. */
#ifndef MXI_MODEL_INTERNAL_H
#define MXI_MODEL_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "core/diag.h"
#include "model/layers.h"
#include "model/linear.h"
#include "model/profile.h"
#include "model/units.h"
#include "mxtrain/model.h"

// `omp simd` in the model's files is a request: where the optimizer leaves such a loop
// scalar (clang at -O1, the fuzzing build), that is fine, not an error
#ifdef __clang__
#pragma clang diagnostic ignored "-Wpass-failed"
#endif

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

/* What a layer makes again in backward (features.recompute_granularity): nothing; the
 * attention and SwiGLU internals (q and k after their norms and RoPE with the norms' rstd,
 * the SwiGLU hidden h or the experts' he), which live in the recomputed region; or its whole
 * forward, keeping only its input x. */
typedef enum { MXI_RECOMPUTE_NONE, MXI_RECOMPUTE_SELECTIVE, MXI_RECOMPUTE_FULL } mxi_recompute;

/* Pointers to one layer's saved activations. */
typedef struct {
    float *x;            // (N, C) layer input
    float *rstd1;        // (N)
    float *ln1;          // (N, C)
    float *q_raw, *k_raw;// (N, QD), (N, KVD) before the per-head norms (qwen3)
    float *rstd_q;       // (N*NH)
    float *rstd_k;       // (N*NKV)
    float *q, *k, *v;    // (N, QD), (N, KVD), (N, KVD) as attention sees them
    float *att_stats;    // (B, NH, T, 2) each query row's largest scaled score (log2 units) and 1 / sum of exps
    float *a;            // (N, QD) attention output, o_proj input
    uint16_t *a16;       // (N, QD) a rounded to bf16 where a_sv keeps a plane: attention's backward reads it
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
    mxi_delayed *delayed;   // delayed recipes: every converted tensor's amax histories and scales, else NULL
    int n_converted;
    int embed, final_norm, lm_head;   // tensor indices; lm_head == embed when tied
    int64_t num_params;   // P
    float *w;             // (P) master weights; NULL when an FSDP engine binds the units
    float *g;             // (P) gradients; likewise
    float **tw, **tg;     // (n_params) where each tensor's weights and gradients are now
    const uint16_t **tw16;  // (n_params) a tensor's weights as bf16 bits instead of tw (mxi_model_bind_tensor_bf16)
    const mxi_mx_weight **wq;  // (n_params) pre-quantized planes of converted weights, or NULL
    bool *wq_converted;   // (n_params) whether the plan converts the tensor's module
    int n_units;
    mxi_recompute recompute[MX_MAX_LAYERS];   // what each layer recomputes in backward
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
    float *logits;        // (ce_rows, V) logits of a chunk of rows, then their gradient
    float *ce_lse, *ce_dscale;  // (N), (N) each row's log-sum-exp and loss-gradient scale (sunk lm_head)
    int64_t *emb_order;   // (N) rows by token, (token << 32 | row): the sunk embedding's backward
    float *sink_dw;       // (sink_rows, C) a slice of lm_head's gradient, with add_grad; else NULL
    float *sink_row;      // (C) one token's embedding gradient, with add_grad
    int sink_rows;        // vocabulary rows of a slice
    int ce_rows;          // rows whose logits exist at once: N, or chunks of them (mxi_model_ce_rows)
    float *cos_t, *sin_t; // (T, HD/2)
    int32_t *inputs, *targets; // (N)
    // document masking (mx_model_options.documents; mxi_documents_make from inputs), NULL where off
    mx_model_documents docs;
    int32_t *doc_start;   // (N) each token's document's first position (reset_attention_mask)
    int32_t *positions;   // (N) each token's RoPE position (reset_position_ids)
    int32_t *loss_keep;   // (N) 1 where the loss counts, 0 at an input eod_token (eod_mask_loss)
    int64_t loss_count;   // positions with loss_keep 1 in the micro-batch
    // backward scratch, shared by all layers
    float *d_res;         // (N, C) gradient of the residual stream
    float *d_ln;          // (N, C)
    float *d_q, *d_k, *d_v, *d_a;  // (N, QD), (N, KVD), (N, KVD), (N, QD)
    float *d_qraw, *d_kraw;        // (N, QD), (N, KVD)
    float *d_gate, *d_up, *d_h;    // (N, F); d_up is d_h (SwiGLU's backward turns one into the other)
    float *d_mlp;                  // (N, C)
    float *datt_scratch;           // (mxi_attention_scratch) the fused attention's operand layouts and tiles
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
    mxi_quant_stats *qstats;       // quantization statistics of the converted layers (training.quant_stats_interval)
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

/* ---- parameters (params.c) ---- */

enum { MXI_MAX_TENSORS_PER_LAYER = 20 };

/* Every tensor in Hugging Face's module order into m->params (room for all of them), with
 * flat offsets unit by unit; then the same parameters under Hugging Face checkpoint names. */
void mxi_model_layout_params(mx_model *m);
int mxi_model_build_hf_table(mx_model *m);

/* ---- the loss (model.c) ---- */

/* Logits are made this many bytes at a time at most: a vocabulary of 151,936 over 4096
 * tokens would be 2.3 GiB of them, and their gradient in the same place. */
enum { MXI_CE_CHUNK_BYTES = 64 << 20 };
/* The rows of a chunk for m: every row at once where their logits fit MXI_CE_CHUNK_BYTES (or
 * lm_head is converted: its backward gather has no rowwise plane to recompute them from),
 * else a multiple of 32 rows that fits. */
int mxi_model_ce_chunk(const mx_model *m);

/* ---- gradients handed to the engine (grad_sink.c) ---- */

/* Tensor i's gradient for the one product that makes it: its bound buffer, or for a sunk
 * tensor the slice buffer, zeroed; mxi_grad_done then hands the latter to the engine. */
float *mxi_grad_target(mx_model *m, int i);
void mxi_grad_done(mx_model *m, int i);
/* lm_head's backward (scale: the loss gradient's) and the embedding's, for gradients that go
 * to hooks.add_grad (G(index) NULL): see mxi_model_sinks_grad. */
void mxi_lm_head_backward_sunk(mx_model *m, float scale);
void mxi_embedding_backward_sunk(mx_model *m);
/* Vocabulary rows of each slice of lm_head's sunk weight gradient (its logits over every row
 * fit the logits buffer). */
int64_t mxi_model_lm_slice_rows(const mx_model *m);
/* Whether tensor i's gradient goes to the engine's add_grad now. */
static inline bool mxi_model_sunk(const mx_model *m, int i) { return m->tg[i] == NULL && m->hooks.add_grad; }

/* ---- activations (activations.c) ---- */

/* Size the activations (the smallest layout of saved planes and bf16 copies) into
 * m->act_bytes; then, with allocate, allocate them and point m->acts and the scratch at
 * them (MX_ENOMEM when the allocation fails). */
typedef enum { MXI_ACTS_MEASURE, MXI_ACTS_ALLOCATE } mxi_acts_mode;
int mxi_model_alloc_activations(mx_model *m, mxi_acts_mode mode);

/* ---- the quantization plan (modules.c) ---- */

/* Point each module the plan converts at the model's MX spec. */
int mxi_model_apply_plan(mx_model *m, const mx_plan *plan, mx_diag *diag);

/* ---- profile (profile.c) ---- */

/* A moment by the wall clock and by this thread's CPU clock. */
typedef struct {
    double wall, cpu;
} mxi_prof_t;

mxi_prof_t mxi_prof_start(const mx_model *m);
/* The time since t0 as op's, when profiling. */
void mxi_prof_stop(mx_model *m, mxi_model_op op, mxi_prof_t t0);
/* The time since t0 as a whole forward (or backward) pass, when profiling. */
void mxi_prof_pass(mx_model *m, mxi_prof_t t0, bool forward);
/* Time one statement as op. */
#define TIMED(op, stmt) do { mxi_prof_t t0_ = mxi_prof_start(m); stmt; mxi_prof_stop(m, op, t0_); } while (0)

/* ---- MoE blocks (moe.c) ---- */

/* The MoE block of layer l on its ln2 into out (N, C), and its backward from dout (N, C)
 * to m->d_ln, the gradient of ln2. */
void mxi_moe_forward(mx_model *m, int l, float *out /* (N, C) */);
void mxi_moe_backward(mx_model *m, int l, const float *dout /* (N, C) */);
/* Whether the load-balancing loss is on, and over how many MoE layers it averages. */
bool mxi_moe_aux_enabled(const mx_model *m);
int mxi_moe_layer_count(const mx_model *m);

/* ---- expert parallelism (expert_exchange.c) ---- */

/* Which MoE layers exchange tokens, and how each exchange's rows travel. */
int mxi_model_plan_ep(mx_model *m, const mx_model_options *o, mx_diag *diag);
/* Whether exchanges run beside the work that does not need them. */
bool mxi_ep_overlapping(const mx_model *m);
/* Between the GEMMs that run beside an exchange: let it progress. */
void mxi_ep_poke(mx_model *m);
/* The forward dispatch of layer l: m->ep_xs (this rank's routed rows grouped by expert) to
 * the experts' ranks; s->xe gets the rows of this rank's experts, s->xoff their offsets. */
void mxi_ep_dispatch(mx_model *m, int l, layer_acts *s);
/* Send routed rows src (R, C; grouped by expert) of exchange x to their experts' ranks;
 * mxi_ep_arrive_at_experts then puts those of this rank's experts into dst (RX, C). */
void mxi_ep_send_to_experts(mx_model *m, layer_acts *s, int l, mxi_ep_exchange x, const float *src, const char *what);
void mxi_ep_arrive_at_experts(mx_model *m, layer_acts *s, int l, mxi_ep_exchange x, float *dst);
/* The way back (exchange x, fp32): expert-side rows src to their source ranks, dst (R, C),
 * once mxi_ep_combined has returned true. */
void mxi_ep_combine(mx_model *m, layer_acts *s, mxi_ep_exchange x, float *dst, const float *src);
bool mxi_ep_combined(mx_model *m, int l, mxi_ep_exchange x);

/* ---- shared by the forward and backward passes ---- */

/* A site's saved input (plane or bf16), or NULL where the site keeps fp32. */
static inline const mxi_saved_input *mxi_site_saved(const mxi_saved_input *sv) { return sv->q || sv->bf16 ? sv : NULL; }

/* The fp32 input backward should read: NULL where the site saved a plane or bf16 instead. */
static inline const float *mxi_site_kept(const float *fp32, const mxi_saved_input *sv) {
    return mxi_site_saved(sv) ? NULL : fp32;
}

/* Where tensor i's weights, gradients and pre-quantized planes are now (NULL for an absent
 * tensor, index -1); m is the model in scope. */
#define W(i) ((i) >= 0 ? m->tw[i] : NULL)
#define W16(i) ((i) >= 0 ? m->tw16[i] : NULL)
#define G(i) ((i) >= 0 ? m->tg[i] : NULL)
#define WQ(i) ((i) >= 0 ? m->wq[i] : NULL)
/* A linear call's parameters from tensor indices (weight, bias: -1 for none) and its shape. */
#define PARAMS(w, b) ((mxi_linear_params){W(w), WQ(w), W(b), W16(w), mxi_delayed_site_of(m->delayed, w, 0), w})
/* A backward call's gradients: dinp written as write says, tensor w's (and bias b's) += (a
 * sunk w's into the slice buffer: mxi_grad_done(m, w) after the call) */
#define GRADS(dinp, write, w, b) ((mxi_linear_grads){dinp, write, mxi_grad_target(m, w), G(b)})
#define SHAPE(rows, in, out) ((mxi_linear_shape){rows, in, out})

/* A site's input as backward reads it: the fp32 one, or what forward saved instead. */
static inline mxi_linear_input mxi_site_input(const float *fp32, const mxi_saved_input *sv) {
    return (mxi_linear_input){mxi_site_kept(fp32, sv), mxi_site_saved(sv)};
}

/* model/documents.c: doc_start, positions and loss_keep of the micro-batch from m->inputs. */
void mxi_documents_make(mx_model *m);
/* The loss summed over the rows with keep[n] 1 (masked rows add nothing); with dlogits, the
 * gradient of dscale x that sum (0 in masked rows). */
double mxi_cross_entropy_kept(float *dlogits, const float *logits, const int32_t *targets, const int32_t *keep, int N,
                              int V, float dscale);

#endif
