/* The transformer layers against PyTorch autograd (tests/py/layers_ref.py writes inputs and
 * PyTorch's outputs and gradients; each layer here must match them to fp32 rounding). */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "model/layers.h"
#include "mxtrain/mx.h"
#include "ops/attention.h"
#include "ops/nn_kernels.h"

enum { B = 2, T = 37, C = 96, NH = 3, NKV = 1, HD = 32, F = 80, V = 67, N = B * T };
static const float THETA = 10000.0f, EPS = 1e-6f;
static char ref_dir[256];

/* Read ref_dir/name.bin holding exactly n 4-byte values; NULL (and a failed check) otherwise. */
static void *load(const char *name, size_t n) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s.bin", ref_dir, name);
    FILE *f = fopen(path, "rb");
    void *buf = malloc(n * 4 + 1);
    size_t got = f ? fread(buf, 1, n * 4 + 1, f) : 0;
    if (f) fclose(f);
    if (got != n * 4) {
        mxt_fail(__FILE__, __LINE__, "%s: read %zu bytes, want %zu", path, got, n * 4);
        free(buf);
        return NULL;
    }
    return buf;
}

#define CHECK_CLOSE(got, want, n, tol) do { \
    double e_ = mxt_rel_err(got, want, n); \
    if (!(e_ <= (tol))) mxt_fail(__FILE__, __LINE__, "%s vs %s: relative error %.3g > %.3g", #got, #want, e_, (double)(tol)); \
} while (0)

static void test_rmsnorm(void) {
    float *x = load("rms_x", N * C), *w = load("rms_w", C), *dy = load("rms_dy", N * C), *y = load("rms_y", N * C),
          *dx = load("rms_dx", N * C), *dw = load("rms_dw", C);
    if (x && w && dy && y && dx && dw) {
        float out[N * C], rstd[N], din[N * C], dwt[C];
        for (int c = 0; c < C; c++) dwt[c] = 0.5f;    // backward accumulates into dweight
        mxi_rmsnorm_forward(out, rstd, x, w, N, C, EPS);
        mxi_rmsnorm_backward(din, dwt, dy, x, w, rstd, N, C);
        for (int c = 0; c < C; c++) dwt[c] -= 0.5f;
        CHECK_CLOSE(out, y, N * C, 1e-6);
        CHECK_CLOSE(din, dx, N * C, 1e-5);
        CHECK_CLOSE(dwt, dw, C, 1e-5);
    }
    free(x), free(w), free(dy), free(y), free(dx), free(dw);
}

static void test_rope(void) {
    float *x = load("rope_x", B * T * NH * HD), *dy = load("rope_dy", B * T * NH * HD), *y = load("rope_y", B * T * NH * HD),
          *dx = load("rope_dx", B * T * NH * HD), *cs = load("rope_cos", T * HD / 2), *sn = load("rope_sin", T * HD / 2);
    if (x && dy && y && dx && cs && sn) {
        static float c_t[T * HD / 2], s_t[T * HD / 2];
        mxi_rope_tables(c_t, s_t, T, HD, THETA);
        CHECK_CLOSE(c_t, cs, T * HD / 2, 1e-6);
        CHECK_CLOSE(s_t, sn, T * HD / 2, 1e-6);
        mxi_rope_forward(x, c_t, s_t, NULL, B, T, NH, HD);
        mxi_rope_backward(dy, c_t, s_t, NULL, B, T, NH, HD);
        CHECK_CLOSE(x, y, B * T * NH * HD, 1e-6);
        CHECK_CLOSE(dy, dx, B * T * NH * HD, 1e-6);
    }
    free(x), free(dy), free(y), free(dx), free(cs), free(sn);
}

/* Both the fused attention (each nn kernel table the CPU runs) and the scalar reference
 * against PyTorch, at fp32 (within 1e-5) or at bf16 compute precision: against PyTorch
 * running the same products on bf16-rounded factors with fp32 accumulation (layers_ref.py's
 * BF16MatMul). There a probability a few ulps off PyTorch's can round to the neighbouring
 * bf16 (see test_attention.c), so the tolerance is 2e-4; the fp32 results stand about 1e-3
 * away, which the last check makes sure of. The fused forward rounds P before dividing by
 * the row's sum (flash attention's order), PyTorch after it: its out is held to 3e-3. The
 * backward's D = dO . O (flash attention's) is taken from PyTorch's output, so that the
 * forward's difference does not enter the gradients. */
