/* MPI, checked (see comm.h). */
#include "distributed/comm.h"

#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/diag.h"
#include "core/clock.h"
#include "mxtrain/safetensors.h"

struct mxi_comm {
    bool mpi;
    int rank, world;
    MPI_Comm world_comm;   // MPI_COMM_WORLD, or a group's communicator (mxi_comm_split)
    MPI_Op bf16_sum;
    double wait_seconds;
    mxi_comm *parent, *groups, *next_group;   // mxi_comm_split: what this group was split from, the
                                              // groups split from this one, this one's siblings
    int *a2a;                                 // (4, world) mxi_comm_alltoallv's counts and displacements
};

/* A failed MPI call as a diag: "MPI_X failed: reason" (the CLI names the rank when there are several). */
static int mpi_fail(const char *call, int err, mx_diag *diag) {
    char reason[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    if (MPI_Error_string(err, reason, &len) != MPI_SUCCESS) snprintf(reason, sizeof reason, "MPI error %d", err);
    int name = (int)strcspn(call, "(");   // "MPI_Iallgather(send, ...)": the function's name
    return mxi_diag(diag, MX_ECOMM, "%.*s failed: %s", name, call, reason);
}
#define CHECK_MPI(call, diag)                                      \
    do {                                                           \
        int err_ = (call);                                         \
        if (err_ != MPI_SUCCESS) return mpi_fail(#call, err_, diag); \
    } while (0)

/* Sum of bf16 vectors, each addition in fp32 rounded back to bf16. */
static void bf16_sum_fn(void *in, void *inout, int *len, MPI_Datatype *type) {
    (void)type;
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++) b[i] = mx_st_f32_to_bf16(mx_st_bf16_to_f32(a[i]) + mx_st_bf16_to_f32(b[i]));
}

/* Launchers announce themselves in the environment: Open MPI's mpirun (OMPI_*), PMIx
 * (Open MPI, Slurm's srun --mpi=pmix), PMI-1 and -2 (MPICH's Hydra mpiexec: PMI_RANK,
 * PMI_SIZE, PMI_FD; srun --mpi=pmi2: PMI_FD; a PMI server by address: PMI_PORT) and Hydra's
 * own MPI_LOCALNRANKS. */
static bool launched_by_mpi(void) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "PMI_FD",
                                       "PMI_PORT", "MPI_LOCALNRANKS"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        if (getenv(vars[i])) return true;
    return false;
}

static mxi_comm the_comm;
static bool the_comm_ready;
static double watchdog_s = MXI_COMM_DEFAULT_TIMEOUT_S;   // every wait's limit (parallel.timeout_s)

void mxi_comm_set_timeout(double seconds) {
    if (seconds > 0) watchdog_s = seconds;
}
double mxi_comm_timeout(void) { return watchdog_s; }

int mxi_comm_init(mxi_comm **out, mx_diag *diag) {
    *out = &the_comm;
    if (the_comm_ready) return MX_OK;
    mxi_comm *c = &the_comm;
    memset(c, 0, sizeof *c);
    c->world = 1;
    if (launched_by_mpi()) {
        int provided = 0;
        CHECK_MPI(MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided), diag);
        c->mpi = true;
        c->world_comm = MPI_COMM_WORLD;
        // errors come back to us as codes: the caller says which rank failed and why, then aborts
        CHECK_MPI(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), diag);
        CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &c->rank), diag);
        CHECK_MPI(MPI_Comm_size(MPI_COMM_WORLD, &c->world), diag);
        CHECK_MPI(MPI_Op_create(bf16_sum_fn, 1, &c->bf16_sum), diag);
    }
    the_comm_ready = true;
    return MX_OK;
}

static int poll_wait(mxi_comm *c, MPI_Request *r, const char *call, const char *what, mx_diag *diag);

/* MPI_Finalize's own watchdog: a thread that ends the process with the job's exit code if
 * MPI_Finalize has not returned after `limit` seconds. It only runs once every rank has
 * finished its work (the barrier before it), so nothing is lost but MPI's teardown, which
 * can hang: Debian 12's MPICH over UCX's TCP transport often never returns from it (one
 * rank waits in its disconnect for a peer already waiting in the final PMI barrier). */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    double limit;
    int rank, exit_code;
} finalize_guard;

