/* The MX GEMM against an exact oracle written here.
 *
 * Planes come from the library's quantizer (tested on its own in test_mx); the oracle
 * decodes them itself from the FP8 bit fields (sign, exponent, mantissa; the OCP
 * definitions of E4M3 and E5M2) and the E8M0 scales, and sums the products in long double:
 * each product of two dequantized values is exact in long double, and the sums' error is
 * far below the fp32 tolerance, (K + 2) u * sum |products| with u = 2^-24, that the GEMM's
 * fp32 accumulation must meet. The dequantization kernels (every kernel of the library the
 * CPU runs, each reported by name) are checked against the same decoder, and each SIMD
 * kernel against the scalar reference bit for bit. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "harness.h"
#include "mxtrain/mx.h"
#include "ops/mx_gemm.h"
#include "ops/ops_kernels.h"
#include "numerics/mx_internal.h"   // mxi_kernel_emulated

/* ---- random numbers ---- */

static uint64_t rng_state = 0x13198A2E03707344ull;
static uint64_t rng_next(void) { return mxt_splitmix64(&rng_state); }
static double rng_unit(void) { return mxt_uniform(&rng_state); }

/* ---- the oracle's decoder ---- */

/* Value of an FP8 code from its bit fields; NaN for NaN codes, +/-inf for E5M2 infinities. */
static long double fp8_value(uint8_t code, mx_elem elem) {
    int ebits = elem == MX_E4M3 ? 4 : 5, mbits = elem == MX_E4M3 ? 3 : 2, bias = elem == MX_E4M3 ? 7 : 15;
    int sign = code >> 7, e = (code >> mbits) & ((1 << ebits) - 1), m = code & ((1 << mbits) - 1);
    long double v;
    if (elem == MX_E4M3 && e == 15 && m == 7) return NAN;      // S.1111.111
    if (elem == MX_E5M2 && e == 31) {
        if (m) return NAN;
        v = INFINITY;
    } else if (e == 0) {
        v = ldexpl((long double)m, 1 - bias - mbits);           // subnormal: 0.m * 2^(1-bias)
    } else {
        v = ldexpl((long double)((1 << mbits) + m), e - bias - mbits);   // 1.m * 2^(e-bias)
    }
    return sign ? -v : v;
}

/* Dequantized element (r, c) of a plane: value(q) * 2^(s-127); NaN scale 0xFF. */
static long double plane_value(const mxi_mx_plane *p, int64_t r, int64_t c) {
    int64_t cb = (p->cols + 31) / 32;
    uint8_t s = p->axis == MX_ROWWISE ? p->scales[r * cb + c / 32] : p->scales[(r / 32) * p->cols + c];
    if (s == 0xFF) return NAN;
    return ldexpl(fp8_value(p->q[r * p->cols + c], p->elem), s - 127);
}

/* ---- planes ---- */

typedef struct {
    mxi_mx_plane p;
    uint8_t *q, *s;
} plane_buf;

/* Heavy-tailed data with rows and columns scaled over a few binades, so blocks get
 * different scales and elements span their format's range. */
static float *random_matrix(int64_t rows, int64_t cols) {
    float *x = malloc(((size_t)(rows * cols) + 1) * sizeof *x);
    int row_e[4096], col_e[4096];
    for (int64_t r = 0; r < rows && r < 4096; r++) row_e[r] = (int)(rng_next() % 9) - 4;
    for (int64_t c = 0; c < cols && c < 4096; c++) col_e[c] = (int)(rng_next() % 5) - 2;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            double u = rng_unit();
            x[r * cols + c] = (float)ldexp(u * u * u * 4.0, row_e[r % 4096] + col_e[c % 4096]);
        }
    return x;
}

static plane_buf quantize(const float *x, int64_t rows, int64_t cols, mx_axis axis, mx_elem elem) {
    plane_buf b;
    int64_t ns = mx_scale_count(rows, cols, axis);
    b.q = malloc((size_t)(rows * cols) + 1);
    b.s = malloc((size_t)ns + 1);
    CHECK_EQ_INT(mx_quantize_f32(x, rows, cols, axis, elem, MX_SCALE_FLOOR, b.q, b.s), 0);
    b.p = (mxi_mx_plane){b.q, b.s, rows, cols, axis, elem};
    return b;
}

static void plane_free(plane_buf *b) {
    free(b->q);
    free(b->s);
}

/* C (M, N) with leading dim ldc against the oracle of op(A) op(B) (+ C0). NaN entries of
 * the oracle must be NaN in C. */
static void check_product(const float *C, int64_t ldc, const float *C0, const mxi_mx_plane *A, bool ta,
                          const mxi_mx_plane *B, bool tb, const char *what) {
    int64_t M = ta ? A->cols : A->rows, K = ta ? A->rows : A->cols, N = tb ? B->rows : B->cols;
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            long double exact = C0 ? C0[i * ldc + j] : 0.0L, mag = fabsl(exact);
            for (int64_t k = 0; k < K; k++) {
                long double a = ta ? plane_value(A, k, i) : plane_value(A, i, k);
                long double b = tb ? plane_value(B, j, k) : plane_value(B, k, j);
                exact += a * b;
                mag += fabsl(a * b);
            }
            float got = C[i * ldc + j];
            bool ok = isnan(exact) ? isnan(got) : fabsl((long double)got - exact) <= (long double)(K + 2) * ldexpl(1.0L, -24) * mag;
            if (!ok) {
                mxt_fail(__FILE__, __LINE__, "%s: C[%lld,%lld] = %.9g, exact %.17Lg (sum |products| %.3Lg, K=%lld)",
                         what, (long long)i, (long long)j, got, exact, mag, (long long)K);
                return;
            }
        }
}

static mxi_gemm_ctx *new_ctx(void) {
    mxi_gemm_ctx *ctx = NULL;
    CHECK_EQ_INT(mxi_gemm_ctx_create(&ctx, NULL), 0);
    return ctx;
}

/* The three GEMMs of Y = X W^T for X (M, K), W (N, K), dY (M, N), each plane quantized
 * independently along its contraction dim. */
