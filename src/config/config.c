/* The training configuration (SPEC §1): the whole YAML file, in MindSpeed MM's section layout,
 * with the model given inline under Hugging Face key names and/or read from a checkpoint's
 * config.json (model.model_name_or_path).
 *
 * Every key of the file is described once, in the table `keys` below: its dotted path, type,
 * range and where it is stored. Loading runs in phases so that a value is judged only once
 * it is known which value wins and for which model type:
 *   1. collect: walk the YAML mappings against the table (unknown keys, duplicates, key +
 *      alias), then config.json's keys for those the YAML model section does not give;
 *   2. model_type, then the per-type defaults (Hugging Face's);
 *   3. convert every collected value, in file order (types and ranges);
 *   4. required keys, derived defaults, and checks across keys.
 * The first error stops the load with one line in diag, and nothing is returned. */
#include "mxtrain/config.h"

#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "config/value.h"
#include "core/diag.h"
#include "core/file.h"
#include "core/text.h"
#include "mxtrain/tokens.h"
#include "plan/plan_yaml.h"

/* ---- The keys ---------------------------------------------------------------------------- */

typedef enum {
    T_SECTION,      /* a mapping of further keys */
    T_QPLAN,        /* training.quantization_plan: handed to the plan loader */
    T_HFDIR,        /* model.model_name_or_path */
    T_INT,          /* int, lo..hi */
    T_SEED,         /* uint64_t, 0..2^63-1 */
    T_F32,          /* float, lo..hi (open ends by flags) */
    T_F64,          /* double, lo..hi */
    T_BOOL,         /* bool */
    T_STR,          /* char *: a non-empty path */
    T_PATHS,        /* char ** + int count: a path or glob, or a list of them */
    T_CHOICE,       /* an enum stored as int, from choices */
    T_PATTERNS,     /* mx_plan_pattern * + int count */
    T_LAYERS,       /* model.mlp_only_layers: bool[MX_MAX_LAYERS] */
    T_FSDP_SIZE,    /* a group size: a positive int, or `auto` (stored as 0) */
    /* Hugging Face keys that only have one value mxtrain can honour; nothing is stored. */
    T_MUST_SILU,    /* hidden_act */
    T_MUST_ZERO,    /* attention_dropout */
    T_MUST_FALSE,   /* use_sliding_window, mlp_bias */
    T_ROPE_SCALING, /* null, or {rope_type: default} */
    T_ROPE_PARAMS,  /* {rope_type: default, rope_theta: X}: transformers 5's spelling of rope_theta */
    T_LAYER_TYPES,  /* a list of 'full_attention' */
} key_type;

enum {
    F_REQUIRED = 1 << 0,  /* no default: missing is an error */
    F_NULLABLE = 1 << 1,  /* null means "the default" */
    F_MOE = 1 << 2,       /* only for model_type qwen3_moe */
    F_LO_OPEN = 1 << 3,   /* value > lo rather than >= lo */
    F_HI_OPEN = 1 << 4,   /* value < hi rather than <= hi */
    F_HIDDEN = 1 << 5,    /* accepted but not a setting: not listed, no value to print */
    F_YAML_ONLY = 1 << 6, /* not a config.json key */
};

typedef struct {
    const char *text;
    int value;
} choice;

typedef struct {
    const char *path;      /* dotted path; the last component is the key */
    const char *alias;     /* another accepted spelling of the key, or NULL */
    key_type type;
    size_t off;            /* offset of the field in mx_config */
    size_t count_off;      /* T_PATHS, T_PATTERNS: offset of the int holding the count */
    size_t weights_off;    /* T_PATHS: offset of the double * of a blend's weights */
    double lo, hi;         /* range of T_INT, T_F32, T_F64 */
    unsigned flags;
    const choice *choices; /* T_CHOICE, NULL-terminated; aliases map to the same value */
    const char *allowed;   /* the "(allowed: ...)" text, when not derived from the type */
} key_def;

static const choice model_types[] = {
    {"llama", MX_MODEL_LLAMA}, {"qwen3", MX_MODEL_QWEN3}, {"qwen3_moe", MX_MODEL_QWEN3_MOE}, {NULL, 0}};
static const choice dtypes[] = {
    {"bf16", MX_DTYPE_BF16}, {"bfloat16", MX_DTYPE_BF16}, {"fp32", MX_DTYPE_FP32}, {"float32", MX_DTYPE_FP32},
    {NULL, 0}};
static const choice reduce_dtypes[] = {
    {"bf16", MX_DTYPE_BF16}, {"bfloat16", MX_DTYPE_BF16}, {"fp32", MX_DTYPE_FP32}, {"float32", MX_DTYPE_FP32},
    {"fp64", MX_DTYPE_FP64}, {"float64", MX_DTYPE_FP64}, {NULL, 0}};
static const choice ep_dispatchers[] = {{"alltoall", 0}, {NULL, 0}};
static const choice ep_dispatch_dtypes[] = {
    {"auto", MX_EP_DISPATCH_AUTO}, {"fp32", MX_EP_DISPATCH_FP32}, {"float32", MX_EP_DISPATCH_FP32},
    {"bf16", MX_EP_DISPATCH_BF16}, {"bfloat16", MX_EP_DISPATCH_BF16}, {"mxfp8", MX_EP_DISPATCH_MXFP8}, {NULL, 0}};
static const choice decay_styles[] = {
    {"constant", MX_LR_CONSTANT}, {"linear", MX_LR_LINEAR}, {"cosine", MX_LR_COSINE}, {"WSD", MX_LR_WSD},
    {"wsd", MX_LR_WSD}, {NULL, 0}};
static const choice wsd_styles[] = {{"exponential", MX_WSD_EXPONENTIAL}, {"linear", MX_WSD_LINEAR},
                                    {"cosine", MX_WSD_COSINE}, {"minus_sqrt", MX_WSD_MINUS_SQRT}, {NULL, 0}};

#define OFF(member) offsetof(mx_config, member)
#define NOWHERE ((size_t)-1)
#define IMAX ((double)INT_MAX)

#define SECTION(p, fl, allow) {.path = p, .type = T_SECTION, .off = NOWHERE, .flags = fl, .allowed = allow}
#define INT(p, m, l, h, fl) {.path = p, .type = T_INT, .off = OFF(m), .lo = l, .hi = h, .flags = fl}
#define F32(p, m, l, h, fl) {.path = p, .type = T_F32, .off = OFF(m), .lo = l, .hi = h, .flags = fl}
#define F64(p, m, l, h, fl) {.path = p, .type = T_F64, .off = OFF(m), .lo = l, .hi = h, .flags = fl}
#define BOOL(p, m, fl) {.path = p, .type = T_BOOL, .off = OFF(m), .flags = fl}
#define STR(p, m) {.path = p, .type = T_STR, .off = OFF(m), .flags = F_NULLABLE}
#define CHOICE(p, m, c, fl) {.path = p, .type = T_CHOICE, .off = OFF(m), .flags = fl, .choices = c}
#define FIXED(p, t, fl) {.path = p, .type = t, .off = NOWHERE, .flags = F_HIDDEN | (fl)}

