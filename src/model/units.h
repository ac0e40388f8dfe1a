/* Internal: the model as FSDP units (SPEC §6), for the distributed engine.
 *
 * A unit is each transformer block (unit l + 1 for layer l), the embedding (unit L + 1),
 * and the root unit 0 (final norm, lm_head), as torchtitan wraps them; when lm_head shares
 * the embedding (tie_word_embeddings) there is no unit L + 1 and the root holds it. Each
 * unit's tensors are one contiguous range of the flat parameter layout. A model created with external_params owns no weights or gradients: before a unit
 * runs, the engine binds it to buffers holding the unit's gathered weights (and, for
 * converted weights, their gathered MX planes) and to a buffer receiving its gradients. The
 * model calls the engine's hooks around each unit's forward and backward. */
#ifndef MXI_MODEL_UNITS_H
#define MXI_MODEL_UNITS_H

#include <stdbool.h>
#include <stdint.h>

#include "model/linear.h"
#include "mxtrain/model.h"
#include "mxtrain/safetensors.h"

typedef enum { MXI_PRE_FORWARD, MXI_POST_FORWARD, MXI_PRE_BACKWARD, MXI_POST_BACKWARD } mxi_unit_event;

typedef struct {
    void *ctx;
    /* Called with the unit around its forward and backward; a non-zero return stops the
     * pass (the model's error becomes it, with diag). */
    int (*on_unit)(void *ctx, int unit, mxi_unit_event event, mx_diag *diag);
    /* Optional, for the tensors mxi_model_sinks_grad names whose gradient is bound to NULL:
     * rows [row0, row0 + rows) of the tensor's gradient += src (rows, cols), called during
     * its unit's backward; src is the model's scratch, which the hook may overwrite.
     * Non-zero stops the pass, as on_unit's. */
    int (*add_grad)(void *ctx, int tensor, int64_t row0, int64_t rows, float *src, mx_diag *diag);
    /* add_grad's calls are collectives over ranks (the engine reduces each slice across
     * them): every rank makes the same calls, and the embedding hands its gradient over by
     * slices of the vocabulary (mxi_model_sink_calls) instead of a token at a time. */
    bool collective;
} mxi_model_hooks;

/* Expert parallelism (docs/distributed.md#expert-parallelism): the model is rank `rank` of
 * an EP group of `size` ranks (its mx_model_options.expert_parallel) and computes experts
 * [rank E/size, (rank+1) E/size). alltoallv is mxi_comm_alltoallv over the group; sum adds
 * x (n) over the group in place; what names the exchange for the watchdog's message. A
 * non-zero return stops the pass, as on_unit's. Optional, for mx_model_options.ep_overlap:
 * start begins the same exchange and returns at once (one in flight at a time), poke lets
 * it progress (called between the GEMMs that run beside it), wait finishes it; without
 * them every exchange is alltoallv's, where it starts. */
typedef struct {
    void *ctx;
    int rank, size;
    int (*alltoallv)(void *ctx, const void *send, const int *send_rows, void *recv, const int *recv_rows,
                     size_t row_bytes, const char *what, mx_diag *diag);
    int (*sum)(void *ctx, double *x, int n, const char *what, mx_diag *diag);
    int (*start)(void *ctx, const void *send, const int *send_rows, void *recv, const int *recv_rows,
                 size_t row_bytes, const char *what, mx_diag *diag);
    void (*poke)(void *ctx);
    int (*wait)(void *ctx, mx_diag *diag);
} mxi_model_ep;
/* Install the EP group's exchange; size must be the model's expert_parallel. With EP > 1 the
 * fused expert tensors bound to the model (mxi_model_bind_tensor, bind_planes) hold this
 * rank's E/size experts only, (E/size, rows, cols): its experts' weights, planes and gradients. */
void mxi_model_set_ep(mx_model *model, const mxi_model_ep *ep);
/* The four exchanges of an EP layer, per micro-batch (recompute runs the forward ones again). */
typedef enum {
    MXI_EP_FWD_DISPATCH,   // the routed rows (router input) to their experts' ranks
    MXI_EP_FWD_COMBINE,    // the experts' outputs back
    MXI_EP_BWD_DISPATCH,   // the gradients of those outputs to the experts' ranks
    MXI_EP_BWD_COMBINE,    // the gradients of the experts' inputs back
    MXI_EP_EXCHANGES
} mxi_ep_exchange;
/* How rows travel (parallel.ep_plan.dispatch_dtype, decided per layer and exchange when the
 * model is created): fp32, bf16 (round to nearest even), or the rowwise MX plane of the
 * experts' FC1 input (per row: C FP8 codes, then ceil(C/32) E8M0 scales). */
