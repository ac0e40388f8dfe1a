/* Internal: opening the files a user names (configs, weights, token shards, texts).
 *
 * Only a regular file is opened, and never by waiting: a FIFO given as a config would block
 * open() until some writer appeared, /dev/zero would be read until memory ran out, and a
 * directory cannot be read at all. Files that are read whole have a size limit. */
#ifndef MXI_FILE_H
#define MXI_FILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "mxtrain/error.h"

/* Size limits of the files read whole (bytes). */
#define MXI_MAX_CONFIG_BYTES (16ull << 20)   /* YAML configs and plans, Hugging Face config.json */
#define MXI_MAX_INDEX_BYTES (64ull << 20)    /* model.safetensors.index.json */
#define MXI_MAX_STATE_BYTES (1ull << 20)     /* a checkpoint's trainer_state.json and latest file */
#define MXI_MAX_TEXT_BYTES (1ull << 30)      /* an input text of `mxtrain prepare` */

/* Open path read-only if it is a regular file of at most max_bytes bytes (0: any size).
 * Returns 0 with *fd and *size (fstat's), or MX_EIO with one of
 *   "PATH: cannot open (REASON)"                        (open failed: errno's reason)
 *   "PATH: is a directory (allowed: ALLOWED)"
 *   "PATH: is a FIFO, not a regular file (allowed: ALLOWED)"   (likewise a character or
 *                                                         block device, a socket)
 *   "PATH: is N bytes (allowed: ALLOWED of at most M MiB)"
 * in diag; ALLOWED names what the caller reads ("a YAML config file"); with allowed NULL the
 * parenthesis is left out. */
int mxi_open_input(const char *path, const char *allowed, uint64_t max_bytes, int *fd, uint64_t *size,
                   mx_diag *diag);

/* The whole of such a file in a malloc'ed buffer (*data, NUL-terminated; *len bytes without
 * the NUL; free with free()). Reads to the end, so a file whose size fstat does not report
 * (in /proc) is read too, and one that grows past max_bytes is refused. Returns 0, the
 * errors above, "PATH: cannot read (REASON)" (MX_EIO), or MX_ENOMEM. */
int mxi_read_input(const char *path, const char *allowed, uint64_t max_bytes, char **data, size_t *len,
                   mx_diag *diag);

/* mkdir -p: path and every missing parent, as directories. 0, or -1 with errno (ENOTDIR
 * when a part exists and is not a directory). */
int mxi_make_dirs(const char *path);
/* mkdir -p of the directory part of a file's path (nothing for a bare file name). */
int mxi_make_parent_dirs(const char *file);

/* Whether paths a and b name one file (the same device and inode, through symbolic links),
 * or, where either does not exist, are the same string: an output that is an input. */
bool mxi_same_file(const char *a, const char *b);

#endif