static void *guard_finalize(void *arg) {
    finalize_guard *g = arg;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    double end = until.tv_sec + until.tv_nsec * 1e-9 + g->limit;
    until.tv_sec = (time_t)end, until.tv_nsec = (long)((end - (double)(time_t)end) * 1e9);
    pthread_mutex_lock(&g->mu);
    while (!g->done)
        if (pthread_cond_timedwait(&g->cv, &g->mu, &until) != 0) break;
    bool done = g->done;
    pthread_mutex_unlock(&g->mu);
    if (!done) {
        fprintf(stderr, "mxtrain: rank %d: MPI_Finalize did not return within %g s of every rank finishing: "
                "leaving without it\n", g->rank, g->limit);
        _exit(g->exit_code);
    }
    return NULL;
}

int mxi_comm_finalize(mxi_comm *c, int exit_code, mx_diag *diag) {
    if (!c || !the_comm_ready) return MX_OK;
    if (c->mpi) {
        // every rank arrives before any leaves, under the watchdog
        MPI_Request r;
        CHECK_MPI(MPI_Ibarrier(c->world_comm, &r), diag);
        int rc = poll_wait(c, &r, "MPI_Ibarrier", "the end of the job", diag);
        if (rc) return rc;
        fflush(NULL);   // what this process printed is out before its teardown
        finalize_guard g = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER, .done = false,
                            .limit = watchdog_s < MXI_COMM_FINALIZE_LIMIT_S ? watchdog_s : MXI_COMM_FINALIZE_LIMIT_S,
                            .rank = c->rank, .exit_code = exit_code};
        pthread_t guard;
        bool guarded = pthread_create(&guard, NULL, guard_finalize, &g) == 0;
        MPI_Op_free(&c->bf16_sum);
        MPI_Finalize();
        if (guarded) {
            pthread_mutex_lock(&g.mu);
            g.done = true;
            pthread_cond_signal(&g.cv);
            pthread_mutex_unlock(&g.mu);
            pthread_join(guard, NULL);
        }
    }
    the_comm_ready = false;
    return MX_OK;
}

void mxi_comm_abort(mxi_comm *c, int code) {
    fflush(stdout), fflush(stderr);
    if (c && c->mpi) {
        // a moment for the launcher to forward what this rank printed (its message) before
        // the abort tears the job down: Hydra otherwise loses it now and then
        struct timespec ts = {.tv_sec = 0, .tv_nsec = 200000000};
        nanosleep(&ts, NULL);
        MPI_Abort(MPI_COMM_WORLD, code);
    }
    exit(code);
}

int mxi_comm_rank(const mxi_comm *c) { return c->rank; }
int mxi_comm_world(const mxi_comm *c) { return c->world; }

double mxi_comm_take_seconds(mxi_comm *c) {
    double s = c->wait_seconds;
    c->wait_seconds = 0;
    for (mxi_comm *g = c->groups; g; g = g->next_group) s += mxi_comm_take_seconds(g);   // HSDP's groups
    return s;
}

/* MPI counts are ints: larger messages are refused rather than truncated. */
static int count_of(size_t n, const char *call, mx_diag *diag) {
    if (n > INT_MAX)
        return mxi_diag(diag, MX_ECOMM, "%s of %zu elements exceeds MPI's int count (at most %d)", call, n, INT_MAX);
    return MX_OK;
}

/* Open MPI's MPI_Request is a pointer, MPICH's an int: either fits. */
_Static_assert(sizeof(MPI_Request) <= sizeof(((mxi_request *)0)->mpi), "MPI_Request does not fit mxi_request");
static MPI_Request *request_of(mxi_request *req) { return (MPI_Request *)(void *)req->mpi; }

void mxi_comm_label(mxi_request *req, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(req->what, sizeof req->what, fmt, ap);
    va_end(ap);
}

/* The watchdog: wait for r by polling it (MPI_Test), never blocking inside MPI. For the
 * first millisecond the tests run back to back, yielding the core to any other runnable
 * process in between (most waits end there, and late); then with sleeps that double from
 * 20 us to 1 ms in between, so that a rank waiting for a slow or lost peer leaves its core
 * to others, and a wait overshoots its completion by at most about a fifth. After
 * watchdog_s without completion: MX_ETIMEOUT, r still in flight. */
