/* Phase 4 of loading the config, once every value is converted: required keys, derived
 * values (head_dim, rope_theta from rope_parameters), and the checks across keys. An error
 * about a key's final value points where that value came from (mxi_fail_key). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "config/config_internal.h"
#include "core/diag.h"
#include "mxtrain/tokens.h"

int mxi_config_check_required(mxi_loader *ld) {
    char allowed[MXI_LIST_SIZE];
    int hf = mxi_key_find("model.model_name_or_path");
    for (int id = 0; id < mxi_n_keys; id++) {
        if (!(mxi_keys[id].flags & MXI_FLAG_REQUIRED) || ld->slots[id].set) continue;
        int parent = mxi_key_parent(id);
        if (parent >= 0 && !ld->slots[parent].set) continue; /* reported for the section */
        if (mxi_keys[id].type == MXI_KEY_SECTION)
            return mxi_diag(ld->diag, MX_ECONFIG, "%s: %s: required section missing (allowed: %s)", ld->source,
                            mxi_keys[id].path, mxi_keys[id].allowed);
        if (parent == mxi_key_find("model") && ld->slots[hf].set)
            return mxi_fail_key(ld, MX_ECONFIG, id, "required key missing, both here and in %s (allowed: %s)",
                                ld->cfg->hf_config_path, mxi_key_allowed(id, allowed, sizeof allowed));
        return mxi_fail_key(ld, MX_ECONFIG, id, "required key missing (allowed: %s)",
                            mxi_key_allowed(id, allowed, sizeof allowed));
    }
    return 0;
}

/* rope_parameters.rope_theta (transformers 5's spelling) is rope_theta. Given both, the
 * YAML file's wins over config.json's; from the same file they must agree. */
static int resolve_rope_theta(mxi_loader *ld) {
    mx_model_config *m = &ld->cfg->model;
    char note[MXI_PATH_SIZE];
    int rp = mxi_key_find("model.rope_parameters"), rt = mxi_key_find("model.rope_theta");
    if (isnan(ld->rope_params_theta)) return 0;
    const mxi_slot *p = &ld->slots[rp], *t = &ld->slots[rt];
    bool p_yaml = p->key != NULL, t_yaml = t->key != NULL;
    if (t->set && t_yaml == p_yaml && (float)ld->rope_params_theta != m->rope_theta) {
        char a[64], b[64];
        return mxi_fail_key(ld, MX_ECONFIG, rp, "its rope_theta %s disagrees with rope_theta %s%s (allowed: the same "
                                                "value, or only one of them)",
                            mxi_format_double(ld->rope_params_theta, a, sizeof a),
                            mxi_format_float(m->rope_theta, b, sizeof b),
                            mxi_origin_note(ld, rt, note, sizeof note));
    }
    if (!t->set || (p_yaml && !t_yaml)) {
        m->rope_theta = (float)ld->rope_params_theta;
        ld->cfg->origins[rt] = ld->cfg->origins[rp];
    }
    return 0;
}

