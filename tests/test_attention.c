/* Fused attention (ops/attention.c) against its scalar reference (ops/ref/attention_ref.c)
 * over odd sizes: T of 1, below, at and past the 64-row block, odd head dims, grouped-query
 * attention and one kv head, for each nn kernel table this CPU runs; each vector table
 * against the reference table's run of the same fused code; the same bits on 1, 2 and 3
 * threads; the softmax pieces on special values; the exps' accuracy. The reference itself
 * is checked against PyTorch in test_layers. */
#include <omp.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/bits.h"
#include "harness.h"
#include "mxtrain/mx.h"
#include "ops/attention.h"
#include "numerics/mx_internal.h"   // mxi_kernel_emulated
#include "ops/nn_kernels.h"

/* A kernel's name in the report; the SIMDe build runs the AVX-512 source emulated. */
static const char *label(mx_kernel k) {
    return mxi_kernel_emulated(k) ? "avx512 (SIMDe emulation)" : mx_kernel_name(k);
}

static float *randn(size_t n, uint64_t *state) {
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) {
        double u = 0;   // sum of 4 uniforms: roughly normal, mean 0
        for (int j = 0; j < 4; j++) u += (double)(mxt_lcg64(state) >> 11) / 9007199254740992.0 - 0.5;
        x[i] = (float)(u * 1.7);
    }
    return x;
}

static float *nan_filled(size_t n) {
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = NAN;
    return x;
}

typedef struct { int B, T, NH, NKV, HD; } shape;

/* The matmul attention against the reference at one shape and precision. At bf16 the
 * reference rounds each factor of its products as the library does, and the results must
 * also stand apart from the fp32 reference's (so the rounding really happened). */
