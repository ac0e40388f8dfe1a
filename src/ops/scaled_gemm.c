/* The GEMM of per-tensor scaled operands: decode both code tensors (exact) into context
 * buffers, one GEMM through oneDNN, then the two scales applied to the fp32 result. With
 * block scales the operands are dequantized whole (value times its block's scale) and the
 * GEMM runs on those. */
#include "ops/scaled_gemm.h"

#include <omp.h>
#include <string.h>

#include "core/bits.h"
#include "core/diag.h"
#include "mxtrain/scaled.h"
#include "ops/nn_kernels.h"
#include "ops/ops_kernels.h"

/* FP8 codes are MX codes whose block scale is 2^0: into fp32 they go through the MX
 * dequantizer (arithmetic, not a lookup), as rows of DQ_CHUNK codes that share unit_scales. */
enum { DQ_CHUNK = 4096 };
static const uint8_t unit_scales[DQ_CHUNK / MX_BLOCK] = {[0 ... DQ_CHUNK / MX_BLOCK - 1] = 127};   // E8M0 127 = 2^0

static void dequant_fp8(float *y, const uint8_t *q, mx_elem elem, const mxi_code_values *t, int64_t i0, int64_t i1) {
    const mxi_ops_kernels *k = mxi_ops_kernels_active();
    for (int64_t off = i0; off < i1; off += DQ_CHUNK) {
        mxi_mx_plane p = {.q = q + off, .scales = unit_scales, .rows = 1, .cols = i1 - off < DQ_CHUNK ? i1 - off : DQ_CHUNK,
                          .axis = MX_ROWWISE, .elem = elem};
        mxi_dequant_job job = {.p = &p, .values = t, .y = y + off};
        k->dequant_rows(&job, 0, 1);
    }
}

/* The values of x's codes into fp32 y or, when y16, bf16 y16 (exact: see scaled_gemm.h):
 * to bf16 by a table lookup, to fp32 FP8 through the MX dequantizer and HiF8 by lookup. */
static void decode_range(float *y, uint16_t *y16, const mxi_scaled_tensor *x, const mxi_code_values *t, int64_t i0,
                         int64_t i1) {
    const mxi_ops_kernels *k = mxi_ops_kernels_active();
    if (y16) k->lut16(y16 + i0, x->q + i0, i1 - i0, t->bf16);
    else if (x->elem != MX_HIF8) dequant_fp8(y, x->q, x->elem, t, i0, i1);
    else k->lut32((uint32_t *)(void *)y + i0, x->q + i0, i1 - i0, t->f32);
}

/* Pieces of this many elements go to the threads; fewer run on the calling thread without
 * opening an OpenMP region (one of a single thread still costs futex calls in libgomp). */
enum { PIECE = 1 << 16 };

static int64_t pieces_of(int64_t n) { return omp_in_parallel() ? 1 : (n + PIECE - 1) / PIECE; }

static void decode(float *y, uint16_t *y16, const mxi_scaled_tensor *x, const mxi_code_values *t) {
    int64_t n = x->rows * x->cols, pieces = pieces_of(n);
    if (pieces <= 1) {
        decode_range(y, y16, x, t, 0, n);
        return;
    }
    #pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < pieces; p++) decode_range(y, y16, x, t, p * PIECE, p * PIECE + PIECE < n ? p * PIECE + PIECE : n);
}

/* Rows [i0, i1) of C (M, N) (+)= fp32(fp32(sa[i] * sb[j]) * acc[i][j]) for a product with a
 * vector of scales on either side (scaled_gemm.h), or by the two per-tensor scales; acc is C
 * itself when not accumulating. */
static void scale_rows(float *C, const float *acc, const mxi_scaled_tensor *A, const mxi_scaled_tensor *B, int64_t i0,
                       int64_t i1, int64_t N, bool accumulate) {
    const mxi_ops_kernels *k = mxi_ops_kernels_active();
    mxi_row_write w = accumulate ? MXI_ROW_ADD : MXI_ROW_SET;
    if (!A->vscale && !B->vscale) {   // one scale for all: the rows as one
        k->scale_row(C + i0 * N, acc + i0 * N, (i1 - i0) * N, A->scale_inv, NULL, B->scale_inv, w);
        return;
    }
    for (int64_t i = i0; i < i1; i++)
        k->scale_row(C + i * N, acc + i * N, N, A->vscale ? A->vscale[i] : A->scale_inv, B->vscale, B->scale_inv, w);
}

