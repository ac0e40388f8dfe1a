/* A checkpoint as a standalone Hugging Face model directory (see mx_checkpoint_export in
 * train.h): config.json and the weights, in one model.safetensors or, past the shard size,
 * in model-0000K-of-0000N.safetensors files with model.safetensors.index.json, split the
 * way transformers' save_pretrained splits them. */
#include <dirent.h>
#include <errno.h>
#include <stdbool.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/diag.h"
#include "mxtrain/safetensors.h"
#include "mxtrain/train.h"
#include "train/checkpoint.h"

/* tmp = DIR/.BASE.tmp-export beside out (a fixed name: a killed export's is replaced by
 * the next export to the same place). */
static int temp_beside(const char *out, char *tmp, size_t size, mx_diag *diag) {
    size_t n = strlen(out);
    while (n > 1 && out[n - 1] == '/') n--;
    const char *base = out;
    for (size_t i = 0; i < n; i++)
        if (out[i] == '/') base = out + i + 1;
    int dir_len = (int)(base - out);
    int w = snprintf(tmp, size, "%.*s.%.*s.tmp-export", dir_len, out, (int)(n - (size_t)dir_len), base);
    if (w < 0 || (size_t)w >= size) return mxi_diag(diag, MX_EINVAL, "--out: path too long: %s", out);
    return MX_OK;
}

/* --out must be new, or an empty directory (the rename replaces it). */
static int check_out(const char *out, mx_diag *diag) {
    struct stat st;
    if (!*out) return mxi_diag(diag, MX_EINVAL, "--out: an empty path (allowed: a new directory)");
    if (stat(out, &st) != 0) return MX_OK;
    if (!S_ISDIR(st.st_mode))
        return mxi_diag(diag, MX_EINVAL, "--out: '%s' exists and is not a directory (allowed: a new or empty directory)",
                        out);
    DIR *d = opendir(out);
    if (!d) return mxi_diag(diag, MX_EIO, "--out: cannot read the directory '%s' (%s)", out, strerror(errno));
    struct dirent *e;
    bool empty = true;
    while (empty && (e = readdir(d))) empty = !strcmp(e->d_name, ".") || !strcmp(e->d_name, "..");
    closedir(d);
    if (!empty)
        return mxi_diag(diag, MX_EINVAL, "--out: '%s' is a directory that is not empty (allowed: a new or empty "
                        "directory; nothing is overwritten)", out);
    return MX_OK;
}

/* One safetensors file of the Hugging Face tensors [begin, end). */
static int write_shard(const char *dir, const char *file, mx_model *m, int begin, int end, mx_st_dtype dtype,
                       mx_diag *diag) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s/%s", dir, file) >= (int)sizeof path)
        return mxi_diag(diag, MX_EINVAL, "path too long: %s/%s", dir, file);
    mx_st_writer *w = NULL;
    int rc = mx_st_writer_new(&w);
    if (rc) return mxi_diag(diag, rc, "out of memory");
    rc = mx_st_writer_set_metadata(w, "format", "pt", diag);
    for (int j = begin; j < end && !rc; j++) {
        mx_tensor_view v = mx_model_hf_tensor(m, j);
        rc = mx_st_writer_add_f32(w, v.name, dtype, v.shape, v.ndim, v.data, diag);
    }
    if (!rc) rc = mx_st_write(w, path, diag);
    mx_st_writer_free(w);
    return rc;
}

