/* Internal: linear layers Y = X W^T (+ b) on top of the GEMM layer, at the compute precision
 * (fp32, or bf16 operands with fp32 accumulation).
 *
 * Shape legend of this layer (GEMM level, apart from the model's B, T, C, ...): rows (of
 * tokens), in (features in), out (features out). X is (rows, in), W (out, in), Y (rows, out).
 * Inside linear.c the GEMMs' own letters M, N, K follow ops/gemm.h. */
#ifndef MXI_LINEAR_H
#define MXI_LINEAR_H

#include <stdbool.h>
#include <stdint.h>

#include "mxtrain/error.h"
#include "mxtrain/mx.h"
#include "model/delayed.h"
#include "model/quant_stats.h"
#include "mxtrain/plan.h"
#include "mxtrain/scaled.h"
#include "numerics/tiles.h"
#include "ops/mx_gemm.h"
#include "ops/scaled_gemm.h"

typedef struct mxi_linear_ctx mxi_linear_ctx;

/* How a recipe scales: MX blocks (E8M0 scales per 32 elements), one fp32 scale per tensor
 * (tensorwise FP8 as TE's current scaling, HiF8 as MindSpeed's), one per row of each
 * operand along its product's reduction dim (torchao's rowwise, linear_rowwise.c), or one
 * fp32 scale per 1x128 / 128x128 / 128x1 block (the blockwise recipe, linear_blockwise.c). */
typedef enum { MXI_SCALE_BLOCKS = 0, MXI_SCALE_TENSOR = 1, MXI_SCALE_ROWS = 2, MXI_SCALE_BLOCKS128 = 3 } mxi_scaling;

/* How a converted linear layer quantizes (quantize.linear.<family>, and quantize.moe.<family>
 * per expert group): the recipe's element formats for inputs, weights and gradients, its
 * scaling and the plan's scale mode. NULL where a layer is not converted. */
typedef struct {
    mx_elem inputs, weight, grads;
    mxi_scaling scaling;
    mx_scale_mode mode;      // MX blocks: floor, rceil
    mx_tscale_mode tmode;    // per tensor, per line, per block (FP8): fp32 or power-of-two scales
    bool weight_tiles;       // 1-32-32 recipes: the weight in 32x32 tiles, one plane for both GEMMs
    bool dgrad_weight_tensor; // per rows: dgrad's weight with one scale per tensor (rowwise_with_gw_hp)
    unsigned high_precision; // mx_gemm_set: products run as an unconverted layer's (high_precision_gemms)
} mxi_linear_mx;

/* HiF8's per-tensor target maxima (MindSpeed's HIF8_15 and HIF8_224): inputs and weights
 * are scaled so that their amax becomes 15, gradients 224. */
#define MXI_HIF8_TARGET_ACT 15.0f
#define MXI_HIF8_TARGET_GRAD 224.0f

/* A converted weight (out, in) already quantized, as the FSDP engine gathers it: the rowwise
 * plane for the forward GEMM and the colwise plane for dinput (with 32x32 tiles: the same
 * codes, each tile's scale spread over both layouts). A plane with q NULL is absent. A
 * per-tensor recipe's weight is row.q, its codes for both products (no block scales), and
 * *tscale its dequantization scale (fused experts: one per expert, in order). A rowwise
 * recipe's (MXI_SCALE_ROWS) planes have no block scales either: row.q is quantized per row
 * (fprop), row_scales its fp32 dequantization scale per row; col.q is dgrad's operand,
 * quantized per column (col_scales: one per column, each expert's cols after the last's)
 * or, with dgrad_weight_tensor, per tensor (col_scales: one per expert); col_per_group says
 * how many each expert has (cols or 1). The blockwise recipe's (MXI_SCALE_BLOCKS128) is row.q,
 * its codes for both products, with bscale the fp32 dequantization scale of each 128x128
 * tile (row-major; fused experts: each expert's tiles after the last's). */
typedef struct {
    mxi_mx_plane row;
    mxi_mx_plane col;
    const float *tscale;
    const float *row_scales, *col_scales;
    int64_t col_per_group;
    const float *bscale;
} mxi_mx_weight;

/* A context owns GEMM primitives and conversion scratch; created once per model. 0, or
 * MX_ENOMEM or oneDNN's failure with its one line in diag. */
