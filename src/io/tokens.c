/* llm.c token shards and the batch loader over them (see include/mxtrain/tokens.h). */
#include "mxtrain/tokens.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/diag.h"
#include "core/file.h"
#include "core/synth.h"
#include "io/io_internal.h"

#define PAIRS "allowed: magic 20240520 version 1 (uint16 tokens) or magic 20240801 version 7 (uint32 tokens)"

enum { CHUNK_TOKENS = 1 << 15 };

/* ---- shard header ------------------------------------------------------------------- */

/* Open path for reading: MX_EIO for a missing file, a directory, anything not a file. The
 * size needs no limit of its own: the header must account for every byte. */
static int open_file(const char *path, int *fd, uint64_t *size, mx_diag *diag) {
    return mxi_open_input(path, "an llm.c token shard", 0, fd, size, diag);
}

static int check_header(int fd, const char *path, uint64_t size, mx_shard_info *info, mx_diag *diag) {
    if (size < MX_SHARD_HEADER_BYTES)
        return mxi_diag(diag, MX_EFORMAT,
                        "%s: file is %llu bytes, shorter than the 1024-byte llm.c shard header (" PAIRS ")", path,
                        (unsigned long long)size);
    int32_t h[256];
    if (mxi_pread_full(fd, h, sizeof h, 0) != 0)
        return mxi_diag(diag, MX_EIO, "%s: cannot read the header (%s)", path, errno ? strerror(errno) : "the file ended");
    int32_t magic = h[0], version = h[1], count = h[2];
    int width = 0;
    if (magic == MX_SHARD_MAGIC_U16 && version == MX_SHARD_VERSION_U16) width = 2;
    else if (magic == MX_SHARD_MAGIC_U32 && version == MX_SHARD_VERSION_U32) width = 4;
    else if (magic == MX_SHARD_MAGIC_U16 || magic == MX_SHARD_MAGIC_U32)
        return mxi_diag(diag, MX_EFORMAT, "%s: magic %d with version %d is not a known shard format (" PAIRS ")", path,
                        (int)magic, (int)version);
    else
        return mxi_diag(diag, MX_EFORMAT, "%s: bad magic number %d, not an llm.c token shard (" PAIRS ")", path,
                        (int)magic);
    if (count <= 0)
        return mxi_diag(diag, MX_EFORMAT, "%s: the header's token count is %d (allowed: at least 1)", path, (int)count);
    uint64_t expected = MX_SHARD_HEADER_BYTES + (uint64_t)count * (uint64_t)width;
    if (size != expected) {
        if (size < expected)
            return mxi_diag(diag, MX_EFORMAT,
                            "%s: file is truncated: the header says %d uint%d tokens, so the file should be %llu bytes, "
                            "but it is %llu bytes (%llu missing)",
                            path, (int)count, 8 * width, (unsigned long long)expected, (unsigned long long)size,
                            (unsigned long long)(expected - size));
        return mxi_diag(diag, MX_EFORMAT,
                        "%s: file has %llu trailing bytes: the header says %d uint%d tokens, so the file should be "
                        "%llu bytes, but it is %llu bytes",
                        path, (unsigned long long)(size - expected), (int)count, 8 * width,
                        (unsigned long long)expected, (unsigned long long)size);
    }
    info->width = width;
    info->count = count;
    return 0;
}

int mx_shard_inspect(const char *path, mx_shard_info *info, mx_diag *diag) {
    if (!path || !info) return mxi_diag(diag, MX_ENULL, "mx_shard_inspect: NULL argument");
    int fd;
    uint64_t size;
    int rc = open_file(path, &fd, &size, diag);
    if (rc) return rc;
    rc = check_header(fd, path, size, info, diag);
    close(fd);
    return rc;
}

