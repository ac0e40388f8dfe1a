/* Internal: what a config means for a run, shared by the planner (mx_parallel_layout,
 * mx_predict_step) and the trainer, so that a plan predicts what a run does. */
#ifndef MXI_PLANNER_H
#define MXI_PLANNER_H

#include "distributed/fsdp.h"
#include "mxtrain/config.h"
#include "mxtrain/model.h"
#include "mxtrain/train.h"

/* The engine's options for a config on a model and layout. */
mxi_fsdp_options mxi_train_fsdp_options(const mx_config *cfg, mx_model *model, const mx_layout *layout);
/* The gather mode those options make, as mx_run_info.gather_mode names it. */
const char *mxi_train_gather_mode(const mx_config *cfg, const mxi_fsdp_options *fo);
/* The model a run of cfg trains on this layout, for micro-batches of B rows of T tokens. */
/* data.reset_attention_mask, reset_position_ids, eod_mask_loss and the EOD token they use
 * (data.eod_token_id, else mxtrain prepare's EOT). */
mx_model_documents mxi_train_documents(const mx_config *cfg);
mx_model_options mxi_train_model_options(const mx_config *cfg, const mx_layout *layout, int B, int T);

#endif