static const key_def keys[] = {
    SECTION("model", F_REQUIRED, "a mapping of Hugging Face model keys (model_type, hidden_size, ...), "
                                 "and/or model_name_or_path"),
    {.path = "model.model_name_or_path", .type = T_HFDIR, .off = OFF(model_name_or_path), .flags = F_YAML_ONLY,
     .allowed = "a local directory holding a Hugging Face config.json, or the config.json itself; nothing is "
                "downloaded"},
    CHOICE("model.model_type", model.type, model_types, F_REQUIRED),
    INT("model.vocab_size", model.vocab_size, 1, IMAX, F_REQUIRED),
    INT("model.hidden_size", model.hidden_size, 1, IMAX, F_REQUIRED),
    INT("model.intermediate_size", model.intermediate_size, 1, IMAX, F_REQUIRED),
    INT("model.num_hidden_layers", model.num_hidden_layers, 1, MX_MAX_LAYERS, F_REQUIRED),
    INT("model.num_attention_heads", model.num_attention_heads, 1, IMAX, F_REQUIRED),
    INT("model.num_key_value_heads", model.num_key_value_heads, 1, IMAX, F_NULLABLE),
    INT("model.head_dim", model.head_dim, 1, IMAX, F_NULLABLE),
    F32("model.rms_norm_eps", model.rms_norm_eps, 0, INFINITY, F_LO_OPEN),
    F32("model.rope_theta", model.rope_theta, 0, INFINITY, F_LO_OPEN),
    INT("model.max_position_embeddings", model.max_position_embeddings, 1, IMAX, 0),
    BOOL("model.tie_word_embeddings", model.tie_word_embeddings, 0),
    BOOL("model.attention_bias", model.attention_bias, 0),
    F32("model.initializer_range", model.initializer_range, 0, INFINITY, F_LO_OPEN),
    {.path = "model.num_experts", .alias = "num_local_experts", .type = T_INT, .off = OFF(model.num_experts),
     .lo = 1, .hi = IMAX, .flags = F_MOE},
    INT("model.num_experts_per_tok", model.num_experts_per_tok, 1, IMAX, F_MOE),
    INT("model.moe_intermediate_size", model.moe_intermediate_size, 1, IMAX, F_MOE),
    BOOL("model.norm_topk_prob", model.norm_topk_prob, F_MOE),
    INT("model.decoder_sparse_step", model.decoder_sparse_step, 1, IMAX, F_MOE),
    {.path = "model.mlp_only_layers", .type = T_LAYERS, .off = OFF(model.mlp_only_layers),
     .flags = F_MOE | F_NULLABLE, .allowed = "a list of layer indices from 0 to num_hidden_layers - 1"},
    BOOL("model.output_router_logits", model.output_router_logits, F_MOE),
    F32("model.router_aux_loss_coef", model.router_aux_loss_coef, 0, INFINITY, F_MOE),
    FIXED("model.hidden_act", T_MUST_SILU, 0),
    FIXED("model.attention_dropout", T_MUST_ZERO, 0),
    FIXED("model.use_sliding_window", T_MUST_FALSE, 0),
    FIXED("model.mlp_bias", T_MUST_FALSE, 0),
    FIXED("model.rope_scaling", T_ROPE_SCALING, F_NULLABLE),
    FIXED("model.rope_parameters", T_ROPE_PARAMS, F_NULLABLE),
    FIXED("model.layer_types", T_LAYER_TYPES, F_NULLABLE),

    SECTION("data", F_REQUIRED, "a mapping with keys data_path, seq_length, val_data_path, shuffle"),
    {.path = "data.data_path", .type = T_PATHS, .off = OFF(data.data_path), .count_off = OFF(data.n_data_path),
     .weights_off = OFF(data.data_weights), .flags = F_REQUIRED,
     .allowed = "a file or glob pattern of llm.c .bin shards, a list of them, or a blend [weight, pattern, weight, "
                "pattern, ...]"},
    {.path = "data.val_data_path", .type = T_PATHS, .off = OFF(data.val_data_path),
     .count_off = OFF(data.n_val_data_path), .weights_off = OFF(data.val_data_weights), .flags = F_NULLABLE,
     .allowed = "a file or glob pattern of llm.c .bin shards, a list of them, a blend [weight, pattern, ...], or "
                "null"},
    INT("data.seq_length", data.seq_length, 1, IMAX, F_REQUIRED),
    BOOL("data.shuffle", data.shuffle, 0),

    SECTION("parallel", 0, "a mapping with keys data_parallel_size, fully_shard_parallel_size, expert_parallel_size, "
                         "expert_fully_shard_parallel_size, expert_data_parallel_size, ep_plan, fsdp_plan, timeout_s"),
    {.path = "parallel.data_parallel_size", .type = T_FSDP_SIZE, .off = OFF(parallel.data_parallel_size),
     .allowed = "a positive integer, or auto: the MPI ranks / fully_shard_parallel_size"},
    {.path = "parallel.fully_shard_parallel_size", .type = T_FSDP_SIZE, .off = OFF(parallel.fully_shard_parallel_size),
     .allowed = "a positive integer, or auto: the MPI ranks / data_parallel_size"},
    INT("parallel.expert_parallel_size", parallel.expert_parallel_size, 1, 4096, 0),
    {.path = "parallel.expert_fully_shard_parallel_size", .type = T_FSDP_SIZE,
     .off = OFF(parallel.expert_fully_shard_parallel_size),
     .allowed = "a positive integer, or auto: the MPI ranks / (expert_parallel_size x expert_data_parallel_size)"},
    {.path = "parallel.expert_data_parallel_size", .type = T_FSDP_SIZE, .off = OFF(parallel.expert_data_parallel_size),
     .allowed = "a positive integer, or auto: the MPI ranks / (expert_parallel_size x expert_fully_shard_parallel_size)"},
    SECTION("parallel.ep_plan", 0, "a mapping with keys apply_modules, dispatcher, dispatch_dtype, overlap"),
    {.path = "parallel.ep_plan.apply_modules", .type = T_PATTERNS, .off = OFF(parallel.ep_modules),
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
    F64("parallel.timeout_s", parallel.timeout_s, 0, INFINITY, F_LO_OPEN),

    SECTION("features", 0, "a mapping with keys recompute, recompute_plan"),
    BOOL("features.recompute", features.recompute, 0),
    SECTION("features.recompute_plan", 0, "a mapping with key apply_modules"),
    {.path = "features.recompute_plan.apply_modules", .type = T_PATTERNS, .off = OFF(features.recompute_modules),
     .count_off = OFF(features.n_recompute_modules),
     .allowed = "a list of module patterns such as ['model.layers.{*}'], or one pattern"},

    SECTION("training", F_REQUIRED, "a mapping with keys micro_batch_size, train_iters, lr, ... (see docs/config.md)"),
    INT("training.micro_batch_size", training.micro_batch_size, 1, IMAX, F_REQUIRED),
    INT("training.gradient_accumulation_steps", training.gradient_accumulation_steps, 1, IMAX, 0),
    INT("training.global_batch_size", training.global_batch_size, 1, IMAX, 0),
    {.path = "training.seed", .type = T_SEED, .off = OFF(training.seed), .allowed = "an integer from 0 to 2^63-1"},
    F64("training.lr", training.lr, 0, INFINITY, F_REQUIRED | F_LO_OPEN),
    F64("training.min_lr", training.min_lr, 0, INFINITY, 0),
    CHOICE("training.lr_decay_style", training.lr_decay_style, decay_styles, 0),
    F64("training.lr_warmup_ratio", training.lr_warmup_ratio, 0, 1, 0),
    INT("training.lr_warmup_iters", training.lr_warmup_iters, 0, IMAX, 0),
    INT("training.lr_decay_iters", training.lr_decay_iters, 1, IMAX, 0),
    CHOICE("training.lr_wsd_decay_style", training.lr_wsd_decay_style, wsd_styles, 0),
    INT("training.lr_wsd_decay_iters", training.lr_wsd_decay_iters, 1, IMAX, 0),
    F64("training.weight_decay", training.weight_decay, 0, INFINITY, 0),
    F64("training.moe_z_loss_coeff", training.moe_z_loss_coeff, 0, INFINITY, F_MOE),
    F64("training.adam_beta1", training.adam_beta1, 0, 1, F_HI_OPEN),
    F64("training.adam_beta2", training.adam_beta2, 0, 1, F_HI_OPEN),
    F64("training.adam_eps", training.adam_eps, 0, INFINITY, F_LO_OPEN),
    INT("training.train_iters", training.train_iters, 1, IMAX, F_REQUIRED),
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
    STR("training.load", training.load),
    STR("training.metrics_path", training.metrics_path),
    STR("training.plot_path", training.plot_path),
    {.path = "training.quantization_plan", .type = T_QPLAN, .off = NOWHERE},
};

#define N_KEYS ((int)(sizeof keys / sizeof keys[0]))
_Static_assert(sizeof keys / sizeof keys[0] <= MX_CONFIG_MAX_KEYS, "MX_CONFIG_MAX_KEYS is too small");
_Static_assert(sizeof(mx_model_type) == sizeof(int) && sizeof(mx_dtype) == sizeof(int) &&
                   sizeof(mx_lr_decay) == sizeof(int),
               "choices are stored as int");

/* Keys of Hugging Face config.json files that do not change the model mxtrain builds
 * (bookkeeping, generation and inference settings, PretrainedConfig's generic attributes):
 * accepted there and ignored. Keys whose values could change the model are in `keys`. */
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

static const char *key_name(int id) {
    const char *dot = strrchr(keys[id].path, '.');
    return dot ? dot + 1 : keys[id].path;
}

/* The section holding key id, -1 for a top-level key. */
static int parent_of(int id) {
    const char *dot = strrchr(keys[id].path, '.');
    if (!dot) return -1;
    size_t n = (size_t)(dot - keys[id].path);
    for (int s = 0; s < N_KEYS; s++)
        if (strlen(keys[s].path) == n && strncmp(keys[s].path, keys[id].path, n) == 0) return s;
    return -1;
}

static int find_path(const char *path) {
    for (int i = 0; i < N_KEYS; i++)
        if (strcmp(keys[i].path, path) == 0) return i;
    return -1;
}

/* The child of section named text[0..len) (its name or alias), or -1. */
static int find_child(int section, const char *text, size_t len, bool json) {
    if (strlen(text) != len) return -1; /* a NUL inside the key */
    for (int i = 0; i < N_KEYS; i++) {
        if (parent_of(i) != section || (json && (keys[i].flags & F_YAML_ONLY))) continue;
        if (!strcmp(key_name(i), text) || (keys[i].alias && !strcmp(keys[i].alias, text))) return i;
    }
    return -1;
}

/* "a, b (alias c), ..." for the keys of a section that are settings. */
static const char *allowed_keys(int section, bool json, char *buf, size_t size) {
    size_t o = 0;
    buf[0] = '\0';
    for (int i = 0; i < N_KEYS && o < size; i++) {
        if (parent_of(i) != section || (keys[i].flags & F_HIDDEN) || (json && (keys[i].flags & F_YAML_ONLY)))
            continue;
        const char *sep = o ? ", " : "";
        int n = keys[i].alias ? snprintf(buf + o, size - o, "%s%s (alias %s)", sep, key_name(i), keys[i].alias)
                              : snprintf(buf + o, size - o, "%s%s", sep, key_name(i));
        if (n < 0) break;
        o += (size_t)n;
    }
    return buf;
}

/* The "(allowed: ...)" text of a key. */
static const char *allowed_text(int id, char *buf, size_t size) {
    const key_def *d = &keys[id];
    if (d->allowed) return d->allowed;
    switch (d->type) {
    case T_INT:
        if (d->hi >= IMAX) snprintf(buf, size, "an integer >= %g", d->lo);
        else snprintf(buf, size, "an integer from %g to %g", d->lo, d->hi);
        break;
    case T_F32:
    case T_F64:
        if (isinf(d->hi)) snprintf(buf, size, "a number %s %g", (d->flags & F_LO_OPEN) ? ">" : ">=", d->lo);
        else if (!(d->flags & (F_LO_OPEN | F_HI_OPEN))) snprintf(buf, size, "a number from %g to %g", d->lo, d->hi);
        else
            snprintf(buf, size, "a number in %c%g, %g%c", (d->flags & F_LO_OPEN) ? '(' : '[', d->lo, d->hi,
                     (d->flags & F_HI_OPEN) ? ')' : ']');
        break;
    case T_BOOL: snprintf(buf, size, "true, false"); break;
    case T_CHOICE: {
        size_t o = 0;
        buf[0] = '\0';
        for (const choice *c = d->choices; c->text && o < size; c++) {
            const choice *first = d->choices;
            while (first->value != c->value) first++;
            int n = first == c ? snprintf(buf + o, size - o, "%s'%s'", o ? ", " : "", c->text)
                               : snprintf(buf + o, size - o, " (alias '%s')", c->text);
            if (n < 0) break;
            o += (size_t)n;
        }
        break;
    }
    case T_MUST_SILU: snprintf(buf, size, "'silu'"); break;
    case T_MUST_ZERO: snprintf(buf, size, "0"); break;
    case T_MUST_FALSE: snprintf(buf, size, "false"); break;
    case T_ROPE_SCALING: snprintf(buf, size, "null, or rope_type 'default'"); break;
    case T_ROPE_PARAMS: snprintf(buf, size, "a mapping with rope_type 'default' and rope_theta"); break;
    case T_LAYER_TYPES: snprintf(buf, size, "a list of 'full_attention'"); break;
    default: snprintf(buf, size, "see docs/config.md"); break;
    }
    return buf;
}

/* ---- The loader ------------------------------------------------------------------------ */

typedef struct {
    bool set;
    mxi_value v;
    const yaml_node_t *key; /* the YAML key node; NULL for a config.json value or an override */
    const char *written;    /* the key as written: its name or its alias */
    bool cli;               /* given on the command line (mx_config_load_with) */
} slot;

typedef struct {
    const char *source;
    mx_diag *diag;
    yaml_document_t *doc;
    json_t *json;           /* model_name_or_path's config.json */
    mx_config *cfg;
    slot slots[N_KEYS];
    int order[N_KEYS];      /* collected keys, in file order (YAML first, then config.json) */
    int n_order;
    double rope_params_theta; /* rope_parameters.rope_theta, NAN when not given */
    const mx_config_override *overrides;
    int n_overrides;
    yaml_document_t *override_docs; /* (n_overrides): each value, parsed */
    int n_override_docs;
} loader;

#define DESC_SIZE (MXI_QUOTE_SIZE + 32)
#define PATH_SIZE 256
#define LIST_SIZE 900

/* The path of a key as the user sees it: config.json keys have no "model." prefix. */
static const char *shown(const char *path, bool json) {
    return (json && strncmp(path, "model.", 6) == 0) ? path + 6 : path;
}

#define ON_COMMAND_LINE (-1)   /* failv's line for an override */

/* Fill diag with "SOURCE:LINE: PATH: message" ("HFCONFIG: PATH: ..." for config.json
 * values, "command line: PATH: ..." for overrides, "SOURCE: PATH: ..." when there is no
 * line) and return code. */
static int failv(const loader *ld, int code, int line, bool json, const char *path, const char *fmt, va_list ap) {
    char msg[sizeof ld->diag->msg];
    vsnprintf(msg, sizeof msg, fmt, ap);
    if (json) return mxi_diag(ld->diag, code, "%s: %s: %s", ld->cfg->hf_config_path, shown(path, true), msg);
    if (line == ON_COMMAND_LINE) return mxi_diag(ld->diag, code, "command line: %s: %s", path, msg);
    if (line > 0) return mxi_diag(ld->diag, code, "%s:%d: %s: %s", ld->source, line, path, msg);
    return mxi_diag(ld->diag, code, "%s: %s: %s", ld->source, path, msg);
}

/* An error about a value, at the value. */
static int fail_value(const loader *ld, int code, mxi_value v, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int fail_value(const loader *ld, int code, mxi_value v, const char *path, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int line = v.y && v.doc != ld->doc ? ON_COMMAND_LINE : mxi_value_line(v);
    int rc = failv(ld, code, line, v.y == NULL, path, fmt, ap);
    va_end(ap);
    return rc;
}

/* An error at a YAML node (a key). */
static int fail_node(const loader *ld, int code, const yaml_node_t *node, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int fail_node(const loader *ld, int code, const yaml_node_t *node, const char *path, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int rc = failv(ld, code, node ? mxi_yaml_line(node) : 0, false, path, fmt, ap);
    va_end(ap);
    return rc;
}

/* The line of the nearest section of key id written in the YAML file, 0 if none. */
static int section_line(const loader *ld, int id) {
    for (int s = parent_of(id); s >= 0; s = parent_of(s))
        if (ld->slots[s].set && ld->slots[s].key) return mxi_yaml_line(ld->slots[s].key);
    return 0;
}

/* An error about the final value of key id, wherever it came from: the key's line, the
 * config.json, or (for a default) the line of its section. */
static int fail_key(const loader *ld, int code, int id, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int fail_key(const loader *ld, int code, int id, const char *fmt, ...) {
    const slot *s = &ld->slots[id];
    int line = s->cli ? ON_COMMAND_LINE : s->set && s->key ? mxi_yaml_line(s->key) : s->set ? 0 : section_line(ld, id);
    va_list ap;
    va_start(ap, fmt);
    int rc = failv(ld, code, line, s->set && !s->key && !s->cli, keys[id].path, fmt, ap);
    va_end(ap);
    return rc;
}

static int out_of_memory(const loader *ld) {
    return mxi_diag(ld->diag, MX_ENOMEM, "%s: out of memory loading the config", ld->source);
}

/* " (line 7)", " (from DIR/config.json)", " (default for qwen3_moe)" or " (default)": where
 * a value quoted in a message about another key came from. */
static const char *origin_note(const loader *ld, int id, char *buf, size_t size) {
    const slot *s = &ld->slots[id];
    if (s->cli) snprintf(buf, size, " (command line)");
    else if (s->set && s->key) snprintf(buf, size, " (line %d)", mxi_yaml_line(s->key));
    else if (s->set) snprintf(buf, size, " (from %s)", ld->cfg->hf_config_path);
    else if (parent_of(id) == find_path("model") && ld->slots[find_path("model.model_type")].set)
        snprintf(buf, size, " (default for %s)", model_types[ld->cfg->model.type].text);
    else snprintf(buf, size, " (default)");
    return buf;
}

/* ---- Phase 1: collect ------------------------------------------------------------------ */


/* "; did you mean 'X'?" for an unknown key: a close key of the same section (a typo or a
 * shortening), else the same key in another section ("did you mean training.lr?"). */
static const char *suggest(int section, const char *key, size_t len, bool json, char *buf, size_t size) {
    const char *best = NULL;
    size_t best_d = len / 3 > 2 ? len / 3 : 2;
    buf[0] = '\0';
    for (int i = 0; i < N_KEYS; i++) {
        if (parent_of(i) != section || (json && (keys[i].flags & F_YAML_ONLY))) continue;
        const char *names[2] = {key_name(i), keys[i].alias};
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
    for (int i = 0; i < N_KEYS; i++) {
        if (!(keys[i].flags & F_HIDDEN) && keys[i].type != T_QPLAN && strcmp(key_name(i), key) == 0) {
            snprintf(buf, size, "; did you mean %s?", keys[i].path);
            break;
        }
    }
    return buf;
}

static void add_slot(loader *ld, int id, mxi_value v, const yaml_node_t *key, const char *written) {
    ld->slots[id] = (slot){true, v, key, written, false};
    ld->order[ld->n_order++] = id;
}

/* Walk a YAML mapping (the root when section is -1) against the table. */
static int collect_yaml(loader *ld, int section, const yaml_node_t *map) {
    char desc[DESC_SIZE], key[MXI_QUOTE_SIZE], path[PATH_SIZE], hint[PATH_SIZE], list[LIST_SIZE];
    const char *where = section >= 0 ? keys[section].path : "the config";
    mxi_value mv = {ld->doc, map, NULL};
    for (size_t i = 0; i < mxi_value_count(mv); i++) {
        mxi_value v;
        const yaml_node_t *k;
        const char *text = mxi_value_pair(mv, i, &v, &k);
        if (!text)
            return fail_node(ld, MX_ECONFIG, k, where, "%s is not a key (allowed: %s)",
                             mxi_yaml_describe(k, desc, sizeof desc), allowed_keys(section, false, list, sizeof list));
        size_t len = k->data.scalar.length;
        mxi_quote(key, sizeof key, text, len);
        snprintf(path, sizeof path, "%s%s%s", section >= 0 ? keys[section].path : "", section >= 0 ? "." : "", key);
        int id = find_child(section, text, len, false);
        if (id < 0) {
            if (!strcmp(text, "<<"))
                return fail_node(ld, MX_ECONFIG, k, path, "YAML merge keys are not supported; write the keys out "
                                                          "(allowed: %s)",
                                 allowed_keys(section, false, list, sizeof list));
            return fail_node(ld, MX_ECONFIG, k, path, "unknown key%s (allowed: %s)",
                             suggest(section, text, len, false, hint, sizeof hint),
                             allowed_keys(section, false, list, sizeof list));
        }
        slot *s = &ld->slots[id];
        if (s->set) {
            if (!strcmp(s->written, text))
                return fail_node(ld, MX_ECONFIG, k, path, "duplicate key (first given at line %d)",
                                 mxi_yaml_line(s->key));
            return fail_node(ld, MX_ECONFIG, k, path, "given together with its alias %s (line %d); keep one of them",
                             s->written, mxi_yaml_line(s->key));
        }
        add_slot(ld, id, v, k, text);
        if (keys[id].type == T_SECTION) {
            if (v.y->type != YAML_MAPPING_NODE)
                return fail_value(ld, MX_ECONFIG, v, keys[id].path, "%s is not a mapping (allowed: %s)",
                                  mxi_value_describe(v, desc, sizeof desc), keys[id].allowed);
            int rc = collect_yaml(ld, id, v.y);
            if (rc) return rc;
        }
    }
    return 0;
}

/* The command line's settings over the file's: each key resolved through its sections (an
 * alias too), its value parsed as YAML, the slot taken over whether the file gave it or not. */
static int apply_overrides(loader *ld) {
    char list[LIST_SIZE], hint[PATH_SIZE], part[PATH_SIZE], key[MXI_QUOTE_SIZE], shown_part[MXI_QUOTE_SIZE];
    ld->override_docs = ld->n_overrides ? calloc((size_t)ld->n_overrides, sizeof *ld->override_docs) : NULL;
    if (ld->n_overrides && !ld->override_docs) return out_of_memory(ld);
    for (int i = 0; i < ld->n_overrides; i++) {
        const char *name = ld->overrides[i].key ? ld->overrides[i].key : "", *value = ld->overrides[i].value;
        mxi_quote(key, sizeof key, name, strlen(name));   // as messages show it: escaped
        int id = -1, section = -1;
        for (const char *p = name;;) {   // walk the dotted name: sections, then the setting
            size_t len = strcspn(p, ".");
            snprintf(part, sizeof part, "%.*s", (int)len, p);
            id = find_child(section, part, len, false);
            if (id < 0)
                return mxi_diag(ld->diag, MX_ECONFIG, "command line: --%s: unknown %s '%s'%s (allowed: %s)", key,
                                section < 0 ? "section" : "key", mxi_quote(shown_part, sizeof shown_part, part,
                                strlen(part)), suggest(section, part, len, false, hint, sizeof hint),
                                allowed_keys(section, false, list, sizeof list));
            if (keys[id].type == T_QPLAN)
                return mxi_diag(ld->diag, MX_ECONFIG, "command line: --%s: the quantization plan is set in the config "
                                "file only (allowed: the settings of docs/config.md outside training.quantization_plan)",
                                key);
            if (!p[len]) break;
            if (keys[id].type != T_SECTION)
                return mxi_diag(ld->diag, MX_ECONFIG, "command line: --%s: %s is a setting, not a section (allowed: "
                                "--%s VALUE)", key, keys[id].path, keys[id].path);
            section = id;
            p += len + 1;
        }
        if (keys[id].type == T_SECTION)
            return mxi_diag(ld->diag, MX_ECONFIG, "command line: --%s: is a section (allowed: one of its settings: %s)",
                            key, allowed_keys(id, false, list, sizeof list));
        slot *s = &ld->slots[id];
        if (s->cli)
            return mxi_diag(ld->diag, MX_ECONFIG, "command line: --%s: %s is given twice (allowed: once)", key,
                            keys[id].path);
        if (!value || !*value)
            return mxi_diag(ld->diag, MX_ECONFIG, "command line: --%s: no value (allowed: --%s VALUE, or --%s=VALUE; "
                            "null for the default where docs/config.md allows it)", key, key, key);
        yaml_document_t *doc = &ld->override_docs[i];
        char source[PATH_SIZE];
        snprintf(source, sizeof source, "command line: --%s", key);
        int rc = mxi_yaml_load_one(value, strlen(value), source, doc, ld->diag);
        if (rc) return rc;
        ld->n_override_docs = i + 1;
        bool was_set = s->set;
        *s = (slot){true, {doc, yaml_document_get_root_node(doc), NULL}, NULL, key_name(id), true};
        if (!was_set) ld->order[ld->n_order++] = id;
    }
    return MX_OK;
}

static bool hf_is_ignored(const char *name) {
    for (const char *const *p = hf_ignored; *p; p++)
        if (!strcmp(*p, name)) return true;
    return false;
}

/* config.json's keys, for every model key the YAML model section does not give. */
static int collect_json(loader *ld, int model) {
    char desc[DESC_SIZE], key[MXI_QUOTE_SIZE], hint[PATH_SIZE], list[LIST_SIZE];
    mxi_value root = {NULL, NULL, ld->json};
    if (!json_is_object(ld->json))
        return mxi_diag(ld->diag, MX_ECONFIG, "%s: the file holds %s, not a JSON object of model keys",
                        ld->cfg->hf_config_path, mxi_value_describe(root, desc, sizeof desc));
    const char *name;
    json_t *value;
    json_object_foreach(ld->json, name, value) {
        if (hf_is_ignored(name)) continue;
        mxi_quote(key, sizeof key, name, strlen(name));
        int id = find_child(model, name, strlen(name), true);
        if (id < 0)
            return mxi_diag(ld->diag, MX_ECONFIG, "%s: %s: unknown key%s (allowed: %s; and Hugging Face bookkeeping "
                                                  "keys such as architectures, torch_dtype, bos_token_id, which are "
                                                  "ignored)",
                            ld->cfg->hf_config_path, key, suggest(model, name, strlen(name), true, hint, sizeof hint),
                            allowed_keys(model, true, list, sizeof list));
        slot *s = &ld->slots[id];
        if (s->set && s->key) continue; /* the YAML model section overrides config.json */
        if (s->set) {
            if (json_equal(s->v.j, value)) continue;
            return mxi_diag(ld->diag, MX_ECONFIG, "%s: %s: given together with its alias %s, with another value; "
                                                  "keep one of them",
                            ld->cfg->hf_config_path, key, s->written);
        }
        add_slot(ld, id, (mxi_value){NULL, NULL, value}, NULL, name);
    }
    return 0;
}

/* model.model_name_or_path: find and read the config.json. */
static int load_hf_config(loader *ld) {
    char desc[DESC_SIZE];
    int id = find_path("model.model_name_or_path");
    const slot *s = &ld->slots[id];
    if (!s->set) return 0;
    const char *path = mxi_value_str(s->v);
    if (!path || !*path)
        return fail_value(ld, MX_ECONFIG, s->v, keys[id].path, "%s is not a path (allowed: %s)",
                          mxi_value_describe(s->v, desc, sizeof desc), keys[id].allowed);
    mx_config *cfg = ld->cfg;
    cfg->model_name_or_path = mxi_strndup(path, strlen(path));
    if (!cfg->model_name_or_path) return out_of_memory(ld);
    ld->cfg->origins[id] = s->cli ? (mx_origin){MX_ORIGIN_COMMAND_LINE, 0} : (mx_origin){MX_ORIGIN_YAML, mxi_yaml_line(s->key)};
    struct stat st;
    bool dir = stat(path, &st) == 0 && S_ISDIR(st.st_mode);
    size_t n = strlen(path);
    cfg->hf_config_path = malloc(n + sizeof "/config.json");
    if (!cfg->hf_config_path) return out_of_memory(ld);
    if (dir) snprintf(cfg->hf_config_path, n + sizeof "/config.json", "%s%sconfig.json", path,
                      path[n - 1] != '/' ? "/" : "");
    else snprintf(cfg->hf_config_path, n + sizeof "/config.json", "%s", path);
    char *text;
    size_t len;
    mx_diag sub;
    if (stat(cfg->hf_config_path, &st) != 0) {
        int err = errno;
        return fail_value(ld, MX_EIO, s->v, keys[id].path, "cannot read %s: %s (allowed: %s)", cfg->hf_config_path,
                          strerror(err), keys[id].allowed);
    }
    int rc = mxi_read_input(cfg->hf_config_path, NULL, MXI_MAX_CONFIG_BYTES, &text, &len, &sub);
    if (rc) return fail_value(ld, rc, s->v, keys[id].path, "cannot read %s (allowed: %s)", sub.msg, keys[id].allowed);
    json_error_t jerr;
    ld->json = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    free(text);
    char qe[MXI_QUOTE_SIZE]; /* jansson's text quotes the input, control characters included */
    char from[PATH_SIZE + 16] = "command line";
    if (!s->cli) snprintf(from, sizeof from, "%s:%d", ld->source, mxi_yaml_line(s->key));
    if (!ld->json)
        return mxi_diag(ld->diag, MX_ECONFIG, "%s:%d:%d: invalid JSON: %s (read for model.model_name_or_path, %s)",
                        cfg->hf_config_path, jerr.line, jerr.column,
                        mxi_quote(qe, sizeof qe, jerr.text, strlen(jerr.text)), from);
    return collect_json(ld, parent_of(id));
}

/* ---- Phase 2: defaults ------------------------------------------------------------------- */

static int compile_default_patterns(mx_plan_pattern **list, int *n, const char *text) {
    *list = calloc(1, sizeof **list);
    if (!*list) return MX_ENOMEM;
    *n = 1;
    (*list)->text = mxi_strndup(text, strlen(text));
    if (!(*list)->text || mx_pattern_compile(text, &(*list)->compiled, NULL) != 0) return MX_ENOMEM;
    return 0;
}

/* Everything but the model (whose defaults depend on model_type). */
static int set_defaults(mx_config *cfg) {
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
    cfg->training.gradient_accumulation_steps = 1;
    cfg->training.seed = 1234;
    cfg->training.min_lr = 0.0;
    cfg->training.lr_decay_style = MX_LR_LINEAR; /* Megatron's default */
    cfg->training.lr_warmup_ratio = 0.0;
    cfg->training.weight_decay = 0.0;
    cfg->training.adam_beta1 = 0.9;
    cfg->training.adam_beta2 = 0.95;
    cfg->training.adam_eps = 1e-8;
    cfg->training.clip_grad = 1.0;
    cfg->training.log_interval = 1;
    cfg->training.lr_warmup_iters = -1;
    cfg->training.save_interval = 0;
    cfg->training.save_parallel = true;
    cfg->parallel.ep_overlap = true;
    cfg->training.eval_interval = 0;
    cfg->training.eval_iters = 10;
    if (compile_default_patterns(&cfg->parallel.ep_modules, &cfg->parallel.n_ep_modules, "model.layers.{*}.mlp.experts"))
        return MX_ENOMEM;
    return compile_default_patterns(&cfg->features.recompute_modules, &cfg->features.n_recompute_modules,
                                    "model.layers.{*}");
}

/* Hugging Face's defaults for a model type: the keyword defaults of transformers'
 * LlamaConfig, Qwen3Config and Qwen3MoeConfig. num_key_value_heads and head_dim are derived
 * later (Llama's rule, for every type: see docs/config.md). */
static void set_model_defaults(mx_model_config *m, mx_model_type type) {
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

/* ---- Phase 3: values --------------------------------------------------------------------- */

static void *field(const loader *ld, int id) { return (char *)ld->cfg + keys[id].off; }

static int not_a(const loader *ld, int id, mxi_value v, const char *path, const char *what, bool quoted_fits) {
    char desc[DESC_SIZE], allowed[LIST_SIZE];
    mxi_value_describe(v, desc, sizeof desc);
    if (quoted_fits)
        return fail_value(ld, MX_ECONFIG, v, path, "%s is a quoted string, not %s (allowed: %s, unquoted)", desc, what,
                          allowed_text(id, allowed, sizeof allowed));
    return fail_value(ld, MX_ECONFIG, v, path, "%s is not %s (allowed: %s)", desc, what,
                      allowed_text(id, allowed, sizeof allowed));
}

static int out_of_range(const loader *ld, int id, mxi_value v, const char *path) {
    char text[MXI_QUOTE_SIZE], allowed[LIST_SIZE];
    return fail_value(ld, MX_ECONFIG, v, path, "%s is out of range (allowed: %s)", mxi_value_text(v, text, sizeof text),
                      allowed_text(id, allowed, sizeof allowed));
}

static int get_int(const loader *ld, int id, mxi_value v, const char *path, double lo, double hi, long long *out) {
    int rc = mxi_value_int(v, out);
    if (rc == -1) return not_a(ld, id, v, path, "an integer", mxi_value_quoted_int(v));
    if (rc == -2 || (double)*out < lo || (double)*out > hi) return out_of_range(ld, id, v, path);
    return 0;
}

static int get_number(const loader *ld, int id, mxi_value v, double *out) {
    const key_def *d = &keys[id];
    if (mxi_value_number(v, true, out)) return not_a(ld, id, v, d->path, "a number", mxi_value_quoted_number(v));
    double x = *out;
    bool ok = isfinite(x) && ((d->flags & F_LO_OPEN) ? x > d->lo : x >= d->lo) &&
              ((d->flags & F_HI_OPEN) ? x < d->hi : x <= d->hi);
    /* A float field must keep the value finite, and a positive one positive. */
    if (ok && d->type == T_F32) ok = isfinite((float)x) && !((d->flags & F_LO_OPEN) && (float)x <= (float)d->lo);
    return ok ? 0 : out_of_range(ld, id, v, d->path);
}

static int get_bool(const loader *ld, int id, mxi_value v, const char *path, bool *out) {
    if (mxi_value_kind(v) != MXI_YAML_BOOL) return not_a(ld, id, v, path, "a boolean", mxi_value_quoted_bool(v));
    *out = mxi_value_bool(v);
    return 0;
}

/* A non-empty string without NUL bytes, for paths. */
static const char *get_path(mxi_value v) {
    const char *s = mxi_value_str(v);
    return s && *s ? s : NULL;
}

static void free_strings(char **list, int n) {
    for (int i = 0; i < n; i++) free(list[i]);
    free(list);
}


/* data_path, val_data_path: one path or a list of them (at least one), replacing *list. */
/* A path, a list of paths, or Megatron's blend: a list whose first item is a number,
 * alternating weights (> 0) and paths, each path one dataset. */
static int convert_paths(loader *ld, int id, mxi_value v, char ***list, int *count, double **weights) {
    char desc[DESC_SIZE], path[PATH_SIZE];
    bool seq = mxi_value_kind(v) == MXI_YAML_SEQ;
    int items = seq ? (int)mxi_value_count(v) : 1;
    double first;
    bool blend = seq && items > 0 && !mxi_value_quoted(mxi_value_item(v, 0)) &&
                 mxi_value_number(mxi_value_item(v, 0), true, &first) == 0;
    if (!seq && !get_path(v))
        return fail_value(ld, MX_ECONFIG, v, keys[id].path, "%s is not a path (allowed: %s)",
                          mxi_value_describe(v, desc, sizeof desc), keys[id].allowed);
    if (items == 0) return fail_value(ld, MX_ECONFIG, v, keys[id].path, "an empty list names no data (allowed: %s)",
                                      keys[id].allowed);
    if (blend && items % 2)
        return fail_value(ld, MX_ECONFIG, v, keys[id].path, "a blend of %d items is not weight, path pairs (allowed: "
                          "[weight, pattern, weight, pattern, ...])", items);
    int n = blend ? items / 2 : items;
    if (blend && n > MX_LOADER_MAX_DATASETS)
        return fail_value(ld, MX_ECONFIG, v, keys[id].path, "a blend of %d datasets (allowed: at most %d)", n,
                          MX_LOADER_MAX_DATASETS);
    char **out = calloc((size_t)n, sizeof *out);
    double *w = blend ? calloc((size_t)n, sizeof *w) : NULL;
    if (!out || (blend && !w)) {
        free(out), free(w);
        return out_of_memory(ld);
    }
    int rc = 0;
    for (int i = 0; !rc && i < n; i++) {
        if (blend) {
            mxi_value wv = mxi_value_item(v, (size_t)(2 * i));
            snprintf(path, sizeof path, "%s[%d]", keys[id].path, 2 * i);
            if (mxi_value_quoted(wv) || mxi_value_number(wv, true, &w[i]) || !isfinite(w[i]) || !(w[i] > 0)) {
                rc = fail_value(ld, MX_ECONFIG, wv, path, "%s is not a weight (allowed: a number > 0, each dataset's "
                                "weight before its path)", mxi_value_describe(wv, desc, sizeof desc));
                break;
            }
        }
        int at = blend ? 2 * i + 1 : i;
        mxi_value item = seq ? mxi_value_item(v, (size_t)at) : v;
        const char *text = get_path(item);
        if (!text || (blend && !mxi_value_quoted(item) && mxi_value_number(item, true, &first) == 0)) {
            snprintf(path, sizeof path, "%s[%d]", keys[id].path, at);
            rc = fail_value(ld, MX_ECONFIG, item, path, "%s is not a path (allowed: a file or glob pattern%s)",
                            mxi_value_describe(item, desc, sizeof desc), blend ? " after each weight" : "");
            break;
        }
        if (!(out[i] = mxi_strndup(text, strlen(text)))) rc = out_of_memory(ld);
    }
    if (rc) {
        free_strings(out, n);
        free(w);
        return rc;
    }
    free_strings(*list, *count);
    free(*weights);
    *list = out;
    *count = n;
    *weights = w;
    return 0;
}

/* recompute_plan.apply_modules: patterns (or one), at least one, replacing *list. */
static int convert_patterns(loader *ld, int id, mxi_value v, mx_plan_pattern **list, int *count) {
    char desc[DESC_SIZE], path[PATH_SIZE];
    bool seq = mxi_value_kind(v) == MXI_YAML_SEQ;
    int n = seq ? (int)mxi_value_count(v) : 1;
    if (!seq && !get_path(v))
        return fail_value(ld, MX_ECONFIG, v, keys[id].path, "%s is not a list of patterns (allowed: %s)",
                          mxi_value_describe(v, desc, sizeof desc), keys[id].allowed);
    if (n == 0)
        return fail_value(ld, MX_ECONFIG, v, keys[id].path, "an empty list selects nothing (allowed: %s; list at "
                                                            "least one)",
                          keys[id].allowed);
    mx_plan_pattern *out = calloc((size_t)n, sizeof *out);
    if (!out) return out_of_memory(ld);
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        mxi_value item = seq ? mxi_value_item(v, (size_t)i) : v;
        const char *text = mxi_value_str(item);
        if (seq) snprintf(path, sizeof path, "%s[%d]", keys[id].path, i);
        else snprintf(path, sizeof path, "%s", keys[id].path);
        if (!text) {
            rc = fail_value(ld, MX_ECONFIG, item, path, "%s is not a pattern (allowed: a string such as "
                                                        "'model.layers.{*}')",
                            mxi_value_describe(item, desc, sizeof desc));
            break;
        }
        mx_diag sub;
        rc = mx_pattern_compile(text, &out[i].compiled, &sub);
        if (rc) {
            rc = rc == MX_ENOMEM ? out_of_memory(ld) : fail_value(ld, rc, item, path, "%s", sub.msg);
            break;
        }
        out[i].line = item.doc == ld->doc ? mxi_value_line(item) : 0;   // no line on the command line
        if (!(out[i].text = mxi_strndup(text, strlen(text)))) rc = out_of_memory(ld);
    }
    if (rc) {
        mxi_plan_patterns_free(out, n);
        return rc;
    }
    mxi_plan_patterns_free(*list, *count);
    *list = out;
    *count = n;
    return 0;
}

/* mlp_only_layers: a list of layer indices (checked against num_hidden_layers later). */
static int convert_layers(loader *ld, int id, mxi_value v, bool *layers) {
    char desc[DESC_SIZE], path[PATH_SIZE];
    if (mxi_value_kind(v) != MXI_YAML_SEQ)
        return fail_value(ld, MX_ECONFIG, v, keys[id].path, "%s is not a list (allowed: %s)",
                          mxi_value_describe(v, desc, sizeof desc), keys[id].allowed);
    memset(layers, 0, MX_MAX_LAYERS * sizeof *layers);
    for (size_t i = 0; i < mxi_value_count(v); i++) {
        mxi_value item = mxi_value_item(v, i);
        long long x;
        snprintf(path, sizeof path, "%s[%zu]", keys[id].path, i);
        int rc = get_int(ld, id, item, path, 0, MX_MAX_LAYERS - 1, &x);
        if (rc) return rc;
        layers[x] = true;
    }
    return 0;
}

static int convert_choice(loader *ld, int id, mxi_value v, int *out) {
    char desc[DESC_SIZE], allowed[LIST_SIZE];
    const char *text = mxi_value_str(v);
    for (const choice *c = keys[id].choices; c->text && text; c++) {
        if (!strcmp(c->text, text)) {
            *out = c->value;
            return 0;
        }
    }
    return fail_value(ld, MX_ECONFIG, v, keys[id].path, "%s is not allowed (allowed: %s)",
                      mxi_value_describe(v, desc, sizeof desc), allowed_text(id, allowed, sizeof allowed));
}

/* rope_scaling / rope_parameters: the RoPE variant must be the plain one. sets_theta: the
 * mapping may carry rope_theta (rope_parameters), stored in *theta (NAN when absent). */
static int convert_rope(loader *ld, int id, mxi_value v, bool sets_theta, double *theta) {
    char desc[DESC_SIZE], path[PATH_SIZE], qname[MXI_QUOTE_SIZE];
    *theta = NAN;
    if (mxi_value_kind(v) != MXI_YAML_MAP)
        return fail_value(ld, MX_ECONFIG, v, keys[id].path, "%s cannot be honoured: mxtrain implements plain RoPE "
                                                            "(allowed: %s)",
                          mxi_value_describe(v, desc, sizeof desc),
                          sets_theta ? "a mapping with rope_type 'default' and rope_theta"
                                     : "null, or rope_type 'default'");
    /* The variant first (it says the most), then keys that only other variants have. */
    for (int pass = 0; pass < 2; pass++) {
        for (size_t i = 0; i < mxi_value_count(v); i++) {
            mxi_value item;
            const char *name = mxi_value_pair(v, i, &item, NULL);
            bool is_type = name && (!strcmp(name, "rope_type") || !strcmp(name, "type"));
            snprintf(path, sizeof path, "%s.%s", keys[id].path,
                     name ? mxi_quote(qname, sizeof qname, name, strlen(name)) : "?");
            if (pass == 0) {
                const char *t = mxi_value_str(item);
                if (is_type && (!t || strcmp(t, "default") != 0))
                    return fail_value(ld, MX_ECONFIG, item, path, "%s cannot be honoured: mxtrain implements plain "
                                                                  "RoPE (allowed: 'default')",
                                      mxi_value_describe(item, desc, sizeof desc));
            } else if (name && sets_theta && !strcmp(name, "rope_theta")) {
                if (mxi_value_number(item, true, theta) || !isfinite(*theta) || *theta <= 0 ||
                    !isfinite((float)*theta) || (float)*theta <= 0)
                    return fail_value(ld, MX_ECONFIG, item, path, "%s is not allowed (allowed: a number > 0)",
                                      mxi_value_describe(item, desc, sizeof desc));
            } else if (!is_type) {
                return fail_value(ld, MX_ECONFIG, item, path, "%s cannot be honoured: mxtrain implements plain RoPE "
                                                              "(allowed: rope_type 'default'%s)",
                                  name ? "this key" : "a non-text key", sets_theta ? " and rope_theta" : "");
            }
        }
    }
    return 0;
}

static int convert(loader *ld, int id) {
    const key_def *d = &keys[id];
    slot *s = &ld->slots[id];
    mxi_value v = s->v;
    char desc[DESC_SIZE];
    mx_config *cfg = ld->cfg;
    mx_origin origin = {s->cli ? MX_ORIGIN_COMMAND_LINE : s->key ? MX_ORIGIN_YAML : MX_ORIGIN_HF_CONFIG,
                        s->key ? mxi_yaml_line(s->key) : 0};
    if ((d->flags & F_MOE) && cfg->model.type != MX_MODEL_QWEN3_MOE)
        return fail_key(ld, MX_ECONFIG, id, "given for model_type %s, but it applies only to qwen3_moe (allowed: "
                                            "leave it out, or set model_type: qwen3_moe)",
                        model_types[cfg->model.type].text);
    /* Written as null: the default, and the origin stays "default" as well. */
    if ((d->flags & F_NULLABLE) && mxi_value_kind(v) == MXI_YAML_NULL) return 0;
    int rc = 0;
    long long i;
    double x;
    switch (d->type) {
    case T_SECTION:
    case T_HFDIR: break; /* collected / read already */
    case T_QPLAN:
        /* the plan loader reports its own errors, in the same format */
        rc = mxi_plan_from_node(ld->doc, (yaml_node_t *)v.y, ld->source, &cfg->training.quantization_plan, ld->diag);
        break;
    case T_INT:
        if (!(rc = get_int(ld, id, v, d->path, d->lo, d->hi, &i))) *(int *)field(ld, id) = (int)i;
        break;
    case T_SEED:
        if (!(rc = get_int(ld, id, v, d->path, 0, 9223372036854775807.0, &i)))
            *(uint64_t *)field(ld, id) = (uint64_t)i;
        break;
    case T_F32:
        if (!(rc = get_number(ld, id, v, &x))) *(float *)field(ld, id) = (float)x;
        break;
    case T_F64:
        if (!(rc = get_number(ld, id, v, &x))) *(double *)field(ld, id) = x;
        break;
    case T_BOOL: rc = get_bool(ld, id, v, d->path, (bool *)field(ld, id)); break;
    case T_STR: {
        const char *text = get_path(v);
        if (!text)
            return fail_value(ld, MX_ECONFIG, v, d->path, "%s is not a path (allowed: a file or directory path, or "
                                                          "null)",
                              mxi_value_describe(v, desc, sizeof desc));
        char **dst = (char **)field(ld, id);
        free(*dst);
        if (!(*dst = mxi_strndup(text, strlen(text)))) return out_of_memory(ld);
        break;
    }
    case T_PATHS:
        rc = convert_paths(ld, id, v, (char ***)field(ld, id), (int *)((char *)cfg + d->count_off),
                           (double **)((char *)cfg + d->weights_off));
        break;
    case T_CHOICE: rc = convert_choice(ld, id, v, (int *)field(ld, id)); break;
    case T_PATTERNS:
        rc = convert_patterns(ld, id, v, (mx_plan_pattern **)field(ld, id), (int *)((char *)cfg + d->count_off));
        break;
    case T_LAYERS: rc = convert_layers(ld, id, v, cfg->model.mlp_only_layers); break;
    case T_FSDP_SIZE: {
        const char *text = mxi_value_str(v);
        if (text && !strcmp(text, "auto")) *(int *)field(ld, id) = 0;
        else if (mxi_value_kind(v) == MXI_YAML_INT) {
            if (!(rc = get_int(ld, id, v, d->path, 1, IMAX, &i))) *(int *)field(ld, id) = (int)i;
        } else
            return fail_value(ld, MX_ECONFIG, v, d->path, "%s is not allowed (allowed: %s)",
                              mxi_value_describe(v, desc, sizeof desc), d->allowed);
        break;
    }
    case T_MUST_SILU: {
        const char *text = mxi_value_str(v);
        if (!text || strcmp(text, "silu") != 0)
            return fail_value(ld, MX_ECONFIG, v, d->path, "%s cannot be honoured: mxtrain's MLPs are SwiGLU "
                                                          "(allowed: 'silu')",
                              mxi_value_describe(v, desc, sizeof desc));
        break;
    }
    case T_MUST_ZERO:
        if (mxi_value_number(v, true, &x) || x != 0)
            return fail_value(ld, MX_ECONFIG, v, d->path, "%s cannot be honoured: mxtrain has no attention dropout "
                                                          "(allowed: 0)",
                              mxi_value_describe(v, desc, sizeof desc));
        break;
    case T_MUST_FALSE: {
        bool b;
        if ((rc = get_bool(ld, id, v, d->path, &b))) return rc;
        if (b)
            return fail_value(ld, MX_ECONFIG, v, d->path, "%s cannot be honoured: mxtrain has %s (allowed: false)",
                              mxi_value_describe(v, desc, sizeof desc),
                              !strcmp(key_name(id), "mlp_bias") ? "no MLP biases" : "full causal attention only");
        break;
    }
    case T_ROPE_SCALING: rc = convert_rope(ld, id, v, false, &x); break;
    case T_ROPE_PARAMS: rc = convert_rope(ld, id, v, true, &ld->rope_params_theta); break;
    case T_LAYER_TYPES: {
        char path[PATH_SIZE];
        if (mxi_value_kind(v) != MXI_YAML_SEQ)
            return fail_value(ld, MX_ECONFIG, v, d->path, "%s is not a list (allowed: a list of 'full_attention')",
                              mxi_value_describe(v, desc, sizeof desc));
        for (size_t k = 0; k < mxi_value_count(v); k++) {
            mxi_value item = mxi_value_item(v, k);
            const char *t = mxi_value_str(item);
            snprintf(path, sizeof path, "%s[%zu]", d->path, k);
            if (!t || strcmp(t, "full_attention") != 0)
                return fail_value(ld, MX_ECONFIG, item, path, "%s cannot be honoured: mxtrain has full causal "
                                                              "attention only (allowed: 'full_attention')",
                                  mxi_value_describe(item, desc, sizeof desc));
        }
        break;
    }
    }
    if (!rc) cfg->origins[id] = origin;
    return rc;
}

/* ---- Phase 4: required keys, derived values, checks across keys -------------------------- */

static int check_required(loader *ld) {
    char allowed[LIST_SIZE];
    int hf = find_path("model.model_name_or_path");
    for (int id = 0; id < N_KEYS; id++) {
        if (!(keys[id].flags & F_REQUIRED) || ld->slots[id].set) continue;
        int parent = parent_of(id);
        if (parent >= 0 && !ld->slots[parent].set) continue; /* reported for the section */
        if (keys[id].type == T_SECTION)
            return mxi_diag(ld->diag, MX_ECONFIG, "%s: %s: required section missing (allowed: %s)", ld->source,
                            keys[id].path, keys[id].allowed);
        if (parent == find_path("model") && ld->slots[hf].set)
            return fail_key(ld, MX_ECONFIG, id, "required key missing, both here and in %s (allowed: %s)",
                            ld->cfg->hf_config_path, allowed_text(id, allowed, sizeof allowed));
        return fail_key(ld, MX_ECONFIG, id, "required key missing (allowed: %s)",
                        allowed_text(id, allowed, sizeof allowed));
    }
    return 0;
}

/* rope_parameters.rope_theta (transformers 5's spelling) is rope_theta. Given both, the
 * YAML file's wins over config.json's; from the same file they must agree. */
static int resolve_rope_theta(loader *ld) {
    mx_model_config *m = &ld->cfg->model;
    char note[PATH_SIZE];
    int rp = find_path("model.rope_parameters"), rt = find_path("model.rope_theta");
    if (isnan(ld->rope_params_theta)) return 0;
    const slot *p = &ld->slots[rp], *t = &ld->slots[rt];
    bool p_yaml = p->key != NULL, t_yaml = t->key != NULL;
    if (t->set && t_yaml == p_yaml && (float)ld->rope_params_theta != m->rope_theta) {
        char a[64], b[64];
        return fail_key(ld, MX_ECONFIG, rp, "its rope_theta %s disagrees with rope_theta %s%s (allowed: the same "
                                            "value, or only one of them)",
                        mxi_format_double(ld->rope_params_theta, a, sizeof a),
                        mxi_format_float(m->rope_theta, b, sizeof b),
                        origin_note(ld, rt, note, sizeof note));
    }
    if (!t->set || (p_yaml && !t_yaml)) {
        m->rope_theta = (float)ld->rope_params_theta;
        ld->cfg->origins[rt] = ld->cfg->origins[rp];
    }
    return 0;
}

static int check_model(loader *ld) {
    mx_model_config *m = &ld->cfg->model;
    char note[PATH_SIZE], path[PATH_SIZE];
    int nh = find_path("model.num_attention_heads"), nkv = find_path("model.num_key_value_heads"),
        hd = find_path("model.head_dim"), e = find_path("model.num_experts"),
        k = find_path("model.num_experts_per_tok"), mlp = find_path("model.mlp_only_layers");
    /* Llama's rule: num_key_value_heads defaults to num_attention_heads, head_dim to
     * hidden_size / num_attention_heads. */
    if (!ld->cfg->origins[nkv].kind) m->num_key_value_heads = m->num_attention_heads;
    if (!ld->cfg->origins[hd].kind) {
        if (m->hidden_size % m->num_attention_heads != 0)
            return fail_key(ld, MX_ECONFIG, nh, "%d does not divide hidden_size %d, and head_dim is not given "
                                                "(allowed: a divisor of hidden_size, or give head_dim)",
                            m->num_attention_heads, m->hidden_size);
        m->head_dim = m->hidden_size / m->num_attention_heads;
    }
    /* Rotary embeddings turn pairs of channels: a head needs an even number of them. */
    if (m->head_dim % 2 != 0) {
        if (ld->cfg->origins[hd].kind)
            return fail_key(ld, MX_ECONFIG, hd, "%d is odd (allowed: an even number: rotary embeddings rotate pairs "
                                                "of channels)",
                            m->head_dim);
        return fail_key(ld, MX_ECONFIG, nh, "%d gives head_dim %d = hidden_size %d / %d, which is odd (allowed: an "
                                            "even head_dim: rotary embeddings rotate pairs of channels; give head_dim)",
                        m->num_attention_heads, m->head_dim, m->hidden_size, m->num_attention_heads);
    }
    if (m->num_attention_heads % m->num_key_value_heads != 0)
        return fail_key(ld, MX_ECONFIG, nkv, "%d does not divide num_attention_heads %d%s (allowed: a divisor of "
                                             "num_attention_heads)",
                        m->num_key_value_heads, m->num_attention_heads, origin_note(ld, nh, note, sizeof note));
    if (m->type == MX_MODEL_QWEN3_MOE && m->num_experts_per_tok > m->num_experts) {
        if (ld->slots[k].set)
            return fail_key(ld, MX_ECONFIG, k, "%d is more than num_experts %d%s (allowed: 1 to num_experts)",
                            m->num_experts_per_tok, m->num_experts, origin_note(ld, e, note, sizeof note));
        return fail_key(ld, MX_ECONFIG, e, "%d is less than num_experts_per_tok %d%s (allowed: at least "
                                           "num_experts_per_tok)",
                        m->num_experts, m->num_experts_per_tok, origin_note(ld, k, note, sizeof note));
    }
    /* mlp_only_layers entries must name layers that exist. */
    const slot *s = &ld->slots[mlp];
    if (s->set && mxi_value_kind(s->v) == MXI_YAML_SEQ) {
        for (size_t i = 0; i < mxi_value_count(s->v); i++) {
            mxi_value item = mxi_value_item(s->v, i);
            long long x = 0;
            mxi_value_int(item, &x);
            snprintf(path, sizeof path, "%s[%zu]", keys[mlp].path, i);
            if (x >= m->num_hidden_layers)
                return fail_value(ld, MX_ECONFIG, item, path, "%lld is not a layer (allowed: 0 to %d: "
                                                              "num_hidden_layers is %d)",
                                  x, m->num_hidden_layers - 1, m->num_hidden_layers);
        }
    }
    return 0;
}

/* The model layer's own limits (mx_model_config_check: sizes it can allocate, ...), so that
 * a model it would refuse is refused here, at the line of the key. Its messages begin with
 * "model.KEY: "; the key's origin replaces that with the usual location. */
static int check_model_limits(loader *ld) {
    mx_diag sub = {{0}};
    int rc = mx_model_config_check(&ld->cfg->model, &sub);
    if (rc == 0) return 0;
    const char *colon = strstr(sub.msg, ": ");
    int id = -1;
    if (colon && (size_t)(colon - sub.msg) < PATH_SIZE) {
        char path[PATH_SIZE];
        memcpy(path, sub.msg, (size_t)(colon - sub.msg));
        path[colon - sub.msg] = '\0';
        id = find_path(path);
    }
    if (id >= 0) return fail_key(ld, rc, id, "%s", colon + 2);
    return mxi_diag(ld->diag, rc, "%s: %s", ld->source, sub.msg);
}

int64_t mx_training_decay_steps(const mx_training_config *tc) {
    return tc->lr_decay_iters > 0 ? tc->lr_decay_iters : tc->train_iters;
}

int64_t mx_training_warmup_steps(const mx_training_config *tc) {
    if (tc->lr_warmup_iters >= 0) return tc->lr_warmup_iters;
    return llround(tc->lr_warmup_ratio * (double)mx_training_decay_steps(tc));
}

/* The learning-rate schedule's keys: each one given does something (docs/config.md). */
static int check_schedule(loader *ld) {
    mx_training_config *tc = &ld->cfg->training;
    int iters = find_path("training.lr_warmup_iters"), ratio = find_path("training.lr_warmup_ratio"),
        style = find_path("training.lr_decay_style"),
        wsd_style = find_path("training.lr_wsd_decay_style"), wsd_iters = find_path("training.lr_wsd_decay_iters");
    char note[PATH_SIZE];
    if (ld->slots[iters].set && ld->slots[ratio].set)
        return fail_key(ld, MX_ECONFIG, iters, "%d is given with training.lr_warmup_ratio%s (allowed: one of the two)",
                        tc->lr_warmup_iters, origin_note(ld, ratio, note, sizeof note));
    int D = (int)mx_training_decay_steps(tc);
    const char *d_name = tc->lr_decay_iters > 0 ? "lr_decay_iters" : "train_iters";
    if (tc->lr_warmup_iters > D)
        return fail_key(ld, MX_ECONFIG, iters, "%d is more than %s %d (allowed: 0 to %d)", tc->lr_warmup_iters, d_name,
                        D, D);
    if (tc->lr_decay_style != MX_LR_WSD) {
        int given = ld->slots[wsd_style].set ? wsd_style : ld->slots[wsd_iters].set ? wsd_iters : -1;
        if (given >= 0)
            return fail_key(ld, MX_ECONFIG, given, "given, but lr_decay_style is not WSD (allowed: leave it out, or set "
                                                   "lr_decay_style: WSD)");
        return MX_OK;
    }
    int W = (int)mx_training_warmup_steps(tc);
    if (!ld->slots[wsd_iters].set)
        return fail_key(ld, MX_ECONFIG, style, "WSD needs training.lr_wsd_decay_iters, the steps of its anneal "
                                               "(allowed: give lr_wsd_decay_iters, or another style)");
    if (tc->lr_wsd_decay_iters > D - W)
        return fail_key(ld, MX_ECONFIG, wsd_iters, "%d is more than the %d steps after warmup (%s %d - %d warmup; "
                        "allowed: 1 to %d)", tc->lr_wsd_decay_iters, D - W, d_name, D, W, D - W);
    return MX_OK;
}

static int check_ep_plan(loader *ld);
static int check_rest(loader *ld) {
    mx_config *cfg = ld->cfg;
    char note[PATH_SIZE];
    int seq = find_path("data.seq_length"), maxpos = find_path("model.max_position_embeddings"),
        min_lr = find_path("training.min_lr"), lr = find_path("training.lr"),
        save_interval = find_path("training.save_interval"), mbs = find_path("training.micro_batch_size");
    if (cfg->data.seq_length > cfg->model.max_position_embeddings)
        return fail_key(ld, MX_ECONFIG, seq, "%d is more than model.max_position_embeddings %d%s (allowed: 1 to %d)",
                        cfg->data.seq_length, cfg->model.max_position_embeddings,
                        origin_note(ld, maxpos, note, sizeof note), cfg->model.max_position_embeddings);
    int64_t tokens = (int64_t)cfg->training.micro_batch_size * cfg->data.seq_length;
    if (tokens > MX_MAX_BATCH_TOKENS)
        return fail_key(ld, MX_ECONFIG, mbs, "%d x data.seq_length %d%s = %lld tokens per micro-batch (allowed: at most "
                                             "%d = 2^24 tokens)",
                        cfg->training.micro_batch_size, cfg->data.seq_length, origin_note(ld, seq, note, sizeof note),
                        (long long)tokens, MX_MAX_BATCH_TOKENS);
    int gbs = find_path("training.global_batch_size"), accum = find_path("training.gradient_accumulation_steps");
    const mx_training_config *tc = &cfg->training;
    long long per = ld->slots[accum].set ? (long long)tc->micro_batch_size * tc->gradient_accumulation_steps
                                         : tc->micro_batch_size;   // what divides it on any number of ranks
    if (tc->global_batch_size && tc->global_batch_size % per) {
        char by[80] = "";
        if (ld->slots[accum].set) snprintf(by, sizeof by, " x gradient_accumulation_steps %d = %lld",
                                           tc->gradient_accumulation_steps, per);
        return fail_key(ld, MX_ECONFIG, gbs, "%d is not a multiple of micro_batch_size %d%s (allowed: a multiple of "
                        "%lld x the ranks)", tc->global_batch_size, tc->micro_batch_size, by, per);
    }
    if (cfg->training.min_lr > cfg->training.lr) {
        char a[64], b[64];
        return fail_key(ld, MX_ECONFIG, min_lr, "%s is more than lr %s%s (allowed: 0 to lr)",
                        mxi_format_double(cfg->training.min_lr, a, sizeof a),
                        mxi_format_double(cfg->training.lr, b, sizeof b), origin_note(ld, lr, note, sizeof note));
    }
    if (cfg->training.save_interval > 0 && !cfg->training.save)
        return fail_key(ld, MX_ECONFIG, save_interval, "%d needs training.save, the checkpoint directory (allowed: 0 "
                                                       "without save, or give save)",
                        cfg->training.save_interval);
    int keep = find_path("training.keep_latest_k");
    if (cfg->training.keep_latest_k > 0 && !cfg->training.save)
        return fail_key(ld, MX_ECONFIG, keep, "%d needs training.save, the checkpoint directory (allowed: 0 without "
                                              "save, or give save)",
                        cfg->training.keep_latest_k);
    int rc = check_schedule(ld);
    if (rc) return rc;
    // evaluation settings without validation data would be ignored: say so instead
    int eval_interval = find_path("training.eval_interval"), eval_iters = find_path("training.eval_iters");
    if (cfg->data.n_val_data_path == 0 && cfg->training.eval_interval > 0)
        return fail_key(ld, MX_ECONFIG, eval_interval, "%d needs data.val_data_path, the validation shards (allowed: "
                        "0 without val_data_path, or give data.val_data_path)", cfg->training.eval_interval);
    if (cfg->data.n_val_data_path == 0 && ld->slots[eval_iters].set)
        return fail_key(ld, MX_ECONFIG, eval_iters, "%d needs data.val_data_path, the validation shards (allowed: "
                        "leave eval_iters out without val_data_path, or give data.val_data_path)",
                        cfg->training.eval_iters);
    int plot_path = find_path("training.plot_path");
    if (cfg->training.plot_path && !cfg->training.metrics_path)
        return fail_key(ld, MX_ECONFIG, plot_path, "'%s' needs training.metrics_path, the metrics it draws (allowed: "
                        "leave plot_path out, or give metrics_path)", cfg->training.plot_path);
    return check_ep_plan(ld);
}

/* parallel.ep_plan: only with EP on an MoE model; every apply_modules pattern selects the
 * experts of an MoE layer (itself or an ancestor, SPEC §3); mxfp8 dispatch needs every
 * selected layer's experts converted by the quantization plan. */
static int check_ep_plan(loader *ld) {
    mx_config *cfg = ld->cfg;
    const mx_parallel_config *pc = &cfg->parallel;
    static const char *const names[] = {"parallel.ep_plan.apply_modules", "parallel.ep_plan.dispatcher",
                                        "parallel.ep_plan.dispatch_dtype", "parallel.ep_plan.overlap",
                                        "parallel.ep_plan"};   // a key it holds first
    int given = -1;
    for (int i = 0; i < 5 && given < 0; i++)
        if (ld->slots[find_path(names[i])].set) given = find_path(names[i]);
    if (given < 0) return 0;
    if (cfg->model.type != MX_MODEL_QWEN3_MOE)
        return fail_key(ld, MX_ECONFIG, given, "given for a dense model (model.model_type is not qwen3_moe; allowed: "
                                               "leave parallel.ep_plan out)");
    if (pc->expert_parallel_size <= 1)
        return fail_key(ld, MX_ECONFIG, given, "given with parallel.expert_parallel_size 1, where no token leaves its "
                                               "rank (allowed: leave parallel.ep_plan out, or set "
                                               "parallel.expert_parallel_size > 1)");
    mx_module *mods = NULL;
    int n = 0;
    if (mx_model_modules(&cfg->model, &mods, &n)) return out_of_memory(ld);
    int rc = 0, apply = find_path("parallel.ep_plan.apply_modules");
    for (int p = 0; p < pc->n_ep_modules && !rc; p++) {
        const mx_plan_pattern *pat = &pc->ep_modules[p];
        int experts = 0, other = -1;
        size_t len = 0;   // of the module the pattern names: other's name or the ancestor matched
        for (int i = 0; i < n; i++) {
            if (mods[i].kind == MX_MODULE_EXPERTS) experts += mx_pattern_match_module(pat->compiled, mods[i].fqn, NULL);
            else if (other < 0 && mx_pattern_match_module(pat->compiled, mods[i].fqn, &len)) other = i;
        }
        if (experts) continue;
        if (other >= 0)
            rc = fail_key(ld, MX_ECONFIG, apply, "'%s' names %.*s, which is not an MoE expert module (allowed: patterns "
                          "selecting the MoE expert modules model.layers.N.mlp.experts, or their ancestors such as "
                          "model.layers.N)", pat->text, (int)len, mods[other].fqn);
        else
            rc = fail_key(ld, MX_ECONFIG, apply, "'%s' matches no module (allowed: patterns selecting the MoE expert "
                          "modules model.layers.N.mlp.experts, or their ancestors such as model.layers.N)", pat->text);
    }
    if (!rc && pc->ep_dispatch_dtype == MX_EP_DISPATCH_MXFP8) {
        mx_selection sel;
        if (mx_plan_select(&cfg->training.quantization_plan, mods, n, &sel)) {
            mx_model_modules_free(mods, n);
            return out_of_memory(ld);
        }
        for (int i = 0; i < n && !rc; i++) {
            if (mods[i].kind != MX_MODULE_EXPERTS || sel.decisions[i].converted) continue;
            bool selected = false;
            for (int p = 0; p < pc->n_ep_modules; p++)
                selected |= mx_pattern_match_module(pc->ep_modules[p].compiled, mods[i].fqn, NULL);
            if (selected)
                rc = fail_key(ld, MX_ECONFIG, find_path("parallel.ep_plan.dispatch_dtype"),
                              "mxfp8 sends the rowwise MXFP8 plane of converted experts' input, but %s is not "
                              "converted by training.quantization_plan (allowed: auto, fp32, bf16; or convert the "
                              "experts with quantize.moe.mx)", mods[i].fqn);
        }
        mx_selection_free(&sel);
    }
    mx_model_modules_free(mods, n);
    return rc;
}

/* ---- The document ----------------------------------------------------------------------- */

static int load_document(loader *ld) {
    char desc[DESC_SIZE];
    mx_config *cfg = ld->cfg;
    if (set_defaults(cfg)) return out_of_memory(ld);
    yaml_node_t *root = yaml_document_get_root_node(ld->doc);
    /* An empty file (only comments or `---`) is a config with nothing in it. */
    if (root && mxi_yaml_kind_of(root) != MXI_YAML_NULL) {
        if (root->type != YAML_MAPPING_NODE)
            return mxi_diag(ld->diag, MX_ECONFIG, "%s:%d: the config is %s, not a mapping of sections (allowed: model, "
                                                  "data, parallel, features, training)",
                            ld->source, mxi_yaml_line(root), mxi_yaml_describe(root, desc, sizeof desc));
        int rc = collect_yaml(ld, -1, root);
        if (rc) return rc;
    }
    int rc = apply_overrides(ld);
    if (rc) return rc;
    rc = load_hf_config(ld);
    if (rc) return rc;
    /* Values are judged for a model type: without one, say what is missing. */
    int type_id = find_path("model.model_type");
    if (!ld->slots[type_id].set) return check_required(ld);
    int type;
    if ((rc = convert_choice(ld, type_id, ld->slots[type_id].v, &type))) return rc;
    set_model_defaults(&cfg->model, (mx_model_type)type);
    for (int i = 0; i < ld->n_order; i++)
        if ((rc = convert(ld, ld->order[i]))) return rc;
    /* No quantization_plan block: the plan's defaults, quantization off. */
    if (!ld->slots[find_path("training.quantization_plan")].set &&
        (rc = mxi_plan_from_node(ld->doc, NULL, ld->source, &cfg->training.quantization_plan, ld->diag)))
        return rc;
    if ((rc = resolve_rope_theta(ld)) || (rc = check_required(ld)) || (rc = check_model(ld)) ||
        (rc = check_model_limits(ld)) || (rc = check_rest(ld)))
        return rc;
    return 0;
}

void mx_config_free(mx_config *config) {
    if (!config) return;
    free(config->source);
    free(config->model_name_or_path);
    free(config->hf_config_path);
    free_strings(config->data.data_path, config->data.n_data_path);
    free_strings(config->data.val_data_path, config->data.n_val_data_path);
    free(config->data.data_weights);
    free(config->data.val_data_weights);
    mxi_plan_patterns_free(config->features.recompute_modules, config->features.n_recompute_modules);
    mxi_plan_patterns_free(config->parallel.ep_modules, config->parallel.n_ep_modules);
    free(config->training.save);
    free(config->training.load);
    free(config->training.metrics_path);
    free(config->training.plot_path);
    mx_plan_free(&config->training.quantization_plan);
    memset(config, 0, sizeof *config);
}

static int load_buffer(const char *data, size_t len, const char *source, const mx_config_override *overrides,
                       int n_overrides, mx_config *out, mx_diag *diag) {
    yaml_document_t doc;
    int rc = mxi_yaml_load_one(data, len, source, &doc, diag);
    if (rc) return rc;
    loader *ld = rc ? NULL : calloc(1, sizeof *ld);
    mx_config *cfg = rc ? NULL : calloc(1, sizeof *cfg);
    if (!rc && (!ld || !cfg)) rc = mxi_diag(diag, MX_ENOMEM, "%s: out of memory loading the config", source);
    if (!rc) {
        cfg->source = mxi_strndup(source, strlen(source));
        *ld = (loader){.source = source, .diag = diag, .doc = &doc, .cfg = cfg, .rope_params_theta = NAN,
                       .overrides = overrides, .n_overrides = n_overrides};
        rc = cfg->source ? load_document(ld) : out_of_memory(ld);
        json_decref(ld->json);
        for (int i = 0; i < ld->n_override_docs; i++) yaml_document_delete(&ld->override_docs[i]);
        free(ld->override_docs);
        if (rc) mx_config_free(cfg);
        else *out = *cfg;
    }
    free(ld);
    free(cfg);
    yaml_document_delete(&doc);
    return rc;
}

int mx_config_load_string(const char *yaml, const char *source_name, mx_config *out, mx_diag *diag) {
    if (out) memset(out, 0, sizeof *out);
    if (!yaml || !out) return mxi_diag(diag, MX_ENULL, "mx_config_load_string: NULL argument");
    return load_buffer(yaml, strlen(yaml), source_name ? source_name : "<string>", NULL, 0, out, diag);
}

int mx_config_load(const char *path, mx_config *out, mx_diag *diag) {
    return mx_config_load_with(path, NULL, 0, out, diag);
}

int mx_config_load_with(const char *path, const mx_config_override *overrides, int n, mx_config *out, mx_diag *diag) {
    if (out) memset(out, 0, sizeof *out);
    if (!path || !out || (n > 0 && !overrides) || n < 0) return mxi_diag(diag, MX_ENULL, "mx_config_load: NULL argument");
    char *data;
    size_t len;
    int rc = mxi_read_input(path, "a YAML config file", MXI_MAX_CONFIG_BYTES, &data, &len, diag);
    if (rc) return rc;
    rc = load_buffer(data, len, path, overrides, n, out, diag);
    free(data);
    return rc;
}

/* ---- Settings by name ------------------------------------------------------------------ */

static bool is_setting(int id) {
    return keys[id].type != T_SECTION && keys[id].type != T_QPLAN && !(keys[id].flags & F_HIDDEN);
}

int mx_config_key_count(void) {
    int n = 0;
    for (int i = 0; i < N_KEYS; i++) n += is_setting(i);
    return n;
}

const char *mx_config_key_name(int index) {
    for (int i = 0; i < N_KEYS && index >= 0; i++)
        if (is_setting(i) && index-- == 0) return keys[i].path;
    return NULL;
}

int mx_config_origin(const mx_config *config, const char *key, mx_origin *out) {
    if (!config || !key || !out) return MX_ENULL;
    int id = find_path(key);
    if (id < 0) return MX_EINVAL;
    *out = config->origins[id];
    return 0;
}

int mx_config_format_origin(const mx_config *config, const char *key, char *buf, size_t size) {
    mx_origin o;
    int rc = mx_config_origin(config, key, &o);
    if (rc) return rc;
    if (!buf && size) return MX_ENULL;
    if (o.kind == MX_ORIGIN_YAML) return snprintf(buf, size, "%s:%d", config->source ? config->source : "", o.line);
    if (o.kind == MX_ORIGIN_HF_CONFIG)
        return snprintf(buf, size, "%s", config->hf_config_path ? config->hf_config_path : "");
    if (o.kind == MX_ORIGIN_COMMAND_LINE) return snprintf(buf, size, "command line");
    return snprintf(buf, size, "default");
}

/* Append to buf at *o, snprintf-style (the total length keeps counting past the end). */
static void append(char *buf, size_t size, size_t *o, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void append(char *buf, size_t size, size_t *o, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(*o < size ? buf + *o : NULL, *o < size ? size - *o : 0, fmt, ap);
    va_end(ap);
    if (n > 0) *o += (size_t)n;
}

/* A YAML single-quoted string ('' for a quote). */
static void append_quoted(char *buf, size_t size, size_t *o, const char *text) {
    append(buf, size, o, "'");
    for (const char *p = text; *p; p++) {
        if (*p == '\'') append(buf, size, o, "''");
        else append(buf, size, o, "%c", *p);
    }
    append(buf, size, o, "'");
}

int mx_config_format_value(const mx_config *config, const char *key, char *buf, size_t size) {
    if (!config || !key || (!buf && size)) return MX_ENULL;
    int id = find_path(key);
    if (id < 0 || !is_setting(id)) return MX_EINVAL;
    if (size) buf[0] = '\0';
    const void *p = (const char *)config + keys[id].off;
    char num[64];
    size_t o = 0;
    switch (keys[id].type) {
    case T_INT: append(buf, size, &o, "%d", *(const int *)p); break;
    case T_SEED: append(buf, size, &o, "%llu", (unsigned long long)*(const uint64_t *)p); break;
    case T_F32: append(buf, size, &o, "%s", mxi_format_float(*(const float *)p, num, sizeof num)); break;
    case T_F64: append(buf, size, &o, "%s", mxi_format_double(*(const double *)p, num, sizeof num)); break;
    case T_BOOL: append(buf, size, &o, "%s", *(const bool *)p ? "true" : "false"); break;
    case T_STR:
    case T_HFDIR: {
        const char *s = *(char *const *)p;
        if (s) append_quoted(buf, size, &o, s);
        else append(buf, size, &o, "null");
        break;
    }
    case T_PATHS: {
        char *const *list = *(char **const *)p;
        int n = *(const int *)((const char *)config + keys[id].count_off);
        const double *w = *(double *const *)((const char *)config + keys[id].weights_off);
        if (!n) {
            append(buf, size, &o, "null");
            break;
        }
        append(buf, size, &o, "[");
        for (int i = 0; i < n; i++) {
            char weight[32];
            if (i) append(buf, size, &o, ", ");
            if (w) append(buf, size, &o, "%s, ", mxi_format_double(w[i], weight, sizeof weight));
            append_quoted(buf, size, &o, list[i]);
        }
        append(buf, size, &o, "]");
        break;
    }
    case T_CHOICE: {
        int v = *(const int *)p;
        for (const choice *c = keys[id].choices; c->text; c++) {
            if (c->value == v) {
                append(buf, size, &o, "%s", c->text);
                break;
            }
        }
        break;
    }
    case T_PATTERNS: {
        const mx_plan_pattern *list = *(mx_plan_pattern *const *)p;
        int n = *(const int *)((const char *)config + keys[id].count_off);
        append(buf, size, &o, "[");
        for (int i = 0; i < n; i++) {
            if (i) append(buf, size, &o, ", ");
            append_quoted(buf, size, &o, list[i].text);
        }
        append(buf, size, &o, "]");
        break;
    }
    case T_LAYERS: {
        const bool *layers = (const bool *)p;
        bool first = true;
        append(buf, size, &o, "[");
        for (int i = 0; i < MX_MAX_LAYERS; i++) {
            if (!layers[i]) continue;
            append(buf, size, &o, first ? "%d" : ", %d", i);
            first = false;
        }
        append(buf, size, &o, "]");
        break;
    }
    case T_FSDP_SIZE:
        if (*(const int *)p) append(buf, size, &o, "%d", *(const int *)p);
        else append(buf, size, &o, "auto");
        break;
    default: return MX_EINVAL;
    }
    return o > INT_MAX ? INT_MAX : (int)o;
}
