/* Internal: a run's own output files, training.metrics_path and training.plot_path. Both are
 * checked at start, before step 1, under the rules of every output (io_internal.h's
 * mxi_output_target: a device, FIFO or socket refused, a symbolic link followed) and against
 * the run's inputs: neither may be the config, the model's config.json, a data file (train
 * or validation) or the other one. */
#ifndef MXI_TRAIN_OUTPUTS_H
#define MXI_TRAIN_OUTPUTS_H

#include <stdio.h>

#include "core/diag.h"
#include "mxtrain/config.h"
#include "mxtrain/tokens.h"

/* Rank 0, at start: checks both paths, makes their directories, and opens metrics_path
 * (*metrics; NULL when the config has none), continued when the run resumes (training.load)
 * and started afresh otherwise. loaders: the run's n_loaders data loaders, whose shards are
 * inputs. Errors name the key: "training.metrics_path: PATH: is a FIFO (allowed: ...)",
 * "training.plot_path: 'PATH' is the run's config file (allowed: a path of its own)". */
int mxi_run_outputs_open(const mx_config *cfg, const mx_loader *const *loaders, int n_loaders, FILE **metrics,
                         mx_diag *diag);

#endif