static void apply_scales(float *C, const float *acc, const mxi_scaled_tensor *A, const mxi_scaled_tensor *B,
                         int64_t M, int64_t N, bool accumulate) {
    int64_t pieces = pieces_of(M * N), rows = (M + pieces - 1) / pieces;
    if (pieces <= 1) {
        scale_rows(C, acc, A, B, 0, M, N, accumulate);
        return;
    }
    #pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < pieces; p++)
        scale_rows(C, acc, A, B, p * rows < M ? p * rows : M, (p + 1) * rows < M ? (p + 1) * rows : M, N, accumulate);
}

/* ---- block scales ---- */

/* The exponents k of n scales 2^k into e, the least and greatest into lo and hi; whether
 * every scale is such a power of two with k in t's [pow2_lo, pow2_hi] (a nonzero value of
 * the format times it is a normal bf16). */
static bool pow2_exponents(int16_t *e, const float *s, int64_t n, const mxi_code_values *t, int *lo, int *hi) {
    int l = INT16_MAX, h = INT16_MIN;
    uint32_t other = 0;   // sign or mantissa bits anywhere: not all powers of two
    for (int64_t i = 0; i < n; i++) {   // no branch: a loop the compiler vectorizes
        uint32_t b = mxi_f32_bits(s[i]);
        int k = (int)(b >> 23 & 0xFF) - 127;
        other |= b & 0x807FFFFFu;
        e[i] = (int16_t)k;
        l = k < l ? k : l, h = k > h ? k : h;
    }
    *lo = l, *hi = h;
    return !other && l >= t->pow2_lo && h <= t->pow2_hi;
}

/* Whether x goes to bf16 by pow2_rows16: blocks of one column or a multiple of 64, and every
 * block scale a power of two 2^e with e in t's [pow2_lo, pow2_hi] (a nonzero FP8 value times
 * it is a normal bf16: exact); then the exponents, one per block, are in e. */
static bool pow2_blocks_of(int16_t *e, const mxi_scaled_tensor *x, const mxi_code_values *t) {
    if (x->bcols != 1 && x->bcols % 64) return false;
    int64_t n = ((x->rows + x->brows - 1) / x->brows) * ((x->cols + x->bcols - 1) / x->bcols);
    int lo, hi;
    return pow2_exponents(e, x->bscale, n, t, &lo, &hi);
}

/* x's codes to bf16 y16 with the exponents e of (brows, bcols) blocks (pow2_rows16); a large
 * operand in pieces of whole blocks' rows over the threads (any rows where a block spans
 * them all). */
static void pow2_blocks(uint16_t *y16, const mxi_scaled_tensor *x, const mxi_code_values *t, const int16_t *e,
                        int64_t brows, int64_t bcols) {
    const mxi_ops_kernels *k = mxi_ops_kernels_active();
    int64_t R = x->rows, C = x->cols, nbc = (C + bcols - 1) / bcols, pieces = pieces_of(R * C);
    if (pieces <= 1) {
        k->pow2_rows16(y16, x->q, R, C, e, brows, bcols, t);
        return;
    }
    int64_t align = brows < R ? brows : 1, step = ((R + pieces - 1) / pieces + align - 1) / align * align;   // rows a piece
    #pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < pieces; p++) {
        int64_t r0 = p * step < R ? p * step : R, r1 = r0 + step < R ? r0 + step : R;
        k->pow2_rows16(y16 + r0 * C, x->q + r0 * C, r1 - r0, C, e + (r0 / brows) * nbc, brows, bcols, t);
    }
}