/* Everything into the temporary directory tmp. */
static int write_model_dir(const char *tmp, const mx_model_config *mc, mx_model *m, mx_dtype dtype,
                           uint64_t max_shard, mx_export_info *info, mx_diag *diag) {
    int n = mx_model_num_hf_tensors(m);
    uint64_t elem = dtype == MX_DTYPE_BF16 ? 2 : 4;
    // transformers' rule: a tensor goes into the current shard unless it would then pass the
    // limit; a tensor larger than the limit has a shard of its own
    int *first = malloc((size_t)(n + 1) * sizeof *first), shards = 0;
    if (!first) return mxi_diag(diag, MX_ENOMEM, "out of memory");
    uint64_t in_shard = 0, total = 0;
    for (int j = 0; j < n; j++) {
        uint64_t b = (uint64_t)mx_model_hf_tensor(m, j).numel * elem;
        if (shards == 0 || (in_shard > 0 && in_shard + b > max_shard)) first[shards++] = j, in_shard = 0;
        in_shard += b, total += b;
    }
    first[shards] = n;
    char path[4096];
    int rc = snprintf(path, sizeof path, "%s/config.json", tmp) < (int)sizeof path
                 ? mx_hf_config_save(mc, dtype == MX_DTYPE_BF16 ? "bfloat16" : "float32", path, diag)
                 : mxi_diag(diag, MX_EINVAL, "path too long: %s", tmp);
    mx_st_dtype st = dtype == MX_DTYPE_BF16 ? MX_ST_BF16 : MX_ST_F32;
    json_t *map = shards > 1 ? json_object() : NULL;
    if (shards > 1 && !map) rc = mxi_diag(diag, MX_ENOMEM, "out of memory");
    for (int k = 0; k < shards && !rc; k++) {
        char file[64];
        if (shards == 1) snprintf(file, sizeof file, "model.safetensors");
        else snprintf(file, sizeof file, "model-%05d-of-%05d.safetensors", k + 1, shards);
        rc = write_shard(tmp, file, m, first[k], first[k + 1], st, diag);
        for (int j = first[k]; j < first[k + 1] && !rc && map; j++)
            if (json_object_set_new(map, mx_model_hf_tensor(m, j).name, json_string(file)))
                rc = mxi_diag(diag, MX_ENOMEM, "out of memory");
    }
    if (!rc && map) {
        json_t *index = json_pack("{s:{s:I}, s:O}", "metadata", "total_size", (json_int_t)total, "weight_map", map);
        char *text = index ? json_dumps(index, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
        json_decref(index);
        if (!text) rc = mxi_diag(diag, MX_ENOMEM, "out of memory");
        if (!rc && snprintf(path, sizeof path, "%s/model.safetensors.index.json", tmp) >= (int)sizeof path)
            rc = mxi_diag(diag, MX_EINVAL, "path too long: %s", tmp);
        if (!rc) rc = mxi_write_file(path, text, strlen(text), diag);
        free(text);
    }
    json_decref(map);
    free(first);
    if (info) info->files = shards, info->tensors = n, info->bytes = total;
    return rc;
}

int mx_checkpoint_export(const char *checkpoint, const char *out, mx_dtype dtype, uint64_t max_shard_bytes,
                         mx_export_info *info, mx_diag *diag) {
    if (!checkpoint || !out) return mxi_diag(diag, MX_ENULL, "mx_checkpoint_export: NULL argument");
    if (dtype != MX_DTYPE_BF16 && dtype != MX_DTYPE_FP32)
        return mxi_diag(diag, MX_EINVAL, "--dtype: only bf16 and fp32 are written");
    if (max_shard_bytes < 1) return mxi_diag(diag, MX_EINVAL, "--max-shard-size: 0 (allowed: at least 1 byte)");
    if (info) memset(info, 0, sizeof *info);
    // a Hugging Face model directory (an iter_N holds config.json) is read as it is; a
    // save directory stands for its latest checkpoint
    char dir[4096], path[4096];
    struct stat st;
    snprintf(path, sizeof path, "%s/config.json", checkpoint);
    int rc = MX_OK;
    if (stat(path, &st) == 0) snprintf(dir, sizeof dir, "%s", checkpoint);
    else rc = mxi_checkpoint_resolve(checkpoint, "mxtrain export", dir, sizeof dir, diag);
    if (rc) return rc;
    if (info) snprintf(info->source, sizeof info->source, "%s", dir);
    mx_model_config mc;
    if ((rc = mx_hf_config_load(dir, &mc, diag))) return rc;
    mx_model *m = NULL;
    mx_model_options opt = {.batch = 1, .seq = 1};
    if ((rc = mx_model_create(&mc, &opt, &m, diag))) return rc;
    char tmp[4096];
    if (!(rc = mx_model_load(m, dir, diag)) && !(rc = check_out(out, diag)) &&
        !(rc = temp_beside(out, tmp, sizeof tmp, diag))) {
        mxi_remove_tree(tmp);
        if (mkdir(tmp, 0777) != 0)
            rc = mxi_diag(diag, MX_EIO, "--out: cannot create a directory beside '%s' (%s)", out, strerror(errno));
        if (!rc) rc = write_model_dir(tmp, &mc, m, dtype, max_shard_bytes, info, diag);
        if (!rc && rename(tmp, out) != 0)
            rc = mxi_diag(diag, MX_EIO, "--out: cannot rename '%s' to '%s' (%s)", tmp, out, strerror(errno));
        if (rc) mxi_remove_tree(tmp);
    }
    mx_model_free(m);
    return rc;
}
