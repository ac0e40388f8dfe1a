/* The training loop over the FSDP engine (see include/mxtrain/train.h); the layout a config
 * asks for, and what the engine and model are told, come from planner.c. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>

#include "core/diag.h"
#include "core/host.h"
#include "core/file.h"
#include "core/clock.h"
#include "distributed/comm.h"
#include "distributed/ep.h"
#include "distributed/fsdp.h"
#include "model/delayed.h"
#include "model/quant_stats.h"
#include "model/units.h"
#include "mxtrain/tokens.h"
#include "mxtrain/train.h"
#include "train/checkpoint.h"
#include "train/tokenizer_files.h"
#include "train/ckpt_sums.h"
#include "train/optim.h"
#include "train/outputs.h"
#include "train/planner.h"
#include "train/save_dir.h"
#include "train/resume.h"
#include "train/sample.h"

struct mx_trainer {
    const mx_config *cfg;
    mxi_comm *comm;
    mx_model *model;
    mxi_fsdp *fsdp;
    mxi_ep_link ep;           // expert parallelism: this rank's EP group (ep.group, or NULL)
    mx_loader *loader;
    mx_loader *val;           // data.val_data_path, or NULL
    int32_t *inputs, *targets;// (B, T)
    double *nonfinite;         // (tensors) 1 where a tensor's gradient shard holds a non-finite value
    int64_t steps_done;
    double start_time;
    FILE *metrics;            // rank 0 only
    mx_run_info info;
    char resumed_from[4096];
    char val_note[512];
    char gather_note[512];
    char save_note[640];
    bool save_parallel;   // training.save_parallel, where the ranks share training.save
    mxi_moment moments[2];     // AdamW's exp_avg and exp_avg_sq over the shard, as training.*_dtype store them
    mxi_save_dir save_dir;     // training.save, locked for the run's lifetime (rank 0 holds the lock)
    mxi_resume_notes resume;   // what changed since the checkpoint loaded
    char resume_more[96];
    char *run_record;     // mxi_resume_record's, saved with each checkpoint
    mxi_sampler *sampler; // rank 0's model for text samples, made at the first
};

static uint64_t peak_rss(void) {
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) == 0 ? (uint64_t)ru.ru_maxrss * 1024 : 0;
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

static mxi_comm *job_comm(mx_diag *diag, int *rc) {
    mxi_comm *c = NULL;
    *rc = mxi_comm_init(&c, diag);
    return *rc ? NULL : c;
}

int mx_job_rank(void) {
    int rc;
    mxi_comm *c = job_comm(NULL, &rc);
    return c ? mxi_comm_rank(c) : 0;
}

int mx_job_world(void) {
    int rc;
    mxi_comm *c = job_comm(NULL, &rc);
    return c ? mxi_comm_world(c) : 1;
}

void mx_job_abort(int code) {
    mxi_save_dir_abandon();   // the save directory's lock: this process ends without freeing its trainer
    int rc;
    mxi_comm_abort(job_comm(NULL, &rc), code);
}

int mx_job_finish(int exit_code, mx_diag *diag) {
    int rc;
    mxi_comm *c = job_comm(diag, &rc);
    return c ? mxi_comm_finalize(c, exit_code, diag) : rc;
}

/* One forward and backward pass on the first batch before step 1, with nothing kept: the
 * oneDNN primitives, the grow-only buffers, the collectives and the threads that the steps
 * use are all created here, so that running out of memory is a one-line error at start
 * rather than at step N (or a crash inside oneDNN). The loader goes back to where it was;
 * step 1 zeroes the gradients this leaves. */
static int warm_up(mx_trainer *t, mx_diag *diag) {
    mx_loader_pos pos;
    mx_loader_get_pos(t->loader, &pos);
    int rc = mxi_fsdp_begin_step(t->fsdp, diag);
    if (!rc) rc = mx_loader_next(t->loader, t->inputs, t->targets, diag);
    if (!rc) {
        mx_model_forward(t->model, t->inputs, t->targets);
        mx_model_backward(t->model, 1.0f);
        rc = mx_model_error(t->model, diag);
    }
    if (!rc) rc = mxi_fsdp_end_backward(t->fsdp, diag);
    if (!rc) rc = mx_loader_set_pos(t->loader, &pos, diag);
    return rc;
}

/* A data_path's loader: one stream of shards, or Megatron's blend (weights given), its rows
 * shuffled from seed when shuffle is set (a stream's shards then make one dataset). */
static int open_data(const char *const *paths, const double *weights, int n, bool shuffle, uint64_t seed, int B,
                     int T, int rank, int world, int64_t vocab, mx_loader **out, mx_diag *diag) {
    int rc = weights || shuffle ? mx_loader_open_blend(paths, weights, n, B, T, rank, world, vocab, out, diag)
                                : mx_loader_open(paths, n, B, T, rank, world, vocab, out, diag);
    if (!rc && shuffle && (rc = mx_loader_shuffle(*out, seed, diag))) {
        mx_loader_close(*out);
        *out = NULL;
    }
    return rc;
}

/* Before anything is allocated: the memory a rank will hold by the prediction, against what
 * its host has available, shared by the job's ranks there. Every rank takes the worst of
 * them, so that they refuse together with one line. */
/* The run's predicted peak into *predicted; with training.memory_check, refused when the
 * host cannot hold it. */
