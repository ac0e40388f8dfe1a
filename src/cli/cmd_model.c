/* mxtrain train / init / grads / plan: the commands that take a training config. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "mxtrain/config.h"
#include "mxtrain/model.h"
#include "mxtrain/tokens.h"
#include "mxtrain/train.h"

/* Options of a command: positional CONFIG plus --name VALUE pairs and --flags. */
typedef struct {
    const char *config;
    const char *values[4];    // by option index
    bool flags[4];
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

static int load_config(const char *cmd, const char *path, mx_config *cfg) {
    mx_diag diag = {{0}};
    int rc = mx_config_load(path, cfg, &diag);
    if (rc) fprintf(stderr, "mxtrain %s: %s\n", cmd, diag.msg);
    return rc;
}

static void format_duration(char *buf, size_t n, double s) {
    if (s < 60) snprintf(buf, n, "%.0fs", s);
    else if (s < 3600) snprintf(buf, n, "%dm%02ds", (int)(s / 60), (int)s % 60);
    else snprintf(buf, n, "%dh%02dm", (int)(s / 3600), (int)(s / 60) % 60);
}

/* ---- train ---- */

static const char train_usage[] =
    "usage: mxtrain train CONFIG\n"
    "\n"
    "Trains the model of CONFIG (a YAML file: see docs/config.md) on its data, printing a\n"
    "progress line every training.log_interval steps and a summary at the end. Metrics go to\n"
    "training.metrics_path (JSON lines) when set; the final weights to training.save.\n";

int cli_train(int argc, char **argv) {
    cmd_args args;
    int code;
    if (!parse_args(argc, argv, train_usage, NULL, 0, &args, &code)) return code;
    mx_config cfg;
    if (load_config("train", args.config, &cfg)) return 1;
    mx_trainer *t = NULL;
    mx_diag diag = {{0}};
    int rc = mx_trainer_create(&cfg, &t, &diag);
    if (rc) {
        fprintf(stderr, "mxtrain train: %s\n", diag.msg);
        mx_config_free(&cfg);
        return 1;
    }
    const mx_training_config *tc = &cfg.training;
    printf("mxtrain train: %s, %lld parameters, micro-batch %d x %d tokens, %d accumulation steps, %d steps\n",
           cfg.source, (long long)mx_model_num_params(mx_trainer_model(t)), tc->micro_batch_size,
           cfg.data.seq_length, tc->gradient_accumulation_steps, tc->train_iters);
    if (tc->quantization_plan.enabled) {
        char recipe[160];
        mx_recipe_format(&tc->quantization_plan.recipe, recipe, sizeof recipe);
        size_t unsaved, act = mx_model_activation_bytes(mx_trainer_model(t), &unsaved);
        printf("quantization: %s, %d modules converted (mxtrain plan %s lists them); activations %.1f MiB, "
               "%.1f MiB if converted layers kept fp32 inputs\n", recipe, mx_model_converted_modules(mx_trainer_model(t)),
               args.config, act / 1048576.0, unsaved / 1048576.0);
    }
    mx_step_metrics mt = {0};
    double first_loss = 0, tokens = 0, seconds = 0;
    for (int s = 0; s < tc->train_iters; s++) {
        rc = mx_trainer_step(t, &mt, &diag);
        if (rc) {
            fprintf(stderr, "mxtrain train: %s\n", diag.msg);
            break;
        }
        if (s == 0) first_loss = mt.loss;
        tokens += (double)mt.tokens, seconds += mt.step_seconds;
        if (mt.step % tc->log_interval == 0 || mt.step == tc->train_iters) {
            char eta[32];
            format_duration(eta, sizeof eta, seconds / mt.step * (tc->train_iters - mt.step));
            printf("step %5lld/%lld | loss %.4f | lr %.3e | grad norm %7.3f | %8.0f tok/s | ETA %s\n",
                   (long long)mt.step, (long long)tc->train_iters, mt.loss, mt.lr, mt.grad_norm, mt.tokens_per_s, eta);
            fflush(stdout);
        }
    }
    if (!rc) {
        char took[32];
        format_duration(took, sizeof took, mt.elapsed_seconds);
        printf("done: %lld steps in %s | loss %.4f -> %.4f | %.0f tok/s on average\n", (long long)mt.step, took,
               first_loss, mt.loss, tokens / seconds);
        rc = mx_trainer_save(t, &diag);
        if (rc) fprintf(stderr, "mxtrain train: %s\n", diag.msg);
        else if (tc->save) printf("saved %s/model.safetensors\n", tc->save);
    }
    mx_trainer_free(t);
    mx_config_free(&cfg);
    return rc ? 1 : 0;
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
    mx_model_options opt = {.batch = batch, .seq = seq, .bf16 = cfg->parallel.param_dtype == MX_DTYPE_BF16, .plan = &cfg->training.quantization_plan};
    if (mx_model_create(&cfg->model, &opt, &m, &diag)) fprintf(stderr, "mxtrain %s: %s\n", cmd, diag.msg);
    return m;
}

int cli_init(int argc, char **argv) {
    static const cmd_option opts[] = {{"--out", true, true}};
    cmd_args args;
    int code;
    if (!parse_args(argc, argv, init_usage, opts, 1, &args, &code)) return code;
    mx_config cfg;
    if (load_config("init", args.config, &cfg)) return 1;
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
    "`grad.<name>` for every parameter as fp32 safetensors.\n";

int cli_grads(int argc, char **argv) {
    static const cmd_option opts[] = {{"--weights", true, true}, {"--tokens", true, true}, {"--out", true, true}};
    cmd_args args;
    int code;
    if (!parse_args(argc, argv, grads_usage, opts, 3, &args, &code)) return code;
    mx_config cfg;
    if (load_config("grads", args.config, &cfg)) return 1;
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
    "usage: mxtrain plan CONFIG [--json]\n"
    "\n"
    "Shows, for every module of CONFIG's model, whether the quantization plan converts it and\n"
    "why (which pattern applied it, which excluded it), and warns about patterns that select\n"
    "nothing. --json prints the same as one JSON object.\n";

static void json_string(const char *s) {
    putchar('"');
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') printf("\\%c", *s);
        else if ((unsigned char)*s < 0x20) printf("\\u%04x", *s);
        else putchar(*s);
    }
    putchar('"');
}

int cli_plan(int argc, char **argv) {
    static const cmd_option opts[] = {{"--json", false, false}};
    cmd_args args;
    int code;
    if (!parse_args(argc, argv, plan_usage, opts, 1, &args, &code)) return code;
    bool json = args.flags[0];
    mx_config cfg;
    if (load_config("plan", args.config, &cfg)) return 1;
    const mx_plan *plan = &cfg.training.quantization_plan;
    mx_module *mods = NULL;
    int n = 0;
    mx_selection sel;
    if (mx_model_modules(&cfg.model, &mods, &n) || mx_plan_select(plan, mods, n, &sel)) {
        fprintf(stderr, "mxtrain plan: out of memory\n");
        mx_model_modules_free(mods, n);
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
        printf(", \"recipe\": ");
        plan->enabled ? json_string(recipe) : (void)printf("null");
        printf(", \"converted\": %d, \"modules\": [", converted);
        for (int i = 0; i < n; i++) {
            char why[512];
            mx_decision_explain(plan, &mods[i], &sel.decisions[i], why, sizeof why);
            printf("%s\n  {\"module\": ", i ? "," : "");
            json_string(mods[i].fqn);
            printf(", \"converted\": %s, \"converter\": ", sel.decisions[i].converted ? "true" : "false");
            sel.decisions[i].converted ? json_string(mx_converter_name(sel.decisions[i].converter)) : (void)printf("null");
            printf(", \"why\": ");
            json_string(why);
            printf("}");
        }
        printf("\n], \"warnings\": [");
        for (int i = 0; i < sel.n_warnings; i++) {
            printf("%s", i ? ", " : "");
            json_string(sel.warnings[i]);
        }
        printf("]}\n");
    } else {
        printf("%s: recipe %s, %d of %d modules converted\n", cfg.source, recipe, converted, n);
        for (int i = 0; i < n; i++) {
            char why[512];
            mx_decision_explain(plan, &mods[i], &sel.decisions[i], why, sizeof why);
            printf("  %-44s %s\n", mods[i].fqn, why);
        }
        for (int i = 0; i < sel.n_warnings; i++) fprintf(stderr, "warning: %s\n", sel.warnings[i]);
    }
    mx_selection_free(&sel);
    mx_model_modules_free(mods, n);
    mx_config_free(&cfg);
    return 0;
}