static void check_shape(mxi_gemm_ctx *g, shape s, bool bf16) {
    int B = s.B, T = s.T, NH = s.NH, NKV = s.NKV, HD = s.HD;
    size_t nq = (size_t)B * T * NH * HD, nk = (size_t)B * T * NKV * HD, na = (size_t)B * NH * T * T;
    uint64_t st = 42 + (uint64_t)T * 131 + HD;
    float *q = randn(nq, &st), *k = randn(nk, &st), *v = randn(nk, &st), *dy = randn(nq, &st);
    // outputs start as NaN: every element must be written, and no read may see them
    size_t ns = (size_t)B * NH * T * 2;
    float *out = nan_filled(nq), *stats = nan_filled(ns), *dq = nan_filled(nq), *dk = nan_filled(nk), *dv = nan_filled(nk);
    float *scratch = nan_filled((size_t)mxi_attention_scratch(B, T, NH, NKV, HD, bf16));
    float *r_out = malloc(nq * 4), *r_att = malloc(na * 4), *r_dq = malloc(nq * 4), *r_dk = malloc(nk * 4),
          *r_dv = malloc(nk * 4);
    mxi_attention_forward_ref(r_out, r_att, q, k, v, NULL, B, T, NH, NKV, HD, bf16);
    mxi_attention_backward_ref(r_dq, r_dk, r_dv, dy, r_out, r_att, q, k, v, NULL, B, T, NH, NKV, HD, bf16);
    mx_diag diag = {{0}};
    CHECK_EQ_INT(mxi_attention_forward(g, out, stats, scratch, q, k, v, NULL, B, T, NH, NKV, HD, bf16, &diag), 0);
    // the backward keeps to what the forward left: the scratch is garbage in between. It
    // takes D = dO . O from the reference's output: at bf16 the forward's own out stands
    // about 1e-3 away (see below), and the gradients would show it
    for (int64_t i = 0; i < mxi_attention_scratch(B, T, NH, NKV, HD, bf16); i++) scratch[i] = NAN;
    CHECK_EQ_INT(mxi_attention_backward(g, dq, dk, dv, scratch, dy, (mxi_att_output){.f32 = r_out}, stats, q, k, v,
                                        NULL, B, T, NH, NKV, HD, bf16, &diag), 0);
    if (bf16) {   // O kept as bf16 (the model's bf16 sites) gives the bits of the fp32 O it rounds
        uint16_t *o16 = malloc(nq * sizeof *o16);
        float *dq2 = nan_filled(nq), *dk2 = nan_filled(nk), *dv2 = nan_filled(nk);
        for (size_t i = 0; i < nq; i++) o16[i] = mxi_f32_to_bf16(r_out[i]);
        CHECK_EQ_INT(mxi_attention_backward(g, dq2, dk2, dv2, scratch, dy, (mxi_att_output){.bf16 = o16}, stats, q, k,
                                            v, NULL, B, T, NH, NKV, HD, bf16, &diag), 0);
        CHECK_MEM_EQ(dq2, dq, nq * sizeof *dq);
        CHECK_MEM_EQ(dk2, dk, nk * sizeof *dk);
        CHECK_MEM_EQ(dv2, dv, nk * sizeof *dv);
        free(o16), free(dq2), free(dk2), free(dv2);
    }
    // At bf16 a probability or dS a few fp32 ulps off the reference's (the vector exp, the
    // summation order) now and then rounds to the neighbouring bf16, 2^-8 away: up to 1e-4
    // in the norm here. One factor left unrounded would be about 1e-3 (2^-9 / sqrt(3)). The
    // forward rounds each key tile's P before the division by the row's sum, the reference
    // after it: two independent roundings of P, about 2^-9 / sqrt(3) * sqrt(2) = 1.6e-3 in out.
    double tol = bf16 ? 2e-4 : 2e-6, tol_out = bf16 ? 3e-3 : tol;
    // a row's 1 / sum is its largest probability (the max score's exp is 1): from the reference's
    float *inv = malloc(ns / 2 * 4), *r_inv = malloc(ns / 2 * 4);
    for (size_t r = 0; r < ns / 2; r++) {
        float best = 0.0f;
        for (int u = 0; u < T; u++) best = fmaxf(best, r_att[r * T + u]);
        inv[r] = stats[2 * r + 1], r_inv[r] = best;
    }
    double e[5] = {mxt_rel_err(out, r_out, nq), mxt_rel_err(inv, r_inv, ns / 2), mxt_rel_err(dq, r_dq, nq),
                   mxt_rel_err(dk, r_dk, nk), mxt_rel_err(dv, r_dv, nk)};
    static const char *const names[5] = {"out", "1 / sum of each row", "dq", "dk", "dv"};
    for (int i = 0; i < 5; i++)
        if (!(e[i] <= (i == 0 ? tol_out : tol)))
            mxt_fail(__FILE__, __LINE__, "%s B=%d T=%d NH=%d NKV=%d HD=%d: %s relative error %.3g > %.3g",
                     bf16 ? "bf16" : "fp32", B, T, NH, NKV, HD, names[i], e[i], i == 0 ? tol_out : tol);
    if (bf16 && T > 1) {   // against fp32 products: bf16 rounding (2^-9 relative) shows
        mxi_attention_forward_ref(r_out, r_att, q, k, v, NULL, B, T, NH, NKV, HD, false);
        mxi_attention_backward_ref(r_dq, r_dk, r_dv, dy, r_out, r_att, q, k, v, NULL, B, T, NH, NKV, HD, false);
        double f = mxt_rel_err(dq, r_dq, nq);
        if (!(f > 1e-4)) mxt_fail(__FILE__, __LINE__, "bf16 T=%d HD=%d: dq within %.3g of fp32: not rounded", T, HD, f);
    }
    // each row's largest scaled score, in log2 units (mxi_att_exp2_scale), against double
    // arithmetic on the fp32 operands
    if (!bf16) {
        int64_t bad = 0;
        for (int b = 0; b < B; b++)
            for (int h = 0; h < NH; h++)
                for (int t = 0; t < T; t++) {
                    double best = -INFINITY;
                    for (int u = 0; u <= t; u++) {
                        double dot = 0;
                        for (int d = 0; d < HD; d++)
                            dot += (double)q[(((int64_t)b * T + t) * NH + h) * HD + d] *
                                   k[(((int64_t)b * T + u) * NKV + h / (NH / NKV)) * HD + d];
                        best = fmax(best, dot / sqrt((double)HD) * 1.4426950408889634);
                    }
                    double got = stats[(((int64_t)b * NH + h) * T + t) * 2];
                    bad += !(fabs(got - best) <= 1e-5 * (1 + fabs(best)));
                }
        CHECK_EQ_INT(bad, 0);
    }
    free(inv), free(r_inv);
    free(q), free(k), free(v), free(dy), free(out), free(stats), free(dq), free(dk), free(dv), free(scratch);
    free(r_out), free(r_att), free(r_dq), free(r_dk), free(r_dv);
}

static const shape odd_shapes[] = {
    {1, 1, 1, 1, 1},  {2, 37, 5, 1, 7},  {1, 63, 3, 3, 16}, {1, 64, 4, 2, 16},
    {2, 65, 6, 3, 12}, {1, 130, 2, 2, 33}, {1, 200, 8, 2, 64}, {3, 129, 4, 1, 8},
};
enum { N_ODD = sizeof odd_shapes / sizeof odd_shapes[0] };

