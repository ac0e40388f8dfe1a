/* mxtrain train / init / grads / plan: the commands that take a training config. */
#include <glob.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "core/clock.h"
#include "mxtrain/config.h"
#include "mxtrain/model.h"
#include "mxtrain/tokens.h"
#include "mxtrain/train.h"
#include "report/plot.h"
#include "train/planner.h"

/* Options of a command: positional CONFIG plus --name VALUE pairs and --flags, and the
 * config's settings given over the file's (`--training.lr 3e-4`, `--training.lr=3e-4`). */
#define MAX_OVERRIDES 64
typedef struct {
    const char *config;
    const char *values[8];    // by option index
    bool flags[8];
    mx_config_override overrides[MAX_OVERRIDES];
    char override_keys[MAX_OVERRIDES][128];
    int n_overrides;
} cmd_args;

typedef struct {
    const char *name;         // "--out"
    bool takes_value;
    bool required;
} cmd_option;

/* Parse argv (argv[0] is the command name); prints usage and returns false on misuse. */
static bool parse_args(int argc, char **argv, const char *usage, const cmd_option *opts, int n_opts, cmd_args *out,
                       int *exit_code) {
    memset(out, 0, sizeof *out);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            fputs(usage, stdout);
            *exit_code = 0;
            return false;
        }
        int k = -1;
        for (int j = 0; j < n_opts; j++)
            if (strcmp(a, opts[j].name) == 0) k = j;
        if (k < 0 && strncmp(a, "--", 2) == 0 && strchr(a, '.') && (!strchr(a, '=') || strchr(a, '.') < strchr(a, '='))) {
            // a setting of the config: --section.key VALUE or --section.key=VALUE
            const char *eq = strchr(a, '=');
            size_t n = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
            if (out->n_overrides == MAX_OVERRIDES || n >= sizeof out->override_keys[0]) {
                fprintf(stderr, "mxtrain %s: %s: %s (allowed: at most %d settings of at most %zu characters)\n",
                        argv[0], a, out->n_overrides == MAX_OVERRIDES ? "too many settings" : "too long",
                        MAX_OVERRIDES, sizeof out->override_keys[0] - 1);
                *exit_code = 2;
                return false;
            }
            if (!eq && i + 1 >= argc) {
                fprintf(stderr, "mxtrain %s: %s needs a value\n%s", argv[0], a, usage);
                *exit_code = 2;
                return false;
            }
            char *key = out->override_keys[out->n_overrides];
            snprintf(key, sizeof out->override_keys[0], "%.*s", (int)n, a + 2);
            out->overrides[out->n_overrides++] = (mx_config_override){.key = key, .value = eq ? eq + 1 : argv[++i]};
            continue;
        }
        if (k < 0 && a[0] == '-') {
            fprintf(stderr, "mxtrain %s: unknown option '%s'\n%s", argv[0], a, usage);
            *exit_code = 2;
            return false;
        }
        if (k < 0) {
            if (out->config) {
                fprintf(stderr, "mxtrain %s: unexpected argument '%s' (one CONFIG only)\n%s", argv[0], a, usage);
                *exit_code = 2;
                return false;
            }
            out->config = a;
        } else if (opts[k].takes_value) {
            if (i + 1 >= argc) {
                fprintf(stderr, "mxtrain %s: %s needs a value\n%s", argv[0], a, usage);
                *exit_code = 2;
                return false;
            }
            out->values[k] = argv[++i];
        } else {
            out->flags[k] = true;
        }
    }
    if (!out->config) {
        fprintf(stderr, "mxtrain %s: missing CONFIG\n%s", argv[0], usage);
        *exit_code = 2;
        return false;
    }
    for (int j = 0; j < n_opts; j++)
        if (opts[j].required && !out->values[j]) {
            fprintf(stderr, "mxtrain %s: missing %s\n%s", argv[0], opts[j].name, usage);
            *exit_code = 2;
            return false;
        }
    return true;
}

static int load_config(const char *cmd, const cmd_args *args, mx_config *cfg) {
    mx_diag diag = {{0}};
    int rc = mx_config_load_with(args->config, args->overrides, args->n_overrides, cfg, &diag);
    if (rc) fprintf(stderr, "mxtrain %s: %s\n", cmd, diag.msg);
    return rc;
}

/* The plan's decisions over cfg's modules; false when out of memory (nothing to free then). */
static bool select_modules(const mx_config *cfg, mx_module **mods, int *n, mx_selection *sel) {
    *mods = NULL, *n = 0;
    if (mx_model_modules(&cfg->model, mods, n) == 0 && mx_plan_select(&cfg->training.quantization_plan, *mods, *n, sel) == 0)
        return true;
    mx_model_modules_free(*mods, *n);
    return false;
}

/* The plan's patterns that select nothing (almost always a typo), as `plan` and `train` say it. */
static const char *elem_name(mx_elem e) { return e == MX_HIF8 ? "HIF8" : mx_elem_traits_of(e)->name; }

static void json_string(const char *s);

/* The recipe's operand table, for `mxtrain plan`. */
static void print_operands(const mx_plan *plan, bool json) {
    mx_plan_operand ops[6];
    bool delayed = plan->enabled && plan->recipe.strategy == MX_STRATEGY_DELAYED;
    const char *algo = plan->amax_compute_algo == MX_AMAX_MOST_RECENT ? "most_recent" : "max";
    if (mx_plan_operands(plan, ops) != 6) {
        if (json) printf(", \"operands\": []");
        return;
    }
    if (json) {
        printf(", \"operands\": [");
        for (int i = 0; i < 6; i++)
            printf("%s{\"product\": \"%s\", \"operand\": \"%s\", \"format\": \"%s\", \"scale\": \"%s\", \"axis\": \"%s\", "
                   "\"high_precision\": %s}", i ? ", " : "", ops[i].product, ops[i].operand,
                   ops[i].high_precision ? "model" : elem_name(ops[i].elem), ops[i].scale, ops[i].axis,
                   ops[i].high_precision ? "true" : "false");
        printf("], \"low_precision_gather\": %s, \"gather_fallback\": ", mx_plan_low_precision_gather(plan) ? "true" : "false");
        mx_plan_gather_fallback(plan) ? json_string(mx_plan_gather_fallback(plan)) : (void)printf("null");
        if (delayed)
            printf(", \"delayed_scaling\": {\"amax_history_len\": %d, \"amax_compute_algo\": \"%s\", \"margin\": %d}",
                   plan->amax_history_len, algo, plan->margin);
        return;
    }
    printf("operands of a converted layer (X inputs, W weight, dY output gradients):\n");
    for (int i = 0; i < 6; i++)
        printf("  %-6s %-3s %-5s %-36s %s\n", i % 2 ? "" : ops[i].product, ops[i].operand,
               ops[i].high_precision ? "model" : elem_name(ops[i].elem), ops[i].scale, ops[i].axis);
    if (mx_plan_gather_fallback(plan))
        printf("low-precision all-gather: not for this plan: %s; converted weights gather in the param dtype\n",
               mx_plan_gather_fallback(plan));
    if (delayed)
        printf("delayed scaling: amax_history_len %d, amax_compute_algo %s, margin %d (each tensor's scale per role "
               "and expert from its amax history, updated after each micro-batch's forward and backward)\n",
               plan->amax_history_len, algo, plan->margin);
}

