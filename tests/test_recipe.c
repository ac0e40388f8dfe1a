/* Recipe names (SPEC §2): long forms, aliases, unsupported and malformed recipes. */
#include <stdio.h>
#include <string.h>

#include "harness.h"
#include "mxtrain/plan.h"

#define SUPPORTED_TAIL                                                                         \
    "; supported: dynamic_mx-1-1-32_*, dynamic_mx-1-32-32_* (aliases mxfp8, mxfp8-32x32), "  \
    "dynamic_per_tensor_* and delayed_per_tensor_* with E4M3/E5M2/HIF8 in each role (aliases tensorwise, "     \
    "delayed, hif8, delayed_hif8_pertensor), dynamic_per_channel_* and "                                          \
    "dynamic_per_channel_dgrad_w_per_tensor_* with E4M3/E5M2 (aliases rowwise, rowwise_with_gw_hp), "            \
    "dynamic_per_block-1-128-128_* with E4M3/E5M2 (alias blockwise)"

typedef struct {
    const char *in;
    int rc;
    const char *canon; /* 0 and MX_EUNSUPPORTED: the canonical long form */
    int pos;           /* MX_ERECIPE: the 1-based fault position */
    const char *sub;   /* MX_ERECIPE / MX_EUNSUPPORTED: a substring of the message */
} recipe_case;

