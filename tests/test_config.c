/* The training configuration (SPEC §1): the whole YAML file, Hugging Face config.json through
 * model_name_or_path, defaults, YAML typing, and one-line errors for every class of mistake.
 *
 * Expected values are written out here from their sources: the numbers in the YAML text of
 * each test, Hugging Face transformers' config classes for the defaults (cited where used),
 * and hand-worked layer lists for the MoE layer rule. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "mxtrain/config.h"

static int load(const char *yaml, mx_config *cfg, mx_diag *diag) {
    return mx_config_load_string(yaml, "cfg.yaml", cfg, diag);
}

static bool is_empty(const mx_config *cfg) {
    static const mx_config zero;
    return memcmp(cfg, &zero, sizeof zero) == 0;
}

/* The origin of a key as text ("cfg.yaml:4", ".../config.json", "default"). */
static const char *origin(const mx_config *cfg, const char *key) {
    static char buf[512];
    if (mx_config_format_origin(cfg, key, buf, sizeof buf) < 0) snprintf(buf, sizeof buf, "(error)");
    return buf;
}

static const char *value(const mx_config *cfg, const char *key) {
    static char buf[512];
    if (mx_config_format_value(cfg, key, buf, sizeof buf) < 0) snprintf(buf, sizeof buf, "(error)");
    return buf;
}

/* A minimal valid config: model lines 1-7, data 8-10, training 11-14. */
#define MODEL_LLAMA                  \
    "model:\n"                       \
    "  model_type: llama\n"          \
    "  vocab_size: 257\n"            \
    "  hidden_size: 64\n"            \
    "  intermediate_size: 192\n"     \
    "  num_hidden_layers: 2\n"       \
    "  num_attention_heads: 4\n"
#define DATA                         \
    "data:\n"                        \
    "  data_path: data/train_*.bin\n" \
    "  seq_length: 64\n"
#define TRAINING                     \
    "training:\n"                    \
    "  micro_batch_size: 2\n"        \
    "  train_iters: 10\n"            \
    "  lr: 0.001\n"
#define MINIMAL MODEL_LLAMA DATA TRAINING

/* The same model lines for qwen3_moe (lines 1-7). */
#define MODEL_MOE                    \
    "model:\n"                       \
    "  model_type: qwen3_moe\n"      \
    "  vocab_size: 257\n"            \
    "  hidden_size: 64\n"            \
    "  intermediate_size: 192\n"     \
    "  num_hidden_layers: 2\n"       \
    "  num_attention_heads: 4\n"

/* The seed's block, verbatim. */
#define SEED_BLOCK                                                      \
    "  quantization_plan:\n"                                            \
    "    recipe_name: mxfp8\n"                                          \
    "    apply_modules: ['model.layers.{*}']\n"                         \
    "    ignored_modules: ['*lm_head', '*gate']\n"                      \
    "    quant_converters: ['quantize.linear.mx', 'quantize.moe.mx']\n" \
    "    enable_fsdp_low_precision_all_gather: True\n"                  \
    "    fsdp_low_precision_all_gather_mode: 'on-demand'\n"

/* ---- Examples ----------------------------------------------------------------------------- */

/* Steps and log interval: 200 and 10 for the tiny examples; the MXFP8 one is the README's
 * main job, 1000 steps on two ranks, with checkpoints. */
static void check_tiny_data_and_training(const mx_config *c, int steps, int log_interval) {
    CHECK_EQ_INT(c->data.n_data_path, 1);
    if (c->data.n_data_path == 1) CHECK_STR_EQ(c->data.data_path[0], "data/fortunes/train_*.bin");
    CHECK_EQ_INT(c->data.n_val_data_path, 1);
    if (c->data.n_val_data_path == 1) CHECK_STR_EQ(c->data.val_data_path[0], "data/fortunes/val_*.bin");
    CHECK_EQ_INT(c->data.seq_length, 128);
    CHECK_EQ_INT(c->parallel.fully_shard_parallel_size, 0); /* auto */
    CHECK_EQ_INT(c->training.micro_batch_size, 8);
    CHECK_EQ_INT(c->training.seed, 1234);
    CHECK_EQ_DBL(c->training.lr, 3e-3);
    CHECK_EQ_DBL(c->training.min_lr, 3e-4);
    CHECK_EQ_INT(c->training.lr_decay_style, MX_LR_COSINE);
    CHECK_EQ_DBL(c->training.lr_warmup_ratio, 0.05);
    CHECK_EQ_DBL(c->training.weight_decay, 0.1);
    CHECK_EQ_INT(c->training.train_iters, steps);
    CHECK_EQ_DBL(c->training.clip_grad, 1.0);
    CHECK_EQ_INT(c->training.log_interval, log_interval);
    CHECK(c->model.vocab_size >= 257); /* byte-level tokens */
}

static void test_examples(void) {
    mx_config c;
    mx_diag diag = {{0}};

    int rc = mx_config_load("examples/llama_tiny.yaml", &c, &diag);
    CHECK_EQ_INT(rc, 0);
    if (rc) printf("    %s\n", diag.msg);
    CHECK_EQ_INT(c.model.type, MX_MODEL_LLAMA);
    CHECK_EQ_INT(c.model.vocab_size, 257);
    CHECK_EQ_INT(c.model.hidden_size, 64);
    CHECK_EQ_INT(c.model.intermediate_size, 192);
    CHECK_EQ_INT(c.model.num_hidden_layers, 2);
    CHECK_EQ_INT(c.model.num_attention_heads, 4);
    CHECK_EQ_INT(c.model.num_key_value_heads, 2);
    CHECK_EQ_INT(c.model.head_dim, 16);
    CHECK_EQ_INT(c.model.max_position_embeddings, 256);
    CHECK(!c.model.tie_word_embeddings);
    CHECK_EQ_INT(c.parallel.param_dtype, MX_DTYPE_BF16);
    CHECK_EQ_INT(c.parallel.reduce_dtype, MX_DTYPE_FP32);
    CHECK(!c.features.recompute);
    CHECK(!c.training.quantization_plan.enabled);
    CHECK_STR_EQ(c.source, "examples/llama_tiny.yaml");
    check_tiny_data_and_training(&c, 200, 10);
    mx_config_free(&c);

    rc = mx_config_load("examples/qwen3_tiny.yaml", &c, &diag);
    CHECK_EQ_INT(rc, 0);
    if (rc) printf("    %s\n", diag.msg);
    CHECK_EQ_INT(c.model.type, MX_MODEL_QWEN3);
    CHECK_EQ_INT(c.model.head_dim, 16);
    CHECK_EQ_DBL(c.model.rope_theta, 1000000.0f);
    CHECK(c.model.tie_word_embeddings);
    CHECK_EQ_INT(c.training.gradient_accumulation_steps, 1);
    check_tiny_data_and_training(&c, 200, 10);
    mx_config_free(&c);

    static const char *const moe[] = {"examples/qwen3_moe_tiny.yaml", "examples/qwen3_moe_mxfp8.yaml"};
    for (int f = 0; f < 2; f++) {
        rc = mx_config_load(moe[f], &c, &diag);
        CHECK_EQ_INT(rc, 0);
        if (rc) printf("    %s\n", diag.msg);
        CHECK_EQ_INT(c.model.type, MX_MODEL_QWEN3_MOE);
        CHECK_EQ_INT(c.model.num_hidden_layers, 3);
        CHECK_EQ_INT(c.model.num_experts, 8);
        CHECK_EQ_INT(c.model.num_experts_per_tok, 2);
        CHECK_EQ_INT(c.model.moe_intermediate_size, 64);
        CHECK(c.model.norm_topk_prob);
        CHECK(c.model.output_router_logits);
        CHECK_EQ_DBL(c.model.router_aux_loss_coef, 0.001f);
        CHECK(c.model.mlp_only_layers[0] && !c.model.mlp_only_layers[1]);
        CHECK(!mx_model_layer_is_moe(&c.model, 0));
        CHECK(mx_model_layer_is_moe(&c.model, 1));
        CHECK(mx_model_layer_is_moe(&c.model, 2));
        check_tiny_data_and_training(&c, f ? 1000 : 200, f ? 50 : 10);
        const mx_plan *p = &c.training.quantization_plan;
        if (f == 0) {
            CHECK(!p->enabled);
        } else {
            CHECK(p->enabled);
            CHECK_STR_EQ(p->recipe_name, "mxfp8");
            CHECK_EQ_INT(p->n_converters, 2);
            CHECK_EQ_INT(p->converters[1], MX_CONVERTER_MOE);
            CHECK_EQ_INT(p->n_ignored, 2);
            CHECK(p->low_precision_all_gather);
            CHECK_EQ_INT(p->all_gather_mode, MX_AG_ON_DEMAND);
            CHECK_STR_EQ(c.training.save, "checkpoints/qwen3_moe_mxfp8");
            CHECK_EQ_INT(c.training.save_interval, 500);
        }
        mx_config_free(&c);
    }
}

