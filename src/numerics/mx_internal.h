/* Internal: the MX kernel interface (one per instruction set, BLIS-style) and the scalar
 * helpers every kernel shares. */
#ifndef MXI_MX_INTERNAL_H
#define MXI_MX_INTERNAL_H

#include <stdint.h>

#include "core/bits.h"
#include "mxtrain/mx.h"

typedef enum { MXI_SRC_F32 = 0, MXI_SRC_BF16 = 1 } mxi_src;

/* One quantization call. Shapes are (rows, cols), row-major; RB = ceil(rows/32) and
 * CB = ceil(cols/32) count the blocks (the letters of the ops kernels, ops/ops_kernels.h). */
typedef struct {
    const void *x;        // (rows, cols) fp32 or bf16 bits
    mxi_src src;
    int64_t rows, cols;
    const mx_elem_traits *elem;
    mx_scale_mode mode;
    uint8_t *q_row;       // (rows, cols) rowwise element plane, or NULL
    uint8_t *s_row;       // (rows, CB)   rowwise scales
    uint8_t *q_col;       // (rows, cols) colwise element plane, or NULL
    uint8_t *s_col;       // (RB, cols)   colwise scales
    uint8_t *q_tile;      // (rows, cols) element plane of 32x32 tiles (one scale per tile), or NULL
    uint8_t *s_tile;      // (RB, CB)     tile scales
} mxi_quant_job;

typedef struct {
    const char *name;
    /* Quantize rows [r0, r1) of the job into every plane it asks for. When the job has a
     * colwise or a tile plane, r0 is a multiple of 32 and r1 is a multiple of 32 or the
     * last row. */
    void (*quantize_rows)(const mxi_quant_job *job, int64_t r0, int64_t r1);
    /* The element pass of the per-tensor and per-block scalings (mxtrain/scaled.h), over
     * n contiguous elements: q[i] = fp8(fp32(x[i] * scale)) rounded to nearest even and
     * saturated, NaN to the format's NaN code (scale > 0, finite). */
    void (*encode_fp8)(uint8_t *q, const float *x, int64_t n, float scale, const mx_elem_traits *t);
    /* The same with a scale per element: q[i] = fp8(fp32(x[i] * scale[i])), every scale[i] > 0
     * and finite (a row of per-column scales). */
    void (*encode_fp8_vec)(uint8_t *q, const float *x, int64_t n, const float *scale, const mx_elem_traits *t);
    /* encode_fp8 of each row r of x (rows, cols) with its own scale[r] (> 0, finite) into the
     * same row of q: the per-row scalings' element pass, the rows in one call. */
    void (*encode_fp8_rows)(uint8_t *q, const float *x, int64_t rows, int64_t cols, const float *scale,
                            const mx_elem_traits *t);
    /* encode_fp8_vec of each row of x (rows, cols) with the same scales (cols), one per column:
     * the per-column scalings' element pass. */
    void (*encode_fp8_cols)(uint8_t *q, const float *x, int64_t rows, int64_t cols, const float *scale,
                            const mx_elem_traits *t);
    /* The values of encode_fp8's codes with the scales taken off again, as bf16: y[i] =
     * bf16(value(fp8(fp32(x[i] * s))) / s), the NaN code's value MXI_CANONICAL_NAN, for rows
     * of x (rows, cols) in 1 x bcols blocks with s = scale[r * ceil(cols / bcols) + c / bcols]
     * (values16_fp8_blocks), or with s = scale[c] (values16_fp8_cols). Every s is a power of
     * two 2^k whose inverse takes each nonzero value of the format to a normal bf16
     * (mxi_fp8_values16_range), so y is exact: what pow2_rows16 (ops/ops_kernels.h) makes of
     * the codes, in one pass instead of two. */
    void (*values16_fp8_blocks)(uint16_t *y, const float *x, int64_t rows, int64_t cols, int64_t bcols,
                                const float *scale, const mx_elem_traits *t);
    void (*values16_fp8_cols)(uint16_t *y, const float *x, int64_t rows, int64_t cols, const float *scale,
                              const mx_elem_traits *t);
    /* q[i] = HiF8 of fp32(x[i] / scale), ties away from zero, saturating (scale > 0, finite). */
    void (*encode_hif8)(uint8_t *q, const float *x, int64_t n, float scale);
    /* Largest |x[i]|, NaN elements ignored (an Inf counts); 0 for n == 0. */
    float (*amax)(const float *x, int64_t n);
    /* The largest of the bits of |x[i]| (magnitudes order like their bits; a NaN's exceed an
     * Inf's): the amax when at most 0x7F800000, a NaN among x above it; 0 for n == 0. */
    uint32_t (*amax_bits)(const float *x, int64_t n);
    /* amax_bits of each column of x (rows, cols) into m (cols): m[c] = the largest of the
     * bits of |x[r][c]| over the rows, 0 for rows == 0. */
    void (*amax_bits_cols)(uint32_t *m, const float *x, int64_t rows, int64_t cols);
    /* amax_bits of each row of x (rows, cols) into m (rows). */
    void (*amax_bits_rows)(uint32_t *m, const float *x, int64_t rows, int64_t cols);
} mxi_mx_kernels;

