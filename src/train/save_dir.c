/* A run's save directory: made, locked, checked writable and checked free of other runs'
 * checkpoints at the start of a run (see save_dir.h). */
#define _DEFAULT_SOURCE   // flock, gethostname
#include "train/save_dir.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/file.h"

enum { HOST_MAX = 256 };

// the lock this process holds, for mxi_save_dir_abandon (a job ended by an error)
static mxi_save_dir *held_lock;

typedef struct {
    char host[HOST_MAX];
    long pid;
    char run[32];
    bool named;   // the file held the line (a creator killed before writing it leaves it empty)
} holder;

static void this_host(char *host, size_t size) {
    if (gethostname(host, size) != 0 || !host[0]) snprintf(host, size, "unknown");
    host[size - 1] = '\0';
    for (char *c = host; *c; c++)
        if (*c == ' ' || *c == '\n') *c = '_';   // one token in the lock file's line
}

static void read_holder(int fd, holder *h) {
    char text[HOST_MAX + 96] = "";
    ssize_t n = pread(fd, text, sizeof text - 1, 0);
    text[n > 0 ? n : 0] = '\0';
    *h = (holder){.pid = 0};
    h->named = sscanf(text, "host %255s pid %ld run %31s", h->host, &h->pid, h->run) == 3;
}

/* The flock of fd: 1 taken, 0 held by another process, -1 the file system has no locks. */
static int try_flock(int fd) {
    while (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        if (errno == EINTR) continue;
        return errno == EWOULDBLOCK ? 0 : -1;
    }
    return 1;
}