/* Tokens [first, first+n) of a shard, widened to uint32 into dst. */
static int read_tokens(int fd, const char *path, int width, int64_t first, int64_t n, uint32_t *dst, mx_diag *diag) {
    uint64_t off = MX_SHARD_HEADER_BYTES + (uint64_t)first * (uint64_t)width;
    int failed = 0;
    if (width == 4) {
        failed = mxi_pread_full(fd, dst, (size_t)n * 4, off);
    } else {
        uint16_t half[4096];
        for (int64_t i0 = 0; !failed && i0 < n; i0 += 4096) {
            int64_t m = n - i0 < 4096 ? n - i0 : 4096;
            failed = mxi_pread_full(fd, half, (size_t)m * 2, off + (uint64_t)i0 * 2);
            for (int64_t i = 0; !failed && i < m; i++) dst[i0 + i] = half[i];
        }
    }
    if (!failed) return 0;
    return mxi_diag(diag, MX_EIO, "%s: cannot read tokens (%s)", path,
                    errno ? strerror(errno) : "the file ended early: it changed after it was checked");
}

static int check_vocab(const char *path, const uint32_t *tok, int64_t n, int64_t first, int64_t vocab_size,
                       mx_diag *diag) {
    for (int64_t i = 0; i < n; i++)
        if ((int64_t)tok[i] >= vocab_size)
            return mxi_diag(diag, MX_EFORMAT,
                            "%s: token %lld at index %lld is out of range (allowed: 0 to %lld for vocab_size %lld)",
                            path, (long long)tok[i], (long long)(first + i), (long long)(vocab_size - 1),
                            (long long)vocab_size);
    return 0;
}

static int check_vocab_size(int64_t vocab_size, mx_diag *diag) {
    if (vocab_size < 1 || vocab_size > 2147483647ll)
        return mxi_diag(diag, MX_EINVAL, "vocab_size %lld is out of range (allowed: 1 to 2147483647)",
                        (long long)vocab_size);
    return 0;
}

/* Validate a whole shard; with store != NULL also keep its tokens there (info->count). */
static int scan_shard(const char *path, int64_t vocab_size, mx_shard_info *info, uint32_t **store, mx_diag *diag) {
    int fd;
    uint64_t size;
    int rc = open_file(path, &fd, &size, diag);
    if (rc) return rc;
    rc = check_header(fd, path, size, info, diag);
    uint32_t *all = NULL, *chunk = NULL;
    if (rc == 0) {
        if (store) all = malloc((size_t)info->count * sizeof *all);
        else chunk = malloc(CHUNK_TOKENS * sizeof *chunk);
        if (!all && !chunk)
            rc = mxi_diag(diag, MX_ENOMEM, "%s: out of memory for %lld tokens (%zu bytes)", path, (long long)info->count,
                          (size_t)(store ? info->count : CHUNK_TOKENS) * sizeof *all);
    }
    for (int64_t i0 = 0; rc == 0 && i0 < info->count; i0 += CHUNK_TOKENS) {
        int64_t n = info->count - i0 < CHUNK_TOKENS ? info->count - i0 : CHUNK_TOKENS;
        uint32_t *dst = all ? all + i0 : chunk;
        rc = read_tokens(fd, path, info->width, i0, n, dst, diag);
        if (rc == 0) rc = check_vocab(path, dst, n, i0, vocab_size, diag);
    }
    close(fd);
    free(chunk);
    if (rc) free(all);
    else if (store) *store = all;
    return rc;
}

int mx_shard_read(const char *path, int64_t vocab_size, uint32_t **tokens, int64_t *count, mx_diag *diag) {
    if (!path || !tokens || !count) return mxi_diag(diag, MX_ENULL, "mx_shard_read: NULL argument");
    *tokens = NULL;
    *count = 0;
    int rc = check_vocab_size(vocab_size, diag);
    if (rc) return rc;
    mx_shard_info info;
    rc = scan_shard(path, vocab_size, &info, tokens, diag);
    if (rc == 0) *count = info.count;
    return rc;
}

