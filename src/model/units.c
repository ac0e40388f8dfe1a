/* The model as FSDP units, for the distributed engine (model/units.h). */
#include <stdlib.h>

#include "model/model_internal.h"
#include "ops/nn_kernels.h"

int mxi_model_num_units(const mx_model *m) { return m->n_units; }
int mxi_model_embedding_unit(const mx_model *m) { return m->cfg.tie_word_embeddings ? 0 : m->cfg.num_hidden_layers + 1; }

int64_t mxi_model_largest_tensor(const mx_model *m) {
    int64_t n = 1;
    for (int i = 0; i < m->n_params; i++) n = m->params[i].numel > n ? m->params[i].numel : n;
    return n;
}

bool mxi_model_unit_recomputes(const mx_model *m, int unit) {
    return unit > 0 && unit <= m->cfg.num_hidden_layers && m->recompute[unit - 1] == MXI_RECOMPUTE_FULL;
}

mxi_tensor_shape mxi_model_tensor_shape(const mx_model *m, int i) {
    const param_info *p = &m->params[i];
    mxi_tensor_shape t = {.unit = p->unit, .groups = 1, .rows = p->shape[0], .cols = 1, .offset = p->offset,
                          .converted = m->wq_converted ? m->wq_converted[i] : false, .decay = p->ndim >= 2,
                          .name = p->name};
    if (p->kind == P_EXPERTS) t.groups = p->shape[0], t.rows = p->shape[1], t.cols = p->shape[2];
    else if (p->ndim == 2) t.cols = p->shape[1];
    return t;
}

const mxi_linear_mx *mxi_model_mx_spec(const mx_model *m) { return m->n_converted ? &m->mx_spec : NULL; }

/* Vocabulary rows of a slice of a table's gradient: at most 64 MiB of fp32. */
static int64_t slice_rows(const mx_model *m) {
    int64_t C = m->cfg.hidden_size, V = m->cfg.vocab_size, cap = (MXI_CE_CHUNK_BYTES / 4) / C;
    return V < cap ? V : cap > 0 ? cap : 1;
}

/* Elements of the slice buffer: a slice of a vocabulary table's gradient, or the largest block weight. */
static int64_t sink_elems(const mx_model *m, int *lm_rows) {
    int64_t rows = slice_rows(m), most = rows * m->cfg.hidden_size;
    for (int i = 0; i < m->n_params; i++)
        if (i != m->lm_head && i != m->embed && mxi_model_sinks_grad(m, i) && m->params[i].numel > most)
            most = m->params[i].numel;
    if (lm_rows) *lm_rows = (int)rows;
    return most;
}

int64_t mxi_model_lm_slice_rows(const mx_model *m) {
    int64_t V = m->cfg.vocab_size, fit = (int64_t)m->ce_rows * V / m->N, rows = slice_rows(m);
    rows = fit < rows ? fit : rows;
    return rows > 0 ? rows : 1;
}

int64_t mxi_model_sink_calls(const mx_model *m, int i, int64_t *rows) {
    int64_t V = m->cfg.vocab_size, calls = 0;
    *rows = 0;
    if (!mxi_model_sinks_grad(m, i)) return 0;
    int64_t lm = mxi_model_lm_slice_rows(m), emb = slice_rows(m);
    if (i == m->lm_head) calls += (V + lm - 1) / lm, *rows += V;
    if (i == m->embed) calls += (V + emb - 1) / emb, *rows += V;
    return calls;
}

int mxi_model_set_hooks(mx_model *m, const mxi_model_hooks *hooks) {
    m->hooks = *hooks;
    free(m->sink_dw), free(m->sink_row);
    m->sink_dw = m->sink_row = NULL;
    if (!hooks->add_grad) return MX_OK;
    int64_t elems = sink_elems(m, &m->sink_rows);
    m->sink_dw = malloc((size_t)elems * sizeof(float));
    m->sink_row = malloc((size_t)m->cfg.hidden_size * sizeof(float));
    return m->sink_dw && m->sink_row ? MX_OK : MX_ENOMEM;
}

bool mxi_model_sinks_grad(const mx_model *m, int i) {
    if (i == m->lm_head) return !m->lm_head_mx;   // tied: the embedding's too
    if (i == m->embed) return true;
    int l = m->params[i].unit - 1;   // a dense block's products: one weight gradient each a backward
    if (l < 0 || l >= m->cfg.num_hidden_layers) return false;
    const layer_offsets *o = &m->layers[l];
    int dense[] = {o->q, o->k, o->v, o->o, o->gate, o->up, o->down};
    for (int k = 0; k < 7; k++)
        if (i == dense[k]) return true;
    return false;
}

bool mxi_model_vocab_table(const mx_model *m, int i) { return i == m->embed || i == m->lm_head; }

uint64_t mxi_model_sink_bytes(const mx_model *m) {
    return (uint64_t)(sink_elems(m, NULL) + m->cfg.hidden_size) * sizeof(float);
}
void mxi_model_bind_tensor(mx_model *m, int i, float *w, float *g) { m->tw[i] = w, m->tg[i] = g, m->tw16[i] = NULL; }
void mxi_model_bind_tensor_bf16(mx_model *m, int i, const uint16_t *w) { m->tw[i] = NULL, m->tw16[i] = w; }

bool mxi_model_takes_bf16(const mx_model *m, int i) {
    // the vocabulary-sized tables: an embedding lookup widens rows, lm_head's products read
    // bf16 operands (not converted: a converted lm_head quantizes from fp32)
    return (i == m->embed || i == m->lm_head) && !m->lm_head_mx;
}
void mxi_model_bind_planes(mx_model *m, int i, const mxi_mx_weight *planes) { m->wq[i] = planes; }

void mxi_model_weights_bf16(mx_model *m, bool yes) { mxi_linear_ctx_weights_bf16(m->lin, yes); }

void mx_model_round_weights_bf16(mx_model *m, bool mx_from_fp32) {
    if (!m->w) return;
    for (int i = 0; i < m->n_params; i++) {
        mxi_tensor_shape t = mxi_model_tensor_shape(m, i);
        if (!(mx_from_fp32 && t.converted)) mxi_bf16_round_f32(m->w + t.offset, m->w + t.offset, t.groups * t.rows * t.cols);
    }
    mxi_model_weights_bf16(m, true);
}

void mxi_model_hf_slice(const mx_model *m, int hf_index, int *tensor, int64_t *within) {
    *tensor = m->hf[hf_index].tensor, *within = m->hf[hf_index].within;
}

void mxi_model_hf_range(const mx_model *m, int tensor, int *first, int *end) {
    *first = m->hf_first[tensor], *end = m->hf_first[tensor + 1];
}
