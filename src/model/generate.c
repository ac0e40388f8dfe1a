/* Text generation's loop and sampling (see generate.h). */
#include "model/generate.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "core/diag.h"
#include "core/rng.h"
#include "model/model_internal.h"

static int by_value_desc(const void *a, const void *b) {
    const mxi_gen_pair *x = a, *y = b;
    if (x->z != y->z) return x->z > y->z ? -1 : 1;
    return x->i < y->i ? -1 : x->i > y->i;   // equals in index order, as a stable sort leaves them
}

int32_t mxi_gen_sample(const float *z, int V, const mxi_gen_options *o, uint64_t *rng, mxi_gen_pair *pairs) {
    if (!(o->temperature > 0)) {
        int32_t best = 0;
        for (int i = 1; i < V; i++)
            if (z[i] > z[best]) best = i;
        return best;
    }
    int n = V;
    if (o->top_k > 0 && o->top_k < V) {
        // the k largest by insertion: past the first k, most values fall below the smallest kept
        n = 0;
        for (int i = 0; i < V; i++) {
            if (n == o->top_k && !(z[i] > pairs[n - 1].z)) continue;
            int at = n < o->top_k ? n++ : n - 1;
            while (at > 0 && z[i] > pairs[at - 1].z) pairs[at] = pairs[at - 1], at--;
            pairs[at] = (mxi_gen_pair){z[i], i};
        }
    } else {
        for (int i = 0; i < V; i++) pairs[i] = (mxi_gen_pair){z[i], i};
        if (o->top_p < 1) qsort(pairs, (size_t)V, sizeof *pairs, by_value_desc);
    }
    float zmax = -INFINITY;
    for (int j = 0; j < n; j++) zmax = fmaxf(zmax, pairs[j].z);
    double total = 0;
    for (int j = 0; j < n; j++) {
        pairs[j].z = (float)exp((double)(pairs[j].z - zmax) / o->temperature);
        total += pairs[j].z;
    }
    if (o->top_p < 1) {   // the sorted prefix whose mass reaches top_p (the top token at least)
        double kept = 0;
        int j = 0;
        while (j < n && (j == 0 || kept < o->top_p * total)) kept += pairs[j++].z;
        n = j, total = kept;
    }
    double u = mxi_rng_uniform(rng) * total, acc = 0;
    for (int j = 0; j < n; j++) {
        acc += pairs[j].z;
        if (u < acc) return pairs[j].i;
    }
    return pairs[n - 1].i;
}

int mxi_generate(mxi_infer *inf, const int32_t *const *prompts, const int *lens, int n, const mxi_gen_options *o,
                 mxi_gen_emit emit, void *ctx, mxi_gen_stats *stats, mx_diag *diag) {
    memset(stats, 0, sizeof *stats);
    mx_model *m = mxi_infer_model(inf);
    int V = m->cfg.vocab_size;
    // the batch, positions and rows inf was made for
    int S = 0, TC = 0, R = 0;
    mxi_infer_limits(inf, &S, &TC, &R);
    if (n < 1 || n > S) return mxi_diag(diag, MX_EINVAL, "%d prompts (allowed: 1 to %d)", n, S);
    for (int s = 0; s < n; s++)
        if (lens[s] < 1 || lens[s] > TC)
            return mxi_diag(diag, MX_EINVAL, "prompt %d has %d tokens (allowed: 1 to %d)", s + 1, lens[s], TC);
    if (o->max_new_tokens < 1) return MX_OK;
    int per = R / n;   // rows of prompt tokens each sequence may give a forward
    int32_t *ints = malloc(((size_t)R * 3 + (size_t)n * 6) * sizeof *ints);
    uint64_t *rng = malloc((size_t)n * sizeof *rng);
    mxi_gen_pair *pairs = malloc((size_t)V * sizeof *pairs);
    if (!ints || !rng || !pairs) {
        free(ints), free(rng), free(pairs);
        return mxi_diag(diag, MX_ENOMEM, "out of memory for generation's buffers (%d sequences, vocabulary %d)", n, V);
    }
    int32_t *tok = ints, *seq = tok + R, *pos = seq + R, *out = pos + R, *out_seq = out + n, *done_at = out_seq + n,
            *last = done_at + n, *made = last + n, *alive = made + n;
    for (int s = 0; s < n; s++) {
        rng[s] = mxi_mix64(o->seed * 0x9E3779B97F4A7C15ull + (uint64_t)s);
        done_at[s] = 0, made[s] = 0, alive[s] = 1, last[s] = -1;
        stats->prompt_tokens += lens[s];
    }
    int rc = MX_OK, active = n;
    while (active > 0 && !rc) {
        int rows = 0, n_out = 0;
        bool prefill = false;
        for (int s = 0; s < n; s++) {
            if (!alive[s]) continue;
            if (done_at[s] < lens[s]) {   // prompt tokens, the last of them asking for the first new token
                int k = lens[s] - done_at[s] < per ? lens[s] - done_at[s] : per;
                for (int j = 0; j < k; j++)
                    tok[rows] = prompts[s][done_at[s] + j], seq[rows] = s, pos[rows] = done_at[s] + j, rows++;
                done_at[s] += k;
                prefill = true;
                if (done_at[s] < lens[s]) continue;
            } else {
                tok[rows] = last[s], seq[rows] = s, pos[rows] = done_at[s]++, rows++;
            }
            out[n_out] = rows - 1, out_seq[n_out++] = s;
        }
        double t0 = mxi_now_seconds();
        const float *logits;
        rc = mxi_infer_forward(inf, tok, seq, pos, rows, out, n_out, &logits, diag);
        for (int j = 0; j < n_out && !rc; j++) {
            int s = out_seq[j];
            int32_t t = mxi_gen_sample(logits + (int64_t)j * V, V, o, &rng[s], pairs);
            if (t == o->eos) {
                alive[s] = 0, active--;
                continue;
            }
            made[s]++, last[s] = t;
            stats->new_tokens++;
            if (!prefill) stats->decode_tokens++;
            rc = emit(ctx, s, t);
            if (made[s] == o->max_new_tokens || done_at[s] >= TC) alive[s] = 0, active--;
        }
        double dt = mxi_now_seconds() - t0;
        if (prefill) stats->prefill_seconds += dt;
        else stats->decode_seconds += dt;
    }
    free(ints), free(rng), free(pairs);
    return rc;
}
