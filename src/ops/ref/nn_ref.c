/* Reference kernels of the network's non-GEMM layers: plain scalar code, in the order the
 * formulas read. The vector kernels are checked against these. */
#include <math.h>
#include <string.h>

#include "ops/nn_kernels.h"

static void ref_softmax_causal(float *p, int64_t ld, int64_t rows, int64_t t0, int64_t cols, float scale) {
    for (int64_t r = 0; r < rows; r++) {
        float *row = p + r * ld;
        int64_t n = t0 + r + 1;   // keys 0..t0+r are visible
        float maxv = -INFINITY;
        for (int64_t s = 0; s < n; s++) {
            row[s] *= scale;
            if (row[s] > maxv) maxv = row[s];
        }
        float sum = 0.0f;
        for (int64_t s = 0; s < n; s++) {
            row[s] = expf(row[s] - maxv);
            sum += row[s];
        }
        float inv = 1.0f / sum;
        for (int64_t s = 0; s < n; s++) row[s] *= inv;
        for (int64_t s = n; s < cols; s++) row[s] = 0.0f;
    }
}

static void ref_softmax_causal_backward(float *dp, int64_t ldd, const float *p, int64_t ldp, int64_t rows, int64_t t0,
                                        int64_t cols, float scale) {
    for (int64_t r = 0; r < rows; r++) {
        float *d = dp + r * ldd;
        const float *pr = p + r * ldp;
        int64_t n = t0 + r + 1;
        float dot = 0.0f;
        for (int64_t s = 0; s < n; s++) dot += pr[s] * d[s];
        for (int64_t s = 0; s < n; s++) d[s] = pr[s] * (d[s] - dot) * scale;
        for (int64_t s = n; s < cols; s++) d[s] = 0.0f;
    }
}

static inline uint32_t bf16_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (u | 0x00400000u) & 0xFFFF0000u;   // quiet NaN
    return (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;                        // nearest even
}

static void ref_bf16_round(uint16_t *y, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = (uint16_t)(bf16_bits(x[i]) >> 16);
}

static void ref_bf16_round_f32(float *y, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        uint32_t u = bf16_bits(x[i]);
        memcpy(&y[i], &u, 4);
    }
}

static void ref_bf16_widen(float *y, const uint16_t *x, int64_t n, int add) {
    for (int64_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)x[i] << 16;   // bf16 is the top half of fp32
        float f;
        memcpy(&f, &u, 4);
        y[i] = add ? y[i] + f : f;
    }
}

const mxi_nn_kernels mxi_nn_kernels_ref = {"ref", ref_softmax_causal, ref_softmax_causal_backward,
                                           ref_bf16_round, ref_bf16_round_f32, ref_bf16_widen};
