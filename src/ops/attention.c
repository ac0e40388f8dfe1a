/* Causal grouped-query attention, flash-attention-2 style (see ops/attention.h): forward
 * per query block of BS rows and head a loop over key tiles of BS keys, backward per key
 * tile a loop over the query blocks that see it; scores, probabilities and dS live in a
 * thread's tiles only. The products are the nn kernels' att_gemm (fp32) or att_gemm_bf16
 * (bf16 pairs), the softmax pieces their att_online_softmax, att_probs and
 * att_dscores_bf16. Plain causal attention is one document per sequence starting at 0. */
#include "ops/attention.h"

#include <math.h>
#include <omp.h>
#include <string.h>

#include "core/bits.h"
#include "ops/nn_kernels.h"

enum { BS = MXI_ATT_BLOCK, BP = MXI_ATT_BLOCK / 2 };

/* Rows and keys of a sub-tile: a tile that not every row sees whole (the diagonal one, one
 * holding a document start) runs its products per sub-tile over the span its rows see, so
 * that what lies above the diagonal or before a document is skipped. The skipped terms are
 * products with P or dS 0: fp32 sums without them are the same (a zero's sign aside). */
enum { SUB = 16, NSUB = BS / SUB };

/* A thread's tiles: scores / probabilities and dP / dS; per row the visible columns,
 * running max, sum and correction; at bf16 three tiles of pairs. */
enum { TILE_FLOATS = 2 * BS * BS + 5 * BS + 3 * BS * BP };

/* Then the sums of the products into the model's row-major tensors, kept contiguous: the
 * forward's output rows of a block (BS, HD), backward's dQ of one head and dK and dV of one
 * kv head (T, HD) each. Rows of the model's tensors lie heads x HD floats apart, a power of
 * two in most models: a tile's rows there would share a few L1 sets and evict each other
 * every product. */
static int64_t tile_floats(int T, int HD) { return TILE_FLOATS + 3 * ((int64_t)(T + BS - 1) / BS * BS) * HD; }

/* Where each part of the scratch starts, in floats (a bf16 pair counts as one).
 * fp32: q and dO (B, NH, T, HD) and k and v (B, NKV, T, HD) head-major, so that a tile's
 * rows are contiguous; k and v transposed per key tile (B, NKV, T / BS, HD, BS), the B
 * operand of S = Q K^T and dP = dO V^T.
 * bf16, as pairs along the products' sums: q and dO (B, NH, T, HP) and k and v (B, NKV, T,
 * HP) rounded head-major, HP = (HD + 1) / 2 pairs of each row; k and v per key tile (B,
 * NKV, T / BS, HP, BS), pairs along HD; k and v as pairs of rows (B, NKV, T / 2, HD), the
 * B operand of O += P V and dQ += dS K, and q and dO so (B, NH, T / 2, HD), of dK += dS^T Q
 * and dV += P^T dO. T / 2 and T / BS round up to whole key tiles. Then D of every row and
 * head (B, NH, T), and the threads' tiles. */
typedef struct {
    int64_t q, k, v, dout, kt, vt, kr, vr, qr, dor, dsum, tiles, total;
} scratch_layout;

static scratch_layout layout_of(int B, int T, int NH, int NKV, int HD, bool bf16, int threads) {
    int64_t nt = (T + BS - 1) / BS, hd = bf16 ? (HD + 1) / 2 : HD, at = 0;
    int64_t nq = (int64_t)B * T * NH * hd, nkv = (int64_t)B * T * NKV * hd, ntile = (int64_t)B * NKV * nt * BS * hd;
    int64_t rkv = bf16 ? (int64_t)B * NKV * nt * BP * HD : 0, rq = bf16 ? (int64_t)B * NH * nt * BP * HD : 0;
    scratch_layout z;
    z.q = at, at += nq;
    z.k = at, at += nkv;
    z.v = at, at += nkv;
    z.dout = at, at += nq;
    z.kt = at, at += ntile;
    z.vt = at, at += ntile;
    z.kr = at, at += rkv;
    z.vr = at, at += rkv;
    z.qr = at, at += rq;
    z.dor = at, at += rq;
    z.dsum = at, at += (int64_t)B * NH * T;
    z.tiles = at, at += (int64_t)threads * tile_floats(T, HD);
    z.total = at;
    return z;
}

