/* Internal: the one clock for timing (steps, collectives, benchmarks): monotonic seconds. */
#ifndef MXI_CLOCK_H
#define MXI_CLOCK_H

#include <time.h>

static inline double mxi_now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

#endif
