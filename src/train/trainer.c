/* The training loop over the FSDP engine (see include/mxtrain/train.h). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>

#include "core/diag.h"
#include "core/file.h"
#include "core/clock.h"
#include "distributed/comm.h"
#include "distributed/ep.h"
#include "distributed/fsdp.h"
#include "model/units.h"
#include "mxtrain/tokens.h"
#include "mxtrain/train.h"
#include "train/checkpoint.h"
#include "train/optim.h"

struct mx_trainer {
    const mx_config *cfg;
    mxi_comm *comm;
    mx_model *model;
    mxi_fsdp *fsdp;
    mxi_ep_link ep;           // expert parallelism: this rank's EP group (ep.group, or NULL)
    mx_loader *loader;
    mx_loader *val;           // data.val_data_path, or NULL
    int32_t *inputs, *targets;// (B, T)
    int64_t steps_done;
    double start_time;
    FILE *metrics;            // rank 0 only
    mx_run_info info;
    char resumed_from[4096];
    char val_note[512];
    char gather_note[512];
    char save_note[640];
    bool save_parallel;   // training.save_parallel, where the ranks share training.save
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

static int dense_layout(const mx_config *cfg, int ranks, int D, int F, mx_layout *out, mx_diag *diag);

/* Micro-batches per optimizer step on `ranks` ranks: gradient_accumulation_steps, or
 * Megatron's training.global_batch_size / (micro_batch_size x ranks), which must divide it
 * (and agree with gradient_accumulation_steps where both are given). */
static int accumulation_of(const mx_config *cfg, int ranks, int *out, mx_diag *diag) {
    const mx_training_config *tc = &cfg->training;
    *out = tc->gradient_accumulation_steps;
    if (!tc->global_batch_size) return MX_OK;
    mx_origin gbs, accum;
    mx_config_origin(cfg, "training.global_batch_size", &gbs);
    mx_config_origin(cfg, "training.gradient_accumulation_steps", &accum);
    char at[32] = "";
    if (gbs.line) snprintf(at, sizeof at, ":%d", gbs.line);
    long long per = (long long)tc->micro_batch_size * ranks;
    if (tc->global_batch_size % per)
        return mxi_diag(diag, MX_ECONFIG, "%s%s: training.global_batch_size: %d is not a multiple of micro_batch_size "
                        "%d x %d rank%s = %lld (allowed: a multiple of %lld)", cfg->source, at, tc->global_batch_size,
                        tc->micro_batch_size, ranks, ranks == 1 ? "" : "s", per, per);
    int steps = (int)(tc->global_batch_size / per);
    if (accum.kind != MX_ORIGIN_DEFAULT && steps != tc->gradient_accumulation_steps)
        return mxi_diag(diag, MX_ECONFIG, "%s%s: training.global_batch_size: %d is micro_batch_size %d x %d rank%s x %d "
                        "accumulation step%s, but gradient_accumulation_steps is %d (allowed: one of the two, or "
                        "values that agree)", cfg->source, at, tc->global_batch_size, tc->micro_batch_size, ranks,
                        ranks == 1 ? "" : "s", steps, steps == 1 ? "" : "s", tc->gradient_accumulation_steps);
    *out = steps;
    return MX_OK;
}

