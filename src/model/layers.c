/* The transformer's non-GEMM layers, forward and backward (see layers.h), threaded with
 * OpenMP over independent rows. The arithmetic is in the nn kernels (ops/nn_kernels.h:
 * scalar reference or AVX2); the MoE router's small loops (E and K entries a token) stay
 * plain here. */
#include "model/layers.h"

#include <math.h>
#include <omp.h>
#include <string.h>

#include "ops/nn_kernels.h"

/* Rows per parallel task for rows of `cols` elements: at least ~32K elements a task, so a
 * small layer runs in one thread instead of paying for a parallel region. */
#define ROWS_PER_TASK(cols) ((int64_t)(32768 / ((cols) > 0 ? (cols) : 1)) + 1)

void mxi_embedding_forward(float *out, const int32_t *tokens, const float *wte, int N, int C) {
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) memcpy(out + (int64_t)n * C, wte + (int64_t)tokens[n] * C, (size_t)C * sizeof(float));
}

void mxi_embedding_forward_bf16(float *out, const int32_t *tokens, const uint16_t *wte, int N, int C) {
    const mxi_nn_kernels *k = mxi_nn_kernels_active();
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) k->bf16_widen(out + (int64_t)n * C, wte + (int64_t)tokens[n] * C, C, 0);
}

void mxi_embedding_backward(float *dwte, const float *dout, const int32_t *tokens, int N, int C) {
    // Threads own column ranges, so rows with the same token never race.
    const mxi_nn_kernels *k = mxi_nn_kernels_active();
    #pragma omp parallel
    {
        int nt = omp_get_num_threads(), id = omp_get_thread_num();
        int c0 = (int)((int64_t)C * id / nt), c1 = (int)((int64_t)C * (id + 1) / nt);
        for (int n = 0; n < N; n++) {
            float *dst = dwte + (int64_t)tokens[n] * C;
            const float *src = dout + (int64_t)n * C;
            k->add(dst + c0, src + c0, c1 - c0);
        }
    }
}

void mxi_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int N, int C, float eps) {
    const mxi_nn_kernels *k = mxi_nn_kernels_active();
    int64_t chunk = ROWS_PER_TASK(C), tasks = (N + chunk - 1) / chunk;
    #pragma omp parallel for schedule(static) if (tasks > 1)
    for (int64_t t = 0; t < tasks; t++) {
        int64_t r0 = t * chunk, rows = N - r0 < chunk ? N - r0 : chunk;
        k->rmsnorm_forward(out + r0 * C, rstd + r0, inp + r0 * C, weight, rows, C, eps);
    }
}

void mxi_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp, const float *weight,
                      const float *rstd, int N, int C) {
    const mxi_nn_kernels *k = mxi_nn_kernels_active();
    int64_t chunk = ROWS_PER_TASK(C), tasks = (N + chunk - 1) / chunk;
    // dweight by column blocks (each thread owns its columns, rows walked in order), dx by rows
    int cblocks = (C + 63) / 64;
    #pragma omp parallel if (tasks > 1)
    {
        #pragma omp for schedule(static) nowait
        for (int cb = 0; cb < cblocks; cb++)
            k->rmsnorm_dweight(dweight, dout, inp, rstd, N, C, cb * 64, cb * 64 + 64 < C ? cb * 64 + 64 : C);
        #pragma omp for schedule(static)
        for (int64_t t = 0; t < tasks; t++) {
            int64_t r0 = t * chunk, rows = N - r0 < chunk ? N - r0 : chunk;
            k->rmsnorm_backward(dinp + r0 * C, dout + r0 * C, inp + r0 * C, weight, rstd + r0, rows, C);
        }
    }
}

