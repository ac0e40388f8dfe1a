/* The `training.quantization_plan` block (SPEC §1) and module selection (SPEC §3). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "mxtrain/plan.h"

/* The seed's block, verbatim. */
#define SEED_BLOCK                                                      \
    "training:\n"                                                       \
    "  quantization_plan:\n"                                            \
    "    recipe_name: mxfp8\n"                                          \
    "    apply_modules: ['model.layers.{*}']\n"                         \
    "    ignored_modules: ['*lm_head', '*gate']\n"                      \
    "    quant_converters: ['quantize.linear.mx', 'quantize.moe.mx']\n" \
    "    enable_fsdp_low_precision_all_gather: True\n"                  \
    "    fsdp_low_precision_all_gather_mode: 'on-demand'\n"

#define QP_HEAD "training:\n  quantization_plan:\n"

static int load(const char *yaml, mx_plan *plan, mx_diag *diag) {
    return mx_plan_load_string(yaml, "cfg.yaml", plan, diag);
}

/* Every field of a plan left empty after an error. */
static bool plan_is_empty(const mx_plan *p) {
    return !p->enabled && !p->recipe_name && !p->apply && !p->n_apply && !p->ignored && !p->n_ignored &&
           !p->n_converters && !p->low_precision_all_gather;
}

static void check_seed_plan(const mx_plan *p) {
    CHECK(p->enabled);
    CHECK_STR_EQ(p->recipe_name, "mxfp8");
    CHECK_EQ_INT(p->recipe.strategy, MX_STRATEGY_DYNAMIC);
    CHECK_EQ_INT(p->recipe.granularity, MX_GRANULARITY_MX);
    CHECK_EQ_INT(p->recipe.block[1], 1);
    CHECK_EQ_INT(p->recipe.block[2], 32);
    CHECK_EQ_INT(p->n_apply, 1);
    if (p->n_apply == 1) {
        CHECK_STR_EQ(p->apply[0].text, "model.layers.{*}");
        CHECK_EQ_INT(p->apply[0].line, 4);
        CHECK(p->apply[0].compiled != NULL);
    }
    CHECK_EQ_INT(p->n_ignored, 2);
    if (p->n_ignored == 2) {
        CHECK_STR_EQ(p->ignored[0].text, "*lm_head");
        CHECK_STR_EQ(p->ignored[1].text, "*gate");
        CHECK_EQ_INT(p->ignored[0].line, 5);
        CHECK_EQ_INT(p->ignored[1].line, 5);
    }
    CHECK_EQ_INT(p->n_converters, 2);
    CHECK_EQ_INT(p->converters[0], MX_CONVERTER_LINEAR);
    CHECK_EQ_INT(p->converters[1], MX_CONVERTER_MOE);
    CHECK(p->low_precision_all_gather);
    CHECK_EQ_INT(p->all_gather_mode, MX_AG_ON_DEMAND);
    CHECK_EQ_INT(p->scale_mode, MX_SCALE_FLOOR);
}

static void check_default_plan(const mx_plan *p) {
    CHECK(!p->enabled);
    CHECK(p->recipe_name == NULL);
    CHECK_EQ_INT(p->n_apply, 1);
    if (p->n_apply == 1) {
        CHECK_STR_EQ(p->apply[0].text, "model.layers.{*}");
        CHECK_EQ_INT(p->apply[0].line, 0);
    }
    CHECK_EQ_INT(p->n_ignored, 2);
    if (p->n_ignored == 2) {
        CHECK_STR_EQ(p->ignored[0].text, "*lm_head");
        CHECK_STR_EQ(p->ignored[1].text, "*gate");
        CHECK_EQ_INT(p->ignored[1].line, 0);
    }
    CHECK_EQ_INT(p->n_converters, 1);
    CHECK_EQ_INT(p->converters[0], MX_CONVERTER_LINEAR);
    CHECK(p->low_precision_all_gather);
    CHECK_EQ_INT(p->all_gather_mode, MX_AG_ON_DEMAND);
    CHECK_EQ_INT(p->scale_mode, MX_SCALE_FLOOR);
}

/* ---- Loading ------------------------------------------------------------------------ */

static void test_seed_block(void) {
    mx_plan plan;
    mx_diag diag = {{0}};
    CHECK_EQ_INT(load(SEED_BLOCK, &plan, &diag), 0);
    CHECK_STR_EQ(diag.msg, "");
    check_seed_plan(&plan);
    mx_plan_free(&plan);
    CHECK(plan_is_empty(&plan));
    mx_plan_free(&plan); /* freeing twice is fine */
}

/* The block inside a full config: other sections and keys are left to the config loader. */
static void test_seed_block_in_full_config(void) {
    const char *yaml =
        "# a MindSpeed MM style config\n"
        "model:\n"
        "  hidden_size: 64\n"
        "  num_experts: 4\n"
        "parallel:\n"
        "  fully_shard_parallel_size: 2\n"
        "training:\n"
        "  micro_batch_size: 1\n"
        "  quantization_plan:\n"
        "    recipe_name: mxfp8\n"
        "    apply_modules: ['model.layers.{*}']\n"
        "    ignored_modules: ['*lm_head', '*gate']\n"
        "    quant_converters: ['quantize.linear.mx', 'quantize.moe.mx']\n"
        "    enable_fsdp_low_precision_all_gather: True\n"
        "    fsdp_low_precision_all_gather_mode: 'on-demand'\n"
        "  lr: 1.0e-4\n";
    mx_plan plan;
    mx_diag diag;
    CHECK_EQ_INT(load(yaml, &plan, &diag), 0);
    CHECK(plan.enabled);
    CHECK_EQ_INT(plan.n_converters, 2);
    CHECK_EQ_INT(plan.apply[0].line, 11);
    mx_plan_free(&plan);
}

static void test_load_file(void) {
    const char *path = mxt_tmp_path("plan.yaml");
    mxt_write_text(path, SEED_BLOCK);
    mx_plan plan;
    mx_diag diag;
    CHECK_EQ_INT(mx_plan_load_file(path, &plan, &diag), 0);
    check_seed_plan(&plan);
    mx_plan_free(&plan);

    /* A bad value names the file. */
    mxt_write_text(path, QP_HEAD "    scale_mode: ceil\n");
    CHECK_EQ_INT(mx_plan_load_file(path, &plan, &diag), MX_ECONFIG);
    char want[128];
    snprintf(want, sizeof want, "%s:3: training.quantization_plan.scale_mode: 'ceil' is not allowed", path);
    CHECK_STR_CONTAINS(diag.msg, want);
    CHECK(plan_is_empty(&plan));
    unlink(path);

    CHECK_EQ_INT(mx_plan_load_file(path, &plan, &diag), MX_EIO);
    CHECK_STR_CONTAINS(diag.msg, path);
    CHECK_STR_CONTAINS(diag.msg, "cannot open");
    CHECK(plan_is_empty(&plan));
    CHECK_EQ_INT(mx_plan_load_file("/tmp", &plan, &diag), MX_EIO);
    CHECK_STR_EQ(diag.msg, "/tmp: is a directory (allowed: a YAML quantization plan)");
    CHECK_EQ_INT(mx_plan_load_file("/dev/zero", &plan, &diag), MX_EIO);
    CHECK_STR_EQ(diag.msg, "/dev/zero: is a character device, not a regular file (allowed: a YAML quantization plan)");
    CHECK(plan_is_empty(&plan));
}

static void test_defaults(void) {
    static const char *const yamls[] = {
        "",
        "# only a comment\n",
        "---\n",
        "model:\n  hidden_size: 64\n",
        "training:\n  lr: 0.001\n",
        "training: {}\n",
    };
    for (size_t i = 0; i < sizeof yamls / sizeof yamls[0]; i++) {
        mx_plan plan;
        mx_diag diag = {{0}};
        int rc = load(yamls[i], &plan, &diag);
        CHECK_EQ_INT(rc, 0);
        if (rc) printf("    (yaml %zu: %s)\n", i, diag.msg);
        check_default_plan(&plan);
        mx_plan_free(&plan);
    }
    mx_plan plan;
    CHECK_EQ_INT(mx_plan_init_defaults(&plan), 0);
    check_default_plan(&plan);
    mx_plan_free(&plan);
    CHECK_EQ_INT(mx_plan_init_defaults(NULL), MX_ENULL);

    /* Only the recipe given: the rest keeps its defaults. */
    CHECK_EQ_INT(load(QP_HEAD "    recipe_name: mxfp8-32x32\n", &plan, NULL), 0);
    CHECK(plan.enabled);
    CHECK_STR_EQ(plan.recipe_name, "mxfp8-32x32");
    CHECK_EQ_INT(plan.recipe.block[1], 32);
    CHECK_EQ_INT(plan.n_converters, 1);
    CHECK_EQ_INT(plan.n_apply, 1);
    CHECK_EQ_INT(plan.apply[0].line, 0);
    CHECK_EQ_INT(plan.n_ignored, 2);
    mx_plan_free(&plan);

    /* The block without a recipe: quantization off, settings still read and checked. */
    CHECK_EQ_INT(load(QP_HEAD "    apply_modules: ['model.layers.0']\n", &plan, NULL), 0);
    CHECK(!plan.enabled);
    CHECK_STR_EQ(plan.apply[0].text, "model.layers.0");
    mx_plan_free(&plan);
}