/* Rows [r0, r1) of x dequantized: y = fp32(value * scale of the element's block). */
static void dequant_block_rows(float *y, const mxi_scaled_tensor *x, const mxi_code_values *t, int64_t r0, int64_t r1) {
    int64_t C = x->cols, nbc = (C + x->bcols - 1) / x->bcols;
    for (int64_t r = r0; r < r1; r++) {
        const float *s = x->bscale + (r / x->brows) * nbc;
        const uint8_t *q = x->q + r * C;
        float *yr = y + r * C;
        for (int64_t c0 = 0, b = 0; c0 < C; c0 += x->bcols, b++) {
            int64_t c1 = c0 + x->bcols < C ? c0 + x->bcols : C;
            float sc = s[b];
            for (int64_t c = c0; c < c1; c++) yr[c] = mxi_bits_f32(t->f32[q[c]]) * sc;
        }
    }
}

/* x dequantized into fp32 y (from its bf16 values when it has them: exact). */
static void dequant_blocks(float *y, const mxi_scaled_tensor *x, const mxi_code_values *t) {
    int64_t R = x->rows;
    if (x->v16) {
        mxi_ops_kernels_active()->widen_bf16(y, x->v16, x->cols, R, x->cols);
        return;
    }
    if (pieces_of(R * x->cols) <= 1) {
        dequant_block_rows(y, x, t, 0, R);
        return;
    }
    #pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < R; r++) dequant_block_rows(y, x, t, r, r + 1);
}

/* C (+)= op(A) op(B) on the dequantized operands of a product with block scales: bf16 where
 * oneDNN multiplies bf16 natively and both go to bf16 exactly (pow2_blocks_of), else fp32. */
static int block_gemm(mxi_gemm_ctx *ctx, const mxi_scaled_gemm_args *args, const mxi_code_values *ta,
                      const mxi_code_values *tb, int64_t M, int64_t N, int64_t K, mx_diag *diag) {
    const mxi_scaled_tensor *A = args->a, *B = args->b;
    size_t ea = (size_t)(A->rows * A->cols), eb = (size_t)(B->rows * B->cols);
    size_t sa = (size_t)(((A->rows + A->brows - 1) / A->brows) * ((A->cols + A->bcols - 1) / A->bcols));
    size_t sb = (size_t)(((B->rows + B->brows - 1) / B->brows) * ((B->cols + B->bcols - 1) / B->bcols));
    bool native = mxi_gemm_bf16_native(ctx);
    // bf16: the fp32 slots hold the block exponents; fp32: the dequantized operands
    void *a = mxi_gemm_ctx_buffer(ctx, MXI_GEMM_SLOT_A, native ? sa * 2 : ea * 4);
    void *b = mxi_gemm_ctx_buffer(ctx, MXI_GEMM_SLOT_B, native ? sb * 2 : eb * 4);
    if (!a || !b) goto oom;
    bool bf16 = native && (A->v16 || pow2_blocks_of(a, A, ta)) && (B->v16 || pow2_blocks_of(b, B, tb));
    if (native && !bf16) {
        a = mxi_gemm_ctx_buffer(ctx, MXI_GEMM_SLOT_A, ea * 4), b = mxi_gemm_ctx_buffer(ctx, MXI_GEMM_SLOT_B, eb * 4);
        if (!a || !b) goto oom;
    }
    const uint16_t *a16 = NULL, *b16 = NULL;
    if (bf16) {   // the values an operand came with, else its codes through pow2_blocks
        uint16_t *ca = A->v16 ? NULL : mxi_gemm_ctx_buffer(ctx, MXI_GEMM_SLOT_A16, ea * 2);
        uint16_t *cb = B->v16 ? NULL : mxi_gemm_ctx_buffer(ctx, MXI_GEMM_SLOT_B16, eb * 2);
        if ((!A->v16 && !ca) || (!B->v16 && !cb)) goto oom;
        if (ca) pow2_blocks(ca, A, ta, a, A->brows, A->bcols);
        if (cb) pow2_blocks(cb, B, tb, b, B->brows, B->bcols);
        a16 = ca ? ca : A->v16, b16 = cb ? cb : B->v16;
    } else {
        dequant_blocks(a, A, ta);
        dequant_blocks(b, B, tb);
    }
    mxi_dtype type = bf16 ? MXI_BF16 : MXI_F32;
    const void *da = bf16 ? (const void *)a16 : a, *db = bf16 ? (const void *)b16 : b;
    mxi_matmul_args mm = {.C = args->C, .a = {.data = da, .type = type, .trans = args->trans_a},
                          .b = {.data = db, .type = type, .trans = args->trans_b},
                          .M = M, .N = N, .K = K, .accumulate = args->accumulate, .runtime = args->runtime};
    return mxi_matmul_ex(ctx, &mm, diag);
oom:
    return mxi_diag(diag, MX_ENOMEM, "mxi_scaled_gemm: out of memory for the operands of a %lld x %lld x %lld product",
                    (long long)M, (long long)N, (long long)K);
}

