/* Delayed scaling's state in a checkpoint (delayed_scaling.safetensors; docs/files.md): per
 * converted tensor NAME, NAME.amax_history (3, len) and NAME.scale (3), the roles input,
 * weight, grad in that order, with a leading dim of the experts for a fused expert tensor.
 * The state is the same on every rank after each update (slot 0 of every history is
 * all-reduced, the rest was), so one rank writes it and every rank reads all of it. */
#include <stdio.h>
#include <sys/stat.h>

#include "core/diag.h"
#include "io/io_internal.h"
#include "model/model_internal.h"
#include "mxtrain/safetensors.h"

/* Tensor i's shapes: (groups, 3, len) and (groups, 3), the groups dim only for experts. */
static int shapes_of(const mx_model *m, int i, int64_t groups, int len, int64_t hist[3], int64_t scale[2]) {
    bool experts = m->params[i].kind == P_EXPERTS;
    int n = 0;
    if (experts) hist[n] = scale[n] = groups, n++;
    hist[n] = scale[n] = MXI_DELAYED_ROLES;
    hist[n + 1] = len;
    return n + 1;
}

/* One array of the state as the file names it: its name, shape and values. */
typedef int (*array_fn)(void *ctx, const char *name, const int64_t *shape, int ndim, float *data, mx_diag *diag);

/* fn on each converted tensor's NAME.amax_history and NAME.scale, in the file's order. */
static int each_array(mx_model *m, array_fn fn, void *ctx, mx_diag *diag) {
    mxi_delayed *d = m->delayed;
    int rc = MX_OK, len = mxi_delayed_history_len(d);
    char name[160];
    for (int i = 0; i < m->n_params && !rc; i++) {
        int64_t first = mxi_delayed_first_slot(d, i);
        if (first < 0) continue;
        int64_t hs[3], ss[2], groups = m->params[i].kind == P_EXPERTS ? m->params[i].shape[0] : 1;
        int nd = shapes_of(m, i, groups, len, hs, ss);
        snprintf(name, sizeof name, "%s.amax_history", m->params[i].name);
        rc = fn(ctx, name, hs, nd + 1, mxi_delayed_history(d) + first * len, diag);
        snprintf(name, sizeof name, "%s.scale", m->params[i].name);
        if (!rc) rc = fn(ctx, name, ss, nd, mxi_delayed_scales(d) + first, diag);
    }
    return rc;
}

static int add_array(void *w, const char *name, const int64_t *shape, int ndim, float *data, mx_diag *diag) {
    return mx_st_writer_add_f32(w, name, MX_ST_F32, shape, ndim, data, diag);
}

static int read_array(void *f, const char *name, const int64_t *shape, int ndim, float *data, mx_diag *diag) {
    return mx_st_read_f32(f, name, shape, ndim, data, diag);
}

int mxi_model_delayed_save(mx_model *m, const char *path, mx_diag *diag) {
    if (!m->delayed) return MX_OK;
    mx_st_writer *w = NULL;
    int rc = mxi_st_writer_new(&w, diag);
    if (!rc) rc = mx_st_writer_set_metadata(w, "format", "pt", diag);
    if (!rc) rc = each_array(m, add_array, w, diag);
    if (!rc) rc = mx_st_write(w, path, diag);
    mx_st_writer_free(w);
    return rc;
}

int mxi_model_delayed_load(mx_model *m, const char *path, mx_diag *diag) {
    mxi_delayed *d = m->delayed;
    struct stat st;
    if (!d || stat(path, &st) != 0) return MX_OK;   // no state saved: the run starts the histories afresh
    mx_st_file *f = NULL;
    int rc = mx_st_open(path, &f, diag);
    if (!rc) rc = each_array(m, read_array, f, diag);
    if (rc && f && diag) {
        char msg[sizeof diag->msg];
        snprintf(msg, sizeof msg, "%s", diag->msg);
        rc = mxi_diag(diag, rc, "%s (training.quantization_plan.amax_history_len is %d)", msg,   // msg names path
                      mxi_delayed_history_len(d));
    }
    mx_st_close(f);
    mxi_delayed_begin_forward(d);   // the scales loaded are those of the next pass
    return rc;
}
