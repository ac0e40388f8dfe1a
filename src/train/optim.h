/* Internal: the optimizer and the learning-rate schedule.
 *
 * AdamW exactly as torch.optim.AdamW (decoupled weight decay, bias-corrected moments), on
 * fp32 master weights and fp32 moments held as flat buffers, so that FSDP can give each
 * rank a contiguous slice. */
#ifndef MXI_OPTIM_H
#define MXI_OPTIM_H

#include <stdint.h>

#include "mxtrain/config.h"
#include "train/moments.h"

typedef struct {
    float lr;              // this step's learning rate
    float beta1, beta2, eps;
    float weight_decay;    // applied to tensors whose decay flag is set
    int64_t step;          // 1-based count of updates so far, including this one
} adamw_step;

/* One AdamW update of n parameters: w, m, v updated in place from the gradient g.
 * decay: 1 to apply weight decay to this span, 0 not to (norms, biases). */
void mxi_adamw_update(float *w /* (n) */, float *m /* (n) */, float *v /* (n) */, const float *g /* (n) */,
                  int64_t n, const adamw_step *s, int decay);

/* The same with the moments as stored (train/moments.h): w, g the span's (n), its moments
 * elements [at, at + n) of m and v (at a multiple of 32), tensor span `span` of the store.
 * Each piece of the moments is read into fp32, updated as above and written back. An FP8
 * moment's new scale comes from the amax of the span's updated values, before any is
 * stored: a first pass updates copies to find it (the update is the same arithmetic on the
 * same values, so the second pass stores exactly those values). */
void mxi_adamw_update_moments(float *w /* (n) */, mxi_moment *m, mxi_moment *v, const float *g /* (n) */, int span,
                              int64_t at, int64_t n, const adamw_step *s, int decay);

/* The same with bf16 gradients (training.main_grads_dtype: bf16): g16 (n) widened a piece at a
 * time and multiplied by gscale (clipping; 1 for none), as mxi_scale_inplace would. */
void mxi_adamw_update_bf16_grads(float *w /* (n) */, mxi_moment *m, mxi_moment *v, const uint16_t *g16 /* (n) */,
                                 float gscale, int span, int64_t at, int64_t n, const adamw_step *s, int decay);

/* The learning-rate schedule, Megatron-LM's semantics (docs/training.md): W warmup updates
 * run at lr * step / W (the first at lr / W); after warmup, update k runs at the schedule
 * after n = k - 1 completed updates, falling from lr to min_lr over the first D: progress
 * p = (n - W) / (D - W), constant lr, linear min_lr + (lr - min_lr) (1 - p), cosine
 * min_lr + (lr - min_lr) (1 + cos(pi p)) / 2; WSD holds lr until n = D - S, then anneals
 * over the last S with r = (n - (D - S)) / S: exponential 2 * 0.5^r - 1, linear 1 - r,
 * cosine (1 + cos(pi r)) / 2, minus_sqrt 1 - sqrt(r). From n = D on, min_lr. */
typedef struct {
    float lr, min_lr;
    int64_t warmup;          // W
    int64_t decay;           // D
    mx_lr_decay style;
    mx_wsd_decay wsd_style;
    int64_t wsd_decay;       // S (WSD only)
} lr_schedule;

/* The schedule of a training config (mx_training_warmup_steps, mx_training_decay_steps). */
lr_schedule mxi_lr_schedule_of(const mx_training_config *tc);
/* The learning rate of update `step` (1-based). */
float mxi_lr_at(const lr_schedule *s, int64_t step);

/* Sum of squares of n values, in double. */
double mxi_sum_squares(const float *x /* (n) */, int64_t n);

/* The same of n bf16 values. */
double mxi_sum_squares_bf16(const uint16_t *x /* (n) */, int64_t n);

/* Multiply n values by s. */
void mxi_scale_inplace(float *x /* (n) */, int64_t n, float s);

#endif