extern const mxi_mx_kernels mxi_mx_kernels_ref;
extern const mxi_mx_kernels mxi_mx_kernels_avx2;
extern const mxi_mx_kernels mxi_mx_kernels_avx512;

/* The MX table of a kernel (MX_KERNEL_AUTO: of the one mx_kernel_active() names), NULL for
 * a value that is no kernel. The bundle of every family (ops/kernels.h) takes its MX table
 * from here, so numerics needs nothing from the layers above it. */
const mxi_mx_kernels *mxi_mx_kernels_of(mx_kernel kernel);

/* Whether this build runs the kernel's source on an emulation of its instruction set
 * (the AVX-512 kernels on SIMDe in a `make SIMDE=1` build), so tests can say so. */
bool mxi_kernel_emulated(mx_kernel kernel);

/* E8M0 code of a block from the bits of its amax (sign clear; >= 0x7F800000 means the
 * block holds a NaN or an infinity), for an element format with the given emax and max.
 * SPEC §4. */
static inline uint8_t mxi_scale_code_bits(uint32_t amax_bits, int emax, float max,
                                          mx_scale_mode mode) {
    if (amax_bits >= 0x7F800000u) return MX_E8M0_NAN;
    if (mode == MX_SCALE_FLOOR) {
        // floor(log2(amax)) is the unbiased exponent field; subnormal amax clamps to code 0.
        int e = (int)(amax_bits >> 23) - emax;
        return (uint8_t)(e < 0 ? 0 : e);
    }
    // RCEIL: the smallest power of two >= fp32(amax * fp32(1/max)).
    float d = mxi_bits_f32(amax_bits) * (1.0f / max);
    uint32_t db = mxi_f32_bits(d), E = db >> 23, M = db & 0x7FFFFFu;
    return (uint8_t)(E > 0 ? E + (M != 0) : (M > 0x400000u));
}

/* FP8 code of x * 2^shift, rounded to nearest even and saturated, computed exactly on
 * integers (the reference encoder; x finite or not, any shift). */
uint8_t mxi_encode_scaled_ref(uint32_t x_bits, int shift, const mx_elem_traits *t);

/* HiF8 rounding as data, for the vector encoders, indexed by fp32 exponent fields (ef, the
 * bits 30..23): with a = |y|'s bits, step[a >> 23] = (1 << (sh - 1)) | sh, where sh = 23 - the
 * mantissa bits HiF8 keeps in a's binade (0 for the denormals); r = a + (1 << (sh - 1))
 * rounds the significand ties away from zero (a carry moves r to the next binade, whose
 * mantissa field is then 0); the code of |y| is code[r >> 23] | ((r & 0x7FFFFF) >> sh), where
 * code[ef] is the code of 2^(ef - 127) (of 2^-22 for 2^-23, where everything rounds up).
 * Outside that: r >= 1.5 * 2^15 (MXI_HIF8_OVER_BITS, Inf too) saturates, a < 2^-23
 * (MXI_HIF8_ZERO_BITS) is the one zero, NaN is MX_HIF8_NAN; entries there are filler (sh 23,
 * code 0). code has 257 entries: a NaN's r reaches 256. numerics/hif8.c builds both from the
 * bands. */
enum { MXI_HIF8_OVER_BITS = 0x47400000, MXI_HIF8_ZERO_BITS = 104 << 23 };
typedef struct {
    uint32_t step[256];
    uint32_t code[257];
} mxi_hif8_rounding;
const mxi_hif8_rounding *mxi_hif8_rounding_table(void);