static void print_plan_warnings(const mx_selection *sel) {
    for (int i = 0; i < sel->n_warnings; i++) fprintf(stderr, "warning: %s\n", sel->warnings[i]);
}

static void format_duration(char *buf, size_t n, double s) {
    if (s < 60) snprintf(buf, n, "%.0fs", s);
    else if (s < 3600) snprintf(buf, n, "%dm%02ds", (int)(s / 60), (int)s % 60);
    else snprintf(buf, n, "%dh%02dm", (int)(s / 3600), (int)(s / 60) % 60);
}

/* ---- train ---- */

/* A text sample of the model now (collective), printed by rank 0: the prompt and its
 * continuation (without the newlines it may end with: the log's next line follows), under a
 * line naming the step. */
static int sample_text(mx_trainer *t, const mx_config *cfg, int64_t step, bool lead, mx_diag *diag) {
    const char *text = NULL;
    size_t n = 0;
    int rc = mx_trainer_sample(t, &text, &n, diag);
    if (!rc && lead && text) {   // bytes as generate writes them: a NUL is a byte like any other
        while (n > 0 && text[n - 1] == '\n') n--;
        printf("sample at step %lld:\n%s", (long long)step, cfg->training.sample_prompt ? cfg->training.sample_prompt : "");
        fwrite(text, 1, n, stdout);
        putchar('\n');
        fflush(stdout);
    }
    return rc;
}

static const char train_usage[] =
    "usage: mxtrain train CONFIG [--SECTION.KEY VALUE ...]\n"
    "       mpirun -np N mxtrain train CONFIG [--SECTION.KEY VALUE ...]\n"
    "\n"
    "Trains the model of CONFIG (a YAML file: see docs/config.md) on its data, printing a\n"
    "progress line every training.log_interval steps and a summary at the end. Under mpirun\n"
    "the N ranks train data-parallel with fully sharded weights (docs/distributed.md); only\n"
    "rank 0 prints. With data.val_data_path it evaluates the validation loss every\n"
    "training.eval_interval steps and after the last. Metrics go to training.metrics_path\n"
    "(JSON lines) when set; checkpoints to training.save every training.save_interval steps\n"
    "and after the last; training.load resumes from one. training.exit_interval,\n"
    "exit_duration_in_mins and exit_signal_handler (SIGTERM, SIGINT, SIGUSR1) stop it early,\n"
    "after a step, with a checkpoint.\n"
    "\n"
    "--SECTION.KEY VALUE (or --SECTION.KEY=VALUE) sets a setting of docs/config.md over\n"
    "CONFIG's, VALUE read as YAML: --training.train_iters 100 --parallel.fsdp_plan.param_dtype fp32.\n"
    "So do init, grads and plan.\n";

static double mib(uint64_t bytes) { return bytes / 1048576.0; }

/* "all-gathered X MiB (MODE: ...), reduce-scattered Y MiB[, all-reduced Z MiB across D replicas]";
 * the codes named by the plan's family (MX codes and E8M0 scales, FP8 or HiF8 codes and
 * fp32 scales). */
static void print_bytes(const mx_plan *plan, uint64_t param, uint64_t data, uint64_t scale, uint64_t rs, uint64_t ar,
                        const char *mode, int replicas) {
    static const char *const codes[MX_FAMILY_COUNT] = {[MX_FAMILY_MX] = "MX", [MX_FAMILY_FLOAT8] = "FP8",
                                                       [MX_FAMILY_HIF8] = "HiF8"};
    // the gathered codes are the weight's: a per-tensor mix names them by the weight's format
    const char *c = plan->family == MX_FAMILY_MX ? codes[MX_FAMILY_MX]
                    : plan->recipe.weight == MX_HIF8 ? codes[MX_FAMILY_HIF8] : codes[MX_FAMILY_FLOAT8];
    printf("all-gathered %.2f MiB (%s: %.2f MiB weights in param_dtype, %.2f MiB %s codes, %.2f MiB %s scales), "
           "reduce-scattered %.2f MiB", mib(param + data + scale), mode, mib(param), mib(data), c, mib(scale),
           plan->family == MX_FAMILY_MX ? "MX" : "fp32", mib(rs));
    if (replicas > 1) printf(", all-reduced %.2f MiB across %d replicas", mib(ar), replicas);
}

/* training.exit_signal_handler: a signal is noted, and the run stops after the step under
 * way (mx_trainer_should_stop); a second one takes its default action. */
static volatile sig_atomic_t caught_signal;
static void note_signal(int sig) { caught_signal = sig; }
static const int exit_signals[] = {SIGTERM, SIGINT, SIGUSR1};   // SIGUSR1: what mpirun forwards untouched
static void handle_exit_signals(void) {
    struct sigaction sa = {.sa_handler = note_signal, .sa_flags = SA_RESTART | SA_RESETHAND};
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < sizeof exit_signals / sizeof exit_signals[0]; i++) sigaction(exit_signals[i], &sa, NULL);
}

static void print_stop(const mx_stop *stop, int64_t step, const mx_training_config *tc) {
    printf("stopping after step %lld of %d: ", (long long)step, tc->train_iters);
    if (stop->reason == MX_STOP_SIGNAL) {
        int sig = stop->signal;
        const char *name = sig == SIGTERM ? "SIGTERM" : sig == SIGINT ? "SIGINT" : sig == SIGUSR1 ? "SIGUSR1" : NULL;
        if (name) printf("%s (training.exit_signal_handler)", name);
        else printf("signal %d (training.exit_signal_handler)", sig);
    } else if (stop->reason == MX_STOP_DURATION) {
        printf("%.2f minutes, past training.exit_duration_in_mins %g", stop->minutes, tc->exit_duration_in_mins);
    } else {
        printf("training.exit_interval %d", tc->exit_interval);
    }
    printf("%s\n", tc->save ? "; training.load resumes it from the checkpoint below" : "");
    fflush(stdout);
}