static void linear_case(mxi_gemm_ctx *ctx, int64_t M, int64_t N, int64_t K, mx_elem act, mx_elem wt, mx_elem grad) {
    char what[128];
    float *x = random_matrix(M, K), *w = random_matrix(N, K), *dy = random_matrix(M, N);
    plane_buf X_row = quantize(x, M, K, MX_ROWWISE, act), X_col = quantize(x, M, K, MX_COLWISE, act);
    plane_buf W_row = quantize(w, N, K, MX_ROWWISE, wt), W_col = quantize(w, N, K, MX_COLWISE, wt);
    plane_buf dY_row = quantize(dy, M, N, MX_ROWWISE, grad), dY_col = quantize(dy, M, N, MX_COLWISE, grad);
    float *y = malloc((size_t)(M * N + 1) * sizeof *y);
    float *dx = malloc((size_t)(M * K + 1) * sizeof *dx), *dx0 = malloc((size_t)(M * K + 1) * sizeof *dx0);
    float *dw = malloc((size_t)(N * K + 1) * sizeof *dw), *dw0 = malloc((size_t)(N * K + 1) * sizeof *dw0);
    for (int64_t i = 0; i < M * K; i++) dx0[i] = dx[i] = (float)rng_unit();
    for (int64_t i = 0; i < N * K; i++) dw0[i] = dw[i] = (float)rng_unit();
    mx_diag diag = {{0}};

    snprintf(what, sizeof what, "forward M=%lld N=%lld K=%lld", (long long)M, (long long)N, (long long)K);
    CHECK_EQ_INT(mxi_mx_linear_forward(ctx, y, &X_row.p, &W_row.p, &diag), 0);
    check_product(y, N, NULL, &X_row.p, false, &W_row.p, true, what);

    snprintf(what, sizeof what, "dinput M=%lld N=%lld K=%lld", (long long)M, (long long)N, (long long)K);
    CHECK_EQ_INT(mxi_mx_linear_dinput(ctx, dx, &dY_row.p, &W_col.p, false, &diag), 0);
    check_product(dx, K, NULL, &dY_row.p, false, &W_col.p, false, what);
    memcpy(dx, dx0, (size_t)(M * K) * sizeof *dx);
    CHECK_EQ_INT(mxi_mx_linear_dinput(ctx, dx, &dY_row.p, &W_col.p, true, &diag), 0);
    check_product(dx, K, dx0, &dY_row.p, false, &W_col.p, false, what);

    snprintf(what, sizeof what, "dweight M=%lld N=%lld K=%lld", (long long)M, (long long)N, (long long)K);
    CHECK_EQ_INT(mxi_mx_linear_dweight(ctx, dw, &dY_col.p, &X_col.p, false, &diag), 0);
    check_product(dw, K, NULL, &dY_col.p, true, &X_col.p, false, what);
    memcpy(dw, dw0, (size_t)(N * K) * sizeof *dw);
    CHECK_EQ_INT(mxi_mx_linear_dweight(ctx, dw, &dY_col.p, &X_col.p, true, &diag), 0);
    check_product(dw, K, dw0, &dY_col.p, true, &X_col.p, false, what);

    plane_buf *all[] = {&X_row, &X_col, &W_row, &W_col, &dY_row, &dY_col};
    for (int i = 0; i < 6; i++) plane_free(all[i]);
    free(x); free(w); free(dy); free(y); free(dx); free(dx0); free(dw); free(dw0);
}

static void test_linear_gemms(void) {
    mxi_gemm_ctx *ctx = new_ctx();
    if (!ctx) return;
    // partial blocks on every axis (K, N, M not multiples of 32) and whole ones
    linear_case(ctx, 1, 1, 1, MX_E4M3, MX_E4M3, MX_E5M2);
    linear_case(ctx, 37, 19, 45, MX_E4M3, MX_E4M3, MX_E5M2);
    linear_case(ctx, 64, 96, 128, MX_E4M3, MX_E4M3, MX_E4M3);
    linear_case(ctx, 70, 33, 100, MX_E5M2, MX_E4M3, MX_E5M2);
    linear_case(ctx, 200, 65, 300, MX_E4M3, MX_E5M2, MX_E5M2);   // large enough for threads
    mxi_gemm_ctx_destroy(ctx);
}

/* The general entry point: every transpose combination and a padded C. */
static void test_general(void) {
    mxi_gemm_ctx *ctx = new_ctx();
    if (!ctx) return;
    int64_t M = 23, N = 41, K = 77, ldc = N + 3;
    float *a = random_matrix(M, K), *at = random_matrix(K, M), *b = random_matrix(K, N), *bt = random_matrix(N, K);
    plane_buf A = quantize(a, M, K, MX_ROWWISE, MX_E4M3), At = quantize(at, K, M, MX_COLWISE, MX_E5M2);
    plane_buf B = quantize(b, K, N, MX_COLWISE, MX_E4M3), Bt = quantize(bt, N, K, MX_ROWWISE, MX_E4M3);
    float *c = malloc((size_t)(M * ldc) * sizeof *c), *c0 = malloc((size_t)(M * ldc) * sizeof *c0);
    for (int v = 0; v < 8; v++) {
        bool ta = v & 1, tb = (v >> 1) & 1, acc = (v >> 2) & 1;
        for (int64_t i = 0; i < M * ldc; i++) c0[i] = c[i] = (float)rng_unit();
        mx_diag diag = {{0}};
        int rc = mxi_mx_gemm(ctx, c, ldc, ta ? &At.p : &A.p, ta, tb ? &Bt.p : &B.p, tb, acc, &diag);
        CHECK_EQ_INT(rc, 0);
        if (rc) fprintf(stderr, "  diag: %s\n", diag.msg);
        char what[64];
        snprintf(what, sizeof what, "general ta=%d tb=%d acc=%d", ta, tb, acc);
        check_product(c, ldc, acc ? c0 : NULL, ta ? &At.p : &A.p, ta, tb ? &Bt.p : &B.p, tb, what);
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = N; j < ldc; j++) CHECK_EQ_DBL(c[i * ldc + j], c0[i * ldc + j]);
    }
    // the same shapes again: no new primitive
    mxi_gemm_stats st;
    mxi_gemm_ctx_stats(ctx, &st);
    int64_t created = st.primitives_created;
    CHECK_EQ_INT(mxi_mx_gemm(ctx, c, ldc, &A.p, false, &B.p, false, false, NULL), 0);
    mxi_gemm_ctx_stats(ctx, &st);
    CHECK_EQ_INT(st.primitives_created, created);
    plane_free(&A); plane_free(&At); plane_free(&B); plane_free(&Bt);
    free(a); free(at); free(b); free(bt); free(c); free(c0);
    mxi_gemm_ctx_destroy(ctx);
}

