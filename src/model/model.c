/* The transformer (SPEC §7): creation, and the forward and backward passes, read top to
 * bottom: embedding, each block (attention, then its dense MLP or MoE block, moe.c), final
 * norm, lm_head and the loss; backward in reverse.
 *
 * Memory is one allocation per category, made at create time: parameters (fp32 master
 * weights), gradients, and activations (activations.c). Nothing is allocated per step.
 * Shape letters: see include/mxtrain/model.h; N = B*T token rows, QD = NH*HD, KVD = NKV*HD. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_internal.h"
#include "ops/attention.h"
#include "ops/nn_kernels.h"

/* ---- configuration ---- */

bool mx_model_layer_is_moe(const mx_model_config *c, int layer) {
    return c->type == MX_MODEL_QWEN3_MOE && c->num_experts > 0 && layer >= 0 && layer < MX_MAX_LAYERS &&
           !c->mlp_only_layers[layer] && c->decoder_sparse_step > 0 && (layer + 1) % c->decoder_sparse_step == 0;
}

int mx_model_config_check(const mx_model_config *c, mx_diag *diag) {
    if (!c) return MX_ENULL;
    struct { const char *key; long long value; long long min, max; } sizes[] = {
        {"vocab_size", c->vocab_size, 1, 1 << 24},
        {"hidden_size", c->hidden_size, 1, 1 << 16},
        {"intermediate_size", c->intermediate_size, 1, 1 << 18},
        {"num_hidden_layers", c->num_hidden_layers, 1, MX_MAX_LAYERS},
        {"num_attention_heads", c->num_attention_heads, 1, 1024},
        {"num_key_value_heads", c->num_key_value_heads, 1, 1024},
        {"head_dim", c->head_dim, 2, 4096},
        {"max_position_embeddings", c->max_position_embeddings, 1, 1 << 20},
    };
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        if (sizes[i].value < sizes[i].min || sizes[i].value > sizes[i].max)
            return mxi_diag(diag, MX_ECONFIG, "model.%s: %lld is out of range (allowed: %lld to %lld)", sizes[i].key,
                            sizes[i].value, sizes[i].min, sizes[i].max);
    if (c->head_dim % 2)
        return mxi_diag(diag, MX_ECONFIG, "model.head_dim: %d is odd (allowed: an even number, for rotary embeddings)",
                        c->head_dim);
    if (c->num_attention_heads % c->num_key_value_heads)
        return mxi_diag(diag, MX_ECONFIG,
                        "model.num_key_value_heads: %d does not divide num_attention_heads %d (allowed: a divisor)",
                        c->num_key_value_heads, c->num_attention_heads);
    if (!(c->rms_norm_eps > 0))
        return mxi_diag(diag, MX_ECONFIG, "model.rms_norm_eps: %g is not allowed (allowed: > 0)", c->rms_norm_eps);
    if (!(c->rope_theta > 0))
        return mxi_diag(diag, MX_ECONFIG, "model.rope_theta: %g is not allowed (allowed: > 0)", c->rope_theta);
    if (c->type == MX_MODEL_QWEN3_MOE) {
        if (c->num_experts < 1 || c->num_experts > 4096)
            return mxi_diag(diag, MX_ECONFIG, "model.num_experts: %d is out of range (allowed: 1 to 4096)", c->num_experts);
        if (c->num_experts_per_tok < 1 || c->num_experts_per_tok > c->num_experts)
            return mxi_diag(diag, MX_ECONFIG,
                            "model.num_experts_per_tok: %d is not allowed (allowed: 1 to num_experts = %d)",
                            c->num_experts_per_tok, c->num_experts);
        if (c->moe_intermediate_size < 1 || c->moe_intermediate_size > (1 << 18))
            return mxi_diag(diag, MX_ECONFIG, "model.moe_intermediate_size: %d is out of range (allowed: 1 to %d)",
                            c->moe_intermediate_size, 1 << 18);
        if (c->decoder_sparse_step < 1)
            return mxi_diag(diag, MX_ECONFIG, "model.decoder_sparse_step: %d is not allowed (allowed: >= 1)",
                            c->decoder_sparse_step);
    }
    return MX_OK;
}

static int keep_bf16_override = -1;   // mxi_model_keep_bf16_inputs
static int ce_rows_override = 0;      // mxi_model_ce_rows

void mxi_model_keep_bf16_inputs(int yes) { keep_bf16_override = yes; }

void mxi_model_ce_rows(int rows) { ce_rows_override = rows; }

