/* Linear layers over mxi_matmul. At bf16 compute precision the operands are rounded to
 * bf16 (round-to-nearest-even) into context buffers first; products accumulate in fp32. */
#include "model/linear.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/diag.h"
#include "ops/gemm.h"
#include "ops/mx_gemm.h"
#include "ops/nn_kernels.h"
#include "ops/scaled_gemm.h"

struct mxi_linear_ctx {
    mxi_gemm_ctx *gemm;
    bool bf16;
    bool weights_bf16;     // weights hold bf16 values already (mxi_linear_ctx_weights_bf16)
    void *buf[3];          // bf16 copies of the two operands, and of the shared input (grow-only)
    size_t cap[3];         // bytes
    uint8_t *mxbuf[MXI_LINEAR_SLOTS]; // MX planes: codes and scales of the two operands, tile scales,
                           // dout's rowwise plane made beside its colwise one; the rowwise recipes'
                           // operands (grow-only)
    size_t mxcap[MXI_LINEAR_SLOTS]; // bytes
    // the input plane of the last forward GEMM, reused while the caller shares one input
    const float *shared;   // the input being shared (linear_share_input), NULL when none
    mxi_mx_plane shared_plane;
    mx_scale_mode shared_mode;
    bool shared_valid;
    bool given;            // the shared plane came from mxi_linear_given_input (measured where it was made)
    struct {               // the shared input quantized (mxi_linear_keep_quantized)
        mxi_scaled_tensor t;
        int kind, slots[2];
        bool valid;
    } kept;
    float shared_amax;     // the shared input's amax, measured by the first delayed cast of it
    bool shared_amax_valid;
    int64_t shared_bf16_n; // elements of the shared input rounded into its bf16 copy, 0 when none
    uint16_t *shared16;    // where that copy goes: the caller's (linear_share_input_into), or NULL for buf[2]
    bool vary_tokens;      // token counts change from call to call (linear_vary_tokens)
    int error;             // first failure, sticky
    mx_diag diag;
    const char *trace_dir; // when set: dump the first MX GEMM of each kind (see linear.h)
    bool traced[3];
    int saves_traced;
    mxi_quant_stats *qs;   // quantization statistics (mxi_linear_ctx_stats), or NULL
};

void mxi_linear_ctx_stats(mxi_linear_ctx *ctx, mxi_quant_stats *qs) { ctx->qs = qs; }
mxi_quant_stats *mxi_linear_ctx_stats_of(mxi_linear_ctx *ctx) { return ctx->qs; }

/* Fold an MX plane made from x (NULL: not at hand) into the statistics of tensor's role. */
static void stats_plane(mxi_linear_ctx *ctx, int tensor, mxi_qs_role role, const float *x, const mxi_mx_plane *p) {
    mxi_qs_operand op = {.q = p->q, .rows = p->rows, .cols = p->cols, .elem = p->elem, .scaling = MXI_QS_BLOCKS,
                         .axis = p->axis, .e8m0 = p->scales};
    mxi_quant_stats_record(ctx->qs, tensor, role, x, &op);
}

void mxi_linear_ctx_trace(mxi_linear_ctx *ctx, const char *dir) {
    ctx->trace_dir = dir;
    ctx->traced[0] = ctx->traced[1] = ctx->traced[2] = false;
    ctx->saves_traced = 0;
}

bool mxi_linear_ctx_tracing(const mxi_linear_ctx *ctx) { return ctx->trace_dir != NULL; }

/* Write DIR/<kind>_<name>.bin with n bytes. */
static void trace_write(mxi_linear_ctx *ctx, const char *kind, const char *name, const void *data, size_t n) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s_%s.bin", ctx->trace_dir, kind, name);
    FILE *f = fopen(path, "wb");
    if (!f) return;
    if (fwrite(data, 1, n, f) != n) ctx->error = ctx->error ? ctx->error : MX_EIO;
    fclose(f);
}

void mxi_linear_trace_scaled(mxi_linear_ctx *ctx, int kind, const mxi_trace_operand ops[2]) {
    static const char *const kinds[3] = {"forward", "dinput", "dweight"};
    if (!ctx->trace_dir || ctx->traced[kind]) return;
    ctx->traced[kind] = true;
    for (int i = 0; i < 2; i++) {
        const mxi_scaled_tensor *t = ops[i].t;
        char name[16];
        int64_t meta[5] = {t->rows, t->cols, ops[i].axis, t->elem, 0};
        size_t n = (size_t)(t->rows * t->cols);
        snprintf(name, sizeof name, "%c_meta", 'a' + i), trace_write(ctx, kinds[kind], name, meta, sizeof meta);
        if (ops[i].hp) snprintf(name, sizeof name, "%c_hp", 'a' + i), trace_write(ctx, kinds[kind], name, ops[i].hp, n * 4);
        snprintf(name, sizeof name, "%c_q", 'a' + i), trace_write(ctx, kinds[kind], name, t->q, n);
        snprintf(name, sizeof name, "%c_s", 'a' + i), trace_write(ctx, kinds[kind], name, ops[i].scales, ops[i].n_scales * 4);
    }
}

int mxi_linear_scaled_gemm(mxi_linear_ctx *ctx, unsigned runtime, float *C, const mxi_scaled_tensor *A, bool trans_a,
                           const mxi_scaled_tensor *B, bool trans_b, mxi_write write) {
    mxi_scaled_gemm_args args = {.C = C, .a = A, .b = B, .trans_a = trans_a, .trans_b = trans_b,
                                 .accumulate = write == MXI_WRITE_ADD, .runtime = runtime};
    mx_diag diag;
    int rc = mxi_scaled_gemm(ctx->gemm, &args, &diag);
    if (rc) mxi_linear_ctx_record(ctx, rc, &diag);
    return rc;
}