void mxi_rope_tables(float *cos_t, float *sin_t, int T, int HD, float theta) {
    int half = HD / 2;
    for (int i = 0; i < half; i++) {
        // fp32 like HF: inv_freq = 1 / theta^(2i/HD), freqs = t * inv_freq, then cos/sin
        float inv_freq = 1.0f / powf(theta, (float)(2 * i) / (float)HD);
        for (int t = 0; t < T; t++) {
            float f = (float)t * inv_freq;
            cos_t[t * half + i] = cosf(f);
            sin_t[t * half + i] = sinf(f);
        }
    }
}

/* Rotate pairs (x_i, x_{i+HD/2}) by the angle of position t (or pos[b][t]); sign = +1
 * forward, -1 backward. */
static void rope_apply(float *x, const float *cos_t, const float *sin_t, const int32_t *pos, int B, int T, int H, int HD,
                       float sign) {
    const mxi_nn_kernels *k = mxi_nn_kernels_active();
    int half = HD / 2;
    #pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            int64_t p = pos ? pos[(int64_t)b * T + t] : t;
            k->rope(x + ((int64_t)b * T + t) * H * HD, cos_t + p * half, sin_t + p * half, H, HD, sign);
        }
}

void mxi_rope_forward(float *x, const float *cos_t, const float *sin_t, const int32_t *pos, int B, int T, int H,
                      int HD) {
    rope_apply(x, cos_t, sin_t, pos, B, T, H, HD, 1.0f);
}

void mxi_rope_backward(float *dx, const float *cos_t, const float *sin_t, const int32_t *pos, int B, int T, int H,
                       int HD) {
    rope_apply(dx, cos_t, sin_t, pos, B, T, H, HD, -1.0f);   // a rotation's transpose is its inverse
}

void mxi_swiglu_forward(float *out, const float *gate, const float *up, int64_t rows, int F, int ld) {
    const mxi_nn_kernels *k = mxi_nn_kernels_active();
    int64_t chunk = ROWS_PER_TASK(F), tasks = (rows + chunk - 1) / chunk;
    #pragma omp parallel for schedule(static) if (tasks > 1)
    for (int64_t t = 0; t < tasks; t++)
        for (int64_t r = t * chunk; r < rows && r < (t + 1) * chunk; r++)
            k->swiglu_forward(out + r * F, gate + r * ld, up + r * ld, F);
}

void mxi_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up, int64_t rows,
                     int F, int ld) {
    const mxi_nn_kernels *k = mxi_nn_kernels_active();
    int64_t chunk = ROWS_PER_TASK(F), tasks = (rows + chunk - 1) / chunk;
    #pragma omp parallel for schedule(static) if (tasks > 1)
    for (int64_t t = 0; t < tasks; t++)
        for (int64_t r = t * chunk; r < rows && r < (t + 1) * chunk; r++)
            k->swiglu_backward(dgate + r * ld, dup + r * ld, dout + r * F, gate + r * ld, up + r * ld, F);
}

void mxi_add_inplace(float *y, const float *x, int64_t n) {
    const mxi_nn_kernels *k = mxi_nn_kernels_active();
    MXI_PARALLEL_CHUNKS(n, k->add(y + i0, x + i0, len));
}

double mxi_cross_entropy_forward_backward(float *dlogits, const float *logits, const int32_t *targets, int N, int V,
                                      float dscale) {
    const mxi_nn_kernels *k = mxi_nn_kernels_active();
    double total = 0.0;
    #pragma omp parallel for schedule(static) reduction(+ : total)
    for (int n = 0; n < N; n++)
        total += k->cross_entropy(dlogits ? dlogits + (int64_t)n * V : NULL, logits + (int64_t)n * V, V, targets[n], dscale);
    return total / N;
}