int mxi_model_ce_chunk(const mx_model *m) {
    int64_t V = m->cfg.vocab_size, fit = MXI_CE_CHUNK_BYTES / (4 * V) / 32 * 32;
    int rows = ce_rows_override > 0 ? ce_rows_override : fit >= m->N ? m->N : (int)(fit > 32 ? fit : 32);
    return m->lm_head_mx || rows > m->N ? m->N : rows;
}

bool mx_model_bf16_native(mx_model *m) { return mxi_gemm_bf16_native(mxi_linear_ctx_gemm(m->lin)); }

/* ---- create / free ---- */

static int model_build(const mx_model_config *config, const mx_model_options *options, mxi_acts_mode mode,
                       mx_model **out, mx_diag *diag);

int mx_model_create(const mx_model_config *config, const mx_model_options *options, mx_model **out, mx_diag *diag) {
    if (!config || !options || !out) return mxi_diag(diag, MX_ENULL, "mx_model_create: NULL argument");
    return model_build(config, options, MXI_ACTS_ALLOCATE, out, diag);
}

int mx_model_measure_activations(const mx_model_config *config, const mx_model_options *options, size_t *bytes,
                                 mx_diag *diag) {
    if (!config || !options || !bytes) return mxi_diag(diag, MX_ENULL, "mx_model_measure_activations: NULL argument");
    mx_model_options o = *options;
    o.external_params = true;   // no weights or gradients either: only the tables
    mx_model *m = NULL;
    int rc = model_build(config, &o, MXI_ACTS_MEASURE, &m, diag);
    *bytes = rc ? 0 : m->act_bytes;
    mx_model_free(m);
    return rc;
}

/* mx_model_create, or with MXI_ACTS_MEASURE a model whose activations are sized, not
 * allocated (mx_model_measure_activations). */
