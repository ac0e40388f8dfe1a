/* Internal: expert parallelism's exchanges over MPI (docs/distributed.md#expert-parallelism).
 *
 * The model moves routed token rows to the ranks holding their experts through the hooks of
 * model/units.h (mxi_model_ep); this room gives them an EP group of consecutive ranks of the
 * world, whose exchanges run on that group's communicator. */
#ifndef MXI_EP_H
#define MXI_EP_H

#include "distributed/comm.h"
#include "model/units.h"
#include "mxtrain/model.h"

/* An EP group `group`, with the exchange in flight in pending (the link must outlive the
 * model's use of the hooks made from it). */
typedef struct {
    mxi_comm *group;
    mxi_request pending;
} mxi_ep_link;

/* The model's exchanges (mxi_model_set_ep) over link's group. */
mxi_model_ep mxi_ep_hooks(mxi_ep_link *link);

/* Split the world into EP groups of ep consecutive ranks (collective over world), keep this
 * rank's in link, and install its exchanges in model. */
int mxi_ep_link_open(mxi_ep_link *link, mxi_comm *world, int ep, mx_model *model, mx_diag *diag);
/* Free the group (collective over it, as mxi_comm_free); a link never opened is a no-op. */
void mxi_ep_link_close(mxi_ep_link *link);

#endif
