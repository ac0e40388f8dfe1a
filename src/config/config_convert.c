/* Phase 3 of loading the config: each collected value converted into its field of
 * mx_config, in file order, its type and range checked against the key table. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config_internal.h"
#include "core/diag.h"
#include "core/text.h"
#include "mxtrain/tokens.h"

static void *field(const mxi_loader *ld, int id) { return (char *)ld->cfg + mxi_keys[id].off; }

static int not_a(const mxi_loader *ld, int id, mxi_value v, const char *path, const char *what, bool quoted_fits) {
    char desc[MXI_DESC_SIZE], allowed[MXI_LIST_SIZE];
    mxi_value_describe(v, desc, sizeof desc);
    if (quoted_fits)
        return mxi_fail_value(ld, MX_ECONFIG, v, path, "%s is a quoted string, not %s (allowed: %s, unquoted)", desc,
                              what, mxi_key_allowed(id, allowed, sizeof allowed));
    return mxi_fail_value(ld, MX_ECONFIG, v, path, "%s is not %s (allowed: %s)", desc, what,
                          mxi_key_allowed(id, allowed, sizeof allowed));
}

static int out_of_range(const mxi_loader *ld, int id, mxi_value v, const char *path) {
    char text[MXI_QUOTE_SIZE], allowed[MXI_LIST_SIZE];
    return mxi_fail_value(ld, MX_ECONFIG, v, path, "%s is out of range (allowed: %s)",
                          mxi_value_text(v, text, sizeof text), mxi_key_allowed(id, allowed, sizeof allowed));
}

static int get_int(const mxi_loader *ld, int id, mxi_value v, const char *path, double lo, double hi, long long *out) {
    int rc = mxi_value_int(v, out);
    if (rc == -1) return not_a(ld, id, v, path, "an integer", mxi_value_quoted_int(v));
    if (rc == -2 || (double)*out < lo || (double)*out > hi) return out_of_range(ld, id, v, path);
    return 0;
}

static int get_number(const mxi_loader *ld, int id, mxi_value v, double *out) {
    const mxi_key_def *d = &mxi_keys[id];
    if (mxi_value_number(v, true, out)) return not_a(ld, id, v, d->path, "a number", mxi_value_quoted_number(v));
    double x = *out;
    bool ok = isfinite(x) && ((d->flags & MXI_FLAG_LO_OPEN) ? x > d->lo : x >= d->lo) &&
              ((d->flags & MXI_FLAG_HI_OPEN) ? x < d->hi : x <= d->hi);
    /* A float field must keep the value finite, and a positive one positive. */
    if (ok && d->type == MXI_KEY_F32)
        ok = isfinite((float)x) && !((d->flags & MXI_FLAG_LO_OPEN) && (float)x <= (float)d->lo);
    return ok ? 0 : out_of_range(ld, id, v, d->path);
}

static int get_bool(const mxi_loader *ld, int id, mxi_value v, const char *path, bool *out) {
    if (mxi_value_kind(v) != MXI_YAML_BOOL) return not_a(ld, id, v, path, "a boolean", mxi_value_quoted_bool(v));
    *out = mxi_value_bool(v);
    return 0;
}

/* A non-empty string without NUL bytes, for paths. */
static const char *get_path(mxi_value v) {
    const char *s = mxi_value_str(v);
    return s && *s ? s : NULL;
}

void mxi_config_free_strings(char **list, int n) {
    for (int i = 0; i < n; i++) free(list[i]);
    free(list);
}


/* data_path, val_data_path: one path or a list of them (at least one), replacing *list. */
/* A path, a list of paths, or Megatron's blend: a list whose first item is a number,
 * alternating weights (> 0) and paths, each path one dataset. */