static void test_odd_sizes(void) {
    mxi_gemm_ctx *g = NULL;
    mx_diag diag = {{0}};
    CHECK_EQ_INT(mxi_gemm_ctx_create(&g, &diag), 0);
    // every nn kernel table the library has (mx_kernel_name() is NULL past the last)
    for (mx_kernel id = MX_KERNEL_REF; g && mx_kernel_name(id); id = (mx_kernel)(id + 1)) {
        if (!mx_kernel_available(id)) {
            printf("  nn kernel %s: not run (%s)\n", mx_kernel_name(id), mx_kernel_missing(id));
            continue;
        }
        mx_kernel_select(id);
        CHECK(mxi_nn_kernels_active() == mxi_nn_kernels_of(id));
        for (int bf16 = 0; bf16 < 2; bf16++) {
            int before = mxt_current_failures();
            for (size_t j = 0; j < N_ODD; j++) check_shape(g, odd_shapes[j], bf16);
            printf("  nn kernel %s, %s: %s%d shapes\n", label(id), bf16 ? "bf16" : "fp32",
                   mxt_current_failures() > before ? "FAILED: " : "", (int)N_ODD);
        }
    }
    mx_kernel_select(MX_KERNEL_AUTO);
    mxi_gemm_ctx_destroy(g);
}

/* One forward and backward of the active table: out, stats, dq, dk, dv in one buffer. */
typedef struct { float *all, *out, *stats, *dq, *dk, *dv; size_t n; } att_run;

static att_run run_attention(mxi_gemm_ctx *g, shape s, bool bf16, const int32_t *doc) {
    int B = s.B, T = s.T, NH = s.NH, NKV = s.NKV, HD = s.HD;
    size_t nq = (size_t)B * T * NH * HD, nk = (size_t)B * T * NKV * HD, ns = (size_t)B * NH * T * 2;
    uint64_t st = 5 + (uint64_t)T * 17 + HD;
    float *q = randn(nq, &st), *k = randn(nk, &st), *v = randn(nk, &st), *dy = randn(nq, &st);
    att_run r = {.n = 2 * nq + ns + 2 * nk};
    r.all = nan_filled(r.n);
    r.out = r.all, r.stats = r.out + nq, r.dq = r.stats + ns, r.dk = r.dq + nq, r.dv = r.dk + nk;
    float *scratch = nan_filled((size_t)mxi_attention_scratch(B, T, NH, NKV, HD, bf16));
    mx_diag diag = {{0}};
    CHECK_EQ_INT(mxi_attention_forward(g, r.out, r.stats, scratch, q, k, v, doc, B, T, NH, NKV, HD, bf16, &diag), 0);
    CHECK_EQ_INT(mxi_attention_backward(g, r.dq, r.dk, r.dv, scratch, dy, (mxi_att_output){.f32 = r.out}, r.stats, q, k,
                                        v, doc, B, T, NH, NKV, HD, bf16, &diag), 0);
    free(q), free(k), free(v), free(dy), free(scratch);
    return r;
}

/* Documents of 1, 40, 70 and the rest of the row (when T is that long), for every sequence. */
static int32_t *documents(int B, int T) {
    int32_t *doc = malloc((size_t)B * T * sizeof *doc);
    for (int b = 0; b < B; b++)
        for (int t = 0, start = 0; t < T; t++) {
            if (t == 1 || t == 41 || t == 111) start = t;
            doc[(size_t)b * T + t] = start;
        }
    return doc;
}

/* Each vector table against the reference table running the same fused code: the same
 * formulas, fp32 sums in another order (fused multiply-adds) and a polynomial exp. At bf16 a
 * P or dS a few ulps off now and then rounds to the neighbouring bf16 (see check_shape). */
static void test_tables(void) {
    mxi_gemm_ctx *g = NULL;
    mx_diag diag = {{0}};
    CHECK_EQ_INT(mxi_gemm_ctx_create(&g, &diag), 0);
    for (size_t j = 0; g && j < N_ODD; j++)
        for (int bf16 = 0; bf16 < 2; bf16++)
            for (int docs = 0; docs < 2; docs++) {
                shape s = odd_shapes[j];
                int32_t *doc = docs ? documents(s.B, s.T) : NULL;
                mx_kernel_select(MX_KERNEL_REF);
                att_run want = run_attention(g, s, bf16, doc);
                for (mx_kernel id = MX_KERNEL_AVX2; mx_kernel_name(id); id = (mx_kernel)(id + 1)) {
                    if (!mx_kernel_available(id)) continue;
                    mx_kernel_select(id);
                    att_run got = run_attention(g, s, bf16, doc);
                    double e = mxt_rel_err(got.all, want.all, got.n), tol = bf16 ? 2e-4 : 1e-6;
                    if (!(e <= tol))
                        mxt_fail(__FILE__, __LINE__, "%s %s%s B=%d T=%d NH=%d NKV=%d HD=%d: relative error %.3g > %.3g",
                                 label(id), bf16 ? "bf16" : "fp32", docs ? " documents" : "", s.B, s.T, s.NH, s.NKV,
                                 s.HD, e, tol);
                    free(got.all);
                }
                free(want.all), free(doc);
            }
    for (mx_kernel id = MX_KERNEL_AVX2; mx_kernel_name(id); id = (mx_kernel)(id + 1))
        if (mx_kernel_available(id))
            printf("  nn kernel %s: near the reference table, fp32 and bf16, with and without documents\n", label(id));
    mx_kernel_select(MX_KERNEL_AUTO);
    mxi_gemm_ctx_destroy(g);
}

