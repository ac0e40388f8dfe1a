/* The blockwise recipe's linear layer (DeepSeek-V3's FP8 training, TE Float8BlockScaling;
 * docs/quantization-plan.md): each GEMM operand quantized from fp32 to E4M3 with one fp32
 * scale per block (mx_fp8_quantize_blocks_f32), the GEMM on the dequantized operands
 * (ops/scaled_gemm.h); where that GEMM runs on bf16, the activations and gradients go to
 * their dequantized bf16 values in the quantizer's pass. In GEMM letters X (M, K), W (N, K),
 * dY (M, N):
 *   fprop  Y  = X W^T:   X in 1x128 blocks (along K), W in 128x128 tiles
 *   dgrad  dX = dY W:    dY in 1x128 blocks (along N), W in the same 128x128 tiles
 *   wgrad  dW = dY^T X:  dY in 128x1 blocks (along M), X in 128x1 blocks (along M)
 * A partial block at an edge is a block of its own. An MoE layer calls these per expert
 * group, so no block spans two groups. */
#include <stdio.h>

#include "model/linear.h"
#include "numerics/mx_internal.h"   // mxi_fp8_quantize_blocks_values16
#include "ops/gemm.h"
#include "ops/scaled_gemm.h"

/* Scratch slots (mxi_linear_ctx_buffer), codes (or bf16 values) and scales of each operand. */
enum { SLOT_X_Q = 0, SLOT_X_S = 1, SLOT_W_Q = 2, SLOT_W_S = 3, SLOT_DY_Q = 5, SLOT_DY_S = 6, SLOT_XC_Q = 7,
       SLOT_XC_S = 8 };

enum { BLOCK = 128 };

/* The three block shapes, as (rows, cols) of a block of the operand's own layout. */
typedef enum { BLOCKS_1x128, BLOCKS_128x128, BLOCKS_128x1 } blocks;
static const int64_t block_rows[3] = {1, BLOCK, BLOCK}, block_cols[3] = {BLOCK, BLOCK, 1};

/* Whether an operand goes to its bf16 values in the quantizer's pass, no codes in between:
 * where the product multiplies bf16 natively (so it would turn the codes into those values
 * next), with power-of-two scales (the values exact), blocks along a line, and nobody reading
 * the codes (statistics, traces). */
static bool as_values(mxi_linear_ctx *ctx, blocks how, mx_tscale_mode mode) {
    return how != BLOCKS_128x128 && mode == MX_TSCALE_POW2 && mxi_gemm_bf16_native(mxi_linear_ctx_gemm(ctx)) &&
           !mxi_quant_stats_on(mxi_linear_ctx_stats_of(ctx)) && !mxi_linear_ctx_tracing(ctx);
}

/* x (rows, cols) quantized in blocks into slots (qs, ss) and described as a GEMM operand:
 * bf16 values where as_values and every block's scale allows (mxi_fp8_quantize_blocks_values16),
 * else codes. */
static int quantize_blocks(mxi_linear_ctx *ctx, mxi_scaled_tensor *t, int qs, int ss, const float *x, int64_t rows,
                           int64_t cols, blocks how, mx_elem elem, mx_tscale_mode mode) {
    int64_t br = block_rows[how], bc = block_cols[how];
    int64_t n_scales = ((rows + br - 1) / br) * ((cols + bc - 1) / bc);
    int kind = MXI_SCALE_BLOCKS128 | how << 4 | elem << 8 | mode << 12;
    if (mxi_linear_shared_quantized(ctx, x, kind, t)) return MX_OK;   // q, k and v read one input
    bool values = as_values(ctx, how, mode);
    void *q = mxi_linear_ctx_buffer(ctx, qs, rows * cols * (values ? 2 : 1));
    float *s = mxi_linear_ctx_buffer(ctx, ss, n_scales * (int64_t)sizeof(float));
    if (!q || !s) return MX_ENOMEM;
    *t = (mxi_scaled_tensor){.q = q, .rows = rows, .cols = cols, .elem = elem, .bscale = s, .brows = br, .bcols = bc};
    if (values && mxi_fp8_quantize_blocks_values16(q, s, x, rows, cols, br, bc, elem)) {
        t->q = NULL, t->v16 = q;
    } else {
        int rc = mx_fp8_quantize_blocks_f32(x, rows, cols, br, bc, elem, mode, q, s);
        if (rc) {
            mxi_linear_ctx_record(ctx, rc, NULL);
            return rc;
        }
    }
    mxi_linear_keep_quantized(ctx, x, kind, qs, ss, t);
    return MX_OK;
}