static const recipe_case cases[] = {
    /* Implemented. */
    {"mxfp8", 0, "dynamic_mx-1-1-32_E4M3_E4M3_E4M3", 0, NULL},
    {"MXFP8", 0, "dynamic_mx-1-1-32_E4M3_E4M3_E4M3", 0, NULL},
    {"MxFp8", 0, "dynamic_mx-1-1-32_E4M3_E4M3_E4M3", 0, NULL},
    {"mxfp8-32x32", 0, "dynamic_mx-1-32-32_E4M3_E4M3_E4M3", 0, NULL},
    {"MXFP8-32X32", 0, "dynamic_mx-1-32-32_E4M3_E4M3_E4M3", 0, NULL},
    {"dynamic_mx-1-1-32_E4M3_E4M3_E4M3", 0, "dynamic_mx-1-1-32_E4M3_E4M3_E4M3", 0, NULL},
    {"dynamic_MX-1-1-32_E4M3_E4M3_E4M3", 0, "dynamic_mx-1-1-32_E4M3_E4M3_E4M3", 0, NULL}, /* the guide's */
    {"dynamic_mx_E4M3_E4M3_E4M3", 0, "dynamic_mx-1-1-32_E4M3_E4M3_E4M3", 0, NULL},
    {"dynamic_mx-1-32-32_E4M3_E4M3_E4M3", 0, "dynamic_mx-1-32-32_E4M3_E4M3_E4M3", 0, NULL},
    {"DYNAMIC_mx-1-32-32_e4m3_e5m2_E5M2", 0, "dynamic_mx-1-32-32_E4M3_E5M2_E5M2", 0, NULL},
    {"Dynamic_Mx_E5M2_E5M2_E5M2", 0, "dynamic_mx-1-1-32_E5M2_E5M2_E5M2", 0, NULL},
    {"dynamic_mx-1-1-32_E4M3_E4M3_E5M2", 0, "dynamic_mx-1-1-32_E4M3_E4M3_E5M2", 0, NULL},
    {"dynamic_mx-01-1-032_E4M3_E4M3_E4M3", 0, "dynamic_mx-1-1-32_E4M3_E4M3_E4M3", 0, NULL},
    /* per_tensor: FP8 in any mix (TE current scaling), HiF8 in every role (MindSpeed). */
    {"tensorwise", 0, "dynamic_per_tensor_E4M3_E4M3_E5M2", 0, NULL},
    {"TensorWise", 0, "dynamic_per_tensor_E4M3_E4M3_E5M2", 0, NULL},
    {"hif8", 0, "dynamic_per_tensor_HIF8_HIF8_HIF8", 0, NULL},
    {"HiF8", 0, "dynamic_per_tensor_HIF8_HIF8_HIF8", 0, NULL},
    {"dynamic_per_tensor_E4M3_E4M3_E4M3", 0, "dynamic_per_tensor_E4M3_E4M3_E4M3", 0, NULL},
    {"dynamic_pertensor_E4M3_E4M3_E5M2", 0, "dynamic_per_tensor_E4M3_E4M3_E5M2", 0, NULL},
    {"dynamic_PER_TENSOR_E5M2_E4M3_E5M2", 0, "dynamic_per_tensor_E5M2_E4M3_E5M2", 0, NULL},
    {"dynamic_per_tensor_hif8_HIF8_Hif8", 0, "dynamic_per_tensor_HIF8_HIF8_HIF8", 0, NULL},
    /* delayed per_tensor (TE DelayedScaling): the same dtype mixes. */
    {"delayed", 0, "delayed_per_tensor_E4M3_E4M3_E5M2", 0, NULL},
    {"DELAYED", 0, "delayed_per_tensor_E4M3_E4M3_E5M2", 0, NULL},
    {"Delayed_HiF8_PerTensor", 0, "delayed_per_tensor_HIF8_HIF8_HIF8", 0, NULL},
    {"delayed_per_tensor_HIF8_HIF8_HIF8", 0, "delayed_per_tensor_HIF8_HIF8_HIF8", 0, NULL},
    {"delayed_per_tensor_E4M3_E4M3_E4M3", 0, "delayed_per_tensor_E4M3_E4M3_E4M3", 0, NULL},
    {"Delayed_PerTensor_e5m2_E4M3_E5M2", 0, "delayed_per_tensor_E5M2_E4M3_E5M2", 0, NULL},

    /* Well-formed but not implemented. */
    {"ROWWISE", 0, "dynamic_per_channel_E4M3_E4M3_E4M3", 0, NULL},
    {"rowwise_with_gw_hp", 0, "dynamic_per_channel_dgrad_w_per_tensor_E4M3_E4M3_E4M3", 0, NULL},
    {"dynamic_Per_Channel_Dgrad_W_Per_Tensor_e4m3_e4m3_e5m2", 0, "dynamic_per_channel_dgrad_w_per_tensor_E4M3_E4M3_E5M2",
     0, NULL},
    {"delayed_per_channel_dgrad_w_per_tensor_E4M3_E4M3_E4M3", MX_EUNSUPPORTED,
     "delayed_per_channel_dgrad_w_per_tensor_E4M3_E4M3_E4M3", 0, "strategy delayed is implemented for per_tensor"},
    {"dynamic_per_channel_dgrad_w_E4M3_E4M3_E4M3", MX_ERECIPE, NULL, 9, "per_channel_dgrad_w_per_tensor"},
    {"dynamic_per_channel_dgrad_w_per_tensor-1-1-1_E4M3_E4M3_E4M3", MX_ERECIPE, NULL, 39, "block suffix"},
    /* per_block (DeepSeek-V3, TE Float8BlockScaling): blocks 1-128-128 only. */
    {"blockwise", 0, "dynamic_per_block-1-128-128_E4M3_E4M3_E4M3", 0, NULL},
    {"BlockWise", 0, "dynamic_per_block-1-128-128_E4M3_E4M3_E4M3", 0, NULL},
    {"dynamic_per_block-1-128-128_E4M3_E4M3_E4M3", 0, "dynamic_per_block-1-128-128_E4M3_E4M3_E4M3", 0, NULL},
    {"dynamic_perblock_E4M3_E4M3_E5M2", 0, "dynamic_per_block-1-128-128_E4M3_E4M3_E5M2", 0, NULL},
    {"dynamic_per_block_E4M3_E4M3_E4M3", 0, "dynamic_per_block-1-128-128_E4M3_E4M3_E4M3", 0, NULL},
    {"DYNAMIC_PER_BLOCK-001-128-0128_e4m3_e4m3_e4m3", 0, "dynamic_per_block-1-128-128_E4M3_E4M3_E4M3", 0, NULL},
    {"dynamic_per_block-1-1-128_E4M3_E4M3_E4M3", MX_EUNSUPPORTED, "dynamic_per_block-1-1-128_E4M3_E4M3_E4M3", 0,
     "per_block blocks 1-1-128 are not implemented (allowed: 1-128-128)"},
    {"dynamic_per_block-128-128-128_E4M3_E4M3_E4M3", MX_EUNSUPPORTED, "dynamic_per_block-128-128-128_E4M3_E4M3_E4M3", 0,
     "per_block blocks 128-128-128 are not implemented (allowed: 1-128-128)"},
    {"dynamic_per_block-1-128-64_E4M3_E4M3_E4M3", MX_EUNSUPPORTED, "dynamic_per_block-1-128-64_E4M3_E4M3_E4M3", 0,
     "per_block blocks 1-128-64"},
    {"delayed_per_block_E4M3_E4M3_E4M3", MX_EUNSUPPORTED, "delayed_per_block-1-128-128_E4M3_E4M3_E4M3", 0,
     "strategy delayed is implemented for per_tensor"},
    /* per_tensor mixes of HiF8 and FP8: each role its own format */
    {"dynamic_per_tensor_hif8_E4M3_e5m2", 0, "dynamic_per_tensor_HIF8_E4M3_E5M2", 0, NULL},
    {"dynamic_per_tensor_HIF8_HIF8_E5M2", 0, "dynamic_per_tensor_HIF8_HIF8_E5M2", 0, NULL},
    {"dynamic_per_tensor_E4M3_E4M3_HIF8", 0, "dynamic_per_tensor_E4M3_E4M3_HIF8", 0, NULL},
    {"dynamic_per_tensor_E4M3_HIF8_HIF8", 0, "dynamic_per_tensor_E4M3_HIF8_HIF8", 0, NULL},
    {"delayed_per_tensor_HIF8_E4M3_E5M2", 0, "delayed_per_tensor_HIF8_E4M3_E5M2", 0, NULL},
    /* HiF8 stays per_tensor only */
    {"dynamic_per_channel_HIF8_E4M3_E4M3", MX_ERECIPE, NULL, 21, "inputs dtype HIF8 goes only with per_tensor"},
    {"dynamic_mx_E4M3_E4M3_HIF8", MX_ERECIPE, NULL, 22, "grads dtype HIF8 goes only with per_tensor"},
    {"delayed_mx-1-1-32_E4M3_E4M3_E4M3", MX_EUNSUPPORTED, "delayed_mx-1-1-32_E4M3_E4M3_E4M3", 0, "strategy delayed"},
    {"DELAYED_mx_E4M3_E4M3_E4M3", MX_EUNSUPPORTED, "delayed_mx-1-1-32_E4M3_E4M3_E4M3", 0, "strategy delayed"},
    {"delayed_per_channel_E4M3_E4M3_E4M3", MX_EUNSUPPORTED, "delayed_per_channel_E4M3_E4M3_E4M3", 0,
     "strategy delayed is implemented for per_tensor granularity only"},
    {"dynamic_per_channel_E4M3_E4M3_E4M3", 0, "dynamic_per_channel_E4M3_E4M3_E4M3", 0, NULL},
    {"dynamic_PerChannel_E5M2_E5M2_E5M2", 0, "dynamic_per_channel_E5M2_E5M2_E5M2", 0, NULL},
    {"dynamic_mx-1-1-16_E4M3_E4M3_E4M3", MX_EUNSUPPORTED, "dynamic_mx-1-1-16_E4M3_E4M3_E4M3", 0,
     "mx blocks 1-1-16"},
    {"dynamic_mx-32-32-32_E4M3_E4M3_E4M3", MX_EUNSUPPORTED, "dynamic_mx-32-32-32_E4M3_E4M3_E4M3", 0, NULL},
    {"dynamic_mx-1-32-1_E4M3_E4M3_E4M3", MX_EUNSUPPORTED, "dynamic_mx-1-32-1_E4M3_E4M3_E4M3", 0, NULL},
    {"dynamic_mx-1-1-999999999_E4M3_E4M3_E4M3", MX_EUNSUPPORTED, "dynamic_mx-1-1-999999999_E4M3_E4M3_E4M3", 0, NULL},

    /* Malformed: the position of the fault and what the message says. */
    {"", MX_ERECIPE, NULL, 1, "empty"},
    {"mxfp9", MX_ERECIPE, NULL, 1, "neither an alias"},
    {"mxfp8-16x16", MX_ERECIPE, NULL, 1, "neither an alias"},
    {"mxfp8 ", MX_ERECIPE, NULL, 6, "unexpected character ' '"},
    {"dynamic", MX_ERECIPE, NULL, 8, "only 1 of the 5 '_'-separated fields"},
    {"dynamic_mx_E4M3_E4M3", MX_ERECIPE, NULL, 21, "only 4 of the 5"},
    {"static_mx_E4M3_E4M3_E4M3", MX_ERECIPE, NULL, 1, "scaling strategy 'static'"},
    {"dynamic__mx_E4M3_E4M3_E4M3", MX_ERECIPE, NULL, 9, "empty field"},
    {"_dynamic_mx_E4M3_E4M3_E4M3", MX_ERECIPE, NULL, 1, "empty field"},
    {"dynamic_mx_E4M3_E4M3_E4M3_", MX_ERECIPE, NULL, 27, "missing field at the end"},
    {"dynamic_mx-1-1-32_E4M3_E4M3_", MX_ERECIPE, NULL, 29, "missing field"},
    {"dynamic_mx_E4M3_E4M3_FP8", MX_ERECIPE, NULL, 22, "grads dtype 'FP8'"},
    {"dynamic_mx_E4M3_E3M4_E4M3", MX_ERECIPE, NULL, 17, "weight dtype 'E3M4'"},
    {"dynamic_mx_e4m2_E4M3_E4M3", MX_ERECIPE, NULL, 12, "inputs dtype 'e4m2'"},
    {"dynamic_block_E4M3_E4M3_E4M3", MX_ERECIPE, NULL, 9, "scaling granularity 'block'"},
    {"dynamic_per_blocks_E4M3_E4M3_E4M3", MX_ERECIPE, NULL, 9, "scaling granularity 'per_blocks'"},
    {"dynamic_mx_HIF8_E4M3_E4M3", MX_ERECIPE, NULL, 12, "inputs dtype HIF8 goes only with per_tensor"},
    {"dynamic_per_block_E4M3_E4M3_HIF8", MX_ERECIPE, NULL, 29, "grads dtype HIF8 goes only with per_tensor"},
    {"dynamic_per_channel_E4M3_HIF8_E4M3", MX_ERECIPE, NULL, 26, "weight dtype HIF8"},
    {"tensorwise2", MX_ERECIPE, NULL, 1, "neither an alias"},
    {"dynamic_mx_E4M3_E4M3_E4M3_E4M3", MX_ERECIPE, NULL, 9, "scaling granularity 'mx_E4M3'"},
    {"dynamic_-1-1-32_E4M3_E4M3_E4M3", MX_ERECIPE, NULL, 9, "missing scaling granularity"},
    {"dynamic_mx-1-1_E4M3_E4M3_E4M3", MX_ERECIPE, NULL, 15, "2 of the three sizes"},
    {"dynamic_mx-1-1-32-4_E4M3_E4M3_E4M3", MX_ERECIPE, NULL, 18, "more than three block sizes"},
    {"dynamic_mx-0-1-32_E4M3_E4M3_E4M3", MX_ERECIPE, NULL, 12, "must be positive"},
    {"dynamic_mx-1-1-0_E4M3_E4M3_E4M3", MX_ERECIPE, NULL, 16, "must be positive"},
    {"dynamic_mx-+1-1-32_E4M3_E4M3_E4M3", MX_ERECIPE, NULL, 12, "unexpected character '+'"},
    {"dynamic_mx--1-1-32_E4M3_E4M3_E4M3", MX_ERECIPE, NULL, 12, "positive decimal integer, found '-'"},
    {"dynamic_mx-1-1-99999999999_E4M3_E4M3_E4M3", MX_ERECIPE, NULL, 16, "more than 9 digits"},
    {"dynamic_mx-1-1-2147483648_E4M3_E4M3_E4M3", MX_ERECIPE, NULL, 16, "more than 9 digits"},
    {"dynamic_mx-1-1-32x_E4M3_E4M3_E4M3", MX_ERECIPE, NULL, 18, "unexpected 'x' after the block suffix"},
    {"dynamic_mx-1x1-32_E4M3_E4M3_E4M3", MX_ERECIPE, NULL, 13, "unexpected 'x' in the block suffix"},
    {"dynamic_mx-_E4M3_E4M3_E4M3", MX_ERECIPE, NULL, 12, "missing block sizes"},
    {"dynamic_mx-1-1-32_E4M3_E4M3_E4M3_E4M3", MX_ERECIPE, NULL, 18, "unexpected '_' after the block suffix"},
    {"dynamic_mx-1_1-32_E4M3_E4M3_E4M3", MX_ERECIPE, NULL, 13, "unexpected '_' in the block suffix"},
    {"dynamic_per_tensor-1-1-32_E4M3_E4M3_E4M3", MX_ERECIPE, NULL, 19, "only allowed with mx"},
    {"dynamic_mx.1.1.32_E4M3_E4M3_E4M3", MX_ERECIPE, NULL, 11, "unexpected character '.'"},
    {"dynamic_mx-1-1-32 _E4M3_E4M3_E4M3", MX_ERECIPE, NULL, 18, "unexpected character ' '"},
    {"dynamic_mx_E4M3_E4M3_E4M3\n", MX_ERECIPE, NULL, 26, "unexpected character '\\n'"},
    {"dynamic_mx_E4M3_E4M3_E4M3\xC3\xA9", MX_ERECIPE, NULL, 26, "unexpected character '\xC3\xA9'"},
    {"dynamic-mx_E4M3_E4M3_E4M3_E4M3", MX_ERECIPE, NULL, 1, "scaling strategy 'dynamic-mx'"},
};

