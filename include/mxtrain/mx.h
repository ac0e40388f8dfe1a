/* mxtrain — MX (OCP Microscaling) numerics: FP8 element codecs, the E8M0 scale codec, and
 * block quantization of 2-D matrices (SPEC §4).
 *
 * A block is 32 consecutive elements along one axis. Rowwise blocks run along a row (the
 * last dim), colwise blocks run down a column (dim 0). A trailing partial block behaves as
 * if padded with zeros. Each block gets one power-of-two scale 2^(c-127) stored as the E8M0
 * code c, and each element the FP8 code of round-to-nearest-even(x / scale), saturated.
 *
 * Layouts: the element plane q is row-major rows x cols, like the input. Scales are
 * row-major too: rows x ceil(cols/32) for rowwise, ceil(rows/32) x cols for colwise.
 *
 * Every function here is thread-safe. Large inputs are split across OpenMP threads; the
 * result does not depend on the thread count or on which kernel (scalar reference or
 * SIMD) runs: all kernels are bit-identical.
 */
#ifndef MXTRAIN_MX_H
#define MXTRAIN_MX_H

#include <stdbool.h>
#include <stdint.h>

#include "mxtrain/error.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MX_BLOCK 32 /* elements per scale block */

/* MX_HIF8 names HiFloat8 in recipes; it is not an MX/FP8 element format: its codec is in
 * mxtrain/scaled.h and every function here refuses it as an unknown elem. */
typedef enum { MX_E4M3 = 0, MX_E5M2 = 1, MX_HIF8 = 2 } mx_elem;
typedef enum { MX_SCALE_FLOOR = 0, MX_SCALE_RCEIL = 1 } mx_scale_mode;
typedef enum { MX_ROWWISE = 0, MX_COLWISE = 1 } mx_axis;

#define MX_E8M0_NAN 0xFF /* scale code of a block holding a NaN or an infinity */

/* One FP8 element format, declared as data. */
typedef struct {
    const char *name;  /* "E4M3" */
    int bits;          /* 8 */
    int ebits, mbits;  /* exponent and mantissa field widths */
    int bias;          /* exponent bias */
    int emax;          /* unbiased exponent of the largest normal (8 for E4M3, 15 for E5M2) */
    float max;         /* largest finite value (448, 57344) */
    uint8_t max_code;  /* code of +max */
    uint8_t nan_code;  /* the NaN code the quantizer writes (0x7F) */
    bool has_inf;      /* E5M2 has IEEE infinities, E4M3 does not */
    float (*to_f32)(uint8_t code);   /* exact decode */
    uint8_t (*from_f32)(float x);    /* round-to-nearest-even, saturating to +/-max; NaN -> nan_code */
} mx_elem_traits;

/* Traits of an element format, or NULL for an unknown value. */
const mx_elem_traits *mx_elem_traits_of(mx_elem elem);

/* Decode an FP8 code exactly (NaN codes give NaN, E5M2 infinity codes give +/-inf).
 * An unknown elem gives NaN. */
float mx_fp8_to_f32(uint8_t code, mx_elem elem);

/* Encode x as FP8 with round-to-nearest-even, saturating finite values and infinities to
 * +/-max (the OCP "saturating" conversion); NaN gives the format's NaN code. Signed zeros
 * keep their sign. An unknown elem gives 0xFF. */
uint8_t mx_f32_to_fp8(float x, mx_elem elem);

/* The value 2^(code-127) of an E8M0 scale code; 0xFF gives NaN. Code 0 is 2^-127, an fp32
 * subnormal, returned exactly. */
float mx_e8m0_to_f32(uint8_t code);

/* The E8M0 scale code of a block whose largest magnitude is amax (>= 0, or NaN/Inf, which
 * give MX_E8M0_NAN), for the given element format and scale mode (SPEC §4). */
uint8_t mx_scale_code(float amax, mx_elem elem, mx_scale_mode mode);

