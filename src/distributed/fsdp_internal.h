/* Internal to the FSDP engine (fsdp.h): its state, shared by the files that make it up —
 * fsdp.c (create, step, unit hooks), fsdp_layout.c (shards, unit buffers, wire pieces),
 * fsdp_gather.c (all-gathers into unit buffers), fsdp_tensor_scaled.c and fsdp_row_scaled.c
 * (the per-tensor and rowwise recipes' quantized shards), fsdp_reduce.c (reduce-scatters of the
 * gradients), fsdp_tensors.c (whole tensors, for checkpoints) and fsdp_expected.c (what a
 * layout costs, without communicating).
 *
 * Shape letters, local to the engine (the model's K, experts per token, is not used here):
 * G groups of a tensor (experts, else 1), R rows per group, cols elements per row, S rows per
 * rank, CB = ceil(cols/32) column blocks per row, RB and SB row blocks of R and S, W ranks. */
#ifndef MXI_FSDP_INTERNAL_H
#define MXI_FSDP_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "distributed/comm.h"
#include "distributed/fsdp.h"
#include "model/linear.h"
#include "model/units.h"
#include "mxtrain/model.h"

#define CEIL_DIV(a, b) (((a) + (b) - 1) / (b))
#define ROUND64(x) (((x) + (size_t)63) & ~(size_t)63)

typedef struct {
    int64_t G, R, cols, S;  // shape as sharded; S rows per rank per group
    int64_t R_model;        // rows of one group as the model indexes the tensor (one expert's: R
                            // is G_full of them when mxi_fsdp_shard_groups cuts the experts as one group)
    int64_t shard_off;      // first element in the local shard buffers
    int64_t unit_off;       // first element in the unit's unsharded layout (gradients; -1 when sunk)
    int unit;
    int dom;                // its layout: DOM_DENSE, or DOM_EXPERTS (fused experts under EP)
    int64_t g0, G_full;     // the whole tensor's groups (of R rows) g0 .. g0 + G are held here (experts:
                            // this EP rank's); G_full: the tensor's experts (1: not experts)
    bool mx;                // travels quantized: MX planes, or a per-tensor recipe's codes (tensor_scaled)
    bool tensor_scaled;     // one scale per expert (per tensor), from the amax all-reduced over the shards
    bool row_scaled;        // a rowwise recipe's: fprop's plane per row (codes and scales travel), dgrad's
                            // per column or tensor from the amaxes all-reduced over the shards (codes travel)
    bool block_scaled;      // the blockwise recipe's: one scale per 128x128 tile of each expert, from the
                            // tile's amax all-reduced over the shards (codes travel, for both products)
    int64_t n_ts;           // its scales: one per expert of the groups held (1 for a plain tensor)
    int64_t n_tiles;        // block_scaled: its 128x128 tiles, n_ts experts' worth
    bool half;              // held in the unit buffer as bf16 bits at f32_at (opt.hold_bf16)
    bool sunk;              // its gradient comes through the model's add_grad into the bf16 shard
                            // (main grads bf16, mxi_model_sinks_grad; on one rank straight, on more a
                            // vocabulary table's by slices reduced across the ranks): no unit gradient
    int64_t red_off;        // first element in its unit part's reduce-scatter block (not sunk)
    bool cached;            // its shard's planes quantized once a step into mx_cache; else at each gather
    bool decay;
    // unit buffer layout (bytes from the slot start)
    size_t f32_at;          // (G, R, cols) fp32 (bf16 when half), when !mx
    size_t row_q, row_s, col_q, col_s, tiles;   // when mx: (G,R,cols) (G,R,CB) (G,R,cols) (G,RB,cols) (G,RB,CB)
    // MX planes of the local shard (bytes from mx_cache); per tensor: codes at c_row_q, the
    // dequantization scales (n_ts fp32) at c_row_s, the amaxes (n_ts double) at c_col_s;
    // blockwise: the same with one scale and amax per tile (n_tiles);
    // rowwise: fprop's codes at c_row_q and (G, S) fp32 dequantization scales at c_row_s,
    // dgrad's codes at c_col_q, its (n_ts, lines) dequantization scales at c_col_s, their
    // quantization scales at c_qscale and the amaxes' all-reduce (doubles) at c_keys
    size_t c_row_q, c_row_s, c_col_q, c_col_s, c_tiles, c_qscale, c_keys;
    mxi_mx_weight planes;   // as bound to the model while resident
} shard_tensor;