static void test_table(void) {
    CHECK(sizeof cases / sizeof cases[0] >= 40);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const recipe_case *c = &cases[i];
        mx_recipe r;
        mx_diag diag = {{0}};
        int rc = mx_recipe_parse(c->in, &r, &diag);
        if (rc != c->rc) {
            mxt_fail(__FILE__, __LINE__, "'%s': rc %d (%s), expected %d; message: %s", c->in, rc, mx_errname(rc),
                     c->rc, diag.msg);
            continue;
        }
        if (rc == 0 || rc == MX_EUNSUPPORTED) {
            char buf[128];
            int n = mx_recipe_format(&r, buf, sizeof buf);
            CHECK_EQ_INT(n, (long long)strlen(c->canon));
            CHECK_STR_EQ(buf, c->canon);
            /* The canonical form parses back to the same recipe. */
            mx_recipe again;
            CHECK_EQ_INT(mx_recipe_parse(buf, &again, NULL), rc);
            char buf2[128];
            mx_recipe_format(&again, buf2, sizeof buf2);
            CHECK_STR_EQ(buf2, buf);
        }
        if (rc == MX_EUNSUPPORTED) {
            char head[256];
            snprintf(head, sizeof head, "recipe '%s' is recognised but not supported yet: ", c->in);
            CHECK(strncmp(diag.msg, head, strlen(head)) == 0);
            size_t ml = strlen(diag.msg), tl = strlen(SUPPORTED_TAIL);
            CHECK(ml > tl && strcmp(diag.msg + ml - tl, SUPPORTED_TAIL) == 0);
            if (c->sub) CHECK_STR_CONTAINS(diag.msg, c->sub);
        }
        if (rc == MX_ERECIPE) {
            char want[256];
            snprintf(want, sizeof want, " at position %d (expected " MX_RECIPE_GRAMMAR ")", c->pos);
            CHECK_STR_CONTAINS(diag.msg, want);
            CHECK_STR_CONTAINS(diag.msg, c->sub);
            CHECK(strncmp(diag.msg, "recipe '", 8) == 0);
            CHECK(strchr(diag.msg, '\n') == NULL); /* one line, even for a recipe holding one */
            if (mxt_current_failures()) printf("    (case '%s': %s)\n", c->in, diag.msg);
        }
    }
}