/* A checkpoint, announced by the lead rank with the time it took. */
static int save_checkpoint(mx_trainer *t, char *where, size_t size, bool lead, mx_diag *diag) {
    double t0 = mxi_now_seconds();
    int rc = mx_trainer_save(t, where, size, diag);
    if (!rc && lead) printf("saved %s in %.2f s\n", where, mxi_now_seconds() - t0), fflush(stdout);
    return rc;
}

/* An error after the job started: on several ranks, end them all (none may wait forever;
 * the error may be this rank's alone, so each rank that has one says it, with its rank;
 * a single process has no rank to name). */
static int train_failed(const mx_diag *diag, int rank, int world) {
    if (world > 1) {
        fprintf(stderr, "mxtrain train: rank %d: %s\n", rank, diag->msg);
        mx_job_abort(1);
    }
    fprintf(stderr, "mxtrain train: %s\n", diag->msg);
    return 1;
}

/* Whether parallel.ep_plan.apply_modules selects an expert module (itself or an ancestor). */
static bool ep_selects(const mx_config *cfg, const char *fqn) {
    for (int i = 0; i < cfg->parallel.n_ep_modules; i++)
        if (mx_pattern_match_module(cfg->parallel.ep_modules[i].compiled, fqn, NULL)) return true;
    return false;
}

static const char *ep_dtype_name(mx_ep_dispatch d) {
    return d == MX_EP_DISPATCH_FP32 ? "fp32" : d == MX_EP_DISPATCH_BF16 ? "bf16" : d == MX_EP_DISPATCH_MXFP8 ? "mxfp8" : "auto";
}

/* What the quantization plan saves against the same config in bf16 (no plan), by category,
 * from both predictions; nothing when the plan converts nothing. */
static void print_against_bf16(const mx_config *cfg, const mx_layout *layout) {
    mx_config bf = *cfg;   // shallow: only read, with the plan left out
    bf.training.quantization_plan = (mx_plan){0};
    mx_step_prediction have, base;
    mx_diag diag = {{0}};
    if (mx_predict_step(cfg, layout, &have, &diag) || mx_predict_step(&bf, layout, &base, &diag)) return;
    if (!have.ag_bf16_equiv && have.mx_shard_bytes == base.mx_shard_bytes &&
        have.activation_bytes == base.activation_bytes && have.gathered_bytes == base.gathered_bytes)
        return;
    have.process_bytes = base.process_bytes = 0;   // the same either way (and at the summary, the whole run)
    double d_mx = mib(have.mx_shard_bytes) - mib(base.mx_shard_bytes);
    double d_gather = mib(have.gathered_bytes) - mib(base.gathered_bytes);
    double d_act = mib(have.activation_bytes) - mib(base.activation_bytes);
    double d_all = mib(mx_predicted_bytes(&have)) - mib(mx_predicted_bytes(&base));
    printf("memory against bf16 with the same settings, per rank: MX shards %+.1f MiB, gather buffers %+.1f MiB, "
           "activations %+.1f MiB; in all %+.1f MiB, %.2f GiB against %.2f GiB (%.3fx) besides the process itself\n", d_mx, d_gather, d_act, d_all,
           mx_predicted_bytes(&have) / 1073741824.0, mx_predicted_bytes(&base) / 1073741824.0,
           (double)mx_predicted_bytes(&have) / (double)mx_predicted_bytes(&base));
}

static void print_summary(const mx_config *cfg, const mx_trainer *t, const mx_step_metrics *mt, double first_loss,
                          double tokens, double seconds, double comm_seconds, const mx_step_metrics *per_step,
                          const mx_eval_metrics *val) {
    mx_run_info in = mx_trainer_info(t);
    char took[32], val_text[64] = "";
    format_duration(took, sizeof took, mt->elapsed_seconds);
    if (val) snprintf(val_text, sizeof val_text, " | val loss %.4f", val->loss);
    printf("done: %lld step%s in %s | loss %.4f -> %.4f%s | %.0f tok/s on average over %d rank%s\n", (long long)mt->step,
           mt->step == 1 ? "" : "s", took, first_loss, mt->loss, val_text, tokens / seconds, in.world,
           in.world == 1 ? "" : "s");
    printf("communication per step and rank: ");
    print_bytes(&cfg->training.quantization_plan, per_step->ag_param_bytes, per_step->ag_mx_data_bytes, per_step->ag_mx_scale_bytes, per_step->rs_bytes,
                per_step->ar_bytes, in.gather_mode, in.data_parallel_size);
    if (in.expert_parallel_size > 1) {   // routing decides these: the last step's
        char kinds[160] = "";
        const struct { uint64_t n; const char *what; } k[] = {
            {per_step->dispatch_fp32_bytes, "fp32"}, {per_step->dispatch_bf16_bytes, "bf16"},
            {per_step->dispatch_mx_data_bytes + per_step->dispatch_mx_scale_bytes, "MXFP8 codes and scales"}};
        for (int i = 0; i < 3; i++)
            if (k[i].n)
                snprintf(kinds + strlen(kinds), sizeof kinds - strlen(kinds), "%s%.2f MiB %s", kinds[0] ? ", " : "",
                         mib(k[i].n), k[i].what);
        printf(", tokens dispatched %.2f MiB (%s) and combined %.2f MiB (fp32), last step", mib(per_step->dispatch_bytes),
               kinds[0] ? kinds : "none", mib(per_step->combine_bytes));
    }
    printf("; %.1f%% of the time waiting in collectives\n", 100.0 * comm_seconds / seconds);
    if (per_step->ag_bf16_equiv)
        printf("converted weights: gathered %.2f MiB as MX planes where bf16 would have gathered %.2f MiB (%.3fx)\n",
               mib(per_step->ag_mx_data_bytes + per_step->ag_mx_scale_bytes), mib(per_step->ag_bf16_equiv),
               (double)(per_step->ag_mx_data_bytes + per_step->ag_mx_scale_bytes) / (double)per_step->ag_bf16_equiv);
    printf("memory per rank: master weights %.1f MiB, gradients %.1f MiB, optimizer %.1f MiB, MX shards %.1f MiB, "
           "gather buffers %.1f MiB, activations %.1f MiB",
           mib(in.master_bytes), mib(in.grad_bytes), mib(in.optimizer_bytes), mib(in.mx_shard_bytes),
           mib(in.gathered_bytes), mib(in.activation_bytes));
    if (in.scaling_state_bytes) printf(", delayed scaling state %.1f MiB", mib(in.scaling_state_bytes));
    printf("; peak resident %.1f MiB (predicted %.1f MiB)\n", mib(mt->peak_rss_bytes), mib(in.predicted_bytes));
    mx_layout layout;
    mx_diag diag = {{0}};
    if (!mx_parallel_layout(cfg, in.world, &layout, &diag)) print_against_bf16(cfg, &layout);
}

