/* Internal: the kernels of the network's non-GEMM layers (attention's softmax, norms,
 * activations, rotary embedding, residuals, loss, optimizer), one table per instruction
 * set: the scalar reference (ops/ref/), AVX2 and AVX-512 (ops/x86/). Unlike the MX
 * kernels these are not all bit-identical: a vector kernel sums in another order and uses
 * its own exp, so tests hold softmax, RMSNorm, SwiGLU, the sum of squares and the
 * cross-entropy to the reference within a few ulps of fp32 (the bf16 conversions, rope,
 * add, scale and AdamW are the same operations in the same order: bit-identical). The
 * table in use is that of the bundle mx_kernel_active() names (ops/kernels.h; MXTRAIN_KERNEL,
 * mx_kernel_select()): ref, avx2 or avx512.
 *
 * Special values: every table propagates NaN and infinities in its inputs as the
 * reference does. A bit-identical kernel stays bit-identical, except that a NaN's sign and
 * payload are unspecified (which operand's NaN an instruction passes on is the compiler's
 * choice; the bf16 conversions alone fix it); the others are NaN exactly where the
 * reference is NaN, the same infinity where it has one, and within their tolerance
 * elsewhere. The reference follows its formulas, as PyTorch does: a softmax or
 * cross-entropy row with a NaN, a +Inf, or only -Infs among its scores is NaN throughout
 * (a NaN in the sum, or max - max); a -Inf beside finite scores has probability 0.
 *
 * Shapes are row-major and name the parameters: `rows` rows of C channels (norms), of
 * `cols` scores with leading dim ld (softmax), H heads of HD (rotary embedding), V logits
 * (cross-entropy); n counts the elements of an elementwise kernel. */
#ifndef MXI_NN_KERNELS_H
#define MXI_NN_KERNELS_H

#include <stdbool.h>
#include <stdint.h>

#include "mxtrain/mx.h"

/* Whether a product overwrites its output or adds to it. */
typedef enum { MXI_ATT_SET, MXI_ATT_ADD } mxi_att_write;

/* What att_probs does besides the probabilities. */
typedef enum { MXI_ATT_PROBS, MXI_ATT_DSCORES } mxi_att_probs_mode;

/* Attention's exps are powers of two, as flash attention's softmax_scale_log2:
 * e^(scale s - m) = 2^(c s - m') with c = scale log2 e and m' = m log2 e, so that the exp
 * needs no ln 2 reduction. Every table takes c so, rounds c s, then subtracts (the row's
 * max then gives exactly 2^0, however large the scores), and keeps the rows' maxima (the
 * statistics the backward reads) in log2 units. */
static inline float mxi_att_exp2_scale(float scale) { return (float)((double)scale * 1.4426950408889634074); }

/* The vector tables' 2^f on [-1/2, 1/2], highest power first: a degree-5 polynomial,
 * minimax in relative error, 1.7e-7 at most evaluated in fp32 by fused multiply-adds. */
static const float mxi_exp2_poly[6] = {1.326470985e-3f, 9.671507403e-3f, 5.550733581e-2f,
                                       2.402224243e-1f, 6.931470037e-1f, 1.0f};

