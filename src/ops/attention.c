/* Causal attention on oneDNN batched matmuls (see ops/attention.h). Batch dims of every
 * product: (B, NKV, G) with G = NH / NKV heads per kv head, so k and v broadcast over G;
 * dK and dV sum over G, which a batch dim cannot do, so they run once per head of the group
 * with accumulation. */
#include "ops/attention.h"

#include <math.h>
#include <string.h>

#include "ops/nn_kernels.h"

/* Floats of each scratch part: the scores, then probabilities, of one block and its dS
 * (fp32), then at bf16 the rounded operands: P and dS of one block, q, k, v and dO (as bf16
 * where the GEMM runs it natively, else as fp32 holding bf16 values; counted as floats
 * either way). */
typedef struct {
    int64_t block;      // (B, NH, bs, T)
    int64_t q, kv;      // (B, T, NH, HD), (B, T, NKV, HD)
} scratch_sizes;

static scratch_sizes sizes_of(int B, int T, int NH, int NKV, int HD) {
    int64_t bs = T < MXI_ATT_BLOCK ? T : MXI_ATT_BLOCK;
    return (scratch_sizes){(int64_t)B * NH * bs * T, (int64_t)B * T * NH * HD, (int64_t)B * T * NKV * HD};
}

int64_t mxi_attention_scratch(int B, int T, int NH, int NKV, int HD, bool bf16) {
    scratch_sizes z = sizes_of(B, T, NH, NKV, HD);
    return 2 * z.block + (bf16 ? 2 * z.block + 2 * z.q + 2 * z.kv : 0);
}

/* The operands of the products at bf16: where each rounded copy lives in the scratch. */
typedef struct {
    mxi_dtype t;          // MXI_BF16 where the GEMM runs bf16 natively, else MXI_F32 (bf16 values)
    size_t es;            // bytes per element
    char *p, *ds;         // (B, NH, bs, T) P and dS of one block
    char *q, *k, *v, *dout;
} bf16_operands;

static int storage_override = -1;   // mxi_attention_bf16_storage

void mxi_attention_bf16_storage(int as_bf16) { storage_override = as_bf16; }

/* Where the rounded operands go in the scratch, with q, k and v rounded there already. */
static bf16_operands bf16_layout(mxi_gemm_ctx *g, float *scratch, scratch_sizes z, const float *q, const float *k,
                                 const float *v) {
    bf16_operands o;
    bool native = storage_override >= 0 ? storage_override == 1 : mxi_gemm_bf16_batched_native(g);
    o.t = native ? MXI_BF16 : MXI_F32;
    o.es = native ? 2 : 4;
    o.p = (char *)(scratch + 2 * z.block);   // each part sized for floats, so any element type fits
    o.ds = o.p + z.block * 4;
    o.q = o.ds + z.block * 4;
    o.k = o.q + z.q * 4;
    o.v = o.k + z.kv * 4;
    o.dout = o.v + z.kv * 4;
    mxi_bf16_operand(o.q, q, z.q, native);
    mxi_bf16_operand(o.k, k, z.kv, native);
    mxi_bf16_operand(o.v, v, z.kv, native);
    return o;
}

/* Element e of an operand of element size es. */
static const void *elem(const void *base, size_t es, int64_t e) { return (const char *)base + (size_t)e * es; }

/* Rows 0 .. m of src (row stride T), columns 0 .. n, rounded to bf16 into dst (row stride T):
 * the part of a block of P or dS the products read. Single-threaded (called per head). */
static void round_rows(char *dst, const bf16_operands *o, const float *src, int64_t m, int64_t n, int64_t T,
                       const mxi_nn_kernels *kern) {
    for (int64_t r = 0; r < m; r++) {
        if (o->t == MXI_BF16) kern->bf16_round((uint16_t *)dst + r * T, src + r * T, n);
        else kern->bf16_round_f32((float *)dst + r * T, src + r * T, n);
    }
}

/* Strides of the three batch dims, in elements: a token-major tensor of H heads (q: H = NH;
 * k, v: H = NKV with the group dim broadcast) and the (B, NH, rows, T) probability layout. */
static void tok_strides(int64_t *st, int T, int H, int G, int HD, bool per_group_head) {
    st[0] = (int64_t)T * H * HD;
    st[1] = (int64_t)(per_group_head ? G : 1) * HD;
    st[2] = per_group_head ? HD : 0;
}