/* The experts' grouped GEMMs on MX planes: each group of M tokens (M = 1, 31, 33, 100: a
 * partial last block of 32 along the tokens, or none) quantized on its own, the token dim
 * left to run time: right against the oracle, the same bit for bit as the fixed-shape
 * product, and one primitive per kind of GEMM for all the sizes. */
static void test_runtime_dims(void) {
    mxi_gemm_ctx *ctx = new_ctx(), *fixed = new_ctx();
    if (!ctx || !fixed) return;
    static const int64_t sizes[] = {1, 31, 33, 100, 0, 31};
    int64_t N = 19, K = 45;
    float *w = random_matrix(N, K);
    plane_buf W_row = quantize(w, N, K, MX_ROWWISE, MX_E4M3), W_col = quantize(w, N, K, MX_COLWISE, MX_E4M3);
    mxi_gemm_stats st, fs;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        int64_t M = sizes[i];
        float *x = random_matrix(M, K), *dy = random_matrix(M, N);
        plane_buf X_row = quantize(x, M, K, MX_ROWWISE, MX_E4M3), X_col = quantize(x, M, K, MX_COLWISE, MX_E4M3);
        plane_buf dY_row = quantize(dy, M, N, MX_ROWWISE, MX_E5M2), dY_col = quantize(dy, M, N, MX_COLWISE, MX_E5M2);
        float *r[3], *f[3];
        int64_t n[3] = {M * N, M * K, N * K};
        for (int j = 0; j < 3; j++) {
            r[j] = malloc((size_t)(n[j] + 1) * sizeof(float));
            f[j] = malloc((size_t)(n[j] + 1) * sizeof(float));
            for (int64_t e = 0; e < n[j]; e++) r[j][e] = f[j][e] = (float)rng_unit();
        }
        float *dw0 = malloc((size_t)(N * K + 1) * sizeof *dw0);
        memcpy(dw0, r[2], (size_t)(N * K) * sizeof *dw0);
        mx_diag diag = {{0}};
        // Y = X W^T, dX = dY W (M at run time); dW += dY^T X (K, the tokens, at run time)
        const mxi_mx_gemm_args fwd = {.C = r[0], .a = &X_row.p, .b = &W_row.p, .trans_b = true,
                                      .runtime = MXI_GEMM_RUNTIME_M},
                               dinp = {.C = r[1], .a = &dY_row.p, .b = &W_col.p, .runtime = MXI_GEMM_RUNTIME_M},
                               dw = {.C = r[2], .a = &dY_col.p, .trans_a = true, .b = &X_col.p, .accumulate = true,
                                     .runtime = MXI_GEMM_RUNTIME_K};
        CHECK_EQ_INT(mxi_mx_gemm_ex(ctx, &fwd, &diag), 0);
        CHECK_EQ_INT(mxi_mx_gemm_ex(ctx, &dinp, &diag), 0);
        CHECK_EQ_INT(mxi_mx_gemm_ex(ctx, &dw, &diag), 0);
        CHECK_EQ_INT(mxi_mx_gemm(fixed, f[0], 0, &X_row.p, false, &W_row.p, true, false, &diag), 0);
        CHECK_EQ_INT(mxi_mx_gemm(fixed, f[1], 0, &dY_row.p, false, &W_col.p, false, false, &diag), 0);
        CHECK_EQ_INT(mxi_mx_gemm(fixed, f[2], 0, &dY_col.p, true, &X_col.p, false, true, &diag), 0);
        char what[64];
        snprintf(what, sizeof what, "run-time dims, group of %lld", (long long)M);
        check_product(r[0], N, NULL, &X_row.p, false, &W_row.p, true, what);
        check_product(r[1], K, NULL, &dY_row.p, false, &W_col.p, false, what);
        check_product(r[2], K, dw0, &dY_col.p, true, &X_col.p, false, what);
        mxi_gemm_ctx_stats(ctx, &st);
        mxi_gemm_ctx_stats(fixed, &fs);
        bool same = !strcmp(st.runtime_impl, fs.bf16_native == 1 ? fs.bf16_probe : fs.f32_impl);
        for (int j = 0; j < 3 && same; j++) CHECK_MEM_EQ(r[j], f[j], (size_t)n[j] * sizeof(float));
        if (!same && M > 0) printf("# run-time dims run %s, fixed shapes %s: not compared bit for bit\n", st.runtime_impl,
                                   fs.bf16_native == 1 ? fs.bf16_probe : fs.f32_impl);
        for (int j = 0; j < 3; j++) free(r[j]), free(f[j]);
        plane_buf *all[] = {&X_row, &X_col, &dY_row, &dY_col};
        for (int j = 0; j < 4; j++) plane_free(all[j]);
        free(x); free(dy); free(dw0);
    }
    printf("# MX grouped GEMMs: %lld primitives with run-time dims (%s), %lld with fixed shapes\n",
           (long long)st.primitives_created, st.runtime_impl, (long long)fs.primitives_created);
    CHECK(st.primitives_created <= 4);   // three kinds (+ the bf16 probe)
    CHECK(fs.primitives_created >= 12);  // three per size
    plane_free(&W_row); plane_free(&W_col); free(w);
    mxi_gemm_ctx_destroy(ctx);
    mxi_gemm_ctx_destroy(fixed);
}

/* A NaN scale block, or a NaN element, makes the products it enters NaN, and only those. */
static void test_nan_propagates(void) {
    mxi_gemm_ctx *ctx = new_ctx();
    if (!ctx) return;
    int64_t M = 5, N = 6, K = 70;   // 3 blocks along K, the last partial
    float *x = random_matrix(M, K), *w = random_matrix(N, K), *dy = random_matrix(M, N);
    plane_buf X = quantize(x, M, K, MX_ROWWISE, MX_E4M3), W = quantize(w, N, K, MX_ROWWISE, MX_E4M3);
    plane_buf dY = quantize(dy, M, N, MX_ROWWISE, MX_E5M2), Wc = quantize(w, N, K, MX_COLWISE, MX_E4M3);
    float y[5 * 6], dx[5 * 70];
    X.s[2 * 3 + 2] = 0xFF;      // row 2 of X, block 2 (the partial one): row 2 of Y is NaN
    W.q[4 * K + 33] = 0x7F;     // E4M3 NaN code in row 4 of W: column 4 of Y is NaN
    CHECK_EQ_INT(mxi_mx_linear_forward(ctx, y, &X.p, &W.p, NULL), 0);
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) CHECK_EQ_INT(isnan(y[i * N + j]), i == 2 || j == 4);
    check_product(y, N, NULL, &X.p, false, &W.p, true, "forward with NaN");
    Wc.s[0 * K + 9] = 0xFF;     // colwise W: strip 0, column 9: column 9 of dX is NaN
    dY.q[1 * N + 3] = 0x7D;     // E5M2 NaN code in dY row 1: row 1 of dX is NaN
    CHECK_EQ_INT(mxi_mx_linear_dinput(ctx, dx, &dY.p, &Wc.p, false, NULL), 0);
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < K; j++) CHECK_EQ_INT(isnan(dx[i * K + j]), i == 1 || j == 9);
    plane_free(&X); plane_free(&W); plane_free(&dY); plane_free(&Wc);
    free(x); free(w); free(dy);
    mxi_gemm_ctx_destroy(ctx);
}

