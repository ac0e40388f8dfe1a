/* Megatron's document masking (data.reset_attention_mask, reset_position_ids, eod_mask_loss).
 * The masked attention against its scalar reference for every nn kernel table, and against
 * plain causal attention run on each document alone (an oracle that knows nothing of the
 * masking): odd T, head dims, GQA ratios, documents of one token, a row without an EOD, an
 * EOD at the last position. The model: a micro-batch of concatenated documents, with the
 * attention mask and positions reset, gives the loss and gradients of each document run on
 * its own (the unmasked model); with eod_mask_loss, those of each document less its EOD
 * input; recompute (full, selective) changes no bit of them. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "model/layers.h"
#include "mxtrain/model.h"
#include "mxtrain/mx.h"
#include "ops/attention.h"
#include "ops/nn_kernels.h"

static float *randn(size_t n, uint64_t *state) {
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) {
        double u = 0;
        for (int j = 0; j < 4; j++) u += (double)(mxt_lcg64(state) >> 11) / 9007199254740992.0 - 0.5;
        x[i] = (float)(u * 1.7);
    }
    return x;
}

/* doc[t] for a row cut into documents of the given lengths (summing to T). */
static void starts_of(int32_t *doc, const int *len, int n) {
    for (int i = 0, t = 0; i < n; t += len[i++])
        for (int j = 0; j < len[i]; j++) doc[t + j] = t;
}

typedef struct {
    int T, NH, NKV, HD;
    int n;          // documents in row 0 (row 1 is cut in reverse order)
    int len[8];
} case_t;

/* Row b of a (B, T, H, HD) tensor, positions [t0, t0 + len), into dst (1, len, H, HD). */
static void take_rows(float *dst, const float *src, int b, int T, int t0, int len, int H, int HD) {
    memcpy(dst, src + ((size_t)b * T + t0) * H * HD, (size_t)len * H * HD * sizeof(float));
}