/* Unigram entropy, in nats per token, of the first shard data_path names: the loss of a
 * model that learned token frequencies only. NAN when it cannot be read. */
static double unigram_entropy(const mx_config *cfg) {
    glob_t g;
    if (cfg->data.n_data_path < 1 || glob(cfg->data.data_path[0], 0, NULL, &g) != 0) return NAN;
    uint32_t *tok = NULL;
    int64_t n = 0;
    mx_diag diag = {{0}};
    int rc = g.gl_pathc ? mx_shard_read(g.gl_pathv[0], cfg->model.vocab_size, &tok, &n, &diag) : MX_EIO;
    globfree(&g);
    if (rc || n == 0) {
        free(tok);
        return NAN;
    }
    int64_t V = cfg->model.vocab_size, *count = calloc((size_t)V, sizeof *count);
    double h = NAN;
    if (count) {
        for (int64_t i = 0; i < n; i++) count[tok[i]]++;
        h = 0;
        for (int64_t v = 0; v < V; v++)
            if (count[v]) h -= (double)count[v] / n * log((double)count[v] / n);
    }
    free(count);
    free(tok);
    return h;
}

/* The end of the summary: the loss against the data's unigram entropy, the validation loss,
 * and where the checkpoints and the loss plot went. Returns the exit status (the plot can
 * fail). */
static int print_outcome(const mx_config *cfg, const mx_step_metrics *mt, const mx_eval_metrics *val,
                         const char *last_checkpoint) {
    const mx_training_config *tc = &cfg->training;
    double h = unigram_entropy(cfg);
    if (h == h)
        printf("loss %.4f against %.4f nats, the unigram entropy of the training tokens (first shard): %s\n", mt->loss,
               h, mt->loss < h ? "the model learned more than token frequencies"
                               : "not below what token frequencies alone give");
    if (val) printf("validation loss %.4f over %lld tokens of data.val_data_path\n", val->loss, (long long)val->tokens);
    if (tc->save && last_checkpoint[0])
        printf("checkpoints in %s, the last %s (Hugging Face model directories)\n", tc->save, last_checkpoint);
    if (tc->metrics_path) printf("metrics in %s\n", tc->metrics_path);
    if (tc->plot_path) {
        mx_diag diag = {{0}};
        // the run is labelled by its config's name: examples/qwen3_moe_mxfp8.yaml -> qwen3_moe_mxfp8
        const char *base = strrchr(cfg->source, '/') ? strrchr(cfg->source, '/') + 1 : cfg->source;
        char label[256];
        snprintf(label, sizeof label, "%.*s", (int)strcspn(base, "."), base);
        const char *files[1] = {tc->metrics_path}, *labels[1] = {label};
        if (mxi_plot_metrics(files, labels, 1, tc->plot_path, cfg->source, &diag)) {
            fprintf(stderr, "mxtrain train: training.plot_path: %s\n", diag.msg);
            return 1;
        }
        printf("loss curves in %s\n", tc->plot_path);
    }
    return 0;
}

