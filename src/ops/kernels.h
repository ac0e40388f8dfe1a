/* Internal: the kernels of one instruction set, one table per family, and the one lookup
 * from an mx_kernel to them. mx_kernel_active() (MXTRAIN_KERNEL, mx_kernel_select())
 * names one bundle, so every family switches together. The bundles live in ops/, the
 * lowest layer that sees every family's table type; numerics looks up its own MX table
 * (mxi_mx_kernels_of), which the bundle holds too. */
#ifndef MXI_KERNELS_H
#define MXI_KERNELS_H

#include "mxtrain/mx.h"
#include "numerics/mx_internal.h"
#include "ops/nn_kernels.h"
#include "ops/ops_kernels.h"

typedef struct {
    mxi_mx_kernels mx;    // MX quantization (numerics/)
    mxi_ops_kernels ops;  // dequantization, bf16 widening of GEMM operands
    mxi_nn_kernels nn;    // the layers' non-GEMM kernels
} mxi_kernels;

/* The bundle of a kernel (MX_KERNEL_AUTO: of the one mx_kernel_active() names); NULL for a
 * value that is no kernel. Every slot is set: one an instruction set leaves NULL holds the
 * reference's function. Only call its functions if mx_kernel_available(kernel). */
const mxi_kernels *mxi_kernels_of(mx_kernel kernel);

/* Set every NULL slot of b to the reference's function (what mxi_kernels_of does to each
 * instruction set's tables once; exposed for tests). */
void mxi_kernels_fill(mxi_kernels *b);

#endif
