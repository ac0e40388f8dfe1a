/* Internal: attention for decoding with a KV cache. Each query row belongs to one sequence
 * of the cache and sits at one position of it; it attends to that sequence's cached
 * positions 0..pos (causal: its own key included, written into the cache beforehand).
 * Shape letters as in ops/attention.h (NH query heads, NKV kv heads, query head h reading kv
 * head h / (NH / NKV), HD head dim), plus S sequences and TC positions the cache holds:
 * the cache is (S, TC, NKV, HD). The per-head work is the nn kernel `attend` (reference in
 * ops/ref/nn_ref.c). */
#ifndef MXI_DECODE_ATTENTION_H
#define MXI_DECODE_ATTENTION_H

#include <stdint.h>

/* Floats of scratch mxi_decode_attention needs for a cache of TC positions: one row of
 * probabilities per OpenMP thread. */
int64_t mxi_decode_attention_scratch(int TC);

typedef struct {
    const int32_t *seq;   // (rows) the cache sequence of each query row
    const int32_t *pos;   // (rows) its position there (0 .. TC-1)
    int rows, NH, NKV, HD, TC;
} mxi_decode_shape;

/* out[r, h] = softmax(q[r, h] k^T / sqrt(HD)) v over the keys and values of positions
 * 0..pos[r] of sequence seq[r]; rows and heads in parallel. */
void mxi_decode_attention(float *out /* (rows, NH, HD) */, float *scratch /* (mxi_decode_attention_scratch) */,
                          const float *q /* (rows, NH, HD) */, const float *kc /* (S, TC, NKV, HD) */,
                          const float *vc /* (S, TC, NKV, HD) */, mxi_decode_shape shape);

#endif
