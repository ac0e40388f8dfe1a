/* Model weights in and out as safetensors with Hugging Face names (SPEC §8): a file, or a
 * directory with model.safetensors or a sharded Hugging Face checkpoint; read one model
 * tensor at a time, so that a sharded model never holds more than one whole tensor. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <errno.h>

#include "core/diag.h"
#include "core/file.h"
#include "io/io_internal.h"
#include "model/units.h"
#include "mxtrain/model.h"
#include "mxtrain/safetensors.h"


typedef struct {
    mx_st_file *files[64];
    int n;
    char where[4096];   // the file or index named in messages
} st_set;

static void st_set_close(st_set *s) {
    for (int i = 0; i < s->n; i++) mx_st_close(s->files[i]);
    s->n = 0;
}

static int st_set_add(st_set *s, const char *path, mx_diag *diag) {
    for (int i = 0; i < s->n; i++)
        if (strcmp(mx_st_path(s->files[i]), path) == 0) return MX_OK;
    if (s->n == (int)(sizeof s->files / sizeof s->files[0]))
        return mxi_diag(diag, MX_EUNSUPPORTED, "%s: more than %d safetensors files (allowed: at most %d)", s->where,
                        s->n, s->n);
    return mx_st_open(path, &s->files[s->n++], diag) ? (s->n--, MX_EIO) : MX_OK;
}

/* A file, or a directory with model.safetensors or model.safetensors.index.json. */
static int st_set_open(const char *path, st_set *s, mx_diag *diag) {
    memset(s, 0, sizeof *s);
    snprintf(s->where, sizeof s->where, "%s", path);
    struct stat st;
    if (stat(path, &st) != 0) return mxi_diag(diag, MX_EIO, "%s: cannot open (%s)", path, strerror(errno));
    if (!S_ISDIR(st.st_mode)) {
        int rc = mx_st_open(path, &s->files[0], diag);
        if (!rc) s->n = 1;
        return rc;
    }
    char file[4096], index[4096];
    snprintf(file, sizeof file, "%s/model.safetensors", path);
    snprintf(index, sizeof index, "%s/model.safetensors.index.json", path);
    if (stat(file, &st) == 0) {
        snprintf(s->where, sizeof s->where, "%s", file);
        int rc = mx_st_open(file, &s->files[0], diag);
        if (!rc) s->n = 1;
        return rc;
    }
    if (stat(index, &st) != 0)
        return mxi_diag(diag, MX_EIO, "%s: no model.safetensors or model.safetensors.index.json in this directory", path);
    snprintf(s->where, sizeof s->where, "%s", index);
    json_t *root;
    int rc = mxi_read_json(index, "a Hugging Face model.safetensors.index.json", MXI_MAX_INDEX_BYTES, &root, diag);
    if (rc) return rc;
    json_t *map = json_object_get(root, "weight_map");
    if (!json_is_object(map)) {
        rc = mxi_diag(diag, MX_EFORMAT, "%s: no \"weight_map\" object (allowed: a Hugging Face "
                      "model.safetensors.index.json)", index);
    } else {
        const char *key;
        json_t *val;
        json_object_foreach(map, key, val) {
            const char *f = json_string_value(val);
            if (!f || strchr(f, '/')) {
                rc = mxi_diag(diag, MX_EFORMAT, "%s: weight_map['%s'] is not a file name in the same directory", index, key);
                break;
            }
            char p[4096];
            snprintf(p, sizeof p, "%s/%s", path, f);
            if ((rc = st_set_add(s, p, diag))) break;
        }
    }
    json_decref(root);
    if (rc) st_set_close(s);
    return rc;
}

static int hf_index_of(const mx_model *m, const char *name) {
    for (int i = 0; i < mx_model_num_hf_tensors(m); i++)
        if (strcmp(mx_model_hf_tensor(m, i).name, name) == 0) return i;
    return -1;
}

/* Every tensor of the files must be a parameter (or a buffer HF checkpoints carry). */
static int check_names(const st_set *s, const mx_model *m, mx_diag *diag) {
    bool tied = hf_index_of(m, "lm_head.weight") < 0;
    for (int f = 0; f < s->n; f++)
        for (int i = 0; i < mx_st_count(s->files[f]); i++) {
            const char *name = mx_st_get(s->files[f], i)->name;
            if (hf_index_of(m, name) >= 0 || strstr(name, "rotary_emb.inv_freq") ||
                (tied && strcmp(name, "lm_head.weight") == 0))
                continue;
            return mxi_diag(diag, MX_EFORMAT, "%s: tensor '%s' is not a parameter of this model (check model_type, "
                            "num_hidden_layers, num_experts and tie_word_embeddings)", mx_st_path(s->files[f]), name);
        }
    return MX_OK;
}

