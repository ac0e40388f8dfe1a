/* Causal grouped-query attention, flash-attention-2 style (see ops/attention.h): per query
 * block of MXI_ATT_BLOCK rows and head, a loop over key tiles of MXI_ATT_BLOCK keys whose
 * scores, probabilities and dS live in a thread's tiles (L1 / L2) only. The products are
 * the nn kernels' att_gemm, the softmax pieces their att_online_softmax and att_probs.
 * Plain causal attention is one document per sequence starting at 0. */
#include "ops/attention.h"

#include <math.h>
#include <omp.h>
#include <string.h>

#include "ops/nn_kernels.h"

enum { BS = MXI_ATT_BLOCK };

/* A thread's tiles: scores / probabilities, dP / dS, a transposed tile, then per row the
 * visible columns, running max, sum, correction and D (floats, the int32 ones too). */
enum { TILE_FLOATS = 3 * BS * BS + 6 * BS };

/* Where each part of the scratch starts, in floats: q, k, v and dO head-major, (B, NH, T,
 * HD) and (B, NKV, T, HD), rounded at bf16, so that a tile's rows are contiguous; k and v
 * transposed per key tile, (B, NKV, T / BS, HD, BS), the B operand of S = Q K^T and dP = dO
 * V^T; dK and dV per query head (B, T, NH, HD), summed over the group afterwards, only with
 * G > 1; the threads' tiles. */
typedef struct {
    int64_t q, k, v, dout, kt, vt, dkp, dvp, tiles, total;
} scratch_layout;

static scratch_layout layout_of(int B, int T, int NH, int NKV, int HD, int threads) {
    int64_t nq = (int64_t)B * T * NH * HD, nkv = (int64_t)B * T * NKV * HD, at = 0;
    int64_t ntile = (int64_t)B * NKV * ((T + BS - 1) / BS) * BS * HD;
    scratch_layout z;
    z.q = at, at += nq;
    z.k = at, at += nkv;
    z.v = at, at += nkv;
    z.dout = at, at += nq;
    z.kt = at, at += ntile;
    z.vt = at, at += ntile;
    z.dkp = at, at += NH > NKV ? nq : 0;
    z.dvp = at, at += NH > NKV ? nq : 0;
    z.tiles = at, at += (int64_t)threads * TILE_FLOATS;
    z.total = at;
    return z;
}

int64_t mxi_attention_scratch(int B, int T, int NH, int NKV, int HD, bool bf16) {
    (void)bf16;
    return layout_of(B, T, NH, NKV, HD, omp_get_max_threads()).total;
}

/* What every block of one call reads. */
typedef struct {
    const mxi_nn_kernels *kern;
    const float *q, *k, *v, *dout;   // head-major, as the products read them: (B, NH, T, HD), (B, NKV, T, HD)
    const float *kt, *vt;            // (B, NKV, T / BS, HD, BS)
    const int32_t *doc;              // (B, T) or NULL
    float *tiles;
    int B, T, NH, NKV, HD, G;
    int64_t ntiles;                  // key tiles of a sequence
    float scale;
    bool bf16;
} att_ctx;

/* x (B, T, H, HD) -> xh (B, H, T, HD), rounded to bf16 (as fp32 values) when bf16. */
static void head_major(const mxi_nn_kernels *kern, float *xh, const float *x, int B, int T, int H, int HD, bool bf16) {
    #pragma omp parallel for schedule(static)
    for (int64_t bt = 0; bt < (int64_t)B * T; bt++) {
        int64_t b = bt / T, t = bt % T;
        for (int64_t h = 0; h < H; h++) {
            float *dst = xh + ((b * H + h) * T + t) * HD;
            const float *src = x + (bt * H + h) * HD;
            if (bf16) kern->bf16_round_f32(dst, src, HD);
            else memcpy(dst, src, (size_t)HD * sizeof(float));
        }
    }
}

/* xh (B, H, T, HD) -> xt (B, H, T / BS, HD, BS): each key tile's HD x BS block. */
static void tile_transpose(float *xt, const float *xh, int B, int T, int H, int HD) {
    int64_t nt = (T + BS - 1) / BS;
    #pragma omp parallel for schedule(static)
    for (int64_t u = 0; u < (int64_t)B * H * nt; u++) {
        int64_t bh = u / nt, k0 = u % nt * BS, n = T - k0 < BS ? T - k0 : BS;
        float *dst = xt + u * HD * BS;
        const float *src = xh + (bh * T + k0) * HD;
        for (int64_t j = 0; j < n; j++)
            for (int d = 0; d < HD; d++) dst[d * BS + j] = src[j * HD + d];
    }
}

