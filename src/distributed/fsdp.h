/* Internal: FSDP2-style fully sharded data parallelism over MPI (SPEC §6).
 *
 * Every parameter is sharded along dim 0 in blocks of 32 rows: with W ranks, a tensor of R
 * rows (per group: fused experts are E groups) gives each rank S = 32 * ceil(R / (32 W)) rows,
 * rank r holding rows [r S, r S + S), the tail padded with zeros. fp32 master weights,
 * gradients and AdamW state exist only as these local shards (one allocation each).
 *
 * Units are the model's (model/units.h): each transformer block, and the root (embedding,
 * final norm, lm_head). Before a unit's forward its weights are all-gathered into a unit
 * buffer — one MPI_Iallgather per unit and phase — and after its backward its gradients are
 * reduce-scattered back to the shards — one MPI_Ireduce_scatter_block per unit. Weights the
 * plan converts travel as MX planes quantized by their owners once per optimizer step
 * (low-precision all-gather): the forward gathers the rowwise plane, the backward the colwise
 * plane (`on-demand`), or every gather both (`all`; also the single gather of units kept after
 * forward). Under `on-demand` the backward gather of a block the model recomputes carries
 * both planes: its forward runs again there. Everything else travels in param_dtype.
 *
 * HSDP: with D replicas, the world's W ranks form D FSDP groups of F = W / D consecutive
 * ranks (world rank r is rank r % F of group r / F). Everything above happens within the
 * group (F in place of W: shards, gathers, reduce-scatters); after its reduce-scatter, each
 * unit's reduced shard is all-reduced across the D ranks holding the same shard (one
 * MPI_Iallreduce per unit and micro-batch, in reduce_dtype), so every replica holds the
 * same gradient shards: sums over all W ranks.
 *
 * Experts (options expert_parallel EP > 1, expert_replicas EDP): the fused expert tensors
 * (E groups) have a layout of their own, EDP x EFSDP x EP with EFSDP = W / (EP EDP): world
 * rank r holds EP rank r % EP's E / EP experts only, sharded as above over its expert shard
 * group (the EFSDP ranks r % EP + EP k of its expert replica r / (EP EFSDP)) and replicated
 * over the EDP ranks with the same r % (EP EFSDP). An MoE block then has two gathers and two
 * reduce-scatters (and all-reduces) per phase: its dense part's and its experts'. The unit
 * gradient buffer and the model's bound expert tensors hold this rank's experts only. */
#ifndef MXI_FSDP_H
#define MXI_FSDP_H

#include <stdbool.h>
#include <stdint.h>

#include "distributed/comm.h"
#include "model/linear.h"
#include "model/quant_stats.h"
#include "mxtrain/model.h"

typedef struct mxi_fsdp mxi_fsdp;

typedef struct {
    bool param_bf16;             // gather unconverted weights in bf16 (else fp32)
    bool hold_bf16;              // with param_bf16: the weights the model takes as bf16 (mxi_model_takes_bf16)
                                 // stay bf16 in the unit buffers; for models whose products run bf16
                                 // natively (elsewhere they would be widened at every product)
    mxi_wire_dtype reduce;       // dtype gradients are reduce-scattered and accumulated in
    bool reshard_after_forward;  // free block weights after forward, gather again in backward
    int forward_prefetch;        // units gathered ahead in forward (>= 0)
    int backward_prefetch;       // the same in backward
    bool low_precision;          // converted weights gathered as MX planes
    bool gather_all;             // every gather carries both planes (`all`)
    bool quant_stats;            // training.quant_stats_interval: converted shards quantized once a step (cached),
                                 // where mxi_fsdp_weight_stats measures them
    int replicas;                // FSDP groups (HSDP's data_parallel_size), dividing the world; 0 or 1: one
    int expert_parallel;         // EP (0 or 1: none): the model's fused experts held by EP rank (the layout above)
    int expert_replicas;         // EDP, with EP x EDP dividing the world; 0 or 1: one
    int micro_batches;           // per step (gradient accumulation); 0 or 1: one
    mxi_wire_dtype grads;        // the gradient shards (training.main_grads_dtype): F32 or BF16
    uint64_t moment_bytes32;     // bytes the optimizer's moments take per 32 elements of the shard (the
                                 // optimizer holds them; for the memory figures): 0 as fp32's 256
    uint64_t moment_bytes_span;  // and per tensor's span of the shard (FP8 moments' scales)
} mxi_fsdp_options;

