/* The `training.quantization_plan` config block (SPEC §1), read through libyaml's document
 * API so that every error can name the line it comes from. */
#include "plan/plan_yaml.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/diag.h"
#include "core/file.h"
#include "core/text.h"

#define QP "training.quantization_plan"

/* ---- YAML 1.1 scalar typing (as PyYAML's safe_load resolves plain scalars) ------------ */

static const char *scalar_text(const yaml_node_t *node) { return (const char *)node->data.scalar.value; }

static bool str_in(const char *s, const char *const *list) {
    for (; *list; list++)
        if (strcmp(s, *list) == 0) return true;
    return false;
}

static const char *const null_words[] = {"", "~", "null", "Null", "NULL", NULL};
static const char *const true_words[] = {"true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON", NULL};
static const char *const false_words[] = {"false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF", NULL};

/* Advance *p over characters of set (at least min of them); returns how many. */
static size_t span(const char **p, const char *set) {
    size_t n = strspn(*p, set);
    *p += n;
    return n;
}

/* One or more sexagesimal groups ":[0-5]?[0-9]". */
static bool sexagesimal(const char **p) {
    int groups = 0;
    while (**p == ':') {
        const char *q = *p + 1;
        if (q[0] >= '0' && q[0] <= '5' && mxi_is_digit(q[1])) q += 2;
        else if (mxi_is_digit(q[0])) q += 1;
        else return false;
        *p = q;
        groups++;
    }
    return groups > 0;
}

static bool is_yaml_int(const char *s) {
    const char *p = s;
    if (*p == '-' || *p == '+') p++;
    if (p[0] == '0' && p[1] == 'b') return (p += 2, span(&p, "01_") > 0 && *p == '\0');
    if (p[0] == '0' && p[1] == 'x') return (p += 2, span(&p, "0123456789abcdefABCDEF_") > 0 && *p == '\0');
    if (p[0] == '0') return (p += 1, span(&p, "01234567_"), *p == '\0');
    if (p[0] < '1' || p[0] > '9') return false;
    p++;
    span(&p, "0123456789_");
    if (*p == '\0') return true;
    return sexagesimal(&p) && *p == '\0';
}

static bool is_yaml_float(const char *s) {
    const char *p = s;
    if (*p == '-' || *p == '+') p++;
    if (!strcmp(p, ".inf") || !strcmp(p, ".Inf") || !strcmp(p, ".INF")) return true;
    if (p == s && (!strcmp(p, ".nan") || !strcmp(p, ".NaN") || !strcmp(p, ".NAN"))) return true;
    if (mxi_is_digit(*p)) {
        span(&p, "0123456789_");
        if (*p == ':') {
            if (!sexagesimal(&p) || *p != '.') return false;
            p++;
            span(&p, "0123456789_");
            return *p == '\0';
        }
        if (*p != '.') return false;
        p++;
        span(&p, "0123456789_");
    } else if (*p == '.' && p == s) {
        p++;
        if (span(&p, "0123456789_") == 0) return false;
    } else {
        return false;
    }
    if (*p == 'e' || *p == 'E') {
        p++;
        if (*p != '-' && *p != '+') return false;
        p++;
        if (span(&p, "0123456789") == 0) return false;
    }
    return *p == '\0';
}

mxi_yaml_kind mxi_yaml_kind_of(const yaml_node_t *node) {
    if (node->type == YAML_SEQUENCE_NODE) return MXI_YAML_SEQ;
    if (node->type == YAML_MAPPING_NODE) return MXI_YAML_MAP;
    const char *tag = (const char *)node->tag, *s = scalar_text(node);
    /* An explicit standard tag decides when the text fits it (`!!bool 'false'`); the default
     * tag (also what `!!str` gives) leaves it to the plain-scalar rules. */
    if (tag && strcmp(tag, YAML_DEFAULT_SCALAR_TAG) != 0) {
        if (!strcmp(tag, YAML_NULL_TAG) && str_in(s, null_words)) return MXI_YAML_NULL;
        if (!strcmp(tag, YAML_BOOL_TAG) && (str_in(s, true_words) || str_in(s, false_words))) return MXI_YAML_BOOL;
        if (!strcmp(tag, YAML_INT_TAG) && is_yaml_int(s)) return MXI_YAML_INT;
        if (!strcmp(tag, YAML_FLOAT_TAG) && (is_yaml_float(s) || is_yaml_int(s))) return MXI_YAML_FLOAT;
        return MXI_YAML_STR;
    }
    if (node->data.scalar.style != YAML_PLAIN_SCALAR_STYLE) return MXI_YAML_STR;
    if (str_in(s, null_words)) return MXI_YAML_NULL;
    if (str_in(s, true_words) || str_in(s, false_words)) return MXI_YAML_BOOL;
    if (is_yaml_int(s)) return MXI_YAML_INT;
    if (is_yaml_float(s)) return MXI_YAML_FLOAT;
    return MXI_YAML_STR;
}

bool mxi_yaml_bool_value(const yaml_node_t *node) {
    return node->type == YAML_SCALAR_NODE && str_in(scalar_text(node), true_words);
}

