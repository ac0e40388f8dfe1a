/* mxtrain — the model family (SPEC §7): decoder-only transformers in the Llama / Qwen3 /
 * Qwen3-MoE style, with Hugging Face semantics, names and tensor layouts.
 *
 * Letters used in the model's shape comments (model, layers, attention, trainer):
 *   B batch (micro-batch size)     T sequence length        C hidden size
 *   V vocabulary size              L layers                 NH attention heads
 *   NKV key/value heads            HD head dim              F dense MLP hidden size
 *   E experts                      K experts per token      FE expert MLP hidden size
 *   N = B*T token rows             R = N*K routed rows of an MoE layer
 * GEMM-level code has its own legend, kept apart: a linear layer is (rows, in) -> (rows, out)
 * (model/linear.h), and ops/gemm.h's products are C (M, N) = A (M, K) B (K, N); a sharded
 * tensor is groups x rows x cols (model/units.h).
 */
#ifndef MXTRAIN_MODEL_H
#define MXTRAIN_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "mxtrain/error.h"
#include "mxtrain/plan.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MX_MAX_LAYERS 256
/* Tokens of a micro-batch (batch x seq: training.micro_batch_size x data.seq_length) a
 * model accepts. */
#define MX_MAX_BATCH_TOKENS (1 << 24)

typedef enum { MX_MODEL_LLAMA = 0, MX_MODEL_QWEN3 = 1, MX_MODEL_QWEN3_MOE = 2 } mx_model_type;

/* Model hyper-parameters, with the Hugging Face config.json key of each field. */
typedef struct {
    mx_model_type type;            /* model_type: "llama", "qwen3", "qwen3_moe" */
    int vocab_size;                /* vocab_size (V) */
    int hidden_size;               /* hidden_size (C) */
    int intermediate_size;         /* intermediate_size (F), dense MLP layers */
    int num_hidden_layers;         /* num_hidden_layers (L), at most MX_MAX_LAYERS */
    int num_attention_heads;       /* num_attention_heads (NH) */
    int num_key_value_heads;       /* num_key_value_heads (NKV); NH must be a multiple */
    int head_dim;                  /* head_dim (HD); default C / NH */
    float rms_norm_eps;            /* rms_norm_eps */
    float rope_theta;              /* rope_theta */
    int max_position_embeddings;   /* max_position_embeddings: longest sequence */
    bool tie_word_embeddings;      /* tie_word_embeddings: lm_head shares embed_tokens */
    bool attention_bias;           /* attention_bias: q/k/v/o projections have biases */
    float initializer_range;       /* initializer_range: std of the normal init */
    /* Qwen3-MoE only */
    int num_experts;               /* num_experts (E) */
    int num_experts_per_tok;       /* num_experts_per_tok (K), 1 <= K <= E */
    int moe_intermediate_size;     /* moe_intermediate_size (FE) */
    bool norm_topk_prob;           /* norm_topk_prob: renormalise the top-K routing weights */
    int decoder_sparse_step;       /* decoder_sparse_step: layer i is MoE when (i+1) % step == 0 */
    bool mlp_only_layers[MX_MAX_LAYERS]; /* mlp_only_layers: layers forced dense */
    bool output_router_logits;     /* output_router_logits: add the load-balancing loss */
    float router_aux_loss_coef;    /* router_aux_loss_coef */
} mx_model_config;

/* Whether layer i of a config is an MoE layer (Qwen3-MoE's rule). */
bool mx_model_layer_is_moe(const mx_model_config *config, int layer);

/* Check a config's internal consistency (sizes positive, heads dividing, top-K <= experts, ...).
 * Returns 0 or MX_ECONFIG with diag naming the Hugging Face key, its value and the rule. */
int mx_model_config_check(const mx_model_config *config, mx_diag *diag);

/* ---- Modules ------------------------------------------------------------------------ */

/* The modules of a model in forward order, with Hugging Face names, for the quantization
 * plan (see plan.h): linear layers (projections, MLPs, MoE routers, lm_head), MoE expert
 * blocks, and everything else (embedding, norms). *out is malloc'ed, its names too: free
 * with mx_model_modules_free. */
int mx_model_modules(const mx_model_config *config, mx_module **out, int *count);
/* The most modules mx_model_modules lists for a model of L layers (its list's length). */
#define MX_MODULES_MAX(L) ((size_t)(L) * 14 + 3)
void mx_model_modules_free(mx_module *modules, int count);

/* ---- The model ---------------------------------------------------------------------- */

typedef struct mx_model mx_model;

/* How the tokens travel to their experts with expert parallelism (parallel.ep_plan.dispatch_dtype,
 * docs/distributed.md#expert-parallelism). */
