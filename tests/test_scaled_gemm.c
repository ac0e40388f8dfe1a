/* The GEMM of per-tensor scaled operands (ops/scaled_gemm.h) against an oracle written here.
 *
 * The operands are random codes (NaN codes left out) of E4M3, E5M2 and HiF8; the oracle
 * decodes them from the formats' bit fields (OCP FP8; HiF8's dot prefix, sign-magnitude
 * exponent and tapered mantissa, arXiv 2409.16626), sums the exact products in long double,
 * and applies the scales as documented: alpha = fp32(sa * sb), C = fp32(alpha * acc), or
 * C0 + that when accumulating. The GEMM sums in fp32 in its own order, so the bound is
 * (K + 2) u * alpha * sum |products| with u = 2^-24, plus the final roundings. With vector
 * scales (the rowwise recipes) small integer codes make every sum exact, and the scales'
 * application is held bit for bit. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "harness.h"
#include "mxtrain/mx.h"
#include "mxtrain/scaled.h"
#include "ops/scaled_gemm.h"

static uint64_t rng_state = 0x452821E638D01377ull;

static long double fp8_value(uint8_t code, mx_elem elem) {
    int ebits = elem == MX_E4M3 ? 4 : 5, mbits = elem == MX_E4M3 ? 3 : 2, bias = elem == MX_E4M3 ? 7 : 15;
    int sign = code >> 7, e = (code >> mbits) & ((1 << ebits) - 1), m = code & ((1 << mbits) - 1);
    long double v = e == 0 ? ldexpl((long double)m, 1 - bias - mbits)
                           : ldexpl((long double)((1 << mbits) + m), e - bias - mbits);
    return sign ? -v : v;
}

/* HiF8 from the layout: after the sign, dot 11 / 10 / 01 give 4 / 3 / 2 exponent bits (a sign
 * bit, then |E| - 8 / 4 / 2) and 1 / 2 / 3 mantissa bits; 001: E = +-1, 3 bits; 0001: E = 0,
 * 3 bits; 0000: zero and the denormals 2^(M - 23). */
static long double hif8_value(uint8_t code) {
    int sign = code >> 7, c = code & 0x7F, mb, mag, e;
    if ((c & 0x60) == 0x60) mb = 1, mag = 3;
    else if ((c & 0x60) == 0x40) mb = 2, mag = 2;
    else if ((c & 0x60) == 0x20) mb = 3, mag = 1;
    else if ((c & 0x70) == 0x10) mb = 3, mag = 0;
    else if ((c & 0x78) == 0x08) mb = 3, mag = -1;
    else return c ? (sign ? -1 : 1) * ldexpl(1.0L, c - 23) : 0.0L;
    if (mag < 0) {
        e = 0;
    } else {
        int field = (c >> mb) & ((1 << (mag + 1)) - 1);
        e = (1 << mag) + (field & ((1 << mag) - 1));
        if (field >> mag) e = -e;
    }
    long double v = ldexpl(1.0L + (long double)(c & ((1 << mb) - 1)) / (1 << mb), e);
    return sign ? -v : v;
}

static long double value(uint8_t code, mx_elem elem) { return elem == MX_HIF8 ? hif8_value(code) : fp8_value(code, elem); }

/* A random code that is a finite number of elem. */
static uint8_t random_code(mx_elem elem) {
    for (;;) {
        uint8_t c = (uint8_t)(mxt_splitmix64(&rng_state) >> 56);
        long double v = value(c, elem);
        bool nan = elem == MX_E4M3 ? (c & 0x7F) == 0x7F : elem == MX_E5M2 ? ((c >> 2) & 31) == 31
                                                                         : c == 0x80 || (c & 0x7F) == 0x6F;
        if (!nan && isfinite(v)) return c;
    }
}

