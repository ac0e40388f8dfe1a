/* mxtrain — the training loop: a model built from a config, batches from llm.c token
 * shards, AdamW with warmup and decay, gradient accumulation and clipping by the global
 * norm, per-step metrics (a JSONL line each when training.metrics_path is set, written by
 * rank 0), and checkpoints. Data-parallel and fully sharded over the ranks of an MPI job
 * (SPEC §6; one rank without a launcher): each rank trains on its own micro-batches of the
 * global batch, which is micro_batch_size * ranks * gradient_accumulation_steps rows. The
 * library prints nothing: callers show the metrics as they like. */
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
    double z_loss;          /* mean router z-loss (training.moe_z_loss_coeff; 0 without) */
    double lr;              /* learning rate of this step */
    double grad_norm;       /* global gradient norm before clipping */
    int64_t tokens;         /* tokens trained on this step (B * T * accumulation) */
    double step_seconds;
    double tokens_per_s;
    double elapsed_seconds; /* since the trainer was created */
    /* communication of this rank in this step (SPEC §6) */
    uint64_t ag_param_bytes;    /* all-gathered unconverted weights, in param_dtype */
    uint64_t ag_mx_data_bytes;  /* all-gathered MX element codes of converted weights */
    uint64_t ag_mx_scale_bytes; /* all-gathered E8M0 scales */
    uint64_t ag_bf16_equiv;     /* what the converted weights would have cost gathered in bf16 */
    uint64_t rs_bytes;          /* gradients reduce-scattered, in reduce_dtype */
    uint64_t ar_bytes;          /* reduced gradient shards all-reduced across the replicas (HSDP),
                                   in reduce_dtype: the shards' size (0 with one replica) */
    double comm_seconds;        /* waiting in collectives */
    uint64_t peak_rss_bytes;    /* this process's peak resident memory so far */
    uint64_t dispatch_bytes, combine_bytes;   /* expert parallelism: token rows this rank sent to
                                                 the other ranks of its EP group towards the
                                                 experts and back (forward and backward), as
                                                 they travel (the sums of the fields below) */
    uint64_t dispatch_fp32_bytes, dispatch_bf16_bytes;          /* dispatch_bytes by wire format: */
    uint64_t dispatch_mx_data_bytes, dispatch_mx_scale_bytes;   /* ... mxfp8's FP8 codes and E8M0 scales */
    uint64_t dispatch_rows, combine_rows;   /* rows of the forward dispatches and combines (the
                                               backward moves the same rows; recompute's second
                                               forward counts again) */
} mx_step_metrics;

/* A run as set up: ranks, the memory each holds by category, and what the trainer decided
 * that a user should hear about (one line each). */
typedef struct {
    int rank, world;
    int expert_parallel_size;        /* EP (mx_layout) */
    int expert_fully_shard_parallel_size, expert_data_parallel_size;   /* EFSDP, EDP (mx_layout) */
    int data_parallel_size, fully_shard_parallel_size;   /* the layout (mx_layout): replicas x ranks per
                                                            FSDP group = world */
    int accumulation;                /* micro-batches per optimizer step (mx_layout) */
    int64_t step;                    /* steps done: > 0 after resuming */
    const char *resumed_from;        /* the checkpoint directory loaded, or NULL */
    uint64_t master_bytes, grad_bytes, optimizer_bytes;  /* shards (grads: + fp64 sums with reduce_dtype fp64) */
    uint64_t mx_shard_bytes;         /* MX planes of the converted shards */
    uint64_t gathered_bytes;         /* gather, reduce-scatter and unit buffers */
    uint64_t expert_shard_bytes, expert_unit_bytes, expert_grad_bytes;   /* of the above, the fused
                                        experts' (this rank's E / EP with EP): their shards (master,
                                        gradients, optimizer), the most of them one unit buffer holds,
                                        their unsharded gradients in one unit */
    uint64_t activation_bytes;
    uint64_t scaling_state_bytes;    /* a delayed recipe's amax histories and scales (0 for others) */
    uint64_t predicted_bytes;        /* the peak mx_predict_step predicted at start (with this
                                        process as it was then), for comparing with the peak RSS */
    int64_t val_batches;             /* validation batches in one pass over data.val_data_path
                                        (0 without it) */
    const char *notes[16];           /* e.g. what on-demand gathers for recomputed blocks, what
                                        changed since the checkpoint a run resumes */
    int n_notes;
    const char *gather_mode;         /* "bf16", "fp32", "on-demand", "all" */
} mx_run_info;

