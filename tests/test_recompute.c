/* Activation recompute (features.recompute_granularity): selective recompute makes the
 * attention and SwiGLU internals again in backward with forward's own calls, and full
 * recompute runs the block's forward again; either must give the same losses and gradients,
 * bit for bit, as keeping everything. Llama, Qwen3 and Qwen3-MoE of awkward sizes (hidden
 * 96, 3 heads over 1 KV head, sequence 37, intermediate 80), at fp32 and bf16 compute, with
 * and without the MXFP8 plan (its saved input planes and bf16 copies too), over two
 * micro-batches accumulated; and the activation bytes each keeps, against the sizes of what
 * selective drops. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "mxtrain/model.h"
#include "mxtrain/plan.h"

static mx_model_config config(mx_model_type type) {
    mx_model_config c = {0};
    c.type = type;
    c.vocab_size = 67;
    c.hidden_size = 96;
    c.intermediate_size = 80;
    c.num_hidden_layers = 3;
    c.num_attention_heads = 3;
    c.num_key_value_heads = 1;
    c.head_dim = 32;
    c.rms_norm_eps = 1e-6f;
    c.rope_theta = 10000.0f;
    c.max_position_embeddings = 64;
    c.initializer_range = 0.1f;
    if (type == MX_MODEL_QWEN3_MOE) {
        c.num_experts = 5;
        c.num_experts_per_tok = 2;
        c.moe_intermediate_size = 24;
        c.decoder_sparse_step = 1;
        c.mlp_only_layers[1] = true;   // layers 0 and 2 MoE, layer 1 dense
        c.norm_topk_prob = true;
        c.output_router_logits = true;
        c.router_aux_loss_coef = 0.05f;
    }
    return c;
}

enum { NONE, SELECTIVE, FULL, MODES };
static const char *const mode_names[MODES] = {"none", "selective", "full"};
enum { B = 2, T = 37, N = B * T };

typedef struct {
    double loss[2];
    float *grads;
    int64_t P;
    size_t act;
} run_result;

/* Two micro-batches accumulated with every layer recomputed as mode says. */
static run_result run(const mx_model_config *c, const mx_plan *plan, bool bf16, int mode, bool measure_only) {
    run_result r = {{0, 0}, NULL, 0, 0};
    mx_plan_pattern all = {"model.layers.{*}", NULL, 0};
    CHECK_EQ_INT(mx_pattern_compile(all.text, &all.compiled, NULL), 0);
    mx_model_options opt = {.batch = B, .seq = T, .bf16 = bf16, .plan = plan, .recompute = mode ? &all : NULL,
                            .n_recompute = mode != NONE, .external_params = measure_only,
                            .recompute_granularity = mode == SELECTIVE ? MX_RECOMPUTE_SELECTIVE : MX_RECOMPUTE_FULL};
    mx_model *m = NULL;
    mx_diag diag;
    int rc = mx_model_create(c, &opt, &m, &diag);
    CHECK_EQ_INT(rc, 0);
    if (rc) {
        printf("    %s\n", diag.msg);
        mx_pattern_free(all.compiled);
        return r;
    }
    r.act = mx_model_activation_bytes(m, NULL);
    size_t measured = 0;
    CHECK_EQ_INT(mx_model_measure_activations(c, &opt, &measured, &diag), 0);
    CHECK_EQ_INT((int64_t)measured, (int64_t)r.act);   // what `plan` predicts is what the model takes
    if (!measure_only) {
        mx_model_init(m, 5);
        int32_t tok[2][N + 1];
        uint64_t s = 777;
        for (int b = 0; b < 2; b++)
            for (int i = 0; i <= N; i++) tok[b][i] = (int32_t)((mxt_lcg64(&s) >> 33) % (uint64_t)c->vocab_size);
        mx_model_zero_grad(m);
        for (int b = 0; b < 2; b++) {
            r.loss[b] = mx_model_forward(m, tok[b], tok[b] + 1);
            mx_model_backward(m, 1.0f);
        }
        CHECK_EQ_INT(mx_model_error(m, &diag), 0);
        r.P = mx_model_num_params(m);
        r.grads = malloc((size_t)r.P * sizeof(float));
        memcpy(r.grads, mx_model_grads(m), (size_t)r.P * sizeof(float));
    }
    mx_model_free(m);
    mx_pattern_free(all.compiled);
    return r;
}

