/* mxi_matmul against a double-precision triple loop written here.
 *
 * Tolerance: K products summed in fp32, in any order, with or without FMA, plus the old C
 * when accumulating, are within (K + 2) u * sum |terms| of the exact sum (the classic
 * n u / (1 - n u) bound with slack), u = 2^-24. A GEMM that rounded its inputs to bf16 or
 * accumulated in bf16 misses it by orders of magnitude. For bf16 inputs the test rounds
 * its fp32 data to bf16 itself, and the oracle uses those rounded values. */
#include <dnnl.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#include "harness.h"
#include "mxtrain/mx.h"
#include "ops/gemm.h"
#include "ops/ops_kernels.h"
#include "numerics/mx_internal.h"   // mxi_kernel_emulated

/* ---- random numbers ---- */

static uint64_t rng_state = 0x243F6A8885A308D3ull;
static uint64_t rng_next(void) { return mxt_splitmix64(&rng_state); }
static float rng_unit(void) { return (float)mxt_uniform(&rng_state); }

/* fp32 -> bf16 bits, round to nearest even (inputs here are finite). */
static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static double bf16_value(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ---- operands ---- */

/* One stored matrix (rows, cols) with leading dim ld, as fp32 and bf16, plus the exact
 * values the oracle uses. */
typedef struct {
    int64_t rows, cols, ld;
    float *f;        // (rows, ld)
    uint16_t *b;     // (rows, ld)
    double *v;       // (rows, cols) value of the dtype under test
} mat;

static mat mat_new(int64_t rows, int64_t cols, int64_t ld, bool bf16) {
    mat m = {rows, cols, ld, NULL, NULL, NULL};
    size_t n = (size_t)(rows * ld) + 1;
    m.f = malloc(n * sizeof *m.f);
    m.b = malloc(n * sizeof *m.b);
    m.v = malloc(((size_t)(rows * cols) + 1) * sizeof *m.v);
    for (int64_t i = 0; i < rows * ld; i++) {   // padding holds garbage that must not be read
        m.f[i] = 1e30f;
        m.b[i] = 0x7F80;   // bf16 +inf
    }
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            float x = rng_unit() * (float)ldexp(1.0, (int)(rng_next() % 7) - 3);
            m.f[r * ld + c] = x;
            m.b[r * ld + c] = to_bf16(x);
            m.v[r * cols + c] = bf16 ? bf16_value(m.b[r * ld + c]) : x;
        }
    return m;
}

static void mat_free(mat *m) {
    free(m->f);
    free(m->b);
    free(m->v);
}

/* One product check: C = op(A) op(B) (+ C) against the oracle, entry by entry. */
typedef struct {
    int64_t M, N, K;
    bool ta, tb, acc;
    int64_t pad_a, pad_b, pad_c;   // leading dim minus row length
    mxi_dtype at, bt;
} case_t;

/* With rt, the dims left to run time (mxi_matmul_ex). With twin: the same product also
 * through twin with fixed shapes, and, when both run the same oneDNN implementation, the
 * two results compared bit for bit. */
