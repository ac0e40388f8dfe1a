/* mxtrain — the training configuration (SPEC §1): one YAML file in MindSpeed MM's section
 * layout (`model`, `data`, `parallel`, `features`, `training`), where the model section uses
 * Hugging Face config.json key names inline or points at a checkpoint directory holding a
 * config.json (`model_name_or_path`). docs/config.md is the user reference for every key.
 *
 * Loading checks the whole file: every unknown key (with a "did you mean"), wrong type,
 * out-of-range value, missing required key and inconsistent combination is an error with a
 * one-line message "FILE:LINE: section.key: VALUE <problem> (allowed: ...)". A config that
 * fails to load never starts training.
 */
#ifndef MXTRAIN_CONFIG_H
#define MXTRAIN_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "mxtrain/error.h"
#include "mxtrain/model.h"
#include "mxtrain/plan.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { MX_DTYPE_BF16 = 0, MX_DTYPE_FP32 = 1, MX_DTYPE_FP64 = 2 } mx_dtype;
/* How an AdamW moment is stored (training.exp_avg_dtype, exp_avg_sq_dtype): fp32, bf16,
 * MXFP8 (E4M3 codes, one E8M0 scale per 32 consecutive elements; the second moment as its
 * square root), or FP8 (E4M3 codes, one fp32 scale per tensor's span of the shard, as
 * TransformerEngine's FusedAdam stores a uint8 state). */
typedef enum { MX_STATE_FP32 = 0, MX_STATE_BF16 = 1, MX_STATE_MXFP8 = 2, MX_STATE_FP8 = 3 } mx_state_dtype;

/* How the learning rate falls from `lr` to `min_lr` after warm-up (Megatron's styles). */
typedef enum { MX_LR_CONSTANT = 0, MX_LR_LINEAR = 1, MX_LR_COSINE = 2, MX_LR_WSD = 3 } mx_lr_decay;
/* WSD's anneal (Megatron-LM's lr_wsd_decay_style) */
typedef enum { MX_WSD_EXPONENTIAL = 0, MX_WSD_LINEAR = 1, MX_WSD_COSINE = 2, MX_WSD_MINUS_SQRT = 3 } mx_wsd_decay;

/* `data:` — where the tokens come from. Paths are used as written: relative paths are
 * relative to the working directory of the run, not to the config file. */
typedef struct {
    char **data_path;       /* data_path: llm.c .bin shards, each entry a file or a glob; at least one. Required. */
    int n_data_path;
    double *data_weights;   /* (n_data_path) Megatron's blend, `[0.7, web_*.bin, 0.3, code_*.bin]`:
                               each entry a dataset drawn from in these proportions; NULL: one
                               stream of shards */
    char **val_data_path;   /* val_data_path: the same for validation, evaluated every
                               training.eval_interval steps; none by default (n = 0) */
    int n_val_data_path;
    double *val_data_weights; /* (n_val_data_path) as data_weights */
    int seq_length;         /* seq_length (T): tokens per sample, 1..model.max_position_embeddings. Required. */
    bool shuffle;           /* shuffle: data_path's rows in a new order each pass, from training.seed
                               (mx_loader_shuffle); default false: llm.c's order */
    /* Megatron's document masking, each off by default (mx_model_documents): */
    bool reset_attention_mask; /* reset_attention_mask: a token attends within its own document */
    bool reset_position_ids;   /* reset_position_ids: RoPE positions restart after each EOD token */
    bool eod_mask_loss;        /* eod_mask_loss: no loss where the input token is the EOD token */
    int eod_token_id;          /* eod_token_id: the end-of-document token; -1 (not given): mxtrain
                                  prepare's EOT (MX_PREPARE_EOT) with its byte-level vocabulary */
    char *tokenizer;        /* tokenizer: the Hugging Face tokenizer.json (or a directory holding one)
                               the shards were prepared with, copied into checkpoints with its
                               tokenizer_config.json and special_tokens_map.json; NULL (the default):
                               model_name_or_path's, when it has one */
} mx_data_config;

