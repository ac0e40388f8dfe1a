/* Internal: the GEMM of per-tensor scaled operands (the tensorwise FP8 and HiF8 recipes,
 * docs/quantization-plan.md). Each operand is a tensor of 8-bit codes (E4M3, E5M2 or HiF8)
 * with one fp32 dequantization scale; the product runs on the codes' values and its fp32
 * accumulator is multiplied by the two scales after, as TransformerEngine's FP8 GEMM applies
 * scale_inv_a * scale_inv_b as cuBLASLt's alpha:
 *   alpha = fp32(scale_inv_a * scale_inv_b),  C = fp32(alpha * acc)  or  C = fp32(C + fp32(alpha * acc)).
 * The codes' values are exact in bf16 (FP8: at most 4 significant bits in 2^-16..57344;
 * HiF8: at most 4 in 2^-22..32768), so the operands go to oneDNN as bf16 where it multiplies
 * bf16 natively and as fp32 elsewhere, as the MX GEMM does (ops/mx_gemm.h); either way the
 * products accumulate in fp32.
 *
 * With a vector of scales on either side (torchao's rowwise recipes) each output element has
 * its own: C[i][j] = fp32(fp32(sa[i] * sb[j]) * acc[i][j]), sa[i] the scale of op(A)'s row i
 * (or its one scale), sb[j] that of op(B)'s column j, as torchao applies them after a
 * product of unscaled codes when it does not use fast accumulation (float8_ops.py,
 * addmm_float8_unwrapped's post_inverse_scale); its fast-accumulation product (torch._scaled_mm's
 * rowwise kernel) computes fp32(fp32(acc * sa[i]) * sb[j]), the same value whenever the
 * scales are powers of two and nothing overflows or falls below fp32's normal range. Where
 * oneDNN multiplies bf16 natively and every line scale is a power of two in the range where
 * each partial sum stays normal (scaled_gemm.c, pow2_sums_exact), the operands go to the
 * product already scaled and C is its result: the same bits, without the scales' pass.
 *
 * With block scales (DeepSeek-V3's and TE Float8BlockScaling's blockwise recipe: one fp32
 * scale per 1x128, 128x128 or 128x1 block) the operands are dequantized first, each element
 * to fp32(value * scale of its block), and the product runs on those values with fp32 sums.
 * With power-of-two scales every such element is exact (4 significant bits), in bf16 too, so
 * the operands go as bf16 where oneDNN multiplies bf16 natively and every scale lies in
 * [2^-117, 2^118] (a nonzero element then stays a normal bf16), as fp32 elsewhere; either way
 * C[i][j] is the exact sum of the exact products sa*sb*qa*qb, rounded as fp32 sums round: the
 * value DeepGEMM's per-128-K partial sums promoted in fp32 give, up to the order of the
 * sums. With fp32 scales the dequantized elements are rounded to fp32 once each. An operand
 * may come as those bf16 values already (v16), made in the quantizer's pass. */
#ifndef MXI_SCALED_GEMM_H
#define MXI_SCALED_GEMM_H

#include <stdbool.h>
#include <stdint.h>

#include "mxtrain/mx.h"
#include "ops/gemm.h"

/* One operand: dense row-major codes and the fp32 scale their values are multiplied by. */
typedef struct {
    const uint8_t *q;   // (rows, cols) codes
    int64_t rows, cols;
    mx_elem elem;       // MX_E4M3, MX_E5M2 or MX_HIF8
    float scale_inv;    // dequantization scale
    const float *vscale; // or NULL: one scale per row of op(A) (operand a) or per column of op(B)
                         // (operand b), torchao's rowwise recipes, in place of scale_inv
    const float *bscale; // or NULL: one scale per brows x bcols block of (rows, cols), row-major
                         // (ceil(rows/brows), ceil(cols/bcols)), the blockwise recipe, in place of
                         // scale_inv; FP8 only
    int64_t brows, bcols;
    const uint16_t *v16; // or NULL: with block or line scales, each element's value times its
                         // block's or line's scale as bf16 already (mxi_fp8_quantize_blocks_values16,
                         // mxi_fp8_quantize_axiswise_values16: exact), in place of q
} mxi_scaled_tensor;

/* C (M, N) = alpha op(A) op(B) (or C += it with accumulate), alpha as above; op(A) is (M, K),
 * op(B) (K, N). runtime: the dims left to run time (MXI_GEMM_RUNTIME_*, see mxi_matmul_ex).
 * Returns 0, MX_ENULL, MX_ESIZE (inner dims differ, a block size < 1), MX_EENUM (element format;
 * HiF8 with block scales), MX_ENOMEM,
 * or an mxi_matmul error; diag says which. */
typedef struct {
    float *C;
    const mxi_scaled_tensor *a, *b;
    bool trans_a, trans_b;
    bool accumulate;
    unsigned runtime;
} mxi_scaled_gemm_args;

int mxi_scaled_gemm(mxi_gemm_ctx *ctx, const mxi_scaled_gemm_args *args, mx_diag *diag);

#endif