int64_t mxi_attention_scratch(int B, int T, int NH, int NKV, int HD, bool bf16) {
    return layout_of(B, T, NH, NKV, HD, bf16, omp_get_max_threads()).total;
}

/* What every block of one call reads. The operands are float (fp32) or uint32 pairs (bf16). */
typedef struct {
    const mxi_nn_kernels *kern;
    const void *q, *k, *v, *dout;   // head-major rows: (B, NH, T, hd), (B, NKV, T, hd)
    const void *kt, *vt;            // per key tile: (B, NKV, T / BS, hd, BS)
    const uint32_t *kr, *vr, *qr, *dor;   // bf16: pairs of rows (B, H, T / 2, HD)
    const int32_t *doc;             // (B, T) or NULL
    float *tiles;                   // threads' tiles, tile_floats(T, HD) each
    int B, T, NH, NKV, HD, G;
    int64_t hd;                     // elements of a head-major row: HD, or HP pairs
    int64_t ntiles;                 // key tiles of a sequence
    float scale;
    bool bf16;
} att_ctx;

/* x (B, T, H, HD) -> xh (B, H, T, HD) as floats, or (B, H, T, HP) as pairs of bf16 (a
 * last odd element paired with 0). */
static void head_major(const mxi_nn_kernels *kern, float *xh, const float *x, int B, int T, int H, int HD, bool bf16) {
    int64_t hd = bf16 ? (HD + 1) / 2 : HD;
    #pragma omp parallel for schedule(static)
    for (int64_t bt = 0; bt < (int64_t)B * T; bt++) {
        int64_t b = bt / T, t = bt % T;
        for (int64_t h = 0; h < H; h++) {
            float *dst = xh + ((b * H + h) * T + t) * hd;
            const float *src = x + (bt * H + h) * HD;
            if (!bf16) {
                memcpy(dst, src, (size_t)HD * sizeof(float));
                continue;
            }
            uint16_t *d16 = (uint16_t *)dst;
            kern->bf16_round(d16, src, HD);
            if (HD & 1) d16[HD] = 0;
        }
    }
}

/* xh (B, H, T, hd) -> xt (B, H, T / BS, hd, BS): each key tile's rows as columns (32-bit
 * elements: floats or pairs); columns past T are 0. */
static void tile_transpose(uint32_t *xt, const uint32_t *xh, int B, int T, int H, int64_t hd) {
    int64_t nt = (T + BS - 1) / BS;
    #pragma omp parallel for schedule(static)
    for (int64_t u = 0; u < (int64_t)B * H * nt; u++) {
        int64_t bh = u / nt, k0 = u % nt * BS, n = T - k0 < BS ? T - k0 : BS;
        uint32_t *dst = xt + u * hd * BS;
        const uint32_t *src = xh + (bh * T + k0) * hd;
        for (int64_t j = 0; j < BS; j++)
            for (int64_t d = 0; d < hd; d++) dst[d * BS + j] = j < n ? src[j * hd + d] : 0;
    }
}

/* xh (B, H, T, HP) bf16 pairs -> xr (B, H, T / 2, HD): rows 2i and 2i + 1 paired per
 * element; rows past T are 0 (T padded to whole tiles). */
