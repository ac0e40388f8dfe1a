/* The model run for generation over a KV cache (see infer.h): embedding, each block
 * (attention over the cache, then its dense MLP or MoE block), final norm and lm_head on
 * the rows whose next token is wanted. The layers are the training forward's kernels and
 * linear layers (model/layers.h, model/linear.h), attention the decoding kernel
 * (ops/decode_attention.h). Shape letters: see infer.h. */
#include "model/infer.h"

#include <stdlib.h>
#include <string.h>

#include "model/model_internal.h"
#include "ops/decode_attention.h"
#include "ops/nn_kernels.h"

struct mxi_infer {
    mx_model *m;
    int S, TC, R;
    float *mem;           // every buffer below, one allocation
    size_t bytes;
    float *kc, *vc;       // (L, S, TC, KVD)
    float *cos_t, *sin_t; // (TC, HD/2)
    float *x;             // (R, C) residual stream
    float *ln;            // (R, C) normed input of a sub-block
    float *q, *k, *v;     // (R, QD), (R, KVD), (R, KVD) as attention reads them
    float *q_raw, *k_raw; // (R, QD), (R, KVD) before the per-head norms (qwen3)
    float *rstd;          // (R * NH)
    float *a;             // (R, QD) attention output
    float *y;             // (R, C) a sub-block's output, added to x
    float *gate, *up, *h; // (R, F) dense MLP
    float *att;           // (mxi_decode_attention_scratch)
    float *x_out, *ln_out;// (S, C) the rows whose logits are wanted
    float *logits;        // (S, V)
    // MoE, sized for the largest MoE layer (RK = R * K routed rows)
    float *probs;         // (R, E)
    float *route_w;       // (R, K)
    float *xe, *gu, *he, *ye;  // (RK, C), (RK, 2FE), (RK, FE), (RK, C)
    int32_t *idx;         // (R, K)
    int32_t *perm;        // (RK) token row of each routed row, grouped by expert
    int32_t *pos_of;      // (RK) routed row of (token, slot)
    int32_t *off;         // (E + 1) first routed row of each expert
    int32_t *next;        // (E)
};

mx_model *mxi_infer_model(mxi_infer *inf) { return inf->m; }
void mxi_infer_limits(const mxi_infer *inf, int *batch, int *max_seq, int *max_rows) {
    *batch = inf->S, *max_seq = inf->TC, *max_rows = inf->R;
}

size_t mxi_infer_bytes(const mxi_infer *inf) { return inf->bytes; }

void mxi_infer_free(mxi_infer *inf) {
    if (!inf) return;
    mx_model_free(inf->m);
    free(inf->mem);
    free(inf);
}

/* Carve the buffers out of one allocation (or, with base NULL, count its floats). */
static size_t carve(mxi_infer *inf, float *base) {
    const mx_model_config *c = &inf->m->cfg;
    int64_t S = inf->S, TC = inf->TC, R = inf->R, L = c->num_hidden_layers, C = c->hidden_size, V = c->vocab_size;
    int64_t QD = inf->m->QD, KVD = inf->m->KVD, NH = c->num_attention_heads, F = c->intermediate_size;
    bool moe = c->type == MX_MODEL_QWEN3_MOE;
    int64_t E = moe ? c->num_experts : 0, K = moe ? c->num_experts_per_tok : 0, FE = moe ? c->moe_intermediate_size : 0;
    int64_t RK = R * K, at = 0;
    // each buffer starts on a 64-byte line
#define TAKE(ptr, n) do { if (base) (ptr) = (void *)(base + at); at += ((int64_t)(n) + 15) / 16 * 16; } while (0)
    TAKE(inf->kc, L * S * TC * KVD);
    TAKE(inf->vc, L * S * TC * KVD);
    TAKE(inf->cos_t, TC * (c->head_dim / 2));
    TAKE(inf->sin_t, TC * (c->head_dim / 2));
    TAKE(inf->x, R * C);
    TAKE(inf->ln, R * C);
    TAKE(inf->q, R * QD);
    TAKE(inf->k, R * KVD);
    TAKE(inf->v, R * KVD);
    TAKE(inf->q_raw, R * QD);
    TAKE(inf->k_raw, R * KVD);
    TAKE(inf->rstd, R * NH);
    TAKE(inf->a, R * QD);
    TAKE(inf->y, R * C);
    TAKE(inf->gate, R * F);
    TAKE(inf->up, R * F);
    TAKE(inf->h, R * F);
    TAKE(inf->att, mxi_decode_attention_scratch((int)TC));
    TAKE(inf->x_out, S * C);
    TAKE(inf->ln_out, S * C);
    TAKE(inf->logits, S * V);
    TAKE(inf->probs, R * E);
    TAKE(inf->route_w, R * K);
    TAKE(inf->xe, RK * C);
    TAKE(inf->gu, RK * 2 * FE);
    TAKE(inf->he, RK * FE);
    TAKE(inf->ye, RK * C);
    TAKE(inf->idx, R * K);
    TAKE(inf->perm, RK);
    TAKE(inf->pos_of, RK);
    TAKE(inf->off, E + 1);
    TAKE(inf->next, E);
#undef TAKE
    return (size_t)at * sizeof(float);
}