/* Dump one MX GEMM: both high-precision operands and the planes made from them (b_tiles:
 * the right operand is a weight quantized in 32x32 tiles). */
static void trace_gemm(mxi_linear_ctx *ctx, int kind, const float *a, const mxi_mx_plane *pa, const float *b,
                       const mxi_mx_plane *pb, bool b_tiles) {
    static const char *const kinds[3] = {"forward", "dinput", "dweight"};
    if (!ctx->trace_dir || ctx->traced[kind]) return;
    ctx->traced[kind] = true;
    const char *k = kinds[kind];
    const mxi_mx_plane *planes[2] = {pa, pb};
    const float *hp[2] = {a, b};
    for (int i = 0; i < 2; i++) {
        const mxi_mx_plane *p = planes[i];
        char name[16];
        int64_t meta[5] = {p->rows, p->cols, p->axis, p->elem, i == 1 && b_tiles};
        snprintf(name, sizeof name, "%c_meta", 'a' + i), trace_write(ctx, k, name, meta, sizeof meta);
        // a saved input has no fp32 tensor left in backward: its plane was checked when saved
        if (hp[i]) snprintf(name, sizeof name, "%c_hp", 'a' + i), trace_write(ctx, k, name, hp[i], (size_t)(p->rows * p->cols) * 4);
        snprintf(name, sizeof name, "%c_q", 'a' + i), trace_write(ctx, k, name, p->q, (size_t)(p->rows * p->cols));
        snprintf(name, sizeof name, "%c_s", 'a' + i),
            trace_write(ctx, k, name, p->scales, (size_t)mx_scale_count(p->rows, p->cols, p->axis));
    }
}

/* Dump one GEMM of per-tensor operands (see linear.h: axis MXI_TRACE_TENSOR). */
static void trace_tensor_gemm(mxi_linear_ctx *ctx, int kind, const float *a, const mxi_scaled_tensor *ta, const float *b,
                              const mxi_scaled_tensor *tb) {
    static const char *const kinds[3] = {"forward", "dinput", "dweight"};
    if (!ctx->trace_dir || ctx->traced[kind]) return;
    ctx->traced[kind] = true;
    const mxi_scaled_tensor *ts[2] = {ta, tb};
    const float *hp[2] = {a, b};
    for (int i = 0; i < 2; i++) {
        char name[16];
        int64_t meta[5] = {ts[i]->rows, ts[i]->cols, MXI_TRACE_TENSOR, ts[i]->elem, 0};
        size_t n = (size_t)(ts[i]->rows * ts[i]->cols);
        snprintf(name, sizeof name, "%c_meta", 'a' + i), trace_write(ctx, kinds[kind], name, meta, sizeof meta);
        if (hp[i]) snprintf(name, sizeof name, "%c_hp", 'a' + i), trace_write(ctx, kinds[kind], name, hp[i], n * 4);
        snprintf(name, sizeof name, "%c_q", 'a' + i), trace_write(ctx, kinds[kind], name, ts[i]->q, n);
        snprintf(name, sizeof name, "%c_s", 'a' + i), trace_write(ctx, kinds[kind], name, &ts[i]->scale_inv, 4);
    }
}

int mxi_linear_ctx_create(mxi_linear_ctx **out, bool bf16, mx_diag *diag) {
    mxi_linear_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx)
        return mxi_diag(diag, MX_ENOMEM, "out of memory setting up the matrix products (%zu bytes)", sizeof *ctx);
    int rc = mxi_gemm_ctx_create(&ctx->gemm, diag);
    if (rc) {
        free(ctx);
        return rc;
    }
    ctx->bf16 = bf16;
    *out = ctx;
    return MX_OK;
}

void mxi_linear_ctx_free(mxi_linear_ctx *ctx) {
    if (!ctx) return;
    mxi_gemm_ctx_destroy(ctx->gemm);
    for (int i = 0; i < 3; i++) free(ctx->buf[i]);
    for (int i = 0; i < MXI_LINEAR_SLOTS; i++) free(ctx->mxbuf[i]);
    free(ctx);
}

int mxi_linear_ctx_error(const mxi_linear_ctx *ctx, mx_diag *diag) {
    if (ctx->error && diag) *diag = ctx->diag;
    return ctx->error;
}

mxi_gemm_ctx *mxi_linear_ctx_gemm(mxi_linear_ctx *ctx) { return ctx->gemm; }

void mxi_linear_ctx_weights_bf16(mxi_linear_ctx *ctx, bool yes) { ctx->weights_bf16 = yes; }

void mxi_linear_share_input(mxi_linear_ctx *ctx, const float *inp) {
    ctx->shared = inp;
    ctx->shared_valid = false;
    ctx->kept.valid = false;
    ctx->shared_amax_valid = false;
    ctx->given = false;
    ctx->shared_bf16_n = 0;
    ctx->shared16 = NULL;
}

void mxi_linear_share_input_into(mxi_linear_ctx *ctx, const float *inp, uint16_t *x16) {
    mxi_linear_share_input(ctx, inp);
    if (ctx->bf16 && mxi_gemm_bf16_native(ctx->gemm)) ctx->shared16 = x16;
}

void mxi_linear_given_input(mxi_linear_ctx *ctx, const float *inp, const mxi_mx_plane *plane, mx_scale_mode mode) {
    ctx->shared = inp;
    ctx->shared_plane = *plane, ctx->shared_mode = mode;
    ctx->shared_valid = true;
    ctx->kept.valid = false;
    ctx->shared_amax_valid = false;
    ctx->given = true;
    ctx->shared_bf16_n = 0;
    ctx->shared16 = NULL;
}

void mxi_linear_vary_tokens(mxi_linear_ctx *ctx, bool yes) { ctx->vary_tokens = yes; }