static void att_strides(int64_t *st, int NH, int G, int64_t rows, int64_t T) {
    st[0] = (int64_t)NH * rows * T;
    st[1] = (int64_t)G * rows * T;
    st[2] = rows * T;
}

/* Scores of the block of query rows [t0, t0 + m) against keys [0, n): p (B, NH, bs, T)
 * rows of the block, S = Q K^T (unscaled). The forward and the backward make them with the
 * same call, so the backward's scores are the forward's bit for bit. */
static int block_scores(mxi_gemm_ctx *g, float *p, const int64_t *batch, const int64_t *ps, int T, const bf16_operands *o,
                        const void *qo, const int64_t *qs, int64_t ldq, const void *ko, const int64_t *kvs, int64_t ldkv,
                        int64_t t0, int64_t m, int64_t n, int HD, mx_diag *diag) {
    return mxi_matmul_batched(g, &(mxi_matmul_batched_args){
        .nbatch = 3, .batch = batch, .C = p, .c_bs = ps, .ldc = T, .type = o->t,
        .a = {elem(qo, o->es, t0 * ldq), false, qs, ldq},
        .b = {ko, true, kvs, ldkv},
        .M = m, .N = n, .K = HD}, diag);
}

static int forward_docs(mxi_gemm_ctx *g, float *out, float *stats, float *scratch, const float *q, const float *k,
                        const float *v, const int32_t *doc, int B, int T, int NH, int NKV, int HD, bool bf16,
                        mx_diag *diag);
static int backward_docs(mxi_gemm_ctx *g, float *dq, float *dk, float *dv, float *scratch, const float *dout,
                         const float *stats, const float *q, const float *k, const float *v, const int32_t *doc, int B,
                         int T, int NH, int NKV, int HD, bool bf16, mx_diag *diag);

int mxi_attention_forward(mxi_gemm_ctx *g, float *out, float *stats, float *scratch, const float *q, const float *k,
                          const float *v, const int32_t *doc, int B, int T, int NH, int NKV, int HD, bool bf16,
                          mx_diag *diag) {
    if (doc) return forward_docs(g, out, stats, scratch, q, k, v, doc, B, T, NH, NKV, HD, bf16, diag);
    int G = NH / NKV;
    float scale = 1.0f / sqrtf((float)HD);
    const mxi_nn_kernels *kern = mxi_nn_kernels_active();
    scratch_sizes z = sizes_of(B, T, NH, NKV, HD);
    int64_t bs = T < MXI_ATT_BLOCK ? T : MXI_ATT_BLOCK;
    int64_t batch[3] = {B, NKV, G}, qs[3], kvs[3], ps[3];
    tok_strides(qs, T, NH, G, HD, true);
    tok_strides(kvs, T, NKV, G, HD, false);
    att_strides(ps, NH, G, bs, T);   // a block of scores or probabilities: (B, NH, bs, T)
    int64_t ldq = (int64_t)NH * HD, ldkv = (int64_t)NKV * HD;
    // the operands as the products read them: fp32 as given, or rounded to bf16
    bf16_operands o = {.t = MXI_F32, .es = 4};
    const void *qo = q, *ko = k, *vo = v;
    if (bf16) {
        o = bf16_layout(g, scratch, z, q, k, v);
        qo = o.q, ko = o.k, vo = o.v;
    }
    float *p = scratch;   // (B, NH, bs, T) the block's scores, then probabilities
    for (int64_t t0 = 0; t0 < T; t0 += MXI_ATT_BLOCK) {
        int64_t m = T - t0 < MXI_ATT_BLOCK ? T - t0 : MXI_ATT_BLOCK, n = t0 + m;   // rows, visible keys
        int rc = block_scores(g, p, batch, ps, T, &o, qo, qs, ldq, ko, kvs, ldkv, t0, m, n, HD, diag);
        if (rc) return rc;
        #pragma omp parallel for schedule(static)
        for (int64_t bh = 0; bh < (int64_t)B * NH; bh++) {
            kern->softmax_causal(p + bh * bs * T, T, m, t0, n, scale, stats + (bh * T + t0) * 2);
            if (bf16) round_rows(o.p + (size_t)(bh * bs * T) * o.es, &o, p + bh * bs * T, m, n, T, kern);
        }
        const void *pa = bf16 ? (const void *)o.p : p;   // P as the second product reads it
        rc = mxi_matmul_batched(g, &(mxi_matmul_batched_args){
            .nbatch = 3, .batch = batch, .C = out + t0 * ldq, .c_bs = qs, .ldc = ldq, .type = o.t,
            .a = {pa, false, ps, T},
            .b = {vo, false, kvs, ldkv},
            .M = m, .N = HD, .K = n}, diag);
        if (rc) return rc;
    }
    return MX_OK;
}

