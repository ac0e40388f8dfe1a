/* A checkpoint as a standalone Hugging Face model directory (see mx_checkpoint_export in
 * train.h): config.json and the weights, in one model.safetensors or, past the shard size,
 * in model-0000K-of-0000N.safetensors files with model.safetensors.index.json, split the
 * way transformers' save_pretrained splits them. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/diag.h"
#include "model/units.h"
#include "mxtrain/safetensors.h"
#include "mxtrain/train.h"
#include "io/checksum.h"
#include "io/io_internal.h"
#include "train/checkpoint.h"
#include "train/ckpt_sums.h"
#include "train/tokenizer_files.h"

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

/* The weights on their way out: each Hugging Face tensor's file and data offset there (the
 * files laid out first, data reserved), written as mxi_model_read hands over each model
 * tensor, so that no more than one whole tensor is in memory. */
typedef struct {
    const mx_model *m;
    int *file;            // (J) shard file of HF tensor j
    uint64_t *off;        // (J) data offset of HF tensor j in its file
    int *fd;              // (shards)
    char (*path)[4096];   // (shards)
    mx_st_dtype dtype;
    uint16_t *conv;       // (CONV) bf16 staging
    const mxi_sums *sums; // the checkpoint's checksums.json, or NULL
    const char *source;   // its model.safetensors, named in messages
    int verified;
    mx_diag *diag;
} export_sink;

enum { CONV = 1 << 15 };
static const char INDEX[] = "model.safetensors.index.json";

static int write_tensor(void *ctx, int t, const float *full /* (numel of tensor t) */) {
    export_sink *x = ctx;
    int rc = MX_OK, first, end;
    mxi_model_hf_range(x->m, t, &first, &end);
    for (int j = first; j < end && !rc; j++) {
        int tj;
        int64_t within, n = mx_model_hf_tensor(x->m, j).numel;
        mxi_model_hf_slice(x->m, j, &tj, &within);
        int fd = x->fd[x->file[j]];
        const char *path = x->path[x->file[j]];
        if (x->sums) {   // the bytes as read are the file's: hashed before they go out
            const char *name = mx_model_hf_tensor(x->m, j).name;
            uint32_t want, got = mxi_crc32(0, full + within, (size_t)n * 4);
            if (!mxi_sums_get(x->sums, "model.safetensors", name, &want))
                return mxi_diag(x->diag, MX_EFORMAT, "%s: tensor '%s' has no checksum in checksums.json", x->source,
                                name);
            if (got != want) return mxi_sums_mismatch(x->source, name, got, want, x->diag);
            x->verified++;
        }
        if (x->dtype == MX_ST_F32) {
            rc = mxi_pwrite_all(fd, full + within, (size_t)n * 4, x->off[j], path, x->diag);
            continue;
        }
        for (int64_t i0 = 0; i0 < n && !rc; i0 += CONV) {   // as mx_st_write rounds
            int64_t c = n - i0 < CONV ? n - i0 : CONV;
            for (int64_t i = 0; i < c; i++) x->conv[i] = mx_st_f32_to_bf16(full[within + i0 + i]);
            rc = mxi_pwrite_all(fd, x->conv, (size_t)c * 2, x->off[j] + (uint64_t)i0 * 2, path, x->diag);
        }
    }
    return rc;
}

/* Shard file k: the Hugging Face tensors [begin, end), laid out with their data reserved;
 * their offsets into x. */
static int lay_out_shard(export_sink *x, int k, int begin, int end, mx_diag *diag) {
    mx_st_writer *w = NULL;
    int rc = mxi_st_writer_new(&w, diag);
    if (rc) return rc;
    rc = mx_st_writer_set_metadata(w, "format", "pt", diag);
    for (int j = begin; j < end && !rc; j++) {
        mx_tensor_view v = mx_model_hf_tensor(x->m, j);
        rc = mx_st_writer_reserve(w, v.name, x->dtype, v.shape, v.ndim, diag);
        x->file[j] = k;
    }
    if (!rc) rc = mx_st_writer_data_offsets(w, x->off + begin, diag);
    if (!rc) rc = mx_st_write(w, x->path[k], diag);
    mx_st_writer_free(w);
    return rc;
}