/* The same bits whatever the number of threads: every sum of the fused kernels is one
 * task's, in its own order. */
static void test_threads(void) {
    static const shape shapes[] = {{2, 200, 6, 2, 24}, {1, 129, 4, 4, 64}};
    mxi_gemm_ctx *g = NULL;
    mx_diag diag = {{0}};
    CHECK_EQ_INT(mxi_gemm_ctx_create(&g, &diag), 0);
    int keep = omp_get_max_threads();
    for (size_t j = 0; g && j < sizeof shapes / sizeof shapes[0]; j++)
        for (int bf16 = 0; bf16 < 2; bf16++)
            for (int docs = 0; docs < 2; docs++) {
                int32_t *doc = docs ? documents(shapes[j].B, shapes[j].T) : NULL;
                omp_set_num_threads(1);
                att_run one = run_attention(g, shapes[j], bf16, doc);
                for (int nt = 2; nt <= 3; nt++) {
                    omp_set_num_threads(nt);
                    att_run more = run_attention(g, shapes[j], bf16, doc);
                    CHECK_MEM_EQ(more.all, one.all, one.n * sizeof(float));
                    free(more.all);
                }
                free(one.all), free(doc);
            }
    omp_set_num_threads(keep);
    printf("  1, 2 and 3 threads: the same bits (fp32, bf16, with and without documents)\n");
    mxi_gemm_ctx_destroy(g);
}

/* The softmax pieces of kernel table kt on a tile of 21 rows, each seeing [c0, c1) of NC
 * columns: against the reference within tolerance, and their bf16 outputs against the
 * table's own fp32 results bit for bit. NC 61: rows cut at odd places; NC 64: most rows see
 * the whole tile, as below attention's diagonal (the kernels' unmasked paths), the rest not.
 * af and bf are test_kernel_slots' LD x LD inputs (LD here is its LD). */