int cli_train(int argc, char **argv) {
    cmd_args args;
    int code;
    if (!parse_args(argc, argv, train_usage, NULL, 0, &args, &code)) return code;
    int rank = mx_job_rank(), world = mx_job_world();
    bool lead = rank == 0;
    mx_config cfg;
    mx_diag diag = {{0}};
    if (mx_config_load_with(args.config, args.overrides, args.n_overrides, &cfg, &diag)) {
        code = train_failed(&diag, rank, world);
        mx_job_finish(code, NULL);   // (one process: several ranks ended in train_failed)
        return code;
    }
    mx_trainer *t = NULL;
    int rc = mx_trainer_create(&cfg, &t, &diag);
    if (rc) {
        code = train_failed(&diag, rank, world);
        mx_config_free(&cfg);
        mx_job_finish(code, NULL);
        return code;
    }
    const mx_training_config *tc = &cfg.training;
    mx_run_info in = mx_trainer_info(t);
    if (lead) {
        char hsdp[96] = "";
        if (in.data_parallel_size > 1)
            snprintf(hsdp, sizeof hsdp, " (%d replicas x FSDP groups of %d)", in.data_parallel_size,
                     in.fully_shard_parallel_size);
        if (in.expert_parallel_size > 1)
            snprintf(hsdp + strlen(hsdp), sizeof hsdp - strlen(hsdp), " (EP groups of %d, %d experts each)",
                     in.expert_parallel_size, cfg.model.num_experts / in.expert_parallel_size);
        printf("mxtrain train: %s, %lld parameters, %d rank%s%s x micro-batch %d x %d tokens, %d accumulation step%s, "
               "%d step%s\n", cfg.source, (long long)mx_model_num_params(mx_trainer_model(t)), world, world == 1 ? "" : "s",
               hsdp, tc->micro_batch_size, cfg.data.seq_length, in.accumulation, in.accumulation == 1 ? "" : "s",
               tc->train_iters, tc->train_iters == 1 ? "" : "s");
        if (in.resumed_from) printf("resumed from %s at step %lld\n", in.resumed_from, (long long)in.step);
        size_t unsaved, act = mx_model_activation_bytes(mx_trainer_model(t), &unsaved);
        if (cfg.parallel.param_dtype == MX_DTYPE_BF16) {
            bool native = mx_model_bf16_native(mx_trainer_model(t));
            char acts[128] = "";   // with a plan, its line below gives the activations
            if (!tc->quantization_plan.enabled && act < unsaved)
                snprintf(acts, sizeof acts, "; inputs kept for backward in bf16: activations %.1f MiB, %.1f MiB in fp32",
                         act / 1048576.0, unsaved / 1048576.0);
            printf("precision: bf16 operands, fp32 accumulation, on oneDNN's %s%s\n",
                   native ? "bf16 matmul" : "fp32 matmul (this CPU has no bf16 matmul)", acts);
        }
        if (tc->quantization_plan.enabled) {
            char recipe[160];
            mx_recipe_format(&tc->quantization_plan.recipe, recipe, sizeof recipe);
            char acts[128];
            if (act < unsaved)
                snprintf(acts, sizeof acts, "activations %.1f MiB, %.1f MiB if layers kept fp32 inputs for backward",
                         act / 1048576.0, unsaved / 1048576.0);
            else if (tc->quantization_plan.recipe.granularity != MX_GRANULARITY_MX ||   // backward quantizes them again,
                     tc->quantization_plan.high_precision_gemms & MX_GEMM_WGRAD)       // or reads them in fp32
                snprintf(acts, sizeof acts, "activations %.1f MiB (converted layers keep fp32 inputs)", act / 1048576.0);
            else   // planes are kept only where they take less: here nowhere
                snprintf(acts, sizeof acts, "activations %.1f MiB (converted layers keep fp32 inputs: MX planes would "
                         "take more here)", act / 1048576.0);
            const char *why = mx_plan_gather_fallback(&tc->quantization_plan);
            printf("quantization: %s, %d modules converted (mxtrain plan %s lists them); weights gathered as %s%s%s%s; "
                   "%s\n", recipe, mx_model_converted_modules(mx_trainer_model(t)), args.config, in.gather_mode,
                   why ? " (no low-precision all-gather: " : "", why ? why : "", why ? ")" : "", acts);
        }
        if (cfg.data.n_val_data_path > 0) {
            char every[64] = "";
            if (tc->eval_interval > 0) snprintf(every, sizeof every, "every %d steps and ", tc->eval_interval);
            printf("validation: %safter the last step, %d batch%s per rank from data.val_data_path (%lld in one "
                   "pass)\n", every, tc->eval_iters, tc->eval_iters == 1 ? "" : "es", (long long)in.val_batches);
        }
        for (int i = 0; i < in.n_notes; i++) printf("note: %s\n", in.notes[i]);
        mx_module *mods;
        int n;
        mx_selection sel;
        if (select_modules(&cfg, &mods, &n, &sel)) {
            fflush(stdout);
            print_plan_warnings(&sel);
            mx_selection_free(&sel);
            mx_model_modules_free(mods, n);
        }
    }
    mx_step_metrics mt = {0}, last = {0};
    mx_eval_metrics val = {0};
    bool have_val = false;
    double first_loss = 0, tokens = 0, seconds = 0, comm = 0;
    int64_t done = mx_trainer_steps_done(t);
    bool saved_last = false;
    char where[4096] = "";
    if (tc->exit_signal_handler) handle_exit_signals();
    if (lead && done >= tc->train_iters)   // not an error: a finished run started again ends at once
        printf("nothing to do: the checkpoint is at step %lld and training.train_iters is %d (raise it to train "
               "further)\n", (long long)done, tc->train_iters);
    for (int64_t s = done; s < tc->train_iters && !rc; s++) {
        rc = mx_trainer_step(t, &mt, &diag);
        if (rc) break;
        if (s == done) first_loss = mt.loss;
        tokens += (double)mt.tokens, seconds += mt.step_seconds, comm += mt.comm_seconds;
        last = mt;
        bool evaluated = mx_trainer_should_evaluate(t);
        if (evaluated) {
            rc = mx_trainer_evaluate(t, &val, &diag);
            if (rc) break;
            have_val = true;
        }
        if (lead && (mt.step % tc->log_interval == 0 || mt.step == tc->train_iters || evaluated)) {
            char eta[32], val_text[64] = "";
            format_duration(eta, sizeof eta, seconds / (mt.step - done) * (tc->train_iters - mt.step));
            if (evaluated) snprintf(val_text, sizeof val_text, " | val loss %.4f", val.loss);
            printf("step %5lld/%lld | loss %.4f%s | lr %.3e | grad norm %7.3f | %8.0f tok/s | comm %4.1f%% | ETA %s\n",
                   (long long)mt.step, (long long)tc->train_iters, mt.loss, val_text, mt.lr, mt.grad_norm,
                   mt.tokens_per_s, 100.0 * mt.comm_seconds / mt.step_seconds, eta);
            fflush(stdout);
        }
        if (mx_trainer_should_sample(t)) {
            rc = sample_text(t, &cfg, mt.step, lead, &diag);
            if (rc) break;
        }
        saved_last = false;
        if (mx_trainer_should_save(t)) {
            rc = save_checkpoint(t, where, sizeof where, lead, &diag);
            saved_last = true;
        }
        mx_stop stop;
        if (!rc && !(rc = mx_trainer_should_stop(t, caught_signal, &stop, &diag)) && stop.reason) {
            if (lead) print_stop(&stop, mt.step, tc);
            break;
        }
    }
    // the final checkpoint, unless the last step's is written or no step ran (resumed at the end)
    if (!rc && tc->save && !saved_last && mx_trainer_steps_done(t) > done) {
        rc = save_checkpoint(t, where, sizeof where, lead, &diag);
    }
    // what the run learned: a sample from the last step's weights
    if (!rc && mx_trainer_steps_done(t) > done) rc = sample_text(t, &cfg, mx_trainer_steps_done(t), lead, &diag);
    if (rc) {
        code = train_failed(&diag, rank, world);
    } else {
        code = 0;
        if (lead && seconds > 0) {
            print_summary(&cfg, t, &mt, first_loss, tokens, seconds, comm, &last, have_val ? &val : NULL);
            code = print_outcome(&cfg, &mt, have_val ? &val : NULL, where);
        }
    }
    mx_trainer_free(t);
    mx_config_free(&cfg);
    // every rank waits here for the others, under the watchdog: a rank lost at the very end
    // still ends the job with a message
    if (mx_job_finish(code, &diag)) code = train_failed(&diag, rank, world);
    return code;
}

/* ---- init ---- */

static const char init_usage[] =
    "usage: mxtrain init CONFIG --out W.safetensors\n"
    "\n"
    "Writes the initial weights of CONFIG's model for its training.seed, with Hugging Face\n"
    "tensor names, as fp32 safetensors.\n";

static mx_model *create_model(const char *cmd, const mx_config *cfg, int batch, int seq) {
    mx_model *m = NULL;
    mx_diag diag = {{0}};
    mx_model_options opt = {.batch = batch, .seq = seq, .bf16 = cfg->parallel.param_dtype == MX_DTYPE_BF16,
                            .plan = &cfg->training.quantization_plan, .z_loss_coef = cfg->training.moe_z_loss_coeff,
                            .documents = mxi_train_documents(cfg)};
    if (mx_model_create(&cfg->model, &opt, &m, &diag)) fprintf(stderr, "mxtrain %s: %s\n", cmd, diag.msg);
    return m;
}