static void test_aliases_and_forms(void) {
    const char *yaml = QP_HEAD
        "    quant_recipe: dynamic_mx-1-32-32_E4M3_E4M3_E5M2\n"
        "    quant_apply_modules: 'model.layers.{1-2}'\n"
        "    quant_ignored_modules:\n"
        "      - '*lm_head'\n"
        "      - model.layers.1.mlp.gate\n"
        "    converters: quantize.moe.mx\n"
        "    enable_fsdp_low_precision_all_gather: off\n"
        "    fsdp_low_precision_all_gather_mode: all\n"
        "    scale_mode: rceil\n";
    mx_plan plan;
    mx_diag diag;
    CHECK_EQ_INT(load(yaml, &plan, &diag), 0);
    CHECK(plan.enabled);
    CHECK_STR_EQ(plan.recipe_name, "dynamic_mx-1-32-32_E4M3_E4M3_E5M2");
    CHECK_EQ_INT(plan.recipe.grads, MX_E5M2);
    CHECK_EQ_INT(plan.n_apply, 1);
    CHECK_STR_EQ(plan.apply[0].text, "model.layers.{1-2}");
    CHECK_EQ_INT(plan.apply[0].line, 4);
    CHECK_EQ_INT(plan.n_ignored, 2);
    CHECK_STR_EQ(plan.ignored[1].text, "model.layers.1.mlp.gate");
    CHECK_EQ_INT(plan.ignored[0].line, 6);
    CHECK_EQ_INT(plan.ignored[1].line, 7);
    CHECK_EQ_INT(plan.n_converters, 1);
    CHECK_EQ_INT(plan.converters[0], MX_CONVERTER_MOE);
    CHECK(!plan.low_precision_all_gather);
    CHECK_EQ_INT(plan.all_gather_mode, MX_AG_ALL);
    CHECK_EQ_INT(plan.scale_mode, MX_SCALE_RCEIL);
    mx_plan_free(&plan);

    /* Converters keep the order written; an empty ignored list excludes nothing. */
    CHECK_EQ_INT(load(QP_HEAD "    recipe_name: MXFP8\n"
                              "    quant_converters: [quantize.moe.mx, quantize.linear.mx]\n"
                              "    ignored_modules: []\n",
                      &plan, &diag),
                 0);
    CHECK_EQ_INT(plan.converters[0], MX_CONVERTER_MOE);
    CHECK_EQ_INT(plan.converters[1], MX_CONVERTER_LINEAR);
    CHECK_EQ_INT(plan.n_ignored, 0);
    CHECK(plan.ignored == NULL);
    mx_plan_free(&plan);

    /* PyYAML's plain booleans. */
    static const char *const truths[] = {"true", "True", "TRUE", "yes", "Yes", "on", "ON"};
    static const char *const lies[] = {"false", "False", "FALSE", "no", "NO", "off", "Off"};
    for (int t = 0; t < 2; t++) {
        for (int i = 0; i < 7; i++) {
            char buf[256];
            snprintf(buf, sizeof buf, QP_HEAD "    enable_fsdp_low_precision_all_gather: %s\n",
                     t ? truths[i] : lies[i]);
            CHECK_EQ_INT(load(buf, &plan, &diag), 0);
            CHECK(plan.low_precision_all_gather == (t == 1));
            mx_plan_free(&plan);
        }
    }
    /* An explicit tag is honoured, if the text fits it. */
    CHECK_EQ_INT(load(QP_HEAD "    enable_fsdp_low_precision_all_gather: !!bool 'false'\n", &plan, &diag), 0);
    CHECK(!plan.low_precision_all_gather);
    mx_plan_free(&plan);
    CHECK_EQ_INT(load(QP_HEAD "    enable_fsdp_low_precision_all_gather: !!bool 'maybe'\n", &plan, &diag),
                 MX_ECONFIG);
    CHECK_EQ_INT(load(QP_HEAD "    recipe_name: !!str mxfp8\n", &plan, &diag), 0);
    CHECK(plan.enabled);
    mx_plan_free(&plan);
    /* Anchors and aliases work as in any YAML. */
    CHECK_EQ_INT(load("defaults: &pats ['model.layers.{*}', 'lm_head']\n"
                      QP_HEAD "    recipe_name: mxfp8\n    apply_modules: *pats\n",
                      &plan, &diag),
                 0);
    CHECK_EQ_INT(plan.n_apply, 2);
    mx_plan_free(&plan);
}

typedef struct {
    const char *yaml;
    int rc;
    int line;               /* the "cfg.yaml:LINE:" prefix; -1 for YAML syntax errors (checked by subs) */
    const char *subs[4];    /* substrings of the message */
} error_case;

#define ALLOWED_KEYS_TEXT                                                                       \
    "(allowed: recipe_name (alias quant_recipe), apply_modules (alias quant_apply_modules), "   \
    "ignored_modules (alias quant_ignored_modules), quant_converters (alias converters), "      \
    "enable_fsdp_low_precision_all_gather, fsdp_low_precision_all_gather_mode, scale_mode, "   \
    "high_precision_gemms, amax_history_len, amax_compute_algo, margin)"

