/* Internal: AdamW's moments as stored (training.exp_avg_dtype, exp_avg_sq_dtype).
 *
 * A moment of the rank's shard, n elements (n a multiple of 32: every tensor's span of the
 * shard is), in fp32, bf16 (round to nearest even) or MXFP8: E4M3 codes with one E8M0 scale
 * per 32 consecutive elements, as the MX numerics quantize a row (SPEC §4, floor scales). The
 * second moment is stored in MXFP8 as its square root: v spans twice the binary orders of
 * magnitude of sqrt(v), and E4M3's 17.8 within a block of 32 keep small v from flushing to
 * zero beside a large one, where AdamW would divide by eps alone. AdamW itself runs in fp32
 * on spans read from the store and written back (mxi_adamw_update_moments). */
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
    float *f32;          // (n) fp32
    uint16_t *bf16;      // (n) bf16 bit patterns
    uint8_t *q, *scales; // (n) E4M3 codes, (n / 32) E8M0 scales
} mxi_moment;

/* Bytes a moment of n elements takes in dtype. */
uint64_t mxi_moment_bytes(mx_state_dtype dtype, int64_t n);
/* A zeroed moment of n elements; second: the second moment. MX_ENOMEM, MX_ESIZE (n not a
 * multiple of 32). */
int mxi_moment_alloc(mxi_moment *m, mx_state_dtype dtype, bool second, int64_t n);
void mxi_moment_free(mxi_moment *m);

/* Elements [at, at + len) as fp32 into out (len), and from in back into the store. at is a
 * multiple of 32; len may end inside a block: write re-encodes that whole block from in and
 * the block's stored elements past it. */
void mxi_moment_read(const mxi_moment *m, int64_t at, int64_t len, float *out);
void mxi_moment_write(mxi_moment *m, int64_t at, int64_t len, const float *in);

/* The span [at, at + len) as fp32: the store itself when it is fp32, else read into scratch
 * (len floats). */
float *mxi_moment_span(const mxi_moment *m, int64_t at, int64_t len, float *scratch);

#endif