/* ---- line scales that are powers of two ---- */

/* The codes' values of an operand that came as its scaled values (v16, a scale per line:
 * op(A)'s rows or op(B)'s columns, stored rows or columns): each divided by its line's scale
 * again (exact: powers of two), into bf16 y16 or fp32 y. Scalar: only products whose scales
 * fall outside pow2_sums_exact's range come here. */
static void unscale_lines(float *y, uint16_t *y16, const mxi_scaled_tensor *x, bool stored_rows) {
    for (int64_t r = 0; r < x->rows; r++)
        for (int64_t c = 0; c < x->cols; c++) {
            int64_t i = r * x->cols + c;
            float v = mxi_bf16_to_f32(x->v16[i]) / x->vscale[stored_rows ? r : c];
            if (y16) y16[i] = mxi_f32_to_bf16(v);
            else y[i] = v;
        }
}

/* An operand's scales as exponents for pow2_rows16: one per line (op(A)'s rows for a, op(B)'s
 * columns for b), in blocks of (1, cols) where those lines are stored rows, (rows, 1) where
 * they are stored columns, (rows, cols) for one scale; lo and hi the least and greatest. */
typedef struct {
    int16_t *e;
    int64_t brows, bcols;
    int lo, hi;
} line_exps;

/* Whether every scale of FP8 operand x is 2^k with k in t's [pow2_lo, pow2_hi] (each nonzero
 * value times it a normal bf16); then le holds them. */
static bool pow2_lines_of(line_exps *le, const mxi_scaled_tensor *x, bool stored_rows, const mxi_code_values *t) {
    if (x->elem == MX_HIF8) return false;
    int64_t n = x->vscale ? (stored_rows ? x->rows : x->cols) : 1;
    if (!pow2_exponents(le->e, x->vscale ? x->vscale : &x->scale_inv, n, t, &le->lo, &le->hi)) return false;
    le->brows = x->vscale && stored_rows ? 1 : x->rows;
    le->bcols = x->vscale && !stored_rows ? 1 : x->cols;
    return true;
}

/* Whether C[i][j] = sum over k of (qa * 2^ea[i]) (qb * 2^eb[j]) in fp32 is exactly
 * 2^(ea[i] + eb[j]) times the sum of the codes' products, whatever the order of the sums:
 * every value of a format is a multiple of its smallest, 2^(-126 - pow2_lo), so each exact
 * partial sum of one output is 0 or at least that unit times 2^(ea + eb) in magnitude, which
 * keeps it normal (a rounding to fp32, flushing or not, commutes with the power of two); and
 * K products of the largest magnitudes (below 2^(128 - pow2_hi)) stay below 2^127. Then the
 * scaled product is fp32(fp32(2^ea 2^eb) acc), the scales applied after, bit for bit. */
static bool pow2_sums_exact(const line_exps *a, const line_exps *b, const mxi_code_values *ta,
                            const mxi_code_values *tb, int64_t K) {
    int log2_k = 0;
    while (log2_k < 63 && (INT64_C(1) << log2_k) < K) log2_k++;
    return a->lo + b->lo - 252 - ta->pow2_lo - tb->pow2_lo >= -126 &&
           a->hi + b->hi + log2_k + 256 - ta->pow2_hi - tb->pow2_hi <= 127;
}

/* A product with line scales, each a power of two within pow2_sums_exact's range, where
 * oneDNN multiplies bf16 natively: each operand goes to bf16 already scaled (exact), and the
 * product is the result, added to C after when accumulating; the scales' pass is saved. */
