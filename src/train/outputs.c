/* A run's own output files, checked before step 1 (see outputs.h). */
#include "train/outputs.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/file.h"
#include "io/io_internal.h"

/* diag's message after "KEY: ". */
static int with_key(mx_diag *diag, int rc, const char *key) {
    char why[sizeof diag->msg];
    snprintf(why, sizeof why, "%s", diag ? diag->msg : "");
    return mxi_diag(diag, rc, "%s: %s", key, why);
}

/* Which of the run's inputs path is ("config file", "data file 'X'", ...), or NULL. */
static const char *input_named(const mx_config *cfg, const mx_loader *const *loaders, int n_loaders, const char *path,
                               char *buf, size_t size) {
    if (cfg->source && mxi_same_file(path, cfg->source)) return "config file";
    if (cfg->hf_config_path && mxi_same_file(path, cfg->hf_config_path)) return "model's config.json";
    for (int i = 0; i < n_loaders; i++)
        for (int s = 0; loaders[i] && s < mx_loader_shard_count(loaders[i]); s++)
            if (mxi_same_file(path, mx_loader_shard_path(loaders[i], s))) {
                snprintf(buf, size, "data file '%s'", mx_loader_shard_path(loaders[i], s));
                return buf;
            }
    return NULL;
}

/* key's path under the rules of every output, and none of the run's inputs nor other (the
 * run's other output, or NULL). */
static int check_output(const mx_config *cfg, const mx_loader *const *loaders, int n_loaders, const char *key,
                        const char *path, const char *other_key, const char *other, mx_diag *diag) {
    char buf[4200];
    const char *input = input_named(cfg, loaders, n_loaders, path, buf, sizeof buf);
    if (!input && other && mxi_same_file(path, other)) input = other_key;
    if (input) return mxi_diag(diag, MX_ECONFIG, "%s: '%s' is the run's %s (allowed: a path of its own)", key, path, input);
    char *target;
    int rc = mxi_output_target(path, &target, diag);
    if (rc) return with_key(diag, rc, key);
    free(target);
    // its directory is made now, as a checkpoint's is (checkpoints/RUN/metrics.jsonl before
    // the first save): one that cannot be made fails before step 1
    if (mxi_make_parent_dirs(path) != 0)
        return mxi_diag(diag, MX_EIO, "%s: cannot create the directory of '%s' (%s)", key, path, strerror(errno));
    return 0;
}

int mxi_run_outputs_open(const mx_config *cfg, const mx_loader *const *loaders, int n_loaders, FILE **metrics,
                         mx_diag *diag) {
    *metrics = NULL;
    const mx_training_config *tc = &cfg->training;
    int rc = 0;
    // the plot replaces its file after the last step: checked first, before the metrics file is made
    if (tc->plot_path)
        rc = check_output(cfg, loaders, n_loaders, "training.plot_path", tc->plot_path, "training.metrics_path",
                          tc->metrics_path, diag);
    if (!rc && tc->metrics_path)
        rc = check_output(cfg, loaders, n_loaders, "training.metrics_path", tc->metrics_path, "training.plot_path",
                          tc->plot_path, diag);
    // a resumed run continues the log; a new run starts it
    if (!rc && tc->metrics_path &&
        (rc = mxi_output_open(tc->metrics_path, tc->load ? MXI_OUTPUT_APPEND : MXI_OUTPUT_TRUNCATE, metrics, diag)))
        rc = with_key(diag, rc, "training.metrics_path");
    return rc;
}
