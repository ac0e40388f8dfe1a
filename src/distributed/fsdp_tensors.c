/* Whole tensors to and from the FSDP shards (see fsdp.h): what checkpoints save, load and
 * initialise. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/diag.h"
#include "distributed/fsdp_internal.h"

void mxi_fsdp_scatter_tensor(const mxi_fsdp *f, int i, const float *full, float *dst) {
    mxi_shard_piece p;
    for (int k = 0; mxi_fsdp_piece(f, i, k, true, &p); k++) {
        if (p.count) memcpy(dst + p.offset, full + p.start, (size_t)p.count * sizeof(float));   // none past the last row
        memset(dst + p.offset + p.count, 0, (size_t)(p.slot - p.count) * sizeof(float));
    }
}

bool mxi_fsdp_piece(const mxi_fsdp *f, int i, int k, bool every_replica, mxi_shard_piece *p) {
    const shard_tensor *t = &f->t[i];
    const domain *dm = &f->dom[t->dom];
    if ((dm->replica != 0 && !every_replica) || k < 0 || k >= t->G) return false;
    int64_t r0 = (int64_t)dm->rank * t->S, rows = t->R - r0 < t->S ? t->R - r0 : t->S;
    if (rows < 0) rows = 0;
    *p = (mxi_shard_piece){.start = ((t->g0 + k) * t->R + r0) * t->cols, .count = rows * t->cols,
                           .offset = t->shard_off + k * t->S * t->cols, .slot = t->S * t->cols};
    return true;
}

int mxi_fsdp_gather_tensor(mxi_fsdp *f, int i, const float *src, float *full, mx_diag *diag) {
    const shard_tensor *t = &f->t[i];
    const domain *dm = &f->dom[t->dom];
    if (dm->replica != 0) return MX_OK;   // the other replicas hold the same rows
    // dense: the FSDP group of world rank 0; experts: the EP x EF ranks of expert replica 0,
    // rank q holding EP rank q % EP's experts, rows of expert shard rank q / EP
    bool experts = t->dom == DOM_EXPERTS;
    mxi_comm *comm = !experts ? dm->comm : f->emesh_group ? f->emesh_group : f->world;
    int n_ranks = experts ? f->EP * dm->W : dm->W, me = mxi_comm_rank(comm);
    size_t n = (size_t)(t->G * t->S * t->cols);
    float *all = me == 0 ? malloc(n * (size_t)n_ranks * 4 + 1) : NULL;
    if (me == 0 && !all)
        return mxi_diag(diag, MX_ENOMEM, "out of memory assembling a tensor (%zu bytes)", n * (size_t)n_ranks * 4 + 1);
    char why[160];
    snprintf(why, sizeof why, "%s for a checkpoint", mxi_model_tensor_shape(f->model, i).name);
    int rc = mxi_comm_gather(comm, src, all, n * 4, 0, why, diag);
    if (!rc && me == 0)
        for (int q = 0; q < n_ranks; q++) {
            int r = experts ? q / f->EP : q;
            int64_t g0 = experts ? (int64_t)(q % f->EP) * t->G : 0;
            for (int64_t g = 0; g < t->G; g++) {
                int64_t r0 = (int64_t)r * t->S, rows = t->R - r0 < t->S ? t->R - r0 : t->S;
                if (rows > 0)
                    memcpy(full + ((g0 + g) * t->R + r0) * t->cols, all + (size_t)q * n + (size_t)(g * t->S * t->cols),
                           (size_t)(rows * t->cols) * 4);
            }
        }
    free(all);
    return rc;
}