static int model_build(const mx_model_config *config, const mx_model_options *options, mxi_acts_mode mode,
                       mx_model **out, mx_diag *diag) {
    *out = NULL;
    int rc = mx_model_config_check(config, diag);
    if (rc) return rc;
    if (options->batch < 1 || options->seq < 1)
        return mxi_diag(diag, MX_EINVAL, "micro-batch %d x sequence %d is not allowed (allowed: both >= 1)",
                        options->batch, options->seq);
    if (options->seq > config->max_position_embeddings)
        return mxi_diag(diag, MX_ECONFIG, "data.seq_length: %d exceeds model.max_position_embeddings %d",
                        options->seq, config->max_position_embeddings);
    if ((int64_t)options->batch * options->seq > MX_MAX_BATCH_TOKENS)
        return mxi_diag(diag, MX_EINVAL, "training.micro_batch_size %d x data.seq_length %d = %lld tokens per "
                        "micro-batch (allowed: at most %d = 2^24)", options->batch, options->seq,
                        (long long)options->batch * options->seq, MX_MAX_BATCH_TOKENS);
    int ep = options->expert_parallel;
    if (ep > 1 && (config->type != MX_MODEL_QWEN3_MOE || config->num_experts % ep))   // the trainer says why first
        return mxi_diag(diag, MX_ECONFIG, "parallel.expert_parallel_size: %d does not divide model.num_experts "
                        "(allowed: a divisor of the number of experts of an MoE model)", ep);
    mx_model *m = calloc(1, sizeof *m);
    if (!m) return mxi_diag(diag, MX_ENOMEM, "out of memory for the model (%zu bytes)", sizeof *m);
    m->cfg = *config;
    m->B = options->batch, m->T = options->seq, m->N = options->batch * options->seq;
    m->QD = config->num_attention_heads * config->head_dim;
    m->KVD = config->num_key_value_heads * config->head_dim;
    m->ep_size = options->expert_parallel > 1 ? options->expert_parallel : 1;
    m->ep_overlap = options->ep_overlap;
    m->z_loss_coef = options->z_loss_coef;
    m->docs = options->documents;
    m->params = calloc((size_t)config->num_hidden_layers * MXI_MAX_TENSORS_PER_LAYER + 3, sizeof *m->params);
    if (!m->params) goto nomem;
    mxi_model_layout_params(m);
    if (mxi_model_build_hf_table(m)) goto nomem;
    m->tw = calloc((size_t)m->n_params, sizeof *m->tw);
    m->tg = calloc((size_t)m->n_params, sizeof *m->tg);
    m->tw16 = calloc((size_t)m->n_params, sizeof *m->tw16);
    m->wq = calloc((size_t)m->n_params, sizeof *m->wq);
    m->wq_converted = calloc((size_t)m->n_params, sizeof *m->wq_converted);
    if (!m->tw || !m->tg || !m->tw16 || !m->wq || !m->wq_converted) goto nomem;
    m->local_experts = options->external_params;
    if (!options->external_params) {
        m->w = calloc((size_t)m->num_params, sizeof(float));
        m->g = calloc((size_t)m->num_params, sizeof(float));
        if (!m->w || !m->g) goto nomem;
        for (int i = 0; i < m->n_params; i++)
            m->tw[i] = m->w + m->params[i].offset, m->tg[i] = m->g + m->params[i].offset;
    }
    for (int l = 0; l < config->num_hidden_layers; l++) {
        char name[32];
        snprintf(name, sizeof name, "model.layers.%d", l);
        bool match = false;
        for (int i = 0; i < options->n_recompute && !match; i++)
            match = mx_pattern_match(options->recompute[i].compiled, name);
        m->recompute[l] = !match ? MXI_RECOMPUTE_NONE
                          : options->recompute_granularity == MX_RECOMPUTE_SELECTIVE ? MXI_RECOMPUTE_SELECTIVE
                                                                                    : MXI_RECOMPUTE_FULL;
    }
    rc = mxi_model_apply_plan(m, options->plan, diag);
    if (!rc) rc = mxi_model_plan_ep(m, options, diag);
    if (rc) {
        mx_model_free(m);
        return rc;
    }
    rc = mxi_linear_ctx_create(&m->lin, options->bf16, diag);
    if (rc) {
        mx_model_free(m);
        return rc;
    }
    // room for every saved input plane of a pass: four per layer, two per expert group
    if (mxi_quant_stats_create(&m->qstats, m->n_params, config->num_hidden_layers * (4 + 2 * config->num_experts)))
        goto nomem;
    mxi_linear_ctx_stats(m->lin, m->qstats);
    // bf16 inputs save backward a rounding pass where the products take bf16 as it is
    m->keep_bf16 = m->bf16 && mx_model_bf16_native(m) && keep_bf16_override != 0;
    m->ce_rows = mxi_model_ce_chunk(m);
    if (mxi_model_alloc_activations(m, mode)) goto nomem;
    if (mode == MXI_ACTS_MEASURE) {
        *out = m;
        return MX_OK;
    }
    mxi_rope_tables(m->cos_t, m->sin_t, m->T, config->head_dim, config->rope_theta);
    *out = m;
    return MX_OK;
nomem:;
    // what it needed: weights and gradients of its own (none with external_params), and
    // activations (sized once the plan is applied)
    double own = options->external_params ? 0 : (double)m->num_params * 8 / (1 << 20), act = m->act_bytes / 1048576.0;
    size_t tables = ((size_t)config->num_hidden_layers * MXI_MAX_TENSORS_PER_LAYER + 3) * sizeof *m->params +
                    (size_t)m->n_params * (sizeof *m->tw + sizeof *m->tg + sizeof *m->tw16 + sizeof *m->wq + sizeof *m->wq_converted);
    mx_model_free(m);
    if (act > 0 && own == 0)
        return mxi_diag(diag, MX_ENOMEM, "out of memory for the model's activations (%.1f MiB)", act);
    if (act > 0)
        return mxi_diag(diag, MX_ENOMEM, "out of memory for the model: %.1f MiB of weights and gradients, %.1f MiB of "
                        "activations", own, act);
    if (own > 0)
        return mxi_diag(diag, MX_ENOMEM, "out of memory for the model: %.1f MiB of weights and gradients, then its "
                        "activations", own);
    return mxi_diag(diag, MX_ENOMEM, "out of memory for the model's tables (about %zu bytes)", tables);
}

void mx_model_free(mx_model *m) {
    if (!m) return;
    mxi_linear_ctx_free(m->lin);
    mxi_quant_stats_free(m->qstats);
    free(m->params), free(m->hf), free(m->hf_first), free(m->w), free(m->g), free(m->act_mem);
    free(m->tw), free(m->tg), free(m->tw16), free(m->wq), free(m->wq_converted);
    mxi_delayed_free(m->delayed);
    free(m->sink_dw), free(m->sink_row);
    free(m);
}
/* ---- forward ---- */

/* Before the forward products that read site x: where it keeps bf16, the rounding they
 * share goes there, for backward. */
static void share_site(mx_model *m, const float *x, const mxi_saved_input *sv) {
    if (sv->bf16) mxi_linear_share_input_into(m->lin, x, sv->bf16);
    else mxi_linear_share_input(m->lin, x);
}

