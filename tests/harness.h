/* A small test harness: typed assertions that print both sides, and a main() that runs a
 * table of tests and ends with a tally line the runner (tests/run) adds up.
 *
 * A failed CHECK records the failure and lets the test go on, so one run shows every
 * mismatch (the first few of each test are printed). */
#ifndef MXT_HARNESS_H
#define MXT_HARNESS_H

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