static void check_attention(bool bf16) {
    size_t nq = B * T * NH * HD, nk = B * T * NKV * HD;
    const char *p = bf16 ? "attb" : "att";
    char name[32];
#define LOAD_OUT(x, what, n) (snprintf(name, sizeof name, "%s_%s", p, what), x = load(name, n))
    float *q = load("att_q", nq), *k = load("att_k", nk), *v = load("att_v", nk), *dy = load("att_dy", nq),
          *dq32 = load("att_dq", nq), *y, *dq, *dk, *dv;
    LOAD_OUT(y, "y", nq), LOAD_OUT(dq, "dq", nq), LOAD_OUT(dk, "dk", nk), LOAD_OUT(dv, "dv", nk);
#undef LOAD_OUT
    double tol = bf16 ? 2e-4 : 1e-5;
    mxi_gemm_ctx *g = NULL;
    mx_diag diag = {{0}};
    CHECK_EQ_INT(mxi_gemm_ctx_create(&g, &diag), 0);
    if (q && k && v && dy && y && dq && dk && dv && dq32 && g) {
        float *out = malloc(nq * 4), *att = malloc((size_t)B * NH * T * T * 4), *stats = malloc((size_t)B * NH * T * 2 * 4),
              *gq = malloc(nq * 4),
              *gk = malloc(nk * 4), *gv = malloc(nk * 4),
              *scratch = malloc((size_t)mxi_attention_scratch(B, T, NH, NKV, HD, bf16) * 4);
        // each nn kernel table the library has (kernels 1 .. MX_KERNEL_AVX512), then the scalar reference
        for (int run = MX_KERNEL_REF; run <= MX_KERNEL_AVX512 + 1; run++) {
            if (run <= MX_KERNEL_AVX512) {
                if (!mx_kernel_available((mx_kernel)run)) {
                    printf("  attention, nn kernel %s: not run (%s)\n", mx_kernel_name((mx_kernel)run),
                           mx_kernel_missing((mx_kernel)run));
                    continue;
                }
                mx_kernel_select((mx_kernel)run);
                printf("  %s fused attention, nn kernel %s\n", bf16 ? "bf16" : "fp32", mxi_nn_kernels_active()->name);
                CHECK_EQ_INT(mxi_attention_forward(g, out, stats, scratch, q, k, v, NULL, B, T, NH, NKV, HD, bf16, &diag), 0);
                CHECK_EQ_INT(mxi_attention_backward(g, gq, gk, gv, scratch, dy, (mxi_att_output){.f32 = y}, stats, q, k,
                                                    v, NULL, B, T, NH, NKV, HD, bf16, &diag), 0);
                // each row's 1 / sum of exps: the row's largest exp is 1, so in (0, 1]
                for (int i = 0; i < B * NH * T; i++) CHECK(stats[2 * i + 1] > 0 && stats[2 * i + 1] <= 1);
            } else {
                printf("  %s attention, scalar reference\n", bf16 ? "bf16" : "fp32");
                mxi_attention_forward_ref(out, att, q, k, v, NULL, B, T, NH, NKV, HD, bf16);
                mxi_attention_backward_ref(gq, gk, gv, dy, y, att, q, k, v, NULL, B, T, NH, NKV, HD, bf16);
            }
            CHECK_CLOSE(out, y, nq, bf16 && run <= MX_KERNEL_AVX512 ? 3e-3 : tol);
            CHECK_CLOSE(gq, dq, nq, tol);
            CHECK_CLOSE(gk, dk, nk, tol);
            CHECK_CLOSE(gv, dv, nk, tol);
            if (bf16) CHECK(mxt_rel_err(gq, dq32, nq) > 5e-4);
            // the reference's probabilities, causal: row t has zero probability beyond t and sums to one
            for (int t = 0; t < T && run > MX_KERNEL_AVX512; t++) {
                double s = 0;
                for (int u = 0; u < T; u++) s += att[(size_t)t * T + u];
                CHECK_NEAR(s, 1.0, 1e-5);
                if (t + 1 < T) CHECK_EQ_DBL(att[(size_t)t * T + t + 1], 0.0);
            }
        }
        mx_kernel_select(MX_KERNEL_AUTO);
        free(out), free(att), free(stats), free(gq), free(gk), free(gv), free(scratch);
    }
    mxi_gemm_ctx_destroy(g);
    free(q), free(k), free(v), free(dy), free(y), free(dq), free(dk), free(dv), free(dq32);
}

static void test_attention(void) { check_attention(false); }
static void test_attention_bf16(void) { check_attention(true); }

/* Megatron's document masking against PyTorch: layers_ref.py builds the explicit attention
 * mask and position ids from the EOD tokens of each row (get_ltor_masks_and_position_ids);
 * here the rotary embedding at the positions within each document and the attention with
 * each row's document starts, for each nn kernel table, forward and backward. */