static void check_case_twin(mxi_gemm_ctx *ctx, case_t t, unsigned rt, mxi_gemm_ctx *twin) {
    int64_t ar = t.ta ? t.K : t.M, ac = t.ta ? t.M : t.K;
    int64_t br = t.tb ? t.N : t.K, bc = t.tb ? t.K : t.N;
    mat A = mat_new(ar, ac, ac + t.pad_a, t.at == MXI_BF16);
    mat B = mat_new(br, bc, bc + t.pad_b, t.bt == MXI_BF16);
    int64_t ldc = t.N + t.pad_c;
    float *C = malloc(((size_t)(t.M * ldc) + 1) * sizeof *C);
    float *C0 = malloc(((size_t)(t.M * ldc) + 1) * sizeof *C0);
    for (int64_t i = 0; i < t.M * ldc; i++) C0[i] = C[i] = rng_unit();
    mx_diag diag = {{0}};
    mxi_matmul_args args = {.C = C, .ldc = ldc,
                            .a = {t.at == MXI_BF16 ? (const void *)A.b : A.f, t.at, t.ta, A.ld},
                            .b = {t.bt == MXI_BF16 ? (const void *)B.b : B.f, t.bt, t.tb, B.ld},
                            .M = t.M, .N = t.N, .K = t.K, .accumulate = t.acc, .runtime = rt};
    int rc = mxi_matmul_ex(ctx, &args, &diag);
    CHECK_EQ_INT(rc, 0);
    if (rc) fprintf(stderr, "  diag: %s\n", diag.msg);
    if (twin) {
        float *Cf = malloc(((size_t)(t.M * ldc) + 1) * sizeof *Cf);
        memcpy(Cf, C0, (size_t)(t.M * ldc) * sizeof *Cf);
        CHECK_EQ_INT(mxi_matmul(twin, Cf, ldc, t.at == MXI_BF16 ? (const void *)A.b : A.f, t.at, t.ta, A.ld,
                                t.bt == MXI_BF16 ? (const void *)B.b : B.f, t.bt, t.tb, B.ld, t.M, t.N, t.K, t.acc,
                                &diag), 0);
        mxi_gemm_stats sr, sf;
        mxi_gemm_ctx_stats(ctx, &sr);
        mxi_gemm_ctx_stats(twin, &sf);
        const char *fixed_impl = sf.bf16_native == 1 && t.at == MXI_BF16 && t.bt == MXI_BF16 ? sf.bf16_probe : sf.f32_impl;
        if (t.M > 0 && t.N > 0 && t.K > 0 && strcmp(sr.runtime_impl, fixed_impl) != 0)
            printf("# M=%lld N=%lld K=%lld: run-time dims run %s, fixed shapes %s: not compared bit for bit\n",
                   (long long)t.M, (long long)t.N, (long long)t.K, sr.runtime_impl, fixed_impl);
        else
            CHECK_MEM_EQ(C, Cf, (size_t)(t.M * ldc) * sizeof *C);
        free(Cf);
    }
    for (int64_t i = 0; i < t.M && mxt_current_failures() == 0; i++) {
        for (int64_t j = 0; j < t.N; j++) {
            double exact = t.acc ? C0[i * ldc + j] : 0.0, mag = fabs(exact);
            for (int64_t k = 0; k < t.K; k++) {
                double a = t.ta ? A.v[k * ac + i] : A.v[i * ac + k];
                double b = t.tb ? B.v[j * bc + k] : B.v[k * bc + j];
                exact += a * b;
                mag += fabs(a * b);
            }
            double tol = (double)(t.K + 2) * ldexp(1.0, -24) * mag;
            if (!(fabs(C[i * ldc + j] - exact) <= tol)) {
                mxt_fail(__FILE__, __LINE__, "M=%lld N=%lld K=%lld ta=%d tb=%d acc=%d types=%d,%d: C[%lld,%lld] = %.9g, exact %.17g, tol %.3g",
                         (long long)t.M, (long long)t.N, (long long)t.K, t.ta, t.tb, t.acc, t.at, t.bt,
                         (long long)i, (long long)j, C[i * ldc + j], exact, tol);
                break;
            }
        }
        for (int64_t j = t.N; j < ldc; j++) CHECK_EQ_DBL(C[i * ldc + j], C0[i * ldc + j]);   // padding untouched
    }
    mat_free(&A);
    mat_free(&B);
    free(C);
    free(C0);
}

static void check_case(mxi_gemm_ctx *ctx, case_t t) { check_case_twin(ctx, t, 0, NULL); }

static mxi_gemm_ctx *new_ctx(void) {
    mxi_gemm_ctx *ctx = NULL;
    mx_diag diag = {{0}};
    int rc = mxi_gemm_ctx_create(&ctx, &diag);
    CHECK_EQ_INT(rc, 0);
    if (rc) fprintf(stderr, "  diag: %s\n", diag.msg);
    return ctx;
}

static const int64_t shapes[][3] = {
    {1, 1, 1}, {17, 33, 65}, {1, 40, 7}, {31, 1, 64}, {5, 9, 1}, {64, 48, 96}, {2, 3, 300},
};