typedef struct {
    const char *name;
    /* Flash attention's pieces (ops/attention.c), on tiles of up to MXI_ATT_BLOCK rows and
     * keys. att_gemm: c (m, n) = a (m, k) b (k, n) (MXI_ATT_SET) or += (MXI_ATT_ADD), c
     * and b row-major with leading dims, element (i, x) of a at a[i lda + x acs] (acs 1:
     * row-major; lda 1: a transposed tile); each element adds its k products to 0 or c in k
     * order (the vector tables with fused multiply-adds), so its value depends on neither
     * the tile's shape nor its place. */
    void (*att_gemm)(float *c, int64_t ldc, const float *a, int64_t lda, int64_t acs, const float *b, int64_t ldb,
                     int64_t m, int64_t n, int64_t k, mxi_att_write write);
    /* The same product on bf16 operands, each row of a and of b holding pairs along k: a
     * (m, kp) and b (kp, n) of uint32, a pair's element 2p in the low 16 bits, 2p + 1 in the
     * high. Per element and pair in order c += hi(a) hi(b), then c += lo(a) lo(b) in fp32
     * (vdpbf16ps's order; the products are exact): every table the same numbers, but that
     * AVX512_BF16's vdpbf16ps treats denormal inputs and results as zero. */
    void (*att_gemm_bf16)(float *c, int64_t ldc, const uint32_t *a, int64_t lda, int64_t acs, const uint32_t *b,
                          int64_t ldb, int64_t m, int64_t n, int64_t kp, mxi_att_write write);
    /* One key tile of the online softmax, in powers of two (see mxi_att_exp2_scale): row r
     * of s (n scores) sees columns [c0[r], c1[r]). There, with c = mxi_att_exp2_scale(scale)
     * and x = c s, mx = max(rmax[r], max x) (NaN skipped), s becomes 2^(x - mx), corr[r] =
     * 2^(rmax[r] - mx), rsum[r] = rsum[r] * corr[r] + the row's sum of exps and rmax[r] =
     * mx; columns outside become 0. A row that sees no column keeps its rmax, rsum
     * and corr 1. With p16 (not NULL) the exps go to p16 instead, rounded to bf16 as
     * bf16_round rounds them (but that on a CPU with AVX512_BF16 an fp32 denormal may
     * become 0, as att_gemm_bf16 takes it there): row r of p16 (leading dim ld) holds [0,
     * n) and, for an odd n, a 0 at n (the products' bf16 pairs); s's columns are then
     * unspecified. */
    void (*att_online_softmax)(float *s /* (rows, ld) */, int64_t ld, int64_t rows, int64_t n, const int32_t *c0,
                               const int32_t *c1, float scale, float *rmax, float *rsum, float *corr /* (rows) */,
                               uint16_t *p16 /* (rows, ld) or NULL */);
    /* The probabilities again from the scores and the rows' final (max, 1 / sum) of
     * att_online_softmax: 2^(c s - max) * inv in columns [c0[r], c1[r]) (c s rounded, as
     * there), 0 in the rest of [0, n); then
     * MXI_ATT_DSCORES makes d, the tile's dP, d = P (dP - dsum[r]) scale in the visible
     * columns and 0 in the others (dsum: the rows' D). */
    void (*att_probs)(float *s /* (rows, ld) */, float *d /* (rows, ld) */, int64_t ld, int64_t rows, int64_t n,
                      const int32_t *c0, const int32_t *c1, float scale, const float *stats /* (rows, 2) */,
                      const float *dsum /* (rows) */, mxi_att_probs_mode mode);
    /* Backward's tile at bf16 in one pass: P and dS as att_probs's MXI_ATT_DSCORES makes
     * them (s the scores, d the tile's dP), rounded as bf16_round rounds (an fp32 denormal
     * as in att_online_softmax's p16) into the products' operands: p2 and ds2 ((rows + 1) /
     * 2, ld) rows 2i and 2i + 1 paired per column as bf16_pair_rows pairs them (a last odd
     * row with 0), ds16 (rows, ld) each row of dS with, for an odd n, a 0 at n; columns [0,
     * n) of each. s and d are left unspecified, and have room for a row `rows` when rows is
     * odd. */
    void (*att_dscores_bf16)(uint32_t *p2, uint32_t *ds2, uint16_t *ds16, float *s /* (rows, ld) */,
                             float *d /* (rows, ld) */, int64_t ld, int64_t rows, int64_t n, const int32_t *c0,
                             const int32_t *c1, float scale, const float *stats /* (rows, 2) */,
                             const float *dsum /* (rows) */);
    /* bf16 conversions, bit-identical across kernels: round to nearest even (a NaN stays a
     * quiet NaN with its sign and top payload bits), as mx_st_f32_to_bf16. */
    void (*bf16_round)(uint16_t *y, const float *x, int64_t n);
    /* Two rows rounded and paired: y[j] = bf16(x1[j]) << 16 | bf16(x0[j]) (a product's
     * operand as pairs along its rows, att_gemm_bf16's b). */
    void (*bf16_pair_rows)(uint32_t *y, const float *x0, const float *x1, int64_t n);
    /* The same rounding, kept as fp32 (the bf16 value widened): a bf16 GEMM operand for a
     * CPU whose matmul is fp32 only, made in one pass. */
    void (*bf16_round_f32)(float *y, const float *x, int64_t n);
    /* y = widen(x), or y += widen(x) when add. */
    void (*bf16_widen)(float *y, const uint16_t *x, int64_t n, int add);
    /* RMSNorm over rows of C: y = x * r * w with r = 1/sqrt(mean(x^2) + eps), kept in rstd. */
    void (*rmsnorm_forward)(float *out /* (rows, C) */, float *rstd /* (rows) */, const float *inp /* (rows, C) */,
                            const float *weight /* (C) */, int64_t rows, int C, float eps);
    /* dx = r * (w*dy) - x * r^3 / C * sum(w*dy*x), per row. */
    void (*rmsnorm_backward)(float *dinp /* (rows, C) */, const float *dout, const float *inp, const float *weight,
                             const float *rstd /* (rows) */, int64_t rows, int C);
    /* dweight[c0..c1) += sum over rows of dout * inp * rstd: rows walked in order, columns
     * contiguous (row-major). */
    void (*rmsnorm_dweight)(float *dweight /* (C) */, const float *dout /* (rows, C) */, const float *inp,
                            const float *rstd /* (rows) */, int64_t rows, int C, int c0, int c1);
    /* out = silu(gate) * up and its backward over n elements; dup may be dout (each element's
     * inputs are read before its outputs are written). */
    void (*swiglu_forward)(float *out, const float *gate, const float *up, int64_t n);
    void (*swiglu_backward)(float *dgate, float *dup, const float *dout, const float *gate, const float *up, int64_t n);
    /* torch.optim.AdamW on n elements: w *= shrink; m, v moments; w -= step_size * m / (sqrt(v) / bc2_sqrt + eps). */
    void (*adamw)(float *w, float *m, float *v, const float *g, int64_t n, float b1, float b2, float step_size,
                  float bc2_sqrt, float eps, float shrink);
    /* Rotary embedding of one position: each of the H heads of x has its pairs (x_i, x_{i+HD/2})
     * rotated by the angles whose cos/sin are cs/sn (HD/2 each); sign -1 rotates back (backward). */
    void (*rope)(float *x /* (H, HD) */, const float *cs /* (HD/2) */, const float *sn /* (HD/2) */, int H, int HD,
                 float sign);
    /* Decoding attention of one query over t cached positions: out = softmax(q k^T * scale) v
     * over rows 0..t-1 of k and v (rows ld floats apart); p receives the t probabilities.
     * The scores' max, the exps and their sum in position order, then out accumulated over
     * the positions in order and divided by the sum. */
    void (*attend)(float *out /* (HD) */, float *p /* (t) */, const float *q /* (HD) */, const float *k /* (t, ld) */,
                   const float *v /* (t, ld) */, int64_t t, int64_t ld, int HD, float scale);
    /* y += x over n elements (residual connections, gradient accumulation). */
    void (*add)(float *y, const float *x, int64_t n);
    /* x *= s over n elements. */
    void (*scale)(float *x, int64_t n, float s);
    /* Sum of squares of n elements, accumulated in double (the gradient norm). */
    double (*sum_squares)(const float *x, int64_t n);
    /* Cross-entropy of one row of V logits against target: returns log(sum(e^z)) - z[target];
     * with dz, writes dscale * (softmax(z) - onehot(target)). A NaN or +Inf logit, or only
     * -Infs, make the loss and every dz NaN; a -Inf target logit makes the loss +Inf. */
    double (*cross_entropy)(float *dz /* (V) or NULL */, const float *z /* (V) */, int V, int target, float dscale);
} mxi_nn_kernels;

