/* Internal: the scales of FP8 moments in a checkpoint (optimizer_scales.safetensors;
 * docs/files.md). optimizer.safetensors holds the moments as fp32 values, as stored; each
 * FP8 moment's per-span scale_inv (moments.h) is saved beside them, so that a run resumed
 * on the same layout stores exactly the codes it had and continues bit for bit. A span whose
 * values are not codes of its saved scale_inv (another layout, another dtype) takes its
 * scale from its values instead, as TransformerEngine's FusedAdam.load_state_dict does. */
#ifndef MXI_CKPT_SCALES_H
#define MXI_CKPT_SCALES_H

#include "distributed/comm.h"
#include "train/moments.h"

/* Every rank (collective): each FP8 moment's scale_inv per span (m[v].spans of them) gathered
 * on rank 0, which writes dir/optimizer_scales.safetensors: tensors exp_avg.scale_inv and
 * exp_avg_sq.scale_inv, F32 (world, spans), row r rank r's, for the moments stored in FP8
 * (no file when none is). Returns an MPI error; rank 0's own errors go to *file_rc. */
int mxi_scales_save(const char *dir, const mxi_moment *m /* (2) */, mxi_comm *comm, int *file_rc, mx_diag *diag);

/* This rank's saved scale_inv per span of each moment stored in FP8, into scale_inv[v]
 * (m[v].spans floats each, for the moments stored in FP8); have[v] says whether the
 * checkpoint dir has them (a file of this world size and span count). An unreadable file is
 * an error naming it. */
int mxi_scales_load(const char *dir, const mxi_moment *m /* (2) */, int rank, int world, float *scale_inv[2],
                    bool have[2], mx_diag *diag);

#endif