/* "i, j, k": the index of element `flat` of a tensor of shape (ndim dims). */
static void index_text(char *at, size_t size, const int64_t *shape, int ndim, int64_t flat) {
    int64_t idx[8] = {0}, rest = flat;   // model tensors have at most 3 dims
    for (int d = (ndim < 8 ? ndim : 8) - 1; d >= 0; d--) idx[d] = rest % shape[d], rest /= shape[d];
    at[0] = '\0';
    for (int d = 0, o = 0; d < ndim && d < 8; d++)
        o += snprintf(at + o, size - (size_t)o, "%s%lld", d ? ", " : "", (long long)idx[d]);
}

int mxi_check_finite_part(const char *file, const char *tensor, const int64_t *shape, int ndim, int64_t first,
                             int64_t n, const float *x, mx_diag *diag) {
    for (int64_t i = 0; i < n; i++) {
        if (isfinite(x[i])) continue;
        char at[160];
        index_text(at, sizeof at, shape, ndim, first + i);
        return mxi_diag(diag, MX_EFORMAT, "%s: tensor '%s' holds %s at [%s] (allowed: finite values; the file is "
                        "damaged or was saved from a run that diverged)", file, tensor,
                        isnan(x[i]) ? "NaN" : x[i] > 0 ? "+Inf" : "-Inf", at);
    }
    return MX_OK;
}

int mxi_check_nonnegative_part(const char *file, const char *tensor, const int64_t *shape, int ndim, int64_t first,
                               int64_t n, const float *x, mx_diag *diag) {
    for (int64_t i = 0; i < n; i++) {
        if (!(x[i] < 0)) continue;
        char at[160];
        index_text(at, sizeof at, shape, ndim, first + i);
        return mxi_diag(diag, MX_EFORMAT, "%s: tensor '%s' holds %g at [%s] (allowed: values >= 0: a second moment "
                        "is a mean of squares; the file is damaged)", file, tensor, (double)x[i], at);
    }
    return MX_OK;
}

int mxi_check_finite(const char *file, const char *tensor, const int64_t *shape, int ndim, const float *x,
                     mx_diag *diag) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    return mxi_check_finite_part(file, tensor, shape, ndim, 0, n, x, diag);
}

/* The file of the set holding tensor name. */
static int file_holding(const st_set *s, const char *name, mx_st_file **file, mx_diag *diag) {
    for (int f = 0; f < s->n; f++)
        if (mx_st_find(s->files[f], name)) return *file = s->files[f], MX_OK;
    return mxi_diag(diag, MX_EFORMAT, "%s: tensor '%s' is missing (the model needs every parameter)", s->where, name);
}

/* Read the whole of model tensor `tensor` (all its Hugging Face slices) into full. */
static int read_tensor(st_set *s, const mx_model *m, int tensor, float *full, mx_diag *diag) {
    int first, end;
    mxi_model_hf_range(m, tensor, &first, &end);
    for (int j = first; j < end; j++) {
        int t;
        int64_t within;
        mxi_model_hf_slice(m, j, &t, &within);
        mx_tensor_view v = mx_model_hf_tensor(m, j);
        mx_st_file *f = NULL;
        int rc = file_holding(s, v.name, &f, diag);
        if (!rc) rc = mx_st_read_f32(f, v.name, v.shape, v.ndim, full + within, diag);
        if (!rc) rc = mxi_check_finite(mx_st_path(f), v.name, v.shape, v.ndim, full + within, diag);
        if (rc) return rc;
    }
    return MX_OK;
}

int mxi_model_read(const mx_model *m, const char *path, mxi_tensor_sink take, void *ctx, mx_diag *diag) {
    if (!m || !path) return mxi_diag(diag, MX_ENULL, "mx_model_load: NULL argument");
    st_set s;
    int rc = st_set_open(path, &s, diag);
    if (rc) return rc;
    float *full = malloc((size_t)mxi_model_largest_tensor(m) * sizeof(float));
    rc = full ? check_names(&s, m, diag)
              : mxi_diag(diag, MX_ENOMEM, "out of memory reading %s (%zu bytes for its largest tensor)", path,
                         (size_t)mxi_model_largest_tensor(m) * sizeof(float));
    for (int i = 0; i < mx_model_num_tensors(m) && !rc; i++) {
        rc = read_tensor(&s, m, i, full, diag);
        if (!rc) rc = take(ctx, i, full);
    }
    free(full);
    st_set_close(&s);
    return rc;
}