static void check_softmax_pieces(const mxi_nn_kernels *ref, const mxi_nn_kernels *kt, const float *af, const float *bf,
                                 int NC) {
    enum { R = 21, LD = 80 };
    int32_t lo[R], hi[R];
    for (int r = 0; r < R; r++)
        if (NC == 64) lo[r] = r == 5 || r == 12 ? 3 : 0, hi[r] = r == 8 || r == 12 ? 40 : r == 16 ? 0 : NC;
        else lo[r] = r % 5 == 4 ? 30 : r / 3, hi[r] = r % 5 == 4 ? 30 : NC - r % 7 * 3;
    float s1[R * LD], s2[R * LD], d1[R * LD], d2[R * LD], mx1[R], mx2[R], sum1[R], sum2[R], cr1[R], cr2[R], stats[2 * R];
    for (int r = 0; r < R; r++) mx1[r] = mx2[r] = r % 2 ? -INFINITY : 0.5f, sum1[r] = sum2[r] = r % 2 ? 0.0f : 3.0f;
    memcpy(s1, bf, sizeof s1), memcpy(s2, bf, sizeof s2);
    float mx3[R], sum3[R], cr3[R];
    memcpy(mx3, mx2, sizeof mx3), memcpy(sum3, sum2, sizeof sum3);
    ref->att_online_softmax(s1, LD, R, NC, lo, hi, 0.37f, mx1, sum1, cr1, NULL);
    kt->att_online_softmax(s2, LD, R, NC, lo, hi, 0.37f, mx2, sum2, cr2, NULL);
    CHECK(mxt_rel_err(s2, s1, sizeof s1 / 4) <= 3e-6);
    CHECK_MEM_EQ(mx2, mx1, sizeof mx1);
    CHECK(mxt_rel_err(sum2, sum1, R) <= 3e-6);
    CHECK(mxt_rel_err(cr2, cr1, R) <= 3e-6);
    // the exps as bf16 into p16: the same statistics, and each row its own exps rounded as
    // bf16_round rounds them, the odd column count padded with a 0; the rest untouched
    {
        uint16_t p16[R * LD], want16[R * LD];
        float s3[R * LD];
        memset(p16, 0xA5, sizeof p16), memset(want16, 0xA5, sizeof want16), memcpy(s3, bf, sizeof s3);
        kt->att_online_softmax(s3, LD, R, NC, lo, hi, 0.37f, mx3, sum3, cr3, p16);
        CHECK_MEM_EQ(mx3, mx2, sizeof mx3);
        CHECK_MEM_EQ(sum3, sum2, sizeof sum3);
        CHECK_MEM_EQ(cr3, cr2, sizeof cr3);
        for (int r = 0; r < R; r++) {
            ref->bf16_round(want16 + r * LD, s2 + r * LD, NC);
            if (NC & 1) want16[r * LD + NC] = 0;
        }
        CHECK_MEM_EQ(p16, want16, sizeof p16);
    }
    for (int r = 0; r < R; r++) stats[2 * r] = mx1[r], stats[2 * r + 1] = lo[r] < hi[r] ? 1.0f / sum1[r] : 1.0f;
    for (int mode = MXI_ATT_PROBS; mode <= MXI_ATT_DSCORES; mode++) {
        float ds[R];
        for (int r = 0; r < R; r++) ds[r] = 0.1f * (float)r;
        memcpy(s1, bf, sizeof s1), memcpy(s2, bf, sizeof s2), memcpy(d1, af, sizeof d1), memcpy(d2, af, sizeof d2);
        ref->att_probs(s1, d1, LD, R, NC, lo, hi, 0.37f, stats, ds, (mxi_att_probs_mode)mode);
        kt->att_probs(s2, d2, LD, R, NC, lo, hi, 0.37f, stats, ds, (mxi_att_probs_mode)mode);
        CHECK(mxt_rel_err(s2, s1, sizeof s1 / 4) <= 3e-6);
        CHECK(mxt_rel_err(d2, d1, sizeof d1 / 4) <= 1e-5);
        if (mode == MXI_ATT_PROBS) CHECK_MEM_EQ(d2, af, sizeof d2);   // dP untouched
    }
    // backward's tile at bf16 in one pass: the bits of the table's own att_probs and
    // conversions (R odd: the last row paired with 0; NC odd: each dS row padded)
    {
        enum { RP = (R + 1) / 2 };
        float s3[(R + 1) * LD], d3[(R + 1) * LD], ds[R];
        uint32_t p2[RP * LD], ds2[RP * LD], w_p2[RP * LD], w_ds2[RP * LD];
        uint16_t ds16[R * LD], w_ds16[R * LD];
        for (int r = 0; r < R; r++) ds[r] = 0.1f * (float)r;
        memset(p2, 0xA5, sizeof p2), memset(ds2, 0xA5, sizeof ds2), memset(ds16, 0xA5, sizeof ds16);
        memset(w_p2, 0xA5, sizeof w_p2), memset(w_ds2, 0xA5, sizeof w_ds2), memset(w_ds16, 0xA5, sizeof w_ds16);
        memcpy(s3, bf, sizeof s3), memcpy(d3, af, sizeof d3);
        kt->att_dscores_bf16(p2, ds2, ds16, s3, d3, LD, R, NC, lo, hi, 0.37f, stats, ds);
        memcpy(s3, bf, sizeof s3), memcpy(d3, af, sizeof d3);
        kt->att_probs(s3, d3, LD, R, NC, lo, hi, 0.37f, stats, ds, MXI_ATT_DSCORES);
        for (int j = 0; j < NC; j++) s3[R * LD + j] = d3[R * LD + j] = 0.0f;
        for (int i = 0; i < RP; i++) {
            kt->bf16_pair_rows(w_p2 + i * LD, s3 + 2 * i * LD, s3 + (2 * i + 1) * LD, NC);
            kt->bf16_pair_rows(w_ds2 + i * LD, d3 + 2 * i * LD, d3 + (2 * i + 1) * LD, NC);
        }
        for (int r = 0; r < R; r++) {
            kt->bf16_round(w_ds16 + r * LD, d3 + r * LD, NC);
            if (NC & 1) w_ds16[r * LD + NC] = 0;
        }
        CHECK_MEM_EQ(p2, w_p2, sizeof p2);
        CHECK_MEM_EQ(ds2, w_ds2, sizeof ds2);
        CHECK_MEM_EQ(ds16, w_ds16, sizeof ds16);
    }
}

