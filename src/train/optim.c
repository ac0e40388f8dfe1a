/* AdamW and the learning-rate schedule (see optim.h). */
#include "train/optim.h"

#include <math.h>
#include <string.h>

#include "mxtrain/scaled.h"
#include "ops/nn_kernels.h"

void mxi_adamw_update(float *w, float *m, float *v, const float *g, int64_t n, const adamw_step *s, int decay) {
    // torch.optim.AdamW: w *= 1 - lr*wd; m, v updated; w -= lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps)
    float b1 = s->beta1, b2 = s->beta2, lr = s->lr;
    float bc1 = 1.0f - powf(b1, (float)s->step), bc2_sqrt = sqrtf(1.0f - powf(b2, (float)s->step));
    float step_size = lr / bc1, shrink = decay ? 1.0f - lr * s->weight_decay : 1.0f;
    const mxi_nn_kernels *k = mxi_nn_kernels_active();
    MXI_PARALLEL_CHUNKS(n, k->adamw(w + i0, m + i0, v + i0, g + i0, len, b1, b2, step_size, bc2_sqrt, s->eps, shrink));
}

/* Elements a thread reads from a stored moment, updates and writes back at a time: whole
 * MX blocks. */
enum { PIECE = 4096 };

/* The span's gradients: fp32, or bf16 times the clipping factor. */
typedef struct {
    const float *g;          // (n) or NULL
    const uint16_t *g16;     // (n) when g is NULL
    float gscale;
} grads_in;

/* The gradients of a piece [i0, i0 + len): g's own, or widened and scaled into buf. */
static const float *piece_grads(const grads_in *in, int64_t i0, int64_t len, float *buf) {
    if (in->g) return in->g + i0;
    const mxi_nn_kernels *k = mxi_nn_kernels_active();
    k->bf16_widen(buf, in->g16 + i0, len, 0);
    if (in->gscale != 1.0f) k->scale(buf, len, in->gscale);
    return buf;
}

/* FP8 moments: the largest magnitude of each updated moment over the span, from the update
 * run on copies (the weights and the store untouched). */
static void updated_amax(const float *w, const mxi_moment *m, const mxi_moment *v, const grads_in *in, int span,
                         int64_t at, int64_t n, const adamw_step *s, int decay, float amax[2]) {
    int64_t pieces = (n + PIECE - 1) / PIECE;
    float am = 0.0f, av = 0.0f;
    #pragma omp parallel for schedule(static) reduction(max : am, av) if (pieces > 1)
    for (int64_t p = 0; p < pieces; p++) {
        float wb[PIECE], gb[PIECE], mb[PIECE], vb[PIECE];
        int64_t i0 = p * PIECE, len = n - i0 < PIECE ? n - i0 : PIECE;
        memcpy(wb, w + i0, (size_t)len * sizeof *wb);
        mxi_moment_read(m, span, at + i0, len, mb);
        mxi_moment_read(v, span, at + i0, len, vb);
        mxi_adamw_update(wb, mb, vb, piece_grads(in, i0, len, gb), len, s, decay);
        float a = mx_amax_f32(mb, len), b = mx_amax_f32(vb, len);
        am = a > am ? a : am, av = b > av ? b : av;
    }
    amax[0] = am, amax[1] = av;
}

static void put(mxi_moment *m, int span, int64_t at, int64_t len, const float *x, const mxi_fp8_scaling *sc) {
    if (m->dtype == MX_STATE_FP8) mxi_moment_put_fp8(m, at, len, x, sc);
    else if (m->dtype != MX_STATE_FP32) mxi_moment_write(m, span, at, len, x);
}

static void update_stored(float *w, mxi_moment *m, mxi_moment *v, const grads_in *in, int span, int64_t at, int64_t n,
                          const adamw_step *s, int decay) {
    mxi_fp8_scaling sc[2] = {{.q = 1.0f, .scale_inv = 1.0f}, {.q = 1.0f, .scale_inv = 1.0f}};
    if (m->dtype == MX_STATE_FP8 || v->dtype == MX_STATE_FP8) {
        float amax[2];
        updated_amax(w, m, v, in, span, at, n, s, decay, amax);
        sc[0] = mxi_fp8_scaling_of(amax[0]), sc[1] = mxi_fp8_scaling_of(amax[1]);
    }
    int64_t pieces = (n + PIECE - 1) / PIECE;
    #pragma omp parallel for schedule(static) if (pieces > 1)
    for (int64_t p = 0; p < pieces; p++) {
        float gb[PIECE], mb[PIECE], vb[PIECE];
        int64_t i0 = p * PIECE, len = n - i0 < PIECE ? n - i0 : PIECE;
        float *mp = mxi_moment_span(m, span, at + i0, len, mb), *vp = mxi_moment_span(v, span, at + i0, len, vb);
        mxi_adamw_update(w + i0, mp, vp, piece_grads(in, i0, len, gb), len, s, decay);   // one piece: one chunk
        put(m, span, at + i0, len, mp, &sc[0]);
        put(v, span, at + i0, len, vp, &sc[1]);
    }
    // every piece now holds codes of the new scale
    if (m->dtype == MX_STATE_FP8) m->scale_inv[span] = sc[0].scale_inv;
    if (v->dtype == MX_STATE_FP8) v->scale_inv[span] = sc[1].scale_inv;
}