static int check_model(mxi_loader *ld) {
    mx_model_config *m = &ld->cfg->model;
    char note[MXI_PATH_SIZE], path[MXI_PATH_SIZE];
    int nh = mxi_key_find("model.num_attention_heads"), nkv = mxi_key_find("model.num_key_value_heads"),
        hd = mxi_key_find("model.head_dim"), e = mxi_key_find("model.num_experts"),
        k = mxi_key_find("model.num_experts_per_tok"), mlp = mxi_key_find("model.mlp_only_layers");
    /* Llama's rule: num_key_value_heads defaults to num_attention_heads, head_dim to
     * hidden_size / num_attention_heads. */
    if (!ld->cfg->origins[nkv].kind) m->num_key_value_heads = m->num_attention_heads;
    if (!ld->cfg->origins[hd].kind) {
        if (m->hidden_size % m->num_attention_heads != 0)
            return mxi_fail_key(ld, MX_ECONFIG, nh, "%d does not divide hidden_size %d, and head_dim is not given "
                                                    "(allowed: a divisor of hidden_size, or give head_dim)",
                                m->num_attention_heads, m->hidden_size);
        m->head_dim = m->hidden_size / m->num_attention_heads;
    }
    /* Rotary embeddings turn pairs of channels: a head needs an even number of them. */
    if (m->head_dim % 2 != 0) {
        if (ld->cfg->origins[hd].kind)
            return mxi_fail_key(ld, MX_ECONFIG, hd, "%d is odd (allowed: an even number: rotary embeddings rotate "
                                "pairs of channels)", m->head_dim);
        return mxi_fail_key(ld, MX_ECONFIG, nh, "%d gives head_dim %d = hidden_size %d / %d, which is odd (allowed: an "
                            "even head_dim: rotary embeddings rotate pairs of channels; give head_dim)",
                            m->num_attention_heads, m->head_dim, m->hidden_size, m->num_attention_heads);
    }
    if (m->num_attention_heads % m->num_key_value_heads != 0)
        return mxi_fail_key(ld, MX_ECONFIG, nkv, "%d does not divide num_attention_heads %d%s (allowed: a divisor of "
                                                 "num_attention_heads)",
                            m->num_key_value_heads, m->num_attention_heads, mxi_origin_note(ld, nh, note, sizeof note));
    if (m->type == MX_MODEL_QWEN3_MOE && m->num_experts_per_tok > m->num_experts) {
        if (ld->slots[k].set)
            return mxi_fail_key(ld, MX_ECONFIG, k, "%d is more than num_experts %d%s (allowed: 1 to num_experts)",
                                m->num_experts_per_tok, m->num_experts, mxi_origin_note(ld, e, note, sizeof note));
        return mxi_fail_key(ld, MX_ECONFIG, e, "%d is less than num_experts_per_tok %d%s (allowed: at least "
                                               "num_experts_per_tok)",
                            m->num_experts, m->num_experts_per_tok, mxi_origin_note(ld, k, note, sizeof note));
    }
    /* mlp_only_layers entries must name layers that exist. */
    const mxi_slot *s = &ld->slots[mlp];
    if (s->set && mxi_value_kind(s->v) == MXI_YAML_SEQ) {
        for (size_t i = 0; i < mxi_value_count(s->v); i++) {
            mxi_value item = mxi_value_item(s->v, i);
            long long x = 0;
            mxi_value_int(item, &x);
            snprintf(path, sizeof path, "%s[%zu]", mxi_keys[mlp].path, i);
            if (x >= m->num_hidden_layers)
                return mxi_fail_value(ld, MX_ECONFIG, item, path, "%lld is not a layer (allowed: 0 to %d: "
                                                                  "num_hidden_layers is %d)",
                                      x, m->num_hidden_layers - 1, m->num_hidden_layers);
        }
    }
    return 0;
}

/* The model layer's own limits (mx_model_config_check: sizes it can allocate, ...), so that
 * a model it would refuse is refused here, at the line of the key. Its messages begin with
 * "model.KEY: "; the key's origin replaces that with the usual location. */
static int check_model_limits(mxi_loader *ld) {
    mx_diag sub = {{0}};
    int rc = mx_model_config_check(&ld->cfg->model, &sub);
    if (rc == 0) return 0;
    const char *colon = strstr(sub.msg, ": ");
    int id = -1;
    if (colon && (size_t)(colon - sub.msg) < MXI_PATH_SIZE) {
        char path[MXI_PATH_SIZE];
        memcpy(path, sub.msg, (size_t)(colon - sub.msg));
        path[colon - sub.msg] = '\0';
        id = mxi_key_find(path);
    }
    if (id >= 0) return mxi_fail_key(ld, rc, id, "%s", colon + 2);
    return mxi_diag(ld->diag, rc, "%s: %s", ld->source, sub.msg);
}

int64_t mx_training_decay_steps(const mx_training_config *tc) {
    return tc->lr_decay_iters > 0 ? tc->lr_decay_iters : tc->train_iters;
}

int64_t mx_training_warmup_steps(const mx_training_config *tc) {
    if (tc->lr_warmup_iters >= 0) return tc->lr_warmup_iters;
    return llround(tc->lr_warmup_ratio * (double)mx_training_decay_steps(tc));
}

