/* Whole-model loss and gradients at fp32 against a PyTorch implementation of the same
 * model family (tests/py/model_ref.py), for llama, qwen3 and qwen3_moe configs of awkward
 * sizes: hidden 96, 3 heads over 1 KV head, sequence 37, experts that receive no tokens,
 * tied and untied embeddings, biases, the load-balancing loss on and off. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "harness.h"
#include "model/profile.h"
#include "ops/gemm.h"
#include "mxtrain/model.h"
#include "mxtrain/plan.h"

static mx_model_config base_config(mx_model_type type) {
    mx_model_config c = {0};
    c.type = type;
    c.vocab_size = 67;
    c.hidden_size = 96;
    c.intermediate_size = 80;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 3;
    c.num_key_value_heads = 1;
    c.head_dim = 32;
    c.rms_norm_eps = 1e-6f;
    c.rope_theta = type == MX_MODEL_LLAMA ? 10000.0f : 1000000.0f;
    c.max_position_embeddings = 64;
    c.initializer_range = 0.1f;
    return c;
}

static int write_file(const char *dir, const char *name, const void *data, size_t bytes) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t n = fwrite(data, 1, bytes, f);
    return fclose(f) == 0 && n == bytes ? 0 : -1;
}

static int read_file(const char *dir, const char *name, void *data, size_t bytes) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    size_t n = fread(data, 1, bytes, f);
    fclose(f);
    return n == bytes ? 0 : -1;
}

static double rel_err(const float *got, const float *want, int64_t n) {
    double d = 0, w = 0;
    for (int64_t i = 0; i < n; i++) {
        d += ((double)got[i] - want[i]) * ((double)got[i] - want[i]);
        w += (double)want[i] * want[i];
    }
    return sqrt(d / (w > 0 ? w : 1e-300));
}

/* Run one config through C and PyTorch and compare the loss and every gradient, to tol
 * (relative norm error). With a plan, PyTorch emulates the MX GEMMs of the modules it
 * converts (tests/py/mx_ref.py), and the operands of the first GEMM of each kind the model
 * runs are checked bit for bit against the emulation's quantizer. */
/* mx_model_options.z_loss_coef of the next check (the z-loss test sets it, and resets it). */
static double z_loss_coef;

