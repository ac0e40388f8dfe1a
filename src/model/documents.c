/* Megatron's document masking (get_ltor_masks_and_position_ids): a row of tokens holds
 * documents each ended by the end-of-document token, which belongs to the document it ends;
 * the next starts at the position after it. From the micro-batch's input tokens: each
 * token's document start (the attention's first visible key), its position within its
 * document (RoPE), and whether its loss counts (not where the input token is the EOD). */
#include <string.h>

#include "model/model_internal.h"
#include "ops/nn_kernels.h"

void mxi_documents_make(mx_model *m) {
    const mx_model_documents *d = &m->docs;
    if (!m->doc_start && !m->positions && !m->loss_keep) return;
    int64_t kept = 0;
    for (int b = 0; b < m->B; b++) {
        int32_t start = 0;
        for (int t = 0; t < m->T; t++) {
            int64_t i = (int64_t)b * m->T + t;
            bool eod = m->inputs[i] == d->eod_token;
            if (m->doc_start) m->doc_start[i] = start;
            if (m->positions) m->positions[i] = t - start;
            if (m->loss_keep) kept += (m->loss_keep[i] = !eod);
            if (eod) start = t + 1;
        }
    }
    m->loss_count = kept;
}

double mxi_cross_entropy_kept(float *dlogits, const float *logits, const int32_t *targets, const int32_t *keep, int N,
                              int V, float dscale) {
    const mxi_nn_kernels *k = mxi_nn_kernels_active();
    double total = 0.0;
    #pragma omp parallel for schedule(static) reduction(+ : total)
    for (int n = 0; n < N; n++) {
        float *dz = dlogits ? dlogits + (int64_t)n * V : NULL;
        if (keep[n]) total += k->cross_entropy(dz, logits + (int64_t)n * V, V, targets[n], dscale);
        else if (dz) memset(dz, 0, (size_t)V * sizeof(float));
    }
    return total;
}