static int check_memory(const mx_config *cfg, const mx_layout *layout, mxi_comm *comm, uint64_t *predicted,
                        mx_diag *diag) {
    mx_step_prediction p;
    int rc = mx_predict_step(cfg, layout, &p, diag);
    if (rc) return rc;
    *predicted = mx_predicted_bytes(&p);
    if (!cfg->training.memory_check) return MX_OK;
    const char *source = NULL;
    uint64_t host = mxi_host_available_bytes(&source);
    int local = mxi_host_local_ranks();
    if (host == 0) return MX_OK;   // nothing to compare with (no /proc): the allocations will tell
    double need = (double)mx_predicted_bytes(&p), avail = (double)host / local;
    double worst[3] = {need - avail, need, -avail};
    if ((rc = mxi_comm_allreduce_max(comm, worst, 3, "the memory check", diag))) return rc;
    if (worst[0] <= 0) return MX_OK;
    typedef struct {
        const char *what;
        double bytes;
    } part;
    part parts[] = {
        {"activations", (double)p.activation_bytes}, {"optimizer state", (double)p.optimizer_bytes},
        {"master weights", (double)p.master_bytes}, {"gradients", (double)p.grad_bytes},
        {"gather buffers", (double)p.gathered_bytes}, {"MX shards", (double)p.mx_shard_bytes},
        {"product workspace", (double)p.workspace_bytes}, {"delayed scaling state", (double)p.scaling_state_bytes},
        {"the process itself", (double)p.process_bytes}};
    enum { NPARTS = sizeof parts / sizeof parts[0] };
    for (int i = 1; i < NPARTS; i++)   // largest first
        for (int j = i; j > 0 && parts[j].bytes > parts[j - 1].bytes; j--) {
            part t = parts[j];
            parts[j] = parts[j - 1], parts[j - 1] = t;
        }
    const double gib = 1024.0 * 1024 * 1024;
    return mxi_diag(diag, MX_ENOMEM, "training.memory_check: this run needs about %.2f GiB per rank (%s %.2f, %s %.2f, "
                    "%s %.2f GiB, ...) but %.2f GiB is available per rank (%s, %d rank%s on this host); lower "
                    "training.micro_batch_size (%d) or data.seq_length (%d), set features.recompute: true, add ranks, "
                    "or set training.memory_check: false to start anyway", worst[1] / gib, parts[0].what,
                    parts[0].bytes / gib, parts[1].what, parts[1].bytes / gib, parts[2].what, parts[2].bytes / gib,
                    -worst[2] / gib, source, local, local == 1 ? "" : "s", cfg->training.micro_batch_size,
                    cfg->data.seq_length);
}