/* The GEMM dim that counts tokens, left to run time while they vary: M of the forward and
 * dinput products, K (the contraction) of dweight. */
static unsigned token_dim(const mxi_linear_ctx *ctx, unsigned dim) { return ctx->vary_tokens ? dim : 0; }

void mxi_linear_ctx_record(mxi_linear_ctx *ctx, int rc, const mx_diag *diag) {
    if (ctx->error || rc >= 0) return;
    ctx->error = rc;
    if (diag) ctx->diag = *diag;
}

static int fail(mxi_linear_ctx *ctx, int rc) {
    if (!ctx->error) ctx->error = rc;
    return rc;
}

/* A scratch buffer of bytes could not be had: the first error, with its line; NULL. */
static void *no_memory(mxi_linear_ctx *ctx, size_t bytes, const char *what) {
    if (!ctx->error) {
        ctx->error = MX_ENOMEM;
        mxi_diag(&ctx->diag, MX_ENOMEM, "out of memory for %s (%zu bytes)", what, bytes);
    }
    return NULL;
}

/* x (n elements) rounded to bf16 in buffer slot: as bf16 when the GEMM runs bf16 natively,
 * else as fp32 holding the bf16 values (the fp32 GEMM then needs no widening pass). The
 * shared input (linear_share_input) is rounded once, into slot 2 or the caller's copy
 * (linear_share_input_into), for every call that reads it. NULL when out of memory. */
static const void *to_bf16(mxi_linear_ctx *ctx, int slot, const float *x, int64_t n, bool native) {
    bool shared = x == ctx->shared;
    if (shared && ctx->shared16) {
        if (ctx->shared_bf16_n != n) mxi_bf16_operand(ctx->shared16, x, n, true);
        ctx->shared_bf16_n = n;
        return ctx->shared16;
    }
    if (shared && ctx->shared_bf16_n == n) return ctx->buf[2];
    if (shared) slot = 2;
    size_t bytes = (size_t)n * (native ? sizeof(uint16_t) : sizeof(float));
    if (bytes > ctx->cap[slot]) {
        free(ctx->buf[slot]);
        ctx->buf[slot] = malloc(bytes);
        ctx->cap[slot] = ctx->buf[slot] ? bytes : 0;
        if (!ctx->buf[slot]) return no_memory(ctx, bytes, "a bf16 operand of a matrix product");
    }
    mxi_bf16_operand(ctx->buf[slot], x, n, native);
    if (shared) ctx->shared_bf16_n = n;
    return ctx->buf[slot];
}

/* An operand of matmul: x (elems values, fp32), transposed or not; ready: already what
 * to_bf16 would give for it (backward's dY, rounded once for both of its products; a saved
 * bf16 input); weight: a weight (bf16 values already when ctx->weights_bf16); bits: x holds
 * bf16 bit patterns (a weight bound as bf16, mxi_linear_params.w16). */
typedef struct {
    const void *x;
    int64_t elems;
    bool trans, ready, weight, bits;
} operand;

/* bf16 bits x (n) widened to fp32 in buffer slot: for a product that does not run on bf16. */
static const float *widen_bits(mxi_linear_ctx *ctx, int slot, const uint16_t *x, int64_t n) {
    size_t bytes = (size_t)n * sizeof(float);
    if (bytes > ctx->cap[slot]) {
        free(ctx->buf[slot]);
        ctx->buf[slot] = malloc(bytes);
        ctx->cap[slot] = ctx->buf[slot] ? bytes : 0;
        if (!ctx->buf[slot]) return no_memory(ctx, bytes, "a weight widened from bf16");
    }
    mxi_bf16_widen(ctx->buf[slot], x, n, 0);
    return ctx->buf[slot];
}

/* C (M, N) = op(A) op(B) (or += with MXI_WRITE_ADD) with both operands at the compute precision. */
static int matmul(mxi_linear_ctx *ctx, unsigned runtime, float *C, operand A, operand B, int64_t M, int64_t N,
                  int64_t K, mxi_write write) {
    const void *a = A.x, *b = B.x;
    mxi_dtype type = MXI_F32;
    bool native = ctx->bf16 && mxi_gemm_bf16_native(ctx->gemm);
    if (B.bits && !native) {   // bf16 values either way: as fp32 for an fp32 product
        b = widen_bits(ctx, 1, B.x, B.elems);
        B.ready = true;
    }
    if (ctx->bf16) {
        if (!A.ready) a = to_bf16(ctx, 0, A.x, A.elems, native);
        if (!B.ready && !B.bits && !(B.weight && ctx->weights_bf16 && !native)) b = to_bf16(ctx, 1, B.x, B.elems, native);
        type = native ? MXI_BF16 : MXI_F32;
    }
    if (!a || !b) return fail(ctx, MX_ENOMEM);
    mxi_matmul_args args = {.C = C, .a = {.data = a, .type = type, .trans = A.trans},
                            .b = {.data = b, .type = type, .trans = B.trans}, .M = M, .N = N, .K = K,
                            .accumulate = write == MXI_WRITE_ADD, .runtime = runtime};
    int rc = mxi_matmul_ex(ctx->gemm, &args, &ctx->diag);
    return rc ? fail(ctx, rc) : MX_OK;
}

/* A layer's weight (elems) as a product's operand: its fp32 values or its bf16 bits. */
static operand weight_operand(mxi_linear_params p, int64_t elems, bool trans) {
    return p.w16 ? (operand){.x = p.w16, .elems = elems, .trans = trans, .weight = true, .bits = true}
                 : (operand){.x = p.w, .elems = elems, .trans = trans, .weight = true};
}

