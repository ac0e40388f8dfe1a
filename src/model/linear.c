/* Linear layers over mxi_matmul. At bf16 compute precision the operands are rounded to
 * bf16 (round-to-nearest-even) into context buffers first; products accumulate in fp32. */
#include "model/linear.h"

#include <stdlib.h>
#include <string.h>

#include "ops/gemm.h"

struct mxi_linear_ctx {
    mxi_gemm_ctx *gemm;
    bool bf16;
    uint16_t *buf[3];      // bf16 copies of the two operands (grow-only)
    size_t cap[3];         // elements
    int error;             // first failure, sticky
    mx_diag diag;
};

int mxi_linear_ctx_create(mxi_linear_ctx **out, bool bf16) {
    mxi_linear_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return MX_ENOMEM;
    int rc = mxi_gemm_ctx_create(&ctx->gemm, &ctx->diag);
    if (rc) {
        free(ctx);
        return rc;
    }
    ctx->bf16 = bf16;
    *out = ctx;
    return MX_OK;
}

void mxi_linear_ctx_free(mxi_linear_ctx *ctx) {
    if (!ctx) return;
    mxi_gemm_ctx_destroy(ctx->gemm);
    for (int i = 0; i < 3; i++) free(ctx->buf[i]);
    free(ctx);
}

int mxi_linear_ctx_error(const mxi_linear_ctx *ctx, mx_diag *diag) {
    if (ctx->error && diag) *diag = ctx->diag;
    return ctx->error;
}

static int fail(mxi_linear_ctx *ctx, int rc) {
    if (!ctx->error) ctx->error = rc;
    return rc;
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40);   // quiet NaN
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1)) >> 16);                   // nearest even
}

/* A bf16 copy of x (n elements) in buffer slot; NULL when out of memory. */
static const uint16_t *to_bf16(mxi_linear_ctx *ctx, int slot, const float *x, int64_t n) {
    if ((size_t)n > ctx->cap[slot]) {
        free(ctx->buf[slot]);
        ctx->buf[slot] = malloc((size_t)n * sizeof(uint16_t));
        ctx->cap[slot] = ctx->buf[slot] ? (size_t)n : 0;
        if (!ctx->buf[slot]) return NULL;
    }
    uint16_t *b = ctx->buf[slot];
    #pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; i++) b[i] = f32_to_bf16(x[i]);
    return b;
}

/* C (M, N) = op(A) op(B) with both operands at the compute precision. */
static int matmul(mxi_linear_ctx *ctx, float *C, const float *A, bool ta, int64_t a_elems, const float *Bm, bool tb,
                  int64_t b_elems, int64_t M, int64_t N, int64_t K, bool accumulate) {
    const void *a = A, *b = Bm;
    mxi_dtype type = MXI_F32;
    if (ctx->bf16) {
        a = to_bf16(ctx, 0, A, a_elems);
        b = to_bf16(ctx, 1, Bm, b_elems);
        if (!a || !b) return fail(ctx, MX_ENOMEM);
        type = MXI_BF16;
    }
    int rc = mxi_matmul(ctx->gemm, C, 0, a, type, ta, 0, b, type, tb, 0, M, N, K, accumulate, &ctx->diag);
    return rc ? fail(ctx, rc) : MX_OK;
}

int linear_forward(mxi_linear_ctx *ctx, float *out, const float *inp, const float *w, const float *b, int64_t M,
                   int64_t K, int64_t N) {
    int rc = matmul(ctx, out, inp, false, M * K, w, true, N * K, M, N, K, false);
    if (rc || !b) return rc;
    #pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < M; r++)
        for (int64_t j = 0; j < N; j++) out[r * N + j] += b[j];
    return MX_OK;
}

int linear_backward(mxi_linear_ctx *ctx, float *dinp, bool accumulate, float *dw, float *db, const float *dout,
                    const float *inp, const float *w, int64_t M, int64_t K, int64_t N) {
    int rc = matmul(ctx, dw, dout, true, M * N, inp, false, M * K, N, K, M, true);   // dw += dout^T inp
    if (!rc && dinp) rc = matmul(ctx, dinp, dout, false, M * N, w, false, N * K, M, K, N, accumulate);
    if (rc || !db) return rc;
    #pragma omp parallel for schedule(static)
    for (int64_t j = 0; j < N; j++) {
        float acc = 0.0f;
        for (int64_t r = 0; r < M; r++) acc += dout[r * N + j];
        db[j] += acc;
    }
    return MX_OK;
}
