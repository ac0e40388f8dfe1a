/* mxtrain — the quantization plan: recipes (SPEC §2), module patterns (SPEC §3), the
 * `training.quantization_plan` config block (SPEC §1), and module selection (SPEC §3).
 */
#ifndef MXTRAIN_PLAN_H
#define MXTRAIN_PLAN_H

#include <stdbool.h>
#include <stddef.h>

#include "mxtrain/error.h"
#include "mxtrain/mx.h"
#include "mxtrain/scaled.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Recipes ------------------------------------------------------------------------ */

/* The recipe grammar, as printed in error messages. */
#define MX_RECIPE_GRAMMAR \
    "<scaling_strategy>_<scaling_granularity>[-b0-b1-b2]_<inputs_dtype>_<weight_dtype>_<grads_dtype>"

typedef enum { MX_STRATEGY_DYNAMIC = 0, MX_STRATEGY_DELAYED = 1 } mx_strategy;
typedef enum {
    MX_GRANULARITY_MX = 0,
    MX_GRANULARITY_PER_TENSOR = 1,
    MX_GRANULARITY_PER_CHANNEL = 2,
    MX_GRANULARITY_PER_BLOCK = 3,
} mx_granularity;

/* The three products of a converted linear layer, as bits of a set (high_precision_gemms):
 * fprop Y = X W^T, dgrad dX = dY W, wgrad dW = dY^T X. */
typedef enum { MX_GEMM_FPROP = 1, MX_GEMM_DGRAD = 2, MX_GEMM_WGRAD = 4, MX_GEMM_ALL = 7 } mx_gemm_set;

typedef struct {
    mx_strategy strategy;
    mx_granularity granularity;
    bool has_block;         /* a -b0-b1-b2 suffix was given (always true for mx and per_block:
                               defaults 1-1-32 and 1-128-128) */
    int block[3];           /* block extents over (token, in, out) */
    mx_elem inputs, weight, grads;
    bool dgrad_weight_per_tensor; /* granularity per_channel_dgrad_w_per_tensor: per_channel, but
                                     dgrad's weight with one scale per tensor (torchao's
                                     rowwise_with_gw_hp) */
    unsigned high_precision;      /* mx_gemm_set bits the alias implies (rowwise_with_gw_hp: wgrad) */
} mx_recipe;

/* Parse a recipe name: the long form or an alias (`mxfp8`, `mxfp8-32x32`, `tensorwise`,
 * `delayed`, `rowwise`, `rowwise_with_gw_hp`, `blockwise`, `hif8`, `delayed_hif8_pertensor`),
 * words case-insensitive. Returns 0 when the recipe is implemented (strategy dynamic with
 * granularity mx and blocks 1-1-32 or 1-32-32; strategy dynamic or delayed with granularity
 * per_tensor and E4M3/E5M2 in every role or HIF8 in every role; strategy dynamic with
 * per_channel / per_channel_dgrad_w_per_tensor and E4M3/E5M2; strategy dynamic with per_block,
 * blocks 1-128-128 and E4M3/E5M2); MX_EUNSUPPORTED for a well-formed recipe that is not implemented yet (out is
 * filled all the same); MX_ERECIPE for a malformed one, with diag showing the grammar and
 * the 1-based position of the fault; MX_ENULL for NULL pointers. */
int mx_recipe_parse(const char *text, mx_recipe *out, mx_diag *diag);

/* The canonical long form of a recipe, e.g. "dynamic_mx-1-1-32_E4M3_E4M3_E4M3".
 * Returns the length written (as snprintf), or a negative code. */
int mx_recipe_format(const mx_recipe *recipe, char *buf, size_t size);

/* The converter family of a recipe: `mx` (granularity mx), `hif8` (HiF8 inputs: a per_tensor
 * recipe's other roles may be E4M3 or E5M2), `float8` (the other FP8 recipes: per_tensor,
 * with HIF8 in other roles than the inputs too, per_channel, per_block). */
typedef enum { MX_FAMILY_MX = 0, MX_FAMILY_FLOAT8 = 1, MX_FAMILY_HIF8 = 2, MX_FAMILY_COUNT = 3 } mx_quant_family;

mx_quant_family mx_recipe_family(const mx_recipe *recipe);

/* "mx", "float8", "hif8"; NULL for unknown values. */
const char *mx_family_name(mx_quant_family family);

/* ---- Module patterns ---------------------------------------------------------------- */

/* A compiled module pattern (whole-string match): `{*}` one or more digits, `{a-b}` an
 * integer a <= n <= b, `*` any run of characters (dots included, possibly empty), `?` one
 * character, everything else literal. A `{...}` matches a whole number: its digits are not
 * preceded or followed by another digit. */
typedef struct mx_pattern mx_pattern;

