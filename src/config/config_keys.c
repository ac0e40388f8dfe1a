/* The config's keys (SPEC §1), each described once: its dotted path, type, range, where it
 * is stored and what messages say is allowed; and the lookups over them. Loading, printing
 * and the docs' list of settings are all driven by this table. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "config/config_internal.h"
#include "core/text.h"

#define OPTION(t, v) {.text = t, .value = v}
#define END {.text = NULL}

static const mxi_key_choice model_types[] = {
    OPTION("llama", MX_MODEL_LLAMA), OPTION("qwen3", MX_MODEL_QWEN3), OPTION("qwen3_moe", MX_MODEL_QWEN3_MOE), END};
static const mxi_key_choice dtypes[] = {
    OPTION("bf16", MX_DTYPE_BF16), OPTION("bfloat16", MX_DTYPE_BF16),
    OPTION("fp32", MX_DTYPE_FP32), OPTION("float32", MX_DTYPE_FP32), END};
static const mxi_key_choice reduce_dtypes[] = {
    OPTION("bf16", MX_DTYPE_BF16), OPTION("bfloat16", MX_DTYPE_BF16), OPTION("fp32", MX_DTYPE_FP32),
    OPTION("float32", MX_DTYPE_FP32), OPTION("fp64", MX_DTYPE_FP64), OPTION("float64", MX_DTYPE_FP64), END};
static const mxi_key_choice state_dtypes[] = {
    OPTION("fp32", MX_STATE_FP32), OPTION("float32", MX_STATE_FP32), OPTION("bf16", MX_STATE_BF16),
    OPTION("bfloat16", MX_STATE_BF16), OPTION("mxfp8", MX_STATE_MXFP8), OPTION("fp8", MX_STATE_FP8), END};
static const mxi_key_choice ep_dispatchers[] = {OPTION("alltoall", 0), END};
static const mxi_key_choice ep_dispatch_dtypes[] = {
    OPTION("auto", MX_EP_DISPATCH_AUTO), OPTION("fp32", MX_EP_DISPATCH_FP32), OPTION("float32", MX_EP_DISPATCH_FP32),
    OPTION("bf16", MX_EP_DISPATCH_BF16), OPTION("bfloat16", MX_EP_DISPATCH_BF16), OPTION("mxfp8", MX_EP_DISPATCH_MXFP8),
    END};
static const mxi_key_choice recompute_granularities[] = {
    OPTION("full", MX_RECOMPUTE_FULL), OPTION("selective", MX_RECOMPUTE_SELECTIVE), END};
static const mxi_key_choice decay_styles[] = {
    OPTION("constant", MX_LR_CONSTANT), OPTION("linear", MX_LR_LINEAR), OPTION("cosine", MX_LR_COSINE),
    OPTION("WSD", MX_LR_WSD), OPTION("wsd", MX_LR_WSD), END};
static const mxi_key_choice wsd_styles[] = {
    OPTION("exponential", MX_WSD_EXPONENTIAL), OPTION("linear", MX_WSD_LINEAR), OPTION("cosine", MX_WSD_COSINE),
    OPTION("minus_sqrt", MX_WSD_MINUS_SQRT), END};

#define OFF(member) offsetof(mx_config, member)
#define NOWHERE ((size_t)-1)
/* The table in short: the range without an upper bound, and the flags. */
#define IMAX MXI_KEY_NO_MAX
#define REQUIRED MXI_FLAG_REQUIRED
#define NULLABLE MXI_FLAG_NULLABLE
#define MOE MXI_FLAG_MOE
#define LO_OPEN MXI_FLAG_LO_OPEN
#define HI_OPEN MXI_FLAG_HI_OPEN
#define HIDDEN MXI_FLAG_HIDDEN
#define YAML_ONLY MXI_FLAG_YAML_ONLY

#define SECTION(p, fl, allow) {.path = p, .type = MXI_KEY_SECTION, .off = NOWHERE, .flags = fl, .allowed = allow}
#define INT(p, m, l, h, fl) {.path = p, .type = MXI_KEY_INT, .off = OFF(m), .lo = l, .hi = h, .flags = fl}
#define F32(p, m, l, h, fl) {.path = p, .type = MXI_KEY_F32, .off = OFF(m), .lo = l, .hi = h, .flags = fl}
#define F64(p, m, l, h, fl) {.path = p, .type = MXI_KEY_F64, .off = OFF(m), .lo = l, .hi = h, .flags = fl}
#define BOOL(p, m, fl) {.path = p, .type = MXI_KEY_BOOL, .off = OFF(m), .flags = fl}
#define STR(p, m) {.path = p, .type = MXI_KEY_STR, .off = OFF(m), .flags = NULLABLE}
#define CHOICE(p, m, c, fl) {.path = p, .type = MXI_KEY_CHOICE, .off = OFF(m), .flags = fl, .choices = c}
#define FIXED(p, t, fl) {.path = p, .type = t, .off = NOWHERE, .flags = HIDDEN | (fl)}