/* The weights of the checkpoint dir into the shard files first[0..shards) of tmp. */
static int write_weights(const char *tmp, const char *dir, const mx_model *m, const int *first, int shards,
                         mx_st_dtype dtype, mx_export_info *info, mx_diag *diag) {
    int J = mx_model_num_hf_tensors(m);
    char source[4200];
    snprintf(source, sizeof source, "%s/model.safetensors", dir);
    mxi_sums *sums = NULL;
    int rc = mxi_sums_open(dir, &sums, diag);
    if (rc) return rc;
    export_sink x = {.m = m, .dtype = dtype, .diag = diag, .sums = sums, .source = source};
    x.file = malloc((size_t)J * sizeof *x.file);
    x.off = malloc((size_t)J * sizeof *x.off);
    x.fd = malloc((size_t)shards * sizeof *x.fd);
    x.path = malloc((size_t)shards * sizeof *x.path);
    x.conv = malloc(CONV * sizeof *x.conv);
    rc = x.file && x.off && x.fd && x.path && x.conv
                 ? MX_OK
                 : mxi_diag(diag, MX_ENOMEM, "out of memory (%zu bytes for the export's tables)",
                            (size_t)J * (sizeof *x.file + sizeof *x.off) + (size_t)shards * (sizeof *x.fd + sizeof *x.path) +
                                CONV * sizeof *x.conv);
    int opened = 0;
    for (int k = 0; k < shards && !rc; k++) {
        int n = shards == 1 ? snprintf(x.path[k], sizeof x.path[k], "%s/model.safetensors", tmp)
                            : snprintf(x.path[k], sizeof x.path[k], "%s/model-%05d-of-%05d.safetensors", tmp, k + 1, shards);
        if (n < 0 || n >= (int)sizeof x.path[k]) rc = mxi_diag(diag, MX_EINVAL, "path too long: %s", tmp);
        if (!rc) rc = lay_out_shard(&x, k, first[k], first[k + 1], diag);
        if (!rc && (x.fd[k] = open(x.path[k], O_WRONLY | O_CLOEXEC)) < 0)
            rc = mxi_diag(diag, MX_EIO, "cannot open '%s' (%s)", x.path[k], strerror(errno));
        if (!rc) opened++;
    }
    if (!rc) rc = mxi_model_read(m, dir, write_tensor, &x, diag);
    for (int k = 0; k < opened; k++) {
        if (!rc && fsync(x.fd[k]) != 0)
            rc = mxi_diag(diag, MX_EIO, "cannot write '%s': fsync failed (%s)", x.path[k], strerror(errno));
        close(x.fd[k]);
    }
    free(x.file), free(x.off), free(x.fd), free(x.path), free(x.conv);
    mxi_sums_free(sums);
    if (info) info->verified = x.verified;
    return rc;
}

