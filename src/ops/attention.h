/* Internal: causal grouped-query attention, softmax(q k^T / sqrt(HD)) v, fused in the
 * manner of flash attention 2. Shape letters: B batch, T positions, NH query heads, NKV kv
 * heads (query head h reads kv head h / (NH / NKV)), HD head dim. Tensors are token-major as
 * the linear layers write them: q (B, T, NH, HD), k and v (B, T, NKV, HD).
 *
 * Forward: per sequence, head and block of MXI_ATT_BLOCK query rows (one OpenMP task each),
 * a loop over tiles of MXI_ATT_BLOCK keys up to the block's diagonal: S = Q K^T of the tile,
 * the online softmax (each row's running max and sum of exps, the output rescaled when the
 * max grows), O += P V. What stays for backward is 2 floats per query row and head, the
 * row's largest scaled score and 1 / its sum of exps. Backward: per sequence and head (one
 * task each, so every sum keeps its order whatever the number of threads), per query block,
 * first over its key tiles P again from the stats, dP = dO V^T and D = rowsum(P * dP), each
 * tile's P and dP kept; then per key tile dS = P (dP - D) / sqrt(HD), dV += P^T dO, dK +=
 * dS^T Q, dQ += dS K: 7 tile products a tile in all. (D is not rowsum(dO * O): the model
 * keeps O only as the o projection's input, at most in bf16.) With NH > NKV each head's dK
 * and dV go to a buffer of their own and are summed over the group in order afterwards.
 * A tile that not every row sees whole (the diagonal one, one holding a document start)
 * runs its products per sub-tile of 16 rows or keys over the span they see: the part above
 * the diagonal or before a document is skipped (terms with P or dS 0, so the sums are the
 * same but for a zero's sign). Nothing of size T x T exists: the scores of a tile live in a
 * thread's tiles of the scratch, and backward keeps one query block's P and dP tiles, 2 x
 * MXI_ATT_BLOCK x T floats a thread, so memory grows linearly in T.
 * The products are the nn kernels' att_gemm, the softmax pieces att_online_softmax and
 * att_probs (ops/nn_kernels.h): the kernel table in use decides the arithmetic, and every
 * table accumulates in fp32. With bf16 (the model's bf16 compute precision) every operand of
 * the products (q, k, v, dO, P, dS) is rounded to bf16 first, as the linear layers round
 * theirs, and kept as fp32 values: the same numbers on every CPU. The forward rounds each
 * tile's P before its rescaling by the final 1 / sum (flash attention's order), the
 * backward the final P. The scalar reference of the formulas is ops/ref/attention_ref.c.
 *
 * Document masking (Megatron's reset_attention_mask): doc, when not NULL, holds for each
 * (b, t) the position of the first token of t's document, doc[b][t] <= t and non-decreasing
 * in t; row t then sees keys doc[b][t] .. t only. A block's key tiles start at its first
 * row's document start, so the tiles of earlier documents are skipped and the cost falls
 * with short documents. NULL: plain causal (one document from 0). */
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
 * anything there for the other): k and v transposed, at bf16 the rounded q, k, v and dO,
 * with NH > NKV two (B, T, NH, HD) buffers of the heads' dK and dV, and the tiles of
 * omp_get_max_threads() threads (the calls must not run more). */
int64_t mxi_attention_scratch(int B, int T, int NH, int NKV, int HD, bool bf16);

/* dq, dk, dv are overwritten; q, k, v and stats as the forward had them. */
int mxi_attention_backward(mxi_gemm_ctx *g, float *dq /* (B, T, NH, HD) */, float *dk /* (B, T, NKV, HD) */,
                           float *dv /* (B, T, NKV, HD) */, float *scratch /* (mxi_attention_scratch) */,
                           const float *dout /* (B, T, NH, HD) */, const float *stats /* (B, NH, T, 2) */,
                           const float *q, const float *k, const float *v, const int32_t *doc /* as the forward's */,
                           int B, int T, int NH, int NKV, int HD, bool bf16, mx_diag *diag);

/* The scalar reference: the same results from plain loops (summation order and, at bf16,
 * the forward's rounding point of P differ), which
 * keeps the whole probabilities att (B, NH, T, T) for its backward; with bf16, the operands
 * of every product rounded to bf16 as above. */
void mxi_attention_forward_ref(float *out, float *att, const float *q, const float *k, const float *v,
                               const int32_t *doc, int B, int T, int NH, int NKV, int HD, bool bf16);
void mxi_attention_backward_ref(float *dq, float *dk, float *dv, const float *dout, const float *att, const float *q,
                                const float *k, const float *v, const int32_t *doc, int B, int T, int NH, int NKV, int HD,
                                bool bf16);

#endif
