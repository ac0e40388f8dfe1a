/* Internal: AdamW's moments as stored (training.exp_avg_dtype, exp_avg_sq_dtype).
 *
 * A moment of the rank's shard, n elements (n a multiple of 32: every tensor's span of the
 * shard is), in fp32, bf16 (round to nearest even), MXFP8 or FP8.
 *
 * MXFP8: E4M3 codes with one E8M0 scale per 32 consecutive elements, as the MX numerics
 * quantize a row (SPEC §4, floor scales). The second moment is stored in MXFP8 as its
 * square root: v spans twice the binary orders of magnitude of sqrt(v), and E4M3's 17.8
 * within a block of 32 keep small v from flushing to zero beside a large one, where AdamW
 * would divide by eps alone.
 *
 * FP8: TransformerEngine FusedAdam's uint8 state (Megatron-LM's precision-aware optimizer,
 * exp_avg_dtype / exp_avg_sq_dtype fp8): E4M3 codes with one fp32 scale per tensor's span
 * of the shard (the piece of a parameter a rank's distributed optimizer holds), both
 * moments stored as they are (v itself, not its root). A span's values are read as
 * fp32(e4m3(code) * scale_inv). Each step quantizes the updated values with the scale of
 * their own amax (current, not delayed): scale = fp32(amax / 448), q = fp32(1 / scale),
 * code = e4m3(fp32(x * q)) rounded to nearest even and saturating at +/-448, scale_inv =
 * fp32(1 / q). A new store reads zeros with scale_inv 1 (TE's quantizer starts at scale 1).
 * Where TE would divide by zero (amax 0: a span of zeros, or padding only) the quantization
 * scale q is 1, and a q that overflows is FLT_MAX (TE's current-scaling guards), so that no
 * code becomes NaN.
 *
 * AdamW itself runs in fp32 on spans read from the store and written back
 * (mxi_adamw_update_moments). Every call names the span (a tensor's index) it reads or
 * writes: the FP8 store's scale is the span's. */
#ifndef MXI_MOMENTS_H
#define MXI_MOMENTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "mxtrain/config.h"

typedef struct {
    mx_state_dtype dtype;
    bool root;           // stored as the square root (the second moment, MXFP8)
    int64_t n;           // elements
    int spans;           // tensors' spans of the shard (FP8: a scale each)
    float *f32;          // (n) fp32
    uint16_t *bf16;      // (n) bf16 bit patterns
    uint8_t *q;          // (n) E4M3 codes (MXFP8, FP8)
    uint8_t *scales;     // (n / 32) E8M0 scales (MXFP8)
    float *scale_inv;    // (spans) FP8: the dequantization scale of each span's codes
    float e4m3[256];     // FP8: each code's value
} mxi_moment;

/* Bytes a moment of n elements over `spans` tensor spans takes in dtype: FP8's codes and a
 * scale_inv a span. */
uint64_t mxi_moment_bytes(mx_state_dtype dtype, int64_t n, int spans);
/* A zeroed moment of n elements over `spans` tensor spans; second: the second moment.
 * MX_ENOMEM, MX_ESIZE (n not a multiple of 32, spans < 0). */
int mxi_moment_alloc(mxi_moment *m, mx_state_dtype dtype, bool second, int64_t n, int spans);
void mxi_moment_free(mxi_moment *m);

/* Elements [at, at + len) of span `span` as fp32 into out (len), and from in back into the
 * store. at is a multiple of 32. MXFP8: len may end inside a block: write re-encodes that
 * whole block from in and the block's stored elements past it. FP8: write takes the span's
 * scale from these values' amax (TE's _apply_scale), so it writes every element of the
 * span at once (a checkpoint's span as loaded). */
void mxi_moment_read(const mxi_moment *m, int span, int64_t at, int64_t len, float *out);
void mxi_moment_write(mxi_moment *m, int span, int64_t at, int64_t len, const float *in);

/* The span [at, at + len) as fp32: the store itself when it is fp32, else read into scratch
 * (len floats). */
float *mxi_moment_span(const mxi_moment *m, int span, int64_t at, int64_t len, float *scratch);

/* FP8's scales of a span whose largest magnitude is amax: q quantizes (x * q), scale_inv
 * dequantizes. */
typedef struct {
    float q, scale_inv;
} mxi_fp8_scaling;
mxi_fp8_scaling mxi_fp8_scaling_of(float amax);

/* FP8, a span a piece at a time (the optimizer's step): elements [at, at + len) as codes of
 * in * sc->q, leaving the span's scale_inv as it is: the span's other pieces may still hold
 * codes of the old one. Once every piece is written, m->scale_inv[span] = sc->scale_inv. */
void mxi_moment_put_fp8(mxi_moment *m, int64_t at, int64_t len, const float *in, const mxi_fp8_scaling *sc);

/* FP8, a checkpoint's span with the scale_inv it was saved with: stores in as codes of that
 * scale_inv when every value is one exactly (fp32(e4m3(c) * scale_inv) == in[i]), so that
 * the span reads back bit for bit, and returns true; else leaves the store as it was and
 * returns false. */
bool mxi_moment_restore_fp8(mxi_moment *m, int span, int64_t at, int64_t len, const float *in, float scale_inv);

#endif