static void test_bad_arguments(void) {
    mxi_gemm_ctx *ctx = new_ctx();
    if (!ctx) return;
    int64_t M = 4, N = 3, K = 40;
    float *x = random_matrix(M, K), *w = random_matrix(N, K);
    plane_buf Xr = quantize(x, M, K, MX_ROWWISE, MX_E4M3), Xc = quantize(x, M, K, MX_COLWISE, MX_E4M3);
    plane_buf Wr = quantize(w, N, K, MX_ROWWISE, MX_E4M3), Wc = quantize(w, N, K, MX_COLWISE, MX_E4M3);
    float y[4 * 40];
    mx_diag diag = {{0}};
    // forward with a colwise X: its blocks run along M, not the contraction dim K
    CHECK_EQ_INT(mxi_mx_linear_forward(ctx, y, &Xc.p, &Wr.p, &diag), MX_EINVAL);
    CHECK_STR_CONTAINS(diag.msg, "plane A (4 x 40) is colwise");
    CHECK_STR_CONTAINS(diag.msg, "K=40");
    CHECK_STR_CONTAINS(diag.msg, "allowed: rowwise");
    CHECK_EQ_INT(mxi_mx_linear_forward(ctx, y, &Xr.p, &Wc.p, &diag), MX_EINVAL);
    CHECK_STR_CONTAINS(diag.msg, "plane B (3 x 40, transposed) is colwise");
    CHECK_STR_CONTAINS(diag.msg, "allowed: rowwise");
    // dweight needs both colwise
    CHECK_EQ_INT(mxi_mx_gemm(ctx, y, 0, &Xr.p, true, &Xc.p, false, false, &diag), MX_EINVAL);
    CHECK_STR_CONTAINS(diag.msg, "plane A (4 x 40, transposed) is rowwise");
    CHECK_STR_CONTAINS(diag.msg, "allowed: colwise");
    // inner dims
    CHECK_EQ_INT(mxi_mx_gemm(ctx, y, 0, &Xr.p, false, &Xr.p, false, false, &diag), MX_ESIZE);
    CHECK_STR_CONTAINS(diag.msg, "inner dims differ: op(A) is 4 x 40, op(B) is 4 x 40");
    // ldc
    CHECK_EQ_INT(mxi_mx_gemm(ctx, y, 2, &Xr.p, false, &Wr.p, true, false, &diag), MX_ESIZE);
    CHECK_STR_CONTAINS(diag.msg, "leading dim of C is 2");
    // enums, sizes, NULLs
    mxi_mx_plane bad = Xr.p;
    bad.axis = (mx_axis)5;
    CHECK_EQ_INT(mxi_mx_gemm(ctx, y, 0, &bad, false, &Wr.p, true, false, &diag), MX_EENUM);
    CHECK_STR_CONTAINS(diag.msg, "plane A has axis 5");
    bad = Wr.p;
    bad.elem = (mx_elem)9;
    CHECK_EQ_INT(mxi_mx_gemm(ctx, y, 0, &Xr.p, false, &bad, true, false, &diag), MX_EENUM);
    CHECK_STR_CONTAINS(diag.msg, "plane B has element format 9");
    bad = Xr.p;
    bad.rows = -1;
    CHECK_EQ_INT(mxi_mx_gemm(ctx, y, 0, &bad, false, &Wr.p, true, false, &diag), MX_ESIZE);
    CHECK_STR_CONTAINS(diag.msg, "plane A is -1 x 40");
    bad = Xr.p;
    bad.scales = NULL;
    CHECK_EQ_INT(mxi_mx_gemm(ctx, y, 0, &bad, false, &Wr.p, true, false, &diag), MX_ENULL);
    CHECK_STR_CONTAINS(diag.msg, "NULL scales");
    CHECK_EQ_INT(mxi_mx_gemm(ctx, y, 0, NULL, false, &Wr.p, true, false, &diag), MX_ENULL);
    CHECK_STR_CONTAINS(diag.msg, "plane A is NULL");
    CHECK_EQ_INT(mxi_mx_gemm(NULL, y, 0, &Xr.p, false, &Wr.p, true, false, &diag), MX_ENULL);
    CHECK_STR_CONTAINS(diag.msg, "context is NULL");
    CHECK_EQ_INT(mxi_mx_gemm(ctx, NULL, 0, &Xr.p, false, &Wr.p, true, false, &diag), MX_ENULL);
    CHECK_STR_CONTAINS(diag.msg, "C is NULL");
    CHECK_EQ_INT(mxi_mx_dequantize(NULL, &Xr.p), MX_ENULL);
    CHECK_EQ_INT(mxi_mx_dequantize(y, NULL), MX_ENULL);
    plane_free(&Xr); plane_free(&Xc); plane_free(&Wr); plane_free(&Wc);
    free(x); free(w);
    mxi_gemm_ctx_destroy(ctx);
}

static void test_zero_sizes(void) {
    mxi_gemm_ctx *ctx = new_ctx();
    if (!ctx) return;
    float c[6] = {7, 7, 7, 7, 7, 7};
    mxi_mx_plane a0 = {NULL, NULL, 2, 0, MX_ROWWISE, MX_E4M3};   // (M=2, K=0)
    mxi_mx_plane b0 = {NULL, NULL, 3, 0, MX_ROWWISE, MX_E4M3};   // (N=3, K=0), transposed
    CHECK_EQ_INT(mxi_mx_gemm(ctx, c, 0, &a0, false, &b0, true, true, NULL), 0);
    for (int i = 0; i < 6; i++) CHECK_EQ_DBL(c[i], 7);
    CHECK_EQ_INT(mxi_mx_gemm(ctx, c, 0, &a0, false, &b0, true, false, NULL), 0);
    for (int i = 0; i < 6; i++) CHECK_EQ_DBL(c[i], 0);
    mxi_mx_plane m0 = {NULL, NULL, 0, 5, MX_ROWWISE, MX_E4M3}, n0 = {NULL, NULL, 0, 5, MX_ROWWISE, MX_E4M3};
    CHECK_EQ_INT(mxi_mx_gemm(ctx, NULL, 0, &m0, false, &n0, true, false, NULL), 0);
    CHECK_EQ_INT(mxi_mx_dequantize(NULL, &m0), 0);
    mxi_gemm_stats st;
    mxi_gemm_ctx_stats(ctx, &st);
    CHECK_EQ_INT(st.primitives_created, 0);
    mxi_gemm_ctx_destroy(ctx);
}