static void test_attention_documents(void) {
    enum { EOD = 0 };
    size_t nq = B * T * NH * HD, nk = B * T * NKV * HD;
    int32_t *tok = load("doc_tok", N);
    float *q = load("doc_q", nq), *k = load("doc_k", nk), *v = load("doc_v", nk), *dy = load("doc_dy", nq),
          *y = load("doc_y", nq), *dq = load("doc_dq", nq), *dk = load("doc_dk", nk), *dv = load("doc_dv", nk);
    mxi_gemm_ctx *g = NULL;
    mx_diag diag = {{0}};
    CHECK_EQ_INT(mxi_gemm_ctx_create(&g, &diag), 0);
    if (tok && q && k && v && dy && y && dq && dk && dv && g) {
        int32_t doc[N], pos[N];
        for (int b = 0; b < B; b++)
            for (int t = 0, start = 0; t < T; t++) {
                doc[b * T + t] = start, pos[b * T + t] = t - start;
                if (tok[b * T + t] == EOD) start = t + 1;
            }
        static float c_t[T * HD / 2], s_t[T * HD / 2];
        mxi_rope_tables(c_t, s_t, T, HD, THETA);
        float *qr = malloc(nq * 4), *kr = malloc(nk * 4), *out = malloc(nq * 4), *stats = malloc((size_t)B * NH * T * 8),
              *gq = malloc(nq * 4), *gk = malloc(nk * 4), *gv = malloc(nk * 4),
              *scratch = malloc((size_t)mxi_attention_scratch(B, T, NH, NKV, HD, false) * 4);
        for (int run = MX_KERNEL_REF; run <= MX_KERNEL_AVX512; run++) {
            if (!mx_kernel_available((mx_kernel)run)) continue;
            mx_kernel_select((mx_kernel)run);
            memcpy(qr, q, nq * 4), memcpy(kr, k, nk * 4);
            mxi_rope_forward(qr, c_t, s_t, pos, B, T, NH, HD);
            mxi_rope_forward(kr, c_t, s_t, pos, B, T, NKV, HD);
            CHECK_EQ_INT(mxi_attention_forward(g, out, stats, scratch, qr, kr, v, doc, B, T, NH, NKV, HD, false, &diag), 0);
            CHECK_EQ_INT(mxi_attention_backward(g, gq, gk, gv, scratch, dy, (mxi_att_output){.f32 = out}, stats, qr, kr,
                                                v, doc, B, T, NH, NKV, HD, false, &diag), 0);
            mxi_rope_backward(gq, c_t, s_t, pos, B, T, NH, HD);
            mxi_rope_backward(gk, c_t, s_t, pos, B, T, NKV, HD);
            printf("  documents: rotary at document positions, masked attention, nn kernel %s\n",
                   mxi_nn_kernels_active()->name);
            CHECK_CLOSE(out, y, nq, 1e-5);
            CHECK_CLOSE(gq, dq, nq, 1e-5);
            CHECK_CLOSE(gk, dk, nk, 1e-5);
            CHECK_CLOSE(gv, dv, nk, 1e-5);
        }
        mx_kernel_select(MX_KERNEL_AUTO);
        free(qr), free(kr), free(out), free(stats), free(gq), free(gk), free(gv), free(scratch);
    }
    mxi_gemm_ctx_destroy(g);
    free(tok), free(q), free(k), free(v), free(dy), free(y), free(dq), free(dk), free(dv);
}

static void test_swiglu(void) {
    float *g = load("swi_g", N * F), *u = load("swi_u", N * F), *dy = load("swi_dy", N * F), *y = load("swi_y", N * F),
          *dg = load("swi_dg", N * F), *du = load("swi_du", N * F);
    if (g && u && dy && y && dg && du) {
        static float out[N * F], gg[N * F], gu[N * F];
        mxi_swiglu_forward(out, g, u, N, F, F);
        mxi_swiglu_backward(gg, gu, dy, g, u, N, F, F);
        CHECK_CLOSE(out, y, N * F, 1e-6);
        CHECK_CLOSE(gg, dg, N * F, 1e-6);
        CHECK_CLOSE(gu, du, N * F, 1e-6);
    }
    free(g), free(u), free(dy), free(y), free(dg), free(du);
}

static void test_cross_entropy(void) {
    float *z = load("ce_z", N * V), *loss = load("ce_loss", 1), *dz = load("ce_dz", N * V);
    int32_t *tgt = load("ce_tgt", N);
    if (z && loss && dz && tgt) {
        static float gz[N * V];
        double l = mxi_cross_entropy_forward_backward(gz, z, tgt, N, V, 1.0f / N);
        CHECK_NEAR(l, loss[0], 1e-5 * fabs(loss[0]));
        CHECK_CLOSE(gz, dz, N * V, 1e-5);
        CHECK_NEAR(mxi_cross_entropy_forward_backward(NULL, z, tgt, N, V, 0), l, 1e-12);
    }
    free(z), free(loss), free(dz), free(tgt);
}

