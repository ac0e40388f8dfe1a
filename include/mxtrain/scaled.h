/* mxtrain — the element format and the scalings of the non-MX recipes (docs/mx-numerics.md,
 * docs/quantization-plan.md; the anchors' arithmetic in ../shared/recipes.md).
 *
 * HiF8 (Ascend HiFloat8, arXiv 2409.16626): a tapered 8-bit format, sign | dot prefix |
 * sign-magnitude exponent | mantissa. 0x00 is the only zero, 0x80 NaN, 0x6F / 0xEF +/-Inf;
 * largest finite 32768 (0x6E), smallest positive 2^-22 (0x01). Conversion rounds to
 * nearest, ties away from zero.
 *
 * FP8 per-tensor and per-block scaling as TransformerEngine's current scaling: the
 * quantization scale is fp8_max / amax as one fp32 division (amax 0, Inf or NaN give 1,
 * a scale that overflows gives FLT_MAX), optionally truncated to a power of two; elements
 * are fp8(fp32(x * scale)), round-to-nearest-even, saturating, NaN kept as the NaN code.
 * The dequantization scale is fp32(1 / scale). amax ignores NaN elements.
 *
 * Every function is thread-safe; all take row-major (rows, cols) fp32 matrices. */
#ifndef MXTRAIN_SCALED_H
#define MXTRAIN_SCALED_H

#include <stdint.h>

#include "mxtrain/mx.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MX_HIF8_NAN 0x80
#define MX_HIF8_INF 0x6F   /* +Inf; 0xEF is -Inf */
#define MX_HIF8_MAX 32768.0f

typedef enum { MX_HIF8_OVERFLOW_INF = 0, MX_HIF8_SATURATE = 1 } mx_hif8_overflow;

/* Exact value of a HiF8 code (NaN for 0x80, +/-Inf for 0x6F / 0xEF). */
float mx_hif8_to_f32(uint8_t code);

/* HiF8 code of x, round to nearest with ties away from zero. |x| < 2^-23 gives 0x00 (the
 * sign of a zero is lost: HiF8 has one zero), NaN gives 0x80. With MX_HIF8_OVERFLOW_INF
 * |x| >= 40960 and +/-Inf give +/-Inf; with MX_HIF8_SATURATE they give +/-32768.
 * An unknown overflow mode gives 0x80. */
uint8_t mx_f32_to_hif8(float x, mx_hif8_overflow overflow);

typedef enum { MX_TSCALE_FP32 = 0, MX_TSCALE_POW2 = 1 } mx_tscale_mode;

/* Largest magnitude of n values, NaN elements ignored (an Inf counts); 0 for n == 0. */
float mx_amax_f32(const float *x, int64_t n);

/* TE's quantization scale of an FP8 operand from its amax (see above). */
float mx_fp8_scale_from_amax(float amax, mx_elem elem, mx_tscale_mode mode);

/* One fp32 scale for the whole tensor: q[i] = fp8(fp32(x[i] * scale)); *scale_inv receives
 * fp32(1 / scale). Returns 0, MX_ENULL, MX_ESIZE or MX_EENUM. */
int mx_fp8_quantize_tensor_f32(const float *x, int64_t n, mx_elem elem, mx_tscale_mode mode,
                               uint8_t *q, float *scale_inv);

/* The element pass alone, with a scale already known (a weight's scale from the amax of
 * all its shards): q[i] = fp8(fp32(x[i] * scale)) as above. Returns 0, MX_ENULL, MX_ESIZE,
 * MX_EENUM or MX_EINVAL (a scale that is not positive and finite). */
int mx_fp8_encode_f32(const float *x, int64_t n, mx_elem elem, float scale, uint8_t *q);

/* Block scaling (TE Float8BlockScaling, DeepSeek-V3): one scale per block of brows x bcols
 * elements (1x128 along a row, 128x128 tiles, 128x1 down a column), from the block's own
 * amax; a partial block at the bottom or right edge is a block of its own. scale_inv is
 * ceil(rows/brows) x ceil(cols/bcols), row-major. Returns 0, MX_ENULL, MX_ESIZE (negative
 * or overflowing sizes, a block size < 1) or MX_EENUM. */