static bool same_recipe(const mx_recipe *a, const mx_recipe *b) {
    return a->strategy == b->strategy && a->granularity == b->granularity && a->has_block == b->has_block &&
           a->block[0] == b->block[0] && a->block[1] == b->block[1] && a->block[2] == b->block[2] &&
           a->inputs == b->inputs && a->weight == b->weight && a->grads == b->grads;
}

/* The aliases and their long forms give identical structs (the reference system's bug). */
static void test_alias_equals_long_form(void) {
    mx_recipe a, b;
    CHECK_EQ_INT(mx_recipe_parse("mxfp8", &a, NULL), 0);
    CHECK_EQ_INT(mx_recipe_parse("dynamic_mx-1-1-32_E4M3_E4M3_E4M3", &b, NULL), 0);
    CHECK(same_recipe(&a, &b));
    CHECK_EQ_INT(mx_recipe_parse("dynamic_MX_e4m3_e4m3_e4m3", &b, NULL), 0);
    CHECK(same_recipe(&a, &b));
    CHECK_EQ_INT(mx_recipe_parse("mxfp8-32x32", &a, NULL), 0);
    CHECK_EQ_INT(mx_recipe_parse("dynamic_mx-1-32-32_E4M3_E4M3_E4M3", &b, NULL), 0);
    CHECK(same_recipe(&a, &b));
    CHECK_EQ_INT(a.strategy, MX_STRATEGY_DYNAMIC);
    CHECK_EQ_INT(a.granularity, MX_GRANULARITY_MX);
    CHECK(a.has_block);
    CHECK_EQ_INT(a.block[0], 1);
    CHECK_EQ_INT(a.block[1], 32);
    CHECK_EQ_INT(a.block[2], 32);
    CHECK_EQ_INT(a.inputs, MX_E4M3);
    CHECK_EQ_INT(a.weight, MX_E4M3);
    CHECK_EQ_INT(a.grads, MX_E4M3);
}

