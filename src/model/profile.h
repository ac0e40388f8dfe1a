/* Internal: where a model's forward and backward passes spend their time, and the GEMM
 * context's counters, for benchmarks (bench/bench_moe.c) and tests. Wall-clock seconds on
 * the thread that runs the model (each op's OpenMP threads work inside that time), and that
 * thread's CPU seconds: with one thread (OMP_NUM_THREADS=1) all of an op's CPU time, which
 * other work on the machine does not inflate as it does the wall clock. */
#ifndef MXI_MODEL_PROFILE_H
#define MXI_MODEL_PROFILE_H

#include <stdbool.h>
#include <stdint.h>

#include "mxtrain/model.h"
#include "ops/gemm.h"

typedef enum {
    MXI_OP_ATTENTION,      // attention's products and softmax (not its q, k, v, o projections)
    MXI_OP_LINEAR,         // linear layers outside the MoE blocks: q, k, v, o, the dense MLPs, lm_head
    MXI_OP_ROUTER,         // the routers' GEMMs (mlp.gate)
    MXI_OP_ROUTING,        // router softmax, top-k and weights, the load-balancing loss, their backward
    MXI_OP_PERMUTE,        // grouping tokens by expert: sort, gather, weighted combine, their backward
                           // (with expert parallelism, its dispatch and combine exchanges too)
    MXI_OP_EXPERT_GEMM,    // the experts' grouped GEMMs (with their MX quantization when converted)
    MXI_OP_EXPERT_SWIGLU,  // the experts' SwiGLU, forward and backward
    MXI_OPS
} mxi_model_op;

typedef struct {
    double seconds[MXI_OPS];                // per op, wall clock, summed over passes
    double cpu_seconds[MXI_OPS];            // per op, the model thread's CPU time
    double forward_s, backward_s;           // whole mx_model_forward / mx_model_backward calls, wall
    double forward_cpu_s, backward_cpu_s;   // and CPU
    int64_t forwards, backwards;            // calls timed
} mxi_model_profile;

/* Start (zeroed) or stop timing. Off by default: then the passes read no clock. */
void mxi_model_profile_enable(mx_model *model, bool on);
mxi_model_profile mxi_model_profile_get(const mx_model *model);
const char *mxi_model_op_name(mxi_model_op op);

/* The model's GEMM context, for its counters (mxi_gemm_ctx_stats). */
mxi_gemm_ctx *mxi_model_gemm(mx_model *model);

/* For benchmarks, the way it was before: the experts' GEMMs with fixed shapes, one oneDNN
 * primitive per group size (default false: the token dim left to run time). */
void mxi_model_fixed_expert_shapes(mx_model *model, bool yes);

/* For tests: models created from now on keep unconverted layers' inputs for backward as
 * bf16 where they can (-1, the default: at bf16 compute on a native bf16 matmul) or never
 * (0: fp32, rounded again in backward). Not thread-safe. */
void mxi_model_keep_bf16_inputs(int yes);

/* For tests: models created from now on keep the inputs of their linear layers for backward
 * in the smallest layout (-1, the default: MX planes, per-tensor codes or bf16 where they
 * take less) or in fp32 only (0). Not thread-safe. */
void mxi_model_save_inputs(int yes);

/* For tests: models created from now on compute their logits and loss in chunks of this
 * many rows (0, the default: mxi_model_ce_chunk's choice). Not thread-safe. */
void mxi_model_ce_rows(int rows);

/* How many (layer, input) sites keep their input for backward as bf16. */
int mxi_model_bf16_kept_sites(const mx_model *model);

#endif
