/* Internal: the model run for generation. Sequences decode together over a KV cache: a
 * forward takes token rows, each of one sequence at one position, writes their keys and
 * values into the cache at those positions and attends over the sequence's positions 0..pos
 * (a prompt's tokens go in as many rows at once, each new token as one row). The model's
 * weights, config, MX specs and linear context are an mx_model's (created for one token:
 * its training activations are not used); everything a forward needs is allocated at create
 * time, so that decoding allocates nothing per token (but the GEMM primitives oneDNN makes
 * for a row count the first time it sees it, and the MoE experts' run-time-sized products).
 * Shape letters: include/mxtrain/model.h, plus S sequences, TC positions the cache holds,
 * R token rows of a forward (at most max_rows), QD = NH*HD, KVD = NKV*HD. */
#ifndef MXI_INFER_H
#define MXI_INFER_H

#include <stdbool.h>
#include <stdint.h>

#include "mxtrain/error.h"
#include "mxtrain/model.h"
#include "mxtrain/plan.h"

typedef struct mxi_infer mxi_infer;

typedef struct {
    int batch;              // S: sequences decoded together
    int max_seq;            // TC: positions the cache holds per sequence, <= max_position_embeddings
    int max_rows;           // most token rows one forward takes (>= batch): prompts go in chunks of this
    bool bf16;              // GEMM operands (and q, k, v) rounded to bf16, fp32 accumulation; else fp32
    const mx_plan *plan;    // the modules it converts run their GEMMs on MX operands, as in training's
                            // forward; NULL or disabled: none
} mxi_infer_options;

int mxi_infer_create(const mx_model_config *config, const mxi_infer_options *options, mxi_infer **out, mx_diag *diag);
void mxi_infer_free(mxi_infer *inf);

/* The model whose weights the forward reads: mx_model_load into it, or write its tensors. */
mx_model *mxi_infer_model(mxi_infer *inf);

/* One forward over rows token rows: row r is token tokens[r] of sequence seq[r] at position
 * pos[r] (a sequence's rows in ascending positions; positions before them already in the
 * cache). *logits receives the logits of the n_out rows out[0..n_out) (n_out <= batch),
 * (n_out, V), valid until the next call. 0, or the first failure of a product (diag). */
int mxi_infer_forward(mxi_infer *inf, const int32_t *tokens /* (R) */, const int32_t *seq /* (R) */,
                      const int32_t *pos /* (R) */, int rows, const int32_t *out /* (n_out) */, int n_out,
                      const float **logits, mx_diag *diag);

/* The sequences, positions per sequence and rows per forward inf was made for. */
void mxi_infer_limits(const mxi_infer *inf, int *batch, int *max_seq, int *max_rows);

/* Bytes the cache and the forward's buffers take (not the weights). */
size_t mxi_infer_bytes(const mxi_infer *inf);

#endif