static int pow2_lines_gemm(mxi_gemm_ctx *ctx, const mxi_scaled_gemm_args *args, const mxi_code_values *ta,
                           const mxi_code_values *tb, const line_exps *la, const line_exps *lb, int64_t M, int64_t N,
                           int64_t K, mx_diag *diag) {
    const mxi_scaled_tensor *A = args->a, *B = args->b;
    uint16_t *a16 = A->v16 ? NULL : mxi_gemm_ctx_buffer(ctx, MXI_GEMM_SLOT_A16, (size_t)(A->rows * A->cols) * 2);
    uint16_t *b16 = B->v16 ? NULL : mxi_gemm_ctx_buffer(ctx, MXI_GEMM_SLOT_B16, (size_t)(B->rows * B->cols) * 2);
    float *out = args->accumulate ? mxi_gemm_ctx_buffer(ctx, MXI_GEMM_SLOT_C, (size_t)(M * N) * sizeof(float)) : args->C;
    if ((!a16 && !A->v16) || (!b16 && !B->v16) || !out)
        return mxi_diag(diag, MX_ENOMEM, "mxi_scaled_gemm: out of memory for the operands of a %lld x %lld x %lld product",
                        (long long)M, (long long)N, (long long)K);
    if (!A->v16) pow2_blocks(a16, A, ta, la->e, la->brows, la->bcols);
    if (!B->v16) pow2_blocks(b16, B, tb, lb->e, lb->brows, lb->bcols);
    mxi_matmul_args mm = {.C = out, .a = {.data = A->v16 ? A->v16 : a16, .type = MXI_BF16, .trans = args->trans_a},
                          .b = {.data = B->v16 ? B->v16 : b16, .type = MXI_BF16, .trans = args->trans_b},
                          .M = M, .N = N, .K = K,
                          .runtime = args->runtime};
    int rc = mxi_matmul_ex(ctx, &mm, diag);
    if (rc || !args->accumulate) return rc;
    // C + 1 * out, one rounding as the scales' pass adds (oneDNN's sum post-op may add C
    // before the products are all summed)
    static const mxi_scaled_tensor unit = {.scale_inv = 1.0f};
    apply_scales(args->C, out, &unit, &unit, M, N, true);
    return MX_OK;
}