static void check_case(mxi_gemm_ctx *ctx, mx_elem ea, mx_elem eb, int64_t M, int64_t N, int64_t K, bool ta, bool tb,
                       bool accumulate) {
    uint8_t *qa = malloc((size_t)(M * K)), *qb = malloc((size_t)(K * N));
    float *C = malloc((size_t)(M * N) * sizeof *C), *C0 = malloc((size_t)(M * N) * sizeof *C0);
    for (int64_t i = 0; i < M * K; i++) qa[i] = random_code(ea);
    for (int64_t i = 0; i < K * N; i++) qb[i] = random_code(eb);
    for (int64_t i = 0; i < M * N; i++) C[i] = C0[i] = (float)(mxt_uniform(&rng_state) - 0.5);
    float sa = 0.0123f * (1.5f + (float)mxt_uniform(&rng_state)), sb = 3.7e-3f * (1.5f + (float)mxt_uniform(&rng_state));
    mxi_scaled_tensor A = {.q = qa, .rows = ta ? K : M, .cols = ta ? M : K, .elem = ea, .scale_inv = sa};
    mxi_scaled_tensor B = {.q = qb, .rows = tb ? N : K, .cols = tb ? K : N, .elem = eb, .scale_inv = sb};
    mxi_scaled_gemm_args args = {.C = C, .a = &A, .b = &B, .trans_a = ta, .trans_b = tb, .accumulate = accumulate};
    mx_diag diag;
    CHECK_EQ_INT(mxi_scaled_gemm(ctx, &args, &diag), 0);
    float alpha = sa * sb;
    int bad = 0;
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            long double acc = 0, mag = 0;
            for (int64_t k = 0; k < K; k++) {
                long double p = value(qa[ta ? k * M + i : i * K + k], ea) * value(qb[tb ? j * K + k : k * N + j], eb);
                acc += p, mag += fabsl(p);
            }
            long double want = (long double)alpha * acc + (accumulate ? C0[i * N + j] : 0);
            long double tol = (K + 4) * ldexpl(1.0L, -24) * (alpha * mag + fabsl(want)) + 1e-30L;
            if (fabsl((long double)C[i * N + j] - want) > tol && bad++ < 3)
                mxt_fail(__FILE__, __LINE__, "elems %d x %d, %lldx%lldx%lld%s%s%s: C[%lld,%lld] = %.9g, want %.9Lg (tol %.3Lg)",
                         ea, eb, (long long)M, (long long)N, (long long)K, ta ? " A^T" : "", tb ? " B^T" : "",
                         accumulate ? " +=" : "", (long long)i, (long long)j, C[i * N + j], want, tol);
        }
    free(qa), free(qb), free(C), free(C0);
}

static void test_against_oracle(void) {
    mxi_gemm_ctx *ctx = NULL;
    CHECK_EQ_INT(mxi_gemm_ctx_create(&ctx, NULL), 0);
    if (!ctx) return;
    const mx_elem pairs[][2] = {{MX_E4M3, MX_E4M3}, {MX_E5M2, MX_E4M3}, {MX_HIF8, MX_HIF8}};
    for (size_t p = 0; p < sizeof pairs / sizeof pairs[0]; p++) {
        check_case(ctx, pairs[p][0], pairs[p][1], 37, 45, 70, false, true, false);   // fprop: Y = X W^T
        check_case(ctx, pairs[p][0], pairs[p][1], 37, 70, 45, false, false, true);   // dgrad: dX += dY W
        check_case(ctx, pairs[p][0], pairs[p][1], 45, 70, 37, true, false, true);    // wgrad: dW += dY^T X
        check_case(ctx, pairs[p][0], pairs[p][1], 1, 1, 1, false, false, false);
    }
    mxi_gemm_ctx_destroy(ctx);
}

/* A random E4M3 code of an integer in [-16, 16] (all exact in E4M3): sums of their
 * products over a few hundred terms are exact in fp32 whatever the order, so the scales'
 * application can be checked bit for bit. */