/* Compile a pattern. Returns MX_EPATTERN with diag naming the position for bad braces
 * (`{x}`, `{3-1}`, `{`, `{1-}`, a lone `}`) or an empty pattern. */
int mx_pattern_compile(const char *text, mx_pattern **out, mx_diag *diag);
void mx_pattern_free(mx_pattern *pattern);

/* Whether the pattern matches the whole of name. */
bool mx_pattern_match(const mx_pattern *pattern, const char *name);

/* Whether the pattern matches fqn or one of its ancestors (the prefixes of fqn that end
 * before a '.'). On a match, *matched_len (if not NULL) is the length of the shortest
 * matching prefix; fqn itself counts as the longest. */
bool mx_pattern_match_module(const mx_pattern *pattern, const char *fqn, size_t *matched_len);

/* ---- The plan ----------------------------------------------------------------------- */

typedef enum { MX_CONVERTER_LINEAR = 0, MX_CONVERTER_MOE = 1, MX_CONVERTER_COUNT = 2 } mx_converter;
/* Delayed scaling's keys: the history's default and largest length, the largest margin
 * (2^-margin times 448 stays a normal fp32 number). */
#define MX_PLAN_AMAX_HISTORY_DEFAULT 1024
#define MX_PLAN_AMAX_HISTORY_MAX 65536
#define MX_PLAN_MARGIN_MAX 64
/* Delayed scaling's amax from the history (TE DelayedScaling.amax_compute_algo). */
typedef enum { MX_AMAX_MAX = 0, MX_AMAX_MOST_RECENT = 1 } mx_amax_algo;
typedef enum { MX_AG_ON_DEMAND = 0, MX_AG_ALL = 1 } mx_ag_mode;

/* "quantize.linear.mx", "quantize.moe.mx"; NULL for unknown values. */
const char *mx_converter_name(mx_converter converter);

/* The converter's name in a family: "quantize.linear.float8", "quantize.moe.hif8", ...;
 * NULL for unknown values. */
const char *mx_converter_family_name(mx_converter converter, mx_quant_family family);

typedef struct {
    char *text;            /* as written */
    mx_pattern *compiled;
    int line;              /* 1-based line in the config, 0 for a default */
} mx_plan_pattern;

typedef struct {
    bool enabled;                        /* recipe_name given: quantization on */
    char *recipe_name;                   /* as written, NULL when off */
    mx_recipe recipe;                    /* recipe_name parsed; all zero when off */
    mx_quant_family family;              /* the recipe's converter family (mx when off) */
    mx_scale_mode scale_mode;            /* `scale_mode: floor|rceil` (mx recipes), default floor */
    mx_tscale_mode tensor_scale_mode;    /* `scale_mode: fp32|pow2` (per_tensor, per_channel and per_block
                                            recipes), default fp32 (per_tensor), pow2 (per_channel, torchao's;
                                            per_block, TE's and DeepSeek-V3's) */
    unsigned high_precision_gemms;       /* mx_gemm_set: products run unquantized, in the model's
                                            precision (high_precision_gemms, and the recipe's own) */
    int amax_history_len;                /* delayed recipes: amaxes kept per tensor and role, default 1024 */
    mx_amax_algo amax_compute_algo;      /* delayed recipes: `max` (default) or `most_recent` */
    int margin;                          /* delayed recipes: scale = (max / amax) / 2^margin, default 0 */
    mx_plan_pattern *apply;              /* apply_modules (alias quant_apply_modules) */
    int n_apply;
    mx_plan_pattern *ignored;            /* ignored_modules (alias quant_ignored_modules) */
    int n_ignored;
    mx_converter converters[MX_CONVERTER_COUNT]; /* quant_converters (alias converters), in order, as
                                                    kinds: their family is the recipe's; left out: the
                                                    linear one for mx (SPEC §1), both for the others */
    int n_converters;
    bool low_precision_all_gather;       /* enable_fsdp_low_precision_all_gather, default true */
    mx_ag_mode all_gather_mode;          /* fsdp_low_precision_all_gather_mode, default on-demand */
} mx_plan;

/* The defaults of SPEC §1 with quantization off. Returns 0 or MX_ENOMEM. */
int mx_plan_init_defaults(mx_plan *plan);

/* Whether converted weights are gathered quantized: quantization on, the all-gather key
 * true, a recipe whose low-precision all-gather is implemented (mx, per_tensor: dynamic and
 * delayed, per_channel; not per_block), and neither fprop nor dgrad in high_precision_gemms (they read
 * the weight unquantized); otherwise weights gather in the param dtype. */
bool mx_plan_low_precision_gather(const mx_plan *plan);

/* Why a plan that asks for the low-precision all-gather (the key true) gathers in the param
 * dtype instead, as one phrase; NULL when it does gather quantized, or does not ask. */