/* q[0..n) from x by one known scale, FP8 in format fp8 (HiF8 when NULL; scale positive and
 * finite), and the amax of x (NaN ignored, as mx_amax_f32), in one pass over memory: piece by
 * piece, its amax, then its codes while it is in cache. */
float mxi_encode_amax(uint8_t *q, const float *x, int64_t n, float scale, const mx_elem_traits *fp8);

/* The exponents k for which every nonzero finite value of format t times 2^k is a normal
 * bf16: from -126 less the exponent of its smallest value to 127 less that of its largest
 * (E4M3: -117 to 119). */
static inline void mxi_fp8_values16_range(const mx_elem_traits *t, int *lo, int *hi) {
    *lo = -126 - (1 - t->bias - t->mbits);
    *hi = 127 - t->emax;
}

/* Whether every scale s[0, n) is a power of two 2^k with -k in that range: the scales the
 * values16_fp8_* kernels take (0, Inf, NaN and negative scales are not). */
static inline bool mxi_values16_fit(const mx_elem_traits *t, const float *s, int64_t n) {
    int lo, hi;
    mxi_fp8_values16_range(t, &lo, &hi);
    bool fit = true;
    for (int64_t i = 0; i < n; i++) {   // no branch: a loop the compiler vectorizes
        uint32_t b = mxi_f32_bits(s[i]);
        int k = (int)(b >> 23) - 127;   // a sign bit makes k > 127
        fit &= (b & 0x7FFFFFu) == 0 && -k >= lo && -k <= hi;
    }
    return fit;
}

/* The blockwise quantizer (mx_fp8_quantize_blocks_f32, power-of-two scales) with each code
 * written as its value times its block's dequantization scale, in bf16 (values16_fp8_*),
 * and those scales into scale_inv: a product's operand ready for a bf16 GEMM in one pass.
 * Blocks of 1 x bcols or brows x 1. False, y and scale_inv then unspecified, for other
 * block shapes and where a block's dequantization scale falls outside
 * mxi_fp8_values16_range (an amax below about 2^-109, or near FLT_MAX): the caller quantizes
 * to codes then. Arguments as mx_fp8_quantize_blocks_f32 takes them, checked by the caller. */
bool mxi_fp8_quantize_blocks_values16(uint16_t *y, float *scale_inv, const float *x, int64_t rows, int64_t cols,
                                      int64_t brows, int64_t bcols, mx_elem elem);

/* The same for torchao's axiswise scaling with power-of-two scales
 * (mx_fp8_quantize_axiswise_f32, MX_TSCALE_POW2): a line's values as bf16 in place of its
 * codes, the dequantization scales into scale_inv. False, y and scale_inv unspecified, where
 * a scale does not fit (mxi_values16_fit: an Inf or NaN amax among them) or a single line is
 * longer than 2^16 elements. Arguments as mx_fp8_quantize_axiswise_f32 takes them. */
bool mxi_fp8_quantize_axiswise_values16(uint16_t *y, float *scale_inv, const float *x, int64_t rows, int64_t cols,
                                        mx_axis axis, mx_elem elem);

/* The kernels of the per-tensor element pass: the references (numerics/ref/scaled_ref.c)
 * and the vector ones (numerics/x86/scaled_avx2.c, scaled_avx512.c), each bit-identical to
 * the reference. */
void mxi_encode_fp8_ref(uint8_t *q, const float *x, int64_t n, float scale, const mx_elem_traits *t);
void mxi_encode_fp8_vec_ref(uint8_t *q, const float *x, int64_t n, const float *scale, const mx_elem_traits *t);
void mxi_encode_hif8_ref(uint8_t *q, const float *x, int64_t n, float scale);
float mxi_amax_ref(const float *x, int64_t n);
uint32_t mxi_amax_bits_ref(const float *x, int64_t n);
void mxi_amax_bits_cols_ref(uint32_t *m, const float *x, int64_t rows, int64_t cols);
void mxi_amax_bits_rows_ref(uint32_t *m, const float *x, int64_t rows, int64_t cols);
void mxi_encode_fp8_cols_ref(uint8_t *q, const float *x, int64_t rows, int64_t cols, const float *scale,
                             const mx_elem_traits *t);