int mx_fp8_quantize_blocks_f32(const float *x, int64_t rows, int64_t cols, int64_t brows,
                               int64_t bcols, mx_elem elem, mx_tscale_mode mode, uint8_t *q,
                               float *scale_inv);

/* torchao's float8 scale from an amax (float8_utils.amax_to_scale): fp32(fp8_max / max(amax,
 * 1e-12)) divided in float64, so amax 0 gives fp8_max * 1e12 and Inf gives 0; NaN stays NaN.
 * With MX_TSCALE_POW2, exp2(floor(log2(scale))) with log2 rounded to fp32 (a scale just
 * below 2^k gives 2^k). NaN for an unknown elem. */
float mx_torchao_scale_from_amax(float amax, mx_elem elem, mx_tscale_mode mode);

/* Axiswise scaling as torchao's rowwise recipes: one scale per row (MX_ROWWISE, the row's
 * cols elements) or per column (MX_COLWISE), from that line's amax, NaN propagating (a line
 * holding NaN quantizes to NaN codes; one holding Inf and no NaN has scale 0, its finite
 * elements give 0 and its Inf elements NaN); q[i] = fp8_RNE(clamp(fp32(x[i] * scale), +/-max))
 * in x's layout; scale_inv[line] = fp32(1 / scale). scale_inv holds rows (MX_ROWWISE) or cols
 * (MX_COLWISE) floats. A whole tensor is one row of rows * cols. Returns 0, MX_ENULL,
 * MX_ESIZE or MX_EENUM. */
int mx_fp8_quantize_axiswise_f32(const float *x, int64_t rows, int64_t cols, mx_axis axis, mx_elem elem,
                                 mx_tscale_mode mode, uint8_t *q, float *scale_inv);

/* The element pass of axiswise scaling with the quantization scales already known (a
 * weight's column scales from the amaxes of all its shards): scale holds one per row
 * (MX_ROWWISE) or per column (MX_COLWISE), any value (0 and NaN too, as
 * mx_torchao_scale_from_amax gives them), and q is mx_fp8_quantize_axiswise_f32's for those
 * scales. Returns 0, MX_ENULL, MX_ESIZE or MX_EENUM. */
int mx_fp8_encode_axiswise_f32(const float *x, int64_t rows, int64_t cols, mx_axis axis, mx_elem elem,
                               const float *scale, uint8_t *q);

/* MindSpeed's HiF8 dequantization scale from an amax: fp32(amax * fp32(1 / target)), 1 where
 * that is 0, Inf or NaN. */
float mx_hif8_scale_from_amax(float amax, float target);

/* MindSpeed's HiF8 per-tensor scaling to a target maximum (15 for inputs and weights, 224
 * for gradients): the dequantization scale is fp32(amax * fp32(1 / target)) (amax 0, Inf or
 * NaN give 1), y = hif8_saturating(fp32(x / scale)). Returns 0, MX_ENULL, MX_ESIZE or
 * MX_EINVAL (a target that is not a positive finite HiF8 value). */
int mx_hif8_quantize_tensor_f32(const float *x, int64_t n, float target, uint8_t *q,
                                float *scale_inv);

/* The same with a scale mode: MX_TSCALE_FP32 as above; MX_TSCALE_POW2 (scale_mode: pow2) the
 * smallest power of two at or above that fp32 scale (exact: 2^ceil(log2(scale)); 2^127 at
 * most), so that no element's |x / scale| exceeds the target by more than the fp32 scale
 * lets it, and the division is exact wherever it stays normal. mx_hif8_scale_from_amax_ex:
 * the dequantization scale alone. Returns as above, and MX_EENUM for an unknown mode. */
float mx_hif8_scale_from_amax_ex(float amax, float target, mx_tscale_mode mode);
int mx_hif8_quantize_tensor_ex_f32(const float *x, int64_t n, float target, mx_tscale_mode mode, uint8_t *q,
                                   float *scale_inv);

/* The element pass alone with a known dequantization scale: q[i] = hif8_saturating(fp32(x[i]
 * / scale)). Returns 0, MX_ENULL, MX_ESIZE or MX_EINVAL (a scale not positive and finite). */
int mx_hif8_encode_f32(const float *x, int64_t n, float scale, uint8_t *q);

#ifdef __cplusplus
}
#endif

#endif