int mxi_attention_backward(mxi_gemm_ctx *g, float *dq, float *dk, float *dv, float *scratch, const float *dout,
                           const float *stats, const float *q, const float *k, const float *v, const int32_t *doc, int B,
                           int T, int NH, int NKV, int HD, bool bf16, mx_diag *diag) {
    if (doc) return backward_docs(g, dq, dk, dv, scratch, dout, stats, q, k, v, doc, B, T, NH, NKV, HD, bf16, diag);
    int G = NH / NKV;
    float scale = 1.0f / sqrtf((float)HD);
    const mxi_nn_kernels *kern = mxi_nn_kernels_active();
    scratch_sizes z = sizes_of(B, T, NH, NKV, HD);
    int64_t bs = T < MXI_ATT_BLOCK ? T : MXI_ATT_BLOCK;
    int64_t batch[3] = {B, NKV, G}, qs[3], kvs[3], ps[3];
    tok_strides(qs, T, NH, G, HD, true);
    tok_strides(kvs, T, NKV, G, HD, false);
    att_strides(ps, NH, G, bs, T);   // a block of P, or of dS: (B, NH, bs, T)
    int64_t ldq = (int64_t)NH * HD, ldkv = (int64_t)NKV * HD;
    // dK and dV: batch (B, NKV), one call per head of the group; rows of q and of P, dS of head j
    int64_t batch2[2] = {B, NKV}, qs2[2] = {qs[0], qs[1]}, kvs2[2] = {kvs[0], HD}, ps2[2] = {ps[0], ps[1]};
    float *p = scratch, *ds = scratch + z.block;   // (B, NH, bs, T) each
    bf16_operands o = {.t = MXI_F32, .es = 4};
    const void *qo = q, *ko = k, *vo = v, *doo = dout, *dso = ds, *pa = p;
    if (bf16) {
        o = bf16_layout(g, scratch, z, q, k, v);
        mxi_bf16_operand(o.dout, dout, z.q, o.t == MXI_BF16);
        qo = o.q, ko = o.k, vo = o.v, doo = o.dout, dso = o.ds, pa = o.p;
    }
    memset(dk, 0, (size_t)B * T * ldkv * sizeof(float));
    memset(dv, 0, (size_t)B * T * ldkv * sizeof(float));
    for (int64_t t0 = 0; t0 < T; t0 += MXI_ATT_BLOCK) {
        int64_t m = T - t0 < MXI_ATT_BLOCK ? T - t0 : MXI_ATT_BLOCK, n = t0 + m;
        const void *dob = elem(doo, o.es, t0 * ldq);   // (B, m, NH, HD)
        // P again: the forward's scores and its rows' (max, 1 / sum)
        int rc = block_scores(g, p, batch, ps, T, &o, qo, qs, ldq, ko, kvs, ldkv, t0, m, n, HD, diag);
        if (rc) return rc;
        // dP = dO V^T
        rc = mxi_matmul_batched(g, &(mxi_matmul_batched_args){
            .nbatch = 3, .batch = batch, .C = ds, .c_bs = ps, .ldc = T, .type = o.t,
            .a = {dob, false, qs, ldq},
            .b = {vo, true, kvs, ldkv},
            .M = m, .N = n, .K = HD}, diag);
        if (rc) return rc;
        #pragma omp parallel for schedule(static)
        for (int64_t bh = 0; bh < (int64_t)B * NH; bh++) {
            float *pb = p + bh * bs * T, *db = ds + bh * bs * T;
            kern->softmax_causal_replay(pb, T, m, t0, n, scale, stats + (bh * T + t0) * 2);
            kern->softmax_causal_backward(db, T, pb, T, m, t0, n, scale);
            if (bf16) {
                round_rows(o.ds + (size_t)(bh * bs * T) * o.es, &o, db, m, n, T, kern);
                round_rows(o.p + (size_t)(bh * bs * T) * o.es, &o, pb, m, n, T, kern);
            }
        }
        // dQ = dS K
        rc = mxi_matmul_batched(g, &(mxi_matmul_batched_args){
            .nbatch = 3, .batch = batch, .C = dq + t0 * ldq, .c_bs = qs, .ldc = ldq, .type = o.t,
            .a = {dso, false, ps, T},
            .b = {ko, false, kvs, ldkv},
            .M = m, .N = HD, .K = n}, diag);
        if (rc) return rc;
        for (int j = 0; j < G; j++) {
            // dK[0..n) += dS^T Q, dV[0..n) += P^T dO, for head j of each group
            rc = mxi_matmul_batched(g, &(mxi_matmul_batched_args){
                .nbatch = 2, .batch = batch2, .C = dk, .c_bs = kvs2, .ldc = ldkv, .type = o.t,
                .a = {elem(dso, o.es, j * ps[2]), true, ps2, T},
                .b = {elem(qo, o.es, t0 * ldq + j * HD), false, qs2, ldq},
                .M = n, .N = HD, .K = m, .accumulate = true}, diag);
            if (rc) return rc;
            rc = mxi_matmul_batched(g, &(mxi_matmul_batched_args){
                .nbatch = 2, .batch = batch2, .C = dv, .c_bs = kvs2, .ldc = ldkv, .type = o.t,
                .a = {elem(pa, o.es, j * ps[2]), true, ps2, T},
                .b = {elem(dob, o.es, j * HD), false, qs2, ldq},
                .M = n, .N = HD, .K = m, .accumulate = true}, diag);
            if (rc) return rc;
        }
    }
    return MX_OK;
}