/* Two layouts: the dense parameters, sharded over the FSDP group and replicated over the
 * replicas (HSDP), and with EP > 1 the experts: an EP rank's experts sharded over its expert
 * shard group (EFSDP ranks) and replicated over its expert replica group (EDP ranks). A unit
 * gathers and reduces each layout's part with its own collectives. */
enum { DOM_DENSE, DOM_EXPERTS, N_DOMS };

typedef struct {
    mxi_comm *comm;         // the shard group (NULL in mxi_fsdp_expected)
    mxi_comm *replicas;     // the replica group, or NULL with one replica
    int W, rank;            // ranks of the shard group, and this rank's place in it
    int D, replica;         // replicas, and this rank's
} domain;

typedef struct {
    int n, *tensors;        // tensor indices, the dense ones first
    int64_t shard_numel, shard_off;   // its part of the shard buffers
    int64_t part_numel[N_DOMS], part_off[N_DOMS];   // of which each layout's (contiguous, dense first)
    int64_t red_numel[N_DOMS];   // of each part, what its reduce-scatter carries (not the sunk tensors)
    int64_t full_numel;     // unsharded fp32 elements (gradient buffer: experts this rank's only)
    size_t slot_bytes, expert_slot;   // its unit buffer, and the fused experts' part of it
} shard_unit;

enum { SEG_F32, SEG_BF16, SEG_BYTES };
enum { KIND_PARAM, KIND_MX_DATA, KIND_MX_SCALE };
enum { PLANE_ROW, PLANE_COL, PLANE_TILES };

/* A piece of one rank's all-gather block: G groups of S rows of cols elements from the local
 * shard, landing as G groups of R rows in the unit buffer. */
typedef struct {
    int type, kind;
    int tensor, plane;      // MX codes and scales (BYTES): whose, which plane; the scales follow the codes
    int64_t G, S, R, cols;
    size_t src_at;          // (G, S, cols) from byte src_at of the fp32 master (F32, BF16) or of the MX planes (BYTES)
    size_t wire_off;        // offset in one rank's block
    size_t dst_off;         // offset in the unit buffer
    int64_t bf16_equiv;     // bytes this piece stands for gathered in bf16 (MX codes only)
} segment;

typedef struct {            // one all-gather per layout with something to gather
    uint8_t *recv;          // every rank's block, this rank's packed in place
    mxi_request req;
    segment *segs;
    int n_segs;
    size_t block;           // bytes per rank
} gather_part;

typedef struct {
    int unit;               // -1: free
    int slot;
    bool row, col;
    gather_part part[N_DOMS];
} gather_op;

enum { RED_IDLE, RED_SCATTER, RED_ALL_REDUCE };
typedef struct {
    int unit;               // -1: free
    struct reduce_part {    // one reduce-scatter (then all-reduce across replicas) per layout
        int stage;          // RED_IDLE (done or nothing to do), RED_SCATTER or RED_ALL_REDUCE in flight
        uint8_t *send, *recv;   // recv: send's first block, where the in-place sum lands
        mxi_request req;
    } part[N_DOMS];
} reduce_op;