static const error_case errors[] = {
    /* Unknown keys, aliases, duplicates. */
    {QP_HEAD "    recipe_name: mxfp8\n    recipe: mxfp8\n", MX_ECONFIG, 4,
     {"training.quantization_plan.recipe: unknown key; did you mean 'recipe_name'?", ALLOWED_KEYS_TEXT}},
    {QP_HEAD "    fsdp_mode: all\n", MX_ECONFIG, 3,
     {"training.quantization_plan.fsdp_mode: unknown key", ALLOWED_KEYS_TEXT}},
    {QP_HEAD "    recipe_name: mxfp8\n    quant_recipe: mxfp8\n", MX_ECONFIG, 4,
     {"training.quantization_plan.quant_recipe: given together with its alias recipe_name (line 3)"}},
    {QP_HEAD "    converters: [quantize.moe.mx]\n    quant_converters: [quantize.moe.mx]\n", MX_ECONFIG, 4,
     {"quant_converters: given together with its alias converters (line 3)"}},
    {QP_HEAD "    scale_mode: floor\n    recipe_name: mxfp8\n    scale_mode: rceil\n", MX_ECONFIG, 5,
     {"training.quantization_plan.scale_mode: duplicate key (first given at line 3)"}},
    {QP_HEAD "    ? [a]\n    : b\n", MX_ECONFIG, 3, {"training.quantization_plan: a list is not a key"}},
    /* The sections themselves. */
    {"training: 5\n", MX_ECONFIG, 1, {"training: 5 (an integer) is not a mapping"}},
    {"training:\n  - quantization_plan\n", MX_ECONFIG, 2, {"training: a list is not a mapping"}},
    {"training:\n", MX_ECONFIG, 1, {"training: an empty value is not a mapping"}},
    {"training:\n  quantization_plan: mxfp8\n", MX_ECONFIG, 2,
     {"training.quantization_plan: 'mxfp8' is not a mapping (allowed: a mapping with keys recipe_name"}},
    {"training:\n  quantization_plan:\n  lr: 1\n", MX_ECONFIG, 2,
     {"training.quantization_plan: an empty value is not a mapping"}},
    {"training:\n  quantization_plan: {}\n  quantization_plan: {}\n", MX_ECONFIG, 3,
     {"training.quantization_plan: duplicate key (first given at line 2)"}},
    {"training: {}\ntraining: {}\n", MX_ECONFIG, 2, {"training: duplicate key (first given at line 1)"}},
    {"- training\n", MX_ECONFIG, 1, {"the config is a list, not a mapping of sections"}},
    /* recipe_name. */
    {QP_HEAD "    recipe_name:\n", MX_ECONFIG, 3,
     {"training.quantization_plan.recipe_name: an empty value is not a recipe name (allowed: mxfp8, mxfp8-32x32, tensorwise, delayed, hif8, delayed_hif8_pertensor, rowwise, "
      "rowwise_with_gw_hp, blockwise or "
      "<scaling_strategy>_"}},
    {QP_HEAD "    recipe_name: ~\n", MX_ECONFIG, 3, {"recipe_name: ~ is not a recipe name"}},
    {QP_HEAD "    recipe_name: ''\n", MX_ECONFIG, 3, {"recipe_name: '' is not a recipe name"}},
    {QP_HEAD "    recipe_name: 8\n", MX_ECONFIG, 3, {"recipe_name: 8 (an integer) is not a recipe name"}},
    {QP_HEAD "    recipe_name: [mxfp8]\n", MX_ECONFIG, 3, {"recipe_name: a list is not a recipe name"}},
    {QP_HEAD "    recipe_name: mxfp9\n", MX_ERECIPE, 3,
     {"training.quantization_plan.recipe_name: recipe 'mxfp9': neither an alias (mxfp8, mxfp8-32x32, tensorwise, delayed, rowwise, "
      "rowwise_with_gw_hp, blockwise, hif8, delayed_hif8_pertensor) nor a "
      "long-form recipe at position 1 (expected <scaling_strategy>_"}},
    {QP_HEAD "    recipe_name: dynamic_mx-1-1-32_E4M3_E4M3_E4M2\n", MX_ERECIPE, 3,
     {"recipe_name: recipe 'dynamic_mx-1-1-32_E4M3_E4M3_E4M2': grads dtype 'E4M2' is not E4M3, E5M2 or HIF8 at position 29"}},
    {QP_HEAD "    quant_recipe: delayed_mx_E4M3_E4M3_E4M3\n", MX_EUNSUPPORTED, 3,
     {"training.quantization_plan.quant_recipe: recipe 'delayed_mx_E4M3_E4M3_E4M3' is recognised but not "
      "supported yet", "supported: dynamic_mx-1-1-32_*"}},
    /* Patterns. */
    {QP_HEAD "    apply_modules: []\n", MX_ECONFIG, 3,
     {"training.quantization_plan.apply_modules: an empty list selects nothing", "list at least one"}},
    {QP_HEAD "    apply_modules: 5\n", MX_ECONFIG, 3,
     {"apply_modules: 5 (an integer) is not a list of patterns (allowed: a list of module patterns"}},
    {QP_HEAD "    apply_modules: {a: b}\n", MX_ECONFIG, 3, {"apply_modules: a mapping is not a list of patterns"}},
    {QP_HEAD "    apply_modules: [[a]]\n", MX_ECONFIG, 3, {"apply_modules[0]: a list is not a pattern"}},
    {QP_HEAD "    apply_modules: ['model.layers.{x}']\n", MX_EPATTERN, 3,
     {"training.quantization_plan.apply_modules[0]: pattern 'model.layers.{x}': unexpected 'x' in braces at "
      "position 15 (allowed: {*}, {a-b} with a <= b, *, ?, literal characters)"}},
    {QP_HEAD "    apply_modules: 'model.layers.{3-1}'\n", MX_EPATTERN, 3,
     {"training.quantization_plan.apply_modules: pattern 'model.layers.{3-1}': range {3-1}"}},
    {QP_HEAD "    ignored_modules:\n      - '*lm_head'\n      - '*gate}'\n", MX_EPATTERN, 5,
     {"ignored_modules[1]: pattern '*gate}': unmatched '}' at position 6"}},
    {QP_HEAD "    quant_ignored_modules: ['']\n", MX_EPATTERN, 3,
     {"quant_ignored_modules[0]: pattern '': empty pattern at position 1"}},
    {QP_HEAD "    ignored_modules:\n", MX_ECONFIG, 3, {"ignored_modules: an empty value is not a list of patterns"}},
    {QP_HEAD "    ignored_modules: [lm_head, 12]\n", MX_ECONFIG, 3,
     {"ignored_modules[1]: 12 (an integer) is not a pattern"}},
    /* Converters. */
    {QP_HEAD "    quant_converters: ['quantize.linear.fp8']\n", MX_ECONFIG, 3,
     {"training.quantization_plan.quant_converters[0]: 'quantize.linear.fp8' is not allowed (allowed: "
      "'quantize.linear.mx', 'quantize.moe.mx', 'quantize.linear.float8', 'quantize.moe.float8', "
      "'quantize.linear.hif8', 'quantize.moe.hif8')"}},
    /* A converter of another family than the recipe's; families mixed; scale modes of another granularity. */
    {QP_HEAD "    recipe_name: tensorwise\n    quant_converters: ['quantize.linear.mx']\n", MX_ECONFIG, 4,
     {"cfg.yaml:4: training.quantization_plan.quant_converters: converters of family mx do not go with recipe "
      "'tensorwise' (allowed: 'quantize.linear.float8', 'quantize.moe.float8')"}},
    {QP_HEAD "    converters: quantize.moe.hif8\n    recipe_name: mxfp8\n", MX_ECONFIG, 3,
     {"training.quantization_plan.converters: converters of family hif8 do not go with recipe 'mxfp8' "
      "(allowed: 'quantize.linear.mx', 'quantize.moe.mx')"}},
    {QP_HEAD "    recipe_name: hif8\n    quant_converters: [quantize.linear.float8]\n", MX_ECONFIG, 4,
     {"converters of family float8 do not go with recipe 'hif8' (allowed: 'quantize.linear.hif8', "
      "'quantize.moe.hif8')"}},
    {QP_HEAD "    quant_converters: [quantize.linear.float8, quantize.moe.hif8]\n", MX_ECONFIG, 3,
     {"quant_converters[1]: 'quantize.moe.hif8' is of family hif8, the converters before it of float8 (allowed: "
      "converters of one family, the recipe's)"}},
    {QP_HEAD "    recipe_name: mxfp8\n    scale_mode: pow2\n", MX_ECONFIG, 4,
     {"training.quantization_plan.scale_mode: 'pow2' does not go with recipe 'mxfp8' (allowed: 'floor', 'rceil')"}},
    {QP_HEAD "    scale_mode: fp32\n    recipe_name: dynamic_mx-1-32-32_E4M3_E4M3_E4M3\n", MX_ECONFIG, 3,
     {"scale_mode: 'fp32' does not go with recipe 'dynamic_mx-1-32-32_E4M3_E4M3_E4M3' (allowed: 'floor', 'rceil')"}},
    {QP_HEAD "    recipe_name: tensorwise\n    scale_mode: rceil\n", MX_ECONFIG, 4,
     {"training.quantization_plan.scale_mode: 'rceil' does not go with recipe 'tensorwise' (allowed: 'fp32', 'pow2')"}},
    {QP_HEAD "    recipe_name: hif8\n    scale_mode: floor\n", MX_ECONFIG, 4,
     {"scale_mode: 'floor' does not go with recipe 'hif8' (allowed: 'fp32', 'pow2')"}},
    {QP_HEAD "    recipe_name: delayed_hif8_pertensor\n    scale_mode: pow2\n", MX_ECONFIG, 4,
     {"training.quantization_plan.scale_mode: 'pow2' is not implemented for delayed recipe 'delayed_hif8_pertensor' "
      "(allowed: 'fp32')"}},
    /* a mix of HiF8 and FP8 belongs to its inputs dtype's family: the other one is refused */
    {QP_HEAD "    recipe_name: dynamic_per_tensor_E4M3_E4M3_HIF8\n    quant_converters: [quantize.linear.hif8]\n", MX_ECONFIG,
     4, {"cfg.yaml:4: training.quantization_plan.quant_converters: converters of family hif8 do not go with recipe "
         "'dynamic_per_tensor_E4M3_E4M3_HIF8' (allowed: 'quantize.linear.float8', 'quantize.moe.float8')"}},
    {QP_HEAD "    recipe_name: dynamic_per_tensor_HIF8_HIF8_E5M2\n    quant_converters: [quantize.moe.float8]\n", MX_ECONFIG,
     4, {"cfg.yaml:4: training.quantization_plan.quant_converters: converters of family float8 do not go with recipe "
         "'dynamic_per_tensor_HIF8_HIF8_E5M2' (allowed: 'quantize.linear.hif8', 'quantize.moe.hif8')"}},
    /* The recipes not implemented yet keep their line: per_block blocks other than 1-128-128. */
    {QP_HEAD "    recipe_name: dynamic_per_block-128-128-128_E4M3_E4M3_E4M3\n", MX_EUNSUPPORTED, 3,
     {"cfg.yaml:3: training.quantization_plan.recipe_name: recipe 'dynamic_per_block-128-128-128_E4M3_E4M3_E4M3' is "
      "recognised but not supported yet: per_block blocks 128-128-128 are not implemented (allowed: 1-128-128)"}},
    /* high_precision_gemms: a list of products, each once. */
    {QP_HEAD "    recipe_name: rowwise\n    high_precision_gemms: [wgrad, bprop]\n", MX_ECONFIG, 4,
     {"cfg.yaml:4: training.quantization_plan.high_precision_gemms[1]: 'bprop' is not a product (allowed: a list of "
      "'fprop', 'dgrad', 'wgrad', each at most once, such as ['wgrad'])"}},
    {QP_HEAD "    recipe_name: mxfp8\n    high_precision_gemms: [dgrad, dgrad]\n", MX_ECONFIG, 4,
     {"high_precision_gemms[1]: 'dgrad' is listed twice (allowed: a list of 'fprop', 'dgrad', 'wgrad'"}},
    {QP_HEAD "    recipe_name: tensorwise\n    high_precision_gemms: 3\n", MX_ECONFIG, 4,
     {"high_precision_gemms: 3 (an integer) is not a list of products (allowed: a list of 'fprop'"}},
    {QP_HEAD "    recipe_name: tensorwise\n    high_precision_gemms: {wgrad: 1}\n", MX_ECONFIG, 4,
     {"high_precision_gemms: a mapping is not a list of products"}},
    {QP_HEAD "    recipe_name: tensorwise\n    high_precision_gemms: [WGRAD]\n", MX_ECONFIG, 4,
     {"high_precision_gemms[0]: 'WGRAD' is not a product"}},
    {QP_HEAD "    recipe_name: dynamic_per_block-1-1-128_E4M3_E4M3_E4M3\n", MX_EUNSUPPORTED, 3,
     {"per_block blocks 1-1-128 are not implemented (allowed: 1-128-128)"}},
    /* blockwise: fp32 or pow2 scales, no delayed scaling key. */
    {QP_HEAD "    recipe_name: blockwise\n    scale_mode: rceil\n", MX_ECONFIG, 4,
     {"training.quantization_plan.scale_mode: 'rceil' does not go with recipe 'blockwise' (allowed: 'fp32', 'pow2')"}},
    {QP_HEAD "    recipe_name: blockwise\n    amax_history_len: 16\n", MX_ECONFIG, 4,
     {"training.quantization_plan.amax_history_len: 16 (an integer): delayed scaling's key, but recipe 'blockwise' "
      "scales from the current amax (allowed: only with delayed, delayed_hif8_pertensor or a delayed_per_tensor_* "
      "recipe)"}},
    {QP_HEAD "    recipe_name: blockwise\n    margin: 1\n", MX_ECONFIG, 4, {"margin: 1 (an integer): delayed scaling's key"}},
    {QP_HEAD "    amax_compute_algo: max\n    recipe_name: blockwise\n", MX_ECONFIG, 3,
     {"amax_compute_algo: 'max': delayed scaling's key, but recipe 'blockwise'"}},
    {QP_HEAD "    recipe_name: blockwise\n    quant_converters: [quantize.linear.mx]\n", MX_ECONFIG, 4,
     {"converters of family mx do not go with recipe 'blockwise' (allowed: 'quantize.linear.float8', "
      "'quantize.moe.float8')"}},
    /* Delayed scaling's keys: only with a delayed recipe, each in its range. */
    {QP_HEAD "    recipe_name: tensorwise\n    amax_history_len: 16\n", MX_ECONFIG, 4,
     {"training.quantization_plan.amax_history_len: 16 (an integer): delayed scaling's key, but recipe 'tensorwise' "
      "scales from the current amax (allowed: only with delayed, delayed_hif8_pertensor or a delayed_per_tensor_* "
      "recipe)"}},
    {QP_HEAD "    margin: 1\n    recipe_name: mxfp8\n", MX_ECONFIG, 3,
     {"training.quantization_plan.margin: 1 (an integer): delayed scaling's key, but recipe 'mxfp8'"}},
    {QP_HEAD "    recipe_name: hif8\n    amax_compute_algo: max\n", MX_ECONFIG, 4,
     {"training.quantization_plan.amax_compute_algo: 'max': delayed scaling's key, but recipe 'hif8'"}},
    {QP_HEAD "    recipe_name: delayed\n    amax_history_len: 0\n", MX_ECONFIG, 4,
     {"training.quantization_plan.amax_history_len: 0 (an integer) is out of range (allowed: an integer from 1 to "
      "65536)"}},
    {QP_HEAD "    recipe_name: delayed\n    amax_history_len: 99999999999999999999\n", MX_ECONFIG, 4,
     {"amax_history_len: 99999999999999999999 (an integer) is out of range (allowed: an integer from 1 to 65536)"}},
    {QP_HEAD "    recipe_name: delayed\n    amax_history_len: '16'\n", MX_ECONFIG, 4,
     {"amax_history_len: '16' is not an integer (allowed: an integer from 1 to 65536)"}},
    {QP_HEAD "    recipe_name: delayed\n    amax_compute_algo: mean\n", MX_ECONFIG, 4,
     {"training.quantization_plan.amax_compute_algo: 'mean' is not allowed (allowed: 'max', 'most_recent')"}},
    {QP_HEAD "    recipe_name: delayed_hif8_pertensor\n    margin: -1\n", MX_ECONFIG, 4,
     {"training.quantization_plan.margin: -1 (an integer) is out of range (allowed: an integer from 0 to 64)"}},
    {QP_HEAD "    recipe_name: delayed\n    margin: 0.5\n", MX_ECONFIG, 4,
     {"margin: 0.5 (a number) is not an integer (allowed: an integer from 0 to 64)"}},
    {QP_HEAD "    recipe_name: delayed\n    scale_mode: pow2\n", MX_ECONFIG, 4,
     {"training.quantization_plan.scale_mode: 'pow2' is not implemented for delayed recipe 'delayed' (allowed: "
      "'fp32')"}},
    {QP_HEAD "    quant_converters:\n      - quantize.linear.mx\n      - quantize.linear.mx\n", MX_ECONFIG, 5,
     {"quant_converters[1]: 'quantize.linear.mx' is listed twice (first at line 4"}},
    {QP_HEAD "    converters: []\n", MX_ECONFIG, 3, {"converters: an empty list converts nothing"}},
    {QP_HEAD "    converters: quantize.moe\n", MX_ECONFIG, 3, {"converters: 'quantize.moe' is not allowed"}},
    /* Booleans and choices. */
    {QP_HEAD "    enable_fsdp_low_precision_all_gather: 'True'\n", MX_ECONFIG, 3,
     {"training.quantization_plan.enable_fsdp_low_precision_all_gather: 'True' is a quoted string, not a boolean "
      "(allowed: true, false, unquoted)"}},
    {QP_HEAD "    enable_fsdp_low_precision_all_gather: maybe\n", MX_ECONFIG, 3,
     {"enable_fsdp_low_precision_all_gather: 'maybe' is not a boolean (allowed: true, false)"}},
    {QP_HEAD "    enable_fsdp_low_precision_all_gather: 1\n", MX_ECONFIG, 3,
     {"enable_fsdp_low_precision_all_gather: 1 (an integer) is not a boolean"}},
    {QP_HEAD "    enable_fsdp_low_precision_all_gather:\n", MX_ECONFIG, 3,
     {"enable_fsdp_low_precision_all_gather: an empty value is not a boolean"}},
    {QP_HEAD "    fsdp_low_precision_all_gather_mode: 5\n", MX_ECONFIG, 3,
     {"fsdp_low_precision_all_gather_mode: 5 (an integer) is not allowed (allowed: 'on-demand', 'all')"}},
    {QP_HEAD "    fsdp_low_precision_all_gather_mode: 'ALL'\n", MX_ECONFIG, 3,
     {"fsdp_low_precision_all_gather_mode: 'ALL' is not allowed"}},
    {QP_HEAD "    scale_mode: 1.5\n", MX_ECONFIG, 3,
     {"scale_mode: 1.5 (a number) is not allowed (allowed: 'floor', 'rceil' (mx recipes), 'fp32', 'pow2' (per_tensor, "
      "per_channel and per_block recipes))"}},
    {QP_HEAD "    scale_mode: on\n", MX_ECONFIG, 3, {"scale_mode: on (a boolean) is not allowed"}},
    /* YAML itself. */
    {QP_HEAD "    recipe_name: mxfp8\n    apply_modules: ['model.layers.{*}'\n    ignored_modules: []\n",
     MX_ECONFIG, -1, {"cfg.yaml:5:", "YAML syntax error: did not find expected ',' or ']'"}},
    {QP_HEAD "    ignored_modules: [*lm_head]\n", MX_ECONFIG, -1, {"cfg.yaml:3:23: YAML syntax error: found undefined alias"}},
    {"training:\n\tquantization_plan: {}\n", MX_ECONFIG, -1, {"cfg.yaml:2:1: YAML syntax error: found character that cannot start any token"}},
    {"training:\n  quantization_plan:\n    recipe_name: \"mx\xff\"\n", MX_ECONFIG, -1,
     {"cfg.yaml:3:21: invalid YAML input: invalid leading UTF-8 octet (byte 0xFF)"}},
    {SEED_BLOCK "---\nmodel: {}\n", MX_ECONFIG, 9, {"a second YAML document starts here"}},
};

