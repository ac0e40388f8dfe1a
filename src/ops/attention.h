/* Internal: causal grouped-query attention, softmax(q k^T / sqrt(HD)) v, fused in the
 * manner of flash attention 2. Shape letters: B batch, T positions, NH query heads, NKV kv
 * heads (query head h reads kv head h / (NH / NKV)), HD head dim. Tensors are token-major as
 * the linear layers write them: q (B, T, NH, HD), k and v (B, T, NKV, HD).
 *
 * Forward: per sequence, head and block of MXI_ATT_BLOCK query rows (one OpenMP task each),
 * a loop over tiles of MXI_ATT_BLOCK keys up to the block's diagonal: S = Q K^T of the tile,
 * the online softmax (each row's running max and sum of exps, the output rescaled when the
 * max grows), O += P V. What stays for backward is 2 floats per query row and head, the
 * row's largest scaled score (in log2 units, ops/nn_kernels.h) and 1 / its sum of exps.
 * Backward: first D = rowsum(dO * O) of every row from the forward's output (the softmax
 * backward's sum_j P dP, as flash attention takes it); then per sequence and kv head (one
 * task each, so every sum keeps its order whatever the number of threads), per head of its
 * group, per key tile, over the query blocks that see the tile: S and dP = dO V^T again, P
 * from the stats, dS = P (dP - D) / sqrt(HD), dV += P^T dO and dK += dS^T Q into the
 * tile's rows (in cache across the blocks), dQ += dS K into the block's: 7 tile products a
 * tile in all, forward's 2 with backward's 5.
 * A tile that not every row sees whole (the diagonal one, one holding a document start)
 * runs its products per sub-tile of 16 rows or keys over the span they see: the part above
 * the diagonal or before a document is skipped (terms with P or dS 0, so the sums are the
 * same but for a zero's sign). Nothing of size T x T exists: the scores of a tile live in a
 * thread's tiles of the scratch, beside one head's dQ and one kv head's dK and dV (T x HD
 * floats each), so memory grows linearly in T.
 * The products are the nn kernels' att_gemm, the softmax pieces att_online_softmax and
 * att_probs (ops/nn_kernels.h): the kernel table in use decides the arithmetic, and every
 * table accumulates in fp32. With bf16 (the model's bf16 compute precision) every operand of
 * the products (q, k, v, dO, P, dS) is rounded to bf16 first, as the linear layers round
 * theirs, and kept as fp32 values: the same numbers on every CPU. The forward rounds each
 * tile's P before its rescaling by the final 1 / sum (flash attention's order), the
 * backward the final P; D's factors dO and O are rounded too. The scalar reference of the
 * formulas is ops/ref/attention_ref.c.
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
 * probabilities: the largest scaled score times log2 e (the exps are powers of two,
 * mxi_att_exp2_scale) and 1 / the sum of the exps. */
int mxi_attention_forward(mxi_gemm_ctx *g, float *out /* (B, T, NH, HD) */, float *stats /* (B, NH, T, 2) */,
                          float *scratch /* (mxi_attention_scratch) */, const float *q /* (B, T, NH, HD) */,
                          const float *k /* (B, T, NKV, HD) */, const float *v /* (B, T, NKV, HD) */,
                          const int32_t *doc /* (B, T) or NULL */, int B, int T, int NH, int NKV, int HD, bool bf16,
                          mx_diag *diag);

/* Floats of scratch the forward and the backward need (they may share it: neither keeps
 * anything there for the other): q, k, v and dO head-major, k and v transposed per key tile,
 * at bf16 rounded and paired, D of every row, and per thread of omp_get_max_threads() (the
 * calls must not run more) its tiles and one head's dQ, dK and dV. */
int64_t mxi_attention_scratch(int B, int T, int NH, int NKV, int HD, bool bf16);

/* The forward's output as backward reads it, (B, T, NH, HD): fp32, or rounded to bf16 (as
 * a bf16 model keeps its o projection's input); one of the two. */
typedef struct {
    const float *f32;
    const uint16_t *bf16;
} mxi_att_output;

/* dq, dk, dv are overwritten; q, k, v and stats as the forward had them, out its output. */
int mxi_attention_backward(mxi_gemm_ctx *g, float *dq /* (B, T, NH, HD) */, float *dk /* (B, T, NKV, HD) */,
                           float *dv /* (B, T, NKV, HD) */, float *scratch /* (mxi_attention_scratch) */,
                           const float *dout /* (B, T, NH, HD) */, mxi_att_output out,
                           const float *stats /* (B, NH, T, 2) */,
                           const float *q, const float *k, const float *v, const int32_t *doc /* as the forward's */,
                           int B, int T, int NH, int NKV, int HD, bool bf16, mx_diag *diag);

/* The scalar reference: the same results from plain loops (summation order and, at bf16,
 * the forward's rounding point of P differ), which keeps the whole probabilities att (B, NH,
 * T, T) for its backward, and takes D from out as the fused backward does; with bf16, the
 * operands of every product rounded to bf16 as above. */
void mxi_attention_forward_ref(float *out, float *att, const float *q, const float *k, const float *v,
                               const int32_t *doc, int B, int T, int NH, int NKV, int HD, bool bf16);
void mxi_attention_backward_ref(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *att,
                                const float *q, const float *k, const float *v, const int32_t *doc, int B, int T, int NH,
                                int NKV, int HD, bool bf16);

#endif
