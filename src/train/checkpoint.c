/* Weights and checkpoints of a sharded model: every rank reads its own rows, and writes
 * them into the consolidated files rank 0 lays out (or, where the ranks do not share the save
 * directory, rank 0 gathers and writes them one tensor at a time); see train.h. */
#include "train/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/diag.h"
#include "core/file.h"
#include "io/io_internal.h"
#include "mxtrain/config.h"
#include "model/units.h"
#include "mxtrain/safetensors.h"
#include "train/ckpt_scales.h"
#include "train/ckpt_sums.h"
#include "train/tokenizer_files.h"

/* out = dir/name; a path that does not fit is an error, never a truncated name. */
static int path_in(char *out, size_t size, const char *dir, const char *name, mx_diag *diag) {
    int n = snprintf(out, size, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= size) return mxi_diag(diag, MX_EINVAL, "path too long: %s/%s", dir, name);
    return MX_OK;
}

/* Where this rank's rows of a tensor go in a shard buffer (its padding zeroed on the way). */
typedef struct {
    const mxi_fsdp *f;
    float *shards;   // master weights (the whole shard, origin 0), or one tensor's span of a moment
    int64_t origin;  // the shard element shards[0] stands for
} own_rows;

static bool own_part(void *ctx, int tensor, int k, int64_t *start, int64_t *count, float **dst) {
    own_rows *o = ctx;
    mxi_shard_piece p;
    if (!mxi_fsdp_piece(o->f, tensor, k, true, &p)) return false;
    float *at = o->shards + (p.offset - o->origin);
    memset(at + p.count, 0, (size_t)(p.slot - p.count) * sizeof(float));
    *start = p.start, *count = p.count, *dst = at;
    return true;
}

int mxi_load_sharded_weights(const char *path, mx_model *m, mxi_fsdp *f, mx_diag *diag) {
    own_rows o = {.f = f, .shards = mxi_fsdp_master(f)};
    return mxi_model_read_parts(m, path, own_part, &o, diag);
}

void mxi_init_sharded_weights(mx_model *m, mxi_fsdp *f, uint64_t seed, float *scratch) {
    for (int i = 0; i < mx_model_num_tensors(m); i++) {
        mxi_model_init_tensor(m, i, seed, scratch);
        mxi_fsdp_scatter_tensor(f, i, scratch, mxi_fsdp_master(f));
    }
}

/* ---- checkpoints ---- */

static const char LATEST[] = "latest_checkpointed_iteration.txt";
static const char SHARED_TOKEN[] = ".ranks_see_this";   // mxi_checkpoint_shared's

int mxi_remove_tree(const char *path) {
    DIR *d = opendir(path);
    if (!d) return unlink(path) == 0 || errno == ENOENT ? 0 : -1;
    struct dirent *e;
    char p[4096];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", path, e->d_name);
        unlink(p);
    }
    closedir(d);
    return rmdir(path);
}

/* Every rank learns whether any rank failed (collective), so that all stop together; who
 * did the work that could fail names it for the others ("rank 0" when only rank 0 did the
 * file work). Returns this rank's own error rc, an MPI error, or on the other ranks
 * "training.save: WHO could not WHAT 'PATH'". */
static int agree(mxi_comm *comm, int rc, const char *who, const char *what, const char *path, mx_diag *diag) {
    double failed = rc ? 1 : 0;
    char why[96];
    snprintf(why, sizeof why, "training.save: whether %s could %s", who, what);
    int crc = mxi_comm_allreduce_max(comm, &failed, 1, why, diag);
    if (crc) return crc;
    if (failed && !rc) return mxi_diag(diag, MX_EIO, "training.save: %s could not %s '%s'", who, what, path);
    return rc;
}

static int agree_with_rank0(mxi_comm *comm, int rc, const char *what, const char *path, mx_diag *diag) {
    return agree(comm, rc, "rank 0", what, path, diag);
}

/* Rank 0, at the start of a run, holding the save directory's lock (save_dir.h), so that
 * nothing in it belongs to a live run: what killed saves left there. A .tmp_iter_N.RUN
 * directory (a save that did not finish), a temporary latest file, a shared-directory token
 * and a writability probe (.probe.RUN) are removed; a .old_iter_N directory (a checkpoint moved aside while the same step was saved
 * again) is put back when iter_N is missing, else removed. */
static void clean_leftovers(const char *save) {
    DIR *d = opendir(save);
    if (!d) return;
    struct dirent *e;
    char p[4096], dir[4096];
    static const char latest_tmp[] = ".latest_checkpointed_iteration.txt.tmp-";
    while ((e = readdir(d))) {
        const char *n = e->d_name;
        if (snprintf(p, sizeof p, "%s/%s", save, n) >= (int)sizeof p) continue;
        if (!strncmp(n, ".tmp_iter_", 10) || !strncmp(n, ".probe.", 7)) {
            mxi_remove_tree(p);
        } else if (!strncmp(n, latest_tmp, sizeof latest_tmp - 1) || !strcmp(n, SHARED_TOKEN)) {
            unlink(p);
        } else if (!strncmp(n, ".old_iter_", 10)) {
            struct stat st;
            if (snprintf(dir, sizeof dir, "%s/%s", save, n + 5) >= (int)sizeof dir) continue;
            if (stat(dir, &st) == 0) mxi_remove_tree(p);
            else rename(p, dir);
        }
    }
    closedir(d);
}

