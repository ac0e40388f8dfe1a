/* Reference kernels of the network's non-GEMM layers: plain scalar code, in the order the
 * formulas read. The vector kernels are checked against these. */
#include <math.h>

#include "core/bits.h"
#include "ops/nn_kernels.h"
#include "ops/ops_kernels.h"

static void ref_att_gemm(float *c, int64_t ldc, const float *a, int64_t lda, int64_t acs, const float *b, int64_t ldb,
                         int64_t m, int64_t n, int64_t k, mxi_att_write write) {
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            float s = write == MXI_ATT_ADD ? c[i * ldc + j] : 0.0f;
            for (int64_t x = 0; x < k; x++) s += a[i * lda + x * acs] * b[x * ldb + j];
            c[i * ldc + j] = s;
        }
}

static void ref_att_gemm_bf16(float *c, int64_t ldc, const uint32_t *a, int64_t lda, int64_t acs, const uint32_t *b,
                              int64_t ldb, int64_t m, int64_t n, int64_t kp, mxi_att_write write) {
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            float s = write == MXI_ATT_ADD ? c[i * ldc + j] : 0.0f;
            for (int64_t p = 0; p < kp; p++) {
                uint32_t x = a[i * lda + p * acs], y = b[p * ldb + j];
                s += mxi_bits_f32(x & 0xFFFF0000u) * mxi_bits_f32(y & 0xFFFF0000u);
                s += mxi_bits_f32(x << 16) * mxi_bits_f32(y << 16);
            }
            c[i * ldc + j] = s;
        }
}

/* Columns of row outside [c0, c1) of n become 0. */
static void zero_outside(float *row, int64_t n, int64_t c0, int64_t c1) {
    for (int64_t j = 0; j < c0 && j < n; j++) row[j] = 0.0f;
    for (int64_t j = c1 > c0 ? c1 : c0; j < n; j++) row[j] = 0.0f;
}

static void ref_bf16_round(uint16_t *y, const float *x, int64_t n);

/* The rows' exps as att_online_softmax's p16 takes them: rounded, an odd n padded with 0. */
static void ref_rows_bf16(uint16_t *p16, const float *s, int64_t ld, int64_t rows, int64_t n) {
    for (int64_t r = 0; r < rows; r++) {
        ref_bf16_round(p16 + r * ld, s + r * ld, n);
        if (n & 1) p16[r * ld + n] = 0;
    }
}

static void ref_att_online_softmax(float *s, int64_t ld, int64_t rows, int64_t n, const int32_t *c0, const int32_t *c1,
                                   float scale, float *rmax, float *rsum, float *corr, uint16_t *p16) {
    const float c = mxi_att_exp2_scale(scale);
    for (int64_t r = 0; r < rows; r++) {
        float *row = s + r * ld;
        zero_outside(row, n, c0[r], c1[r]);
        corr[r] = 1.0f;
        if (c0[r] >= c1[r]) continue;
        float mx = rmax[r];
        for (int64_t j = c0[r]; j < c1[r]; j++) {
            row[j] *= c;
            if (row[j] > mx) mx = row[j];
        }
        float sum = 0.0f;
        for (int64_t j = c0[r]; j < c1[r]; j++) {
            row[j] = exp2f(row[j] - mx);
            sum += row[j];
        }
        corr[r] = exp2f(rmax[r] - mx);
        rsum[r] = rsum[r] * corr[r] + sum;
        rmax[r] = mx;
    }
    if (p16) ref_rows_bf16(p16, s, ld, rows, n);
}

static void ref_att_probs(float *s, float *d, int64_t ld, int64_t rows, int64_t n, const int32_t *c0, const int32_t *c1,
                          float scale, const float *stats, const float *dsum, mxi_att_probs_mode mode) {
    const float c = mxi_att_exp2_scale(scale);
    for (int64_t r = 0; r < rows; r++) {
        float *row = s + r * ld, *dr = d ? d + r * ld : NULL;
        for (int64_t j = c0[r]; j < c1[r]; j++) row[j] = exp2f(row[j] * c - stats[2 * r]) * stats[2 * r + 1];
        zero_outside(row, n, c0[r], c1[r]);
        if (mode == MXI_ATT_DSCORES) {
            for (int64_t j = c0[r]; j < c1[r]; j++) dr[j] = row[j] * (dr[j] - dsum[r]) * scale;
            zero_outside(dr, n, c0[r], c1[r]);
        }
    }
}

static void ref_att_dscores_bf16(uint32_t *p2, uint32_t *ds2, uint16_t *ds16, float *s, float *d, int64_t ld,
                                 int64_t rows, int64_t n, const int32_t *c0, const int32_t *c1, float scale,
                                 const float *stats, const float *dsum) {
    mxi_att_dscores_composed(&mxi_nn_kernels_ref, p2, ds2, ds16, s, d, ld, rows, n, c0, c1, scale, stats, dsum);
}

static void ref_bf16_round(uint16_t *y, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = mxi_f32_to_bf16(x[i]);
}

static void ref_bf16_pair_rows(uint32_t *y, const float *x0, const float *x1, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = (uint32_t)mxi_f32_to_bf16(x1[i]) << 16 | mxi_f32_to_bf16(x0[i]);
}

static void ref_bf16_round_f32(float *y, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = mxi_bits_f32(mxi_bf16_bits(x[i]));
}

static void ref_bf16_widen(float *y, const uint16_t *x, int64_t n, int add) {
    for (int64_t i = 0; i < n; i++) {
        float f = mxi_bf16_to_f32(x[i]);
        y[i] = add ? y[i] + f : f;
    }
}

