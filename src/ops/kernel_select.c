/* Which kernel tables of the ops layer run (the dequantization and the nn kernels): those
 * of the MX kernel in use (mx_kernel_active(), so MXTRAIN_MX_KERNEL and mx_kernel_select()
 * switch these too): ref, avx2, or avx512 on a CPU with AVX-512 F/BW/DQ/VL (and in the
 * SIMDe build, where it is emulated). */
#include <stdint.h>

#include "mxtrain/mx.h"
#include "ops/nn_kernels.h"
#include "ops/ops_kernels.h"

const mxi_ops_kernels *mxi_ops_kernels_of(mx_kernel kernel) {
    switch (kernel == MX_KERNEL_AUTO ? mx_kernel_active() : kernel) {
    case MX_KERNEL_REF: return &mxi_ops_kernels_ref;
    case MX_KERNEL_AVX2: return &mxi_ops_kernels_avx2;
    case MX_KERNEL_AVX512: return &mxi_ops_kernels_avx512;
    default: return NULL;
    }
}

const mxi_ops_kernels *mxi_ops_kernels_active(void) { return mxi_ops_kernels_of(MX_KERNEL_AUTO); }

const mxi_nn_kernels *mxi_nn_kernels_of(mx_kernel kernel) {
    switch (kernel == MX_KERNEL_AUTO ? mx_kernel_active() : kernel) {
    case MX_KERNEL_REF: return &mxi_nn_kernels_ref;
    case MX_KERNEL_AVX2: return &mxi_nn_kernels_avx2;
    case MX_KERNEL_AVX512: return &mxi_nn_kernels_avx512;
    default: return NULL;
    }
}

const mxi_nn_kernels *mxi_nn_kernels_active(void) { return mxi_nn_kernels_of(MX_KERNEL_AUTO); }

void mxi_bf16_round(uint16_t *y, const float *x, int64_t n) {
    const mxi_nn_kernels *k = mxi_nn_kernels_active();
    MXI_PARALLEL_CHUNKS(n, k->bf16_round(y + i0, x + i0, len));
}

void mxi_bf16_round_f32(float *y, const float *x, int64_t n) {
    const mxi_nn_kernels *k = mxi_nn_kernels_active();
    MXI_PARALLEL_CHUNKS(n, k->bf16_round_f32(y + i0, x + i0, len));
}

void mxi_bf16_operand(void *y, const float *x, int64_t n, bool as_bf16) {
    if (as_bf16) mxi_bf16_round(y, x, n);
    else mxi_bf16_round_f32(y, x, n);
}

void mxi_bf16_widen(float *y, const uint16_t *x, int64_t n, int add) {
    const mxi_nn_kernels *k = mxi_nn_kernels_active();
    MXI_PARALLEL_CHUNKS(n, k->bf16_widen(y + i0, x + i0, len, add));
}
