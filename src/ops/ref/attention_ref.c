/* The scalar reference of causal grouped-query attention: one query row at a time, the
 * formulas of ops/attention.h as plain loops (the code the model ran before the matmul
 * version). With bf16, each factor of a product is rounded to bf16 where it enters the
 * product (r() below). Serial; for tests. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/bits.h"
#include "ops/attention.h"

/* x rounded to the nearest bf16, ties to even, kept as fp32. */
#define R(x) (bf16 ? mxi_bits_f32(mxi_bf16_bits(x)) : (x))

/* The first key row t of sequence b sees. */
static int first_key(const int32_t *doc, int T, int b, int t) { return doc ? doc[(int64_t)b * T + t] : 0; }

void mxi_attention_forward_ref(float *out, float *att, const float *q, const float *k, const float *v,
                               const int32_t *doc, int B, int T, int NH, int NKV, int HD, bool bf16) {
    int group = NH / NKV;
    float scale = 1.0f / sqrtf((float)HD);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                int kvh = h / group;
                const float *qr = q + (((int64_t)b * T + t) * NH + h) * HD;
                float *a = att + (((int64_t)b * NH + h) * T + t) * T;
                int s0 = first_key(doc, T, b, t);
                float maxv = -INFINITY;
                for (int s = 0; s < s0; s++) a[s] = 0.0f;
                for (int s = s0; s <= t; s++) {
                    const float *kr = k + (((int64_t)b * T + s) * NKV + kvh) * HD;
                    float dot = 0.0f;
                    for (int d = 0; d < HD; d++) dot += R(qr[d]) * R(kr[d]);
                    a[s] = dot * scale;
                    if (a[s] > maxv) maxv = a[s];
                }
                float sum = 0.0f;
                for (int s = s0; s <= t; s++) {
                    a[s] = expf(a[s] - maxv);
                    sum += a[s];
                }
                float inv = 1.0f / sum;
                for (int s = s0; s <= t; s++) a[s] *= inv;
                for (int s = t + 1; s < T; s++) a[s] = 0.0f;
                float *o = out + (((int64_t)b * T + t) * NH + h) * HD;
                for (int d = 0; d < HD; d++) o[d] = 0.0f;
                for (int s = s0; s <= t; s++) {
                    const float *vr = v + (((int64_t)b * T + s) * NKV + kvh) * HD;
                    for (int d = 0; d < HD; d++) o[d] += R(a[s]) * R(vr[d]);
                }
            }
}

void mxi_attention_backward_ref(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *att,
                                const float *q, const float *k, const float *v, const int32_t *doc, int B, int T, int NH,
                                int NKV, int HD, bool bf16) {
    int group = NH / NKV;
    float scale = 1.0f / sqrtf((float)HD);
    memset(dk, 0, (size_t)B * T * NKV * HD * sizeof(float));
    memset(dv, 0, (size_t)B * T * NKV * HD * sizeof(float));
    float *datt = malloc((size_t)T * sizeof(float));   // (T) dL/d probabilities of one row
    if (!datt) abort();
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                int kvh = h / group;
                const float *a = att + (((int64_t)b * NH + h) * T + t) * T;
                const float *dor = dout + (((int64_t)b * T + t) * NH + h) * HD;
                const float *outr = out + (((int64_t)b * T + t) * NH + h) * HD;
                const float *qr = q + (((int64_t)b * T + t) * NH + h) * HD;
                float *dqr = dq + (((int64_t)b * T + t) * NH + h) * HD;
                // out = sum_s a[s] v[s]: datt[s] = dout . v[s], dv[s] += a[s] dout; the
                // softmax backward's sum_s a[s] datt[s] is dout . out
                int s0 = first_key(doc, T, b, t);
                double dsum = 0.0;   // in double, as the fused backward sums it
                for (int e = 0; e < HD; e++) dsum += (double)R(dor[e]) * R(outr[e]);
                float dot_sum = (float)dsum;
                for (int s = s0; s <= t; s++) {
                    const float *vr = v + (((int64_t)b * T + s) * NKV + kvh) * HD;
                    float *dvr = dv + (((int64_t)b * T + s) * NKV + kvh) * HD;
                    float d = 0.0f;
                    for (int e = 0; e < HD; e++) {
                        d += R(dor[e]) * R(vr[e]);
                        dvr[e] += R(a[s]) * R(dor[e]);
                    }
                    datt[s] = d;
                }
                // softmax backward, then the scaled dot products
                for (int e = 0; e < HD; e++) dqr[e] = 0.0f;
                for (int s = s0; s <= t; s++) {
                    float dpre = R(a[s] * (datt[s] - dot_sum) * scale);
                    const float *kr = k + (((int64_t)b * T + s) * NKV + kvh) * HD;
                    float *dkr = dk + (((int64_t)b * T + s) * NKV + kvh) * HD;
                    for (int e = 0; e < HD; e++) {
                        dqr[e] += dpre * R(kr[e]);
                        dkr[e] += dpre * R(qr[e]);
                    }
                }
            }
    free(datt);
}