struct mxi_fsdp {
    mx_model *model;
    mxi_comm *world;
    mxi_comm *comm;         // this rank's FSDP group: the world, or shard_group
    mxi_comm *shard_group, *replica_group;   // split from the world with replicas > 1, else NULL
    mxi_comm *eshard_group, *ereplica_group, *emesh_group;   // EP: split from the world (emesh: one expert replica)
    domain dom[N_DOMS];     // [DOM_DENSE] mirrors comm, W, rank, replicas, replica
    int EP, El, ep_rank;    // expert parallelism: EP ranks, El = E / EP experts each, this rank's place
    mxi_fsdp_options opt;
    const mxi_linear_mx *spec;
    int W, rank;            // ranks of the FSDP group, and this rank's place in it
    int replicas, replica;  // FSDP groups, and this rank's
    int n_tensors, n_units;
    shard_tensor *t;
    shard_unit *u;
    int64_t shard_numel;
    float *master, *grads;  // (shard), (shard): one allocation each (the optimizer holds its moments)
    uint16_t *grads16;      // (shard) the gradients in bf16 instead of grads (opt.grads BF16)
    double *grad_sums;    // (shard) with reduce_dtype fp64: the sums, before finish_grads
    uint8_t *mx_cache;
    // unit buffers: slot 0 for the root, the others shared by the blocks
    int n_slots;
    uint8_t **slots;
    size_t slot_bytes;
    int *slot_unit;         // (n_slots) resident unit or -1
    int *resident;          // (n_units) slot or -1
    bool *has_row, *has_col;// (n_units) planes present in the resident buffer
    int *pending;           // (n_units) gather op or -1
    gather_op *gathers;
    int n_gathers;
    segment *seg_pool;      // n_gathers * max segments
    float *root_grad, *block_grad;        // unsharded gradients of the root and of one block
    bool any_sunk;          // some tensor's gradient is sunk (the model then holds mxi_model_sink_bytes)
    bool sink_reduces;      // and reduced across ranks, a slice at a time (add_grad is collective)
    int *sink_counts;       // (W) elements of a slice each rank receives
    bool grads_direct;      // the model adds every gradient straight into the shard: one rank, fp32
                            // reduction into fp32 shards, one micro-batch, each group's rows where the
                            // shard has them (no buffers)
    reduce_op reduces[2];
    int next_reduce;        // the one to use next: the older of the two when both are in flight
    bool backward;          // the pass running: what a gather is for, in the watchdog's message
    mxi_fsdp_counters counters;
    mxi_fsdp_memory mem;
    void *block_mem;        // one allocation for every communication buffer
};

/* The communication buffers: their sizes, and where each piece goes in one allocation. A
 * layout of one rank has no all-gather buffers (its gathers copy from the shard) and, when
 * its reduction is direct, no reduce-scatter buffers: block and rs_elems are 0 there. */
typedef struct {
    int block_slots, max_segs;
    size_t block[N_DOMS];   // largest all-gather block per rank (any unit, any phase), by layout
    size_t rs_elems[N_DOMS], rs_elem;   // largest unit shard, by layout; bytes per reduce_dtype element
    int64_t root_full, block_full;
    size_t slot0, slotn, total;
} buffer_sizes;

/* ---- layout (fsdp_layout.c) ---- */

/* Rows per rank of a group of R rows cut over W ranks: whole 32-row blocks. */
int64_t mxi_fsdp_rows_per_rank(int64_t R, int W);
void mxi_fsdp_shard_groups(int64_t G, int64_t R, int64_t *G_out, int64_t *R_out);
void mxi_fsdp_set_options(mxi_fsdp *f, const mxi_fsdp_options *opt);
int mxi_fsdp_lay_out(mxi_fsdp *f, size_t *cache_out);
int mxi_fsdp_size_buffers(mxi_fsdp *f, buffer_sizes *b);
mxi_fsdp_memory mxi_fsdp_count_memory(const mxi_fsdp *f, size_t cache, size_t gathered);
size_t mxi_fsdp_segments(const mxi_fsdp *f, int u, int d, bool row, bool col, segment *segs, int *n_segs);
void mxi_fsdp_planes_for(const mxi_fsdp *f, int u, bool forward, bool *row, bool *col);

/* ---- per-tensor recipes (fsdp_tensor_scaled.c) ---- */

/* Every per-tensor-scaled shard quantized for this step: each weight's (each expert's) amax
 * over this rank's rows, all-reduced with MAX over its shard group, so that every rank
 * quantizes its rows with the scale of the whole weight; codes and scales into mx_cache. */