static void check_case(mxi_gemm_ctx *g, const case_t *c, bool bf16, const char *kname) {
    enum { B = 2 };
    int T = c->T, NH = c->NH, NKV = c->NKV, HD = c->HD;
    size_t nq = (size_t)B * T * NH * HD, nk = (size_t)B * T * NKV * HD;
    uint64_t st = 99 + (uint64_t)T * 7 + (uint64_t)HD;
    float *q = randn(nq, &st), *k = randn(nk, &st), *v = randn(nk, &st), *dy = randn(nq, &st);
    int32_t *doc = malloc((size_t)B * T * sizeof *doc);
    int rev[8];
    for (int i = 0; i < c->n; i++) rev[i] = c->len[c->n - 1 - i];
    starts_of(doc, c->len, c->n);
    starts_of(doc + T, rev, c->n);
    float *out = malloc(nq * 4), *stats = malloc((size_t)B * NH * T * 2 * 4), *dq = malloc(nq * 4),
          *dk = malloc(nk * 4), *dv = malloc(nk * 4);
    int64_t ns = mxi_attention_scratch(B, T, NH, NKV, HD, bf16);
    float *scratch = malloc((size_t)ns * 4);
    for (int64_t i = 0; i < ns; i++) scratch[i] = NAN;
    // the reference with the same document starts
    float *r_out = malloc(nq * 4), *r_att = malloc((size_t)B * NH * T * T * 4), *r_dq = malloc(nq * 4),
          *r_dk = malloc(nk * 4), *r_dv = malloc(nk * 4);
    mxi_attention_forward_ref(r_out, r_att, q, k, v, doc, B, T, NH, NKV, HD, bf16);
    mxi_attention_backward_ref(r_dq, r_dk, r_dv, dy, r_out, r_att, q, k, v, doc, B, T, NH, NKV, HD, bf16);
    mx_diag diag = {{0}};
    CHECK_EQ_INT(mxi_attention_forward(g, out, stats, scratch, q, k, v, doc, B, T, NH, NKV, HD, bf16, &diag), 0);
    for (int64_t i = 0; i < ns; i++) scratch[i] = NAN;
    // D = dO . O from the reference's output, as test_attention.c takes it
    CHECK_EQ_INT(mxi_attention_backward(g, dq, dk, dv, scratch, dy, (mxi_att_output){.f32 = r_out}, stats, q, k, v, doc,
                                        B, T, NH, NKV, HD, bf16, &diag),
                 0);
    // at bf16 the forward rounds P before the division by the row's sum (see test_attention.c)
    double tol = bf16 ? 2e-4 : 2e-6, tol_out = bf16 ? 3e-3 : tol;
    double e[5] = {mxt_rel_err(out, r_out, nq), mxt_rel_err(dq, r_dq, nq), mxt_rel_err(dk, r_dk, nk),
                   mxt_rel_err(dv, r_dv, nk), 0};
    // the oracle: each document alone through the plain causal reference (fp32 only: at
    // bf16 the reference's own rounding is checked above)
    if (!bf16) {
        float *o_out = malloc(nq * 4), *o_dq = malloc(nq * 4), *o_dk = malloc(nk * 4), *o_dv = malloc(nk * 4);
        for (int b = 0; b < B; b++)
            for (int t0 = 0; t0 < T;) {
                int len = 1;
                while (t0 + len < T && doc[(size_t)b * T + t0 + len] == t0) len++;
                float *dq1 = malloc((size_t)len * NH * HD * 4), *dk1 = malloc((size_t)len * NKV * HD * 4),
                      *dv1 = malloc((size_t)len * NKV * HD * 4), *q1 = malloc((size_t)len * NH * HD * 4),
                      *k1 = malloc((size_t)len * NKV * HD * 4), *v1 = malloc((size_t)len * NKV * HD * 4),
                      *dy1 = malloc((size_t)len * NH * HD * 4), *o1 = malloc((size_t)len * NH * HD * 4),
                      *a1 = malloc((size_t)NH * len * len * 4);
                take_rows(q1, q, b, T, t0, len, NH, HD), take_rows(dy1, dy, b, T, t0, len, NH, HD);
                take_rows(k1, k, b, T, t0, len, NKV, HD), take_rows(v1, v, b, T, t0, len, NKV, HD);
                mxi_attention_forward_ref(o1, a1, q1, k1, v1, NULL, 1, len, NH, NKV, HD, false);
                mxi_attention_backward_ref(dq1, dk1, dv1, dy1, o1, a1, q1, k1, v1, NULL, 1, len, NH, NKV, HD, false);
                size_t qo = ((size_t)b * T + t0) * NH * HD, ko = ((size_t)b * T + t0) * NKV * HD;
                memcpy(o_out + qo, o1, (size_t)len * NH * HD * 4), memcpy(o_dq + qo, dq1, (size_t)len * NH * HD * 4);
                memcpy(o_dk + ko, dk1, (size_t)len * NKV * HD * 4), memcpy(o_dv + ko, dv1, (size_t)len * NKV * HD * 4);
                free(dq1), free(dk1), free(dv1), free(q1), free(k1), free(v1), free(dy1), free(o1), free(a1);
                t0 += len;
            }
        e[4] = fmax(fmax(mxt_rel_err(out, o_out, nq), mxt_rel_err(dq, o_dq, nq)),
                    fmax(mxt_rel_err(dk, o_dk, nk), mxt_rel_err(dv, o_dv, nk)));
        free(o_out), free(o_dq), free(o_dk), free(o_dv);
    }
    static const char *const names[5] = {"out", "dq", "dk", "dv", "each document alone (worst of all)"};
    for (int i = 0; i < 5; i++)
        if (!(e[i] <= (i == 0 ? tol_out : tol)))
            mxt_fail(__FILE__, __LINE__, "%s %s T=%d NH=%d NKV=%d HD=%d docs=%d: %s relative error %.3g > %.3g", kname,
                     bf16 ? "bf16" : "fp32", T, NH, NKV, HD, c->n, names[i], e[i], i == 0 ? tol_out : tol);
    free(q), free(k), free(v), free(dy), free(doc), free(out), free(stats), free(dq), free(dk), free(dv), free(scratch);
    free(r_out), free(r_att), free(r_dq), free(r_dk), free(r_dv);
}