void mxi_moe_route_forward(int32_t *expert_idx, float *route_w, float *probs, const float *logits, int N, int E, int K,
                       bool norm) {
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *z = logits + (int64_t)n * E;
        float *p = probs + (int64_t)n * E;
        float maxv = -INFINITY, sum = 0.0f;
        for (int e = 0; e < E; e++) maxv = fmaxf(maxv, z[e]);
        for (int e = 0; e < E; e++) sum += (p[e] = expf(z[e] - maxv));
        for (int e = 0; e < E; e++) p[e] /= sum;
        // top-K by selection: K is small; ties go to the lower expert index
        int32_t *idx = expert_idx + (int64_t)n * K;
        float *w = route_w + (int64_t)n * K, wsum = 0.0f;
        for (int j = 0; j < K; j++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                bool taken = false;
                for (int i = 0; i < j; i++) taken |= idx[i] == e;
                if (!taken && (best < 0 || p[e] > p[best])) best = e;
            }
            idx[j] = best;
            wsum += (w[j] = p[best]);
        }
        if (norm)
            for (int j = 0; j < K; j++) w[j] /= wsum;
    }
}

void mxi_moe_route_backward(float *dlogits, const float *droute_w, const float *probs, const int32_t *expert_idx,
                        const float *aux_dprob, int N, int E, int K, bool norm) {
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *p = probs + (int64_t)n * E, *dw = droute_w + (int64_t)n * K;
        const int32_t *idx = expert_idx + (int64_t)n * K;
        float *dz = dlogits + (int64_t)n * E;   // holds dprobs until the softmax backward
        for (int e = 0; e < E; e++) dz[e] = aux_dprob ? aux_dprob[e] : 0.0f;
        if (norm) {
            // w_j = p_j / S with S = sum of the selected p: dp_j = (dw_j - sum_i dw_i w_i) / S
            float S = 0.0f, dot = 0.0f;
            for (int j = 0; j < K; j++) S += p[idx[j]];
            for (int j = 0; j < K; j++) dot += dw[j] * p[idx[j]] / S;
            for (int j = 0; j < K; j++) dz[idx[j]] += (dw[j] - dot) / S;
        } else {
            for (int j = 0; j < K; j++) dz[idx[j]] += dw[j];
        }
        float dot = 0.0f;
        for (int e = 0; e < E; e++) dot += p[e] * dz[e];
        for (int e = 0; e < E; e++) dz[e] = p[e] * (dz[e] - dot);
    }
}

void mxi_moe_aux_accumulate(double *count, double *prob_sum, const int32_t *expert_idx, const float *probs, int N, int E,
                        int K) {
    for (int n = 0; n < N; n++) {
        for (int j = 0; j < K; j++) count[expert_idx[(int64_t)n * K + j]] += 1.0;
        for (int e = 0; e < E; e++) prob_sum[e] += probs[(int64_t)n * E + e];
    }
}

double mxi_moe_aux_loss(const double *count, const double *prob_sum, int E, double ntot) {
    double loss = 0.0;
    for (int e = 0; e < E; e++) loss += (count[e] / ntot) * (prob_sum[e] / ntot);
    return loss * E;
}

void mxi_moe_aux_dprob(float *aux_dprob, const double *count, int E, double ntot, double coef) {
    for (int e = 0; e < E; e++) aux_dprob[e] = (float)(coef * E * count[e] / (ntot * ntot));
}

double mxi_moe_z_forward(float *z, const float *logits, int N, int E) {
    double sum = 0;
    for (int n = 0; n < N; n++) {
        const float *row = logits + (int64_t)n * E;
        float mx = row[0];
        for (int e = 1; e < E; e++) mx = row[e] > mx ? row[e] : mx;
        double s = 0;
        for (int e = 0; e < E; e++) s += exp((double)row[e] - mx);
        z[n] = (float)(mx + log(s));
        sum += (double)z[n] * z[n];
    }
    return sum;
}

void mxi_moe_z_backward(float *dlogits, const float *probs, const float *z, int N, int E, float scale) {
    for (int n = 0; n < N; n++)
        for (int e = 0; e < E; e++) dlogits[(int64_t)n * E + e] += scale * 2.0f * z[n] * probs[(int64_t)n * E + e];
}
