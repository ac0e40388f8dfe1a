/* Shared by the libFuzzer targets tests/fuzz/fuzz_*.c (SPEC-free test code). Each target
 * defines LLVMFuzzerTestOneInput; built with clang -fsanitize=fuzzer it is a fuzzer
 * (`make fuzz`, build-fuzz/fuzz/), built with replay_main.c it replays files (every build's
 * BUILD/fuzz/, run over the seeds and regressions by tests/fuzz_replay.sh).
 *
 * Besides "no crash, no sanitizer report", every target checks that an error is a negative
 * known status with a non-empty one-line message, and whatever else it states. */
#ifndef MXT_FUZZ_H
#define MXT_FUZZ_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memfd_create */
#endif

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "mxtrain/error.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_REQUIRE(cond)                                                                       \
    do {                                                                                         \
        if (!(cond)) {                                                                           \
            fprintf(stderr, "fuzz check failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__);       \
            abort();                                                                             \
        }                                                                                        \
    } while (0)

/* rc is 0, or a known negative status whose diag is one non-empty line. With
 * MXTRAIN_FUZZ_VERBOSE set in the environment, every status is printed (to see what a seed
 * or a found input does). */
static inline void fuzz_check_status(int rc, const mx_diag *diag) {
    if (getenv("MXTRAIN_FUZZ_VERBOSE"))
        fprintf(stderr, "  %s%s%s\n", mx_errname(rc), rc ? ": " : "", rc ? diag->msg : "");
    if (rc == 0) return;
    FUZZ_REQUIRE(rc < 0 && strcmp(mx_errname(rc), "MX_EUNKNOWN") != 0);
    FUZZ_REQUIRE(memchr(diag->msg, '\0', sizeof diag->msg) != NULL);
    if (diag->msg[0] == '\0' || strchr(diag->msg, '\n') || strchr(diag->msg, '\r'))
        fprintf(stderr, "fuzz: status %s with the message \"%s\"\n", mx_errname(rc), diag->msg);
    FUZZ_REQUIRE(diag->msg[0] != '\0');
    FUZZ_REQUIRE(strchr(diag->msg, '\n') == NULL && strchr(diag->msg, '\r') == NULL);
}

/* The input as a NUL-terminated string (cut at its first NUL byte, as a C API sees it);
 * free() it. */
static inline char *fuzz_cstr(const uint8_t *data, size_t size) {
    char *s = malloc(size + 1);
    FUZZ_REQUIRE(s != NULL);
    if (size) memcpy(s, data, size);
    s[size] = '\0';
    return s;
}

/* A path whose file holds exactly data[0..size): an in-memory file (memfd) reached through
 * /proc/self/fd, so the readers that take a path read it with their own open/stat/pread.
 * slot 0 and 1 are two independent files. */
static inline const char *fuzz_file(int slot, const uint8_t *data, size_t size) {
    static int fds[2] = {-1, -1};
    static char paths[2][40];
    if (fds[slot] < 0) {
        fds[slot] = memfd_create("mxtrain-fuzz", MFD_CLOEXEC);
        FUZZ_REQUIRE(fds[slot] >= 0);
        snprintf(paths[slot], sizeof paths[slot], "/proc/self/fd/%d", fds[slot]);
    }
    FUZZ_REQUIRE(ftruncate(fds[slot], 0) == 0);
    size_t done = 0;
    while (done < size) {
        ssize_t w = pwrite(fds[slot], data + done, size - done, (off_t)done);
        FUZZ_REQUIRE(w > 0);
        done += (size_t)w;
    }
    return paths[slot];
}

#endif