/* ---- The seed block in a full config ---------------------------------------------------- */

static void test_seed_block(void) {
    const char *yaml = MODEL_MOE
        "  num_experts: 4\n"                      /* 8 */
        "  num_experts_per_tok: 2\n"              /* 9 */
        "  moe_intermediate_size: 32\n"           /* 10 */
        DATA                                      /* 11-13 */
        "parallel:\n"                             /* 14 */
        "  fully_shard_parallel_size: 2\n"        /* 15 */
        "features:\n"                             /* 16 */
        "  recompute: true\n"                     /* 17 */
        TRAINING                                  /* 18-21 */
        SEED_BLOCK;                               /* 22-28 */
    mx_config c;
    mx_diag diag = {{0}};
    int rc = load(yaml, &c, &diag);
    CHECK_EQ_INT(rc, 0);
    if (rc) printf("    %s\n", diag.msg);
    const mx_plan *p = &c.training.quantization_plan;
    CHECK(p->enabled);
    CHECK_STR_EQ(p->recipe_name, "mxfp8");
    CHECK_EQ_INT(p->recipe.granularity, MX_GRANULARITY_MX);
    CHECK_EQ_INT(p->n_apply, 1);
    if (p->n_apply == 1) {
        CHECK_STR_EQ(p->apply[0].text, "model.layers.{*}");
        CHECK_EQ_INT(p->apply[0].line, 24);
    }
    CHECK_EQ_INT(p->n_ignored, 2);
    if (p->n_ignored == 2) {
        CHECK_STR_EQ(p->ignored[0].text, "*lm_head");
        CHECK_STR_EQ(p->ignored[1].text, "*gate");
    }
    CHECK_EQ_INT(p->n_converters, 2);
    CHECK_EQ_INT(p->converters[0], MX_CONVERTER_LINEAR);
    CHECK_EQ_INT(p->converters[1], MX_CONVERTER_MOE);
    CHECK(p->low_precision_all_gather);
    CHECK_EQ_INT(p->all_gather_mode, MX_AG_ON_DEMAND);
    CHECK_EQ_INT(c.parallel.fully_shard_parallel_size, 2);
    CHECK(c.features.recompute);
    CHECK_EQ_INT(c.model.num_experts, 4);
    mx_config_free(&c);
    CHECK(is_empty(&c));
    mx_config_free(&c); /* twice is fine */
    mx_config_free(NULL);
}

/* ---- Defaults ------------------------------------------------------------------------------ */

static void test_defaults(void) {
    mx_config c;
    mx_diag diag = {{0}};
    int rc = load(MINIMAL, &c, &diag);
    CHECK_EQ_INT(rc, 0);
    if (rc) printf("    %s\n", diag.msg);
    /* transformers LlamaConfig.__init__: rms_norm_eps=1e-6, rope_theta=10000.0,
     * max_position_embeddings=2048, initializer_range=0.02, tie_word_embeddings=False,
     * attention_bias=False, num_key_value_heads=None -> num_attention_heads, head_dim=None ->
     * hidden_size // num_attention_heads. */
    CHECK_EQ_DBL(c.model.rms_norm_eps, 1e-6f);
    CHECK_EQ_DBL(c.model.rope_theta, 10000.0f);
    CHECK_EQ_INT(c.model.max_position_embeddings, 2048);
    CHECK_EQ_DBL(c.model.initializer_range, 0.02f);
    CHECK(!c.model.tie_word_embeddings);
    CHECK(!c.model.attention_bias);
    CHECK_EQ_INT(c.model.num_key_value_heads, 4);
    CHECK_EQ_INT(c.model.head_dim, 16);
    CHECK_EQ_INT(c.model.num_experts, 0);
    CHECK(!mx_model_layer_is_moe(&c.model, 0));
    /* The guide / docs/config.md: parallel and training defaults (lr_decay_style linear and
     * seed 1234 are Megatron-LM's defaults, which MindSpeed MM inherits). */
    CHECK_EQ_INT(c.parallel.fully_shard_parallel_size, 0);
    CHECK_EQ_INT(c.parallel.param_dtype, MX_DTYPE_BF16);
    CHECK_EQ_INT(c.parallel.reduce_dtype, MX_DTYPE_FP32);
    CHECK(c.parallel.reshard_after_forward);
    CHECK_EQ_INT(c.parallel.num_to_forward_prefetch, 1);
    CHECK_EQ_INT(c.parallel.num_to_backward_prefetch, 1);
    CHECK_EQ_DBL(c.parallel.timeout_s, 600);   // torch.distributed's default process-group timeout
    CHECK(!c.features.recompute);
    CHECK_EQ_INT(c.features.n_recompute_modules, 1);
    if (c.features.n_recompute_modules == 1) {
        CHECK_STR_EQ(c.features.recompute_modules[0].text, "model.layers.{*}");
        CHECK_EQ_INT(c.features.recompute_modules[0].line, 0);
        CHECK(mx_pattern_match(c.features.recompute_modules[0].compiled, "model.layers.12"));
    }
    CHECK_EQ_INT(c.training.gradient_accumulation_steps, 1);
    CHECK_EQ_INT(c.training.seed, 1234);
    CHECK_EQ_DBL(c.training.min_lr, 0.0);
    CHECK_EQ_INT(c.training.lr_decay_style, MX_LR_LINEAR);
    CHECK_EQ_DBL(c.training.lr_warmup_ratio, 0.0);
    CHECK_EQ_INT(c.training.global_batch_size, 0);  // not given: gradient_accumulation_steps
    CHECK_EQ_INT(c.training.lr_warmup_iters, -1);   // not given: the ratio's
    CHECK_EQ_INT(c.training.lr_decay_iters, 0);     // train_iters
    CHECK_EQ_INT(c.training.lr_wsd_decay_style, MX_WSD_EXPONENTIAL);
    CHECK_EQ_DBL(c.training.weight_decay, 0.0);
    CHECK_EQ_DBL(c.training.adam_beta1, 0.9);
    CHECK_EQ_DBL(c.training.adam_beta2, 0.95);
    CHECK_EQ_DBL(c.training.adam_eps, 1e-8);
    CHECK_EQ_DBL(c.training.clip_grad, 1.0);
    CHECK_EQ_INT(c.training.log_interval, 1);
    CHECK_EQ_INT(c.training.save_interval, 0);
    CHECK(c.training.save == NULL && c.training.load == NULL && c.training.metrics_path == NULL);
    CHECK_EQ_INT(c.data.n_val_data_path, 0);
    CHECK(c.model_name_or_path == NULL && c.hf_config_path == NULL);
    CHECK(!c.training.quantization_plan.enabled);
    CHECK_EQ_INT(c.training.quantization_plan.n_apply, 1); /* the plan's own defaults */
    mx_config_free(&c);

    /* transformers Qwen3Config.__init__: max_position_embeddings=32768, rope_theta=10000.0,
     * rms_norm_eps=1e-6. (Its head_dim=128 and num_key_value_heads=32 are Qwen3-8B's sizes;
     * mxtrain derives both as for Llama: docs/config.md.) */
    rc = load("model:\n  model_type: qwen3\n  vocab_size: 257\n  hidden_size: 64\n  intermediate_size: 192\n"
              "  num_hidden_layers: 2\n  num_attention_heads: 4\n" DATA TRAINING,
              &c, &diag);
    CHECK_EQ_INT(rc, 0);
    CHECK_EQ_INT(c.model.max_position_embeddings, 32768);
    CHECK_EQ_DBL(c.model.rope_theta, 10000.0f);
    CHECK_EQ_DBL(c.model.rms_norm_eps, 1e-6f);
    CHECK_EQ_INT(c.model.head_dim, 16);
    CHECK_EQ_INT(c.model.num_key_value_heads, 4);
    mx_config_free(&c);

    /* transformers Qwen3MoeConfig.__init__: num_experts=128, num_experts_per_tok=8,
     * moe_intermediate_size=768, norm_topk_prob=False, decoder_sparse_step=1,
     * output_router_logits=False, router_aux_loss_coef=0.001, mlp_only_layers=None -> [],
     * max_position_embeddings=32768, rope_theta=10000.0, rms_norm_eps=1e-6. */
    rc = load(MODEL_MOE DATA TRAINING, &c, &diag);
    CHECK_EQ_INT(rc, 0);
    if (rc) printf("    %s\n", diag.msg);
    CHECK_EQ_INT(c.model.num_experts, 128);
    CHECK_EQ_INT(c.model.num_experts_per_tok, 8);
    CHECK_EQ_INT(c.model.moe_intermediate_size, 768);
    CHECK(!c.model.norm_topk_prob);
    CHECK_EQ_INT(c.model.decoder_sparse_step, 1);
    CHECK(!c.model.output_router_logits);
    CHECK_EQ_DBL(c.model.router_aux_loss_coef, 0.001f);
    CHECK_EQ_INT(c.model.max_position_embeddings, 32768);
    CHECK_EQ_DBL(c.model.rope_theta, 10000.0f);
    CHECK_EQ_DBL(c.model.rms_norm_eps, 1e-6f);
    for (int i = 0; i < MX_MAX_LAYERS; i++) CHECK(!c.model.mlp_only_layers[i]);
    CHECK(mx_model_layer_is_moe(&c.model, 0) && mx_model_layer_is_moe(&c.model, 1));
    mx_config_free(&c);

    /* null means "the default" where Hugging Face's default is None. */
    rc = load(MODEL_MOE "  num_key_value_heads: null\n  head_dim: ~\n  mlp_only_layers:\n"
              "data:\n  data_path: [a.bin, 'b_*.bin']\n  val_data_path: null\n  seq_length: 64\n" TRAINING
              "  save: ~\n",
              &c, &diag);
    CHECK_EQ_INT(rc, 0);
    if (rc) printf("    %s\n", diag.msg);
    CHECK_EQ_INT(c.model.num_key_value_heads, 4);
    CHECK_EQ_INT(c.model.head_dim, 16);
    CHECK_STR_EQ(origin(&c, "model.head_dim"), "default");
    CHECK_EQ_INT(c.data.n_data_path, 2);
    if (c.data.n_data_path == 2) CHECK_STR_EQ(c.data.data_path[1], "b_*.bin");
    CHECK_EQ_INT(c.data.n_val_data_path, 0);
    CHECK(c.training.save == NULL);
    mx_config_free(&c);
}