void mxi_adamw_update_moments(float *w, mxi_moment *m, mxi_moment *v, const float *g, int span, int64_t at, int64_t n,
                              const adamw_step *s, int decay) {
    if (m->dtype == MX_STATE_FP32 && v->dtype == MX_STATE_FP32) {
        mxi_adamw_update(w, m->f32 + at, v->f32 + at, g, n, s, decay);
        return;
    }
    update_stored(w, m, v, &(grads_in){.g = g}, span, at, n, s, decay);
}

void mxi_adamw_update_bf16_grads(float *w, mxi_moment *m, mxi_moment *v, const uint16_t *g16, float gscale, int span,
                                 int64_t at, int64_t n, const adamw_step *s, int decay) {
    update_stored(w, m, v, &(grads_in){.g16 = g16, .gscale = gscale}, span, at, n, s, decay);
}

lr_schedule mxi_lr_schedule_of(const mx_training_config *tc) {
    return (lr_schedule){.lr = (float)tc->lr, .min_lr = (float)tc->min_lr, .warmup = mx_training_warmup_steps(tc),
                         .decay = mx_training_decay_steps(tc), .style = tc->lr_decay_style,
                         .wsd_style = tc->lr_wsd_decay_style, .wsd_decay = tc->lr_wsd_decay_iters};
}

float mxi_lr_at(const lr_schedule *s, int64_t step) {
    // Megatron-LM / Hugging Face: update k runs at the schedule after k - 1 completed
    // updates, except that warmup counts this update (k / W, never 0)
    double lr = s->lr, min_lr = s->min_lr;
    int64_t W = s->warmup, D = s->decay, n = step - 1;
    if (step <= W) return (float)(lr * (double)step / (double)W);
    if (s->style == MX_LR_CONSTANT) return s->lr;
    if (n >= D) return s->min_lr;
    const double pi = 3.14159265358979323846;
    double k;
    if (s->style == MX_LR_WSD) {
        int64_t anneal = D - s->wsd_decay;   // the last stable update count
        double r = n <= anneal ? 0 : (double)(n - anneal) / (double)s->wsd_decay;
        switch (s->wsd_style) {
        case MX_WSD_LINEAR: k = 1 - r; break;
        case MX_WSD_COSINE: k = 0.5 * (1 + cos(pi * r)); break;
        case MX_WSD_MINUS_SQRT: k = 1 - sqrt(r); break;
        default: k = 2 * pow(0.5, r) - 1; break;
        }
    } else {
        double p = (double)(n - W) / (double)(D - W);   // [0, 1)
        k = s->style == MX_LR_LINEAR ? 1 - p : 0.5 * (1 + cos(pi * p));
    }
    return (float)(min_lr + (lr - min_lr) * k);
}

double mxi_sum_squares(const float *x, int64_t n) {
    const mxi_nn_kernels *k = mxi_nn_kernels_active();
    int64_t chunks = n / MXI_NN_MIN_CHUNK > 0 ? n / MXI_NN_MIN_CHUNK : 1;
    double acc = 0.0;
    #pragma omp parallel for schedule(static) reduction(+ : acc) if (chunks > 1)
    for (int64_t c = 0; c < chunks; c++) acc += k->sum_squares(x + n * c / chunks, n * (c + 1) / chunks - n * c / chunks);
    return acc;
}

double mxi_sum_squares_bf16(const uint16_t *x, int64_t n) {
    const mxi_nn_kernels *k = mxi_nn_kernels_active();
    int64_t pieces = (n + PIECE - 1) / PIECE;
    double acc = 0.0;
    #pragma omp parallel for schedule(static) reduction(+ : acc) if (pieces > 16)
    for (int64_t p = 0; p < pieces; p++) {
        float buf[PIECE];
        int64_t i0 = p * PIECE, len = n - i0 < PIECE ? n - i0 : PIECE;
        k->bf16_widen(buf, x + i0, len, 0);
        acc += k->sum_squares(buf, len);
    }
    return acc;
}

void mxi_scale_inplace(float *x, int64_t n, float s) {
    const mxi_nn_kernels *k = mxi_nn_kernels_active();
    MXI_PARALLEL_CHUNKS(n, k->scale(x + i0, len, s));
}