int mx_parallel_layout(const mx_config *cfg, int ranks, mx_layout *out, mx_diag *diag) {
    if (!cfg || !out) return mxi_diag(diag, MX_ENULL, "mx_parallel_layout: NULL argument");
    if (ranks < 1) return mxi_diag(diag, MX_EINVAL, "ranks: %d is not allowed (allowed: >= 1)", ranks);
    int D = cfg->parallel.data_parallel_size, F = cfg->parallel.fully_shard_parallel_size;
    *out = (mx_layout){ranks, 1, ranks, 1, 1, 1, 1};
    int arc = accumulation_of(cfg, ranks, &out->accumulation, diag);
    if (arc) return arc;
    int ep = cfg->parallel.expert_parallel_size > 1 ? cfg->parallel.expert_parallel_size : 1;
    int EF = cfg->parallel.expert_fully_shard_parallel_size, ED = cfg->parallel.expert_data_parallel_size;
    const mx_model_config *mc = &cfg->model;
    if (ep == 1 && (EF || ED))   // they lay out the experts of EP ranks: nothing to lay out without
        return mxi_diag(diag, MX_ECONFIG, "%s: parallel.%s: %d needs parallel.expert_parallel_size > 1 (it is 1%s; "
                        "allowed: auto, or leave it out)", cfg->source,
                        EF ? "expert_fully_shard_parallel_size" : "expert_data_parallel_size", EF ? EF : ED,
                        mc->type != MX_MODEL_QWEN3_MOE || mc->num_experts < 1 ? ", and the model has no experts" : "");
    if (ep > 1 && (mc->type != MX_MODEL_QWEN3_MOE || mc->num_experts < 1))
        return mxi_diag(diag, MX_ECONFIG, "%s: parallel.expert_parallel_size: %d needs an MoE model (model.model_type "
                        "is not qwen3_moe or it has no experts; allowed: 1)", cfg->source, ep);
    if (ep > 1 && mc->num_experts % ep)
        return mxi_diag(diag, MX_ECONFIG, "%s: parallel.expert_parallel_size: %d does not divide model.num_experts: %d "
                        "(allowed: a divisor of %d)", cfg->source, ep, mc->num_experts, mc->num_experts);
    if (ep > 1 && ranks % ep)
        return mxi_diag(diag, MX_ECONFIG, "%s: parallel.expert_parallel_size: %d does not divide this job of %d rank%s "
                        "(allowed: a divisor of %d)", cfg->source, ep, ranks, ranks == 1 ? "" : "s", ranks);
    out->expert_parallel_size = ep;
    int rc = dense_layout(cfg, ranks, D, F, out, diag);
    if (rc || ep == 1) return rc;
    // the experts: EDP x EFSDP x EP; by default the expert shard group is the FSDP group's
    // ranks of one EP rank (EFSDP = F / EP) and the expert replicas the dense ones
    char ef[16] = "auto", ed[16] = "auto";
    if (EF) snprintf(ef, sizeof ef, "%d", EF);
    if (ED) snprintf(ed, sizeof ed, "%d", ED);
    int rest = ranks / ep;   // EFSDP x EDP
    bool fits = EF && ED ? (long long)EF * ED == rest : EF ? rest % EF == 0 : ED ? rest % ED == 0 : true;
    if (!fits)
        return mxi_diag(diag, MX_ECONFIG, "%s: parallel.expert_data_parallel_size: %s x "
                        "parallel.expert_fully_shard_parallel_size: %s x parallel.expert_parallel_size: %d does not fit "
                        "this job of %d ranks (allowed: expert_data_parallel_size x expert_fully_shard_parallel_size = %d / %d "
                        "= %d, either may be auto)", cfg->source, ed, ef, ep, ranks, ranks, ep, rest);
    if (!EF && !ED) EF = out->fully_shard_parallel_size % ep == 0 ? out->fully_shard_parallel_size / ep : 1;
    if (!EF) EF = rest / ED;
    out->expert_fully_shard_parallel_size = EF;
    out->expert_data_parallel_size = rest / EF;
    return MX_OK;
}

/* The dense part of mx_parallel_layout. */
static int dense_layout(const mx_config *cfg, int ranks, int D, int F, mx_layout *out, mx_diag *diag) {
    if (!D && !F) return MX_OK;   // one FSDP group of every rank
    char d[16] = "auto", f[16] = "auto";
    if (D) snprintf(d, sizeof d, "%d", D);
    if (F) snprintf(f, sizeof f, "%d", F);
    int known = D ? D : F;
    bool fits = D && F ? (long long)D * F == ranks : ranks % known == 0;
    if (!fits) {
        char why[96];
        if (D && F) snprintf(why, sizeof why, "%d x %d = %lld", D, F, (long long)D * F);
        else snprintf(why, sizeof why, "%d does not divide %d", known, ranks);
        return mxi_diag(diag, MX_ECONFIG, "%s: parallel.data_parallel_size: %s x parallel.fully_shard_parallel_size: %s "
                        "does not fit this job of %d rank%s (%s; allowed: sizes whose product is %d, either may be "
                        "auto)", cfg->source, d, f, ranks, ranks == 1 ? "" : "s", why, ranks);
    }
    out->data_parallel_size = D ? D : ranks / F;
    out->fully_shard_parallel_size = ranks / out->data_parallel_size;
    return MX_OK;
}

