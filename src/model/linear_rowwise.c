/* The rowwise recipes' linear layer (torchao's float8 rowwise and rowwise_with_gw_hp,
 * docs/quantization-plan.md): each GEMM operand quantized from fp32 with one scale per line
 * along that GEMM's reduction dim, the GEMM on the codes with the scales applied to its fp32
 * accumulator (ops/scaled_gemm.h). In GEMM letters X (M, K), W (N, K), dY (M, N):
 *   fprop  Y  = X W^T:   X per row (along K), W per row (along K)
 *   dgrad  dX = dY W:    dY per row (along N), W per column (along N), or per tensor
 *   wgrad  dW = dY^T X:  dY per column (along M), X per column (along M)
 * An MoE layer calls these per expert group, so no scale spans two groups. */
#include <stdio.h>

#include "model/linear.h"
#include "numerics/mx_internal.h"   // mxi_fp8_quantize_axiswise_values16
#include "ops/gemm.h"
#include "ops/scaled_gemm.h"

/* Scratch slots (mxi_linear_ctx_buffer), codes (or bf16 values) and scales of each operand. */
enum { SLOT_X_Q = 0, SLOT_X_S = 1, SLOT_W_Q = 2, SLOT_W_S = 3, SLOT_DY_Q = 5, SLOT_DY_S = 6, SLOT_XC_Q = 7,
       SLOT_XC_S = 8 };

typedef enum { LINES_ROWS, LINES_COLS, LINES_TENSOR } lines;

/* Whether an operand goes to its bf16 values in the quantizer's pass, no codes in between:
 * where the product multiplies bf16 natively (it would turn power-of-two line scales into
 * those values next, ops/scaled_gemm.h), a scale per line, and nobody reading the codes
 * (statistics, traces). */
static bool as_values(mxi_linear_ctx *ctx, lines how, mx_elem elem, mx_tscale_mode mode) {
    return how != LINES_TENSOR && elem != MX_HIF8 && mode == MX_TSCALE_POW2 &&
           mxi_gemm_bf16_native(mxi_linear_ctx_gemm(ctx)) && !mxi_quant_stats_on(mxi_linear_ctx_stats_of(ctx)) &&
           !mxi_linear_ctx_tracing(ctx);
}

/* x (rows, cols) quantized per line into slots (qs, ss) and described as a GEMM operand:
 * bf16 values where as_values and every scale allows (mxi_fp8_quantize_axiswise_values16),
 * else codes. */
static int quantize_lines(mxi_linear_ctx *ctx, mxi_scaled_tensor *t, int qs, int ss, const float *x, int64_t rows,
                          int64_t cols, lines how, mx_elem elem, mx_tscale_mode mode) {
    int64_t n_scales = how == LINES_ROWS ? rows : how == LINES_COLS ? cols : 1;
    int kind = MXI_SCALE_ROWS | how << 4 | elem << 8 | mode << 12;
    if (mxi_linear_shared_quantized(ctx, x, kind, t)) return MX_OK;   // q, k and v read one input
    bool values = as_values(ctx, how, elem, mode);
    void *q = mxi_linear_ctx_buffer(ctx, qs, rows * cols * (values ? 2 : 1));
    float *s = mxi_linear_ctx_buffer(ctx, ss, n_scales * (int64_t)sizeof(float));
    if (!q || !s) return MX_ENOMEM;
    mx_axis axis = how == LINES_ROWS ? MX_ROWWISE : MX_COLWISE;
    if (values && mxi_fp8_quantize_axiswise_values16(q, s, x, rows, cols, axis, elem)) {
        *t = (mxi_scaled_tensor){.v16 = q, .rows = rows, .cols = cols, .elem = elem, .scale_inv = s[0], .vscale = s};
        mxi_linear_keep_quantized(ctx, x, kind, qs, ss, t);
        return MX_OK;
    }
    int rc = how == LINES_TENSOR ? mx_fp8_quantize_axiswise_f32(x, 1, rows * cols, MX_ROWWISE, elem, mode, q, s)
                                 : mx_fp8_quantize_axiswise_f32(x, rows, cols, axis, elem, mode, q, s);
    if (rc) {
        mxi_linear_ctx_record(ctx, rc, NULL);
        return rc;
    }
    *t = (mxi_scaled_tensor){.q = q, .rows = rows, .cols = cols, .elem = elem, .scale_inv = s[0],
                             .vscale = how == LINES_TENSOR ? NULL : s};
    mxi_linear_keep_quantized(ctx, x, kind, qs, ss, t);
    return MX_OK;
}