int cli_init(int argc, char **argv) {
    static const cmd_option opts[] = {{"--out", true, true}};
    cmd_args args;
    int code;
    if (!parse_args(argc, argv, init_usage, opts, 1, &args, &code)) return code;
    if (!cli_out_not_input("init", "--out", args.values[0], &args.config, 1)) return 2;
    mx_config cfg;
    if (load_config("init", &args, &cfg)) return 1;
    mx_model *m = create_model("init", &cfg, 1, 1);
    int rc = m ? 0 : 1;
    if (m) {
        mx_diag diag = {{0}};
        mx_model_init(m, cfg.training.seed);
        if (mx_model_save(m, args.values[0], false, NULL, NULL, 0, &diag)) {
            fprintf(stderr, "mxtrain init: %s\n", diag.msg);
            rc = 1;
        } else {
            printf("wrote %s: %d tensors, %lld parameters (seed %llu)\n", args.values[0], mx_model_num_hf_tensors(m),
                   (long long)mx_model_num_params(m), (unsigned long long)cfg.training.seed);
        }
    }
    mx_model_free(m);
    mx_config_free(&cfg);
    return rc;
}

/* ---- grads ---- */

static const char grads_usage[] =
    "usage: mxtrain grads CONFIG --weights W.safetensors --tokens T.bin --out G.safetensors\n"
    "\n"
    "One forward and backward pass of CONFIG's model with weights W on the first batch of\n"
    "T.bin (training.micro_batch_size x data.seq_length tokens), writing `loss` and\n"
    "`grad.<name>` for every parameter as fp32 safetensors. At parallel.fsdp_plan.param_dtype\n"
    "bf16 the weights are first rounded to bf16 as training gathers them, so the pass is a\n"
    "training step's.\n";

int cli_grads(int argc, char **argv) {
    static const cmd_option opts[] = {{"--weights", true, true}, {"--tokens", true, true}, {"--out", true, true}};
    cmd_args args;
    int code;
    if (!parse_args(argc, argv, grads_usage, opts, 3, &args, &code)) return code;
    const char *ins[] = {args.config, args.values[0], args.values[1]};
    if (!cli_out_not_input("grads", "--out", args.values[2], ins, 3)) return 2;
    mx_config cfg;
    if (load_config("grads", &args, &cfg)) return 1;
    int B = cfg.training.micro_batch_size, T = cfg.data.seq_length, rc = 1;
    mx_diag diag = {{0}};
    mx_loader *loader = NULL;
    int32_t *inputs = malloc((size_t)B * T * 4), *targets = malloc((size_t)B * T * 4);
    mx_model *m = create_model("grads", &cfg, B, T);
    if (!m || !inputs || !targets) goto done;
    if (mx_model_load(m, args.values[0], &diag) ||
        mx_loader_open(&args.values[1], 1, B, T, 0, 1, cfg.model.vocab_size, &loader, &diag) ||
        mx_loader_next(loader, inputs, targets, &diag)) {
        fprintf(stderr, "mxtrain grads: %s\n", diag.msg);
        goto done;
    }
    // at bf16, the weights as the trainer's FSDP engine gathers them
    if (cfg.parallel.param_dtype == MX_DTYPE_BF16)
        mx_model_round_weights_bf16(m, mx_plan_low_precision_gather(&cfg.training.quantization_plan));
    mx_model_zero_grad(m);
    float loss = (float)mx_model_forward(m, inputs, targets);
    mx_model_backward(m, 1.0f);
    const char *names[] = {"loss"};
    if (mx_model_error(m, &diag) || mx_model_save(m, args.values[2], true, names, &loss, 1, &diag)) {
        fprintf(stderr, "mxtrain grads: %s\n", diag.msg);
        goto done;
    }
    printf("loss %.6f; wrote %s\n", loss, args.values[2]);
    rc = 0;
done:
    mx_loader_close(loader);
    mx_model_free(m);
    free(inputs), free(targets);
    mx_config_free(&cfg);
    return rc;
}

/* ---- plan ---- */

static const char plan_usage[] =
    "usage: mxtrain plan CONFIG [--json] [--ranks N] [--dp D] [--ep EP] [--efsdp EF] [--edp ED]\n"
    "\n"
    "Shows, for every module of CONFIG's model, whether the quantization plan converts it and\n"
    "why (which pattern applied it, which excluded it), and warns about patterns that select\n"
    "nothing. Then, for a job of N ranks laid out as CONFIG's parallel.data_parallel_size x\n"
    "parallel.fully_shard_parallel_size (--dp D: D replicas of FSDP groups of N / D ranks\n"
    "instead; N defaults to the sizes given, auto counting as 1), what one step costs each\n"
    "rank: the bytes the converted weights would all-gather in bf16, on-demand and all modes\n"
    "(with CONFIG's reshard_after_forward, gradient accumulation and recompute);\n"
    "the bytes the run would all-gather, reduce-scatter and all-reduce across replicas; the\n"
    "memory of its shards and buffers. --ep, --efsdp and --edp set parallel.expert_parallel_size,\n"
    "expert_fully_shard_parallel_size and expert_data_parallel_size (the experts' layout, EDP x\n"
    "EFSDP x EP = N; the others auto). --json prints the same as one JSON object.\n";

static void json_string(const char *s) {
    putchar('"');
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') printf("\\%c", *s);
        else if ((unsigned char)*s < 0x20) printf("\\u%04x", *s);
        else putchar(*s);
    }
    putchar('"');
}

/* The settings not at their default, with where each came from (the file's line, the
 * model's config.json, the command line); in JSON every setting, as "settings". */
static void print_settings(const mx_config *cfg, bool json) {
    char value[512], from[4200];
    int shown = 0;
    for (int i = 0; i < mx_config_key_count(); i++) {
        const char *key = mx_config_key_name(i);
        mx_origin o;
        if (mx_config_origin(cfg, key, &o) || mx_config_format_value(cfg, key, value, sizeof value) < 0 ||
            mx_config_format_origin(cfg, key, from, sizeof from) < 0 || (!json && o.kind == MX_ORIGIN_DEFAULT))
            continue;
        if (json) {
            printf("%s\n  ", shown ? "," : "");
            json_string(key);
            printf(": {\"value\": ");
            json_string(value);
            printf(", \"from\": ");
            json_string(from);
            printf("}");
        } else {
            printf("%s  %s: %s (%s)\n", shown ? "" : "settings given (the others at their defaults, docs/config.md):\n",
                   key, value, from);
        }
        shown++;
    }
}