static void row_pairs(uint32_t *xr, const uint32_t *xh, int B, int T, int H, int HD) {
    int64_t hp = (HD + 1) / 2, np = (T + BS - 1) / BS * BP;
    #pragma omp parallel for schedule(static)
    for (int64_t u = 0; u < (int64_t)B * H * np; u++) {
        int64_t bh = u / np, t = u % np * 2;
        const uint16_t *r0 = (const uint16_t *)(xh + (bh * T + t) * hp), *r1 = (const uint16_t *)(r0 + 2 * hp);
        uint32_t *dst = xr + u * HD;
        for (int d = 0; d < HD; d++)
            dst[d] = (t < T ? r0[d] : 0u) | (uint32_t)(t + 1 < T ? r1[d] : 0u) << 16;
    }
}

static att_ctx ctx_of(float *scratch, scratch_layout z, const float *q, const float *k, const float *v,
                      const int32_t *doc, int B, int T, int NH, int NKV, int HD, bool bf16) {
    int64_t hd = bf16 ? (HD + 1) / 2 : HD;
    att_ctx c = {.kern = mxi_nn_kernels_active(), .q = scratch + z.q, .k = scratch + z.k, .v = scratch + z.v,
                 .dout = scratch + z.dout, .kt = scratch + z.kt, .vt = scratch + z.vt,
                 .kr = (uint32_t *)(scratch + z.kr), .vr = (uint32_t *)(scratch + z.vr),
                 .qr = (uint32_t *)(scratch + z.qr), .dor = (uint32_t *)(scratch + z.dor), .doc = doc,
                 .tiles = scratch + z.tiles, .B = B, .T = T, .NH = NH, .NKV = NKV, .HD = HD, .G = NH / NKV, .hd = hd,
                 .ntiles = (T + BS - 1) / BS, .scale = 1.0f / sqrtf((float)HD), .bf16 = bf16};
    head_major(c.kern, scratch + z.q, q, B, T, NH, HD, bf16);
    head_major(c.kern, scratch + z.k, k, B, T, NKV, HD, bf16);
    head_major(c.kern, scratch + z.v, v, B, T, NKV, HD, bf16);
    tile_transpose((uint32_t *)(scratch + z.kt), (const uint32_t *)(scratch + z.k), B, T, NKV, hd);
    if (bf16) row_pairs((uint32_t *)(scratch + z.vr), (const uint32_t *)(scratch + z.v), B, T, NKV, HD);
    return c;
}

/* The first key row t of sequence b sees. */
static int64_t first_key(const att_ctx *c, int64_t b, int64_t t) { return c->doc ? c->doc[b * c->T + t] : 0; }

/* The first key tile of the rows from t0: the one holding their first row's first key. */
static int64_t first_tile(const att_ctx *c, int64_t b, int64_t t0) { return first_key(c, b, t0) / BS * BS; }

/* The visible columns of the m rows from t0 in the key tile [k0, k0 + n); whether every
 * row sees all n. */
static bool visible(const att_ctx *c, int32_t *c0, int32_t *c1, int64_t b, int64_t t0, int64_t m, int64_t k0,
                    int64_t n) {
    if (!c->doc && k0 + n <= t0 + 1) {   // a tile wholly below the diagonal
        for (int64_t r = 0; r < m; r++) c0[r] = 0, c1[r] = (int32_t)n;
        return true;
    }
    bool whole = true;
    for (int64_t r = 0; r < m; r++) {
        int64_t lo = first_key(c, b, t0 + r) - k0, hi = t0 + r + 1 - k0;
        lo = lo < 0 ? 0 : lo > n ? n : lo;
        hi = hi < lo ? lo : hi > n ? n : hi;
        c0[r] = (int32_t)lo, c1[r] = (int32_t)hi;
        whole = whole && lo == 0 && hi == n;
    }
    return whole;
}

/* A tile's sub-tiles (one when every row sees the whole tile): rows [r0, r1) and the keys
 * [k0, k1) they see, k0 even (bf16 pairs); keys [j0, j1) and the rows [q0, q1) that see
 * them, q0 even. An empty span has k1 <= k0 or q1 <= q0. */
typedef struct {
    int n;
    int64_t r0[NSUB], r1[NSUB], k0[NSUB], k1[NSUB], j0[NSUB], j1[NSUB], q0[NSUB], q1[NSUB];
} spans;