/* Dump a product's two operands (linear.h: MXI_TRACE_ROWS, _COLS, _TORCHAO_TENSOR). */
static void trace(mxi_linear_ctx *ctx, int kind, const float *hp[2], const mxi_scaled_tensor *t[2], const lines how[2]) {
    static const int64_t axes[3] = {MXI_TRACE_ROWS, MXI_TRACE_COLS, MXI_TRACE_TORCHAO_TENSOR};
    mxi_trace_operand ops[2];
    for (int i = 0; i < 2; i++)
        ops[i] = (mxi_trace_operand){.hp = hp[i], .t = t[i], .axis = axes[how[i]],
                                     .scales = t[i]->vscale ? t[i]->vscale : &t[i]->scale_inv,
                                     .n_scales = how[i] == LINES_ROWS   ? (size_t)t[i]->rows
                                                 : how[i] == LINES_COLS ? (size_t)t[i]->cols
                                                                        : 1};
    mxi_linear_trace_scaled(ctx, kind, ops);
}

/* Fold an operand quantized per line from x into the statistics of tensor's role. */
static void stats(mxi_linear_ctx *ctx, int tensor, mxi_qs_role role, const float *x, const mxi_scaled_tensor *t, lines how) {
    mxi_qs_operand op = {.q = t->q, .rows = t->rows, .cols = t->cols, .elem = t->elem,
                         .scaling = how == LINES_ROWS ? MXI_QS_ROWS : how == LINES_COLS ? MXI_QS_COLS : MXI_QS_TENSOR,
                         .scale = t->vscale ? t->vscale : &t->scale_inv};
    mxi_quant_stats_record(mxi_linear_ctx_stats_of(ctx), tensor, role, x, &op);
}

/* The weight W (N, K) as the operand of fprop (per row, how = LINES_ROWS) or dgrad (per
 * column or whole): the plane the engine gathered when it did, else quantized from w here. */
static int weight_lines(mxi_linear_ctx *ctx, mxi_scaled_tensor *t, const float *w, const mxi_mx_weight *wq, int64_t N,
                        int64_t K, lines how, const mxi_linear_mx *mx) {
    const mxi_mx_plane *p = wq ? (how == LINES_ROWS ? &wq->row : &wq->col) : NULL;
    const float *s = wq ? (how == LINES_ROWS ? wq->row_scales : wq->col_scales) : NULL;
    if (p && p->q && s) {
        *t = (mxi_scaled_tensor){.q = p->q, .rows = N, .cols = K, .elem = mx->weight, .scale_inv = s[0],
                                 .vscale = how == LINES_TENSOR ? NULL : s};
        return MX_OK;
    }
    if (!w) {   // neither planes nor weights bound: an engine bug
        mxi_linear_ctx_record(ctx, MX_EINVAL, NULL);
        return MX_EINVAL;
    }
    return quantize_lines(ctx, t, SLOT_W_Q, SLOT_W_S, w, N, K, how, mx->weight, mx->tmode);
}