int mxi_linear_ctx_create(mxi_linear_ctx **out, bool bf16, mx_diag *diag);
void mxi_linear_ctx_free(mxi_linear_ctx *ctx);

/* For verification: from now on, the first MX GEMM of each kind (forward, dinput, dweight)
 * writes its operands to dir: <kind>_{a,b}_hp.bin (the fp32 tensors), _q.bin, _s.bin (their
 * planes), _meta.bin (int64 rows, cols, axis, elem, tiles: 1 for a weight quantized in 32x32 tiles); an operand that is a saved input has no
 * _hp file, and every saved input is written as saveNNN_a_*. A per-tensor recipe's operand
 * has axis 2 (MXI_TRACE_TENSOR) and its _s.bin holds its fp32 dequantization scale. NULL
 * stops tracing. */
#define MXI_TRACE_TENSOR 2
void mxi_linear_ctx_trace(mxi_linear_ctx *ctx, const char *dir);
/* Whether ctx traces (a products' operands must then be codes). */
bool mxi_linear_ctx_tracing(const mxi_linear_ctx *ctx);

/* The rowwise recipes' traces (linear_rowwise.c): axis MXI_TRACE_ROWS (one fp32 scale per row
 * in _s.bin), MXI_TRACE_COLS (one per column), MXI_TRACE_TORCHAO_TENSOR (one, torchao's
 * arithmetic). */
#define MXI_TRACE_ROWS 3
#define MXI_TRACE_COLS 4
#define MXI_TRACE_TORCHAO_TENSOR 5
/* The blockwise recipe's traces (linear_blockwise.c): axis MXI_TRACE_BLOCKS_1x128, _128x128,
 * _128x1, the block shape in the operand's own (rows, cols) layout; _s.bin holds the fp32
 * scales, (ceil(rows / block rows), ceil(cols / block cols)) row-major. */
#define MXI_TRACE_BLOCKS_1x128 6
#define MXI_TRACE_BLOCKS_128x128 7
#define MXI_TRACE_BLOCKS_128x1 8
/* One operand of a traced product: its fp32 source (NULL: a weight the engine gathered
 * quantized, no _hp.bin), its codes, the trace axis above and its n_scales fp32 scales. */
typedef struct {
    const float *hp;
    const mxi_scaled_tensor *t;
    int64_t axis;
    const float *scales;
    size_t n_scales;
} mxi_trace_operand;
/* Product kind (0 forward, 1 dinput, 2 dweight), if it is to be traced now (once per
 * context): DIR/<kind>_{a,b}_{meta,hp,q,s}.bin of its two operands. */
void mxi_linear_trace_scaled(mxi_linear_ctx *ctx, int kind, const mxi_trace_operand ops[2]);

/* C = op(A) op(B) (or += with MXI_WRITE_ADD) on scaled operands (ops/scaled_gemm.h), the
 * GEMM dims in runtime left to run time (ops/gemm.h), a failure recorded in ctx. */
typedef enum { MXI_WRITE_SET, MXI_WRITE_ADD } mxi_write;
int mxi_linear_scaled_gemm(mxi_linear_ctx *ctx, unsigned runtime, float *C, const mxi_scaled_tensor *A, bool trans_a,
                           const mxi_scaled_tensor *B, bool trans_b, mxi_write write);

/* The context's GEMM context, for layers that run their own products (attention), and the
 * way they record a failure (rc < 0, its message in diag) as the context's first. */
struct mxi_gemm_ctx *mxi_linear_ctx_gemm(mxi_linear_ctx *ctx);
void mxi_linear_ctx_record(mxi_linear_ctx *ctx, int rc, const mx_diag *diag);

/* The first failure of any call on this context (sticky; 0 if none), its message in diag. */
int mxi_linear_ctx_error(const mxi_linear_ctx *ctx, mx_diag *diag);

/* A layer's sizes: rows of tokens, in features, out features. */
typedef struct {
    int64_t rows, in, out;
} mxi_linear_shape;