int mxi_checkpoint_clean(const char *save, mxi_comm *comm, mx_diag *diag) {
    if (mxi_comm_rank(comm) == 0) clean_leftovers(save);
    return agree_with_rank0(comm, MX_OK, "clean", save, diag);   // no rank loads before it is done
}

int mxi_write_file(const char *path, const void *data, size_t n, mx_diag *diag) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0) return mxi_diag(diag, MX_EIO, "cannot write '%s' (%s)", path, strerror(errno));
    const char *p = data;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) {
            int e = errno;
            close(fd);
            return mxi_diag(diag, MX_EIO, "cannot write '%s' (%s)", path, strerror(e));
        }
        p += w, n -= (size_t)w;
    }
    if (fsync(fd) != 0) {
        int e = errno;
        close(fd);
        return mxi_diag(diag, MX_EIO, "cannot write '%s': fsync failed (%s)", path, strerror(e));
    }
    if (close(fd) != 0) return mxi_diag(diag, MX_EIO, "cannot write '%s': close failed (%s)", path, strerror(errno));
    return MX_OK;
}

int mxi_copy_file(const char *from, const char *to, const char *what, uint64_t max, const char *key, mx_diag *diag) {
    char *data;
    size_t len;
    int rc = mxi_read_input(from, what, max, &data, &len, diag);
    if (rc) {
        if (!key) return rc;
        mx_diag inner = *diag;
        return mxi_diag(diag, rc, "%s: %s", key, inner.msg);
    }
    rc = mxi_write_file(to, data, len, diag);
    free(data);
    return rc;
}

static void sync_dir(const char *path) {
    int fd = open(path, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) fsync(fd), close(fd);
}

/* The two safetensors files of a checkpoint: model.safetensors, the model as a Hugging Face
 * model directory holds it (HF names, PyTorch's format tag), and optimizer.safetensors, the
 * moments of every tensor (exp_avg.NAME, exp_avg_sq.NAME; tensor i's are entries 2i, 2i + 1).
 * Laid out with their data reserved, for the ranks (or rank 0) to write into. */
typedef struct {
    mx_st_writer *model, *optim;
} ckpt_files;

static void files_free(ckpt_files *c) {
    mx_st_writer_free(c->model);
    mx_st_writer_free(c->optim);
}

static int files_of(mx_model *m, ckpt_files *c, mx_diag *diag) {
    *c = (ckpt_files){0};
    int rc = mxi_st_writer_new(&c->model, diag);
    if (!rc) rc = mxi_st_writer_new(&c->optim, diag);
    if (rc) {
        files_free(c);
        return rc;
    }
    rc = mx_st_writer_set_metadata(c->model, "format", "pt", diag);
    for (int j = 0; j < mx_model_num_hf_tensors(m) && !rc; j++) {
        mx_tensor_view v = mx_model_hf_tensor(m, j);
        rc = mx_st_writer_reserve(c->model, v.name, MX_ST_F32, v.shape, v.ndim, diag);
    }
    if (!rc) rc = mx_st_writer_set_metadata(c->optim, "format", "pt", diag);
    for (int i = 0; i < mx_model_num_tensors(m) && !rc; i++) {
        mx_tensor_view v = mx_model_tensor(m, i);
        for (int k = 0; k < 2 && !rc; k++) {
            char name[256];
            snprintf(name, sizeof name, "%s.%s", k ? "exp_avg_sq" : "exp_avg", v.name);
            rc = mx_st_writer_reserve(c->optim, name, MX_ST_F32, v.shape, v.ndim, diag);
        }
    }
    if (rc) files_free(c);
    return rc;
}

static int write_safetensors(const char *dir, const ckpt_files *c, mx_diag *diag) {
    char path[4096];
    int rc = path_in(path, sizeof path, dir, "model.safetensors", diag);
    if (!rc) rc = mx_st_write(c->model, path, diag);
    if (!rc) rc = path_in(path, sizeof path, dir, "optimizer.safetensors", diag);
    if (!rc) rc = mx_st_write(c->optim, path, diag);
    return rc;
}

/* Rank 0: config.json and trainer_state.json beside the safetensors files. */
static int write_config_and_state(const char *dir, const mx_model_config *hf, const mxi_train_state *st,
                                  mx_diag *diag) {
    char path[4096];
    int rc = path_in(path, sizeof path, dir, "config.json", diag);
    if (!rc) rc = mx_hf_config_save(hf, "float32", path, diag);
    if (!rc && st->tokenizer) rc = mxi_tokenizer_files_copy(dir, st->tokenizer, st->tokenizer_key, diag);
    if (rc) return rc;
    // the layout is for information: a checkpoint loads on any layout
    int dp = st->data_parallel_size > 0 ? st->data_parallel_size : 1;
    json_t *j = json_pack("{s:I, s:{s:I, s:I, s:I}, s:I, s:i, s:i, s:i}", "step", (json_int_t)st->step, "data",
                          "shard", (json_int_t)st->data.shard, "offset", (json_int_t)st->data.offset, "epoch",
                          (json_int_t)st->data.epoch, "seed", (json_int_t)st->seed, "world", st->world,
                          "data_parallel_size", dp, "fully_shard_parallel_size", st->world / dp);
    if (j && st->data.n_datasets > 0) {   // a blend: the rows taken from each dataset
        json_t *rows = json_array(), *data = json_object_get(j, "data");
        for (int d = 0; rows && d < st->data.n_datasets; d++)
            if (json_array_append_new(rows, json_integer((json_int_t)st->data.rows[d]))) json_decref(rows), rows = NULL;
        if (!rows || json_object_set_new(data, "rows", rows)) json_decref(j), j = NULL;
    }
    if (j && st->expert_parallel_size > 0 &&
        (json_object_set_new(j, "expert_parallel_size", json_integer(st->expert_parallel_size)) ||
         json_object_set_new(j, "expert_fully_shard_parallel_size", json_integer(st->expert_fully_shard_parallel_size)) ||
         json_object_set_new(j, "expert_data_parallel_size", json_integer(st->expert_data_parallel_size)))) {
        json_decref(j);
        j = NULL;
    }
    if (j && st->run) {   // resume.c's record of the run, compared when it resumes
        json_t *run = json_loads(st->run, 0, NULL);
        if (!run || json_object_set_new(j, "run", run)) json_decref(j), j = NULL;
    }
    char *text = j ? json_dumps(j, JSON_INDENT(2)) : NULL;
    json_decref(j);
    if (!text)
        return mxi_diag(diag, MX_ENOMEM, "out of memory building trainer_state.json's JSON (jansson; the run's record "
                        "is %zu bytes)", st->run ? strlen(st->run) : 0);
    rc = path_in(path, sizeof path, dir, "trainer_state.json", diag);
    if (!rc) rc = mxi_write_file(path, text, strlen(text), diag);
    free(text);
    return rc;
}

