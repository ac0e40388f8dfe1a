/* Internal: text generation's loop on top of model/infer.h: prompts (token ids) in, new
 * tokens out one at a time through a callback, greedy or sampled (temperature, top-k,
 * top-p), each sequence until its end-of-text token, its token budget or the end of the
 * cache. Shape letters: infer.h. */
#ifndef MXI_GENERATE_H
#define MXI_GENERATE_H

#include <stdint.h>

#include "model/infer.h"

typedef struct {
    int max_new_tokens;  // per sequence
    float temperature;   // 0: greedy (the most probable token, the first of equals)
    int top_k;           // sample among the k most probable only; 0: all
    float top_p;         // then among the fewest most probable whose probabilities reach p; 1: all
    uint64_t seed;       // sequence s samples from its own stream, seeded by (seed, s)
    int eos;             // the token that ends a sequence (not handed out), or -1
} mxi_gen_options;

typedef struct {
    int64_t prompt_tokens, new_tokens;   // all sequences'
    int64_t decode_tokens;               // new tokens of the forwards that read no prompt token
    double prefill_seconds;              // forwards that read prompt tokens (and sample the first new ones)
    double decode_seconds;               // the others, sampling included
} mxi_gen_stats;

/* Called with each new token of sequence seq as it comes; a nonzero return stops the
 * generation, which returns it. */
typedef int (*mxi_gen_emit)(void *ctx, int seq, int32_t token);

/* Generate after the n prompts (prompts[s] of lens[s] >= 1 tokens; n <= the batch of inf,
 * lens[s] <= its positions) together: every forward takes each unfinished sequence's next
 * rows (up to max_rows / n prompt tokens, or its last new token). Its buffers are allocated
 * before the first forward, none per token. */
int mxi_generate(mxi_infer *inf, const int32_t *const *prompts, const int *lens, int n, const mxi_gen_options *o,
                 mxi_gen_emit emit, void *ctx, mxi_gen_stats *stats, mx_diag *diag);

/* The token sampled from logits z (V) as o says, with the stream *rng; pairs: scratch of V
 * (value, index) pairs. Exposed for tests. */
typedef struct {
    float z;
    int32_t i;
} mxi_gen_pair;
int32_t mxi_gen_sample(const float *z /* (V) */, int V, const mxi_gen_options *o, uint64_t *rng,
                       mxi_gen_pair *pairs /* (V) */);

#endif
