/* The operand table of a recipe: for each of a converted linear layer's three products, each
 * operand's element format, its scales and which elements share one (docs/quantization-plan.md). */
#include <stdio.h>
#include <string.h>

#include "mxtrain/plan.h"

typedef enum { ROLE_INPUT, ROLE_WEIGHT, ROLE_GRAD } role;

/* The operands of the three GEMMs, with the axis an MX plane's blocks run along (the
 * product's reduction dim): K = in, N = out, M = rows. */
static const struct {
    const char *product, *operand;
    role r;
    const char *mx_axis, *line_axis;   // line_axis: per_channel's lines, one scale each
    const char *block_axis;            // per_block's blocks, one scale each
    unsigned gemm;
} slots[6] = {
    {.product = "fprop", .operand = "X", .r = ROLE_INPUT, .mx_axis = "along in (rowwise)",
     .line_axis = "each row of X, along in",
     .block_axis = "1x128 blocks of X, along in", .gemm = MX_GEMM_FPROP},
    {.product = "fprop", .operand = "W", .r = ROLE_WEIGHT, .mx_axis = "along in (rowwise)",
     .line_axis = "each row of W, along in",
     .block_axis = "128x128 tiles of W (out x in)", .gemm = MX_GEMM_FPROP},
    {.product = "dgrad", .operand = "dY", .r = ROLE_GRAD, .mx_axis = "along out (rowwise)",
     .line_axis = "each row of dY, along out",
     .block_axis = "1x128 blocks of dY, along out", .gemm = MX_GEMM_DGRAD},
    {.product = "dgrad", .operand = "W", .r = ROLE_WEIGHT, .mx_axis = "along out (colwise)",
     .line_axis = "each column of W, along out",
     .block_axis = "128x128 tiles of W (out x in)", .gemm = MX_GEMM_DGRAD},
    {.product = "wgrad", .operand = "dY", .r = ROLE_GRAD, .mx_axis = "along rows (colwise)",
     .line_axis = "each column of dY, along rows (of one expert group)",
     .block_axis = "128x1 blocks of dY, along rows (of one expert group)", .gemm = MX_GEMM_WGRAD},
    {.product = "wgrad", .operand = "X", .r = ROLE_INPUT, .mx_axis = "along rows (colwise)",
     .line_axis = "each column of X, along rows (of one expert group)",
     .block_axis = "128x1 blocks of X, along rows (of one expert group)", .gemm = MX_GEMM_WGRAD},
};

int mx_plan_operands(const mx_plan *plan, mx_plan_operand out[6]) {
    if (!plan || !out) return MX_ENULL;
    if (!plan->enabled) return MX_EINVAL;
    const mx_recipe *r = &plan->recipe;
    bool mx = r->granularity == MX_GRANULARITY_MX, tiles = mx && r->block[1] == 32;
    bool delayed = r->strategy == MX_STRATEGY_DELAYED;
    for (int i = 0; i < 6; i++) {
        role k = slots[i].r;
        mx_plan_operand *o = &out[i];
        memset(o, 0, sizeof *o);
        o->product = slots[i].product, o->operand = slots[i].operand;
        o->elem = k == ROLE_INPUT ? r->inputs : k == ROLE_WEIGHT ? r->weight : r->grads;
        bool pow2 = plan->tensor_scale_mode == MX_TSCALE_POW2;
        if (plan->high_precision_gemms & slots[i].gemm) {
            o->high_precision = true;
            snprintf(o->scale, sizeof o->scale, "none (high_precision_gemms)");
            o->axis = "unquantized, in the model's precision";
        } else if (r->granularity == MX_GRANULARITY_PER_BLOCK) {
            snprintf(o->scale, sizeof o->scale, "%s per block, max / amax",
                     pow2 ? "power of two" : "fp32");
            o->axis = slots[i].block_axis;
        } else if (r->granularity == MX_GRANULARITY_PER_CHANNEL && !(r->dgrad_weight_per_tensor && i == 3)) {
            snprintf(o->scale, sizeof o->scale, "%s per line (torchao)",
                     pow2 ? "power of two" : "fp32");
            o->axis = slots[i].line_axis;
        } else if (r->granularity == MX_GRANULARITY_PER_CHANNEL) {
            snprintf(o->scale, sizeof o->scale, "%s per tensor (torchao)",
                     pow2 ? "power of two" : "fp32");
            o->axis = "the whole tensor (the weight; one per expert)";
        } else if (mx && tiles && k == ROLE_WEIGHT) {
            snprintf(o->scale, sizeof o->scale, "E8M0 per 32x32 tile (%s)", plan->scale_mode == MX_SCALE_RCEIL ? "rceil" : "floor");
            o->axis = "one tile quantization for both products";
        } else if (mx) {
            snprintf(o->scale, sizeof o->scale, "E8M0 per 32 elements (%s)", plan->scale_mode == MX_SCALE_RCEIL ? "rceil" : "floor");
            o->axis = slots[i].mx_axis;
        } else if (o->elem == MX_HIF8) {   // delayed: the amax from the history, not the tensor's own
            if (pow2)   // the power of two at or above MindSpeed's scale
                snprintf(o->scale, sizeof o->scale, "2^ceil(log2(amax / %d)) per tensor", k == ROLE_GRAD ? 224 : 15);
            else
                snprintf(o->scale, sizeof o->scale, "fp32 per tensor, amax%s / %d", delayed ? " history" : "",
                         k == ROLE_GRAD ? 224 : 15);
            o->axis = k == ROLE_INPUT ? "the whole tensor (the micro-batch's rows; one per expert group)"
                                      : k == ROLE_WEIGHT ? "the whole tensor (the gathered weight; one per expert)"
                                                         : "the whole tensor (one per expert group)";
        } else {
            snprintf(o->scale, sizeof o->scale, "%s per tensor, max / amax%s",
                     pow2 ? "power of two" : "fp32", delayed ? " history" : "");
            o->axis = k == ROLE_INPUT ? "the whole tensor (the micro-batch's rows; one per expert group)"
                                      : k == ROLE_WEIGHT ? "the whole tensor (the gathered weight; one per expert)"
                                                         : "the whole tensor (one per expert group)";
        }
    }
    return 6;
}