typedef enum {
    MX_EP_DISPATCH_AUTO = 0,  /* exact: bf16 where the experts' GEMMs round their inputs to bf16, else fp32 */
    MX_EP_DISPATCH_FP32 = 1,  /* every exchange in fp32 */
    MX_EP_DISPATCH_BF16 = 2,  /* the tokens in bf16 (rounding them where compute is fp32 or MX) */
    MX_EP_DISPATCH_MXFP8 = 3, /* the tokens as the rowwise MXFP8 plane of the converted experts' FC1 input */
} mx_ep_dispatch;

/* What a recomputed block drops in forward and makes again in backward
 * (features.recompute_granularity, Megatron's names). */
typedef enum {
    MX_RECOMPUTE_FULL = 0,      /* everything but the block's input: its forward runs again */
    MX_RECOMPUTE_SELECTIVE = 1, /* the attention and SwiGLU internals only (the normed, rotated q
                                   and k with their norms' rstd, the SwiGLU hidden): made again
                                   from what the block keeps, no GEMM runs again */
} mx_recompute_granularity;

/* Megatron's document masking (data.reset_attention_mask, data.reset_position_ids,
 * data.eod_mask_loss): a row of tokens holds documents each ended by eod_token (the token
 * belongs to the document it ends; the next document starts after it). */
typedef struct {
    int32_t eod_token;        /* the end-of-document token (read only when a switch below is on) */
    bool reset_attention_mask;/* a token attends to the earlier tokens of its own document only */
    bool reset_position_ids;  /* RoPE positions restart at 0 after each eod_token */
    bool eod_mask_loss;       /* no loss where the input token is eod_token; the micro-batch's loss
                                 is the mean over the other positions */
} mx_model_documents;

typedef struct {
    int batch;                /* B: rows of a micro-batch */
    int seq;                  /* T: tokens per row, <= max_position_embeddings */
    bool bf16;                /* matmuls on bf16 operands (fp32 accumulation); else fp32 */
    const mx_plan *plan;      /* quantization plan (plan.h): the modules it converts run their
                                 GEMMs on MXFP8 operands; NULL or disabled: none */
    const mx_plan_pattern *recompute;  /* features.recompute_plan.apply_modules: blocks
                                          ("model.layers.N") matching one re-run their forward
                                          in backward, keeping only their input; NULL: none */
    int n_recompute;
    mx_recompute_granularity recompute_granularity;   /* what those blocks recompute */
    bool external_params;     /* for the FSDP engine: no weights or gradients of its own; the
                                 engine binds each unit's buffers (mx_model_params is NULL); under EP
                                 it binds, for each EP layer, this rank's E / EP experts only */
    int expert_parallel;      /* EP (0 or 1: none): MoE layers compute num_experts / EP experts on
                                 the tokens EP ranks route to them, through the exchange the
                                 engine installs (mxi_model_set_ep); their expert-side
                                 activations are sized for EP times the routed rows */
    const mx_plan_pattern *ep_modules;  /* parallel.ep_plan.apply_modules: the MoE layers whose
                                           experts ("model.layers.N.mlp.experts", or an ancestor)
                                           a pattern matches use EP; the others compute every
                                           expert locally. NULL: every MoE layer */
    int n_ep_modules;
    mx_ep_dispatch ep_dispatch;         /* parallel.ep_plan.dispatch_dtype */
    bool ep_overlap;                    /* parallel.ep_plan.overlap: where the engine's exchange can
                                           run in the background (mxi_model_ep.start), the weight
                                           gradients of the experts and of the router, the
                                           experts' saved input planes and the load-balancing
                                           statistics are computed while it does */
    double z_loss_coef;                 /* training.moe_z_loss_coeff: the router z-loss, coef times
                                           the mean over a micro-batch's tokens of logsumexp(router
                                           logits)^2, summed over the MoE layers; 0: none */
    mx_model_documents documents;       /* all off: no document masking */
} mx_model_options;

/* Build a model: parameters, gradients and activations each in one allocation, sized for
 * (B, T). Parameters start at zero: call mx_model_init or mx_model_load. */
int mx_model_create(const mx_model_config *config, const mx_model_options *options, mx_model **out, mx_diag *diag);
void mx_model_free(mx_model *model);

/* Parameters as Hugging Face tensors: count, and for each its name, shape and fp32 data
 * (master weights) and gradient, both inside the flat buffers below. MoE experts are one
 * fused tensor per layer and kind internally (see mx_model_save for the per-expert names). */
int mx_model_num_tensors(const mx_model *model);
typedef struct {
    const char *name;         /* e.g. "model.layers.0.self_attn.q_proj.weight" */
    const char *module;       /* owning module, e.g. "model.layers.0.self_attn.q_proj" */
    int ndim;
    int64_t shape[3];
    int64_t numel;
    float *data;              /* master weights */
    float *grad;              /* gradients */
} mx_tensor_view;
mx_tensor_view mx_model_tensor(const mx_model *model, int index);
int64_t mx_model_num_params(const mx_model *model);   /* scalars, P */