/* ---- shard writer ------------------------------------------------------------------- */

int mxi_shard_emit(mxi_atomic *a, const void *tokens, int in_width, int64_t count, int out_width, mx_diag *diag) {
    int32_t h[256] = {0};
    h[0] = out_width == 2 ? MX_SHARD_MAGIC_U16 : MX_SHARD_MAGIC_U32;
    h[1] = out_width == 2 ? MX_SHARD_VERSION_U16 : MX_SHARD_VERSION_U32;
    h[2] = (int32_t)count;
    int rc = mxi_atomic_write(a, h, sizeof h, diag);
    if (rc) return rc;
    if (in_width == out_width) return mxi_atomic_write(a, tokens, (size_t)count * (size_t)in_width, diag);
    unsigned char buf[4 * 4096];
    for (int64_t i0 = 0; rc == 0 && i0 < count; i0 += 4096) {
        int64_t n = count - i0 < 4096 ? count - i0 : 4096;
        for (int64_t i = 0; i < n; i++) {
            uint32_t t = in_width == 2 ? ((const uint16_t *)tokens)[i0 + i] : ((const uint32_t *)tokens)[i0 + i];
            if (out_width == 2) {
                uint16_t s = (uint16_t)t;
                memcpy(buf + 2 * i, &s, 2);
            } else {
                memcpy(buf + 4 * i, &t, 4);
            }
        }
        rc = mxi_atomic_write(a, buf, (size_t)n * (size_t)out_width, diag);
    }
    return rc;
}

int mx_shard_write(const char *path, const uint32_t *tokens, int64_t count, bool force_u32, mx_diag *diag) {
    if (!path || !tokens) return mxi_diag(diag, MX_ENULL, "mx_shard_write: NULL argument");
    if (count < 1 || count > MX_SHARD_MAX_TOKENS)
        return mxi_diag(diag, MX_EINVAL, "%s: cannot write %lld tokens (allowed: 1 to %lld per shard)", path,
                        (long long)count, MX_SHARD_MAX_TOKENS);
    int width = 2;
    if (force_u32) width = 4;
    for (int64_t i = 0; width == 2 && i < count; i++)
        if (tokens[i] > 0xFFFFu) width = 4;
    mxi_atomic a;
    int rc = mxi_atomic_begin(&a, path, diag);
    if (rc) return rc;
    rc = mxi_shard_emit(&a, tokens, 4, count, width, diag);
    if (rc == 0) return mxi_atomic_commit(&a, diag);
    mxi_atomic_abort(&a);
    return rc;
}

/* ---- loader ------------------------------------------------------------------------- */

struct mx_loader {
    int B, T, rank, world;
    int64_t vocab_size;
    int64_t step;       /* world*B*T: tokens a global step advances */
    int n;              /* shards */
    int paths_cap;      /* entries allocated in paths */
    char **paths;       /* (n) */
    int64_t *counts;    /* (n) tokens per shard */
    int *widths;        /* (n) bytes per token */
    mx_loader_pos pos;
    int fd;             /* open shard, or -1 */
    int64_t fd_shard;   /* which shard fd is */
    uint32_t *buf;      /* (B*T+1) tokens of the current batch */
    /* a blend (mx_loader_open_blend); n_datasets 0 otherwise */
    int n_datasets;
    double weights[MX_LOADER_MAX_DATASETS];          /* normalised to sum 1 */
    int first[MX_LOADER_MAX_DATASETS + 1];           /* dataset d: shards first[d] .. first[d + 1] - 1 */
    int64_t *row_start;                              /* (n) rows of the dataset's shards before this one */
    int64_t dataset_rows[MX_LOADER_MAX_DATASETS];    /* rows in one pass over dataset d */
    int dataset_fd[MX_LOADER_MAX_DATASETS];          /* the open shard of each dataset, or -1 */
    int64_t dataset_fd_shard[MX_LOADER_MAX_DATASETS];/* which shard it is */
    bool shuffled;                                   /* mx_loader_shuffle: rows in a keyed order */
    uint64_t seed;
};