/* Returns how many Hugging Face tensors got no gradient on either side (-1: no model). */
static int check_against_torch_plan_with(const mx_model_config *c, int B, int T, uint64_t seed, const mx_plan *plan,
                                         double tol, void (*prepare)(mx_model *m)) {
    char dir[] = "/tmp/mxtrain-model-XXXXXX";
    if (!mkdtemp(dir)) {
        mxt_fail(__FILE__, __LINE__, "mkdtemp failed");
        return -1;
    }
    mx_model *m = NULL;
    mx_diag diag = {{0}};
    mx_model_options opt = {.batch = B, .seq = T, .bf16 = false, .plan = plan, .z_loss_coef = z_loss_coef};
    int rc = mx_model_create(c, &opt, &m, &diag);
    CHECK_EQ_INT(rc, 0);
    if (rc) {
        printf("    %s\n", diag.msg);
        return -1;
    }
    mx_model_init(m, seed);
    if (prepare) prepare(m);
    int N = B * T;
    int32_t *inputs = malloc((size_t)N * 4), *targets = malloc((size_t)N * 4);
    uint64_t s = seed * 7919 + 1;
    for (int i = 0; i < N; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        inputs[i] = (int32_t)((s >> 33) % (uint64_t)c->vocab_size);
        targets[i] = (int32_t)((s >> 13) % (uint64_t)c->vocab_size);
    }
    // the model, in Hugging Face tensors
    char path[512];
    snprintf(path, sizeof path, "%s/index.txt", dir);
    FILE *idx = fopen(path, "w");
    for (int t = 0; t < mx_model_num_hf_tensors(m); t++) {
        mx_tensor_view v = mx_model_hf_tensor(m, t);
        fprintf(idx, "%s %d", v.name, v.ndim);
        for (int d = 0; d < v.ndim; d++) fprintf(idx, " %lld", (long long)v.shape[d]);
        fprintf(idx, "\n");
        char name[200];
        snprintf(name, sizeof name, "%s.bin", v.name);
        CHECK_EQ_INT(write_file(dir, name, v.data, (size_t)v.numel * 4), 0);
    }
    fclose(idx);
    snprintf(path, sizeof path, "%s/config.txt", dir);
    FILE *cf = fopen(path, "w");
    fprintf(cf, "B %d\nT %d\nmodel_type %d\nhidden_size %d\nnum_attention_heads %d\nnum_key_value_heads %d\n"
                "head_dim %d\nnum_hidden_layers %d\nrms_norm_eps %.9e\nrope_theta %.9e\nnum_experts %d\n"
                "num_experts_per_tok %d\nnorm_topk_prob %d\noutput_router_logits %d\nrouter_aux_loss_coef %.9e\n"
                "z_loss_coef %.9e\n",
            B, T, (int)c->type, c->hidden_size, c->num_attention_heads, c->num_key_value_heads, c->head_dim,
            c->num_hidden_layers, c->rms_norm_eps, c->rope_theta, c->num_experts, c->num_experts_per_tok,
            c->norm_topk_prob, c->output_router_logits, c->router_aux_loss_coef, z_loss_coef);
    fclose(cf);
    if (plan) {   // the converted modules and the recipe, for the emulation
        CHECK(mx_model_converted_modules(m) > 0);
        snprintf(path, sizeof path, "%s/mx.txt", dir);
        FILE *mf = fopen(path, "w");
        bool per_tensor = plan->recipe.granularity == MX_GRANULARITY_PER_TENSOR;
        bool per_line = plan->recipe.granularity == MX_GRANULARITY_PER_CHANNEL;
        bool per_block = plan->recipe.granularity == MX_GRANULARITY_PER_BLOCK;
        int mode = per_tensor || per_line || per_block ? (int)plan->tensor_scale_mode : (int)plan->scale_mode;
        fprintf(mf, "%d %d %d %d %d %d %u %d\n", plan->recipe.inputs, plan->recipe.weight, plan->recipe.grads, mode,
                plan->recipe.granularity == MX_GRANULARITY_MX && plan->recipe.block[1] == 32,
                per_block ? 3 : per_line ? 2 : per_tensor, plan->high_precision_gemms, plan->recipe.dgrad_weight_per_tensor);
        mx_module *mods = NULL;
        int n = 0;
        mx_selection sel;
        CHECK_EQ_INT(mx_model_modules(c, &mods, &n), 0);
        CHECK_EQ_INT(mx_plan_select(plan, mods, n, &sel), 0);
        for (int i = 0; i < n; i++)
            if (sel.decisions[i].converted) fprintf(mf, "%s\n", mods[i].fqn);
        mx_selection_free(&sel);
        mx_model_modules_free(mods, n);
        fclose(mf);
        snprintf(path, sizeof path, "%s/mode.txt", dir);
        mf = fopen(path, "w");
        fprintf(mf, "%d\n", mode);
        fclose(mf);
        snprintf(path, sizeof path, "%s/hp.txt", dir);   // the products the trace does not hold
        mf = fopen(path, "w");
        fprintf(mf, "%u\n", plan->high_precision_gemms);
        fclose(mf);
        mx_model_trace_mx(m, dir);
    }
    CHECK_EQ_INT(write_file(dir, "inputs.bin", inputs, (size_t)N * 4), 0);
    CHECK_EQ_INT(write_file(dir, "targets.bin", targets, (size_t)N * 4), 0);

    char cmd[700];
    snprintf(cmd, sizeof cmd, "tests/py/oracle %s tests/py/model_ref.py %s", dir, dir);
    CHECK_EQ_INT(system(cmd), 0);

    mx_model_zero_grad(m);
    double loss = mx_model_forward(m, inputs, targets);
    mx_model_backward(m, 1.0f);
    CHECK_EQ_INT(mx_model_error(m, &diag), 0);
    if (plan) {
        snprintf(cmd, sizeof cmd, "tests/py/oracle %s tests/py/mx_ref.py check-trace %s", dir, dir);
        CHECK_EQ_INT(system(cmd), 0);
    }
    double want[3] = {0};
    CHECK_EQ_INT(read_file(dir, "loss.bin", want, sizeof want), 0);
    double ltol = plan ? tol : 1e-5;
    CHECK_NEAR(mx_model_last_ce_loss(m), want[0], ltol * want[0]);
    CHECK_NEAR(mx_model_last_aux_loss(m), want[1], ltol * fabs(want[1]) + 1e-12);
    CHECK_NEAR(loss, want[2], ltol * want[2]);
    int zero_grad_tensors = 0;
    for (int t = 0; t < mx_model_num_hf_tensors(m); t++) {
        mx_tensor_view v = mx_model_hf_tensor(m, t);
        float *g = malloc((size_t)v.numel * 4);
        char name[220];
        snprintf(name, sizeof name, "grad/%s.bin", v.name);
        CHECK_EQ_INT(read_file(dir, name, g, (size_t)v.numel * 4), 0);
        double norm = 0;
        for (int64_t i = 0; i < v.numel; i++) norm += (double)g[i] * g[i];
        if (norm == 0) {
            zero_grad_tensors++;   // an expert no token reached: C must agree exactly
            for (int64_t i = 0; i < v.numel; i++) CHECK_EQ_DBL(v.grad[i], 0.0);
        } else {
            double e = rel_err(v.grad, g, v.numel);
            if (!(e <= tol)) mxt_fail(__FILE__, __LINE__, "gradient of %s: relative error %.3g > %.3g", v.name, e, tol);
        }
        free(g);
    }
    if (c->type == MX_MODEL_QWEN3_MOE && B * T * c->num_experts_per_tok < c->num_experts)
        CHECK(zero_grad_tensors > 0);   // the config was meant to leave experts without tokens
    mx_model_free(m);
    free(inputs), free(targets);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) printf("    could not remove %s\n", dir);
    return zero_grad_tensors;
}

static void check_against_torch_plan(const mx_model_config *c, int B, int T, uint64_t seed, const mx_plan *plan,
                                     double tol) {
    (void)check_against_torch_plan_with(c, B, T, seed, plan, tol, NULL);
}

static void check_against_torch(const mx_model_config *c, int B, int T, uint64_t seed) {
    check_against_torch_plan(c, B, T, seed, NULL, 1e-4);
}

static void test_llama(void) {
    mx_model_config c = base_config(MX_MODEL_LLAMA);
    check_against_torch(&c, 2, 37, 1);
}

static void test_llama_bias_tied(void) {
    mx_model_config c = base_config(MX_MODEL_LLAMA);
    c.attention_bias = true;
    c.tie_word_embeddings = true;
    c.num_key_value_heads = 3;
    check_against_torch(&c, 1, 19, 2);
}

static void test_qwen3(void) {
    mx_model_config c = base_config(MX_MODEL_QWEN3);
    check_against_torch(&c, 2, 37, 3);
}

static mx_model_config moe_config(void) {
    mx_model_config c = base_config(MX_MODEL_QWEN3_MOE);
    c.num_hidden_layers = 3;
    c.num_experts = 5;
    c.num_experts_per_tok = 2;
    c.moe_intermediate_size = 24;
    c.decoder_sparse_step = 1;
    c.mlp_only_layers[1] = true;   // layers 0 and 2 MoE, layer 1 dense
    c.norm_topk_prob = true;
    c.router_aux_loss_coef = 0.05f;
    return c;
}

static void test_qwen3_moe(void) {
    mx_model_config c = moe_config();
    check_against_torch(&c, 2, 37, 4);
}

static void test_qwen3_moe_aux(void) {
    mx_model_config c = moe_config();
    c.output_router_logits = true;
    c.norm_topk_prob = false;
    check_against_torch(&c, 2, 37, 5);
}