/* Build everything a run needs from a loaded config: join the MPI job if there is one, the
 * model (weights from training.load's checkpoint, else model.model_name_or_path when it
 * holds safetensors, else initialised from training.seed) sharded over the ranks, the data
 * loader over data.data_path, optimizer state, the metrics file. Errors (one line in diag):
 * the config's data, weights or checkpoint cannot be read, a parallel setting that does not
 * fit the job, memory, MPI. After an error on one rank of several, the caller should end
 * the job with mx_job_abort. */
int mx_trainer_create(const mx_config *config, mx_trainer **out, mx_diag *diag);

mx_run_info mx_trainer_info(const mx_trainer *trainer);

/* This process's rank and the job's size, whether or not a trainer exists (joins MPI
 * when launched by mpirun). */
int mx_job_rank(void);
int mx_job_world(void);
/* End every rank of the job with exit code code (MPI_Abort under MPI). Never returns. */
void mx_job_abort(int code);
/* Leave MPI at the end of a job (after mx_trainer_free), once every rank has come here.
 * MX_ETIMEOUT when one has not within parallel.timeout_s (the caller then ends the job
 * with mx_job_abort). Should MPI_Finalize then not return within min(timeout_s, 30 s),
 * the process ends with exit_code, what it would have exited with (see
 * docs/distributed.md, MPICH). */
int mx_job_finish(int exit_code, mx_diag *diag);

/* How the ranks of a job are laid out (SPEC §6, docs/distributed.md#hsdp):
 * data_parallel_size replicas of the sharded model, each an FSDP group of
 * fully_shard_parallel_size consecutive ranks (rank r is rank r % F of group r / F). */
typedef struct {
    int ranks, data_parallel_size, fully_shard_parallel_size;
    int expert_parallel_size;   /* EP groups of this many consecutive ranks (1: none) */
    int expert_fully_shard_parallel_size, expert_data_parallel_size;   /* with EP > 1: EFSDP x EDP x EP =
                                   ranks; rank r is EP rank r % EP, expert shard rank (r / EP) % EFSDP,
                                   expert replica r / (EP EFSDP) (docs/distributed.md); else 1, 1 */
    int accumulation;           /* micro-batches per optimizer step: training.gradient_accumulation_steps,
                                   or training.global_batch_size / (micro_batch_size x ranks) */
} mx_layout;

/* The config's parallel.data_parallel_size x parallel.fully_shard_parallel_size on a job of
 * `ranks` ranks, `auto` resolved (both auto: one FSDP group of every rank), and the experts'
 * expert_data_parallel_size x expert_fully_shard_parallel_size x expert_parallel_size.
 * MX_ECONFIG, one line naming the keys, their values and the ranks, when a product is not
 * the ranks, a given size does not divide them, EP does not divide the experts, or expert
 * sizes are given without EP > 1. */
int mx_parallel_layout(const mx_config *config, int ranks, mx_layout *layout, mx_diag *diag);

/* The all-gather bytes per optimizer step and rank that the config's converted weights
 * would cost on a layout (they depend on the FSDP group size only; shard padding included;
 * gradient_accumulation_steps micro-batches, each gathering again; with the config's
 * reshard_after_forward and features.recompute, whose blocks on-demand gathers with both
 * planes in backward): gathered in bf16, as MX planes on-demand, and as both planes
 * (`all`). All zero when the plan converts nothing. */
int mx_gather_bytes_expected(const mx_config *config, const mx_layout *layout, uint64_t *bf16, uint64_t *on_demand,
                             uint64_t *all, mx_diag *diag);

/* What one optimizer step of the config on a layout costs each rank, computed from the
 * shard layout without training: the communication counters of mx_step_metrics and the
 * memory of mx_run_info, as the run reports them, exactly; an estimate of the products'
 * workspace (their grow-only operand buffers: 8 bytes per element of the largest tensor,
 * its bf16 or MX copy and its input's); and the process itself as measured when predicting
 * (its code and libraries, and in `train` its MPI: what it holds before the run allocates). */