/* A layer's parameters: w (out, in); wq its pre-quantized planes (a converted layer whose
 * engine gathered them), or NULL to quantize from w; b (out) or NULL; w16 (out, in) the
 * weight as bf16 bits instead of w (unconverted layers at bf16 compute precision only);
 * delayed: the layer's slots under a delayed recipe (per-tensor casts take their scales and
 * record their amaxes there), state NULL otherwise; tensor: the weight's tensor index (statistics). */
typedef struct {
    const float *w;
    const mxi_mx_weight *wq;
    const float *b;
    const uint16_t *w16;
    mxi_delayed_site delayed;
    int tensor;   // the weight's index in the model's tensor table: whose quantization statistics these are
} mxi_linear_params;

/* out = inp @ w^T (+ b). With mx, the GEMM runs on MX operands (SPEC §5): inp rowwise in
 * the inputs format, w rowwise in the weight format (p.wq->row when given, else quantized
 * from p.w); the bias is added in fp32 after. */
int mxi_linear_forward(mxi_linear_ctx *ctx, const mxi_linear_mx *mx, float *out /* (rows, out) */,
                       const float *inp /* (rows, in) */, mxi_linear_params p, mxi_linear_shape shape);

/* The weights given from now on hold bf16 values already (FSDP gathered them in bf16): at
 * bf16 compute precision, a CPU without a native bf16 matmul uses them as they are. */
void mxi_linear_ctx_weights_bf16(mxi_linear_ctx *ctx, bool yes);

/* The linear_forward and linear_backward calls that follow read the same input inp,
 * unchanged, until the next mxi_linear_share_input (NULL ends it): a converted layer's rowwise
 * input plane is made once and reused by the others with the same format and scale mode
 * (q, k, v; gate, up), and at bf16 compute precision inp is rounded to bf16 once. */
void mxi_linear_share_input(mxi_linear_ctx *ctx, const float *inp);

/* linear_share_input with inp's bf16 rounding made into x16 (rows * in, the caller's) instead of
 * the context's scratch, so that backward's weight-gradient product can read it again
 * (mxi_saved_input.bf16) without inp. Only where the GEMM runs bf16 natively
 * (mxi_gemm_bf16_native); elsewhere it is linear_share_input. */
void mxi_linear_share_input_into(mxi_linear_ctx *ctx, const float *inp, uint16_t *x16);

/* The next linear_forward on inp (rows, in) takes plane, the rowwise MX plane of inp's values
 * made elsewhere with this layer's inputs format and scale mode (expert parallelism's mxfp8
 * dispatch: quantized on the token's rank), instead of quantizing inp; mxi_linear_share_input(ctx,
 * NULL) ends it. */
void mxi_linear_given_input(mxi_linear_ctx *ctx, const float *inp, const mxi_mx_plane *plane, mx_scale_mode mode);

/* The calls that follow (until mxi_linear_vary_tokens(ctx, false)) have token counts M that
 * change from call to call: the expert groups of an MoE layer. Their GEMMs leave the token
 * dim to run time (mxi_matmul_ex), so one primitive per GEMM kind serves every group size
 * instead of one per size. */
void mxi_linear_vary_tokens(mxi_linear_ctx *ctx, bool yes);

/* A layer's input as backward needs it, kept instead of the fp32 input: for a converted
 * layer its colwise plane in the inputs format (1 + 1/32 bytes per element instead of 4), or
 * with a per-tensor recipe (current scaling) the codes forward multiplied (1 byte);
 * for an unconverted one at bf16 compute precision on a native bf16 matmul, its bf16
 * rounding (2 bytes), made by forward's linear_share_input_into. */
typedef struct {
    uint8_t *q;       // (rows, in) FP8 codes, or NULL
    uint8_t *scales;  // (ceil(rows/32), in) E8M0 scales; per tensor: the fp32 dequantization scale's 4 bytes
    uint16_t *bf16;   // (rows, in) bf16 bits, or NULL
} mxi_saved_input;

/* Quantize inp (rows, in) colwise into saved (for a converted layer, in forward); a
 * per-tensor recipe's codes instead (current scaling), which the products that share inp
 * (linear_share_input, called first) then take as theirs. */
int mxi_linear_save_input(mxi_linear_ctx *ctx, const mxi_linear_mx *mx, const mxi_saved_input *saved,
                      const float *inp /* (rows, in) */, int64_t rows, int64_t in);