static att_ctx ctx_of(float *scratch, scratch_layout z, const float *q, const float *k, const float *v,
                      const int32_t *doc, int B, int T, int NH, int NKV, int HD, bool bf16) {
    att_ctx c = {.kern = mxi_nn_kernels_active(), .q = scratch + z.q, .k = scratch + z.k, .v = scratch + z.v,
                 .dout = scratch + z.dout, .kt = scratch + z.kt, .vt = scratch + z.vt, .doc = doc,
                 .tiles = scratch + z.tiles, .B = B, .T = T, .NH = NH, .NKV = NKV, .HD = HD, .G = NH / NKV,
                 .ntiles = (T + BS - 1) / BS, .scale = 1.0f / sqrtf((float)HD), .bf16 = bf16};
    head_major(c.kern, scratch + z.q, q, B, T, NH, HD, bf16);
    head_major(c.kern, scratch + z.k, k, B, T, NKV, HD, bf16);
    head_major(c.kern, scratch + z.v, v, B, T, NKV, HD, bf16);
    tile_transpose(scratch + z.kt, c.k, B, T, NKV, HD);
    return c;
}

/* The first key row t of sequence b sees. */
static int64_t first_key(const att_ctx *c, int64_t b, int64_t t) { return c->doc ? c->doc[b * c->T + t] : 0; }

/* The visible columns of the m rows from t0 in the key tile [k0, k0 + n). */
static void visible(const att_ctx *c, int32_t *c0, int32_t *c1, int64_t b, int64_t t0, int64_t m, int64_t k0, int64_t n) {
    for (int64_t r = 0; r < m; r++) {
        int64_t lo = first_key(c, b, t0 + r) - k0, hi = t0 + r + 1 - k0;
        lo = lo < 0 ? 0 : lo > n ? n : lo;
        hi = hi < lo ? lo : hi > n ? n : hi;
        c0[r] = (int32_t)lo, c1[r] = (int32_t)hi;
    }
}

/* A thread's tiles. */
typedef struct {
    float *s, *d, *tr;   // (BS, BS) each
    int32_t *c0, *c1;    // (BS)
    float *rmax, *rsum, *corr, *dsum;
} tiles;

static tiles tiles_of(const att_ctx *c) {
    float *t = c->tiles + (int64_t)omp_get_thread_num() * TILE_FLOATS, *rows = t + 3 * BS * BS;
    return (tiles){.s = t, .d = t + BS * BS, .tr = t + 2 * BS * BS, .c0 = (int32_t *)rows,
                   .c1 = (int32_t *)(rows + BS), .rmax = rows + 2 * BS, .rsum = rows + 3 * BS,
                   .corr = rows + 4 * BS, .dsum = rows + 5 * BS};
}

/* Rows [t0, t0 + m) of head h of sequence b in a head-major tensor of H heads. */
static const float *rows_of(const att_ctx *c, const float *x, int H, int64_t b, int64_t h, int64_t t0) {
    return x + ((b * H + h) * c->T + t0) * c->HD;
}

/* The transposed key tile from k0 (a multiple of BS) of kv head kvh. */
static const float *tile_of(const att_ctx *c, const float *xt, int64_t b, int64_t kvh, int64_t k0) {
    return xt + ((b * c->NKV + kvh) * c->ntiles + k0 / BS) * c->HD * BS;
}

/* Scores of rows [t0, t0 + m) of head h against keys [k0, k0 + n): s = Q K^T (unscaled). */
static void scores(const att_ctx *c, float *s, int64_t b, int64_t h, int64_t t0, int64_t m, int64_t k0, int64_t n) {
    for (int64_t r = 0; r < m; r++) memset(s + r * BS, 0, (size_t)n * sizeof(float));
    c->kern->att_gemm(s, BS, rows_of(c, c->q, c->NH, b, h, t0), c->HD, tile_of(c, c->kt, b, h / c->G, k0), BS, m, n,
                      c->HD);
}

/* The first key tile of the rows from t0: the one holding their first row's first key. */
static int64_t first_tile(const att_ctx *c, int64_t b, int64_t t0) { return first_key(c, b, t0) / BS * BS; }

static void round_tile(const att_ctx *c, float *s, int64_t m, int64_t n) {
    for (int64_t r = 0; r < m; r++) c->kern->bf16_round_f32(s + r * BS, s + r * BS, n);
}