/* Tell the engine (if any) about a unit; false when it failed and the pass must stop. */
static bool unit_event(mx_model *m, int unit, mxi_unit_event event) {
    if (m->hook_error) return false;
    if (!m->hooks.on_unit) return true;
    int rc = m->hooks.on_unit(m->hooks.ctx, unit, event, &m->hook_diag);
    if (rc) m->hook_error = rc;
    return rc == 0;
}

/* Transformer block l: from its input s->x to its output (the next block's input). */
static void layer_forward(mx_model *m, int l) {
    const mx_model_config *c = &m->cfg;
    int B = m->B, T = m->T, N = m->N, C = c->hidden_size, L = c->num_hidden_layers;
    int NH = c->num_attention_heads, NKV = c->num_key_value_heads, HD = c->head_dim, QD = m->QD, KVD = m->KVD;
    int F = c->intermediate_size;
    float eps = c->rms_norm_eps;
    bool qk_norm = c->type != MX_MODEL_LLAMA;
    layer_acts *s = &m->acts[l];
    const layer_offsets *o = &m->layers[l];
    const layer_mx *x = &m->mx[l];
    float *out = l + 1 < L ? m->acts[l + 1].x : m->x_final;   // (N, C) this layer's output
    // attention
    mxi_rmsnorm_forward(s->ln1, s->rstd1, s->x, W(o->ln1), N, C, eps);
    mxi_prof_t t0 = mxi_prof_start(m);
    float *q_out = qk_norm ? s->q_raw : s->q, *k_out = qk_norm ? s->k_raw : s->k;
    share_site(m, s->ln1, &s->ln1_sv);   // first: a per-tensor save offers its codes to the products
    if (s->ln1_sv.q) mxi_linear_save_input(m->lin, x->q, &s->ln1_sv, s->ln1, N, C);
    mxi_linear_forward(m->lin, x->q, q_out, s->ln1, PARAMS(o->q, o->q_b), SHAPE(N, C, QD));
    mxi_linear_forward(m->lin, x->k, k_out, s->ln1, PARAMS(o->k, o->k_b), SHAPE(N, C, KVD));
    mxi_linear_forward(m->lin, x->v, s->v, s->ln1, PARAMS(o->v, o->v_b), SHAPE(N, C, KVD));
    mxi_linear_share_input(m->lin, NULL);
    mxi_prof_stop(m, MXI_OP_LINEAR, t0);
    if (qk_norm) {
        mxi_rmsnorm_forward(s->q, s->rstd_q, s->q_raw, W(o->q_norm), N * NH, HD, eps);
        mxi_rmsnorm_forward(s->k, s->rstd_k, s->k_raw, W(o->k_norm), N * NKV, HD, eps);
    }
    mxi_rope_forward(s->q, m->cos_t, m->sin_t, m->positions, B, T, NH, HD);
    mxi_rope_forward(s->k, m->cos_t, m->sin_t, m->positions, B, T, NKV, HD);
    mx_diag ad = {{0}};
    t0 = mxi_prof_start(m);
    int arc = mxi_attention_forward(mxi_linear_ctx_gemm(m->lin), s->a, s->att_stats, m->datt_scratch, s->q, s->k,
                                    s->v, m->doc_start, B, T, NH, NKV, HD, m->bf16, &ad);
    if (s->a16) mxi_bf16_round(s->a16, s->a, (int64_t)N * QD);
    mxi_prof_stop(m, MXI_OP_ATTENTION, t0);
    if (arc) mxi_linear_ctx_record(m->lin, arc, &ad);
    t0 = mxi_prof_start(m);
    share_site(m, s->a, &s->a_sv);
    if (s->a_sv.q) mxi_linear_save_input(m->lin, x->o, &s->a_sv, s->a, N, QD);
    mxi_linear_forward(m->lin, x->o, s->x2, s->a, PARAMS(o->o, o->o_b), SHAPE(N, QD, C));
    mxi_linear_share_input(m->lin, NULL);
    mxi_prof_stop(m, MXI_OP_LINEAR, t0);
    mxi_add_inplace(s->x2, s->x, (int64_t)N * C);
    // MLP
    mxi_rmsnorm_forward(s->ln2, s->rstd2, s->x2, W(o->ln2), N, C, eps);
    if (o->router < 0) share_site(m, s->ln2, &s->ln2_sv);   // gate and up: as ln1's
    if (s->ln2_sv.q)
        TIMED(o->router >= 0 ? MXI_OP_ROUTER : MXI_OP_LINEAR,
              mxi_linear_save_input(m->lin, o->router >= 0 ? x->router : x->gate, &s->ln2_sv, s->ln2, N, C));
    if (o->router >= 0) {
        mxi_moe_forward(m, l, out);
    } else {
        t0 = mxi_prof_start(m);
        mxi_linear_forward(m->lin, x->gate, s->gate, s->ln2, PARAMS(o->gate, -1), SHAPE(N, C, F));
        mxi_linear_forward(m->lin, x->up, s->up, s->ln2, PARAMS(o->up, -1), SHAPE(N, C, F));
        mxi_linear_share_input(m->lin, NULL);
        mxi_prof_stop(m, MXI_OP_LINEAR, t0);
        mxi_swiglu_forward(s->h, s->gate, s->up, N, F, F);
        t0 = mxi_prof_start(m);
        share_site(m, s->h, &s->h_sv);
        if (s->h_sv.q) mxi_linear_save_input(m->lin, x->down, &s->h_sv, s->h, N, F);
        mxi_linear_forward(m->lin, x->down, out, s->h, PARAMS(o->down, -1), SHAPE(N, F, C));
        mxi_linear_share_input(m->lin, NULL);
        mxi_prof_stop(m, MXI_OP_LINEAR, t0);
    }
    mxi_add_inplace(out, s->x2, (int64_t)N * C);
}