int mx_trainer_create(const mx_config *cfg, mx_trainer **out, mx_diag *diag) {
    if (!cfg || !out) return mxi_diag(diag, MX_ENULL, "mx_trainer_create: NULL argument");
    *out = NULL;
    int rc;
    mxi_comm *comm = job_comm(diag, &rc);
    if (!comm) return rc;
    int world = mxi_comm_world(comm), rank = mxi_comm_rank(comm);
    const mx_parallel_config *pc = &cfg->parallel;
    mxi_comm_set_timeout(pc->timeout_s);   // the watchdog of every wait from here on
    mx_layout layout;
    if ((rc = mx_parallel_layout(cfg, world, &layout, diag))) return rc;   // before any work
    if ((rc = mxi_sample_check(cfg, diag))) return rc;
    if ((rc = mxi_tokenizer_source_check(cfg, diag))) return rc;
    uint64_t predicted = 0;
    if ((rc = check_memory(cfg, &layout, comm, &predicted, diag))) return rc;
    mx_trainer *t = calloc(1, sizeof *t);
    if (!t) return mxi_diag(diag, MX_ENOMEM, "out of memory (%zu bytes for the trainer)", sizeof *t);
    t->cfg = cfg, t->comm = comm;
    t->save_dir = (mxi_save_dir){.fd = -1};
    t->start_time = mxi_now_seconds();
    int B = cfg->training.micro_batch_size, T = cfg->data.seq_length;
    mx_model_options opt = mxi_train_model_options(cfg, &layout, B, T);
    rc = mx_model_create(&cfg->model, &opt, &t->model, diag);
    if (rc) goto fail;
    mx_run_info *info = &t->info;
    mxi_fsdp_options fo = mxi_train_fsdp_options(cfg, t->model, &layout);
    int recomputed = 0, blocks = cfg->model.num_hidden_layers;
    for (int u = 1; u <= blocks; u++) recomputed += mxi_model_unit_recomputes(t->model, u);
    const mxi_linear_mx *spec = mxi_model_mx_spec(t->model);
    // what on-demand gathers for recomputed blocks (a per-tensor recipe's one code tensor serves every product)
    if (fo.low_precision && !fo.gather_all && recomputed > 0 && spec->scaling == MXI_SCALE_BLOCKS) {
        if (!pc->reshard_after_forward)
            snprintf(t->gather_note, sizeof t->gather_note, "features.recompute: without reshard_after_forward each "
                     "block is gathered once, with %s, and the %d recomputed block%s run%s forward again from %s",
                     spec->weight_tiles ? "its 32x32-tiled MX plane" : "both MX planes", recomputed,
                     recomputed == 1 ? "" : "s", recomputed == 1 ? "s its" : " their", spec->weight_tiles ? "it" : "them");
        else if (spec->weight_tiles)
            snprintf(t->gather_note, sizeof t->gather_note, "features.recompute: one 32x32-tiled MX plane serves "
                     "every GEMM, so the %d recomputed block%s gather it in backward as in forward", recomputed,
                     recomputed == 1 ? "" : "s");
        else
            snprintf(t->gather_note, sizeof t->gather_note, "features.recompute: on-demand gathers the rowwise MX "
                     "plane in forward; in backward the %d recomputed block%s gather%s both planes (the forward run "
                     "again there reads the rowwise one, dx = dy W the colwise one)%s", recomputed,
                     recomputed == 1 ? "" : "s", recomputed == 1 ? "s" : "",
                     recomputed < blocks ? ", the other blocks the colwise one" : "");
        info->notes[info->n_notes++] = t->gather_note;
    }
    info->gather_mode = mxi_train_gather_mode(cfg, &fo);
    info->data_parallel_size = layout.data_parallel_size;
    info->fully_shard_parallel_size = layout.fully_shard_parallel_size;
    info->accumulation = layout.accumulation;
    rc = mxi_fsdp_create(t->model, comm, &fo, &t->fsdp, diag);
    if (rc) goto fail;
    const mx_state_dtype moment_dtype[2] = {cfg->training.exp_avg_dtype, cfg->training.exp_avg_sq_dtype};
    const int64_t shard = mxi_fsdp_shard_numel(t->fsdp);
    const int spans = mx_model_num_tensors(t->model);   // a span of the shard a tensor
    for (int v = 0; v < 2 && !rc; v++)
        if ((rc = mxi_moment_alloc(&t->moments[v], moment_dtype[v], v == 1, shard, spans)))
            rc = mxi_diag(diag, rc, "out of memory for the optimizer's %s (%llu bytes)", v ? "exp_avg_sq" : "exp_avg",
                          (unsigned long long)mxi_moment_bytes(moment_dtype[v], shard, spans));
    if (rc) goto fail;
    if (layout.expert_parallel_size > 1 &&
        (rc = mxi_ep_link_open(&t->ep, comm, layout.expert_parallel_size, t->model, diag)))
        goto fail;
    info->expert_parallel_size = layout.expert_parallel_size;
    info->expert_fully_shard_parallel_size = layout.expert_fully_shard_parallel_size;
    info->expert_data_parallel_size = layout.expert_data_parallel_size;
    // the save directory: locked (and checked writable) before anything touches it
    if (cfg->training.save && (rc = mxi_save_dir_open(cfg->training.save,
                                                      cfg->training.load ? MXI_SAVE_RESUME : MXI_SAVE_FRESH, comm,
                                                      &t->save_dir, diag)))
        goto fail;
    // before loading: a killed save may have left the checkpoint to load moved aside
    if (cfg->training.save && (rc = mxi_checkpoint_clean(cfg->training.save, comm, diag))) goto fail;
    mxi_train_state st = {0};
    if (cfg->training.load) {
        // the state, the model it belongs to and the files' checksums before any tensor is read
        bool had_sums = true;
        rc = mxi_checkpoint_read_state(cfg->training.load, &st, t->resumed_from, sizeof t->resumed_from, diag);
        if (!rc) rc = mxi_resume_check_model(cfg, t->resumed_from, &t->resume, diag);
        if (!rc) rc = mxi_checkpoint_verify(t->resumed_from, comm, &had_sums, diag);
        if (!rc && !had_sums)
            mxi_resume_note(&t->resume, "training.load: %s has no checksums.json (an older mxtrain's checkpoint): its "
                            "tensors are not verified", t->resumed_from);
        if (!rc) rc = mxi_checkpoint_load_tensors(t->resumed_from, t->model, t->fsdp, t->moments, mxi_comm_rank(comm),
                                                   mxi_comm_world(comm), diag);
        if (rc) goto fail;
        t->steps_done = st.step;
        info->resumed_from = t->resumed_from;
    } else if (cfg->model_name_or_path && has_checkpoint(cfg->model_name_or_path)) {
        rc = mxi_load_sharded_weights(cfg->model_name_or_path, t->model, t->fsdp, diag);
        if (rc) goto fail;
    } else {
        float *scratch = malloc((size_t)mxi_model_largest_tensor(t->model) * sizeof(float));
        if (!scratch) {
            rc = mxi_diag(diag, MX_ENOMEM, "out of memory initialising the weights (%zu bytes for the largest tensor)",
                          (size_t)mxi_model_largest_tensor(t->model) * sizeof(float));
            goto fail;
        }
        mxi_init_sharded_weights(t->model, t->fsdp, cfg->training.seed, scratch);
        free(scratch);
    }
    rc = open_data((const char *const *)cfg->data.data_path, cfg->data.data_weights, cfg->data.n_data_path,
                   cfg->data.shuffle, cfg->training.seed, B, T, rank, world, cfg->model.vocab_size, &t->loader, diag);
    if (rc) goto fail;
    if (cfg->training.load) {
        // the position before the files: its message says what a blend's or a stream's cannot be
        rc = mxi_resume_check_order(cfg, t->resumed_from, &st, diag);
        if (!rc) rc = mx_loader_set_pos(t->loader, &st.data, diag);
        if (!rc) rc = mxi_resume_check_run(cfg, t->resumed_from, &st, t->loader, world, &t->resume, diag);
        if (rc) goto fail;
        for (int i = 0; i < t->resume.n; i++) info->notes[info->n_notes++] = t->resume.lines[i];
        if (t->resume.more) {
            snprintf(t->resume_more, sizeof t->resume_more, "and %d more setting%s changed since the checkpoint",
                     t->resume.more, t->resume.more == 1 ? "" : "s");
            info->notes[info->n_notes++] = t->resume_more;
        }
    }
    if (cfg->training.save && (rc = mxi_resume_record(cfg, t->loader, &t->run_record, diag))) goto fail;
    if (cfg->data.n_val_data_path > 0) {
        // every rank reads its own rows of each validation batch, as in training
        rc = open_data((const char *const *)cfg->data.val_data_path, cfg->data.val_data_weights,
                       cfg->data.n_val_data_path, false, 0, B, T, rank, world, cfg->model.vocab_size, &t->val, diag);
        if (rc) {
            char why[sizeof diag->msg], where[4200];
            snprintf(why, sizeof why, "%s", diag->msg);
            if (mx_config_format_origin(cfg, "data.val_data_path", where, sizeof where) < 0)
                snprintf(where, sizeof where, "%s", cfg->source);
            rc = mxi_diag(diag, rc, "%s: data.val_data_path: %s", where, why);
            goto fail;
        }
        int64_t have = mx_loader_steps_per_epoch(t->val);
        info->val_batches = have;
        if (have < cfg->training.eval_iters) {
            snprintf(t->val_note, sizeof t->val_note, "data.val_data_path holds %lld batch%s of %d x %d x %d tokens; "
                     "training.eval_iters %d evaluates some of them more than once", (long long)have,
                     have == 1 ? "" : "es", world, B, T, cfg->training.eval_iters);
            info->notes[info->n_notes++] = t->val_note;
        }
    }
    if (cfg->training.save && cfg->training.save_parallel) {
        if ((rc = mxi_checkpoint_shared(cfg->training.save, comm, &t->save_parallel, diag))) goto fail;
        if (!t->save_parallel) {
            snprintf(t->save_note, sizeof t->save_note, "training.save_parallel: not every rank sees the files rank 0 "
                     "writes in '%s' (not one shared directory), so rank 0 gathers and writes each checkpoint alone",
                     cfg->training.save);
            info->notes[info->n_notes++] = t->save_note;
        }
    }
    t->inputs = malloc((size_t)B * T * sizeof(int32_t));
    t->targets = malloc((size_t)B * T * sizeof(int32_t));
    if (!t->inputs || !t->targets) {
        rc = mxi_diag(diag, MX_ENOMEM, "out of memory for the batch (2 x %zu bytes)", (size_t)B * T * sizeof(int32_t));
        goto fail;
    }
    // allocated now: a step that diverged looks for its non-finite gradients without allocating
    if (!(t->nonfinite = calloc((size_t)mx_model_num_tensors(t->model), sizeof *t->nonfinite))) {
        rc = mxi_diag(diag, MX_ENOMEM, "out of memory for the divergence check (%zu bytes)",
                      (size_t)mx_model_num_tensors(t->model) * sizeof *t->nonfinite);
        goto fail;
    }
    const mx_loader *loaders[2] = {t->loader, t->val};
    if (rank == 0 && (rc = mxi_run_outputs_open(cfg, loaders, 2, &t->metrics, diag))) goto fail;
    if (t->steps_done < cfg->training.train_iters && (rc = warm_up(t, diag))) goto fail;
    mxi_fsdp_memory mem = mxi_fsdp_memory_of(t->fsdp);
    info->rank = rank, info->world = world, info->step = t->steps_done;
    info->master_bytes = mem.master, info->grad_bytes = mem.grads, info->optimizer_bytes = mem.optimizer;
    info->mx_shard_bytes = mem.mx_shards, info->gathered_bytes = mem.gathered;
    info->expert_shard_bytes = mem.expert_shards, info->expert_unit_bytes = mem.expert_unit;
    info->expert_grad_bytes = mem.expert_grad;
    info->activation_bytes = mx_model_activation_bytes(t->model, NULL);
    info->scaling_state_bytes = mxi_delayed_bytes(mxi_model_delayed(t->model));
    info->predicted_bytes = predicted;
    *out = t;
    return MX_OK;
fail:
    mx_trainer_free(t);
    return rc;
}