int mxi_infer_create(const mx_model_config *config, const mxi_infer_options *o, mxi_infer **out, mx_diag *diag) {
    if (!config || !o || !out) return mxi_diag(diag, MX_ENULL, "mxi_infer_create: NULL argument");
    *out = NULL;
    if (o->batch < 1 || o->max_seq < 1 || o->max_rows < o->batch)
        return mxi_diag(diag, MX_EINVAL, "generation of %d sequences of %d positions in forwards of %d rows is not "
                        "allowed (allowed: at least 1 sequence and position, rows >= sequences)", o->batch, o->max_seq,
                        o->max_rows);
    if (o->max_seq > config->max_position_embeddings)
        return mxi_diag(diag, MX_EINVAL, "%d positions exceed the model's max_position_embeddings %d", o->max_seq,
                        config->max_position_embeddings);
    mxi_infer *inf = calloc(1, sizeof *inf);
    if (!inf) return mxi_diag(diag, MX_ENOMEM, "out of memory (%zu bytes)", sizeof *inf);
    mx_model_options mo = {.batch = 1, .seq = 1, .bf16 = o->bf16, .plan = o->plan};
    int rc = mx_model_create(config, &mo, &inf->m, diag);
    if (rc) {
        free(inf);
        return rc;
    }
    inf->S = o->batch, inf->TC = o->max_seq, inf->R = o->max_rows;
    inf->bytes = carve(inf, NULL);
    inf->mem = aligned_alloc(64, inf->bytes);
    if (!inf->mem) {
        size_t b = inf->bytes;
        mxi_infer_free(inf);
        return mxi_diag(diag, MX_ENOMEM, "out of memory for the KV cache and the generation buffers (%.1f MiB)",
                        b / 1048576.0);
    }
    carve(inf, inf->mem);
    mxi_rope_tables(inf->cos_t, inf->sin_t, inf->TC, config->head_dim, config->rope_theta);
    *out = inf;
    return MX_OK;
}

/* The MoE block of layer l on inf->ln (rows) into inf->y: route, group the rows by expert,
 * each expert's SwiGLU MLP over its group, combine with the routing weights (moe.c's
 * forward without training's statistics and exchanges). */