/* The fused attention's kernel slots alone, each vector table against the reference table:
 * att_gemm_bf16 and bf16_pair_rows bit for bit (the products of bf16 values are exact, so
 * one order of additions gives one result; the inputs hold no denormals), att_gemm within
 * fp32 rounding (fused multiply-adds), over odd m, n, k, a row-major and a transposed a, and
 * both writes; the softmax pieces within 3e-6 relative (1e-5 where a gradient enters). */
static void test_kernel_slots(void) {
    enum { M = 67, N = 70, K = 45, LD = 80 };
    uint64_t st = 123;
    float *af = randn((size_t)LD * LD, &st), *bf = randn((size_t)LD * LD, &st), *c0 = randn((size_t)LD * LD, &st);
    uint32_t *a2 = malloc((size_t)LD * LD * 4), *b2 = malloc((size_t)LD * LD * 4);
    for (int i = 0; i < LD * LD; i++) {   // pairs of bf16 values, as the attention lays them out
        a2[i] = (uint32_t)mxi_f32_to_bf16(af[i]) | (uint32_t)mxi_f32_to_bf16(af[(i * 7) % (LD * LD)]) << 16;
        b2[i] = (uint32_t)mxi_f32_to_bf16(bf[i]) | (uint32_t)mxi_f32_to_bf16(bf[(i * 5) % (LD * LD)]) << 16;
    }
    const mxi_nn_kernels *ref = mxi_nn_kernels_of(MX_KERNEL_REF);
    static const int shapes[][3] = {{M, N, K}, {1, 1, 1}, {4, 16, 3}, {5, 17, 64}, {64, 64, 32}, {3, 9, 2}};
    for (mx_kernel id = MX_KERNEL_AVX2; mx_kernel_name(id); id = (mx_kernel)(id + 1)) {
        if (!mx_kernel_available(id)) continue;
        const mxi_nn_kernels *kt = mxi_nn_kernels_of(id);
        int before = mxt_current_failures();
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
            for (int tr = 0; tr < 2; tr++)
                for (int w = 0; w < 2; w++) {
                    int m = shapes[si][0], n = shapes[si][1], k = shapes[si][2];
                    int64_t lda = tr ? 1 : LD, acs = tr ? LD : 1;
                    mxi_att_write wr = w ? MXI_ATT_ADD : MXI_ATT_SET;
                    float *want = malloc((size_t)LD * LD * 4), *got = malloc((size_t)LD * LD * 4);
                    memcpy(want, c0, (size_t)LD * LD * 4), memcpy(got, c0, (size_t)LD * LD * 4);
                    ref->att_gemm_bf16(want, LD, a2, lda, acs, b2, LD, m, n, k, wr);
                    kt->att_gemm_bf16(got, LD, a2, lda, acs, b2, LD, m, n, k, wr);
                    if (memcmp(want, got, (size_t)LD * LD * 4))
                        mxt_fail(__FILE__, __LINE__, "%s att_gemm_bf16 m=%d n=%d k=%d %s %s: not the reference's bits",
                                 label(id), m, n, k, tr ? "a transposed" : "a row-major", w ? "add" : "set");
                    memcpy(want, c0, (size_t)LD * LD * 4), memcpy(got, c0, (size_t)LD * LD * 4);
                    ref->att_gemm(want, LD, af, lda, acs, bf, LD, m, n, k, wr);
                    kt->att_gemm(got, LD, af, lda, acs, bf, LD, m, n, k, wr);
                    double e = mxt_rel_err(got, want, (size_t)LD * LD);
                    if (!(e <= 1e-6))
                        mxt_fail(__FILE__, __LINE__, "%s att_gemm m=%d n=%d k=%d: relative error %.3g", label(id), m,
                                 n, k, e);
                    for (int i = 0; i < LD; i++)   // outside the m x n corner: untouched
                        for (int j = 0; j < LD; j++)
                            if ((i >= m || j >= n) && got[i * LD + j] != c0[i * LD + j]) {
                                mxt_fail(__FILE__, __LINE__, "%s att_gemm wrote (%d, %d) outside %d x %d", label(id),
                                         i, j, m, n);
                                i = LD;
                                break;
                            }
                    free(want), free(got);
                }
        // two rows rounded and paired: bit for bit, every tail length
        for (int n = 1; n <= 37; n += 3) {
            uint32_t want[40], got[40];
            ref->bf16_pair_rows(want, af, af + LD, n);
            kt->bf16_pair_rows(got, af, af + LD, n);
            CHECK_MEM_EQ(got, want, (size_t)n * 4);
        }
        check_softmax_pieces(ref, kt, af, bf, 61);
        check_softmax_pieces(ref, kt, af, bf, 64);
        printf("  nn kernel %s: %sattention tile products (bf16 pairs bit for bit), pairing, softmax pieces\n",
               label(id), mxt_current_failures() > before ? "FAILED: " : "");
    }
    free(af), free(bf), free(c0), free(a2), free(b2);
}

