/* What an FSDP layout costs, computed without communicating or allocating the shards (see
 * fsdp.h): with the layout code of mxi_fsdp_create, so that `mxtrain plan` predicts a run's
 * counters and memory exactly. */
#include <stdlib.h>
#include <string.h>

#include "core/diag.h"
#include "distributed/fsdp_internal.h"

void mxi_fsdp_expected_gather(const mx_model *m, int world_W, int EP, int EF, bool reshard, uint64_t *bf16,
                              uint64_t *on_demand, uint64_t *all) {
    *bf16 = *on_demand = *all = 0;
    const mxi_linear_mx *spec = mxi_model_mx_spec(m);
    for (int i = 0; i < mx_model_num_tensors(m); i++) {
        mxi_tensor_shape s = mxi_model_tensor_shape(m, i);
        if (!s.converted || !spec) continue;
        int W = world_W;
        if (EP > 1 && s.groups > 1 && mxi_model_ep_layer(m, s.unit - 1))   // an EP rank's experts, over its expert shard group
            s.groups /= EP, W = EF;
        mxi_fsdp_shard_groups(s.groups, s.rows, &s.groups, &s.rows);
        int64_t S = mxi_fsdp_rows_per_rank(s.rows, W), CB = CEIL_DIV(s.cols, 32);
        uint64_t codes = (uint64_t)(s.groups * S * s.cols) * (uint64_t)W;
        uint64_t row = codes + (uint64_t)(s.groups * S * CB) * (uint64_t)W;
        uint64_t col = codes + (uint64_t)(s.groups * (S / 32) * s.cols) * (uint64_t)W;
        uint64_t tiled = codes + (uint64_t)(s.groups * (S / 32) * CB) * (uint64_t)W;
        if (spec->weight_tiles) row = col = tiled;
        if (spec->scaling == MXI_SCALE_TENSOR || spec->scaling == MXI_SCALE_BLOCKS128)
            row = col = codes;   // one code tensor, the scales not gathered
        if (spec->scaling == MXI_SCALE_ROWS)   // an fp32 scale a row with fprop's codes; dgrad's scales not gathered
            row = codes + (uint64_t)(s.groups * S) * 4 * (uint64_t)W, col = codes;
        bool twice = reshard && s.unit != 0;   // gathered in forward and again in backward
        bool one = spec->weight_tiles || spec->scaling == MXI_SCALE_TENSOR || spec->scaling == MXI_SCALE_BLOCKS128;
        uint64_t both = one ? row : row + col;
        // on-demand's backward gather of a recomputed block carries both planes (tiles, per tensor: the one)
        uint64_t backward = mxi_model_unit_recomputes(m, s.unit) ? both : col;
        *bf16 += 2 * codes * (twice ? 2 : 1);
        *on_demand += twice ? row + backward : both;
        *all += twice ? 2 * both : both;
    }
}

int mxi_fsdp_expected(const mx_model *m, const mxi_fsdp_options *opt, int world, mxi_fsdp_counters *c,
                      mxi_fsdp_memory *mem, mx_diag *diag) {
    memset(c, 0, sizeof *c);
    memset(mem, 0, sizeof *mem);
    int D = opt->replicas > 1 ? opt->replicas : 1;
    if (world < 1 || world % D)
        return mxi_diag(diag, MX_EINVAL, "mxi_fsdp_expected: %d replicas do not divide %d ranks", D, world);
    mxi_fsdp f = {0};
    f.model = (mx_model *)(uintptr_t)m;   // only read
    mxi_fsdp_set_options(&f, opt);
    int ED = opt->expert_replicas > 1 ? opt->expert_replicas : 1;
    if (f.EP > 1 && world % (f.EP * ED))
        return mxi_diag(diag, MX_EINVAL, "mxi_fsdp_expected: %d EP ranks x %d expert replicas do not divide %d ranks",
                        f.EP, ED, world);
    f.W = world / D, f.replicas = D;
    f.dom[DOM_DENSE] = (domain){.W = f.W, .D = D};
    if (f.EP > 1) f.dom[DOM_EXPERTS] = (domain){.W = world / (f.EP * ED), .D = ED};
    size_t cache = 0;
    buffer_sizes b;
    segment *segs = NULL;
    int rc = mxi_fsdp_lay_out(&f, &cache);
    if (!rc) rc = mxi_fsdp_size_buffers(&f, &b);
    if (!rc && !(segs = calloc((size_t)b.max_segs ? (size_t)b.max_segs : 1, sizeof *segs))) rc = MX_ENOMEM;
    // one micro-batch: every unit gathered for forward and, resharded after it, again for
    // backward (the root stays; the embedding's backward reads no weights), then
    // reduce-scattered, then all-reduced across replicas
    for (int u = 0; u < f.n_units && !rc; u++)
        for (int d = 0; d < N_DOMS; d++) {
            const domain *dm = &f.dom[d];
            uint64_t n = (uint64_t)f.u[u].part_numel[d];
            if (!n) continue;   // one gather and reduce per layout the unit has tensors of
            for (int forward = 1; forward >= 0; forward--) {
                if (!forward && (u == 0 || !f.opt.reshard_after_forward || mxi_fsdp_is_embedding_unit(&f, u))) break;
                bool row, col;
                int k;
                mxi_fsdp_planes_for(&f, u, forward, &row, &col);
                mxi_fsdp_segments(&f, u, d, row, col, segs, &k);
                mxi_fsdp_count_gather(c, segs, k, dm->W);
            }
            uint64_t red = mxi_fsdp_reduce_direct(&f, d) ? n : (uint64_t)f.u[u].red_numel[d];
            if (!red) continue;   // every gradient of it reduced by slices (below)
            c->rs_bytes += red * (uint64_t)dm->W * mxi_fsdp_reduce_elem(&f);
            c->reduce_scatters++;
            if (dm->D > 1) c->ar_bytes += red * mxi_fsdp_reduce_elem(&f), c->all_reduces++;
        }
    for (int i = 0; i < f.n_tensors && !rc; i++) {   // the vocabulary tables' slices (add_grad)
        int64_t rows, calls;
        if (!f.t[i].sunk || mxi_fsdp_reduce_direct(&f, f.t[i].dom)) continue;
        calls = mxi_model_sink_calls(m, i, &rows);
        c->rs_bytes += (uint64_t)(rows * f.t[i].cols) * 4;
        c->reduce_scatters += (int)calls;
    }
    if (!rc) *mem = mxi_fsdp_count_memory(&f, cache, b.total);
    free(segs);
    if (f.u) free(f.u[0].tensors);
    free(f.t), free(f.u);
    return rc ? mxi_diag(diag, MX_ENOMEM, "out of memory laying out the shards (about %zu bytes of tables)",
                         (size_t)f.n_tensors * (sizeof *f.t + sizeof(int)) + (size_t)f.n_units * sizeof *f.u) : MX_OK;
}