/* ---- Every key, given ---------------------------------------------------------------------- */

static void test_every_key(void) {
    const char *yaml =
        "model:\n"
        "  model_type: qwen3_moe\n"
        "  vocab_size: 300\n"
        "  hidden_size: 96\n"
        "  intermediate_size: 160\n"
        "  num_hidden_layers: 6\n"
        "  num_attention_heads: 6\n"
        "  num_key_value_heads: 3\n"
        "  head_dim: 8\n"
        "  rms_norm_eps: 1.0e-5\n"
        "  rope_theta: 500000\n"
        "  max_position_embeddings: 512\n"
        "  tie_word_embeddings: yes\n"
        "  attention_bias: on\n"
        "  initializer_range: 0.01\n"
        "  num_experts: 6\n"
        "  num_experts_per_tok: 3\n"
        "  moe_intermediate_size: 48\n"
        "  norm_topk_prob: True\n"
        "  decoder_sparse_step: 2\n"
        "  mlp_only_layers: [3]\n"
        "  output_router_logits: true\n"
        "  router_aux_loss_coef: 0.01\n"
        "  hidden_act: silu\n"
        "  attention_dropout: 0.0\n"
        "  use_sliding_window: false\n"
        "  mlp_bias: false\n"
        "  rope_scaling: null\n"
        "  layer_types: [full_attention, full_attention]\n"
        "data:\n"
        "  data_path: 'd/train_*.bin'\n"
        "  val_data_path: [d/val_000000.bin]\n"
        "  seq_length: 512\n"
        "parallel:\n"
        "  fully_shard_parallel_size: 4\n"
        "  data_parallel_size: 2\n"
        "  fsdp_plan:\n"
        "    param_dtype: float32\n"
        "    reduce_dtype: bfloat16\n"
        "    reshard_after_forward: false\n"
        "    num_to_forward_prefetch: 0\n"
        "    num_to_backward_prefetch: 2\n"
        "  timeout_s: 30.5\n"
        "features:\n"
        "  recompute: true\n"
        "  recompute_plan:\n"
        "    apply_modules: ['model.layers.{0-2}', 'model.layers.5.mlp']\n"
        "training:\n"
        "  micro_batch_size: 3\n"
        "  gradient_accumulation_steps: 4\n"
        "  seed: 42\n"
        "  lr: 6.0e-4\n"
        "  min_lr: 6.0e-5\n"
        "  lr_decay_style: constant\n"
        "  lr_warmup_ratio: 0.1\n"
        "  weight_decay: 0.05\n"
        "  adam_beta1: 0.8\n"
        "  adam_beta2: 0.99\n"
        "  adam_eps: 1.0e-6\n"
        "  train_iters: 1000\n"
        "  clip_grad: 0\n"
        "  log_interval: 5\n"
        "  save_interval: 100\n"
        "  save: ckpt/run1\n"
        "  load: ckpt/run0\n"
        "  metrics_path: runs/metrics.jsonl\n";
    mx_config c;
    mx_diag diag = {{0}};
    int rc = load(yaml, &c, &diag);
    CHECK_EQ_INT(rc, 0);
    if (rc) {
        printf("    %s\n", diag.msg);
        return;
    }
    const mx_model_config *m = &c.model;
    CHECK_EQ_INT(m->type, MX_MODEL_QWEN3_MOE);
    CHECK_EQ_INT(m->vocab_size, 300);
    CHECK_EQ_INT(m->hidden_size, 96);
    CHECK_EQ_INT(m->intermediate_size, 160);
    CHECK_EQ_INT(m->num_hidden_layers, 6);
    CHECK_EQ_INT(m->num_attention_heads, 6);
    CHECK_EQ_INT(m->num_key_value_heads, 3);
    CHECK_EQ_INT(m->head_dim, 8);
    CHECK_EQ_DBL(m->rms_norm_eps, 1e-5f);
    CHECK_EQ_DBL(m->rope_theta, 500000.0f);
    CHECK_EQ_INT(m->max_position_embeddings, 512);
    CHECK(m->tie_word_embeddings);
    CHECK(m->attention_bias);
    CHECK_EQ_DBL(m->initializer_range, 0.01f);
    CHECK_EQ_INT(m->num_experts, 6);
    CHECK_EQ_INT(m->num_experts_per_tok, 3);
    CHECK_EQ_INT(m->moe_intermediate_size, 48);
    CHECK(m->norm_topk_prob);
    CHECK_EQ_INT(m->decoder_sparse_step, 2);
    CHECK(m->output_router_logits);
    CHECK_EQ_DBL(m->router_aux_loss_coef, 0.01f);
    /* Layer i is MoE iff i not in [3] and (i+1) % 2 == 0: layers 1 and 5 (3 is forced dense). */
    static const bool want_moe[6] = {false, true, false, false, false, true};
    for (int i = 0; i < 6; i++) CHECK_EQ_INT(mx_model_layer_is_moe(m, i), want_moe[i]);
    CHECK_EQ_INT(c.data.n_data_path, 1);
    CHECK_STR_EQ(c.data.data_path[0], "d/train_*.bin");
    CHECK_STR_EQ(c.data.val_data_path[0], "d/val_000000.bin");
    CHECK_EQ_INT(c.data.seq_length, 512);
    CHECK_EQ_INT(c.parallel.fully_shard_parallel_size, 4);
    CHECK_EQ_INT(c.parallel.data_parallel_size, 2);
    CHECK_EQ_INT(c.parallel.param_dtype, MX_DTYPE_FP32);
    CHECK_EQ_INT(c.parallel.reduce_dtype, MX_DTYPE_BF16);
    CHECK(!c.parallel.reshard_after_forward);
    CHECK_EQ_INT(c.parallel.num_to_forward_prefetch, 0);
    CHECK_EQ_INT(c.parallel.num_to_backward_prefetch, 2);
    CHECK_EQ_DBL(c.parallel.timeout_s, 30.5);
    CHECK(c.features.recompute);
    CHECK_EQ_INT(c.features.n_recompute_modules, 2);
    if (c.features.n_recompute_modules == 2) {
        CHECK_STR_EQ(c.features.recompute_modules[1].text, "model.layers.5.mlp");
        CHECK_EQ_INT(c.features.recompute_modules[1].line, 47);
        CHECK(mx_pattern_match(c.features.recompute_modules[0].compiled, "model.layers.2"));
        CHECK(!mx_pattern_match(c.features.recompute_modules[0].compiled, "model.layers.3"));
    }
    const mx_training_config *t = &c.training;
    CHECK_EQ_INT(t->micro_batch_size, 3);
    CHECK_EQ_INT(t->gradient_accumulation_steps, 4);
    CHECK_EQ_INT(t->seed, 42);
    CHECK_EQ_DBL(t->lr, 6e-4);
    CHECK_EQ_DBL(t->min_lr, 6e-5);
    CHECK_EQ_INT(t->lr_decay_style, MX_LR_CONSTANT);
    CHECK_EQ_DBL(t->lr_warmup_ratio, 0.1);
    CHECK_EQ_DBL(t->weight_decay, 0.05);
    CHECK_EQ_DBL(t->adam_beta1, 0.8);
    CHECK_EQ_DBL(t->adam_beta2, 0.99);
    CHECK_EQ_DBL(t->adam_eps, 1e-6);
    CHECK_EQ_INT(t->train_iters, 1000);
    CHECK_EQ_DBL(t->clip_grad, 0.0);
    CHECK_EQ_INT(t->log_interval, 5);
    CHECK_EQ_INT(t->save_interval, 100);
    CHECK_STR_EQ(t->save, "ckpt/run1");
    CHECK_STR_EQ(t->load, "ckpt/run0");
    CHECK_STR_EQ(t->metrics_path, "runs/metrics.jsonl");

    /* Origins and values by name. */
    CHECK_STR_EQ(origin(&c, "model.hidden_size"), "cfg.yaml:4");
    CHECK_STR_EQ(origin(&c, "training.metrics_path"), "cfg.yaml:66");
    CHECK_STR_EQ(origin(&c, "parallel.fsdp_plan.reduce_dtype"), "cfg.yaml:39");
    CHECK_STR_EQ(origin(&c, "parallel.data_parallel_size"), "cfg.yaml:36");
    CHECK_STR_EQ(value(&c, "parallel.fsdp_plan.reduce_dtype"), "bf16");
    CHECK_STR_EQ(value(&c, "parallel.fully_shard_parallel_size"), "4");
    CHECK_STR_EQ(value(&c, "parallel.data_parallel_size"), "2");
    CHECK_STR_EQ(value(&c, "parallel.timeout_s"), "30.5");
    CHECK_STR_EQ(origin(&c, "parallel.timeout_s"), "cfg.yaml:43");
    CHECK_STR_EQ(value(&c, "model.rms_norm_eps"), "1e-05");
    CHECK_STR_EQ(value(&c, "model.model_type"), "qwen3_moe");
    CHECK_STR_EQ(value(&c, "model.mlp_only_layers"), "[3]");
    CHECK_STR_EQ(value(&c, "model.tie_word_embeddings"), "true");
    CHECK_STR_EQ(value(&c, "training.lr"), "0.0006");
    CHECK_STR_EQ(value(&c, "training.seed"), "42");
    CHECK_STR_EQ(value(&c, "data.val_data_path"), "['d/val_000000.bin']");
    CHECK_STR_EQ(value(&c, "features.recompute_plan.apply_modules"), "['model.layers.{0-2}', 'model.layers.5.mlp']");
    CHECK_STR_EQ(value(&c, "model.model_name_or_path"), "null");
    mx_config_free(&c);
}

