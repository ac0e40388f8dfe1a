/* mxtrain — the training loop on one process: a model built from a config, batches from
 * llm.c token shards, AdamW with warmup and decay, gradient accumulation and clipping by
 * the global norm, and per-step metrics (a JSONL line each when training.metrics_path is
 * set). The library prints nothing: callers show the metrics as they like. */
#ifndef MXTRAIN_TRAIN_H
#define MXTRAIN_TRAIN_H

#include <stdint.h>

#include "mxtrain/config.h"
#include "mxtrain/model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mx_trainer mx_trainer;

typedef struct {
    int64_t step;           /* optimizer steps done, 1-based after the first */
    int64_t total_steps;    /* training.train_iters */
    double loss;            /* mean over the step's micro-batches of cross-entropy (+ aux) */
    double ce_loss;         /* mean cross-entropy alone */
    double aux_loss;        /* mean load-balancing loss (0 for dense models) */
    double lr;              /* learning rate of this step */
    double grad_norm;       /* global gradient norm before clipping */
    int64_t tokens;         /* tokens trained on this step (B * T * accumulation) */
    double step_seconds;
    double tokens_per_s;
    double elapsed_seconds; /* since the trainer was created */
} mx_step_metrics;

/* Build everything a run needs from a loaded config: the model (weights from
 * model.model_name_or_path when it holds safetensors, else initialised from training.seed),
 * the data loader over data.data_path, optimizer state, the metrics file. Errors (one line
 * in diag): the config's data or weights cannot be read, an unsupported setting, memory. */
int mx_trainer_create(const mx_config *config, mx_trainer **out, mx_diag *diag);

/* One optimizer step (gradient_accumulation_steps micro-batches). Returns 0, or an error
 * (data, a non-finite loss, a failed matrix product, the metrics file) in diag. */
int mx_trainer_step(mx_trainer *trainer, mx_step_metrics *metrics, mx_diag *diag);

/* Steps done so far, and the model being trained. */
int64_t mx_trainer_steps_done(const mx_trainer *trainer);
mx_model *mx_trainer_model(mx_trainer *trainer);

/* Save the weights to training.save/model.safetensors (atomic). No-op without training.save. */
int mx_trainer_save(mx_trainer *trainer, mx_diag *diag);

void mx_trainer_free(mx_trainer *trainer);

#ifdef __cplusplus
}
#endif

#endif
