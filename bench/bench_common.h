/* Helpers shared by the benchmarks: the CPU's name for the report (the clock is core/clock.h). */
#ifndef MXT_BENCH_COMMON_H
#define MXT_BENCH_COMMON_H

#include <stdio.h>
#include <string.h>

#include "core/clock.h"

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