/* The engine's options for a config on a model: what the config says (recompute keeps the
 * gather mode: the engine gathers both planes where a recomputed block's backward needs them). */
static mxi_fsdp_options fsdp_options(const mx_config *cfg, const mx_model *model, const mx_layout *layout) {
    const mx_parallel_config *pc = &cfg->parallel;
    const mx_plan *plan = &cfg->training.quantization_plan;
    bool lp = mx_model_converted_modules(model) > 0 && plan->low_precision_all_gather;
    bool all = plan->all_gather_mode == MX_AG_ALL;
    mxi_wire_dtype reduce = pc->reduce_dtype == MX_DTYPE_BF16 ? MXI_WIRE_BF16
                            : pc->reduce_dtype == MX_DTYPE_FP64 ? MXI_WIRE_F64 : MXI_WIRE_F32;
    return (mxi_fsdp_options){pc->param_dtype == MX_DTYPE_BF16, reduce, pc->reshard_after_forward,
                              pc->num_to_forward_prefetch, pc->num_to_backward_prefetch, lp, all,
                              layout->data_parallel_size, layout->expert_parallel_size,
                              layout->expert_data_parallel_size};
}

static const char *gather_mode_of(const mx_config *cfg, const mxi_fsdp_options *fo) {
    return !fo->low_precision ? (cfg->parallel.param_dtype == MX_DTYPE_BF16 ? "bf16" : "fp32")
                              : fo->gather_all ? "all" : "on-demand";
}