extern const mxi_nn_kernels mxi_nn_kernels_ref;
extern const mxi_nn_kernels mxi_nn_kernels_avx2;
extern const mxi_nn_kernels mxi_nn_kernels_avx512;

/* att_dscores_bf16 as table k's att_probs, bf16_pair_rows and bf16_round make it, one pass
 * each: the tables without a fused pass of their own (the reference, AVX2) call this. */
static inline void mxi_att_dscores_composed(const mxi_nn_kernels *k, uint32_t *p2, uint32_t *ds2, uint16_t *ds16,
                                            float *s, float *d, int64_t ld, int64_t rows, int64_t n,
                                            const int32_t *c0, const int32_t *c1, float scale, const float *stats,
                                            const float *dsum) {
    k->att_probs(s, d, ld, rows, n, c0, c1, scale, stats, dsum, MXI_ATT_DSCORES);
    if (rows & 1)
        for (int64_t j = 0; j < n; j++) s[rows * ld + j] = d[rows * ld + j] = 0.0f;
    for (int64_t i = 0; 2 * i < rows; i++) {
        k->bf16_pair_rows(p2 + i * ld, s + 2 * i * ld, s + (2 * i + 1) * ld, n);
        k->bf16_pair_rows(ds2 + i * ld, d + 2 * i * ld, d + (2 * i + 1) * ld, n);
    }
    for (int64_t r = 0; r < rows; r++) {
        k->bf16_round(ds16 + r * ld, d + r * ld, n);
        if (n & 1) ds16[r * ld + n] = 0;
    }
}

