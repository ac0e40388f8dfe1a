/* The model's tensor table: every parameter in Hugging Face's module order, its FSDP unit
 * and flat offset; the Hugging Face checkpoint names (fused experts as per-expert slices);
 * views of the tensors and their initialisation. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "model/model_internal.h"

static int add_param(mx_model *m, const char *module, const char *suffix, param_kind kind, int ndim, int64_t d0,
                     int64_t d1, int64_t d2) {
    int index = m->n_params;
    param_info *p = &m->params[m->n_params++];
    snprintf(p->module, sizeof p->module, "%s", module);
    snprintf(p->name, sizeof p->name, "%s%s", module, suffix);
    p->kind = kind;
    p->ndim = ndim;
    p->shape[0] = d0, p->shape[1] = d1, p->shape[2] = d2;
    p->numel = d0 * (ndim > 1 ? d1 : 1) * (ndim > 2 ? d2 : 1);
    // units (model/units.h): blocks 1..L, the embedding L + 1 unless lm_head shares it, the root 0
    bool own_embedding = strcmp(module, "model.embed_tokens") == 0 && !m->cfg.tie_word_embeddings;
    p->unit = strncmp(module, "model.layers.", 13) == 0 ? atoi(module + 13) + 1
            : own_embedding ? m->cfg.num_hidden_layers + 1 : 0;
    return index;
}

/* Flat offsets unit by unit (the root first), so that each unit is one contiguous range. */
static void assign_offsets(mx_model *m) {
    m->n_units = m->cfg.num_hidden_layers + 1 + !m->cfg.tie_word_embeddings;
    m->num_params = 0;
    for (int u = 0; u < m->n_units; u++)
        for (int i = 0; i < m->n_params; i++)
            if (m->params[i].unit == u) m->params[i].offset = m->num_params, m->num_params += m->params[i].numel;
}


/* Every tensor in Hugging Face's module order; m->params has room for all of them. */
void mxi_model_layout_params(mx_model *m) {
    const mx_model_config *c = &m->cfg;
    int64_t C = c->hidden_size, V = c->vocab_size, HD = c->head_dim, QD = m->QD, KVD = m->KVD;
    int64_t F = c->intermediate_size, E = c->num_experts, FE = c->moe_intermediate_size;
    bool qk_norm = c->type != MX_MODEL_LLAMA, bias = c->attention_bias;
    char mod[112];
    m->n_params = 0;
    m->num_params = 0;
    m->embed = add_param(m, "model.embed_tokens", ".weight", P_EMBED, 2, V, C, 0);
    for (int l = 0; l < c->num_hidden_layers; l++) {
        layer_offsets *o = &m->layers[l];
        memset(o, 0xFF, sizeof *o);   // -1 everywhere
#define MOD(fmt) (snprintf(mod, sizeof mod, "model.layers.%d." fmt, l), mod)
        o->ln1 = add_param(m, MOD("input_layernorm"), ".weight", P_NORM, 1, C, 0, 0);
        o->q = add_param(m, MOD("self_attn.q_proj"), ".weight", P_LINEAR, 2, QD, C, 0);
        if (bias) o->q_b = add_param(m, MOD("self_attn.q_proj"), ".bias", P_BIAS, 1, QD, 0, 0);
        o->k = add_param(m, MOD("self_attn.k_proj"), ".weight", P_LINEAR, 2, KVD, C, 0);
        if (bias) o->k_b = add_param(m, MOD("self_attn.k_proj"), ".bias", P_BIAS, 1, KVD, 0, 0);
        o->v = add_param(m, MOD("self_attn.v_proj"), ".weight", P_LINEAR, 2, KVD, C, 0);
        if (bias) o->v_b = add_param(m, MOD("self_attn.v_proj"), ".bias", P_BIAS, 1, KVD, 0, 0);
        o->o = add_param(m, MOD("self_attn.o_proj"), ".weight", P_LINEAR, 2, C, QD, 0);
        if (bias) o->o_b = add_param(m, MOD("self_attn.o_proj"), ".bias", P_BIAS, 1, C, 0, 0);
        if (qk_norm) {
            o->q_norm = add_param(m, MOD("self_attn.q_norm"), ".weight", P_NORM, 1, HD, 0, 0);
            o->k_norm = add_param(m, MOD("self_attn.k_norm"), ".weight", P_NORM, 1, HD, 0, 0);
        }
        o->ln2 = add_param(m, MOD("post_attention_layernorm"), ".weight", P_NORM, 1, C, 0, 0);
        if (mx_model_layer_is_moe(c, l)) {
            o->router = add_param(m, MOD("mlp.gate"), ".weight", P_LINEAR, 2, E, C, 0);
            o->experts_gate_up = add_param(m, MOD("mlp.experts"), ".gate_up_proj", P_EXPERTS, 3, E, 2 * FE, C);
            o->experts_down = add_param(m, MOD("mlp.experts"), ".down_proj", P_EXPERTS, 3, E, C, FE);
        } else {
            o->gate = add_param(m, MOD("mlp.gate_proj"), ".weight", P_LINEAR, 2, F, C, 0);
            o->up = add_param(m, MOD("mlp.up_proj"), ".weight", P_LINEAR, 2, F, C, 0);
            o->down = add_param(m, MOD("mlp.down_proj"), ".weight", P_LINEAR, 2, C, F, 0);
        }
#undef MOD
    }
    m->final_norm = add_param(m, "model.norm", ".weight", P_NORM, 1, C, 0, 0);
    m->lm_head = c->tie_word_embeddings ? m->embed : add_param(m, "lm_head", ".weight", P_LINEAR, 2, V, C, 0);
    assign_offsets(m);
}