static int poll_wait(mxi_comm *c, MPI_Request *r, const char *call, const char *what, mx_diag *diag) {
    double t0 = mxi_now_seconds(), now = t0;
    long sleep_ns = 0;
    for (;;) {
        int done = 0;
        int err = MPI_Test(r, &done, MPI_STATUS_IGNORE);
        if (err != MPI_SUCCESS) {
            c->wait_seconds += mxi_now_seconds() - t0;
            return mpi_fail(call, err, diag);
        }
        if (done) break;
        now = mxi_now_seconds();
        if (now - t0 >= watchdog_s) {
            c->wait_seconds += now - t0;
            bool said = what && *what;
            return mxi_diag(diag, MX_ETIMEOUT, "no progress for %g s in %s%s%s%s: a peer rank may have died, "
                            "stopped, or lost its network (the limit is parallel.timeout_s)", watchdog_s, call,
                            said ? " (" : "", said ? what : "", said ? ")" : "");
        }
        if (now - t0 < 1e-3) {
            sched_yield();
            continue;
        }
        sleep_ns = sleep_ns == 0 ? 20000 : sleep_ns * 2 > 1000000 ? 1000000 : sleep_ns * 2;
        struct timespec ts = {.tv_sec = 0, .tv_nsec = sleep_ns};
        nanosleep(&ts, NULL);
    }
    c->wait_seconds += mxi_now_seconds() - t0;
    return MX_OK;
}

int mxi_comm_iallgather(mxi_comm *c, const void *send, void *recv, size_t bytes, mxi_request *req, mx_diag *diag) {
    req->active = false;
    if (!c->mpi) {   // one rank
        if (send) memcpy(recv, send, bytes);
        return MX_OK;
    }
    int rc = count_of(bytes, "MPI_Iallgather", diag);
    if (rc) return rc;
    MPI_Request *r = request_of(req);
    double t0 = mxi_now_seconds();
    if (send)
        CHECK_MPI(MPI_Iallgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, c->world_comm, r), diag);
    else
        CHECK_MPI(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, (int)bytes, MPI_BYTE, c->world_comm, r), diag);
    c->wait_seconds += mxi_now_seconds() - t0;
    req->active = true, req->call = "MPI_Iallgather", req->what[0] = 0;
    return MX_OK;
}

int mxi_comm_ireduce_scatter(mxi_comm *c, const void *send, void *recv, size_t count, mxi_wire_dtype dtype,
                             mxi_request *req, mx_diag *diag) {
    req->active = false;
    size_t elem = dtype == MXI_WIRE_BF16 ? 2 : dtype == MXI_WIRE_F64 ? 8 : 4;
    if (!c->mpi) {   // one rank
        if (recv != send) memcpy(recv, send, count * elem);
        return MX_OK;
    }
    int rc = count_of(count, "MPI_Ireduce_scatter_block", diag);
    if (rc) return rc;
    MPI_Request *r = request_of(req);
    double t0 = mxi_now_seconds();
    if (recv == send) send = MPI_IN_PLACE;
    if (dtype == MXI_WIRE_BF16)
        CHECK_MPI(MPI_Ireduce_scatter_block(send, recv, (int)count, MPI_UINT16_T, c->bf16_sum, c->world_comm, r), diag);
    else if (dtype == MXI_WIRE_F64)
        CHECK_MPI(MPI_Ireduce_scatter_block(send, recv, (int)count, MPI_DOUBLE, MPI_SUM, c->world_comm, r), diag);
    else
        CHECK_MPI(MPI_Ireduce_scatter_block(send, recv, (int)count, MPI_FLOAT, MPI_SUM, c->world_comm, r), diag);
    c->wait_seconds += mxi_now_seconds() - t0;
    req->active = true, req->call = "MPI_Ireduce_scatter_block", req->what[0] = 0;
    return MX_OK;
}

int mxi_comm_reduce_scatter_f32(mxi_comm *c, float *buf, const int *counts, const char *what, mx_diag *diag) {
    if (!c->mpi) return MX_OK;   // one rank: its part is the whole, in place
    MPI_Request r;
    double t0 = mxi_now_seconds();
    CHECK_MPI(MPI_Ireduce_scatter(MPI_IN_PLACE, buf, counts, MPI_FLOAT, MPI_SUM, c->world_comm, &r), diag);
    c->wait_seconds += mxi_now_seconds() - t0;
    return poll_wait(c, &r, "MPI_Ireduce_scatter", what, diag);
}