static int convert_paths(mxi_loader *ld, int id, mxi_value v, char ***list, int *count, double **weights) {
    char desc[MXI_DESC_SIZE], path[MXI_PATH_SIZE];
    bool seq = mxi_value_kind(v) == MXI_YAML_SEQ;
    int items = seq ? (int)mxi_value_count(v) : 1;
    double first;
    bool blend = seq && items > 0 && !mxi_value_quoted(mxi_value_item(v, 0)) &&
                 mxi_value_number(mxi_value_item(v, 0), true, &first) == 0;
    if (!seq && !get_path(v))
        return mxi_fail_value(ld, MX_ECONFIG, v, mxi_keys[id].path, "%s is not a path (allowed: %s)",
                              mxi_value_describe(v, desc, sizeof desc), mxi_keys[id].allowed);
    if (items == 0)
        return mxi_fail_value(ld, MX_ECONFIG, v, mxi_keys[id].path, "an empty list names no data (allowed: %s)",
                              mxi_keys[id].allowed);
    if (blend && items % 2)
        return mxi_fail_value(ld, MX_ECONFIG, v, mxi_keys[id].path, "a blend of %d items is not weight, path pairs "
                              "(allowed: [weight, pattern, weight, pattern, ...])", items);
    int n = blend ? items / 2 : items;
    if (blend && n > MX_LOADER_MAX_DATASETS)
        return mxi_fail_value(ld, MX_ECONFIG, v, mxi_keys[id].path, "a blend of %d datasets (allowed: at most %d)", n,
                              MX_LOADER_MAX_DATASETS);
    char **out = calloc((size_t)n, sizeof *out);
    double *w = blend ? calloc((size_t)n, sizeof *w) : NULL;
    if (!out || (blend && !w)) {
        free(out), free(w);
        return mxi_fail_oom(ld, (size_t)n * (sizeof *out + (blend ? sizeof *w : 0)), mxi_keys[id].path);
    }
    int rc = 0;
    for (int i = 0; !rc && i < n; i++) {
        if (blend) {
            mxi_value wv = mxi_value_item(v, (size_t)(2 * i));
            snprintf(path, sizeof path, "%s[%d]", mxi_keys[id].path, 2 * i);
            if (mxi_value_quoted(wv) || mxi_value_number(wv, true, &w[i]) || !isfinite(w[i]) || !(w[i] > 0)) {
                rc = mxi_fail_value(ld, MX_ECONFIG, wv, path, "%s is not a weight (allowed: a number > 0, each "
                                    "dataset's weight before its path)", mxi_value_describe(wv, desc, sizeof desc));
                break;
            }
        }
        int at = blend ? 2 * i + 1 : i;
        mxi_value item = seq ? mxi_value_item(v, (size_t)at) : v;
        const char *text = get_path(item);
        if (!text || (blend && !mxi_value_quoted(item) && mxi_value_number(item, true, &first) == 0)) {
            snprintf(path, sizeof path, "%s[%d]", mxi_keys[id].path, at);
            rc = mxi_fail_value(ld, MX_ECONFIG, item, path, "%s is not a path (allowed: a file or glob pattern%s)",
                                mxi_value_describe(item, desc, sizeof desc), blend ? " after each weight" : "");
            break;
        }
        if (!(out[i] = mxi_strndup(text, strlen(text)))) rc = mxi_fail_oom(ld, strlen(text) + 1, mxi_keys[id].path);
    }
    if (rc) {
        mxi_config_free_strings(out, n);
        free(w);
        return rc;
    }
    mxi_config_free_strings(*list, *count);
    free(*weights);
    *list = out;
    *count = n;
    *weights = w;
    return 0;
}