typedef enum { MXI_EP_WIRE_FP32, MXI_EP_WIRE_BF16, MXI_EP_WIRE_MXFP8 } mxi_ep_wire;
/* Bytes of one row of C elements on the wire: 4 C, 2 C, C + ceil(C/32). */
uint64_t mxi_ep_row_bytes(mxi_ep_wire wire, int64_t C);
/* Whether layer l exchanges tokens (an MoE layer that parallel.ep_plan.apply_modules selects,
 * with EP > 1), and the wire format of its exchange x (meaningful when it does). */
bool mxi_model_ep_layer(const mx_model *model, int layer);
mxi_ep_wire mxi_model_ep_wire(const mx_model *model, int layer, mxi_ep_exchange x);
/* What this rank sent to the other ranks of its EP group since the last call (rows it keeps
 * for its own experts, and the count messages, are not counted): bytes towards the experts
 * (forward inputs and backward output gradients: dispatch) by wire format, bytes back
 * (forward outputs and backward input gradients: combine, always fp32), and the rows of the
 * forward dispatches and combines (the backward exchanges move the same rows again). The
 * counters restart. */
typedef struct {
    uint64_t dispatch_fp32, dispatch_bf16, dispatch_mx_data, dispatch_mx_scale;
    uint64_t combine_fp32;
    uint64_t dispatch_rows, combine_rows;
} mxi_model_ep_bytes;
void mxi_model_take_ep_bytes(mx_model *model, mxi_model_ep_bytes *bytes);

/* A tensor as FSDP shards it: groups of rows along dim 0 (experts are E groups of their own
 * rows, so that each expert is sharded as the per-expert Hugging Face tensor it stands for). */
typedef struct {
    int unit;
    int64_t groups;   // 1, or E for fused expert tensors
    int64_t rows;     // rows per group (dim 0 of a matrix, numel of a vector)
    int64_t cols;     // elements per row
    int64_t offset;   // first element in the flat layout
    bool converted;   // a weight the plan converts: its GEMMs read MX planes
    bool decay;       // AdamW weight decay applies (matrices)
    const char *name;
} mxi_tensor_shape;

int mxi_model_num_units(const mx_model *model);
/* The embedding's unit: L + 1, or 0 (the root's) when lm_head shares the embedding. */
int mxi_model_embedding_unit(const mx_model *model);
/* Elements of the largest tensor (at least 1): the scratch that reading one whole tensor needs. */
int64_t mxi_model_largest_tensor(const mx_model *model);
/* Whether unit's forward runs again inside its backward (features.recompute with granularity
 * full): its backward then reads the forward's weight planes too. Selective recompute runs no
 * GEMM again, so its blocks gather as without recompute. The root never does. */
bool mxi_model_unit_recomputes(const mx_model *model, int unit);
mxi_tensor_shape mxi_model_tensor_shape(const mx_model *model, int index);
/* The quantization of converted weights (its formats, scale mode and tiles), or NULL. */
const mxi_linear_mx *mxi_model_mx_spec(const mx_model *model);
/* A delayed recipe's amax histories and scales (model/delayed.h), or NULL. */
mxi_delayed *mxi_model_delayed(mx_model *model);
/* The delayed scaling state in a checkpoint: written to path (one rank: every rank holds the
 * same), read back from it (every rank; no file: the state stays as it is). 0 without a
 * delayed recipe; a tensor missing or of another shape is an error naming path. */
#define MXI_DELAYED_FILE "delayed_scaling.safetensors"
int mxi_model_delayed_save(mx_model *model, const char *path, mx_diag *diag);
int mxi_model_delayed_load(mx_model *model, const char *path, mx_diag *diag);
/* The global index of the first expert a bound fused expert tensor holds: with EP its rank's
 * first expert where the bound tensors hold this rank's experts only, else 0. */
int64_t mxi_model_expert_base(const mx_model *model, int tensor);

/* Install the hooks; with add_grad, the scratch a sunk gradient needs is allocated here
 * (mxi_model_sink_bytes): MX_ENOMEM. */
int mxi_model_set_hooks(mx_model *model, const mxi_model_hooks *hooks);
/* Whether tensor index's gradient may go to add_grad instead of a buffer: the vocabulary
 * tables when lm_head is not converted, and the weights of a dense block's products (q, k,
 * v, o, gate, up, down: one weight gradient each a backward, handed over whole). lm_head's
 * backward then makes its weight gradient a slice of the vocabulary at a time over all rows
 * (its logits made once more), the embedding's adds each token's rows once: no V x C fp32
 * gradient exists. */