static void moe_forward(mxi_infer *inf, int l, int rows) {
    mx_model *m = inf->m;
    const mx_model_config *c = &m->cfg;
    const layer_offsets *o = &m->layers[l];
    int C = c->hidden_size, E = c->num_experts, K = c->num_experts_per_tok, FE = c->moe_intermediate_size;
    mxi_linear_forward(m->lin, m->mx[l].router, inf->probs, inf->ln, PARAMS(o->router, -1), SHAPE(rows, C, E));
    mxi_moe_route_forward(inf->idx, inf->route_w, inf->probs, inf->probs, rows, E, K, c->norm_topk_prob);
    int32_t *off = inf->off, *next = inf->next;
    memset(off, 0, (size_t)(E + 1) * sizeof *off);
    for (int i = 0; i < rows * K; i++) off[inf->idx[i] + 1]++;
    for (int e = 0; e < E; e++) off[e + 1] += off[e];
    memcpy(next, off, (size_t)E * sizeof *off);
    for (int n = 0; n < rows; n++)
        for (int j = 0; j < K; j++) {
            int32_t p = next[inf->idx[n * K + j]]++;
            inf->perm[p] = n;
            inf->pos_of[n * K + j] = p;
        }
    for (int p = 0; p < rows * K; p++)
        memcpy(inf->xe + (int64_t)p * C, inf->ln + (int64_t)inf->perm[p] * C, (size_t)C * sizeof(float));
    const float *wgu = W(o->experts_gate_up), *wd = W(o->experts_down);
    mxi_linear_vary_tokens(m->lin, true);
    for (int e = 0; e < E; e++) {
        int64_t r0 = off[e], ne = off[e + 1] - off[e];
        if (ne == 0) continue;
        mxi_linear_params pgu = {.w = wgu + (int64_t)e * 2 * FE * C}, pd = {.w = wd + (int64_t)e * C * FE};
        mxi_linear_forward(m->lin, m->mx[l].experts, inf->gu + r0 * 2 * FE, inf->xe + r0 * C, pgu, SHAPE(ne, C, 2 * FE));
        mxi_swiglu_forward(inf->he + r0 * FE, inf->gu + r0 * 2 * FE, inf->gu + r0 * 2 * FE + FE, ne, FE, 2 * FE);
        mxi_linear_forward(m->lin, m->mx[l].experts, inf->ye + r0 * C, inf->he + r0 * FE, pd, SHAPE(ne, FE, C));
    }
    mxi_linear_vary_tokens(m->lin, false);
    for (int n = 0; n < rows; n++) {   // each element's sum in slot order, as training's
        float *y = inf->y + (int64_t)n * C;
        for (int i = 0; i < C; i++) y[i] = 0.0f;
        for (int j = 0; j < K; j++) {
            float w = inf->route_w[n * K + j];
            const float *ye = inf->ye + (int64_t)inf->pos_of[n * K + j] * C;
            for (int i = 0; i < C; i++) y[i] += w * ye[i];
        }
    }
}

/* Block l on inf->x (rows of sequences seq at positions pos), in place. */
static void layer_forward(mxi_infer *inf, int l, const int32_t *seq, const int32_t *pos, int rows) {
    mx_model *m = inf->m;
    const mx_model_config *c = &m->cfg;
    const mxi_nn_kernels *nk = mxi_nn_kernels_active();
    const layer_offsets *o = &m->layers[l];
    const layer_mx *x = &m->mx[l];
    int C = c->hidden_size, NH = c->num_attention_heads, NKV = c->num_key_value_heads, HD = c->head_dim;
    int QD = m->QD, KVD = m->KVD, F = c->intermediate_size, half = HD / 2;
    float eps = c->rms_norm_eps;
    bool qk_norm = c->type != MX_MODEL_LLAMA;
    // attention: q, k, v of the rows; k and v into the cache; the rows attend over it
    mxi_rmsnorm_forward(inf->ln, inf->rstd, inf->x, W(o->ln1), rows, C, eps);
    float *q_out = qk_norm ? inf->q_raw : inf->q, *k_out = qk_norm ? inf->k_raw : inf->k;
    mxi_linear_share_input(m->lin, inf->ln);
    mxi_linear_forward(m->lin, x->q, q_out, inf->ln, PARAMS(o->q, o->q_b), SHAPE(rows, C, QD));
    mxi_linear_forward(m->lin, x->k, k_out, inf->ln, PARAMS(o->k, o->k_b), SHAPE(rows, C, KVD));
    mxi_linear_forward(m->lin, x->v, inf->v, inf->ln, PARAMS(o->v, o->v_b), SHAPE(rows, C, KVD));
    mxi_linear_share_input(m->lin, NULL);
    if (qk_norm) {
        mxi_rmsnorm_forward(inf->q, inf->rstd, inf->q_raw, W(o->q_norm), rows * NH, HD, eps);
        mxi_rmsnorm_forward(inf->k, inf->rstd, inf->k_raw, W(o->k_norm), rows * NKV, HD, eps);
    }
    int64_t cache_l = (int64_t)l * inf->S * inf->TC * KVD;
    for (int r = 0; r < rows; r++) {
        const float *cs = inf->cos_t + (int64_t)pos[r] * half, *sn = inf->sin_t + (int64_t)pos[r] * half;
        nk->rope(inf->q + (int64_t)r * QD, cs, sn, NH, HD, 1.0f);
        nk->rope(inf->k + (int64_t)r * KVD, cs, sn, NKV, HD, 1.0f);
    }
    if (m->bf16) {   // attention's operands as training's attention rounds them
        mxi_bf16_round_f32(inf->q, inf->q, (int64_t)rows * QD);
        mxi_bf16_round_f32(inf->k, inf->k, (int64_t)rows * KVD);
        mxi_bf16_round_f32(inf->v, inf->v, (int64_t)rows * KVD);
    }
    for (int r = 0; r < rows; r++) {
        int64_t at = cache_l + ((int64_t)seq[r] * inf->TC + pos[r]) * KVD;
        memcpy(inf->kc + at, inf->k + (int64_t)r * KVD, (size_t)KVD * sizeof(float));
        memcpy(inf->vc + at, inf->v + (int64_t)r * KVD, (size_t)KVD * sizeof(float));
    }
    mxi_decode_attention(inf->a, inf->att, inf->q, inf->kc + cache_l, inf->vc + cache_l,
                         (mxi_decode_shape){.seq = seq, .pos = pos, .rows = rows, .NH = NH, .NKV = NKV, .HD = HD,
                                            .TC = inf->TC});
    mxi_linear_forward(m->lin, x->o, inf->y, inf->a, PARAMS(o->o, o->o_b), SHAPE(rows, QD, C));
    mxi_add_inplace(inf->x, inf->y, (int64_t)rows * C);
    // MLP
    mxi_rmsnorm_forward(inf->ln, inf->rstd, inf->x, W(o->ln2), rows, C, eps);
    if (o->router >= 0) {
        moe_forward(inf, l, rows);
    } else {
        mxi_linear_share_input(m->lin, inf->ln);
        mxi_linear_forward(m->lin, x->gate, inf->gate, inf->ln, PARAMS(o->gate, -1), SHAPE(rows, C, F));
        mxi_linear_forward(m->lin, x->up, inf->up, inf->ln, PARAMS(o->up, -1), SHAPE(rows, C, F));
        mxi_linear_share_input(m->lin, NULL);
        mxi_swiglu_forward(inf->h, inf->gate, inf->up, rows, F, F);
        mxi_linear_forward(m->lin, x->down, inf->y, inf->h, PARAMS(o->down, -1), SHAPE(rows, F, C));
    }
    mxi_add_inplace(inf->x, inf->y, (int64_t)rows * C);
}