/* The table of a kernel (MX_KERNEL_AUTO: the active one), NULL for no such kernel: a view
 * of the kernel's bundle (ops/kernels.h). Only call it when mx_kernel_available() says the
 * CPU runs that kernel. */
const mxi_nn_kernels *mxi_nn_kernels_of(mx_kernel kernel);

/* The table of the kernel mx_kernel_active() names. */
const mxi_nn_kernels *mxi_nn_kernels_active(void);

/* Runs `body` over [0, n) split into chunks of at least MXI_NN_MIN_CHUNK elements, one per
 * OpenMP iteration (serially when there is one chunk: a parallel region costs more than a
 * small layer); body sees the chunk as i0 and len. */
#define MXI_NN_MIN_CHUNK (1 << 15)
#define MXI_PARALLEL_CHUNKS(n, body) do { \
    int64_t chunks_ = (n) / MXI_NN_MIN_CHUNK > 0 ? (n) / MXI_NN_MIN_CHUNK : 1; \
    _Pragma("omp parallel for schedule(static) if (chunks_ > 1)") \
    for (int64_t c_ = 0; c_ < chunks_; c_++) { \
        int64_t i0 = (n) * c_ / chunks_, len = (n) * (c_ + 1) / chunks_ - i0; \
        body; \
    } \
} while (0)

/* Threaded calls of the active table's bf16 kernels over n elements (serial when small). */
void mxi_bf16_round(uint16_t *y, const float *x, int64_t n);
void mxi_bf16_round_f32(float *y, const float *x, int64_t n);
void mxi_bf16_widen(float *y, const uint16_t *x, int64_t n, int add);

/* x rounded to bf16 as a GEMM operand: as bf16 (uint16_t) when as_bf16 (the GEMM runs bf16
 * natively), else as fp32 holding the bf16 values (the fp32 GEMM then needs no widening). */
void mxi_bf16_operand(void *y, const float *x, int64_t n, bool as_bf16);

#endif