static void sweep(mxi_dtype at, mxi_dtype bt) {
    mxi_gemm_ctx *ctx = new_ctx();
    if (!ctx) return;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int v = 0; v < 16; v++) {
            case_t t = {shapes[s][0], shapes[s][1], shapes[s][2], v & 1, (v >> 1) & 1, (v >> 2) & 1,
                        (v >> 3) ? 3 : 0, (v >> 3) ? 1 : 0, (v >> 3) ? 5 : 0, at, bt};
            check_case(ctx, t);
        }
    mxi_gemm_ctx_destroy(ctx);
}

static void test_f32(void) { sweep(MXI_F32, MXI_F32); }
static void test_bf16(void) { sweep(MXI_BF16, MXI_BF16); }
static void test_mixed(void) {
    sweep(MXI_BF16, MXI_F32);
    sweep(MXI_F32, MXI_BF16);
}

/* Large enough that oneDNN and the widening pass use every thread. */
static void test_large(void) {
    mxi_gemm_ctx *ctx = new_ctx();
    if (!ctx) return;
    check_case(ctx, (case_t){129, 257, 1000, false, true, false, 0, 0, 0, MXI_F32, MXI_F32});
    check_case(ctx, (case_t){300, 130, 513, true, false, true, 2, 0, 1, MXI_BF16, MXI_BF16});
    mxi_gemm_ctx_destroy(ctx);
}

/* A repeated shape reuses its primitive; the cache evicts the least recently used. */
static void test_cache(void) {
    mxi_gemm_ctx *ctx = new_ctx();
    if (!ctx) return;
    mxi_gemm_stats st;
    case_t t = {8, 16, 32, false, true, false, 0, 0, 0, MXI_F32, MXI_F32};
    check_case(ctx, t);
    mxi_gemm_ctx_stats(ctx, &st);
    CHECK_EQ_INT(st.primitives_created, 1);
    CHECK_EQ_INT(st.cache_hits, 0);
    CHECK_STR_CONTAINS(st.f32_impl, ":");   // e.g. "gemm:jit"
    size_t bytes = st.buffer_bytes;
    for (int i = 0; i < 5; i++) check_case(ctx, t);
    mxi_gemm_ctx_stats(ctx, &st);
    CHECK_EQ_INT(st.primitives_created, 1);
    CHECK_EQ_INT(st.cache_hits, 5);
    CHECK_EQ_INT(st.buffer_bytes, bytes);
    t.acc = true;   // accumulate is part of the key
    check_case(ctx, t);
    t.pad_c = 1;    // so are leading dims
    check_case(ctx, t);
    mxi_gemm_ctx_stats(ctx, &st);
    CHECK_EQ_INT(st.primitives_created, 3);
    CHECK_EQ_INT(st.cached, 3);
    // bf16 operands: widened buffers are reused, the probe happens once
    case_t b = {8, 16, 32, false, true, false, 0, 0, 0, MXI_BF16, MXI_BF16};
    check_case(ctx, b);
    mxi_gemm_ctx_stats(ctx, &st);
    int64_t created = st.primitives_created;
    bytes = st.buffer_bytes;
    CHECK(st.bf16_native == 0 || st.bf16_native == 1);
    CHECK(st.bf16_probe[0] != 0);
    printf("# bf16 probe: %s (native %d), fp32 implementation: %s\n", st.bf16_probe, st.bf16_native, st.f32_impl);
    check_case(ctx, b);
    mxi_gemm_ctx_stats(ctx, &st);
    CHECK_EQ_INT(st.primitives_created, created);
    CHECK_EQ_INT(st.buffer_bytes, bytes);
    // oneDNN fixes some kernels' thread count at creation: another count is another primitive
    int threads = omp_get_max_threads();
    omp_set_num_threads(threads == 1 ? 2 : 1);
    check_case(ctx, t);
    omp_set_num_threads(threads);
    mxi_gemm_ctx_stats(ctx, &st);
    CHECK_EQ_INT(st.primitives_created, created + 1);
    created++;
    // more shapes than the cache holds: it drops the oldest
    enum { MORE = MXI_GEMM_CACHE_CAP + 6 };
    for (int i = 0; i < MORE; i++) check_case(ctx, (case_t){1 + i, 3, 4, false, false, false, 0, 0, 0, MXI_F32, MXI_F32});
    mxi_gemm_ctx_stats(ctx, &st);
    CHECK_EQ_INT(st.cached, MXI_GEMM_CACHE_CAP);
    CHECK_EQ_INT(st.cache_evictions, created + MORE - MXI_GEMM_CACHE_CAP);
    check_case(ctx, t);   // evicted long ago: created again, still right
    mxi_gemm_ctx_stats(ctx, &st);
    CHECK_EQ_INT(st.primitives_created, created + MORE + 1);
    mxi_gemm_ctx_destroy(ctx);
}