static uint8_t small_int_code(void) {
    for (;;) {
        uint8_t c = (uint8_t)(mxt_splitmix64(&rng_state) >> 56);
        long double v = fp8_value(c, MX_E4M3);
        if ((c & 0x7F) != 0x7F && fabsl(v) <= 16 && v == floorl(v)) return c;
    }
}

/* Vector scales (rowwise recipes): C[i][j] = fp32(fp32(sa[i] * sb[j]) * acc), or
 * fp32(C0 + that), where a side without a vector uses its one scale. The oracle rounds each
 * step once from exact long double values. VSCALES_ANY are not powers of two, so another order
 * of the two multiplications would show; with powers of two the operands may go to the
 * product already scaled (scaled_gemm.h), which must give the same bits: VSCALES_POW2 lie in
 * the range where it does, VSCALES_TINY and VSCALES_HUGE outside it (their products would fall
 * below fp32's normal range, where bf16 products flush to zero, or sums overflow). */
typedef enum { VSCALES_ANY, VSCALES_POW2, VSCALES_TINY, VSCALES_HUGE } vector_scales;

static float vector_scale(vector_scales kind, int64_t i, int spread, int shift) {
    int e = (int)(i % spread) - shift;
    switch (kind) {
    case VSCALES_POW2: return ldexpf(1.0f, e);
    case VSCALES_TINY: return ldexpf(1.0f, e - 62);
    case VSCALES_HUGE: return ldexpf(1.0f, e + 56);
    default: return (float)(0.3 + mxt_uniform(&rng_state)) * ldexpf(1.0f, e);
    }
}

static void check_vector_case(mxi_gemm_ctx *ctx, int64_t M, int64_t N, int64_t K, bool ta, bool tb, bool accumulate,
                              bool va, bool vb, vector_scales kind, unsigned runtime) {
    uint8_t *qa = malloc((size_t)(M * K) + 1), *qb = malloc((size_t)(K * N) + 1);
    float *C = malloc((size_t)(M * N) * sizeof *C + 4), *C0 = malloc((size_t)(M * N) * sizeof *C0 + 4);
    float *sa = malloc((size_t)M * 4 + 4), *sb = malloc((size_t)N * 4 + 4);
    for (int64_t i = 0; i < M * K; i++) qa[i] = small_int_code();
    for (int64_t i = 0; i < K * N; i++) qb[i] = small_int_code();
    for (int64_t i = 0; i < M * N; i++) C[i] = C0[i] = (float)(mxt_uniform(&rng_state) - 0.5);
    for (int64_t i = 0; i < M; i++) sa[i] = vector_scale(kind, i, 9, 4);
    for (int64_t j = 0; j < N; j++) sb[j] = vector_scale(kind, j, 7, 3);
    mxi_scaled_tensor A = {.q = qa, .rows = ta ? K : M, .cols = ta ? M : K, .elem = MX_E4M3, .scale_inv = sa[0],
                           .vscale = va ? sa : NULL};
    mxi_scaled_tensor B = {.q = qb, .rows = tb ? N : K, .cols = tb ? K : N, .elem = MX_E4M3, .scale_inv = sb[0],
                           .vscale = vb ? sb : NULL};
    mxi_scaled_gemm_args args = {.C = C, .a = &A, .b = &B, .trans_a = ta, .trans_b = tb, .accumulate = accumulate,
                                 .runtime = runtime};
    mx_diag diag;
    CHECK_EQ_INT(mxi_scaled_gemm(ctx, &args, &diag), 0);
    int bad = 0;
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            long double acc = 0;
            for (int64_t k = 0; k < K; k++)
                acc += fp8_value(qa[ta ? k * M + i : i * K + k], MX_E4M3) * fp8_value(qb[tb ? j * K + k : k * N + j], MX_E4M3);
            float alpha = (float)((long double)(va ? sa[i] : sa[0]) * (vb ? sb[j] : sb[0]));
            float t = (float)((long double)alpha * acc);
            float want = accumulate ? (float)((long double)C0[i * N + j] + t) : t;
            if (C[i * N + j] != want && bad++ < 3)
                mxt_fail(__FILE__, __LINE__, "%lldx%lldx%lld%s%s%s vectors a%d b%d scales %d: C[%lld,%lld] = %.9g, "
                         "want %.9g", (long long)M, (long long)N, (long long)K, ta ? " A^T" : "", tb ? " B^T" : "",
                         accumulate ? " +=" : "", va, vb, (int)kind, (long long)i, (long long)j, C[i * N + j], want);
        }
    free(qa), free(qb), free(C), free(C0), free(sa), free(sb);
}

