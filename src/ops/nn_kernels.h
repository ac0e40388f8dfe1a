/* Internal: the kernels of the network's non-GEMM layers (softmax of attention, and more
 * as they move here), one table per instruction set: the scalar reference (ops/ref/) and
 * AVX2 (ops/x86/). Unlike the MX kernels these are not bit-identical: a vector kernel sums
 * in another order and uses its own exp, so tests hold it to the reference within a few
 * ulps of fp32. The table in use follows mx_kernel_active() (MXTRAIN_MX_KERNEL). */
#ifndef MXI_NN_KERNELS_H
#define MXI_NN_KERNELS_H

#include <stdint.h>

typedef struct {
    const char *name;
    /* Causal softmax of rows of attention scores, in place. p holds `rows` rows of scores
     * (leading dim ld) for query positions t0, t0+1, ...: row r becomes
     * softmax(scale * p[r][0..t0+r]) and its columns t0+r+1 .. cols-1 become 0. */
    void (*softmax_causal)(float *p /* (rows, ld) */, int64_t ld, int64_t rows, int64_t t0, int64_t cols, float scale);
    /* Softmax backward of the same rows: dp (the gradient of the probabilities) becomes the
     * gradient of the scores, p * (dp - sum(p * dp)) * scale over columns 0..t0+r, and 0 in
     * columns t0+r+1 .. cols-1. */
    void (*softmax_causal_backward)(float *dp /* (rows, ldd) */, int64_t ldd, const float *p /* (rows, ldp) */,
                                    int64_t ldp, int64_t rows, int64_t t0, int64_t cols, float scale);
} mxi_nn_kernels;

extern const mxi_nn_kernels mxi_nn_kernels_ref;
extern const mxi_nn_kernels mxi_nn_kernels_avx2;

/* The table of the kernel mx_kernel_active() names (the AVX2 table for any vector kernel). */
const mxi_nn_kernels *mxi_nn_kernels_active(void);

#endif