/* recompute_plan.apply_modules: patterns (or one), at least one, replacing *list. */
static int convert_patterns(mxi_loader *ld, int id, mxi_value v, mx_plan_pattern **list, int *count) {
    char desc[MXI_DESC_SIZE], path[MXI_PATH_SIZE];
    bool seq = mxi_value_kind(v) == MXI_YAML_SEQ;
    int n = seq ? (int)mxi_value_count(v) : 1;
    if (!seq && !get_path(v))
        return mxi_fail_value(ld, MX_ECONFIG, v, mxi_keys[id].path, "%s is not a list of patterns (allowed: %s)",
                              mxi_value_describe(v, desc, sizeof desc), mxi_keys[id].allowed);
    if (n == 0)
        return mxi_fail_value(ld, MX_ECONFIG, v, mxi_keys[id].path, "an empty list selects nothing (allowed: %s; list "
                              "at least one)", mxi_keys[id].allowed);
    mx_plan_pattern *out = calloc((size_t)n, sizeof *out);
    if (!out) return mxi_fail_oom(ld, (size_t)n * sizeof *out, mxi_keys[id].path);
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        mxi_value item = seq ? mxi_value_item(v, (size_t)i) : v;
        const char *text = mxi_value_str(item);
        if (seq) snprintf(path, sizeof path, "%s[%d]", mxi_keys[id].path, i);
        else snprintf(path, sizeof path, "%s", mxi_keys[id].path);
        if (!text) {
            rc = mxi_fail_value(ld, MX_ECONFIG, item, path, "%s is not a pattern (allowed: a string such as "
                                                            "'model.layers.{*}')",
                                mxi_value_describe(item, desc, sizeof desc));
            break;
        }
        mx_diag sub;
        rc = mx_pattern_compile(text, &out[i].compiled, &sub);
        if (rc) {
            rc = rc == MX_ENOMEM ? mxi_diag(ld->diag, rc, "%s: %s: %s", ld->source, path, sub.msg)
                                 : mxi_fail_value(ld, rc, item, path, "%s", sub.msg);
            break;
        }
        out[i].line = item.doc == ld->doc ? mxi_value_line(item) : 0;   // no line on the command line
        if (!(out[i].text = mxi_strndup(text, strlen(text)))) rc = mxi_fail_oom(ld, strlen(text) + 1, path);
    }
    if (rc) {
        mxi_plan_patterns_free(out, n);
        return rc;
    }
    mxi_plan_patterns_free(*list, *count);
    *list = out;
    *count = n;
    return 0;
}

/* mlp_only_layers: a list of layer indices (checked against num_hidden_layers later). */
static int convert_layers(mxi_loader *ld, int id, mxi_value v, bool *layers) {
    char desc[MXI_DESC_SIZE], path[MXI_PATH_SIZE];
    if (mxi_value_kind(v) != MXI_YAML_SEQ)
        return mxi_fail_value(ld, MX_ECONFIG, v, mxi_keys[id].path, "%s is not a list (allowed: %s)",
                              mxi_value_describe(v, desc, sizeof desc), mxi_keys[id].allowed);
    memset(layers, 0, MX_MAX_LAYERS * sizeof *layers);
    for (size_t i = 0; i < mxi_value_count(v); i++) {
        mxi_value item = mxi_value_item(v, i);
        long long x;
        snprintf(path, sizeof path, "%s[%zu]", mxi_keys[id].path, i);
        int rc = get_int(ld, id, item, path, 0, MX_MAX_LAYERS - 1, &x);
        if (rc) return rc;
        layers[x] = true;
    }
    return 0;
}

int mxi_config_choice(mxi_loader *ld, int id, mxi_value v, int *out) {
    char desc[MXI_DESC_SIZE], allowed[MXI_LIST_SIZE];
    const char *text = mxi_value_str(v);
    for (const mxi_key_choice *c = mxi_keys[id].choices; c->text && text; c++) {
        if (!strcmp(c->text, text)) {
            *out = c->value;
            return 0;
        }
    }
    return mxi_fail_value(ld, MX_ECONFIG, v, mxi_keys[id].path, "%s is not allowed (allowed: %s)",
                          mxi_value_describe(v, desc, sizeof desc), mxi_key_allowed(id, allowed, sizeof allowed));
}

/* rope_scaling / rope_parameters: the RoPE variant must be the plain one. sets_theta: the
 * mapping may carry rope_theta (rope_parameters), stored in *theta (NAN when absent). */
