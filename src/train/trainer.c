/* The single-process training loop (see include/mxtrain/train.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "core/diag.h"
#include "mxtrain/tokens.h"
#include "mxtrain/train.h"
#include "train/optim.h"

struct mx_trainer {
    const mx_config *cfg;
    mx_model *model;
    mx_loader *loader;
    float *adam_m, *adam_v;   // (P) AdamW moments, one allocation
    int32_t *inputs, *targets;// (B, T)
    int64_t steps_done;
    double start_time;
    FILE *metrics;
};

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Weights of model_name_or_path when that directory holds a checkpoint. */
static bool has_checkpoint(const char *dir) {
    char path[4096];
    struct stat st;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (stat(path, &st) == 0) return true;
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    return stat(path, &st) == 0;
}

int mx_trainer_create(const mx_config *cfg, mx_trainer **out, mx_diag *diag) {
    if (!cfg || !out) return mxi_diag(diag, MX_ENULL, "mx_trainer_create: NULL argument");
    *out = NULL;
    // settings the single-process engine does not carry out yet: refused, never ignored
    if (cfg->training.load)
        return mxi_diag(diag, MX_EUNSUPPORTED, "%s: training.load: resuming from '%s' is not supported yet "
                        "(remove training.load)", cfg->source, cfg->training.load);
    if (cfg->training.save_interval > 0)
        return mxi_diag(diag, MX_EUNSUPPORTED, "%s: training.save_interval: %d is not supported yet (allowed: 0, "
                        "saving the weights after the last step)", cfg->source, cfg->training.save_interval);
    if (cfg->features.recompute)
        return mxi_diag(diag, MX_EUNSUPPORTED, "%s: features.recompute: true is not supported yet (allowed: false)",
                        cfg->source);
    if (cfg->parallel.fully_shard_parallel_size > 1)
        return mxi_diag(diag, MX_EUNSUPPORTED, "%s: parallel.fully_shard_parallel_size: %d needs the MPI backend, "
                        "which is not built yet (allowed: auto or 1)", cfg->source,
                        cfg->parallel.fully_shard_parallel_size);
    mx_trainer *t = calloc(1, sizeof *t);
    if (!t) return mxi_diag(diag, MX_ENOMEM, "out of memory");
    t->cfg = cfg;
    t->start_time = now_seconds();
    int B = cfg->training.micro_batch_size, T = cfg->data.seq_length;
    mx_model_options opt = {.batch = B, .seq = T, .bf16 = cfg->parallel.param_dtype == MX_DTYPE_BF16, .plan = &cfg->training.quantization_plan};
    int rc = mx_model_create(&cfg->model, &opt, &t->model, diag);
    if (rc) goto fail;
    if (cfg->model_name_or_path && has_checkpoint(cfg->model_name_or_path)) {
        rc = mx_model_load(t->model, cfg->model_name_or_path, diag);
        if (rc) goto fail;
    } else {
        mx_model_init(t->model, cfg->training.seed);
    }
    rc = mx_loader_open((const char *const *)cfg->data.data_path, cfg->data.n_data_path, B, T, 0, 1,
                        cfg->model.vocab_size, &t->loader, diag);
    if (rc) goto fail;
    int64_t P = mx_model_num_params(t->model);
    t->adam_m = calloc((size_t)(2 * P), sizeof(float));
    t->inputs = malloc((size_t)B * T * sizeof(int32_t));
    t->targets = malloc((size_t)B * T * sizeof(int32_t));
    if (!t->adam_m || !t->inputs || !t->targets) {
        rc = mxi_diag(diag, MX_ENOMEM, "out of memory for the optimizer state (%lld parameters)", (long long)P);
        goto fail;
    }
    t->adam_v = t->adam_m + P;
    if (cfg->training.metrics_path) {
        t->metrics = fopen(cfg->training.metrics_path, "w");
        if (!t->metrics) {
            rc = mxi_diag(diag, MX_EIO, "training.metrics_path: cannot write '%s'", cfg->training.metrics_path);
            goto fail;
        }
    }
    *out = t;
    return MX_OK;
fail:
    mx_trainer_free(t);
    return rc;
}