/* The model a run of cfg trains on this layout, for micro-batches of B rows of T tokens. */
static mx_model_options model_options(const mx_config *cfg, const mx_layout *layout, int B, int T) {
    const mx_parallel_config *pc = &cfg->parallel;
    mx_model_options opt = {.batch = B, .seq = T, .bf16 = pc->param_dtype == MX_DTYPE_BF16,
                            .plan = &cfg->training.quantization_plan, .external_params = true,
                            .expert_parallel = layout->expert_parallel_size,
                            .ep_modules = pc->ep_modules, .n_ep_modules = pc->n_ep_modules,
                            .ep_dispatch = pc->ep_dispatch_dtype, .ep_overlap = pc->ep_overlap,
                            .z_loss_coef = cfg->training.moe_z_loss_coeff};
    if (cfg->features.recompute)   // on-demand gathers both planes for the backward of a recomputed block
        opt.recompute = cfg->features.recompute_modules, opt.n_recompute = cfg->features.n_recompute_modules;
    return opt;
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
    mx_trainer *t = calloc(1, sizeof *t);
    if (!t) return mxi_diag(diag, MX_ENOMEM, "out of memory");
    t->cfg = cfg, t->comm = comm;
    t->start_time = mxi_now_seconds();
    int B = cfg->training.micro_batch_size, T = cfg->data.seq_length;
    mx_model_options opt = model_options(cfg, &layout, B, T);
    rc = mx_model_create(&cfg->model, &opt, &t->model, diag);
    if (rc) goto fail;
    mx_run_info *info = &t->info;
    mxi_fsdp_options fo = fsdp_options(cfg, t->model, &layout);
    int recomputed = 0, blocks = cfg->model.num_hidden_layers;
    for (int u = 1; u <= blocks; u++) recomputed += mxi_model_unit_recomputes(t->model, u);
    if (fo.low_precision && !fo.gather_all && recomputed > 0) {   // what on-demand gathers for recomputed blocks
        const mxi_linear_mx *spec = mxi_model_mx_spec(t->model);
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
    info->gather_mode = gather_mode_of(cfg, &fo);
    info->data_parallel_size = layout.data_parallel_size;
    info->fully_shard_parallel_size = layout.fully_shard_parallel_size;
    info->accumulation = layout.accumulation;
    rc = mxi_fsdp_create(t->model, comm, &fo, &t->fsdp, diag);
    if (rc) goto fail;
    if (layout.expert_parallel_size > 1 &&
        (rc = mxi_ep_link_open(&t->ep, comm, layout.expert_parallel_size, t->model, diag)))
        goto fail;
    info->expert_parallel_size = layout.expert_parallel_size;
    info->expert_fully_shard_parallel_size = layout.expert_fully_shard_parallel_size;
    info->expert_data_parallel_size = layout.expert_data_parallel_size;
    // before loading: a killed save may have left the checkpoint to load moved aside
    if (cfg->training.save && (rc = mxi_checkpoint_clean(cfg->training.save, comm, diag))) goto fail;
    mxi_train_state st = {0};
    if (cfg->training.load) {
        rc = mxi_checkpoint_load(cfg->training.load, t->model, t->fsdp, &st, t->resumed_from, sizeof t->resumed_from,
                                 diag);
        if (rc) goto fail;
        t->steps_done = st.step;
        info->resumed_from = t->resumed_from;
    } else if (cfg->model_name_or_path && has_checkpoint(cfg->model_name_or_path)) {
        rc = mxi_load_sharded_weights(cfg->model_name_or_path, t->model, t->fsdp, diag);
        if (rc) goto fail;
    } else {
        float *scratch = malloc((size_t)mxi_model_largest_tensor(t->model) * sizeof(float));
        if (!scratch) {
            rc = mxi_diag(diag, MX_ENOMEM, "out of memory initialising the weights");
            goto fail;
        }
        mxi_init_sharded_weights(t->model, t->fsdp, cfg->training.seed, scratch);
        free(scratch);
    }
    rc = open_data((const char *const *)cfg->data.data_path, cfg->data.data_weights, cfg->data.n_data_path,
                   cfg->data.shuffle, cfg->training.seed, B, T, rank, world, cfg->model.vocab_size, &t->loader, diag);
    if (rc) goto fail;
    if (cfg->training.load && (rc = mx_loader_set_pos(t->loader, &st.data, diag))) goto fail;
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
    if (cfg->training.save && (rc = mxi_checkpoint_prepare(cfg->training.save, comm, diag))) goto fail;
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
        rc = mxi_diag(diag, MX_ENOMEM, "out of memory for the batch");
        goto fail;
    }
    if (cfg->training.metrics_path && rank == 0) {
        // a resumed run continues the log; a new run starts it
        // its directory is made as a checkpoint's is (checkpoints/RUN/metrics.jsonl before the first save)
        if (mxi_make_parent_dirs(cfg->training.metrics_path) == 0)
            t->metrics = fopen(cfg->training.metrics_path, cfg->training.load ? "a" : "w");
        if (!t->metrics) {
            rc = mxi_diag(diag, MX_EIO, "training.metrics_path: cannot write '%s' (%s)", cfg->training.metrics_path,
                          strerror(errno));
            goto fail;
        }
    }
    // the plot is drawn after the last step: a directory that cannot be made fails now
    if (cfg->training.plot_path && rank == 0 && mxi_make_parent_dirs(cfg->training.plot_path) != 0) {
        rc = mxi_diag(diag, MX_EIO, "training.plot_path: cannot create the directory of '%s' (%s)",
                      cfg->training.plot_path, strerror(errno));
        goto fail;
    }
    if (t->steps_done < cfg->training.train_iters && (rc = warm_up(t, diag))) goto fail;
    mxi_fsdp_memory mem = mxi_fsdp_memory_of(t->fsdp);
    info->rank = rank, info->world = world, info->step = t->steps_done;
    info->master_bytes = mem.master, info->grad_bytes = mem.grads, info->optimizer_bytes = mem.optimizer;
    info->mx_shard_bytes = mem.mx_shards, info->gathered_bytes = mem.gathered;
    info->expert_shard_bytes = mem.expert_shards, info->expert_unit_bytes = mem.expert_unit;
    info->expert_grad_bytes = mem.expert_grad;
    info->activation_bytes = mx_model_activation_bytes(t->model, NULL);
    *out = t;
    return MX_OK;
fail:
    mx_trainer_free(t);
    return rc;
}