/* dst (n, m) = src (m, n), both of leading dim BS. */
static void transpose_tile(float *dst, const float *src, int64_t m, int64_t n) {
    for (int64_t j = 0; j < n; j++)
        for (int64_t r = 0; r < m; r++) dst[j * BS + r] = src[r * BS + j];
}

/* Forward of rows [t0, t0 + m) of head h of sequence b: out and stats. */
static void forward_block(const att_ctx *c, float *out, float *stats, int64_t b, int64_t h, int64_t t0, int64_t m) {
    tiles w = tiles_of(c);
    int64_t ldq = (int64_t)c->NH * c->HD, kvh = h / c->G;
    float *o = out + (b * c->T + t0) * ldq + h * c->HD;
    for (int64_t r = 0; r < m; r++) {
        memset(o + r * ldq, 0, (size_t)c->HD * sizeof(float));
        w.rmax[r] = -INFINITY, w.rsum[r] = 0.0f;
    }
    for (int64_t k0 = first_tile(c, b, t0), end = t0 + m; k0 < end; k0 += BS) {
        int64_t n = end - k0 < BS ? end - k0 : BS;
        scores(c, w.s, b, h, t0, m, k0, n);
        visible(c, w.c0, w.c1, b, t0, m, k0, n);
        c->kern->att_online_softmax(w.s, BS, m, n, w.c0, w.c1, c->scale, w.rmax, w.rsum, w.corr);
        if (c->bf16) round_tile(c, w.s, m, n);
        for (int64_t r = 0; r < m; r++)
            if (w.corr[r] != 1.0f) c->kern->scale(o + r * ldq, c->HD, w.corr[r]);
        c->kern->att_gemm(o, ldq, w.s, BS, rows_of(c, c->v, c->NKV, b, kvh, k0), c->HD, m, c->HD, n);
    }
    float *st = stats + ((b * c->NH + h) * c->T + t0) * 2;
    for (int64_t r = 0; r < m; r++) {
        float inv = 1.0f / w.rsum[r];
        c->kern->scale(o + r * ldq, c->HD, inv);
        st[2 * r] = w.rmax[r], st[2 * r + 1] = inv;
    }
}