/* The MX GEMM C (+)= op(A) op(B) on planes, its failure recorded. */
static int mx_gemm(mxi_linear_ctx *ctx, unsigned runtime, float *C, const mxi_mx_plane *A, bool trans_a,
                   const mxi_mx_plane *B, bool trans_b, mxi_write write) {
    mxi_mx_gemm_args args = {.C = C, .a = A, .b = B, .trans_a = trans_a, .trans_b = trans_b,
                             .accumulate = write == MXI_WRITE_ADD, .runtime = runtime};
    int rc = mxi_mx_gemm_ex(ctx->gemm, &args, &ctx->diag);
    return rc ? fail(ctx, rc) : MX_OK;
}

/* Grow-only MX buffer slot of at least bytes; NULL when out of memory. */
static uint8_t *mx_buffer(mxi_linear_ctx *ctx, int slot, int64_t bytes) {
    if (slot == ctx->kept.slots[0] || slot == ctx->kept.slots[1]) ctx->kept.valid = false;   // about to change
    if ((size_t)bytes > ctx->mxcap[slot]) {
        free(ctx->mxbuf[slot]);
        ctx->mxbuf[slot] = malloc((size_t)bytes);
        ctx->mxcap[slot] = ctx->mxbuf[slot] ? (size_t)bytes : 0;
        if (!ctx->mxbuf[slot]) return no_memory(ctx, (size_t)bytes, "an MX plane");
    }
    return ctx->mxbuf[slot];
}

/* Quantize x (rows, cols) along axis into buffer slots (2*plane, 2*plane+1) and describe it. */
static int quantize_plane(mxi_linear_ctx *ctx, int plane, mxi_mx_plane *p, const float *x, int64_t rows, int64_t cols,
                          mx_axis axis, mx_elem elem, mx_scale_mode mode) {
    uint8_t *q = mx_buffer(ctx, 2 * plane, rows * cols), *s = mx_buffer(ctx, 2 * plane + 1, mx_scale_count(rows, cols, axis));
    if (!q || !s) return fail(ctx, MX_ENOMEM);
    int rc = mx_quantize_f32(x, rows, cols, axis, elem, mode, q, s);
    if (rc) return fail(ctx, rc);
    *p = (mxi_mx_plane){q, s, rows, cols, axis, elem};
    return MX_OK;
}

void *mxi_linear_ctx_buffer(mxi_linear_ctx *ctx, int slot, int64_t bytes) { return mx_buffer(ctx, slot, bytes); }

bool mxi_linear_shared_quantized(mxi_linear_ctx *ctx, const float *x, int kind, mxi_scaled_tensor *t) {
    if (!ctx->kept.valid || x != ctx->shared || kind != ctx->kept.kind) return false;
    *t = ctx->kept.t;
    return true;
}

void mxi_linear_keep_quantized(mxi_linear_ctx *ctx, const float *x, int kind, int q_slot, int s_slot,
                               const mxi_scaled_tensor *t) {
    if (x != ctx->shared) return;
    ctx->kept.t = *t, ctx->kept.kind = kind, ctx->kept.slots[0] = q_slot, ctx->kept.slots[1] = s_slot;
    ctx->kept.valid = true;
}

static int mx_check(mxi_linear_ctx *ctx, int rc) { return rc ? fail(ctx, rc) : MX_OK; }

/* The weight w (N, K) as the plane along axis. With 32x32 tiles (1-32-32 recipes) one tile
 * quantization serves both axes: the elements are the same and each tile's scale is spread
 * over the block layout the axis needs (mxi_tiles_spread). */
static int quantize_weight(mxi_linear_ctx *ctx, mxi_mx_plane *p, const float *w, int64_t N, int64_t K, mx_axis axis,
                           const mxi_linear_mx *mx) {
    if (!mx->weight_tiles) return quantize_plane(ctx, 1, p, w, N, K, axis, mx->weight, mx->mode);
    int64_t tr = (N + MX_BLOCK - 1) / MX_BLOCK, tc = (K + MX_BLOCK - 1) / MX_BLOCK;
    uint8_t *q = mx_buffer(ctx, 2, N * K), *s = mx_buffer(ctx, 3, mx_scale_count(N, K, axis)),
            *tiles = mx_buffer(ctx, 4, tr * tc);
    if (!q || !s || !tiles) return fail(ctx, MX_ENOMEM);
    int rc = mx_quantize_tiles_f32(w, N, K, mx->weight, mx->mode, q, tiles);
    if (rc) return fail(ctx, rc);
    mxi_tiles_spread(s, tiles, N, K, axis);
    *p = (mxi_mx_plane){q, s, N, K, axis, mx->weight};
    return MX_OK;
}

/* The weight's plane along axis: the pre-quantized one when given, else quantized from w. */
static int weight_plane(mxi_linear_ctx *ctx, mxi_mx_plane *p, const float *w, const mxi_mx_weight *wq, int64_t N,
                        int64_t K, mx_axis axis, const mxi_linear_mx *mx) {
    const mxi_mx_plane *given = wq ? (axis == MX_ROWWISE ? &wq->row : &wq->col) : NULL;
    if (given && given->q) {
        *p = *given;
        return MX_OK;
    }
    if (!w) return fail(ctx, MX_EINVAL);   // neither planes nor weights bound: an engine bug
    return quantize_weight(ctx, p, w, N, K, axis, mx);
}

static void add_bias(float *out, const float *b, int64_t M, int64_t N) {
    #pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < M; r++)
        for (int64_t j = 0; j < N; j++) out[r * N + j] += b[j];
}

/* ---- per-tensor recipes ---- */

typedef enum { ROLE_INPUT = MXI_DELAYED_INPUT, ROLE_WEIGHT = MXI_DELAYED_WEIGHT, ROLE_GRAD = MXI_DELAYED_GRAD } tensor_role;

/* x (n) quantized with one scale by current scaling: FP8 as TE's, HiF8 to MindSpeed's
 * target maximum of the role; codes into q, the dequantization scale into *s. */
