/* The model's modules by fully qualified name, for the quantization plan, and the plan's
 * conversions applied to the model. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_internal.h"

static int push_module(mx_module *list, int *n, mx_module_kind kind, const char *fmt, int layer) {
    char name[128];
    snprintf(name, sizeof name, fmt, layer);
    char *copy = malloc(strlen(name) + 1);
    if (!copy) return MX_ENOMEM;
    strcpy(copy, name);
    list[*n].fqn = copy;
    list[*n].kind = kind;
    (*n)++;
    return MX_OK;
}

int mx_model_modules(const mx_model_config *c, mx_module **out, int *count) {
    if (!c || !out || !count) return MX_ENULL;
    *out = NULL, *count = 0;
    int L = c->num_hidden_layers;
    if (L < 0 || L > MX_MAX_LAYERS) return MX_EINVAL;
    mx_module *list = calloc(MX_MODULES_MAX(L), sizeof *list);
    if (!list) return MX_ENOMEM;
    int n = 0, rc = 0;
    const mx_module_kind LIN = MX_MODULE_LINEAR, OTH = MX_MODULE_OTHER;
    rc |= push_module(list, &n, OTH, "model.embed_tokens", 0);
    for (int l = 0; l < L && !rc; l++) {
        rc |= push_module(list, &n, OTH, "model.layers.%d.input_layernorm", l);
        rc |= push_module(list, &n, LIN, "model.layers.%d.self_attn.q_proj", l);
        rc |= push_module(list, &n, LIN, "model.layers.%d.self_attn.k_proj", l);
        rc |= push_module(list, &n, LIN, "model.layers.%d.self_attn.v_proj", l);
        if (c->type != MX_MODEL_LLAMA) {
            rc |= push_module(list, &n, OTH, "model.layers.%d.self_attn.q_norm", l);
            rc |= push_module(list, &n, OTH, "model.layers.%d.self_attn.k_norm", l);
        }
        rc |= push_module(list, &n, LIN, "model.layers.%d.self_attn.o_proj", l);
        rc |= push_module(list, &n, OTH, "model.layers.%d.post_attention_layernorm", l);
        if (mx_model_layer_is_moe(c, l)) {
            rc |= push_module(list, &n, LIN, "model.layers.%d.mlp.gate", l);
            rc |= push_module(list, &n, MX_MODULE_EXPERTS, "model.layers.%d.mlp.experts", l);
        } else {
            rc |= push_module(list, &n, LIN, "model.layers.%d.mlp.gate_proj", l);
            rc |= push_module(list, &n, LIN, "model.layers.%d.mlp.up_proj", l);
            rc |= push_module(list, &n, LIN, "model.layers.%d.mlp.down_proj", l);
        }
    }
    rc |= push_module(list, &n, OTH, "model.norm", 0);
    if (!c->tie_word_embeddings) rc |= push_module(list, &n, LIN, "lm_head", 0);
    if (rc) {
        mx_model_modules_free(list, n);
        return MX_ENOMEM;
    }
    *out = list, *count = n;
    return MX_OK;
}

void mx_model_modules_free(mx_module *modules, int count) {
    if (!modules) return;
    for (int i = 0; i < count; i++) free((char *)modules[i].fqn);
    free(modules);
}

int mxi_model_apply_plan(mx_model *m, const mx_plan *plan, mx_diag *diag) {
    if (!plan || !plan->enabled) return MX_OK;
    // the plan only lets implemented recipes through: dynamic mx (blocks 1-1-32 or 1-32-32),
    // per_tensor (dynamic, delayed), dynamic per_channel and dynamic per_block (1-128-128)
    mx_granularity g = plan->recipe.granularity;
    bool mx = g == MX_GRANULARITY_MX;
    m->mx_spec = (mxi_linear_mx){.inputs = plan->recipe.inputs, .weight = plan->recipe.weight,
                                 .grads = plan->recipe.grads,
                                 .scaling = mx ? MXI_SCALE_BLOCKS : g == MX_GRANULARITY_PER_CHANNEL ? MXI_SCALE_ROWS
                                          : g == MX_GRANULARITY_PER_BLOCK ? MXI_SCALE_BLOCKS128 : MXI_SCALE_TENSOR,
                                 .mode = plan->scale_mode, .tmode = plan->tensor_scale_mode,
                                 .weight_tiles = mx && plan->recipe.block[1] == 32,
                                 .dgrad_weight_tensor = plan->recipe.dgrad_weight_per_tensor,
                                 .high_precision = plan->high_precision_gemms};
    mx_module *mods = NULL;
    int n = 0;
    mx_selection sel;
    if (mx_model_modules(&m->cfg, &mods, &n) || mx_plan_select(plan, mods, n, &sel)) {
        mx_model_modules_free(mods, n);
        return mxi_diag(diag, MX_ENOMEM, "out of memory selecting the modules the plan converts (a list of %zu bytes, "
                        "then their names and decisions)", MX_MODULES_MAX(m->cfg.num_hidden_layers) * sizeof *mods);
    }
    for (int i = 0; i < n; i++) {
        if (!sel.decisions[i].converted) continue;
        m->n_converted++;
        const char *fqn = mods[i].fqn;
        if (strcmp(fqn, "lm_head") == 0) {
            m->lm_head_mx = &m->mx_spec;
            continue;
        }
        int l, used = 0;
        if (sscanf(fqn, "model.layers.%d.%n", &l, &used) != 1 || used == 0 || l < 0 || l >= m->cfg.num_hidden_layers)
            continue;
        const char *rest = fqn + used;
        layer_mx *x = &m->mx[l];
        const mxi_linear_mx *spec = &m->mx_spec;
        if (!strcmp(rest, "self_attn.q_proj")) x->q = spec;
        else if (!strcmp(rest, "self_attn.k_proj")) x->k = spec;
        else if (!strcmp(rest, "self_attn.v_proj")) x->v = spec;
        else if (!strcmp(rest, "self_attn.o_proj")) x->o = spec;
        else if (!strcmp(rest, "mlp.gate_proj")) x->gate = spec;
        else if (!strcmp(rest, "mlp.up_proj")) x->up = spec;
        else if (!strcmp(rest, "mlp.down_proj")) x->down = spec;
        else if (!strcmp(rest, "mlp.gate")) x->router = spec;
        else if (!strcmp(rest, "mlp.experts")) x->experts = spec;
    }
    mx_selection_free(&sel);
    mx_model_modules_free(mods, n);
    for (int l = 0; l < m->cfg.num_hidden_layers; l++) {
        const layer_mx *x = &m->mx[l];
        const layer_offsets *o = &m->layers[l];
        const struct { const mxi_linear_mx *spec; int tensor; } marks[] = {
            {x->q, o->q}, {x->k, o->k}, {x->v, o->v}, {x->o, o->o}, {x->gate, o->gate}, {x->up, o->up},
            {x->down, o->down}, {x->router, o->router}, {x->experts, o->experts_gate_up}, {x->experts, o->experts_down}};
        for (size_t i = 0; i < sizeof marks / sizeof marks[0]; i++)
            if (marks[i].spec && marks[i].tensor >= 0) m->wq_converted[marks[i].tensor] = true;
    }
    if (m->lm_head_mx) m->wq_converted[m->lm_head] = true;
    if (plan->recipe.strategy != MX_STRATEGY_DELAYED) return MX_OK;
    // delayed scaling: slots for every converted tensor, one triple per expert of a fused one
    int64_t *groups = calloc((size_t)m->n_params + 1, sizeof *groups);
    int rc = groups ? MX_OK : MX_ENOMEM;
    for (int i = 0; groups && i < m->n_params; i++)
        groups[i] = !m->wq_converted[i] ? 0 : m->params[i].kind == P_EXPERTS ? m->params[i].shape[0] : 1;
    if (!rc) rc = mxi_delayed_create(&m->delayed, plan, m->n_params, groups);
    free(groups);
    if (rc)
        return mxi_diag(diag, MX_ENOMEM, "out of memory for the delayed scaling state (%d floats of amax history "
                        "per tensor and role)", plan->amax_history_len);
    return MX_OK;
}

mxi_delayed *mxi_model_delayed(mx_model *m) { return m->delayed; }

mxi_quant_stats *mxi_model_quant_stats(mx_model *m) { return m->qstats; }

int64_t mxi_model_expert_base(const mx_model *m, int tensor) {
    int l = m->params[tensor].unit - 1;
    if (m->params[tensor].kind != P_EXPERTS || l < 0 || !m->local_experts || !m->ep_layer[l]) return 0;
    return (int64_t)m->ep.rank * (m->cfg.num_experts / m->ep_size);
}

int mx_model_converted_modules(const mx_model *m) { return m->n_converted; }

