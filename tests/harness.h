/* A small test harness: typed assertions that print both sides, and a main() that runs a
 * table of tests and ends with a tally line the runner (tests/run) adds up; with the
 * scaffolding several tests share: a scratch directory, file writers, and seeded random
 * numbers.
 *
 * A failed CHECK records the failure and lets the test go on, so one run shows every
 * mismatch (the first few of each test are printed). */
#ifndef MXT_HARNESS_H
#define MXT_HARNESS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    const char *name;
    void (*fn)(void);
} mxt_test;

void mxt_fail(const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int mxt_run(const mxt_test *tests, int count, int argc, char **argv);
#define MXT_RUN(tests, argc, argv) mxt_run(tests, (int)(sizeof(tests) / sizeof((tests)[0])), argc, argv)

/* Failures recorded so far in the running test; lets loops stop early after a mismatch. */
int mxt_current_failures(void);

/* ||got - want|| / ||want|| over n floats, in double (||want|| taken as 1 when it is 0). */
double mxt_rel_err(const float *got, const float *want, size_t n);

/* ---- Files. Setup that cannot be done (no directory, an unwritable file) ends the binary
 * with a message: its missing tally line counts as a failure in tests/run. */

/* The binary's scratch directory, /tmp/mxt_XXXXXX, made on first use and removed with all
 * it holds when mxt_run returns. */
const char *mxt_tmpdir(void);
/* SCRATCH/name. The result lives in a ring of 8 buffers: the last 8 results stay valid. */
const char *mxt_tmp_path(const char *name);
/* SCRATCH/name made an empty directory (anything there before is removed); as mxt_tmp_path. */
const char *mxt_tmp_mkdir(const char *name);
/* Write n bytes to path, replacing it. */
void mxt_write_bytes(const char *path, const void *data, size_t n);
/* Write text (without its NUL) to path, replacing it. */
void mxt_write_text(const char *path, const char *text);
/* Entries of dir other than . and ..; -1 if it cannot be read. */
int mxt_count_entries(const char *dir);
/* Remove path, and everything in it when it is a directory (symbolic links are not
 * followed). Returns 0, or -1 if something could not be removed. */
int mxt_remove_tree(const char *path);

/* ---- Random numbers for test data: each test file seeds its own state, so the data is the
 * same on every run and machine. */

/* splitmix64: the next 64 random bits. */
uint64_t mxt_splitmix64(uint64_t *state);
/* Uniform in [-1, 1) from the top 53 bits of mxt_splitmix64. */
double mxt_uniform(uint64_t *state);
/* The 64-bit LCG with Knuth's MMIX constants: advances *state and returns it (its high bits
 * are the random ones). */
uint64_t mxt_lcg64(uint64_t *state);

#define CHECK(cond) \
    do { if (!(cond)) mxt_fail(__FILE__, __LINE__, "CHECK(%s) failed", #cond); } while (0)

#define CHECK_EQ_INT(a, b) do { \
    long long a_ = (long long)(a), b_ = (long long)(b); \
    if (a_ != b_) mxt_fail(__FILE__, __LINE__, "%s == %s: %lld != %lld", #a, #b, a_, b_); \
} while (0)

#define CHECK_EQ_HEX(a, b) do { \
    unsigned long long a_ = (unsigned long long)(a), b_ = (unsigned long long)(b); \
    if (a_ != b_) mxt_fail(__FILE__, __LINE__, "%s == %s: 0x%llx != 0x%llx", #a, #b, a_, b_); \
} while (0)

#define CHECK_EQ_DBL(a, b) do { \
    double a_ = (double)(a), b_ = (double)(b); \
    if (!(a_ == b_)) mxt_fail(__FILE__, __LINE__, "%s == %s: %.17g != %.17g", #a, #b, a_, b_); \
} while (0)

#define CHECK_NEAR(a, b, tol) do { \
    double a_ = (double)(a), b_ = (double)(b), t_ = (double)(tol); \
    if (!(a_ - b_ <= t_ && b_ - a_ <= t_)) \
        mxt_fail(__FILE__, __LINE__, "%s ~= %s (tol %g): %.17g vs %.17g", #a, #b, t_, a_, b_); \
} while (0)

#define CHECK_STR_EQ(a, b) do { \
    const char *a_ = (a), *b_ = (b); \
    if (!a_ || !b_ || strcmp(a_, b_) != 0) \
        mxt_fail(__FILE__, __LINE__, "%s == %s: \"%s\" != \"%s\"", #a, #b, a_ ? a_ : "(null)", b_ ? b_ : "(null)"); \
} while (0)

#define CHECK_STR_CONTAINS(hay, needle) do { \
    const char *h_ = (hay), *n_ = (needle); \
    if (!h_ || !strstr(h_, n_)) \
        mxt_fail(__FILE__, __LINE__, "%s contains \"%s\": \"%s\"", #hay, n_, h_ ? h_ : "(null)"); \
} while (0)

#define CHECK_MEM_EQ(a, b, n) do { \
    const uint8_t *a_ = (const uint8_t *)(a), *b_ = (const uint8_t *)(b); size_t n_ = (size_t)(n); \
    for (size_t i_ = 0; i_ < n_; i_++) if (a_[i_] != b_[i_]) { \
        mxt_fail(__FILE__, __LINE__, "%s == %s: first difference at byte %zu: 0x%02x != 0x%02x", \
                 #a, #b, i_, a_[i_], b_[i_]); break; } \
} while (0)

#endif