static int tensor_codes(uint8_t *q, float *s, const float *x, int64_t n, const mxi_linear_mx *mx, mx_elem elem,
                        tensor_role role) {
    if (elem != MX_HIF8) return mx_fp8_quantize_tensor_f32(x, n, elem, mx->tmode, q, s);
    return mx_hif8_quantize_tensor_ex_f32(x, n, role == ROLE_GRAD ? MXI_HIF8_TARGET_GRAD : MXI_HIF8_TARGET_ACT, mx->tmode,
                                          q, s);
}

/* The kind of quantization of an input per tensor (mxi_linear_shared_quantized). */
static int tensor_kind(const mxi_linear_mx *mx) { return MXI_SCALE_TENSOR | mx->inputs << 8 | mx->tmode << 12; }

/* x (rows, cols) quantized with one scale for the whole tensor into buffer slot: FP8 as TE's
 * current scaling, HiF8 to MindSpeed's target maximum of its role. The shared input (q, k
 * and v, or gate and up, read one) is quantized once into slot 0 for all of them while its
 * scale is its own amax's; with delayed scaling each layer has its scale, and its codes. */
static int quantize_tensor(mxi_linear_ctx *ctx, int slot, mxi_scaled_tensor *t, const float *x, int64_t rows,
                           int64_t cols, const mxi_linear_mx *mx, tensor_role role, const mxi_delayed_site *ds) {
    mx_elem elem = role == ROLE_INPUT ? mx->inputs : role == ROLE_WEIGHT ? mx->weight : mx->grads;
    bool share = role == ROLE_INPUT && !(ds && ds->state);
    int kind = tensor_kind(mx);   // used for inputs only
    if (share && mxi_linear_shared_quantized(ctx, x, kind, t)) return MX_OK;
    uint8_t *q = mx_buffer(ctx, slot, rows * cols);
    if (!q) return fail(ctx, MX_ENOMEM);
    float s = 1.0f;
    if (ds && ds->state) {   // delayed scaling: the slot's scale, and the amax for its history
        mxi_delayed_role r = (mxi_delayed_role)role;
        bool shared = x == ctx->shared, measure = mxi_delayed_records(ds, r) && !(shared && ctx->shared_amax_valid);
        float amax = ctx->shared_amax;
        mxi_delayed_encode(x, rows * cols, elem, mxi_delayed_scale(ds, r), q, &s, measure ? &amax : NULL);
        if (measure && shared) ctx->shared_amax = amax, ctx->shared_amax_valid = true;   // q, k, v: one amax
        if (mxi_delayed_records(ds, r)) mxi_delayed_note(ds, r, amax);
        *t = (mxi_scaled_tensor){.q = q, .rows = rows, .cols = cols, .elem = elem, .scale_inv = s};
        return MX_OK;
    }
    int rc = tensor_codes(q, &s, x, rows * cols, mx, elem, role);
    if (rc) return fail(ctx, rc);
    *t = (mxi_scaled_tensor){.q = q, .rows = rows, .cols = cols, .elem = elem, .scale_inv = s};
    if (share) mxi_linear_keep_quantized(ctx, x, kind, slot, -1, t);
    return MX_OK;
}

/* Fold a per-tensor operand made from x into the statistics of tensor's role. */
static void stats_tensor(mxi_linear_ctx *ctx, int tensor, mxi_qs_role role, const float *x, const mxi_scaled_tensor *t) {
    mxi_qs_operand op = {.q = t->q, .rows = t->rows, .cols = t->cols, .elem = t->elem, .scaling = MXI_QS_TENSOR,
                         .scale = &t->scale_inv};
    mxi_quant_stats_record(ctx->qs, tensor, role, x, &op);
}

/* The weight W (N, K) as one scaled tensor: the codes the engine gathered (quantized with
 * the whole weight's scale), else quantized from p.w here. */
static int tensor_weight(mxi_linear_ctx *ctx, mxi_scaled_tensor *w, mxi_linear_params p, int64_t N, int64_t K,
                         const mxi_linear_mx *mx) {
    if (p.wq && p.wq->row.q && p.wq->tscale) {
        *w = (mxi_scaled_tensor){.q = p.wq->row.q, .rows = N, .cols = K, .elem = mx->weight, .scale_inv = *p.wq->tscale};
        return MX_OK;
    }
    if (!p.w) return fail(ctx, MX_EINVAL);   // neither codes nor weights bound: an engine bug
    return quantize_tensor(ctx, 2, w, p.w, N, K, mx, ROLE_WEIGHT, &p.delayed);
}

/* Y = X W^T with X and W each quantized whole (the micro-batch's rows, the gathered weight). */
static int tensor_forward(mxi_linear_ctx *ctx, const mxi_linear_mx *mx, float *out, const float *inp,
                          mxi_linear_params p, int64_t M, int64_t N, int64_t K) {
    mxi_scaled_tensor x, w;
    int rc = quantize_tensor(ctx, 0, &x, inp, M, K, mx, ROLE_INPUT, &p.delayed);
    if (!rc) rc = tensor_weight(ctx, &w, p, N, K, mx);
    if (!rc) trace_tensor_gemm(ctx, 0, inp, &x, p.w, &w);
    if (!rc && mxi_quant_stats_on(ctx->qs))
        stats_tensor(ctx, p.tensor, MXI_QS_FPROP_X, inp, &x), stats_tensor(ctx, p.tensor, MXI_QS_FPROP_W, p.w, &w);
    if (!rc)
        rc = mxi_linear_scaled_gemm(ctx, token_dim(ctx, MXI_GEMM_RUNTIME_M), out, &x, false, &w, true, MXI_WRITE_SET);
    if (!rc && p.b) add_bias(out, p.b, M, N);
    return rc;
}

