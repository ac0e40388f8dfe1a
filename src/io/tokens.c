/* llm.c token shards and the batch loader over them (see include/mxtrain/tokens.h). */
#include "mxtrain/tokens.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/diag.h"
#include "core/file.h"
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
        if (!all && !chunk) rc = mxi_diag(diag, MX_ENOMEM, "%s: out of memory for %lld tokens", path, (long long)info->count);
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
    char **paths;       /* (n) */
    int64_t *counts;    /* (n) tokens per shard */
    int *widths;        /* (n) bytes per token */
    mx_loader_pos pos;
    int fd;             /* open shard, or -1 */
    int64_t fd_shard;   /* which shard fd is */
    uint32_t *buf;      /* (B*T+1) tokens of the current batch */
};

void mx_loader_close(mx_loader *l) {
    if (!l) return;
    if (l->fd >= 0) close(l->fd);
    for (int i = 0; i < l->n; i++) free(l->paths[i]);
    free(l->paths);
    free(l->counts);
    free(l->widths);
    free(l->buf);
    free(l);
}

static int add_path(mx_loader *l, int *cap, const char *path, mx_diag *diag) {
    if (l->n == *cap) {
        int c = *cap ? 2 * *cap : 8;
        char **p = realloc(l->paths, (size_t)c * sizeof *p);
        if (!p) return mxi_diag(diag, MX_ENOMEM, "data loader: out of memory");
        l->paths = p;
        *cap = c;
    }
    l->paths[l->n] = strdup(path);
    if (!l->paths[l->n]) return mxi_diag(diag, MX_ENOMEM, "data loader: out of memory");
    l->n++;
    return 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int expand(mx_loader *l, const char *const *paths, int n_paths, mx_diag *diag) {
    int cap = 0;
    for (int i = 0; i < n_paths; i++) {
        const char *p = paths[i];
        if (!p) return mxi_diag(diag, MX_ENULL, "data loader: path %d is NULL", i);
        if (!strpbrk(p, "*?[")) {
            int rc = add_path(l, &cap, p, diag);
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
                            g_rc == GLOB_NOSPACE ? "out of memory" : "a directory could not be read");
        }
        /* glob sorts by the locale's collation; sort by bytes so the order never depends on it. */
        qsort(g.gl_pathv, g.gl_pathc, sizeof *g.gl_pathv, cmp_str);
        int rc = 0;
        for (size_t k = 0; rc == 0 && k < g.gl_pathc; k++) rc = add_path(l, &cap, g.gl_pathv[k], diag);
        globfree(&g);
        if (rc) return rc;
    }
    return 0;
}

int mx_loader_open(const char *const *paths, int n_paths, int B, int T, int rank, int world, int64_t vocab_size,
                   mx_loader **out, mx_diag *diag) {
    if (!out) return mxi_diag(diag, MX_ENULL, "mx_loader_open: out is NULL");
    *out = NULL;
    if (!paths || n_paths < 1)
        return mxi_diag(diag, MX_EINVAL, "data loader: no shards given (allowed: at least one path or pattern)");
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
    if (!l) return mxi_diag(diag, MX_ENOMEM, "data loader: out of memory");
    l->B = B;
    l->T = T;
    l->rank = rank;
    l->world = world;
    l->vocab_size = vocab_size;
    l->step = step;
    l->fd = -1;
    l->fd_shard = -1;
    rc = expand(l, paths, n_paths, diag);
    if (rc == 0) {
        l->counts = calloc((size_t)l->n, sizeof *l->counts);
        l->widths = calloc((size_t)l->n, sizeof *l->widths);
        l->buf = malloc(((size_t)B * (size_t)T + 1) * sizeof *l->buf);
        if (!l->counts || !l->widths || !l->buf) rc = mxi_diag(diag, MX_ENOMEM, "data loader: out of memory");
    }
    for (int i = 0; rc == 0 && i < l->n; i++) {
        mx_shard_info info;
        rc = scan_shard(l->paths[i], vocab_size, &info, NULL, diag);
        if (rc) break;
        l->counts[i] = info.count;
        l->widths[i] = info.width;
        if (info.count < step + 1)
            rc = mxi_diag(diag, MX_EINVAL,
                          "%s: shard has %lld tokens, too few for one batch (allowed: at least world*B*T+1 = "
                          "%d*%d*%d+1 = %lld tokens)",
                          l->paths[i], (long long)info.count, world, B, T, (long long)(step + 1));
    }
    if (rc) {
        mx_loader_close(l);
        return rc;
    }
    *out = l;
    return 0;
}

int mx_loader_next(mx_loader *l, int32_t *inputs, int32_t *targets, mx_diag *diag) {
    if (!l || !inputs || !targets) return mxi_diag(diag, MX_ENULL, "mx_loader_next: NULL argument");
    int64_t s = l->pos.shard, bt = (int64_t)l->B * l->T;
    const char *path = l->paths[s];
    if (l->fd_shard != s) {
        if (l->fd >= 0) close(l->fd);
        l->fd_shard = -1;
        uint64_t size;
        int rc = open_file(path, &l->fd, &size, diag);
        if (rc) return rc;
        if (size != MX_SHARD_HEADER_BYTES + (uint64_t)l->counts[s] * (uint64_t)l->widths[s]) {
            close(l->fd);
            l->fd = -1;
            return mxi_diag(diag, MX_EIO, "%s: the shard changed size after the loader checked it", path);
        }
        l->fd_shard = s;
    }
    int64_t first = l->pos.offset + (int64_t)l->rank * bt;
    int rc = read_tokens(l->fd, path, l->widths[s], first, bt + 1, l->buf, diag);
    if (rc == 0) rc = check_vocab(path, l->buf, bt + 1, first, l->vocab_size, diag);
    if (rc) return rc;
    for (int64_t i = 0; i < bt; i++) {
        inputs[i] = (int32_t)l->buf[i];
        targets[i] = (int32_t)l->buf[i + 1];
    }
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

int mx_loader_set_pos(mx_loader *l, const mx_loader_pos *pos, mx_diag *diag) {
    if (!l || !pos) return mxi_diag(diag, MX_ENULL, "mx_loader_set_pos: NULL argument");
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
    int64_t steps = 0;
    for (int i = 0; i < l->n; i++) steps += (l->counts[i] - 1) / l->step;
    return steps;
}