/* What crossed the wire in this rank's collectives since mxi_fsdp_begin_step: bytes each
 * rank received from all-gathers, by kind, sent into reduce-scatters, and all-reduced
 * across replicas (the size of the shard buffer each all-reduce sums). */
typedef struct {
    uint64_t ag_param_bytes;     // unconverted weights, in param_dtype
    uint64_t ag_mx_data_bytes;   // MX element codes of converted weights
    uint64_t ag_mx_scale_bytes;  // their E8M0 scales
    uint64_t ag_bf16_equiv;      // what the converted weights would have cost gathered in bf16
    uint64_t rs_bytes;           // gradients, in reduce_dtype
    uint64_t ar_bytes;           // reduced gradient shards all-reduced across replicas, in reduce_dtype
    int all_gathers, reduce_scatters, all_reduces;
} mxi_fsdp_counters;

/* Bytes this rank holds, by category (all allocated at create). */
typedef struct {
    uint64_t master, grads, optimizer;   // shards: fp32 weights, gradients (fp32 or bf16, and their
                                         // fp64 sums with reduce_dtype fp64), AdamW m and v
    uint64_t mx_shards;                  // this step's MX planes of the converted shards
    uint64_t gathered;                   // unit buffers, wire buffers, unit gradient buffers
    // of which the fused experts' (with EP this rank's E / EP): their shards (master, gradients,
    // optimizer together), the most one unit holds of them gathered (fp32 as the unit buffer
    // holds them, or both MX planes), and their unsharded gradients in one unit
    uint64_t expert_shards, expert_unit, expert_grad;
} mxi_fsdp_memory;

/* One tensor's local shard: numel elements at offset in the shard buffers. */
typedef struct {
    int64_t offset, numel;
    bool decay;       // AdamW weight decay applies
} mxi_shard_span;

/* Take over a model created with external_params: shard its parameters over this rank's
 * FSDP group of comm (the world; split into options->replicas groups, collectively),
 * allocate every buffer, and install the unit hooks. */
int mxi_fsdp_create(mx_model *model, mxi_comm *comm, const mxi_fsdp_options *options, mxi_fsdp **out, mx_diag *diag);
void mxi_fsdp_free(mxi_fsdp *fsdp);

int64_t mxi_fsdp_shard_numel(const mxi_fsdp *fsdp);
int mxi_fsdp_replicas(const mxi_fsdp *fsdp);   // D
int mxi_fsdp_replica(const mxi_fsdp *fsdp);    // this rank's replica, 0..D-1
float *mxi_fsdp_master(mxi_fsdp *fsdp);   // (shard) fp32 weights
float *mxi_fsdp_grads(mxi_fsdp *fsdp);    // (shard) fp32 gradients (NULL with grads BF16): see mxi_fsdp_finish_grads
uint16_t *mxi_fsdp_grads_bf16(mxi_fsdp *fsdp);   // (shard) bf16 gradients (NULL with grads F32)
mxi_shard_span mxi_fsdp_span(const mxi_fsdp *fsdp, int tensor);
mxi_fsdp_memory mxi_fsdp_memory_of(const mxi_fsdp *fsdp);
/* The k-th range of the shard buffers this rank counts in the global gradient norm (false
 * past the last): its shards of each layout of which it is in replica 0 (the other replicas
 * hold the same), adjacent ranges merged (one range [0, shard) without replicas). */
bool mxi_fsdp_norm_span(const mxi_fsdp *fsdp, int k, mxi_shard_span *span);

/* Start an optimizer step: zero the gradient shards, quantize the converted shards (once per
 * step: every micro-batch reuses them), zero the counters. */
int mxi_fsdp_begin_step(mxi_fsdp *fsdp, mx_diag *diag);
/* Before every micro-batch's forward but the step's first: with a delayed recipe and the
 * low-precision all-gather, quantize the converted shards again with the scales the last
 * forward's update made (and drop the units gathered with the old ones); else nothing. */