static void test_errors(void) {
    for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++) {
        const error_case *c = &errors[i];
        mx_plan plan;
        mx_diag diag = {{0}};
        int rc = load(c->yaml, &plan, &diag);
        int before = mxt_current_failures();
        CHECK_EQ_INT(rc, c->rc);
        if (c->line > 0) {
            char prefix[32];
            snprintf(prefix, sizeof prefix, "cfg.yaml:%d: ", c->line);
            CHECK(strncmp(diag.msg, prefix, strlen(prefix)) == 0);
        }
        for (int s = 0; s < 4 && c->subs[s]; s++) CHECK_STR_CONTAINS(diag.msg, c->subs[s]);
        CHECK(strchr(diag.msg, '\n') == NULL);
        CHECK(plan_is_empty(&plan));
        if (mxt_current_failures() > before) printf("    (case %zu: %s)\n", i, diag.msg);
        mx_plan_free(&plan);
    }
}

/* The guide's example, exactly. */
static void test_exact_message(void) {
    const char *yaml = "# quantization\n"
                       "training:\n"
                       "  quantization_plan:\n"
                       "    recipe_name: mxfp8\n"
                       "    apply_modules: ['model.layers.{*}']\n"
                       "    enable_fsdp_low_precision_all_gather: True\n"
                       "    fsdp_low_precision_all_gather_mode: 'ondemand'\n";
    mx_plan plan;
    mx_diag diag;
    CHECK_EQ_INT(load(yaml, &plan, &diag), MX_ECONFIG);
    CHECK_STR_EQ(diag.msg, "cfg.yaml:7: training.quantization_plan.fsdp_low_precision_all_gather_mode: 'ondemand' "
                           "is not allowed (allowed: 'on-demand', 'all')");
}