mx_run_info mx_trainer_info(const mx_trainer *t) { return t->info; }

void mx_trainer_free(mx_trainer *t) {
    if (!t) return;
    mxi_ep_link_close(&t->ep);
    mxi_fsdp_free(t->fsdp);
    mxi_moment_free(&t->moments[0]), mxi_moment_free(&t->moments[1]);
    mx_model_free(t->model);
    mx_loader_close(t->loader);
    mx_loader_close(t->val);
    if (t->metrics) fclose(t->metrics);
    free(t->inputs), free(t->targets), free(t->nonfinite);
    free(t->run_record);
    mxi_sampler_free(t->sampler);
    mxi_save_dir_close(&t->save_dir);   // the lock goes last: the run is over
    free(t);
}

int64_t mx_trainer_steps_done(const mx_trainer *t) { return t->steps_done; }
mx_model *mx_trainer_model(mx_trainer *t) { return t->model; }

int mx_trainer_should_save(const mx_trainer *t) {
    int every = t->cfg->training.save_interval;
    return t->cfg->training.save && every > 0 && t->steps_done % every == 0;
}

int mx_trainer_should_stop(mx_trainer *t, int signal, mx_stop *stop, mx_diag *diag) {
    const mx_training_config *tc = &t->cfg->training;
    *stop = (mx_stop){.reason = MX_STOP_NONE, .minutes = (mxi_now_seconds() - t->start_time) / 60};
    double any[2] = {tc->exit_signal_handler ? signal : 0,
                     tc->exit_duration_in_mins > 0 && stop->minutes > tc->exit_duration_in_mins};
    if (tc->exit_signal_handler || tc->exit_duration_in_mins > 0) {
        int rc = mxi_comm_allreduce_max(t->comm, any, 2, "training.exit_*: whether a rank stops the run", diag);
        if (rc) return rc;
    }
    if (t->steps_done >= tc->train_iters) return MX_OK;
    if (any[0] > 0) stop->reason = MX_STOP_SIGNAL, stop->signal = (int)any[0];
    else if (any[1] > 0) stop->reason = MX_STOP_DURATION;
    else if (tc->exit_interval > 0 && t->steps_done % tc->exit_interval == 0) stop->reason = MX_STOP_INTERVAL;
    return MX_OK;
}

int mx_trainer_should_sample(const mx_trainer *t) {
    int every = t->cfg->training.sample_interval;
    return every > 0 && t->steps_done > 0 && t->steps_done % every == 0 && t->steps_done < t->cfg->training.train_iters &&
           mxi_sample_enabled(t->cfg);
}

