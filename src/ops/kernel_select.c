/* Which kernel table of the ops layer runs: the one of the MX kernel in use
 * (mx_kernel_active(), so MXTRAIN_MX_KERNEL and mx_kernel_select() switch these too). */
#include "mxtrain/mx.h"
#include "ops/nn_kernels.h"
#include "ops/ops_kernels.h"

const mxi_ops_kernels *mxi_ops_kernels_active(void) {
    return mx_kernel_active() == MX_KERNEL_AVX2 ? &mxi_ops_kernels_avx2 : &mxi_ops_kernels_ref;
}

const mxi_nn_kernels *mxi_nn_kernels_active(void) {
    return mx_kernel_active() == MX_KERNEL_REF ? &mxi_nn_kernels_ref : &mxi_nn_kernels_avx2;
}
