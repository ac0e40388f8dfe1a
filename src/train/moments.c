/* AdamW's moments as stored (see moments.h). */
#include "train/moments.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/bits.h"
#include "mxtrain/error.h"
#include "mxtrain/mx.h"

enum { BLOCK = 32 };

uint64_t mxi_moment_bytes(mx_state_dtype dtype, int64_t n) {
    uint64_t u = n > 0 ? (uint64_t)n : 0;
    return dtype == MX_STATE_BF16 ? 2 * u : dtype == MX_STATE_MXFP8 ? u + (u + BLOCK - 1) / BLOCK : 4 * u;
}

int mxi_moment_alloc(mxi_moment *m, mx_state_dtype dtype, bool second, int64_t n) {
    memset(m, 0, sizeof *m);
    if (n < 0 || n % BLOCK) return MX_ESIZE;
    *m = (mxi_moment){.dtype = dtype, .root = second && dtype == MX_STATE_MXFP8, .n = n};
    size_t k = n ? (size_t)n : 1;
    if (dtype == MX_STATE_FP32) m->f32 = calloc(k, sizeof *m->f32);
    else if (dtype == MX_STATE_BF16) m->bf16 = calloc(k, sizeof *m->bf16);
    else m->q = calloc(k, 1), m->scales = calloc(k / BLOCK + 1, 1);   // E4M3 0x00 and scale 2^-127: zero
    bool ok = dtype == MX_STATE_FP32 ? m->f32 != NULL : dtype == MX_STATE_BF16 ? m->bf16 != NULL : m->q && m->scales;
    if (!ok) {
        mxi_moment_free(m);
        return MX_ENOMEM;
    }
    return MX_OK;
}

void mxi_moment_free(mxi_moment *m) {
    free(m->f32), free(m->bf16), free(m->q), free(m->scales);
    memset(m, 0, sizeof *m);
}

/* MXFP8 spans go a piece at a time through a buffer on the stack, whole blocks each. */
enum { PIECE = 2048 };

void mxi_moment_read(const mxi_moment *m, int64_t at, int64_t len, float *out) {
    if (len <= 0) return;
    if (m->dtype == MX_STATE_FP32) {
        memcpy(out, m->f32 + at, (size_t)len * sizeof *out);
    } else if (m->dtype == MX_STATE_BF16) {
        for (int64_t i = 0; i < len; i++) out[i] = mxi_bf16_to_f32(m->bf16[at + i]);
    } else {
        float buf[PIECE];
        for (int64_t b = 0; b < len; b += PIECE) {
            int64_t k = len - b < PIECE ? len - b : PIECE, whole = (k + BLOCK - 1) / BLOCK * BLOCK;
            mx_dequantize_f32(m->q + at + b, m->scales + (at + b) / BLOCK, 1, whole, MX_ROWWISE, MX_E4M3, buf);
            for (int64_t i = 0; i < k; i++) out[b + i] = m->root ? buf[i] * buf[i] : buf[i];
        }
    }
}

void mxi_moment_write(mxi_moment *m, int64_t at, int64_t len, const float *in) {
    if (len <= 0) return;
    if (m->dtype == MX_STATE_FP32) {
        memcpy(m->f32 + at, in, (size_t)len * sizeof *in);
    } else if (m->dtype == MX_STATE_BF16) {
        for (int64_t i = 0; i < len; i++) m->bf16[at + i] = mxi_f32_to_bf16(in[i]);
    } else {
        float buf[PIECE];
        for (int64_t b = 0; b < len; b += PIECE) {
            int64_t k = len - b < PIECE ? len - b : PIECE, whole = (k + BLOCK - 1) / BLOCK * BLOCK;
            if (whole > k)   // the block the span ends inside: its stored tail too
                mx_dequantize_f32(m->q + at + b + whole - BLOCK, m->scales + (at + b + whole) / BLOCK - 1, 1, BLOCK,
                                  MX_ROWWISE, MX_E4M3, buf + whole - BLOCK);
            for (int64_t i = 0; i < k; i++) buf[i] = m->root ? sqrtf(in[b + i]) : in[b + i];
            mx_quantize_f32(buf, 1, whole, MX_ROWWISE, MX_E4M3, MX_SCALE_FLOOR, m->q + at + b,
                            m->scales + (at + b) / BLOCK);
        }
    }
}

float *mxi_moment_span(const mxi_moment *m, int64_t at, int64_t len, float *scratch) {
    if (m->dtype == MX_STATE_FP32) return m->f32 + at;
    mxi_moment_read(m, at, len, scratch);
    return scratch;
}