/* ---- document masking ----
 * Row t of sequence b sees keys doc[b][t] .. t. Each sequence runs on its own (batch dims
 * (1, NKV, G)) so that a block of rows [t0, t0 + m) computes keys [doc[b][t0], t0 + m) only:
 * the key blocks before the block's first document are skipped. Column c of a block's
 * scores, probabilities and dS is key kmin + c; each row's softmax runs on its own document's
 * columns (the kernels' causal rows, one at a time), and the columns of other documents
 * become 0 so that the products over [kmin, n) read zeros there. */

/* Row r of one head's block (ld T): softmax over columns [s, c] with c the row's own key, 0
 * elsewhere in [0, nc); stats as the kernels keep them. */
static void doc_softmax_row(const mxi_nn_kernels *kern, float *row, int64_t s, int64_t c, int64_t nc, float scale,
                            float *stats) {
    kern->softmax_causal(row + s, 0, 1, c - s, c - s + 1, scale, stats);
    memset(row, 0, (size_t)s * sizeof(float));
    if (c + 1 < nc) memset(row + c + 1, 0, (size_t)(nc - c - 1) * sizeof(float));
}

static void doc_replay_row(const mxi_nn_kernels *kern, float *p, float *d, int64_t s, int64_t c, int64_t nc,
                           float scale, const float *stats) {
    kern->softmax_causal_replay(p + s, 0, 1, c - s, c - s + 1, scale, stats);
    kern->softmax_causal_backward(d + s, 0, p + s, 0, 1, c - s, c - s + 1, scale);
    memset(p, 0, (size_t)s * sizeof(float));
    memset(d, 0, (size_t)s * sizeof(float));
    if (c + 1 < nc) {
        memset(p + c + 1, 0, (size_t)(nc - c - 1) * sizeof(float));
        memset(d + c + 1, 0, (size_t)(nc - c - 1) * sizeof(float));
    }
}