static void test_vector_scales(void) {
    mxi_gemm_ctx *ctx = NULL;
    CHECK_EQ_INT(mxi_gemm_ctx_create(&ctx, NULL), 0);
    if (!ctx) return;
    for (vector_scales kind = VSCALES_ANY; kind <= VSCALES_HUGE; kind++) {
        check_vector_case(ctx, 37, 45, 70, false, true, false, true, true, kind, 0);   // fprop: X rows, W rows
        check_vector_case(ctx, 37, 70, 45, false, false, true, true, true, kind, 0);   // dgrad: dY rows, W columns
        check_vector_case(ctx, 37, 70, 45, false, false, false, true, false, kind, 0); // dgrad, W per tensor
        check_vector_case(ctx, 45, 70, 37, true, false, true, true, true, kind, 0);    // wgrad: dY columns, X columns
        check_vector_case(ctx, 45, 70, 37, true, false, true, false, true, kind, 0);
        check_vector_case(ctx, 1, 1, 1, false, false, false, true, true, kind, 0);
        check_vector_case(ctx, 3, 1, 129, true, true, true, true, true, kind, 0);
        check_vector_case(ctx, 130, 32, 64, false, true, true, true, true, kind, 0);   // rows of 32 and 64, as k, v
        check_vector_case(ctx, 33, 40, 1000, false, true, true, true, true, kind, MXI_GEMM_RUNTIME_M);   // K in blocks
        // one scale a side (the per-tensor recipes), fixed and run-time dims, and a K long
        // enough for oneDNN to cut into blocks: the scales must multiply the whole sum once
        // (oneDNN's own output scale does not: it fails the K = 1000 cases)
        check_vector_case(ctx, 37, 45, 70, false, true, false, false, false, kind, 0);
        check_vector_case(ctx, 37, 45, 70, false, true, false, false, false, kind, MXI_GEMM_RUNTIME_M);
        check_vector_case(ctx, 45, 70, 37, true, false, true, false, false, kind, MXI_GEMM_RUNTIME_K);
        check_vector_case(ctx, 33, 40, 1000, false, false, false, false, false, kind, 0);
        check_vector_case(ctx, 33, 40, 1000, false, true, false, false, false, kind, MXI_GEMM_RUNTIME_M);
    }
    mxi_gemm_ctx_destroy(ctx);
}

/* Block scales (the blockwise recipe): op(A) op(B) on the dequantized operands, each element
 * fp32(value * its block's scale) (exact with power-of-two scales), summed in fp32 in the
 * GEMM's order: within (K + 4) u of the exact long-double sum of those elements' products.
 * Blocks of each operand's own layout, partial at the edges; pow2 scales inside and outside
 * the range where the operands go as bf16, and fp32 scales (each element rounded once). */
typedef enum { SCALES_POW2, SCALES_POW2_WIDE, SCALES_FP32 } scale_kind;

static float block_scale(scale_kind kind) {
    int e = (int)(mxt_splitmix64(&rng_state) % 21) - 10;
    if (kind != SCALES_FP32) return ldexpf(1.0f, e);
    return (float)(0.5 + mxt_uniform(&rng_state)) * ldexpf(1.0f, e);
}