static void test_embedding(void) {
    float *w = load("emb_w", V * C), *dy = load("emb_dy", N * C), *y = load("emb_y", N * C), *dw = load("emb_dw", V * C);
    int32_t *tok = load("emb_tok", N);
    if (w && dy && y && dw && tok) {
        static float out[N * C], gw[V * C];
        mxi_embedding_forward(out, tok, w, N, C);
        mxi_embedding_backward(gw, dy, tok, N, C);
        CHECK_CLOSE(out, y, N * C, 0);
        CHECK_CLOSE(gw, dw, V * C, 1e-6);
    }
    free(w), free(dy), free(y), free(dw), free(tok);
}

static void check_moe(int norm) {
    enum { E = 6, K = 2 };
    const double coef = 0.25;
    char name[64];
    float *z[2], *g[2], *w[2], *dz[2], *aux;
    int32_t *idx[2];
    bool ok = true;
    for (int l = 0; l < 2; l++) {
        snprintf(name, sizeof name, "moe%d_z%d", norm, l), ok &= !!(z[l] = load(name, N * E));
        snprintf(name, sizeof name, "moe%d_g%d", norm, l), ok &= !!(g[l] = load(name, N * K));
        snprintf(name, sizeof name, "moe%d_w%d", norm, l), ok &= !!(w[l] = load(name, N * K));
        snprintf(name, sizeof name, "moe%d_dz%d", norm, l), ok &= !!(dz[l] = load(name, N * E));
        snprintf(name, sizeof name, "moe%d_idx%d", norm, l), ok &= !!(idx[l] = load(name, N * K));
    }
    snprintf(name, sizeof name, "moe%d_aux", norm), ok &= !!(aux = load(name, 1));
    if (ok) {
        static float probs[2][N * E], rw[2][N * K], dlogits[N * E], aux_dprob[E];
        static int32_t ri[2][N * K];
        double count[E] = {0}, prob_sum[E] = {0};
        for (int l = 0; l < 2; l++) {
            mxi_moe_route_forward(ri[l], rw[l], probs[l], z[l], N, E, K, norm);
            mxi_moe_aux_accumulate(count, prob_sum, ri[l], probs[l], N, E, K);
            for (int i = 0; i < N * K; i++) CHECK_EQ_INT(ri[l][i], idx[l][i]);
            CHECK_CLOSE(rw[l], w[l], N * K, 1e-6);
        }
        CHECK_NEAR(mxi_moe_aux_loss(count, prob_sum, E, 2.0 * N), aux[0], 1e-6);
        mxi_moe_aux_dprob(aux_dprob, count, E, 2.0 * N, coef);
        for (int l = 0; l < 2; l++) {
            mxi_moe_route_backward(dlogits, g[l], probs[l], ri[l], aux_dprob, N, E, K, norm);
            CHECK_CLOSE(dlogits, dz[l], N * E, 1e-5);
        }
    }
    for (int l = 0; l < 2; l++) free(z[l]), free(g[l]), free(w[l]), free(dz[l]), free(idx[l]);
    free(aux);
}

static void test_moe_routing(void) { check_moe(0); }
static void test_moe_routing_normalised(void) { check_moe(1); }

static const mxt_test tests[] = {
    {"moe_routing", test_moe_routing}, {"moe_routing_normalised", test_moe_routing_normalised},
    {"rmsnorm", test_rmsnorm},     {"rope", test_rope},
    {"attention", test_attention}, {"attention_bf16", test_attention_bf16},
    {"attention_documents", test_attention_documents}, {"swiglu", test_swiglu},
    {"cross_entropy", test_cross_entropy}, {"embedding", test_embedding},
};

int main(int argc, char **argv) {
    snprintf(ref_dir, sizeof ref_dir, "/tmp/mxtrain-layers-XXXXXX");
    if (!mkdtemp(ref_dir)) {
        printf("FAIL cannot create a temporary directory\n# tally 0 1\n");
        return 1;
    }
    char cmd[640];
    snprintf(cmd, sizeof cmd, "tests/py/oracle %s tests/py/layers_ref.py %s", ref_dir, ref_dir);
    if (system(cmd) != 0) {
        printf("FAIL the PyTorch oracle (%s) did not run\n# tally 0 1\n", cmd);
        return 1;
    }
    int rc = MXT_RUN(tests, argc, argv);
    snprintf(cmd, sizeof cmd, "rm -rf %s", ref_dir);
    if (system(cmd) != 0) printf("# could not remove %s\n", ref_dir);
    return rc;
}
