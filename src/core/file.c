/* Opening the files a user names: regular files only, never blocking, with size limits
 * (see file.h). */
#include "core/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/diag.h"

static const char *kind_of(mode_t mode) {
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
#ifdef S_ISSOCK
    if (S_ISSOCK(mode)) return "a socket";
#endif
    return "a special file";
}

/* "N MiB" when max is a whole number of MiB, else "N bytes". */
static const char *format_max(char *buf, size_t size, uint64_t max) {
    if (max % (1u << 20) == 0) snprintf(buf, size, "%llu MiB", (unsigned long long)(max >> 20));
    else snprintf(buf, size, "%llu bytes", (unsigned long long)max);
    return buf;
}

static int too_large(const char *path, const char *allowed, uint64_t bytes, bool more, uint64_t max, mx_diag *diag) {
    char m[64];
    format_max(m, sizeof m, max);
    if (!allowed)
        return mxi_diag(diag, MX_EIO, "%s: is %s%llu bytes, more than %s", path, more ? "over " : "",
                        (unsigned long long)bytes, m);
    return mxi_diag(diag, MX_EIO, "%s: is %s%llu bytes (allowed: %s of at most %s)", path, more ? "over " : "",
                    (unsigned long long)bytes, allowed, m);
}

int mxi_open_input(const char *path, const char *allowed, uint64_t max_bytes, int *fd, uint64_t *size,
                   mx_diag *diag) {
    *fd = -1;
    *size = 0;
    // O_NONBLOCK: opening a FIFO would otherwise wait for a writer; it is refused below
    int f = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (f < 0) return mxi_diag(diag, MX_EIO, "%s: cannot open (%s)", path, strerror(errno));
    struct stat st;
    int rc = 0;
    if (fstat(f, &st) != 0) rc = mxi_diag(diag, MX_EIO, "%s: cannot stat (%s)", path, strerror(errno));
    else if (S_ISDIR(st.st_mode))
        rc = allowed ? mxi_diag(diag, MX_EIO, "%s: is a directory (allowed: %s)", path, allowed)
                     : mxi_diag(diag, MX_EIO, "%s: is a directory", path);
    else if (!S_ISREG(st.st_mode))
        rc = allowed ? mxi_diag(diag, MX_EIO, "%s: is %s, not a regular file (allowed: %s)", path, kind_of(st.st_mode),
                                allowed)
                     : mxi_diag(diag, MX_EIO, "%s: is %s, not a regular file", path, kind_of(st.st_mode));
    else if (max_bytes && (uint64_t)st.st_size > max_bytes)
        rc = too_large(path, allowed, (uint64_t)st.st_size, false, max_bytes, diag);
    else if (fcntl(f, F_SETFL, fcntl(f, F_GETFL) & ~O_NONBLOCK) != 0)
        rc = mxi_diag(diag, MX_EIO, "%s: cannot open (%s)", path, strerror(errno));
    if (rc) {
        close(f);
        return rc;
    }
    *fd = f;
    *size = (uint64_t)st.st_size;
    return 0;
}

int mxi_read_input(const char *path, const char *allowed, uint64_t max_bytes, char **data, size_t *len,
                   mx_diag *diag) {
    *data = NULL;
    *len = 0;
    int fd;
    uint64_t size;
    int rc = mxi_open_input(path, allowed, max_bytes, &fd, &size, diag);
    if (rc) return rc;
    size_t cap = (size_t)size + 2 > 4096 ? (size_t)size + 2 : 4096, n = 0;   // + 2: the NUL, and a read that sees the end
    char *buf = malloc(cap);
    while (rc == 0) {
        if (buf && n + 1 == cap) {   // keep room for the NUL
            char *grown = realloc(buf, cap * 2);
            if (!grown) free(buf);
            buf = grown, cap *= 2;
        }
        if (!buf) {
            rc = mxi_diag(diag, MX_ENOMEM, "%s: out of memory reading the file (%zu bytes)", path, n + 1 == cap ? cap * 2 : cap);
            break;
        }
        ssize_t got = read(fd, buf + n, cap - 1 - n);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) rc = mxi_diag(diag, MX_EIO, "%s: cannot read (%s)", path, strerror(errno));
        if (got <= 0) break;
        n += (size_t)got;
        if (max_bytes && n > max_bytes) rc = too_large(path, allowed, max_bytes, true, max_bytes, diag);
    }
    close(fd);
    if (rc) {
        free(buf);
        return rc;
    }
    buf[n] = '\0';
    *data = buf, *len = n;
    return 0;
}

int mxi_make_dirs(const char *path) {
    char p[4096];
    if (snprintf(p, sizeof p, "%s", path) >= (int)sizeof p) return errno = ENAMETOOLONG, -1;
    for (char *s = p + 1; *s; s++) {
        if (*s != '/') continue;
        *s = 0;
        if (mkdir(p, 0777) != 0 && errno != EEXIST) return -1;
        *s = '/';
    }
    if (mkdir(p, 0777) != 0 && errno != EEXIST) return -1;
    struct stat st;
    if (stat(p, &st) != 0) return -1;
    if (!S_ISDIR(st.st_mode)) return errno = ENOTDIR, -1;
    return 0;
}

int mxi_make_parent_dirs(const char *file) {
    const char *slash = strrchr(file, '/');
    if (!slash || slash == file) return 0;
    char dir[4096];
    if ((size_t)(slash - file) >= sizeof dir) return errno = ENAMETOOLONG, -1;
    memcpy(dir, file, (size_t)(slash - file));
    dir[slash - file] = 0;
    return mxi_make_dirs(dir);
}

bool mxi_same_file(const char *a, const char *b) {
    struct stat sa, sb;
    if (stat(a, &sa) == 0 && stat(b, &sb) == 0) return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
    return strcmp(a, b) == 0;
}