/* ---- dequantization ---- */

/* A plane of arbitrary bytes: every code, scales mostly real-looking with some of every
 * special value (0, 254, 255, and codes above the fast path's limit). */
static plane_buf random_plane(int64_t rows, int64_t cols, mx_axis axis, mx_elem elem, bool wild_scales) {
    plane_buf b;
    int64_t ns = mx_scale_count(rows, cols, axis);
    b.q = malloc((size_t)(rows * cols) + 1);
    b.s = malloc((size_t)ns + 1);
    for (int64_t i = 0; i < rows * cols; i++) b.q[i] = (uint8_t)rng_next();
    for (int64_t i = 0; i < ns; i++) {
        uint64_t r = rng_next();
        b.s[i] = (uint8_t)(wild_scales && r % 4 == 0 ? (r >> 8) : 107 + (r >> 8) % 40);
    }
    b.p = (mxi_mx_plane){b.q, b.s, rows, cols, axis, elem};
    return b;
}

/* Row tails of 1 to 31 elements (17 and 31: into the second half of a block, as 16-lane
 * kernels split it), column tails of 1 to 15 beyond a multiple of 16. */
static const int64_t deq_dims[][2] = {{1, 1}, {1, 33}, {37, 101}, {65, 33}, {5, 300}, {96, 64}, {33, 7}, {300, 257},
                                      {33, 4100 + 37}, {3, 49}, {34, 63}};

/* The kernels, as the library lists them: each one the CPU runs, and a "not run" line for
 * each other one (nothing is checked for it). */
static int runnable_kernels(mx_kernel *out, bool with_ref) {
    int n = 0;
    for (int k = MX_KERNEL_REF; mx_kernel_name((mx_kernel)k); k++)
        if (mx_kernel_available((mx_kernel)k) && (with_ref || k != MX_KERNEL_REF)) out[n++] = (mx_kernel)k;
    return n;
}

static void report_unavailable(void) {
    for (int k = MX_KERNEL_REF; mx_kernel_name((mx_kernel)k); k++)
        if (!mx_kernel_available((mx_kernel)k))
            printf("    kernel %s: not run (%s)\n", mx_kernel_name((mx_kernel)k), mx_kernel_missing((mx_kernel)k));
}

static const char *kernel_label(mx_kernel k) {
    return k == MX_KERNEL_AVX512 && mxi_kernel_emulated(k) ? "avx512 (SIMDe emulation)" : mx_kernel_name(k);
}

/* The exact value v to bf16, nearest even, as the test computes it: spacing 2^(e-7) for a
 * binade 2^e (e >= -126: below it bf16's subnormal spacing 2^-133), infinity from 2^128 up;
 * NaN is the canonical 0x7FC0. */
static uint16_t bf16_of_exact(long double v) {
    if (isnan(v)) return 0x7FC0;
    uint16_t sign = signbit(v) ? 0x8000 : 0;
    long double a = fabsl(v);
    if (a == 0) return sign;
    if (isinf(a)) return sign | 0x7F80;   // an E5M2 infinity code
    int e = ilogbl(a) < -126 ? -126 : ilogbl(a);
    long double ulp = ldexpl(1.0L, e - 7), q = a / ulp, fl = floorl(q);
    if (q - fl > 0.5L || (q - fl == 0.5L && fmodl(fl, 2.0L) != 0)) fl += 1;
    long double r = fl * ulp;
    if (r >= ldexpl(1.0L, 128)) return sign | 0x7F80;
    float f = (float)r;   // exact: at most 8 significant bits, within fp32's range
    uint32_t bits;
    memcpy(&bits, &f, 4);
    return (uint16_t)(sign | (bits >> 16 & 0x7FFF));
}

/* Every kernel against the test's own decoder, on row ranges (two calls, as threads split
 * a plane): fp32 output (job->y) equal to the exact value, which is one fp32 or overflows
 * to inf, NaN the canonical 0x7FC00000; with bf16, the bf16 output (job->y16, what the
 * bf16 MX GEMM multiplies) equal to the exact value rounded by bf16_of_exact. */
static void dequant_against_decoder(bool bf16) {
    mx_kernel kernels[16];
    int nk = runnable_kernels(kernels, true);
    for (int ki = 0; ki < nk; ki++) {
        const mxi_ops_kernels *k = mxi_ops_kernels_of(kernels[ki]);
        int before = mxt_current_failures();
        int64_t checked = 0;
        for (size_t d = 0; d < sizeof deq_dims / sizeof deq_dims[0]; d++)
            for (int v = 0; v < 8; v++) {
                mx_axis axis = v & 1 ? MX_COLWISE : MX_ROWWISE;
                mx_elem elem = v & 2 ? MX_E5M2 : MX_E4M3;
                plane_buf b = random_plane(deq_dims[d][0], deq_dims[d][1], axis, elem, v & 4);
                int64_t n = b.p.rows * b.p.cols;
                mxi_dequant_job job;
                job.p = &b.p;
                job.y = bf16 ? NULL : malloc((size_t)n * sizeof(float));
                job.y16 = bf16 ? malloc((size_t)n * sizeof(uint16_t)) : NULL;
                job.values = mxi_code_values_of(elem);
                int64_t split = b.p.rows > 32 ? 32 : b.p.rows;
                k->dequant_rows(&job, 0, split);
                k->dequant_rows(&job, split, b.p.rows);
                for (int64_t r = 0; r < b.p.rows; r++)
                    for (int64_t c = 0; c < b.p.cols; c++) {
                        long double want = plane_value(&b.p, r, c);
                        uint32_t got, expect;
                        if (bf16) {
                            got = job.y16[r * b.p.cols + c], expect = bf16_of_exact(want);
                        } else {
                            float y = job.y[r * b.p.cols + c], w = isnan(want) ? NAN : (float)want;
                            memcpy(&got, &y, 4);
                            memcpy(&expect, &w, 4);
                            if (isnan(want)) expect = 0x7FC00000u;
                            else if ((long double)y == (long double)w) expect = got;   // -0 and 0 alike
                        }
                        if (got != expect) {
                            mxt_fail(__FILE__, __LINE__, "%s %s %s %lldx%lld: y%s[%lld,%lld] = 0x%0*x, want 0x%0*x (%.17Lg)",
                                     k->name, mx_elem_traits_of(elem)->name, axis ? "colwise" : "rowwise",
                                     (long long)b.p.rows, (long long)b.p.cols, bf16 ? "16" : "", (long long)r,
                                     (long long)c, bf16 ? 4 : 8, got, bf16 ? 4 : 8, expect, want);
                            r = b.p.rows;
                            break;
                        }
                    }
                checked += n;
                free(job.y);
                free(job.y16);
                plane_free(&b);
            }
        printf("    kernel %s: %s%lld %s elements equal to the decoder%s\n", kernel_label(kernels[ki]),
               mxt_current_failures() > before ? "FAILED: " : "", (long long)checked, bf16 ? "bf16" : "fp32",
               bf16 ? "'s values rounded" : "");
    }
    report_unavailable();
}