const mxi_key_def mxi_keys[] = {
    SECTION("model", REQUIRED, "a mapping of Hugging Face model keys (model_type, hidden_size, ...), "
                               "and/or model_name_or_path"),
    {.path = "model.model_name_or_path", .type = MXI_KEY_HFDIR, .off = OFF(model_name_or_path), .flags = YAML_ONLY,
     .allowed = "a local directory holding a Hugging Face config.json, or the config.json itself; nothing is "
                "downloaded"},
    CHOICE("model.model_type", model.type, model_types, REQUIRED),
    INT("model.vocab_size", model.vocab_size, 1, IMAX, REQUIRED),
    INT("model.hidden_size", model.hidden_size, 1, IMAX, REQUIRED),
    INT("model.intermediate_size", model.intermediate_size, 1, IMAX, REQUIRED),
    INT("model.num_hidden_layers", model.num_hidden_layers, 1, MX_MAX_LAYERS, REQUIRED),
    INT("model.num_attention_heads", model.num_attention_heads, 1, IMAX, REQUIRED),
    INT("model.num_key_value_heads", model.num_key_value_heads, 1, IMAX, NULLABLE),
    INT("model.head_dim", model.head_dim, 1, IMAX, NULLABLE),
    F32("model.rms_norm_eps", model.rms_norm_eps, 0, INFINITY, LO_OPEN),
    F32("model.rope_theta", model.rope_theta, 0, INFINITY, LO_OPEN),
    INT("model.max_position_embeddings", model.max_position_embeddings, 1, IMAX, 0),
    BOOL("model.tie_word_embeddings", model.tie_word_embeddings, 0),
    BOOL("model.attention_bias", model.attention_bias, 0),
    F32("model.initializer_range", model.initializer_range, 0, INFINITY, LO_OPEN),
    {.path = "model.num_experts", .alias = "num_local_experts", .type = MXI_KEY_INT, .off = OFF(model.num_experts),
     .lo = 1, .hi = IMAX, .flags = MOE},
    INT("model.num_experts_per_tok", model.num_experts_per_tok, 1, IMAX, MOE),
    INT("model.moe_intermediate_size", model.moe_intermediate_size, 1, IMAX, MOE),
    BOOL("model.norm_topk_prob", model.norm_topk_prob, MOE),
    INT("model.decoder_sparse_step", model.decoder_sparse_step, 1, IMAX, MOE),
    {.path = "model.mlp_only_layers", .type = MXI_KEY_LAYERS, .off = OFF(model.mlp_only_layers),
     .flags = MOE | NULLABLE, .allowed = "a list of layer indices from 0 to num_hidden_layers - 1"},
    BOOL("model.output_router_logits", model.output_router_logits, MOE),
    F32("model.router_aux_loss_coef", model.router_aux_loss_coef, 0, INFINITY, MOE),
    FIXED("model.hidden_act", MXI_KEY_MUST_SILU, 0),
    FIXED("model.attention_dropout", MXI_KEY_MUST_ZERO, 0),
    FIXED("model.use_sliding_window", MXI_KEY_MUST_FALSE, 0),
    FIXED("model.mlp_bias", MXI_KEY_MUST_FALSE, 0),
    FIXED("model.rope_scaling", MXI_KEY_ROPE_SCALING, NULLABLE),
    FIXED("model.rope_parameters", MXI_KEY_ROPE_PARAMS, NULLABLE),
    FIXED("model.layer_types", MXI_KEY_LAYER_TYPES, NULLABLE),

    SECTION("data", REQUIRED, "a mapping with keys data_path, seq_length, val_data_path, shuffle, "
                              "reset_attention_mask, reset_position_ids, eod_mask_loss, eod_token_id, tokenizer"),
    {.path = "data.data_path", .type = MXI_KEY_PATHS, .off = OFF(data.data_path), .count_off = OFF(data.n_data_path),
     .weights_off = OFF(data.data_weights), .flags = REQUIRED,
     .allowed = "a file or glob pattern of llm.c .bin shards, a list of them, or a blend [weight, pattern, weight, "
                "pattern, ...]"},
    {.path = "data.val_data_path", .type = MXI_KEY_PATHS, .off = OFF(data.val_data_path),
     .count_off = OFF(data.n_val_data_path), .weights_off = OFF(data.val_data_weights), .flags = NULLABLE,
     .allowed = "a file or glob pattern of llm.c .bin shards, a list of them, a blend [weight, pattern, ...], or "
                "null"},
    INT("data.seq_length", data.seq_length, 1, IMAX, REQUIRED),
    BOOL("data.shuffle", data.shuffle, 0),
    BOOL("data.reset_attention_mask", data.reset_attention_mask, 0),
    BOOL("data.reset_position_ids", data.reset_position_ids, 0),
    BOOL("data.eod_mask_loss", data.eod_mask_loss, 0),
    INT("data.eod_token_id", data.eod_token_id, 0, IMAX, 0),
    STR("data.tokenizer", data.tokenizer),

    SECTION("parallel", 0, "a mapping with keys data_parallel_size, fully_shard_parallel_size, expert_parallel_size, "
                         "expert_fully_shard_parallel_size, expert_data_parallel_size, ep_plan, fsdp_plan, timeout_s"),
    {.path = "parallel.data_parallel_size", .type = MXI_KEY_FSDP_SIZE, .off = OFF(parallel.data_parallel_size),
     .allowed = "a positive integer, or auto: the MPI ranks / fully_shard_parallel_size"},
    {.path = "parallel.fully_shard_parallel_size", .type = MXI_KEY_FSDP_SIZE,
     .off = OFF(parallel.fully_shard_parallel_size),
     .allowed = "a positive integer, or auto: the MPI ranks / data_parallel_size"},
    INT("parallel.expert_parallel_size", parallel.expert_parallel_size, 1, 4096, 0),
    {.path = "parallel.expert_fully_shard_parallel_size", .type = MXI_KEY_FSDP_SIZE,
     .off = OFF(parallel.expert_fully_shard_parallel_size),
     .allowed = "a positive integer, or auto: the MPI ranks / (expert_parallel_size x expert_data_parallel_size)"},
    {.path = "parallel.expert_data_parallel_size", .type = MXI_KEY_FSDP_SIZE,
     .off = OFF(parallel.expert_data_parallel_size),
     .allowed = "a positive integer, or auto: the MPI ranks / (expert_parallel_size x "
                "expert_fully_shard_parallel_size)"},
    SECTION("parallel.ep_plan", 0, "a mapping with keys apply_modules, dispatcher, dispatch_dtype, overlap"),
    {.path = "parallel.ep_plan.apply_modules", .type = MXI_KEY_PATTERNS, .off = OFF(parallel.ep_modules),
     .count_off = OFF(parallel.n_ep_modules),
     .allowed = "a list of patterns selecting MoE expert modules such as ['model.layers.{*}.mlp.experts'], or one "
                "pattern"},
    CHOICE("parallel.ep_plan.dispatcher", parallel.ep_dispatcher, ep_dispatchers, 0),
    CHOICE("parallel.ep_plan.dispatch_dtype", parallel.ep_dispatch_dtype, ep_dispatch_dtypes, 0),
    BOOL("parallel.ep_plan.overlap", parallel.ep_overlap, 0),
    SECTION("parallel.fsdp_plan", 0, "a mapping with keys param_dtype, reduce_dtype, reshard_after_forward, "
                                     "num_to_forward_prefetch, num_to_backward_prefetch"),
    CHOICE("parallel.fsdp_plan.param_dtype", parallel.param_dtype, dtypes, 0),
    CHOICE("parallel.fsdp_plan.reduce_dtype", parallel.reduce_dtype, reduce_dtypes, 0),
    BOOL("parallel.fsdp_plan.reshard_after_forward", parallel.reshard_after_forward, 0),
    INT("parallel.fsdp_plan.num_to_forward_prefetch", parallel.num_to_forward_prefetch, 0, IMAX, 0),
    INT("parallel.fsdp_plan.num_to_backward_prefetch", parallel.num_to_backward_prefetch, 0, IMAX, 0),
    F64("parallel.timeout_s", parallel.timeout_s, 0, INFINITY, LO_OPEN),

    SECTION("features", 0, "a mapping with keys recompute, recompute_granularity, recompute_plan"),
    BOOL("features.recompute", features.recompute, 0),
    CHOICE("features.recompute_granularity", features.recompute_granularity, recompute_granularities, 0),
    SECTION("features.recompute_plan", 0, "a mapping with key apply_modules"),
    {.path = "features.recompute_plan.apply_modules", .type = MXI_KEY_PATTERNS, .off = OFF(features.recompute_modules),
     .count_off = OFF(features.n_recompute_modules),
     .allowed = "a list of module patterns such as ['model.layers.{*}'], or one pattern"},

    SECTION("training", REQUIRED, "a mapping with keys micro_batch_size, train_iters, lr, ... (see docs/config.md)"),
    INT("training.micro_batch_size", training.micro_batch_size, 1, IMAX, REQUIRED),
    INT("training.gradient_accumulation_steps", training.gradient_accumulation_steps, 1, IMAX, 0),
    INT("training.global_batch_size", training.global_batch_size, 1, IMAX, 0),
    {.path = "training.seed", .type = MXI_KEY_SEED, .off = OFF(training.seed),
     .allowed = "an integer from 0 to 2^63-1"},
    F64("training.lr", training.lr, 0, INFINITY, REQUIRED | LO_OPEN),
    F64("training.min_lr", training.min_lr, 0, INFINITY, 0),
    CHOICE("training.lr_decay_style", training.lr_decay_style, decay_styles, 0),
    F64("training.lr_warmup_ratio", training.lr_warmup_ratio, 0, 1, 0),
    INT("training.lr_warmup_iters", training.lr_warmup_iters, 0, IMAX, 0),
    INT("training.lr_decay_iters", training.lr_decay_iters, 1, IMAX, 0),
    CHOICE("training.lr_wsd_decay_style", training.lr_wsd_decay_style, wsd_styles, 0),
    INT("training.lr_wsd_decay_iters", training.lr_wsd_decay_iters, 1, IMAX, 0),
    F64("training.weight_decay", training.weight_decay, 0, INFINITY, 0),
    F64("training.moe_z_loss_coeff", training.moe_z_loss_coeff, 0, INFINITY, MOE),
    F64("training.adam_beta1", training.adam_beta1, 0, 1, HI_OPEN),
    F64("training.adam_beta2", training.adam_beta2, 0, 1, HI_OPEN),
    F64("training.adam_eps", training.adam_eps, 0, INFINITY, LO_OPEN),
    CHOICE("training.exp_avg_dtype", training.exp_avg_dtype, state_dtypes, 0),
    CHOICE("training.exp_avg_sq_dtype", training.exp_avg_sq_dtype, state_dtypes, 0),
    CHOICE("training.main_grads_dtype", training.main_grads_dtype, dtypes, 0),
    INT("training.train_iters", training.train_iters, 1, IMAX, REQUIRED),
    F64("training.clip_grad", training.clip_grad, 0, INFINITY, 0),
    INT("training.log_interval", training.log_interval, 1, IMAX, 0),
    INT("training.save_interval", training.save_interval, 0, IMAX, 0),
    INT("training.eval_interval", training.eval_interval, 0, IMAX, 0),
    INT("training.eval_iters", training.eval_iters, 1, IMAX, 0),
    STR("training.save", training.save),
    BOOL("training.save_parallel", training.save_parallel, 0),
    INT("training.keep_latest_k", training.keep_latest_k, 0, IMAX, 0),
    INT("training.exit_interval", training.exit_interval, 0, IMAX, 0),
    F64("training.exit_duration_in_mins", training.exit_duration_in_mins, 0, INFINITY, 0),
    BOOL("training.exit_signal_handler", training.exit_signal_handler, 0),
    BOOL("training.memory_check", training.memory_check, 0),
    BOOL("training.check_for_nan_in_loss_and_grad", training.check_for_nan_in_loss_and_grad, 0),
    STR("training.load", training.load),
    STR("training.metrics_path", training.metrics_path),
    STR("training.plot_path", training.plot_path),
    INT("training.sample_interval", training.sample_interval, 0, IMAX, 0),
    INT("training.sample_tokens", training.sample_tokens, 0, 65536, 0),
    STR("training.sample_prompt", training.sample_prompt),
    INT("training.quant_stats_interval", training.quant_stats_interval, 0, IMAX, 0),
    {.path = "training.quantization_plan", .type = MXI_KEY_QPLAN, .off = NOWHERE},
};