static spans spans_of(const int32_t *c0, const int32_t *c1, int64_t m, int64_t n, bool whole) {
    if (whole)
        return (spans){.n = 1, .r0 = {0}, .r1 = {m}, .k0 = {0}, .k1 = {n}, .j0 = {0}, .j1 = {n}, .q0 = {0}, .q1 = {m}};
    spans z = {.n = (int)((m > n ? m : n) + SUB - 1) / SUB};
    for (int i = 0; i < z.n; i++) {
        int64_t a = i * SUB, e = a + SUB < m ? a + SUB : m;
        int64_t lo = n, hi = 0;
        for (int64_t r = a; r < e; r++)
            if (c0[r] < c1[r]) lo = c0[r] < lo ? c0[r] : lo, hi = c1[r] > hi ? c1[r] : hi;
        z.r0[i] = a, z.r1[i] = e, z.k0[i] = lo & ~(int64_t)1, z.k1[i] = hi;
        int64_t j1 = a + SUB < n ? a + SUB : n, q0 = -1, q1 = 0;
        for (int64_t r = 0; r < m; r++)
            if (c0[r] < c1[r] && c0[r] < j1 && c1[r] > a) q0 = q0 < 0 ? r : q0, q1 = r + 1;
        z.j0[i] = a, z.j1[i] = j1, z.q0[i] = q0 < 0 ? 0 : q0 & ~(int64_t)1, z.q1[i] = q1;
    }
    return z;
}

/* A thread's tiles. */
typedef struct {
    float *s, *d;        // (BS, BS) each
    int32_t *c0, *c1;    // (BS)
    float *rmax, *rsum, *corr;
    uint32_t *p2, *ds2;  // (BS, BP) pairs each: P or dS paired along columns, or along rows
    uint32_t *dsr;       // (BP, BS) backward: dS paired along rows
    float *rows;         // forward: a block's output, (BS, HD)
    float *dq, *dk, *dv; // backward: one head's dQ, one kv head's dK and dV, (T, HD) each
} tiles;

static tiles tiles_of(const att_ctx *c) {
    float *t = c->tiles + (int64_t)omp_get_thread_num() * tile_floats(c->T, c->HD), *rows = t + 2 * BS * BS;
    float *sums = t + TILE_FLOATS;
    int64_t tpad = c->ntiles * BS * c->HD;
    uint32_t *pairs = (uint32_t *)(rows + 5 * BS);
    return (tiles){.s = t, .d = t + BS * BS, .c0 = (int32_t *)rows, .c1 = (int32_t *)(rows + BS),
                   .rmax = rows + 2 * BS, .rsum = rows + 3 * BS, .corr = rows + 4 * BS, .p2 = pairs,
                   .ds2 = pairs + BS * BP, .dsr = pairs + 2 * BS * BP, .rows = sums, .dq = sums, .dk = sums + tpad,
                   .dv = sums + 2 * tpad};
}

/* Element e of a head-major operand of H heads: rows [t0, ...) of head h of sequence b. */
static const void *rows_of(const att_ctx *c, const void *x, int H, int64_t b, int64_t h, int64_t t0) {
    return (const uint32_t *)x + ((b * H + h) * c->T + t0) * c->hd;
}

/* The transposed key tile from k0 (a multiple of BS) of kv head kvh. */
static const void *tile_of(const att_ctx *c, const void *xt, int64_t b, int64_t kvh, int64_t k0) {
    return (const uint32_t *)xt + ((b * c->NKV + kvh) * c->ntiles + k0 / BS) * c->hd * BS;
}

/* Rows from t (even) of head h of a row-paired operand (bf16). */
static const uint32_t *pairs_of(const att_ctx *c, const uint32_t *xr, int H, int64_t b, int64_t h, int64_t t) {
    return xr + ((b * H + h) * c->ntiles * BP + t / 2) * c->HD;
}

