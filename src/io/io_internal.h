/* Internal helpers of the file I/O layer: whole reads at an offset, and atomic file
 * replacement (write a temporary file beside the target, fsync, rename over the target),
 * so that no reader ever sees a partial output file. */
#ifndef MXI_IO_INTERNAL_H
#define MXI_IO_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <jansson.h>

#include "mxtrain/error.h"
#include "mxtrain/safetensors.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "mxtrain's file formats are little-endian and are read and written by memcpy"
#endif

/* Read exactly n bytes at offset off. Returns 0, or -1 with errno set (errno 0 means the
 * file ended first). */
int mxi_pread_full(int fd, void *buf, size_t n, uint64_t off);

/* Where an output path is written, and whether it may be: every output file goes through
 * here (mxi_atomic_begin, mxi_output_open). A symbolic link is followed, through a chain of
 * links, to the file it names (*target, malloc'ed; the link stays). Refused: a path that
 * names no file ("" or ending in '/'), a directory, and a device, FIFO or socket (never
 * replaced by a regular file, nor written through). 0, MX_EIO with one line naming out,
 * or MX_ENOMEM. */
int mxi_output_target(const char *out, char **target, mx_diag *diag);

typedef enum {
    MXI_OUTPUT_TRUNCATE,   /* start the file afresh */
    MXI_OUTPUT_APPEND,     /* continue it */
} mxi_output_mode;

/* A stream on an output that grows as a run goes (a log, not written atomically), under
 * mxi_output_target's rules; the file is made if missing and truncated, when mode says so,
 * only once it is known to be a regular file. 0 with *f, or mxi_output_target's errors. */
int mxi_output_open(const char *out, mxi_output_mode mode, FILE **f, mx_diag *diag);

/* A JSON file read whole (core/file.h's mxi_read_input: a regular file of at most max_bytes,
 * allowed naming it) and parsed: 0 with *out (json_decref it), mxi_read_input's errors,
 * MX_EFORMAT "PATH:LINE: REASON", or, when jansson ran out of memory (never taken for a
 * damaged file), MX_ENOMEM "PATH: out of memory parsing its LEN bytes of JSON (jansson)". */
int mxi_read_json(const char *path, const char *allowed, uint64_t max_bytes, json_t **out, mx_diag *diag);

/* mx_st_writer_new with its message in diag. */
int mxi_st_writer_new(mx_st_writer **out, mx_diag *diag);

/* An output file being written. The bytes go to a temporary file in the target's
 * directory (".NAME.tmp-XXXX", hidden so globs over the directory never see it). */
typedef struct {
    int fd;              /* -1 when closed */
    char *path;          /* the target */
    char *tmp_path;      /* the temporary file, NULL once renamed or removed */
    unsigned char *buf;  /* write buffer */
    size_t used;
    bool hole;           /* mxi_atomic_skip left a hole: close sets the file's size */
} mxi_atomic;

/* Create the temporary file for path (mode 0666 less the umask, like fopen), locked (flock)
 * until it is renamed or removed. First removes the temporary files of earlier writes of
 * path that were killed: named ".NAME.tmp-" and 1-10 hex digits, in the same directory,
 * and locked by no process. On failure nothing is left on disk: MX_EIO naming the
 * directory and the system's reason. */
int mxi_atomic_begin(mxi_atomic *a, const char *path, mx_diag *diag);

/* Append n bytes (buffered). On failure returns MX_EIO; the caller then calls abort. */
int mxi_atomic_write(mxi_atomic *a, const void *data, size_t n, mx_diag *diag);

/* Advance n bytes without writing them: they read as zeros unless written later, by pwrite
 * into the finished file (a hole, so unwritten space costs no disk). MX_EIO on failure. */
int mxi_atomic_skip(mxi_atomic *a, uint64_t n, mx_diag *diag);

/* Flush and fsync the temporary file (it is not yet renamed; it stays open and locked). */
int mxi_atomic_close(mxi_atomic *a, mx_diag *diag);

/* Rename the finished temporary file over the target, close it and fsync the directory.
 * On failure the temporary file is removed. */
int mxi_atomic_rename(mxi_atomic *a, mx_diag *diag);

/* close + rename; on failure the temporary file is removed. Frees a's memory either way. */
int mxi_atomic_commit(mxi_atomic *a, mx_diag *diag);

/* Close and remove the temporary file (if any) and free a's memory. Safe to call twice. */
void mxi_atomic_abort(mxi_atomic *a);

/* Free a's memory after a successful rename (the temporary file is gone). */
void mxi_atomic_free(mxi_atomic *a);

/* Write an llm.c shard into an atomic file that mxi_atomic_begin opened: the header for
 * count tokens of out_width bytes (2 or 4), then the tokens, read from `tokens` as
 * in_width-byte (2 or 4) unsigned integers. The caller checked every token fits out_width. */
int mxi_shard_emit(mxi_atomic *a, const void *tokens, int in_width, int64_t count, int out_width, mx_diag *diag);

#endif