/* `parallel:` — the FSDP2 backend (SPEC §6). */
typedef struct {
    int data_parallel_size;         /* data_parallel_size: replicas of the sharded model (HSDP), each
                                       an FSDP group; 0 = `auto` (the default): the MPI world size /
                                       fully_shard_parallel_size (1 when that is auto too) */
    int fully_shard_parallel_size;  /* fully_shard_parallel_size: ranks per FSDP group; 0 = `auto`
                                       (the default): the MPI world size / data_parallel_size.
                                       data_parallel_size x fully_shard_parallel_size = the world
                                       size (checked when the job starts: mx_parallel_layout) */
    mx_dtype param_dtype;           /* fsdp_plan.param_dtype: bf16 (default) or fp32; the dtype
                                       non-quantized weights are gathered and computed in */
    mx_dtype reduce_dtype;          /* fsdp_plan.reduce_dtype: fp32 (default), bf16 or fp64; the
                                       dtype gradients are reduce-scattered in (summed over
                                       micro-batches in fp32, or fp64 with fp64).
                                       fp64 sums exactly in practice, so that results do not
                                       depend on the number of ranks */
    bool reshard_after_forward;     /* fsdp_plan.reshard_after_forward: default true */
    int num_to_forward_prefetch;    /* fsdp_plan.num_to_forward_prefetch: units gathered ahead in
                                       forward, >= 0, default 1 */
    int num_to_backward_prefetch;   /* fsdp_plan.num_to_backward_prefetch: the same in backward,
                                       >= 0, default 1 */
    int expert_parallel_size;       /* expert_parallel_size: EP, default 1; EP groups of EP
                                       consecutive ranks, each rank computing num_experts / EP
                                       experts on the group's tokens (docs/distributed.md) */
    mx_plan_pattern *ep_modules;    /* ep_plan.apply_modules: patterns (SPEC §3) selecting the MoE
                                       expert modules EP applies to; default
                                       ['model.layers.{*}.mlp.experts'] (line 0). The experts of
                                       the other MoE layers are computed by every rank on its
                                       own tokens, with no exchange */
    int n_ep_modules;
    int ep_dispatcher;              /* ep_plan.dispatcher: alltoall (0), the only one */
    mx_ep_dispatch ep_dispatch_dtype; /* ep_plan.dispatch_dtype: auto (default), fp32, bf16, mxfp8 */
    bool ep_overlap;                /* ep_plan.overlap: the exchanges run beside the work that does
                                       not need them (default true; the same results either way) */
    int expert_fully_shard_parallel_size;   /* expert_fully_shard_parallel_size: EFSDP, ranks each EP
                                       rank's experts are sharded over; 0 = `auto` (the default) */
    int expert_data_parallel_size;  /* expert_data_parallel_size: EDP, replicas of the sharded
                                       experts; 0 = `auto`. EDP x EFSDP x EP = the world size
                                       (mx_parallel_layout; both auto: EFSDP = the FSDP group
                                       size / EP when EP divides it, else 1) */
    double timeout_s;               /* timeout_s: seconds any wait for the other ranks may go
                                       without progress before the job ends with a message
                                       (> 0, default 600) */
} mx_parallel_config;

/* `features:` */
typedef struct {
    bool recompute;                     /* recompute: activation recompute, default false. With
                                           the on-demand low-precision gather, a recomputed
                                           block's backward gathers both planes (SPEC §6). */
    mx_plan_pattern *recompute_modules; /* recompute_plan.apply_modules: module patterns (SPEC §3)
                                           whose forward is re-run in backward; default
                                           ['model.layers.{*}'] (line 0); at least one */
    int n_recompute_modules;
    mx_recompute_granularity recompute_granularity;   /* recompute_granularity: full (default)
                                           or selective; only with recompute: true */
} mx_features_config;

