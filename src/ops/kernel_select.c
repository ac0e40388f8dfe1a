/* The kernel bundles (ops/kernels.h): which tables each instruction set runs, built once
 * with the reference filling the slots a set leaves NULL, and the one lookup from mx_kernel
 * to a bundle that every family's accessor goes through. */
#include <pthread.h>
#include <stdint.h>

#include "ops/kernels.h"

/* Each instruction set's tables as its files define them (the MX table from numerics'
 * own lookup, the layer below). */
static const struct {
    const mxi_ops_kernels *ops;
    const mxi_nn_kernels *nn;
} isa_tables[] = {
    [MX_KERNEL_REF] = {.ops = &mxi_ops_kernels_ref, .nn = &mxi_nn_kernels_ref},
    [MX_KERNEL_AVX2] = {.ops = &mxi_ops_kernels_avx2, .nn = &mxi_nn_kernels_avx2},
    [MX_KERNEL_AVX512] = {.ops = &mxi_ops_kernels_avx512, .nn = &mxi_nn_kernels_avx512},
};
enum { N_ISAS = sizeof isa_tables / sizeof isa_tables[0] };

static mxi_kernels bundles[N_ISAS];
static pthread_once_t bundles_once = PTHREAD_ONCE_INIT;

/* Every slot is listed below: a table holds its name and then only slots. */
_Static_assert(sizeof(mxi_mx_kernels) == 13 * sizeof(void *), "a new mx slot needs its line in mxi_kernels_fill");
_Static_assert(sizeof(mxi_ops_kernels) == 7 * sizeof(void *), "a new ops slot needs its line in mxi_kernels_fill");
_Static_assert(sizeof(mxi_nn_kernels) == 22 * sizeof(void *), "a new nn slot needs its line in mxi_kernels_fill");

#define REF_IF_NULL(table, ref, slot) do { if (!(table).slot) (table).slot = (ref)->slot; } while (0)

void mxi_kernels_fill(mxi_kernels *b) {
    REF_IF_NULL(b->mx, &mxi_mx_kernels_ref, quantize_rows);
    REF_IF_NULL(b->mx, &mxi_mx_kernels_ref, encode_fp8);
    REF_IF_NULL(b->mx, &mxi_mx_kernels_ref, encode_fp8_vec);
    REF_IF_NULL(b->mx, &mxi_mx_kernels_ref, encode_fp8_rows);
    REF_IF_NULL(b->mx, &mxi_mx_kernels_ref, encode_fp8_cols);
    REF_IF_NULL(b->mx, &mxi_mx_kernels_ref, values16_fp8_blocks);
    REF_IF_NULL(b->mx, &mxi_mx_kernels_ref, values16_fp8_cols);
    REF_IF_NULL(b->mx, &mxi_mx_kernels_ref, encode_hif8);
    REF_IF_NULL(b->mx, &mxi_mx_kernels_ref, amax);
    REF_IF_NULL(b->mx, &mxi_mx_kernels_ref, amax_bits);
    REF_IF_NULL(b->mx, &mxi_mx_kernels_ref, amax_bits_cols);
    REF_IF_NULL(b->mx, &mxi_mx_kernels_ref, amax_bits_rows);

    REF_IF_NULL(b->ops, &mxi_ops_kernels_ref, dequant_rows);
    REF_IF_NULL(b->ops, &mxi_ops_kernels_ref, widen_bf16);
    REF_IF_NULL(b->ops, &mxi_ops_kernels_ref, lut32);
    REF_IF_NULL(b->ops, &mxi_ops_kernels_ref, lut16);
    REF_IF_NULL(b->ops, &mxi_ops_kernels_ref, pow2_rows16);
    REF_IF_NULL(b->ops, &mxi_ops_kernels_ref, scale_row);

    const mxi_nn_kernels *nn = &mxi_nn_kernels_ref;
    REF_IF_NULL(b->nn, nn, att_gemm);
    REF_IF_NULL(b->nn, nn, att_gemm_bf16);
    REF_IF_NULL(b->nn, nn, att_online_softmax);
    REF_IF_NULL(b->nn, nn, att_probs);
    REF_IF_NULL(b->nn, nn, att_dscores_bf16);
    REF_IF_NULL(b->nn, nn, bf16_round);
    REF_IF_NULL(b->nn, nn, bf16_pair_rows);
    REF_IF_NULL(b->nn, nn, bf16_round_f32);
    REF_IF_NULL(b->nn, nn, bf16_widen);
    REF_IF_NULL(b->nn, nn, rmsnorm_forward);
    REF_IF_NULL(b->nn, nn, rmsnorm_backward);
    REF_IF_NULL(b->nn, nn, rmsnorm_dweight);
    REF_IF_NULL(b->nn, nn, swiglu_forward);
    REF_IF_NULL(b->nn, nn, swiglu_backward);
    REF_IF_NULL(b->nn, nn, adamw);
    REF_IF_NULL(b->nn, nn, rope);
    REF_IF_NULL(b->nn, nn, attend);
    REF_IF_NULL(b->nn, nn, add);
    REF_IF_NULL(b->nn, nn, scale);
    REF_IF_NULL(b->nn, nn, sum_squares);
    REF_IF_NULL(b->nn, nn, cross_entropy);
}

static void build_bundles(void) {
    for (int k = MX_KERNEL_REF; k < N_ISAS; k++) {
        bundles[k] = (mxi_kernels){.mx = *mxi_mx_kernels_of((mx_kernel)k), .ops = *isa_tables[k].ops,
                                   .nn = *isa_tables[k].nn};
        mxi_kernels_fill(&bundles[k]);
    }
}

const mxi_kernels *mxi_kernels_of(mx_kernel kernel) {
    if (kernel == MX_KERNEL_AUTO) kernel = mx_kernel_active();
    if (kernel == MX_KERNEL_AUTO || (unsigned)kernel >= N_ISAS) return NULL;
    pthread_once(&bundles_once, build_bundles);
    return &bundles[kernel];
}

/* Each family's view of the lookup. */

const mxi_ops_kernels *mxi_ops_kernels_of(mx_kernel kernel) {
    const mxi_kernels *b = mxi_kernels_of(kernel);
    return b ? &b->ops : NULL;
}

const mxi_ops_kernels *mxi_ops_kernels_active(void) { return mxi_ops_kernels_of(MX_KERNEL_AUTO); }

const mxi_nn_kernels *mxi_nn_kernels_of(mx_kernel kernel) {
    const mxi_kernels *b = mxi_kernels_of(kernel);
    return b ? &b->nn : NULL;
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