static int forward_docs(mxi_gemm_ctx *g, float *out, float *stats, float *scratch, const float *q, const float *k,
                        const float *v, const int32_t *doc, int B, int T, int NH, int NKV, int HD, bool bf16,
                        mx_diag *diag) {
    int G = NH / NKV;
    float scale = 1.0f / sqrtf((float)HD);
    const mxi_nn_kernels *kern = mxi_nn_kernels_active();
    scratch_sizes z = sizes_of(B, T, NH, NKV, HD);
    int64_t bs = T < MXI_ATT_BLOCK ? T : MXI_ATT_BLOCK;
    int64_t batch[3] = {1, NKV, G}, qs[3], kvs[3], ps[3];
    tok_strides(qs, T, NH, G, HD, true);
    tok_strides(kvs, T, NKV, G, HD, false);
    att_strides(ps, NH, G, bs, T);
    int64_t ldq = (int64_t)NH * HD, ldkv = (int64_t)NKV * HD;
    bf16_operands o = {.t = MXI_F32, .es = 4};
    const void *qo = q, *ko = k, *vo = v;
    if (bf16) {
        o = bf16_layout(g, scratch, z, q, k, v);
        qo = o.q, ko = o.k, vo = o.v;
    }
    float *p = scratch;   // (1, NH, bs, T): one sequence's block
    for (int b = 0; b < B; b++) {
        const int32_t *d = doc + (int64_t)b * T;
        const void *qb = elem(qo, o.es, (int64_t)b * T * ldq), *kb = elem(ko, o.es, (int64_t)b * T * ldkv),
                   *vb = elem(vo, o.es, (int64_t)b * T * ldkv);
        for (int64_t t0 = 0; t0 < T; t0 += MXI_ATT_BLOCK) {
            int64_t m = T - t0 < MXI_ATT_BLOCK ? T - t0 : MXI_ATT_BLOCK, n = t0 + m, kmin = d[t0], nc = n - kmin;
            int rc = block_scores(g, p, batch, ps, T, &o, qb, qs, ldq, elem(kb, o.es, kmin * ldkv), kvs, ldkv, t0, m,
                                  nc, HD, diag);
            if (rc) return rc;
            #pragma omp parallel for schedule(static)
            for (int64_t h = 0; h < NH; h++) {
                for (int64_t r = 0; r < m; r++)
                    doc_softmax_row(kern, p + (h * bs + r) * T, d[t0 + r] - kmin, t0 + r - kmin, nc, scale,
                                    stats + (((int64_t)b * NH + h) * T + t0 + r) * 2);
                if (bf16) round_rows(o.p + (size_t)(h * bs * T) * o.es, &o, p + h * bs * T, m, nc, T, kern);
            }
            const void *pa = bf16 ? (const void *)o.p : p;
            rc = mxi_matmul_batched(g, &(mxi_matmul_batched_args){
                .nbatch = 3, .batch = batch, .C = out + ((int64_t)b * T + t0) * ldq, .c_bs = qs, .ldc = ldq,
                .type = o.t,
                .a = {pa, false, ps, T},
                .b = {elem(vb, o.es, kmin * ldkv), false, kvs, ldkv},
                .M = m, .N = HD, .K = nc}, diag);
            if (rc) return rc;
        }
    }
    return MX_OK;
}