void mx_loader_close(mx_loader *l) {
    if (!l) return;
    if (l->fd >= 0) close(l->fd);
    for (int d = 0; d < l->n_datasets; d++)
        if (l->dataset_fd[d] >= 0) close(l->dataset_fd[d]);
    for (int i = 0; i < l->n; i++) free(l->paths[i]);
    free(l->paths);
    free(l->counts);
    free(l->widths);
    free(l->buf);
    free(l->row_start);
    free(l);
}

static int add_path(mx_loader *l, const char *path, mx_diag *diag) {
    if (l->n == l->paths_cap) {
        int c = l->paths_cap ? 2 * l->paths_cap : 8;
        char **p = realloc(l->paths, (size_t)c * sizeof *p);
        if (!p) return mxi_diag(diag, MX_ENOMEM, "data loader: out of memory (%zu bytes for %d shard names)",
                                (size_t)c * sizeof *p, c);
        l->paths = p;
        l->paths_cap = c;
    }
    l->paths[l->n] = strdup(path);
    if (!l->paths[l->n]) return mxi_diag(diag, MX_ENOMEM, "data loader: out of memory (%zu bytes)", strlen(path) + 1);
    l->n++;
    return 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int expand(mx_loader *l, const char *const *paths, int n_paths, mx_diag *diag) {
    for (int i = 0; i < n_paths; i++) {
        const char *p = paths[i];
        if (!p) return mxi_diag(diag, MX_ENULL, "data loader: path %d is NULL", i);
        if (!strpbrk(p, "*?[")) {
            int rc = add_path(l, p, diag);
            if (rc) return rc;
            continue;
        }
        glob_t g;
        int g_rc = glob(p, 0, NULL, &g);
        if (g_rc == GLOB_NOMATCH) {
            globfree(&g);
            return mxi_diag(diag, MX_EINVAL, "%s: no file matches this pattern (allowed: a pattern matching at least one shard)", p);
        }
        if (g_rc != 0) {
            globfree(&g);
            return mxi_diag(diag, g_rc == GLOB_NOSPACE ? MX_ENOMEM : MX_EIO, "%s: cannot expand the pattern (%s)", p,
                            g_rc == GLOB_NOSPACE ? "out of memory in glob(3), listing its matches"
                                                 : "a directory could not be read");
        }
        /* glob sorts by the locale's collation; sort by bytes so the order never depends on it. */
        qsort(g.gl_pathv, g.gl_pathc, sizeof *g.gl_pathv, cmp_str);
        int rc = 0;
        for (size_t k = 0; rc == 0 && k < g.gl_pathc; k++) rc = add_path(l, g.gl_pathv[k], diag);
        globfree(&g);
        if (rc) return rc;
    }
    return 0;
}

/* A loader of B x T batches on rank of world, its shards not yet named. */
static int loader_new(int B, int T, int rank, int world, int64_t vocab_size, mx_loader **out, mx_diag *diag) {
    *out = NULL;
    if (B < 1 || T < 1)
        return mxi_diag(diag, MX_EINVAL, "data loader: batch %d x %d (allowed: B >= 1 and T >= 1)", B, T);
    if (world < 1 || rank < 0 || rank >= world)
        return mxi_diag(diag, MX_EINVAL, "data loader: rank %d of world %d (allowed: world >= 1, 0 <= rank < world)",
                        rank, world);
    int64_t step = (int64_t)B * T * world;
    if (step >= MX_SHARD_MAX_TOKENS)
        return mxi_diag(diag, MX_EINVAL,
                        "data loader: world*B*T = %lld tokens per step is more than a shard can hold (allowed: below %lld)",
                        (long long)step, MX_SHARD_MAX_TOKENS);
    int rc = check_vocab_size(vocab_size, diag);
    if (rc) return rc;
    mx_loader *l = calloc(1, sizeof *l);
    if (!l) return mxi_diag(diag, MX_ENOMEM, "data loader: out of memory (%zu bytes)", sizeof *l);
    *l = (mx_loader){.B = B, .T = T, .rank = rank, .world = world, .vocab_size = vocab_size, .step = step, .fd = -1,
                     .fd_shard = -1};
    l->buf = malloc(((size_t)B * (size_t)T + 1) * sizeof *l->buf);
    if (!l->buf) {
        free(l);
        return mxi_diag(diag, MX_ENOMEM, "data loader: out of memory (%zu bytes for a batch)",
                        ((size_t)B * (size_t)T + 1) * sizeof *l->buf);
    }
    *out = l;
    return 0;
}

/* Check every shard of l and take its size; each needs at least `least` tokens (`what`). */
static int scan_shards(mx_loader *l, int64_t least, const char *what, mx_diag *diag) {
    l->counts = calloc((size_t)l->n, sizeof *l->counts);
    l->widths = calloc((size_t)l->n, sizeof *l->widths);
    if (!l->counts || !l->widths)
        return mxi_diag(diag, MX_ENOMEM, "data loader: out of memory (%zu bytes for %d shards)",
                        (size_t)l->n * (sizeof *l->counts + sizeof *l->widths), l->n);
    for (int i = 0; i < l->n; i++) {
        mx_shard_info info;
        int rc = scan_shard(l->paths[i], l->vocab_size, &info, NULL, diag);
        if (rc) return rc;
        l->counts[i] = info.count;
        l->widths[i] = info.width;
        if (info.count < least)
            return mxi_diag(diag, MX_EINVAL, "%s: shard has %lld tokens, too few for %s = %lld tokens)", l->paths[i],
                            (long long)info.count, what, (long long)least);
    }
    return 0;
}

int mx_loader_open(const char *const *paths, int n_paths, int B, int T, int rank, int world, int64_t vocab_size,
                   mx_loader **out, mx_diag *diag) {
    if (!out) return mxi_diag(diag, MX_ENULL, "mx_loader_open: out is NULL");
    *out = NULL;
    if (!paths || n_paths < 1)
        return mxi_diag(diag, MX_EINVAL, "data loader: no shards given (allowed: at least one path or pattern)");
    mx_loader *l;
    int rc = loader_new(B, T, rank, world, vocab_size, &l, diag);
    if (rc) return rc;
    char what[96];
    snprintf(what, sizeof what, "one batch (allowed: at least world*B*T+1 = %d*%d*%d+1", world, B, T);
    if (!(rc = expand(l, paths, n_paths, diag))) rc = scan_shards(l, l->step + 1, what, diag);
    if (rc) {
        mx_loader_close(l);
        return rc;
    }
    *out = l;
    return 0;
}

int mx_loader_open_blend(const char *const *paths, const double *weights, int n_datasets, int B, int T, int rank,
                         int world, int64_t vocab_size, mx_loader **out, mx_diag *diag) {
    if (!out) return mxi_diag(diag, MX_ENULL, "mx_loader_open_blend: out is NULL");
    *out = NULL;
    if (!paths || n_datasets < 1 || (weights && n_datasets > MX_LOADER_MAX_DATASETS))
        return mxi_diag(diag, MX_EINVAL, "data loader: a blend of %d datasets (allowed: 1 to %d)", n_datasets,
                        MX_LOADER_MAX_DATASETS);
    int n_paths = n_datasets;
    static const double one = 1;
    if (!weights) weights = &one, n_datasets = 1;   // one dataset of every path
    double sum = 0;
    for (int d = 0; d < n_datasets; d++) {
        if (!(weights[d] > 0) || !isfinite(weights[d]))
            return mxi_diag(diag, MX_EINVAL, "data loader: dataset %d has weight %g (allowed: a number > 0)", d,
                            weights[d]);
        sum += weights[d];
    }
    if (!isfinite(sum))
        return mxi_diag(diag, MX_EINVAL, "data loader: the blend's weights add up to %g (allowed: a finite sum)", sum);
    mx_loader *l;
    int rc = loader_new(B, T, rank, world, vocab_size, &l, diag);
    if (rc) return rc;
    l->n_datasets = n_datasets;
    l->pos.n_datasets = n_datasets;
    for (int d = 0; d < n_datasets; d++) l->dataset_fd[d] = -1, l->dataset_fd_shard[d] = -1;
    for (int d = 0; !rc && d < n_datasets; d++) {
        l->weights[d] = weights[d] / sum;
        l->first[d] = l->n;
        rc = expand(l, paths + d, n_datasets == 1 ? n_paths : 1, diag);
    }
    l->first[n_datasets] = l->n;
    char what[96];
    snprintf(what, sizeof what, "one row (allowed: at least seq_length+1 = %d+1", T);
    if (!rc) rc = scan_shards(l, (int64_t)T + 1, what, diag);
    if (!rc && !(l->row_start = calloc((size_t)l->n, sizeof *l->row_start)))
        rc = mxi_diag(diag, MX_ENOMEM, "data loader: out of memory (%zu bytes for %d shards)",
                      (size_t)l->n * sizeof *l->row_start, l->n);
    for (int d = 0; !rc && d < n_datasets; d++) {
        int64_t rows = 0;
        for (int s = l->first[d]; s < l->first[d + 1]; s++) {
            l->row_start[s] = rows;
            rows += (l->counts[s] - 1) / T;
        }
        l->dataset_rows[d] = rows;
    }
    if (rc) {
        mx_loader_close(l);
        return rc;
    }
    *out = l;
    return 0;
}

/* The dataset row g of the blend's stream comes from, rows[d] taken from each before it:
 * Megatron's build_blending_indices. */
static int blend_pick(const mx_loader *l, int64_t g, const int64_t *rows) {
    double at = g > 1 ? (double)g : 1.0;
    int best = 0;
    double best_error = l->weights[0] * at - (double)rows[0];
    for (int d = 1; d < l->n_datasets; d++) {
        double error = l->weights[d] * at - (double)rows[d];
        if (error > best_error) best_error = error, best = d;
    }
    return best;
}

uint64_t mx_loader_shuffle_key(uint64_t seed, int dataset, int64_t epoch) {
    return mxi_mix64(mxi_mix64(mxi_mix64(seed) ^ (uint64_t)(dataset + 1)) ^ (uint64_t)(epoch + 1));
}

int64_t mx_loader_permute(int64_t k, int64_t n, uint64_t key) {
    if (n <= 1) return k;
    int h = 1;   // bits of a half: 4^h >= n
    while (((int64_t)1 << (2 * h)) < n) h++;
    uint64_t mask = ((uint64_t)1 << h) - 1, x = (uint64_t)k;
    do {   // a 4-round Feistel network on [0, 4^h), walked until it lands in [0, n)
        uint64_t left = x >> h, right = x & mask;
        for (uint64_t round = 1; round <= 4; round++) {
            uint64_t f = mxi_mix64(key ^ round * 0x9E3779B97F4A7C15ull ^ right) & mask;
            uint64_t next = left ^ f;
            left = right, right = next;
        }
        x = left << h | right;
    } while (x >= (uint64_t)n);
    return (int64_t)x;
}

int mx_loader_shuffle(mx_loader *l, uint64_t seed, mx_diag *diag) {
    if (!l) return mxi_diag(diag, MX_ENULL, "mx_loader_shuffle: NULL loader");
    if (!l->n_datasets)
        return mxi_diag(diag, MX_EINVAL, "data loader: only a blend's rows can be shuffled (allowed: a loader of "
                        "mx_loader_open_blend)");
    l->shuffled = true;
    l->seed = seed;
    return 0;
}

/* The n inputs and the n targets of the n + 1 tokens at `first` in shard s, read through
 * *fd, which holds shard *open: another shard is opened first, its size checked again. */
static int read_pairs(mx_loader *l, int *fd, int64_t *open, int64_t s, int64_t first, int64_t n, int32_t *inputs,
                      int32_t *targets, mx_diag *diag) {
    const char *path = l->paths[s];
    if (*open != s) {
        if (*fd >= 0) close(*fd);
        *open = -1;
        uint64_t size;
        int rc = open_file(path, fd, &size, diag);
        if (rc) return rc;
        if (size != MX_SHARD_HEADER_BYTES + (uint64_t)l->counts[s] * (uint64_t)l->widths[s]) {
            close(*fd);
            *fd = -1;
            return mxi_diag(diag, MX_EIO, "%s: the shard changed size after the loader checked it", path);
        }
        *open = s;
    }
    int rc = read_tokens(*fd, path, l->widths[s], first, n + 1, l->buf, diag);
    if (rc == 0) rc = check_vocab(path, l->buf, n + 1, first, l->vocab_size, diag);
    if (rc) return rc;
    for (int64_t i = 0; i < n; i++) {
        inputs[i] = (int32_t)l->buf[i];
        targets[i] = (int32_t)l->buf[i + 1];
    }
    return 0;
}

/* Row j of dataset d (counting on over its passes): T inputs and their T targets. */
static int read_row(mx_loader *l, int d, int64_t j, int32_t *inputs, int32_t *targets, mx_diag *diag) {
    int64_t rows = l->dataset_rows[d], k = j % rows;
    if (l->shuffled) k = mx_loader_permute(k, rows, mx_loader_shuffle_key(l->seed, d, j / rows));
    int lo = l->first[d], hi = l->first[d + 1] - 1;   // the last shard whose rows start at or before k
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (l->row_start[mid] <= k) lo = mid;
        else hi = mid - 1;
    }
    // each dataset keeps its own shard open: a blend alternates between them
    return read_pairs(l, &l->dataset_fd[d], &l->dataset_fd_shard[d], lo, (k - l->row_start[lo]) * l->T, l->T, inputs,
                      targets, diag);
}