const int mxi_n_keys = (int)(sizeof mxi_keys / sizeof mxi_keys[0]);
_Static_assert(sizeof mxi_keys / sizeof mxi_keys[0] <= MX_CONFIG_MAX_KEYS, "MX_CONFIG_MAX_KEYS is too small");
_Static_assert(sizeof(mx_model_type) == sizeof(int) && sizeof(mx_dtype) == sizeof(int) &&
                   sizeof(mx_state_dtype) == sizeof(int) &&
                   sizeof(mx_lr_decay) == sizeof(int),
               "choices are stored as int");
_Static_assert(sizeof(mx_recompute_granularity) == sizeof(int), "choices are stored as int");

/* Keys of Hugging Face config.json files that do not change the model mxtrain builds
 * (bookkeeping, generation and inference settings, PretrainedConfig's generic attributes):
 * accepted there and ignored. Keys whose values could change the model are in mxi_keys. */
static const char *const hf_ignored[] = {
    "architectures", "torch_dtype", "dtype", "transformers_version", "_name_or_path", "_commit_hash",
    "_attn_implementation_autoset", "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id",
    "decoder_start_token_id", "use_cache", "max_window_layers", "sliding_window", "pretraining_tp",
    "tokenizer_class", "return_dict", "output_hidden_states", "output_attentions", "torchscript",
    "use_bfloat16", "tf_legacy_loss", "pruned_heads", "chunk_size_feed_forward", "is_encoder_decoder",
    "is_decoder", "cross_attention_hidden_size", "add_cross_attention", "tie_encoder_decoder",
    "finetuning_task", "id2label", "label2id", "task_specific_params", "problem_type", "prefix",
    "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups",
    "diversity_penalty", "temperature", "top_k", "top_p", "typical_p", "repetition_penalty",
    "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids",
    "num_return_sequences", "output_scores", "return_dict_in_generate", "forced_bos_token_id",
    "forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty", "suppress_tokens",
    "begin_suppress_tokens", "gradient_checkpointing", NULL,
};

