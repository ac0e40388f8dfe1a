/* AdamW's moments as stored (see moments.h). */
#include "train/moments.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/bits.h"
#include "mxtrain/error.h"
#include "mxtrain/mx.h"
#include "mxtrain/scaled.h"

enum { BLOCK = 32 };

uint64_t mxi_moment_bytes(mx_state_dtype dtype, int64_t n, int spans) {
    uint64_t u = n > 0 ? (uint64_t)n : 0, s = spans > 0 ? (uint64_t)spans : 0;
    switch (dtype) {
    case MX_STATE_BF16: return 2 * u;
    case MX_STATE_MXFP8: return u + (u + BLOCK - 1) / BLOCK;
    case MX_STATE_FP8: return u + s * sizeof(float);
    default: return 4 * u;
    }
}

int mxi_moment_alloc(mxi_moment *m, mx_state_dtype dtype, bool second, int64_t n, int spans) {
    memset(m, 0, sizeof *m);
    if (n < 0 || n % BLOCK || spans < 0) return MX_ESIZE;
    *m = (mxi_moment){.dtype = dtype, .root = second && dtype == MX_STATE_MXFP8, .n = n, .spans = spans};
    size_t k = n ? (size_t)n : 1;
    bool ok;
    if (dtype == MX_STATE_FP32) {
        ok = (m->f32 = calloc(k, sizeof *m->f32)) != NULL;
    } else if (dtype == MX_STATE_BF16) {
        ok = (m->bf16 = calloc(k, sizeof *m->bf16)) != NULL;
    } else if (dtype == MX_STATE_MXFP8) {
        m->q = calloc(k, 1), m->scales = calloc(k / BLOCK + 1, 1);   // E4M3 0x00 and scale 2^-127: zero
        ok = m->q && m->scales;
    } else {
        m->q = calloc(k, 1), m->scale_inv = malloc((spans ? (size_t)spans : 1) * sizeof *m->scale_inv);
        ok = m->q && m->scale_inv;
        for (int s = 0; ok && s < spans; s++) m->scale_inv[s] = 1.0f;   // TE quantizes the zeros with scale 1
        for (int c = 0; c < 256; c++) m->e4m3[c] = mx_fp8_to_f32((uint8_t)c, MX_E4M3);
    }
    if (!ok) {
        mxi_moment_free(m);
        return MX_ENOMEM;
    }
    return MX_OK;
}

void mxi_moment_free(mxi_moment *m) {
    free(m->f32), free(m->bf16), free(m->q), free(m->scales), free(m->scale_inv);
    memset(m, 0, sizeof *m);
}

mxi_fp8_scaling mxi_fp8_scaling_of(float amax) {
    // TE FusedAdam._apply_scale: scale = amax / 448 and the quantizer's 1 / scale, each an
    // fp32 operation; the cast kernel's scale_inv is 1 / q. amax 0 (TE: 1 / 0) gives q 1.
    float scale = amax / 448.0f, q = amax > 0.0f && isfinite(amax) ? 1.0f / scale : 1.0f;
    if (isinf(q)) q = FLT_MAX;   // amax below 448 * 2^-128
    return (mxi_fp8_scaling){.q = q, .scale_inv = 1.0f / q};
}

void mxi_moment_put_fp8(mxi_moment *m, int64_t at, int64_t len, const float *in, const mxi_fp8_scaling *sc) {
    const mx_elem_traits *t = mx_elem_traits_of(MX_E4M3);
    for (int64_t i = 0; i < len; i++) m->q[at + i] = t->from_f32(in[i] * sc->q);
}

bool mxi_moment_restore_fp8(mxi_moment *m, int span, int64_t at, int64_t len, const float *in, float scale_inv) {
    if (!(scale_inv > 0.0f) || isinf(scale_inv)) return false;
    const mx_elem_traits *t = mx_elem_traits_of(MX_E4M3);
    // a value c * scale_inv (rounded) divided by scale_inv is c within 2^-23: the nearest
    // E4M3 value is c, whose neighbours lie 2^-4 of it away or more
    for (int64_t i = 0; i < len; i++)
        if (mxi_f32_bits(m->e4m3[t->from_f32(in[i] / scale_inv)] * scale_inv) != mxi_f32_bits(in[i])) return false;
    for (int64_t i = 0; i < len; i++) m->q[at + i] = t->from_f32(in[i] / scale_inv);
    m->scale_inv[span] = scale_inv;
    return true;
}

/* MXFP8 spans go a piece at a time through a buffer on the stack, whole blocks each. */
enum { PIECE = 2048 };

void mxi_moment_read(const mxi_moment *m, int span, int64_t at, int64_t len, float *out) {
    if (len <= 0) return;
    if (m->dtype == MX_STATE_FP32) {
        memcpy(out, m->f32 + at, (size_t)len * sizeof *out);
    } else if (m->dtype == MX_STATE_BF16) {
        for (int64_t i = 0; i < len; i++) out[i] = mxi_bf16_to_f32(m->bf16[at + i]);
    } else if (m->dtype == MX_STATE_FP8) {
        float s = m->scale_inv[span];
        for (int64_t i = 0; i < len; i++) out[i] = m->e4m3[m->q[at + i]] * s;
    } else {
        float buf[PIECE];
        for (int64_t b = 0; b < len; b += PIECE) {
            int64_t k = len - b < PIECE ? len - b : PIECE, whole = (k + BLOCK - 1) / BLOCK * BLOCK;
            mx_dequantize_f32(m->q + at + b, m->scales + (at + b) / BLOCK, 1, whole, MX_ROWWISE, MX_E4M3, buf);
            for (int64_t i = 0; i < k; i++) out[b + i] = m->root ? buf[i] * buf[i] : buf[i];
        }
    }
}

void mxi_moment_write(mxi_moment *m, int span, int64_t at, int64_t len, const float *in) {
    if (len <= 0) return;
    if (m->dtype == MX_STATE_FP32) {
        memcpy(m->f32 + at, in, (size_t)len * sizeof *in);
    } else if (m->dtype == MX_STATE_BF16) {
        for (int64_t i = 0; i < len; i++) m->bf16[at + i] = mxi_f32_to_bf16(in[i]);
    } else if (m->dtype == MX_STATE_FP8) {
        mxi_fp8_scaling sc = mxi_fp8_scaling_of(mx_amax_f32(in, len));
        mxi_moment_put_fp8(m, at, len, in, &sc);
        m->scale_inv[span] = sc.scale_inv;
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

float *mxi_moment_span(const mxi_moment *m, int span, int64_t at, int64_t len, float *scratch) {
    if (m->dtype == MX_STATE_FP32) return m->f32 + at;
    mxi_moment_read(m, span, at, len, scratch);
    return scratch;
}