static int convert_rope(mxi_loader *ld, int id, mxi_value v, bool sets_theta, double *theta) {
    char desc[MXI_DESC_SIZE], path[MXI_PATH_SIZE], qname[MXI_QUOTE_SIZE];
    *theta = NAN;
    if (mxi_value_kind(v) != MXI_YAML_MAP)
        return mxi_fail_value(ld, MX_ECONFIG, v, mxi_keys[id].path, "%s cannot be honoured: mxtrain implements plain "
                              "RoPE (allowed: %s)", mxi_value_describe(v, desc, sizeof desc),
                              sets_theta ? "a mapping with rope_type 'default' and rope_theta"
                                         : "null, or rope_type 'default'");
    /* The variant first (it says the most), then keys that only other variants have. */
    for (int pass = 0; pass < 2; pass++) {
        for (size_t i = 0; i < mxi_value_count(v); i++) {
            mxi_value item;
            const char *name = mxi_value_pair(v, i, &item, NULL);
            bool is_type = name && (!strcmp(name, "rope_type") || !strcmp(name, "type"));
            snprintf(path, sizeof path, "%s.%s", mxi_keys[id].path,
                     name ? mxi_quote(qname, sizeof qname, name, strlen(name)) : "?");
            if (pass == 0) {
                const char *t = mxi_value_str(item);
                if (is_type && (!t || strcmp(t, "default") != 0))
                    return mxi_fail_value(ld, MX_ECONFIG, item, path, "%s cannot be honoured: mxtrain implements plain "
                                                                      "RoPE (allowed: 'default')",
                                          mxi_value_describe(item, desc, sizeof desc));
            } else if (name && sets_theta && !strcmp(name, "rope_theta")) {
                if (mxi_value_number(item, true, theta) || !isfinite(*theta) || *theta <= 0 ||
                    !isfinite((float)*theta) || (float)*theta <= 0)
                    return mxi_fail_value(ld, MX_ECONFIG, item, path, "%s is not allowed (allowed: a number > 0)",
                                          mxi_value_describe(item, desc, sizeof desc));
            } else if (!is_type) {
                return mxi_fail_value(ld, MX_ECONFIG, item, path, "%s cannot be honoured: mxtrain implements plain "
                                      "RoPE (allowed: rope_type 'default'%s)", name ? "this key" : "a non-text key",
                                      sets_theta ? " and rope_theta" : "");
            }
        }
    }
    return 0;
}