int mx_trainer_sample(mx_trainer *t, const char **text, size_t *len, mx_diag *diag) {
    return mxi_sample(&t->sampler, t->cfg, t->model, t->fsdp, t->comm, t->steps_done, text, len, diag);
}

int mx_trainer_should_evaluate(const mx_trainer *t) {
    int every = t->cfg->training.eval_interval;
    return t->val && t->steps_done > 0 &&
           ((every > 0 && t->steps_done % every == 0) || t->steps_done == t->cfg->training.train_iters);
}

/* A number of a metrics record: JSON has no NaN or infinity, so those are null (the
 * progress line still prints them). fmt formats one double. */
static const char *json_num(char *buf, size_t size, const char *fmt, double x) {
    if (!isfinite(x)) return "null";
    snprintf(buf, size, fmt, x);
    return buf;
}

/* A metrics line is written whole or the run stops: a full disk must not pass unnoticed. */
static int flush_metrics(mx_trainer *t, mx_diag *diag) {
    if (fflush(t->metrics) == 0 && !ferror(t->metrics)) return 0;
    return mxi_diag(diag, MX_EIO, "training.metrics_path: writing '%s' failed (%s)", t->cfg->training.metrics_path,
                    strerror(errno));
}

int mx_trainer_evaluate(mx_trainer *t, mx_eval_metrics *out, mx_diag *diag) {
    if (!t->val) return mxi_diag(diag, MX_EINVAL, "mx_trainer_evaluate: the config has no data.val_data_path");
    const mx_training_config *tc = &t->cfg->training;
    double t0 = mxi_now_seconds();
    // the MX planes of converted weights were quantized before this step's update: quantize
    // the updated shards again, as the next step would (gradients and counters are spent)
    int rc = mxi_fsdp_begin_step(t->fsdp, diag);
    if (rc) return rc;
    // the same batches at every evaluation: from the start of the validation shards
    mx_loader_rewind(t->val);
    double sum = 0;
    for (int i = 0; i < tc->eval_iters; i++) {
        if ((rc = mx_loader_next(t->val, t->inputs, t->targets, diag))) return rc;
        mx_model_forward(t->model, t->inputs, t->targets);   // forward only: no backward, no gradients
        if ((rc = mx_model_error(t->model, diag))) return rc;
        sum += mx_model_last_ce_loss(t->model);
    }
    int world = mxi_comm_world(t->comm);
    if ((rc = mxi_comm_allreduce_sum(t->comm, &sum, 1, "the validation loss", diag))) return rc;
    mx_eval_metrics ev = {
        .step = t->steps_done,
        .loss = sum / ((double)tc->eval_iters * world),
        .tokens = (int64_t)tc->eval_iters * world * tc->micro_batch_size * t->cfg->data.seq_length,
        .batches = tc->eval_iters,
        .seconds = mxi_now_seconds() - t0,
    };
    if (t->metrics) {
        char f[2][40];
        fprintf(t->metrics, "{\"step\": %lld, \"val_loss\": %s, \"val_tokens\": %lld, \"val_iters\": %d, "
                "\"val_s\": %s}\n", (long long)ev.step, json_num(f[0], sizeof f[0], "%.17g", ev.loss), (long long)ev.tokens,
                ev.batches, json_num(f[1], sizeof f[1], "%.4f", ev.seconds));
        if ((rc = flush_metrics(t, diag)) != 0) return rc;
    }
    if (out) *out = ev;
    return MX_OK;
}

/* "nan", "inf" or "-inf" (printf may say "-nan"), else the number. */
static const char *nonfinite_text(char *buf, size_t size, double x) {
    if (isnan(x)) return "nan";
    if (isinf(x)) return x > 0 ? "inf" : "-inf";
    snprintf(buf, size, "%.4f", x);
    return buf;
}

/* Where the step's gradients stopped being finite: how many tensors hold a non-finite value in
 * their gradient shard on some rank, and the last of them in model order, -1 if none.
 * Backward runs from the loss down the model, so that last one is where it first appeared:
 * everything backward reaches after it takes the NaN in. Collective: every rank gets the same. */
static int nonfinite_grads(mx_trainer *t, int *count, int *origin, mx_diag *diag) {
    int nt = mx_model_num_tensors(t->model);
    double *bad = t->nonfinite;
    const float *g = mxi_fsdp_grads(t->fsdp);
    const uint16_t *g16 = mxi_fsdp_grads_bf16(t->fsdp);
    for (int i = 0; i < nt; i++) {
        bad[i] = 0;
        mxi_shard_span s = mxi_fsdp_span(t->fsdp, i);
        for (int64_t k = 0; k < s.numel && !bad[i]; k++)
            bad[i] = g ? !isfinite(g[s.offset + k]) : (g16[s.offset + k] & 0x7f80) == 0x7f80;   // bf16: exponent all ones
    }
    int rc = mxi_comm_allreduce_max(t->comm, bad, nt, "the tensors with non-finite gradients", diag);
    *count = 0, *origin = -1;
    for (int i = 0; !rc && i < nt; i++)
        if (bad[i]) ++*count, *origin = i;
    return rc;
}

/* The step's loss or global gradient norm is not finite: the one line that stops the run,
 * naming the step, what was not finite and where the gradients first were. Every rank
 * returns the same line (loss, norm and the tensors are agreed on). */