const char *mxi_key_name(int id) {
    const char *dot = strrchr(mxi_keys[id].path, '.');
    return dot ? dot + 1 : mxi_keys[id].path;
}

/* The section holding key id, -1 for a top-level key. */
int mxi_key_parent(int id) {
    const char *dot = strrchr(mxi_keys[id].path, '.');
    if (!dot) return -1;
    size_t n = (size_t)(dot - mxi_keys[id].path);
    for (int s = 0; s < mxi_n_keys; s++)
        if (strlen(mxi_keys[s].path) == n && strncmp(mxi_keys[s].path, mxi_keys[id].path, n) == 0) return s;
    return -1;
}

int mxi_key_find(const char *path) {
    for (int i = 0; i < mxi_n_keys; i++)
        if (strcmp(mxi_keys[i].path, path) == 0) return i;
    return -1;
}

/* The child of section named text[0..len) (its name or alias), or -1. */
int mxi_key_child(int section, const char *text, size_t len, bool json) {
    if (strlen(text) != len) return -1; /* a NUL inside the key */
    for (int i = 0; i < mxi_n_keys; i++) {
        if (mxi_key_parent(i) != section || (json && (mxi_keys[i].flags & MXI_FLAG_YAML_ONLY))) continue;
        if (!strcmp(mxi_key_name(i), text) || (mxi_keys[i].alias && !strcmp(mxi_keys[i].alias, text))) return i;
    }
    return -1;
}