/* got against the reference's want by the special-value rule of ops/nn_kernels.h: NaN
 * exactly where want is NaN, the same infinity where want has one, elsewhere within tol
 * relative (or 1e-37 absolute: the vector exps flush what the reference makes denormal). */
static void check_specials(const char *what, mx_kernel id, int row_len, const float *got, const float *want, int n,
                           double tol) {
    for (int i = 0; i < n; i++) {
        double g = got[i], w = want[i];
        bool ok = isnan(w) ? isnan(g) : isinf(w) ? g == w : !isnan(g) && fabs(g - w) <= tol * fabs(w) + 1e-37;
        if (!ok) {
            mxt_fail(__FILE__, __LINE__, "%s %s row %d column %d: %.9g, the reference %.9g", label(id), what,
                     i / row_len, i % row_len, g, w);
            return;
        }
    }
}

/* The softmax pieces on scores holding NaN, +-Inf, rows of -Inf only, huge and tiny values,
 * each vector table against the reference by the special-value rule; a row's max bit for bit. */
static void test_softmax_specials(void) {
    enum { R = 12, NC = 37, LD = 40 };
    const float inf = INFINITY, big = 3.0e38f, tiny = 1.0e-40f;
    float s0[R * LD], d0[R * LD];
    uint64_t st = 7;
    float *x = randn((size_t)R * LD, &st), *y = randn((size_t)R * LD, &st);
    memcpy(s0, x, sizeof s0), memcpy(d0, y, sizeof d0);
    free(x), free(y);
    int32_t lo[R], hi[R];
    for (int r = 0; r < R; r++) lo[r] = r % 4 == 3 ? 5 : 0, hi[r] = r % 3 == 2 ? 29 : NC;
    s0[0 * LD + 7] = NAN;                                                      // NaN beside finite scores
    s0[1 * LD + 3] = inf;                                                      // +Inf
    s0[2 * LD + 4] = -inf, s0[2 * LD + 20] = -inf;                             // -Inf beside finite
    for (int j = 0; j < NC; j++) s0[3 * LD + j] = -inf;                        // visible part all -Inf
    for (int j = 0; j < NC; j++) s0[4 * LD + j] = j % 2 ? big : -big;          // huge
    for (int j = 0; j < NC; j++) s0[5 * LD + j] = j % 3 ? tiny * (float)j : -0.0f;   // tiny, denormal
    s0[6 * LD + 1] = inf, s0[6 * LD + 2] = -inf;                               // both infinities
    s0[7 * LD + 9] = NAN, s0[7 * LD + 10] = inf;                               // NaN and +Inf
    for (int j = 0; j < NC; j++) s0[8 * LD + j] = j == 11 ? 0.0f : -1.0e30f;   // exps underflow but one
    for (int j = 0; j < NC; j++) s0[9 * LD + j] = -inf;                        // all -Inf, a finite max before
    s0[10 * LD + 30] = NAN;                                                    // NaN outside the visible columns
    d0[11 * LD + 6] = NAN, d0[0 * LD + 8] = inf;                               // dP with a NaN, an Inf
    const mxi_nn_kernels *ref = mxi_nn_kernels_of(MX_KERNEL_REF);
    for (mx_kernel id = MX_KERNEL_AVX2; mx_kernel_name(id); id = (mx_kernel)(id + 1)) {
        if (!mx_kernel_available(id)) continue;
        const mxi_nn_kernels *kt = mxi_nn_kernels_of(id);
        int before = mxt_current_failures();
        float s1[R * LD], s2[R * LD], mx1[R], mx2[R], sum1[R], sum2[R], cr1[R], cr2[R], stats[2 * R];
        for (int r = 0; r < R; r++) {
            mx1[r] = mx2[r] = r % 2 ? -inf : 0.5f, sum1[r] = sum2[r] = r % 2 ? 0.0f : 3.0f;
            if (r == 9) mx1[r] = mx2[r] = 1.5f, sum1[r] = sum2[r] = 2.0f;
        }
        memcpy(s1, s0, sizeof s1), memcpy(s2, s0, sizeof s2);
        ref->att_online_softmax(s1, LD, R, NC, lo, hi, 0.37f, mx1, sum1, cr1, NULL);
        kt->att_online_softmax(s2, LD, R, NC, lo, hi, 0.37f, mx2, sum2, cr2, NULL);
        for (int r = 0; r < R; r++) check_specials("att_online_softmax exps", id, NC, s2 + r * LD,
                                                   s1 + r * LD, NC, 3e-6);
        CHECK_MEM_EQ(mx2, mx1, sizeof mx1);
        check_specials("att_online_softmax rsum", id, R, sum2, sum1, R, 3e-6);
        check_specials("att_online_softmax corr", id, R, cr2, cr1, R, 3e-6);
        for (int r = 0; r < R; r++) stats[2 * r] = mx1[r], stats[2 * r + 1] = 1.0f / sum1[r];
        for (int mode = MXI_ATT_PROBS; mode <= MXI_ATT_DSCORES; mode++) {
            float d1[R * LD], d2[R * LD], ds[R];
            for (int r = 0; r < R; r++) ds[r] = 0.1f * (float)r;
            ds[4] = NAN, ds[5] = inf;
            memcpy(s1, s0, sizeof s1), memcpy(s2, s0, sizeof s2), memcpy(d1, d0, sizeof d1), memcpy(d2, d0, sizeof d2);
            ref->att_probs(s1, d1, LD, R, NC, lo, hi, 0.37f, stats, ds, (mxi_att_probs_mode)mode);
            kt->att_probs(s2, d2, LD, R, NC, lo, hi, 0.37f, stats, ds, (mxi_att_probs_mode)mode);
            for (int r = 0; r < R; r++) {
                check_specials("att_probs P", id, NC, s2 + r * LD, s1 + r * LD, NC, 3e-6);
                check_specials("att_probs dS", id, NC, d2 + r * LD, d1 + r * LD, NC, 1e-5);
            }
        }
        printf("  nn kernel %s: %ssoftmax pieces on NaN, +-Inf, -Inf rows, huge and tiny scores\n", label(id),
               mxt_current_failures() > before ? "FAILED: " : "");
    }
}

