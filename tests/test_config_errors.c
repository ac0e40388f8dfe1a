/* The training configuration's one-line errors, for every class of mistake: each case a
 * config, the status, the line and the message word for word. test_config.c holds the
 * rest. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config_cases.h"

/* ---- Errors ------------------------------------------------------------------------------- */

typedef struct {
    const char *yaml;
    int rc;
    int line;            /* the "cfg.yaml:LINE: " prefix; 0: "cfg.yaml: " with no line; -1: not checked */
    const char *subs[3]; /* substrings of the message */
} error_case;

#define MOE_LINES MODEL_MOE DATA TRAINING
#define DEEP8 "[[[[{a: "

static const error_case errors[] = {
    /* Unknown keys, duplicates, aliases, structure. */
    {"modle:\n  model_type: llama\n" DATA TRAINING, MX_ECONFIG, 1,
     {"modle: unknown key; did you mean 'model'? (allowed: model, data, parallel, features, training)"}},
    {MODEL_LLAMA "  hiden_size: 3\n" DATA TRAINING, MX_ECONFIG, 8,
     {"model.hiden_size: unknown key; did you mean 'hidden_size'? (allowed: model_name_or_path, model_type, "
      "vocab_size, hidden_size,",
      "num_experts (alias num_local_experts)"}},
    {MODEL_LLAMA "  lr: 0.1\n" DATA TRAINING, MX_ECONFIG, 8, {"model.lr: unknown key; did you mean training.lr?"}},
    {MINIMAL "  micro_batch: 4\n", MX_ECONFIG, 15,
     {"training.micro_batch: unknown key; did you mean 'micro_batch_size'?"}},
    {MINIMAL "parallel:\n  fsdp_plan:\n    param_type: bf16\n", MX_ECONFIG, 17,
     {"parallel.fsdp_plan.param_type: unknown key; did you mean 'param_dtype'? (allowed: param_dtype, reduce_dtype, "
      "reshard_after_forward, num_to_forward_prefetch, num_to_backward_prefetch)"}},
    {MINIMAL "  lr: 0.002\n", MX_ECONFIG, 15, {"training.lr: duplicate key (first given at line 14)"}},
    {MINIMAL "model: {}\n", MX_ECONFIG, 15, {"model: duplicate key (first given at line 1)"}},
    {MODEL_MOE "  num_experts: 4\n  num_local_experts: 4\n" DATA TRAINING, MX_ECONFIG, 9,
     {"model.num_local_experts: given together with its alias num_experts (line 8); keep one of them"}},
    {"model: 5\n" DATA TRAINING, MX_ECONFIG, 1,
     {"model: 5 (an integer) is not a mapping (allowed: a mapping of Hugging Face model keys"}},
    {MODEL_LLAMA "data:\n" TRAINING, MX_ECONFIG, 8,
     {"data: an empty value is not a mapping (allowed: a mapping with keys data_path, seq_length, val_data_path, shuffle, "
      "reset_attention_mask, reset_position_ids, eod_mask_loss, eod_token_id, tokenizer)"}},
    {MINIMAL "features:\n  recompute_plan: [model.layers.0]\n", MX_ECONFIG, 16,
     {"features.recompute_plan: a list is not a mapping (allowed: a mapping with key apply_modules)"}},
    {"- model\n", MX_ECONFIG, 1, {"the config is a list, not a mapping of sections"}},
    {MINIMAL "  ? [a]\n  : b\n", MX_ECONFIG, 15, {"training: a list is not a key (allowed: micro_batch_size,"}},
    {"base: &b {lr: 1}\n" MINIMAL, MX_ECONFIG, 1, {"base: unknown key (allowed: model, data"}},
    {MODEL_LLAMA DATA "training:\n  <<: {lr: 0.1}\n  micro_batch_size: 2\n  train_iters: 1\n", MX_ECONFIG, 12,
     {"training.<<: YAML merge keys are not supported; write the keys out"}},
    {MINIMAL "---\nmodel: {}\n", MX_ECONFIG, 15, {"a second YAML document starts here (allowed: one document)"}},
    {MINIMAL "  lr: [0.1\n", MX_ECONFIG, -1, {"cfg.yaml:16:1: YAML syntax error"}},
    /* flow collections 65 deep (DEEP8: 5 levels): refused before libyaml parses them (quadratic in the depth) */
    {MINIMAL "  weight_decay: " DEEP8 DEEP8 DEEP8 DEEP8 DEEP8 DEEP8 DEEP8 DEEP8 DEEP8 DEEP8 DEEP8 DEEP8 DEEP8 "1\n",
     MX_ECONFIG, 15,
     {"[ ] and { } nested deeper than 64 levels (allowed: at most 64)"}},
    /* brackets in quoted scalars and comments do not count */
    {MINIMAL "  weight_decay: {a: {b: [\"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\"]}} # [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\n",
     MX_ECONFIG, 15, {"training.weight_decay: a mapping is not"}},

    /* Types and ranges. */
    {"model:\n  model_type: llama\n  vocab_size: 257\n  hidden_size: abc\n", MX_ECONFIG, 4,
     {"model.hidden_size: 'abc' is not an integer (allowed: an integer >= 1)"}},
    {"model:\n  model_type: llama\n  vocab_size: 257\n  hidden_size: '64'\n", MX_ECONFIG, 4,
     {"model.hidden_size: '64' is a quoted string, not an integer (allowed: an integer >= 1, unquoted)"}},
    {"model:\n  model_type: llama\n  vocab_size: 257\n  hidden_size: 64.0\n", MX_ECONFIG, 4,
     {"model.hidden_size: 64.0 (a number) is not an integer (allowed: an integer >= 1)"}},
    {"model:\n  model_type: llama\n  vocab_size: 257\n  hidden_size: 0\n", MX_ECONFIG, 4,
     {"model.hidden_size: 0 is out of range (allowed: an integer >= 1)"}},
    {"model:\n  model_type: llama\n  vocab_size: 99999999999\n", MX_ECONFIG, 3,
     {"model.vocab_size: 99999999999 is out of range (allowed: an integer >= 1)"}},
    {"model:\n  model_type: llama\n  vocab_size: 999999999999999999999999\n", MX_ECONFIG, 3,
     {"model.vocab_size: 999999999999999999999999 is out of range"}},
    {"model:\n  model_type: llama\n  num_hidden_layers: 257\n", MX_ECONFIG, 3,
     {"model.num_hidden_layers: 257 is out of range (allowed: an integer from 1 to 256)"}},
    {"model:\n  model_type: llama\n  vocab_size: [257]\n", MX_ECONFIG, 3,
     {"model.vocab_size: a list is not an integer"}},
    {"model:\n  model_type: gpt2\n", MX_ECONFIG, 2,
     {"model.model_type: 'gpt2' is not allowed (allowed: 'llama', 'qwen3', 'qwen3_moe')"}},
    {"model:\n  model_type: Llama\n", MX_ECONFIG, 2, {"model.model_type: 'Llama' is not allowed"}},
    {MODEL_LLAMA "  tie_word_embeddings: 'true'\n" DATA TRAINING, MX_ECONFIG, 8,
     {"model.tie_word_embeddings: 'true' is a quoted string, not a boolean (allowed: true, false, unquoted)"}},
    {MODEL_LLAMA "  attention_bias: 1\n" DATA TRAINING, MX_ECONFIG, 8,
     {"model.attention_bias: 1 (an integer) is not a boolean (allowed: true, false)"}},
    {MODEL_LLAMA "  rms_norm_eps: 0\n" DATA TRAINING, MX_ECONFIG, 8,
     {"model.rms_norm_eps: 0 is out of range (allowed: a number > 0)"}},
    {MODEL_LLAMA "  rms_norm_eps: -1e-6\n" DATA TRAINING, MX_ECONFIG, 8, {"model.rms_norm_eps: -1e-6 is out of range"}},
    {MODEL_LLAMA "  rms_norm_eps: 1e-50\n" DATA TRAINING, MX_ECONFIG, 8,
     {"model.rms_norm_eps: 1e-50 is out of range (allowed: a number > 0)"}},
    {MODEL_LLAMA "  rope_theta: 1e39\n" DATA TRAINING, MX_ECONFIG, 8, {"model.rope_theta: 1e39 is out of range"}},
    {MODEL_LLAMA DATA "training:\n  lr: abc\n", MX_ECONFIG, 12,
     {"training.lr: 'abc' is not a number (allowed: a number > 0)"}},
    {MODEL_LLAMA DATA "training:\n  lr: 3e\n", MX_ECONFIG, 12, {"training.lr: '3e' is not a number"}},
    {MODEL_LLAMA DATA "training:\n  lr: '3e-4'\n", MX_ECONFIG, 12,
     {"training.lr: '3e-4' is a quoted string, not a number (allowed: a number > 0, unquoted)"}},
    {MODEL_LLAMA DATA "training:\n  lr: .inf\n", MX_ECONFIG, 12,
     {"training.lr: .inf is out of range (allowed: a number > 0)"}},
    {MODEL_LLAMA DATA "training:\n  lr: .nan\n", MX_ECONFIG, 12, {"training.lr: .nan is out of range"}},
    {MODEL_LLAMA DATA "training:\n  lr: 0\n", MX_ECONFIG, 12, {"training.lr: 0 is out of range (allowed: a number > 0)"}},
    {MODEL_LLAMA DATA "training:\n  lr: true\n", MX_ECONFIG, 12, {"training.lr: true (a boolean) is not a number"}},
    {MINIMAL "  lr_warmup_ratio: 1.5\n", MX_ECONFIG, 15,
     {"training.lr_warmup_ratio: 1.5 is out of range (allowed: a number from 0 to 1)"}},
    {MINIMAL "  adam_beta2: 1\n", MX_ECONFIG, 15, {"training.adam_beta2: 1 is out of range (allowed: a number in [0, 1))"}},
    {MINIMAL "  adam_eps: 0.0\n", MX_ECONFIG, 15, {"training.adam_eps: 0.0 is out of range (allowed: a number > 0)"}},
    {MINIMAL "  clip_grad: -1\n", MX_ECONFIG, 15, {"training.clip_grad: -1 is out of range (allowed: a number >= 0)"}},
    {MINIMAL "  weight_decay: -0.1\n", MX_ECONFIG, 15, {"training.weight_decay: -0.1 is out of range"}},
    {MODEL_LLAMA DATA "training:\n  train_iters: 1e3\n", MX_ECONFIG, 12,
     {"training.train_iters: '1e3' is not an integer (allowed: an integer >= 1)"}},
    {MINIMAL "  seed: -1\n", MX_ECONFIG, 15, {"training.seed: -1 is out of range (allowed: an integer from 0 to 2^63-1)"}},
    {MINIMAL "  log_interval: 0\n", MX_ECONFIG, 15, {"training.log_interval: 0 is out of range (allowed: an integer >= 1)"}},
    {MINIMAL "  gradient_accumulation_steps: 0\n", MX_ECONFIG, 15, {"training.gradient_accumulation_steps: 0 is out of range"}},
    {MINIMAL "  save_interval: -5\n", MX_ECONFIG, 15, {"training.save_interval: -5 is out of range (allowed: an integer >= 0)"}},
    {MINIMAL "  sample_interval: -1\n", MX_ECONFIG, 15,
     {"training.sample_interval: -1 is out of range (allowed: an integer >= 0)"}},
    {MINIMAL "  quant_stats_interval: -3\n", MX_ECONFIG, 15,
     {"training.quant_stats_interval: -3 is out of range (allowed: an integer >= 0)"}},
    {MINIMAL "  quant_stats_interval: 2.5\n", MX_ECONFIG, 15,
     {"training.quant_stats_interval: 2.5 (a number) is not an integer (allowed: an integer >= 0)"}},
    {MINIMAL "  sample_tokens: 2000000\n", MX_ECONFIG, 15,
     {"training.sample_tokens: 2000000 is out of range (allowed: an integer from 0 to 65536)"}},
    {MINIMAL "  save: ck\n  keep_latest_k: -1\n", MX_ECONFIG, 16,
     {"training.keep_latest_k: -1 is out of range (allowed: an integer >= 0)"}},
    {MINIMAL "  save: ck\n  keep_latest_k: two\n", MX_ECONFIG, 16, {"training.keep_latest_k: 'two'", "an integer"}},
    {MODEL_LLAMA "data:\n  data_path: [0.7, a.bin, 0.3]\n" TRAINING, MX_ECONFIG, 9,
     {"data.data_path: a blend of 3 items is not weight, path pairs (allowed: [weight, pattern, weight, pattern, ...])"}},
    {MODEL_LLAMA "data:\n  data_path: [0.7, a.bin, b.bin, c.bin]\n" TRAINING, MX_ECONFIG, 9,
     {"data.data_path[2]: 'b.bin' is not a weight (allowed: a number > 0, each dataset's weight before its path)"}},
    {MODEL_LLAMA "data:\n  data_path: [0, a.bin]\n" TRAINING, MX_ECONFIG, 9, {"data.data_path[0]: 0 (an integer) is not a weight"}},
    {MODEL_LLAMA "data:\n  data_path: [0.5, 3]\n" TRAINING, MX_ECONFIG, 9,
     {"data.data_path[1]: 3 (an integer) is not a path (allowed: a file or glob pattern after each weight)"}},
    {MINIMAL "  global_batch_size: 7\n", MX_ECONFIG, 15,
     {"training.global_batch_size: 7 is not a multiple of micro_batch_size 2 (allowed: a multiple of 2 x the ranks)"}},
    {MINIMAL "  gradient_accumulation_steps: 3\n  global_batch_size: 8\n", MX_ECONFIG, 16,
     {"training.global_batch_size: 8 is not a multiple of micro_batch_size 2 x gradient_accumulation_steps 3 = 6"}},
    {MINIMAL "  global_batch_size: 0\n", MX_ECONFIG, 15, {"training.global_batch_size: 0 is out of range (allowed: an integer >= 1)"}},
    {MINIMAL "  lr_warmup_iters: 2\n  lr_warmup_ratio: 0.1\n", MX_ECONFIG, 15,
     {"training.lr_warmup_iters: 2 is given with training.lr_warmup_ratio", "(allowed: one of the two)"}},
    {MINIMAL "  lr_warmup_iters: 11\n", MX_ECONFIG, 15,
     {"training.lr_warmup_iters: 11 is more than train_iters 10 (allowed: 0 to 10)"}},
    {MINIMAL "  lr_decay_iters: 4\n  lr_warmup_iters: 5\n", MX_ECONFIG, 16,
     {"training.lr_warmup_iters: 5 is more than lr_decay_iters 4 (allowed: 0 to 4)"}},
    {MINIMAL "  lr_decay_iters: 0\n", MX_ECONFIG, 15, {"training.lr_decay_iters: 0 is out of range (allowed: an integer >= 1)"}},
    {MINIMAL "  lr_decay_style: WSD\n", MX_ECONFIG, 15,
     {"training.lr_decay_style: WSD needs training.lr_wsd_decay_iters"}},
    {MINIMAL "  lr_decay_style: WSD\n  lr_wsd_decay_iters: 9\n  lr_warmup_iters: 2\n", MX_ECONFIG, 16,
     {"training.lr_wsd_decay_iters: 9 is more than the 8 steps after warmup (train_iters 10 - 2 warmup; allowed: 1 to 8)"}},
    {MINIMAL "  lr_wsd_decay_iters: 3\n", MX_ECONFIG, 15,
     {"training.lr_wsd_decay_iters: given, but lr_decay_style is not WSD"}},
    {MINIMAL "  lr_wsd_decay_style: linear\n", MX_ECONFIG, 15,
     {"training.lr_wsd_decay_style: given, but lr_decay_style is not WSD"}},
    {MINIMAL "  lr_decay_style: WSD\n  lr_wsd_decay_iters: 3\n  lr_wsd_decay_style: square\n", MX_ECONFIG, 17,
     {"training.lr_wsd_decay_style: 'square'", "'exponential', 'linear', 'cosine', 'minus_sqrt'"}},
    {MINIMAL "  moe_z_loss_coeff: 0.001\n", MX_ECONFIG, 15,
     {"training.moe_z_loss_coeff: given for model_type llama, but it applies only to qwen3_moe"}},
    {MINIMAL "  exit_interval: -1\n", MX_ECONFIG, 15, {"training.exit_interval: -1 is out of range (allowed: an integer >= 0)"}},
    {MINIMAL "  exit_duration_in_mins: -2\n", MX_ECONFIG, 15, {"training.exit_duration_in_mins: -2 is out of range"}},
    {MINIMAL "  exit_duration_in_mins: soon\n", MX_ECONFIG, 15, {"training.exit_duration_in_mins: 'soon'", "a number"}},
    {MINIMAL "  exit_signal_handler: 2\n", MX_ECONFIG, 15, {"training.exit_signal_handler: 2", "a boolean"}},
    {MINIMAL "  memory_check: sometimes\n", MX_ECONFIG, 15, {"training.memory_check: 'sometimes' is not a boolean", "true, false"}},
    {MINIMAL "  check_for_nan_in_loss_and_grad: 1\n", MX_ECONFIG, 15,
     {"training.check_for_nan_in_loss_and_grad: 1", "a boolean"}},
    {MINIMAL "  lr_decay_style: exponential\n", MX_ECONFIG, 15,
     {"training.lr_decay_style: 'exponential' is not allowed (allowed: 'constant', 'linear', 'cosine', 'WSD' (alias 'wsd'))"}},
    {MINIMAL "  save: 5\n", MX_ECONFIG, 15, {"training.save: 5 (an integer) is not a path"}},
    {MINIMAL "  load: ''\n", MX_ECONFIG, 15, {"training.load: '' is not a path"}},
    {MINIMAL "  metrics_path: [a]\n", MX_ECONFIG, 15, {"training.metrics_path: a list is not a path"}},
    {MINIMAL "parallel:\n  fsdp_plan:\n    param_dtype: fp16\n", MX_ECONFIG, 17,
     {"parallel.fsdp_plan.param_dtype: 'fp16' is not allowed (allowed: 'bf16' (alias 'bfloat16'), 'fp32' (alias "
      "'float32'))"}},
    {MINIMAL "parallel:\n  fsdp_plan:\n    num_to_forward_prefetch: -1\n", MX_ECONFIG, 17,
     {"parallel.fsdp_plan.num_to_forward_prefetch: -1 is out of range (allowed: an integer >= 0)"}},
    {MINIMAL "parallel:\n  timeout_s: 0\n", MX_ECONFIG, 16, {"parallel.timeout_s: 0 is out of range (allowed: a number > 0)"}},
    {MINIMAL "parallel:\n  timeout_s: -5\n", MX_ECONFIG, 16, {"parallel.timeout_s: -5 is out of range"}},
    {MINIMAL "parallel:\n  timeout_s: .inf\n", MX_ECONFIG, 16, {"parallel.timeout_s: .inf is out of range"}},
    {MINIMAL "parallel:\n  timeout_s: 10m\n", MX_ECONFIG, 16,
     {"parallel.timeout_s: '10m' is not a number (allowed: a number > 0)"}},
    {MINIMAL "parallel:\n  fully_shard_parallel_size: 0\n", MX_ECONFIG, 16,
     {"parallel.fully_shard_parallel_size: 0 is out of range (allowed: a positive integer, or auto: the MPI ranks / "
      "data_parallel_size)"}},
    {MINIMAL "parallel:\n  data_parallel_size: 0\n", MX_ECONFIG, 16,
     {"parallel.data_parallel_size: 0 is out of range (allowed: a positive integer, or auto: the MPI ranks / "
      "fully_shard_parallel_size)"}},
    {MINIMAL "parallel:\n  data_parallel_size: 2.5\n", MX_ECONFIG, 16,
     {"parallel.data_parallel_size: 2.5 (a number) is not allowed (allowed: a positive integer, or auto"}},
    {MINIMAL "parallel:\n  data_parallel_size: [2]\n", MX_ECONFIG, 16,
     {"parallel.data_parallel_size: a list is not allowed (allowed: a positive integer, or auto"}},
    {MINIMAL "parallel:\n  fully_shard_parallel_size: all\n", MX_ECONFIG, 16,
     {"parallel.fully_shard_parallel_size: 'all' is not allowed (allowed: a positive integer, or auto"}},
    {MINIMAL "features:\n  recompute: 'yes'\n", MX_ECONFIG, 16, {"features.recompute: 'yes' is a quoted string, not a boolean"}},
    {MINIMAL "features:\n  recompute: true\n  recompute_granularity: partial\n", MX_ECONFIG, 17,
     {"features.recompute_granularity: 'partial' is not allowed (allowed: 'full', 'selective')"}},
    {MINIMAL "features:\n  recompute_granularity: selective\n", MX_ECONFIG, 16,
     {"features.recompute_granularity: given, but features.recompute is false (allowed: leave it out, or set "
      "features.recompute: true)"}},
    {MINIMAL "  save_parallel: 2\n", MX_ECONFIG, 15, {"training.save_parallel: 2", "a boolean"}},
    {MINIMAL "features:\n  recompute_plan:\n    apply_modules: ['model.layers.{x}']\n", MX_EPATTERN, 17,
     {"features.recompute_plan.apply_modules[0]: "}},
    {MINIMAL "features:\n  recompute_plan:\n    apply_modules: []\n", MX_ECONFIG, 17,
     {"features.recompute_plan.apply_modules: an empty list selects nothing"}},
    {MINIMAL "features:\n  recompute_plan:\n    apply_modules: [3]\n", MX_ECONFIG, 17,
     {"features.recompute_plan.apply_modules[0]: 3 (an integer) is not a pattern"}},
    {MODEL_LLAMA "data:\n  data_path: []\n  seq_length: 64\n" TRAINING, MX_ECONFIG, 9,
     {"data.data_path: an empty list names no data (allowed: a file or glob pattern of llm.c .bin shards, a list of "
      "them, or a blend [weight, pattern, weight, pattern, ...])"}},
    {MODEL_LLAMA "data:\n  data_path: [a.bin, 5]\n  seq_length: 64\n" TRAINING, MX_ECONFIG, 9,
     {"data.data_path[1]: 5 (an integer) is not a path (allowed: a file or glob pattern)"}},
    {MODEL_LLAMA "data:\n  data_path: ~\n  seq_length: 64\n" TRAINING, MX_ECONFIG, 9, {"data.data_path: ~ is not a path"}},
    {MODEL_LLAMA "data:\n  data_path: x.bin\n  seq_length: 0\n" TRAINING, MX_ECONFIG, 10,
     {"data.seq_length: 0 is out of range (allowed: an integer >= 1)"}},
    /* Handed to the plan loader, which words its errors the same way. */
    {MINIMAL "  quantization_plan:\n    recipe_name: mxfp9\n", MX_ERECIPE, 16,
     {"training.quantization_plan.recipe_name: recipe 'mxfp9'"}},
    {MINIMAL "  quantization_plan:\n    recipe_nam: mxfp8\n", MX_ECONFIG, 16,
     {"training.quantization_plan.recipe_nam: unknown key; did you mean 'recipe_name'?"}},
    {MINIMAL "  quantization_plan:\n", MX_ECONFIG, 15, {"training.quantization_plan: an empty value is not a mapping"}},

    /* Hugging Face values mxtrain cannot honour. */
    {MODEL_LLAMA "  hidden_act: gelu\n" DATA TRAINING, MX_ECONFIG, 8,
     {"model.hidden_act: 'gelu' cannot be honoured: mxtrain's MLPs are SwiGLU (allowed: 'silu')"}},
    {MODEL_LLAMA "  attention_dropout: 0.1\n" DATA TRAINING, MX_ECONFIG, 8,
     {"model.attention_dropout: 0.1 (a number) cannot be honoured: mxtrain has no attention dropout (allowed: 0)"}},
    {MODEL_LLAMA "  use_sliding_window: true\n" DATA TRAINING, MX_ECONFIG, 8,
     {"model.use_sliding_window: true (a boolean) cannot be honoured: mxtrain has full causal attention only "
      "(allowed: false)"}},
    {MODEL_LLAMA "  mlp_bias: yes\n" DATA TRAINING, MX_ECONFIG, 8, {"model.mlp_bias: yes (a boolean) cannot be honoured"}},
    {MODEL_LLAMA "  rope_scaling: {rope_type: yarn, factor: 4.0}\n" DATA TRAINING, MX_ECONFIG, 8,
     {"model.rope_scaling.rope_type: 'yarn' cannot be honoured: mxtrain implements plain RoPE (allowed: 'default')"}},
    {MODEL_LLAMA "  rope_scaling: {rope_type: default, mrope_section: [16, 24, 24]}\n" DATA TRAINING, MX_ECONFIG, 8,
     {"model.rope_scaling.mrope_section: this key cannot be honoured"}},
    {MODEL_LLAMA "  rope_scaling: linear\n" DATA TRAINING, MX_ECONFIG, 8,
     {"model.rope_scaling: 'linear' cannot be honoured: mxtrain implements plain RoPE (allowed: null, or rope_type "
      "'default')"}},
    {MODEL_LLAMA "  layer_types: [full_attention, sliding_attention]\n" DATA TRAINING, MX_ECONFIG, 8,
     {"model.layer_types[1]: 'sliding_attention' cannot be honoured"}},
    {MODEL_LLAMA "  rope_theta: 10000.0\n  rope_parameters: {rope_type: default, rope_theta: 500000.0}\n" DATA TRAINING,
     MX_ECONFIG, 9, {"model.rope_parameters: its rope_theta 500000 disagrees with rope_theta 10000 (line 8)"}},

    /* MoE keys on a dense model. */
    {MODEL_LLAMA "  num_experts: 4\n" DATA TRAINING, MX_ECONFIG, 8,
     {"model.num_experts: given for model_type llama, but it applies only to qwen3_moe (allowed: leave it out, or set "
      "model_type: qwen3_moe)"}},
    {"model:\n  norm_topk_prob: true\n  model_type: qwen3\n", MX_ECONFIG, 2,
     {"model.norm_topk_prob: given for model_type qwen3, but it applies only to qwen3_moe"}},

    /* Document masking: the EOD token inside the vocabulary, and given where prepare's is not the one. */
    {MODEL_LLAMA DATA "  eod_token_id: 257\n" TRAINING, MX_ECONFIG, 11,
     {"data.eod_token_id: 257 is not a token of model.vocab_size 257 (line 3) (allowed: 0 to 256)"}},
    {MODEL_LLAMA DATA "  eod_token_id: -1\n" TRAINING, MX_ECONFIG, 11, {"data.eod_token_id: -1 is out of range (allowed: an integer >= 0)"}},
    {"model:\n  model_type: llama\n  vocab_size: 300\n  hidden_size: 64\n  intermediate_size: 192\n"
     "  num_hidden_layers: 2\n  num_attention_heads: 4\n" DATA "  reset_attention_mask: true\n" TRAINING,
     MX_ECONFIG, 11,
     {"data.reset_attention_mask: true needs data.eod_token_id, the end-of-document token: model.vocab_size 300 is "
      "not mxtrain prepare's byte-level vocabulary (257, EOT 256) (allowed: give data.eod_token_id, or false)"}},
    {"model:\n  model_type: llama\n  vocab_size: 300\n  hidden_size: 64\n  intermediate_size: 192\n"
     "  num_hidden_layers: 2\n  num_attention_heads: 4\n" DATA "  eod_mask_loss: true\n" TRAINING,
     MX_ECONFIG, 11, {"data.eod_mask_loss: true needs data.eod_token_id"}},

    /* Required keys and sections. */
    {"", MX_ECONFIG, 0, {"cfg.yaml: model: required section missing"}},
    {"# nothing\n", MX_ECONFIG, 0, {"cfg.yaml: model: required section missing"}},
    {MODEL_LLAMA TRAINING, MX_ECONFIG, 0,
     {"cfg.yaml: data: required section missing (allowed: a mapping with keys data_path, seq_length, val_data_path, shuffle, "
      "reset_attention_mask, reset_position_ids, eod_mask_loss, eod_token_id, tokenizer)"}},
    {MODEL_LLAMA DATA, MX_ECONFIG, 0, {"cfg.yaml: training: required section missing"}},
    {"model:\n  vocab_size: 257\n" DATA TRAINING, MX_ECONFIG, 1,
     {"model.model_type: required key missing (allowed: 'llama', 'qwen3', 'qwen3_moe')"}},
    {"model:\n  model_type: llama\n  vocab_size: 257\n  intermediate_size: 192\n  num_hidden_layers: 2\n"
     "  num_attention_heads: 4\n" DATA TRAINING,
     MX_ECONFIG, 1, {"cfg.yaml:1: model.hidden_size: required key missing (allowed: an integer >= 1)"}},
    {MODEL_LLAMA "data:\n  seq_length: 64\n" TRAINING, MX_ECONFIG, 8,
     {"data.data_path: required key missing (allowed: a file or glob pattern of llm.c .bin shards"}},
    {MODEL_LLAMA "data:\n  data_path: x.bin\n" TRAINING, MX_ECONFIG, 8, {"data.seq_length: required key missing"}},
    {MODEL_LLAMA DATA "training:\n  train_iters: 10\n  lr: 0.001\n", MX_ECONFIG, 11,
     {"training.micro_batch_size: required key missing"}},
    {MODEL_LLAMA DATA "training:\n  micro_batch_size: 2\n  lr: 0.001\n", MX_ECONFIG, 11,
     {"training.train_iters: required key missing"}},
    {MODEL_LLAMA DATA "training:\n  micro_batch_size: 2\n  train_iters: 10\n", MX_ECONFIG, 11,
     {"training.lr: required key missing (allowed: a number > 0)"}},

    /* Checks across keys. */
    {"model:\n  model_type: llama\n  vocab_size: 257\n  hidden_size: 64\n  intermediate_size: 192\n"
     "  num_hidden_layers: 2\n  num_attention_heads: 6\n" DATA TRAINING,
     MX_ECONFIG, 7,
     {"model.num_attention_heads: 6 does not divide hidden_size 64, and head_dim is not given (allowed: a divisor of "
      "hidden_size, or give head_dim)"}},
    {MODEL_LLAMA "  num_key_value_heads: 3\n" DATA TRAINING, MX_ECONFIG, 8,
     {"model.num_key_value_heads: 3 does not divide num_attention_heads 4 (line 7) (allowed: a divisor of "
      "num_attention_heads)"}},
    {MODEL_MOE "  num_experts: 4\n" DATA TRAINING, MX_ECONFIG, 8,
     {"model.num_experts: 4 is less than num_experts_per_tok 8 (default for qwen3_moe)"}},
    {MODEL_MOE "  num_experts: 4\n  num_experts_per_tok: 5\n" DATA TRAINING, MX_ECONFIG, 9,
     {"model.num_experts_per_tok: 5 is more than num_experts 4 (line 8) (allowed: 1 to num_experts)"}},
    {MODEL_MOE "  num_experts: 0\n" DATA TRAINING, MX_ECONFIG, 8,
     {"model.num_experts: 0 is out of range (allowed: an integer >= 1)"}},
    {"model:\n  model_type: llama\n  vocab_size: 257\n  hidden_size: 60\n  intermediate_size: 192\n"
     "  num_hidden_layers: 2\n  num_attention_heads: 4\n" DATA TRAINING,
     MX_ECONFIG, 7,
     {"model.num_attention_heads: 4 gives head_dim 15 = hidden_size 60 / 4, which is odd (allowed: an even head_dim"}},
    {MODEL_LLAMA "  head_dim: 7\n" DATA TRAINING, MX_ECONFIG, 8,
     {"model.head_dim: 7 is odd (allowed: an even number: rotary embeddings rotate pairs of channels)"}},
    {MODEL_MOE "  num_experts_per_tok: 129\n" DATA TRAINING, MX_ECONFIG, 8,
     {"model.num_experts_per_tok: 129 is more than num_experts 128 (default for qwen3_moe)"}},
    {MODEL_MOE "  mlp_only_layers: [0, 2]\n" DATA TRAINING, MX_ECONFIG, 8,
     {"model.mlp_only_layers[1]: 2 is not a layer (allowed: 0 to 1: num_hidden_layers is 2)"}},
    {MODEL_MOE "  mlp_only_layers: [-1]\n" DATA TRAINING, MX_ECONFIG, 8,
     {"model.mlp_only_layers[0]: -1 is out of range (allowed: a list of layer indices"}},
    {MODEL_MOE "  mlp_only_layers: 1\n" DATA TRAINING, MX_ECONFIG, 8,
     {"model.mlp_only_layers: 1 (an integer) is not a list"}},
    /* The model layer's own limits (mx_model_config_check), at the key's line. */
    {"model:\n  model_type: llama\n  vocab_size: 2000000000\n  hidden_size: 64\n  intermediate_size: 192\n"
     "  num_hidden_layers: 2\n  num_attention_heads: 4\n" DATA TRAINING,
     MX_ECONFIG, 3, {"cfg.yaml:3: model.vocab_size: 2000000000 is out of range (allowed: "}},
    {MODEL_LLAMA "data:\n  data_path: x.bin\n  seq_length: 4096\n" TRAINING, MX_ECONFIG, 10,
     {"data.seq_length: 4096 is more than model.max_position_embeddings 2048 (default for llama) (allowed: 1 to 2048)"}},
    {MODEL_LLAMA "  max_position_embeddings: 32\n" DATA TRAINING, MX_ECONFIG, 11,
     {"data.seq_length: 64 is more than model.max_position_embeddings 32 (line 8)"}},
    {MINIMAL "  min_lr: 0.01\n", MX_ECONFIG, 15, {"training.min_lr: 0.01 is more than lr 0.001 (line 14) (allowed: 0 to lr)"}},
    {MINIMAL "  save_interval: 100\n", MX_ECONFIG, 15,
     {"training.save_interval: 100 needs training.save, the checkpoint directory"}},
    {MINIMAL "  keep_latest_k: 2\n", MX_ECONFIG, 15, {"training.keep_latest_k: 2 needs training.save, the checkpoint directory"}},
    {MINIMAL "  plot_path: loss.png\n", MX_ECONFIG, 15,
     {"training.plot_path: 'loss.png' needs training.metrics_path, the metrics it draws"}},
    /* 262145 x 64 = 2^24 + 64 tokens */
    {MODEL_LLAMA DATA "training:\n  micro_batch_size: 262145\n  train_iters: 10\n  lr: 0.001\n", MX_ECONFIG, 12,
     {"training.micro_batch_size: 262145 x data.seq_length 64 (line 10) = 16777280 tokens per micro-batch (allowed: at "
      "most 16777216 = 2^24 tokens)"}},
};