static double model_forward(mx_model *m, const int32_t *inputs, const int32_t *targets);

double mx_model_forward(mx_model *m, const int32_t *inputs, const int32_t *targets) {
    mxi_prof_t t0 = mxi_prof_start(m);
    mxi_delayed_begin_forward(m->delayed);   // this pass's scales, which its backward and recompute use too
    double loss = model_forward(m, inputs, targets);
    mxi_prof_pass(m, t0, true);
    return loss;
}

static double model_forward(mx_model *m, const int32_t *inputs, const int32_t *targets) {
    const mx_model_config *c = &m->cfg;
    int N = m->N, C = c->hidden_size, V = c->vocab_size, L = c->num_hidden_layers, E = c->num_experts;
    memcpy(m->inputs, inputs, (size_t)N * sizeof *inputs);
    memcpy(m->targets, targets, (size_t)N * sizeof *targets);
    mxi_documents_make(m);
    if (m->aux_count) {
        memset(m->aux_count, 0, (size_t)E * sizeof(double));
        memset(m->aux_prob, 0, (size_t)E * sizeof(double));
    }
    m->z_sum = 0;
    int eu = mxi_model_embedding_unit(m);   // the root's when lm_head shares the embedding
    if (!unit_event(m, eu, MXI_PRE_FORWARD)) return NAN;
    if (W16(m->embed)) mxi_embedding_forward_bf16(m->acts[0].x, m->inputs, W16(m->embed), N, C);
    else mxi_embedding_forward(m->acts[0].x, m->inputs, W(m->embed), N, C);
    if (eu && !unit_event(m, eu, MXI_POST_FORWARD)) return NAN;
    for (int l = 0; l < L; l++) {
        if (!unit_event(m, l + 1, MXI_PRE_FORWARD)) return NAN;
        layer_forward(m, l);
        if (!unit_event(m, l + 1, MXI_POST_FORWARD)) return NAN;
    }
    if (eu && !unit_event(m, 0, MXI_PRE_FORWARD)) return NAN;
    mxi_rmsnorm_forward(m->ln_f, m->rstd_f, m->x_final, W(m->final_norm), N, C, c->rms_norm_eps);
    // the logits a chunk of rows at a time (all rows in one where they fit), and their loss
    double ce_sum = 0.0, mean = 0.0;
    for (int r0 = 0; r0 < N; r0 += m->ce_rows) {
        int rows = N - r0 < m->ce_rows ? N - r0 : m->ce_rows;
        TIMED(MXI_OP_LINEAR, mxi_linear_forward(m->lin, m->lm_head_mx, m->logits, m->ln_f + (int64_t)r0 * C,
                                                PARAMS(m->lm_head, -1), SHAPE(rows, C, V)));
        if (m->loss_keep) {
            ce_sum += mxi_cross_entropy_kept(NULL, m->logits, m->targets + r0, m->loss_keep + r0, rows, V, 0.0f);
            continue;
        }
        mean = mxi_cross_entropy_forward_backward(NULL, m->logits, m->targets + r0, rows, V, 0.0f);
        ce_sum += mean * rows;
    }
    if (!unit_event(m, 0, MXI_POST_FORWARD)) return NAN;
    m->ce_loss = m->ce_rows >= N ? mean : ce_sum / N;   // one chunk: its mean as it is, no * N / N
    // eod_mask_loss: the mean over the kept positions (0 when the micro-batch keeps none)
    if (m->loss_keep) m->ce_loss = m->loss_count ? ce_sum / (double)m->loss_count : 0.0;
    m->aux_loss = 0.0;
    if (mxi_moe_aux_enabled(m) && m->ep_size > 1 && !m->hook_error && m->ep.sum) {
        // the statistics of the EP group's concatenated micro-batches, as its experts see them
        int rc = m->ep.sum(m->ep.ctx, m->aux_count, E, "the router's expert counts", &m->hook_diag);
        if (!rc) rc = m->ep.sum(m->ep.ctx, m->aux_prob, E, "the router's expert probabilities", &m->hook_diag);
        if (rc) m->hook_error = rc;
    }
    if (mxi_moe_aux_enabled(m))
        m->aux_loss = mxi_moe_aux_loss(m->aux_count, m->aux_prob, E, (double)N * m->ep_size * mxi_moe_layer_count(m));
    m->z_loss = m->z_sum / N;   // per layer a mean over the tokens, summed over the layers
    return m->ce_loss + (mxi_moe_aux_enabled(m) ? c->router_aux_loss_coef * m->aux_loss : 0.0) + m->z_loss_coef * m->z_loss;
}