/* Quantize an fp32 matrix x (rows x cols, row-major) to one MX plane along axis.
 * q receives rows*cols codes; scales receives the scale plane (see the layout above).
 * Returns 0, or MX_ENULL / MX_ESIZE / MX_EENUM for bad arguments. Empty matrices are fine. */
int mx_quantize_f32(const float *x, int64_t rows, int64_t cols, mx_axis axis,
                    mx_elem elem, mx_scale_mode mode, uint8_t *q, uint8_t *scales);

/* As mx_quantize_f32, for a bf16 matrix given as raw uint16_t bit patterns. */
int mx_quantize_bf16(const uint16_t *x, int64_t rows, int64_t cols, mx_axis axis,
                     mx_elem elem, mx_scale_mode mode, uint8_t *q, uint8_t *scales);

/* Both planes from one pass over x: the rowwise plane (q_row, s_row) and the colwise plane
 * (q_col, s_col), each byte-identical to what mx_quantize_f32 gives for that axis.
 * A linear layer needs both for every activation and weight. */
int mx_quantize_dual_f32(const float *x, int64_t rows, int64_t cols, mx_elem elem,
                         mx_scale_mode mode, uint8_t *q_row, uint8_t *s_row,
                         uint8_t *q_col, uint8_t *s_col);

/* As mx_quantize_dual_f32, for bf16 input. */
int mx_quantize_dual_bf16(const uint16_t *x, int64_t rows, int64_t cols, mx_elem elem,
                          mx_scale_mode mode, uint8_t *q_row, uint8_t *s_row,
                          uint8_t *q_col, uint8_t *s_col);

/* Dequantize one MX plane (as produced above) to fp32: y = value(q) * 2^(scale-127).
 * Exact for every plane the quantizer produces. */
int mx_dequantize_f32(const uint8_t *q, const uint8_t *scales, int64_t rows, int64_t cols,
                      mx_axis axis, mx_elem elem, float *y);

/* Number of scale bytes of a plane: rows*ceil(cols/32) or ceil(rows/32)*cols.
 * Returns a negative code for negative sizes, unknown axes or overflow. */
int64_t mx_scale_count(int64_t rows, int64_t cols, mx_axis axis);

/* ---- 32x32 tiles: the weight layout of 1-32-32 recipes (SPEC §5) ----
 *
 * One E8M0 scale per 32x32 tile, from the amax over the whole tile, with the same FLOOR /
 * RCEIL rules, NaN/Inf handling and element rounding as 32-element blocks. A partial tile
 * at the bottom or right edge behaves exactly as if padded with zeros. Because the scale is
 * shared along both axes, this one plane is both the rowwise and the colwise plane of the
 * weight: the forward GEMM (W along K) and the input-gradient GEMM (W along N) read the
 * same elements and scales.
 *
 * Layouts: q is rows x cols, row-major, like the input; scales is
 * ceil(rows/32) x ceil(cols/32), row-major: tile (i, j) covers rows 32i..32i+31 and
 * cols 32j..32j+31, and its scale is scales[i * ceil(cols/32) + j]. */

/* Quantize an fp32 matrix x (rows x cols, row-major) in 32x32 tiles.
 * Returns 0, or MX_ENULL (x, q or scales NULL), MX_ESIZE (a negative size, or sizes whose
 * product overflows), MX_EENUM (unknown elem or mode). Empty matrices are fine. */
int mx_quantize_tiles_f32(const float *x, int64_t rows, int64_t cols, mx_elem elem,
                          mx_scale_mode mode, uint8_t *q, uint8_t *scales);

/* As mx_quantize_tiles_f32, for a bf16 matrix given as raw uint16_t bit patterns. */
int mx_quantize_tiles_bf16(const uint16_t *x, int64_t rows, int64_t cols, mx_elem elem,
                           mx_scale_mode mode, uint8_t *q, uint8_t *scales);

/* Dequantize a tile plane (as produced above) to fp32: y = value(q) * 2^(scale-127), with
 * the scale of the element's tile. Exact for every plane the quantizer produces.
 * Returns 0, or MX_ENULL / MX_ESIZE / MX_EENUM (unknown elem). */