static void test_bit_identical(void) {
    mx_plan plan;
    mx_diag diag;
    CHECK_EQ_INT(mx_plan_load_string("training:\n  quantization_plan:\n    recipe_name: mxfp8\n"
                                     "    apply_modules: ['model.layers.{*}']\n    ignored_modules: ['*lm_head', '*gate']\n"
                                     "    quant_converters: ['quantize.linear.mx', 'quantize.moe.mx']\n",
                                     "plan.yaml", &plan, &diag), 0);
    mx_model_type types[] = {MX_MODEL_LLAMA, MX_MODEL_QWEN3, MX_MODEL_QWEN3_MOE};
    const char *type_names[] = {"llama", "qwen3", "qwen3_moe"};
    for (int t = 0; t < 3; t++)
        for (int mx = 0; mx < 2; mx++)
            for (int bf16 = 0; bf16 < 2; bf16++) {
                mx_model_config c = config(types[t]);
                run_result r[MODES];
                for (int mode = 0; mode < MODES; mode++) r[mode] = run(&c, mx ? &plan : NULL, bf16, mode, false);
                printf("  %s%s%s: activations %zu bytes kept, %zu selective, %zu full; loss %.9f\n", type_names[t],
                       mx ? " mxfp8" : "", bf16 ? " bf16" : "", r[NONE].act, r[SELECTIVE].act, r[FULL].act,
                       r[NONE].loss[1]);
                CHECK(r[SELECTIVE].act < r[NONE].act);
                CHECK(r[FULL].act < r[SELECTIVE].act);
                for (int mode = SELECTIVE; mode < MODES; mode++) {
                    for (int b = 0; b < 2; b++) CHECK_EQ_DBL(r[mode].loss[b], r[NONE].loss[b]);
                    CHECK_EQ_INT(r[mode].P, r[NONE].P);
                    if (r[mode].grads && r[NONE].grads && r[mode].P == r[NONE].P &&
                        memcmp(r[mode].grads, r[NONE].grads, (size_t)r[NONE].P * sizeof(float)))
                        mxt_fail(__FILE__, __LINE__, "%s%s%s: %s recompute changed the gradients", type_names[t],
                                 mx ? " mxfp8" : "", bf16 ? " bf16" : "", mode_names[mode]);
                }
                for (int mode = 0; mode < MODES; mode++) free(r[mode].grads);
            }
    mx_plan_free(&plan);
}

static int64_t r64(int64_t floats) { return (floats * 4 + 63) / 64 * 64; }   // the arena's pieces

/* Without a plan at fp32 every site keeps fp32, so selective keeps exactly the bytes of
 * everything less what it drops in each layer, plus one region for the largest layer's. */
static void test_selective_bytes(void) {
    mx_model_type types[] = {MX_MODEL_LLAMA, MX_MODEL_QWEN3, MX_MODEL_QWEN3_MOE};
    for (int t = 0; t < 3; t++) {
        mx_model_config c = config(types[t]);
        int64_t QD = c.num_attention_heads * c.head_dim, KVD = c.num_key_value_heads * c.head_dim;
        int64_t qk = types[t] == MX_MODEL_LLAMA ? 0
                                                : r64(N * QD) + r64(N * KVD) + r64(N * c.num_attention_heads) +
                                                      r64(N * c.num_key_value_heads);
        int64_t sum = 0, largest = 0;
        for (int l = 0; l < c.num_hidden_layers; l++) {
            bool moe = mx_model_layer_is_moe(&c, l);
            int64_t d = qk + (moe ? r64((int64_t)N * c.num_experts_per_tok * c.moe_intermediate_size)
                                  : r64((int64_t)N * c.intermediate_size));
            sum += d, largest = d > largest ? d : largest;
        }
        run_result none = run(&c, NULL, false, NONE, true), sel = run(&c, NULL, false, SELECTIVE, true);
        CHECK_EQ_INT((int64_t)none.act - (int64_t)sel.act, sum - largest);
    }
}

static const mxt_test tests[] = {
    {"selective_bytes", test_selective_bytes},
    {"bit_identical", test_bit_identical},
};

int main(int argc, char **argv) { return MXT_RUN(tests, argc, argv); }