typedef struct {
    uint64_t ag_param_bytes, ag_mx_data_bytes, ag_mx_scale_bytes, ag_bf16_equiv, rs_bytes, ar_bytes;
    uint64_t master_bytes, grad_bytes, optimizer_bytes, mx_shard_bytes, gathered_bytes;
    uint64_t activation_bytes, workspace_bytes, process_bytes;
    uint64_t scaling_state_bytes;    /* as mx_run_info's */
    const char *gather_mode;         /* as mx_run_info's */
    uint64_t expert_shard_bytes, expert_unit_bytes, expert_grad_bytes;   /* as mx_run_info's */
    /* Expert parallelism (0 without): routing decides these, so the worst case (every routed
     * row of this rank leaves it, and every other rank's come to it) and the expectation
     * under uniform routing ((EP - 1) / EP of the routed rows each way) */
    uint64_t dispatch_worst_bytes, combine_worst_bytes;
    double dispatch_uniform_bytes, combine_uniform_bytes;
    const char *dispatch_wire;       /* the forward dispatch's wire format: "fp32", "bf16", "mxfp8",
                                        "mixed" (layers differ), or NULL without EP */
} mx_step_prediction;
int mx_predict_step(const mx_config *config, const mx_layout *layout, mx_step_prediction *prediction, mx_diag *diag);

/* The memory a rank of the run holds, by the prediction: the sum of its categories. */
uint64_t mx_predicted_bytes(const mx_step_prediction *prediction);

/* One optimizer step (gradient_accumulation_steps micro-batches). Returns 0, or an error
 * (data, a failed matrix product, the metrics file) in diag. With
 * training.check_for_nan_in_loss_and_grad, a non-finite loss or global gradient norm is an
 * error (MX_EINVAL, on every rank the same line, naming the step and the first tensor in model
 * order whose gradient is non-finite) before the optimizer step: the weights and optimizer
 * state stay those of the step before. Metrics write non-finite numbers as null. */
int mx_trainer_step(mx_trainer *trainer, mx_step_metrics *metrics, mx_diag *diag);

/* A validation loss: after `step` optimizer steps, the mean cross-entropy (without the MoE
 * load-balancing loss) over training.eval_iters batches of data.val_data_path on every rank
 * (micro_batch_size x seq_length each, each rank its own rows, as in training), always the
 * same batches: each evaluation starts again at the beginning of the validation shards. */
typedef struct {
    int64_t step;
    double loss;            /* NAN if the forward diverged */
    int64_t tokens;         /* tokens evaluated, all ranks */
    int batches;            /* per rank: training.eval_iters */
    double seconds;
} mx_eval_metrics;

/* Whether a text sample is due after the step just done: every training.sample_interval
 * steps before the last (byte-level models, training.sample_tokens > 0). */
int mx_trainer_should_sample(const mx_trainer *trainer);

/* A text sample of the model with the weights of the step just done (collective: every rank
 * calls it): training.sample_tokens tokens after training.sample_prompt, sampled at
 * temperature 1 among the 40 most probable, in fp32 from the master weights rank 0 gathers,
 * ending at the end-of-text token. Its random stream is its own (training.seed and the
 * step): the run's random numbers, data order and weights are untouched. *text on rank 0:
 * the continuation, *len bytes (a token may decode to a NUL byte; valid until the next
 * call); NULL elsewhere, and NULL everywhere for a model without text (not byte-level) or
 * sample_tokens 0. */
int mx_trainer_sample(mx_trainer *trainer, const char **text, size_t *len, mx_diag *diag);

/* Whether an evaluation is due after the step just done: every training.eval_interval steps
 * and after the last step (train_iters); never without data.val_data_path. */
int mx_trainer_should_evaluate(const mx_trainer *trainer);

/* Evaluate (collective: every rank calls it): the model's forward as in training (MXFP8
 * included, with the weights of the step just done), no backward. Writes a JSONL record
 * {"step", "val_loss", "val_tokens", "val_iters", "val_s"} to training.metrics_path. */
int mx_trainer_evaluate(mx_trainer *trainer, mx_eval_metrics *metrics, mx_diag *diag);

/* Steps done so far, and the model being trained. */
int64_t mx_trainer_steps_done(const mx_trainer *trainer);
mx_model *mx_trainer_model(mx_trainer *trainer);