int mxi_infer_forward(mxi_infer *inf, const int32_t *tokens, const int32_t *seq, const int32_t *pos, int rows,
                      const int32_t *out, int n_out, const float **logits, mx_diag *diag) {
    mx_model *m = inf->m;
    const mx_model_config *c = &m->cfg;
    int C = c->hidden_size, V = c->vocab_size;
    if (rows < 1 || rows > inf->R || n_out < 0 || n_out > inf->S)
        return mxi_diag(diag, MX_EINVAL, "a generation forward of %d rows, %d of them for logits (allowed: 1 to %d "
                        "rows, at most %d for logits)", rows, n_out, inf->R, inf->S);
    for (int r = 0; r < rows; r++) {
        if (seq[r] < 0 || seq[r] >= inf->S || pos[r] < 0 || pos[r] >= inf->TC)
            return mxi_diag(diag, MX_EINVAL, "row %d: sequence %d at position %d (allowed: sequences 0 to %d, "
                            "positions 0 to %d)", r, seq[r], pos[r], inf->S - 1, inf->TC - 1);
        if (tokens[r] < 0 || tokens[r] >= V)
            return mxi_diag(diag, MX_EINVAL, "token %d is not in the vocabulary (allowed: 0 to %d)", tokens[r], V - 1);
    }
    mxi_embedding_forward(inf->x, tokens, W(m->embed), rows, C);
    for (int l = 0; l < c->num_hidden_layers; l++) layer_forward(inf, l, seq, pos, rows);
    for (int j = 0; j < n_out; j++)
        memcpy(inf->x_out + (int64_t)j * C, inf->x + (int64_t)out[j] * C, (size_t)C * sizeof(float));
    if (n_out > 0) {
        mxi_rmsnorm_forward(inf->ln_out, inf->rstd, inf->x_out, W(m->final_norm), n_out, C, c->rms_norm_eps);
        mxi_linear_forward(m->lin, m->lm_head_mx, inf->logits, inf->ln_out, PARAMS(m->lm_head, -1), SHAPE(n_out, C, V));
    }
    *logits = inf->logits;
    return mxi_linear_ctx_error(m->lin, diag);
}