/* The router z-loss (training.moe_z_loss_coeff) beside the load-balancing loss. */
static void test_qwen3_moe_z_loss(void) {
    mx_model_config c = moe_config();
    c.output_router_logits = true;
    z_loss_coef = 0.1;
    check_against_torch(&c, 2, 37, 9);
    z_loss_coef = 0;
}

static void test_qwen3_moe_idle_experts(void) {
    mx_model_config c = moe_config();
    c.num_experts = 16;
    c.num_experts_per_tok = 3;
    c.output_router_logits = true;
    check_against_torch(&c, 1, 5, 6);    // 15 routed rows over 16 experts: some get none
}

/* top-k = the number of experts: every expert gets every token (groups of all N rows). */
static void test_qwen3_moe_all_experts(void) {
    mx_model_config c = moe_config();
    c.num_experts = 3;
    c.num_experts_per_tok = 3;
    c.output_router_logits = true;
    check_against_torch(&c, 2, 37, 9);
}

/* Every token to expert 2, the other groups empty: channel 0 of every embedding is large
 * (20, the rest ~0.1), so channel 0 of each MoE layer's normed input is positive for every
 * token, and each router's only non-zero weight is expert 2's on channel 0: its logit is
 * about 10 for every token, all others 0 (a strict winner, not a tie). */
static void route_all_to_expert_2(mx_model *m) {
    for (int t = 0; t < mx_model_num_hf_tensors(m); t++) {
        mx_tensor_view v = mx_model_hf_tensor(m, t);
        if (strstr(v.name, "mlp.gate.weight")) {
            memset(v.data, 0, (size_t)v.numel * sizeof *v.data);
            v.data[2 * v.shape[1]] = 1.0f;   // (E, C): expert 2, channel 0
        } else if (!strcmp(v.name, "model.embed_tokens.weight")) {
            for (int64_t r = 0; r < v.shape[0]; r++) v.data[r * v.shape[1]] = 20.0f;
        }
    }
}

static void test_qwen3_moe_one_expert_takes_all(void) {
    mx_model_config c = moe_config();
    c.num_experts = 4;
    c.num_experts_per_tok = 1;
    c.output_router_logits = true;
    int idle = check_against_torch_plan_with(&c, 2, 37, 10, NULL, 1e-4, route_all_to_expert_2);
    CHECK_EQ_INT(idle, 2 * 3 * 3);   // 2 MoE layers x experts 0, 1, 3 x gate, up, down
}

/* The plan of yaml against PyTorch's emulation, within 1e-2. */
static void check_plan_yaml(const char *yaml, mx_model_config c, int B, int T, uint64_t seed) {
    mx_plan plan;
    mx_diag diag;
    int rc = mx_plan_load_string(yaml, "plan.yaml", &plan, &diag);
    CHECK_EQ_INT(rc, 0);
    if (rc) {
        printf("    %s\n", diag.msg);
        return;
    }
    check_against_torch_plan(&c, B, T, seed, &plan, 1e-2);
    mx_plan_free(&plan);
}

/* The MXFP8 plan of MindSpeed MM's guide, verbatim, plus a variant in E5M2 gradients and
 * rceil scales. */
static void check_mx(const char *recipe, const char *scale_mode, mx_model_config c, int B, int T, uint64_t seed) {
    char yaml[1024];
    snprintf(yaml, sizeof yaml,
             "training:\n  quantization_plan:\n    recipe_name: %s\n    apply_modules: ['model.layers.{*}']\n"
             "    ignored_modules: ['*lm_head', '*gate']\n    quant_converters: ['quantize.linear.mx', 'quantize.moe.mx']\n"
             "    enable_fsdp_low_precision_all_gather: True\n    fsdp_low_precision_all_gather_mode: 'on-demand'\n"
             "    scale_mode: %s\n", recipe, scale_mode);
    check_plan_yaml(yaml, c, B, T, seed);
}

/* Whole-model agreement with the emulation is at the mercy of rounding-boundary flips: C and
 * PyTorch sum in different orders, so their fp32 operands differ in the last bits, and an
 * element that sits within that difference of an FP8 rounding midpoint (or a router
 * near-tie) quantizes differently on the two sides; every operand downstream then differs by
 * ~1e-3 and the 1e-2 bound can fail. Half of the seeds of this config see no such flip; the
 * seed below is one of them (on this machine kind, results are deterministic). The per-GEMM
 * operand checks above are exact whatever the seed. */
static void test_qwen3_moe_mxfp8(void) { check_mx("mxfp8", "floor", moe_config(), 2, 37, 11); }

static void test_llama_mxfp8(void) { check_mx("mxfp8", "floor", base_config(MX_MODEL_LLAMA), 2, 37, 8); }

/* 1-32-32: weights in 32x32 tiles (hidden 96 and head dims give whole and partial tiles). */
static void test_qwen3_mxfp8_32x32(void) {
    check_mx("dynamic_mx-1-32-32_E4M3_E4M3_E4M3", "floor", base_config(MX_MODEL_QWEN3), 2, 37, 9);
}

static void test_llama_mx_e5m2_rceil(void) {
    check_mx("dynamic_mx_E4M3_E4M3_E5M2", "rceil", base_config(MX_MODEL_LLAMA), 2, 37, 8);
}

/* The per-tensor recipes (tensorwise FP8, HiF8) against tests/py/scaled_ref.py: every
 * traced operand bit for bit (codes and scale), loss and gradients within 1e-2. Without
 * quant_converters both converters of the family apply: the experts' groups too, one
 * scale per group (5 experts over 74 x 2 routed rows, ragged). */
static void check_per_tensor_on(const char *recipe, const char *scale_mode, const char *extra, mx_model_config c, int B,
                                int T, uint64_t seed) {
    char yaml[512];
    snprintf(yaml, sizeof yaml, "training:\n  quantization_plan:\n    recipe_name: %s\n    scale_mode: %s\n%s", recipe,
             scale_mode, extra);
    check_plan_yaml(yaml, c, B, T, seed);
}

static void check_per_tensor(const char *recipe, const char *scale_mode, mx_model_config c, uint64_t seed) {
    check_per_tensor_on(recipe, scale_mode, "", c, 2, 37, seed);
}