int mxi_comm_wait(mxi_comm *c, mxi_request *req, mx_diag *diag) {
    if (!req->active) return MX_OK;
    int rc = poll_wait(c, request_of(req), req->call ? req->call : "an MPI collective", req->what, diag);
    if (rc != MX_ETIMEOUT) req->active = false;   // done, or failed: nothing is in flight any more
    return rc;
}

void mxi_comm_poke(mxi_comm *c, mxi_request *req) {
    if (!req->active || !c->mpi) return;
    int done = 0;
    // a failure here shows again, with its reason, at the wait
    MPI_Test(request_of(req), &done, MPI_STATUS_IGNORE);
    if (done) req->active = false;
}

/* The blocking collectives start their nonblocking form and wait for it under the watchdog.
 * A timeout leaves the request in flight: the job is about to end anyway (mxi_comm_abort). */
static int allreduce(mxi_comm *c, double *x, int n, MPI_Op op, const char *what, mx_diag *diag) {
    if (!c->mpi) return MX_OK;
    MPI_Request r;
    double t0 = mxi_now_seconds();
    CHECK_MPI(MPI_Iallreduce(MPI_IN_PLACE, x, n, MPI_DOUBLE, op, c->world_comm, &r), diag);
    c->wait_seconds += mxi_now_seconds() - t0;
    return poll_wait(c, &r, "MPI_Iallreduce", what, diag);
}
int mxi_comm_allreduce_sum(mxi_comm *c, double *x, int n, const char *what, mx_diag *diag) {
    return allreduce(c, x, n, MPI_SUM, what, diag);
}
int mxi_comm_allreduce_max(mxi_comm *c, double *x, int n, const char *what, mx_diag *diag) {
    return allreduce(c, x, n, MPI_MAX, what, diag);
}

int mxi_comm_gather(mxi_comm *c, const void *send, void *recv, size_t bytes, int root, const char *what,
                    mx_diag *diag) {
    if (!c->mpi) {
        memcpy(recv, send, bytes);
        return MX_OK;
    }
    int rc = count_of(bytes, "MPI_Igather", diag);
    if (rc) return rc;
    MPI_Request r;
    double t0 = mxi_now_seconds();
    CHECK_MPI(MPI_Igather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, root, c->world_comm, &r), diag);
    c->wait_seconds += mxi_now_seconds() - t0;
    return poll_wait(c, &r, "MPI_Igather", what, diag);
}

/* ---- process groups (HSDP) ---- */

int mxi_comm_split(mxi_comm *parent, int color, int key, mxi_comm **out, mx_diag *diag) {
    *out = NULL;
    mxi_comm *g = calloc(1, sizeof *g);
    if (!g) return mxi_diag(diag, MX_ENOMEM, "out of memory (%zu bytes for a process group)", sizeof *g);
    g->mpi = parent->mpi, g->bf16_sum = parent->bf16_sum, g->world = 1;
    if (parent->mpi) {
        // MPI_Comm_split blocks inside MPI: a barrier under the watchdog first, so that a rank
        // that never comes is reported, not waited for forever
        MPI_Request r;
        int err = MPI_Ibarrier(parent->world_comm, &r);
        if (err != MPI_SUCCESS) {
            free(g);
            return mpi_fail("MPI_Ibarrier", err, diag);
        }
        int rc = poll_wait(parent, &r, "MPI_Ibarrier", "the start of a process group (MPI_Comm_split)", diag);
        if (rc) {
            free(g);
            return rc;
        }
        err = MPI_Comm_split(parent->world_comm, color, key, &g->world_comm);
        if (err == MPI_SUCCESS) err = MPI_Comm_set_errhandler(g->world_comm, MPI_ERRORS_RETURN);
        if (err == MPI_SUCCESS) err = MPI_Comm_rank(g->world_comm, &g->rank);
        if (err == MPI_SUCCESS) err = MPI_Comm_size(g->world_comm, &g->world);
        if (err != MPI_SUCCESS) {
            free(g);
            return mpi_fail("MPI_Comm_split", err, diag);
        }
    }
    g->parent = parent, g->next_group = parent->groups;
    parent->groups = g;
    *out = g;
    return MX_OK;
}

