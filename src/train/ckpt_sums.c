/* Checksums of a checkpoint's tensors (see ckpt_sums.h): hashed as the ranks write them,
 * joined and written by rank 0, verified on load with the work shared among the ranks. */
#include "train/ckpt_sums.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/diag.h"
#include "core/file.h"
#include "io/checksum.h"
#include "io/io_internal.h"
#include "model/units.h"
#include "mxtrain/safetensors.h"
#include "train/checkpoint.h"

static const char SUMS[] = "checksums.json";
static const char *const FILES[2] = {"model.safetensors", "optimizer.safetensors"};

void mxi_sum_log_add(mxi_sum_log *log, int entry, int64_t start, int64_t count, const float *src) {
    if (log->out_of_memory) return;
    if (log->n == log->cap) {
        size_t cap = log->cap ? 2 * log->cap : 256;
        mxi_sum_piece *grown = realloc(log->pieces, cap * sizeof *grown);
        if (!grown) {
            log->out_of_memory = true;
            return;
        }
        log->pieces = grown, log->cap = cap;
    }
    log->pieces[log->n++] = (mxi_sum_piece){.entry = entry, .start = start, .count = count,
                                            .crc = mxi_crc32(0, src, (size_t)count * sizeof(float))};
}

void mxi_sum_log_free(mxi_sum_log *log) {
    free(log->pieces);
    *log = (mxi_sum_log){0};
}

static int by_entry_then_start(const void *a, const void *b) {
    const mxi_sum_piece *x = a, *y = b;
    if (x->entry != y->entry) return x->entry < y->entry ? -1 : 1;
    return (x->start > y->start) - (x->start < y->start);
}

/* Entry e's file (0 model, 1 optimizer), tensor name and elements. */
static void entry_of(const mx_model *m, int e, int *file, char *name, size_t size, int64_t *numel) {
    int J = mx_model_num_hf_tensors(m);
    if (e < J) {
        mx_tensor_view v = mx_model_hf_tensor(m, e);
        *file = 0, *numel = v.numel;
        snprintf(name, size, "%s", v.name);
        return;
    }
    mx_tensor_view v = mx_model_tensor(m, (e - J) / 2);
    *file = 1, *numel = v.numel;
    snprintf(name, size, "%s.%s", (e - J) % 2 ? "exp_avg_sq" : "exp_avg", v.name);
}

/* Rank 0: the gathered pieces (n, sorted) joined per entry into checksums.json in dir. */
static int write_sums(const char *dir, const mx_model *m, const mxi_sum_piece *p, size_t n, mx_diag *diag) {
    int entries = mx_model_num_hf_tensors(m) + 2 * mx_model_num_tensors(m);
    json_t *root = json_pack("{s:s, s:{s:{}, s:{}}}", "algorithm", "crc32", "files", FILES[0], FILES[1]);
    if (!root) return mxi_diag(diag, MX_ENOMEM, "out of memory building %s's JSON (jansson)", SUMS);
    json_t *files = json_object_get(root, "files");
    int rc = MX_OK;
    size_t k = 0;
    for (int e = 0; e < entries && !rc; e++) {
        int file;
        char name[256], hex[16];
        int64_t numel, covered = 0;
        entry_of(m, e, &file, name, sizeof name, &numel);
        uint32_t crc = 0;
        for (; k < n && p[k].entry == e; k++) {
            if (p[k].start != covered) break;   // a gap or an overlap: caught below
            crc = covered ? mxi_crc32_combine(crc, p[k].crc, (uint64_t)p[k].count * 4) : p[k].crc;
            covered += p[k].count;
        }
        if (covered != numel || (k < n && p[k].entry == e)) {
            rc = mxi_diag(diag, MX_EINVAL, "%s: the pieces written of tensor '%s' do not cover it once (%lld of %lld "
                          "elements)", SUMS, name, (long long)covered, (long long)numel);
            break;
        }
        snprintf(hex, sizeof hex, "%08x", (unsigned)crc);
        if (json_object_set_new(json_object_get(files, FILES[file]), name, json_string(hex)))
            rc = mxi_diag(diag, MX_ENOMEM, "out of memory building %s's JSON (jansson; %d tensors)", SUMS, entries);
    }
    char *text = rc ? NULL : json_dumps(root, JSON_INDENT(2));
    json_decref(root);
    if (!rc && !text)
        rc = mxi_diag(diag, MX_ENOMEM, "out of memory building %s's JSON (jansson; %d tensors)", SUMS, entries);
    char path[4096];
    if (!rc && snprintf(path, sizeof path, "%s/%s", dir, SUMS) >= (int)sizeof path)
        rc = mxi_diag(diag, MX_EINVAL, "path too long: %s/%s", dir, SUMS);
    if (!rc) rc = mxi_write_file(path, text, strlen(text), diag);
    free(text);
    return rc;
}