/* The learning-rate schedule's keys: each one given does something (docs/config.md). */
static int check_schedule(mxi_loader *ld) {
    mx_training_config *tc = &ld->cfg->training;
    int iters = mxi_key_find("training.lr_warmup_iters"), ratio = mxi_key_find("training.lr_warmup_ratio"),
        style = mxi_key_find("training.lr_decay_style"), wsd_style = mxi_key_find("training.lr_wsd_decay_style"),
        wsd_iters = mxi_key_find("training.lr_wsd_decay_iters");
    char note[MXI_PATH_SIZE];
    if (ld->slots[iters].set && ld->slots[ratio].set)
        return mxi_fail_key(ld, MX_ECONFIG, iters, "%d is given with training.lr_warmup_ratio%s (allowed: one of the "
                            "two)", tc->lr_warmup_iters, mxi_origin_note(ld, ratio, note, sizeof note));
    int D = (int)mx_training_decay_steps(tc);
    const char *d_name = tc->lr_decay_iters > 0 ? "lr_decay_iters" : "train_iters";
    if (tc->lr_warmup_iters > D)
        return mxi_fail_key(ld, MX_ECONFIG, iters, "%d is more than %s %d (allowed: 0 to %d)", tc->lr_warmup_iters,
                            d_name, D, D);
    if (tc->lr_decay_style != MX_LR_WSD) {
        int given = ld->slots[wsd_style].set ? wsd_style : ld->slots[wsd_iters].set ? wsd_iters : -1;
        if (given >= 0)
            return mxi_fail_key(ld, MX_ECONFIG, given, "given, but lr_decay_style is not WSD (allowed: leave it out, "
                                "or set lr_decay_style: WSD)");
        return MX_OK;
    }
    int W = (int)mx_training_warmup_steps(tc);
    if (!ld->slots[wsd_iters].set)
        return mxi_fail_key(ld, MX_ECONFIG, style, "WSD needs training.lr_wsd_decay_iters, the steps of its anneal "
                                                   "(allowed: give lr_wsd_decay_iters, or another style)");
    if (tc->lr_wsd_decay_iters > D - W)
        return mxi_fail_key(ld, MX_ECONFIG, wsd_iters, "%d is more than the %d steps after warmup (%s %d - %d warmup; "
                            "allowed: 1 to %d)", tc->lr_wsd_decay_iters, D - W, d_name, D, W, D - W);
    return MX_OK;
}

static int check_ep_plan(mxi_loader *ld);
static int check_rest(mxi_loader *ld) {
    mx_config *cfg = ld->cfg;
    char note[MXI_PATH_SIZE];
    int seq = mxi_key_find("data.seq_length"), maxpos = mxi_key_find("model.max_position_embeddings"),
        min_lr = mxi_key_find("training.min_lr"), lr = mxi_key_find("training.lr"),
        save_interval = mxi_key_find("training.save_interval"), mbs = mxi_key_find("training.micro_batch_size");
    if (cfg->data.seq_length > cfg->model.max_position_embeddings)
        return mxi_fail_key(ld, MX_ECONFIG, seq, "%d is more than model.max_position_embeddings %d%s (allowed: 1 to "
                            "%d)", cfg->data.seq_length, cfg->model.max_position_embeddings,
                            mxi_origin_note(ld, maxpos, note, sizeof note), cfg->model.max_position_embeddings);
    int64_t tokens = (int64_t)cfg->training.micro_batch_size * cfg->data.seq_length;
    if (tokens > MX_MAX_BATCH_TOKENS)
        return mxi_fail_key(ld, MX_ECONFIG, mbs, "%d x data.seq_length %d%s = %lld tokens per micro-batch (allowed: at "
                            "most %d = 2^24 tokens)", cfg->training.micro_batch_size, cfg->data.seq_length,
                            mxi_origin_note(ld, seq, note, sizeof note), (long long)tokens, MX_MAX_BATCH_TOKENS);
    int gbs = mxi_key_find("training.global_batch_size"), accum = mxi_key_find("training.gradient_accumulation_steps");
    const mx_training_config *tc = &cfg->training;
    long long per = ld->slots[accum].set ? (long long)tc->micro_batch_size * tc->gradient_accumulation_steps
                                         : tc->micro_batch_size;   // what divides it on any number of ranks
    if (tc->global_batch_size && tc->global_batch_size % per) {
        char by[80] = "";
        if (ld->slots[accum].set) snprintf(by, sizeof by, " x gradient_accumulation_steps %d = %lld",
                                           tc->gradient_accumulation_steps, per);
        return mxi_fail_key(ld, MX_ECONFIG, gbs, "%d is not a multiple of micro_batch_size %d%s (allowed: a multiple "
                            "of %lld x the ranks)", tc->global_batch_size, tc->micro_batch_size, by, per);
    }
    if (cfg->training.min_lr > cfg->training.lr) {
        char a[64], b[64];
        return mxi_fail_key(ld, MX_ECONFIG, min_lr, "%s is more than lr %s%s (allowed: 0 to lr)",
                            mxi_format_double(cfg->training.min_lr, a, sizeof a),
                            mxi_format_double(cfg->training.lr, b, sizeof b),
                            mxi_origin_note(ld, lr, note, sizeof note));
    }
    if (cfg->training.save_interval > 0 && !cfg->training.save)
        return mxi_fail_key(ld, MX_ECONFIG, save_interval, "%d needs training.save, the checkpoint directory (allowed: "
                            "0 without save, or give save)", cfg->training.save_interval);
    int keep = mxi_key_find("training.keep_latest_k");
    if (cfg->training.keep_latest_k > 0 && !cfg->training.save)
        return mxi_fail_key(ld, MX_ECONFIG, keep, "%d needs training.save, the checkpoint directory (allowed: 0 "
                            "without save, or give save)", cfg->training.keep_latest_k);
    int rc = check_schedule(ld);
    if (rc) return rc;
    // evaluation settings without validation data would be ignored: say so instead
    int eval_interval = mxi_key_find("training.eval_interval"), eval_iters = mxi_key_find("training.eval_iters");
    if (cfg->data.n_val_data_path == 0 && cfg->training.eval_interval > 0)
        return mxi_fail_key(ld, MX_ECONFIG, eval_interval, "%d needs data.val_data_path, the validation shards "
                            "(allowed: 0 without val_data_path, or give data.val_data_path)",
                            cfg->training.eval_interval);
    if (cfg->data.n_val_data_path == 0 && ld->slots[eval_iters].set)
        return mxi_fail_key(ld, MX_ECONFIG, eval_iters, "%d needs data.val_data_path, the validation shards (allowed: "
                            "leave eval_iters out without val_data_path, or give data.val_data_path)",
                            cfg->training.eval_iters);
    // a granularity without recompute would do nothing: say so (Megatron's flag alone turns it on)
    int granularity = mxi_key_find("features.recompute_granularity");
    if (ld->slots[granularity].set && !cfg->features.recompute)
        return mxi_fail_key(ld, MX_ECONFIG, granularity, "given, but features.recompute is false (allowed: leave it "
                            "out, or set features.recompute: true)");
    int plot_path = mxi_key_find("training.plot_path");
    if (cfg->training.plot_path && !cfg->training.metrics_path)
        return mxi_fail_key(ld, MX_ECONFIG, plot_path, "'%s' needs training.metrics_path, the metrics it draws "
                            "(allowed: leave plot_path out, or give metrics_path)", cfg->training.plot_path);
    return check_ep_plan(ld);
}