int cli_plan(int argc, char **argv) {
    static const cmd_option opts[] = {{"--json", false, false}, {"--ranks", true, false}, {"--dp", true, false},
                                      {"--ep", true, false}, {"--efsdp", true, false}, {"--edp", true, false}};
    cmd_args args;
    int code;
    if (!parse_args(argc, argv, plan_usage, opts, 6, &args, &code)) return code;
    bool json = args.flags[0];
    int sizes[5] = {0, 0, 0, 0, 0};   // --ranks, --dp, --ep, --efsdp, --edp (0: from the config)
    for (int k = 0; k < 5; k++) {
        const char *text = args.values[1 + k];
        if (!text) continue;
        char *end;
        long v = strtol(text, &end, 10);
        if (*end || end == text || v < 1 || v > 1 << 20) {
            fprintf(stderr, "mxtrain plan: %s: '%s' is not allowed (allowed: an integer 1 to %d)\n%s", opts[1 + k].name,
                    text, 1 << 20, plan_usage);
            return 2;
        }
        sizes[k] = (int)v;
    }
    if (sizes[0] && sizes[1] && sizes[0] % sizes[1]) {
        fprintf(stderr, "mxtrain plan: --dp: %d does not divide --ranks %d (allowed: a divisor of the ranks)\n%s",
                sizes[1], sizes[0], plan_usage);
        return 2;
    }
    mx_config cfg;
    if (load_config("plan", &args, &cfg)) return 1;
    mx_parallel_config *pc = &cfg.parallel;
    if (sizes[1]) pc->data_parallel_size = sizes[1], pc->fully_shard_parallel_size = 0;
    if (sizes[2]) pc->expert_parallel_size = sizes[2];
    if (sizes[3] || sizes[4]) pc->expert_fully_shard_parallel_size = sizes[3], pc->expert_data_parallel_size = sizes[4];
    // without --ranks: the config's sizes multiplied, auto counting as 1
    int ranks = sizes[0] ? sizes[0] : (pc->data_parallel_size ? pc->data_parallel_size : 1) *
                                          (pc->fully_shard_parallel_size ? pc->fully_shard_parallel_size : 1);
    uint64_t ag[3];
    mx_layout layout;
    mx_step_prediction pr;
    mx_diag diag = {{0}};
    if (mx_parallel_layout(&cfg, ranks, &layout, &diag) ||
        mx_gather_bytes_expected(&cfg, &layout, &ag[0], &ag[1], &ag[2], &diag) ||
        mx_predict_step(&cfg, &layout, &pr, &diag)) {
        fprintf(stderr, "mxtrain plan: %s\n", diag.msg);
        mx_config_free(&cfg);
        return 1;
    }
    int D = layout.data_parallel_size, F = layout.fully_shard_parallel_size, EP = layout.expert_parallel_size;
    int EF = layout.expert_fully_shard_parallel_size, ED = layout.expert_data_parallel_size;
    const mx_plan *plan = &cfg.training.quantization_plan;
    mx_module *mods;
    int n;
    mx_selection sel;
    if (!select_modules(&cfg, &mods, &n, &sel)) {
        fprintf(stderr, "mxtrain plan: out of memory selecting the modules the plan converts (a list of %zu bytes, "
                "then their names and decisions)\n", MX_MODULES_MAX(cfg.model.num_hidden_layers) * sizeof *mods);
        mx_config_free(&cfg);
        return 1;
    }
    char recipe[160] = "off";
    if (plan->enabled) mx_recipe_format(&plan->recipe, recipe, sizeof recipe);
    int converted = 0;
    for (int i = 0; i < n; i++) converted += sel.decisions[i].converted;
    if (json) {
        printf("{\"config\": ");
        json_string(cfg.source);
        printf(", \"settings\": {");
        print_settings(&cfg, true);
        printf("\n}, \"recipe\": ");
        plan->enabled ? json_string(recipe) : (void)printf("null");
        print_operands(plan, true);
        printf(", \"converted\": %d, \"modules\": [", converted);
        for (int i = 0; i < n; i++) {
            char why[512];
            mx_decision_explain(plan, &mods[i], &sel.decisions[i], why, sizeof why);
            printf("%s\n  {\"module\": ", i ? "," : "");
            json_string(mods[i].fqn);
            printf(", \"converted\": %s, \"converter\": ", sel.decisions[i].converted ? "true" : "false");
            sel.decisions[i].converted ? json_string(mx_converter_family_name(sel.decisions[i].converter, plan->family)) : (void)printf("null");
            printf(", \"why\": ");
            json_string(why);
            printf("}");
        }
        printf("\n], \"warnings\": [");
        for (int i = 0; i < sel.n_warnings; i++) {
            printf("%s", i ? ", " : "");
            json_string(sel.warnings[i]);
        }
        printf("], \"gather_bytes_per_step\": {\"ranks\": %d, \"fully_shard_parallel_size\": %d, \"recompute\": %s, "
               "\"bf16\": %llu, \"on_demand\": %llu, \"all\": %llu}", ranks, F, cfg.features.recompute ? "true" : "false",
               (unsigned long long)ag[0], (unsigned long long)ag[1], (unsigned long long)ag[2]);
        // the names of the metrics' fields (training.metrics_path), to compare with them
        printf(",\n \"layout\": {\"ranks\": %d, \"data_parallel_size\": %d, \"fully_shard_parallel_size\": %d},\n"
               " \"per_step\": {\"gather_mode\": \"%s\", \"ag_bytes\": %llu, \"ag_param_bytes\": %llu, "
               "\"ag_mx_data_bytes\": %llu, \"ag_mx_scale_bytes\": %llu, \"ag_bf16_equiv_bytes\": %llu, \"rs_bytes\": %llu, "
               "\"ar_bytes\": %llu, \"mem_master_bytes\": %llu, \"mem_grad_bytes\": %llu, \"mem_optimizer_bytes\": %llu, "
               "\"mem_mx_shard_bytes\": %llu, \"mem_gathered_bytes\": %llu, \"mem_activation_bytes\": %llu, "
               "\"mem_scaling_state_bytes\": %llu},\n"
               " \"memory\": {\"workspace_bytes\": %llu, \"process_bytes\": %llu, \"predicted_bytes\": %llu},\n", ranks, D, F, pr.gather_mode,
               (unsigned long long)(pr.ag_param_bytes + pr.ag_mx_data_bytes + pr.ag_mx_scale_bytes),
               (unsigned long long)pr.ag_param_bytes, (unsigned long long)pr.ag_mx_data_bytes,
               (unsigned long long)pr.ag_mx_scale_bytes, (unsigned long long)pr.ag_bf16_equiv,
               (unsigned long long)pr.rs_bytes, (unsigned long long)pr.ar_bytes, (unsigned long long)pr.master_bytes,
               (unsigned long long)pr.grad_bytes, (unsigned long long)pr.optimizer_bytes,
               (unsigned long long)pr.mx_shard_bytes, (unsigned long long)pr.gathered_bytes,
               (unsigned long long)pr.activation_bytes, (unsigned long long)pr.scaling_state_bytes,
               (unsigned long long)pr.workspace_bytes, (unsigned long long)pr.process_bytes,
               (unsigned long long)mx_predicted_bytes(&pr));
        printf(" \"expert_parallel\": {\"expert_parallel_size\": %d, \"dispatch_wire\": ", EP);
        pr.dispatch_wire ? json_string(pr.dispatch_wire) : (void)printf("null");
        printf(", \"dispatch_worst_bytes\": %llu, \"combine_worst_bytes\": %llu, \"dispatch_uniform_bytes\": %.1f, "
               "\"combine_uniform_bytes\": %.1f, \"overlap\": %s},\n", (unsigned long long)pr.dispatch_worst_bytes,
               (unsigned long long)pr.combine_worst_bytes, pr.dispatch_uniform_bytes, pr.combine_uniform_bytes,
               cfg.parallel.ep_overlap ? "true" : "false");
        // the fused experts' layout and their part of the memory (the metrics' mem_expert_* fields)
        printf(" \"experts\": {\"expert_parallel_size\": %d, \"expert_fully_shard_parallel_size\": %d, "
               "\"expert_data_parallel_size\": %d, \"mem_expert_shard_bytes\": %llu, \"mem_expert_unit_bytes\": %llu, "
               "\"mem_expert_grad_bytes\": %llu}}\n", EP, EF, ED, (unsigned long long)pr.expert_shard_bytes,
               (unsigned long long)pr.expert_unit_bytes, (unsigned long long)pr.expert_grad_bytes);
    } else {
        printf("%s: recipe %s, %d of %d modules converted\n", cfg.source, recipe, converted, n);
        for (int i = 0; i < n; i++) {
            char why[512];
            mx_decision_explain(plan, &mods[i], &sel.decisions[i], why, sizeof why);
            printf("  %-44s %s\n", mods[i].fqn, why);
        }
        print_operands(plan, false);
        print_plan_warnings(&sel);
        printf("layout on %d rank%s: %d replica%s x FSDP groups of %d rank%s (parallel.data_parallel_size x "
               "parallel.fully_shard_parallel_size)\n", ranks, ranks == 1 ? "" : "s", D, D == 1 ? "" : "s", F,
               F == 1 ? "" : "s");
        if (EP > 1) {
            printf("experts on %d ranks: %d replica%s x expert shard groups of %d x EP groups of %d, %d experts each "
                   "(parallel.expert_data_parallel_size x expert_fully_shard_parallel_size x expert_parallel_size)\n",
                   ranks, ED, ED == 1 ? "" : "s", EF, EP, cfg.model.num_experts / EP);
            int moe = 0, ep_layers = 0;
            for (int l = 0; l < cfg.model.num_hidden_layers; l++) moe += mx_model_layer_is_moe(&cfg.model, l);
            for (int i = 0; i < n; i++) ep_layers += mods[i].kind == MX_MODULE_EXPERTS && ep_selects(&cfg, mods[i].fqn);
            printf("expert parallelism: EP groups of %d ranks, %d experts each, in %d of %d MoE layers "
                   "(parallel.ep_plan.apply_modules); tokens dispatched in %s (parallel.ep_plan.dispatch_dtype: %s); "
                   "%s (parallel.ep_plan.overlap)\n",
                   EP, cfg.model.num_experts / EP, ep_layers, moe, pr.dispatch_wire ? pr.dispatch_wire : "-",
                   ep_dtype_name(cfg.parallel.ep_dispatch_dtype),
                   cfg.parallel.ep_overlap ? "exchanges beside compute" : "each exchange waited for where it starts");
            printf("token exchange per step and rank (routing decides it): dispatched at most %.3f MiB (worst case: every "
                   "routed row leaves its rank), %.3f MiB under uniform routing ((EP - 1) / EP of them); combined at most "
                   "%.3f MiB, %.3f MiB under uniform routing\n", mib(pr.dispatch_worst_bytes),
                   pr.dispatch_uniform_bytes / 1048576.0, mib(pr.combine_worst_bytes), pr.combine_uniform_bytes / 1048576.0);
        }
        if (ag[0])
            printf("all-gather of the converted weights per step and rank: bf16 %.3f MiB, on-demand %.3f MiB (%.4fx%s), "
                   "all %.3f MiB (%.4fx)\n", ag[0] / 1048576.0, ag[1] / 1048576.0, (double)ag[1] / (double)ag[0],
                   cfg.features.recompute && cfg.features.recompute_granularity == MX_RECOMPUTE_FULL
                       ? "; with features.recompute: both planes in a recomputed block's backward" : "",
                   ag[2] / 1048576.0, (double)ag[2] / (double)ag[0]);
        printf("communication per step and rank: ");
        print_bytes(plan, pr.ag_param_bytes, pr.ag_mx_data_bytes, pr.ag_mx_scale_bytes, pr.rs_bytes, pr.ar_bytes,
                    pr.gather_mode, D);
        printf("\n");
        printf("memory per rank: master weights %.1f MiB, gradients %.1f MiB, optimizer %.1f MiB, MX shards %.1f MiB, "
               "gather buffers %.1f MiB, activations %.1f MiB, ", mib(pr.master_bytes), mib(pr.grad_bytes),
               mib(pr.optimizer_bytes), mib(pr.mx_shard_bytes), mib(pr.gathered_bytes), mib(pr.activation_bytes));
        if (pr.scaling_state_bytes) printf("delayed scaling state %.1f MiB, ", mib(pr.scaling_state_bytes));
        printf("product workspace about %.1f MiB, the process itself %.1f MiB; about %.2f GiB in all "
               "(training.memory_check compares it with the host's available memory)\n",
               mib(pr.workspace_bytes), mib(pr.process_bytes), mx_predicted_bytes(&pr) / 1073741824.0);
        print_against_bf16(&cfg, &layout);
        if (pr.expert_shard_bytes)
            printf("of which the experts': shards %.2f MiB (master, gradients, optimizer), gathered %.2f MiB per block, "
                   "unsharded gradients %.2f MiB per block\n", mib(pr.expert_shard_bytes), mib(pr.expert_unit_bytes),
                   mib(pr.expert_grad_bytes));
        print_settings(&cfg, false);
    }
    mx_selection_free(&sel);
    mx_model_modules_free(mods, n);
    mx_config_free(&cfg);
    return 0;
}