int mxi_sums_save(const char *dir, const mx_model *m, mxi_comm *comm, const mxi_sum_log *log, int *file_rc,
                  mx_diag *diag) {
    bool root = mxi_comm_rank(comm) == 0;
    int world = mxi_comm_world(comm);
    double most[2] = {(double)log->n, log->out_of_memory};
    int rc = mxi_comm_allreduce_max(comm, most, 2, "training.save: the checksums' pieces", diag);
    if (rc) return rc;
    *file_rc = MX_OK;
    size_t each = (size_t)most[0];
    mxi_sum_piece *send = calloc(each ? each : 1, sizeof *send), *all = NULL;
    if (root) all = calloc(each * (size_t)world + 1, sizeof *all);
    double missing = !send || (root && !all) || most[1] > 0;
    // every rank learns whether any could not hold the pieces, so that none gathers alone
    if ((rc = mxi_comm_allreduce_max(comm, &missing, 1, "training.save: the checksums' memory", diag))) goto done;
    if (missing) {
        *file_rc = mxi_diag(diag, MX_ENOMEM, "out of memory gathering the checkpoint's checksums (%zu bytes on each "
                            "rank, %zu more on rank 0)", (each ? each : 1) * sizeof *send,
                            (each * (size_t)world + 1) * sizeof *all);
        goto done;
    }
    for (size_t i = 0; i < each; i++) send[i] = i < log->n ? log->pieces[i] : (mxi_sum_piece){.entry = -1};
    if (each > 0 &&
        (rc = mxi_comm_gather(comm, send, all, each * sizeof *send, 0, "training.save: the checksums", diag)))
        goto done;
    if (root) {
        size_t n = 0;
        for (size_t i = 0; i < each * (size_t)world; i++)
            if (all[i].entry >= 0) all[n++] = all[i];
        qsort(all, n, sizeof *all, by_entry_then_start);
        *file_rc = write_sums(dir, m, all, n, diag);
    }
done:
    free(send), free(all);
    return rc;
}

/* ---- reading ---- */

struct mxi_sums {
    json_t *files;   // {file: {tensor: "hex"}}
    json_t *root;
};

void mxi_sums_free(mxi_sums *s) {
    if (!s) return;
    json_decref(s->root);
    free(s);
}