/* The dequantized element (i, j) of a (rows, cols) operand in br x bc blocks. */
static long double block_elem(const uint8_t *q, const float *s, int64_t cols, int64_t br, int64_t bc, int64_t i,
                              int64_t j) {
    int64_t nbc = (cols + bc - 1) / bc;
    return (float)(fp8_value(q[i * cols + j], MX_E4M3) * (long double)s[(i / br) * nbc + j / bc]);
}

static void check_block_case(mxi_gemm_ctx *ctx, int64_t M, int64_t N, int64_t K, bool ta, bool tb, bool accumulate,
                             const int64_t ba[2], const int64_t bb[2], scale_kind kind) {
    int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
    int64_t nsa = ((ar + ba[0] - 1) / ba[0]) * ((ac + ba[1] - 1) / ba[1]), nsb = ((br + bb[0] - 1) / bb[0]) * ((bc + bb[1] - 1) / bb[1]);
    uint8_t *qa = malloc((size_t)(M * K)), *qb = malloc((size_t)(K * N));
    float *sa = malloc((size_t)nsa * 4), *sb = malloc((size_t)nsb * 4);
    float *C = malloc((size_t)(M * N) * sizeof *C), *C0 = malloc((size_t)(M * N) * sizeof *C0);
    for (int64_t i = 0; i < M * K; i++) qa[i] = random_code(MX_E4M3);
    for (int64_t i = 0; i < K * N; i++) qb[i] = random_code(MX_E4M3);
    // wide: A's scales about 2^-110 (some below 2^-117: fp32 operands), B's about 2^100
    for (int64_t i = 0; i < nsa; i++) sa[i] = ldexpf(block_scale(kind), kind == SCALES_POW2_WIDE ? -110 : 0);
    for (int64_t i = 0; i < nsb; i++) sb[i] = ldexpf(block_scale(kind), kind == SCALES_POW2_WIDE ? 100 : 0);
    for (int64_t i = 0; i < M * N; i++) C[i] = C0[i] = (float)(mxt_uniform(&rng_state) - 0.5);
    mxi_scaled_tensor A = {.q = qa, .rows = ar, .cols = ac, .elem = MX_E4M3, .bscale = sa, .brows = ba[0], .bcols = ba[1]};
    mxi_scaled_tensor B = {.q = qb, .rows = br, .cols = bc, .elem = MX_E4M3, .bscale = sb, .brows = bb[0], .bcols = bb[1]};
    mxi_scaled_gemm_args args = {.C = C, .a = &A, .b = &B, .trans_a = ta, .trans_b = tb, .accumulate = accumulate};
    mx_diag diag;
    CHECK_EQ_INT(mxi_scaled_gemm(ctx, &args, &diag), 0);
    int bad = 0;
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            long double acc = 0, mag = 0;
            for (int64_t k = 0; k < K; k++) {
                long double x = ta ? block_elem(qa, sa, ac, ba[0], ba[1], k, i) : block_elem(qa, sa, ac, ba[0], ba[1], i, k);
                long double y = tb ? block_elem(qb, sb, bc, bb[0], bb[1], j, k) : block_elem(qb, sb, bc, bb[0], bb[1], k, j);
                acc += x * y, mag += fabsl(x * y);
            }
            long double want = acc + (accumulate ? C0[i * N + j] : 0);
            long double tol = (K + 4) * ldexpl(1.0L, -24) * (mag + fabsl(want)) + 1e-30L;
            if (fabsl((long double)C[i * N + j] - want) > tol && bad++ < 3)
                mxt_fail(__FILE__, __LINE__, "blocks %lldx%lld / %lldx%lld, scales %d, %lldx%lldx%lld%s%s%s: C[%lld,%lld] = "
                         "%.9g, want %.9Lg (tol %.3Lg)", (long long)ba[0], (long long)ba[1], (long long)bb[0],
                         (long long)bb[1], kind, (long long)M, (long long)N, (long long)K, ta ? " A^T" : "",
                         tb ? " B^T" : "", accumulate ? " +=" : "", (long long)i, (long long)j, C[i * N + j], want, tol);
        }
    free(qa), free(qb), free(sa), free(sb), free(C), free(C0);
}

