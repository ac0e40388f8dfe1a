/* Weight gradients handed to the engine's add_grad hook as they are made instead of kept in
 * a unit's gradient buffer (mxi_model_sinks_grad): with bf16 gradient shards on one rank the
 * engine adds each piece into the shard. A dense block's product weights go whole, through
 * one buffer; the vocabulary tables by slices of rows, so that no V x C fp32 gradient exists. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_internal.h"
#include "ops/nn_kernels.h"

/* Hand rows [row0, row0 + rows) of tensor i's gradient to the engine. */
static void sink(mx_model *m, int i, int64_t row0, int64_t rows, float *src) {
    if (m->hook_error) return;
    int rc = m->hooks.add_grad(m->hooks.ctx, i, row0, rows, src, &m->hook_diag);
    if (rc) m->hook_error = rc;
}

/* Logits z (N, vs) of vocabulary rows [v0, v0 + vs) become their loss gradient from the rows'
 * log-sum-exps: dscale (softmax - onehot), softmax = exp(z - lse), for the weight gradient's
 * slices (d_ln takes the unsunk backward's own gradient, whose bits its callers compare; the
 * two differ by rounding only). */
static void ce_slice(float *z, const float *lse, const float *dscale, const int32_t *targets, int N, int64_t v0,
                     int64_t vs) {
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *r = z + (int64_t)n * vs;
        for (int64_t j = 0; j < vs; j++) r[j] = dscale[n] * expf(r[j] - lse[n]);
        int64_t t = targets[n] - v0;
        if (t >= 0 && t < vs) r[t] -= dscale[n];
    }
}

float *mxi_grad_target(mx_model *m, int i) {
    if (i < 0 || !mxi_model_sunk(m, i)) return G(i);
    memset(m->sink_dw, 0, (size_t)m->params[i].numel * sizeof(float));
    return m->sink_dw;
}

void mxi_grad_done(mx_model *m, int i) {
    if (i >= 0 && mxi_model_sunk(m, i)) sink(m, i, 0, m->params[i].shape[0], m->sink_dw);
}

void mxi_lm_head_backward_sunk(mx_model *m, float scale) {
    int N = m->N, C = m->cfg.hidden_size, V = m->cfg.vocab_size;
    // d_ln a chunk of rows at a time, as lm_head's backward does, keeping each row's log-sum-exp
    for (int r0 = 0; r0 < N; r0 += m->ce_rows) {
        int rows = N - r0 < m->ce_rows ? N - r0 : m->ce_rows;
        const float *ln = m->ln_f + (int64_t)r0 * C;
        if (m->ce_rows < N)   // one chunk: the forward's logits are still here
            TIMED(MXI_OP_LINEAR, mxi_linear_forward(m->lin, NULL, m->logits, ln, PARAMS(m->lm_head, -1), SHAPE(rows, C, V)));
        const mxi_nn_kernels *k = mxi_nn_kernels_active();
        #pragma omp parallel for schedule(static)
        for (int n = 0; n < rows; n++) {   // the kernel's loss is log-sum-exp less the target's logit
            const float *z = m->logits + (int64_t)n * V;
            int t = m->targets[r0 + n];
            m->ce_lse[r0 + n] = (float)(k->cross_entropy(NULL, z, V, t, 0.0f) + z[t]);
            m->ce_dscale[r0 + n] = !m->loss_keep ? scale / N   // eod_mask_loss: the mean over the kept rows
                                   : m->loss_keep[r0 + n] ? scale / (float)m->loss_count : 0.0f;
        }
        // d_ln from the gradient the unsunk backward makes (the same bits); the slices below
        // make lm_head's from the log-sum-exps
        if (m->loss_keep)
            mxi_cross_entropy_kept(m->logits, m->logits, m->targets + r0, m->loss_keep + r0, rows, V,
                                   m->loss_count ? scale / (float)m->loss_count : 0.0f);
        else
            mxi_cross_entropy_forward_backward(m->logits, m->logits, m->targets + r0, rows, V, scale / N);
        TIMED(MXI_OP_LINEAR, mxi_linear_backward(m->lin, NULL, (mxi_linear_grads){.dinp = m->d_ln + (int64_t)r0 * C},
                                                 m->logits, (mxi_linear_input){.inp = ln}, PARAMS(m->lm_head, -1),
                                                 SHAPE(rows, C, V)));
    }
    // the weight gradient a slice of the vocabulary at a time, over every row: the slice's
    // logits once more, their gradient, and its product handed to the engine
    int64_t vs_max = mxi_model_lm_slice_rows(m);
    const float *w = W(m->lm_head);
    const uint16_t *w16 = W16(m->lm_head);
    for (int64_t v0 = 0; v0 < V && !m->hook_error; v0 += vs_max) {
        int64_t vs = V - v0 < vs_max ? V - v0 : vs_max;
        mxi_linear_params p = {.w = w ? w + v0 * C : NULL, .w16 = w16 ? w16 + v0 * C : NULL};
        TIMED(MXI_OP_LINEAR, mxi_linear_forward(m->lin, NULL, m->logits, m->ln_f, p, SHAPE(N, C, vs)));
        ce_slice(m->logits, m->ce_lse, m->ce_dscale, m->targets, N, v0, vs);
        memset(m->sink_dw, 0, (size_t)(vs * C) * sizeof(float));
        TIMED(MXI_OP_LINEAR, mxi_linear_backward(m->lin, NULL, (mxi_linear_grads){.dw = m->sink_dw}, m->logits,
                                                 (mxi_linear_input){.inp = m->ln_f}, p, SHAPE(N, C, vs)));
        sink(m, m->lm_head, v0, vs, m->sink_dw);
    }
}

static int by_key(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

void mxi_embedding_backward_sunk(mx_model *m) {
    int N = m->N, C = m->cfg.hidden_size;
    // rows by token, each token's in row order: its gradient the sum of its rows in that order
    // (the order the scatter-add would add them in), handed over once
    for (int n = 0; n < N; n++) m->emb_order[n] = (int64_t)m->inputs[n] << 32 | n;
    qsort(m->emb_order, (size_t)N, sizeof *m->emb_order, by_key);
    const mxi_nn_kernels *k = mxi_nn_kernels_active();
    if (m->hooks.collective) {   // by slices of the vocabulary, the same on every rank
        for (int64_t v0 = 0, i = 0, V = m->cfg.vocab_size; v0 < V && !m->hook_error; v0 += m->sink_rows) {
            int64_t vs = V - v0 < m->sink_rows ? V - v0 : m->sink_rows;
            memset(m->sink_dw, 0, (size_t)(vs * C) * sizeof(float));
            for (; i < N && m->emb_order[i] >> 32 < v0 + vs; i++)
                k->add(m->sink_dw + ((m->emb_order[i] >> 32) - v0) * C, m->d_res + (m->emb_order[i] & 0xffffffff) * C, C);
            sink(m, m->embed, v0, vs, m->sink_dw);
        }
        return;
    }
    for (int i = 0; i < N && !m->hook_error;) {
        int64_t token = m->emb_order[i] >> 32;
        memcpy(m->sink_row, m->d_res + (m->emb_order[i] & 0xffffffff) * C, (size_t)C * sizeof(float));
        for (i++; i < N && m->emb_order[i] >> 32 == token; i++)
            k->add(m->sink_row, m->d_res + (m->emb_order[i] & 0xffffffff) * C, C);
        sink(m, m->embed, token, 1, m->sink_row);
    }
}