/* The experts' grouped GEMMs: the token dim left to run time (M of the forward and dinput
 * products, the contraction K of dweight), over group sizes 0, 1, 31, 33, 100 and odd other
 * dims, in fp32 and bf16. Each is right against the oracle and the same bit for bit as the
 * fixed-shape product, and all of them share one primitive per kind of product: the
 * primitive count does not grow with the number of sizes. */
static void test_runtime_dims(void) {
    mxi_gemm_ctx *ctx = new_ctx(), *fixed = new_ctx();
    if (!ctx || !fixed) return;
    static const int64_t sizes[] = {0, 1, 31, 33, 100, 2, 77};
    mxi_gemm_stats st;
    int64_t after_first = -1;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        int64_t g = sizes[i];
        for (int ty = 0; ty < 2; ty++) {
            mxi_dtype d = ty ? MXI_BF16 : MXI_F32;
            check_case_twin(ctx, (case_t){g, 37, 45, false, true, false, 0, 0, 0, d, d}, MXI_GEMM_RUNTIME_M, fixed);  // Y = X W^T
            check_case_twin(ctx, (case_t){g, 45, 37, false, false, true, 0, 0, 0, d, d}, MXI_GEMM_RUNTIME_M, fixed);  // dX += dY W
            check_case_twin(ctx, (case_t){37, 45, g, true, false, true, 0, 0, 0, d, d}, MXI_GEMM_RUNTIME_K, fixed);   // dW += dY^T X
            check_case_twin(ctx, (case_t){g, 19, 3, false, true, false, 0, 2, 1, d, d}, MXI_GEMM_RUNTIME_M, fixed);   // padded, tiny K
        }
        mxi_gemm_ctx_stats(ctx, &st);
        if (g > 0 && after_first < 0) after_first = st.primitives_created;   // every kind made once
    }
    mxi_gemm_stats fs;
    mxi_gemm_ctx_stats(ctx, &st);
    mxi_gemm_ctx_stats(fixed, &fs);
    printf("# run-time dims: %s; %lld primitives for %zu group sizes (with fixed shapes: %lld)\n", st.runtime_impl,
           (long long)st.primitives_created, sizeof sizes / sizeof sizes[0], (long long)fs.primitives_created);
    CHECK_EQ_INT(st.primitives_created, after_first);
    CHECK(st.primitives_created <= 9);   // 4 kinds x 2 dtypes (+ the bf16 probe)
    CHECK(st.runtime_primitives >= 1 || !strncmp(st.runtime_impl, "fixed", 5));
    CHECK(fs.primitives_created > 20);   // the churn that run-time dims avoid
    // unknown bits are refused
    float c[4] = {0}, a[4] = {0}, b[4] = {0};
    mx_diag diag = {{0}};
    mxi_matmul_args bad = {.C = c, .a = {.data = a, .type = MXI_F32}, .b = {.data = b, .type = MXI_F32}, .M = 2, .N = 2,
                           .K = 1, .runtime = 4};
    CHECK_EQ_INT(mxi_matmul_ex(ctx, &bad, &diag), MX_EENUM);
    CHECK_STR_CONTAINS(diag.msg, "run-time dims");
    mxi_gemm_ctx_destroy(ctx);
    mxi_gemm_ctx_destroy(fixed);
}

