/* The training configuration (SPEC §1): the whole YAML file, Hugging Face config.json through
 * model_name_or_path, defaults, settings by name, YAML typing and the MoE layer rule; its
 * errors are in test_config_errors.c, files and overrides in test_config_files.c.
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

#include "config_cases.h"

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
    CHECK_EQ_INT(c.features.recompute_granularity, MX_RECOMPUTE_FULL);
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
    /* Megatron's recompute granularity, with recompute on: full by default, or selective. */
    CHECK_EQ_INT(load(MINIMAL "features:\n  recompute: true\n", &c, &diag), 0);
    CHECK_EQ_INT(c.features.recompute_granularity, MX_RECOMPUTE_FULL);
    mx_config_free(&c);
    CHECK_EQ_INT(load(MINIMAL "features:\n  recompute: true\n  recompute_granularity: selective\n", &c, &diag), 0);
    CHECK(c.features.recompute);
    CHECK_EQ_INT(c.features.recompute_granularity, MX_RECOMPUTE_SELECTIVE);
    mx_config_free(&c);
    CHECK_EQ_INT(load(MINIMAL "features:\n  recompute: true\n  recompute_granularity: full\n", &c, &diag), 0);
    CHECK_EQ_INT(c.features.recompute_granularity, MX_RECOMPUTE_FULL);
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
    CHECK(c.training.memory_check);
    CHECK(c.training.check_for_nan_in_loss_and_grad);   // Megatron's default
    mx_config_free(&c);
    CHECK_EQ_INT(load(MINIMAL "  exit_interval: 500\n  exit_duration_in_mins: 230.5\n  exit_signal_handler: true\n",
                      &c, &diag), 0);
    CHECK_EQ_INT(c.training.exit_interval, 500);
    CHECK(c.training.exit_duration_in_mins == 230.5);
    CHECK(c.training.exit_signal_handler);
    mx_config_free(&c);
    CHECK_EQ_INT(load(MINIMAL "  memory_check: false\n", &c, &diag), 0);
    CHECK(!c.training.memory_check);
    mx_config_free(&c);
    CHECK_EQ_INT(load(MINIMAL "  check_for_nan_in_loss_and_grad: false\n", &c, &diag), 0);
    CHECK(!c.training.check_for_nan_in_loss_and_grad);
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
    {"layer_is_moe", test_layer_is_moe},
};

int main(int argc, char **argv) { return MXT_RUN(tests, argc, argv); }