int mxi_linear_rows_forward(mxi_linear_ctx *ctx, const mxi_linear_mx *mx, float *out, const float *inp,
                            const mxi_linear_params *p, int64_t M, int64_t N, int64_t K) {
    const float *w = p->w;
    int tensor = p->tensor;
    mxi_scaled_tensor x, wr;
    int rc = quantize_lines(ctx, &x, SLOT_X_Q, SLOT_X_S, inp, M, K, LINES_ROWS, mx->inputs, mx->tmode);
    if (!rc) rc = weight_lines(ctx, &wr, w, p->wq, N, K, LINES_ROWS, mx);
    if (rc) return rc;
    trace(ctx, 0, (const float *[2]){inp, w}, (const mxi_scaled_tensor *[2]){&x, &wr}, (const lines[2]){LINES_ROWS, LINES_ROWS});
    if (mxi_quant_stats_on(mxi_linear_ctx_stats_of(ctx)))
        stats(ctx, tensor, MXI_QS_FPROP_X, inp, &x, LINES_ROWS);
    if (w && mxi_quant_stats_on(mxi_linear_ctx_stats_of(ctx)))   // a gathered plane: the engine measures it
        stats(ctx, tensor, MXI_QS_FPROP_W, w, &wr, LINES_ROWS);
    // runtime M: the token counts of expert groups vary (a fixed-M primitive per size otherwise)
    return mxi_linear_scaled_gemm(ctx, MXI_GEMM_RUNTIME_M, out, &x, false, &wr, true, MXI_WRITE_SET);   // Y = X W^T
}

int mxi_linear_rows_backward(mxi_linear_ctx *ctx, const mxi_linear_mx *mx, mxi_linear_grads grads, const float *dout,
                             const float *inp, const mxi_linear_params *p, int64_t M, int64_t N, int64_t K) {
    const float *w = p->w;
    int tensor = p->tensor;
    if (grads.dw && !inp) {   // no input kept: an engine bug
        mxi_linear_ctx_record(ctx, MX_EINVAL, NULL);
        return MX_EINVAL;
    }
    int rc = MX_OK;
    if (grads.dw) {   // dW += dY^T X, both per column (along M)
        mxi_scaled_tensor dy, x;
        rc = quantize_lines(ctx, &dy, SLOT_X_Q, SLOT_X_S, dout, M, N, LINES_COLS, mx->grads, mx->tmode);
        if (!rc) rc = quantize_lines(ctx, &x, SLOT_XC_Q, SLOT_XC_S, inp, M, K, LINES_COLS, mx->inputs, mx->tmode);
        if (rc) return rc;
        trace(ctx, 2, (const float *[2]){dout, inp}, (const mxi_scaled_tensor *[2]){&dy, &x},
              (const lines[2]){LINES_COLS, LINES_COLS});
        if (mxi_quant_stats_on(mxi_linear_ctx_stats_of(ctx)))
            stats(ctx, tensor, MXI_QS_WGRAD_DY, dout, &dy, LINES_COLS), stats(ctx, tensor, MXI_QS_WGRAD_X, inp, &x, LINES_COLS);
        rc = mxi_linear_scaled_gemm(ctx, MXI_GEMM_RUNTIME_K, grads.dw, &dy, true, &x, false, MXI_WRITE_ADD);
    }
    if (!rc && grads.dinp) {   // dX (+)= dY W: dY per row (along N), W per column (along N) or whole
        mxi_scaled_tensor dy, wc;
        lines wl = mx->dgrad_weight_tensor ? LINES_TENSOR : LINES_COLS;
        rc = quantize_lines(ctx, &dy, SLOT_DY_Q, SLOT_DY_S, dout, M, N, LINES_ROWS, mx->grads, mx->tmode);
        if (!rc) rc = weight_lines(ctx, &wc, w, p->wq, N, K, wl, mx);
        if (rc) return rc;
        trace(ctx, 1, (const float *[2]){dout, w}, (const mxi_scaled_tensor *[2]){&dy, &wc}, (const lines[2]){LINES_ROWS, wl});
        if (mxi_quant_stats_on(mxi_linear_ctx_stats_of(ctx)))
            stats(ctx, tensor, MXI_QS_DGRAD_DY, dout, &dy, LINES_ROWS);
        if (w && mxi_quant_stats_on(mxi_linear_ctx_stats_of(ctx))) stats(ctx, tensor, MXI_QS_DGRAD_W, w, &wc, wl);
        rc = mxi_linear_scaled_gemm(ctx, MXI_GEMM_RUNTIME_M, grads.dinp, &dy, false, &wc, false, grads.dinp_write);
    }
    return rc;
}