static void test_null_arguments(void) {
    mx_plan plan;
    mx_diag diag;
    CHECK_EQ_INT(mx_plan_load_string(NULL, "x", &plan, &diag), MX_ENULL);
    CHECK(plan_is_empty(&plan));
    CHECK_EQ_INT(mx_plan_load_string("", "x", NULL, &diag), MX_ENULL);
    CHECK_EQ_INT(mx_plan_load_file(NULL, &plan, &diag), MX_ENULL);
    CHECK_EQ_INT(mx_plan_load_file("x", NULL, &diag), MX_ENULL);
    mx_plan_free(NULL);
    /* No source name and no diag are fine. */
    CHECK_EQ_INT(mx_plan_load_string(QP_HEAD "    scale_mode: x\n", NULL, &plan, &diag), MX_ECONFIG);
    CHECK_STR_CONTAINS(diag.msg, "<string>:3: ");
    CHECK_EQ_INT(mx_plan_load_string(QP_HEAD "    scale_mode: x\n", "c", &plan, NULL), MX_ECONFIG);
}

/* ---- Selection ---------------------------------------------------------------------- */

enum { MAX_MODULES = 256 };

typedef struct {
    char names[MAX_MODULES][64];
    mx_module modules[MAX_MODULES];
    int n;
} module_tree;

static void add_module(module_tree *t, mx_module_kind kind, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void add_module(module_tree *t, mx_module_kind kind, const char *fmt, ...) {
    if (t->n >= MAX_MODULES) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->names[t->n], sizeof t->names[t->n], fmt, ap);
    va_end(ap);
    t->modules[t->n].fqn = t->names[t->n];
    t->modules[t->n].kind = kind;
    t->n++;
}

/* A Qwen3-MoE-like model: odd layers are MoE (router mlp.gate + mlp.experts), even ones
 * dense (gate_proj, up_proj, down_proj), as with decoder_sparse_step 2. */
static void build_tree(module_tree *t, int n_layers) {
    t->n = 0;
    add_module(t, MX_MODULE_OTHER, "model.embed_tokens");
    for (int l = 0; l < n_layers; l++) {
        add_module(t, MX_MODULE_OTHER, "model.layers.%d.input_layernorm", l);
        add_module(t, MX_MODULE_LINEAR, "model.layers.%d.self_attn.q_proj", l);
        add_module(t, MX_MODULE_LINEAR, "model.layers.%d.self_attn.k_proj", l);
        add_module(t, MX_MODULE_LINEAR, "model.layers.%d.self_attn.v_proj", l);
        add_module(t, MX_MODULE_LINEAR, "model.layers.%d.self_attn.o_proj", l);
        add_module(t, MX_MODULE_OTHER, "model.layers.%d.self_attn.q_norm", l);
        add_module(t, MX_MODULE_OTHER, "model.layers.%d.self_attn.k_norm", l);
        add_module(t, MX_MODULE_OTHER, "model.layers.%d.post_attention_layernorm", l);
        if (l % 2 == 1) {
            add_module(t, MX_MODULE_LINEAR, "model.layers.%d.mlp.gate", l);
            add_module(t, MX_MODULE_EXPERTS, "model.layers.%d.mlp.experts", l);
        } else {
            add_module(t, MX_MODULE_LINEAR, "model.layers.%d.mlp.gate_proj", l);
            add_module(t, MX_MODULE_LINEAR, "model.layers.%d.mlp.up_proj", l);
            add_module(t, MX_MODULE_LINEAR, "model.layers.%d.mlp.down_proj", l);
        }
    }
    add_module(t, MX_MODULE_OTHER, "model.norm");
    add_module(t, MX_MODULE_LINEAR, "lm_head");
}

static int find_module(const module_tree *t, const char *fqn) {
    for (int i = 0; i < t->n; i++)
        if (!strcmp(t->names[i], fqn)) return i;
    mxt_fail(__FILE__, __LINE__, "no module %s in the test tree", fqn);
    return 0;
}

static const mx_decision *decision_of(const module_tree *t, const mx_selection *s, const char *fqn) {
    return &s->decisions[find_module(t, fqn)];
}

static const char *explain(const mx_plan *plan, const module_tree *t, const mx_selection *s, const char *fqn,
                           char *buf, size_t size) {
    int i = find_module(t, fqn);
    int n = mx_decision_explain(plan, &t->modules[i], &s->decisions[i], buf, size);
    if (n < 0) snprintf(buf, size, "(error %d)", n);
    return buf;
}

/* Load yaml and select over tree; returns 0 or the load error. */
static int plan_and_select(const char *yaml, const module_tree *t, mx_plan *plan, mx_selection *sel) {
    mx_diag diag;
    int rc = load(yaml, plan, &diag);
    if (rc) {
        mxt_fail(__FILE__, __LINE__, "load: %s", diag.msg);
        memset(sel, 0, sizeof *sel);
        return rc;
    }
    rc = mx_plan_select(plan, t->modules, t->n, sel);
    CHECK_EQ_INT(rc, 0);
    CHECK_EQ_INT(sel->n_modules, t->n);
    return rc;
}

/* The names of converted modules, comma-separated, for whole-selection checks. */
static void converted_list(const module_tree *t, const mx_selection *s, char *buf, size_t size) {
    size_t o = 0;
    buf[0] = '\0';
    for (int i = 0; i < t->n; i++)
        if (s->decisions[i].converted) o += (size_t)snprintf(buf + o, size - o, "%s%s", o ? "," : "", t->names[i]);
}