/* The b operand of a product summing over positions from t (even): rows of xh (fp32), or
 * pairs of rows of xr (bf16). */
static const void *over_rows(const att_ctx *c, const uint32_t *xr, const void *xh, int H, int64_t b, int64_t h,
                             int64_t t) {
    return c->bf16 ? (const void *)pairs_of(c, xr, H, b, h, t) : rows_of(c, xh, H, b, h, t);
}

/* c (m, n) = or += a b over K (as write says): fp32 operands (a of lda floats, b of ldb),
 * or at bf16 pairs. */
static void product(const att_ctx *c, float *out, int64_t ldc, const void *a, int64_t lda, int64_t acs, const void *b,
                    int64_t ldb, int64_t m, int64_t n, int64_t K, mxi_att_write write) {
    if (c->bf16) c->kern->att_gemm_bf16(out, ldc, a, lda, acs, b, ldb, m, n, (K + 1) / 2, write);
    else c->kern->att_gemm(out, ldc, a, lda, acs, b, ldb, m, n, K, write);
}

/* Scores of rows [t0, t0 + m) of head h against keys [k0 + j, k0 + j + n) of the key tile
 * from k0: s = Q K^T (unscaled), from column j of s. */
static void scores(const att_ctx *c, float *s, int64_t b, int64_t h, int64_t t0, int64_t m, int64_t k0, int64_t j,
                   int64_t n) {
    product(c, s + j, BS, rows_of(c, c->q, c->NH, b, h, t0), c->hd, 1,
            (const uint32_t *)tile_of(c, c->kt, b, h / c->G, k0) + j, BS, m, n, c->HD, MXI_ATT_SET);
}

/* dP of the same: d = dO V^T. */
static void dprobs(const att_ctx *c, float *d, int64_t b, int64_t h, int64_t t0, int64_t m, int64_t k0, int64_t j,
                   int64_t n) {
    product(c, d + j, BS, rows_of(c, c->dout, c->NH, b, h, t0), c->hd, 1,
            (const uint32_t *)tile_of(c, c->vt, b, h / c->G, k0) + j, BS, m, n, c->HD, MXI_ATT_SET);
}

/* Element (r, j) of a tile operand: at bf16 of pairs along its columns (P forward, dS for dQ;
 * j even) or along its rows (P and dS for dV and dK; r even); fp32: the tile itself. */
static const uint32_t *at_col(const att_ctx *c, const void *x, int64_t r, int64_t j) {
    return (const uint32_t *)x + (c->bf16 ? r * BP + j / 2 : r * BS + j);
}
static const uint32_t *at_row(const att_ctx *c, const void *x, int64_t r, int64_t j) {
    return (const uint32_t *)x + (c->bf16 ? r / 2 * BS + j : r * BS + j);
}