int mxi_attention_forward(mxi_gemm_ctx *g, float *out, float *stats, float *scratch, const float *q, const float *k,
                          const float *v, const int32_t *doc, int B, int T, int NH, int NKV, int HD, bool bf16,
                          mx_diag *diag) {
    (void)g, (void)diag;
    scratch_layout z = layout_of(B, T, NH, NKV, HD, omp_get_max_threads());
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

/* D of rows [t0, t0 + m) of head h: sum over the row's keys of P * dP (the softmax
 * backward's dot product, as the reference takes it), into w->dsum. */
static void block_dsum(const att_ctx *c, const tiles *w, const float *stats, int64_t b, int64_t h, int64_t t0, int64_t m) {
    int64_t kvh = h / c->G;
    const float *dob = rows_of(c, c->dout, c->NH, b, h, t0);
    for (int64_t r = 0; r < m; r++) w->dsum[r] = 0.0f;
    for (int64_t k0 = first_tile(c, b, t0), end = t0 + m; k0 < end; k0 += BS) {
        int64_t n = end - k0 < BS ? end - k0 : BS;
        scores(c, w->s, b, h, t0, m, k0, n);
        visible(c, w->c0, w->c1, b, t0, m, k0, n);
        c->kern->att_probs(w->s, BS, m, n, w->c0, w->c1, c->scale, stats);
        for (int64_t r = 0; r < m; r++) memset(w->d + r * BS, 0, (size_t)n * sizeof(float));
        c->kern->att_gemm(w->d, BS, dob, c->HD, tile_of(c, c->vt, b, kvh, k0), BS, m, n, c->HD);
        for (int64_t r = 0; r < m; r++) {
            float sum = 0.0f;
            for (int64_t j = w->c0[r]; j < w->c1[r]; j++) sum += w->s[r * BS + j] * w->d[r * BS + j];
            w->dsum[r] += sum;
        }
    }
}

/* Backward of head h of sequence b, its query blocks in order: dQ of its rows, and its
 * share of dK and dV into dkp, dvp (B, T, NH, HD) (dk, dv themselves when G = 1). */
static void backward_head(const att_ctx *c, float *dq, float *dkp, float *dvp, const float *stats, int64_t b, int64_t h) {
    tiles w = tiles_of(c);
    int64_t ldq = (int64_t)c->NH * c->HD, kvh = h / c->G, T = c->T;
    for (int64_t t = 0; t < T; t++) {
        int64_t at = (b * T + t) * ldq + h * c->HD;
        memset(dq + at, 0, (size_t)c->HD * sizeof(float));
        memset(dkp + at, 0, (size_t)c->HD * sizeof(float));
        memset(dvp + at, 0, (size_t)c->HD * sizeof(float));
    }
    for (int64_t t0 = 0; t0 < T; t0 += BS) {
        int64_t m = T - t0 < BS ? T - t0 : BS, end = t0 + m;
        const float *st = stats + ((b * c->NH + h) * T + t0) * 2;
        const float *qb = rows_of(c, c->q, c->NH, b, h, t0), *dob = rows_of(c, c->dout, c->NH, b, h, t0);
        float *dqb = dq + (b * T + t0) * ldq + h * c->HD;
        block_dsum(c, &w, st, b, h, t0, m);
        for (int64_t k0 = first_tile(c, b, t0); k0 < end; k0 += BS) {
            int64_t n = end - k0 < BS ? end - k0 : BS, kat = (b * T + k0) * ldq + h * c->HD;
            scores(c, w.s, b, h, t0, m, k0, n);
            visible(c, w.c0, w.c1, b, t0, m, k0, n);
            c->kern->att_probs(w.s, BS, m, n, w.c0, w.c1, c->scale, st);
            // dP = dO V^T, then dS = P (dP - D) scale (0 where P is)
            for (int64_t r = 0; r < m; r++) memset(w.d + r * BS, 0, (size_t)n * sizeof(float));
            c->kern->att_gemm(w.d, BS, dob, c->HD, tile_of(c, c->vt, b, kvh, k0), BS, m, n, c->HD);
            for (int64_t r = 0; r < m; r++) {
                float *ps = w.s + r * BS, *ds = w.d + r * BS, dsum = w.dsum[r];
                for (int64_t j = 0; j < n; j++) ds[j] = ps[j] * (ds[j] - dsum) * c->scale;
            }
            if (c->bf16) round_tile(c, w.s, m, n), round_tile(c, w.d, m, n);
            // dV += P^T dO, dK += dS^T Q, dQ += dS K
            transpose_tile(w.tr, w.s, m, n);
            c->kern->att_gemm(dvp + kat, ldq, w.tr, BS, dob, c->HD, n, c->HD, m);
            transpose_tile(w.tr, w.d, m, n);
            c->kern->att_gemm(dkp + kat, ldq, w.tr, BS, qb, c->HD, n, c->HD, m);
            c->kern->att_gemm(dqb, ldq, w.d, BS, rows_of(c, c->k, c->NKV, b, kvh, k0), c->HD, m, c->HD, n);
        }
    }
}

int mxi_attention_backward(mxi_gemm_ctx *g, float *dq, float *dk, float *dv, float *scratch, const float *dout,
                           const float *stats, const float *q, const float *k, const float *v, const int32_t *doc, int B,
                           int T, int NH, int NKV, int HD, bool bf16, mx_diag *diag) {
    (void)g, (void)diag;
    scratch_layout z = layout_of(B, T, NH, NKV, HD, omp_get_max_threads());
    att_ctx c = ctx_of(scratch, z, q, k, v, doc, B, T, NH, NKV, HD, bf16);
    head_major(c.kern, scratch + z.dout, dout, B, T, NH, HD, bf16);
    tile_transpose(scratch + z.vt, c.v, B, T, NKV, HD);
    int G = NH / NKV;
    float *dkp = G > 1 ? scratch + z.dkp : dk, *dvp = G > 1 ? scratch + z.dvp : dv;
    // one task per head: its dQ rows and its dK, dV shares are its own, so the sums keep
    // their order whatever the number of threads
    #pragma omp parallel for schedule(dynamic, 1)
    for (int64_t bh = 0; bh < (int64_t)B * NH; bh++) backward_head(&c, dq, dkp, dvp, stats, bh / NH, bh % NH);
    if (G > 1) {   // dK, dV: the group's heads summed in order
        #pragma omp parallel for schedule(static)
        for (int64_t row = 0; row < (int64_t)B * T * NKV; row++) {
            const float *pk = dkp + row * G * HD, *pv = dvp + row * G * HD;
            float *ok = dk + row * HD, *ov = dv + row * HD;
            for (int d = 0; d < HD; d++) {
                float sk = pk[d], sv = pv[d];
                for (int j = 1; j < G; j++) sk += pk[j * HD + d], sv += pv[j * HD + d];
                ok[d] = sk, ov[d] = sv;
            }
        }
    }
    return MX_OK;
}