/* The token limit is inclusive: 262144 x 64 = 2^24 tokens load. */
static void test_token_limit(void) {
    mx_config c;
    mx_diag diag = {{0}};
    CHECK_EQ_INT(load(MODEL_LLAMA DATA "training:\n  micro_batch_size: 262144\n  train_iters: 10\n  lr: 0.001\n", &c,
                      &diag), 0);
    CHECK_EQ_INT(c.training.micro_batch_size, 262144);
    mx_config_free(&c);
}

static void test_errors(void) {
    for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++) {
        const error_case *e = &errors[i];
        mx_config c;
        memset(&c, 0x5A, sizeof c); /* out is cleared even on error */
        mx_diag diag = {{0}};
        int before = mxt_current_failures();
        int rc = load(e->yaml, &c, &diag);
        CHECK_EQ_INT(rc, e->rc);
        CHECK(is_empty(&c));
        if (e->line >= 0) {
            char prefix[64];
            if (e->line > 0) snprintf(prefix, sizeof prefix, "cfg.yaml:%d: ", e->line);
            else snprintf(prefix, sizeof prefix, "cfg.yaml: ");
            CHECK(strncmp(diag.msg, prefix, strlen(prefix)) == 0);
        }
        for (int s = 0; s < 3 && e->subs[s]; s++) CHECK_STR_CONTAINS(diag.msg, e->subs[s]);
        CHECK(strchr(diag.msg, '\n') == NULL);
        if (mxt_current_failures() != before) printf("    (case %zu: %s)\n", i, diag.msg);
        if (rc == 0) mx_config_free(&c);
    }
    mx_config c;
    mx_diag diag;
    CHECK_EQ_INT(mx_config_load_string(NULL, "x", &c, &diag), MX_ENULL);
    CHECK_EQ_INT(mx_config_load_string(MINIMAL, "x", NULL, &diag), MX_ENULL);
    CHECK_EQ_INT(mx_config_load(NULL, &c, &diag), MX_ENULL);
    CHECK_EQ_INT(load(MINIMAL "  lr: x\n", &c, NULL), MX_ECONFIG); /* diag is optional */
    /* An absurdly long unknown key is cut in the message, which stays one line. */
    char yaml[4096];
    char key[900]; /* YAML caps simple keys at 1024 characters */
    memset(key, 'k', sizeof key - 1);
    key[sizeof key - 1] = '\0';
    snprintf(yaml, sizeof yaml, MINIMAL "  %s: 1\n", key);
    CHECK_EQ_INT(load(yaml, &c, &diag), MX_ECONFIG);
    CHECK_STR_CONTAINS(diag.msg, "cfg.yaml:15: training.kkkk");
    CHECK_STR_CONTAINS(diag.msg, "...: unknown key");
}

static const mxt_test tests[] = {
    {"errors", test_errors},
    {"token_limit", test_token_limit},
};

int main(int argc, char **argv) { return MXT_RUN(tests, argc, argv); }