static void test_dequant_against_decoder(void) { dequant_against_decoder(false); }
static void test_dequant_bf16_against_decoder(void) { dequant_against_decoder(true); }

/* pow2_rows16 (the blockwise recipe's bf16 operands) of every kernel against the decoder:
 * one row of every code, lengths 0..200 and 4099 (partial vectors), blocks 1 and 128 wide;
 * then matrices of up to 5 and 130 rows, widths of 1 to 192 that end mid-vector and mid-block,
 * blocks of 1, 2 and 128 rows by 1, 64 and 128 columns (a block a row, bands, tiles, columns,
 * a row's or a column's exponent for rows of at most one vector);
 * exponents over the whole range the caller may pass for the format (each nonzero finite
 * value stays a normal bf16), nothing written past the matrix. */
static void test_pow2_rows16_against_decoder(void) {
    enum { N = 4099, MAX = 130 * 192, GUARD = 8 };   // the longest row, the largest matrix
    mx_kernel kernels[16];
    int nk = runnable_kernels(kernels, true);
    uint8_t *q = malloc(MAX);
    int16_t *e = malloc(MAX * sizeof *e);
    uint16_t *y = malloc((MAX + GUARD) * sizeof *y);
    for (int ki = 0; ki < nk; ki++) {
        const mxi_ops_kernels *k = mxi_ops_kernels_of(kernels[ki]);
        int before = mxt_current_failures();
        int64_t checked = 0;
        for (int ei = 0; ei < 2; ei++) {
            mx_elem elem = ei ? MX_E5M2 : MX_E4M3;
            int lo = ei ? -110 : -117, hi = ei ? 112 : 119;   // 2^lo * smallest subnormal, 2^hi * max: normal bf16
            // (rows, cols, brows, bcols): one row of every length first, then matrices
            int64_t shapes[640][4], ns = 0;   // 404 rows, 126 matrices
            for (int64_t n = 0; n <= N; n = n < 200 ? n + 1 : n < N ? N : N + 1)
                for (int64_t width = 1; width <= 128; width += 127)
                    shapes[ns][0] = 1, shapes[ns][1] = n, shapes[ns][2] = 1, shapes[ns][3] = width, ns++;
            static const int64_t rows_[] = {2, 5, 130}, cols_[] = {1, 32, 37, 64, 70, 128, 192}, blk[][2] = {{1, 1}, {1, 64},
                {1, 128}, {2, 64}, {128, 128}, {128, 1}};
            for (int ri = 0; ri < 3; ri++)
                for (int ci = 0; ci < 7; ci++)
                    for (int bi = 0; bi < 6; bi++)
                        shapes[ns][0] = rows_[ri], shapes[ns][1] = cols_[ci], shapes[ns][2] = blk[bi][0],
                        shapes[ns][3] = blk[bi][1], ns++;
            for (int64_t si = 0; si < ns; si++) {
                int64_t R = shapes[si][0], C = shapes[si][1], br = shapes[si][2], bc = shapes[si][3];
                int64_t n = R * C, nbc = (C + bc - 1) / bc, nb = ((R + br - 1) / br) * nbc;
                for (int64_t i = 0; i < n; i++) q[i] = i < 256 ? (uint8_t)i : (uint8_t)rng_next();
                for (int64_t i = 0; i < nb; i++) e[i] = (int16_t)(lo + (int64_t)(rng_next() % (uint64_t)(hi - lo + 1)));
                if (nb > 2) e[0] = (int16_t)lo, e[nb - 1] = (int16_t)hi;
                for (int64_t i = 0; i < n + GUARD; i++) y[i] = 0xBEEF;
                k->pow2_rows16(y, q, R, C, e, br, bc, mxi_code_values_of(elem));
                for (int64_t i = 0; i < n; i++) {
                    int x = (int)e[((i / C) / br) * nbc + (i % C) / bc];
                    long double want = ldexpl(fp8_value(q[i], elem), x);
                    if (y[i] != bf16_of_exact(want)) {
                        mxt_fail(__FILE__, __LINE__, "%s %s %lld x %lld in %lldx%lld blocks: y[%lld] (code 0x%02x, 2^%d) = "
                                 "0x%04x, want 0x%04x", k->name, mx_elem_traits_of(elem)->name, (long long)R, (long long)C,
                                 (long long)br, (long long)bc, (long long)i, q[i], x, y[i], bf16_of_exact(want));
                        break;
                    }
                }
                for (int64_t i = n; i < n + GUARD; i++) CHECK_EQ_HEX(y[i], 0xBEEF);
                checked += n;
            }
        }
        printf("    kernel %s: %s%lld bf16 elements equal to the decoder's\n", kernel_label(kernels[ki]),
               mxt_current_failures() > before ? "FAILED: " : "", (long long)checked);
    }
    report_unavailable();
    free(q), free(e), free(y);
}

/* scale_row against its definition computed here: c = (sa * sb[j]) * acc[j] (or c + that),
 * each step an fp32 rounding, with and without per-column scales, over lengths 0..80 and
 * values that overflow, underflow and carry NaN and infinities; nothing written past n. */