const char *mx_plan_gather_fallback(const mx_plan *plan);

/* Load `training.quantization_plan` from a YAML config file (other sections are not looked
 * at here). A file without the block gives the defaults with quantization off. Every error
 * (MX_EIO, MX_ECONFIG, MX_ERECIPE, MX_EUNSUPPORTED, MX_EPATTERN) fills diag with one line
 * naming the file, line, key, value and what is allowed; plan is then left empty. */
int mx_plan_load_file(const char *path, mx_plan *plan, mx_diag *diag);

/* As mx_plan_load_file, from YAML text; source_name stands for the file in messages. */
int mx_plan_load_string(const char *yaml, const char *source_name, mx_plan *plan, mx_diag *diag);

/* Release what a plan owns; the plan is left empty and may be freed again. */
void mx_plan_free(mx_plan *plan);

/* One operand of a converted linear layer's three products, as `mxtrain plan` prints the
 * recipe: X (rows, in) inputs, W (out, in) weight, dY (rows, out) output gradients. */
typedef struct {
    const char *product;   /* "fprop" (Y = X W^T), "dgrad" (dX = dY W), "wgrad" (dW = dY^T X) */
    const char *operand;   /* "X", "W", "dY" */
    mx_elem elem;
    char scale[80];        /* the scale granularity and how it is made */
    const char *axis;      /* which elements share a scale */
    bool high_precision;   /* the product runs unquantized (high_precision_gemms): elem, scale
                              and axis do not apply */
} mx_plan_operand;

/* The six operands of the plan's recipe (two per product, in the order fprop, dgrad, wgrad).
 * Returns 6, MX_ENULL, or MX_EINVAL when quantization is off. */
int mx_plan_operands(const mx_plan *plan, mx_plan_operand out[6]);

/* ---- Selection ---------------------------------------------------------------------- */

typedef enum {
    MX_MODULE_LINEAR = 0,   /* a linear layer: quantize.linear.mx handles it */
    MX_MODULE_EXPERTS = 1,  /* the experts of an MoE layer: quantize.moe.mx handles it */
    MX_MODULE_OTHER = 2,    /* norms, embeddings, containers: never converted */
} mx_module_kind;

typedef struct {
    const char *fqn;        /* e.g. "model.layers.3.self_attn.q_proj" */
    mx_module_kind kind;
} mx_module;

typedef enum {
    MX_REASON_CONVERTED = 0,     /* applied, not excluded, a listed converter handles it */
    MX_REASON_QUANT_OFF = 1,     /* the plan has no recipe */
    MX_REASON_NOT_HANDLED = 2,   /* no listed converter handles this kind of module */
    MX_REASON_NOT_APPLIED = 3,   /* no apply_modules pattern matches it or an ancestor */
    MX_REASON_EXCLUDED = 4,      /* an ignored_modules pattern matches it or an ancestor */
} mx_reason;

typedef struct {
    bool converted;
    mx_reason reason;
    mx_converter converter;      /* the converter handling the module (valid unless NOT_HANDLED / OTHER) */
    int apply_index;             /* first apply pattern matching it or an ancestor, -1 if none */
    size_t apply_matched_len;    /* length of the fqn prefix that pattern matched */
    int ignore_index;            /* first ignored pattern matching, -1 if none */
    size_t ignore_matched_len;
} mx_decision;

typedef struct {
    mx_decision *decisions;      /* one per module, in the order given */
    int n_modules;
    char **warnings;             /* one line each: a pattern written in the config that selects nothing */
    int n_warnings;
} mx_selection;

/* Decide, for every module, whether the plan converts it and why (SPEC §3). The reason is
 * the first that holds of: OTHER module or converter not listed (NOT_HANDLED), plan off
 * (QUANT_OFF), no apply pattern (NOT_APPLIED), an ignored pattern (EXCLUDED), else CONVERTED;
 * apply_index and ignore_index are filled for every handled module whatever the reason.
 * Warnings: an apply pattern from the config that reaches no module a listed converter
 * handles, and an ignored pattern from the config that matches no module at all. Returns 0,
 * MX_ENULL, MX_ESIZE or MX_ENOMEM; out is zeroed on error. */
int mx_plan_select(const mx_plan *plan, const mx_module *modules, int n_modules, mx_selection *out);
void mx_selection_free(mx_selection *selection);

/* One line explaining a decision, e.g. "converted by quantize.linear.mx: applied by
 * 'model.layers.{*}' (matched model.layers.3)" or "not converted: excluded by '*gate'".
 * Returns the length written (as snprintf). */
int mx_decision_explain(const mx_plan *plan, const mx_module *module, const mx_decision *decision,
                        char *buf, size_t size);

#ifdef __cplusplus
}
#endif

#endif