static void test_attention_documents(void) {
    static const case_t cases[] = {
        {1, 1, 1, 1, 1, {1}},                       // one token
        {37, 5, 1, 7, 1, {37}},                     // no EOD in the row
        {37, 4, 2, 8, 4, {1, 1, 30, 5}},            // documents of one token
        {65, 6, 3, 12, 3, {64, 1, 0}},              // a document ending at the block edge
        {130, 2, 2, 33, 5, {3, 60, 2, 64, 1}},      // the last token alone (EOD at T-2)
        {200, 8, 2, 16, 6, {40, 40, 40, 40, 39, 1}},
        {129, 4, 1, 16, 2, {100, 29}},
    };
    mxi_gemm_ctx *g = NULL;
    mx_diag diag = {{0}};
    CHECK_EQ_INT(mxi_gemm_ctx_create(&g, &diag), 0);
    for (mx_kernel id = MX_KERNEL_REF; g && mx_kernel_name(id); id = (mx_kernel)(id + 1)) {
        if (!mx_kernel_available(id)) continue;
        mx_kernel_select(id);
        for (int bf16 = 0; bf16 < 2; bf16++) {
            int before = mxt_current_failures();
            for (size_t j = 0; j < sizeof cases / sizeof cases[0]; j++) {
                case_t c = cases[j];
                int n = 0;   // drop zero lengths (a case's padding)
                for (int i = 0; i < c.n; i++)
                    if (c.len[i]) c.len[n++] = c.len[i];
                c.n = n;
                check_case(g, &c, bf16, mx_kernel_name(id));
            }
            printf("  nn kernel %s, %s: %s%zu cases\n", mx_kernel_name(id), bf16 ? "bf16" : "fp32",
                   mxt_current_failures() > before ? "FAILED: " : "", sizeof cases / sizeof cases[0]);
        }
    }
    mx_kernel_select(MX_KERNEL_AUTO);
    mxi_gemm_ctx_destroy(g);
}

/* ---- the model ---- */

enum { EOD = 66, V = 67 };

static mx_model_config config(mx_model_type type) {
    mx_model_config c = {0};
    c.type = type;
    c.vocab_size = V;
    c.hidden_size = 64;
    c.intermediate_size = 48;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 16;
    c.rms_norm_eps = 1e-6f;
    c.rope_theta = 10000.0f;
    c.max_position_embeddings = 128;
    c.initializer_range = 0.1f;
    if (type == MX_MODEL_QWEN3_MOE) {   // routing per token; no load-balancing loss (a batch statistic)
        c.num_experts = 4;
        c.num_experts_per_tok = 2;
        c.moe_intermediate_size = 24;
        c.decoder_sparse_step = 1;
        c.norm_topk_prob = true;
    }
    return c;
}

typedef struct {
    double loss;
    float *grads;
    int64_t P;
} result;

/* One forward and backward of B rows of T tokens (inputs, targets), gradients scaled by 1. */
static result run(const mx_model_config *c, int B, int T, const int32_t *in, const int32_t *tg, mx_model_documents d,
                  int recompute, float scale) {
    result r = {0, NULL, 0};
    mx_plan_pattern all = {"model.layers.{*}", NULL, 0};
    CHECK_EQ_INT(mx_pattern_compile(all.text, &all.compiled, NULL), 0);
    mx_model_options opt = {.batch = B, .seq = T, .recompute = recompute ? &all : NULL, .n_recompute = recompute > 0,
                            .recompute_granularity = recompute == 1 ? MX_RECOMPUTE_SELECTIVE : MX_RECOMPUTE_FULL,
                            .documents = d};
    mx_model *m = NULL;
    mx_diag diag;
    CHECK_EQ_INT(mx_model_create(c, &opt, &m, &diag), 0);
    if (m) {
        mx_model_init(m, 11);
        mx_model_zero_grad(m);
        r.loss = mx_model_forward(m, in, tg);
        mx_model_backward(m, scale);
        CHECK_EQ_INT(mx_model_error(m, &diag), 0);
        r.P = mx_model_num_params(m);
        r.grads = malloc((size_t)r.P * sizeof(float));
        memcpy(r.grads, mx_model_grads(m), (size_t)r.P * sizeof(float));
        mx_model_free(m);
    }
    mx_pattern_free(all.compiled);
    return r;
}