/* What backward computes, each NULL to skip: dinp (rows, in) written as dinp_write says;
 * dw (out, in) and db (out) always accumulate (+=); db only with dw. */
typedef struct {
    float *dinp;
    mxi_write dinp_write;
    float *dw;
    float *db;
} mxi_linear_grads;

/* The layer's input as backward reads it: inp (rows, in) in fp32, or NULL and saved, the
 * input forward kept (a converted layer's colwise plane, an unconverted one's bf16 rounding). */
typedef struct {
    const float *inp;
    const mxi_saved_input *saved;
} mxi_linear_input;

/* The rowwise recipes' products (linear_rowwise.c), called by linear_forward and
 * linear_backward for MXI_SCALE_ROWS: every operand quantized from fp32 here but the
 * weight's planes the engine gathered (wq's row.q with row_scales, col.q with col_scales). */
int mxi_linear_rows_forward(mxi_linear_ctx *ctx, const mxi_linear_mx *mx, float *out, const float *inp,
                            const mxi_linear_params *p, int64_t M, int64_t N, int64_t K);
int mxi_linear_rows_backward(mxi_linear_ctx *ctx, const mxi_linear_mx *mx, mxi_linear_grads grads, const float *dout,
                             const float *inp, const mxi_linear_params *p, int64_t M, int64_t N, int64_t K);

/* Quantization statistics: while qs is on, every quantized operand of a product is folded
 * into it under the layer's tensor (p.tensor) and its role (model/quant_stats.h). NULL: none. */
void mxi_linear_ctx_stats(mxi_linear_ctx *ctx, mxi_quant_stats *qs);
mxi_quant_stats *mxi_linear_ctx_stats_of(mxi_linear_ctx *ctx);

/* The blockwise recipe's products (linear_blockwise.c), called by linear_forward and
 * linear_backward for MXI_SCALE_BLOCKS128: every operand quantized from fp32 here but the
 * weight's tiles the engine gathered (p->wq's row.q with bscale). */
int mxi_linear_blocks_forward(mxi_linear_ctx *ctx, const mxi_linear_mx *mx, float *out, const float *inp,
                              const mxi_linear_params *p, int64_t M, int64_t N, int64_t K);
int mxi_linear_blocks_backward(mxi_linear_ctx *ctx, const mxi_linear_mx *mx, mxi_linear_grads grads, const float *dout,
                               const float *inp, const mxi_linear_params *p, int64_t M, int64_t N, int64_t K);

/* Scratch slot of the context of at least bytes, grow-only (slots 0 .. MXI_LINEAR_SLOTS-1,
 * shared with the MX and per-tensor paths); NULL, the failure recorded, when out of memory. */
#define MXI_LINEAR_SLOTS 10
void *mxi_linear_ctx_buffer(mxi_linear_ctx *ctx, int slot, int64_t bytes);

/* The shared input (linear_share_input: q, k and v, or gate and up, read one) quantized once
 * for all of its products where its codes do not depend on the layer: the first product
 * keeps what it made in its slots (mxi_linear_keep_quantized), the next ones find it
 * (mxi_linear_shared_quantized) while no one wrote those slots since. kind tells apart the
 * ways of quantizing it (the caller's own numbering: granularity, format, scale mode). */
bool mxi_linear_shared_quantized(mxi_linear_ctx *ctx, const float *x, int kind, mxi_scaled_tensor *t);
void mxi_linear_keep_quantized(mxi_linear_ctx *ctx, const float *x, int kind, int q_slot, int s_slot,
                               const mxi_scaled_tensor *t);

/* dw += dout^T @ inp; db += column sums of dout; dinp = dout @ w (or += with MXI_WRITE_ADD).
 * A layer's two halves may run apart, with the results of one call. With mx: dinp from dout
 * rowwise (grads format) and w colwise; dw from dout colwise and inp colwise (inputs
 * format); every plane quantized from fp32 (w's colwise plane may come as p.wq->col). */
int mxi_linear_backward(mxi_linear_ctx *ctx, const mxi_linear_mx *mx, mxi_linear_grads grads,
                        const float *dout /* (rows, out) */, mxi_linear_input input, mxi_linear_params p,
                        mxi_linear_shape shape);

#endif
