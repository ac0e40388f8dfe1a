/* The MX GEMM: dequantize both MX planes (exact) into context buffers, then one GEMM through
 * oneDNN: bf16 where oneDNN multiplies bf16 natively (AVX512_BF16, AMX), else fp32. */
#include <stdio.h>

#include "core/bits.h"
#include "core/diag.h"
#include "ops/mx_gemm.h"
#include "ops/ops_kernels.h"

/* ---- plane checks ---- */

static int check_plane(const char *fn, const char *name, const mxi_mx_plane *p, mx_diag *diag) {
    if (!p) return mxi_diag(diag, MX_ENULL, "%s: plane %s is NULL", fn, name);
    if (p->rows < 0 || p->cols < 0)
        return mxi_diag(diag, MX_ESIZE, "%s: plane %s is %lld x %lld; allowed: sizes >= 0",
                        fn, name, (long long)p->rows, (long long)p->cols);
    if (p->rows > 0 && (p->cols > INT64_MAX / p->rows || (uint64_t)(p->rows * p->cols) > SIZE_MAX / sizeof(float)))
        return mxi_diag(diag, MX_ESIZE, "%s: plane %s of %lld x %lld elements overflows",
                        fn, name, (long long)p->rows, (long long)p->cols);
    if (p->axis != MX_ROWWISE && p->axis != MX_COLWISE)
        return mxi_diag(diag, MX_EENUM, "%s: plane %s has axis %d; allowed: MX_ROWWISE, MX_COLWISE",
                        fn, name, (int)p->axis);
    if (!mx_elem_traits_of(p->elem))
        return mxi_diag(diag, MX_EENUM, "%s: plane %s has element format %d; allowed: MX_E4M3, MX_E5M2",
                        fn, name, (int)p->elem);
    if (p->rows > 0 && p->cols > 0 && (!p->q || !p->scales))
        return mxi_diag(diag, MX_ENULL, "%s: plane %s (%lld x %lld) has NULL %s", fn, name,
                        (long long)p->rows, (long long)p->cols, !p->q ? "elements" : "scales");
    return MX_OK;
}

static const char *axis_name(mx_axis a) { return a == MX_ROWWISE ? "rowwise" : "colwise"; }

/* ---- dequantize ---- */

enum { MIN_ELEMENTS_PER_THREAD = 1 << 16 };

/* No argument checks: p was checked, y holds rows*cols floats. With y16 the values go to
 * y16 as bf16 instead, rounded in the kernel's registers (exact but where a product with an
 * extreme scale falls below bf16's normal range: an MX value has at most 3 mantissa bits,
 * SPEC §4). */
static void dequantize_to(float *y, uint16_t *y16, const mxi_mx_plane *p) {
    if (p->rows == 0 || p->cols == 0) return;
    mxi_dequant_job job = {.p = p, .values = mxi_code_values_of(p->elem), .y = y, .y16 = y16};
    const mxi_ops_kernels *k = mxi_ops_kernels_active();
    // tasks of whole 32-row strips, so a colwise strip's scales are read by one thread
    int64_t strip = MX_BLOCK * p->cols;
    int64_t rows_per_task = MX_BLOCK * ((MIN_ELEMENTS_PER_THREAD + strip - 1) / strip);
    int64_t tasks = (p->rows + rows_per_task - 1) / rows_per_task;
    #pragma omp parallel for schedule(static) if (tasks > 1)
    for (int64_t t = 0; t < tasks; t++) {
        int64_t r0 = t * rows_per_task, r1 = r0 + rows_per_task < p->rows ? r0 + rows_per_task : p->rows;
        k->dequant_rows(&job, r0, r1);
    }
}

static void dequantize(float *y, const mxi_mx_plane *p) { dequantize_to(y, NULL, p); }

int mxi_mx_dequantize(float *y, const mxi_mx_plane *p) {
    int rc = check_plane("mxi_mx_dequantize", "p", p, NULL);
    if (rc) return rc;
    if (!y && p->rows > 0 && p->cols > 0) return MX_ENULL;
    dequantize(y, p);
    return MX_OK;
}

/* ---- the GEMM ---- */

int mxi_mx_gemm(mxi_gemm_ctx *ctx, float *C, int64_t ldc,
                const mxi_mx_plane *A, bool trans_a,
                const mxi_mx_plane *B, bool trans_b, bool accumulate, mx_diag *diag) {
    mxi_mx_gemm_args args = {.C = C, .ldc = ldc, .a = A, .b = B, .trans_a = trans_a, .trans_b = trans_b,
                             .accumulate = accumulate};
    return mxi_mx_gemm_ex(ctx, &args, diag);
}

