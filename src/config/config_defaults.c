/* Phase 2 of loading the config: the defaults, set before any value is converted so that
 * a value given replaces them; the model's (Hugging Face's) once model_type is known. */
#include <stdlib.h>
#include <string.h>

#include "config/config_internal.h"
#include "core/text.h"

static int compile_default_patterns(mx_plan_pattern **list, int *n, const char *text) {
    *list = calloc(1, sizeof **list);
    if (!*list) return MX_ENOMEM;
    *n = 1;
    (*list)->text = mxi_strndup(text, strlen(text));
    if (!(*list)->text || mx_pattern_compile(text, &(*list)->compiled, NULL) != 0) return MX_ENOMEM;
    return 0;
}

/* Everything but the model (whose defaults depend on model_type). */
int mxi_config_defaults(mx_config *cfg) {
    cfg->parallel = (mx_parallel_config){
        .data_parallel_size = 0,        /* auto */
        .fully_shard_parallel_size = 0, /* auto */
        .param_dtype = MX_DTYPE_BF16,
        .reduce_dtype = MX_DTYPE_FP32,
        .reshard_after_forward = true,
        .num_to_forward_prefetch = 1,
        .num_to_backward_prefetch = 1,
        .expert_parallel_size = 1,
        .timeout_s = 600, /* torch.distributed's default process-group timeout */
    };
    cfg->features.recompute = false;
    cfg->features.recompute_granularity = MX_RECOMPUTE_FULL;
    cfg->training.gradient_accumulation_steps = 1;
    cfg->training.seed = 1234;
    cfg->data.eod_token_id = -1;   /* not given: prepare's EOT where the vocabulary is prepare's */
    cfg->training.min_lr = 0.0;
    cfg->training.lr_decay_style = MX_LR_LINEAR; /* Megatron's default */
    cfg->training.lr_warmup_ratio = 0.0;
    cfg->training.weight_decay = 0.0;
    cfg->training.adam_beta1 = 0.9;
    cfg->training.adam_beta2 = 0.95;
    cfg->training.adam_eps = 1e-8;
    cfg->training.clip_grad = 1.0;
    cfg->training.exp_avg_dtype = cfg->training.exp_avg_sq_dtype = MX_STATE_FP32;
    cfg->training.main_grads_dtype = MX_DTYPE_FP32;
    cfg->training.log_interval = 1;
    cfg->training.lr_warmup_iters = -1;
    cfg->training.save_interval = 0;
    cfg->training.save_parallel = true;
    cfg->training.memory_check = true;
    cfg->training.check_for_nan_in_loss_and_grad = true;   /* Megatron's default */
    cfg->parallel.ep_overlap = true;
    cfg->training.eval_interval = 0;
    cfg->training.eval_iters = 10;
    cfg->training.sample_tokens = 128;
    if (compile_default_patterns(&cfg->parallel.ep_modules, &cfg->parallel.n_ep_modules,
                                 "model.layers.{*}.mlp.experts"))
        return MX_ENOMEM;
    return compile_default_patterns(&cfg->features.recompute_modules, &cfg->features.n_recompute_modules,
                                    "model.layers.{*}");
}

/* Hugging Face's defaults for a model type: the keyword defaults of transformers'
 * LlamaConfig, Qwen3Config and Qwen3MoeConfig. num_key_value_heads and head_dim are derived
 * later (Llama's rule, for every type: see docs/config.md). */
void mxi_config_model_defaults(mx_model_config *m, mx_model_type type) {
    m->type = type;
    m->rms_norm_eps = 1e-6f;
    m->rope_theta = 10000.0f;
    m->max_position_embeddings = type == MX_MODEL_LLAMA ? 2048 : 32768;
    m->tie_word_embeddings = false;
    m->attention_bias = false;
    m->initializer_range = 0.02f;
    m->decoder_sparse_step = 1;
    if (type == MX_MODEL_QWEN3_MOE) {
        m->num_experts = 128;
        m->num_experts_per_tok = 8;
        m->moe_intermediate_size = 768;
        m->norm_topk_prob = false;
        m->output_router_logits = false;
        m->router_aux_loss_coef = 0.001f;
    }
}
