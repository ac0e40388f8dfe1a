/* Internal: the MX GEMM (SPEC §4, §5). Both operands are MX planes (FP8 element codes plus
 * one E8M0 scale per 32-element block, layouts of include/mxtrain/mx.h); the product
 * contracts over the block axis of each plane and accumulates in fp32.
 *
 * It dequantizes both planes into buffers of the GEMM context and calls mxi_matmul, with
 * bf16 operands where oneDNN multiplies bf16 natively (mxi_gemm_bf16_native: AVX512_BF16,
 * AMX), else with fp32 ones, since there oneDNN would only widen bf16 to fp32 again
 * (docs/gemm.md). Either way the products accumulate in fp32. Dequantizing is exact for
 * every plane the quantizer produces (an FP8 value has at most 4 significant bits; times a
 * power of two it is an fp32 unless it overflows, and a bf16 too unless an extreme scale
 * puts it below bf16's normal range, where it is rounded to nearest even), so the result is
 * the exact MX product accumulated in fp32.
 *
 * The linear layer Y = X W^T, X (M, K) and W (N, K) (M = rows, K = in, N = out in the
 * legend of model/linear.h), needs three GEMMs:
 *   forward      Y  = X W^T    X rowwise (along K),  W rowwise (along K)
 *   input grad   dX = dY W     dY rowwise (along N), W colwise (along N)
 *   weight grad  dW = dY^T X   dY colwise (along M), X colwise (along M)
 */
#ifndef MXI_MX_GEMM_H
#define MXI_MX_GEMM_H

#include <stdbool.h>
#include <stdint.h>

#include "mxtrain/mx.h"
#include "ops/gemm.h"

/* One MX plane as produced by mx_quantize_* (dense, row-major). */
typedef struct {
    const uint8_t *q;       // (rows, cols) FP8 element codes
    const uint8_t *scales;  // rowwise: (rows, ceil(cols/32)); colwise: (ceil(rows/32), cols)
    int64_t rows, cols;
    mx_axis axis;
    mx_elem elem;
} mxi_mx_plane;

/* C (M, N) = op(A) op(B), or C += op(A) op(B) when accumulate.
 *   A plane: (M, K), or (K, M) when trans_a; its blocks must run along K, so its axis
 *            must be MX_ROWWISE (MX_COLWISE when trans_a)
 *   B plane: (K, N), or (N, K) when trans_b; blocks along K: MX_COLWISE (MX_ROWWISE when
 *            trans_b)
 *   C: (M, N) row-major, leading dim ldc (0 means N)
 * A NaN scale (0xFF) or a NaN element code makes the products it enters NaN.
 * Returns 0, MX_ENULL, MX_ESIZE (negative sizes, inner dims that differ, ldc < N),
 * MX_EENUM (axis or element format), MX_EINVAL (a plane's blocks do not run along the
 * contraction dim), MX_ENOMEM, or an mxi_matmul error; diag says which operand and why. */
int mxi_mx_gemm(mxi_gemm_ctx *ctx, float *C, int64_t ldc,
                const mxi_mx_plane *A, bool trans_a,
                const mxi_mx_plane *B, bool trans_b, bool accumulate, mx_diag *diag);

/* A product for mxi_mx_gemm_ex: mxi_mx_gemm's arguments, plus the dims left to run time
 * (MXI_GEMM_RUNTIME_* of gemm.h, for grouped GEMMs whose group sizes vary: see
 * mxi_matmul_ex). */
typedef struct {
    float *C;
    int64_t ldc;
    const mxi_mx_plane *a, *b;
    bool trans_a, trans_b;
    bool accumulate;
    unsigned runtime;
} mxi_mx_gemm_args;

int mxi_mx_gemm_ex(mxi_gemm_ctx *ctx, const mxi_mx_gemm_args *args, mx_diag *diag);

/* The three GEMMs of a linear layer, with their plane layouts checked by mxi_mx_gemm.
 * Sizes come from the planes. */
// Y (M, N) = X W^T;  X (M, K) rowwise, W (N, K) rowwise
int mxi_mx_linear_forward(mxi_gemm_ctx *ctx, float *Y, const mxi_mx_plane *X_row,
                          const mxi_mx_plane *W_row, mx_diag *diag);
// dX (M, K) (+)= dY W;  dY (M, N) rowwise, W (N, K) colwise
int mxi_mx_linear_dinput(mxi_gemm_ctx *ctx, float *dX, const mxi_mx_plane *dY_row,
                         const mxi_mx_plane *W_col, bool accumulate, mx_diag *diag);
// dW (N, K) (+)= dY^T X;  dY (M, N) colwise, X (M, K) colwise
int mxi_mx_linear_dweight(mxi_gemm_ctx *ctx, float *dW, const mxi_mx_plane *dY_col,
                          const mxi_mx_plane *X_col, bool accumulate, mx_diag *diag);

/* Dequantize a plane to fp32 y (rows, cols), dense: y = value(q) * 2^(scale-127), with
 * every NaN (NaN code or NaN scale) written as the canonical quiet NaN 0x7FC00000. Runs the
 * kernel mx_kernel_active() names (the scalar reference, AVX2 or AVX-512; bit-identical),
 * split across OpenMP threads when large. Returns 0, MX_ENULL, MX_ESIZE or MX_EENUM. */
int mxi_mx_dequantize(float *y, const mxi_mx_plane *p);

#endif
