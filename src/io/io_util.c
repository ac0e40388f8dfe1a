/* Whole reads at an offset and atomic file replacement (see io_internal.h). */
#define _DEFAULT_SOURCE   // flock
#include "io/io_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/text.h"
#include "core/diag.h"
#include "core/file.h"

enum { ATOMIC_BUF = 1 << 16 };

int mxi_pread_full(int fd, void *buf, size_t n, uint64_t off) {
    unsigned char *p = buf;
    while (n > 0) {
        size_t chunk = n > (1u << 30) ? (1u << 30) : n;
        ssize_t got = pread(fd, p, chunk, (off_t)off);
        if (got < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (got == 0) {
            errno = 0;
            return -1;
        }
        p += got;
        n -= (size_t)got;
        off += (uint64_t)got;
    }
    return 0;
}

/* "dir/name" -> "dir/.name.tmp-XXXXXXXX" (suffix from the pid, the clock and the attempt). */
static char *tmp_name(const char *path, unsigned attempt) {
    const char *slash = strrchr(path, '/');
    size_t dir_len = slash ? (size_t)(slash - path + 1) : 0;
    const char *base = path + dir_len;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    unsigned long long tag = ((unsigned long long)getpid() << 32) ^ (unsigned long long)ts.tv_nsec ^
                             ((unsigned long long)attempt * 0x9E3779B97F4A7C15ull);
    size_t size = strlen(path) + 32;
    char *tmp = malloc(size);
    if (!tmp) return NULL;
    snprintf(tmp, size, "%.*s.%s.tmp-%llx", (int)dir_len, path, base, tag & 0xFFFFFFFFFFull);
    return tmp;
}

/* Whether name is exactly a temporary name tmp_name gives base: ".BASE.tmp-" and 1 to 10
 * lowercase hex digits. */
static bool is_tmp_name(const char *name, const char *base) {
    size_t bl = strlen(base);
    if (name[0] != '.' || strncmp(name + 1, base, bl) != 0 || strncmp(name + 1 + bl, ".tmp-", 5) != 0) return false;
    const char *hex = name + 1 + bl + 5;
    size_t n = strspn(hex, "0123456789abcdef");
    return n >= 1 && n <= 10 && hex[n] == '\0';
}

/* Remove the temporary files of earlier writes of path that were killed before they could
 * clean up: files named as tmp_name names them, in path's directory, that no process holds
 * locked (a writer holds its temporary file locked from creation to rename, and the lock
 * goes with the process). Best effort: what cannot be checked is left alone. */
static void remove_stale(const char *path) {
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    size_t dir_len = !slash ? 0 : slash == path ? 1 : (size_t)(slash - path);
    char *dir = malloc(dir_len + 2);
    if (!dir) return;
    if (slash) memcpy(dir, path, dir_len), dir[dir_len] = '\0';
    else strcpy(dir, ".");
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        if (!is_tmp_name(e->d_name, base)) continue;
        size_t size = strlen(dir) + strlen(e->d_name) + 2;
        char *p = malloc(size);
        if (!p) break;
        snprintf(p, size, "%s/%s", dir, e->d_name);
        int fd = open(p, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
        struct stat st;
        if (fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && flock(fd, LOCK_EX | LOCK_NB) == 0) unlink(p);
        if (fd >= 0) close(fd);
        free(p);
    }
    if (d) closedir(d);
    free(dir);
}

static const char *special_kind(mode_t mode) {
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISSOCK(mode)) return "a socket";
    return "not a regular file";
}

/* The file a symbolic link at path leads to, through every link in a chain (a link to a
 * file not made yet leads to its path): a malloc'ed path, NULL with errno. The output
 * replaces that file, and the link stays. */
static char *follow_links(const char *path) {
    size_t len = strlen(path);
    char *cur = malloc(len + 1);
    if (!cur) return NULL;
    memcpy(cur, path, len + 1);
    for (int hops = 0; hops < 40; hops++) {
        struct stat st;
        if (lstat(cur, &st) != 0 || !S_ISLNK(st.st_mode)) return cur;
        char target[4096];
        ssize_t n = readlink(cur, target, sizeof target - 1);
        if (n < 0 || n == (ssize_t)sizeof target - 1) {
            free(cur);
            if (n >= 0) errno = ENAMETOOLONG;
            return NULL;
        }
        target[n] = '\0';
        const char *slash = strrchr(cur, '/');
        size_t dir_len = target[0] != '/' && slash ? (size_t)(slash - cur + 1) : 0;   // relative: to the link's directory
        char *next = malloc(dir_len + (size_t)n + 1);
        if (!next) {
            free(cur);
            return NULL;
        }
        memcpy(next, cur, dir_len);
        memcpy(next + dir_len, target, (size_t)n + 1);
        free(cur);
        cur = next;
    }
    free(cur);
    errno = ELOOP;
    return NULL;
}