/* dW += dY^T X and dX (+)= dY W, dY quantized once (its scale is the tensor's whatever the
 * layout), X the codes forward saved or again from fp32 (the same codes forward used), W
 * again. */
static int tensor_backward(mxi_linear_ctx *ctx, const mxi_linear_mx *mx, mxi_linear_grads grads, const float *dout,
                           mxi_linear_input input, mxi_linear_params p, int64_t M, int64_t N, int64_t K) {
    const float *inp = input.inp;
    const mxi_saved_input *saved = !inp && input.saved && input.saved->q ? input.saved : NULL;
    if (grads.dw && !inp && !saved) return fail(ctx, MX_EINVAL);   // no input kept: an engine bug
    mxi_scaled_tensor dy, x, w;
    int rc = quantize_tensor(ctx, 5, &dy, dout, M, N, mx, ROLE_GRAD, &p.delayed);
    if (!rc && grads.dw) {
        if (saved) {
            x = (mxi_scaled_tensor){.q = saved->q, .rows = M, .cols = K, .elem = mx->inputs};
            memcpy(&x.scale_inv, saved->scales, sizeof x.scale_inv);
        } else {
            rc = quantize_tensor(ctx, 0, &x, inp, M, K, mx, ROLE_INPUT, &p.delayed);
        }
        if (!rc) trace_tensor_gemm(ctx, 2, dout, &dy, inp, &x);
        if (!rc && mxi_quant_stats_on(ctx->qs)) {
            stats_tensor(ctx, p.tensor, MXI_QS_WGRAD_DY, dout, &dy);
            if (saved) mxi_quant_stats_saved(ctx->qs, p.tensor, MXI_QS_WGRAD_X, saved->q);   // measured when saved
            else stats_tensor(ctx, p.tensor, MXI_QS_WGRAD_X, inp, &x);
        }
        if (!rc)
            rc = mxi_linear_scaled_gemm(ctx, token_dim(ctx, MXI_GEMM_RUNTIME_K), grads.dw, &dy, true, &x, false,
                                        MXI_WRITE_ADD);
    }
    if (!rc && grads.dinp) {
        rc = tensor_weight(ctx, &w, p, N, K, mx);
        if (!rc) trace_tensor_gemm(ctx, 1, dout, &dy, p.w, &w);
        if (!rc && mxi_quant_stats_on(ctx->qs))
            stats_tensor(ctx, p.tensor, MXI_QS_DGRAD_DY, dout, &dy), stats_tensor(ctx, p.tensor, MXI_QS_DGRAD_W, p.w, &w);
        if (!rc)
            rc = mxi_linear_scaled_gemm(ctx, token_dim(ctx, MXI_GEMM_RUNTIME_M), grads.dinp, &dy, false, &w, false,
                                        grads.dinp_write);
    }
    return rc;
}

int mxi_linear_forward(mxi_linear_ctx *ctx, const mxi_linear_mx *mx, float *out, const float *inp, mxi_linear_params p,
                       mxi_linear_shape shape) {
    // GEMM letters: Y (M, N) = X (M, K) W^T, W (N, K)
    int64_t M = shape.rows, K = shape.in, N = shape.out;
    const float *w = p.w, *b = p.b;
    if (M == 0) return MX_OK;
    if (mx && p.w16) return fail(ctx, MX_EINVAL);   // converted weights come as fp32 or planes: an engine bug
    if (mx && mx->high_precision & MX_GEMM_FPROP) mx = NULL;   // high_precision_gemms: as unconverted
    if (mx && mx->scaling == MXI_SCALE_TENSOR) return tensor_forward(ctx, mx, out, inp, p, M, N, K);
    if (mx && (mx->scaling == MXI_SCALE_ROWS || mx->scaling == MXI_SCALE_BLOCKS128)) {
        int rc = mx->scaling == MXI_SCALE_ROWS ? mxi_linear_rows_forward(ctx, mx, out, inp, &p, M, N, K)
                                               : mxi_linear_blocks_forward(ctx, mx, out, inp, &p, M, N, K);
        if (!rc && b) add_bias(out, b, M, N);
        return rc;
    }
    if (mx) {
        mxi_mx_plane xr, wr;
        int rc = MX_OK;
        bool given = false;   // the plane came made (mxi_linear_given_input): inp holds its dequantized values
        const mxi_mx_plane *sp = &ctx->shared_plane;
        if (ctx->shared_valid && inp == ctx->shared && sp->rows == M && sp->cols == K && sp->elem == mx->inputs &&
            ctx->shared_mode == mx->mode) {
            xr = *sp;   // q, k, v (or gate, up) read one input: quantized once
            given = ctx->given;
        } else {
            rc = quantize_plane(ctx, 0, &xr, inp, M, K, MX_ROWWISE, mx->inputs, mx->mode);
            ctx->shared_valid = !rc && inp == ctx->shared;
            ctx->shared_plane = xr, ctx->shared_mode = mx->mode;
            ctx->given = false;
        }
        if (!rc) rc = weight_plane(ctx, &wr, w, p.wq, N, K, MX_ROWWISE, mx);
        if (!rc) trace_gemm(ctx, 0, inp, &xr, w, &wr, mx->weight_tiles);
        if (!rc && mxi_quant_stats_on(ctx->qs)) {   // a given plane was measured where it was made
            if (!given) stats_plane(ctx, p.tensor, MXI_QS_FPROP_X, inp, &xr);
            stats_plane(ctx, p.tensor, MXI_QS_FPROP_W, w, &wr);
        }
        if (!rc) rc = mx_gemm(ctx, token_dim(ctx, MXI_GEMM_RUNTIME_M), out, &xr, false, &wr, true, MXI_WRITE_SET);   // Y = X W^T
        if (!rc && b) add_bias(out, b, M, N);
        return rc;
    }
    int rc = matmul(ctx, token_dim(ctx, MXI_GEMM_RUNTIME_M), out, (operand){.x = inp, .elems = M * K},
                    weight_operand(p, N * K, true), M, N, K, MXI_WRITE_SET);
    if (rc || !b) return rc;
    add_bias(out, b, M, N);
    return MX_OK;
}