/* Rank 0: move the finished temporary directory into place and point latest at it. The new
 * latest file is written (under a temporary name) before the directory is renamed, and
 * renamed over latest right after; when any of it fails, what was done is undone: an
 * iter_N is never published without latest naming it. */
static int publish(const char *save, const char *tmp, const char *dir, int64_t step, mx_diag *diag) {
    sync_dir(tmp);
    char latest[4096], text[32];
    int rc = path_in(latest, sizeof latest, save, LATEST, diag);
    if (rc) return rc;
    mxi_atomic a;
    int n = snprintf(text, sizeof text, "%lld\n", (long long)step);
    rc = mxi_atomic_begin(&a, latest, diag);
    if (rc) return rc;
    rc = mxi_atomic_write(&a, text, (size_t)n, diag);
    if (!rc) rc = mxi_atomic_close(&a, diag);
    if (rc) {
        mxi_atomic_abort(&a);
        return rc;
    }
    // a checkpoint of the same step already there (a re-run) is moved aside, not deleted,
    // until the new one is in place and named by latest
    char old[4096];
    struct stat st;
    snprintf(old, sizeof old, "%s/.old_iter_%07lld", save, (long long)step);
    bool replacing = stat(dir, &st) == 0;
    if (replacing && (mxi_remove_tree(old), rename(dir, old) != 0)) {
        int e = errno;
        mxi_atomic_abort(&a);
        return mxi_diag(diag, MX_EIO, "cannot move '%s' aside (%s)", dir, strerror(e));
    }
    if (rename(tmp, dir) != 0) {
        int e = errno;
        if (replacing) rename(old, dir);
        mxi_atomic_abort(&a);
        return mxi_diag(diag, MX_EIO, "cannot rename '%s' to '%s' (%s)", tmp, dir, strerror(e));
    }
    if ((rc = mxi_atomic_rename(&a, diag))) {   // removes the temporary latest file
        rename(dir, tmp);   // unpublished again; the caller removes it
        if (replacing) rename(old, dir);
        mxi_atomic_free(&a);
        return rc;
    }
    mxi_atomic_free(&a);
    sync_dir(save);
    if (replacing) mxi_remove_tree(old);
    return MX_OK;
}

int mxi_pwrite_all(int fd, const void *data, size_t n, uint64_t at, const char *path, mx_diag *diag) {
    const char *p = data;
    while (n > 0) {
        ssize_t w = pwrite(fd, p, n, (off_t)at);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return mxi_diag(diag, MX_EIO, "cannot write '%s' (%s)", path, strerror(w < 0 ? errno : EIO));
        p += w, n -= (size_t)w, at += (uint64_t)w;
    }
    return MX_OK;
}

static int open_laid_out(const char *dir, const char *name, char *path, size_t size, int *fd, mx_diag *diag) {
    int rc = path_in(path, size, dir, name, diag);
    if (rc) return rc;
    *fd = open(path, O_WRONLY | O_CLOEXEC);
    if (*fd < 0) return mxi_diag(diag, MX_EIO, "cannot open '%s' to write this rank's rows (%s)", path, strerror(errno));
    return MX_OK;
}

static int close_written(int fd, const char *path, int rc, mx_diag *diag) {
    if (!rc && fsync(fd) != 0) rc = mxi_diag(diag, MX_EIO, "cannot write '%s': fsync failed (%s)", path, strerror(errno));
    if (close(fd) != 0 && !rc) rc = mxi_diag(diag, MX_EIO, "cannot write '%s': close failed (%s)", path, strerror(errno));
    return rc;
}

/* The data offsets of the files files_of lays out: model.safetensors' J, then
 * optimizer.safetensors' 2n (tensor i's moments at J + 2i, J + 2i + 1). */
static int data_offsets(mx_model *m, const ckpt_files *c, uint64_t **out, mx_diag *diag) {
    int J = mx_model_num_hf_tensors(m), n = mx_model_num_tensors(m);
    uint64_t *off = malloc(((size_t)J + 2 * (size_t)n) * sizeof *off);
    int rc = off ? mx_st_writer_data_offsets(c->model, off, diag)
                 : mxi_diag(diag, MX_ENOMEM, "out of memory (%zu bytes of data offsets)",
                            ((size_t)J + 2 * (size_t)n) * sizeof *off);
    if (!rc) rc = mx_st_writer_data_offsets(c->optim, off + J, diag);
    if (rc) free(off), off = NULL;
    *out = off;
    return rc;
}