/* Hugging Face names: fused expert tensors become per-expert slices (rows of gate_up are
 * gate_proj then up_proj for each expert; down_proj is one (C, FE) matrix per expert). */
int mxi_model_build_hf_table(mx_model *m) {
    int n = 0;
    for (int i = 0; i < m->n_params; i++) n += m->params[i].kind == P_EXPERTS ? m->cfg.num_experts * 2 : 1;
    m->hf = calloc((size_t)n, sizeof *m->hf);
    m->hf_first = calloc((size_t)m->n_params + 1, sizeof *m->hf_first);
    if (!m->hf || !m->hf_first) return MX_ENOMEM;
    m->n_hf = 0;
    for (int i = 0; i < m->n_params; i++) {
        const param_info *p = &m->params[i];
        m->hf_first[i] = m->n_hf;
        if (p->kind != P_EXPERTS) {
            m->hf[m->n_hf] = *p;
            m->hf[m->n_hf].tensor = i, m->hf[m->n_hf++].within = 0;
            continue;
        }
        bool gate_up = strstr(p->name, ".gate_up_proj") != NULL;
        int64_t rows = gate_up ? p->shape[1] / 2 : p->shape[1], cols = p->shape[2];
        for (int e = 0; e < p->shape[0]; e++)
            for (int half = 0; half < (gate_up ? 2 : 1); half++) {
                param_info *h = &m->hf[m->n_hf++];
                const char *proj = gate_up ? (half ? "up_proj" : "gate_proj") : "down_proj";
                // names are far below the buffer sizes: FQNs of at most MX_MAX_LAYERS layers
                if (snprintf(h->module, sizeof h->module, "%s.%d.%s", p->module, e, proj) < 0 ||
                    snprintf(h->name, sizeof h->name, "%s.weight", h->module) < 0)
                    return MX_EINVAL;
                h->kind = P_LINEAR;
                h->ndim = 2;
                h->shape[0] = rows, h->shape[1] = cols;
                h->numel = rows * cols;
                h->within = ((int64_t)e * (gate_up ? 2 : 1) + half) * rows * cols;
                h->offset = p->offset + h->within;
                h->tensor = i;
                h->unit = p->unit;
            }
    }
    m->hf_first[m->n_params] = m->n_hf;
    return MX_OK;
}

int mx_model_num_tensors(const mx_model *m) { return m->n_params; }
int64_t mx_model_num_params(const mx_model *m) { return m->num_params; }
float *mx_model_params(mx_model *m) { return m->w; }
float *mx_model_grads(mx_model *m) { return m->g; }

static mx_tensor_view view_of(const mx_model *m, const param_info *p) {
    mx_tensor_view v = {0};
    v.name = p->name, v.module = p->module, v.ndim = p->ndim, v.numel = p->numel;
    memcpy(v.shape, p->shape, sizeof v.shape);
    if (m->w) v.data = m->w + p->offset, v.grad = m->g + p->offset;
    return v;
}

mx_tensor_view mx_model_tensor(const mx_model *m, int i) {
    if (i < 0 || i >= m->n_params) return (mx_tensor_view){0};
    return view_of(m, &m->params[i]);
}

int mx_model_num_hf_tensors(const mx_model *m) { return m->n_hf; }

mx_tensor_view mx_model_hf_tensor(const mx_model *m, int i) {
    if (i < 0 || i >= m->n_hf) return (mx_tensor_view){0};
    return view_of(m, &m->hf[i]);
}

void mx_model_zero_grad(mx_model *m) {
    if (m->g) memset(m->g, 0, (size_t)m->num_params * sizeof(float));
}

/* ---- initialisation ---- */

void mxi_model_init_tensor(const mx_model *m, int i, uint64_t seed, float *w) {
    const param_info *p = &m->params[i];
    float std = m->cfg.initializer_range;
    // each tensor its own stream, so the values do not depend on the other tensors
    uint64_t s = seed ^ (0xD1B54A32D192ED03ull * (uint64_t)(i + 1));
    for (int64_t j = 0; j < p->numel; j++) {
        if (p->kind == P_NORM) {
            w[j] = 1.0f;
        } else if (p->kind == P_BIAS) {
            w[j] = 0.0f;
        } else {
            w[j] = (float)mxi_rng_normal(&s, std);
        }
    }
}

void mx_model_init(mx_model *m, uint64_t seed) {
    if (!m->w) return;
    for (int i = 0; i < m->n_params; i++) mxi_model_init_tensor(m, i, seed, m->w + m->params[i].offset);
}