int mxi_mx_gemm_ex(mxi_gemm_ctx *ctx, const mxi_mx_gemm_args *args, mx_diag *diag) {
    static const char fn[] = "mxi_mx_gemm";
    int rc;
    if (!ctx || !args) return mxi_diag(diag, MX_ENULL, "%s: %s is NULL", fn, !ctx ? "context" : "args");
    unsigned runtime = args->runtime;
    float *C = args->C;
    int64_t ldc = args->ldc;
    const mxi_mx_plane *A = args->a, *B = args->b;
    bool trans_a = args->trans_a, trans_b = args->trans_b, accumulate = args->accumulate;
    if ((rc = check_plane(fn, "A", A, diag)) || (rc = check_plane(fn, "B", B, diag))) return rc;
    // op(A) is (M, K), op(B) is (K, N); blocks must run along K in both.
    int64_t M = trans_a ? A->cols : A->rows, K = trans_a ? A->rows : A->cols;
    int64_t Kb = trans_b ? B->cols : B->rows, N = trans_b ? B->rows : B->cols;
    if (K != Kb)
        return mxi_diag(diag, MX_ESIZE, "%s: inner dims differ: op(A) is %lld x %lld, op(B) is %lld x %lld",
                        fn, (long long)M, (long long)K, (long long)Kb, (long long)N);
    mx_axis a_need = trans_a ? MX_COLWISE : MX_ROWWISE, b_need = trans_b ? MX_ROWWISE : MX_COLWISE;
    if (A->axis != a_need)
        return mxi_diag(diag, MX_EINVAL, "%s: plane A (%lld x %lld%s) is %s, but its blocks must run along the "
                        "contraction dim K=%lld: allowed: %s", fn, (long long)A->rows, (long long)A->cols,
                        trans_a ? ", transposed" : "", axis_name(A->axis), (long long)K, axis_name(a_need));
    if (B->axis != b_need)
        return mxi_diag(diag, MX_EINVAL, "%s: plane B (%lld x %lld%s) is %s, but its blocks must run along the "
                        "contraction dim K=%lld: allowed: %s", fn, (long long)B->rows, (long long)B->cols,
                        trans_b ? ", transposed" : "", axis_name(B->axis), (long long)K, axis_name(b_need));
    if (ldc != 0 && ldc < N)
        return mxi_diag(diag, MX_ESIZE, "%s: leading dim of C is %lld; allowed: 0 (dense) or >= N=%lld",
                        fn, (long long)ldc, (long long)N);
    if (M == 0 || N == 0) return MX_OK;
    if (!C) return mxi_diag(diag, MX_ENULL, "%s: C is NULL for a %lld x %lld product", fn, (long long)M, (long long)N);
    if (K == 0) return mxi_matmul(ctx, C, ldc, NULL, MXI_F32, trans_a, 0, NULL, MXI_F32, trans_b, 0, M, N, 0, accumulate, diag);

    if (mxi_gemm_bf16_native(ctx)) {   // the bf16 matmul is the fast one here: bf16 operands
        uint16_t *a16 = mxi_gemm_ctx_buffer(ctx, MXI_GEMM_SLOT_A16, (size_t)(A->rows * A->cols) * sizeof(uint16_t));
        uint16_t *b16 = mxi_gemm_ctx_buffer(ctx, MXI_GEMM_SLOT_B16, (size_t)(B->rows * B->cols) * sizeof(uint16_t));
        if (!a16 || !b16)
            return mxi_diag(diag, MX_ENOMEM, "%s: out of memory for the bf16 operands (%lld x %lld and %lld x %lld)",
                            fn, (long long)A->rows, (long long)A->cols, (long long)B->rows, (long long)B->cols);
        dequantize_to(NULL, a16, A);
        dequantize_to(NULL, b16, B);
        mxi_matmul_args bf = {.C = C, .ldc = ldc, .a = {a16, MXI_BF16, trans_a, 0}, .b = {b16, MXI_BF16, trans_b, 0},
                              .M = M, .N = N, .K = K, .accumulate = accumulate, .runtime = runtime};
        return mxi_matmul_ex(ctx, &bf, diag);
    }
    float *a = mxi_gemm_ctx_buffer(ctx, MXI_GEMM_SLOT_A, (size_t)(A->rows * A->cols) * sizeof(float));
    float *b = mxi_gemm_ctx_buffer(ctx, MXI_GEMM_SLOT_B, (size_t)(B->rows * B->cols) * sizeof(float));
    if (!a || !b)
        return mxi_diag(diag, MX_ENOMEM, "%s: out of memory dequantizing %lld x %lld and %lld x %lld planes",
                        fn, (long long)A->rows, (long long)A->cols, (long long)B->rows, (long long)B->cols);
    dequantize(a, A);   // (A->rows, A->cols) fp32, same layout as the plane
    dequantize(b, B);   // (B->rows, B->cols)
    mxi_matmul_args f32 = {.C = C, .ldc = ldc, .a = {a, MXI_F32, trans_a, 0}, .b = {b, MXI_F32, trans_b, 0},
                           .M = M, .N = N, .K = K, .accumulate = accumulate, .runtime = runtime};
    return mxi_matmul_ex(ctx, &f32, diag);
}

int mxi_mx_linear_forward(mxi_gemm_ctx *ctx, float *Y, const mxi_mx_plane *X_row,
                          const mxi_mx_plane *W_row, mx_diag *diag) {
    return mxi_mx_gemm(ctx, Y, 0, X_row, false, W_row, true, false, diag);
}

int mxi_mx_linear_dinput(mxi_gemm_ctx *ctx, float *dX, const mxi_mx_plane *dY_row,
                         const mxi_mx_plane *W_col, bool accumulate, mx_diag *diag) {
    return mxi_mx_gemm(ctx, dX, 0, dY_row, false, W_col, false, accumulate, diag);
}

int mxi_mx_linear_dweight(mxi_gemm_ctx *ctx, float *dW, const mxi_mx_plane *dY_col,
                          const mxi_mx_plane *X_col, bool accumulate, mx_diag *diag) {
    return mxi_mx_gemm(ctx, dW, 0, dY_col, true, X_col, false, accumulate, diag);
}