mx_run_info mx_trainer_info(const mx_trainer *t) { return t->info; }

/* The smallest model of this config: the layout is what counts, not the activations. */
static int layout_model(const mx_config *cfg, const mx_layout *layout, mx_model **m, mx_diag *diag) {
    mx_model_options opt = model_options(cfg, layout, 1, 1);
    return mx_model_create(&cfg->model, &opt, m, diag);
}

int mx_gather_bytes_expected(const mx_config *cfg, const mx_layout *layout, uint64_t *bf16, uint64_t *on_demand,
                             uint64_t *all, mx_diag *diag) {
    *bf16 = *on_demand = *all = 0;
    if (layout->fully_shard_parallel_size < 1)
        return mxi_diag(diag, MX_EINVAL, "fully_shard_parallel_size: %d is not allowed (allowed: >= 1)",
                        layout->fully_shard_parallel_size);
    mx_model *m = NULL;
    int rc = layout_model(cfg, layout, &m, diag);
    if (rc) return rc;
    mxi_fsdp_expected_gather(m, layout->fully_shard_parallel_size, layout->expert_parallel_size,
                             layout->expert_fully_shard_parallel_size, cfg->parallel.reshard_after_forward, bf16,
                             on_demand, all);
    mx_model_free(m);
    uint64_t micro = (uint64_t)layout->accumulation;   // every micro-batch gathers again
    *bf16 *= micro, *on_demand *= micro, *all *= micro;
    return MX_OK;
}

/* The EP exchanges of one optimizer step per rank (docs/distributed.md#expert-parallelism):
 * per EP layer and micro-batch, R = micro_batch_size x seq_length x num_experts_per_tok
 * routed rows, each exchange moving them in its wire format; a recomputed block's forward
 * exchanges run twice. Worst case: all R rows of this rank leave it, and all R of each other
 * rank come to it (and go back); uniform routing: (EP - 1) / EP of that each way, i.e. R
 * (EP - 1) / EP rows out and as many in. */
static void predict_ep(const mx_config *cfg, const mx_model *m, const mx_layout *layout, mx_step_prediction *out) {
    int ep = layout->expert_parallel_size;
    if (ep <= 1) return;
    static const char *const wires[] = {"fp32", "bf16", "mxfp8"};
    uint64_t R = (uint64_t)cfg->training.micro_batch_size * cfg->data.seq_length * cfg->model.num_experts_per_tok;
    uint64_t micro = (uint64_t)layout->accumulation, C = (uint64_t)cfg->model.hidden_size;
    uint64_t out_bytes = 0, back_bytes = 0;   // per row sent: towards the experts, back
    for (int l = 0; l < cfg->model.num_hidden_layers; l++) {
        if (!mxi_model_ep_layer(m, l)) continue;
        uint64_t fwd = 1 + (uint64_t)mxi_model_unit_recomputes(m, l + 1);
        out_bytes += fwd * mxi_ep_row_bytes(mxi_model_ep_wire(m, l, MXI_EP_FWD_DISPATCH), (int64_t)C) +
                     mxi_ep_row_bytes(mxi_model_ep_wire(m, l, MXI_EP_BWD_DISPATCH), (int64_t)C);
        back_bytes += fwd * mxi_ep_row_bytes(mxi_model_ep_wire(m, l, MXI_EP_FWD_COMBINE), (int64_t)C) +
                      mxi_ep_row_bytes(mxi_model_ep_wire(m, l, MXI_EP_BWD_COMBINE), (int64_t)C);
        const char *w = wires[mxi_model_ep_wire(m, l, MXI_EP_FWD_DISPATCH)];
        out->dispatch_wire = !out->dispatch_wire || !strcmp(out->dispatch_wire, w) ? w : "mixed";
    }
    out->dispatch_worst_bytes = micro * R * out_bytes;
    out->combine_worst_bytes = micro * R * (uint64_t)(ep - 1) * back_bytes;
    out->dispatch_uniform_bytes = (double)out->dispatch_worst_bytes * (ep - 1) / ep;
    out->combine_uniform_bytes = (double)out->combine_worst_bytes / ep;
}

