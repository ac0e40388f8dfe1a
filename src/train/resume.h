/* Internal: what a resumed run is held to (docs/distributed.md#what-resuming-checks). A
 * checkpoint records its model (config.json), and in trainer_state.json's "run" the data
 * files with their sizes, whether the rows were shuffled, and the settings a run may change;
 * on load the model keys and the data must match, and each changed setting is a note. */
#ifndef MXI_RESUME_H
#define MXI_RESUME_H

#include <stddef.h>

#include "mxtrain/config.h"
#include "mxtrain/tokens.h"
#include "train/checkpoint.h"

enum { MXI_RESUME_MAX_NOTES = 10 };

/* The note lines of a resume ("resuming with training.lr 0.0003 (checkpoint: 0.001)"). */
typedef struct {
    char lines[MXI_RESUME_MAX_NOTES][320];
    int n;
    int more;   // changes past the last line
} mxi_resume_notes;

/* Add a line (past MXI_RESUME_MAX_NOTES: counted in more). */
void mxi_resume_note(mxi_resume_notes *notes, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The run's record for trainer_state.json's "run": a JSON object's text (malloc'ed): the
 * shard files of loader (paths as the run names them, sizes in bytes), data.shuffle, the
 * settings that may change (as mx_config_format_value writes them) and the recipe. */
int mxi_resume_record(const mx_config *config, const mx_loader *loader, char **out, mx_diag *diag);

/* Before any weight is read: the checkpoint dir's config.json against config's model.
 * MX_ECONFIG naming every architecture key that differs, on one line; a key that may differ
 * (max_position_embeddings, output_router_logits, router_aux_loss_coef) is a note. */
int mxi_resume_check_model(const mx_config *config, const char *dir, mxi_resume_notes *notes, mx_diag *diag);

/* Before the data position is set: the order of the rows. Another data.shuffle than the
 * checkpoint's, or with shuffle another training.seed, is MX_ECONFIG. */
int mxi_resume_check_order(const mx_config *config, const char *dir, const mxi_train_state *state, mx_diag *diag);

/* Once the data is open at its position: dir's trainer_state.json ("run", and state's seed
 * and world) against this run of world ranks. Other data files, or files of other sizes, are
 * MX_ECONFIG (one line naming each difference); each changed setting is a note, as is a
 * checkpoint without "run" (an older mxtrain's: nothing is compared). */
int mxi_resume_check_run(const mx_config *config, const char *dir, const mxi_train_state *state,
                         const mx_loader *loader, int world, mxi_resume_notes *notes, mx_diag *diag);

#endif