double mx_model_last_ce_loss(const mx_model *m) { return m->ce_loss; }
double mx_model_last_aux_loss(const mx_model *m) { return m->aux_loss; }
double mx_model_last_z_loss(const mx_model *m) { return m->z_loss; }

/* ---- backward ---- */

/* Selective recompute of block l's attention internals: q and k as attention reads them,
 * made again from q_raw and k_raw by forward's own calls (the per-head norms make their rstd
 * again, the same bits). Llama's q and k are the products' outputs, kept: nothing to do. */
static void remake_qk(mx_model *m, int l) {
    const mx_model_config *c = &m->cfg;
    int B = m->B, T = m->T, N = m->N, NH = c->num_attention_heads, NKV = c->num_key_value_heads, HD = c->head_dim;
    layer_acts *s = &m->acts[l];
    const layer_offsets *o = &m->layers[l];
    if (c->type == MX_MODEL_LLAMA) return;
    mxi_rmsnorm_forward(s->q, s->rstd_q, s->q_raw, W(o->q_norm), N * NH, HD, c->rms_norm_eps);
    mxi_rmsnorm_forward(s->k, s->rstd_k, s->k_raw, W(o->k_norm), N * NKV, HD, c->rms_norm_eps);
    mxi_rope_forward(s->q, m->cos_t, m->sin_t, m->positions, B, T, NH, HD);
    mxi_rope_forward(s->k, m->cos_t, m->sin_t, m->positions, B, T, NKV, HD);
}

/* Backward of block l: m->d_res holds the gradient of its output on entry, of its input on
 * return; its weight gradients are accumulated. */