static void test_select_seed(void) {
    module_tree *t = malloc(sizeof *t);
    build_tree(t, 4);
    CHECK_EQ_INT(t->n, 45);
    mx_plan plan;
    mx_selection sel;
    if (plan_and_select(SEED_BLOCK, t, &plan, &sel)) goto done;
    char buf[256];

    /* Attention and dense MLP projections of every layer, and the experts of MoE layers. */
    for (int l = 0; l < 4; l++) {
        static const char *const attn[] = {"q_proj", "k_proj", "v_proj", "o_proj"};
        for (int k = 0; k < 4; k++) {
            snprintf(buf, sizeof buf, "model.layers.%d.self_attn.%s", l, attn[k]);
            const mx_decision *d = decision_of(t, &sel, buf);
            CHECK(d->converted);
            CHECK_EQ_INT(d->reason, MX_REASON_CONVERTED);
            CHECK_EQ_INT(d->converter, MX_CONVERTER_LINEAR);
            CHECK_EQ_INT(d->apply_index, 0);
            CHECK_EQ_INT(d->apply_matched_len, strlen("model.layers.0"));
            CHECK_EQ_INT(d->ignore_index, -1);
        }
    }
    const mx_decision *d = decision_of(t, &sel, "model.layers.0.mlp.gate_proj");
    CHECK(d->converted);
    d = decision_of(t, &sel, "model.layers.2.mlp.down_proj");
    CHECK(d->converted);
    d = decision_of(t, &sel, "model.layers.1.mlp.experts");
    CHECK(d->converted);
    CHECK_EQ_INT(d->converter, MX_CONVERTER_MOE);
    CHECK_STR_EQ(explain(&plan, t, &sel, "model.layers.1.mlp.experts", buf, sizeof buf),
                 "converted by quantize.moe.mx: applied by 'model.layers.{*}' (matched model.layers.1)");
    CHECK_STR_EQ(explain(&plan, t, &sel, "model.layers.3.self_attn.q_proj", buf, sizeof buf),
                 "converted by quantize.linear.mx: applied by 'model.layers.{*}' (matched model.layers.3)");

    /* The routers: applied, then excluded by '*gate'. */
    d = decision_of(t, &sel, "model.layers.3.mlp.gate");
    CHECK(!d->converted);
    CHECK_EQ_INT(d->reason, MX_REASON_EXCLUDED);
    CHECK_EQ_INT(d->apply_index, 0);
    CHECK_EQ_INT(d->ignore_index, 1);
    CHECK_EQ_INT(d->ignore_matched_len, strlen("model.layers.3.mlp.gate"));
    CHECK_STR_EQ(explain(&plan, t, &sel, "model.layers.1.mlp.gate", buf, sizeof buf),
                 "not converted: excluded by '*gate' (matched model.layers.1.mlp.gate)");

    /* lm_head: outside model.layers.{*}, and also matched by '*lm_head'. */
    d = decision_of(t, &sel, "lm_head");
    CHECK(!d->converted);
    CHECK_EQ_INT(d->reason, MX_REASON_NOT_APPLIED);
    CHECK_EQ_INT(d->apply_index, -1);
    CHECK_EQ_INT(d->ignore_index, 0);
    CHECK_STR_EQ(explain(&plan, t, &sel, "lm_head", buf, sizeof buf), "not converted: not matched by apply_modules");

    /* Norms and embeddings are never converted. */
    static const char *const others[] = {"model.embed_tokens", "model.norm", "model.layers.2.input_layernorm",
                                         "model.layers.1.self_attn.q_norm",
                                         "model.layers.1.post_attention_layernorm"};
    for (int i = 0; i < 5; i++) {
        d = decision_of(t, &sel, others[i]);
        CHECK(!d->converted);
        CHECK_EQ_INT(d->reason, MX_REASON_NOT_HANDLED);
        CHECK_STR_EQ(explain(&plan, t, &sel, others[i], buf, sizeof buf),
                     "not converted: not a linear layer or MoE experts");
    }

    /* Exactly: 4 layers x 4 attention + 2 dense layers x 3 + 2 experts. */
    int n_converted = 0;
    for (int i = 0; i < t->n; i++) n_converted += sel.decisions[i].converted;
    CHECK_EQ_INT(n_converted, 16 + 6 + 2);
    CHECK_EQ_INT(sel.n_warnings, 0);
    mx_selection_free(&sel);
    mx_selection_free(&sel);
    mx_plan_free(&plan);
done:
    free(t);
}

/* Without quantize.moe.mx listed, experts are left alone; '*experts' excludes them too. */
static void test_select_moe_converter(void) {
    module_tree *t = malloc(sizeof *t);
    build_tree(t, 4);
    mx_plan plan;
    mx_selection sel;
    char buf[256];
    if (plan_and_select(QP_HEAD "    recipe_name: mxfp8\n", t, &plan, &sel) == 0) {
        const mx_decision *d = decision_of(t, &sel, "model.layers.1.mlp.experts");
        CHECK(!d->converted);
        CHECK_EQ_INT(d->reason, MX_REASON_NOT_HANDLED);
        CHECK_STR_EQ(explain(&plan, t, &sel, "model.layers.1.mlp.experts", buf, sizeof buf),
                     "not converted: no listed converter handles MoE experts");
        CHECK(decision_of(t, &sel, "model.layers.1.self_attn.q_proj")->converted);
        CHECK_EQ_INT(sel.n_warnings, 0); /* defaults never warn */
        mx_selection_free(&sel);
        mx_plan_free(&plan);
    }
    if (plan_and_select(QP_HEAD "    recipe_name: mxfp8\n    quant_converters: [quantize.moe.mx]\n", t, &plan,
                        &sel) == 0) {
        CHECK(decision_of(t, &sel, "model.layers.3.mlp.experts")->converted);
        const mx_decision *d = decision_of(t, &sel, "model.layers.0.self_attn.q_proj");
        CHECK_EQ_INT(d->reason, MX_REASON_NOT_HANDLED);
        CHECK_STR_EQ(explain(&plan, t, &sel, "model.layers.0.self_attn.q_proj", buf, sizeof buf),
                     "not converted: no listed converter handles linear layers");
        /* The router is a linear layer: no linear converter, so not handled at all. */
        CHECK_EQ_INT(decision_of(t, &sel, "model.layers.1.mlp.gate")->reason, MX_REASON_NOT_HANDLED);
        mx_selection_free(&sel);
        mx_plan_free(&plan);
    }
    if (plan_and_select(QP_HEAD "    recipe_name: mxfp8\n"
                                "    ignored_modules: ['*lm_head', '*gate', '*experts']\n"
                                "    quant_converters: ['quantize.linear.mx', 'quantize.moe.mx']\n",
                        t, &plan, &sel) == 0) {
        const mx_decision *d = decision_of(t, &sel, "model.layers.3.mlp.experts");
        CHECK(!d->converted);
        CHECK_EQ_INT(d->reason, MX_REASON_EXCLUDED);
        CHECK_EQ_INT(d->ignore_index, 2);
        CHECK_STR_EQ(explain(&plan, t, &sel, "model.layers.3.mlp.experts", buf, sizeof buf),
                     "not converted: excluded by '*experts' (matched model.layers.3.mlp.experts)");
        CHECK(decision_of(t, &sel, "model.layers.2.mlp.up_proj")->converted);
        CHECK_EQ_INT(sel.n_warnings, 0);
        mx_selection_free(&sel);
        mx_plan_free(&plan);
    }
    free(t);
}

/* The per-tensor recipes: their family, both of its converters when none are listed, the
 * scale modes of per_tensor. */