/* Everything into the temporary directory tmp. */
static int write_model_dir(const char *tmp, const char *dir, const mx_model_config *mc, const mx_model *m,
                           mx_dtype dtype, uint64_t max_shard, mx_export_info *info, mx_diag *diag) {
    int n = mx_model_num_hf_tensors(m);
    uint64_t elem = dtype == MX_DTYPE_BF16 ? 2 : 4;
    // transformers' rule: a tensor goes into the current shard unless it would then pass the
    // limit; a tensor larger than the limit has a shard of its own
    int *first = malloc((size_t)(n + 1) * sizeof *first), shards = 0;
    if (!first)
        return mxi_diag(diag, MX_ENOMEM, "out of memory (%zu bytes for the shards' first tensors)",
                        (size_t)(n + 1) * sizeof *first);
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
    if (shards > 1 && !map) rc = mxi_diag(diag, MX_ENOMEM, "out of memory building %s's JSON (jansson)", INDEX);
    if (!rc) rc = write_weights(tmp, dir, m, first, shards, st, info, diag);
    for (int k = 0; k < shards && !rc && map; k++) {
        char file[64];
        snprintf(file, sizeof file, "model-%05d-of-%05d.safetensors", k + 1, shards);
        for (int j = first[k]; j < first[k + 1] && !rc; j++)
            if (json_object_set_new(map, mx_model_hf_tensor(m, j).name, json_string(file)))
                rc = mxi_diag(diag, MX_ENOMEM, "out of memory building %s's JSON (jansson; %d tensors in %d shards)",
                              INDEX, n, shards);
    }
    if (!rc && map) {
        json_t *index = json_pack("{s:{s:I}, s:O}", "metadata", "total_size", (json_int_t)total, "weight_map", map);
        char *text = index ? json_dumps(index, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
        json_decref(index);
        if (!text)
            rc = mxi_diag(diag, MX_ENOMEM, "out of memory building %s's JSON (jansson; %d tensors in %d shards)", INDEX,
                          n, shards);
        if (!rc && snprintf(path, sizeof path, "%s/%s", tmp, INDEX) >= (int)sizeof path)
            rc = mxi_diag(diag, MX_EINVAL, "path too long: %s", tmp);
        if (!rc) rc = mxi_write_file(path, text, strlen(text), diag);
        free(text);
    }
    json_decref(map);
    free(first);
    if (info) info->files = shards, info->tensors = n, info->bytes = total;   // info->verified: write_weights
    return rc;
}

/* A delayed recipe's histories and scales go along (`generate --plan` casts with them), as
 * the checkpoint holds them. */
static int copy_delayed_state(const char *out, const char *dir, mx_diag *diag) {
    char from[4200], to[4200];
    struct stat st;
    snprintf(from, sizeof from, "%s/%s", dir, MXI_DELAYED_FILE);
    snprintf(to, sizeof to, "%s/%s", out, MXI_DELAYED_FILE);
    if (stat(from, &st) != 0) return MX_OK;
    return mxi_copy_file(from, to, "the delayed scaling state", UINT64_MAX, NULL, diag);
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
    // the model's shapes and names only: its weights stream from the checkpoint to the files
    mx_model *m = NULL;
    mx_model_options opt = {.batch = 1, .seq = 1, .external_params = true};
    if ((rc = mx_model_create(&mc, &opt, &m, diag))) return rc;
    char tmp[4096];
    if (!(rc = check_out(out, diag)) && !(rc = temp_beside(out, tmp, sizeof tmp, diag))) {
        mxi_remove_tree(tmp);
        if (mkdir(tmp, 0777) != 0)
            rc = mxi_diag(diag, MX_EIO, "--out: cannot create a directory beside '%s' (%s)", out, strerror(errno));
        if (!rc) rc = write_model_dir(tmp, dir, &mc, m, dtype, max_shard_bytes, info, diag);
        // the checkpoint's tokenizer files (tokenizer_files.h) go along
        char tokenizer[4200];
        snprintf(tokenizer, sizeof tokenizer, "%s/tokenizer.json", dir);
        if (!rc && stat(tokenizer, &st) == 0) rc = mxi_tokenizer_files_copy(tmp, dir, "the checkpoint's tokenizer", diag);
        if (!rc) rc = copy_delayed_state(tmp, dir, diag);
        if (!rc && rename(tmp, out) != 0)
            rc = mxi_diag(diag, MX_EIO, "--out: cannot rename '%s' to '%s' (%s)", tmp, out, strerror(errno));
        if (rc) mxi_remove_tree(tmp);
    }
    mx_model_free(m);
    return rc;
}