static void test_scale_row_against_definition(void) {
    enum { N = 80, GUARD = 8 };
    mx_kernel kernels[16];
    int nk = runnable_kernels(kernels, true);
    float acc[N], sb[N], c0[N + GUARD], c[N + GUARD], want[N];
    static const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 3e38f, 1e-40f, 1.0f};
    for (int ki = 0; ki < nk; ki++) {
        const mxi_ops_kernels *k = mxi_ops_kernels_of(kernels[ki]);
        int before = mxt_current_failures();
        for (int round = 0; round < 4; round++)
            for (int64_t n = 0; n <= N; n++)
                for (int v = 0; v < 4; v++) {
                    bool add = v & 1, vec = v & 2;
                    for (int64_t j = 0; j < N; j++) {
                        uint64_t r = rng_next();
                        acc[j] = r % 11 == 0 ? specials[r % 8] : ldexpf((float)(int32_t)(r >> 32) / 2147483648.0f, (int)(r >> 8 & 63) - 20);
                        sb[j] = ldexpf(1.0f + (float)(r >> 16 & 0xFFFF) / 65536.0f, (int)(r >> 40 & 255) - 140);
                        c0[j] = (float)(int32_t)(r >> 20) / 1024.0f;
                    }
                    for (int64_t j = N; j < N + GUARD; j++) c0[j] = 12345.0f;
                    float sa = round == 3 ? 1e30f : ldexpf(1.5f, round * 7 - 10), s = round == 2 ? 7e-39f : 0.3f;
                    for (int64_t j = 0; j < n; j++) {
                        float f = sa * (vec ? sb[j] : s);
                        float t = f * acc[j];
                        want[j] = add ? c0[j] + t : t;
                    }
                    memcpy(c, c0, sizeof c);
                    k->scale_row(c, acc, n, sa, vec ? sb : NULL, s, add ? MXI_ROW_ADD : MXI_ROW_SET);
                    for (int64_t j = 0; j < n; j++)
                        if (memcmp(&c[j], &want[j], 4) && !(c[j] != c[j] && want[j] != want[j])) {
                            mxt_fail(__FILE__, __LINE__, "%s n %lld %s %s: c[%lld] = %a, want %a", k->name, (long long)n,
                                     add ? "add" : "set", vec ? "per column" : "one scale", (long long)j, (double)c[j],
                                     (double)want[j]);
                            break;
                        }
                    CHECK_MEM_EQ(c + n, c0 + n, (size_t)(N + GUARD - n) * sizeof *c);   // untouched past n
                }
        printf("    kernel %s: %sscale_row equals its definition\n", kernel_label(kernels[ki]),
               mxt_current_failures() > before ? "FAILED: " : "");
    }
    report_unavailable();
}

/* Every SIMD kernel equals the reference bit for bit, on whole planes and on row ranges. */
static void test_dequant_fast_equals_reference(void) {
    mx_kernel fast[16];
    int nf = runnable_kernels(fast, false);
    if (nf == 0) printf("    no SIMD kernel runs on this CPU: fast paths not checked\n");
    for (int ki = 0; ki < nf; ki++) {
        const mxi_ops_kernels *k = mxi_ops_kernels_of(fast[ki]);
        int before = mxt_current_failures();
        int64_t checked = 0;
        for (int round = 0; round < 3; round++)
            for (size_t d = 0; d < sizeof deq_dims / sizeof deq_dims[0]; d++)
                for (int v = 0; v < 8; v++) {
                    mx_axis axis = v & 1 ? MX_COLWISE : MX_ROWWISE;
                    mx_elem elem = v & 2 ? MX_E5M2 : MX_E4M3;
                    plane_buf b = random_plane(deq_dims[d][0], deq_dims[d][1], axis, elem, v & 4);
                    size_t bytes = (size_t)(b.p.rows * b.p.cols) * sizeof(float);
                    mxi_dequant_job j0, j1;
                    j0.p = j1.p = &b.p;
                    j0.y = malloc(bytes);
                    j1.y = malloc(bytes);
                    j0.y16 = j1.y16 = NULL;
                    memset(j0.y, 0, bytes);
                    memset(j1.y, 0, bytes);
                    j0.values = mxi_code_values_of(elem);
                    j1.values = mxi_code_values_of(elem);
                    mxi_ops_kernels_ref.dequant_rows(&j0, 0, b.p.rows);
                    int64_t split = b.p.rows > 32 ? 32 : b.p.rows;   // two calls, as threads split it
                    k->dequant_rows(&j1, 0, split);
                    k->dequant_rows(&j1, split, b.p.rows);
                    CHECK_MEM_EQ(j0.y, j1.y, bytes);
                    // and through the public entry point, with each kernel selected
                    float *y2 = malloc(bytes);
                    CHECK_EQ_INT(mx_kernel_select(fast[ki]), 0);
                    CHECK(mxi_ops_kernels_active() == k);
                    CHECK_EQ_INT(mxi_mx_dequantize(y2, &b.p), 0);
                    CHECK_MEM_EQ(j0.y, y2, bytes);
                    CHECK_EQ_INT(mx_kernel_select(MX_KERNEL_REF), 0);
                    CHECK_EQ_INT(mxi_mx_dequantize(y2, &b.p), 0);
                    CHECK_MEM_EQ(j0.y, y2, bytes);
                    CHECK_EQ_INT(mx_kernel_select(MX_KERNEL_AUTO), 0);
                    checked += b.p.rows * b.p.cols;
                    free(y2);
                    free(j0.y);
                    free(j1.y);
                    plane_free(&b);
                }
        printf("    kernel %s: %s%lld elements equal to the reference\n", kernel_label(fast[ki]),
               mxt_current_failures() > before ? "FAILED: " : "", (long long)checked);
    }
    report_unavailable();
}

/* NaN and infinity patterns of every kind (quiet, signalling, negative, all payload bits;
 * some special only as fp32, not as bf16) and +-FLT_MAX, sparse and as a whole block, in a
 * 70x97 matrix (partial blocks and tiles), quantized and dequantized by each kernel: per
 * SPEC 4 a block holding one has scale 0xFF and only 0x7F codes and dequantizes to the
 * canonical NaN, every other block none of these; both formats, modes and input types,
 * rowwise, colwise (one dual call) and tiles. */