const char *mxi_yaml_describe(const yaml_node_t *node, char *buf, size_t size) {
    char q[MXI_QUOTE_SIZE] = "";
    if (node->type == YAML_SCALAR_NODE)
        mxi_quote(q, sizeof q, scalar_text(node), node->data.scalar.length);
    switch (mxi_yaml_kind_of(node)) {
    case MXI_YAML_SEQ: snprintf(buf, size, "a list"); break;
    case MXI_YAML_MAP: snprintf(buf, size, "a mapping"); break;
    case MXI_YAML_NULL: snprintf(buf, size, "%s", node->data.scalar.length ? q : "an empty value"); break;
    case MXI_YAML_BOOL: snprintf(buf, size, "%s (a boolean)", q); break;
    case MXI_YAML_INT: snprintf(buf, size, "%s (an integer)", q); break;
    case MXI_YAML_FLOAT: snprintf(buf, size, "%s (a number)", q); break;
    case MXI_YAML_STR: snprintf(buf, size, "'%s'", q); break;
    }
    return buf;
}

/* ---- Plan defaults and release ------------------------------------------------------ */

void mxi_plan_patterns_free(mx_plan_pattern *list, int n) {
    for (int i = 0; i < n; i++) {
        free(list[i].text);
        mx_pattern_free(list[i].compiled);
    }
    free(list);
}

void mx_plan_free(mx_plan *plan) {
    if (!plan) return;
    free(plan->recipe_name);
    mxi_plan_patterns_free(plan->apply, plan->n_apply);
    mxi_plan_patterns_free(plan->ignored, plan->n_ignored);
    memset(plan, 0, sizeof *plan);
}

/* Compile built-in patterns into *list (line 0: not written in the config). */
static int default_patterns(mx_plan_pattern **list, int *n, const char *const *texts, int count) {
    *list = calloc((size_t)count, sizeof **list);
    if (!*list) return MX_ENOMEM;
    for (int i = 0; i < count; i++) {
        mx_plan_pattern *p = &(*list)[i];
        *n = i + 1; /* counted before filling, so that mx_plan_free releases a partial entry */
        p->text = mxi_strndup(texts[i], strlen(texts[i]));
        if (!p->text || mx_pattern_compile(texts[i], &p->compiled, NULL) != 0) return MX_ENOMEM;
    }
    return 0;
}

int mx_plan_init_defaults(mx_plan *plan) {
    static const char *const apply[] = {"model.layers.{*}"};
    static const char *const ignored[] = {"*lm_head", "*gate"};
    if (!plan) return MX_ENULL;
    memset(plan, 0, sizeof *plan);
    plan->enabled = false;
    plan->scale_mode = MX_SCALE_FLOOR;
    plan->converters[0] = MX_CONVERTER_LINEAR;
    plan->n_converters = 1;
    plan->low_precision_all_gather = true;
    plan->all_gather_mode = MX_AG_ON_DEMAND;
    plan->amax_history_len = MX_PLAN_AMAX_HISTORY_DEFAULT;
    plan->amax_compute_algo = MX_AMAX_MAX;
    if (default_patterns(&plan->apply, &plan->n_apply, apply, 1) ||
        default_patterns(&plan->ignored, &plan->n_ignored, ignored, 2)) {
        mx_plan_free(plan);
        return MX_ENOMEM;
    }
    return 0;
}

bool mx_plan_low_precision_gather(const mx_plan *plan) {
    // per_channel: fprop's row scales travel with their rows, dgrad's column (or tensor)
    // scales come from amaxes all-reduced over the shards (distributed/fsdp_row_scaled.c);
    // per_block: the tiles' scales from their amaxes all-reduced (distributed/fsdp_block_scaled.c)
    return plan && plan->enabled && plan->low_precision_all_gather &&
           (plan->recipe.granularity == MX_GRANULARITY_MX || plan->recipe.granularity == MX_GRANULARITY_PER_TENSOR ||
            plan->recipe.granularity == MX_GRANULARITY_PER_CHANNEL || plan->recipe.granularity == MX_GRANULARITY_PER_BLOCK) &&
           !(plan->high_precision_gemms & (MX_GEMM_FPROP | MX_GEMM_DGRAD));
}

const char *mx_plan_gather_fallback(const mx_plan *plan) {
    if (!plan || !plan->enabled || !plan->low_precision_all_gather || mx_plan_low_precision_gather(plan)) return NULL;
    // every granularity gathers its codes: only a product reading the weight unquantized stops it
    return "high_precision_gemms lists a product that reads the weight unquantized (fprop or dgrad)";
}

/* ---- The block ---------------------------------------------------------------------- */

typedef enum {
    K_RECIPE, K_APPLY, K_IGNORED, K_CONVERTERS, K_LOW_AG, K_AG_MODE, K_SCALE, K_HP, K_HISTORY, K_ALGO, K_MARGIN, K_COUNT
} key_id;

static const struct {
    const char *name, *alias;
} plan_keys[K_COUNT] = {
    [K_RECIPE] = {"recipe_name", "quant_recipe"},
    [K_APPLY] = {"apply_modules", "quant_apply_modules"},
    [K_IGNORED] = {"ignored_modules", "quant_ignored_modules"},
    [K_CONVERTERS] = {"quant_converters", "converters"},
    [K_LOW_AG] = {"enable_fsdp_low_precision_all_gather", NULL},
    [K_AG_MODE] = {"fsdp_low_precision_all_gather_mode", NULL},
    [K_SCALE] = {"scale_mode", NULL},
    [K_HP] = {"high_precision_gemms", NULL},
    [K_HISTORY] = {"amax_history_len", NULL},
    [K_ALGO] = {"amax_compute_algo", NULL},
    [K_MARGIN] = {"margin", NULL},
};