/* The same parameters as the tensors of a Hugging Face checkpoint: MoE experts split into
 * model.layers.N.mlp.experts.J.{gate_proj,up_proj,down_proj}.weight (views into the fused
 * tensors), everything else as above. Safetensors files are read and written in these. */
int mx_model_num_hf_tensors(const mx_model *model);
mx_tensor_view mx_model_hf_tensor(const mx_model *model, int index);
float *mx_model_params(mx_model *model);              /* (P); NULL with external_params */
float *mx_model_grads(mx_model *model);               /* (P); NULL with external_params */

/* Round the weights to bf16 values as the FSDP engine gathers them at param_dtype bf16:
 * every tensor (norms and embeddings too), except the tensors the plan converts when
 * mx_from_fp32 (low-precision all-gather: their MX planes are quantized from the fp32
 * master shards). After this the model computes what a training step computes on these
 * weights (`mxtrain grads`). No-op with external_params. */
void mx_model_round_weights_bf16(mx_model *model, bool mx_from_fp32);

/* Load every parameter from a safetensors file (Hugging Face names, any float dtype the
 * reader converts), or from a directory holding model.safetensors or a sharded checkpoint
 * (model.safetensors.index.json). Every tensor of the model must be present with its shape;
 * a tensor the model does not have is an error naming it (lm_head.weight of a tied model
 * and rotary inv_freq buffers are ignored). On error the parameters are unspecified. */
int mx_model_load(mx_model *model, const char *path, mx_diag *diag);

/* Write the parameters (or, with grads, the gradients as "grad.<name>") as fp32 safetensors
 * with Hugging Face names, atomically. extra/n_extra: more fp32 scalars to store (name,
 * value), e.g. the loss; may be NULL/0. */
int mx_model_save(const mx_model *model, const char *path, bool grads, const char *const *extra_names,
                  const float *extra_values, int n_extra, mx_diag *diag);

/* Hugging Face's initialisation: linear and embedding weights ~ N(0, initializer_range^2),
 * biases 0, norm weights 1; deterministic for a seed. */
void mx_model_init(mx_model *model, uint64_t seed);

/* One forward pass on a micro-batch; returns the loss (mean cross-entropy, plus
 * router_aux_loss_coef times the load-balancing loss when output_router_logits is set, plus
 * z_loss_coef times the router z-loss). */
double mx_model_forward(mx_model *model, const int32_t *inputs /* (B, T) */, const int32_t *targets /* (B, T) */);

/* The last forward's cross-entropy and load-balancing loss, separately. */
double mx_model_last_ce_loss(const mx_model *model);
double mx_model_last_aux_loss(const mx_model *model);
/* The router z-loss of the last forward (mx_model_options.z_loss_coef > 0; else 0): per MoE
 * layer the mean over the micro-batch's tokens of logsumexp(router logits)^2, summed over
 * the layers; the forward's loss adds z_loss_coef times it. */
double mx_model_last_z_loss(const mx_model *model);

/* Backward of the last forward: grads += d(scale * loss)/d params (scale = 1/accumulation steps). */
void mx_model_backward(mx_model *model, float scale);
void mx_model_zero_grad(mx_model *model);

/* For verification: dump the operands of the first MX GEMM of each kind the model runs from
 * now on into dir (see docs/mx-numerics.md); NULL stops. */
void mx_model_trace_mx(mx_model *model, const char *dir);

/* How many modules the plan converted (linear layers and MoE expert blocks). */
int mx_model_converted_modules(const mx_model *model);

/* Bytes of the activation allocation; *without_saved_planes (if not NULL) receives what it
 * would be if every layer kept its fp32 inputs for backward instead of colwise MX planes
 * (converted layers) or bf16 copies (unconverted ones on a native bf16 matmul). A layer keeps
 * them only where that takes no more memory, so the first is never the larger. */
size_t mx_model_activation_bytes(const mx_model *model, size_t *without_saved_planes);

/* What mx_model_create would allocate for activations with these options, without
 * allocating it (nor weights or gradients): for a memory plan before a run starts. */
int mx_model_measure_activations(const mx_model_config *config, const mx_model_options *options, size_t *bytes,
                                 mx_diag *diag);

/* At bf16 compute precision (mx_model_options.bf16): whether oneDNN multiplies the bf16
 * operands natively on this CPU (AVX512_BF16, AMX); where not, its fp32 matmul takes the
 * bf16-rounded values (the same products). */
bool mx_model_bf16_native(mx_model *model);

/* The first failure inside forward or backward since the model was created (a matrix
 * product that could not run: out of memory, oneDNN refused), or 0. Sticky: a model that
 * failed stays failed. */
int mx_model_error(const mx_model *model, mx_diag *diag);

#ifdef __cplusplus
}
#endif

#endif