static int backward_docs(mxi_gemm_ctx *g, float *dq, float *dk, float *dv, float *scratch, const float *dout,
                         const float *stats, const float *q, const float *k, const float *v, const int32_t *doc, int B,
                         int T, int NH, int NKV, int HD, bool bf16, mx_diag *diag) {
    int G = NH / NKV;
    float scale = 1.0f / sqrtf((float)HD);
    const mxi_nn_kernels *kern = mxi_nn_kernels_active();
    scratch_sizes z = sizes_of(B, T, NH, NKV, HD);
    int64_t bs = T < MXI_ATT_BLOCK ? T : MXI_ATT_BLOCK;
    int64_t batch[3] = {1, NKV, G}, qs[3], kvs[3], ps[3];
    tok_strides(qs, T, NH, G, HD, true);
    tok_strides(kvs, T, NKV, G, HD, false);
    att_strides(ps, NH, G, bs, T);
    int64_t ldq = (int64_t)NH * HD, ldkv = (int64_t)NKV * HD;
    int64_t batch2[2] = {1, NKV}, qs2[2] = {qs[0], qs[1]}, kvs2[2] = {kvs[0], HD}, ps2[2] = {ps[0], ps[1]};
    float *p = scratch, *ds = scratch + z.block;
    bf16_operands o = {.t = MXI_F32, .es = 4};
    const void *qo = q, *ko = k, *vo = v, *doo = dout, *dso = ds, *pa = p;
    if (bf16) {
        o = bf16_layout(g, scratch, z, q, k, v);
        mxi_bf16_operand(o.dout, dout, z.q, o.t == MXI_BF16);
        qo = o.q, ko = o.k, vo = o.v, doo = o.dout, dso = o.ds, pa = o.p;
    }
    memset(dk, 0, (size_t)B * T * ldkv * sizeof(float));
    memset(dv, 0, (size_t)B * T * ldkv * sizeof(float));
    for (int b = 0; b < B; b++) {
        const int32_t *d = doc + (int64_t)b * T;
        const void *qb = elem(qo, o.es, (int64_t)b * T * ldq), *kb = elem(ko, o.es, (int64_t)b * T * ldkv),
                   *vb = elem(vo, o.es, (int64_t)b * T * ldkv), *dobs = elem(doo, o.es, (int64_t)b * T * ldq);
        float *dkb = dk + (int64_t)b * T * ldkv, *dvb = dv + (int64_t)b * T * ldkv;
        for (int64_t t0 = 0; t0 < T; t0 += MXI_ATT_BLOCK) {
            int64_t m = T - t0 < MXI_ATT_BLOCK ? T - t0 : MXI_ATT_BLOCK, n = t0 + m, kmin = d[t0], nc = n - kmin;
            const void *dob = elem(dobs, o.es, t0 * ldq), *kk = elem(kb, o.es, kmin * ldkv),
                       *vk = elem(vb, o.es, kmin * ldkv);
            int rc = block_scores(g, p, batch, ps, T, &o, qb, qs, ldq, kk, kvs, ldkv, t0, m, nc, HD, diag);
            if (rc) return rc;
            rc = mxi_matmul_batched(g, &(mxi_matmul_batched_args){
                .nbatch = 3, .batch = batch, .C = ds, .c_bs = ps, .ldc = T, .type = o.t,
                .a = {dob, false, qs, ldq},
                .b = {vk, true, kvs, ldkv},
                .M = m, .N = nc, .K = HD}, diag);
            if (rc) return rc;
            #pragma omp parallel for schedule(static)
            for (int64_t h = 0; h < NH; h++) {
                float *pb = p + h * bs * T, *db = ds + h * bs * T;
                for (int64_t r = 0; r < m; r++)
                    doc_replay_row(kern, pb + r * T, db + r * T, d[t0 + r] - kmin, t0 + r - kmin, nc, scale,
                                   stats + (((int64_t)b * NH + h) * T + t0 + r) * 2);
                if (bf16) {
                    round_rows(o.ds + (size_t)(h * bs * T) * o.es, &o, db, m, nc, T, kern);
                    round_rows(o.p + (size_t)(h * bs * T) * o.es, &o, pb, m, nc, T, kern);
                }
            }
            rc = mxi_matmul_batched(g, &(mxi_matmul_batched_args){
                .nbatch = 3, .batch = batch, .C = dq + ((int64_t)b * T + t0) * ldq, .c_bs = qs, .ldc = ldq,
                .type = o.t,
                .a = {dso, false, ps, T},
                .b = {kk, false, kvs, ldkv},
                .M = m, .N = HD, .K = nc}, diag);
            if (rc) return rc;
            for (int j = 0; j < G; j++) {
                rc = mxi_matmul_batched(g, &(mxi_matmul_batched_args){
                    .nbatch = 2, .batch = batch2, .C = dkb + kmin * ldkv, .c_bs = kvs2, .ldc = ldkv, .type = o.t,
                    .a = {elem(dso, o.es, j * ps[2]), true, ps2, T},
                    .b = {elem(qb, o.es, t0 * ldq + j * HD), false, qs2, ldq},
                    .M = nc, .N = HD, .K = m, .accumulate = true}, diag);
                if (rc) return rc;
                rc = mxi_matmul_batched(g, &(mxi_matmul_batched_args){
                    .nbatch = 2, .batch = batch2, .C = dvb + kmin * ldkv, .c_bs = kvs2, .ldc = ldkv, .type = o.t,
                    .a = {elem(pa, o.es, j * ps[2]), true, ps2, T},
                    .b = {elem(dob, o.es, j * HD), false, qs2, ldq},
                    .M = nc, .N = HD, .K = m, .accumulate = true}, diag);
                if (rc) return rc;
            }
        }
    }
    return MX_OK;
}