int mxi_sums_open(const char *dir, mxi_sums **out, mx_diag *diag) {
    *out = NULL;
    char path[4096];
    struct stat st;
    if (snprintf(path, sizeof path, "%s/%s", dir, SUMS) >= (int)sizeof path)
        return mxi_diag(diag, MX_EINVAL, "path too long: %s/%s", dir, SUMS);
    if (stat(path, &st) != 0) return MX_OK;
    json_t *root;
    int rc = mxi_read_json(path, "a checkpoint's checksums.json", MXI_MAX_INDEX_BYTES, &root, diag);
    if (rc) return rc;
    json_t *files = json_object_get(root, "files");
    const char *algo = json_string_value(json_object_get(root, "algorithm"));
    bool ok = algo && !strcmp(algo, "crc32") && json_is_object(files);
    const char *file, *name;
    json_t *tensors, *hex;
    json_object_foreach(files, file, tensors) {
        if (!json_is_object(tensors)) ok = false;
        json_object_foreach(tensors, name, hex) {
            const char *h = json_string_value(hex);
            if (!h || strlen(h) != 8 || strspn(h, "0123456789abcdef") != 8) ok = false;
        }
    }
    if (!ok) {
        json_decref(root);
        return mxi_diag(diag, MX_EFORMAT, "%s: expected {\"algorithm\": \"crc32\", \"files\": {FILE: {TENSOR: "
                        "8 hex digits}}}", path);
    }
    mxi_sums *s = malloc(sizeof *s);
    if (!s) {
        json_decref(root);
        return mxi_diag(diag, MX_ENOMEM, "%s: out of memory (%zu bytes)", path, sizeof *s);
    }
    *s = (mxi_sums){.root = root, .files = files};
    *out = s;
    return MX_OK;
}

bool mxi_sums_get(const mxi_sums *s, const char *file, const char *tensor, uint32_t *crc) {
    const char *h = json_string_value(json_object_get(json_object_get(s->files, file), tensor));
    if (!h) return false;
    *crc = (uint32_t)strtoul(h, NULL, 16);
    return true;
}

int mxi_sums_mismatch(const char *path, const char *tensor, uint32_t got, uint32_t want, mx_diag *diag) {
    return mxi_diag(diag, MX_EFORMAT, "%s: tensor '%s' does not match its checksum (crc32 %08x, checksums.json "
                    "records %08x): the file is damaged", path, tensor, (unsigned)got, (unsigned)want);
}

/* This rank's share of file's tensors: those whose turn (*turn, counted over both files)
 * falls to it. */
static int verify_file(const char *dir, const mxi_sums *s, int f, int rank, int world, int64_t *turn, mx_diag *diag) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, FILES[f]);
    mx_st_file *file = NULL;
    int rc = mx_st_open(path, &file, diag);
    if (rc) return rc;
    for (int i = 0; i < mx_st_count(file) && !rc; i++) {
        const char *name = mx_st_get(file, i)->name;
        uint32_t want, got;
        if (!mxi_sums_get(s, FILES[f], name, &want))
            rc = mxi_diag(diag, MX_EFORMAT, "%s: tensor '%s' has no checksum in %s/%s", path, name, dir, SUMS);
        else if ((*turn)++ % world == rank && !(rc = mxi_st_tensor_crc32(file, name, &got, diag)) && got != want)
            rc = mxi_sums_mismatch(path, name, got, want, diag);
    }
    const char *name;
    json_t *hex;
    json_object_foreach(json_object_get(s->files, FILES[f]), name, hex) {
        if (rc) break;
        if (!mx_st_find(file, name))
            rc = mxi_diag(diag, MX_EFORMAT, "%s: tensor '%s' of %s/%s is missing from the file", path, name, dir, SUMS);
    }
    mx_st_close(file);
    return rc;
}

int mxi_checkpoint_verify(const char *dir, mxi_comm *comm, bool *had_sums, mx_diag *diag) {
    mxi_sums *s = NULL;
    int rc = mxi_sums_open(dir, &s, diag);   // every rank reads the same file: the same outcome
    *had_sums = s != NULL;
    if (rc || !s) return rc;
    int64_t turn = 0;
    for (int f = 0; f < 2 && !rc; f++) rc = verify_file(dir, s, f, mxi_comm_rank(comm), mxi_comm_world(comm), &turn, diag);
    mxi_sums_free(s);
    double failed = rc != 0;
    int crc = mxi_comm_allreduce_max(comm, &failed, 1, "training.load: whether a rank found a damaged tensor", diag);
    if (crc) return crc;
    if (failed && !rc)
        return mxi_diag(diag, MX_EFORMAT, "another rank found a tensor of '%s' that does not match its checksum "
                        "(its message names it)", dir);
    return rc;
}
