/* Expert parallelism's exchanges (see ep.h): the model's hooks, each one collective over the
 * link's EP group. */
#include "distributed/ep.h"

static int ep_alltoallv(void *ctx, const void *send, const int *send_rows, void *recv, const int *recv_rows,
                        size_t row_bytes, const char *what, mx_diag *diag) {
    return mxi_comm_alltoallv(((mxi_ep_link *)ctx)->group, send, send_rows, recv, recv_rows, row_bytes, what, diag);
}

static int ep_sum(void *ctx, double *x, int n, const char *what, mx_diag *diag) {
    return mxi_comm_allreduce_sum(((mxi_ep_link *)ctx)->group, x, n, what, diag);
}

static int ep_start(void *ctx, const void *send, const int *send_rows, void *recv, const int *recv_rows,
                    size_t row_bytes, const char *what, mx_diag *diag) {
    mxi_ep_link *k = ctx;
    int rc = mxi_comm_ialltoallv(k->group, send, send_rows, recv, recv_rows, row_bytes, &k->pending, diag);
    if (!rc) mxi_comm_label(&k->pending, "%s", what);
    return rc;
}

static void ep_poke(void *ctx) {
    mxi_ep_link *k = ctx;
    mxi_comm_poke(k->group, &k->pending);
}

static int ep_wait(void *ctx, mx_diag *diag) {
    mxi_ep_link *k = ctx;
    return mxi_comm_wait(k->group, &k->pending, diag);
}

mxi_model_ep mxi_ep_hooks(mxi_ep_link *link) {
    return (mxi_model_ep){.ctx = link, .rank = mxi_comm_rank(link->group), .size = mxi_comm_world(link->group),
                          .alltoallv = ep_alltoallv, .sum = ep_sum, .start = ep_start, .poke = ep_poke,
                          .wait = ep_wait};
}

int mxi_ep_link_open(mxi_ep_link *link, mxi_comm *world, int ep, mx_model *model, mx_diag *diag) {
    int rank = mxi_comm_rank(world);
    int rc = mxi_comm_split(world, rank / ep, rank, &link->group, diag);
    if (rc) return rc;
    mxi_model_ep hooks = mxi_ep_hooks(link);
    mxi_model_set_ep(model, &hooks);
    return MX_OK;
}

void mxi_ep_link_close(mxi_ep_link *link) {
    mxi_comm_free(link->group);
    link->group = NULL;
}
