/* Internal: the checksums of a checkpoint's tensors (checksums.json beside the safetensors
 * files; docs/files.md#checksumsjson). Each tensor's checksum is the CRC-32 of its whole
 * data bytes, the same whatever the save mode: the ranks hash the pieces they write, and
 * rank 0 joins them in order (crc32_combine). */
#ifndef MXI_CKPT_SUMS_H
#define MXI_CKPT_SUMS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "distributed/comm.h"
#include "mxtrain/model.h"

/* A piece of a checkpoint entry as one rank wrote it. Entries: model.safetensors' Hugging
 * Face tensor j (0 <= j < J), then optimizer.safetensors' moment v of model tensor i
 * (J + 2i + v), as checkpoint.c lays the files out. */
typedef struct {
    int32_t entry;
    uint32_t crc;          // of the piece's bytes
    int64_t start, count;  // elements of the entry
} mxi_sum_piece;

typedef struct {
    mxi_sum_piece *pieces;
    size_t n, cap;
    bool out_of_memory;
} mxi_sum_log;

/* Hash elements [start, start + count) of entry, at src, into the log. */
void mxi_sum_log_add(mxi_sum_log *log, int entry, int64_t start, int64_t count, const float *src);
void mxi_sum_log_free(mxi_sum_log *log);

/* Every rank (collective): the logs gathered on rank 0, which joins each entry's pieces and
 * writes dir/checksums.json. Returns an MPI error; rank 0's own errors (the file, pieces
 * that do not cover an entry) go to *file_rc. */
int mxi_sums_save(const char *dir, const mx_model *model, mxi_comm *comm, const mxi_sum_log *log, int *file_rc,
                  mx_diag *diag);

/* A checkpoint's checksums.json, read. */
typedef struct mxi_sums mxi_sums;

/* Read dir/checksums.json; *out is NULL when there is none (a checkpoint of an older
 * mxtrain). MX_EFORMAT naming the file when it is not the format. */
int mxi_sums_open(const char *dir, mxi_sums **out, mx_diag *diag);
void mxi_sums_free(mxi_sums *sums);

/* The checksum recorded for tensor of file ("model.safetensors"); false when none is. */
bool mxi_sums_get(const mxi_sums *sums, const char *file, const char *tensor, uint32_t *crc);

/* MX_EFORMAT: "PATH: tensor 'T' does not match its checksum (...)". */
int mxi_sums_mismatch(const char *path, const char *tensor, uint32_t got, uint32_t want, mx_diag *diag);

/* Every rank (collective): each tensor of dir's model.safetensors and optimizer.safetensors
 * hashed by one rank (in turn) and held to checksums.json; a tensor without a checksum, or
 * one recorded for a tensor the file lacks, is an error too. *had_sums is false (and nothing
 * is checked) when the checkpoint has no checksums.json. */
int mxi_checkpoint_verify(const char *dir, mxi_comm *comm, bool *had_sums, mx_diag *diag);

#endif