/* Only the experts converted (quantize.moe.*): the first GEMM of each kind the trace checks is
 * an expert group's, so its operands' codes and scale match the reference only where the
 * scale is that group's own (not the layer's routed rows'); 15 rows over 16 experts leave
 * most groups empty (their gradients exactly 0). */
static void test_qwen3_moe_per_group(void) {
    mx_model_config c = moe_config();
    c.num_experts = 16;
    c.num_experts_per_tok = 3;
    c.output_router_logits = true;
    static const char only_experts[] = "    apply_modules: ['model.layers.{*}.mlp.experts']\n";
    check_per_tensor_on("tensorwise", "fp32", only_experts, c, 1, 5, 6);
    check_per_tensor_on("hif8", "fp32", only_experts, c, 1, 5, 6);
    check_per_tensor_on("tensorwise", "fp32", only_experts, moe_config(), 2, 37, 11);   // ragged groups of 74 x 2 rows
}

static void test_qwen3_moe_tensorwise(void) { check_per_tensor("tensorwise", "fp32", moe_config(), 11); }
static void test_llama_tensorwise_pow2(void) { check_per_tensor("tensorwise", "pow2", base_config(MX_MODEL_LLAMA), 8); }
static void test_qwen3_moe_hif8(void) { check_per_tensor("hif8", "fp32", moe_config(), 11); }
static void test_llama_hif8(void) { check_per_tensor("HIF8", "fp32", base_config(MX_MODEL_LLAMA), 8); }

/* HiF8 with power-of-two scales (the power of two at or above MindSpeed's), and per-role
 * mixes of HiF8 and FP8 (each role's quantizer its own format and target): every traced
 * operand bit for bit. The seeds are ones whose fp32 sums see no near-tie flip between C
 * and PyTorch (see test_qwen3_moe_mxfp8): a flip, and a router choice it changes, moves the
 * gradients past the 1e-2 bound while the operand checks stay exact. */
static void test_llama_hif8_pow2(void) { check_per_tensor("hif8", "pow2", base_config(MX_MODEL_LLAMA), 3); }
static void test_qwen3_moe_hif8_mixed(void) {
    check_per_tensor("dynamic_per_tensor_HIF8_HIF8_E5M2", "fp32", moe_config(), 11);
}
static void test_llama_fp8_hif8_grads_pow2(void) {
    check_per_tensor("dynamic_per_tensor_E4M3_E4M3_HIF8", "pow2", base_config(MX_MODEL_LLAMA), 5);
}

/* torchao's rowwise recipes against tests/py/scaled_ref.py's emulation: every traced operand
 * bit for bit (codes and per-line scales), loss and gradients within 1e-2; MoE experts per
 * group (ragged, empty groups), so no scale spans two groups. */
static void test_qwen3_moe_rowwise(void) { check_per_tensor("rowwise", "pow2", moe_config(), 11); }
static void test_llama_rowwise_fp32_scales(void) {
    check_per_tensor("dynamic_per_channel_E4M3_E4M3_E5M2", "fp32", base_config(MX_MODEL_LLAMA), 8);
}
static void test_qwen3_moe_rowwise_with_gw_hp(void) {
    check_per_tensor_on("rowwise_with_gw_hp", "pow2", "", moe_config(), 2, 37, 11);
    mx_model_config c = moe_config();   // 15 rows over 16 experts: most groups empty
    c.num_experts = 16;
    c.num_experts_per_tok = 3;
    c.output_router_logits = true;
    check_per_tensor_on("rowwise_with_gw_hp", "pow2", "    apply_modules: ['model.layers.{*}.mlp.experts']\n", c, 1,
                        5, 6);
}

/* The blockwise recipe against tests/py/scaled_ref.py's emulation: every traced operand bit
 * for bit (codes and per-block scales), loss and gradients within 1e-2. Hidden 160 and 146
 * rows give whole and partial 128-element blocks along every dim (1x128, 128x128, 128x1);
 * MoE experts per group (ragged, empty groups), so no block spans two groups. */
static mx_model_config blockwise_config(mx_model_config c) {
    c.hidden_size = 160;
    c.max_position_embeddings = 128;
    return c;
}
static void test_qwen3_moe_blockwise(void) {
    check_per_tensor_on("blockwise", "pow2", "", blockwise_config(moe_config()), 2, 73, 11);
    mx_model_config c = moe_config();   // 15 rows over 16 experts: most groups empty
    c.num_experts = 16;
    c.num_experts_per_tok = 3;
    c.output_router_logits = true;
    check_per_tensor_on("BlockWise", "pow2", "    apply_modules: ['model.layers.{*}.mlp.experts']\n", c, 1, 5, 6);
}
/* Its seed and high_precision_gemms' rowwise one: ones whose fp32 sums see no near-tie flip
 * between C and PyTorch with the AVX-512 and the AVX2 tables (see test_llama_hif8_pow2). */
static void test_llama_blockwise_fp32_scales(void) {
    check_per_tensor_on("dynamic_per_block-1-128-128_E4M3_E4M3_E4M3", "fp32", "",
                        blockwise_config(base_config(MX_MODEL_LLAMA)), 2, 73, 9);
}

/* high_precision_gemms in each family: the listed products in fp32, the others quantized. */
static void test_high_precision_gemms(void) {
    check_per_tensor_on("mxfp8", "floor", "    high_precision_gemms: [wgrad]\n", moe_config(), 2, 37, 11);
    check_per_tensor_on("tensorwise", "fp32", "    high_precision_gemms: [dgrad]\n", base_config(MX_MODEL_LLAMA), 2, 37,
                        8);
    check_per_tensor_on("rowwise", "pow2", "    high_precision_gemms: [fprop, wgrad]\n", moe_config(), 2, 37, 7);
    check_per_tensor_on("blockwise", "pow2", "    high_precision_gemms: [dgrad]\n", blockwise_config(moe_config()), 2,
                        73, 11);
}

/* ---- activation memory: saved MX planes only where they take less ---- */