#define ALLOWED_KEYS                                                                            \
    "recipe_name (alias quant_recipe), apply_modules (alias quant_apply_modules), "             \
    "ignored_modules (alias quant_ignored_modules), quant_converters (alias converters), "     \
    "enable_fsdp_low_precision_all_gather, fsdp_low_precision_all_gather_mode, scale_mode, "        \
    "high_precision_gemms, amax_history_len, amax_compute_algo, margin"
#define ALLOWED_RECIPES "mxfp8, mxfp8-32x32, tensorwise, delayed, hif8, delayed_hif8_pertensor, rowwise, rowwise_with_gw_hp, blockwise or " MX_RECIPE_GRAMMAR "; leave the key out to turn quantization off"
#define ALLOWED_PATTERNS "a list of module patterns such as ['model.layers.{*}'], or one pattern"
#define ALLOWED_CONVERTERS                                                                   \
    "'quantize.linear.mx', 'quantize.moe.mx', 'quantize.linear.float8', 'quantize.moe.float8', " \
    "'quantize.linear.hif8', 'quantize.moe.hif8'"

typedef struct {
    yaml_document_t *doc;
    const char *source;
    mx_diag *diag;
} loader;

/* Fill diag with "SOURCE:LINE: training.quantization_plan[.KEY]: message" and return code. */
static int fail(const loader *ld, int code, const yaml_node_t *at, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int fail(const loader *ld, int code, const yaml_node_t *at, const char *key, const char *fmt, ...) {
    char msg[sizeof ld->diag->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return mxi_diag(ld->diag, code, "%s:%d: " QP "%s%s: %s", ld->source, mxi_yaml_line(at), key ? "." : "",
                    key ? key : "", msg);
}

/* bytes 0: the size is not known, what says what was being made. */
static int out_of_memory(const loader *ld, size_t bytes, const char *what) {
    if (bytes == 0) return mxi_diag(ld->diag, MX_ENOMEM, "%s: out of memory loading " QP " (%s)", ld->source, what);
    return mxi_diag(ld->diag, MX_ENOMEM, "%s: out of memory loading " QP " (%zu bytes for %s)", ld->source, bytes,
                    what);
}

static yaml_node_t *node_at(const loader *ld, yaml_node_item_t index) {
    return yaml_document_get_node(ld->doc, index);
}

/* A string scalar holding no NUL byte: the only kind of text a name or pattern can be. */
static bool is_text(const yaml_node_t *node) {
    return mxi_yaml_kind_of(node) == MXI_YAML_STR && strlen(scalar_text(node)) == node->data.scalar.length;
}

/* The items of a list-valued key, where a single string stands for a one-element list.
 * Returns the count, or -1 if node is neither. */
static int list_items(const yaml_node_t *node, const yaml_node_item_t **items) {
    if (node->type == YAML_SEQUENCE_NODE) {
        *items = node->data.sequence.items.start;
        return (int)(node->data.sequence.items.top - node->data.sequence.items.start);
    }
    *items = NULL;
    return is_text(node) ? 1 : -1;
}

static int load_recipe(const loader *ld, const char *key, const yaml_node_t *v, mx_plan *plan) {
    char desc[MXI_QUOTE_SIZE + 32];
    if (!is_text(v) || v->data.scalar.length == 0)
        return fail(ld, MX_ECONFIG, v, key, "%s is not a recipe name (allowed: " ALLOWED_RECIPES ")",
                    mxi_yaml_describe(v, desc, sizeof desc));
    mx_diag sub;
    int rc = mx_recipe_parse(scalar_text(v), &plan->recipe, &sub);
    if (rc) return fail(ld, rc, v, key, "%s", sub.msg);
    plan->recipe_name = mxi_strndup(scalar_text(v), v->data.scalar.length);
    if (!plan->recipe_name) return out_of_memory(ld, v->data.scalar.length + 1, "the recipe's name");
    plan->enabled = true;
    return 0;
}

/* apply_modules / ignored_modules: replaces *list (the defaults) on success. */
static int load_patterns(const loader *ld, const char *key, const yaml_node_t *v, bool need_one,
                         mx_plan_pattern **list, int *count) {
    char desc[MXI_QUOTE_SIZE + 32], item_key[MXI_QUOTE_SIZE + 16];
    const yaml_node_item_t *items;
    int n = list_items(v, &items);
    if (n < 0)
        return fail(ld, MX_ECONFIG, v, key, "%s is not a list of patterns (allowed: " ALLOWED_PATTERNS ")",
                    mxi_yaml_describe(v, desc, sizeof desc));
    if (n == 0 && need_one)
        return fail(ld, MX_ECONFIG, v, key, "an empty list selects nothing (allowed: " ALLOWED_PATTERNS
                                            "; list at least one)");
    mx_plan_pattern *out = n ? calloc((size_t)n, sizeof *out) : NULL;
    if (n && !out) return out_of_memory(ld, (size_t)n * sizeof *out, "a list of patterns");
    int rc = 0;
    for (int i = 0; i < n; i++) {
        const yaml_node_t *item = items ? node_at(ld, items[i]) : v;
        if (items) snprintf(item_key, sizeof item_key, "%s[%d]", key, i);
        else snprintf(item_key, sizeof item_key, "%s", key);
        if (!is_text(item)) {
            rc = fail(ld, MX_ECONFIG, item, item_key, "%s is not a pattern (allowed: a string such as "
                                                      "'model.layers.{*}' or '*lm_head')",
                      mxi_yaml_describe(item, desc, sizeof desc));
            break;
        }
        mx_diag sub;
        rc = mx_pattern_compile(scalar_text(item), &out[i].compiled, &sub);
        if (rc) {
            rc = rc == MX_ENOMEM ? mxi_diag(ld->diag, rc, "%s: %s", ld->source, sub.msg)
                                 : fail(ld, rc, item, item_key, "%s", sub.msg);
            break;
        }
        out[i].line = mxi_yaml_line(item);
        out[i].text = mxi_strndup(scalar_text(item), item->data.scalar.length);
        if (!out[i].text) {
            rc = out_of_memory(ld, item->data.scalar.length + 1, "a pattern");
            break;
        }
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

/* quant_converters: the kinds into plan, the one family they name into *family (checked
 * against the recipe's once the whole block is read). */
static int load_converters(const loader *ld, const char *key, const yaml_node_t *v, mx_plan *plan,
                           mx_quant_family *family) {
    char desc[MXI_QUOTE_SIZE + 32], item_key[MXI_QUOTE_SIZE + 16];
    const yaml_node_item_t *items;
    int n = list_items(v, &items);
    if (n < 0)
        return fail(ld, MX_ECONFIG, v, key, "%s is not a list of converters (allowed: " ALLOWED_CONVERTERS ")",
                    mxi_yaml_describe(v, desc, sizeof desc));
    if (n == 0)
        return fail(ld, MX_ECONFIG, v, key, "an empty list converts nothing (allowed: " ALLOWED_CONVERTERS ")");
    int first_line[MX_CONVERTER_COUNT] = {0};
    mx_converter found[MX_CONVERTER_COUNT];
    int n_found = 0;
    for (int i = 0; i < n; i++) {
        const yaml_node_t *item = items ? node_at(ld, items[i]) : v;
        if (items) snprintf(item_key, sizeof item_key, "%s[%d]", key, i);
        else snprintf(item_key, sizeof item_key, "%s", key);
        int c = -1, fam = -1;
        for (int k = 0; k < MX_CONVERTER_COUNT && is_text(item); k++)
            for (int f = 0; f < MX_FAMILY_COUNT; f++)
                if (strcmp(scalar_text(item), mx_converter_family_name((mx_converter)k, (mx_quant_family)f)) == 0)
                    c = k, fam = f;
        if (c < 0)
            return fail(ld, MX_ECONFIG, item, item_key, "%s is not allowed (allowed: " ALLOWED_CONVERTERS ")",
                        mxi_yaml_describe(item, desc, sizeof desc));
        if (i > 0 && fam != (int)*family)
            return fail(ld, MX_ECONFIG, item, item_key, "'%s' is of family %s, the converters before it of %s "
                        "(allowed: converters of one family, the recipe's)", scalar_text(item),
                        mx_family_name((mx_quant_family)fam), mx_family_name(*family));
        *family = (mx_quant_family)fam;
        if (first_line[c])
            return fail(ld, MX_ECONFIG, item, item_key, "'%s' is listed twice (first at line %d; allowed: "
                                                        "each of " ALLOWED_CONVERTERS " at most once)",
                        scalar_text(item), first_line[c]);
        first_line[c] = mxi_yaml_line(item);
        found[n_found++] = (mx_converter)c;
    }
    memcpy(plan->converters, found, (size_t)n_found * sizeof found[0]);
    plan->n_converters = n_found;
    return 0;
}

#define ALLOWED_GEMMS "a list of 'fprop', 'dgrad', 'wgrad', each at most once, such as ['wgrad']"

/* high_precision_gemms: the products a converted layer runs unquantized, as mx_gemm_set bits. */
static int load_gemms(const loader *ld, const char *key, const yaml_node_t *v, unsigned *out) {
    static const char *const names[] = {"fprop", "dgrad", "wgrad", NULL};
    char desc[MXI_QUOTE_SIZE + 32], item_key[MXI_QUOTE_SIZE + 16];
    const yaml_node_item_t *items;
    int n = list_items(v, &items);
    if (n < 0 && mxi_yaml_kind_of(v) == MXI_YAML_NULL) n = 0;   // `high_precision_gemms:` empty: none
    if (n < 0)
        return fail(ld, MX_ECONFIG, v, key, "%s is not a list of products (allowed: " ALLOWED_GEMMS ")",
                    mxi_yaml_describe(v, desc, sizeof desc));
    unsigned set = 0;
    for (int i = 0; i < n; i++) {
        const yaml_node_t *item = items ? node_at(ld, items[i]) : v;
        if (items) snprintf(item_key, sizeof item_key, "%s[%d]", key, i);
        else snprintf(item_key, sizeof item_key, "%s", key);
        int k = 0;
        while (names[k] && !(is_text(item) && strcmp(scalar_text(item), names[k]) == 0)) k++;
        if (!names[k])
            return fail(ld, MX_ECONFIG, item, item_key, "%s is not a product (allowed: " ALLOWED_GEMMS ")",
                        mxi_yaml_describe(item, desc, sizeof desc));
        if (set & 1u << k)
            return fail(ld, MX_ECONFIG, item, item_key, "'%s' is listed twice (allowed: " ALLOWED_GEMMS ")", names[k]);
        set |= 1u << k;
    }
    *out = set;
    return 0;
}

static int load_bool(const loader *ld, const char *key, const yaml_node_t *v, bool *out) {
    char desc[MXI_QUOTE_SIZE + 32];
    if (mxi_yaml_kind_of(v) == MXI_YAML_BOOL) {
        *out = mxi_yaml_bool_value(v);
        return 0;
    }
    mxi_yaml_describe(v, desc, sizeof desc);
    if (v->type == YAML_SCALAR_NODE && v->data.scalar.style != YAML_PLAIN_SCALAR_STYLE &&
        (str_in(scalar_text(v), true_words) || str_in(scalar_text(v), false_words)))
        return fail(ld, MX_ECONFIG, v, key, "%s is a quoted string, not a boolean (allowed: true, false, unquoted)",
                    desc);
    return fail(ld, MX_ECONFIG, v, key, "%s is not a boolean (allowed: true, false)", desc);
}

/* A string out of a fixed set (NULL-terminated choices); *out receives its index. */
static int load_choice(const loader *ld, const char *key, const yaml_node_t *v, const char *const *choices,
                       const char *allowed, int *out) {
    char desc[MXI_QUOTE_SIZE + 32];
    for (int i = 0; choices[i] && is_text(v); i++) {
        if (strcmp(scalar_text(v), choices[i]) == 0) {
            *out = i;
            return 0;
        }
    }
    return fail(ld, MX_ECONFIG, v, key, "%s is not allowed (allowed: %s)", mxi_yaml_describe(v, desc, sizeof desc),
                allowed);
}

/* An integer in [lo, hi] (YAML 1.1 int syntax, as PyYAML reads it: 0x, 0o, _ separators). */
static int load_int_in(const loader *ld, const char *key, const yaml_node_t *v, long lo, long hi, int *out) {
    char desc[MXI_QUOTE_SIZE + 32];
    mxi_yaml_describe(v, desc, sizeof desc);
    if (mxi_yaml_kind_of(v) != MXI_YAML_INT)
        return fail(ld, MX_ECONFIG, v, key, "%s is not an integer (allowed: an integer from %ld to %ld)", desc, lo, hi);
    char digits[64];
    size_t n = 0;
    for (const char *p = scalar_text(v); *p && n + 1 < sizeof digits; p++)
        if (*p != '_') digits[n++] = *p;
    digits[n] = '\0';
    errno = 0;
    char *end;
    const char *d = digits + (digits[0] == '+' || digits[0] == '-');
    bool octal = d[0] == '0' && d[1] != 'x' && d[1] != 'b' && d[1] != '\0';
    long x = d[0] == '0' && d[1] == 'b' ? strtol(d + 2, &end, 2) : strtol(d, &end, octal ? 8 : 0);
    if (digits[0] == '-') x = -x;
    if (errno || *end || strchr(digits, ':') || x < lo || x > hi)
        return fail(ld, MX_ECONFIG, v, key, "%s is out of range (allowed: an integer from %ld to %ld)", desc, lo, hi);
    *out = (int)x;
    return 0;
}

/* The known key closest to an unknown one, if close enough to be a likely typo or a
 * shortening (`recipe` for `recipe_name`). */
static const char *suggest_key(const char *key, size_t len) {
    const char *best = NULL;
    size_t best_d = len / 3 > 2 ? len / 3 : 2;
    for (int k = 0; k < K_COUNT; k++) {
        const char *names[2] = {plan_keys[k].name, plan_keys[k].alias};
        for (int a = 0; a < 2; a++) {
            if (!names[a]) continue;
            size_t d = mxi_edit_distance(key, len, names[a]);
            if (len >= 4 && strlen(key) == len && strstr(names[a], key)) d = 1;
            if (d <= best_d && !(best && d == best_d)) best_d = d, best = names[a]; /* first of equals */
        }
    }
    return best;
}

static int find_key(const char *key, size_t len) {
    if (strlen(key) != len) return -1; /* a NUL inside the key */
    for (int k = 0; k < K_COUNT; k++) {
        if (!strcmp(key, plan_keys[k].name) || (plan_keys[k].alias && !strcmp(key, plan_keys[k].alias))) return k;
    }
    return -1;
}

/* What one key allows depends on another: the converters' family and scale_mode on the
 * recipe's. Without quant_converters, the recipe's family converts linear layers (mx, SPEC
 * §1) or linear layers and experts (float8, hif8). */
static int check_across_keys(const loader *ld, const yaml_node_t *const *seen, const yaml_node_t *const *vals,
                             mx_plan *plan, mx_quant_family conv_family, int scale_choice) {
    if (!plan->enabled) return 0;
    char name[MXI_QUOTE_SIZE];
    mxi_quote(name, sizeof name, plan->recipe_name, strlen(plan->recipe_name));
    mx_quant_family family = mx_recipe_family(&plan->recipe);
    plan->family = family;
    if (seen[K_CONVERTERS] && conv_family != family) {
        const yaml_node_t *k = seen[K_CONVERTERS];
        return fail(ld, MX_ECONFIG, k, scalar_text(k), "converters of family %s do not go with recipe '%s' "
                    "(allowed: '%s', '%s')", mx_family_name(conv_family), name,
                    mx_converter_family_name(MX_CONVERTER_LINEAR, family), mx_converter_family_name(MX_CONVERTER_MOE, family));
    }
    if (!seen[K_CONVERTERS] && family != MX_FAMILY_MX) {
        plan->converters[0] = MX_CONVERTER_LINEAR, plan->converters[1] = MX_CONVERTER_MOE;
        plan->n_converters = 2;
    }
    bool mx = plan->recipe.granularity == MX_GRANULARITY_MX;
    if (scale_choice >= 0 && (scale_choice >= 2) == mx) {
        static const char *const modes[] = {"floor", "rceil", "fp32", "pow2"};
        return fail(ld, MX_ECONFIG, seen[K_SCALE], scalar_text(seen[K_SCALE]), "'%s' does not go with recipe '%s' "
                    "(allowed: %s)", modes[scale_choice], name, mx ? "'floor', 'rceil'" : "'fp32', 'pow2'");
    }
    plan->high_precision_gemms |= plan->recipe.high_precision;   // rowwise_with_gw_hp: wgrad
    // torchao's rowwise recipes round scales to powers of two, and so do TE's Float8BlockScaling
    // and DeepSeek-V3's blockwise recipe
    if (scale_choice < 0 && (plan->recipe.granularity == MX_GRANULARITY_PER_CHANNEL ||
                             plan->recipe.granularity == MX_GRANULARITY_PER_BLOCK))
        plan->tensor_scale_mode = MX_TSCALE_POW2;
    bool delayed = plan->recipe.strategy == MX_STRATEGY_DELAYED;
    if (scale_choice == 3 && delayed)   // TE's DelayedScaling has no power-of-two scales
        return fail(ld, MX_ECONFIG, seen[K_SCALE], scalar_text(seen[K_SCALE]), "'pow2' is not implemented for "
                    "delayed recipe '%s' (allowed: 'fp32')", name);
    static const int delayed_keys[] = {K_HISTORY, K_ALGO, K_MARGIN};
    for (int i = 0; i < 3 && !delayed; i++) {
        const yaml_node_t *k = seen[delayed_keys[i]];
        char desc[MXI_QUOTE_SIZE + 32];
        if (k)
            return fail(ld, MX_ECONFIG, k, scalar_text(k), "%s: delayed scaling's key, but recipe '%s' scales from "
                        "the current amax (allowed: only with delayed, delayed_hif8_pertensor or a "
                        "delayed_per_tensor_* recipe)", mxi_yaml_describe(vals[delayed_keys[i]], desc, sizeof desc),
                        name);
    }
    return 0;
}

static int load_block(const loader *ld, const yaml_node_t *block, mx_plan *plan) {
    char desc[MXI_QUOTE_SIZE + 32], key[MXI_QUOTE_SIZE];
    if (block->type != YAML_MAPPING_NODE)
        return fail(ld, MX_ECONFIG, block, NULL, "%s is not a mapping (allowed: a mapping with keys " ALLOWED_KEYS ")",
                    mxi_yaml_describe(block, desc, sizeof desc));
    const yaml_node_t *seen[K_COUNT] = {NULL}, *vals[K_COUNT] = {NULL};
    mx_quant_family conv_family = MX_FAMILY_MX;
    int scale_choice = -1;
    for (const yaml_node_pair_t *pair = block->data.mapping.pairs.start; pair < block->data.mapping.pairs.top;
         pair++) {
        const yaml_node_t *k = node_at(ld, pair->key), *v = node_at(ld, pair->value);
        if (k->type != YAML_SCALAR_NODE)
            return fail(ld, MX_ECONFIG, k, NULL, "%s is not a key (allowed: " ALLOWED_KEYS ")",
                        mxi_yaml_describe(k, desc, sizeof desc));
        mxi_quote(key, sizeof key, scalar_text(k), k->data.scalar.length);
        int id = find_key(scalar_text(k), k->data.scalar.length);
        if (id < 0) {
            const char *near = suggest_key(scalar_text(k), k->data.scalar.length);
            char hint[96] = "";
            if (near) snprintf(hint, sizeof hint, "; did you mean '%s'?", near);
            return fail(ld, MX_ECONFIG, k, key, "unknown key%s (allowed: " ALLOWED_KEYS ")", hint);
        }
        if (seen[id]) {
            if (!strcmp(scalar_text(seen[id]), scalar_text(k)))
                return fail(ld, MX_ECONFIG, k, key, "duplicate key (first given at line %d)", mxi_yaml_line(seen[id]));
            return fail(ld, MX_ECONFIG, k, key, "given together with its alias %s (line %d); keep one of them",
                        scalar_text(seen[id]), mxi_yaml_line(seen[id]));
        }
        seen[id] = k, vals[id] = v;
        int rc = 0, choice = 0;
        switch ((key_id)id) {
        case K_RECIPE: rc = load_recipe(ld, key, v, plan); break;
        case K_APPLY: rc = load_patterns(ld, key, v, true, &plan->apply, &plan->n_apply); break;
        case K_IGNORED: rc = load_patterns(ld, key, v, false, &plan->ignored, &plan->n_ignored); break;
        case K_CONVERTERS: rc = load_converters(ld, key, v, plan, &conv_family); break;
        case K_LOW_AG: rc = load_bool(ld, key, v, &plan->low_precision_all_gather); break;
        case K_AG_MODE: {
            static const char *const modes[] = {"on-demand", "all", NULL};
            rc = load_choice(ld, key, v, modes, "'on-demand', 'all'", &choice);
            plan->all_gather_mode = choice ? MX_AG_ALL : MX_AG_ON_DEMAND;
            break;
        }
        case K_SCALE: {
            static const char *const modes[] = {"floor", "rceil", "fp32", "pow2", NULL};
            rc = load_choice(ld, key, v, modes, "'floor', 'rceil' (mx recipes), 'fp32', 'pow2' (per_tensor, "
                             "per_channel and per_block recipes)",
                             &choice);
            scale_choice = choice;
            plan->scale_mode = choice == 1 ? MX_SCALE_RCEIL : MX_SCALE_FLOOR;
            plan->tensor_scale_mode = choice == 3 ? MX_TSCALE_POW2 : MX_TSCALE_FP32;
            break;
        }
        case K_HP: rc = load_gemms(ld, key, v, &plan->high_precision_gemms); break;
        case K_HISTORY:
            rc = load_int_in(ld, key, v, 1, MX_PLAN_AMAX_HISTORY_MAX, &plan->amax_history_len);
            break;
        case K_ALGO: {
            static const char *const algos[] = {"max", "most_recent", NULL};
            rc = load_choice(ld, key, v, algos, "'max', 'most_recent'", &choice);
            plan->amax_compute_algo = choice ? MX_AMAX_MOST_RECENT : MX_AMAX_MAX;
            break;
        }
        case K_MARGIN: rc = load_int_in(ld, key, v, 0, MX_PLAN_MARGIN_MAX, &plan->margin); break;
        case K_COUNT: break;
        }
        if (rc) return rc;
    }
    return check_across_keys(ld, seen, vals, plan, conv_family, scale_choice);
}

int mxi_plan_from_node(yaml_document_t *doc, yaml_node_t *block, const char *source_name, mx_plan *plan,
                       mx_diag *diag) {
    if (!plan) return mxi_diag(diag, MX_ENULL, "mxi_plan_from_node: NULL plan");
    memset(plan, 0, sizeof *plan);
    if (block && !doc) return mxi_diag(diag, MX_ENULL, "mxi_plan_from_node: NULL document");
    loader ld = {doc, source_name ? source_name : "<config>", diag};
    mx_plan tmp;
    if (mx_plan_init_defaults(&tmp)) return out_of_memory(&ld, 0, "the default patterns");
    int rc = block ? load_block(&ld, block, &tmp) : 0;
    if (rc) {
        mx_plan_free(&tmp);
        return rc;
    }
    *plan = tmp;
    return 0;
}

/* ---- Whole files -------------------------------------------------------------------- */

/* One line for a libyaml failure, with the file:line:column of the problem. */
int mxi_yaml_failure(const yaml_parser_t *parser, const char *source, const char *input, size_t len,
                     mx_diag *diag) {
    const char *problem = parser->problem ? parser->problem : "malformed YAML";
    if (parser->error == YAML_MEMORY_ERROR)
        return mxi_diag(diag, MX_ENOMEM, "%s: out of memory parsing its %zu bytes of YAML (libyaml)", source, len);
    if (parser->error == YAML_READER_ERROR) {
        /* Reader errors carry a byte offset rather than a mark. */
        size_t line = 1, col = 1;
        for (size_t i = 0; i < parser->problem_offset && i < len; i++) {
            if (input[i] == '\n') line++, col = 1;
            else col++;
        }
        if (parser->problem_value >= 0)
            return mxi_diag(diag, MX_ECONFIG, "%s:%zu:%zu: invalid YAML input: %s (byte 0x%02X)", source, line, col,
                            problem, (unsigned)parser->problem_value);
        return mxi_diag(diag, MX_ECONFIG, "%s:%zu:%zu: invalid YAML input: %s", source, line, col, problem);
    }
    if (parser->context)
        return mxi_diag(diag, MX_ECONFIG, "%s:%zu:%zu: YAML syntax error: %s (%s at line %zu, column %zu)", source,
                        parser->problem_mark.line + 1, parser->problem_mark.column + 1, problem, parser->context,
                        parser->context_mark.line + 1, parser->context_mark.column + 1);
    return mxi_diag(diag, MX_ECONFIG, "%s:%zu:%zu: YAML syntax error: %s", source, parser->problem_mark.line + 1,
                    parser->problem_mark.column + 1, problem);
}

/* The value of a section key in a mapping, or NULL; a repeated key is an error. */
static int find_section(yaml_document_t *doc, const yaml_node_t *map, const char *name, const char *path,
                        const char *source, yaml_node_t **out, mx_diag *diag) {
    const yaml_node_t *first = NULL;
    *out = NULL;
    for (const yaml_node_pair_t *pair = map->data.mapping.pairs.start; pair < map->data.mapping.pairs.top; pair++) {
        const yaml_node_t *k = yaml_document_get_node(doc, pair->key);
        if (k->type != YAML_SCALAR_NODE || strcmp(scalar_text(k), name) != 0) continue;
        if (first)
            return mxi_diag(diag, MX_ECONFIG, "%s:%d: %s: duplicate key (first given at line %d)", source,
                            mxi_yaml_line(k), path, mxi_yaml_line(first));
        first = k;
        *out = yaml_document_get_node(doc, pair->value);
    }
    return 0;
}

static int load_document(yaml_document_t *doc, const char *source, mx_plan *plan, mx_diag *diag) {
    char desc[MXI_QUOTE_SIZE + 32];
    yaml_node_t *root = yaml_document_get_root_node(doc);
    /* An empty file (or one holding only comments or `---`) is a config with no settings. */
    if (!root || mxi_yaml_kind_of(root) == MXI_YAML_NULL) return mxi_plan_from_node(doc, NULL, source, plan, diag);
    if (root->type != YAML_MAPPING_NODE)
        return mxi_diag(diag, MX_ECONFIG, "%s:%d: the config is %s, not a mapping of sections (allowed: model, "
                                          "data, parallel, features, training)",
                        source, mxi_yaml_line(root), mxi_yaml_describe(root, desc, sizeof desc));
    yaml_node_t *training, *block = NULL;
    int rc = find_section(doc, root, "training", "training", source, &training, diag);
    if (rc) return rc;
    if (training) {
        if (training->type != YAML_MAPPING_NODE)
            return mxi_diag(diag, MX_ECONFIG, "%s:%d: training: %s is not a mapping (allowed: a mapping of "
                                              "training settings such as quantization_plan)",
                            source, mxi_yaml_line(training), mxi_yaml_describe(training, desc, sizeof desc));
        rc = find_section(doc, training, "quantization_plan", QP, source, &block, diag);
        if (rc) return rc;
    }
    return mxi_plan_from_node(doc, block, source, plan, diag);
}

/* Flow collections ([ ], { }) nested deeper than this are refused before libyaml parses
 * them: its parser takes time quadratic in the depth (200,000 levels: 83 s). No config
 * nests more than a few levels. Block nesting (by indentation) costs libyaml linear time. */
enum { MAX_FLOW_DEPTH = 64 };

/* A scan of the bytes as YAML's scanner sees them for flow nesting: quoted scalars and
 * comments are skipped, every other bracket counts. Conservative: a bracket inside a plain
 * or block scalar counts too (a config would need 64 unclosed ones to be refused). */
static int check_flow_depth(const char *data, size_t len, const char *source, mx_diag *diag) {
    int depth = 0, line = 1;
    for (size_t i = 0; i < len; i++) {
        char c = data[i], prev = i ? data[i - 1] : '\n';
        bool token_start = prev == ' ' || prev == '\t' || prev == '\n' || prev == '\r' || prev == '[' ||
                           prev == '{' || prev == ',' || prev == ':';
        if (c == '\n') {
            line++;
        } else if (c == '#' && (prev == ' ' || prev == '\t' || prev == '\n' || prev == '\r')) {
            while (i + 1 < len && data[i + 1] != '\n') i++;
        } else if ((c == '"' || c == '\'') && token_start) {
            for (i++; i < len; i++) {   // to the closing quote: \" escapes in "...", '' in '...'
                if (data[i] == '\n') line++;
                if (c == '"' && data[i] == '\\') i++;
                else if (data[i] == c && (c == '"' || i + 1 >= len || data[i + 1] != '\'')) break;
                else if (data[i] == c) i++;
            }
        } else if (c == '[' || c == '{') {
            if (++depth > MAX_FLOW_DEPTH)
                return mxi_diag(diag, MX_ECONFIG, "%s:%d: [ ] and { } nested deeper than %d levels (allowed: at "
                                "most %d)", source, line, MAX_FLOW_DEPTH, MAX_FLOW_DEPTH);
        } else if ((c == ']' || c == '}') && depth > 0) {
            depth--;
        }
    }
    return MX_OK;
}

int mxi_yaml_load_one(const char *data, size_t len, const char *source, yaml_document_t *doc, mx_diag *diag) {
    yaml_parser_t parser;
    yaml_document_t extra;
    int depth_rc = check_flow_depth(data, len, source, diag);
    if (depth_rc) return depth_rc;
    if (!yaml_parser_initialize(&parser))
        return mxi_diag(diag, MX_ENOMEM, "%s: out of memory starting the YAML parser (libyaml: 64 KiB of buffers and "
                        "its stacks)", source);
    yaml_parser_set_input_string(&parser, (const unsigned char *)data, len);
    if (!yaml_parser_load(&parser, doc)) { /* libyaml has released the partial document */
        int rc = mxi_yaml_failure(&parser, source, data, len, diag);
        yaml_parser_delete(&parser);
        return rc;
    }
    /* A config is one document; a second one would otherwise be ignored without a word. */
    int rc = 0;
    if (!yaml_parser_load(&parser, &extra)) {
        rc = mxi_yaml_failure(&parser, source, data, len, diag);
    } else {
        if (yaml_document_get_root_node(&extra))
            rc = mxi_diag(diag, MX_ECONFIG, "%s:%zu: a second YAML document starts here (allowed: one document)",
                          source, extra.start_mark.line + 1);
        yaml_document_delete(&extra);
    }
    yaml_parser_delete(&parser);
    if (rc) yaml_document_delete(doc);
    return rc;
}

static int load_buffer(const char *data, size_t len, const char *source, mx_plan *plan, mx_diag *diag) {
    yaml_document_t doc;
    memset(plan, 0, sizeof *plan);
    int rc = mxi_yaml_load_one(data, len, source, &doc, diag);
    if (rc) return rc;
    rc = load_document(&doc, source, plan, diag);
    yaml_document_delete(&doc);
    return rc;
}

int mx_plan_load_string(const char *yaml, const char *source_name, mx_plan *plan, mx_diag *diag) {
    if (plan) memset(plan, 0, sizeof *plan);
    if (!yaml || !plan) return mxi_diag(diag, MX_ENULL, "mx_plan_load_string: NULL argument");
    return load_buffer(yaml, strlen(yaml), source_name ? source_name : "<string>", plan, diag);
}

int mx_plan_load_file(const char *path, mx_plan *plan, mx_diag *diag) {
    if (plan) memset(plan, 0, sizeof *plan);
    if (!path || !plan) return mxi_diag(diag, MX_ENULL, "mx_plan_load_file: NULL argument");
    char *data;
    size_t len;
    int rc = mxi_read_input(path, "a YAML quantization plan", MXI_MAX_CONFIG_BYTES, &data, &len, diag);
    if (rc) return rc;
    rc = load_buffer(data, len, path, plan, diag);
    free(data);
    return rc;
}