/* "a, b (alias c), ..." for the keys of a section that are settings. */
const char *mxi_key_list(int section, bool json, char *buf, size_t size) {
    size_t o = 0;
    buf[0] = '\0';
    for (int i = 0; i < mxi_n_keys && o < size; i++) {
        const mxi_key_def *k = &mxi_keys[i];
        if (mxi_key_parent(i) != section || (k->flags & MXI_FLAG_HIDDEN) || (json && (k->flags & MXI_FLAG_YAML_ONLY)))
            continue;
        const char *sep = o ? ", " : "";
        int n = k->alias ? snprintf(buf + o, size - o, "%s%s (alias %s)", sep, mxi_key_name(i), k->alias)
                         : snprintf(buf + o, size - o, "%s%s", sep, mxi_key_name(i));
        if (n < 0) break;
        o += (size_t)n;
    }
    return buf;
}

/* The "(allowed: ...)" text of a key. */
const char *mxi_key_allowed(int id, char *buf, size_t size) {
    const mxi_key_def *d = &mxi_keys[id];
    if (d->allowed) return d->allowed;
    switch (d->type) {
    case MXI_KEY_INT:
        if (d->hi >= MXI_KEY_NO_MAX) snprintf(buf, size, "an integer >= %g", d->lo);
        else snprintf(buf, size, "an integer from %g to %g", d->lo, d->hi);
        break;
    case MXI_KEY_F32:
    case MXI_KEY_F64:
        if (isinf(d->hi)) snprintf(buf, size, "a number %s %g", (d->flags & MXI_FLAG_LO_OPEN) ? ">" : ">=", d->lo);
        else if (!(d->flags & (MXI_FLAG_LO_OPEN | MXI_FLAG_HI_OPEN)))
            snprintf(buf, size, "a number from %g to %g", d->lo, d->hi);
        else
            snprintf(buf, size, "a number in %c%g, %g%c", (d->flags & MXI_FLAG_LO_OPEN) ? '(' : '[', d->lo, d->hi,
                     (d->flags & MXI_FLAG_HI_OPEN) ? ')' : ']');
        break;
    case MXI_KEY_BOOL: snprintf(buf, size, "true, false"); break;
    case MXI_KEY_CHOICE: {
        size_t o = 0;
        buf[0] = '\0';
        for (const mxi_key_choice *c = d->choices; c->text && o < size; c++) {
            const mxi_key_choice *first = d->choices;
            while (first->value != c->value) first++;
            int n = first == c ? snprintf(buf + o, size - o, "%s'%s'", o ? ", " : "", c->text)
                               : snprintf(buf + o, size - o, " (alias '%s')", c->text);
            if (n < 0) break;
            o += (size_t)n;
        }
        break;
    }
    case MXI_KEY_MUST_SILU: snprintf(buf, size, "'silu'"); break;
    case MXI_KEY_MUST_ZERO: snprintf(buf, size, "0"); break;
    case MXI_KEY_MUST_FALSE: snprintf(buf, size, "false"); break;
    case MXI_KEY_ROPE_SCALING: snprintf(buf, size, "null, or rope_type 'default'"); break;
    case MXI_KEY_ROPE_PARAMS: snprintf(buf, size, "a mapping with rope_type 'default' and rope_theta"); break;
    case MXI_KEY_LAYER_TYPES: snprintf(buf, size, "a list of 'full_attention'"); break;
    default: snprintf(buf, size, "see docs/config.md"); break;
    }
    return buf;
}

