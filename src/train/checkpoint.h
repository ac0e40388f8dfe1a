/* Internal: weights and checkpoints of a sharded model (see mx_trainer_save in train.h). */
#ifndef MXI_CHECKPOINT_H
#define MXI_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "distributed/comm.h"
#include "distributed/fsdp.h"
#include "mxtrain/model.h"
#include "mxtrain/tokens.h"
#include "train/moments.h"

typedef struct {
    int64_t step;          // optimizer steps done
    mx_loader_pos data;    // where the next batch comes from
    uint64_t seed;         // training.seed of the run that wrote it
    int world;             // ranks of the run that wrote it
    int data_parallel_size;// its replicas (HSDP; FSDP groups of world / data_parallel_size ranks); 0: not recorded
    // its experts' layout under EP (EDP x EFSDP x EP = world); 0: not recorded, or no EP
    int expert_parallel_size, expert_fully_shard_parallel_size, expert_data_parallel_size;
    const char *run;       // what resume compares (resume.h): a JSON object's text, saved as "run"; NULL: none
    // tokenizer files copied beside config.json (tokenizer_files.h), named by tokenizer_key; NULL: none
    const char *tokenizer, *tokenizer_key;
} mxi_train_state;

/* Each rank reads its rows of every parameter from a safetensors file or a directory with
 * model.safetensors or a sharded Hugging Face checkpoint (model.safetensors.index.json),
 * one tensor at a time. The same checks as mx_model_load. */
int mxi_load_sharded_weights(const char *path, mx_model *model, mxi_fsdp *fsdp, mx_diag *diag);

/* Each rank's rows of HF initialisation for seed, one tensor at a time. */
void mxi_init_sharded_weights(mx_model *model, mxi_fsdp *fsdp, uint64_t seed, float *scratch /* largest tensor */);

/* At the start of a run, before loading and with the save directory locked (save_dir.h):
 * remove what killed saves left in it (.tmp_iter_N.RUN directories, temporary latest files;
 * a moved-aside .old_iter_N goes back when its iter_N is missing, else is removed)
 * (collective). */
int mxi_checkpoint_clean(const char *save, mxi_comm *comm, mx_diag *diag);

/* Remove a file, or a directory and the files in it (one level: what a save writes).
 * 0, or -1 with errno. */
int mxi_remove_tree(const char *path);

/* Write n bytes to path (created or truncated) and fsync it. MX_EIO with the system's
 * reason: "cannot write 'PATH' (No space left on device)". */
int mxi_write_file(const char *path, const void *data, size_t n, mx_diag *diag);

/* Copy file from (what it is, for errors; at most max bytes) to to, with mxi_write_file. A
 * failure to read it is prefixed "key: " when key is not NULL. */
int mxi_copy_file(const char *from, const char *to, const char *what, uint64_t max, const char *key, mx_diag *diag);

/* Write n bytes at byte offset at of the open file fd (named path in errors), whatever
 * pwrite's partial writes. MX_EIO with the system's reason. */
int mxi_pwrite_all(int fd, const void *data, size_t n, uint64_t at, const char *path, mx_diag *diag);

/* Whether every rank sees the files rank 0 writes in dir (one directory on a shared file
 * system, not each host's own): rank 0 writes a random token there, every rank reads it
 * back (collective; *shared is false when any rank does not find it). A rank that finds it
 * must be able to open it for writing, as it will the checkpoint's files: when rank 0
 * cannot write the token, or a rank that sees it cannot write it, every rank returns an
 * error naming the reason. */
int mxi_checkpoint_shared(const char *dir, mxi_comm *comm, bool *shared, mx_diag *diag);

/* Write SAVE/iter_NNNNNNN (collective), staged in SAVE/.tmp_iter_NNNNNNN.RUN_ID (run_id:
 * the run's, from mxi_save_dir_open, so that no two runs share a staging name): config.json
 * of hf (the model's hyper-parameters), model.safetensors, optimizer.safetensors,
 * trainer_state.json (with state->run), and checksums.json (each tensor's CRC-32, from the
 * pieces the ranks wrote). parallel (for ranks that
 * share SAVE, mxi_checkpoint_shared): rank 0 lays the safetensors files out and every rank
 * writes its own rows into them, so no rank holds more than its shards; else rank 0 lays
 * them out and writes every tensor's weights and moments as it gathers them, one at a time
 * (holding one whole tensor besides its shards). The files are the same, byte for byte.
 * keep_latest > 0 then removes the checkpoints of earlier steps but the keep_latest - 1
 * newest (training.keep_latest_k); 0 keeps all. dir_out receives its path. */
int mxi_checkpoint_save(const char *save, const char *run_id, const mx_model_config *hf, mx_model *model,
                        mxi_fsdp *fsdp, const mxi_moment *moments /* (2) */, mxi_comm *comm, const mxi_train_state *state,
                        bool parallel, int keep_latest, char *dir_out, size_t dir_size, mx_diag *diag);

/* The checkpoint directory `load` stands for: itself when it holds trainer_state.json, else
 * the iter_N its latest_checkpointed_iteration.txt names (a step number: 1 to 18 digits,
 * white space around them; anything else is an error naming the file), else its newest
 * iter_N holding a trainer_state.json. Errors name `what` ("training.load"). */
int mxi_checkpoint_resolve(const char *load, const char *what, char *dir, size_t dir_size, mx_diag *diag);

/* Resolve `load` (a SAVE directory with latest_checkpointed_iteration.txt, or one
 * iter_NNNNNNN directory) into dir, and read its trainer_state.json into state: a step that
 * contradicts the directory's name iter_N is an error. */
int mxi_checkpoint_read_state(const char *load, mxi_train_state *state, char *dir, size_t dir_size, mx_diag *diag);

/* Read the checkpoint dir's weights and moments into this rank's shards. Values must be
 * finite, and the second moments (exp_avg_sq) not negative. FP8 moments take the scales
 * saved for this rank (world rank of world) where their values are codes of them
 * (ckpt_scales.h). */
int mxi_checkpoint_load_tensors(const char *dir, mx_model *model, mxi_fsdp *fsdp, mxi_moment *moments /* (2) */,
                                int rank, int world, mx_diag *diag);

#endif
