/* Host facts (core/host.h): memory from /proc and the cgroup files, local ranks from the
 * MPI launcher's environment. */
#include "core/host.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The first number of a file (a cgroup limit or usage); 0 when it is absent, "max", or not
 * a number. */
static uint64_t file_number(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char buf[64] = {0};
    char *end = NULL;
    unsigned long long v = fgets(buf, sizeof buf, f) ? strtoull(buf, &end, 10) : 0;
    fclose(f);
    return end && end != buf ? (uint64_t)v : 0;
}

static uint64_t meminfo_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kib = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1) break;
    fclose(f);
    return (uint64_t)kib * 1024;
}

uint64_t mxi_host_available_bytes(const char **source) {
    uint64_t avail = meminfo_available();
    *source = "MemAvailable";
    static const struct {
        const char *limit, *usage, *name;
    } cgroups[] = {
        {.limit = "/sys/fs/cgroup/memory.max", .usage = "/sys/fs/cgroup/memory.current",
         .name = "the cgroup's memory.max"},
        {.limit = "/sys/fs/cgroup/memory/memory.limit_in_bytes", .usage = "/sys/fs/cgroup/memory/memory.usage_in_bytes",
         .name = "the cgroup's memory.limit_in_bytes"},
    };
    for (size_t i = 0; i < sizeof cgroups / sizeof cgroups[0]; i++) {
        uint64_t limit = file_number(cgroups[i].limit), usage = file_number(cgroups[i].usage);
        if (!limit || limit >= (uint64_t)1 << 60) continue;   // none, or v1's "no limit"
        uint64_t left = limit > usage ? limit - usage : 0;
        if (!avail || left < avail) avail = left, *source = cgroups[i].name;
    }
    return avail;
}

uint64_t mxi_host_self_rss_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return 0;
    unsigned long long size = 0, resident = 0;
    int n = fscanf(f, "%llu %llu", &size, &resident);
    fclose(f);
    long page = sysconf(_SC_PAGESIZE);
    return n == 2 && page > 0 ? (uint64_t)resident * (uint64_t)page : 0;
}

int mxi_host_local_ranks(void) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        int n = v ? atoi(v) : 0;
        if (n > 0) return n;
    }
    return 1;
}