/* A blend's batch: every rank walks the world's rows of this step, reading its own. */
static int next_blend(mx_loader *l, int32_t *inputs, int32_t *targets, mx_diag *diag) {
    mx_loader_pos pos = l->pos;
    int64_t g = 0;   // the stream's row: the rows taken so far
    for (int d = 0; d < l->n_datasets; d++) g += pos.rows[d];
    for (int q = 0; q < l->world * l->B; q++, g++) {
        int d = blend_pick(l, g, pos.rows);
        int64_t j = pos.rows[d]++;
        if (q / l->B != l->rank) continue;
        int64_t b = q % l->B;
        int rc = read_row(l, d, j, inputs + b * l->T, targets + b * l->T, diag);
        if (rc) return rc;
    }
    pos.epoch = INT64_MAX;
    for (int d = 0; d < l->n_datasets; d++)
        if (pos.rows[d] / l->dataset_rows[d] < pos.epoch) pos.epoch = pos.rows[d] / l->dataset_rows[d];
    l->pos = pos;
    return 0;
}

int mx_loader_next(mx_loader *l, int32_t *inputs, int32_t *targets, mx_diag *diag) {
    if (!l || !inputs || !targets) return mxi_diag(diag, MX_ENULL, "mx_loader_next: NULL argument");
    if (l->n_datasets) return next_blend(l, inputs, targets, diag);
    int64_t s = l->pos.shard, bt = (int64_t)l->B * l->T;
    int rc = read_pairs(l, &l->fd, &l->fd_shard, s, l->pos.offset + (int64_t)l->rank * bt, bt, inputs, targets, diag);
    if (rc) return rc;
    /* Advance; keep the position at a valid batch start (a shard always holds one). */
    l->pos.offset += l->step;
    if (l->pos.offset + l->step + 1 > l->counts[s]) {
        l->pos.offset = 0;
        if (++l->pos.shard == l->n) {
            l->pos.shard = 0;
            l->pos.epoch++;
        }
    }
    return 0;
}