int mxi_scaled_gemm(mxi_gemm_ctx *ctx, const mxi_scaled_gemm_args *args, mx_diag *diag) {
    static const char fn[] = "mxi_scaled_gemm";
    if (!ctx || !args || !args->a || !args->b) return mxi_diag(diag, MX_ENULL, "%s: NULL argument", fn);
    const mxi_scaled_tensor *A = args->a, *B = args->b;
    int64_t M = args->trans_a ? A->cols : A->rows, K = args->trans_a ? A->rows : A->cols;
    int64_t Kb = args->trans_b ? B->cols : B->rows, N = args->trans_b ? B->rows : B->cols;
    if (A->rows < 0 || A->cols < 0 || B->rows < 0 || B->cols < 0 || K != Kb)
        return mxi_diag(diag, MX_ESIZE, "%s: op(A) is %lld x %lld, op(B) is %lld x %lld (allowed: sizes >= 0, equal "
                        "inner dims)", fn, (long long)M, (long long)K, (long long)Kb, (long long)N);
    const mxi_code_values *ta = mxi_code_values_of(A->elem), *tb = mxi_code_values_of(B->elem);
    if (!ta || !tb)
        return mxi_diag(diag, MX_EENUM, "%s: element format %d (allowed: MX_E4M3, MX_E5M2, MX_HIF8)", fn,
                        (int)(ta ? B->elem : A->elem));
    const mxi_scaled_tensor *blocked = A->bscale ? A : B->bscale ? B : NULL;
    if (blocked && (!A->bscale || !B->bscale || A->elem == MX_HIF8 || B->elem == MX_HIF8))
        return mxi_diag(diag, MX_EENUM, "%s: block scales on %s (allowed: on both operands, FP8 codes)", fn,
                        A->bscale && B->bscale ? "HiF8 codes" : "one operand only");
    if (blocked && (A->brows < 1 || A->bcols < 1 || B->brows < 1 || B->bcols < 1))
        return mxi_diag(diag, MX_ESIZE, "%s: block sizes %lldx%lld and %lldx%lld (allowed: >= 1)", fn,
                        (long long)A->brows, (long long)A->bcols, (long long)B->brows, (long long)B->bcols);
    if (M == 0 || N == 0) return MX_OK;
    float *C = args->C;
    if (!C || (K > 0 && ((!A->q && !A->v16) || (!B->q && !B->v16))))
        return mxi_diag(diag, MX_ENULL, "%s: NULL output or codes", fn);
    if ((A->v16 && !A->bscale && !A->vscale) || (B->v16 && !B->bscale && !B->vscale))
        return mxi_diag(diag, MX_EINVAL, "%s: bf16 values with one scale (allowed: with block or line scales)", fn);
    if (K == 0) {
        if (!args->accumulate) memset(C, 0, (size_t)(M * N) * sizeof *C);
        return MX_OK;
    }
    if (blocked) return block_gemm(ctx, args, ta, tb, M, N, K, diag);
    bool native = mxi_gemm_bf16_native(ctx);
    if (native && (A->vscale || B->vscale)) {   // the exponents in the fp32 slots, unused on this path
        line_exps la = {.e = mxi_gemm_ctx_buffer(ctx, MXI_GEMM_SLOT_A, (size_t)(A->vscale ? M : 1) * sizeof(int16_t))};
        line_exps lb = {.e = mxi_gemm_ctx_buffer(ctx, MXI_GEMM_SLOT_B, (size_t)(B->vscale ? N : 1) * sizeof(int16_t))};
        if (!la.e || !lb.e)
            return mxi_diag(diag, MX_ENOMEM, "%s: out of memory for the scales of a %lld x %lld x %lld product", fn,
                            (long long)M, (long long)N, (long long)K);
        if (pow2_lines_of(&la, A, !args->trans_a, ta) && pow2_lines_of(&lb, B, args->trans_b, tb) &&
            pow2_sums_exact(&la, &lb, ta, tb, K))
            return pow2_lines_gemm(ctx, args, ta, tb, &la, &lb, M, N, K, diag);
    }
    size_t ea = (size_t)(A->rows * A->cols), eb = (size_t)(B->rows * B->cols), w = native ? 2 : 4;
    void *a = mxi_gemm_ctx_buffer(ctx, native ? MXI_GEMM_SLOT_A16 : MXI_GEMM_SLOT_A, ea * w);
    void *b = mxi_gemm_ctx_buffer(ctx, native ? MXI_GEMM_SLOT_B16 : MXI_GEMM_SLOT_B, eb * w);
    // accumulating: the unscaled product goes to a buffer first, the scales applied on adding
    float *out = args->accumulate ? mxi_gemm_ctx_buffer(ctx, MXI_GEMM_SLOT_C, (size_t)(M * N) * sizeof(float)) : C;
    if (!a || !b || !out)
        return mxi_diag(diag, MX_ENOMEM, "%s: out of memory for the operands of a %lld x %lld x %lld product", fn,
                        (long long)M, (long long)N, (long long)K);
    if (A->v16) unscale_lines(native ? NULL : a, native ? a : NULL, A, !args->trans_a);
    else decode(native ? NULL : a, native ? a : NULL, A, ta);
    if (B->v16) unscale_lines(native ? NULL : b, native ? b : NULL, B, args->trans_b);
    else decode(native ? NULL : b, native ? b : NULL, B, tb);
    mxi_dtype type = native ? MXI_BF16 : MXI_F32;
    mxi_matmul_args mm = {.C = out, .a = {.data = a, .type = type, .trans = args->trans_a},
                          .b = {.data = b, .type = type, .trans = args->trans_b}, .M = M, .N = N, .K = K,
                          .runtime = args->runtime};
    int rc = mxi_matmul_ex(ctx, &mm, diag);
    if (rc) return rc;
    apply_scales(C, out, A, B, M, N, args->accumulate);
    return MX_OK;
}
