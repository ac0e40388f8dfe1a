/* Internal: communication between ranks over MPI (SPEC §6).
 *
 * A process started by an MPI launcher (mpirun, mpiexec, srun with PMI) joins MPI_COMM_WORLD;
 * a process started without one is a world of one rank and never touches MPI, so the same
 * binary trains on one process without a launcher. Every MPI call is checked: a failure
 * returns MX_ECOMM with a diag naming the call and MPI's reason; the caller then takes the
 * job down with mxi_comm_abort, so that no rank waits forever on a dead peer.
 *
 * Every wait is a watchdog: no collective blocks inside MPI. A wait polls its request
 * (MPI_Test; after the first millisecond with sleeps that grow from 20 us to 1 ms, so that a
 * waiting rank leaves its core to others) and gives up after the process's timeout
 * (parallel.timeout_s) with MX_ETIMEOUT and a diag naming the collective and what it was
 * for: a peer that died without MPI noticing, stopped, or lost its network ends the job with
 * a message instead of a silent hang. */
#ifndef MXI_COMM_H
#define MXI_COMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "mxtrain/error.h"

typedef struct mxi_comm mxi_comm;

/* A nonblocking collective in flight. */
typedef struct {
    _Alignas(8) unsigned char mpi[16];   // the MPI_Request (comm.c checks that it fits)
    bool active;
    const char *call;                    // the MPI function, for the watchdog's message
    char what[96];                       // what it is for (mxi_comm_label), or empty
} mxi_request;

/* The watchdog's limit when no config sets one: torch.distributed's default process-group
 * timeout (10 minutes). */
#define MXI_COMM_DEFAULT_TIMEOUT_S 600.0
/* The most MPI_Finalize may take once every rank has finished (see mxi_comm_finalize). */
#define MXI_COMM_FINALIZE_LIMIT_S 30.0

typedef enum { MXI_WIRE_F32 = 0, MXI_WIRE_BF16 = 1, MXI_WIRE_F64 = 2 } mxi_wire_dtype;

/* Join the launcher's world, or make a world of one. Idempotent per process. */
int mxi_comm_init(mxi_comm **out, mx_diag *diag);
/* Leave MPI (after the last collective) once every rank has come here: MX_ETIMEOUT when
 * one does not within the timeout (the caller then ends the job with mxi_comm_abort). If
 * MPI_Finalize itself then hangs (an MPI bug), the process ends with exit_code after
 * min(timeout, MXI_COMM_FINALIZE_LIMIT_S) seconds, saying so on stderr. */
int mxi_comm_finalize(mxi_comm *comm, int exit_code, mx_diag *diag);
/* End the whole job now, every rank, with exit code code. Never returns. */
void mxi_comm_abort(mxi_comm *comm, int code);

int mxi_comm_rank(const mxi_comm *comm);
int mxi_comm_world(const mxi_comm *comm);
/* Seconds spent waiting in collectives since the last call (the counter restarts). */
double mxi_comm_take_seconds(mxi_comm *comm);
/* The watchdog's limit for every wait of this process, in seconds (> 0; default
 * MXI_COMM_DEFAULT_TIMEOUT_S): a wait that has not completed after this long fails. */
void mxi_comm_set_timeout(double seconds);
double mxi_comm_timeout(void);

/* recv (world * bytes) = every rank's send (bytes), rank order. send NULL: in place, the
 * rank's own block already at recv + rank * bytes. Nonblocking: finish with mxi_comm_wait
 * before touching either buffer. */
int mxi_comm_iallgather(mxi_comm *comm, const void *send, void *recv, size_t bytes, mxi_request *req, mx_diag *diag);
/* recv (count elements of dtype) = sum over ranks of their send's block `rank` (send holds
 * world blocks of count). recv == send: in place, the sum in send's first block. bf16 blocks
 * are summed in fp32 and rounded to nearest even. Nonblocking, as above. */
int mxi_comm_ireduce_scatter(mxi_comm *comm, const void *send, void *recv, size_t count, mxi_wire_dtype dtype,
                             mxi_request *req, mx_diag *diag);
/* In place, blocking: buf holds counts[r] fp32 elements for each rank r in rank order; on
 * return its first counts[rank] elements are this rank's part of the sum over the ranks
 * (MPI_Ireduce_scatter, waited for as mxi_comm_wait does; what: for the watchdog's message). */
int mxi_comm_reduce_scatter_f32(mxi_comm *comm, float *buf, const int *counts, const char *what, mx_diag *diag);
/* Say what a started request is for, in the watchdog's message: "weights of unit
 * 'model.layers.3', forward" (printf format; cut to fit). */
void mxi_comm_label(mxi_request *req, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Wait for req to complete, polling, for at most the timeout: MX_ETIMEOUT then, with the
 * request still in flight (it may be waited for again), else MX_OK or MX_ECOMM. */
int mxi_comm_wait(mxi_comm *comm, mxi_request *req, mx_diag *diag);
/* Let MPI make progress on requests in flight (never blocks). */
void mxi_comm_poke(mxi_comm *comm, mxi_request *req);

/* In place: x (n) = sum over ranks; max over ranks. Return when done (MPI_Iallreduce,
 * waited for as mxi_comm_wait does); what says what for, in the watchdog's message. */
int mxi_comm_allreduce_sum(mxi_comm *comm, double *x, int n, const char *what, mx_diag *diag);
int mxi_comm_allreduce_max(mxi_comm *comm, double *x, int n, const char *what, mx_diag *diag);
/* recv (world * bytes) on root only = every rank's send; returns when done (MPI_Igather). */
int mxi_comm_gather(mxi_comm *comm, const void *send, void *recv, size_t bytes, int root, const char *what,
                    mx_diag *diag);

/* Process groups (HSDP). A group is a handle like the world's, over the ranks of parent that
 * gave the same color (MPI_Comm_split), ranked by key: every collective above works on it
 * unchanged, its rank and world being those within the group. Collective over parent.
 * Waits in a group count in its parent's mxi_comm_take_seconds. Free every group (also
 * collective) before mxi_comm_finalize. */
int mxi_comm_split(mxi_comm *parent, int color, int key, mxi_comm **group, mx_diag *diag);
void mxi_comm_free(mxi_comm *group);
/* In place: buf (count elements of dtype) = its sum over the ranks (bf16 summed in fp32 and
 * rounded to nearest even at each addition, as in mxi_comm_ireduce_scatter). Every rank
 * gets the same bits. Nonblocking: finish with mxi_comm_wait before touching buf. */
int mxi_comm_iallreduce(mxi_comm *comm, void *buf, size_t count, mxi_wire_dtype dtype, mxi_request *req,
                        mx_diag *diag);

/* Expert parallelism: rows of row_bytes each to and from every rank. send holds, in rank
 * order, send_rows[d] rows for rank d; recv gets, in rank order, recv_rows[s] rows from rank
 * s (which the caller knows: each rank's send_rows[me]). Returns when done (MPI_Ialltoallv,
 * waited for as mxi_comm_wait does; what: what for, in the watchdog's message). */
int mxi_comm_alltoallv(mxi_comm *comm, const void *send, const int *send_rows, void *recv, const int *recv_rows,
                       size_t row_bytes, const char *what, mx_diag *diag);
/* The same, nonblocking: finish with mxi_comm_wait before touching send or recv, and before
 * the group's next exchange (its counts live in the group until then); the caller's row
 * counts may change once it has started. */
int mxi_comm_ialltoallv(mxi_comm *comm, const void *send, const int *send_rows, void *recv, const int *recv_rows,
                        size_t row_bytes, mxi_request *req, mx_diag *diag);

#endif