/* "; did you mean 'X'?" for an unknown key: a close key of the same section (a typo or a
 * shortening), else the same key in another section ("did you mean training.lr?"). */
const char *mxi_key_suggest(int section, const char *key, size_t len, bool json, char *buf, size_t size) {
    const char *best = NULL;
    size_t best_d = len / 3 > 2 ? len / 3 : 2;
    buf[0] = '\0';
    for (int i = 0; i < mxi_n_keys; i++) {
        if (mxi_key_parent(i) != section || (json && (mxi_keys[i].flags & MXI_FLAG_YAML_ONLY))) continue;
        const char *names[2] = {mxi_key_name(i), mxi_keys[i].alias};
        for (int a = 0; a < 2; a++) {
            if (!names[a]) continue;
            size_t d = mxi_edit_distance(key, len, names[a]);
            if (len >= 4 && strlen(key) == len && strstr(names[a], key)) d = 1;
            if (d <= best_d && !(best && d == best_d)) best_d = d, best = names[a];
        }
    }
    if (best) {
        snprintf(buf, size, "; did you mean '%s'?", best);
        return buf;
    }
    if (strlen(key) != len || json) return buf;
    for (int i = 0; i < mxi_n_keys; i++) {
        const mxi_key_def *k = &mxi_keys[i];
        if (!(k->flags & MXI_FLAG_HIDDEN) && k->type != MXI_KEY_QPLAN && strcmp(mxi_key_name(i), key) == 0) {
            snprintf(buf, size, "; did you mean %s?", k->path);
            break;
        }
    }
    return buf;
}

bool mxi_key_hf_ignored(const char *name) {
    for (const char *const *p = hf_ignored; *p; p++)
        if (!strcmp(*p, name)) return true;
    return false;
}

const char *mxi_key_model_type(mx_model_type type) { return model_types[type].text; }