static size_t r64(int64_t bytes) { return (size_t)((bytes + 63) / 64 * 64); }   // the arena's pieces

/* What keeping one kind of converted input (rows x cols, in `layers` layers, `groups` expert
 * groups) as MX planes saves against fp32 in every layer: fp32 per layer, less the plane
 * and its scales per layer, less the one fp32 scratch all layers share. */
static int64_t plane_saving(int layers, int64_t rows, int64_t cols, int64_t groups) {
    int64_t fp32 = (int64_t)r64(4 * rows * cols), plane = (int64_t)(r64(rows * cols) + r64(((rows + 31) / 32 + groups) * cols));
    return (int64_t)layers * (fp32 - plane) - fp32;
}

/* How activations() builds the model: every layer recomputed or none, bf16 or fp32 compute. */
typedef struct {
    bool recompute, bf16;
} act_setting;

/* Activation bytes of c on B x T with the plan of check_mx (none: plan NULL); *unsaved
 * receives the figure without any planes. */
static size_t activations(const mx_model_config *c, int B, int T, const mx_plan *plan, act_setting set,
                          size_t *unsaved) {
    mx_plan_pattern all = {"model.layers.{*}", NULL, 0};
    CHECK_EQ_INT(mx_pattern_compile(all.text, &all.compiled, NULL), 0);
    mx_model_options opt = {.batch = B, .seq = T, .plan = plan, .recompute = set.recompute ? &all : NULL,
                            .n_recompute = set.recompute, .external_params = true, .bf16 = set.bf16};
    mx_model *m = NULL;
    mx_diag diag;
    int rc = mx_model_create(c, &opt, &m, &diag);
    CHECK_EQ_INT(rc, 0);
    if (rc) printf("    %s\n", diag.msg);
    size_t act = m ? mx_model_activation_bytes(m, unsaved) : 0;
    mx_model_free(m);
    mx_pattern_free(all.compiled);
    return act;
}

static void test_activation_bytes(void) {
    mx_plan plan;
    mx_diag diag;
    int rc = mx_plan_load_string("training:\n  quantization_plan:\n    recipe_name: mxfp8\n"
                                 "    apply_modules: ['model.layers.{*}']\n    ignored_modules: ['*lm_head', '*gate']\n",
                                 "plan.yaml", &plan, &diag);
    CHECK_EQ_INT(rc, 0);
    if (rc) return;
    const int B = 2, T = 64;
    const int64_t N = B * T;
    size_t unsaved, off;
    // a dense Llama, 3 layers, every linear layer converted: three of the four kinds of inputs
    // (q/k/v's, gate/up's, down's) pay in 3 layers; o's, the attention's output, stays fp32
    // at fp32 compute, where attention's backward reads it
    const act_setting fp32 = {0}, fp32_recomputed = {.recompute = true}, bf16 = {.bf16 = true};
    mx_model_config c = base_config(MX_MODEL_LLAMA);
    c.hidden_size = 64, c.num_attention_heads = 2, c.head_dim = 32, c.intermediate_size = 96, c.num_hidden_layers = 3;
    size_t act = activations(&c, B, T, &plan, fp32, &unsaved);
    CHECK_EQ_INT(activations(&c, B, T, NULL, fp32, &off), unsaved);   // the same model without a plan
    CHECK_EQ_INT(off, unsaved);
    int64_t want = plane_saving(3, N, 64, 0) + plane_saving(3, N, 64, 0) + plane_saving(3, N, 96, 0);
    CHECK(want > 0);
    CHECK_EQ_INT((int64_t)(unsaved - act), want);
    // at bf16 o's plane comes with a bf16 copy of the output per layer (attention's backward
    // reads it): that pays from 5 layers of this size on, not in 3
    act = activations(&c, B, T, &plan, bf16, &unsaved);
    CHECK_EQ_INT((int64_t)(unsaved - act), want);
    c.num_hidden_layers = 6;
    int64_t o_saves = plane_saving(6, N, 64, 0) - 6 * (int64_t)r64(2 * N * 64);
    CHECK(o_saves > 0);
    act = activations(&c, B, T, &plan, bf16, &unsaved);
    CHECK_EQ_INT((int64_t)(unsaved - act), plane_saving(6, N, 64, 0) + plane_saving(6, N, 64, 0) +
                                              plane_saving(6, N, 96, 0) + o_saves);
    c.num_hidden_layers = 3;
    // every layer recomputed: a plane would sit in the reused region beside its fp32 scratch,
    // so none pays (the figure was reversed: planes cost more than fp32)
    act = activations(&c, B, T, &plan, fp32_recomputed, &unsaved);
    CHECK_EQ_INT(activations(&c, B, T, NULL, fp32_recomputed, &off), unsaved);
    CHECK_EQ_INT(act, unsaved);
    // Qwen3-MoE, 32 experts top-1, 2 layers of which one MoE: q/k/v's inputs pay (2 layers),
    // the experts' inputs and the dense MLP's (1 layer each) do not (reversed before)
    mx_model_config m = base_config(MX_MODEL_QWEN3_MOE);
    m.hidden_size = 64, m.num_attention_heads = 2, m.head_dim = 32, m.intermediate_size = 96;
    m.num_experts = 32, m.num_experts_per_tok = 1, m.moe_intermediate_size = 32, m.decoder_sparse_step = 1;
    m.mlp_only_layers[0] = true;
    act = activations(&m, B, T, &plan, fp32, &unsaved);
    CHECK_EQ_INT(activations(&m, B, T, NULL, fp32, &off), unsaved);
    CHECK(plane_saving(1, N, 64, 32) + plane_saving(1, N, 32, 32) < 0 && plane_saving(1, N, 96, 0) < 0);
    CHECK_EQ_INT((int64_t)(unsaved - act), plane_saving(2, N, 64, 0));
    // and recomputed: none pays
    act = activations(&m, B, T, &plan, fp32_recomputed, &unsaved);
    CHECK_EQ_INT(act, unsaved);
    mx_plan_free(&plan);
}