static void test_zero_sizes(void) {
    mxi_gemm_ctx *ctx = new_ctx();
    if (!ctx) return;
    float a[8] = {1, 2, 3, 4, 5, 6, 7, 8}, b[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    float c[12];
    for (int i = 0; i < 12; i++) c[i] = 7;
    mx_diag diag = {{0}};
    // M = 0 or N = 0: nothing happens, even with NULL operands and C
    CHECK_EQ_INT(mxi_matmul(ctx, NULL, 0, NULL, MXI_F32, false, 0, NULL, MXI_F32, false, 0, 0, 3, 4, false, &diag), 0);
    CHECK_EQ_INT(mxi_matmul(ctx, c, 0, a, MXI_F32, false, 0, b, MXI_F32, false, 0, 3, 0, 4, false, &diag), 0);
    for (int i = 0; i < 12; i++) CHECK_EQ_DBL(c[i], 7);
    // K = 0: C = 0 (padding kept), or C unchanged when accumulating
    CHECK_EQ_INT(mxi_matmul(ctx, c, 4, NULL, MXI_F32, false, 0, NULL, MXI_BF16, true, 0, 3, 3, 0, true, &diag), 0);
    for (int i = 0; i < 12; i++) CHECK_EQ_DBL(c[i], 7);
    CHECK_EQ_INT(mxi_matmul(ctx, c, 4, NULL, MXI_F32, false, 0, NULL, MXI_BF16, true, 0, 3, 3, 0, false, &diag), 0);
    for (int i = 0; i < 12; i++) CHECK_EQ_DBL(c[i], i % 4 == 3 ? 7 : 0);
    mxi_gemm_stats st;
    mxi_gemm_ctx_stats(ctx, &st);
    CHECK_EQ_INT(st.primitives_created, 0);
    mxi_gemm_ctx_destroy(ctx);
}

static void test_bad_arguments(void) {
    mxi_gemm_ctx *ctx = new_ctx();
    if (!ctx) return;
    float a[64] = {0}, b[64] = {0}, c[64] = {0};
    mx_diag diag = {{0}};
    CHECK_EQ_INT(mxi_matmul(NULL, c, 0, a, MXI_F32, false, 0, b, MXI_F32, false, 0, 2, 2, 2, false, &diag), MX_ENULL);
    CHECK_STR_CONTAINS(diag.msg, "context is NULL");
    CHECK_EQ_INT(mxi_matmul(ctx, c, 0, a, MXI_F32, false, 0, b, MXI_F32, false, 0, -1, 2, 2, false, &diag), MX_ESIZE);
    CHECK_STR_CONTAINS(diag.msg, "M=-1");
    CHECK_STR_CONTAINS(diag.msg, ">= 0");
    CHECK_EQ_INT(mxi_matmul(ctx, c, 0, a, MXI_F32, false, 0, b, MXI_F32, false, 0, 2, 2, -5, false, &diag), MX_ESIZE);
    CHECK_STR_CONTAINS(diag.msg, "K=-5");
    CHECK_EQ_INT(mxi_matmul(ctx, c, 0, a, (mxi_dtype)7, false, 0, b, MXI_F32, false, 0, 2, 2, 2, false, &diag), MX_EENUM);
    CHECK_STR_CONTAINS(diag.msg, "dtype of A is 7");
    CHECK_EQ_INT(mxi_matmul(ctx, c, 0, a, MXI_F32, false, 0, b, (mxi_dtype)-1, false, 0, 2, 2, 2, false, &diag), MX_EENUM);
    CHECK_STR_CONTAINS(diag.msg, "dtype of B is -1");
    // A is (K, M) = (3, 4) when transposed: lda must be >= 4
    CHECK_EQ_INT(mxi_matmul(ctx, c, 0, a, MXI_F32, true, 3, b, MXI_F32, false, 0, 4, 2, 3, false, &diag), MX_ESIZE);
    CHECK_STR_CONTAINS(diag.msg, "leading dim of A is 3");
    CHECK_STR_CONTAINS(diag.msg, ">= its row length 4");
    CHECK_EQ_INT(mxi_matmul(ctx, c, 0, a, MXI_F32, false, 0, b, MXI_F32, true, -2, 4, 2, 3, false, &diag), MX_ESIZE);
    CHECK_STR_CONTAINS(diag.msg, "leading dim of B is -2");
    CHECK_EQ_INT(mxi_matmul(ctx, c, 1, a, MXI_F32, false, 0, b, MXI_F32, false, 0, 4, 2, 3, false, &diag), MX_ESIZE);
    CHECK_STR_CONTAINS(diag.msg, "leading dim of C is 1");
    CHECK_EQ_INT(mxi_matmul(ctx, c, 0, a, MXI_F32, false, (int64_t)1 << 62, b, MXI_F32, false, 0, 8, 2, 3, false, &diag), MX_ESIZE);
    CHECK_STR_CONTAINS(diag.msg, "overflows");
    CHECK_EQ_INT(mxi_matmul(ctx, c, 0, NULL, MXI_F32, false, 0, b, MXI_F32, false, 0, 2, 2, 2, false, &diag), MX_ENULL);
    CHECK_STR_CONTAINS(diag.msg, "A is NULL");
    CHECK_EQ_INT(mxi_matmul(ctx, NULL, 0, a, MXI_F32, false, 0, b, MXI_F32, false, 0, 2, 2, 2, false, &diag), MX_ENULL);
    CHECK_STR_CONTAINS(diag.msg, "C is NULL");
    CHECK_EQ_INT(mxi_gemm_ctx_create(NULL, &diag), MX_ENULL);
    mxi_gemm_ctx_destroy(NULL);
    mxi_gemm_ctx_destroy(ctx);
}

/* oneDNN failures become mx_status codes with the status name. */
static void test_dnnl_errors(void) {
    mx_diag diag = {{0}};
    CHECK_EQ_INT(mxi_gemm_dnnl_error(&diag, dnnl_unimplemented, "creating X"), MX_EUNSUPPORTED);
    CHECK_STR_EQ(diag.msg, "creating X: oneDNN status unimplemented");
    CHECK_EQ_INT(mxi_gemm_dnnl_error(&diag, dnnl_out_of_memory, "running Y"), MX_ENOMEM);
    CHECK_STR_EQ(diag.msg, "running Y: oneDNN status out_of_memory");
    CHECK_EQ_INT(mxi_gemm_dnnl_error(&diag, dnnl_invalid_arguments, "Z"), MX_EINVAL);
    CHECK_STR_EQ(diag.msg, "Z: oneDNN status invalid_arguments");
    CHECK_EQ_INT(mxi_gemm_dnnl_error(NULL, dnnl_runtime_error, "W"), MX_EINVAL);
}

/* Context buffers for callers: grow-only, aligned. */
static void test_ctx_buffers(void) {
    mxi_gemm_ctx *ctx = new_ctx();
    if (!ctx) return;
    char *p = mxi_gemm_ctx_buffer(ctx, MXI_GEMM_SLOT_A, 100);
    CHECK(p != NULL);
    CHECK_EQ_INT((uintptr_t)p % 64, 0);
    CHECK(mxi_gemm_ctx_buffer(ctx, MXI_GEMM_SLOT_A, 50) == p);
    CHECK(mxi_gemm_ctx_buffer(ctx, MXI_GEMM_SLOT_B, 50) != p);
    CHECK(mxi_gemm_ctx_buffer(ctx, MXI_GEMM_SLOTS, 50) == NULL);
    CHECK(mxi_gemm_ctx_buffer(ctx, -1, 50) == NULL);
    mxi_gemm_ctx_destroy(ctx);
}

/* Every kernel's table lookups equal the definition y[i] = table[q[i]] (the low half for
 * lut16), every code, every length 0..70 (the partial last vector), nothing written past n. */
static void test_lut_equals_definition(void) {
    enum { N = 4096 + 70, GUARD = 8 };
    uint32_t table[256];
    for (int c = 0; c < 256; c++) table[c] = (uint32_t)rng_next();
    uint8_t *q = malloc(N);
    uint32_t *y32 = malloc((N + GUARD) * sizeof *y32);
    uint16_t *y16 = malloc((N + GUARD) * sizeof *y16);
    for (int64_t i = 0; i < N; i++) q[i] = i < 256 ? (uint8_t)i : (uint8_t)rng_next();
    for (int kid = MX_KERNEL_REF; mx_kernel_name((mx_kernel)kid); kid++) {
        if (!mx_kernel_available((mx_kernel)kid)) {
            printf("    kernel %s: not run (%s)\n", mx_kernel_name((mx_kernel)kid), mx_kernel_missing((mx_kernel)kid));
            continue;
        }
        const mxi_ops_kernels *k = mxi_ops_kernels_of((mx_kernel)kid);
        int before = mxt_current_failures();
        for (int64_t n = 0; n <= N; n = n < 70 ? n + 1 : n + N - 70) {   // 0..70, then N
            for (int64_t i = 0; i < n + GUARD; i++) y32[i] = 0xDEADBEEFu, y16[i] = 0xBEEF;
            k->lut32(y32, q, n, table);
            k->lut16(y16, q, n, table);
            for (int64_t i = 0; i < n; i++)
                if (y32[i] != table[q[i]] || y16[i] != (uint16_t)table[q[i]]) {
                    mxt_fail(__FILE__, __LINE__, "n %lld, element %lld (code %d): 0x%08x 0x%04x, table 0x%08x",
                             (long long)n, (long long)i, q[i], y32[i], y16[i], table[q[i]]);
                    break;
                }
            CHECK_EQ_HEX(y32[n], 0xDEADBEEFu);
            CHECK_EQ_HEX(y16[n], 0xBEEF);
        }
        printf("    kernel %s%s: %slookups equal the table\n", k->name,
               mxi_kernel_emulated((mx_kernel)kid) ? " (SIMDe emulation)" : "", mxt_current_failures() > before ? "FAILED: " : "");
    }
    free(q), free(y32), free(y16);
}

/* Every SIMD kernel's bf16 widening equals the reference bit for bit (every bf16 pattern,
 * odd sizes); each kernel the library has is reported by name, run or not. */
static void test_widen_fast_equals_reference(void) {
    int64_t dims[][3] = {{1, 1, 1}, {3, 7, 9}, {256, 256, 256}, {5, 17, 33}, {2, 8, 8}, {1, 31, 47}};
    for (int kid = MX_KERNEL_REF + 1; mx_kernel_name((mx_kernel)kid); kid++) {
        if (!mx_kernel_available((mx_kernel)kid)) {
            printf("    kernel %s: not run (%s)\n", mx_kernel_name((mx_kernel)kid), mx_kernel_missing((mx_kernel)kid));
            continue;
        }
        const mxi_ops_kernels *k = mxi_ops_kernels_of((mx_kernel)kid);
        int before = mxt_current_failures();
        for (size_t d = 0; d < sizeof dims / sizeof dims[0]; d++) {
            int64_t rows = dims[d][0] * 64, cols = dims[d][1], ld = dims[d][2];
            uint16_t *x = malloc((size_t)(rows * ld) * sizeof *x);
            float *y0 = malloc((size_t)(rows * cols) * sizeof *y0), *y1 = malloc((size_t)(rows * cols) * sizeof *y1);
            for (int64_t i = 0; i < rows * ld; i++) x[i] = (uint16_t)(i * 7919 + (int64_t)(rng_next() & 1));
            mxi_ops_kernels_ref.widen_bf16(y0, x, ld, rows, cols);
            k->widen_bf16(y1, x, ld, rows, cols);
            CHECK_MEM_EQ(y0, y1, (size_t)(rows * cols) * sizeof *y0);
            for (int64_t r = 0; r < rows; r++)   // and it is the top half of fp32, checked directly
                for (int64_t c = 0; c < cols; c++) {
                    uint32_t u;
                    memcpy(&u, &y0[r * cols + c], 4);
                    if (u != (uint32_t)x[r * ld + c] << 16) {
                        mxt_fail(__FILE__, __LINE__, "widen (%lld,%lld): 0x%08x", (long long)r, (long long)c, u);
                        r = rows;
                        break;
                    }
                }
            free(x);
            free(y0);
            free(y1);
        }
        printf("    kernel %s%s: %swidening equals the reference\n", k->name,
               mxi_kernel_emulated((mx_kernel)kid) ? " (SIMDe emulation)" : "", mxt_current_failures() > before ? "FAILED: " : "");
    }
}

static const mxt_test tests[] = {
    {"f32", test_f32},
    {"bf16", test_bf16},
    {"mixed", test_mixed},
    {"large", test_large},
    {"cache", test_cache},
    {"runtime_dims", test_runtime_dims},
    {"zero_sizes", test_zero_sizes},
    {"bad_arguments", test_bad_arguments},
    {"dnnl_errors", test_dnnl_errors},
    {"ctx_buffers", test_ctx_buffers},
    {"widen_fast_equals_reference", test_widen_fast_equals_reference},
    {"lut_equals_definition", test_lut_equals_definition},
};

int main(int argc, char **argv) { return MXT_RUN(tests, argc, argv); }