int mx_predict_step(const mx_config *cfg, const mx_layout *layout, mx_step_prediction *out, mx_diag *diag) {
    memset(out, 0, sizeof *out);
    if (layout->data_parallel_size < 1 || layout->fully_shard_parallel_size < 1 ||
        (long long)layout->data_parallel_size * layout->fully_shard_parallel_size != layout->ranks)
        return mxi_diag(diag, MX_EINVAL, "mx_predict_step: %d x %d is not a layout of %d ranks",
                        layout->data_parallel_size, layout->fully_shard_parallel_size, layout->ranks);
    mx_model *m = NULL;
    int rc = layout_model(cfg, layout, &m, diag);
    if (rc) return rc;
    mxi_fsdp_options fo = fsdp_options(cfg, m, layout);
    predict_ep(cfg, m, layout, out);
    mxi_fsdp_counters c;
    mxi_fsdp_memory mem;
    rc = mxi_fsdp_expected(m, &fo, layout->ranks, &c, &mem, diag);
    mx_model_free(m);
    if (rc) return rc;
    uint64_t micro = (uint64_t)layout->accumulation;   // the counters are per micro-batch
    mx_step_prediction ep = *out;
    *out = (mx_step_prediction){c.ag_param_bytes * micro, c.ag_mx_data_bytes * micro, c.ag_mx_scale_bytes * micro,
                                c.ag_bf16_equiv * micro, c.rs_bytes * micro, c.ar_bytes * micro,
                                mem.master, mem.grads, mem.optimizer, mem.mx_shards, mem.gathered,
                                gather_mode_of(cfg, &fo), mem.expert_shards, mem.expert_unit, mem.expert_grad, 0, 0, 0, 0, NULL};
    out->dispatch_worst_bytes = ep.dispatch_worst_bytes, out->combine_worst_bytes = ep.combine_worst_bytes;
    out->dispatch_uniform_bytes = ep.dispatch_uniform_bytes, out->combine_uniform_bytes = ep.combine_uniform_bytes;
    out->dispatch_wire = ep.dispatch_wire;
    return MX_OK;
}