/* The primitives an MoE step creates stay bounded: after the first step, new batches (new
 * group sizes for every expert) create none, in bf16 and with the MXFP8 plan; with fixed
 * expert shapes, as before run-time dims, the same steps keep creating them. */
static int64_t primitives_after_steps(const mx_model_config *c, const mx_plan *plan, bool fixed, int steps,
                                      int64_t *after_first) {
    mx_model *m = NULL;
    mx_diag diag = {{0}};
    mx_model_options opt = {.batch = 2, .seq = 37, .bf16 = true, .plan = plan};
    int rc = mx_model_create(c, &opt, &m, &diag);
    CHECK_EQ_INT(rc, 0);
    if (rc) return -1;
    mx_model_init(m, 3);
    mxi_model_fixed_expert_shapes(m, fixed);
    int N = 2 * 37;
    int32_t tok[75];
    uint64_t s = 12345;
    mxi_gemm_stats st;
    for (int step = 0; step < steps; step++) {
        for (int i = 0; i <= N; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            tok[i] = (int32_t)((s >> 33) % (uint64_t)c->vocab_size);
        }
        mx_model_forward(m, tok, tok + 1);
        mx_model_backward(m, 1.0f);
        CHECK_EQ_INT(mx_model_error(m, &diag), 0);
        mxi_gemm_ctx_stats(mxi_model_gemm(m), &st);
        if (step == 0) *after_first = st.primitives_created;
    }
    mx_model_free(m);
    return st.primitives_created;
}

static void test_moe_primitives_bounded(void) {
    mx_model_config c = moe_config();
    c.num_experts = 7;
    c.num_experts_per_tok = 2;
    static const char yaml[] =
        "training:\n  quantization_plan:\n    recipe_name: mxfp8\n    apply_modules: ['model.layers.{*}']\n"
        "    ignored_modules: ['*lm_head', '*gate']\n    quant_converters: ['quantize.linear.mx', 'quantize.moe.mx']\n";
    mx_plan plan;
    mx_diag diag;
    CHECK_EQ_INT(mx_plan_load_string(yaml, "plan.yaml", &plan, &diag), 0);
    for (int mx = 0; mx < 2; mx++) {
        int64_t first = 0, fixed_first = 0;
        int64_t all = primitives_after_steps(&c, mx ? &plan : NULL, false, 6, &first);
        int64_t fixed = primitives_after_steps(&c, mx ? &plan : NULL, true, 6, &fixed_first);
        printf("# %s: primitives after 1 and 6 steps: %lld, %lld (fixed expert shapes: %lld, %lld)\n",
               mx ? "mxfp8" : "bf16", (long long)first, (long long)all, (long long)fixed_first, (long long)fixed);
        CHECK_EQ_INT(all, first);         // steps 2-6: none
        CHECK(fixed > fixed_first + 10);  // what the counter catches if the churn comes back
    }
    mx_plan_free(&plan);
}

/* At bf16 compute on a native bf16 matmul, unconverted layers keep their inputs for backward
 * as the bf16 rounding forward made (2 bytes an element, no second rounding) instead of fp32:
 * the losses and every gradient must be the same bits as with fp32 inputs rounded again in
 * backward, over two micro-batches accumulated (a stale rounding of the first, or of another
 * layer, would show), in a dense model with the MXFP8 plan on one layer only (its inputs keep
 * planes, the others bf16), with every layer recomputed, and in an MoE model. */
static void bf16_kept_run(const mx_model_config *c, const mx_plan *plan, char *recompute, int keep, double *loss,
                          float **grads, int64_t *P, size_t *act, int *kept) {
    mx_plan_pattern rp = {recompute ? recompute : "none", NULL, 0};
    CHECK_EQ_INT(mx_pattern_compile(rp.text, &rp.compiled, NULL), 0);
    mx_model_options opt = {.batch = 2, .seq = 37, .bf16 = true, .plan = plan, .recompute = recompute ? &rp : NULL,
                            .n_recompute = recompute != NULL};
    mxi_model_keep_bf16_inputs(keep);
    mx_model *m = NULL;
    mx_diag diag;
    int rc = mx_model_create(c, &opt, &m, &diag);
    mxi_model_keep_bf16_inputs(-1);
    CHECK_EQ_INT(rc, 0);
    if (rc) {
        printf("    %s\n", diag.msg);
        return;
    }
    mx_model_init(m, 5);
    int32_t tok[2][75];
    uint64_t s = 777;
    for (int b = 0; b < 2; b++)
        for (int i = 0; i < 75; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            tok[b][i] = (int32_t)((s >> 33) % (uint64_t)c->vocab_size);
        }
    mx_model_zero_grad(m);
    for (int b = 0; b < 2; b++) {
        loss[b] = mx_model_forward(m, tok[b], tok[b] + 1);
        mx_model_backward(m, 1.0f);
    }
    CHECK_EQ_INT(mx_model_error(m, &diag), 0);
    *P = mx_model_num_params(m);
    *grads = malloc((size_t)*P * sizeof(float));
    memcpy(*grads, mx_model_grads(m), (size_t)*P * sizeof(float));
    *act = mx_model_activation_bytes(m, NULL);
    *kept = mxi_model_bf16_kept_sites(m);
    mx_model_free(m);
    mx_pattern_free(rp.compiled);
}

