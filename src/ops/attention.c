/* Causal attention on oneDNN batched matmuls (see ops/attention.h). Batch dims of every
 * product: (B, NKV, G) with G = NH / NKV heads per kv head, so k and v broadcast over G;
 * dK and dV sum over G, which a batch dim cannot do, so they run once per head of the group
 * with accumulation. */
#include "ops/attention.h"

#include <math.h>
#include <string.h>

#include "ops/nn_kernels.h"

int64_t mxi_attention_scratch(int B, int T, int NH) {
    int64_t bs = T < MXI_ATT_BLOCK ? T : MXI_ATT_BLOCK;
    return (int64_t)B * NH * bs * T;
}

/* Strides of the three batch dims, in floats: a token-major tensor of H heads (q: H = NH;
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

int mxi_attention_forward(mxi_gemm_ctx *g, float *out, float *att, const float *q, const float *k, const float *v,
                          int B, int T, int NH, int NKV, int HD, mx_diag *diag) {
    int G = NH / NKV;
    float scale = 1.0f / sqrtf((float)HD);
    const mxi_nn_kernels *kern = mxi_nn_kernels_active();
    int64_t batch[3] = {B, NKV, G}, qs[3], kvs[3], as[3];
    tok_strides(qs, T, NH, G, HD, true);
    tok_strides(kvs, T, NKV, G, HD, false);
    att_strides(as, NH, G, T, T);
    int64_t ldq = (int64_t)NH * HD, ldkv = (int64_t)NKV * HD;
    for (int64_t t0 = 0; t0 < T; t0 += MXI_ATT_BLOCK) {
        int64_t m = T - t0 < MXI_ATT_BLOCK ? T - t0 : MXI_ATT_BLOCK, n = t0 + m;   // rows, visible keys
        float *p = att + t0 * T;   // (B, NH, m, T) block rows of the probabilities
        int rc = mxi_matmul_batched(g, 3, batch, p, as, T, q + t0 * ldq, false, qs, ldq, k, true, kvs, ldkv,
                                    m, n, HD, false, diag);
        if (rc) return rc;
        #pragma omp parallel for schedule(static)
        for (int64_t bh = 0; bh < (int64_t)B * NH; bh++)
            kern->softmax_causal(p + bh * T * T, T, m, t0, T, scale);
        rc = mxi_matmul_batched(g, 3, batch, out + t0 * ldq, qs, ldq, p, false, as, T, v, false, kvs, ldkv,
                                m, HD, n, false, diag);
        if (rc) return rc;
    }
    return MX_OK;
}

int mxi_attention_backward(mxi_gemm_ctx *g, float *dq, float *dk, float *dv, float *scratch, const float *dout,
                           const float *att, const float *q, const float *k, const float *v, int B, int T, int NH,
                           int NKV, int HD, mx_diag *diag) {
    int G = NH / NKV;
    float scale = 1.0f / sqrtf((float)HD);
    const mxi_nn_kernels *kern = mxi_nn_kernels_active();
    int64_t bs = T < MXI_ATT_BLOCK ? T : MXI_ATT_BLOCK;
    int64_t batch[3] = {B, NKV, G}, qs[3], kvs[3], as[3], ds[3];
    tok_strides(qs, T, NH, G, HD, true);
    tok_strides(kvs, T, NKV, G, HD, false);
    att_strides(as, NH, G, T, T);
    att_strides(ds, NH, G, bs, T);   // scratch: (B, NH, bs, T), dS of one block
    int64_t ldq = (int64_t)NH * HD, ldkv = (int64_t)NKV * HD;
    // dK and dV: batch (B, NKV), one call per head of the group; rows of q and dS of head j
    int64_t batch2[2] = {B, NKV}, qs2[2] = {qs[0], qs[1]}, kvs2[2] = {kvs[0], HD}, as2[2] = {as[0], as[1]},
            ds2[2] = {ds[0], ds[1]};
    memset(dk, 0, (size_t)B * T * ldkv * sizeof(float));
    memset(dv, 0, (size_t)B * T * ldkv * sizeof(float));
    for (int64_t t0 = 0; t0 < T; t0 += MXI_ATT_BLOCK) {
        int64_t m = T - t0 < MXI_ATT_BLOCK ? T - t0 : MXI_ATT_BLOCK, n = t0 + m;
        const float *p = att + t0 * T;          // (B, NH, m, T) probabilities of the block
        const float *dob = dout + t0 * ldq;     // (B, m, NH, HD)
        // dP = dO V^T
        int rc = mxi_matmul_batched(g, 3, batch, scratch, ds, T, dob, false, qs, ldq, v, true, kvs, ldkv,
                                    m, n, HD, false, diag);
        if (rc) return rc;
        #pragma omp parallel for schedule(static)
        for (int64_t bh = 0; bh < (int64_t)B * NH; bh++)
            kern->softmax_causal_backward(scratch + bh * bs * T, T, p + bh * T * T, T, m, t0, n, scale);
        // dQ = dS K
        rc = mxi_matmul_batched(g, 3, batch, dq + t0 * ldq, qs, ldq, scratch, false, ds, T, k, false, kvs, ldkv,
                                m, HD, n, false, diag);
        if (rc) return rc;
        for (int j = 0; j < G; j++) {
            // dK[0..n) += dS^T Q, dV[0..n) += P^T dO, for head j of each group
            rc = mxi_matmul_batched(g, 2, batch2, dk, kvs2, ldkv, scratch + j * ds[2], true, ds2, T,
                                    q + t0 * ldq + j * HD, false, qs2, ldq, n, HD, m, true, diag);
            if (rc) return rc;
            rc = mxi_matmul_batched(g, 2, batch2, dv, kvs2, ldkv, p + j * as[2], true, as2, T,
                                    dob + j * HD, false, qs2, ldq, n, HD, m, true, diag);
            if (rc) return rc;
        }
    }
    return MX_OK;
}