static void layer_backward(mx_model *m, int l) {
    const mx_model_config *c = &m->cfg;
    int B = m->B, T = m->T, N = m->N, C = c->hidden_size;
    int NH = c->num_attention_heads, NKV = c->num_key_value_heads, HD = c->head_dim, QD = m->QD, KVD = m->KVD;
    int F = c->intermediate_size;
    bool qk_norm = c->type != MX_MODEL_LLAMA;
    layer_acts *s = &m->acts[l];
    const layer_offsets *o = &m->layers[l];
    const layer_mx *x = &m->mx[l];
    // d_res: gradient of this layer's output = x2 + mlp(ln2(x2))
    if (o->router >= 0) {
        mxi_moe_backward(m, l, m->d_res);
    } else {
        if (m->recompute[l] == MXI_RECOMPUTE_SELECTIVE)   // h, for down's weight gradient (kept in fp32 there)
            mxi_swiglu_forward(s->h, s->gate, s->up, N, F, F);
        TIMED(MXI_OP_LINEAR, mxi_linear_backward(m->lin, x->down, GRADS(m->d_h, MXI_WRITE_SET, o->down, -1), m->d_res,
                                                 mxi_site_input(s->h, &s->h_sv), PARAMS(o->down, -1), SHAPE(N, F, C)));
        mxi_grad_done(m, o->down);
        mxi_swiglu_backward(m->d_gate, m->d_up, m->d_h, s->gate, s->up, N, F, F);
        mxi_prof_t t0 = mxi_prof_start(m);
        mxi_linear_share_input(m->lin, mxi_site_kept(s->ln2, &s->ln2_sv));   // gate and up read one input
        mxi_linear_input ln2 = mxi_site_input(s->ln2, &s->ln2_sv);
        mxi_linear_backward(m->lin, x->gate, GRADS(m->d_ln, MXI_WRITE_SET, o->gate, -1), m->d_gate, ln2,
                            PARAMS(o->gate, -1), SHAPE(N, C, F));
        mxi_grad_done(m, o->gate);
        mxi_linear_backward(m->lin, x->up, GRADS(m->d_ln, MXI_WRITE_ADD, o->up, -1), m->d_up, ln2, PARAMS(o->up, -1),
                            SHAPE(N, C, F));
        mxi_grad_done(m, o->up);
        mxi_linear_share_input(m->lin, NULL);
        mxi_prof_stop(m, MXI_OP_LINEAR, t0);
    }
    mxi_rmsnorm_backward(m->d_mlp, G(o->ln2), m->d_ln, s->x2, W(o->ln2), s->rstd2, N, C);
    mxi_add_inplace(m->d_res, m->d_mlp, (int64_t)N * C);   // now the gradient of x2 = x + o_proj(a)
    TIMED(MXI_OP_LINEAR, mxi_linear_backward(m->lin, x->o, GRADS(m->d_a, MXI_WRITE_SET, o->o, o->o_b), m->d_res,
                                             mxi_site_input(s->a, &s->a_sv), PARAMS(o->o, -1), SHAPE(N, QD, C)));
    mxi_grad_done(m, o->o);
    if (m->recompute[l] == MXI_RECOMPUTE_SELECTIVE) remake_qk(m, l);
    mx_diag ad = {{0}};
    mxi_prof_t t0 = mxi_prof_start(m);
    // the output as the o projection kept it (fp32 or bf16), or the copy beside its plane
    mxi_att_output ao = {.f32 = mxi_site_kept(s->a, &s->a_sv), .bf16 = s->a16 ? s->a16 : s->a_sv.bf16};
    int arc = mxi_attention_backward(mxi_linear_ctx_gemm(m->lin), m->d_q, m->d_k, m->d_v, m->datt_scratch, m->d_a, ao,
                                     s->att_stats, s->q, s->k, s->v, m->doc_start, B, T, NH, NKV, HD, m->bf16, &ad);
    mxi_prof_stop(m, MXI_OP_ATTENTION, t0);
    if (arc) mxi_linear_ctx_record(m->lin, arc, &ad);
    mxi_rope_backward(m->d_q, m->cos_t, m->sin_t, m->positions, B, T, NH, HD);
    mxi_rope_backward(m->d_k, m->cos_t, m->sin_t, m->positions, B, T, NKV, HD);
    float *dq = m->d_q, *dk = m->d_k;
    if (qk_norm) {
        mxi_rmsnorm_backward(m->d_qraw, G(o->q_norm), m->d_q, s->q_raw, W(o->q_norm), s->rstd_q, N * NH, HD);
        mxi_rmsnorm_backward(m->d_kraw, G(o->k_norm), m->d_k, s->k_raw, W(o->k_norm), s->rstd_k, N * NKV, HD);
        dq = m->d_qraw, dk = m->d_kraw;
    }
    t0 = mxi_prof_start(m);
    mxi_linear_share_input(m->lin, mxi_site_kept(s->ln1, &s->ln1_sv));   // q, k and v read one input
    mxi_linear_input ln1 = mxi_site_input(s->ln1, &s->ln1_sv);
    mxi_linear_backward(m->lin, x->q, GRADS(m->d_ln, MXI_WRITE_SET, o->q, o->q_b), dq, ln1, PARAMS(o->q, -1),
                        SHAPE(N, C, QD));
    mxi_grad_done(m, o->q);
    mxi_linear_backward(m->lin, x->k, GRADS(m->d_ln, MXI_WRITE_ADD, o->k, o->k_b), dk, ln1, PARAMS(o->k, -1),
                        SHAPE(N, C, KVD));
    mxi_grad_done(m, o->k);
    mxi_linear_backward(m->lin, x->v, GRADS(m->d_ln, MXI_WRITE_ADD, o->v, o->v_b), m->d_v, ln1, PARAMS(o->v, -1),
                        SHAPE(N, C, KVD));
    mxi_grad_done(m, o->v);
    mxi_linear_share_input(m->lin, NULL);
    mxi_prof_stop(m, MXI_OP_LINEAR, t0);
    mxi_rmsnorm_backward(m->d_mlp, G(o->ln1), m->d_ln, s->x, W(o->ln1), s->rstd1, N, C);
    mxi_add_inplace(m->d_res, m->d_mlp, (int64_t)N * C);   // the gradient of this layer's input
}

