/* Internal: what the host offers a run: the memory available to this process's cgroup and
 * machine, and how many ranks of the job share the host. */
#ifndef MXI_HOST_H
#define MXI_HOST_H

#include <stdint.h>

/* Bytes a new allocation can take without swapping or the OOM killer: /proc/meminfo's
 * MemAvailable, or where lower the cgroup's limit less its usage (cgroup v2 memory.max and
 * memory.current, or v1 memory.limit_in_bytes and memory.usage_in_bytes). *source names
 * which ("MemAvailable", "the cgroup's memory.max"). 0 when nothing could be read. */
uint64_t mxi_host_available_bytes(const char **source);

/* This process's resident memory now (/proc/self/statm), in bytes; 0 without /proc. */
uint64_t mxi_host_self_rss_bytes(void);

/* Ranks of this job on this host (the launcher's OMPI_COMM_WORLD_LOCAL_SIZE or
 * MPI_LOCALNRANKS); 1 without a launcher. */
int mxi_host_local_ranks(void);

#endif