/* Attention's exps are 2^u (ops/nn_kernels.h, mxi_att_exp2_scale): att_probs with a max
 * of 0, 1 / sum 1 and a scale whose c rounds to exactly 1 gives 2^s itself. Every table
 * within 2e-7 of 2^s in double at each s from -125 to 0.0625 (the vector tables' polynomial
 * is good to 1.7e-7; a coefficient off in its 7th digit fails), and 0 for -Inf. */
static void test_exp2_accuracy(void) {
    enum { N = 64, ROWS = 2048 };
    const float scale = 0.6931472f;   // ln 2 rounded: scale log2 e rounds to 1
    CHECK(mxi_att_exp2_scale(scale) == 1.0f);
    float *s = malloc((size_t)ROWS * N * sizeof *s), *p = malloc((size_t)ROWS * N * sizeof *p);
    float *stats = malloc(2 * ROWS * sizeof *stats);
    int32_t *lo = malloc(ROWS * sizeof *lo), *hi = malloc(ROWS * sizeof *hi);
    int64_t total = (int64_t)ROWS * N;
    for (int r = 0; r < ROWS; r++) lo[r] = 0, hi[r] = N, stats[2 * r] = 0.0f, stats[2 * r + 1] = 1.0f;
    for (mx_kernel id = MX_KERNEL_REF; mx_kernel_name(id); id = (mx_kernel)(id + 1)) {
        if (!mx_kernel_available(id)) continue;
        const mxi_nn_kernels *kt = mxi_nn_kernels_of(id);
        for (int64_t i = 0; i < total; i++) p[i] = s[i] = -125.0f + 125.0625f * (float)i / (float)(total - 1);
        p[total - 1] = -INFINITY;
        kt->att_probs(p, NULL, N, ROWS, N, lo, hi, scale, stats, NULL, MXI_ATT_PROBS);
        double worst = 0.0;
        for (int64_t i = 0; i + 1 < total; i++) {
            double want = exp2((double)s[i]), err = fabs((double)p[i] - want) / want;
            worst = err > worst ? err : worst;
        }
        CHECK(worst <= 2e-7);
        CHECK(p[total - 1] == 0.0f);
        printf("  nn kernel %s: 2^s within %.3g of double over [-125, 0.0625]\n", label(id), worst);
    }
    free(s), free(p), free(stats), free(lo), free(hi);
}

int main(int argc, char **argv) {
    static const mxt_test tests[] = {
        {"attention_odd_sizes", test_odd_sizes},
        {"attention_tables", test_tables},
        {"attention_threads", test_threads},
        {"attention_kernel_slots", test_kernel_slots},
        {"attention_softmax_specials", test_softmax_specials},
        {"attention_exp2_accuracy", test_exp2_accuracy},
    };
    return MXT_RUN(tests, argc, argv);
}