void mx_loader_get_pos(const mx_loader *l, mx_loader_pos *pos) {
    if (l && pos) *pos = l->pos;
}

void mx_loader_rewind(mx_loader *l) {
    if (l) l->pos = (mx_loader_pos){.n_datasets = l->n_datasets};
}

int mx_loader_set_pos(mx_loader *l, const mx_loader_pos *pos, mx_diag *diag) {
    if (!l || !pos) return mxi_diag(diag, MX_ENULL, "mx_loader_set_pos: NULL argument");
    if (pos->n_datasets != l->n_datasets) {
        char was[48], is[48];
        snprintf(was, sizeof was, pos->n_datasets ? "a blend of %d datasets" : "one stream of shards", pos->n_datasets);
        snprintf(is, sizeof is, l->n_datasets ? "a blend of %d datasets" : "one stream of shards", l->n_datasets);
        return mxi_diag(diag, MX_EINVAL, "data loader: the resume position is of %s, the data of %s (allowed: the "
                        "data the position was saved with)", was, is);
    }
    if (l->n_datasets) {
        for (int d = 0; d < l->n_datasets; d++)
            if (pos->rows[d] < 0)
                return mxi_diag(diag, MX_EINVAL, "data loader: resume position has %lld rows of dataset %d (allowed: "
                                ">= 0)", (long long)pos->rows[d], d);
        l->pos = *pos;
        return 0;
    }
    if (pos->shard < 0 || pos->shard >= l->n)
        return mxi_diag(diag, MX_EINVAL, "data loader: resume position names shard %lld (allowed: 0 to %d, %d shards)",
                        (long long)pos->shard, l->n - 1, l->n);
    if (pos->epoch < 0)
        return mxi_diag(diag, MX_EINVAL, "data loader: resume position has epoch %lld (allowed: >= 0)",
                        (long long)pos->epoch);
    int64_t count = l->counts[pos->shard];
    if (pos->offset < 0 || pos->offset > count)
        return mxi_diag(diag, MX_EINVAL,
                        "%s: resume offset %lld is beyond the shard (allowed: 0 to %lld, its token count)",
                        l->paths[pos->shard], (long long)pos->offset, (long long)count);
    l->pos = *pos;
    // a position saved by a job with a smaller step may leave too few tokens for this job's
    // step: move on as mx_loader_next does at the end of a shard
    if (l->pos.offset + l->step + 1 > count) {
        l->pos.offset = 0;
        if (++l->pos.shard == l->n) l->pos.shard = 0, l->pos.epoch++;
    }
    return 0;
}

int mx_loader_shard_count(const mx_loader *l) { return l ? l->n : 0; }

const char *mx_loader_shard_path(const mx_loader *l, int shard) {
    return (l && shard >= 0 && shard < l->n) ? l->paths[shard] : NULL;
}

int64_t mx_loader_shard_tokens(const mx_loader *l, int shard) {
    return (l && shard >= 0 && shard < l->n) ? l->counts[shard] : 0;
}

int64_t mx_loader_steps_per_epoch(const mx_loader *l) {
    if (!l) return 0;
    if (l->n_datasets) {   // until the first dataset is through, at its share of world * B rows a step
        double steps = INFINITY;
        for (int d = 0; d < l->n_datasets; d++)
            steps = fmin(steps, (double)l->dataset_rows[d] / (l->weights[d] * l->world * l->B));
        return (int64_t)steps;
    }
    int64_t steps = 0;
    for (int i = 0; i < l->n; i++) steps += (l->counts[i] - 1) / l->step;
    return steps;
}