static void test_bf16_kept_inputs(void) {
    mxi_gemm_ctx *g = NULL;
    mx_diag diag;
    CHECK_EQ_INT(mxi_gemm_ctx_create(&g, &diag), 0);
    bool native = g && mxi_gemm_bf16_native(g);
    mxi_gemm_ctx_destroy(g);
    printf("  %s\n", native ? "native bf16 matmul: inputs kept as bf16 against fp32"
                             : "no native bf16 matmul here: both runs keep fp32 (the bf16 path needs AVX512_BF16 or AMX)");
    mx_plan plan;
    CHECK_EQ_INT(mx_plan_load_string("training:\n  quantization_plan:\n    recipe_name: mxfp8\n"
                                     "    apply_modules: ['model.layers.1']\n    ignored_modules: ['*lm_head', '*gate']\n",
                                     "plan.yaml", &plan, &diag), 0);
    mx_model_config dense = base_config(MX_MODEL_QWEN3), moe = moe_config(), llama = base_config(MX_MODEL_LLAMA);
    dense.num_hidden_layers = 3;
    llama.num_hidden_layers = 2;   // a kind kept in two layers takes as much memory as fp32: kept for speed
    // layer 1 recomputed: its kept inputs live in the recomputed region, refilled by the re-run
    char layer1[] = "model.layers.1";
    struct { const char *name; const mx_model_config *c; const mx_plan *plan; char *recompute; int kept; } cases[] = {
        {"qwen3, 3 layers", &dense, NULL, NULL, 3 * 4},
        {"qwen3, 3 layers, layer 1 mxfp8", &dense, &plan, NULL, 2 * 4},    // layer 1 keeps planes
        {"qwen3, 3 layers, layer 1 recomputed", &dense, NULL, layer1, 3 * 4},   // its region too
        {"llama, 2 layers", &llama, NULL, NULL, 2 * 4},
        {"qwen3_moe", &moe, NULL, NULL, 2 * 2 + 2},   // MoE layers: ln1 and a; the dense MLP layer: all 4
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        double loss[2][2];
        float *grads[2] = {NULL, NULL};
        int64_t P[2] = {0, 0};
        size_t act[2] = {0, 0};
        int kept[2] = {0, 0};
        for (int keep = 0; keep < 2; keep++)
            bf16_kept_run(cases[k].c, cases[k].plan, cases[k].recompute, keep ? -1 : 0, loss[keep], &grads[keep], &P[keep],
                          &act[keep], &kept[keep]);
        printf("  %s: %d inputs kept as bf16, activations %zu bytes (%zu without)\n", cases[k].name, kept[1], act[1],
               act[0]);
        CHECK_EQ_INT(kept[0], 0);
        CHECK_EQ_INT(kept[1], native ? cases[k].kept : 0);
        CHECK_EQ_INT(P[0], P[1]);
        for (int b = 0; b < 2; b++) CHECK_EQ_DBL(loss[1][b], loss[0][b]);
        if (grads[0] && grads[1] && P[0] == P[1]) CHECK_MEM_EQ(grads[1], grads[0], (size_t)P[0] * sizeof(float));
        if (native && cases[k].c != &llama) CHECK(act[1] < act[0]);
        if (native && cases[k].c == &llama) CHECK_EQ_INT((int64_t)act[1], (int64_t)act[0]);   // a tie, kept anyway
        if (!native) CHECK_EQ_INT((int64_t)act[1], (int64_t)act[0]);
        free(grads[0]), free(grads[1]);
    }
    mx_plan_free(&plan);
}

/* With the guide's plan on every layer at bf16 compute, the inputs kept as MX planes (and
 * beside o's plane the attention output as bf16, which attention's backward reads for D =
 * dO . O) against every input kept in fp32: the same losses and gradients, bit for bit, over
 * two micro-batches accumulated. Six layers, so that o's plane and its copy pay. */
static void test_saved_planes_same_bits(void) {
    mx_plan plan;
    mx_diag diag;
    CHECK_EQ_INT(mx_plan_load_string("training:\n  quantization_plan:\n    recipe_name: mxfp8\n"
                                     "    apply_modules: ['model.layers.{*}']\n    ignored_modules: ['*lm_head', '*gate']\n",
                                     "plan.yaml", &plan, &diag), 0);
    mx_model_config c = base_config(MX_MODEL_LLAMA);
    c.num_hidden_layers = 6;
    double loss[2][2];
    float *grads[2] = {NULL, NULL};
    int64_t P[2] = {0, 0};
    size_t act[2] = {0, 0};
    int kept[2] = {0, 0};
    for (int save = 0; save < 2; save++) {
        mxi_model_save_inputs(save ? -1 : 0);
        bf16_kept_run(&c, &plan, NULL, -1, loss[save], &grads[save], &P[save], &act[save], &kept[save]);
        mxi_model_save_inputs(-1);
    }
    printf("  llama, 6 layers, mxfp8 at bf16: activations %zu bytes with planes, %zu in fp32\n", act[1], act[0]);
    // the four kinds of inputs as planes (q/k/v's, o's, gate/up's, down's), o's with its bf16
    // copy beside it, as test_activation_bytes counts them
    int64_t N = 2 * 37, o_copies = 6 * (int64_t)r64(2 * N * 96);
    CHECK_EQ_INT((int64_t)(act[0] - act[1]),
                 3 * plane_saving(6, N, 96, 0) + plane_saving(6, N, 80, 0) - o_copies);
    CHECK_EQ_INT(P[0], P[1]);
    for (int b = 0; b < 2; b++) CHECK_EQ_DBL(loss[1][b], loss[0][b]);
    if (grads[0] && grads[1] && P[0] == P[1]) CHECK_MEM_EQ(grads[1], grads[0], (size_t)P[0] * sizeof(float));
    free(grads[0]), free(grads[1]);
    mx_plan_free(&plan);
}

/* The logits and the loss a chunk of rows at a time (lm_head's forward again in backward)
 * against all rows at once: the same loss and gradients up to the order of the sums (the
 * loss's mean, lm_head's gradient over the chunks), in fp32 and at bf16, tied and untied,
 * with a last chunk of odd size; the logits buffer shrinks to a chunk; a converted lm_head
 * stays whole (its backward gather has no rowwise plane to recompute from). */