/* Elements [start, start + count) of model tensor t, at src, into model.safetensors (fd,
 * data offsets off): each HF tensor that is a slice of t gets the part that falls in it. */
static int write_weights_part(int fd, const char *path, mx_model *m, const uint64_t *off, int t, int64_t start,
                              int64_t count, const float *src, mxi_sum_log *log, mx_diag *diag) {
    int rc = MX_OK, first, last;
    mxi_model_hf_range(m, t, &first, &last);
    for (int j = first; j < last && !rc; j++) {
        int tj;
        int64_t within;
        mxi_model_hf_slice(m, j, &tj, &within);
        int64_t end = within + mx_model_hf_tensor(m, j).numel;
        int64_t lo = start > within ? start : within, hi = start + count < end ? start + count : end;
        if (lo < hi) {
            mxi_sum_log_add(log, j, lo - within, hi - lo, src + (lo - start));
            rc = mxi_pwrite_all(fd, src + (lo - start), (size_t)(hi - lo) * 4, off[j] + (uint64_t)(lo - within) * 4,
                                path, diag);
        }
    }
    return rc;
}

/* Elements [start, start + count) of moment v of model tensor i, at src, into
 * optimizer.safetensors (fd, data offsets off). */
static int write_moment_part(int fd, const char *path, mx_model *m, const uint64_t *off, int i, int v,
                             int64_t start, int64_t count, const float *src, mxi_sum_log *log, mx_diag *diag) {
    int e = mx_model_num_hf_tensors(m) + 2 * i + v;
    if (count > 0) mxi_sum_log_add(log, e, start, count, src);
    return mxi_pwrite_all(fd, src, (size_t)count * 4, off[e] + (uint64_t)start * 4, path, diag);
}

/* The two laid-out files of a checkpoint, open for writing into. */
typedef struct {
    int model, optim;
    char model_path[4096], optim_path[4096];
} open_files;

static int open_files_in(const char *dir, open_files *o, mx_diag *diag) {
    o->model = o->optim = -1;
    int rc = open_laid_out(dir, "model.safetensors", o->model_path, sizeof o->model_path, &o->model, diag);
    if (!rc) rc = open_laid_out(dir, "optimizer.safetensors", o->optim_path, sizeof o->optim_path, &o->optim, diag);
    return rc;
}

/* fsync and close both; rc is the writes' result so far. */
static int close_files(open_files *o, int rc, mx_diag *diag) {
    if (o->model >= 0) rc = close_written(o->model, o->model_path, rc, diag);
    if (o->optim >= 0) rc = close_written(o->optim, o->optim_path, rc, diag);
    o->model = o->optim = -1;
    return rc;
}

/* Every rank: its rows of every tensor, written into the files rank 0 laid out in dir:
 * master weights into model.safetensors, the two moments into optimizer.safetensors, each
 * piece at its place, then fsync. */
static int write_rows(const char *dir, mx_model *m, mxi_fsdp *f, const mxi_moment *moments, float *scratch,
                      const ckpt_files *c, mxi_sum_log *log, mx_diag *diag) {
    uint64_t *off;
    int rc = data_offsets(m, c, &off, diag);
    if (rc) return rc;
    open_files o;
    rc = open_files_in(dir, &o, diag);
    const float *master = mxi_fsdp_master(f);
    for (int i = 0; i < mx_model_num_tensors(m) && !rc; i++) {
        mxi_shard_piece p;
        mxi_shard_span s = mxi_fsdp_span(f, i);
        for (int k = 0; !rc && mxi_fsdp_piece(f, i, k, false, &p); k++)
            rc = write_weights_part(o.model, o.model_path, m, off, i, p.start, p.count, master + p.offset, log, diag);
        for (int v = 0; v < 2 && !rc; v++) {   // each moment's span in fp32 (read into scratch unless stored so)
            const float *span = mxi_moment_span(&moments[v], i, s.offset, s.numel, scratch);
            for (int k = 0; !rc && mxi_fsdp_piece(f, i, k, false, &p); k++)
                rc = write_moment_part(o.optim, o.optim_path, m, off, i, v, p.start, p.count, span + (p.offset - s.offset),
                                       log, diag);
        }
    }
    free(off);
    return close_files(&o, rc, diag);
}

/* Every rank (collective): rank 0 assembles each tensor in turn from the ranks' rows (its
 * weights, then each moment, in buf: the largest tensor's numel) and writes it into the
 * files it laid out in dir. After a write error rank 0 goes on gathering, writing no more,
 * so that no rank waits. Returns an MPI error (which stops every rank at once); rank 0's
 * file errors go to *file_rc. */