/* Two rows of documents, each ending with EOD (row 0's last is an EOD alone at the last
 * position): lengths below. */
enum { T = 45, B = 2 };
static const int row_len[B][6] = {{7, 1, 20, 16, 1, 0}, {30, 1, 14, 0}};

static void tokens(int32_t *in, int32_t *tg) {
    uint64_t s = 4242;
    int32_t all[B * T + 1];
    for (int i = 0; i <= B * T; i++) all[i] = (int32_t)((mxt_lcg64(&s) >> 33) % (EOD));
    for (int b = 0; b < B; b++) {
        int t = 0;
        for (int i = 0; row_len[b][i]; i++) {
            t += row_len[b][i];
            all[b * T + t - 1] = EOD;
        }
    }
    memcpy(in, all, sizeof(int32_t) * B * T);
    memcpy(tg, all + 1, sizeof(int32_t) * B * T);
}

/* The oracle: every document on its own through the model without masking, its loss and
 * gradients weighted by its share of the positions that count. With eod_mask_loss a document
 * ending in EOD runs without that token (causal: the others' outputs do not depend on it). */
static result oracle(const mx_model_config *c, const int32_t *in, const int32_t *tg, bool mask_loss) {
    result o = {0, NULL, 0};
    int total = 0;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) total += !(mask_loss && in[b * T + t] == EOD);
    for (int b = 0; b < B; b++)
        for (int i = 0, t0 = 0; row_len[b][i]; t0 += row_len[b][i++]) {
            int len = row_len[b][i];
            if (mask_loss && in[b * T + t0 + len - 1] == EOD) len--;
            if (len == 0) continue;
            result r = run(c, 1, len, in + b * T + t0, tg + b * T + t0, (mx_model_documents){0}, 0,
                           (float)len / (float)total);
            o.loss += r.loss * len / total;
            if (!o.grads) o.P = r.P, o.grads = calloc((size_t)r.P, sizeof(float));
            for (int64_t p = 0; p < r.P; p++) o.grads[p] += r.grads[p];
            free(r.grads);
        }
    return o;
}

static void test_model_documents(void) {
    int32_t in[B * T], tg[B * T];
    tokens(in, tg);
    mx_model_type types[] = {MX_MODEL_LLAMA, MX_MODEL_QWEN3, MX_MODEL_QWEN3_MOE};
    const char *names[] = {"llama", "qwen3", "qwen3_moe"};
    for (int t = 0; t < 3; t++)
        for (int mask_loss = 0; mask_loss < 2; mask_loss++) {
            mx_model_config c = config(types[t]);
            mx_model_documents d = {.eod_token = EOD, .reset_attention_mask = true, .reset_position_ids = true,
                                    .eod_mask_loss = mask_loss};
            result got = run(&c, B, T, in, tg, d, 0, 1.0f), want = oracle(&c, in, tg, mask_loss);
            double e = got.P == want.P ? mxt_rel_err(got.grads, want.grads, (size_t)got.P) : 1.0;
            printf("  %s%s: loss %.9f, each document alone %.9f; gradients relative error %.3g\n", names[t],
                   mask_loss ? " eod_mask_loss" : "", got.loss, want.loss, e);
            CHECK_NEAR(got.loss, want.loss, 2e-6 * fabs(want.loss));
            CHECK(e <= 2e-5);
            // without the masks the documents see each other: the oracle must tell
            if (!mask_loss) {
                result plain = run(&c, B, T, in, tg, (mx_model_documents){0}, 0, 1.0f);
                CHECK(fabs(plain.loss - want.loss) > 1e-4 * fabs(want.loss));
                free(plain.grads);
            }
            // recompute: the same bits
            for (int rc = 1; rc <= 2; rc++) {
                result r = run(&c, B, T, in, tg, d, rc, 1.0f);
                CHECK_EQ_DBL(r.loss, got.loss);
                CHECK(r.P == got.P && !memcmp(r.grads, got.grads, (size_t)got.P * sizeof(float)));
                free(r.grads);
            }
            free(got.grads), free(want.grads);
        }
}

