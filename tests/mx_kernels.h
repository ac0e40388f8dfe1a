/* The MX kernels the tests run (test_mx*.c): the library's list, each reported by name. */
#ifndef MXT_MX_KERNELS_H
#define MXT_MX_KERNELS_H

#include <stdbool.h>
#include <stdio.h>

#include "mxtrain/mx.h"
#include "numerics/mx_internal.h"   // mxi_kernel_emulated

/* ---- kernels under test ----
 *
 * The list is the library's: every value mx_kernel_name() knows, so a new kernel is
 * tested here without touching this file. A test runs each kernel the CPU can execute and
 * says so per kernel by name; for one it cannot, it prints why it was not run (that is
 * not a pass: nothing was checked). */

enum { MAX_KERNELS = 16 };

static inline const char *kernel_label(mx_kernel k) {
    return mxi_kernel_emulated(k) ? (k == MX_KERNEL_AVX512 ? "avx512 (SIMDe emulation)" : "emulated") : mx_kernel_name(k);
}

/* The kernels this CPU runs, into out. */
static inline int available_kernels(mx_kernel *out) {
    int n = 0;
    for (int k = MX_KERNEL_REF; mx_kernel_name((mx_kernel)k) && n < MAX_KERNELS; k++)
        if (mx_kernel_available((mx_kernel)k)) out[n++] = (mx_kernel)k;
    return n;
}

/* A "not run" line for each kernel the CPU cannot execute, closing a test's report. */
static inline void report_unavailable(void) {
    for (int k = MX_KERNEL_REF; mx_kernel_name((mx_kernel)k); k++)
        if (!mx_kernel_available((mx_kernel)k))
            printf("    kernel %s: not run (%s)\n", mx_kernel_name((mx_kernel)k), mx_kernel_missing((mx_kernel)k));
}

/* The same without the reference: the fast paths, each compared with the reference. */
static inline int fast_kernels(mx_kernel *out) {
    mx_kernel all[MAX_KERNELS];
    int n = 0, na = available_kernels(all);
    for (int i = 0; i < na; i++)
        if (all[i] != MX_KERNEL_REF) out[n++] = all[i];
    return n;
}

/* The closing line of one kernel's part of a test (after the last, report_unavailable). */
static inline void kernel_report(mx_kernel k, bool failed, const char *what) {
    printf("    kernel %s: %s%s\n", kernel_label(k), failed ? "FAILED: " : "", what);
}

#endif