/* Dump a saved input (meta: rows, cols, axis, elem, 0), so that backward's operands can be
 * traced to one: its fp32 values, codes and scales (s_bytes). */
static void trace_save(mxi_linear_ctx *ctx, const int64_t meta[5], const float *inp, const uint8_t *q, const void *s,
                       size_t s_bytes) {
    if (!ctx->trace_dir) return;
    char kind[16];
    snprintf(kind, sizeof kind, "save%03d", ctx->saves_traced++);
    trace_write(ctx, kind, "a_meta", meta, 5 * sizeof *meta);
    trace_write(ctx, kind, "a_hp", inp, (size_t)(meta[0] * meta[1]) * 4);
    trace_write(ctx, kind, "a_q", q, (size_t)(meta[0] * meta[1]));
    trace_write(ctx, kind, "a_s", s, s_bytes);
}

/* A per-tensor recipe's input codes into saved, and offered to the products sharing inp. */
static int save_tensor_input(mxi_linear_ctx *ctx, const mxi_linear_mx *mx, const mxi_saved_input *saved, const float *inp,
                             int64_t M, int64_t K) {
    float s;
    int rc = tensor_codes(saved->q, &s, inp, M * K, mx, mx->inputs, ROLE_INPUT);
    if (rc) return fail(ctx, rc);
    memcpy(saved->scales, &s, sizeof s);
    mxi_scaled_tensor t = {.q = saved->q, .rows = M, .cols = K, .elem = mx->inputs, .scale_inv = s};
    mxi_linear_keep_quantized(ctx, inp, tensor_kind(mx), -1, -1, &t);   // in no slot: nothing overwrites it
    if (mxi_quant_stats_on(ctx->qs)) {
        mxi_qs_operand op = {.q = saved->q, .rows = M, .cols = K, .elem = mx->inputs, .scaling = MXI_QS_TENSOR,
                             .scale = &t.scale_inv};
        mxi_quant_stats_save(ctx->qs, inp, &op);
    }
    trace_save(ctx, (int64_t[5]){M, K, MXI_TRACE_TENSOR, mx->inputs, 0}, inp, saved->q, &s, sizeof s);
    return MX_OK;
}

int mxi_linear_save_input(mxi_linear_ctx *ctx, const mxi_linear_mx *mx, const mxi_saved_input *saved, const float *inp,
                      int64_t M, int64_t K) {
    if (mx->scaling == MXI_SCALE_TENSOR) return save_tensor_input(ctx, mx, saved, inp, M, K);
    int rc = mx_quantize_f32(inp, M, K, MX_COLWISE, mx->inputs, mx->mode, saved->q, saved->scales);
    if (rc) return fail(ctx, rc);
    if (mxi_quant_stats_on(ctx->qs)) {
        mxi_qs_operand op = {.q = saved->q, .rows = M, .cols = K, .elem = mx->inputs, .scaling = MXI_QS_BLOCKS,
                             .axis = MX_COLWISE, .e8m0 = saved->scales};
        mxi_quant_stats_save(ctx->qs, inp, &op);
    }
    trace_save(ctx, (int64_t[5]){M, K, MX_COLWISE, mx->inputs, 0}, inp, saved->q, saved->scales,
               (size_t)mx_scale_count(M, K, MX_COLWISE));
    return MX_OK;
}

/* high_precision_gemms in backward: the listed products as an unconverted layer's (its
 * input then kept in fp32, mxi_linear_mx.high_precision), the others quantized; db goes with dw. */
static int split_backward(mxi_linear_ctx *ctx, const mxi_linear_mx *mx, mxi_linear_grads grads, const float *dout,
                          mxi_linear_input input, mxi_linear_params p, mxi_linear_shape shape) {
    bool hp_d = mx->high_precision & MX_GEMM_DGRAD, hp_w = mx->high_precision & MX_GEMM_WGRAD;
    mxi_linear_grads hp = {.dinp = hp_d ? grads.dinp : NULL, .dinp_write = grads.dinp_write,
                           .dw = hp_w ? grads.dw : NULL, .db = hp_w ? grads.db : NULL};
    mxi_linear_grads lp = {.dinp = hp_d ? NULL : grads.dinp, .dinp_write = grads.dinp_write,
                           .dw = hp_w ? NULL : grads.dw, .db = hp_w ? NULL : grads.db};
    mxi_linear_mx quantized = *mx;
    quantized.high_precision = 0;
    int rc = hp.dinp || hp.dw ? mxi_linear_backward(ctx, NULL, hp, dout, input, p, shape) : MX_OK;
    if (!rc && (lp.dinp || lp.dw)) rc = mxi_linear_backward(ctx, &quantized, lp, dout, input, p, shape);
    return rc;
}