/* rowwise_with_gw_hp: its long form's operands plus high_precision_gemms [wgrad]; rowwise's
 * long form implies no high-precision product. */
static void test_rowwise_aliases(void) {
    mx_recipe a, b;
    CHECK_EQ_INT(mx_recipe_parse("rowwise_with_gw_hp", &a, NULL), 0);
    CHECK_EQ_INT(mx_recipe_parse("dynamic_per_channel_dgrad_w_per_tensor_E4M3_E4M3_E4M3", &b, NULL), 0);
    CHECK(same_recipe(&a, &b));
    CHECK(a.dgrad_weight_per_tensor && b.dgrad_weight_per_tensor);
    CHECK_EQ_INT(a.high_precision, MX_GEMM_WGRAD);
    CHECK_EQ_INT(b.high_precision, 0);
    CHECK_EQ_INT(mx_recipe_parse("rowwise", &a, NULL), 0);
    CHECK_EQ_INT(a.granularity, MX_GRANULARITY_PER_CHANNEL);
    CHECK(!a.dgrad_weight_per_tensor);
    CHECK_EQ_INT(a.high_precision, 0);
    CHECK_EQ_INT(mx_recipe_family(&a), MX_FAMILY_FLOAT8);
}

/* A per_tensor mix of HiF8 and FP8 belongs to the family of its inputs dtype. */
static void test_mixed_family(void) {
    static const struct {
        const char *name;
        mx_quant_family family;
    } mixes[] = {{"dynamic_per_tensor_HIF8_HIF8_E5M2", MX_FAMILY_HIF8}, {"dynamic_per_tensor_HIF8_E4M3_E4M3", MX_FAMILY_HIF8},
                 {"dynamic_per_tensor_E4M3_E4M3_HIF8", MX_FAMILY_FLOAT8}, {"delayed_per_tensor_E5M2_HIF8_HIF8", MX_FAMILY_FLOAT8},
                 {"hif8", MX_FAMILY_HIF8}, {"tensorwise", MX_FAMILY_FLOAT8}};
    for (size_t i = 0; i < sizeof mixes / sizeof mixes[0]; i++) {
        mx_recipe r;
        CHECK_EQ_INT(mx_recipe_parse(mixes[i].name, &r, NULL), 0);
        CHECK_EQ_INT(mx_recipe_family(&r), mixes[i].family);
    }
}