/* Dump a product's two operands (linear.h: MXI_TRACE_BLOCKS_*). */
static void trace(mxi_linear_ctx *ctx, int kind, const float *hp[2], const mxi_scaled_tensor *t[2], const blocks how[2]) {
    static const int64_t axes[3] = {MXI_TRACE_BLOCKS_1x128, MXI_TRACE_BLOCKS_128x128, MXI_TRACE_BLOCKS_128x1};
    mxi_trace_operand ops[2];
    for (int i = 0; i < 2; i++)
        ops[i] = (mxi_trace_operand){.hp = hp[i], .t = t[i], .axis = axes[how[i]], .scales = t[i]->bscale,
                                     .n_scales = (size_t)(((t[i]->rows + t[i]->brows - 1) / t[i]->brows) *
                                                          ((t[i]->cols + t[i]->bcols - 1) / t[i]->bcols))};
    mxi_linear_trace_scaled(ctx, kind, ops);
}

/* Fold an operand quantized in blocks from x into the statistics of tensor's role. */
static void stats(mxi_linear_ctx *ctx, int tensor, mxi_qs_role role, const float *x, const mxi_scaled_tensor *t) {
    mxi_qs_operand op = {.q = t->q, .rows = t->rows, .cols = t->cols, .elem = t->elem, .scaling = MXI_QS_FP32_BLOCKS,
                         .scale = t->bscale, .brows = t->brows, .bcols = t->bcols};
    mxi_quant_stats_record(mxi_linear_ctx_stats_of(ctx), tensor, role, x, &op);
}

/* The weight W (N, K) in 128x128 tiles: the codes and tile scales the engine gathered when
 * it did (fsdp_block_scaled.c), else quantized from w here. */
static int weight_tiles(mxi_linear_ctx *ctx, mxi_scaled_tensor *t, const mxi_linear_params *p, int64_t N, int64_t K,
                        const mxi_linear_mx *mx) {
    const mxi_mx_weight *wq = p->wq;
    if (wq && wq->row.q && wq->bscale) {
        *t = (mxi_scaled_tensor){.q = wq->row.q, .rows = N, .cols = K, .elem = mx->weight, .bscale = wq->bscale,
                                 .brows = BLOCK, .bcols = BLOCK};
        return MX_OK;
    }
    if (!p->w) {   // neither codes nor weights bound: an engine bug
        mxi_linear_ctx_record(ctx, MX_EINVAL, NULL);
        return MX_EINVAL;
    }
    return quantize_blocks(ctx, t, SLOT_W_Q, SLOT_W_S, p->w, N, K, BLOCKS_128x128, mx->weight, mx->tmode);
}

