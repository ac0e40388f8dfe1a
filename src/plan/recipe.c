/* Recipe names (SPEC §2):
 *   <scaling_strategy>_<scaling_granularity>[-b0-b1-b2]_<inputs_dtype>_<weight_dtype>_<grads_dtype>
 * parsed from the outside in, so that granularities containing '_' (per_tensor) parse. */
#include "mxtrain/plan.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/diag.h"
#include "core/text.h"

/* ---- Parsing ------------------------------------------------------------------------ */

#define RECIPE_ALIASES "mxfp8, mxfp8-32x32, tensorwise, delayed, rowwise, rowwise_with_gw_hp, blockwise, hif8, delayed_hif8_pertensor"
#define SUPPORTED_RECIPES                                                                   \
    "supported: dynamic_mx-1-1-32_*, dynamic_mx-1-32-32_* (aliases mxfp8, mxfp8-32x32), "  \
    "dynamic_per_tensor_* and delayed_per_tensor_* with E4M3/E5M2/HIF8 in each role (aliases tensorwise, "     \
    "delayed, hif8, delayed_hif8_pertensor), dynamic_per_channel_* and "                                          \
    "dynamic_per_channel_dgrad_w_per_tensor_* with E4M3/E5M2 (aliases rowwise, rowwise_with_gw_hp), "            \
    "dynamic_per_block-1-128-128_* with E4M3/E5M2 (alias blockwise)"

/* Case-insensitive comparison of text[0..len) with a whole word. */
static bool word_eq(const char *text, size_t len, const char *word) {
    if (strlen(word) != len) return false;
    for (size_t i = 0; i < len; i++)
        if (mxi_lower(text[i]) != mxi_lower(word[i])) return false;
    return true;
}