static void model_backward(mx_model *m, float scale);

void mx_model_backward(mx_model *m, float scale) {
    mxi_prof_t t0 = mxi_prof_start(m);
    mxi_delayed_begin_backward(m->delayed);   // only the gradients' casts record: recompute casts again
    model_backward(m, scale);
    mxi_prof_pass(m, t0, false);
}

static void model_backward(mx_model *m, float scale) {
    const mx_model_config *c = &m->cfg;
    int N = m->N, C = c->hidden_size, V = c->vocab_size, L = c->num_hidden_layers;
    float *dlogits = m->logits;   // in place: backward needs only the gradient
    if (!unit_event(m, 0, MXI_PRE_BACKWARD)) return;
    m->z_dscale = (float)(m->z_loss_coef * scale / N);
    // with EP, the gradient of the group's loss: the trainer's mean over ranks divides it by EP again
    if (mxi_moe_aux_enabled(m))
        TIMED(MXI_OP_ROUTING, mxi_moe_aux_dprob(m->aux_dprob, m->aux_count, c->num_experts,
                                            (double)N * m->ep_size * mxi_moe_layer_count(m),
                                            (double)c->router_aux_loss_coef * scale * m->ep_size));
    // each chunk's logits again (one chunk: the forward's are still here), their gradient,
    // and its products: d_ln's rows of the chunk, lm_head's gradient accumulated
    if (mxi_model_sunk(m, m->lm_head)) mxi_lm_head_backward_sunk(m, scale);
    for (int r0 = 0; r0 < N && !mxi_model_sunk(m, m->lm_head); r0 += m->ce_rows) {
        int rows = N - r0 < m->ce_rows ? N - r0 : m->ce_rows;
        const float *ln = m->ln_f + (int64_t)r0 * C;
        if (m->ce_rows < N)
            TIMED(MXI_OP_LINEAR, mxi_linear_forward(m->lin, m->lm_head_mx, m->logits, ln, PARAMS(m->lm_head, -1),
                                                    SHAPE(rows, C, V)));
        if (m->loss_keep)
            mxi_cross_entropy_kept(dlogits, m->logits, m->targets + r0, m->loss_keep + r0, rows, V,
                                   m->loss_count ? scale / (float)m->loss_count : 0.0f);
        else
            mxi_cross_entropy_forward_backward(dlogits, m->logits, m->targets + r0, rows, V, scale / N);
        TIMED(MXI_OP_LINEAR, mxi_linear_backward(m->lin, m->lm_head_mx,
                                                 GRADS(m->d_ln + (int64_t)r0 * C, MXI_WRITE_SET, m->lm_head, -1),
                                                 dlogits, (mxi_linear_input){.inp = ln}, PARAMS(m->lm_head, -1),
                                                 SHAPE(rows, C, V)));
    }
    mxi_rmsnorm_backward(m->d_res, G(m->final_norm), m->d_ln, m->x_final, W(m->final_norm), m->rstd_f, N, C);
    int eu = mxi_model_embedding_unit(m);
    if (eu && !unit_event(m, 0, MXI_POST_BACKWARD)) return;
    for (int l = L - 1; l >= 0; l--) {
        if (!unit_event(m, l + 1, MXI_PRE_BACKWARD)) return;
        if (m->recompute[l] == MXI_RECOMPUTE_FULL) {   // the block's activations were not kept: run its forward again
            m->recomputing = true;
            mxi_quant_stats_pause_forward(m->qstats, true);   // its operands were counted in forward
            layer_forward(m, l);
            mxi_quant_stats_pause_forward(m->qstats, false);
            m->recomputing = false;
        }
        layer_backward(m, l);
        if (!unit_event(m, l + 1, MXI_POST_BACKWARD)) return;
    }
    if (eu && !unit_event(m, eu, MXI_PRE_BACKWARD)) return;
    if (mxi_model_sunk(m, m->embed)) mxi_embedding_backward_sunk(m);
    else mxi_embedding_backward(G(m->embed), m->d_res, m->inputs, N, C);
    unit_event(m, eu, MXI_POST_BACKWARD);
}

int mx_model_error(const mx_model *m, mx_diag *diag) {
    if (m->hook_error) {
        if (diag) *diag = m->hook_diag;
        return m->hook_error;
    }
    return mxi_linear_ctx_error(m->lin, diag);
}

void mx_model_trace_mx(mx_model *m, const char *dir) { mxi_linear_ctx_trace(m->lin, dir); }