static void ref_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int64_t rows, int C,
                                float eps) {
    for (int64_t n = 0; n < rows; n++) {
        const float *x = inp + n * C;
        float *y = out + n * C;
        float ss = 0.0f;
        for (int c = 0; c < C; c++) ss += x[c] * x[c];
        float r = 1.0f / sqrtf(ss / C + eps);
        for (int c = 0; c < C; c++) y[c] = x[c] * r * weight[c];
        rstd[n] = r;
    }
}

static void ref_rmsnorm_backward(float *dinp, const float *dout, const float *inp, const float *weight,
                                 const float *rstd, int64_t rows, int C) {
    for (int64_t n = 0; n < rows; n++) {
        const float *x = inp + n * C, *dy = dout + n * C;
        float *dx = dinp + n * C;
        float r = rstd[n], dot = 0.0f;
        for (int c = 0; c < C; c++) dot += weight[c] * dy[c] * x[c];
        float k = dot * r * r * r / C;
        for (int c = 0; c < C; c++) dx[c] = r * weight[c] * dy[c] - k * x[c];
    }
}

static void ref_rmsnorm_dweight(float *dweight, const float *dout, const float *inp, const float *rstd, int64_t rows,
                                int C, int c0, int c1) {
    for (int c = c0; c < c1; c++) {
        float acc = 0.0f;
        for (int64_t n = 0; n < rows; n++) acc += dout[n * C + c] * inp[n * C + c] * rstd[n];
        dweight[c] += acc;
    }
}

static inline float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

static void ref_swiglu_forward(float *out, const float *gate, const float *up, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = gate[i] * sigmoidf(gate[i]) * up[i];
}

static void ref_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up,
                                int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i], s = sigmoidf(g), silu = g * s, d = dout[i];
        float dg = d * up[i] * s * (1.0f + g * (1.0f - s));
        dup[i] = d * silu;
        dgate[i] = dg;
    }
}

static void ref_adamw(float *w, float *m, float *v, const float *g, int64_t n, float b1, float b2, float step_size,
                      float bc2_sqrt, float eps, float shrink) {
    for (int64_t i = 0; i < n; i++) {
        float gi = g[i];
        m[i] = b1 * m[i] + (1.0f - b1) * gi;
        v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
        w[i] = w[i] * shrink - step_size * m[i] / (sqrtf(v[i]) / bc2_sqrt + eps);
    }
}

static void ref_rope(float *x, const float *cs, const float *sn, int H, int HD, float sign) {
    int half = HD / 2;
    for (int h = 0; h < H; h++) {
        float *row = x + (int64_t)h * HD;
        for (int i = 0; i < half; i++) {
            float x1 = row[i], x2 = row[i + half], s = sign * sn[i];
            row[i] = x1 * cs[i] - x2 * s;
            row[i + half] = x2 * cs[i] + x1 * s;
        }
    }
}

static void ref_attend(float *out, float *p, const float *q, const float *k, const float *v, int64_t t, int64_t ld,
                       int HD, float scale) {
    float maxv = -INFINITY;
    for (int64_t s = 0; s < t; s++) {
        float dot = 0.0f;
        for (int i = 0; i < HD; i++) dot += q[i] * k[s * ld + i];
        p[s] = dot * scale;
        if (p[s] > maxv) maxv = p[s];
    }
    float sum = 0.0f;
    for (int64_t s = 0; s < t; s++) {
        p[s] = expf(p[s] - maxv);
        sum += p[s];
    }
    for (int i = 0; i < HD; i++) out[i] = 0.0f;
    for (int64_t s = 0; s < t; s++)
        for (int i = 0; i < HD; i++) out[i] += p[s] * v[s * ld + i];
    float inv = 1.0f / sum;
    for (int i = 0; i < HD; i++) out[i] *= inv;
}

static void ref_add(float *y, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += x[i];
}

static void ref_scale(float *x, int64_t n, float s) {
    for (int64_t i = 0; i < n; i++) x[i] *= s;
}

static double ref_sum_squares(const float *x, int64_t n) {
    double acc = 0.0;
    for (int64_t i = 0; i < n; i++) acc += (double)x[i] * x[i];
    return acc;
}

static double ref_cross_entropy(float *dz, const float *z, int V, int target, float dscale) {
    float maxv = -INFINITY;
    for (int i = 0; i < V; i++) maxv = fmaxf(maxv, z[i]);
    double sum = 0.0;
    for (int i = 0; i < V; i++) sum += exp((double)(z[i] - maxv));
    if (dz) {
        float inv = (float)(1.0 / sum);
        for (int i = 0; i < V; i++) dz[i] = expf(z[i] - maxv) * inv * dscale;
        dz[target] -= dscale;
    }
    return log(sum) + maxv - z[target];
}

const mxi_nn_kernels mxi_nn_kernels_ref = {
    .name = "ref",
    .att_gemm = ref_att_gemm,
    .att_gemm_bf16 = ref_att_gemm_bf16,
    .att_online_softmax = ref_att_online_softmax,
    .att_probs = ref_att_probs,
    .att_dscores_bf16 = ref_att_dscores_bf16,
    .bf16_round = ref_bf16_round,
    .bf16_pair_rows = ref_bf16_pair_rows,
    .bf16_round_f32 = ref_bf16_round_f32,
    .bf16_widen = ref_bf16_widen,
    .rmsnorm_forward = ref_rmsnorm_forward,
    .rmsnorm_backward = ref_rmsnorm_backward,
    .rmsnorm_dweight = ref_rmsnorm_dweight,
    .swiglu_forward = ref_swiglu_forward,
    .swiglu_backward = ref_swiglu_backward,
    .adamw = ref_adamw,
    .rope = ref_rope,
    .attend = ref_attend,
    .add = ref_add,
    .scale = ref_scale,
    .sum_squares = ref_sum_squares,
    .cross_entropy = ref_cross_entropy,
};
