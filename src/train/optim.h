/* Internal: the optimizer and the learning-rate schedule.
 *
 * AdamW exactly as torch.optim.AdamW (decoupled weight decay, bias-corrected moments), on
 * fp32 master weights and fp32 moments held as flat buffers, so that FSDP can give each
 * rank a contiguous slice. */
#ifndef MXI_OPTIM_H
#define MXI_OPTIM_H

#include <stdint.h>

#include "mxtrain/config.h"

typedef struct {
    float lr;              // this step's learning rate
    float beta1, beta2, eps;
    float weight_decay;    // applied to tensors whose decay flag is set
    int64_t step;          // 1-based count of updates so far, including this one
} adamw_step;

/* One AdamW update of n parameters: w, m, v updated in place from the gradient g.
 * decay: 1 to apply weight decay to this span, 0 not to (norms, biases). */
void adamw_update(float *w /* (n) */, float *m /* (n) */, float *v /* (n) */, const float *g /* (n) */,
                  int64_t n, const adamw_step *s, int decay);

/* Learning rate of update `step` (1-based) of `total`, with Megatron-LM / Hugging Face
 * semantics: W = round(warmup_ratio * total) warmup updates run at lr * step / W (the first
 * at lr / W, none at 0); after warmup update k runs at the schedule after k - 1 updates,
 * decay progress p = (k - 1 - W) / (total - W) in [0, 1): constant lr, linear
 * min_lr + (lr - min_lr) (1 - p), cosine min_lr + (lr - min_lr) (1 + cos(pi p)) / 2. The
 * first update after warmup runs at lr; a one-update run at lr. */
float lr_at(int64_t step, int64_t total, float lr, float min_lr, float warmup_ratio, mx_lr_decay style);

/* Sum of squares of n values, in double. */
double sum_squares(const float *x /* (n) */, int64_t n);

/* Multiply n values by s. */
void scale_inplace(float *x /* (n) */, int64_t n, float s);

#endif
