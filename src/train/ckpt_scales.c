/* FP8 moments' scales in a checkpoint (see ckpt_scales.h). */
#include "train/ckpt_scales.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "core/diag.h"
#include "io/io_internal.h"
#include "mxtrain/safetensors.h"

static const char FILE_NAME[] = "optimizer_scales.safetensors";
static const char *const NAMES[2] = {"exp_avg.scale_inv", "exp_avg_sq.scale_inv"};

static int path_of(const char *dir, char *path, size_t size, mx_diag *diag) {
    if (snprintf(path, size, "%s/%s", dir, FILE_NAME) >= (int)size)
        return mxi_diag(diag, MX_EINVAL, "path too long: %s/%s", dir, FILE_NAME);
    return MX_OK;
}

/* Rank 0: the gathered rows (world, spans) of each FP8 moment into the file. */
static int write_file(const char *dir, const mxi_moment *m, float *const all[2], int world, mx_diag *diag) {
    char path[4096];
    int rc = path_of(dir, path, sizeof path, diag);
    mx_st_writer *w = NULL;
    if (!rc) rc = mxi_st_writer_new(&w, diag);
    if (!rc) rc = mx_st_writer_set_metadata(w, "format", "pt", diag);
    for (int v = 0; v < 2 && !rc; v++) {
        if (m[v].dtype != MX_STATE_FP8) continue;
        int64_t shape[2] = {world, m[v].spans};
        rc = mx_st_writer_add_f32(w, NAMES[v], MX_ST_F32, shape, 2, all[v], diag);
    }
    if (!rc) rc = mx_st_write(w, path, diag);
    mx_st_writer_free(w);
    return rc;
}

int mxi_scales_save(const char *dir, const mxi_moment *m, mxi_comm *comm, int *file_rc, mx_diag *diag) {
    *file_rc = MX_OK;
    int k = (m[0].dtype == MX_STATE_FP8) + (m[1].dtype == MX_STATE_FP8), world = mxi_comm_world(comm);
    if (k == 0) return MX_OK;   // the same on every rank: one config
    bool root = mxi_comm_rank(comm) == 0;
    size_t spans = (size_t)m[0].spans, row = (size_t)k * spans, n = row * (size_t)world;
    float *send = malloc((row + 1) * sizeof *send), *recv = root ? malloc((n + 1) * sizeof *recv) : NULL;
    float *all[2] = {NULL, NULL};
    for (int v = 0; v < 2 && root; v++)
        if (m[v].dtype == MX_STATE_FP8) all[v] = malloc((spans * (size_t)world + 1) * sizeof(float));
    double missing = !send || (root && (!recv || (m[0].dtype == MX_STATE_FP8 && !all[0]) ||
                                        (m[1].dtype == MX_STATE_FP8 && !all[1])));
    // every rank learns whether any could not hold the scales, so that none gathers alone
    int rc = mxi_comm_allreduce_max(comm, &missing, 1, "training.save: the FP8 moments' scales' memory", diag);
    if (!rc && missing)
        *file_rc = mxi_diag(diag, MX_ENOMEM, "out of memory gathering the FP8 moments' scales (%zu bytes on each "
                            "rank, %zu more on rank 0)", row * sizeof(float), 2 * n * sizeof(float));
    if (!rc && !missing) {
        for (int v = 0, j = 0; v < 2; v++) {
            if (m[v].dtype != MX_STATE_FP8) continue;
            for (size_t s = 0; s < spans; s++) send[j * spans + s] = m[v].scale_inv[s];
            j++;
        }
        rc = mxi_comm_gather(comm, send, recv, row * sizeof *send, 0, "training.save: the FP8 moments' scales", diag);
    }
    if (!rc && !missing && root) {
        // recv is (world, k, spans); each file tensor (world, spans)
        for (int r = 0; r < world; r++)
            for (int v = 0, j = 0; v < 2; v++) {
                if (m[v].dtype != MX_STATE_FP8) continue;
                for (size_t s = 0; s < spans; s++) all[v][(size_t)r * spans + s] = recv[(size_t)r * row + j * spans + s];
                j++;
            }
        *file_rc = write_file(dir, m, all, world, diag);
    }
    free(send), free(recv), free(all[0]), free(all[1]);
    return rc;
}

int mxi_scales_load(const char *dir, const mxi_moment *m, int rank, int world, float *scale_inv[2], bool have[2],
                    mx_diag *diag) {
    have[0] = have[1] = false;
    if (m[0].dtype != MX_STATE_FP8 && m[1].dtype != MX_STATE_FP8) return MX_OK;
    char path[4096];
    struct stat st;
    int rc = path_of(dir, path, sizeof path, diag);
    if (rc || stat(path, &st) != 0) return rc;   // a checkpoint of moments stored otherwise
    mx_st_file *f = NULL;
    if ((rc = mx_st_open(path, &f, diag))) return rc;
    for (int v = 0; v < 2 && !rc; v++) {
        const mx_st_tensor *t = m[v].dtype == MX_STATE_FP8 ? mx_st_find(f, NAMES[v]) : NULL;
        // rows of another world size, or of another model, are not this rank's spans
        if (!t || t->ndim != 2 || t->shape[0] != world || t->shape[1] != m[v].spans) continue;
        rc = mx_st_read_f32_part(f, NAMES[v], t->shape, 2, (int64_t)rank * m[v].spans, m[v].spans, scale_inv[v], diag);
        have[v] = rc == MX_OK;
    }
    mx_st_close(f);
    return rc;
}
