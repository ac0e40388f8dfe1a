/* Internal: delayed scaling (TransformerEngine's DelayedScaling; docs/quantization-plan.md#delayed-scaling).
 *
 * Every converted tensor has, per role (input, weight, grad) and per expert of a fused
 * expert tensor, a slot: an amax history of amax_history_len floats and a scale. A cast uses
 * its slot's scale and folds its amax into slot 0 of the history (with max: a tensor cast
 * twice in one pass, as backward casts the input again, records it once). After each
 * micro-batch's forward the input and weight slots update, after its backward the grad
 * slots: slot 0 of each history is MAX all-reduced over the data-parallel ranks (one
 * all-reduce for all of them), the amax is the history's max (`max`) or slot 0
 * (`most_recent`), the scale is recomputed from it, then the history rolls and slot 0 is
 * zeroed. The layout of a history is TE's: slot 0 is the one being written, the roll moves
 * entry i + 1 to i and slot 0 to the end.
 *
 * A scale is, for FP8, the quantization scale (q = fp8(x * scale), dequantized by 1 / scale,
 * as mx_fp8_quantize_tensor_f32); for HiF8, the dequantization scale (q = hif8(x / scale), as
 * mx_hif8_quantize_tensor_f32). */
#ifndef MXI_DELAYED_H
#define MXI_DELAYED_H

#include <stdbool.h>
#include <stdint.h>

#include "mxtrain/error.h"
#include "mxtrain/mx.h"
#include "mxtrain/plan.h"

typedef struct mxi_delayed mxi_delayed;

/* The roles of a converted tensor's casts, the order of its three slots. */
typedef enum { MXI_DELAYED_INPUT = 0, MXI_DELAYED_WEIGHT = 1, MXI_DELAYED_GRAD = 2, MXI_DELAYED_ROLES = 3 } mxi_delayed_role;

/* Which slots an update covers: those of forward's casts (input, weight) or backward's (grad). */
typedef enum { MXI_DELAYED_FORWARD, MXI_DELAYED_BACKWARD } mxi_delayed_phase;

/* A linear call's slots: the first of its three (input, weight, grad); state NULL where the
 * call does not scale by delay. */
typedef struct {
    mxi_delayed *state;
    int64_t slot;
} mxi_delayed_site;

/* The update of one slot from its history hist (len floats), as TE's amax_and_scale_update:
 * amax = max over hist (NaN entries ignored, as fmaxf) or hist[0]; where amax is positive and
 * finite, the scale becomes, for FP8, (max * 2^-margin) / amax in fp32 (FLT_MAX where that
 * overflows), for HiF8 (target max the role's 15 or 224) fp32(amax * fp32(1 / max)) * 2^margin;
 * else, or where a HiF8 scale would be 0 or Inf, *scale stays. Then hist rolls: hist[i] =
 * hist[i + 1] for 0 < i < len - 1, hist[len - 1] = the old hist[0], hist[0] = 0. */
void mxi_delayed_update_slot(float *hist, int len, mx_amax_algo algo, float max, int margin, bool hif8,
                             float *scale);

/* The scale's target maximum of an element format in a role: FP8's largest finite value, or
 * HiF8's per-role target (15 for inputs and weights, 224 for gradients). */
float mxi_delayed_target(mx_elem elem, mxi_delayed_role role);

/* State for n_tensors tensors, tensor i with groups[i] slot triples (0: not converted; the
 * experts of a fused tensor: E), every scale 1 and every history zero. 0 or MX_ENOMEM. */
int mxi_delayed_create(mxi_delayed **out, const mx_plan *plan, int n_tensors, const int64_t *groups);
void mxi_delayed_free(mxi_delayed *d);

/* Tensor i's site for group g (expert g of a fused tensor, 0 otherwise); no site (state
 * NULL) for d NULL or a tensor without slots. */
mxi_delayed_site mxi_delayed_site_of(mxi_delayed *d, int tensor, int64_t group);

/* Whether the casts from now on record their amaxes (training steps; not warm-up, evaluation
 * or `mxtrain grads`). */
void mxi_delayed_set_training(mxi_delayed *d, bool on);

/* A forward pass starts: its casts (and backward's, and a recompute's) use the scales as they
 * are now; its input and weight casts record their amaxes (when training). */
void mxi_delayed_begin_forward(mxi_delayed *d);
/* The backward pass starts: casts of the input and weight roles (backward's again, a
 * recompute's) record nothing, those of the grad role do (when training). */
void mxi_delayed_begin_backward(mxi_delayed *d);

/* The scale a cast of site's role uses (the one of the last forward's start), and the amax of
 * what it cast, folded into slot 0 when that role records. */
float mxi_delayed_scale(const mxi_delayed_site *site, mxi_delayed_role role);
void mxi_delayed_note(const mxi_delayed_site *site, mxi_delayed_role role, float amax);

/* For the FSDP engine, which casts converted weights before the forward starts: the weight
 * scale of the next forward, and a shard's amax (noted when training). */
float mxi_delayed_next_scale(const mxi_delayed_site *site, mxi_delayed_role role);
void mxi_delayed_note_shard(const mxi_delayed_site *site, mxi_delayed_role role, float amax);

/* The MAX all-reduce of n values over the data-parallel ranks, in place (NULL: one rank). */
typedef int (*mxi_amax_reduce)(void *ctx, double *x, int n, mx_diag *diag);

/* Update the slots of phase (see above); 0, or reduce's failure. A no-op for d NULL. */
int mxi_delayed_update(mxi_delayed *d, mxi_delayed_phase phase, mxi_amax_reduce reduce, void *ctx, mx_diag *diag);

/* The state as checkpoints hold it: slots, history length, and the arrays hist (slots, len)
 * and scale (slots); tensor i's slots start at first_slot(i) (-1: none) and number
 * 3 * groups. */
int64_t mxi_delayed_slots(const mxi_delayed *d);
int mxi_delayed_history_len(const mxi_delayed *d);
float *mxi_delayed_history(mxi_delayed *d);
float *mxi_delayed_scales(mxi_delayed *d);
int64_t mxi_delayed_first_slot(const mxi_delayed *d, int tensor);

/* The bytes the state holds (0 for d NULL): histories, scales, the update's buffer and the
 * slot index; `plan` predicts them and `train` reports them as the scaling state. */
uint64_t mxi_delayed_bytes(const mxi_delayed *d);

/* Quantize x (n) with a known scale (the convention above): q, and the dequantization scale
 * into *scale_inv; amax(x) (NaN ignored) into *amax in the same pass, unless amax is NULL. */
void mxi_delayed_encode(const float *x, int64_t n, mx_elem elem, float scale, uint8_t *q, float *scale_inv, float *amax);

/* Whether a cast of role at site records its amax now (mxi_delayed_note folds it). */
bool mxi_delayed_records(const mxi_delayed_site *site, mxi_delayed_role role);

#endif