/* parallel.ep_plan: only with EP on an MoE model; every apply_modules pattern selects the
 * experts of an MoE layer (itself or an ancestor, SPEC §3); mxfp8 dispatch needs every
 * selected layer's experts converted by the quantization plan. */
static int check_ep_plan(mxi_loader *ld) {
    mx_config *cfg = ld->cfg;
    const mx_parallel_config *pc = &cfg->parallel;
    static const char *const names[] = {"parallel.ep_plan.apply_modules", "parallel.ep_plan.dispatcher",
                                        "parallel.ep_plan.dispatch_dtype", "parallel.ep_plan.overlap",
                                        "parallel.ep_plan"};   // a key it holds first
    int given = -1;
    for (int i = 0; i < 5 && given < 0; i++)
        if (ld->slots[mxi_key_find(names[i])].set) given = mxi_key_find(names[i]);
    if (given < 0) return 0;
    if (cfg->model.type != MX_MODEL_QWEN3_MOE)
        return mxi_fail_key(ld, MX_ECONFIG, given, "given for a dense model (model.model_type is not qwen3_moe; "
                            "allowed: leave parallel.ep_plan out)");
    if (pc->expert_parallel_size <= 1)
        return mxi_fail_key(ld, MX_ECONFIG, given, "given with parallel.expert_parallel_size 1, where no token leaves "
                            "its rank (allowed: leave parallel.ep_plan out, or set parallel.expert_parallel_size > 1)");
    mx_module *mods = NULL;
    int n = 0;
    if (mx_model_modules(&cfg->model, &mods, &n))
        return mxi_fail_oom(ld, MX_MODULES_MAX(cfg->model.num_hidden_layers) * sizeof *mods, "the model's module list");
    int rc = 0, apply = mxi_key_find("parallel.ep_plan.apply_modules");
    for (int p = 0; p < pc->n_ep_modules && !rc; p++) {
        const mx_plan_pattern *pat = &pc->ep_modules[p];
        int experts = 0, other = -1;
        size_t len = 0;   // of the module the pattern names: other's name or the ancestor matched
        for (int i = 0; i < n; i++) {
            if (mods[i].kind == MX_MODULE_EXPERTS) experts += mx_pattern_match_module(pat->compiled, mods[i].fqn, NULL);
            else if (other < 0 && mx_pattern_match_module(pat->compiled, mods[i].fqn, &len)) other = i;
        }
        if (experts) continue;
        if (other >= 0)
            rc = mxi_fail_key(ld, MX_ECONFIG, apply, "'%s' names %.*s, which is not an MoE expert module (allowed: "
                              "patterns selecting the MoE expert modules model.layers.N.mlp.experts, or their "
                              "ancestors such as model.layers.N)", pat->text, (int)len, mods[other].fqn);
        else
            rc = mxi_fail_key(ld, MX_ECONFIG, apply, "'%s' matches no module (allowed: patterns selecting the MoE "
                              "expert modules model.layers.N.mlp.experts, or their ancestors such as model.layers.N)",
                              pat->text);
    }
    if (!rc && pc->ep_dispatch_dtype == MX_EP_DISPATCH_MXFP8 &&
        cfg->training.quantization_plan.high_precision_gemms & MX_GEMM_FPROP)   // fprop reads the fp32 tokens
        rc = mxi_fail_key(ld, MX_ECONFIG, mxi_key_find("parallel.ep_plan.dispatch_dtype"),
                          "mxfp8 sends the experts' input quantized, but training.quantization_plan.high_precision_gemms "
                          "runs fprop unquantized (allowed: auto, fp32, bf16; or leave fprop out of high_precision_gemms)");
    if (!rc && pc->ep_dispatch_dtype == MX_EP_DISPATCH_MXFP8) {
        mx_selection sel;
        if (mx_plan_select(&cfg->training.quantization_plan, mods, n, &sel)) {
            mx_model_modules_free(mods, n);
            return mxi_fail_oom(ld, 0, "the quantization plan's selection of modules");
        }
        for (int i = 0; i < n && !rc; i++) {
            if (mods[i].kind != MX_MODULE_EXPERTS || sel.decisions[i].converted) continue;
            bool selected = false;
            for (int p = 0; p < pc->n_ep_modules; p++)
                selected |= mx_pattern_match_module(pc->ep_modules[p].compiled, mods[i].fqn, NULL);
            if (selected)
                rc = mxi_fail_key(ld, MX_ECONFIG, mxi_key_find("parallel.ep_plan.dispatch_dtype"),
                                  "mxfp8 sends the rowwise MXFP8 plane of converted experts' input, but %s is not "
                                  "converted by training.quantization_plan (allowed: auto, fp32, bf16; or convert the "
                                  "experts with quantize.moe.mx)", mods[i].fqn);
        }
        mx_selection_free(&sel);
    }
    mx_model_modules_free(mods, n);
    return rc;
}