/* ---- Settings by name ---------------------------------------------------------------------- */

static void test_settings_by_name(void) {
    int n = mx_config_key_count();
    CHECK(n >= 50 && n <= MX_CONFIG_MAX_KEYS);
    bool seen_hidden = false, seen_lr = false, seen_act = false, seen_plan = false;
    for (int i = 0; i < n; i++) {
        const char *k = mx_config_key_name(i);
        CHECK(k != NULL);
        if (!k) continue;
        seen_hidden |= !strcmp(k, "model.hidden_size");
        seen_lr |= !strcmp(k, "training.lr");
        seen_act |= !strcmp(k, "model.hidden_act");
        seen_plan |= !strcmp(k, "training.quantization_plan") || !strcmp(k, "model");
    }
    CHECK(seen_hidden && seen_lr && !seen_act && !seen_plan);
    CHECK(mx_config_key_name(n) == NULL);
    CHECK(mx_config_key_name(-1) == NULL);

    mx_config c;
    mx_diag diag;
    CHECK_EQ_INT(load(MINIMAL "  save: 'it''s here'\n", &c, &diag), 0);
    char buf[64];
    mx_origin o;
    CHECK_EQ_INT(mx_config_origin(&c, "training.lr", &o), 0);
    CHECK_EQ_INT(o.kind, MX_ORIGIN_YAML);
    CHECK_EQ_INT(o.line, 14);
    CHECK_EQ_INT(mx_config_origin(&c, "training.seed", &o), 0);
    CHECK_EQ_INT(o.kind, MX_ORIGIN_DEFAULT);
    CHECK_EQ_INT(o.line, 0);
    CHECK_EQ_INT(mx_config_origin(&c, "training.nope", &o), MX_EINVAL);
    CHECK_EQ_INT(mx_config_origin(NULL, "training.lr", &o), MX_ENULL);
    CHECK_STR_EQ(origin(&c, "model.head_dim"), "default");
    CHECK_STR_EQ(value(&c, "model.head_dim"), "16");
    CHECK_STR_EQ(value(&c, "training.save"), "'it''s here'");
    CHECK_STR_EQ(value(&c, "parallel.fully_shard_parallel_size"), "auto");
    CHECK_STR_EQ(value(&c, "parallel.data_parallel_size"), "auto");
    CHECK_EQ_INT(c.parallel.data_parallel_size, 0);
    CHECK_STR_EQ(value(&c, "training.lr_decay_style"), "linear");
    CHECK_STR_EQ(value(&c, "training.adam_eps"), "1e-08");
    CHECK_STR_EQ(value(&c, "model.rope_theta"), "10000");
    CHECK_STR_EQ(value(&c, "model.mlp_only_layers"), "[]");
    CHECK_EQ_INT(mx_config_format_value(&c, "model.hidden_act", buf, sizeof buf), MX_EINVAL);
    CHECK_EQ_INT(mx_config_format_value(&c, "model", buf, sizeof buf), MX_EINVAL);
    /* snprintf-like: the full length comes back even when cut. */
    CHECK_EQ_INT(mx_config_format_value(&c, "data.data_path", buf, 4), (int)strlen("['data/train_*.bin']"));
    CHECK_STR_EQ(buf, "['d");
    CHECK_EQ_INT(mx_config_format_origin(&c, "training.lr", buf, sizeof buf), (int)strlen("cfg.yaml:14"));
    mx_config_free(&c);
}

/* ---- YAML typing: PyYAML's rules, and the numeric-string leniency ---------------------------- */