static int write_gathered(const char *dir, mx_model *m, mxi_fsdp *f, const mxi_moment *moments, float *scratch,
                          const ckpt_files *c, float *buf, int *file_rc, mxi_sum_log *log, mx_diag *diag) {
    bool root = buf != NULL;
    uint64_t *off = NULL;
    open_files o = {.model = -1, .optim = -1};
    int rc = MX_OK;   // rank 0's file errors, into *file_rc
    if (root && !(rc = data_offsets(m, c, &off, diag))) rc = open_files_in(dir, &o, diag);
    for (int i = 0; i < mx_model_num_tensors(m); i++) {
        int64_t numel = mx_model_tensor(m, i).numel;
        mxi_shard_span s = mxi_fsdp_span(f, i);
        for (int v = -1; v < 2; v++) {   // the weights, then moments 0 and 1
            mx_diag gd;
            const float *span = v < 0 ? mxi_fsdp_master(f) + s.offset
                                      : mxi_moment_span(&moments[v], i, s.offset, s.numel, scratch);
            int grc = mxi_fsdp_gather_tensor(f, i, span, buf, &gd);
            if (grc) {
                free(off);
                close_files(&o, grc, NULL);
                if (diag) *diag = gd;
                *file_rc = MX_OK;
                return grc;
            }
            if (root && !rc)
                rc = v < 0 ? write_weights_part(o.model, o.model_path, m, off, i, 0, numel, buf, log, diag)
                           : write_moment_part(o.optim, o.optim_path, m, off, i, v, 0, numel, buf, log, diag);
        }
    }
    free(off);
    *file_rc = root ? close_files(&o, rc, diag) : MX_OK;
    return MX_OK;
}

/* This rank's own error rc, its message prefixed with "training.save: ". */
static int with_prefix(mx_diag *diag, int rc) {
    char why[sizeof diag->msg];
    snprintf(why, sizeof why, "%s", diag ? diag->msg : "");
    return mxi_diag(diag, rc, "training.save: %s", why);
}

/* This rank's own error rc (crc == rc), prefixed; another rank's, as agree gave it. */
static int own_or_other(mx_diag *diag, int crc, int rc) {
    return crc && crc == rc ? with_prefix(diag, crc) : crc;
}

int mxi_checkpoint_shared(const char *dir, mxi_comm *comm, bool *shared, mx_diag *diag) {
    char path[4096], text[32] = "", got[32] = "";
    int rc = path_in(path, sizeof path, dir, SHARED_TOKEN, diag);
    if (rc) return rc;
    double token = 0;
    if (mxi_comm_rank(comm) == 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t x = ((uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)ts.tv_sec << 20) ^ (uint64_t)getpid();
        token = (double)(x >> 12);   // exact in a double, which the all-reduce carries
        snprintf(text, sizeof text, "%.0f", token);
        rc = mxi_write_file(path, text, strlen(text), diag);
    }
    // rank 0 cannot write there: its reason, not "not one shared directory"
    if ((rc = own_or_other(diag, agree_with_rank0(comm, rc, "write in", dir, diag), rc))) return rc;
    rc = mxi_comm_allreduce_max(comm, &token, 1, "training.save: the shared-directory token", diag);
    if (rc) return rc;
    snprintf(text, sizeof text, "%.0f", token);
    FILE *fp = fopen(path, "r");
    if (fp) {
        if (!fgets(got, sizeof got, fp)) got[0] = '\0';
        fclose(fp);
    }
    double missing = strcmp(got, text) != 0;
    // a rank that sees the directory writes its rows into the files rank 0 lays out there:
    // it must be able to open them for writing (a read-only mount on its host cannot)
    int fd = missing ? -1 : open(path, O_WRONLY | O_CLOEXEC);
    if (!missing && fd < 0)
        rc = mxi_diag(diag, MX_EIO, "training.save: rank %d cannot write in '%s' (%s)", mxi_comm_rank(comm), dir,
                      strerror(errno));
    if (fd >= 0) close(fd);
    if ((rc = agree(comm, rc, "another rank", "write in", dir, diag))) return rc;
    rc = mxi_comm_allreduce_max(comm, &missing, 1, "training.save: whether every rank sees the save directory", diag);
    if (rc) return rc;
    *shared = missing == 0;
    if (mxi_comm_rank(comm) == 0) unlink(path);
    return MX_OK;
}

/* Rank 0 (buf: one whole tensor) writes each tensor as write_gathered assembles it. */
static int save_gathered(const char *tmp, mx_model *m, mxi_fsdp *f, const mxi_moment *moments, float *scratch,
                         mxi_comm *comm, const ckpt_files *c, mxi_sum_log *log, mx_diag *diag) {
    float *buf = NULL;
    int64_t most = mxi_model_largest_tensor(m);
    int rc = MX_OK;
    if (mxi_comm_rank(comm) == 0 && !(buf = malloc((size_t)most * sizeof(float))))
        rc = mxi_diag(diag, MX_ENOMEM, "out of memory assembling the checkpoint (%zu bytes for a tensor of %lld "
                      "parameters)", (size_t)most * sizeof(float), (long long)most);
    int crc = own_or_other(diag, agree_with_rank0(comm, rc, "allocate the checkpoint in", tmp, diag), rc);
    if (!crc && !(crc = write_gathered(tmp, m, f, moments, scratch, c, buf, &rc, log, diag)))
        crc = own_or_other(diag, agree_with_rank0(comm, rc, "write", tmp, diag), rc);
    free(buf);
    return crc;
}

/* The step N of a directory entry named iter_N, or -1. */
static long long iter_step(const char *name) {
    const char *digits = name + 5;
    if (strncmp(name, "iter_", 5) || !*digits || strspn(digits, "0123456789") != strlen(digits) || strlen(digits) > 18)
        return -1;
    return atoll(digits);
}

static int descending(const void *a, const void *b) {
    long long x = *(const long long *)a, y = *(const long long *)b;
    return (x < y) - (x > y);
}

