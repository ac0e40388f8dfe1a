/* Internal: the text samples a training run prints (training.sample_interval, and one after
 * the last step): rank 0 gathers the fp32 master weights into a model of its own and decodes
 * from it over a KV cache (model/generate.h), with a random stream of its own, so the run's
 * random numbers, data order and weights are untouched. */
#ifndef MXI_SAMPLE_H
#define MXI_SAMPLE_H

#include <stdint.h>

#include "distributed/comm.h"
#include "distributed/fsdp.h"
#include "mxtrain/config.h"

typedef struct mxi_sampler mxi_sampler;

/* Whether the config's model samples at all: training.sample_tokens > 0 and a vocabulary
 * with text (byte-level). */
bool mxi_sample_enabled(const mx_config *config);

/* At the start of a run: a sample_prompt the model cannot take (more positions than
 * max_position_embeddings) is MX_ECONFIG naming it. */
int mxi_sample_check(const mx_config *config, mx_diag *diag);

/* A sample of the model now (collective over comm; rank 0 makes *sampler the first time):
 * *text on rank 0, the prompt's continuation (*len bytes, which may hold NULs; valid until
 * the next call or mxi_sampler_free), NULL elsewhere. The stream is seeded by training.seed
 * and step. */
int mxi_sample(mxi_sampler **sampler, const mx_config *config, mx_model *model, mxi_fsdp *fsdp, mxi_comm *comm,
               int64_t step, const char **text, size_t *len, mx_diag *diag);
void mxi_sampler_free(mxi_sampler *sampler);

#endif
