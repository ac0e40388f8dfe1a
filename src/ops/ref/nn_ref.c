/* Reference kernels of the network's non-GEMM layers: plain scalar code, in the order the
 * formulas read. The vector kernels are checked against these. */
#include <math.h>

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

const mxi_nn_kernels mxi_nn_kernels_ref = {"ref", ref_softmax_causal, ref_softmax_causal_backward};