static void test_fields(void) {
    mx_recipe r;
    CHECK_EQ_INT(mx_recipe_parse("dynamic_mx-1-32-32_E4M3_E5M2_E5M2", &r, NULL), 0);
    CHECK_EQ_INT(r.inputs, MX_E4M3);
    CHECK_EQ_INT(r.weight, MX_E5M2);
    CHECK_EQ_INT(r.grads, MX_E5M2);
    /* Unsupported recipes are filled all the same. */
    CHECK_EQ_INT(mx_recipe_parse("delayed_per_channel_E5M2_E4M3_E5M2", &r, NULL), MX_EUNSUPPORTED);
    CHECK_EQ_INT(r.strategy, MX_STRATEGY_DELAYED);
    CHECK_EQ_INT(r.granularity, MX_GRANULARITY_PER_CHANNEL);
    CHECK(!r.has_block);
    CHECK_EQ_INT(r.inputs, MX_E5M2);
    CHECK_EQ_INT(r.weight, MX_E4M3);
    CHECK_EQ_INT(r.grads, MX_E5M2);
    CHECK_EQ_INT(mx_recipe_parse("dynamic_mx-2-4-8_E4M3_E4M3_E4M3", &r, NULL), MX_EUNSUPPORTED);
    CHECK(r.has_block);
    CHECK_EQ_INT(r.block[0], 2);
    CHECK_EQ_INT(r.block[1], 4);
    CHECK_EQ_INT(r.block[2], 8);
}