/* Whether fd is still the file at path (a releasing run removes it before unlocking). */
static bool still_there(int fd, const char *path) {
    struct stat a, b;
    return fstat(fd, &a) == 0 && stat(path, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

static int write_holder(int fd, const char *path, const char *host, const char *run, mx_diag *diag) {
    char text[HOST_MAX + 96];
    int n = snprintf(text, sizeof text, "host %s pid %ld run %s\n", host, (long)getpid(), run);
    if (ftruncate(fd, 0) != 0 || pwrite(fd, text, (size_t)n, 0) != n || fsync(fd) != 0)
        return mxi_diag(diag, MX_EIO, "training.save: cannot write the lock file '%s' (%s)", path, strerror(errno));
    return MX_OK;
}

static int in_use(const char *save, const char *path, const holder *h, mx_diag *diag) {
    if (!h->named)
        return mxi_diag(diag, MX_EIO, "training.save: '%s' is in use by another run that is starting (lock file "
                        "%s); wait for it to end or choose another training.save", save, path);
    return mxi_diag(diag, MX_EIO, "training.save: '%s' is in use by another run (host %s, pid %ld, run %s; lock file "
                    "%s); wait for it to end or choose another training.save", save, h->host, h->pid, h->run, path);
}

/* Rank 0: take SAVE's lock file, or say who holds it. A stale lock (see save_dir.h) is
 * taken over: locked, then rewritten in place, or (no locks) removed and made again. */
static int take_lock(const char *save, mxi_save_dir *sd, mx_diag *diag) {
    char host[HOST_MAX];
    this_host(host, sizeof host);
    if (snprintf(sd->path, sizeof sd->path, "%s/%s", save, MXI_SAVE_LOCK_NAME) >= (int)sizeof sd->path)
        return mxi_diag(diag, MX_EINVAL, "training.save: path too long: %s/%s", save, MXI_SAVE_LOCK_NAME);
    for (int attempt = 0; attempt < 16; attempt++) {
        bool created = true;
        int fd = open(sd->path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd < 0 && errno == EEXIST) {
            created = false;
            fd = open(sd->path, O_RDWR | O_CLOEXEC);
            if (fd < 0 && errno == ENOENT) continue;   // released meanwhile: create it
        }
        if (fd < 0)
            return mxi_diag(diag, MX_EIO, "training.save: cannot write in '%s' (%s)", save, strerror(errno));
        holder h;
        read_holder(fd, &h);
        int locked = try_flock(fd);
        if (locked == 0 || (!created && locked < 0 && (strcmp(h.host, host) != 0 || !h.named ||
                                                       kill((pid_t)h.pid, 0) == 0 || errno != ESRCH))) {
            // its holder's lock, or no locks here and a holder that may be alive: retried
            // while the holder is still writing its line
            close(fd);
            if (!h.named && attempt < 15) {
                nanosleep(&(struct timespec){.tv_nsec = 20 * 1000 * 1000}, NULL);
                continue;
            }
            if (locked < 0 && h.named && strcmp(h.host, host) != 0)
                return mxi_diag(diag, MX_EIO, "training.save: '%s' is locked by a run on host %s (pid %ld, run %s) "
                                "and this file system cannot say whether it is alive; if it has ended, remove %s",
                                save, h.host, h.pid, h.run, sd->path);
            return in_use(save, sd->path, &h, diag);
        }
        if (!created && locked < 0) {   // no locks, and its holder is dead: remove it and make a new one
            close(fd);
            unlink(sd->path);
            continue;
        }
        if (!still_there(fd, sd->path)) {   // released (removed) between our open and our lock
            close(fd);
            continue;
        }
        int rc = write_holder(fd, sd->path, host, sd->run_id, diag);
        if (rc) {
            if (created) unlink(sd->path);
            close(fd);
            return rc;
        }
        sd->fd = fd, sd->held = true;
        return MX_OK;
    }
    return mxi_diag(diag, MX_EIO, "training.save: cannot take the lock file '%s': other runs keep taking it",
                    sd->path);
}

/* The first entry of save that is a checkpoint (an iter_N directory, or the latest file), or
 * NULL. */
static const char *checkpoint_in(const char *save, char *name, size_t size) {
    DIR *d = opendir(save);
    if (!d) return NULL;
    struct dirent *e;
    const char *found = NULL;
    while (!found && (e = readdir(d))) {
        const char *n = e->d_name, *digits = n + 5;
        bool iter = !strncmp(n, "iter_", 5) && *digits && strspn(digits, "0123456789") == strlen(digits);
        char p[4200];
        struct stat st;
        bool latest = !strcmp(n, "latest_checkpointed_iteration.txt");
        if ((iter || latest) && snprintf(p, sizeof p, "%s/%s", save, n) < (int)sizeof p && stat(p, &st) == 0 &&
            (iter ? S_ISDIR(st.st_mode) : S_ISREG(st.st_mode)))
            found = (snprintf(name, size, "%s", n), name);
    }
    closedir(d);
    return found;
}

/* Rank 0: everything but the run id's broadcast. */
static int open_on_rank0(const char *save, mxi_save_start start, mxi_save_dir *sd, mx_diag *diag) {
    struct stat st;
    sd->made = stat(save, &st) != 0;
    if (mxi_make_dirs(save) != 0)
        return mxi_diag(diag, MX_EIO, "training.save: cannot create the directory '%s' (%s)", save, strerror(errno));
    int rc = take_lock(save, sd, diag);
    if (rc) return rc;
    // saves make a directory per checkpoint: a directory the lock file could be made in may
    // still refuse that (or the lock file was taken over in place)
    char probe[4200];
    snprintf(probe, sizeof probe, "%s/.probe.%s", save, sd->run_id);
    if (mkdir(probe, 0777) != 0 || rmdir(probe) != 0)
        return mxi_diag(diag, MX_EIO, "training.save: cannot write in '%s' (%s)", save, strerror(errno));
    char name[256];
    if (start == MXI_SAVE_FRESH && checkpoint_in(save, name, sizeof name))
        return mxi_diag(diag, MX_ECONFIG, "training.save: '%s' already holds checkpoints (%s) and training.load is not "
                        "set; set training.load: %s to resume from them, or choose an empty directory (or remove "
                        "them) to start afresh", save, name, save);
    return MX_OK;
}

int mxi_save_dir_open(const char *save, mxi_save_start start, mxi_comm *comm, mxi_save_dir *sd, mx_diag *diag) {
    *sd = (mxi_save_dir){.fd = -1};
    bool root = mxi_comm_rank(comm) == 0;
    // the run id: 52 bits (exact in the double the all-reduce carries) of the clock, the pid
    // and the host; rank 0's for every rank, negative when rank 0 failed
    double id = 0;
    int rc = MX_OK;
    if (root) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        char host[HOST_MAX];
        this_host(host, sizeof host);
        uint64_t x = (uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15ull ^ (uint64_t)ts.tv_sec << 24 ^ (uint64_t)getpid() << 40;
        for (const char *c = host; *c; c++) x = (x ^ (unsigned char)*c) * 0x100000001B3ull;
        id = (double)(x >> 12);
        snprintf(sd->run_id, sizeof sd->run_id, "%013llx", (unsigned long long)(x >> 12));
        rc = open_on_rank0(save, start, sd, diag);
        if (rc) id = -1;
    }
    int crc = mxi_comm_allreduce_max(comm, &id, 1, "training.save: the run id", rc ? NULL : diag);
    if (!rc && crc) rc = crc;
    if (!rc && id < 0)
        rc = mxi_diag(diag, MX_EIO, "training.save: rank 0 could not lock and check '%s'", save);
    if (!rc) snprintf(sd->run_id, sizeof sd->run_id, "%013llx", (unsigned long long)id);
    if (rc) mxi_save_dir_close(sd);
    else if (sd->held) held_lock = sd;
    return rc;
}

void mxi_save_dir_close(mxi_save_dir *sd) {
    if (!sd->held) return;
    if (held_lock == sd) held_lock = NULL;
    // removed while still locked: a run that opened it and then gets the lock sees that it
    // is gone (still_there) and makes its own
    unlink(sd->path);
    close(sd->fd);
    sd->held = false, sd->fd = -1;
    // a directory this run made and wrote nothing into (it failed at start) is not left
    // behind; rmdir removes only an empty one
    char *slash = strrchr(sd->path, '/');
    if (sd->made && slash) *slash = '\0', rmdir(sd->path);
}

void mxi_save_dir_abandon(void) {
    if (held_lock) mxi_save_dir_close(held_lock);
}
