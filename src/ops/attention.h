/* Internal: causal grouped-query attention, softmax(q k^T / sqrt(HD)) v, on oneDNN batched
 * matmuls. Shape letters: B batch, T positions, NH query heads, NKV kv heads (query head h
 * reads kv head h / (NH / NKV)), HD head dim. Tensors are token-major as the linear layers
 * write them: q (B, T, NH, HD), k and v (B, T, NKV, HD).
 *
 * The positions are cut into blocks of MXI_ATT_BLOCK query rows; the rows of block i see
 * keys 0 .. end of block i only, so no product is computed above the diagonal blocks.
 * Per block: scores = one batched matmul over (B, kv heads, heads of the group), the causal
 * softmax (nn kernels), then probabilities x V. Backward per block: the scores again (the
 * same call, so the same bits) and the probabilities replayed from each row's (max, 1/sum)
 * that the forward kept (softmax_causal_replay: the forward's own operations, so the same
 * bits as the forward's P), dP = dO V^T, the softmax backward, dQ = dS K, and dK += dS^T Q,
 * dV += P^T dO per head of the group. Nothing of size T x T is kept: what stays between
 * the passes is 2 floats per query row and head, and the scratch holds one block of rows,
 * so memory grows linearly in T.
 * Products accumulate in fp32. With bf16 (the model's bf16 compute precision) every operand
 * of the six products (q, k, v, P, dO, dS) is rounded to bf16 first, as the linear layers
 * round theirs, and the products run oneDNN's bf16 matmul where the CPU has one, else its
 * fp32 matmul on the bf16 values (the same arithmetic, so the numbers do not depend on the
 * CPU); the softmax and its backward stay fp32 on fp32 scores and probabilities. The
 * scalar reference is ops/ref/attention_ref.c.
 *
 * Document masking (Megatron's reset_attention_mask): doc, when not NULL, holds for each
 * (b, t) the position of the first token of t's document, doc[b][t] <= t and non-decreasing
 * in t; row t then sees keys doc[b][t] .. t only. Each sequence then runs on its own, and a
 * block of rows computes keys from its first row's document start only: the key blocks of
 * earlier documents are skipped, so the cost falls with short documents. NULL: plain causal. */
#ifndef MXI_ATTENTION_H
#define MXI_ATTENTION_H

#include <stdbool.h>
#include <stdint.h>

#include "mxtrain/error.h"
#include "ops/gemm.h"

enum { MXI_ATT_BLOCK = 64 };

/* stats keeps, per query row and head, what backward needs to recompute the row's
 * probabilities: the largest scaled score and 1 / the sum of the exps. */
int mxi_attention_forward(mxi_gemm_ctx *g, float *out /* (B, T, NH, HD) */, float *stats /* (B, NH, T, 2) */,
                          float *scratch /* (mxi_attention_scratch) */, const float *q /* (B, T, NH, HD) */,
                          const float *k /* (B, T, NKV, HD) */, const float *v /* (B, T, NKV, HD) */,
                          const int32_t *doc /* (B, T) or NULL */, int B, int T, int NH, int NKV, int HD, bool bf16,
                          mx_diag *diag);

/* Floats of scratch the forward and the backward need (they may share it: neither keeps
 * anything there for the other): about 2 B NH MXI_ATT_BLOCK T, and at bf16 the rounded
 * operands besides. */
int64_t mxi_attention_scratch(int B, int T, int NH, int NKV, int HD, bool bf16);

/* dq, dk, dv are overwritten; q, k, v and stats as the forward had them. */
int mxi_attention_backward(mxi_gemm_ctx *g, float *dq /* (B, T, NH, HD) */, float *dk /* (B, T, NKV, HD) */,
                           float *dv /* (B, T, NKV, HD) */, float *scratch /* (mxi_attention_scratch) */,
                           const float *dout /* (B, T, NH, HD) */, const float *stats /* (B, NH, T, 2) */,
                           const float *q, const float *k, const float *v, const int32_t *doc /* as the forward's */,
                           int B, int T, int NH, int NKV, int HD, bool bf16, mx_diag *diag);

/* For tests: at bf16, keep the rounded operands as bf16 (1) or as fp32 values (0) whatever
 * the CPU, or choose by mxi_gemm_bf16_batched_native as the model does (-1, the default). bf16
 * operands on a CPU without a bf16 matmul are widened by mxi_matmul_batched: slow, but it
 * runs the bf16 layout's code where oneDNN cannot. Not thread-safe. */
void mxi_attention_bf16_storage(int as_bf16);

/* The scalar reference: the same results from plain loops (summation order differs), which
 * keeps the whole probabilities att (B, NH, T, T) for its backward; with bf16, the operands
 * of every product rounded to bf16 as above. */
void mxi_attention_forward_ref(float *out, float *att, const float *q, const float *k, const float *v,
                               const int32_t *doc, int B, int T, int NH, int NKV, int HD, bool bf16);
void mxi_attention_backward_ref(float *dq, float *dk, float *dv, const float *dout, const float *att, const float *q,
                                const float *k, const float *v, const int32_t *doc, int B, int T, int NH, int NKV, int HD,
                                bool bf16);

#endif