static void test_per_tensor_recipes(void) {
    module_tree *t = malloc(sizeof *t);
    build_tree(t, 4);
    mx_plan plan;
    mx_selection sel;
    char buf[256];
    if (plan_and_select(QP_HEAD "    recipe_name: tensorwise\n", t, &plan, &sel) == 0) {
        CHECK_EQ_INT(plan.family, MX_FAMILY_FLOAT8);
        CHECK_EQ_INT(plan.tensor_scale_mode, MX_TSCALE_FP32);
        CHECK_EQ_INT(plan.n_converters, 2);
        CHECK(decision_of(t, &sel, "model.layers.3.mlp.experts")->converted);
        CHECK_STR_EQ(explain(&plan, t, &sel, "model.layers.3.mlp.experts", buf, sizeof buf),
                     "converted by quantize.moe.float8: applied by 'model.layers.{*}' (matched model.layers.3)");
        CHECK_STR_EQ(explain(&plan, t, &sel, "model.layers.0.self_attn.q_proj", buf, sizeof buf),
                     "converted by quantize.linear.float8: applied by 'model.layers.{*}' (matched model.layers.0)");
        CHECK(mx_plan_low_precision_gather(&plan));   // per-tensor weights are gathered as codes
        mx_selection_free(&sel);
        mx_plan_free(&plan);
    }
    if (plan_and_select(QP_HEAD "    recipe_name: HIF8\n    quant_converters: quantize.moe.hif8\n", t, &plan, &sel) == 0) {
        CHECK_EQ_INT(plan.family, MX_FAMILY_HIF8);
        CHECK_EQ_INT(plan.n_converters, 1);
        CHECK_EQ_INT(plan.converters[0], MX_CONVERTER_MOE);
        CHECK(!decision_of(t, &sel, "model.layers.0.self_attn.q_proj")->converted);
        CHECK_STR_EQ(explain(&plan, t, &sel, "model.layers.3.mlp.experts", buf, sizeof buf),
                     "converted by quantize.moe.hif8: applied by 'model.layers.{*}' (matched model.layers.3)");
        mx_selection_free(&sel);
        mx_plan_free(&plan);
    }
    mx_diag diag;
    CHECK_EQ_INT(load(QP_HEAD "    scale_mode: pow2\n    recipe_name: dynamic_per_tensor_E5M2_E5M2_E5M2\n", &plan, &diag), 0);
    CHECK_EQ_INT(plan.tensor_scale_mode, MX_TSCALE_POW2);
    CHECK_EQ_INT(plan.family, MX_FAMILY_FLOAT8);
    mx_plan_free(&plan);
    /* delayed: TE's defaults (history 1024, max, margin 0), and the keys as given */
    CHECK_EQ_INT(load(QP_HEAD "    recipe_name: delayed\n", &plan, &diag), 0);
    CHECK_EQ_INT(plan.recipe.strategy, MX_STRATEGY_DELAYED);
    CHECK_EQ_INT(plan.family, MX_FAMILY_FLOAT8);
    CHECK_EQ_INT(plan.n_converters, 2);
    CHECK_EQ_INT(plan.amax_history_len, 1024);
    CHECK_EQ_INT(plan.amax_compute_algo, MX_AMAX_MAX);
    CHECK_EQ_INT(plan.margin, 0);
    CHECK(mx_plan_low_precision_gather(&plan));
    mx_plan_free(&plan);
    CHECK_EQ_INT(load(QP_HEAD "    recipe_name: Delayed_HIF8_PerTensor\n    amax_history_len: 0x10\n"
                      "    amax_compute_algo: most_recent\n    margin: 3\n", &plan, &diag), 0);
    CHECK_EQ_INT(plan.family, MX_FAMILY_HIF8);
    CHECK_EQ_INT(plan.amax_history_len, 16);
    CHECK_EQ_INT(plan.amax_compute_algo, MX_AMAX_MOST_RECENT);
    CHECK_EQ_INT(plan.margin, 3);
    mx_plan_free(&plan);
    /* blockwise: float8's two converters, power-of-two scales unless told fp32, the weights
     * gathered as codes, its operands in blocks */
    CHECK_EQ_INT(load(QP_HEAD "    recipe_name: blockwise\n", &plan, &diag), 0);
    CHECK_EQ_INT(plan.recipe.granularity, MX_GRANULARITY_PER_BLOCK);
    CHECK_EQ_INT(plan.family, MX_FAMILY_FLOAT8);
    CHECK_EQ_INT(plan.n_converters, 2);
    CHECK_EQ_INT(plan.tensor_scale_mode, MX_TSCALE_POW2);
    CHECK(mx_plan_low_precision_gather(&plan));
    CHECK(mx_plan_gather_fallback(&plan) == NULL);
    mx_plan_operand ops[6];
    CHECK_EQ_INT(mx_plan_operands(&plan, ops), 6);
    CHECK_STR_EQ(ops[0].axis, "1x128 blocks of X, along in");
    CHECK_STR_EQ(ops[3].axis, "128x128 tiles of W (out x in)");
    CHECK_STR_EQ(ops[5].axis, "128x1 blocks of X, along rows (of one expert group)");
    CHECK_STR_EQ(ops[4].scale, "power of two per block, max / amax");
    mx_plan_free(&plan);
    CHECK_EQ_INT(load(QP_HEAD "    recipe_name: blockwise\n    scale_mode: fp32\n    "
                      "enable_fsdp_low_precision_all_gather: false\n", &plan, &diag), 0);
    CHECK_EQ_INT(plan.tensor_scale_mode, MX_TSCALE_FP32);
    CHECK(!mx_plan_gather_fallback(&plan));   // not asked for
    CHECK_EQ_INT(mx_plan_operands(&plan, ops), 6);
    CHECK_STR_EQ(ops[1].scale, "fp32 per block, max / amax");
    mx_plan_free(&plan);
    /* mx keeps SPEC §1's default converter list, and its low-precision all-gather */
    CHECK_EQ_INT(load(QP_HEAD "    recipe_name: mxfp8\n", &plan, &diag), 0);
    CHECK_EQ_INT(plan.family, MX_FAMILY_MX);
    CHECK_EQ_INT(plan.n_converters, 1);
    CHECK(mx_plan_low_precision_gather(&plan));
    mx_plan_free(&plan);
    free(t);
}

/* The guide's `model.layers.0.self_attn`: the four projections of layer 0, not layer 10's. */
static void test_select_layer0_attention(void) {
    module_tree *t = malloc(sizeof *t);
    build_tree(t, 12);
    mx_plan plan;
    mx_selection sel;
    char list[4096];
    if (plan_and_select(QP_HEAD "    recipe_name: mxfp8\n    apply_modules: ['model.layers.0.self_attn']\n", t,
                        &plan, &sel) == 0) {
        converted_list(t, &sel, list, sizeof list);
        CHECK_STR_EQ(list, "model.layers.0.self_attn.q_proj,model.layers.0.self_attn.k_proj,"
                           "model.layers.0.self_attn.v_proj,model.layers.0.self_attn.o_proj");
        const mx_decision *d = decision_of(t, &sel, "model.layers.0.self_attn.v_proj");
        CHECK_EQ_INT(d->apply_matched_len, strlen("model.layers.0.self_attn"));
        CHECK_EQ_INT(decision_of(t, &sel, "model.layers.10.self_attn.q_proj")->reason, MX_REASON_NOT_APPLIED);
        CHECK_EQ_INT(sel.n_warnings, 0);
        mx_selection_free(&sel);
        mx_plan_free(&plan);
    }
    free(t);
}

/* Every apply pattern counts, not only the first. */
static void test_select_multiple_apply(void) {
    module_tree *t = malloc(sizeof *t);
    build_tree(t, 4);
    mx_plan plan;
    mx_selection sel;
    char list[4096], buf[256];
    if (plan_and_select(QP_HEAD "    recipe_name: mxfp8\n"
                                "    apply_modules: ['model.layers.0.self_attn', 'model.layers.3.mlp', lm_head]\n"
                                "    ignored_modules: ['*gate']\n"
                                "    quant_converters: ['quantize.linear.mx', 'quantize.moe.mx']\n",
                        t, &plan, &sel) == 0) {
        converted_list(t, &sel, list, sizeof list);
        CHECK_STR_EQ(list, "model.layers.0.self_attn.q_proj,model.layers.0.self_attn.k_proj,"
                           "model.layers.0.self_attn.v_proj,model.layers.0.self_attn.o_proj,"
                           "model.layers.3.mlp.experts,lm_head");
        const mx_decision *d = decision_of(t, &sel, "model.layers.3.mlp.experts");
        CHECK_EQ_INT(d->apply_index, 1);
        CHECK_STR_EQ(explain(&plan, t, &sel, "model.layers.3.mlp.experts", buf, sizeof buf),
                     "converted by quantize.moe.mx: applied by 'model.layers.3.mlp' (matched model.layers.3.mlp)");
        CHECK_EQ_INT(decision_of(t, &sel, "model.layers.3.mlp.gate")->reason, MX_REASON_EXCLUDED);
        CHECK_EQ_INT(decision_of(t, &sel, "lm_head")->apply_index, 2);
        CHECK_STR_EQ(explain(&plan, t, &sel, "lm_head", buf, sizeof buf),
                     "converted by quantize.linear.mx: applied by 'lm_head' (matched lm_head)");
        CHECK_EQ_INT(sel.n_warnings, 0);
        mx_selection_free(&sel);
        mx_plan_free(&plan);
    }
    /* Everything applied: lm_head is then excluded by '*lm_head'. */
    if (plan_and_select(QP_HEAD "    recipe_name: mxfp8\n    apply_modules: '*'\n", t, &plan, &sel) == 0) {
        const mx_decision *d = decision_of(t, &sel, "lm_head");
        CHECK_EQ_INT(d->reason, MX_REASON_EXCLUDED);
        CHECK_EQ_INT(d->ignore_index, 0);
        CHECK_STR_EQ(explain(&plan, t, &sel, "lm_head", buf, sizeof buf),
                     "not converted: excluded by '*lm_head' (matched lm_head)");
        CHECK_EQ_INT(decision_of(t, &sel, "model.layers.1.self_attn.q_proj")->apply_matched_len, 5);
        mx_selection_free(&sel);
        mx_plan_free(&plan);
    }
    free(t);
}

