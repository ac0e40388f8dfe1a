/* Internal: quantization statistics per converted tensor and operand role (TransformerEngine's
 * LogFp8TensorStats as the anchor; definitions in docs/training.md#quantization-statistics).
 *
 * A collector holds, for every tensor of the model and every role, running figures: element
 * counts, the sums of x^2 and of (x - dequant(q))^2, and the extremes of the scales. It is
 * sized when made; while it is on (mxi_quant_stats_begin .. _end) the linear layers fold
 * each quantized operand they make into it, once per product that reads it. */
#ifndef MXI_QUANT_STATS_H
#define MXI_QUANT_STATS_H

#include <stdbool.h>
#include <stdint.h>

#include "mxtrain/error.h"
#include "mxtrain/model.h"
#include "mxtrain/mx.h"

/* The quantized operands of a linear layer's three products. */
typedef enum {
    MXI_QS_FPROP_X = 0,   // forward, the input X
    MXI_QS_FPROP_W = 1,   // forward, the weight W
    MXI_QS_DGRAD_DY = 2,  // dgrad dX = dY W, the output gradient dY
    MXI_QS_DGRAD_W = 3,   // dgrad, the weight W
    MXI_QS_WGRAD_DY = 4,  // wgrad dW = dY^T X, the output gradient dY
    MXI_QS_WGRAD_X = 5,   // wgrad, the input X
    MXI_QS_ROLES = 6
} mxi_qs_role;

/* The role's name in the metrics records ("fprop_x", ...), NULL for an unknown one. */
const char *mxi_qs_role_name(mxi_qs_role role);

/* How an operand's codes are scaled: MX blocks of 32 along axis or 32x32 tiles (E8M0 codes),
 * one fp32 dequantization scale per tensor, per row, per column or per brows x bcols block
 * (the blockwise recipe's). */
typedef enum { MXI_QS_BLOCKS, MXI_QS_TILES, MXI_QS_TENSOR, MXI_QS_ROWS, MXI_QS_COLS, MXI_QS_FP32_BLOCKS } mxi_qs_scaling;

/* A quantized operand (rows, cols): codes q of format elem and their scales. The value of
 * element i is decode(q[i]) * its scale (the dequantization multiplier). */
typedef struct {
    const uint8_t *q;        // (rows, cols)
    int64_t rows, cols;
    mx_elem elem;
    mxi_qs_scaling scaling;
    mx_axis axis;            // MXI_QS_BLOCKS: the blocks' axis
    const uint8_t *e8m0;     // MXI_QS_BLOCKS: (mx_scale_count(rows, cols, axis)) E8M0 codes;
                             // MXI_QS_TILES: (ceil(rows/32), ceil(cols/32))
    const float *scale;      // MXI_QS_TENSOR: (1); MXI_QS_ROWS: (rows); MXI_QS_COLS: (cols);
                             // MXI_QS_FP32_BLOCKS: (ceil(rows/brows), ceil(cols/bcols))
    int64_t brows, bcols;    // MXI_QS_FP32_BLOCKS: a block's shape
} mxi_qs_operand;

/* Running figures of one tensor and role (sums over everything folded in). */
typedef struct {
    double numel;       // elements
    double nonfinite;   // elements NaN or infinite in x, or whose dequantized value is not finite
    double underflows;  // finite, nonzero in x, zero once quantized
    double overflows;   // finite, |x| / scale beyond the rounding interval of the format's max: clamped
    double signal;      // sum of x^2 over the finite elements
    double error;       // sum of (x - dequant(q))^2 over the finite elements
    double scale_min, scale_max;  // finite dequantization scales' extremes (+inf / -inf when none)
} mxi_qs_acc;

/* An empty accumulator (counts 0, scale_min +inf, scale_max -inf). */
mxi_qs_acc mxi_qs_acc_empty(void);

/* Fold operand op, quantized from x (rows, cols fp32), into acc: one scalar pass over the
 * elements and one over the scales. */
void mxi_qs_measure(mxi_qs_acc *acc, const float *x, const mxi_qs_operand *op);

/* The magnitude past which |x| / scale is clamped to the format's largest finite value: that
 * value plus half its ulp (E4M3 464, E5M2 61440, HiF8 40960). */
double mxi_qs_clamp_threshold(mx_elem elem);

/* Derived figures: shares in percent of all elements; mse over the finite elements; sqnr_db
 * 10 log10(signal / error), NAN where error is 0 (exact, or nothing finite) or numel 0. */
double mxi_qs_underflows_pct(const mxi_qs_acc *a);
double mxi_qs_overflows_pct(const mxi_qs_acc *a);
double mxi_qs_mse(const mxi_qs_acc *a);
double mxi_qs_sqnr_db(const mxi_qs_acc *a);

typedef struct mxi_quant_stats mxi_quant_stats;

/* A collector for n_tensors tensors, with room for max_saves saved input planes per pass.
 * 0 or MX_ENOMEM. */
int mxi_quant_stats_create(mxi_quant_stats **out, int n_tensors, int max_saves);
void mxi_quant_stats_free(mxi_quant_stats *qs);

/* Clear every figure and start collecting; stop collecting. */
void mxi_quant_stats_begin(mxi_quant_stats *qs);
void mxi_quant_stats_end(mxi_quant_stats *qs);
/* Whether operands are folded in now (qs may be NULL: no). */
bool mxi_quant_stats_on(const mxi_quant_stats *qs);
/* While a forward runs again in backward (activation recompute): forward's operands are not
 * folded in twice; saved input planes are still noted. */
void mxi_quant_stats_pause_forward(mxi_quant_stats *qs, bool paused);

/* Fold op (from x) into tensor's figures of role. */
void mxi_quant_stats_record(mxi_quant_stats *qs, int tensor, mxi_qs_role role, const float *x, const mxi_qs_operand *op);
/* A saved input plane (forward keeps a colwise plane for wgrad instead of x): its figures,
 * measured now, under the plane's codes pointer; mxi_quant_stats_saved folds them into tensor's
 * role when the product that reads the plane runs. */
void mxi_quant_stats_save(mxi_quant_stats *qs, const float *x, const mxi_qs_operand *op);
void mxi_quant_stats_saved(mxi_quant_stats *qs, int tensor, mxi_qs_role role, const uint8_t *q);

/* Tensor's figures of role. */
const mxi_qs_acc *mxi_quant_stats_get(const mxi_quant_stats *qs, int tensor, mxi_qs_role role);

/* Combine the figures over ranks: sum adds n doubles element-wise over every rank, max takes
 * their maximum (both collective, ctx passed on). Every rank ends with the whole figures. */
typedef int (*mxi_qs_reduce)(void *ctx, double *x, int n, mx_diag *diag);
int mxi_quant_stats_reduce(mxi_quant_stats *qs, mxi_qs_reduce sum, mxi_qs_reduce max, void *ctx, mx_diag *diag);

/* The model's collector (model/modules.c). */
mxi_quant_stats *mxi_model_quant_stats(mx_model *m);

#endif
