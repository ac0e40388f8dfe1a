/* Helpers shared by the benchmarks: a monotonic clock and the CPU's name for the report. */
#ifndef MXT_BENCH_COMMON_H
#define MXT_BENCH_COMMON_H

#include <stdio.h>
#include <string.h>
#include <time.h>

static inline double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The "model name" line of /proc/cpuinfo, or "unknown CPU". */
static inline void cpu_model(char *out, size_t size) {
    snprintf(out, size, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) == 0) {
            char *v = strchr(line, ':');
            if (v) {
                v += 2;
                v[strcspn(v, "\n")] = 0;
                snprintf(out, size, "%s", v);
            }
            break;
        }
    }
    fclose(f);
}

#endif