static void test_exact_messages(void) {
    mx_recipe r;
    mx_diag diag;
    CHECK_EQ_INT(mx_recipe_parse("delayed_mx_E4M3_E4M3_E4M3", &r, &diag), MX_EUNSUPPORTED);
    CHECK_STR_EQ(diag.msg, "recipe 'delayed_mx_E4M3_E4M3_E4M3' is recognised but not supported yet: "
                           "scaling strategy delayed is implemented for per_tensor granularity only" SUPPORTED_TAIL);
    CHECK_EQ_INT(mx_recipe_parse("dynamic_mx_E4M3_E4M3_FP8", &r, &diag), MX_ERECIPE);
    CHECK_STR_EQ(diag.msg, "recipe 'dynamic_mx_E4M3_E4M3_FP8': grads dtype 'FP8' is not E4M3, E5M2 or HIF8 at position 22 "
                           "(expected <scaling_strategy>_<scaling_granularity>[-b0-b1-b2]_<inputs_dtype>_"
                           "<weight_dtype>_<grads_dtype>)");
}

static void test_long_input_is_cut(void) {
    char text[600];
    memset(text, 'a', sizeof text - 1);
    text[sizeof text - 1] = '\0';
    mx_recipe r;
    mx_diag diag;
    CHECK_EQ_INT(mx_recipe_parse(text, &r, &diag), MX_ERECIPE);
    CHECK_STR_CONTAINS(diag.msg, "...");
    CHECK_STR_CONTAINS(diag.msg, "at position 1 (expected");
    CHECK(strlen(diag.msg) < 500);
    /* Many underscores: no field array to overflow. */
    memset(text, '_', sizeof text - 1);
    CHECK_EQ_INT(mx_recipe_parse(text, &r, &diag), MX_ERECIPE);
    CHECK_STR_CONTAINS(diag.msg, "empty field at position 1");
}

