/* Internal: the kernels of the ops layer, one table per instruction set (the scalar
 * reference, AVX2, AVX-512), bit-identical. The table in use is that of the bundle
 * mx_kernel_active() names (ops/kernels.h), so MXTRAIN_KERNEL and mx_kernel_select()
 * switch these kernels too.
 *
 * Shapes are a matrix's own (rows, cols), row-major; RB = ceil(rows/32) and CB =
 * ceil(cols/32) count a plane's blocks (as in numerics/mx_internal.h). These kernels make
 * GEMM operands; the GEMM's letters M, N, K are those of ops/gemm.h. */
#ifndef MXI_OPS_KERNELS_H
#define MXI_OPS_KERNELS_H

#include <stdint.h>

#include "core/bits.h"
#include "ops/mx_gemm.h"

/* The values of an element format's 256 codes (E4M3, E5M2, HiF8), built once. */
typedef struct {
    uint32_t f32[256];          // each code's value as fp32 bits, every NaN code the canonical NaN
    uint32_t bf16[256];         // the same as bf16 bits (exact: at most 3 mantissa bits), in the low half
    uint8_t lo[128], hi[128];   // bf16[c]'s low and high byte for c < 128: the magnitudes of FP8's
                                // sign-magnitude codes, the byte-permute dequantizer's tables
    uint8_t special, nan;       // FP8: the smallest c < 128 whose value is NaN or infinite; NaN (128: none)
    int pow2_lo, pow2_hi;       // FP8: the e for which every nonzero finite value times 2^e is a normal bf16
                                // (mxi_fp8_values16_range); HiF8: none (lo > hi)
} mxi_code_values;

/* The values of elem's codes; NULL for a value that is no 8-bit element format. */
const mxi_code_values *mxi_code_values_of(mx_elem elem);

/* One dequantization call: the plane and the values of its element format's codes. */
typedef struct {
    const mxi_mx_plane *p;
    const mxi_code_values *values;   // mxi_code_values_of(p->elem)
    float *y;       // (rows, cols) dense fp32 output, when y16 is NULL
    uint16_t *y16;  // (rows, cols) dense bf16 output instead (the fp32 values to nearest even)
} mxi_dequant_job;

/* Whether a kernel overwrites its output or adds to it. */
typedef enum { MXI_ROW_SET, MXI_ROW_ADD } mxi_row_write;

typedef struct {
    const char *name;
    /* Rows [r0, r1) of the plane into job->y (or job->y16). For a colwise plane r0 is a
     * multiple of 32. */
    void (*dequant_rows)(const mxi_dequant_job *job, int64_t r0, int64_t r1);
    /* y (rows, cols) dense = x (rows, cols), bf16 with leading dim ld, widened to fp32. */
    void (*widen_bf16)(float *y, const uint16_t *x, int64_t ld, int64_t rows, int64_t cols);
    /* y[i] = table[q[i]] for n codes (the values of a per-tensor recipe's codes, as fp32 bits). */
    void (*lut32)(uint32_t *y, const uint8_t *q, int64_t n, const uint32_t table[256]);
    /* y[i] = the low 16 bits of table[q[i]] (the same values as bf16). */
    void (*lut16)(uint16_t *y, const uint8_t *q, int64_t n, const uint32_t table[256]);
    /* FP8 codes q (rows, cols) to bf16 y (rows, cols) with power-of-two scales of brows x
     * bcols blocks: y[r][c] = bf16(value(q[r][c]) * 2^e[(r / brows) * nbc + c / bcols]), nbc =
     * ceil(cols / bcols), bcols 1, a multiple of 64 or at least cols; NaN and infinity codes keep their
     * value. The caller sees to it that every nonzero finite value times its scale is a
     * normal bf16 (so the result is exact). */
    void (*pow2_rows16)(uint16_t *y, const uint8_t *q, int64_t rows, int64_t cols, const int16_t *e, int64_t brows,
                        int64_t bcols, const mxi_code_values *v);
    /* One row of a scaled product's fp32 result (ops/scaled_gemm.h): c[j] = (sa * sb[j]) *
     * acc[j], each step an fp32 rounding; with MXI_ROW_ADD c[j] = c[j] + that. sb NULL: the
     * one scale s for every j. c may be acc. */
    void (*scale_row)(float *c, const float *acc, int64_t n, float sa, const float *sb, float s, mxi_row_write w);
} mxi_ops_kernels;

extern const mxi_ops_kernels mxi_ops_kernels_ref;
extern const mxi_ops_kernels mxi_ops_kernels_avx2;
extern const mxi_ops_kernels mxi_ops_kernels_avx512;

/* The table of a kernel (MX_KERNEL_AUTO: of the one mx_kernel_active() names); NULL for
 * a value that is no kernel: a view of the kernel's bundle (ops/kernels.h). Only call a
 * table's functions if mx_kernel_available(). */
const mxi_ops_kernels *mxi_ops_kernels_of(mx_kernel kernel);

/* The table of the kernel mx_kernel_active() names. */
const mxi_ops_kernels *mxi_ops_kernels_active(void);

/* The reference value of one element: value(q) * 2^(s-127), the canonical NaN for a NaN
 * code or scale. The SIMD kernels fall back to it for blocks with special values. */
static inline float mxi_dequant_one(const mxi_code_values *values, uint8_t q, uint8_t s) {
    float v = mxi_bits_f32(values->f32[q]);
    if (s == 0xFF || v != v) return mxi_bits_f32(MXI_CANONICAL_NAN);
    // 2^(s-127) as fp32 bits: a normal for s >= 1, the subnormal 2^-127 for s == 0
    float scale = mxi_bits_f32(s ? (uint32_t)s << 23 : 0x00400000u);
    return v * scale;   // exact unless it overflows (|value| * 2^127 > FLT_MAX)
}

/* n elements from element offset o of the job's plane, one by one through the reference,
 * into its output (y, or y16 as bf16); scales s, one per element when s_step, else one for
 * all. The SIMD kernels' path for blocks with special values. */
static inline void mxi_dequant_run_ref(const mxi_dequant_job *job, int64_t o, const uint8_t *s, int s_step, int64_t n) {
    const uint8_t *q = job->p->q + o;
    for (int64_t i = 0; i < n; i++) {
        float v = mxi_dequant_one(job->values, q[i], s[s_step ? i : 0]);
        if (job->y16) job->y16[o + i] = mxi_f32_to_bf16(v);
        else job->y[o + i] = v;
    }
}

#endif