int mxi_linear_blocks_forward(mxi_linear_ctx *ctx, const mxi_linear_mx *mx, float *out, const float *inp,
                              const mxi_linear_params *p, int64_t M, int64_t N, int64_t K) {
    const float *w = p->w;
    int tensor = p->tensor;
    mxi_scaled_tensor x, wt;
    int rc = quantize_blocks(ctx, &x, SLOT_X_Q, SLOT_X_S, inp, M, K, BLOCKS_1x128, mx->inputs, mx->tmode);
    if (!rc) rc = weight_tiles(ctx, &wt, p, N, K, mx);
    if (rc) return rc;
    trace(ctx, 0, (const float *[2]){inp, w}, (const mxi_scaled_tensor *[2]){&x, &wt},
          (const blocks[2]){BLOCKS_1x128, BLOCKS_128x128});
    if (mxi_quant_stats_on(mxi_linear_ctx_stats_of(ctx))) stats(ctx, tensor, MXI_QS_FPROP_X, inp, &x);
    if (w && mxi_quant_stats_on(mxi_linear_ctx_stats_of(ctx)))   // gathered tiles: the engine measures them
        stats(ctx, tensor, MXI_QS_FPROP_W, w, &wt);
    // runtime M: the token counts of expert groups vary (a fixed-M primitive per size otherwise)
    return mxi_linear_scaled_gemm(ctx, MXI_GEMM_RUNTIME_M, out, &x, false, &wt, true, MXI_WRITE_SET);   // Y = X W^T
}

int mxi_linear_blocks_backward(mxi_linear_ctx *ctx, const mxi_linear_mx *mx, mxi_linear_grads grads, const float *dout,
                               const float *inp, const mxi_linear_params *p, int64_t M, int64_t N, int64_t K) {
    const float *w = p->w;
    int tensor = p->tensor;
    if (grads.dw && !inp) {   // no input kept: an engine bug
        mxi_linear_ctx_record(ctx, MX_EINVAL, NULL);
        return MX_EINVAL;
    }
    int rc = MX_OK;
    if (grads.dw) {   // dW += dY^T X, both in 128x1 blocks (along M)
        mxi_scaled_tensor dy, x;
        rc = quantize_blocks(ctx, &dy, SLOT_X_Q, SLOT_X_S, dout, M, N, BLOCKS_128x1, mx->grads, mx->tmode);
        if (!rc) rc = quantize_blocks(ctx, &x, SLOT_XC_Q, SLOT_XC_S, inp, M, K, BLOCKS_128x1, mx->inputs, mx->tmode);
        if (rc) return rc;
        trace(ctx, 2, (const float *[2]){dout, inp}, (const mxi_scaled_tensor *[2]){&dy, &x},
              (const blocks[2]){BLOCKS_128x1, BLOCKS_128x1});
        if (mxi_quant_stats_on(mxi_linear_ctx_stats_of(ctx)))
            stats(ctx, tensor, MXI_QS_WGRAD_DY, dout, &dy), stats(ctx, tensor, MXI_QS_WGRAD_X, inp, &x);
        rc = mxi_linear_scaled_gemm(ctx, MXI_GEMM_RUNTIME_K, grads.dw, &dy, true, &x, false, MXI_WRITE_ADD);
    }
    if (!rc && grads.dinp) {   // dX (+)= dY W: dY in 1x128 blocks (along N), W in the same 128x128 tiles
        mxi_scaled_tensor dy, wt;
        rc = quantize_blocks(ctx, &dy, SLOT_DY_Q, SLOT_DY_S, dout, M, N, BLOCKS_1x128, mx->grads, mx->tmode);
        if (!rc) rc = weight_tiles(ctx, &wt, p, N, K, mx);
        if (rc) return rc;
        trace(ctx, 1, (const float *[2]){dout, w}, (const mxi_scaled_tensor *[2]){&dy, &wt},
              (const blocks[2]){BLOCKS_1x128, BLOCKS_128x128});
        if (mxi_quant_stats_on(mxi_linear_ctx_stats_of(ctx))) stats(ctx, tensor, MXI_QS_DGRAD_DY, dout, &dy);
        if (w && mxi_quant_stats_on(mxi_linear_ctx_stats_of(ctx))) stats(ctx, tensor, MXI_QS_DGRAD_W, w, &wt);
        rc = mxi_linear_scaled_gemm(ctx, MXI_GEMM_RUNTIME_M, grads.dinp, &dy, false, &wt, false, grads.dinp_write);
    }
    return rc;
}
