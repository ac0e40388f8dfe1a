/* The GEMM of per-tensor scaled operands: decode both code tensors (exact) into context
 * buffers, one GEMM through oneDNN, then the two scales applied to the fp32 result. */
#include "ops/scaled_gemm.h"

#include <string.h>

#include "core/bits.h"
#include "core/diag.h"
#include "mxtrain/scaled.h"
#include "ops/ops_kernels.h"

/* Values of the 256 codes of elem, every NaN as the canonical one; false for an unknown elem. */
static bool value_table(float table[256], mx_elem elem) {
    const mx_elem_traits *t = elem == MX_HIF8 ? NULL : mx_elem_traits_of(elem);
    if (elem != MX_HIF8 && !t) return false;
    for (int c = 0; c < 256; c++) {
        float v = elem == MX_HIF8 ? mx_hif8_to_f32((uint8_t)c) : t->to_f32((uint8_t)c);
        table[c] = v != v ? mxi_bits_f32(MXI_CANONICAL_NAN) : v;
    }
    return true;
}

/* The values of x's codes into fp32 y or, when y16, bf16 y16 (exact: see scaled_gemm.h). */
static void decode(float *y, uint16_t *y16, const mxi_scaled_tensor *x, const float table[256]) {
    int64_t n = x->rows * x->cols;
    #pragma omp parallel for schedule(static) if (n > (1 << 16))
    for (int64_t i = 0; i < n; i++) {
        float v = table[x->q[i]];
        if (y16) y16[i] = (uint16_t)(mxi_f32_bits(v) >> 16);
        else y[i] = v;
    }
}

/* C (+)= fp32(fp32(sa[i] * sb[j]) * acc[i][j]) for a product with a vector of scales on
 * either side (scaled_gemm.h); acc is C itself when not accumulating. */
static void vector_scales(float *C, const float *acc, const mxi_scaled_tensor *A, const mxi_scaled_tensor *B,
                          int64_t M, int64_t N, bool accumulate) {
    #pragma omp parallel for schedule(static) if (M * N > (1 << 16))
    for (int64_t i = 0; i < M; i++) {
        float sa = A->vscale ? A->vscale[i] : A->scale_inv;
        for (int64_t j = 0; j < N; j++) {
            float t = (sa * (B->vscale ? B->vscale[j] : B->scale_inv)) * acc[i * N + j];
            C[i * N + j] = accumulate ? C[i * N + j] + t : t;
        }
    }
}

int mxi_scaled_gemm(mxi_gemm_ctx *ctx, const mxi_scaled_gemm_args *args, mx_diag *diag) {
    static const char fn[] = "mxi_scaled_gemm";
    if (!ctx || !args || !args->a || !args->b) return mxi_diag(diag, MX_ENULL, "%s: NULL argument", fn);
    const mxi_scaled_tensor *A = args->a, *B = args->b;
    int64_t M = args->trans_a ? A->cols : A->rows, K = args->trans_a ? A->rows : A->cols;
    int64_t Kb = args->trans_b ? B->cols : B->rows, N = args->trans_b ? B->rows : B->cols;
    if (A->rows < 0 || A->cols < 0 || B->rows < 0 || B->cols < 0 || K != Kb)
        return mxi_diag(diag, MX_ESIZE, "%s: op(A) is %lld x %lld, op(B) is %lld x %lld (allowed: sizes >= 0, equal "
                        "inner dims)", fn, (long long)M, (long long)K, (long long)Kb, (long long)N);
    float ta[256], tb[256];
    if (!value_table(ta, A->elem) || !value_table(tb, B->elem))
        return mxi_diag(diag, MX_EENUM, "%s: element format %d (allowed: MX_E4M3, MX_E5M2, MX_HIF8)", fn,
                        (int)(value_table(ta, A->elem) ? B->elem : A->elem));
    if (M == 0 || N == 0) return MX_OK;
    float *C = args->C;
    if (!C || (K > 0 && (!A->q || !B->q))) return mxi_diag(diag, MX_ENULL, "%s: NULL output or codes", fn);
    if (K == 0) {
        if (!args->accumulate) memset(C, 0, (size_t)(M * N) * sizeof *C);
        return MX_OK;
    }
    bool native = mxi_gemm_bf16_native(ctx);
    size_t ea = (size_t)(A->rows * A->cols), eb = (size_t)(B->rows * B->cols), w = native ? 2 : 4;
    void *a = mxi_gemm_ctx_buffer(ctx, native ? MXI_GEMM_SLOT_A16 : MXI_GEMM_SLOT_A, ea * w);
    void *b = mxi_gemm_ctx_buffer(ctx, native ? MXI_GEMM_SLOT_B16 : MXI_GEMM_SLOT_B, eb * w);
    // accumulating: the unscaled product goes to a buffer first, the scales applied on adding
    float *out = args->accumulate ? mxi_gemm_ctx_buffer(ctx, MXI_GEMM_SLOT_C, (size_t)(M * N) * sizeof(float)) : C;
    if (!a || !b || !out)
        return mxi_diag(diag, MX_ENOMEM, "%s: out of memory for the operands of a %lld x %lld x %lld product", fn,
                        (long long)M, (long long)N, (long long)K);
    decode(native ? NULL : a, native ? a : NULL, A, ta);
    decode(native ? NULL : b, native ? b : NULL, B, tb);
    mxi_dtype type = native ? MXI_BF16 : MXI_F32;
    mxi_matmul_args mm = {.C = out, .a = {.data = a, .type = type, .trans = args->trans_a},
                          .b = {.data = b, .type = type, .trans = args->trans_b}, .M = M, .N = N, .K = K,
                          .runtime = args->runtime};
    int rc = mxi_matmul_ex(ctx, &mm, diag);
    if (rc) return rc;
    if (A->vscale || B->vscale) {
        vector_scales(C, out, A, B, M, N, args->accumulate);
        return MX_OK;
    }
    float alpha = A->scale_inv * B->scale_inv;
    int64_t n = M * N;
    if (args->accumulate) {
        #pragma omp parallel for schedule(static) if (n > (1 << 16))
        for (int64_t i = 0; i < n; i++) {
            float t = alpha * out[i];
            C[i] = C[i] + t;
        }
    } else {
        #pragma omp parallel for schedule(static) if (n > (1 << 16))
        for (int64_t i = 0; i < n; i++) C[i] = alpha * C[i];
    }
    return MX_OK;
}