/* Rank 0, once step's checkpoint is published: keep the `keep` newest iter_N with N <= step
 * (step's own among them) and remove the older ones. Those of later steps (left by a run
 * past the step this one resumed from) are not this run's and stay. Each goes to .tmp_iter_N.RUN
 * before its files are removed, so that a job killed half-way leaves what the next start
 * cleans, never an iter_N without its files that a load would take. */
static int remove_old(const char *save, const char *run_id, int64_t step, int keep, mx_diag *diag) {
    DIR *d = opendir(save);
    if (!d) return mxi_diag(diag, MX_EIO, "training.keep_latest_k: cannot read '%s' (%s)", save, strerror(errno));
    long long *steps = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    int rc = MX_OK;
    while (!rc && (e = readdir(d))) {
        long long s = iter_step(e->d_name);
        if (s < 0 || s > step) continue;
        if (n == cap) {
            long long *grown = realloc(steps, (cap = cap ? 2 * cap : 16) * sizeof *steps);
            if (!grown)
                rc = mxi_diag(diag, MX_ENOMEM, "training.keep_latest_k: out of memory listing '%s' (%zu bytes)", save,
                              cap * sizeof *steps);
            else steps = grown;
        }
        if (!rc) steps[n++] = s;
    }
    closedir(d);
    if (!rc) qsort(steps, n, sizeof *steps, descending);
    for (size_t i = (size_t)keep; !rc && i < n; i++) {
        char dir[4096], gone[4096];
        snprintf(dir, sizeof dir, "%s/iter_%07lld", save, steps[i]);
        snprintf(gone, sizeof gone, "%s/.tmp_iter_%07lld.%s", save, steps[i], run_id);
        mxi_remove_tree(gone);
        if (rename(dir, gone) != 0 || mxi_remove_tree(gone) != 0)
            rc = mxi_diag(diag, MX_EIO, "training.keep_latest_k: cannot remove the old checkpoint '%s' (%s)", dir,
                          strerror(errno));
    }
    free(steps);
    if (!rc) sync_dir(save);
    return rc;
}

/* A span of every tensor's moments in fp32, unless they are stored so (NULL then): *out. */
static int moment_scratch(mxi_fsdp *f, const mxi_moment *moments, int n_tensors, float **out, mx_diag *diag) {
    *out = NULL;
    if (moments[0].dtype == MX_STATE_FP32 && moments[1].dtype == MX_STATE_FP32) return MX_OK;
    int64_t most = 1;
    for (int i = 0; i < n_tensors; i++) {
        int64_t n = mxi_fsdp_span(f, i).numel;
        most = n > most ? n : most;
    }
    if (!(*out = malloc((size_t)most * sizeof(float))))
        return mxi_diag(diag, MX_ENOMEM, "out of memory for the optimizer moments of a tensor in fp32 (%zu bytes)",
                        (size_t)most * sizeof(float));
    return MX_OK;
}

int mxi_checkpoint_save(const char *save, const char *run_id, const mx_model_config *hf, mx_model *m, mxi_fsdp *f,
                        const mxi_moment *moments, mxi_comm *comm, const mxi_train_state *st, bool parallel,
                        int keep_latest, char *dir_out, size_t dir_size, mx_diag *diag) {
    bool root = mxi_comm_rank(comm) == 0;
    char dir[4096], tmp[4096];
    snprintf(dir, sizeof dir, "%s/iter_%07lld", save, (long long)st->step);
    snprintf(tmp, sizeof tmp, "%s/.tmp_iter_%07lld.%s", save, (long long)st->step, run_id);
    if (dir_out) snprintf(dir_out, dir_size, "%s", dir);
    int rc = MX_OK;
    if (root) {
        if (mxi_make_dirs(save) != 0)
            rc = mxi_diag(diag, MX_EIO, "training.save: cannot create the directory '%s' (%s)", save, strerror(errno));
        if (!rc && (mxi_remove_tree(tmp), mkdir(tmp, 0777) != 0))
            rc = mxi_diag(diag, MX_EIO, "training.save: cannot create '%s' (%s)", tmp, strerror(errno));
    }
    // every rank takes part in every collective, whatever rank 0's state: a rank that stopped
    // early would leave the others waiting
    int crc = agree_with_rank0(comm, rc, "prepare", tmp, diag);
    if (crc) return crc;
    // rank 0 lays the files out; then each rank writes its own rows into them, or (not
    // parallel) rank 0 writes every tensor, gathered one at a time
    ckpt_files c;
    bool have = !(rc = files_of(m, &c, diag));
    if (have && root) rc = write_safetensors(tmp, &c, diag);
    crc = own_or_other(diag, agree_with_rank0(comm, rc, "lay out the checkpoint files in", tmp, diag), rc);
    // each rank hashes the pieces it writes; rank 0 joins them into checksums.json
    mxi_sum_log log = {0};
    float *scratch = NULL;
    if (!crc) {
        rc = moment_scratch(f, moments, mx_model_num_tensors(m), &scratch, diag);
        crc = own_or_other(diag, agree(comm, rc, "another rank", "allocate its moments for", tmp, diag), rc);
    }
    if (!crc && parallel) {
        rc = write_rows(tmp, m, f, moments, scratch, &c, &log, diag);
        crc = own_or_other(diag, agree(comm, rc, "another rank", "write its rows into", tmp, diag), rc);
    } else if (!crc) {
        crc = save_gathered(tmp, m, f, moments, scratch, comm, &c, &log, diag);
    }
    free(scratch);
    if (have) files_free(&c);
    if (!crc && !(crc = mxi_scales_save(tmp, moments, comm, &rc, diag)))
        crc = own_or_other(diag, agree_with_rank0(comm, rc, "write the FP8 moments' scales into", tmp, diag), rc);
    if (!crc) {   // every rank holds the same delayed scaling state: rank 0 writes it
        char state[4096];
        rc = root ? path_in(state, sizeof state, tmp, MXI_DELAYED_FILE, diag) : MX_OK;
        if (!rc && root) rc = mxi_model_delayed_save(m, state, diag);
        crc = own_or_other(diag, agree_with_rank0(comm, rc, "write the delayed scaling state into", tmp, diag), rc);
    }
    if (!crc && !(crc = mxi_sums_save(tmp, m, comm, &log, &rc, diag)))
        crc = own_or_other(diag, agree_with_rank0(comm, rc, "write the checksums into", tmp, diag), rc);
    mxi_sum_log_free(&log);
    if (!crc) {
        rc = MX_OK;
        if (root && !(rc = write_config_and_state(tmp, hf, st, diag))) rc = publish(save, tmp, dir, st->step, diag);
        crc = own_or_other(diag, agree_with_rank0(comm, rc, "write", dir, diag), rc);
    }
    if (crc && root) mxi_remove_tree(tmp);
    if (!crc && keep_latest > 0) {
        rc = root ? remove_old(save, run_id, st->step, keep_latest, diag) : MX_OK;
        crc = agree_with_rank0(comm, rc, "remove the old checkpoints in", save, diag);   // names its key
    }
    return crc;
}