int mxi_linear_backward(mxi_linear_ctx *ctx, const mxi_linear_mx *mx, mxi_linear_grads grads, const float *dout,
                        mxi_linear_input input, mxi_linear_params p, mxi_linear_shape shape) {
    // GEMM letters: dY (M, N), X (M, K), W (N, K)
    int64_t M = shape.rows, K = shape.in, N = shape.out;
    float *dinp = grads.dinp, *dw = grads.dw, *db = grads.db;
    const float *inp = input.inp, *w = p.w;
    const mxi_saved_input *saved = input.saved;
    if (M == 0) return MX_OK;
    if (mx && p.w16) return fail(ctx, MX_EINVAL);
    if (mx && mx->high_precision & (MX_GEMM_DGRAD | MX_GEMM_WGRAD))
        return split_backward(ctx, mx, grads, dout, input, p, shape);
    int rc;
    if (mx && mx->scaling == MXI_SCALE_ROWS) {
        rc = mxi_linear_rows_backward(ctx, mx, grads, dout, inp, &p, M, N, K);
    } else if (mx && mx->scaling == MXI_SCALE_BLOCKS128) {
        rc = mxi_linear_blocks_backward(ctx, mx, grads, dout, inp, &p, M, N, K);
    } else if (mx && mx->scaling == MXI_SCALE_TENSOR) {
        rc = tensor_backward(ctx, mx, grads, dout, input, p, M, N, K);
    } else if (mx) {
        // each plane quantized from fp32, none derived from another (SPEC §5)
        mxi_mx_plane a, bp, a_row = {0};
        if (dinp && !dw) {   // dX alone: dout's rowwise plane, in the slots dW's colwise one would take
            rc = quantize_plane(ctx, 0, &a_row, dout, M, N, MX_ROWWISE, mx->grads, mx->mode);
        } else if (dinp) {   // both planes of dout from one pass
            uint8_t *qc = mx_buffer(ctx, 0, M * N), *sc = mx_buffer(ctx, 1, mx_scale_count(M, N, MX_COLWISE)),
                    *qr = mx_buffer(ctx, 5, M * N), *sr = mx_buffer(ctx, 6, mx_scale_count(M, N, MX_ROWWISE));
            rc = !qc || !sc || !qr || !sr ? fail(ctx, MX_ENOMEM)
                                          : mx_check(ctx, mx_quantize_dual_f32(dout, M, N, mx->grads, mx->mode, qr, sr, qc, sc));
            a = (mxi_mx_plane){qc, sc, M, N, MX_COLWISE, mx->grads};
            a_row = (mxi_mx_plane){qr, sr, M, N, MX_ROWWISE, mx->grads};
        } else {
            rc = quantize_plane(ctx, 0, &a, dout, M, N, MX_COLWISE, mx->grads, mx->mode);
        }
        if (dw) {
            if (!rc && saved && saved->q) bp = (mxi_mx_plane){saved->q, saved->scales, M, K, MX_COLWISE, mx->inputs};
            else if (!rc) rc = quantize_plane(ctx, 1, &bp, inp, M, K, MX_COLWISE, mx->inputs, mx->mode);
            if (!rc) trace_gemm(ctx, 2, dout, &a, inp, &bp, false);
            if (!rc && mxi_quant_stats_on(ctx->qs)) {
                stats_plane(ctx, p.tensor, MXI_QS_WGRAD_DY, dout, &a);
                if (saved && saved->q) mxi_quant_stats_saved(ctx->qs, p.tensor, MXI_QS_WGRAD_X, bp.q);   // measured when saved
                else stats_plane(ctx, p.tensor, MXI_QS_WGRAD_X, inp, &bp);
            }
            if (!rc)   // dW += dY^T X
                rc = mx_gemm(ctx, token_dim(ctx, MXI_GEMM_RUNTIME_K), dw, &a, true, &bp, false, MXI_WRITE_ADD);
        }
        if (!rc && dinp) {
            rc = weight_plane(ctx, &bp, w, p.wq, N, K, MX_COLWISE, mx);
            if (!rc) trace_gemm(ctx, 1, dout, &a_row, w, &bp, mx->weight_tiles);
            if (!rc && mxi_quant_stats_on(ctx->qs))
                stats_plane(ctx, p.tensor, MXI_QS_DGRAD_DY, dout, &a_row), stats_plane(ctx, p.tensor, MXI_QS_DGRAD_W, w, &bp);
            if (!rc)   // dX (+)= dY W
                rc = mx_gemm(ctx, token_dim(ctx, MXI_GEMM_RUNTIME_M), dinp, &a_row, false, &bp, false, grads.dinp_write);
        }
    } else {
        // dY rounded once for both products (slot 0; the other operands take slot 1)
        const void *dy = dout;
        if (ctx->bf16 && dw && dinp) {
            dy = to_bf16(ctx, 0, dout, M * N, mxi_gemm_bf16_native(ctx->gemm));
            if (!dy) return fail(ctx, MX_ENOMEM);
        }
        bool ready = dy != dout;
        // the input: as given, or the bf16 rounding forward kept (mxi_linear_share_input_into)
        bool x16 = !inp && saved && saved->bf16 && ctx->bf16 && mxi_gemm_bf16_native(ctx->gemm);
        if (dw && !inp && !x16) return fail(ctx, MX_EINVAL);   // no input kept: an engine bug
        const void *x = x16 ? (const void *)saved->bf16 : inp;
        rc = !dw ? MX_OK
                 : matmul(ctx, token_dim(ctx, MXI_GEMM_RUNTIME_K), dw,
                          (operand){.x = dy, .elems = M * N, .trans = true, .ready = ready},
                          (operand){.x = x, .elems = M * K, .ready = x16}, N, K, M, MXI_WRITE_ADD);   // dw += dout^T inp
        if (!rc && dinp)
            rc = matmul(ctx, token_dim(ctx, MXI_GEMM_RUNTIME_M), dinp,
                        (operand){.x = dy, .elems = M * N, .ready = ready},
                        weight_operand(p, N * K, false), M, K, N, grads.dinp_write);
    }
    if (rc || !db || !dw) return rc;
    #pragma omp parallel for schedule(static)
    for (int64_t j = 0; j < N; j++) {
        float acc = 0.0f;
        for (int64_t r = 0; r < M; r++) acc += dout[r * N + j];
        db[j] += acc;
    }
    return MX_OK;
}