/* `training:` */
typedef struct {
    int micro_batch_size;            /* micro_batch_size (B), >= 1. Required. */
    int gradient_accumulation_steps; /* >= 1, default 1: micro-batches per optimizer step */
    int global_batch_size;           /* global_batch_size: sequences per optimizer step over all
                                        ranks, a multiple of micro_batch_size x ranks, which sets
                                        the accumulation (mx_layout); 0 = not given */
    uint64_t seed;                   /* seed: 0..2^63-1, default 1234 */
    double lr;                       /* lr: peak learning rate, > 0. Required. */
    double min_lr;                   /* min_lr: 0 <= min_lr <= lr, default 0 */
    mx_lr_decay lr_decay_style;      /* lr_decay_style: constant | linear (default) | cosine | WSD */
    double lr_warmup_ratio;          /* lr_warmup_ratio: fraction of the decay steps (lr_decay_iters)
                                        spent warming up linearly from 0, in [0, 1], default 0 */
    int lr_warmup_iters;             /* lr_warmup_iters: warmup steps, >= 0, instead of
                                        lr_warmup_ratio; -1 (the default) = not given */
    int lr_decay_iters;              /* lr_decay_iters: the steps over which lr falls to min_lr
                                        (min_lr after them), >= 1; 0 (the default) = train_iters */
    mx_wsd_decay lr_wsd_decay_style; /* lr_wsd_decay_style: WSD's anneal, exponential (default) |
                                        linear | cosine | minus_sqrt */
    int lr_wsd_decay_iters;          /* lr_wsd_decay_iters: WSD's anneal, the last steps of
                                        lr_decay_iters, >= 1; required with WSD, 0 = not given */
    double weight_decay;             /* weight_decay: AdamW decoupled decay, >= 0, default 0 */
    double moe_z_loss_coeff;         /* moe_z_loss_coeff: the router z-loss's weight (qwen3_moe),
                                        >= 0, default 0 (none) */
    double adam_beta1;               /* adam_beta1: [0, 1), default 0.9 */
    double adam_beta2;               /* adam_beta2: [0, 1), default 0.95 */
    double adam_eps;                 /* adam_eps: > 0, default 1e-8 */
    mx_state_dtype exp_avg_dtype;    /* exp_avg_dtype: AdamW's first moment, fp32 (default), bf16,
                                        mxfp8 or fp8 */
    mx_state_dtype exp_avg_sq_dtype; /* exp_avg_sq_dtype: its second moment, as exp_avg_dtype */
    mx_dtype main_grads_dtype;       /* main_grads_dtype: the gradient shards the step sums into and
                                        the optimizer reads, fp32 (default) or bf16 */
    int train_iters;                 /* train_iters: optimizer steps, >= 1. Required. */
    double clip_grad;                /* clip_grad: max global gradient norm, >= 0, 0 = no
                                        clipping, default 1.0 */
    int log_interval;                /* log_interval: steps between log lines, >= 1, default 1 */
    int save_interval;               /* save_interval: steps between checkpoints, >= 0; 0 (the
                                        default) saves only after the last step. Needs `save`
                                        when > 0. */
    int eval_interval;               /* eval_interval: steps between validation evaluations, >= 0;
                                        0 (the default) evaluates once, after the last step; either
                                        way after the last step too. Needs data.val_data_path
                                        when > 0. */
    int eval_iters;                  /* eval_iters: validation batches per evaluation and rank,
                                        >= 1, default 10. Needs data.val_data_path when given. */
    char *save;                      /* save: checkpoint directory to write; NULL = never save */
    bool save_parallel;              /* save_parallel: every rank writes its own rows into the
                                        checkpoint files (where the ranks share `save`), default
                                        true; false: rank 0 assembles and writes them */
    int keep_latest_k;               /* keep_latest_k: checkpoints of this run's steps to keep, >= 0;
                                        after each save the older ones are removed; 0 (the
                                        default) keeps all. Needs `save` when > 0. */
    int exit_interval;               /* exit_interval: stop (saving a checkpoint) after a step it
                                        divides, >= 0; 0 (the default) = never */
    double exit_duration_in_mins;    /* exit_duration_in_mins: stop (saving) after the first step
                                        that ends this many minutes after the start, >= 0;
                                        0 (the default) = never */
    bool exit_signal_handler;        /* exit_signal_handler: on SIGTERM, SIGINT or SIGUSR1, stop
                                        (saving) after the step under way; default false (the
                                        signal's default action) */
    bool memory_check;               /* memory_check: refuse at start a run whose predicted memory
                                        exceeds what the machine has available; default true */
    bool check_for_nan_in_loss_and_grad; /* check_for_nan_in_loss_and_grad: stop the run, before the
                                        optimizer step, at a step whose loss or global gradient
                                        norm is not finite (the step is not applied); default true */
    char *load;                      /* load: checkpoint directory to resume from; NULL = none */
    char *metrics_path;              /* metrics_path: JSONL file of per-step metrics; NULL = none */
    char *plot_path;                 /* plot_path: PNG of the loss curves drawn at the end (needs metrics_path); NULL = none */
    int sample_interval;             /* sample_interval: steps between text samples printed while
                                        training, >= 0; 0 (the default) = none (byte-level models) */
    int sample_tokens;               /* sample_tokens: new tokens of a sample, >= 0, default 128; 0 =
                                        no samples, not even the one after the last step */
    char *sample_prompt;             /* sample_prompt: the text a sample continues; NULL (the
                                        default) = none: a document from its start */
    int quant_stats_interval;        /* quant_stats_interval: steps between quantization statistics
                                        records in metrics_path, >= 0; 0 (the default) = none */
    mx_plan quantization_plan;       /* quantization_plan: SPEC §1 (off when absent) */
} mx_training_config;

/* Where a setting's value came from. */
typedef enum {
    MX_ORIGIN_DEFAULT = 0,   /* not given: the documented default (or a value derived from others) */
    MX_ORIGIN_YAML = 1,      /* the YAML config, at `line` */
    MX_ORIGIN_HF_CONFIG = 2, /* the config.json of model_name_or_path (hf_config_path) */
    MX_ORIGIN_COMMAND_LINE = 3, /* an override (mx_config_load_with) */
} mx_origin_kind;

typedef struct {
    mx_origin_kind kind;
    int line;                /* 1-based line of the key in the YAML config; 0 otherwise */
} mx_origin;