static void ce_chunk_run(const mx_model_config *c, const mx_plan *plan, bool bf16, int rows, double *loss,
                         float **grads, int64_t *P, size_t *act) {
    mx_model_options opt = {.batch = 2, .seq = 37, .bf16 = bf16, .plan = plan};
    mxi_model_ce_rows(rows);
    mx_model *m = NULL;
    mx_diag diag;
    int rc = mx_model_create(c, &opt, &m, &diag);
    mxi_model_ce_rows(0);
    CHECK_EQ_INT(rc, 0);
    if (rc) return;
    mx_model_init(m, 9);
    int32_t tok[75];
    uint64_t s = 4242;
    for (int i = 0; i < 75; i++) tok[i] = (int32_t)(mxt_lcg64(&s) >> 33) % c->vocab_size;
    mx_model_zero_grad(m);
    *loss = mx_model_forward(m, tok, tok + 1);
    mx_model_backward(m, 1.0f);
    CHECK_EQ_INT(mx_model_error(m, &diag), 0);
    *P = mx_model_num_params(m);
    *grads = malloc((size_t)*P * sizeof(float));
    memcpy(*grads, mx_model_grads(m), (size_t)*P * sizeof(float));
    *act = mx_model_activation_bytes(m, NULL);
    mx_model_free(m);
}

static void test_ce_chunks(void) {
    mx_model_config llama = base_config(MX_MODEL_LLAMA), tied = base_config(MX_MODEL_QWEN3);
    tied.tie_word_embeddings = true;
    const mx_model_config *models[2] = {&llama, &tied};
    for (int k = 0; k < 2; k++)
        for (int bf16 = 0; bf16 < 2; bf16++) {
            double l0 = 0, l1 = 0;
            float *g0 = NULL, *g1 = NULL;
            int64_t P0 = 0, P1 = 0;
            size_t a0 = 0, a1 = 0;
            ce_chunk_run(models[k], NULL, bf16, 0, &l0, &g0, &P0, &a0);    // 74 rows at once
            ce_chunk_run(models[k], NULL, bf16, 32, &l1, &g1, &P1, &a1);   // 32, 32, 10
            CHECK_EQ_INT(P0, P1);
            if (!g0 || !g1 || P0 != P1) continue;
            CHECK_NEAR(l1, l0, 1e-6 * fabs(l0));
            double e = mxt_rel_err(g1, g0, (size_t)P0);
            if (!(e <= 1e-5)) mxt_fail(__FILE__, __LINE__, "model %d bf16 %d: gradients %.3g apart", k, bf16, e);
            int64_t saved = (int64_t)(a0 - a1), want = (int64_t)(74 - 32) * models[k]->vocab_size * 4;
            CHECK(saved > want - 64 && saved < want + 64);   // the arena's pieces are 64-byte aligned
            printf("  %s%s: loss %.9f whole, %.9f in chunks of 32 rows; gradients %.2g apart\n",
                   k ? "tied qwen3" : "llama", bf16 ? " bf16" : "", l0, l1, e);
            free(g0), free(g1);
        }
    // lm_head converted: whole, whatever the chunk asked for
    mx_plan plan;
    mx_diag diag;
    CHECK_EQ_INT(mx_plan_load_string("training:\n  quantization_plan:\n    recipe_name: mxfp8\n"
                                     "    apply_modules: ['*']\n    ignored_modules: []\n", "plan.yaml", &plan, &diag), 0);
    double l0 = 0, l1 = 0;
    float *g0 = NULL, *g1 = NULL;
    int64_t P0 = 0, P1 = 0;
    size_t a0 = 0, a1 = 0;
    ce_chunk_run(&llama, &plan, true, 0, &l0, &g0, &P0, &a0);
    ce_chunk_run(&llama, &plan, true, 32, &l1, &g1, &P1, &a1);
    CHECK_EQ_INT((int64_t)a0, (int64_t)a1);
    CHECK(l0 == l1);
    if (g0 && g1 && P0 == P1) CHECK_MEM_EQ(g0, g1, (size_t)P0 * sizeof(float));
    free(g0), free(g1);
    mx_plan_free(&plan);
}

static const mxt_test tests[] = {
    {"ce_chunks", test_ce_chunks},
    {"bf16_kept_inputs", test_bf16_kept_inputs},
    {"activation_bytes", test_activation_bytes},
    {"qwen3_moe_mxfp8", test_qwen3_moe_mxfp8},
    {"llama_mxfp8", test_llama_mxfp8},
    {"qwen3_mxfp8_32x32", test_qwen3_mxfp8_32x32},
    {"llama_mx_e5m2_rceil", test_llama_mx_e5m2_rceil},
    {"qwen3_moe_tensorwise", test_qwen3_moe_tensorwise},
    {"llama_tensorwise_pow2", test_llama_tensorwise_pow2},
    {"qwen3_moe_hif8", test_qwen3_moe_hif8},
    {"llama_hif8", test_llama_hif8},
    {"llama_hif8_pow2", test_llama_hif8_pow2},
    {"qwen3_moe_hif8_mixed", test_qwen3_moe_hif8_mixed},
    {"llama_fp8_hif8_grads_pow2", test_llama_fp8_hif8_grads_pow2},
    {"qwen3_moe_rowwise", test_qwen3_moe_rowwise},
    {"llama_rowwise_fp32_scales", test_llama_rowwise_fp32_scales},
    {"qwen3_moe_rowwise_with_gw_hp", test_qwen3_moe_rowwise_with_gw_hp},
    {"qwen3_moe_blockwise", test_qwen3_moe_blockwise},
    {"llama_blockwise_fp32_scales", test_llama_blockwise_fp32_scales},
    {"high_precision_gemms", test_high_precision_gemms},
    {"qwen3_moe_per_group", test_qwen3_moe_per_group},
    {"llama", test_llama},
    {"llama_bias_tied", test_llama_bias_tied},
    {"qwen3", test_qwen3},
    {"qwen3_moe", test_qwen3_moe},
    {"qwen3_moe_aux", test_qwen3_moe_aux},
    {"qwen3_moe_z_loss", test_qwen3_moe_z_loss},
    {"qwen3_moe_idle_experts", test_qwen3_moe_idle_experts},
    {"qwen3_moe_all_experts", test_qwen3_moe_all_experts},
    {"qwen3_moe_one_expert_takes_all", test_qwen3_moe_one_expert_takes_all},
    {"saved_planes_same_bits", test_saved_planes_same_bits},
    {"moe_primitives_bounded", test_moe_primitives_bounded},
};

int main(int argc, char **argv) { return MXT_RUN(tests, argc, argv); }