static int json_refused(const char *path, size_t len, const json_error_t *err, mx_diag *diag) {
    if (json_error_code(err) == json_error_out_of_memory)
        return mxi_diag(diag, MX_ENOMEM, "%s: out of memory parsing its %zu bytes of JSON (jansson)", path, len);
    char text[4 * JSON_ERROR_TEXT_LENGTH];   // jansson's "near '...'" quotes the file's text, newlines and all
    return mxi_diag(diag, MX_EFORMAT, "%s:%d: %s", path, err->line,
                    mxi_quote(text, sizeof text, err->text, strlen(err->text)));
}

int mxi_read_json(const char *path, const char *allowed, uint64_t max_bytes, json_t **out, mx_diag *diag) {
    *out = NULL;
    char *text;
    size_t len;
    int rc = mxi_read_input(path, allowed, max_bytes, &text, &len, diag);
    if (rc) return rc;
    json_error_t err;
    *out = json_loadb(text, len, 0, &err);
    free(text);
    return *out ? MX_OK : json_refused(path, len, &err, diag);
}

int mxi_output_target(const char *out, char **target, mx_diag *diag) {
    *target = NULL;
    size_t len = strlen(out);
    if (len == 0 || out[len - 1] == '/')
        return mxi_diag(diag, MX_EIO, "'%s': not a file path (allowed: a path naming a file to write)", out);
    // a symbolic link is followed: the file it names is replaced, never the link
    char *path = follow_links(out);
    if (!path && errno == ENOMEM)
        return mxi_diag(diag, MX_ENOMEM, "%s: out of memory following the symbolic link (at most %zu bytes)", out,
                        len + 4096);
    if (!path) return mxi_diag(diag, MX_EIO, "%s: cannot follow the symbolic link (%s)", out, strerror(errno));
    struct stat st;
    int rc = 0;
    bool exists = stat(path, &st) == 0;
    if (exists && S_ISDIR(st.st_mode))
        rc = mxi_diag(diag, MX_EIO, "%s: is a directory (allowed: a path naming a file to write)", out);
    // a device, FIFO or socket is never replaced by a regular file (/dev/null would stop
    // being one), nor written through: the output is a file whose write is atomic
    else if (exists && !S_ISREG(st.st_mode))
        rc = mxi_diag(diag, MX_EIO, "%s: is %s (allowed: a regular file, or a path where none exists yet)", out,
                      special_kind(st.st_mode));
    if (rc) free(path);
    else *target = path;
    return rc;
}

int mxi_output_open(const char *out, mxi_output_mode mode, FILE **f, mx_diag *diag) {
    *f = NULL;
    char *path;
    int rc = mxi_output_target(out, &path, diag);
    if (rc) return rc;
    // O_NONBLOCK: a FIFO put there since the check must not block the open; fstat then refuses it
    int fd = open(path, O_WRONLY | O_CREAT | O_NONBLOCK | O_NOCTTY | O_CLOEXEC | (mode == MXI_OUTPUT_APPEND ? O_APPEND : 0),
                  0666);
    free(path);
    struct stat st;
    if (fd < 0) return mxi_diag(diag, MX_EIO, "%s: cannot open for writing (%s)", out, strerror(errno));
    if (fstat(fd, &st) != 0)
        rc = mxi_diag(diag, MX_EIO, "%s: cannot write (%s)", out, strerror(errno));
    else if (!S_ISREG(st.st_mode))
        rc = mxi_diag(diag, MX_EIO, "%s: is %s (allowed: a regular file, or a path where none exists yet)", out,
                      special_kind(st.st_mode));
    else if (mode == MXI_OUTPUT_TRUNCATE && ftruncate(fd, 0) != 0)   // only now that it is a regular file
        rc = mxi_diag(diag, MX_EIO, "%s: cannot truncate (%s)", out, strerror(errno));
    if (rc) {
        close(fd);
        return rc;
    }
    *f = fdopen(fd, mode == MXI_OUTPUT_APPEND ? "a" : "w");
    if (!*f) {
        close(fd);
        return mxi_diag(diag, MX_ENOMEM, "%s: out of memory (a stream's %d-byte buffer)", out, BUFSIZ);
    }
    return 0;
}