int mx_dequantize_tiles_f32(const uint8_t *q, const uint8_t *scales, int64_t rows, int64_t cols,
                            mx_elem elem, float *y);

/* Number of scale bytes of a tile plane: ceil(rows/32) * ceil(cols/32).
 * Returns MX_ESIZE for negative sizes or overflow. */
int64_t mx_tile_scale_count(int64_t rows, int64_t cols);

/* Kernel selection. A kernel is an instruction set the library's CPU kernels are written
 * for: the scalar reference, AVX2, or AVX-512 (F, BW, DQ, VL, with the registers enabled by
 * the OS). The library picks the fastest one the CPU runs at first use. The choice is
 * process-wide and governs every family of CPU kernels together:
 *   - MX quantization: the mx_quantize_* functions above, and the model's quantization;
 *   - MX dequantization of the MX GEMM's operands (to fp32, or bf16 where the CPU has a bf16
 *     matmul) and the widening of bf16 GEMM operands to fp32;
 *   - the non-GEMM kernels of training: the attention's causal softmax and its backward,
 *     RMSNorm (forward, backward, weight gradient), SwiGLU (forward, backward), rotary
 *     embedding, residual add, scale, the gradient norm's sum of squares, cross-entropy,
 *     AdamW, and the bf16 rounding and widening of GEMM operands and of bf16 data sent
 *     between ranks (FSDP, expert parallelism).
 * It does not govern the matrix products (oneDNN picks its own code for the CPU) nor
 * mx_dequantize_f32 and mx_dequantize_tiles_f32 (plain scalar code). The MX kernels, the
 * bf16 conversions, rotary embedding, add, scale and AdamW are bit-identical across
 * kernels; softmax, RMSNorm, SwiGLU, the sum of squares and cross-entropy, which the
 * vector kernels sum in another order (with their own exp), agree with the reference within
 * a few fp32 ulps.
 *
 * The environment variable MXTRAIN_KERNEL=auto|ref|avx2|avx512 overrides the choice.
 * MXTRAIN_MX_KERNEL is an older name for it, read only when MXTRAIN_KERNEL is unset or
 * empty: when both are set, MXTRAIN_KERNEL wins. An empty value counts as unset, and unset
 * means auto. A value that is no kernel, or a kernel this CPU cannot run, is refused by
 * mx_kernel_check_env() (and ignored by the library, which then chooses as if neither
 * variable were set). Tests and benchmarks switch kernels explicitly. */
typedef enum { MX_KERNEL_AUTO = 0, MX_KERNEL_REF = 1, MX_KERNEL_AVX2 = 2, MX_KERNEL_AVX512 = 3 } mx_kernel;

/* Use this kernel from now on (process-wide). Returns MX_EUNSUPPORTED if the CPU or the
 * build lacks it, MX_EENUM for an unknown value. */
int mx_kernel_select(mx_kernel kernel);

/* The kernel in use, and a kernel's name ("auto", "ref", "avx2", "avx512"; NULL for
 * unknown values, so `for (k = MX_KERNEL_REF; mx_kernel_name(k); k++)` visits every kernel). */
mx_kernel mx_kernel_active(void);
const char *mx_kernel_name(mx_kernel kernel);

/* Whether this build and CPU can run the kernel. */
bool mx_kernel_available(mx_kernel kernel);

/* Why this build and CPU cannot run the kernel, e.g. "CPU lacks avx512bw" or "the OS does
 * not enable the AVX-512 registers (XCR0)"; NULL when they can. */
const char *mx_kernel_missing(mx_kernel kernel);

/* Checks the variable that forces a kernel: MXTRAIN_KERNEL, or MXTRAIN_MX_KERNEL when that
 * is unset or empty. Returns 0 when it is unset, empty, "auto" or a kernel this CPU runs;
 * MX_EINVAL (no such kernel) or MX_EUNSUPPORTED (the CPU cannot run it) with a one-line
 * message in diag (if not NULL) naming the variable, its value and what is allowed. */
int mx_kernel_check_env(mx_diag *diag);

#ifdef __cplusplus
}
#endif

#endif