/* Forward of rows [t0, t0 + m) of head h of sequence b: out and stats. */
static void forward_block(const att_ctx *c, float *out, float *stats, int64_t b, int64_t h, int64_t t0, int64_t m) {
    tiles w = tiles_of(c);
    int64_t ldq = (int64_t)c->NH * c->HD, kvh = h / c->G, lda = c->bf16 ? BP : BS, ldo = c->HD;
    float *o = w.rows;   // (m, HD), out's rows at the end
    memset(o, 0, (size_t)(m * c->HD) * sizeof(float));
    for (int64_t r = 0; r < m; r++) w.rmax[r] = -INFINITY, w.rsum[r] = 0.0f;
    for (int64_t k0 = first_tile(c, b, t0), end = t0 + m; k0 < end; k0 += BS) {
        int64_t n = end - k0 < BS ? end - k0 : BS;
        spans z = spans_of(w.c0, w.c1, m, n, visible(c, w.c0, w.c1, b, t0, m, k0, n));
        for (int i = 0; i < z.n; i++)
            if (z.k1[i] > z.k0[i])
                scores(c, w.s + z.r0[i] * BS, b, h, t0 + z.r0[i], z.r1[i] - z.r0[i], k0, z.k0[i], z.k1[i] - z.k0[i]);
        // at bf16 the exps come rounded into the pairs of the product's a operand
        uint16_t *p16 = c->bf16 ? (uint16_t *)w.p2 : NULL;
        c->kern->att_online_softmax(w.s, BS, m, n, w.c0, w.c1, c->scale, w.rmax, w.rsum, w.corr, p16);
        for (int64_t r = 0; r < m; r++)
            if (w.corr[r] != 1.0f) c->kern->scale(o + r * ldo, c->HD, w.corr[r]);
        const void *p = c->bf16 ? (const void *)w.p2 : w.s;
        for (int i = 0; i < z.n; i++)
            if (z.k1[i] > z.k0[i])
                product(c, o + z.r0[i] * ldo, ldo, at_col(c, p, z.r0[i], z.k0[i]), lda, 1,
                        over_rows(c, c->vr, c->v, c->NKV, b, kvh, k0 + z.k0[i]), c->HD, z.r1[i] - z.r0[i], c->HD,
                        z.k1[i] - z.k0[i], MXI_ATT_ADD);
    }
    float *st = stats + ((b * c->NH + h) * c->T + t0) * 2;
    float *dst = out + (b * c->T + t0) * ldq + h * c->HD;
    for (int64_t r = 0; r < m; r++) {
        float inv = 1.0f / w.rsum[r];
        c->kern->scale(o + r * ldo, c->HD, inv);
        memcpy(dst + r * ldq, o + r * ldo, (size_t)c->HD * sizeof(float));
        st[2 * r] = w.rmax[r], st[2 * r + 1] = inv;
    }
}

int mxi_attention_forward(mxi_gemm_ctx *g, float *out, float *stats, float *scratch, const float *q, const float *k,
                          const float *v, const int32_t *doc, int B, int T, int NH, int NKV, int HD, bool bf16,
                          mx_diag *diag) {
    (void)g, (void)diag;
    scratch_layout z = layout_of(B, T, NH, NKV, HD, bf16, omp_get_max_threads());
    att_ctx c = ctx_of(scratch, z, q, k, v, doc, B, T, NH, NKV, HD, bf16);
    int64_t nb = (T + BS - 1) / BS, units = (int64_t)B * NH * nb;
    // the last blocks see the most keys: they go first, so that the threads finish together
    #pragma omp parallel for schedule(dynamic, 1)
    for (int64_t u = 0; u < units; u++) {
        int64_t i = nb - 1 - u / ((int64_t)B * NH), bh = u % ((int64_t)B * NH), t0 = i * BS;
        forward_block(&c, out, stats, bh / NH, bh % NH, t0, T - t0 < BS ? T - t0 : BS);
    }
    return MX_OK;
}

/* Backward of head h of sequence b, flash attention 2's order: per key tile the query
 * blocks that see it, dS = P (dP - D) scale from the tile's scores and dP made again, then
 * dV += P^T dO and dK += dS^T Q into the thread's w->dk, w->dv (T, HD), whose tile stays in
 * cache over the blocks, and dQ += dS K into w->dq (T, HD). A block's dQ sums its key tiles
 * in order, a tile's dK and dV its blocks in order, as one query block at a time would. */