int mxi_fsdp_quantize_tensor_scaled(mxi_fsdp *f, mx_diag *diag);
/* The expert (0 .. n_ts-1) row r of group grp of tensor t belongs to, or -1 for a padding row. */
int64_t mxi_fsdp_expert_of(const shard_tensor *t, int64_t grp, int64_t r);
/* x (n doubles) of tensor id's shards, all-reduced with MAX over its shard group (nothing on
 * one rank); what ("the amax") names them in an error, with the tensor's name. */
int mxi_fsdp_max_over_shards(const mxi_fsdp *f, int id, double *x, int64_t n, const char *what, mx_diag *diag);

/* ---- the blockwise recipe (fsdp_block_scaled.c) ---- */

/* Every blockwise shard quantized for this step: each 128x128 tile's amax over this rank's
 * rows of it, all-reduced with MAX over the shard group, so that every rank quantizes its
 * rows with the scale of the whole tile; codes and scales into mx_cache. */
int mxi_fsdp_quantize_block_scaled(mxi_fsdp *f, mx_diag *diag);

/* ---- rowwise recipes (fsdp_row_scaled.c) ---- */

/* Every rowwise shard quantized for this step: fprop's plane row by row; dgrad's with the
 * column (or tensor) scales of each weight's (each expert's) amaxes all-reduced with MAX over
 * its shard group; codes and scales into mx_cache. */
int mxi_fsdp_quantize_row_scaled(mxi_fsdp *f, mx_diag *diag);

/* ---- units (fsdp.c) ---- */

/* The MX plane of tensor id's shard, quantized from the master: the first `rows` rows of each
 * group (S, or R where the group lands whole in a unit buffer; the padding rows are zeros, so
 * the rows kept are the same bits either way), codes to q and scales to scales, both laid out
 * group after group. */
int mxi_fsdp_quantize_shard(const mxi_fsdp *f, int id, int plane, int64_t rows, uint8_t *q, uint8_t *scales);

bool mxi_fsdp_is_embedding_unit(const mxi_fsdp *f, int u);
/* Bind unconverted tensor id to the model: its weights in unit buffer slot (NULL: none
 * resident), as fp32 or as bf16 bits (half), and its gradients to grads. */
void mxi_fsdp_bind_weights(mxi_fsdp *f, int id, uint8_t *slot, float *grads);
void mxi_fsdp_label(const mxi_fsdp *f, mxi_request *req, bool weights, int u, int d);

/* ---- all-gather (fsdp_gather.c) ---- */

void mxi_fsdp_count_gather(mxi_fsdp_counters *c, const segment *segs, int n_segs, int W);
/* Unit u's weights resident and bound to the model for this pass (gathered if they are not),
 * and the gathers of the next units of the pass started. */
int mxi_fsdp_ensure(mxi_fsdp *f, int u, bool forward, mx_diag *diag);
/* Unit u's buffer free again (its weights no longer resident). */
void mxi_fsdp_release(mxi_fsdp *f, int u);

/* ---- reduce-scatter (fsdp_reduce.c) ---- */

/* Bytes of one gradient element on the wire (reduce_dtype). */
size_t mxi_fsdp_reduce_elem(const mxi_fsdp *f);
/* Layout d's reduce-scatter is the identity (one rank, no replicas, fp32): the unit's
 * gradients go straight into the shard, and the layout needs no reduce buffers. */
bool mxi_fsdp_reduce_direct(const mxi_fsdp *f, int d);
int mxi_fsdp_progress_reduces(mxi_fsdp *f, bool wait, mx_diag *diag);
/* n gradient values added into the gradient shards from element at: fp32 src, or bf16 src16
 * (the other NULL); into bf16 shards each sum rounded to nearest even. */
void mxi_fsdp_add_grads(mxi_fsdp *f, int64_t at, const float *src, const uint16_t *src16, int64_t n);
/* Whether tensor i's gradient is sunk (see shard_tensor.sunk); dom its layout, G its groups. */
bool mxi_fsdp_sinks(const mxi_fsdp *f, int i, int dom, int64_t G);
int mxi_fsdp_start_reduce(mxi_fsdp *f, int u, const float *full, mx_diag *diag);

#endif