/* The highest step N of the iter_N directories in save that hold a trainer_state.json, or -1. */
static long long newest_iter(const char *save) {
    DIR *d = opendir(save);
    if (!d) return -1;
    long long best = -1;
    struct dirent *e;
    char p[4096];
    while ((e = readdir(d))) {
        long long step = iter_step(e->d_name);
        struct stat st;
        if (step > best && snprintf(p, sizeof p, "%s/%s/trainer_state.json", save, e->d_name) < (int)sizeof p &&
            stat(p, &st) == 0)
            best = step;
    }
    closedir(d);
    return best;
}

int mxi_checkpoint_resolve(const char *load, const char *what, char *dir, size_t size, mx_diag *diag) {
    char p[4096];
    struct stat st;
    snprintf(p, sizeof p, "%s/trainer_state.json", load);
    if (stat(p, &st) == 0) {
        snprintf(dir, size, "%s", load);
        return MX_OK;
    }
    snprintf(p, sizeof p, "%s/%s", load, LATEST);
    if (stat(p, &st) != 0) {
        // saves publish latest right after iter_N: only a job killed between the two renames
        // leaves a newest iter_N that latest does not name; every iter_N is complete
        long long newest = newest_iter(load);
        if (newest < 0)
            return mxi_diag(diag, MX_EIO, "%s: '%s' holds no checkpoint (no %s or trainer_state.json)", what, load,
                            LATEST);
        snprintf(dir, size, "%s/iter_%07lld", load, newest);
        return MX_OK;
    }
    char *text;
    size_t len;
    mx_diag sub;
    int rc = mxi_read_input(p, "a step number", MXI_MAX_STATE_BYTES, &text, &len, &sub);
    if (rc) return mxi_diag(diag, rc, "%s: %s", what, sub.msg);
    // exactly a step number (digits, then at most white space): "10abc" is not step 10, and
    // one past the iter_N names saves write (7 to 18 digits) is not a step either
    const char *c = text + strspn(text, " \t"), *digits = c;
    size_t nd = strspn(c, "0123456789");
    c += nd;
    bool exact = nd >= 1 && nd <= 18 && c[strspn(c, " \t\r\n")] == '\0';
    long long step = exact ? strtoll(digits, NULL, 10) : -1;
    if (!exact) {
        int shown = (int)strcspn(text, "\r\n");
        rc = mxi_diag(diag, MX_EFORMAT, "%s: %s holds '%.*s%s', not a step number (allowed: 1 to 18 digits)", what, p,
                      shown > 40 ? 40 : shown, text, shown > 40 ? "..." : "");
    }
    free(text);
    if (rc) return rc;
    snprintf(dir, size, "%s/iter_%07lld", load, step);
    return MX_OK;
}

/* A directory named iter_N holds step N's checkpoint: its trainer_state.json must say so. */
static int check_step(const char *dir, const char *path, long long step, mx_diag *diag) {
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    size_t b = n;
    while (b > 0 && dir[b - 1] != '/') b--;
    char base[256];
    snprintf(base, sizeof base, "%.*s", (int)(n - b), dir + b);
    long long named = iter_step(base);
    if (named >= 0 && named != step)
        return mxi_diag(diag, MX_EFORMAT, "training.load: %s: step %lld contradicts its directory %s (allowed: %lld; the "
                        "file is damaged or was copied from another checkpoint)", path, step, base, named);
    return MX_OK;
}