/* Room for one origin per key of the config (an internal table indexes it). */
#define MX_CONFIG_MAX_KEYS 128

typedef struct {
    char *source;               /* the config file (or the source name given to mx_config_load_string) */
    char *model_name_or_path;   /* model.model_name_or_path as written; NULL when the model is inline */
    char *hf_config_path;       /* the config.json read for it; NULL when none */
    mx_model_config model;      /* model: Hugging Face hyper-parameters (include/mxtrain/model.h) */
    mx_data_config data;
    mx_parallel_config parallel;
    mx_features_config features;
    mx_training_config training;
    mx_origin origins[MX_CONFIG_MAX_KEYS]; /* use mx_config_origin() */
} mx_config;

/* Load and check a config file. On success returns 0 and fills out, which the caller
 * releases with mx_config_free. On error returns MX_EIO (the file, or model_name_or_path's
 * config.json, cannot be read), MX_ECONFIG, MX_ERECIPE, MX_EUNSUPPORTED, MX_EPATTERN,
 * MX_ENOMEM or MX_ENULL, fills diag with one line naming the file, line, key, value and what
 * is allowed, and leaves out empty (all zero; nothing to free). */
int mx_config_load(const char *path, mx_config *out, mx_diag *diag);

/* A setting given on the command line over the file's (`--training.lr 3e-4`): key, a
 * dotted setting name (docs/config.md; not inside training.quantization_plan), and value,
 * YAML text ("3e-4", "true", "[a.bin, b.bin]", "null"). */
typedef struct {
    const char *key;
    const char *value;
} mx_config_override;

/* As mx_config_load, with n overrides applied over the file: each replaces the file's value
 * of its key (or an alias's) or adds it, and is checked as if it were written there, its
 * messages saying "command line: KEY: ...". A key given twice, unknown (with the close keys),
 * a section or inside training.quantization_plan is MX_ECONFIG. */
int mx_config_load_with(const char *path, const mx_config_override *overrides, int n, mx_config *out, mx_diag *diag);

/* As mx_config_load, from YAML text; source_name stands for the file in messages. */
int mx_config_load_string(const char *yaml, const char *source_name, mx_config *out, mx_diag *diag);

/* Release what a config owns; it is left all zero and may be freed again. */
void mx_config_free(mx_config *config);

/* The learning-rate schedule's decay steps D (lr_decay_iters, or train_iters) and warmup
 * steps W (lr_warmup_iters, or round(lr_warmup_ratio x D)), as the trainer runs them. */
int64_t mx_training_decay_steps(const mx_training_config *training);
int64_t mx_training_warmup_steps(const mx_training_config *training);

/* ---- Settings by name: for `mxtrain plan` and for messages about a setting ----------- */

/* The settings, by dotted name: "model.hidden_size", "parallel.fsdp_plan.param_dtype",
 * "training.lr", ... (sections and training.quantization_plan, which has its own API, are
 * not listed). index runs from 0 to mx_config_key_count() - 1; NULL past the end. */
int mx_config_key_count(void);
const char *mx_config_key_name(int index);

/* Where a setting came from. Returns 0, MX_EINVAL for an unknown name, MX_ENULL. */
int mx_config_origin(const mx_config *config, const char *key, mx_origin *out);

/* The origin as text: "cfg.yaml:12", "ckpt/config.json", or "default". Returns the length
 * written (as snprintf) or a negative code. */
int mx_config_format_origin(const mx_config *config, const char *key, char *buf, size_t size);

/* The value as YAML text: "64", "0.0003", "true", "bf16", "auto", "['a', 'b']", "null".
 * Returns the length written (as snprintf) or a negative code. */
int mx_config_format_value(const mx_config *config, const char *key, char *buf, size_t size);

/* ---- Hugging Face config.json ------------------------------------------------------ */

/* Read a Hugging Face config.json (the file, or a directory holding one) into a model
 * config, exactly as model.model_name_or_path reads it: the same keys, defaults, checks and
 * one-line messages naming the file and key. */
int mx_hf_config_load(const char *path, mx_model_config *out, mx_diag *diag);

/* A complete Hugging Face config.json for a model (malloc'ed text, free with free()):
 * model_type, architectures (LlamaForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM) and
 * every hyper-parameter under transformers' names, torch_dtype as given ("float32",
 * "bfloat16"). mx_hf_config_load of it gives the same config back. */
int mx_hf_config_dumps(const mx_model_config *config, const char *torch_dtype, char **out, mx_diag *diag);
/* The same written to path atomically (MX_EIO with the system's reason). */
int mx_hf_config_save(const mx_model_config *config, const char *torch_dtype, const char *path, mx_diag *diag);

#ifdef __cplusplus
}
#endif

#endif