static void test_format(void) {
    char buf[64];
    mx_recipe r = {.strategy = MX_STRATEGY_DYNAMIC, .granularity = MX_GRANULARITY_MX, .has_block = true,
                   .block = {1, 1, 32}, .inputs = MX_E4M3, .weight = MX_E5M2, .grads = MX_E5M2};
    CHECK_EQ_INT(mx_recipe_format(&r, buf, sizeof buf), 32);
    CHECK_STR_EQ(buf, "dynamic_mx-1-1-32_E4M3_E5M2_E5M2");
    /* As snprintf: the full length even when the buffer is short or absent. */
    CHECK_EQ_INT(mx_recipe_format(&r, NULL, 0), 32);
    CHECK_EQ_INT(mx_recipe_format(&r, buf, 8), 32);
    CHECK_STR_EQ(buf, "dynamic");
    /* mx without an explicit block prints the default one. */
    r.has_block = false;
    mx_recipe_format(&r, buf, sizeof buf);
    CHECK_STR_EQ(buf, "dynamic_mx-1-1-32_E4M3_E5M2_E5M2");
    mx_recipe pt = {.strategy = MX_STRATEGY_DELAYED, .granularity = MX_GRANULARITY_PER_TENSOR, .inputs = MX_E4M3,
                    .weight = MX_E4M3, .grads = MX_E4M3};
    mx_recipe_format(&pt, buf, sizeof buf);
    CHECK_STR_EQ(buf, "delayed_per_tensor_E4M3_E4M3_E4M3");
    pt.granularity = (mx_granularity)7;
    CHECK_EQ_INT(mx_recipe_format(&pt, buf, sizeof buf), MX_EENUM);
    CHECK_EQ_INT(mx_recipe_format(NULL, buf, sizeof buf), MX_ENULL);
    CHECK_EQ_INT(mx_recipe_format(&r, NULL, 4), MX_ENULL);
}

static void test_null_arguments(void) {
    mx_recipe r;
    mx_diag diag;
    CHECK_EQ_INT(mx_recipe_parse(NULL, &r, &diag), MX_ENULL);
    CHECK_EQ_INT(mx_recipe_parse("mxfp8", NULL, &diag), MX_ENULL);
    CHECK_EQ_INT(mx_recipe_parse("mxfp8", &r, NULL), 0);
    CHECK_EQ_INT(mx_recipe_parse("bogus", &r, NULL), MX_ERECIPE);
}

/* Found by fuzzing (tests/fuzz/regressions/recipe/): bytes after a UTF-8 lead byte were
 * copied into the message unchecked, newlines included. Now every byte that is not part of
 * a valid UTF-8 sequence is escaped, and valid UTF-8 is kept. */
static void test_message_is_one_line(void) {
    mx_recipe r;
    mx_diag diag;
    CHECK_EQ_INT(mx_recipe_parse("fynamc_m{_E\xb4M3\xf2\x1f\n\n\n\n\nE4M3rFP8", &r, &diag), MX_ERECIPE);
    CHECK_STR_EQ(diag.msg, "recipe 'fynamc_m{_E\\xB4M3\\xF2\\x1F\\n\\n\\n\\n\\nE4M3rFP8': unexpected character '{' at "
                           "position 9 (expected " MX_RECIPE_GRAMMAR ")");
    CHECK_EQ_INT(mx_recipe_parse("d\xc3\xa9namic\xe2\x82", &r, &diag), MX_ERECIPE);
    CHECK_STR_CONTAINS(diag.msg, "recipe 'd\xc3\xa9namic\\xE2\\x82'");
}

static const mxt_test tests[] = {
    {"recipe_table", test_table},
    {"recipe_alias_equals_long_form", test_alias_equals_long_form},
    {"recipe_rowwise_aliases", test_rowwise_aliases},
    {"recipe_mixed_family", test_mixed_family},
    {"recipe_fields", test_fields},
    {"recipe_exact_messages", test_exact_messages},
    {"recipe_long_input_is_cut", test_long_input_is_cut},
    {"recipe_format", test_format},
    {"recipe_null_arguments", test_null_arguments},
    {"recipe_message_is_one_line", test_message_is_one_line},
};

int main(int argc, char **argv) { return MXT_RUN(tests, argc, argv); }
