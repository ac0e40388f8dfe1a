/* Internal: a run's save directory (training.save). At the start of a run it is made,
 * locked for the run's lifetime and checked writable, before the first step; a run that does
 * not resume is refused a directory that holds checkpoints already.
 *
 * The lock is a file, SAVE/.mxtrain.lock, that rank 0 of the run creates (O_CREAT | O_EXCL)
 * and holds locked (flock) until the run ends. It names the host, the pid and the run's id:
 *   host vm pid 4242 run 1a2b3c4d5e6f7
 * A lock file left by a run that ended without removing it (killed) is stale and taken over:
 * when its flock can be taken (the file system's locks say no process holds it), or, where
 * the file system has no locks, when it names this host and a pid that is not alive. A
 * lock held by a live run refuses the start with one line naming its holder. */
#ifndef MXI_SAVE_DIR_H
#define MXI_SAVE_DIR_H

#include <stdbool.h>

#include "core/diag.h"
#include "distributed/comm.h"

#define MXI_SAVE_LOCK_NAME ".mxtrain.lock"

typedef struct {
    bool held;          // rank 0 holds the lock (fd, path); the others never do
    bool made;          // rank 0 made the directory: removed at close if the run left it empty
    int fd;
    char path[4096];    // SAVE/.mxtrain.lock
    char run_id[16];    // 13 hex digits, the same on every rank: this run's staging names
} mxi_save_dir;

/* What the run does with the checkpoints already in the directory. */
typedef enum {
    MXI_SAVE_FRESH,     // starts afresh (no training.load): the directory must hold none
    MXI_SAVE_RESUME,    // resumes (training.load): they are the run's own
} mxi_save_start;

/* Collective, at the start of a run: rank 0 makes SAVE (and its parents), takes the lock,
 * checks that it can create files and directories in it, and (MXI_SAVE_FRESH) that it
 * holds no checkpoint (an iter_N directory or latest_checkpointed_iteration.txt); every rank
 * receives the run id. Errors (every rank returns one; rank 0's names the cause):
 *   "training.save: cannot create the directory 'SAVE' (REASON)"
 *   "training.save: cannot write in 'SAVE' (REASON)"
 *   "training.save: 'SAVE' is in use by another run (host H, pid P, run R; lock file L); ..."
 *   "training.save: 'SAVE' already holds checkpoints (iter_0000003) and training.load is not
 *    set; ..."
 * sd is closed (nothing held) on error. */
int mxi_save_dir_open(const char *save, mxi_save_start start, mxi_comm *comm, mxi_save_dir *sd, mx_diag *diag);

/* Release the lock (rank 0: the file is removed, then unlocked, and a directory
 * mxi_save_dir_open made that is left empty is removed); nothing on other ranks or when
 * nothing is held. Safe to call twice. */
void mxi_save_dir_close(mxi_save_dir *sd);

/* Release the lock this process holds, if any: for a job about to be ended by an error
 * (mx_job_abort), whose trainer is not freed. A job killed without it leaves a stale lock,
 * which the next run takes over. */
void mxi_save_dir_abandon(void);

#endif