int mxi_checkpoint_read_state(const char *load, mxi_train_state *st, char *dir, size_t dir_size, mx_diag *diag) {
    char path[4096];
    int rc = mxi_checkpoint_resolve(load, "training.load", dir, dir_size, diag);
    if (rc) return rc;
    if ((rc = path_in(path, sizeof path, dir, "trainer_state.json", diag))) return rc;
    json_t *j;
    if ((rc = mxi_read_json(path, "a checkpoint's trainer_state.json", MXI_MAX_STATE_BYTES, &j, diag))) return rc;
    json_int_t step = -1, shard = -1, offset = -1, epoch = -1, seed = 0;
    int world = 0;
    if (json_unpack(j, "{s:I, s:{s:I, s:I, s:I}, s:I, s:i}", "step", &step, "data", "shard", &shard, "offset", &offset,
                    "epoch", &epoch, "seed", &seed, "world", &world) != 0 || step < 0) {
        json_decref(j);
        return mxi_diag(diag, MX_EFORMAT, "%s: expected {\"step\", \"data\": {\"shard\", \"offset\", \"epoch\"}, "
                        "\"seed\", \"world\"}", path);
    }
    if ((rc = check_step(dir, path, step, diag))) {
        json_decref(j);
        return rc;
    }
    *st = (mxi_train_state){.step = step, .data = {.shard = shard, .offset = offset, .epoch = epoch},
                            .seed = (uint64_t)seed, .world = world};
    const json_t *rows = json_object_get(json_object_get(j, "data"), "rows");   // a blend's
    if (rows && (!json_is_array(rows) || json_array_size(rows) < 1 || json_array_size(rows) > MX_LOADER_MAX_DATASETS)) {
        json_decref(j);
        return mxi_diag(diag, MX_EFORMAT, "%s: data.rows is not a list of 1 to %d row counts", path,
                        MX_LOADER_MAX_DATASETS);
    }
    st->data.n_datasets = rows ? (int)json_array_size(rows) : 0;
    for (int d = 0; d < st->data.n_datasets; d++) {
        const json_t *r = json_array_get(rows, (size_t)d);
        if (!json_is_integer(r) || json_integer_value(r) < 0) {
            json_decref(j);
            return mxi_diag(diag, MX_EFORMAT, "%s: data.rows[%d] is not a row count (allowed: an integer >= 0)", path, d);
        }
        st->data.rows[d] = (int64_t)json_integer_value(r);
    }
    json_decref(j);
    return MX_OK;
}

/* FP8 moment mo's span of tensor i from its fp32 values: codes of its saved scale_inv where
 * they are that (the same codes as saved), else of its own amax. */
static void store_span(mxi_moment *mo, int i, mxi_shard_span s, const float *values, const float *saved, bool have) {
    if (!(have && mxi_moment_restore_fp8(mo, i, s.offset, s.numel, values, saved[i])))
        mxi_moment_write(mo, i, s.offset, s.numel, values);
}

int mxi_checkpoint_load_tensors(const char *dir, mx_model *m, mxi_fsdp *f, mxi_moment *moments, int rank, int world,
                                mx_diag *diag) {
    char path[4096];
    int rc = path_in(path, sizeof path, dir, "model.safetensors", diag);
    if (rc) return rc;
    if ((rc = mxi_load_sharded_weights(path, m, f, diag))) return rc;
    if ((rc = path_in(path, sizeof path, dir, "optimizer.safetensors", diag))) return rc;
    mx_st_file *opt = NULL;
    if ((rc = mx_st_open(path, &opt, diag))) return rc;
    float *scratch = NULL, *saved[2] = {NULL, NULL};
    bool have[2];
    rc = moment_scratch(f, moments, mx_model_num_tensors(m), &scratch, diag);
    for (int mo = 0; mo < 2 && !rc; mo++)
        if (moments[mo].dtype == MX_STATE_FP8 && !(saved[mo] = malloc((size_t)moments[mo].spans * sizeof(float) + 1)))
            rc = mxi_diag(diag, MX_ENOMEM, "out of memory for the FP8 moments' scales (%zu bytes)",
                          (size_t)moments[mo].spans * sizeof(float));
    if (!rc) rc = mxi_scales_load(dir, moments, rank, world, saved, have, diag);
    for (int i = 0; i < mx_model_num_tensors(m) && !rc; i++) {
        mx_tensor_view v = mx_model_tensor(m, i);
        mxi_shard_span s = mxi_fsdp_span(f, i);
        char name[256];
        for (int mo = 0; mo < 2 && !rc; mo++) {   // this rank's rows of each moment, in fp32, then as stored
            snprintf(name, sizeof name, "%s.%s", mo ? "exp_avg_sq" : "exp_avg", v.name);
            own_rows o = {.f = f, .shards = scratch ? scratch : moments[mo].f32 + s.offset, .origin = s.offset};
            rc = mxi_read_parts_of(opt, name, v.shape, v.ndim, 0, i, own_part, &o, diag);
            // a negative second moment would make AdamW's sqrt a NaN at the first step
            mxi_shard_piece p;
            for (int k = 0; !rc && mo == 1 && mxi_fsdp_piece(f, i, k, true, &p); k++)
                rc = mxi_check_nonnegative_part(path, name, v.shape, v.ndim, p.start, p.count,
                                                o.shards + (p.offset - s.offset), diag);
            if (!rc && moments[mo].dtype == MX_STATE_FP8) store_span(&moments[mo], i, s, scratch, saved[mo], have[mo]);
            else if (!rc && scratch) mxi_moment_write(&moments[mo], i, s.offset, s.numel, scratch);
        }
    }
    free(scratch), free(saved[0]), free(saved[1]);
    mx_st_close(opt);
    if (!rc && !(rc = path_in(path, sizeof path, dir, MXI_DELAYED_FILE, diag))) rc = mxi_model_delayed_load(m, path, diag);
    return rc;
}