/* Write a checkpoint of the current step to training.save (collective: every rank calls
 * it). No-op without training.save. The layout (docs/distributed.md):
 *   SAVE/iter_0000100/model.safetensors      consolidated weights, Hugging Face names, fp32
 *   SAVE/iter_0000100/optimizer.safetensors  AdamW moments (exp_avg.NAME, exp_avg_sq.NAME)
 *   SAVE/iter_0000100/optimizer_scales.safetensors  FP8 moments' scales (exp_avg_dtype fp8)
 *   SAVE/iter_0000100/trainer_state.json     step, data position, seed, ranks
 *   SAVE/latest_checkpointed_iteration.txt   the step of the newest complete checkpoint
 * Each directory is written under a temporary name and renamed when complete, and the
 * latest file (written before, renamed right after) replaced atomically: a job killed
 * mid-save leaves the previous checkpoint loadable, and a failed save publishes neither
 * (errors carry the system's reason). Every rank writes its own rows into the files rank 0
 * lays out (training.save_parallel, where the ranks share SAVE), else rank 0 assembles
 * and writes them. *path receives the directory written (may be NULL). */
int mx_trainer_save(mx_trainer *trainer, char *path, size_t path_size, mx_diag *diag);

/* What mx_checkpoint_export wrote. */
typedef struct {
    char source[4096];      /* the checkpoint directory read */
    int files;              /* safetensors files: 1 (model.safetensors) or N shards with an index */
    int tensors;            /* Hugging Face tensors */
    uint64_t bytes;         /* tensor bytes (the index's metadata.total_size) */
    int verified;           /* tensors held to the checkpoint's checksums.json; 0 when it has
                               none (a Hugging Face directory, an older mxtrain's checkpoint) */
} mx_export_info;

/* Write the model of a checkpoint as a standalone Hugging Face model directory out_dir:
 * config.json (torch_dtype "float32" or "bfloat16") and the weights in dtype (MX_DTYPE_FP32
 * or MX_DTYPE_BF16, rounded to nearest even), as model.safetensors, or past max_shard_bytes
 * as model-0000K-of-0000N.safetensors with model.safetensors.index.json (transformers'
 * split: a tensor joins the current file unless that would pass the limit; a larger tensor
 * has a file of its own). checkpoint: an iter_N directory (any directory with config.json
 * and the weights), or a save directory (its latest checkpoint). out_dir must be new or an
 * empty directory; it is written under a temporary name beside it and renamed when
 * complete, so an error leaves no output. The weights stream through: the files are laid
 * out first, then each tensor is read, checked and written at its place, so memory holds
 * one whole model tensor (fp32), not the model. Errors: one line in diag. */
int mx_checkpoint_export(const char *checkpoint, const char *out_dir, mx_dtype dtype, uint64_t max_shard_bytes,
                         mx_export_info *info, mx_diag *diag);

/* Why a run stops before training.train_iters (Megatron-LM's exits). */
typedef enum {
    MX_STOP_NONE = 0,
    MX_STOP_SIGNAL,     /* a rank received a signal (training.exit_signal_handler) */
    MX_STOP_DURATION,   /* training.exit_duration_in_mins passed on a rank */
    MX_STOP_INTERVAL,   /* training.exit_interval divides the step just done */
} mx_stop_reason;
typedef struct {
    mx_stop_reason reason;
    int signal;         /* MX_STOP_SIGNAL: the signal's number (the highest, if ranks differ) */
    double minutes;     /* this rank's minutes since mx_trainer_create */
} mx_stop;

/* Whether the run stops after the step just done, before train_iters (collective: every
 * rank calls it after every step). signal: the number of a signal this rank received, 0 for
 * none; the caller installs the handler (training.exit_signal_handler) and passes what it
 * caught. The ranks agree (one allreduce) when training.exit_signal_handler or
 * training.exit_duration_in_mins is set; a signal outranks the duration, the duration the
 * interval. Never stops at train_iters: the run ends there anyway. */
int mx_trainer_should_stop(mx_trainer *trainer, int signal, mx_stop *stop, mx_diag *diag);

/* Whether training.save_interval asks for a checkpoint after the step just done. */
int mx_trainer_should_save(const mx_trainer *trainer);

void mx_trainer_free(mx_trainer *trainer);

#ifdef __cplusplus
}
#endif

#endif