static void backward_head(const att_ctx *c, const tiles *w, const float *stats, const float *dsum, int64_t b,
                          int64_t h) {
    int64_t ld = c->HD, kvh = h / c->G, T = c->T, bh = b * c->NH + h, lda = c->bf16 ? BP : BS;
    for (int64_t k0 = 0; k0 < T; k0 += BS) {
        int64_t n = T - k0 < BS ? T - k0 : BS, kat = k0 * ld;
        float *dk = w->dk + kat, *dv = w->dv + kat;
        // the blocks from the tile's own on while their first row's document starts in it or before
        for (int64_t t0 = k0; t0 < T && first_key(c, b, t0) < k0 + n; t0 += BS) {
            int64_t m = T - t0 < BS ? T - t0 : BS;
            const float *st = stats + (bh * T + t0) * 2;
            float *s = w->s, *d = w->d, *dqb = w->dq + t0 * ld;
            spans z = spans_of(w->c0, w->c1, m, n, visible(c, w->c0, w->c1, b, t0, m, k0, n));
            for (int i = 0; i < z.n; i++) {
                int64_t r0 = z.r0[i], j = z.k0[i], nj = z.k1[i] - j;
                if (nj <= 0) continue;
                scores(c, s + r0 * BS, b, h, t0 + r0, z.r1[i] - r0, k0, j, nj);
                dprobs(c, d + r0 * BS, b, h, t0 + r0, z.r1[i] - r0, k0, j, nj);
            }
            // P again from the stats, dS = P (dP - D) scale (0 where P is); at bf16 rounded
            // into the products' pairs: P and dS along rows, dS along columns
            const float *dr = dsum + bh * T + t0;
            if (c->bf16)
                c->kern->att_dscores_bf16(w->p2, w->dsr, (uint16_t *)w->ds2, s, d, BS, m, n, w->c0, w->c1, c->scale, st,
                                          dr);
            else
                c->kern->att_probs(s, d, BS, m, n, w->c0, w->c1, c->scale, st, dr, MXI_ATT_DSCORES);
            // dV += P^T dO, dK += dS^T Q (the tiles read transposed; B over the rows that see
            // the keys: dO, Q), dQ += dS K
            const void *pt = c->bf16 ? (const void *)w->p2 : s, *dst = c->bf16 ? (const void *)w->dsr : d;
            const void *ds = c->bf16 ? (const void *)w->ds2 : d;
            for (int i = 0; i < z.n; i++)
                if (z.q1[i] > z.q0[i])
                    product(c, dv + z.j0[i] * ld, ld, at_row(c, pt, z.q0[i], z.j0[i]), 1, BS,
                            over_rows(c, c->dor, c->dout, c->NH, b, h, t0 + z.q0[i]), c->HD, z.j1[i] - z.j0[i], c->HD,
                            z.q1[i] - z.q0[i], MXI_ATT_ADD);
            for (int i = 0; i < z.n; i++)
                if (z.q1[i] > z.q0[i])
                    product(c, dk + z.j0[i] * ld, ld, at_row(c, dst, z.q0[i], z.j0[i]), 1, BS,
                            over_rows(c, c->qr, c->q, c->NH, b, h, t0 + z.q0[i]), c->HD, z.j1[i] - z.j0[i], c->HD,
                            z.q1[i] - z.q0[i], MXI_ATT_ADD);
            for (int i = 0; i < z.n; i++)
                if (z.k1[i] > z.k0[i])
                    product(c, dqb + z.r0[i] * ld, ld, at_col(c, ds, z.r0[i], z.k0[i]), lda, 1,
                            over_rows(c, c->kr, c->k, c->NKV, b, kvh, k0 + z.k0[i]), c->HD, z.r1[i] - z.r0[i], c->HD,
                            z.k1[i] - z.k0[i], MXI_ATT_ADD);
        }
    }
}

/* Backward of kv head kvh of sequence b: its group's heads in order, each head's dQ copied
 * out after it, their dK and dV summed in the thread's rows and copied out at the end. */
static void backward_kv(const att_ctx *c, float *dq, float *dk, float *dv, const float *stats, const float *dsum,
                        int64_t b, int64_t kvh) {
    tiles w = tiles_of(c);
    int64_t ldkv = (int64_t)c->NKV * c->HD, ldq = (int64_t)c->NH * c->HD, hd = c->HD, T = c->T;
    memset(w.dk, 0, (size_t)(T * hd) * sizeof(float));
    memset(w.dv, 0, (size_t)(T * hd) * sizeof(float));
    for (int g = 0; g < c->G; g++) {
        int64_t h = kvh * c->G + g;
        memset(w.dq, 0, (size_t)(T * hd) * sizeof(float));
        backward_head(c, &w, stats, dsum, b, h);
        for (int64_t t = 0; t < T; t++)
            memcpy(dq + (b * T + t) * ldq + h * hd, w.dq + t * hd, (size_t)hd * sizeof(float));
    }
    for (int64_t t = 0; t < T; t++) {
        memcpy(dk + (b * T + t) * ldkv + kvh * hd, w.dk + t * hd, (size_t)hd * sizeof(float));
        memcpy(dv + (b * T + t) * ldkv + kvh * hd, w.dv + t * hd, (size_t)hd * sizeof(float));
    }
}