void mx_trainer_free(mx_trainer *t) {
    if (!t) return;
    mxi_ep_link_close(&t->ep);
    mxi_fsdp_free(t->fsdp);
    mx_model_free(t->model);
    mx_loader_close(t->loader);
    mx_loader_close(t->val);
    if (t->metrics) fclose(t->metrics);
    free(t->inputs), free(t->targets);
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
    *stop = (mx_stop){MX_STOP_NONE, 0, (mxi_now_seconds() - t->start_time) / 60};
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

int mx_trainer_should_evaluate(const mx_trainer *t) {
    int every = t->cfg->training.eval_interval;
    return t->val && t->steps_done > 0 &&
           ((every > 0 && t->steps_done % every == 0) || t->steps_done == t->cfg->training.train_iters);
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
    mx_eval_metrics ev = {t->steps_done, sum / ((double)tc->eval_iters * world),
                          (int64_t)tc->eval_iters * world * tc->micro_batch_size * t->cfg->data.seq_length,
                          tc->eval_iters, mxi_now_seconds() - t0};
    if (t->metrics) {
        if (isfinite(ev.loss))
            fprintf(t->metrics, "{\"step\": %lld, \"val_loss\": %.17g, \"val_tokens\": %lld, \"val_iters\": %d, "
                    "\"val_s\": %.4f}\n", (long long)ev.step, ev.loss, (long long)ev.tokens, ev.batches, ev.seconds);
        else   // JSON has no NaN
            fprintf(t->metrics, "{\"step\": %lld, \"val_loss\": null, \"val_tokens\": %lld, \"val_iters\": %d, "
                    "\"val_s\": %.4f}\n", (long long)ev.step, (long long)ev.tokens, ev.batches, ev.seconds);
        if ((rc = flush_metrics(t, diag)) != 0) return rc;
    }
    if (out) *out = ev;
    return MX_OK;
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
    int rc = mxi_fsdp_begin_step(t->fsdp, diag);
    if (rc) return rc;
    for (int micro = 0; micro < accum; micro++) {
        rc = mx_loader_next(t->loader, t->inputs, t->targets, diag);
        if (rc) return rc;
        double l = mx_model_forward(m, t->inputs, t->targets);
        mx_model_backward(m, 1.0f);   // sums over micro-batches and ranks, divided once below
        rc = mx_model_error(m, diag);
        if (!rc) rc = mxi_fsdp_end_backward(t->fsdp, diag);
        if (rc) return rc;
        sums[0] += l / accum, sums[1] += mx_model_last_ce_loss(m) / accum, sums[2] += mx_model_last_aux_loss(m) / accum;
        sums[4] += mx_model_last_z_loss(m) / accum;
    }
    mxi_fsdp_finish_grads(t->fsdp, (double)accum * world);
    int64_t n = mxi_fsdp_shard_numel(t->fsdp);
    float *w = mxi_fsdp_master(t->fsdp), *g = mxi_fsdp_grads(t->fsdp), *mom = mxi_fsdp_moments(t->fsdp);
    // padding rows are zero; the replicas hold the same shards: one of them counts
    mxi_shard_span span;
    for (int k = 0; mxi_fsdp_norm_span(t->fsdp, k, &span); k++) sums[3] += sum_squares(g + span.offset, span.numel);
    rc = mxi_comm_allreduce_sum(t->comm, sums, 5, "the step's losses and gradient norm", diag);
    if (rc) return rc;
    double loss = sums[0] / world, ce = sums[1] / world, aux = sums[2] / world, norm = sqrt(sums[3]);
    double z = sums[4] / world;
    int64_t step = t->steps_done + 1;
    if (!isfinite(loss))
        return mxi_diag(diag, MX_EINVAL, "step %lld: the loss is %g (diverged; lower training.lr or set clip_grad)",
                        (long long)step, loss);
    if (tc->clip_grad > 0 && norm > tc->clip_grad) scale_inplace(g, n, (float)(tc->clip_grad / (norm + 1e-6)));
    lr_schedule sched = lr_schedule_of(tc);
    float lr = lr_at(&sched, step);
    adamw_step st = {lr, (float)tc->adam_beta1, (float)tc->adam_beta2, (float)tc->adam_eps, (float)tc->weight_decay, step};
    // weight decay on matrices only: norms and biases (1-D tensors) are not decayed, as in Megatron
    for (int i = 0; i < mx_model_num_tensors(m); i++) {
        mxi_shard_span s = mxi_fsdp_span(t->fsdp, i);
        adamw_update(w + s.offset, mom + s.offset, mom + n + s.offset, g + s.offset, s.numel, &st, s.decay);
    }
    t->steps_done = step;
    double dt = mxi_now_seconds() - t0;
    int64_t tokens = (int64_t)accum * world * tc->micro_batch_size * t->cfg->data.seq_length;
    mxi_fsdp_counters c = mxi_fsdp_counters_of(t->fsdp);
    mx_step_metrics mt = {step, tc->train_iters, loss, ce, aux, z, lr, norm, tokens, dt, tokens / dt,
                          mxi_now_seconds() - t->start_time, c.ag_param_bytes, c.ag_mx_data_bytes, c.ag_mx_scale_bytes,
                          c.ag_bf16_equiv, c.rs_bytes, c.ar_bytes, mxi_comm_take_seconds(t->comm), peak_rss(), 0, 0,
                          0, 0, 0, 0, 0, 0};
    mxi_model_take_ep_bytes(m, &ep);
    mt.dispatch_fp32_bytes = ep.dispatch_fp32, mt.dispatch_bf16_bytes = ep.dispatch_bf16;
    mt.dispatch_mx_data_bytes = ep.dispatch_mx_data, mt.dispatch_mx_scale_bytes = ep.dispatch_mx_scale;
    mt.dispatch_bytes = ep.dispatch_fp32 + ep.dispatch_bf16 + ep.dispatch_mx_data + ep.dispatch_mx_scale;
    mt.combine_bytes = ep.combine_fp32, mt.dispatch_rows = ep.dispatch_rows, mt.combine_rows = ep.combine_rows;
    if (t->metrics) {
        fprintf(t->metrics,
                "{\"step\": %lld, \"loss\": %.17g, \"ce_loss\": %.17g, \"aux_loss\": %.17g, \"z_loss\": %.17g, \"lr\": %.6e, "
                "\"grad_norm\": %.17g, \"tokens\": %lld, \"step_s\": %.4f, \"tokens_per_s\": %.1f, "
                "\"ag_bytes\": %llu, \"ag_param_bytes\": %llu, \"ag_mx_data_bytes\": %llu, \"ag_mx_scale_bytes\": %llu, "
                "\"ag_bf16_equiv_bytes\": %llu, \"rs_bytes\": %llu, \"ar_bytes\": %llu, \"comm_s\": %.4f, "
                "\"peak_mem_bytes\": %llu, \"dispatch_bytes\": %llu, \"combine_bytes\": %llu, "
                "\"dispatch_fp32_bytes\": %llu, \"dispatch_bf16_bytes\": %llu, \"dispatch_mx_data_bytes\": %llu, "
                "\"dispatch_mx_scale_bytes\": %llu, \"dispatch_rows\": %llu, \"combine_rows\": %llu, "
                "\"mem_master_bytes\": %llu, \"mem_grad_bytes\": %llu, \"mem_optimizer_bytes\": %llu, "
                "\"mem_mx_shard_bytes\": %llu, \"mem_gathered_bytes\": %llu, \"mem_activation_bytes\": %llu, "
                "\"mem_expert_shard_bytes\": %llu, \"mem_expert_unit_bytes\": %llu, \"mem_expert_grad_bytes\": %llu}\n",
                (long long)step, loss, ce, aux, z, lr, norm, (long long)tokens, dt, tokens / dt,
                (unsigned long long)(mt.ag_param_bytes + mt.ag_mx_data_bytes + mt.ag_mx_scale_bytes),
                (unsigned long long)mt.ag_param_bytes, (unsigned long long)mt.ag_mx_data_bytes,
                (unsigned long long)mt.ag_mx_scale_bytes, (unsigned long long)mt.ag_bf16_equiv,
                (unsigned long long)mt.rs_bytes, (unsigned long long)mt.ar_bytes, mt.comm_seconds, (unsigned long long)mt.peak_rss_bytes,
                (unsigned long long)mt.dispatch_bytes, (unsigned long long)mt.combine_bytes,
                (unsigned long long)mt.dispatch_fp32_bytes, (unsigned long long)mt.dispatch_bf16_bytes,
                (unsigned long long)mt.dispatch_mx_data_bytes, (unsigned long long)mt.dispatch_mx_scale_bytes,
                (unsigned long long)mt.dispatch_rows, (unsigned long long)mt.combine_rows,
                (unsigned long long)t->info.master_bytes, (unsigned long long)t->info.grad_bytes,
                (unsigned long long)t->info.optimizer_bytes, (unsigned long long)t->info.mx_shard_bytes,
                (unsigned long long)t->info.gathered_bytes, (unsigned long long)t->info.activation_bytes,
                (unsigned long long)t->info.expert_shard_bytes, (unsigned long long)t->info.expert_unit_bytes,
                (unsigned long long)t->info.expert_grad_bytes);
        if ((rc = flush_metrics(t, diag)) != 0) return rc;
    }
    if (out) *out = mt;
    return MX_OK;
}

int mx_trainer_save(mx_trainer *t, char *path, size_t path_size, mx_diag *diag) {
    const char *dir = t->cfg->training.save;
    if (!dir) return MX_OK;
    bool experts = t->info.expert_parallel_size > 1;   // without EP the experts follow the dense layout
    mxi_train_state st = {t->steps_done, {0}, t->cfg->training.seed, mxi_comm_world(t->comm),
                          mxi_fsdp_replicas(t->fsdp), experts ? t->info.expert_parallel_size : 0,
                          experts ? t->info.expert_fully_shard_parallel_size : 0,
                          experts ? t->info.expert_data_parallel_size : 0};
    mx_loader_get_pos(t->loader, &st.data);
    return mxi_checkpoint_save(dir, &t->cfg->model, t->model, t->fsdp, t->comm, &st, t->save_parallel,
                               t->cfg->training.keep_latest_k, path, path_size, diag);
}