void mxi_comm_free(mxi_comm *g) {
    if (!g || !g->parent) return;   // the world is left by mxi_comm_finalize
    while (g->groups) mxi_comm_free(g->groups);
    for (mxi_comm **p = &g->parent->groups; *p; p = &(*p)->next_group)
        if (*p == g) {
            *p = g->next_group;
            break;
        }
    g->parent->wait_seconds += g->wait_seconds;   // waits not yet taken still count
    if (g->mpi && the_comm_ready) MPI_Comm_free(&g->world_comm);
    free(g->a2a);
    free(g);
}

int mxi_comm_iallreduce(mxi_comm *c, void *buf, size_t count, mxi_wire_dtype dtype, mxi_request *req,
                        mx_diag *diag) {
    req->active = false;
    if (!c->mpi) return MX_OK;   // a world of one: the sum is the buffer itself
    int rc = count_of(count, "MPI_Iallreduce", diag);
    if (rc) return rc;
    MPI_Request *r = request_of(req);
    double t0 = mxi_now_seconds();
    if (dtype == MXI_WIRE_BF16)
        CHECK_MPI(MPI_Iallreduce(MPI_IN_PLACE, buf, (int)count, MPI_UINT16_T, c->bf16_sum, c->world_comm, r), diag);
    else if (dtype == MXI_WIRE_F64)
        CHECK_MPI(MPI_Iallreduce(MPI_IN_PLACE, buf, (int)count, MPI_DOUBLE, MPI_SUM, c->world_comm, r), diag);
    else
        CHECK_MPI(MPI_Iallreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, c->world_comm, r), diag);
    c->wait_seconds += mxi_now_seconds() - t0;
    req->active = true, req->call = "MPI_Iallreduce", req->what[0] = 0;
    return MX_OK;
}

/* ---- expert parallelism ---- */

int mxi_comm_ialltoallv(mxi_comm *c, const void *send, const int *send_rows, void *recv, const int *recv_rows,
                        size_t row_bytes, mxi_request *req, mx_diag *diag) {
    req->active = false;
    if (!c->mpi) {
        memcpy(recv, send, (size_t)send_rows[0] * row_bytes);
        return MX_OK;
    }
    int rc = count_of(row_bytes, "MPI_Alltoallv", diag);
    if (rc) return rc;
    // counts and displacements, in rows; the arrays are made once per group (its first call)
    if (!c->a2a) {
        c->a2a = calloc((size_t)4 * c->world, sizeof(int));
        if (!c->a2a)
            return mxi_diag(diag, MX_ENOMEM, "out of memory (%zu bytes of all-to-all counts)",
                            (size_t)4 * c->world * sizeof(int));
    }
    int *sc = c->a2a, *sd = sc + c->world, *rcnt = sd + c->world, *rd = rcnt + c->world;
    long long so = 0, ro = 0;
    for (int r = 0; r < c->world; r++) {
        sc[r] = send_rows[r], rcnt[r] = recv_rows[r], sd[r] = (int)so, rd[r] = (int)ro;
        so += send_rows[r], ro += recv_rows[r];
        if (so > INT_MAX || ro > INT_MAX) return count_of((size_t)(so > ro ? so : ro), "MPI_Alltoallv", diag);
    }
    MPI_Datatype row;
    CHECK_MPI(MPI_Type_contiguous((int)row_bytes, MPI_BYTE, &row), diag);
    CHECK_MPI(MPI_Type_commit(&row), diag);
    double t0 = mxi_now_seconds();
    int err = MPI_Ialltoallv(send, sc, sd, row, recv, rcnt, rd, row, c->world_comm, request_of(req));
    c->wait_seconds += mxi_now_seconds() - t0;
    MPI_Type_free(&row);   // MPI frees it when the exchange in flight ends
    if (err != MPI_SUCCESS) return mpi_fail("MPI_Ialltoallv", err, diag);
    req->active = true, req->call = "MPI_Ialltoallv", req->what[0] = 0;
    return MX_OK;
}

int mxi_comm_alltoallv(mxi_comm *c, const void *send, const int *send_rows, void *recv, const int *recv_rows,
                       size_t row_bytes, const char *what, mx_diag *diag) {
    mxi_request req;
    int rc = mxi_comm_ialltoallv(c, send, send_rows, recv, recv_rows, row_bytes, &req, diag);
    if (rc || !req.active) return rc;
    mxi_comm_label(&req, "%s", what);
    return mxi_comm_wait(c, &req, diag);
}