bool mxi_model_sinks_grad(const mx_model *model, int index);
/* Whether tensor index is a vocabulary table (the embedding, lm_head). */
bool mxi_model_vocab_table(const mx_model *model, int index);
/* The scratch that takes: a slice of lm_head's gradient (at most 64 MiB) or the largest
 * block weight's, and a row. */
uint64_t mxi_model_sink_bytes(const mx_model *model);
/* With collective hooks: the add_grad calls a backward makes for vocabulary table index
 * (lm_head's slices, then the embedding's; both when tied), 0 for other tensors, and in
 * *rows the rows they cover in all. */
int64_t mxi_model_sink_calls(const mx_model *model, int index, int64_t *rows);
/* Point tensor index's weights and gradients at w and g (its full, unsharded extent). */
void mxi_model_bind_tensor(mx_model *model, int index, float *w, float *g);
/* Point tensor index's weights at w, its bf16 bits (its gradients as bound before). Only for a
 * tensor mxi_model_takes_bf16 accepts, on a model whose products run bf16 natively
 * (mx_model_bf16_native); elsewhere the products would widen it at every call. */
void mxi_model_bind_tensor_bf16(mx_model *model, int index, const uint16_t *w);
bool mxi_model_takes_bf16(const mx_model *model, int index);
/* Whether the bound weights hold bf16 values (gathered in bf16 and widened): bf16 GEMMs
 * then take them as they are instead of rounding them again. */
void mxi_model_weights_bf16(mx_model *model, bool yes);
/* The pre-quantized planes of a converted tensor (NULL: quantize from the bound weights). */
void mxi_model_bind_planes(mx_model *model, int index, const mxi_mx_weight *planes);

/* Hugging Face's initialisation of one whole tensor into dst (numel floats): the values
 * mx_model_init gives it for this seed. */
void mxi_model_init_tensor(const mx_model *model, int index, uint64_t seed, float *dst);

/* Read every parameter from a safetensors file or checkpoint directory (as mx_model_load,
 * with its checks), one whole model tensor at a time, handing each to take; a non-zero
 * status from take (an error it has described) stops the read and is returned. The
 * model's own weights are not touched. */
typedef int (*mxi_tensor_sink)(void *ctx, int tensor, const float *full /* (numel) */);
int mxi_model_read(const mx_model *model, const char *path, mxi_tensor_sink take, void *ctx, mx_diag *diag);

/* As mxi_model_read, reading only parts of each tensor: for model tensor t, part(ctx, t, k,
 * &start, &count, &dst) for k = 0, 1, ... until it returns false names elements [start,
 * start + count) of the tensor to read into dst (count floats; a rank's rows). Every rank
 * checks every tensor's name, shape and dtype; the values it reads must be finite. */
typedef bool (*mxi_part_fn)(void *ctx, int tensor, int k, int64_t *start, int64_t *count, float **dst);
int mxi_model_read_parts(const mx_model *model, const char *path, mxi_part_fn part, void *ctx, mx_diag *diag);
/* The same for one tensor `name` of file (shape, ndim), the elements [within, within +
 * numel) of model tensor `tensor` (within 0: all of it, as an optimizer moment). */
int mxi_read_parts_of(mx_st_file *file, const char *name, const int64_t *shape, int ndim, int64_t within,
                      int tensor, mxi_part_fn part, void *ctx, mx_diag *diag);

/* MX_EFORMAT naming file, tensor and element when x (shape, ndim dims) holds a NaN or an
 * infinity: loaded weights and optimizer moments must be finite. */
int mxi_check_finite(const char *file, const char *tensor, const int64_t *shape, int ndim, const float *x,
                     mx_diag *diag);
/* The same over elements [first, first + n) of such a tensor, held at x. */
int mxi_check_finite_part(const char *file, const char *tensor, const int64_t *shape, int ndim, int64_t first,
                          int64_t n, const float *x, mx_diag *diag);

/* MX_EFORMAT naming file, tensor, value and element when elements [first, first + n) of
 * such a tensor, held at x, hold a negative value (an optimizer's second moment). */
int mxi_check_nonnegative_part(const char *file, const char *tensor, const int64_t *shape, int ndim, int64_t first,
                               int64_t n, const float *x, mx_diag *diag);

/* Hugging Face tensor index as (tensor, first element within it). */
void mxi_model_hf_slice(const mx_model *model, int hf_index, int *tensor, int64_t *within);
/* The Hugging Face tensors of model tensor `tensor`: indices [first, end), in the order of
 * their elements within it. */
void mxi_model_hf_range(const mx_model *model, int tensor, int *first, int *end);

#endif