/* Fill diag with the one-line malformed-recipe message; pos is the 0-based fault offset. */
static int recipe_error(mx_diag *diag, const char *text, size_t pos, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int recipe_error(mx_diag *diag, const char *text, size_t pos, const char *fmt, ...) {
    char what[512], quoted[MXI_QUOTE_SIZE];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return mxi_diag(diag, MX_ERECIPE, "recipe '%s': %s at position %zu (expected " MX_RECIPE_GRAMMAR ")",
                    mxi_quote(quoted, sizeof quoted, text, strlen(text)), what, pos + 1);
}

/* Parse a dtype field text[a..b); -1 if it is not a dtype. */
static int parse_elem(const char *text, size_t a, size_t b) {
    if (word_eq(text + a, b - a, "E4M3")) return MX_E4M3;
    if (word_eq(text + a, b - a, "E5M2")) return MX_E5M2;
    if (word_eq(text + a, b - a, "HIF8")) return MX_HIF8;
    return -1;
}

/* Parse the block suffix text[p..end) (just after the '-' following the granularity) into
 * block[3]: exactly three positive decimal integers separated by '-'. */
static int parse_block(const char *text, size_t p, size_t end, int block[3], mx_diag *diag) {
    enum { MAX_DIGITS = 9 }; /* keeps every value inside an int */
    for (int i = 0; i < 3; i++) {
        size_t start = p;
        if (p >= end)
            return recipe_error(diag, text, p, i == 0 ? "missing block sizes after '-'"
                                                     : "block suffix has %d of the three sizes -b0-b1-b2", i);
        if (!mxi_is_digit(text[p]))
            return recipe_error(diag, text, p, "block size must be a positive decimal integer, found '%c'",
                                text[p]);
        long value = 0;
        while (p < end && mxi_is_digit(text[p])) {
            if (p - start >= MAX_DIGITS)
                return recipe_error(diag, text, start, "block size has more than %d digits", MAX_DIGITS);
            value = value * 10 + (text[p] - '0');
            p++;
        }
        if (value == 0) return recipe_error(diag, text, start, "block size must be positive, not 0");
        block[i] = (int)value;
        if (i < 2) {
            if (p >= end)
                return recipe_error(diag, text, p, "block suffix has %d of the three sizes -b0-b1-b2", i + 1);
            if (text[p] != '-') return recipe_error(diag, text, p, "unexpected '%c' in the block suffix", text[p]);
            p++;
        } else if (p < end) {
            if (text[p] == '-') return recipe_error(diag, text, p, "more than three block sizes");
            return recipe_error(diag, text, p, "unexpected '%c' after the block suffix", text[p]);
        }
    }
    return 0;
}

/* Each alias is its long form (docs/quantization-plan.md gives each one's anchor). */
static const struct {
    const char *alias, *long_form;
} recipe_aliases[] = {
    {.alias = "mxfp8", .long_form = "dynamic_mx-1-1-32_E4M3_E4M3_E4M3"},
    {.alias = "mxfp8-32x32", .long_form = "dynamic_mx-1-32-32_E4M3_E4M3_E4M3"},
    {.alias = "tensorwise", .long_form = "dynamic_per_tensor_E4M3_E4M3_E5M2"},
    {.alias = "delayed", .long_form = "delayed_per_tensor_E4M3_E4M3_E5M2"},
    {.alias = "rowwise", .long_form = "dynamic_per_channel_E4M3_E4M3_E4M3"},
    // with high_precision_gemms: [wgrad] (the alias sets it: mx_recipe.high_precision)
    {.alias = "rowwise_with_gw_hp", .long_form = "dynamic_per_channel_dgrad_w_per_tensor_E4M3_E4M3_E4M3"},
    {.alias = "blockwise", .long_form = "dynamic_per_block-1-128-128_E4M3_E4M3_E4M3"},
    {.alias = "hif8", .long_form = "dynamic_per_tensor_HIF8_HIF8_HIF8"},
    {.alias = "delayed_hif8_pertensor", .long_form = "delayed_per_tensor_HIF8_HIF8_HIF8"},
};

/* Whether a well-formed recipe is implemented; if not, fill diag with the reason. */
static int check_supported(const char *text, const mx_recipe *r, mx_diag *diag) {
    char quoted[MXI_QUOTE_SIZE], why[128];
    mxi_quote(quoted, sizeof quoted, text, strlen(text));
    if (r->strategy != MX_STRATEGY_DYNAMIC && r->granularity != MX_GRANULARITY_PER_TENSOR) {
        snprintf(why, sizeof why, "scaling strategy delayed is implemented for per_tensor granularity only");
    } else if (r->granularity == MX_GRANULARITY_PER_TENSOR) {
        return 0;   // any mix of E4M3, E5M2 and HIF8: each role's quantizer takes its own format
    } else if (r->granularity == MX_GRANULARITY_PER_CHANNEL) {
        return 0;   // HIF8 is refused by the parser: per_tensor only
    } else if (r->granularity == MX_GRANULARITY_PER_BLOCK) {
        // DeepSeek-V3's and TE Float8BlockScaling's: 1x128 activations and gradients, 128x128 weight tiles
        if (r->block[0] == 1 && r->block[1] == 128 && r->block[2] == 128) return 0;
        snprintf(why, sizeof why, "per_block blocks %d-%d-%d are not implemented (allowed: 1-128-128)", r->block[0],
                 r->block[1], r->block[2]);
    } else if (r->block[0] == 1 && r->block[2] == 32 && (r->block[1] == 1 || r->block[1] == 32)) {
        return 0;
    } else {
        snprintf(why, sizeof why, "mx blocks %d-%d-%d are not implemented", r->block[0], r->block[1], r->block[2]);
    }
    return mxi_diag(diag, MX_EUNSUPPORTED, "recipe '%s' is recognised but not supported yet: %s; " SUPPORTED_RECIPES,
                    quoted, why);
}

int mx_recipe_parse(const char *text, mx_recipe *out, mx_diag *diag) {
    if (!text || !out) return mxi_diag(diag, MX_ENULL, "mx_recipe_parse: NULL argument");
    memset(out, 0, sizeof *out);
    size_t len = strlen(text);
    if (len == 0) return recipe_error(diag, text, 0, "the recipe is empty");

    for (size_t i = 0; i < sizeof recipe_aliases / sizeof recipe_aliases[0]; i++) {
        if (!word_eq(text, len, recipe_aliases[i].alias)) continue;
        int rc = mx_recipe_parse(recipe_aliases[i].long_form, out, NULL);
        if (out->dgrad_weight_per_tensor) out->high_precision = MX_GEMM_WGRAD;   // rowwise_with_gw_hp
        return rc == MX_EUNSUPPORTED ? check_supported(text, out, diag) : rc;
    }

    /* Only letters, digits, '_' and '-' occur in a recipe; anything else is the fault. */
    for (size_t i = 0; i < len; i++) {
        char c = text[i];
        bool ok = mxi_is_digit(c) || (mxi_lower(c) >= 'a' && mxi_lower(c) <= 'z') || c == '_' || c == '-';
        if (!ok) {
            char q[16];
            size_t n = mxi_utf8_len((unsigned char)c);
            return recipe_error(diag, text, i, "unexpected character '%s'",
                                mxi_quote(q, sizeof q, &text[i], n < len - i ? n : len - i));
        }
    }

    /* Fields: no empty ones, then the first is the strategy and the last three the dtypes. */
    size_t n_fields = 1;
    for (size_t i = 0, start = 0; i <= len; i++) {
        if (i < len && text[i] != '_') continue;
        if (i == start)
            return recipe_error(diag, text, start, start == len ? "missing field at the end" : "empty field");
        if (i < len) n_fields++;
        start = i + 1;
    }
    size_t u_first = strcspn(text, "_");
    if (word_eq(text, u_first, "dynamic")) {
        out->strategy = MX_STRATEGY_DYNAMIC;
    } else if (word_eq(text, u_first, "delayed")) {
        out->strategy = MX_STRATEGY_DELAYED;
    } else if (n_fields == 1) {
        return recipe_error(diag, text, 0, "neither an alias (" RECIPE_ALIASES ") nor a long-form recipe");
    } else {
        char q[MXI_QUOTE_SIZE];
        return recipe_error(diag, text, 0, "scaling strategy '%s' is not dynamic or delayed",
                            mxi_quote(q, sizeof q, text, u_first));
    }
    if (n_fields < 5)
        return recipe_error(diag, text, len, "only %zu of the 5 '_'-separated fields (strategy, granularity, "
                                             "three dtypes)", n_fields);

    /* Offsets of the last three '_' (u[0] is the last). */
    size_t u[3], found = 0;
    for (size_t i = len; i-- > 0 && found < 3;)
        if (text[i] == '_') u[found++] = i;

    /* The granularity is everything between the strategy and the dtypes, up to a '-'. */
    size_t g_start = u_first + 1, g_end = u[2];
    size_t dash = g_start;
    while (dash < g_end && text[dash] != '-') dash++;
    if (dash == g_start) return recipe_error(diag, text, g_start, "missing scaling granularity before '-'");
    if (word_eq(text + g_start, dash - g_start, "mx")) {
        out->granularity = MX_GRANULARITY_MX;
    } else if (word_eq(text + g_start, dash - g_start, "per_tensor") ||
               word_eq(text + g_start, dash - g_start, "pertensor")) {
        out->granularity = MX_GRANULARITY_PER_TENSOR;
    } else if (word_eq(text + g_start, dash - g_start, "per_channel") ||
               word_eq(text + g_start, dash - g_start, "perchannel")) {
        out->granularity = MX_GRANULARITY_PER_CHANNEL;
    } else if (word_eq(text + g_start, dash - g_start, "per_channel_dgrad_w_per_tensor")) {
        out->granularity = MX_GRANULARITY_PER_CHANNEL;   // torchao's rowwise_with_gw_hp operands
        out->dgrad_weight_per_tensor = true;
    } else if (word_eq(text + g_start, dash - g_start, "per_block") ||
               word_eq(text + g_start, dash - g_start, "perblock")) {
        out->granularity = MX_GRANULARITY_PER_BLOCK;
    } else {
        char q[MXI_QUOTE_SIZE];
        return recipe_error(diag, text, g_start, "scaling granularity '%s' is not mx, per_tensor, per_channel, "
                            "per_channel_dgrad_w_per_tensor or per_block",
                            mxi_quote(q, sizeof q, text + g_start, dash - g_start));
    }
    if (dash < g_end) {
        if (out->granularity != MX_GRANULARITY_MX && out->granularity != MX_GRANULARITY_PER_BLOCK)
            return recipe_error(diag, text, dash, "a block suffix is only allowed with mx or per_block granularity");
        int rc = parse_block(text, dash + 1, g_end, out->block, diag);
        if (rc) return rc;
        out->has_block = true;
    } else if (out->granularity == MX_GRANULARITY_MX) {
        out->has_block = true; /* the default mx block */
        out->block[0] = 1, out->block[1] = 1, out->block[2] = 32;
    } else if (out->granularity == MX_GRANULARITY_PER_BLOCK) {
        out->has_block = true; /* DeepSeek-V3's: 1x128 activations, 128x128 weight tiles */
        out->block[0] = 1, out->block[1] = 128, out->block[2] = 128;
    }

    static const char *const dtype_names[3] = {"inputs", "weight", "grads"};
    mx_elem *dtypes[3] = {&out->inputs, &out->weight, &out->grads};
    size_t bounds[4] = {u[2], u[1], u[0], len};
    for (int k = 0; k < 3; k++) {
        size_t a = bounds[k] + 1, b = bounds[k + 1];
        int elem = parse_elem(text, a, b);
        if (elem < 0) {
            char q[MXI_QUOTE_SIZE];
            return recipe_error(diag, text, a, "%s dtype '%s' is not E4M3, E5M2 or HIF8", dtype_names[k],
                                mxi_quote(q, sizeof q, text + a, b - a));
        }
        // HiF8 has its own scaling (MindSpeed's per-tensor targets), no MX or block scales.
        if (elem == MX_HIF8 && out->granularity != MX_GRANULARITY_PER_TENSOR)
            return recipe_error(diag, text, a, "%s dtype HIF8 goes only with per_tensor granularity", dtype_names[k]);
        *dtypes[k] = (mx_elem)elem;
    }
    return check_supported(text, out, diag);
}

int mx_recipe_format(const mx_recipe *recipe, char *buf, size_t size) {
    static const char *const strategies[] = {"dynamic", "delayed"};
    static const char *const granularities[] = {"mx", "per_tensor", "per_channel", "per_block"};
    static const char *const elems[] = {"E4M3", "E5M2", "HIF8"};
    if (!recipe || (!buf && size > 0)) return MX_ENULL;
    const mx_recipe *r = recipe;
    if ((unsigned)r->strategy > MX_STRATEGY_DELAYED || (unsigned)r->granularity > MX_GRANULARITY_PER_BLOCK ||
        (unsigned)r->inputs > MX_HIF8 || (unsigned)r->weight > MX_HIF8 || (unsigned)r->grads > MX_HIF8)
        return MX_EENUM;
    if (r->granularity != MX_GRANULARITY_MX && r->granularity != MX_GRANULARITY_PER_BLOCK)
        return snprintf(buf, size, "%s_%s%s_%s_%s_%s", strategies[r->strategy], granularities[r->granularity],
                        r->granularity == MX_GRANULARITY_PER_CHANNEL && r->dgrad_weight_per_tensor ? "_dgrad_w_per_tensor" : "",
                        elems[r->inputs], elems[r->weight], elems[r->grads]);
    /* mx and per_block always print their block so that the canonical form is unambiguous. */
    bool mx = r->granularity == MX_GRANULARITY_MX;
    int b0 = 1, b1 = mx ? 1 : 128, b2 = mx ? 32 : 128;
    if (r->has_block) {
        if (r->block[0] <= 0 || r->block[1] <= 0 || r->block[2] <= 0) return MX_EINVAL;
        b0 = r->block[0], b1 = r->block[1], b2 = r->block[2];
    }
    return snprintf(buf, size, "%s_%s-%d-%d-%d_%s_%s_%s", strategies[r->strategy], granularities[r->granularity],
                    b0, b1, b2, elems[r->inputs],
                    elems[r->weight], elems[r->grads]);
}

mx_quant_family mx_recipe_family(const mx_recipe *recipe) {
    if (!recipe || recipe->granularity == MX_GRANULARITY_MX) return MX_FAMILY_MX;
    // a mix of HIF8 and FP8 belongs to the family of its inputs dtype (fprop's X, the first named)
    return recipe->inputs == MX_HIF8 ? MX_FAMILY_HIF8 : MX_FAMILY_FLOAT8;
}

const char *mx_family_name(mx_quant_family family) {
    switch (family) {
    case MX_FAMILY_MX: return "mx";
    case MX_FAMILY_FLOAT8: return "float8";
    case MX_FAMILY_HIF8: return "hif8";
    case MX_FAMILY_COUNT: break;
    }
    return NULL;
}