/* Document masking: the EOD token inside the vocabulary; without data.eod_token_id, only
 * mxtrain prepare's byte-level vocabulary says which token ends a document. */
static int check_documents(mxi_loader *ld) {
    const mx_config *cfg = ld->cfg;
    const mx_data_config *d = &cfg->data;
    int eod = mxi_key_find("data.eod_token_id"), vocab = mxi_key_find("model.vocab_size");
    char note[MXI_PATH_SIZE];
    if (ld->slots[eod].set && d->eod_token_id >= cfg->model.vocab_size)
        return mxi_fail_key(ld, MX_ECONFIG, eod, "%d is not a token of model.vocab_size %d%s (allowed: 0 to %d)",
                            d->eod_token_id, cfg->model.vocab_size, mxi_origin_note(ld, vocab, note, sizeof note),
                            cfg->model.vocab_size - 1);
    const char *on = d->reset_attention_mask ? "data.reset_attention_mask"
                   : d->reset_position_ids ? "data.reset_position_ids"
                   : d->eod_mask_loss ? "data.eod_mask_loss" : NULL;
    if (on && !ld->slots[eod].set && cfg->model.vocab_size != MX_PREPARE_VOCAB)
        return mxi_fail_key(ld, MX_ECONFIG, mxi_key_find(on), "true needs data.eod_token_id, the end-of-document "
                            "token: model.vocab_size %d is not mxtrain prepare's byte-level vocabulary (%d, EOT %d) "
                            "(allowed: give data.eod_token_id, or false)", cfg->model.vocab_size, MX_PREPARE_VOCAB,
                            MX_PREPARE_EOT);
    return MX_OK;
}

int mxi_config_check(mxi_loader *ld) {
    int rc;
    if ((rc = resolve_rope_theta(ld)) || (rc = mxi_config_check_required(ld)) || (rc = check_model(ld)) ||
        (rc = check_model_limits(ld)) || (rc = check_rest(ld)) || (rc = check_documents(ld)))
        return rc;
    return 0;
}