static void test_block_scales(void) {
    mxi_gemm_ctx *ctx = NULL;
    CHECK_EQ_INT(mxi_gemm_ctx_create(&ctx, NULL), 0);
    if (!ctx) return;
    static const int64_t row[2] = {1, 128}, tile[2] = {128, 128}, col[2] = {128, 1};
    for (int kind = 0; kind < 3; kind++) {
        check_block_case(ctx, 37, 150, 300, false, true, false, row, tile, (scale_kind)kind);    // fprop: X W^T
        check_block_case(ctx, 37, 300, 150, false, false, true, row, tile, (scale_kind)kind);    // dgrad: dX += dY W
        check_block_case(ctx, 150, 300, 139, true, false, true, col, col, (scale_kind)kind);     // wgrad: dW += dY^T X
        check_block_case(ctx, 1, 1, 1, false, true, false, row, tile, (scale_kind)kind);
        check_block_case(ctx, 37, 150, 64, false, true, false, row, tile, (scale_kind)kind);     // a block a row, 64 wide
        check_block_case(ctx, 37, 70, 128, false, false, true, row, tile, (scale_kind)kind);    // and 128 wide
        check_block_case(ctx, 300, 40, 260, false, true, false, row, tile, (scale_kind)kind);   // operands in pieces
        check_block_case(ctx, 300, 40, 260, true, false, true, col, col, (scale_kind)kind);
    }
    // block scales on both operands or neither, FP8 codes only, blocks of at least one element
    uint8_t q = 0x38;
    float s = 1.0f, c = 0.0f;
    mxi_scaled_tensor A = {.q = &q, .rows = 1, .cols = 1, .elem = MX_E4M3, .bscale = &s, .brows = 1, .bcols = 128};
    mxi_scaled_tensor B = {.q = &q, .rows = 1, .cols = 1, .elem = MX_E4M3, .scale_inv = 1.0f};
    mxi_scaled_gemm_args args = {.C = &c, .a = &A, .b = &B};
    mx_diag diag;
    CHECK_EQ_INT(mxi_scaled_gemm(ctx, &args, &diag), MX_EENUM);
    CHECK_STR_CONTAINS(diag.msg, "block scales on one operand only");
    B.bscale = &s, B.brows = 128, B.bcols = 0;
    CHECK_EQ_INT(mxi_scaled_gemm(ctx, &args, &diag), MX_ESIZE);
    B.bcols = 128, B.elem = MX_HIF8;
    CHECK_EQ_INT(mxi_scaled_gemm(ctx, &args, &diag), MX_EENUM);
    B.elem = MX_E4M3;
    CHECK_EQ_INT(mxi_scaled_gemm(ctx, &args, &diag), 0);
    CHECK_EQ_DBL(c, 1.0);
    mxi_gemm_ctx_destroy(ctx);
}

/* The HiF8 decoder here agrees with the library's on every code (both written from the layout). */
static void test_hif8_values(void) {
    for (int c = 0; c < 256; c++) {
        if (c == 0x80 || (c & 0x7F) == 0x6F) continue;
        CHECK_EQ_DBL((double)hif8_value((uint8_t)c), (double)mx_hif8_to_f32((uint8_t)c));
    }
}

static const mxt_test tests[] = {
    {"scaled_gemm_against_oracle", test_against_oracle},
    {"scaled_gemm_hif8_values", test_hif8_values},
    {"scaled_gemm_vector_scales", test_vector_scales},
    {"scaled_gemm_block_scales", test_block_scales},
};

int main(int argc, char **argv) { return MXT_RUN(tests, argc, argv); }