static void test_nan_blocks(void) {
    static const uint32_t pat[] = {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFF800001u, 0x7FFFFFFFu, 0xFFFFFFFFu,
                                   0x7FBF0000u, 0x7F800000u, 0xFF800000u, 0x7F7FFFFFu, 0xFF7FFFFFu, 0x7F7F0000u};
    enum { R = 70, C = 97, N = R * C };
    static float x[N], y[N];
    static uint16_t xb[N];
    static uint8_t q[3][N], s[3][N], special[2][N];   // special: per input type, the element is NaN or Inf
    float *fill = random_matrix(R, C);
    for (int i = 0; i < N; i++) x[i] = fill[i] * (rng_next() & 1 ? 1e30f : -1e-30f);
    free(fill);
    for (int i = 0; i < 80; i++) {   // in a checkerboard of tiles: the other tiles stay finite
        int r = (int)(rng_next() % R), c = (int)(rng_next() % C);
        if ((r / 32 + c / 32) % 2 == 0) memcpy(&x[r * C + c], &pat[i % 12], 4);
    }
    for (int c = 64; c < 96; c++) x[33 * C + c] = NAN;   // a whole rowwise block, in an odd tile
    for (int i = 0; i < N; i++) {
        uint32_t u;
        memcpy(&u, &x[i], 4);
        xb[i] = (uint16_t)(u >> 16);   // truncated: 0x7F800001 becomes an infinity, 0x7F7FFFFF stays finite
        special[0][i] = (u & 0x7FFFFFFFu) > 0x7F7FFFFFu, special[1][i] = (xb[i] & 0x7FFF) > 0x7F7F;
    }
    mx_kernel kernels[16];
    int nk = runnable_kernels(kernels, true);
    for (int ki = 0; ki < nk; ki++) {
        CHECK_EQ_INT(mx_kernel_select(kernels[ki]), 0);
        int before = mxt_current_failures();
        for (int v = 0; v < 16; v++) {   // input type, format, mode, planes (dual or tiles)
            int bf = v & 1, tiles = v >> 3 & 1;
            mx_elem elem = v & 2 ? MX_E5M2 : MX_E4M3;
            mx_scale_mode mode = v & 4 ? MX_SCALE_RCEIL : MX_SCALE_FLOOR;
            int rc = tiles ? (bf ? mx_quantize_tiles_bf16(xb, R, C, elem, mode, q[2], s[2])
                                 : mx_quantize_tiles_f32(x, R, C, elem, mode, q[2], s[2]))
                           : (bf ? mx_quantize_dual_bf16(xb, R, C, elem, mode, q[0], s[0], q[1], s[1])
                                 : mx_quantize_dual_f32(x, R, C, elem, mode, q[0], s[0], q[1], s[1]));
            CHECK_EQ_INT(rc, 0);
            for (int p = tiles ? 2 : 0; p < (tiles ? 3 : 2); p++) {
                int bh = p ? 32 : 1, bw = p == 1 ? 1 : 32;   // a block's extent: 1x32, 32x1, 32x32
                if (p < 2) {   // this kernel's dequantization of the plane
                    mxi_mx_plane pl = {q[p], s[p], R, C, p ? MX_COLWISE : MX_ROWWISE, elem};
                    mxi_dequant_job job = {.p = &pl, .y = y};
                    job.values = mxi_code_values_of(elem);
                    mxi_ops_kernels_of(kernels[ki])->dequant_rows(&job, 0, R);
                }
                for (int i = 0; i < N; i++) {
                    int r = i / C, c = i % C, sc = s[p][r / bh * ((C + bw - 1) / bw) + c / bw], nan = 0;
                    for (int rr = r / bh * bh; rr < r / bh * bh + bh && rr < R; rr++)
                        for (int cc = c / bw * bw; cc < c / bw * bw + bw && cc < C; cc++) nan |= special[bf][rr * C + cc];
                    uint32_t yb;
                    memcpy(&yb, &y[i], 4);
                    int max_code = elem == MX_E5M2 ? 0x7B : 0x7E;
                    bool ok = nan ? sc == 0xFF && q[p][i] == 0x7F && (p == 2 || yb == 0x7FC00000u)
                                  : sc != 0xFF && (q[p][i] & 0x7F) <= max_code && (p == 2 || !isnan(y[i]));
                    if (!ok) {
                        mxt_fail(__FILE__, __LINE__, "kernel %s, variant %d, plane %d, (%d, %d): scale 0x%02X, code "
                                 "0x%02X, value 0x%08X; block %s", kernel_label(kernels[ki]), v, p, r, c, sc, q[p][i],
                                 yb, nan ? "NaN" : "finite");
                        break;
                    }
                }
            }
        }
        printf("    kernel %s: %sNaN and Inf patterns poison their blocks only, quantized and dequantized\n",
               kernel_label(kernels[ki]), mxt_current_failures() > before ? "FAILED: " : "");
    }
    mx_kernel_select(MX_KERNEL_AUTO);
    report_unavailable();
}

/* A large plane through the threaded entry point equals one reference call. */
static void test_dequant_threads(void) {
    plane_buf b = random_plane(1000, 333, MX_COLWISE, MX_E4M3, true);
    size_t bytes = (size_t)(b.p.rows * b.p.cols) * sizeof(float);
    mxi_dequant_job j0;
    j0.p = &b.p;
    j0.y = malloc(bytes);
    j0.y16 = NULL;
    j0.values = mxi_code_values_of(MX_E4M3);
    mxi_ops_kernels_ref.dequant_rows(&j0, 0, b.p.rows);
    float *y = malloc(bytes);
    CHECK_EQ_INT(mxi_mx_dequantize(y, &b.p), 0);
    CHECK_MEM_EQ(j0.y, y, bytes);
    free(y);
    free(j0.y);
    plane_free(&b);
}

static const mxt_test tests[] = {
    {"linear_gemms", test_linear_gemms},
    {"dequant_bf16_against_decoder", test_dequant_bf16_against_decoder},
    {"general", test_general},
    {"runtime_dims", test_runtime_dims},
    {"nan_propagates", test_nan_propagates},
    {"bad_arguments", test_bad_arguments},
    {"zero_sizes", test_zero_sizes},
    {"dequant_against_decoder", test_dequant_against_decoder},
    {"pow2_rows16_against_decoder", test_pow2_rows16_against_decoder},
    {"scale_row_against_definition", test_scale_row_against_definition},
    {"dequant_fast_equals_reference", test_dequant_fast_equals_reference},
    {"dequant_threads", test_dequant_threads},
    {"nan_blocks", test_nan_blocks},
};

int main(int argc, char **argv) { return MXT_RUN(tests, argc, argv); }