/* D = rowsum(dO * O) of every query row and head, (B, NH, T): the softmax backward's dot
 * product sum_j P dP, taken as flash attention takes it, from the forward's output. dO as
 * it enters the products (the head-major copy, at bf16 rounded), O as the model keeps it,
 * at bf16 rounded too. Summed in double in element order and rounded once, the same on
 * every CPU: in a row whose softmax is nearly one-hot, dS of the dominant key is dP - D of
 * two nearly equal numbers, and an fp32 sum here doubled the gradients' error there. */
static void row_dots(float *dsum, const att_ctx *c, mxi_att_output o) {
    int64_t T = c->T, NH = c->NH, HD = c->HD;
    #pragma omp parallel for schedule(static)
    for (int64_t u = 0; u < c->B * NH * T; u++) {   // (b, h, t) head-major, as dsum
        int64_t b = u / (NH * T), h = u / T % NH, t = u % T, at = ((b * T + t) * NH + h) * HD;
        const void *x = rows_of(c, c->dout, c->NH, b, h, t);
        double sum = 0.0;
        for (int64_t e = 0; e < HD; e++) {
            float xe = c->bf16 ? mxi_bf16_to_f32(((const uint16_t *)x)[e]) : ((const float *)x)[e];
            float ye = o.bf16    ? mxi_bf16_to_f32(o.bf16[at + e])
                       : c->bf16 ? mxi_bits_f32(mxi_bf16_bits(o.f32[at + e]))
                                 : o.f32[at + e];
            sum += (double)xe * ye;
        }
        dsum[u] = (float)sum;
    }
}

int mxi_attention_backward(mxi_gemm_ctx *g, float *dq, float *dk, float *dv, float *scratch, const float *dout,
                           mxi_att_output out, const float *stats, const float *q, const float *k, const float *v,
                           const int32_t *doc, int B, int T, int NH, int NKV, int HD, bool bf16, mx_diag *diag) {
    (void)g, (void)diag;
    scratch_layout z = layout_of(B, T, NH, NKV, HD, bf16, omp_get_max_threads());
    att_ctx c = ctx_of(scratch, z, q, k, v, doc, B, T, NH, NKV, HD, bf16);
    head_major(c.kern, scratch + z.dout, dout, B, T, NH, HD, bf16);
    tile_transpose((uint32_t *)(scratch + z.vt), (const uint32_t *)(scratch + z.v), B, T, NKV, c.hd);
    if (bf16) row_pairs((uint32_t *)(scratch + z.kr), (const uint32_t *)(scratch + z.k), B, T, NKV, HD);
    if (bf16) {
        row_pairs((uint32_t *)(scratch + z.qr), (const uint32_t *)(scratch + z.q), B, T, NH, HD);
        row_pairs((uint32_t *)(scratch + z.dor), (const uint32_t *)(scratch + z.dout), B, T, NH, HD);
    }
    row_dots(scratch + z.dsum, &c, out);
    // one task per kv head: its group's dQ rows and its dK, dV are its own, so the sums keep
    // their order whatever the number of threads
    #pragma omp parallel for schedule(dynamic, 1)
    for (int64_t u = 0; u < (int64_t)B * NKV; u++)
        backward_kv(&c, dq, dk, dv, stats, scratch + z.dsum, u / NKV, u % NKV);
    return MX_OK;
}