void mxi_encode_fp8_rows_ref(uint8_t *q, const float *x, int64_t rows, int64_t cols, const float *scale,
                             const mx_elem_traits *t);
void mxi_values16_fp8_blocks_ref(uint16_t *y, const float *x, int64_t rows, int64_t cols, int64_t bcols,
                                 const float *scale, const mx_elem_traits *t);
void mxi_values16_fp8_cols_ref(uint16_t *y, const float *x, int64_t rows, int64_t cols, const float *scale,
                               const mx_elem_traits *t);
void mxi_encode_fp8_avx2(uint8_t *q, const float *x, int64_t n, float scale, const mx_elem_traits *t);
void mxi_encode_fp8_vec_avx2(uint8_t *q, const float *x, int64_t n, const float *scale, const mx_elem_traits *t);
void mxi_encode_hif8_avx2(uint8_t *q, const float *x, int64_t n, float scale);
float mxi_amax_avx2(const float *x, int64_t n);
uint32_t mxi_amax_bits_avx2(const float *x, int64_t n);
void mxi_amax_bits_cols_avx2(uint32_t *m, const float *x, int64_t rows, int64_t cols);
void mxi_amax_bits_rows_avx2(uint32_t *m, const float *x, int64_t rows, int64_t cols);
void mxi_encode_fp8_cols_avx2(uint8_t *q, const float *x, int64_t rows, int64_t cols, const float *scale,
                              const mx_elem_traits *t);
void mxi_encode_fp8_rows_avx2(uint8_t *q, const float *x, int64_t rows, int64_t cols, const float *scale,
                              const mx_elem_traits *t);
void mxi_encode_fp8_avx512(uint8_t *q, const float *x, int64_t n, float scale, const mx_elem_traits *t);
void mxi_encode_fp8_vec_avx512(uint8_t *q, const float *x, int64_t n, const float *scale, const mx_elem_traits *t);
void mxi_encode_hif8_avx512(uint8_t *q, const float *x, int64_t n, float scale);
float mxi_amax_avx512(const float *x, int64_t n);
uint32_t mxi_amax_bits_avx512(const float *x, int64_t n);
void mxi_amax_bits_cols_avx512(uint32_t *m, const float *x, int64_t rows, int64_t cols);
void mxi_amax_bits_rows_avx512(uint32_t *m, const float *x, int64_t rows, int64_t cols);
void mxi_values16_fp8_blocks_avx512(uint16_t *y, const float *x, int64_t rows, int64_t cols, int64_t bcols,
                                    const float *scale, const mx_elem_traits *t);
void mxi_values16_fp8_cols_avx512(uint16_t *y, const float *x, int64_t rows, int64_t cols, const float *scale,
                                  const mx_elem_traits *t);
void mxi_encode_fp8_cols_avx512(uint8_t *q, const float *x, int64_t rows, int64_t cols, const float *scale,
                                const mx_elem_traits *t);
void mxi_encode_fp8_rows_avx512(uint8_t *q, const float *x, int64_t rows, int64_t cols, const float *scale,
                                const mx_elem_traits *t);

/* The row and column kernels of a table whose own per-row kernels do the work row after row
 * (the reference's and AVX2's): isa's amax_bits_rows, encode_fp8_rows and encode_fp8_cols
 * from its amax_bits, encode_fp8 and encode_fp8_vec. */
#define MXI_ROWS_BY_ROW(isa) \
    void mxi_amax_bits_rows_##isa(uint32_t *m, const float *x, int64_t rows, int64_t cols) { \
        for (int64_t r = 0; r < rows; r++) m[r] = mxi_amax_bits_##isa(x + r * cols, cols); \
    } \
    void mxi_encode_fp8_rows_##isa(uint8_t *q, const float *x, int64_t rows, int64_t cols, const float *scale, \
                                   const mx_elem_traits *t) { \
        for (int64_t r = 0; r < rows; r++) mxi_encode_fp8_##isa(q + r * cols, x + r * cols, cols, scale[r], t); \
    } \
    void mxi_encode_fp8_cols_##isa(uint8_t *q, const float *x, int64_t rows, int64_t cols, const float *scale, \
                                   const mx_elem_traits *t) { \
        for (int64_t r = 0; r < rows; r++) mxi_encode_fp8_vec_##isa(q + r * cols, x + r * cols, cols, scale, t); \
    }

#endif