void mx_trainer_free(mx_trainer *t) {
    if (!t) return;
    mx_model_free(t->model);
    mx_loader_close(t->loader);
    if (t->metrics) fclose(t->metrics);
    free(t->adam_m), free(t->inputs), free(t->targets);
    free(t);
}

int64_t mx_trainer_steps_done(const mx_trainer *t) { return t->steps_done; }
mx_model *mx_trainer_model(mx_trainer *t) { return t->model; }

int mx_trainer_step(mx_trainer *t, mx_step_metrics *out, mx_diag *diag) {
    const mx_training_config *tc = &t->cfg->training;
    mx_model *m = t->model;
    int accum = tc->gradient_accumulation_steps;
    double t0 = now_seconds(), loss = 0, ce = 0, aux = 0;
    mx_model_zero_grad(m);
    for (int micro = 0; micro < accum; micro++) {
        int rc = mx_loader_next(t->loader, t->inputs, t->targets, diag);
        if (rc) return rc;
        double l = mx_model_forward(m, t->inputs, t->targets);
        mx_model_backward(m, 1.0f / accum);
        rc = mx_model_error(m, diag);
        if (rc) return rc;
        if (!isfinite(l))
            return mxi_diag(diag, MX_EINVAL, "step %lld: the loss is %g (diverged; lower training.lr or set clip_grad)",
                            (long long)t->steps_done + 1, l);
        loss += l / accum, ce += mx_model_last_ce_loss(m) / accum, aux += mx_model_last_aux_loss(m) / accum;
    }
    int64_t P = mx_model_num_params(m);
    float *w = mx_model_params(m), *g = mx_model_grads(m);
    double norm = sqrt(sum_squares(g, P));
    if (tc->clip_grad > 0 && norm > tc->clip_grad) scale_inplace(g, P, (float)(tc->clip_grad / (norm + 1e-6)));
    int64_t step = t->steps_done + 1;
    float lr = lr_at(step, tc->train_iters, (float)tc->lr, (float)tc->min_lr, (float)tc->lr_warmup_ratio,
                     tc->lr_decay_style);
    adamw_step st = {lr, (float)tc->adam_beta1, (float)tc->adam_beta2, (float)tc->adam_eps, (float)tc->weight_decay, step};
    // weight decay on matrices only: norms and biases (1-D tensors) are not decayed, as in Megatron
    for (int i = 0; i < mx_model_num_tensors(m); i++) {
        mx_tensor_view v = mx_model_tensor(m, i);
        int64_t off = v.data - w;
        adamw_update(v.data, t->adam_m + off, t->adam_v + off, v.grad, v.numel, &st, v.ndim >= 2);
    }
    t->steps_done = step;
    double dt = now_seconds() - t0;
    int64_t tokens = (int64_t)accum * tc->micro_batch_size * t->cfg->data.seq_length;
    mx_step_metrics mt = {step, tc->train_iters, loss, ce, aux, lr, norm, tokens, dt, tokens / dt,
                          now_seconds() - t->start_time};
    if (t->metrics) {
        fprintf(t->metrics,
                "{\"step\": %lld, \"loss\": %.6f, \"ce_loss\": %.6f, \"aux_loss\": %.6f, \"lr\": %.6e, "
                "\"grad_norm\": %.6f, \"tokens\": %lld, \"step_s\": %.4f, \"tokens_per_s\": %.1f}\n",
                (long long)step, loss, ce, aux, lr, norm, (long long)tokens, dt, tokens / dt);
        if (fflush(t->metrics) != 0)
            return mxi_diag(diag, MX_EIO, "training.metrics_path: writing '%s' failed", tc->metrics_path);
    }
    if (out) *out = mt;
    return MX_OK;
}

int mx_trainer_save(mx_trainer *t, mx_diag *diag) {
    const char *dir = t->cfg->training.save;
    if (!dir) return MX_OK;
    if (mkdir(dir, 0777) != 0) {
        struct stat st;
        if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
            return mxi_diag(diag, MX_EIO, "training.save: cannot create the directory '%s'", dir);
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    return mx_model_save(t->model, path, false, NULL, NULL, 0, diag);
}
