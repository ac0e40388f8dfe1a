#include "core/rng.h"
#include "harness.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

enum { MAX_PRINTED_PER_TEST = 20 };
static int failures_in_test;

void mxt_fail(const char *file, int line, const char *fmt, ...) {
    if (++failures_in_test > MAX_PRINTED_PER_TEST) return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stdout, "    %s:%d: ", file, line);
    vfprintf(stdout, fmt, ap);
    fputc('\n', stdout);
    va_end(ap);
}

int mxt_current_failures(void) { return failures_in_test; }

static char scratch[64];   // mxt_tmpdir's, once made

/* Runs every test, or only those whose name contains argv[1]. */
int mxt_run(const mxt_test *tests, int count, int argc, char **argv) {
    const char *filter = argc > 1 ? argv[1] : NULL;
    int passed = 0, failed = 0;
    for (int i = 0; i < count; i++) {
        if (filter && !strstr(tests[i].name, filter)) continue;
        failures_in_test = 0;
        tests[i].fn();
        fflush(stdout);
        if (failures_in_test == 0) {
            passed++;
            printf("ok   %s\n", tests[i].name);
        } else {
            failed++;
            printf("FAIL %s (%d failed checks)\n", tests[i].name, failures_in_test);
        }
    }
    printf("# tally %d %d\n", passed, failed);
    if (scratch[0] && mxt_remove_tree(scratch) != 0) fprintf(stderr, "could not remove %s\n", scratch);
    scratch[0] = '\0';
    return failed ? 1 : 0;
}

double mxt_rel_err(const float *got, const float *want, size_t n) {
    double d = 0, w = 0;
    for (size_t i = 0; i < n; i++) {
        d += ((double)got[i] - want[i]) * ((double)got[i] - want[i]);
        w += (double)want[i] * want[i];
    }
    return sqrt(d / (w > 0 ? w : 1));
}

/* ---- Files ---------------------------------------------------------------------------- */

static void setup_failed(const char *what, const char *path) {
    fprintf(stderr, "test setup: %s %s: %s\n", what, path, strerror(errno));
    exit(1);
}

const char *mxt_tmpdir(void) {
    if (!scratch[0]) {
        snprintf(scratch, sizeof scratch, "/tmp/mxt_XXXXXX");
        if (!mkdtemp(scratch)) setup_failed("cannot create", scratch);
    }
    return scratch;
}

const char *mxt_tmp_path(const char *name) {
    static char ring[8][512];
    static int k;
    const char *dir = mxt_tmpdir();
    k = (k + 1) % 8;
    snprintf(ring[k], sizeof ring[k], "%s/%s", dir, name);
    return ring[k];
}

const char *mxt_tmp_mkdir(const char *name) {
    const char *path = mxt_tmp_path(name);
    struct stat st;
    if (lstat(path, &st) == 0 && mxt_remove_tree(path) != 0) setup_failed("cannot remove", path);
    if (mkdir(path, 0700) != 0) setup_failed("cannot create", path);
    return path;
}

void mxt_write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) setup_failed("cannot open", path);
    bool ok = n == 0 || fwrite(data, 1, n, f) == n;
    if (fclose(f) != 0 || !ok) setup_failed("cannot write", path);
}

void mxt_write_text(const char *path, const char *text) { mxt_write_bytes(path, text, strlen(text)); }

int mxt_count_entries(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    const struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

int mxt_remove_tree(const char *path) {
    struct stat st;
    if (lstat(path, &st) != 0) return -1;
    if (!S_ISDIR(st.st_mode)) return unlink(path);
    DIR *d = opendir(path);
    if (!d) return -1;
    int rc = 0;
    const struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        size_t len = strlen(path) + strlen(e->d_name) + 2;
        char *child = malloc(len);
        if (!child) {
            rc = -1;
            break;
        }
        snprintf(child, len, "%s/%s", path, e->d_name);
        if (mxt_remove_tree(child) != 0) rc = -1;
        free(child);
    }
    closedir(d);
    return rmdir(path) == 0 ? rc : -1;
}

/* ---- Random numbers ------------------------------------------------------------------- */

uint64_t mxt_splitmix64(uint64_t *state) { return mxi_rng_next(state); }   // the project's one generator

double mxt_uniform(uint64_t *state) { return (double)(mxt_splitmix64(state) >> 11) / 9007199254740992.0 * 2.0 - 1.0; }

uint64_t mxt_lcg64(uint64_t *state) { return *state = *state * 6364136223846793005ull + 1442695040888963407ull; }
