/* mxtrain — the model family (SPEC §7): decoder-only transformers in the Llama / Qwen3 /
 * Qwen3-MoE style, with Hugging Face semantics, names and tensor layouts.
 *
 * Letters used in shape comments throughout the project:
 *   B batch (micro-batch size)     T sequence length        C hidden size
 *   V vocabulary size              L layers                 NH attention heads
 *   NKV key/value heads            HD head dim              F dense MLP hidden size
 *   E experts                      K experts per token      FE expert MLP hidden size
 */
#ifndef MXTRAIN_MODEL_H
#define MXTRAIN_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "mxtrain/error.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MX_MAX_LAYERS 256

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

#ifdef __cplusplus
}
#endif

#endif
