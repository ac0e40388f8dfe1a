/* Attention of decoding rows over a KV cache (see decode_attention.h). */
#include "ops/decode_attention.h"

#include <math.h>
#include <omp.h>

#include "ops/nn_kernels.h"

int64_t mxi_decode_attention_scratch(int TC) { return (int64_t)omp_get_max_threads() * TC; }

void mxi_decode_attention(float *out, float *scratch, const float *q, const float *kc, const float *vc,
                          mxi_decode_shape s) {
    const mxi_nn_kernels *k = mxi_nn_kernels_active();
    int64_t ld = (int64_t)s.NKV * s.HD, work = (int64_t)s.rows * s.NH;
    int group = s.NH / s.NKV;
    float scale = 1.0f / sqrtf((float)s.HD);
    // a thread's share is worth a parallel region only past a few hundred positions' dot products
    int64_t flops = 0;
    for (int r = 0; r < s.rows; r++) flops += (int64_t)(s.pos[r] + 1) * s.NH * s.HD;
    #pragma omp parallel for schedule(dynamic, 1) if (flops > (1 << 15))
    for (int64_t i = 0; i < work; i++) {
        int r = (int)(i / s.NH), h = (int)(i % s.NH);
        int64_t base = (int64_t)s.seq[r] * s.TC * ld + (int64_t)(h / group) * s.HD;
        float *p = scratch + (int64_t)omp_get_thread_num() * s.TC;
        k->attend(out + i * s.HD, p, q + i * s.HD, kc + base, vc + base, s.pos[r] + 1, ld, s.HD, scale);
    }
}