/* With quant_stats on: fold the quantized shards of the weights gathered already quantized
 * into qs (their fprop_w and dgrad_w roles), this rank's rows; a replica's shard once. */
void mxi_fsdp_weight_stats(const mxi_fsdp *f, mxi_quant_stats *qs);

int mxi_fsdp_begin_micro(mxi_fsdp *fsdp, mx_diag *diag);
/* Finish the reduce-scatters still in flight after the last backward of a micro-batch. The
 * gradient shards then hold the sums over ranks and micro-batches of each backward's
 * gradients (models run backward with scale 1). */
int mxi_fsdp_end_backward(mxi_fsdp *fsdp, mx_diag *diag);
/* After the last micro-batch: the gradient shards become the sums divided by count
 * (micro-batches times ranks: the mean over the global batch). bf16 shards hold the sums
 * rounded to bf16 after every addition, and then their quotient rounded (exact when count is
 * a power of two). */
void mxi_fsdp_finish_grads(mxi_fsdp *fsdp, double count);
mxi_fsdp_counters mxi_fsdp_counters_of(const mxi_fsdp *fsdp);

/* Copy this rank's rows of a whole tensor (numel of its model tensor) into shard buffer dst
 * (master weights or an optimizer moment); padding rows become zero. Every replica takes
 * the same rows. */
void mxi_fsdp_scatter_tensor(const mxi_fsdp *fsdp, int tensor, const float *full, float *dst);
/* Assemble a whole tensor on world rank 0 from every rank's span of it, src (mxi_fsdp_span's
 * numel: in the master weights at its offset, or an optimizer moment's), over its FSDP group
 * (collective over the ranks of replica 0; the other replicas, which hold the same rows,
 * return at once). full is written on rank 0 only, and may be NULL elsewhere. */
int mxi_fsdp_gather_tensor(mxi_fsdp *fsdp, int tensor, const float *src, float *full, mx_diag *diag);

/* A run of a tensor's elements this rank holds: count elements of the whole tensor from
 * element start, at offset in the shard buffers (master weights, moments), where the run's
 * slot holds slot elements (count, then zero padding). */
typedef struct {
    int64_t start, count, offset, slot;
} mxi_shard_piece;

/* The k-th piece of tensor this rank holds (false past the last): its rows, without
 * padding, of each group it holds. every_replica false (what a rank writes into a
 * checkpoint): the pieces of the ranks of replica 0 (and expert replica 0), which cover the
 * tensor once; the other replicas, holding the same rows, have none. true (what a rank
 * loads): every rank's. */
bool mxi_fsdp_piece(const mxi_fsdp *fsdp, int tensor, int k, bool every_replica, mxi_shard_piece *piece);

/* For verification: the planes of a converted tensor as gathered in the unit buffer of
 * its unit after the forward of a micro-batch with reshard_after_forward off (NULL if none). */
const mxi_mx_weight *mxi_fsdp_gathered_planes(const mxi_fsdp *fsdp, int tensor);

/* Per-step all-gather bytes the plan implies for converted weights, per rank of an FSDP
 * group of `world` ranks (with expert_parallel EP > 1 the experts: E / EP per rank over an
 * expert shard group of expert_shard ranks), in three settings: bf16 gather (`false`), on-demand and all; with
 * reshard_after_forward as given and the model's recomputed blocks (on-demand gathers both
 * planes in their backward). */
void mxi_fsdp_expected_gather(const mx_model *model, int world, int expert_parallel, int expert_shard,
                              bool reshard_after_forward, uint64_t *bf16, uint64_t *on_demand, uint64_t *all);

/* Without communicating or allocating the shards: the counters of one micro-batch (forward
 * and backward) of an engine made with options over `world` ranks, and the memory it holds
 * (the same layout code as mxi_fsdp_create). */
int mxi_fsdp_expected(const mx_model *model, const mxi_fsdp_options *options, int world, mxi_fsdp_counters *counters,
                      mxi_fsdp_memory *memory, mx_diag *diag);

#endif