static void test_yaml_typing(void) {
    /* lr as written -> the value expected (PyYAML: `3e-4` is a string, `3.0e-4` a float,
     * `1.0e4` a string again: YAML 1.1 floats need a dot and a signed exponent). */
    static const struct {
        const char *text;
        double want;
    } lrs[] = {
        {"3e-4", 3e-4}, {"3.0e-4", 3e-4}, {"0.0003", 3e-4}, {"1E-3", 1e-3}, {"+5e-1", 0.5},
        {"1.0e4", 1e4}, {"2", 2.0},       {".5", 0.5},      {"1_000.5", 1000.5}, {"7.", 7.0},
    };
    for (size_t i = 0; i < sizeof lrs / sizeof lrs[0]; i++) {
        char yaml[1024];
        snprintf(yaml, sizeof yaml, MODEL_LLAMA DATA "training:\n  micro_batch_size: 2\n  train_iters: 10\n  lr: %s\n",
                 lrs[i].text);
        mx_config c;
        mx_diag diag = {{0}};
        int rc = load(yaml, &c, &diag);
        CHECK_EQ_INT(rc, 0);
        if (rc) printf("    lr: %s: %s\n", lrs[i].text, diag.msg);
        CHECK_EQ_DBL(c.training.lr, lrs[i].want);
        mx_config_free(&c);
    }

    /* Integers in YAML 1.1 forms, as PyYAML reads them: hex, underscores, a leading 0 is
     * octal (010 = 8), base 60 (1:30 = 90). */
    const char *ints = "model:\n  model_type: llama\n  vocab_size: 0x101\n  hidden_size: 0b1000000\n"
                       "  intermediate_size: 1_92\n  num_hidden_layers: 010\n  num_attention_heads: +4\n"
                       "data:\n  data_path: x.bin\n  seq_length: 1:30\n" TRAINING;
    mx_config c;
    mx_diag diag = {{0}};
    int rc = load(ints, &c, &diag);
    CHECK_EQ_INT(rc, 0);
    if (rc) printf("    %s\n", diag.msg);
    CHECK_EQ_INT(c.model.vocab_size, 257);
    CHECK_EQ_INT(c.model.hidden_size, 64);
    CHECK_EQ_INT(c.model.intermediate_size, 192);
    CHECK_EQ_INT(c.model.num_hidden_layers, 8);
    CHECK_EQ_INT(c.model.num_attention_heads, 4);
    CHECK_EQ_INT(c.data.seq_length, 90);
    mx_config_free(&c);

    /* Booleans: PyYAML's words, and explicit tags. */
    rc = load(MINIMAL "parallel:\n  fsdp_plan:\n    reshard_after_forward: Off\nfeatures:\n  recompute: !!bool 'yes'\n",
              &c, &diag);
    CHECK_EQ_INT(rc, 0);
    CHECK(!c.parallel.reshard_after_forward);
    CHECK(c.features.recompute);
    mx_config_free(&c);
    CHECK_EQ_INT(load(MINIMAL, &c, &diag), 0);
    CHECK(c.training.save_parallel);   // every rank writes its rows unless told otherwise
    CHECK_EQ_INT(c.training.keep_latest_k, 0);   // every checkpoint stays unless told otherwise
    mx_config_free(&c);
    CHECK_EQ_INT(load(MINIMAL "  save: ck\n  keep_latest_k: 3\n", &c, &diag), 0);
    CHECK_EQ_INT(c.training.keep_latest_k, 3);
    mx_config_free(&c);
    CHECK_EQ_INT(load(MINIMAL, &c, &diag), 0);   // no early exits unless asked for
    CHECK_EQ_INT(c.training.exit_interval, 0);
    mx_config_free(&c);
    CHECK_EQ_INT(load(MINIMAL "  lr_decay_style: WSD\n  lr_wsd_decay_iters: 3\n  lr_wsd_decay_style: minus_sqrt\n"
                              "  lr_warmup_iters: 2\n  lr_decay_iters: 8\n", &c, &diag), 0);
    CHECK_EQ_INT(c.training.lr_decay_style, MX_LR_WSD);
    CHECK_EQ_INT(c.training.lr_wsd_decay_iters, 3);
    CHECK_EQ_INT(c.training.lr_wsd_decay_style, MX_WSD_MINUS_SQRT);
    CHECK_EQ_INT(c.training.lr_warmup_iters, 2);
    CHECK_EQ_INT(c.training.lr_decay_iters, 8);
    mx_config_free(&c);
    // Megatron's blend: weights before their datasets' paths
    CHECK_EQ_INT(load(MODEL_LLAMA "data:\n  data_path: [0.7, a_*.bin, 3e-1, b.bin]\n  seq_length: 64\n"
                      "  val_data_path: [1, v.bin]\n" TRAINING, &c, &diag), 0);
    CHECK_EQ_INT(c.data.n_data_path, 2);
    if (c.data.data_weights && c.data.n_data_path == 2) {
        CHECK_EQ_DBL(c.data.data_weights[0], 0.7);
        CHECK_EQ_DBL(c.data.data_weights[1], 0.3);
        CHECK_STR_EQ(c.data.data_path[1], "b.bin");
    }
    CHECK(c.data.val_data_weights != NULL);
    CHECK_STR_EQ(value(&c, "data.data_path"), "[0.7, 'a_*.bin', 0.3, 'b.bin']");
    mx_config_free(&c);
    CHECK_EQ_INT(load(MODEL_LLAMA "data:\n  data_path: ['0.5', a.bin]\n  seq_length: 64\n" TRAINING, &c, &diag), 0);
    CHECK(c.data.data_weights == NULL);   // quoted: a file named 0.5, not a weight
    mx_config_free(&c);
    CHECK_EQ_INT(load(MINIMAL, &c, &diag), 0);
    CHECK(c.data.data_weights == NULL);
    CHECK(!c.data.shuffle);   // llm.c's order unless asked
    mx_config_free(&c);
    CHECK_EQ_INT(load(MODEL_LLAMA "data:\n  data_path: a.bin\n  seq_length: 64\n  shuffle: true\n" TRAINING, &c, &diag), 0);
    CHECK(c.data.shuffle);
    mx_config_free(&c);
    CHECK_EQ_INT(load(MINIMAL "  global_batch_size: 24\n", &c, &diag), 0);
    CHECK_EQ_INT(c.training.global_batch_size, 24);
    mx_config_free(&c);
    CHECK_EQ_INT(load(MINIMAL "  lr_decay_style: wsd\n  lr_wsd_decay_iters: 10\n", &c, &diag), 0);
    CHECK_EQ_INT(c.training.lr_decay_style, MX_LR_WSD);
    mx_config_free(&c);
    CHECK_EQ_INT(load(MINIMAL, &c, &diag), 0);
    CHECK(c.training.exit_duration_in_mins == 0);
    CHECK(!c.training.exit_signal_handler);
    mx_config_free(&c);
    CHECK_EQ_INT(load(MINIMAL "  exit_interval: 500\n  exit_duration_in_mins: 230.5\n  exit_signal_handler: true\n",
                      &c, &diag), 0);
    CHECK_EQ_INT(c.training.exit_interval, 500);
    CHECK(c.training.exit_duration_in_mins == 230.5);
    CHECK(c.training.exit_signal_handler);
    mx_config_free(&c);
    CHECK_EQ_INT(load(MINIMAL "  save_parallel: false\n", &c, &diag), 0);
    CHECK(!c.training.save_parallel);
    mx_config_free(&c);
    /* Anchors and aliases work as in any YAML. */
    rc = load("sizes: &n 64\n" MINIMAL, &c, &diag);
    CHECK_EQ_INT(rc, MX_ECONFIG); /* but an unknown section is still unknown */
    rc = load(MODEL_LLAMA "  max_position_embeddings: &n 64\ndata:\n  data_path: x.bin\n  seq_length: *n\n" TRAINING,
              &c, &diag);
    CHECK_EQ_INT(rc, 0);
    CHECK_EQ_INT(c.data.seq_length, 64);
    mx_config_free(&c);
}

/* ---- Errors ------------------------------------------------------------------------------- */

typedef struct {
    const char *yaml;
    int rc;
    int line;            /* the "cfg.yaml:LINE: " prefix; 0: "cfg.yaml: " with no line; -1: not checked */
    const char *subs[3]; /* substrings of the message */
} error_case;

#define MOE_LINES MODEL_MOE DATA TRAINING

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
     {"data: an empty value is not a mapping (allowed: a mapping with keys data_path, seq_length, val_data_path, shuffle)"}},
    {MINIMAL "features:\n  recompute_plan: [model.layers.0]\n", MX_ECONFIG, 16,
     {"features.recompute_plan: a list is not a mapping (allowed: a mapping with key apply_modules)"}},
    {"- model\n", MX_ECONFIG, 1, {"the config is a list, not a mapping of sections"}},
    {MINIMAL "  ? [a]\n  : b\n", MX_ECONFIG, 15, {"training: a list is not a key (allowed: micro_batch_size,"}},
    {"base: &b {lr: 1}\n" MINIMAL, MX_ECONFIG, 1, {"base: unknown key (allowed: model, data"}},
    {MODEL_LLAMA DATA "training:\n  <<: {lr: 0.1}\n  micro_batch_size: 2\n  train_iters: 1\n", MX_ECONFIG, 12,
     {"training.<<: YAML merge keys are not supported; write the keys out"}},
    {MINIMAL "---\nmodel: {}\n", MX_ECONFIG, 15, {"a second YAML document starts here (allowed: one document)"}},
    {MINIMAL "  lr: [0.1\n", MX_ECONFIG, -1, {"cfg.yaml:16:1: YAML syntax error"}},

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

    /* Required keys and sections. */
    {"", MX_ECONFIG, 0, {"cfg.yaml: model: required section missing"}},
    {"# nothing\n", MX_ECONFIG, 0, {"cfg.yaml: model: required section missing"}},
    {MODEL_LLAMA TRAINING, MX_ECONFIG, 0,
     {"cfg.yaml: data: required section missing (allowed: a mapping with keys data_path, seq_length, val_data_path, shuffle)"}},
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

/* ---- Files -------------------------------------------------------------------------------- */

static char tmpdir[64];
static char ckpt[128], ckpt_json[160];

/* A fresh directory for the test's files, holding an empty checkpoint directory ckpt. */
static void setup(void) {
    snprintf(tmpdir, sizeof tmpdir, "%s", mxt_tmp_mkdir("config"));
    snprintf(ckpt, sizeof ckpt, "%s", mxt_tmp_mkdir("config/ckpt"));
    snprintf(ckpt_json, sizeof ckpt_json, "%s/config.json", ckpt);
}

static void teardown(void) { (void)mxt_remove_tree(tmpdir); }