int mxi_config_convert(mxi_loader *ld, int id) {
    const mxi_key_def *d = &mxi_keys[id];
    mxi_slot *s = &ld->slots[id];
    mxi_value v = s->v;
    char desc[MXI_DESC_SIZE];
    mx_config *cfg = ld->cfg;
    mx_origin origin = {s->cli ? MX_ORIGIN_COMMAND_LINE : s->key ? MX_ORIGIN_YAML : MX_ORIGIN_HF_CONFIG,
                        s->key ? mxi_yaml_line(s->key) : 0};
    if ((d->flags & MXI_FLAG_MOE) && cfg->model.type != MX_MODEL_QWEN3_MOE)
        return mxi_fail_key(ld, MX_ECONFIG, id, "given for model_type %s, but it applies only to qwen3_moe (allowed: "
                                                "leave it out, or set model_type: qwen3_moe)",
                            mxi_key_model_type(cfg->model.type));
    /* Written as null: the default, and the origin stays "default" as well. */
    if ((d->flags & MXI_FLAG_NULLABLE) && mxi_value_kind(v) == MXI_YAML_NULL) return 0;
    int rc = 0;
    long long i;
    double x;
    switch (d->type) {
    case MXI_KEY_SECTION:
    case MXI_KEY_HFDIR: break; /* collected / read already */
    case MXI_KEY_QPLAN:
        /* the plan loader reports its own errors, in the same format */
        rc = mxi_plan_from_node(ld->doc, (yaml_node_t *)v.y, ld->source, &cfg->training.quantization_plan, ld->diag);
        break;
    case MXI_KEY_INT:
        if (!(rc = get_int(ld, id, v, d->path, d->lo, d->hi, &i))) *(int *)field(ld, id) = (int)i;
        break;
    case MXI_KEY_SEED:
        if (!(rc = get_int(ld, id, v, d->path, 0, 9223372036854775807.0, &i)))
            *(uint64_t *)field(ld, id) = (uint64_t)i;
        break;
    case MXI_KEY_F32:
        if (!(rc = get_number(ld, id, v, &x))) *(float *)field(ld, id) = (float)x;
        break;
    case MXI_KEY_F64:
        if (!(rc = get_number(ld, id, v, &x))) *(double *)field(ld, id) = x;
        break;
    case MXI_KEY_BOOL: rc = get_bool(ld, id, v, d->path, (bool *)field(ld, id)); break;
    case MXI_KEY_STR: {
        const char *text = get_path(v);
        if (!text)
            return mxi_fail_value(ld, MX_ECONFIG, v, d->path, "%s is not a path (allowed: a file or directory path, or "
                                                              "null)",
                                  mxi_value_describe(v, desc, sizeof desc));
        char **dst = (char **)field(ld, id);
        free(*dst);
        if (!(*dst = mxi_strndup(text, strlen(text)))) return mxi_fail_oom(ld, strlen(text) + 1, d->path);
        break;
    }
    case MXI_KEY_PATHS:
        rc = convert_paths(ld, id, v, (char ***)field(ld, id), (int *)((char *)cfg + d->count_off),
                           (double **)((char *)cfg + d->weights_off));
        break;
    case MXI_KEY_CHOICE: rc = mxi_config_choice(ld, id, v, (int *)field(ld, id)); break;
    case MXI_KEY_PATTERNS:
        rc = convert_patterns(ld, id, v, (mx_plan_pattern **)field(ld, id), (int *)((char *)cfg + d->count_off));
        break;
    case MXI_KEY_LAYERS: rc = convert_layers(ld, id, v, cfg->model.mlp_only_layers); break;
    case MXI_KEY_FSDP_SIZE: {
        const char *text = mxi_value_str(v);
        if (text && !strcmp(text, "auto")) *(int *)field(ld, id) = 0;
        else if (mxi_value_kind(v) == MXI_YAML_INT) {
            if (!(rc = get_int(ld, id, v, d->path, 1, MXI_KEY_NO_MAX, &i))) *(int *)field(ld, id) = (int)i;
        } else
            return mxi_fail_value(ld, MX_ECONFIG, v, d->path, "%s is not allowed (allowed: %s)",
                                  mxi_value_describe(v, desc, sizeof desc), d->allowed);
        break;
    }
    case MXI_KEY_MUST_SILU: {
        const char *text = mxi_value_str(v);
        if (!text || strcmp(text, "silu") != 0)
            return mxi_fail_value(ld, MX_ECONFIG, v, d->path, "%s cannot be honoured: mxtrain's MLPs are SwiGLU "
                                                              "(allowed: 'silu')",
                                  mxi_value_describe(v, desc, sizeof desc));
        break;
    }
    case MXI_KEY_MUST_ZERO:
        if (mxi_value_number(v, true, &x) || x != 0)
            return mxi_fail_value(ld, MX_ECONFIG, v, d->path, "%s cannot be honoured: mxtrain has no attention dropout "
                                                              "(allowed: 0)",
                                  mxi_value_describe(v, desc, sizeof desc));
        break;
    case MXI_KEY_MUST_FALSE: {
        bool b;
        if ((rc = get_bool(ld, id, v, d->path, &b))) return rc;
        if (b)
            return mxi_fail_value(ld, MX_ECONFIG, v, d->path, "%s cannot be honoured: mxtrain has %s (allowed: false)",
                                  mxi_value_describe(v, desc, sizeof desc),
                                  !strcmp(mxi_key_name(id), "mlp_bias") ? "no MLP biases"
                                                                        : "full causal attention only");
        break;
    }
    case MXI_KEY_ROPE_SCALING: rc = convert_rope(ld, id, v, false, &x); break;
    case MXI_KEY_ROPE_PARAMS: rc = convert_rope(ld, id, v, true, &ld->rope_params_theta); break;
    case MXI_KEY_LAYER_TYPES: {
        char path[MXI_PATH_SIZE];
        if (mxi_value_kind(v) != MXI_YAML_SEQ)
            return mxi_fail_value(ld, MX_ECONFIG, v, d->path, "%s is not a list (allowed: a list of 'full_attention')",
                                  mxi_value_describe(v, desc, sizeof desc));
        for (size_t k = 0; k < mxi_value_count(v); k++) {
            mxi_value item = mxi_value_item(v, k);
            const char *t = mxi_value_str(item);
            snprintf(path, sizeof path, "%s[%zu]", d->path, k);
            if (!t || strcmp(t, "full_attention") != 0)
                return mxi_fail_value(ld, MX_ECONFIG, item, path, "%s cannot be honoured: mxtrain has full causal "
                                                                  "attention only (allowed: 'full_attention')",
                                      mxi_value_describe(item, desc, sizeof desc));
        }
        break;
    }
    }
    if (!rc) cfg->origins[id] = origin;
    return rc;
}
