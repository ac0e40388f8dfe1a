#include "harness.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>

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