/* Settings given over the file's (mxtrain's --SECTION.KEY VALUE). */
static void test_overrides(void) {
    setup();
    char path[128], want[256];
    snprintf(path, sizeof path, "%s/ov.yaml", tmpdir);
    mxt_write_text(path, MINIMAL);
    mx_config c;
    mx_diag diag = {{0}};
    // replaced, added in a section the file does not have, a list, a nullable key's null
    mx_config_override ov[] = {{"training.lr", "3e-4"}, {"parallel.fsdp_plan.param_dtype", "fp32"},
                               {"data.data_path", "[a.bin, b.bin]"}, {"model.rope_scaling", "null"}};
    CHECK_EQ_INT(mx_config_load_with(path, ov, 4, &c, &diag), 0);
    CHECK_EQ_DBL(c.training.lr, 3e-4);
    CHECK_EQ_INT(c.parallel.param_dtype, MX_DTYPE_FP32);
    CHECK_EQ_INT(c.data.n_data_path, 2);
    if (c.data.n_data_path == 2) CHECK_STR_EQ(c.data.data_path[1], "b.bin");
    CHECK_STR_EQ(origin(&c, "training.lr"), "command line");
    CHECK_STR_EQ(origin(&c, "parallel.fsdp_plan.param_dtype"), "command line");
    snprintf(want, sizeof want, "%s:12", path);
    CHECK_STR_EQ(origin(&c, "training.micro_batch_size"), want);   // the file's stay the file's
    mx_config_free(&c);
    // an alias replaces the key the file wrote
    mxt_write_text(path, MODEL_MOE "  num_experts: 8\n  num_experts_per_tok: 2\n" DATA TRAINING);
    mx_config_override alias[] = {{"model.num_local_experts", "16"}};
    CHECK_EQ_INT(mx_config_load_with(path, alias, 1, &c, &diag), 0);
    CHECK_EQ_INT(c.model.num_experts, 16);
    mx_config_free(&c);
    mxt_write_text(path, MINIMAL);
    static const struct { mx_config_override ov; const char *msg; } bad[] = {
        {{"training.lr", "abc"}, "command line: training.lr: 'abc' is not a number (allowed: a number > 0)"},
        {{"training.min_lr", "0.5"}, "command line: training.min_lr: 0.5 is more than lr 0.001 (line 14) (allowed: 0 to lr)"},
        {{"training.lrr", "1"}, "command line: --training.lrr: unknown key 'lrr'; did you mean 'lr'? (allowed: "},
        {{"trainig.lr", "1"}, "command line: --trainig.lr: unknown section 'trainig'; did you mean 'training'? (allowed: "
                              "model, data, parallel, features, training)"},
        {{"training.quantization_plan.recipe_name", "mxfp8"}, "command line: --training.quantization_plan.recipe_name: "
                                                             "the quantization plan is set in the config file only"},
        {{"parallel.fsdp_plan", "1"}, "command line: --parallel.fsdp_plan: is a section (allowed: one of its settings: "
                                      "param_dtype, "},
        {{"training.lr.x", "1"}, "command line: --training.lr.x: training.lr is a setting, not a section"},
        {{"training.lr", ""}, "command line: --training.lr: no value"},
        {{"data.data_path", "[a.bin,"}, "command line: --data.data_path:"},   // then libyaml's message
        {{"model.num_experts", "4"}, "command line: model.num_experts: given for model_type llama, but it applies only "
                                     "to qwen3_moe"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK_EQ_INT(mx_config_load_with(path, &bad[i].ov, 1, &c, &diag), MX_ECONFIG);
        CHECK_STR_CONTAINS(diag.msg, bad[i].msg);
        CHECK(is_empty(&c));
    }
    mx_config_override twice[] = {{"training.lr", "1"}, {"training.lr", "2"}};
    CHECK_EQ_INT(mx_config_load_with(path, twice, 2, &c, &diag), MX_ECONFIG);
    CHECK_STR_EQ(diag.msg, "command line: --training.lr: training.lr is given twice (allowed: once)");
    unlink(path);
}

static void test_load_file(void) {
    setup();
    char path[128];
    snprintf(path, sizeof path, "%s/run.yaml", tmpdir);
    mxt_write_text(path, MINIMAL);
    mx_config c;
    mx_diag diag = {{0}};
    CHECK_EQ_INT(mx_config_load(path, &c, &diag), 0);
    CHECK_STR_EQ(c.source, path);
    char want[256];
    snprintf(want, sizeof want, "%s:14", path);
    CHECK_STR_EQ(origin(&c, "training.lr"), want);
    mx_config_free(&c);

    mxt_write_text(path, MINIMAL "  lr_decay_style: Cosine\n");
    CHECK_EQ_INT(mx_config_load(path, &c, &diag), MX_ECONFIG);
    snprintf(want, sizeof want, "%s:15: training.lr_decay_style: 'Cosine' is not allowed", path);
    CHECK_STR_CONTAINS(diag.msg, want);
    CHECK(is_empty(&c));
    unlink(path);

    CHECK_EQ_INT(mx_config_load(path, &c, &diag), MX_EIO);
    snprintf(want, sizeof want, "%s: cannot open", path);
    CHECK_STR_CONTAINS(diag.msg, want);
    CHECK(is_empty(&c));
    CHECK_EQ_INT(mx_config_load(tmpdir, &c, &diag), MX_EIO);
    snprintf(want, sizeof want, "%s: is a directory (allowed: a YAML config file)", tmpdir);
    CHECK_STR_EQ(diag.msg, want);
    // a FIFO is refused without waiting for a writer (a plain open() blocks forever; the
    // alarm ends the test if it does), /dev/zero without reading it
    alarm(30);
    snprintf(path, sizeof path, "%s/fifo.yaml", tmpdir);
    CHECK_EQ_INT(mkfifo(path, 0600), 0);
    CHECK_EQ_INT(mx_config_load(path, &c, &diag), MX_EIO);
    snprintf(want, sizeof want, "%s: is a FIFO, not a regular file (allowed: a YAML config file)", path);
    CHECK_STR_EQ(diag.msg, want);
    unlink(path);
    alarm(0);
    CHECK_EQ_INT(mx_config_load("/dev/zero", &c, &diag), MX_EIO);
    CHECK_STR_EQ(diag.msg, "/dev/zero: is a character device, not a regular file (allowed: a YAML config file)");
    CHECK(is_empty(&c));
    // at most 16 MiB: one byte more is refused by its size; exactly 16 MiB (of NUL bytes) is
    // read and fails as YAML
    snprintf(path, sizeof path, "%s/big.yaml", tmpdir);
    for (int extra = 1; extra >= 0; extra--) {
        FILE *f = fopen(path, "w");
        CHECK(f != NULL && ftruncate(fileno(f), (16 << 20) + extra) == 0);
        if (f) fclose(f);
        int rc = mx_config_load(path, &c, &diag);
        snprintf(want, sizeof want, "%s: is 16777217 bytes (allowed: a YAML config file of at most 16 MiB)", path);
        if (extra) {
            CHECK_EQ_INT(rc, MX_EIO);
            CHECK_STR_EQ(diag.msg, want);
        } else {
            CHECK(rc != 0 && rc != MX_EIO);
            CHECK(strstr(diag.msg, "at most 16 MiB") == NULL);
        }
        CHECK(is_empty(&c));
    }
    unlink(path);
    teardown();
}

/* ---- model_name_or_path: a Hugging Face config.json ---------------------------------------- */

/* Qwen3-30B-A3B's config.json (Hugging Face Qwen/Qwen3-30B-A3B), key for key. */
static const char qwen3_30b_a3b[] =
    "{\n"
    "  \"architectures\": [\"Qwen3MoeForCausalLM\"],\n"
    "  \"attention_bias\": false,\n"
    "  \"attention_dropout\": 0.0,\n"
    "  \"bos_token_id\": 151643,\n"
    "  \"decoder_sparse_step\": 1,\n"
    "  \"eos_token_id\": 151645,\n"
    "  \"head_dim\": 128,\n"
    "  \"hidden_act\": \"silu\",\n"
    "  \"hidden_size\": 2048,\n"
    "  \"initializer_range\": 0.02,\n"
    "  \"intermediate_size\": 6144,\n"
    "  \"max_position_embeddings\": 40960,\n"
    "  \"max_window_layers\": 48,\n"
    "  \"mlp_only_layers\": [],\n"
    "  \"model_type\": \"qwen3_moe\",\n"
    "  \"moe_intermediate_size\": 768,\n"
    "  \"norm_topk_prob\": true,\n"
    "  \"num_attention_heads\": 32,\n"
    "  \"num_experts\": 128,\n"
    "  \"num_experts_per_tok\": 8,\n"
    "  \"num_hidden_layers\": 48,\n"
    "  \"num_key_value_heads\": 4,\n"
    "  \"output_router_logits\": false,\n"
    "  \"rms_norm_eps\": 1e-06,\n"
    "  \"rope_scaling\": null,\n"
    "  \"rope_theta\": 1000000.0,\n"
    "  \"router_aux_loss_coef\": 0.001,\n"
    "  \"sliding_window\": null,\n"
    "  \"tie_word_embeddings\": false,\n"
    "  \"torch_dtype\": \"bfloat16\",\n"
    "  \"transformers_version\": \"4.51.0\",\n"
    "  \"use_cache\": true,\n"
    "  \"use_sliding_window\": false,\n"
    "  \"vocab_size\": 151936\n"
    "}\n";

/* Llama-3.2-1B's config.json: its llama3 rope_scaling is what mxtrain cannot honour. */
static const char llama32_1b[] =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"attention_bias\": false, \"attention_dropout\": 0.0,\n"
    " \"bos_token_id\": 128000, \"eos_token_id\": 128001, \"head_dim\": 64, \"hidden_act\": \"silu\",\n"
    " \"hidden_size\": 2048, \"initializer_range\": 0.02, \"intermediate_size\": 8192,\n"
    " \"max_position_embeddings\": 131072, \"mlp_bias\": false, \"model_type\": \"llama\",\n"
    " \"num_attention_heads\": 32, \"num_hidden_layers\": 16, \"num_key_value_heads\": 8, \"pretraining_tp\": 1,\n"
    " \"rms_norm_eps\": 1e-05, \"rope_scaling\": {\"factor\": 32.0, \"high_freq_factor\": 4.0, \"low_freq_factor\": 1.0,\n"
    " \"original_max_position_embeddings\": 8192, \"rope_type\": \"llama3\"}, \"rope_theta\": 500000.0,\n"
    " \"tie_word_embeddings\": true, \"torch_dtype\": \"bfloat16\", \"transformers_version\": \"4.45.0.dev0\",\n"
    " \"use_cache\": true, \"vocab_size\": 128256}\n";

/* Write config.json into the checkpoint directory, load `model:\n  model_name_or_path: CKPT\n`
 * + extra model lines + DATA + TRAINING. */
static int load_hf(const char *json, const char *extra, mx_config *c, mx_diag *diag) {
    if (json) mxt_write_text(ckpt_json, json);
    char yaml[4096];
    snprintf(yaml, sizeof yaml, "model:\n  model_name_or_path: %s\n%s" DATA TRAINING, ckpt, extra);
    return load(yaml, c, diag);
}

static void test_hf_config(void) {
    setup();
    mx_config c;
    mx_diag diag = {{0}};
    char want[512];
    /* The whole file as it is: a 48-layer, 128-expert model. */
    int rc = load_hf(qwen3_30b_a3b, "", &c, &diag);
    CHECK_EQ_INT(rc, 0);
    if (rc) printf("    %s\n", diag.msg);
    const mx_model_config *m = &c.model;
    CHECK_EQ_INT(m->type, MX_MODEL_QWEN3_MOE);
    CHECK_EQ_INT(m->vocab_size, 151936);
    CHECK_EQ_INT(m->hidden_size, 2048);
    CHECK_EQ_INT(m->intermediate_size, 6144);
    CHECK_EQ_INT(m->num_hidden_layers, 48);
    CHECK_EQ_INT(m->num_attention_heads, 32);
    CHECK_EQ_INT(m->num_key_value_heads, 4);
    CHECK_EQ_INT(m->head_dim, 128);
    CHECK_EQ_DBL(m->rms_norm_eps, 1e-6f);
    CHECK_EQ_DBL(m->rope_theta, 1e6f);
    CHECK_EQ_INT(m->max_position_embeddings, 40960);
    CHECK_EQ_INT(m->num_experts, 128);
    CHECK_EQ_INT(m->num_experts_per_tok, 8);
    CHECK_EQ_INT(m->moe_intermediate_size, 768);
    CHECK(m->norm_topk_prob);
    CHECK_EQ_DBL(m->router_aux_loss_coef, 0.001f);
    CHECK(mx_model_layer_is_moe(m, 47));
    CHECK_STR_EQ(c.model_name_or_path, ckpt);
    CHECK_STR_EQ(c.hf_config_path, ckpt_json);
    CHECK_STR_EQ(origin(&c, "model.vocab_size"), ckpt_json);
    CHECK_STR_EQ(origin(&c, "model.model_name_or_path"), "cfg.yaml:2");
    snprintf(want, sizeof want, "'%s'", ckpt);
    CHECK_STR_EQ(value(&c, "model.model_name_or_path"), want);
    mx_config_free(&c);

    /* Inline keys next to model_name_or_path override config.json's: a small model of the
     * same shape of family, and null back to a default. */
    rc = load_hf(qwen3_30b_a3b,
                 "  num_hidden_layers: 2\n"     /* 3 */
                 "  hidden_size: 64\n"          /* 4 */
                 "  head_dim: 16\n"             /* 5 */
                 "  num_experts: 8\n"           /* 6 */
                 "  num_experts_per_tok: 2\n"   /* 7 */
                 "  moe_intermediate_size: 32\n" /* 8 */
                 "  intermediate_size: 128\n"   /* 9 */
                 "  vocab_size: 257\n"          /* 10 */
                 "  max_position_embeddings: 128\n" /* 11 */
                 "  mlp_only_layers: [1]\n",    /* 12 */
                 &c, &diag);
    CHECK_EQ_INT(rc, 0);
    if (rc) printf("    %s\n", diag.msg);
    CHECK_EQ_INT(m->num_hidden_layers, 2);
    CHECK_EQ_INT(m->hidden_size, 64);
    CHECK_EQ_INT(m->head_dim, 16);
    CHECK_EQ_INT(m->num_experts, 8);
    CHECK_EQ_INT(m->num_experts_per_tok, 2);
    CHECK_EQ_INT(m->moe_intermediate_size, 32);
    CHECK_EQ_INT(m->vocab_size, 257);
    CHECK_EQ_INT(m->num_attention_heads, 32); /* from config.json */
    CHECK_EQ_INT(m->num_key_value_heads, 4);
    CHECK(m->norm_topk_prob);
    CHECK(mx_model_layer_is_moe(m, 0) && !mx_model_layer_is_moe(m, 1));
    CHECK_STR_EQ(origin(&c, "model.hidden_size"), "cfg.yaml:4");
    CHECK_STR_EQ(origin(&c, "model.num_attention_heads"), ckpt_json);
    CHECK_STR_EQ(origin(&c, "model.rope_theta"), ckpt_json);
    CHECK_STR_EQ(origin(&c, "model.mlp_only_layers"), "cfg.yaml:12");
    CHECK_STR_EQ(origin(&c, "training.seed"), "default");
    mx_config_free(&c);

    /* A Llama 3.2 config.json: its llama3 RoPE scaling is refused, naming the file, the key
     * and the value; overriding it inline with null makes the rest usable. */
    rc = load_hf(llama32_1b, "", &c, &diag);
    CHECK_EQ_INT(rc, MX_ECONFIG);
    snprintf(want, sizeof want, "%s: rope_scaling.rope_type: 'llama3' cannot be honoured: mxtrain implements plain RoPE "
             "(allowed: 'default')", ckpt_json);
    CHECK_STR_EQ(diag.msg, want);
    CHECK(is_empty(&c));
    rc = load_hf(NULL, "  rope_scaling: null\n", &c, &diag);
    CHECK_EQ_INT(rc, 0);
    if (rc) printf("    %s\n", diag.msg);
    CHECK_EQ_INT(c.model.type, MX_MODEL_LLAMA);
    CHECK_EQ_DBL(c.model.rope_theta, 500000.0f);
    CHECK_EQ_INT(c.model.head_dim, 64);
    CHECK(c.model.tie_word_embeddings);
    CHECK_EQ_DBL(c.model.rms_norm_eps, 1e-5f);
    mx_config_free(&c);

    /* model_name_or_path may name the config.json itself. */
    {
        char yaml[1024];
        snprintf(yaml, sizeof yaml, "model:\n  model_name_or_path: %s\n  rope_scaling: ~\n" DATA TRAINING, ckpt_json);
        CHECK_EQ_INT(load(yaml, &c, &diag), 0);
        CHECK_STR_EQ(c.hf_config_path, ckpt_json);
        mx_config_free(&c);
    }

    /* transformers 5 writes rope_theta inside rope_parameters; num_local_experts is
     * Mixtral's name for num_experts. */
    rc = load_hf("{\"model_type\": \"qwen3_moe\", \"vocab_size\": 300, \"hidden_size\": 64, \"intermediate_size\": 96,"
                 " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_local_experts\": 4,"
                 " \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 32,"
                 " \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 12345.0},"
                 " \"dtype\": \"bfloat16\", \"id2label\": {\"0\": \"LABEL_0\"}, \"layer_types\": [\"full_attention\","
                 " \"full_attention\"]}",
                 "", &c, &diag);
    CHECK_EQ_INT(rc, 0);
    if (rc) printf("    %s\n", diag.msg);
    CHECK_EQ_DBL(c.model.rope_theta, 12345.0f);
    CHECK_STR_EQ(origin(&c, "model.rope_theta"), ckpt_json);
    CHECK_EQ_INT(c.model.num_experts, 4);
    CHECK_EQ_INT(c.model.head_dim, 16);
    CHECK_EQ_INT(c.model.max_position_embeddings, 32768); /* Qwen3MoeConfig's default */
    mx_config_free(&c);
    /* ... and an inline rope_theta overrides it. */
    rc = load_hf(NULL, "  rope_theta: 500.0\n", &c, &diag);
    CHECK_EQ_INT(rc, 0);
    CHECK_EQ_DBL(c.model.rope_theta, 500.0f);
    CHECK_STR_EQ(origin(&c, "model.rope_theta"), "cfg.yaml:3");
    mx_config_free(&c);

    /* Errors inside config.json name the file and the key as written there. */
    static const struct {
        const char *json;
        const char *extra;
        int rc;
        const char *sub; /* after "CKPT/config.json: " */
    } bad[] = {
        {"{\"model_type\": \"llama\", \"hidden_act\": \"gelu\"}", "", MX_ECONFIG,
         "hidden_act: 'gelu' cannot be honoured: mxtrain's MLPs are SwiGLU (allowed: 'silu')"},
        {"{\"model_type\": \"llama\", \"attention_dropout\": 0.1}", "", MX_ECONFIG,
         "attention_dropout: 0.1 (a number) cannot be honoured"},
        {"{\"model_type\": \"qwen3\", \"use_sliding_window\": true}", "", MX_ECONFIG,
         "use_sliding_window: true (a boolean) cannot be honoured"},
        {"{\"model_type\": \"llama\", \"quantization_config\": {\"quant_method\": \"awq\"}}", "", MX_ECONFIG,
         "quantization_config: unknown key (allowed: model_type, vocab_size,"},
        {"{\"model_type\": \"llama\", \"hidden_sise\": 64}", "", MX_ECONFIG,
         "hidden_sise: unknown key; did you mean 'hidden_size'?"},
        {"{\"model_type\": \"llama\", \"hidden_size\": 2048.0}", "", MX_ECONFIG,
         "hidden_size: 2048.0 (a number) is not an integer (allowed: an integer >= 1)"},
        {"{\"model_type\": \"llama\", \"hidden_size\": \"2048\"}", "", MX_ECONFIG,
         "hidden_size: '2048' is not an integer"},
        {"{\"model_type\": \"llama\", \"rms_norm_eps\": -1e-06}", "", MX_ECONFIG,
         "rms_norm_eps: -1e-06 is out of range (allowed: a number > 0)"},
        {"{\"model_type\": \"gpt_neox\"}", "", MX_ECONFIG,
         "model_type: 'gpt_neox' is not allowed (allowed: 'llama', 'qwen3', 'qwen3_moe')"},
        {"{\"model_type\": \"llama\", \"num_experts\": 8}", "", MX_ECONFIG,
         "num_experts: given for model_type llama, but it applies only to qwen3_moe"},
        {"{\"model_type\": \"qwen3_moe\", \"num_experts\": 8, \"num_local_experts\": 16}", "", MX_ECONFIG,
         "num_local_experts: given together with its alias num_experts, with another value"},
        {"{\"model_type\": \"qwen3_moe\", \"rope_theta\": 1000.0, \"rope_parameters\": {\"rope_theta\": 2000.0}}", "",
         MX_ECONFIG, "rope_parameters: its rope_theta 2000 disagrees with rope_theta 1000 (from "},
        {"{\"model_type\": \"qwen3_moe\", \"rope_parameters\": {\"rope_type\": \"yarn\", \"factor\": 4}}", "",
         MX_ECONFIG, "rope_parameters.rope_type: 'yarn' cannot be honoured"},
        {"{\"model_type\": \"qwen3_moe\", \"mlp_only_layers\": [0, 300]}", "", MX_ECONFIG,
         "mlp_only_layers[1]: 300 is out of range"},
        {"[1, 2]", "", MX_ECONFIG, "the file holds a list, not a JSON object of model keys"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int before = mxt_current_failures();
        rc = load_hf(bad[i].json, bad[i].extra, &c, &diag);
        CHECK_EQ_INT(rc, bad[i].rc);
        snprintf(want, sizeof want, "%s: %s", ckpt_json, bad[i].sub);
        CHECK_STR_CONTAINS(diag.msg, want);
        CHECK(is_empty(&c));
        if (mxt_current_failures() != before) printf("    (json case %zu: %s)\n", i, diag.msg);
    }

    /* A key missing from both files; a broken file; no file. */
    rc = load_hf("{\"model_type\": \"llama\", \"hidden_size\": 64, \"intermediate_size\": 96, \"num_hidden_layers\": 2,"
                 " \"num_attention_heads\": 4}",
                 "", &c, &diag);
    CHECK_EQ_INT(rc, MX_ECONFIG);
    snprintf(want, sizeof want, "cfg.yaml:1: model.vocab_size: required key missing, both here and in %s (allowed: an "
             "integer >= 1)", ckpt_json);
    CHECK_STR_EQ(diag.msg, want);
    rc = load_hf("{\"model_type\": \"llama\",\n \"hidden_size\": 64,,}", "", &c, &diag);
    CHECK_EQ_INT(rc, MX_ECONFIG);
    snprintf(want, sizeof want, "%s:2:", ckpt_json);
    CHECK_STR_CONTAINS(diag.msg, want);
    CHECK_STR_CONTAINS(diag.msg, "invalid JSON");
    CHECK_STR_CONTAINS(diag.msg, "(read for model.model_name_or_path, cfg.yaml:2)");
    rc = load_hf("{\"model_type\": \"llama\", \"hidden_size\": 64, \"hidden_size\": 65}", "", &c, &diag);
    CHECK_EQ_INT(rc, MX_ECONFIG);
    CHECK_STR_CONTAINS(diag.msg, "duplicate");
    unlink(ckpt_json);
    rc = load_hf(NULL, "", &c, &diag);
    CHECK_EQ_INT(rc, MX_EIO);
    snprintf(want, sizeof want, "cfg.yaml:2: model.model_name_or_path: cannot read %s: No such file or directory "
             "(allowed: a local directory holding a Hugging Face config.json", ckpt_json);
    CHECK_STR_CONTAINS(diag.msg, want);
    CHECK(is_empty(&c));
    rc = load("model:\n  model_name_or_path: Qwen/Qwen3-30B-A3B\n" DATA TRAINING, &c, &diag);
    CHECK_EQ_INT(rc, MX_EIO);
    CHECK_STR_CONTAINS(diag.msg, "model.model_name_or_path: cannot read Qwen/Qwen3-30B-A3B: No such file or directory");
    CHECK_STR_CONTAINS(diag.msg, "nothing is downloaded");
    rc = load("model:\n  model_name_or_path: 5\n" DATA TRAINING, &c, &diag);
    CHECK_EQ_INT(rc, MX_ECONFIG);
    CHECK_STR_CONTAINS(diag.msg, "cfg.yaml:2: model.model_name_or_path: 5 (an integer) is not a path");
    teardown();
}

/* Found by fuzzing (tests/fuzz/regressions/config/, hf_config/): a rope_parameters key with
 * newlines, and jansson's text for a broken config.json (which quotes the input, here a
 * carriage return), went into the message raw. */
static void test_messages_one_line(void) {
    setup();
    mx_config c;
    mx_diag diag = {{0}};
    char want[512];
    int rc = load(MODEL_LLAMA "  rope_parameters: {\"v\\n\\nx\": 1}\n" DATA TRAINING, &c, &diag);
    CHECK_EQ_INT(rc, MX_ECONFIG);
    CHECK_STR_EQ(diag.msg, "cfg.yaml:8: model.rope_parameters.v\\n\\nx: this key cannot be honoured: mxtrain "
                           "implements plain RoPE (allowed: rope_type 'default' and rope_theta)");
    rc = load_hf("{\"m\\\r\": \"q\"}", "", &c, &diag);
    CHECK_EQ_INT(rc, MX_ECONFIG);
    snprintf(want, sizeof want, "%s:1:5: invalid JSON: invalid escape near '\"m\\\\r' (read for "
             "model.model_name_or_path, cfg.yaml:2)", ckpt_json);
    CHECK_STR_EQ(diag.msg, want);
    teardown();
}

/* ---- The MoE layer rule --------------------------------------------------------------------- */

static void test_layer_is_moe(void) {
    mx_model_config m;
    memset(&m, 0, sizeof m);
    m.type = MX_MODEL_QWEN3_MOE;
    m.num_hidden_layers = 8;
    m.num_experts = 4;
    m.decoder_sparse_step = 3;
    m.mlp_only_layers[5] = true;
    /* (i+1) % 3 == 0 for i = 2, 5; 5 is forced dense. */
    static const bool want[8] = {false, false, true, false, false, false, false, false};
    for (int i = 0; i < 8; i++) CHECK_EQ_INT(mx_model_layer_is_moe(&m, i), want[i]);
    CHECK(!mx_model_layer_is_moe(&m, -1));
    CHECK(!mx_model_layer_is_moe(&m, 100000));
    m.decoder_sparse_step = 1;
    CHECK(mx_model_layer_is_moe(&m, 0) && mx_model_layer_is_moe(&m, 7) && !mx_model_layer_is_moe(&m, 5));
    m.num_experts = 0; /* no experts: every layer dense, as in Hugging Face */
    CHECK(!mx_model_layer_is_moe(&m, 0));
    m.num_experts = 4;
    m.type = MX_MODEL_QWEN3;
    CHECK(!mx_model_layer_is_moe(&m, 0));
    m.type = MX_MODEL_QWEN3_MOE;
    m.decoder_sparse_step = 0; /* never from a loaded config; no division by zero */
    CHECK(!mx_model_layer_is_moe(&m, 0));

}

static const mxt_test tests[] = {
    {"examples", test_examples},
    {"seed_block", test_seed_block},
    {"defaults", test_defaults},
    {"every_key", test_every_key},
    {"settings_by_name", test_settings_by_name},
    {"yaml_typing", test_yaml_typing},
    {"errors", test_errors},
    {"token_limit", test_token_limit},
    {"load_file", test_load_file},
    {"hf_config", test_hf_config},
    {"overrides", test_overrides},
    {"messages_one_line", test_messages_one_line},
    {"layer_is_moe", test_layer_is_moe},
};

int main(int argc, char **argv) { return MXT_RUN(tests, argc, argv); }