/* eod_mask_loss alone: the loss is the mean over positions whose input is not EOD, which the
 * unmasked model gives on a row made only of such positions... checked by the oracle above;
 * here the edge: a micro-batch of EOD inputs only keeps nothing (loss 0, gradients 0). */
static void test_all_masked(void) {
    mx_model_config c = config(MX_MODEL_LLAMA);
    int32_t in[8], tg[8];
    for (int i = 0; i < 8; i++) in[i] = EOD, tg[i] = i;
    result r = run(&c, 1, 8, in, tg, (mx_model_documents){.eod_token = EOD, .eod_mask_loss = true}, 0, 1.0f);
    CHECK_EQ_DBL(r.loss, 0.0);
    int64_t nonzero = 0;
    for (int64_t p = 0; p < r.P; p++) nonzero += r.grads[p] != 0.0f;
    CHECK_EQ_INT(nonzero, 0);
    free(r.grads);
}

/* RoPE at per-token positions: a row whose positions restart at 7 and 20 is rotated as the
 * pieces [0, 7), [7, 20), [20, T) each rotated from position 0; and reset_position_ids alone
 * (documents still see each other) changes the model's loss. */
static void test_positions(void) {
    enum { RT = 31, H = 3, HD = 8 };
    float cs[RT * HD / 2], sn[RT * HD / 2];
    mxi_rope_tables(cs, sn, RT, HD, 10000.0f);
    uint64_t st = 5;
    float *x = randn((size_t)RT * H * HD, &st), *y = malloc(sizeof(float) * RT * H * HD);
    memcpy(y, x, sizeof(float) * RT * H * HD);
    int32_t pos[RT];
    for (int t = 0; t < RT; t++) pos[t] = t < 7 ? t : t < 20 ? t - 7 : t - 20;
    mxi_rope_forward(x, cs, sn, pos, 1, RT, H, HD);
    mxi_rope_forward(y, cs, sn, NULL, 1, 7, H, HD);
    mxi_rope_forward(y + 7 * H * HD, cs, sn, NULL, 1, 13, H, HD);
    mxi_rope_forward(y + 20 * H * HD, cs, sn, NULL, 1, RT - 20, H, HD);
    CHECK_MEM_EQ(x, y, sizeof(float) * RT * H * HD);
    mxi_rope_backward(x, cs, sn, pos, 1, RT, H, HD);
    mxi_rope_backward(y, cs, sn, NULL, 1, 7, H, HD);
    mxi_rope_backward(y + 7 * H * HD, cs, sn, NULL, 1, 13, H, HD);
    mxi_rope_backward(y + 20 * H * HD, cs, sn, NULL, 1, RT - 20, H, HD);
    CHECK_MEM_EQ(x, y, sizeof(float) * RT * H * HD);
    free(x), free(y);
    mx_model_config c = config(MX_MODEL_QWEN3);
    int32_t in[B * T], tg[B * T];
    tokens(in, tg);
    result a = run(&c, B, T, in, tg, (mx_model_documents){0}, 0, 1.0f),
           b = run(&c, B, T, in, tg, (mx_model_documents){.eod_token = EOD, .reset_position_ids = true}, 0, 1.0f);
    printf("  reset_position_ids alone: loss %.9f, without %.9f\n", b.loss, a.loss);
    CHECK(fabs(a.loss - b.loss) > 1e-5);
    free(a.grads), free(b.grads);
}

int main(int argc, char **argv) {
    static const mxt_test tests[] = {
        {"positions", test_positions},
        {"attention_documents", test_attention_documents},
        {"model_documents", test_model_documents},
        {"all_masked", test_all_masked},
    };
    return MXT_RUN(tests, argc, argv);
}