static void test_select_ranges(void) {
    module_tree *t = malloc(sizeof *t);
    build_tree(t, 4);
    mx_plan plan;
    mx_selection sel;
    if (plan_and_select(QP_HEAD "    recipe_name: mxfp8\n    apply_modules: ['model.layers.{1-2}']\n"
                                "    quant_converters: ['quantize.linear.mx', 'quantize.moe.mx']\n",
                        t, &plan, &sel) == 0) {
        for (int i = 0; i < t->n; i++) {
            const char *name = t->names[i];
            bool in_range = !strncmp(name, "model.layers.1.", 15) || !strncmp(name, "model.layers.2.", 15);
            size_t len = strlen(name);
            bool router = len >= 9 && !strcmp(name + len - 9, ".mlp.gate"); /* excluded by '*gate' */
            bool want = in_range && t->modules[i].kind != MX_MODULE_OTHER && !router;
            if (sel.decisions[i].converted != want) mxt_fail(__FILE__, __LINE__, "%s: converted %d", name, !want);
        }
        CHECK(decision_of(t, &sel, "model.layers.1.mlp.experts")->converted);
        CHECK(decision_of(t, &sel, "model.layers.2.mlp.gate_proj")->converted);
        CHECK(!decision_of(t, &sel, "model.layers.3.mlp.experts")->converted);
        CHECK(!decision_of(t, &sel, "model.layers.0.self_attn.q_proj")->converted);
        mx_selection_free(&sel);
        mx_plan_free(&plan);
    }
    free(t);
}

static void test_select_warnings(void) {
    module_tree *t = malloc(sizeof *t);
    build_tree(t, 4);
    mx_plan plan;
    mx_selection sel;
    /* Typos warn by name and line; working patterns stay quiet. */
    if (plan_and_select(QP_HEAD "    recipe_name: mxfp8\n"
                                "    apply_modules:\n"
                                "      - model.layer.{*}\n"
                                "      - model.layers.{*}\n"
                                "      - model.norm\n"
                                "      - model.layers.1.mlp.experts\n"
                                "    ignored_modules: ['*lm_haed', '*gate', 'model.norm']\n",
                        t, &plan, &sel) == 0) {
        CHECK_EQ_INT(sel.n_warnings, 4);
        if (sel.n_warnings == 4) {
            CHECK_STR_EQ(sel.warnings[0], "apply_modules pattern 'model.layer.{*}' (line 5) selects no module");
            /* Only norms: no listed converter handles it. */
            CHECK_STR_EQ(sel.warnings[1], "apply_modules pattern 'model.norm' (line 7) selects no module");
            /* Experts exist, but quantize.moe.mx is not listed. */
            CHECK_STR_EQ(sel.warnings[2],
                         "apply_modules pattern 'model.layers.1.mlp.experts' (line 8) selects no module");
            CHECK_STR_EQ(sel.warnings[3], "ignored_modules pattern '*lm_haed' (line 9) matches no module");
        }
        /* lm_head is not excluded by the typo, but still not applied. */
        CHECK_EQ_INT(decision_of(t, &sel, "lm_head")->ignore_index, -1);
        mx_selection_free(&sel);
        mx_plan_free(&plan);
    }
    /* The defaults never warn, even where they select nothing (no routers in a dense model). */
    mx_plan defaults;
    CHECK_EQ_INT(mx_plan_init_defaults(&defaults), 0);
    CHECK_EQ_INT(mx_plan_select(&defaults, t->modules, 1, &sel), 0); /* only the embedding */
    CHECK_EQ_INT(sel.n_warnings, 0);
    mx_selection_free(&sel);
    /* With no modules at all, every pattern written in the config warns. */
    mx_diag diag;
    CHECK_EQ_INT(load(SEED_BLOCK, &plan, &diag), 0);
    CHECK_EQ_INT(mx_plan_select(&plan, NULL, 0, &sel), 0);
    CHECK_EQ_INT(sel.n_modules, 0);
    CHECK_EQ_INT(sel.n_warnings, 3);
    mx_selection_free(&sel);
    mx_plan_free(&plan);
    mx_plan_free(&defaults);
    free(t);
}

static void test_select_quant_off(void) {
    module_tree *t = malloc(sizeof *t);
    build_tree(t, 2);
    mx_plan plan;
    mx_selection sel;
    char buf[128];
    CHECK_EQ_INT(mx_plan_init_defaults(&plan), 0);
    CHECK_EQ_INT(mx_plan_select(&plan, t->modules, t->n, &sel), 0);
    for (int i = 0; i < t->n; i++) {
        CHECK(!sel.decisions[i].converted);
        CHECK_EQ_INT(sel.decisions[i].reason,
                     t->modules[i].kind == MX_MODULE_LINEAR ? MX_REASON_QUANT_OFF : MX_REASON_NOT_HANDLED);
    }
    CHECK_STR_EQ(explain(&plan, t, &sel, "model.layers.0.self_attn.q_proj", buf, sizeof buf),
                 "not converted: quantization off (no recipe_name)");
    mx_selection_free(&sel);
    mx_plan_free(&plan);
    free(t);
}

static void test_select_arguments(void) {
    mx_plan plan;
    mx_selection sel;
    CHECK_EQ_INT(mx_plan_init_defaults(&plan), 0);
    mx_module m = {"model.layers.0.self_attn.q_proj", MX_MODULE_LINEAR};
    CHECK_EQ_INT(mx_plan_select(NULL, &m, 1, &sel), MX_ENULL);
    CHECK_EQ_INT(mx_plan_select(&plan, &m, 1, NULL), MX_ENULL);
    CHECK_EQ_INT(mx_plan_select(&plan, NULL, 1, &sel), MX_ENULL);
    CHECK_EQ_INT(mx_plan_select(&plan, &m, -1, &sel), MX_ESIZE);
    mx_module bad = {NULL, MX_MODULE_LINEAR};
    CHECK_EQ_INT(mx_plan_select(&plan, &bad, 1, &sel), MX_ENULL);
    CHECK(sel.decisions == NULL && sel.warnings == NULL);

    /* explain as snprintf: full length with a short or absent buffer. */
    plan.enabled = true;
    CHECK_EQ_INT(mx_plan_select(&plan, &m, 1, &sel), 0);
    char buf[16];
    const char *full = "converted by quantize.linear.mx: applied by 'model.layers.{*}' (matched model.layers.0)";
    CHECK_EQ_INT(mx_decision_explain(&plan, &m, &sel.decisions[0], NULL, 0), (long long)strlen(full));
    CHECK_EQ_INT(mx_decision_explain(&plan, &m, &sel.decisions[0], buf, sizeof buf), (long long)strlen(full));
    CHECK_STR_EQ(buf, "converted by qu");
    CHECK_EQ_INT(mx_decision_explain(NULL, &m, &sel.decisions[0], buf, sizeof buf), MX_ENULL);
    mx_decision broken = sel.decisions[0];
    broken.apply_index = 7;
    CHECK_EQ_INT(mx_decision_explain(&plan, &m, &broken, buf, sizeof buf), MX_EINVAL);
    CHECK_STR_EQ(mx_converter_name(MX_CONVERTER_LINEAR), "quantize.linear.mx");
    CHECK_STR_EQ(mx_converter_name(MX_CONVERTER_MOE), "quantize.moe.mx");
    CHECK(mx_converter_name(MX_CONVERTER_COUNT) == NULL);
    mx_selection_free(&sel);
    mx_selection_free(NULL);
    mx_plan_free(&plan);
}

static const mxt_test tests[] = {
    {"plan_seed_block", test_seed_block},
    {"plan_seed_block_in_full_config", test_seed_block_in_full_config},
    {"plan_load_file", test_load_file},
    {"plan_defaults", test_defaults},
    {"plan_aliases_and_forms", test_aliases_and_forms},
    {"plan_errors", test_errors},
    {"plan_exact_message", test_exact_message},
    {"plan_null_arguments", test_null_arguments},
    {"select_seed", test_select_seed},
    {"select_moe_converter", test_select_moe_converter},
    {"select_per_tensor_recipes", test_per_tensor_recipes},
    {"select_layer0_attention", test_select_layer0_attention},
    {"select_multiple_apply", test_select_multiple_apply},
    {"select_ranges", test_select_ranges},
    {"select_warnings", test_select_warnings},
    {"select_quant_off", test_select_quant_off},
    {"select_arguments", test_select_arguments},
};

int main(int argc, char **argv) { return MXT_RUN(tests, argc, argv); }
