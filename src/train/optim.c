/* AdamW and the learning-rate schedule (see optim.h). */
#include "train/optim.h"

#include <math.h>

#include "ops/nn_kernels.h"

void adamw_update(float *w, float *m, float *v, const float *g, int64_t n, const adamw_step *s, int decay) {
    // torch.optim.AdamW: w *= 1 - lr*wd; m, v updated; w -= lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps)
    float b1 = s->beta1, b2 = s->beta2, lr = s->lr;
    float bc1 = 1.0f - powf(b1, (float)s->step), bc2_sqrt = sqrtf(1.0f - powf(b2, (float)s->step));
    float step_size = lr / bc1, shrink = decay ? 1.0f - lr * s->weight_decay : 1.0f;
    const mxi_nn_kernels *k = mxi_nn_kernels_active();
    MXI_PARALLEL_CHUNKS(n, k->adamw(w + i0, m + i0, v + i0, g + i0, len, b1, b2, step_size, bc2_sqrt, s->eps, shrink));
}

float lr_at(int64_t step, int64_t total, float lr, float min_lr, float warmup_ratio, mx_lr_decay style) {
    // Megatron-LM / Hugging Face: update k runs at the schedule after k - 1 completed
    // updates, except that warmup counts this update (k / W, never 0)
    int64_t warmup = (int64_t)llround((double)warmup_ratio * (double)total);
    if (step <= warmup) return (float)((double)lr * (double)step / (double)warmup);
    if (style == MX_LR_CONSTANT || total <= warmup) return lr;
    double progress = (double)(step - 1 - warmup) / (double)(total - warmup);   // [0, 1)
    if (progress > 1) progress = 1;   // past train_iters (not reached by the trainer)
    double k = style == MX_LR_LINEAR ? 1.0 - progress : 0.5 * (1.0 + cos(3.14159265358979323846 * progress));
    return (float)(min_lr + (lr - min_lr) * k);
}

double sum_squares(const float *x, int64_t n) {
    const mxi_nn_kernels *k = mxi_nn_kernels_active();
    int64_t chunks = n / MXI_NN_MIN_CHUNK > 0 ? n / MXI_NN_MIN_CHUNK : 1;
    double acc = 0.0;
    #pragma omp parallel for schedule(static) reduction(+ : acc) if (chunks > 1)
    for (int64_t c = 0; c < chunks; c++) acc += k->sum_squares(x + n * c / chunks, n * (c + 1) / chunks - n * c / chunks);
    return acc;
}

void scale_inplace(float *x, int64_t n, float s) {
    const mxi_nn_kernels *k = mxi_nn_kernels_active();
    MXI_PARALLEL_CHUNKS(n, k->scale(x + i0, len, s));
}
