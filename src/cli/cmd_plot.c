/* mxtrain plot: loss curves of one or more runs' metrics files as a PNG (through gnuplot). */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "report/plot.h"

static const char plot_usage[] =
    "usage: mxtrain plot METRICS.jsonl [METRICS.jsonl ...] --out PNG [--label NAME ...] [--title TEXT]\n"
    "                    [--quant-stats[=FIELD] [--role ROLE]]\n"
    "\n"
    "Draws the train loss and the validation loss against the step of each metrics file\n"
    "(training.metrics_path of a run), the runs overlaid in one picture, into the PNG file\n"
    "PNG. Needs gnuplot (Debian's gnuplot-nox; scripts/setup installs it).\n"
    "\n"
    "  --out PNG      the picture to write (replaced only once it is complete)\n"
    "  --label NAME   the name of a run in the key: the first --label names the first file,\n"
    "                 and so on; a file without one is named by its file name without\n"
    "                 directory and extension (runs/bf16.jsonl: bf16)\n"
    "  --title TEXT   a title above the plot (default: none)\n"
    "  --quant-stats[=FIELD]  instead of the loss, FIELD of the quantization statistics\n"
    "                 records (training.quant_stats_interval) per tensor and role: sqnr_db\n"
    "                 (the default), mse, underflows_pct, overflows_pct, scale_inv_min,\n"
    "                 scale_inv_max, numel, nonfinite, underflows, overflows\n"
    "  --role ROLE    with --quant-stats, that role only: fprop_x, fprop_w, dgrad_dy,\n"
    "                 dgrad_w, wgrad_dy, wgrad_x\n";

static const char *const qs_fields[] = {"sqnr_db", "mse", "underflows_pct", "overflows_pct", "scale_inv_min",
                                        "scale_inv_max", "numel", "nonfinite", "underflows", "overflows", NULL};
static const char *const qs_roles[] = {"fprop_x", "fprop_w", "dgrad_dy", "dgrad_w", "wgrad_dy", "wgrad_x", NULL};

static bool one_of(const char *v, const char *const *list) {
    for (int i = 0; list[i]; i++)
        if (strcmp(v, list[i]) == 0) return true;
    return false;
}

static int usage_error(const char *fmt, const char *arg) {
    fputs("mxtrain plot: ", stderr);
    fprintf(stderr, fmt, arg);
    fputc('\n', stderr);
    fputs(plot_usage, stderr);
    return 2;
}

int cli_plot(int argc, char **argv) {
    const char **files = calloc((size_t)argc + 1, sizeof *files);
    const char **labels = calloc((size_t)argc + 1, sizeof *labels);
    if (!files || !labels) {
        free(files);
        free(labels);
        fprintf(stderr, "mxtrain plot: out of memory (%zu bytes)\n", 2 * ((size_t)argc + 1) * sizeof *files);
        return 1;
    }
    int n_files = 0, n_labels = 0, rc = 0;
    const char *out = NULL, *title = NULL, *field = NULL, *role = NULL;
    bool options_done = false;
    for (int i = 1; i < argc && rc == 0; i++) {
        const char *a = argv[i];
        if (options_done || a[0] != '-') {
            files[n_files++] = a;
        } else if (strcmp(a, "--") == 0) {
            options_done = true;
        } else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            fputs(plot_usage, stdout);
            free(files);
            free(labels);
            return 0;
        } else if (strcmp(a, "--quant-stats") == 0 || strncmp(a, "--quant-stats=", 14) == 0) {
            field = a[13] == '=' ? a + 14 : "sqnr_db";
            if (!one_of(field, qs_fields))
                rc = usage_error("--quant-stats: '%s' is not a field of the statistics records (allowed: sqnr_db, mse, "
                                 "underflows_pct, overflows_pct, scale_inv_min, scale_inv_max, numel, nonfinite, "
                                 "underflows, overflows)", field);
        } else if (strcmp(a, "--role") == 0) {
            if (i + 1 >= argc) {
                rc = usage_error("%s needs a value", a);
                break;
            }
            role = argv[++i];
            if (!one_of(role, qs_roles))
                rc = usage_error("--role: '%s' is not a role (allowed: fprop_x, fprop_w, dgrad_dy, dgrad_w, wgrad_dy, "
                                 "wgrad_x)", role);
        } else if (strcmp(a, "--out") == 0 || strcmp(a, "--label") == 0 || strcmp(a, "--title") == 0) {
            if (i + 1 >= argc) {
                rc = usage_error("%s needs a value", a);
                break;
            }
            const char *v = argv[++i];
            if (strcmp(a, "--out") == 0) {
                if (out) rc = usage_error("--out given twice (allowed: %s)", "one PNG path");
                else if (!*v) rc = usage_error("--out: '%s' is not allowed (allowed: a PNG file path)", v);
                out = v;
            } else if (strcmp(a, "--label") == 0) {
                labels[n_labels++] = v;
            } else {
                title = v;
            }
        } else {
            rc = usage_error("unknown option '%s'", a);
        }
    }
    if (rc == 0 && n_files == 0) rc = usage_error("%s", "missing METRICS.jsonl (at least one metrics file)");
    if (rc == 0 && !out) rc = usage_error("%s", "missing --out PNG");
    if (rc == 0 && role && !field) rc = usage_error("%s", "--role needs --quant-stats");
    if (rc == 0 && n_labels > n_files) {
        fprintf(stderr, "mxtrain plot: %d --label options for %d metrics files (allowed: at most one per file)\n%s",
                n_labels, n_files, plot_usage);
        rc = 2;
    }
    if (rc == 0) {
        mx_diag diag = {{0}};
        int prc = field ? mxi_plot_quant_stats(files, labels, n_files, field, role, out, title, &diag)
                        : mxi_plot_metrics(files, labels, n_files, out, title, &diag);
        if (prc < 0) {
            fprintf(stderr, "mxtrain plot: %s\n", diag.msg);
            rc = 1;
        } else {
            printf("wrote %s (%d run%s)\n", out, n_files, n_files == 1 ? "" : "s");
        }
    }
    free(files);
    free(labels);
    return rc;
}