static int copy_into_model(void *ctx, int tensor, const float *full) {
    mx_tensor_view v = mx_model_tensor(ctx, tensor);
    memcpy(v.data, full, (size_t)v.numel * sizeof(float));
    return MX_OK;
}

int mxi_read_parts_of(mx_st_file *file, const char *name, const int64_t *shape, int ndim, int64_t within,
                      int tensor, mxi_part_fn part, void *ctx, mx_diag *diag) {
    // every rank checks every tensor's shape and dtype, whatever part of it it reads
    int rc = mx_st_read_f32_part(file, name, shape, ndim, 0, 0, NULL, diag);
    int64_t numel = 1, start, count;
    for (int d = 0; d < ndim; d++) numel *= shape[d];
    float *dst;
    for (int k = 0; !rc && part(ctx, tensor, k, &start, &count, &dst); k++) {
        int64_t lo = start > within ? start : within, hi = start + count < within + numel ? start + count : within + numel;
        if (lo >= hi) continue;   // another slice's rows, or a rank past the tensor's last row
        rc = mx_st_read_f32_part(file, name, shape, ndim, lo - within, hi - lo, dst + (lo - start), diag);
        if (!rc)
            rc = mxi_check_finite_part(mx_st_path(file), name, shape, ndim, lo - within, hi - lo, dst + (lo - start), diag);
    }
    return rc;
}

int mxi_model_read_parts(const mx_model *m, const char *path, mxi_part_fn part, void *ctx, mx_diag *diag) {
    if (!m || !path) return mxi_diag(diag, MX_ENULL, "mx_model_load: NULL argument");
    st_set s;
    int rc = st_set_open(path, &s, diag);
    if (rc) return rc;
    rc = check_names(&s, m, diag);
    for (int j = 0; j < mx_model_num_hf_tensors(m) && !rc; j++) {
        int t;
        int64_t within;
        mxi_model_hf_slice(m, j, &t, &within);
        mx_tensor_view v = mx_model_hf_tensor(m, j);
        mx_st_file *f = NULL;
        rc = file_holding(&s, v.name, &f, diag);
        if (!rc) rc = mxi_read_parts_of(f, v.name, v.shape, v.ndim, within, t, part, ctx, diag);
    }
    st_set_close(&s);
    return rc;
}

int mx_model_load(mx_model *m, const char *path, mx_diag *diag) {
    if (m && !mx_model_params(m))
        return mxi_diag(diag, MX_EINVAL, "mx_model_load: the model has no weights of its own (external_params)");
    int rc = mxi_model_read(m, path, copy_into_model, m, diag);
    struct stat st;
    char state[4096];
    // a checkpoint directory: a delayed recipe's histories and scales too
    if (!rc && mxi_model_delayed(m) && stat(path, &st) == 0 && S_ISDIR(st.st_mode) &&
        snprintf(state, sizeof state, "%s/%s", path, MXI_DELAYED_FILE) < (int)sizeof state)
        rc = mxi_model_delayed_load(m, state, diag);
    return rc;
}

int mx_model_save(const mx_model *m, const char *path, bool grads, const char *const *extra_names,
                  const float *extra_values, int n_extra, mx_diag *diag) {
    if (!m || !path) return mxi_diag(diag, MX_ENULL, "mx_model_save: NULL argument");
    if (!mx_model_params((mx_model *)m))
        return mxi_diag(diag, MX_EINVAL, "mx_model_save: the model has no weights of its own (external_params)");
    mx_st_writer *w = NULL;
    int rc = mxi_st_writer_new(&w, diag);
    if (rc) return rc;
    rc = mx_st_writer_set_metadata(w, "format", "pt", diag);   // what transformers' loader looks for
    for (int i = 0; i < n_extra && !rc; i++)
        rc = mx_st_writer_add_f32(w, extra_names[i], MX_ST_F32, NULL, 0, &extra_values[i], diag);
    for (int i = 0; i < mx_model_num_hf_tensors(m) && !rc; i++) {
        mx_tensor_view v = mx_model_hf_tensor(m, i);
        char name[160];
        snprintf(name, sizeof name, "%s%s", grads ? "grad." : "", v.name);
        rc = mx_st_writer_add_f32(w, name, MX_ST_F32, v.shape, v.ndim, grads ? v.grad : v.data, diag);
    }
    if (!rc) rc = mx_st_write(w, path, diag);
    mx_st_writer_free(w);
    return rc;
}