int mxi_atomic_begin(mxi_atomic *a, const char *out, mx_diag *diag) {
    memset(a, 0, sizeof *a);
    a->fd = -1;
    char *path;
    int rc = mxi_output_target(out, &path, diag);
    if (rc) return rc;
    size_t len = strlen(path);
    a->path = path;
    a->buf = malloc(ATOMIC_BUF);
    if (!a->buf) {
        mxi_atomic_abort(a);
        return mxi_diag(diag, MX_ENOMEM, "%s: out of memory (%d bytes)", out, ATOMIC_BUF);
    }
    remove_stale(path);
    for (unsigned attempt = 0; attempt < 64; attempt++) {
        a->tmp_path = tmp_name(path, attempt);
        if (!a->tmp_path) {
            mxi_atomic_abort(a);   // frees path (a->path): the messages name out
            return mxi_diag(diag, MX_ENOMEM, "%s: out of memory (%zu bytes)", out, len + 32);
        }
        a->fd = open(a->tmp_path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (a->fd >= 0) {
            (void)flock(a->fd, LOCK_EX | LOCK_NB);   // "in use" for remove_stale, until the fd is closed
            return 0;
        }
        int err = errno;
        free(a->tmp_path);
        a->tmp_path = NULL;
        if (err != EEXIST) {   // the directory named is where the file goes (a link's target's)
            const char *slash = strrchr(path, '/');
            const char *dir = !slash ? "." : slash == path ? "/" : path;
            int dir_len = !slash ? 1 : slash == path ? 1 : (int)(slash - path);
            rc = mxi_diag(diag, MX_EIO, "%s: cannot create the output file in directory '%.*s' (%s)", out, dir_len,
                          dir, strerror(err));
            mxi_atomic_abort(a);
            return rc;
        }
    }
    mxi_atomic_abort(a);
    return mxi_diag(diag, MX_EIO, "%s: cannot create a unique temporary file beside it", out);
}

static int flush(mxi_atomic *a, mx_diag *diag) {
    size_t done = 0;
    while (done < a->used) {
        ssize_t w = write(a->fd, a->buf + done, a->used - done);
        if (w < 0) {
            if (errno == EINTR) continue;
            return mxi_diag(diag, MX_EIO, "%s: write failed (%s); no file was written", a->path, strerror(errno));
        }
        done += (size_t)w;
    }
    a->used = 0;
    return 0;
}

int mxi_atomic_write(mxi_atomic *a, const void *data, size_t n, mx_diag *diag) {
    const unsigned char *p = data;
    while (n > 0) {
        if (a->used == ATOMIC_BUF) {
            int rc = flush(a, diag);
            if (rc < 0) return rc;
        }
        size_t take = ATOMIC_BUF - a->used;
        if (take > n) take = n;
        memcpy(a->buf + a->used, p, take);
        a->used += take;
        p += take;
        n -= take;
    }
    return 0;
}

int mxi_atomic_skip(mxi_atomic *a, uint64_t n, mx_diag *diag) {
    int rc = flush(a, diag);
    if (rc < 0) return rc;
    if (n > (uint64_t)INT64_MAX || lseek(a->fd, (off_t)n, SEEK_CUR) < 0)
        return mxi_diag(diag, MX_EIO, "%s: cannot seek past %llu bytes (%s); no file was written", a->path,
                        (unsigned long long)n, strerror(errno));
    a->hole = true;
    return 0;
}

int mxi_atomic_close(mxi_atomic *a, mx_diag *diag) {
    int rc = flush(a, diag);
    if (rc < 0) return rc;
    off_t end = a->hole ? lseek(a->fd, 0, SEEK_CUR) : 0;   // a file ending in a hole: give it its size
    if (a->hole && (end < 0 || ftruncate(a->fd, end) != 0))
        return mxi_diag(diag, MX_EIO, "%s: cannot set the size (%s); no file was written", a->path, strerror(errno));
    if (fsync(a->fd) != 0)
        return mxi_diag(diag, MX_EIO, "%s: fsync failed (%s); no file was written", a->path, strerror(errno));
    return 0;   // the fd (and with it the lock) stays open until the rename
}

int mxi_atomic_rename(mxi_atomic *a, mx_diag *diag) {
    int err = rename(a->tmp_path, a->path) == 0 ? 0 : errno;
    // closed after the rename: until then the lock tells remove_stale the file is in use
    // (the data is already on disk: fsync succeeded)
    if (a->fd >= 0) close(a->fd);
    a->fd = -1;
    if (err != 0) {
        unlink(a->tmp_path);
        free(a->tmp_path);
        a->tmp_path = NULL;
        return mxi_diag(diag, MX_EIO, "%s: cannot rename the finished temporary file over it (%s); no file was written",
                        a->path, strerror(err));
    }
    free(a->tmp_path);
    a->tmp_path = NULL;
    /* Make the rename itself durable; best effort (some file systems refuse fsync on a
     * directory, and the data is already safe). */
    const char *slash = strrchr(a->path, '/');
    char *dir = slash ? malloc((size_t)(slash - a->path) + 2) : NULL;
    if (slash && dir) {
        size_t dl = slash == a->path ? 1 : (size_t)(slash - a->path);
        memcpy(dir, a->path, dl);
        dir[dl] = '\0';
    }
    int dfd = (slash && !dir) ? -1 : open(slash ? dir : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        (void)fsync(dfd);
        close(dfd);
    }
    free(dir);
    return 0;
}

int mxi_atomic_commit(mxi_atomic *a, mx_diag *diag) {
    int rc = mxi_atomic_close(a, diag);
    if (rc == 0) rc = mxi_atomic_rename(a, diag);
    if (rc < 0) mxi_atomic_abort(a);
    else mxi_atomic_free(a);
    return rc;
}

void mxi_atomic_abort(mxi_atomic *a) {
    if (a->fd >= 0) close(a->fd);
    a->fd = -1;
    if (a->tmp_path) unlink(a->tmp_path);
    mxi_atomic_free(a);
}

void mxi_atomic_free(mxi_atomic *a) {
    free(a->tmp_path);
    free(a->path);
    free(a->buf);
    a->tmp_path = NULL;
    a->path = NULL;
    a->buf = NULL;
    a->used = 0;
}