static int diverged(mx_trainer *t, int64_t step, double loss, double norm, mx_diag *diag) {
    int count = 0, origin = -1, rc;
    if (!isfinite(norm) && (rc = nonfinite_grads(t, &count, &origin, diag))) return rc;
    char lb[32], nb[32], what[512];
    const char *ls = nonfinite_text(lb, sizeof lb, loss), *ns = nonfinite_text(nb, sizeof nb, norm);
    if (isfinite(norm))
        snprintf(what, sizeof what, "the loss is %s (the gradient norm %s)", ls, ns);
    else
        snprintf(what, sizeof what, "%s%s%sthe gradient norm is %s", isfinite(loss) ? "" : "the loss is ",
                 isfinite(loss) ? "" : ls, isfinite(loss) ? "" : " and ", ns);
    size_t n = strlen(what);
    if (origin >= 0)
        snprintf(what + n, sizeof what - n, ": non-finite gradients in %d of %d tensors, first in backward: %s",
                 count, mx_model_num_tensors(t->model), mx_model_tensor(t->model, origin).name);
    n = strlen(what);
    if (isfinite(loss) && !isfinite(norm)) snprintf(what + n, sizeof what - n, " (loss %s)", ls);
    return mxi_diag(diag, MX_EINVAL, "step %lld: %s; diverged: the step is not applied and not saved (lower "
                    "training.lr%s)", (long long)step, what, t->cfg->training.clip_grad > 0 ? "" :
                    " or set training.clip_grad");
}

/* Delayed scaling's all-reduce: the amaxes' MAX over every rank (data and expert parallel). */
static int amax_max(void *ctx, double *x, int n, mx_diag *diag) {
    return mxi_comm_allreduce_max(ctx, x, n, "the delayed scaling amaxes", diag);
}

/* The micro-batches of a step: forward, backward, and with a delayed recipe the scales'
 * updates after each (TE's DelayedScaling; warm-up and evaluation record nothing). */
static int run_micro_batches(mx_trainer *t, double sums[5], mx_diag *diag) {
    mx_model *m = t->model;
    int accum = t->info.accumulation, rc = MX_OK;
    mxi_delayed *dl = mxi_model_delayed(m);
    mxi_delayed_set_training(dl, true);
    mxi_quant_stats *qs = mxi_model_quant_stats(m);
    int every = t->cfg->training.quant_stats_interval;
    bool stats = every > 0 && (t->steps_done + 1) % every == 0;
    for (int micro = 0; micro < accum && !rc; micro++) {
        if (micro > 0 && (rc = mxi_fsdp_begin_micro(t->fsdp, diag))) break;
        if (stats && micro == 0) mxi_quant_stats_begin(qs);   // the step's first micro-batch only
        if (stats && micro == 0) mxi_fsdp_weight_stats(t->fsdp, qs);   // the shards its gathers carry
        if (stats && micro == 1) mxi_quant_stats_end(qs);
        if ((rc = mx_loader_next(t->loader, t->inputs, t->targets, diag))) break;
        double l = mx_model_forward(m, t->inputs, t->targets);
        if (dl && !(rc = mx_model_error(m, diag))) rc = mxi_delayed_update(dl, MXI_DELAYED_FORWARD, amax_max, t->comm, diag);
        if (!rc) mx_model_backward(m, 1.0f);   // sums over micro-batches and ranks, divided once below
        if (!rc) rc = mx_model_error(m, diag);
        if (!rc) rc = mxi_delayed_update(dl, MXI_DELAYED_BACKWARD, amax_max, t->comm, diag);
        if (!rc) rc = mxi_fsdp_end_backward(t->fsdp, diag);
        if (rc) break;
        sums[0] += l / accum, sums[1] += mx_model_last_ce_loss(m) / accum, sums[2] += mx_model_last_aux_loss(m) / accum;
        sums[4] += mx_model_last_z_loss(m) / accum;
    }
    if (stats) mxi_quant_stats_end(qs);
    mxi_delayed_set_training(dl, false);
    return rc;
}

static int stats_sum(void *comm, double *x, int n, mx_diag *diag) {
    return mxi_comm_allreduce_sum(comm, x, n, "the quantization statistics", diag);
}

static int stats_max(void *comm, double *x, int n, mx_diag *diag) {
    return mxi_comm_allreduce_max(comm, x, n, "the quantization statistics' scales", diag);
}

/* training.quant_stats_interval: the step's statistics summed over the ranks, and on rank 0
 * one record per converted tensor and role its products quantized (docs/training.md). */
static int write_quant_stats(mx_trainer *t, int64_t step, mx_diag *diag) {
    mx_model *m = t->model;
    mxi_quant_stats *qs = mxi_model_quant_stats(m);
    int rc = mxi_quant_stats_reduce(qs, stats_sum, stats_max, t->comm, diag);
    if (rc || !t->metrics) return rc;
    for (int i = 0; i < mx_model_num_tensors(m); i++)
        for (int r = 0; r < MXI_QS_ROLES; r++) {
            const mxi_qs_acc *a = mxi_quant_stats_get(qs, i, (mxi_qs_role)r);
            if (a->numel == 0) continue;
            mx_tensor_view v = mx_model_tensor(m, i);
            char f[6][40];
            fprintf(t->metrics, "{\"step\": %lld, \"quant_stats\": \"%s\", \"tensor\": \"%s\", \"role\": \"%s\", "
                    "\"numel\": %.0f, \"nonfinite\": %.0f, \"underflows\": %.0f, \"overflows\": %.0f, "
                    "\"underflows_pct\": %s, \"overflows_pct\": %s, \"scale_inv_min\": %s, \"scale_inv_max\": %s, "
                    "\"mse\": %s, \"sqnr_db\": %s}\n",
                    (long long)step, v.module, v.name, mxi_qs_role_name((mxi_qs_role)r), a->numel, a->nonfinite,
                    a->underflows, a->overflows, json_num(f[0], sizeof f[0], "%.6g", mxi_qs_underflows_pct(a)),
                    json_num(f[1], sizeof f[1], "%.6g", mxi_qs_overflows_pct(a)),
                    json_num(f[2], sizeof f[2], "%.9g", a->scale_min), json_num(f[3], sizeof f[3], "%.9g", a->scale_max),
                    json_num(f[4], sizeof f[4], "%.9g", mxi_qs_mse(a)), json_num(f[5], sizeof f[5], "%.6f", mxi_qs_sqnr_db(a)));
        }
    return flush_metrics(t, diag);
}

int mx_trainer_step(mx_trainer *t, mx_step_metrics *out, mx_diag *diag) {
    const mx_training_config *tc = &t->cfg->training;
    mx_model *m = t->model;
    int accum = t->info.accumulation, world = mxi_comm_world(t->comm);
    double t0 = mxi_now_seconds();
    double sums[5] = {0, 0, 0, 0, 0};   // loss, cross-entropy, aux over this rank's micro-batches; grad norm^2; z-loss
    mxi_comm_take_seconds(t->comm);
    mxi_model_ep_bytes ep;
    mxi_model_take_ep_bytes(m, &ep);   // this step's only (not warm-up's or evaluation's)
    mxi_delayed_set_training(mxi_model_delayed(m), true);   // the step's weight casts record their amaxes
    int rc = mxi_fsdp_begin_step(t->fsdp, diag);
    if (!rc) rc = run_micro_batches(t, sums, diag);
    if (rc) return rc;
    mxi_fsdp_finish_grads(t->fsdp, (double)accum * world);
    int64_t n = mxi_fsdp_shard_numel(t->fsdp);
    float *w = mxi_fsdp_master(t->fsdp), *g = mxi_fsdp_grads(t->fsdp);
    const uint16_t *g16 = mxi_fsdp_grads_bf16(t->fsdp);   // instead of g with main_grads_dtype bf16
    // padding rows are zero; the replicas hold the same shards: one of them counts
    mxi_shard_span span;
    for (int k = 0; mxi_fsdp_norm_span(t->fsdp, k, &span); k++)
        sums[3] += g ? mxi_sum_squares(g + span.offset, span.numel) : mxi_sum_squares_bf16(g16 + span.offset, span.numel);
    rc = mxi_comm_allreduce_sum(t->comm, sums, 5, "the step's losses and gradient norm", diag);
    if (rc) return rc;
    double loss = sums[0] / world, ce = sums[1] / world, aux = sums[2] / world, norm = sqrt(sums[3]);
    double z = sums[4] / world;
    int64_t step = t->steps_done + 1;
    // before clipping and AdamW: a non-finite step is never applied, so the weights (and any
    // checkpoint of them) stay those of the last good step (Megatron's check_for_nan_in_loss_and_grad)
    if (tc->check_for_nan_in_loss_and_grad && !(isfinite(loss) && isfinite(norm)))
        return diverged(t, step, loss, norm, diag);
    float gscale = tc->clip_grad > 0 && norm > tc->clip_grad ? (float)(tc->clip_grad / (norm + 1e-6)) : 1.0f;
    if (g && gscale != 1.0f) mxi_scale_inplace(g, n, gscale);   // bf16 gradients: scaled as AdamW reads them
    lr_schedule sched = mxi_lr_schedule_of(tc);
    float lr = mxi_lr_at(&sched, step);
    adamw_step st = {.lr = lr, .beta1 = (float)tc->adam_beta1, .beta2 = (float)tc->adam_beta2,
                     .eps = (float)tc->adam_eps, .weight_decay = (float)tc->weight_decay, .step = step};
    // weight decay on matrices only: norms and biases (1-D tensors) are not decayed, as in Megatron
    for (int i = 0; i < mx_model_num_tensors(m); i++) {
        mxi_shard_span s = mxi_fsdp_span(t->fsdp, i);
        if (g)
            mxi_adamw_update_moments(w + s.offset, &t->moments[0], &t->moments[1], g + s.offset, i, s.offset, s.numel, &st,
                                     s.decay);
        else
            mxi_adamw_update_bf16_grads(w + s.offset, &t->moments[0], &t->moments[1], g16 + s.offset, gscale, i, s.offset,
                                        s.numel, &st, s.decay);
    }
    t->steps_done = step;
    double dt = mxi_now_seconds() - t0;
    int64_t tokens = (int64_t)accum * world * tc->micro_batch_size * t->cfg->data.seq_length;
    mxi_fsdp_counters c = mxi_fsdp_counters_of(t->fsdp);
    mxi_model_take_ep_bytes(m, &ep);
    mx_step_metrics mt = {
        .step = step,
        .total_steps = tc->train_iters,
        .loss = loss,
        .ce_loss = ce,
        .aux_loss = aux,
        .z_loss = z,
        .lr = lr,
        .grad_norm = norm,
        .tokens = tokens,
        .step_seconds = dt,
        .tokens_per_s = tokens / dt,
        .elapsed_seconds = mxi_now_seconds() - t->start_time,
        .ag_param_bytes = c.ag_param_bytes,
        .ag_mx_data_bytes = c.ag_mx_data_bytes,
        .ag_mx_scale_bytes = c.ag_mx_scale_bytes,
        .ag_bf16_equiv = c.ag_bf16_equiv,
        .rs_bytes = c.rs_bytes,
        .ar_bytes = c.ar_bytes,
        .comm_seconds = mxi_comm_take_seconds(t->comm),
        .peak_rss_bytes = peak_rss(),
        .dispatch_bytes = ep.dispatch_fp32 + ep.dispatch_bf16 + ep.dispatch_mx_data + ep.dispatch_mx_scale,
        .combine_bytes = ep.combine_fp32,
        .dispatch_fp32_bytes = ep.dispatch_fp32,
        .dispatch_bf16_bytes = ep.dispatch_bf16,
        .dispatch_mx_data_bytes = ep.dispatch_mx_data,
        .dispatch_mx_scale_bytes = ep.dispatch_mx_scale,
        .dispatch_rows = ep.dispatch_rows,
        .combine_rows = ep.combine_rows,
    };
    if (t->metrics) {
        char f[9][40];
        fprintf(t->metrics,
                "{\"step\": %lld, \"loss\": %s, \"ce_loss\": %s, \"aux_loss\": %s, \"z_loss\": %s, \"lr\": %s, "
                "\"grad_norm\": %s, \"tokens\": %lld, \"step_s\": %s, \"tokens_per_s\": %s, "
                "\"ag_bytes\": %llu, \"ag_param_bytes\": %llu, \"ag_mx_data_bytes\": %llu, \"ag_mx_scale_bytes\": %llu, "
                "\"ag_bf16_equiv_bytes\": %llu, \"rs_bytes\": %llu, \"ar_bytes\": %llu, \"comm_s\": %s, "
                "\"peak_mem_bytes\": %llu, \"dispatch_bytes\": %llu, \"combine_bytes\": %llu, "
                "\"dispatch_fp32_bytes\": %llu, \"dispatch_bf16_bytes\": %llu, \"dispatch_mx_data_bytes\": %llu, "
                "\"dispatch_mx_scale_bytes\": %llu, \"dispatch_rows\": %llu, \"combine_rows\": %llu, "
                "\"mem_master_bytes\": %llu, \"mem_grad_bytes\": %llu, \"mem_optimizer_bytes\": %llu, "
                "\"mem_mx_shard_bytes\": %llu, \"mem_gathered_bytes\": %llu, \"mem_activation_bytes\": %llu, "
                "\"mem_expert_shard_bytes\": %llu, \"mem_expert_unit_bytes\": %llu, \"mem_expert_grad_bytes\": %llu, "
                "\"mem_scaling_state_bytes\": %llu, \"mem_predicted_bytes\": %llu}\n",
                (long long)step, json_num(f[0], sizeof f[0], "%.17g", loss), json_num(f[1], sizeof f[1], "%.17g", ce),
                json_num(f[2], sizeof f[2], "%.17g", aux), json_num(f[3], sizeof f[3], "%.17g", z), json_num(f[4], sizeof f[4], "%.6e", lr),
                json_num(f[5], sizeof f[5], "%.17g", norm), (long long)tokens, json_num(f[6], sizeof f[6], "%.4f", dt),
                json_num(f[7], sizeof f[7], "%.1f", tokens / dt),
                (unsigned long long)(mt.ag_param_bytes + mt.ag_mx_data_bytes + mt.ag_mx_scale_bytes),
                (unsigned long long)mt.ag_param_bytes, (unsigned long long)mt.ag_mx_data_bytes,
                (unsigned long long)mt.ag_mx_scale_bytes, (unsigned long long)mt.ag_bf16_equiv,
                (unsigned long long)mt.rs_bytes, (unsigned long long)mt.ar_bytes, json_num(f[8], sizeof f[8], "%.4f", mt.comm_seconds),
                (unsigned long long)mt.peak_rss_bytes,
                (unsigned long long)mt.dispatch_bytes, (unsigned long long)mt.combine_bytes,
                (unsigned long long)mt.dispatch_fp32_bytes, (unsigned long long)mt.dispatch_bf16_bytes,
                (unsigned long long)mt.dispatch_mx_data_bytes, (unsigned long long)mt.dispatch_mx_scale_bytes,
                (unsigned long long)mt.dispatch_rows, (unsigned long long)mt.combine_rows,
                (unsigned long long)t->info.master_bytes, (unsigned long long)t->info.grad_bytes,
                (unsigned long long)t->info.optimizer_bytes, (unsigned long long)t->info.mx_shard_bytes,
                (unsigned long long)t->info.gathered_bytes, (unsigned long long)t->info.activation_bytes,
                (unsigned long long)t->info.expert_shard_bytes, (unsigned long long)t->info.expert_unit_bytes,
                (unsigned long long)t->info.expert_grad_bytes, (unsigned long long)t->info.scaling_state_bytes,
                (unsigned long long)t->info.predicted_bytes);
        if ((rc = flush_metrics(t, diag)) != 0) return rc;
    }
    int every = tc->quant_stats_interval;
    if (every > 0 && step % every == 0 && (rc = write_quant_stats(t, step, diag)) != 0) return rc;
    if (out) *out = mt;
    return MX_OK;
}

int mx_trainer_save(mx_trainer *t, char *path, size_t path_size, mx_diag *diag) {
    const char *dir = t->cfg->training.save;
    if (!dir) return MX_OK;
    bool experts = t->info.expert_parallel_size > 1;   // without EP the experts follow the dense layout
    mxi_train_state st = {
        .step = t->steps_done,
        .seed = t->cfg->training.seed,
        .world = mxi_comm_world(t->comm),
        .data_parallel_size = mxi_fsdp_replicas(t->fsdp),
        .expert_parallel_size = experts ? t->info.expert_parallel_size : 0,
        .expert_fully_shard_parallel_size = experts ? t->info.expert_fully_shard_parallel_size : 0,
        .expert_data_parallel_size = experts ? t->info.expert_data_parallel_size : 0,
        .run = t->run_record,
    };
    mx_loader_get_pos(t->loader, &st.data);
    st.tokenizer = mxi_tokenizer_source(t->cfg, &st.tokenizer_key);
    return mxi_checkpoint_save(dir, t->save_dir.run_id, &t->cfg->model, t->model, t->fsdp, t->moments, t->comm, &st,
                               t->save_parallel,
                               t->cfg->training.keep_latest_k, path, path_size, diag);
}

