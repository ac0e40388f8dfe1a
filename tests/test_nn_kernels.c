/* The nn kernel tables (ops/nn_kernels.h) that are bit-level: bf16 rounding and widening.
 * The reference is checked against an independent oracle (the two bf16 neighbours of x
 * compared in double, ties to even), every vector kernel the CPU runs against the
 * reference bit for bit, over odd lengths so every tail path runs. Also the layer kernels
 * (RMSNorm, SwiGLU, AdamW) against the reference; the reference layers themselves are
 * checked against PyTorch in test_layers and test_optim. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "mxtrain/mx.h"
#include "ops/nn_kernels.h"

static float from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t to_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* Round-to-nearest-even of fp32 bits u to bf16 by comparing distances in double. */
static uint16_t oracle_round(uint32_t u) {
    float x = from_bits(u);
    if (isnan(x)) return (uint16_t)((u >> 16) | 0x40);   // quiet NaN, sign and top payload kept
    uint32_t lo = u & 0xFFFF0000u;          // truncation toward zero: |lo| <= |x|
    uint32_t hi = lo + 0x10000u;            // the next bf16 away from zero (may be inf)
    if ((u & 0xFFFFu) == 0) return (uint16_t)(lo >> 16);
    double dl = fabs((double)x - (double)from_bits(lo));
    // the value above the largest finite bf16 is 2^128 for rounding purposes
    double vh = ((hi & 0x7FFFFFFFu) == 0x7F800000u) ? copysign(ldexp(1.0, 128), x) : (double)from_bits(hi);
    double dh = fabs(vh - (double)x);
    if (dl < dh) return (uint16_t)(lo >> 16);
    if (dh < dl) return (uint16_t)(hi >> 16);
    return (uint16_t)(((lo >> 16) & 1) ? hi >> 16 : lo >> 16);
}

/* Every bf16 top half with low halves around the rounding points, plus random patterns. */
static uint32_t *patterns(size_t *n) {
    static const uint32_t lows[] = {0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x4000, 0xC000};
    size_t count = 65536 * 8 + 200000;
    uint32_t *p = malloc(count * sizeof *p);
    size_t k = 0;
    for (uint32_t top = 0; top < 65536; top++)
        for (int j = 0; j < 8; j++) p[k++] = top << 16 | lows[j];
    uint64_t st = 99;
    while (k < count) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        p[k++] = (uint32_t)(st >> 32);
    }
    *n = count;
    return p;
}

static void test_bf16_reference_vs_oracle(void) {
    size_t n;
    uint32_t *p = patterns(&n);
    float *x = malloc(n * 4), *yf = malloc(n * 4);
    uint16_t *y = malloc(n * 2);
    for (size_t i = 0; i < n; i++) x[i] = from_bits(p[i]);
    mxi_nn_kernels_ref.bf16_round(y, x, (int64_t)n);
    mxi_nn_kernels_ref.bf16_round_f32(yf, x, (int64_t)n);
    size_t bad = 0, bad_f32 = 0;
    for (size_t i = 0; i < n; i++) {
        uint16_t want = oracle_round(p[i]);
        if (y[i] != want && bad++ < 5) printf("    0x%08X: got 0x%04X, want 0x%04X\n", p[i], y[i], want);
        bad_f32 += to_bits(yf[i]) != (uint32_t)want << 16;
    }
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(bad_f32, 0);
    // widening is exact: bf16 bits b become fp32 bits b << 16
    uint16_t all[65536];
    float w[65536];
    for (int i = 0; i < 65536; i++) all[i] = (uint16_t)i, w[i] = 1.0f;
    mxi_nn_kernels_ref.bf16_widen(w, all, 65536, 0);
    bad = 0;
    for (int i = 0; i < 65536; i++) bad += to_bits(w[i]) != (uint32_t)i << 16;
    CHECK_EQ_INT(bad, 0);
    free(p), free(x), free(yf), free(y);
}

static void test_bf16_kernels_vs_reference(void) {
    size_t n;
    uint32_t *p = patterns(&n);
    float *x = malloc(n * 4);
    for (size_t i = 0; i < n; i++) x[i] = from_bits(p[i]);
    const mxi_nn_kernels *kt[] = {&mxi_nn_kernels_avx2};
    const mx_kernel ids[] = {MX_KERNEL_AVX2};
    static const int64_t lens[] = {0, 1, 7, 8, 9, 15, 16, 17, 31, 33, 100003};
    for (int t = 0; t < 1; t++) {
        if (!mx_kernel_available(ids[t])) {
            printf("  nn kernel %s: not run (CPU lacks it)\n", kt[t]->name);
            continue;
        }
        printf("  nn kernel %s: bf16 round, round to fp32, widen, widen-add\n", kt[t]->name);
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
            for (size_t off = 0; off + (size_t)lens[li] <= n; off += n / 3 + 1) {
                int64_t m = lens[li];
                const float *xs = x + off;
                uint16_t *a = calloc((size_t)m + 1, 2), *b = calloc((size_t)m + 1, 2);
                float *fa = calloc((size_t)m + 1, 4), *fb = calloc((size_t)m + 1, 4);
                mxi_nn_kernels_ref.bf16_round(a, xs, m);
                kt[t]->bf16_round(b, xs, m);
                CHECK_MEM_EQ(a, b, (size_t)m * 2 + 2);   // the element past the end is untouched too
                mxi_nn_kernels_ref.bf16_round_f32(fa, xs, m);
                kt[t]->bf16_round_f32(fb, xs, m);
                CHECK_MEM_EQ(fa, fb, (size_t)m * 4 + 4);
                for (int64_t i = 0; i <= m; i++) fa[i] = fb[i] = (float)i * 0.25f;
                mxi_nn_kernels_ref.bf16_widen(fa, a, m, 1);
                kt[t]->bf16_widen(fb, a, m, 1);
                CHECK_MEM_EQ(fa, fb, (size_t)m * 4 + 4);
                mxi_nn_kernels_ref.bf16_widen(fa, a, m, 0);
                kt[t]->bf16_widen(fb, a, m, 0);
                CHECK_MEM_EQ(fa, fb, (size_t)m * 4 + 4);
                free(a), free(b), free(fa), free(fb);
            }
        }
    }
    // the threaded wrappers split work into chunks: same bits as one call
    int64_t m = (int64_t)n;
    uint16_t *a = malloc(n * 2), *b = malloc(n * 2);
    mxi_nn_kernels_ref.bf16_round(a, x, m);
    mxi_bf16_round(b, x, m);
    CHECK_MEM_EQ(a, b, n * 2);
    free(a), free(b), free(p), free(x);
}

static float *randv(size_t n, uint64_t *st, float scale) {
    float *x = malloc((n ? n : 1) * sizeof *x);
    for (size_t i = 0; i < n; i++) {
        *st = *st * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = ((float)(*st >> 40) / 16777216.0f - 0.5f) * scale;
    }
    return x;
}

/* max |a - b| / (atol + rtol |b|) over n: <= 1 passes. */
static double worst(const float *a, const float *b, size_t n, double atol, double rtol) {
    double w = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]) / (atol + rtol * fabs((double)b[i]));
        if (!(e <= w)) w = e;   // NaN counts as worst
    }
    return w;
}

/* RMSNorm, SwiGLU and AdamW kernels against the reference over odd sizes (tails of every
 * length): RMSNorm and SwiGLU within a few fp32 ulps (other summation order, vector exp),
 * AdamW bit for bit (the same operations in the same order, no contraction). */
static void test_layer_kernels_vs_reference(void) {
    if (!mx_kernel_available(MX_KERNEL_AVX2)) {
        printf("  nn kernel avx2: not run (CPU lacks it)\n");
        return;
    }
    const mxi_nn_kernels *r = &mxi_nn_kernels_ref, *k = &mxi_nn_kernels_avx2;
    printf("  nn kernel %s: rmsnorm, swiglu, adamw\n", k->name);
    static const int Cs[] = {1, 7, 8, 9, 63, 64, 65, 130, 517};
    uint64_t st = 5;
    for (size_t ci = 0; ci < sizeof Cs / sizeof Cs[0]; ci++) {
        int C = Cs[ci];
        int64_t rows = 13;
        size_t n = (size_t)rows * C;
        float *x = randv(n, &st, 4.0f), *w = randv((size_t)C, &st, 2.0f), *dy = randv(n, &st, 3.0f);
        float *y0 = malloc(n * 4), *y1 = malloc(n * 4), *r0 = malloc(rows * 4), *r1 = malloc(rows * 4);
        r->rmsnorm_forward(y0, r0, x, w, rows, C, 1e-6f);
        k->rmsnorm_forward(y1, r1, x, w, rows, C, 1e-6f);
        CHECK(worst(y1, y0, n, 1e-6, 1e-5) <= 1);
        CHECK(worst(r1, r0, (size_t)rows, 0, 1e-5) <= 1);
        r->rmsnorm_backward(y0, dy, x, w, r0, rows, C);
        k->rmsnorm_backward(y1, dy, x, w, r0, rows, C);
        CHECK(worst(y1, y0, n, 1e-5, 1e-4) <= 1);
        float *g0 = calloc((size_t)C, 4), *g1 = calloc((size_t)C, 4);
        for (int c = 0; c < C; c++) g0[c] = g1[c] = 0.5f;   // accumulates
        r->rmsnorm_dweight(g0, dy, x, r0, rows, C, 0, C);
        k->rmsnorm_dweight(g1, dy, x, r0, rows, C, C / 3, C);   // two column ranges cover C
        k->rmsnorm_dweight(g1, dy, x, r0, rows, C, 0, C / 3);
        CHECK(worst(g1, g0, (size_t)C, 1e-5, 1e-4) <= 1);
        // SwiGLU over gates from -20 to 20: sigmoid on both sides of 0 and near saturation
        float *gt = randv(n, &st, 40.0f), *up = randv(n, &st, 2.0f), *d0 = malloc(n * 4), *d1 = malloc(n * 4);
        r->swiglu_forward(y0, gt, up, (int64_t)n);
        k->swiglu_forward(y1, gt, up, (int64_t)n);
        CHECK(worst(y1, y0, n, 1e-6, 1e-5) <= 1);
        r->swiglu_backward(d0, y0, dy, gt, up, (int64_t)n);
        k->swiglu_backward(d1, y1, dy, gt, up, (int64_t)n);
        CHECK(worst(d1, d0, n, 1e-6, 1e-5) <= 1);
        CHECK(worst(y1, y0, n, 1e-6, 1e-5) <= 1);
        // AdamW: bit for bit
        float *wa = randv(n, &st, 1.0f), *ma = randv(n, &st, 0.1f), *va = randv(n, &st, 0.01f);
        for (size_t i = 0; i < n; i++) va[i] = fabsf(va[i]);
        float *wb = malloc(n * 4), *mb = malloc(n * 4), *vb = malloc(n * 4);
        memcpy(wb, wa, n * 4), memcpy(mb, ma, n * 4), memcpy(vb, va, n * 4);
        r->adamw(wa, ma, va, dy, (int64_t)n, 0.9f, 0.95f, 3e-4f, 0.3f, 1e-8f, 0.99997f);
        k->adamw(wb, mb, vb, dy, (int64_t)n, 0.9f, 0.95f, 3e-4f, 0.3f, 1e-8f, 0.99997f);
        CHECK_MEM_EQ(wa, wb, n * 4);
        CHECK_MEM_EQ(ma, mb, n * 4);
        CHECK_MEM_EQ(va, vb, n * 4);
        free(x), free(w), free(dy), free(y0), free(y1), free(r0), free(r1), free(g0), free(g1), free(gt), free(up);
        free(d0), free(d1), free(wa), free(ma), free(va), free(wb), free(mb), free(vb);
    }
}

/* RoPE, add, scale bit for bit against the reference (the same operations in the same
 * order); the sum of squares and the cross-entropy against long-double oracles, and the
 * vector kernels within a few ulps of them; odd sizes so every tail runs. */
static void test_elementwise_kernels(void) {
    const mxi_nn_kernels *r = &mxi_nn_kernels_ref;
    const mxi_nn_kernels *kt[] = {&mxi_nn_kernels_ref, &mxi_nn_kernels_avx2};
    const mx_kernel ids[] = {MX_KERNEL_REF, MX_KERNEL_AVX2};
    uint64_t st = 17;
    for (int t = 0; t < 2; t++) {
        const mxi_nn_kernels *k = kt[t];
        if (!mx_kernel_available(ids[t])) {
            printf("  nn kernel %s: not run (CPU lacks it)\n", k->name);
            continue;
        }
        printf("  nn kernel %s: rope, add, scale, sum of squares, cross-entropy\n", k->name);
        static const int HDs[] = {2, 6, 16, 18, 34, 64, 130};
        for (size_t hi = 0; hi < sizeof HDs / sizeof HDs[0]; hi++) {
            int HD = HDs[hi], H = 3;
            size_t n = (size_t)H * HD;
            float *x = randv(n + 1, &st, 4.0f), *cs = randv((size_t)HD / 2, &st, 2.0f), *sn = randv((size_t)HD / 2, &st, 2.0f);
            float *a = malloc((n + 1) * 4), *b = malloc((n + 1) * 4);
            for (float sign = -1; sign <= 1; sign += 2) {
                memcpy(a, x, (n + 1) * 4), memcpy(b, x, (n + 1) * 4);
                r->rope(a, cs, sn, H, HD, sign);
                k->rope(b, cs, sn, H, HD, sign);
                CHECK_MEM_EQ(a, b, (n + 1) * 4);   // the element past the end is untouched too
            }
            // the rotation itself: (x1, x2) -> (x1 c - x2 s, x2 c + x1 s), in double
            double bad = 0;
            for (int h = 0; h < H; h++)
                for (int i = 0; i < HD / 2; i++) {
                    const float *xr = x + h * HD;
                    double w1 = (double)xr[i] * cs[i] - (double)xr[i + HD / 2] * sn[i];   // a: sign +1, last
                    double w2 = (double)xr[i + HD / 2] * cs[i] + (double)xr[i] * sn[i];
                    double e = fabs(a[h * HD + i] - w1) + fabs(a[h * HD + i + HD / 2] - w2);
                    if (e > bad) bad = e;
                }
            CHECK_NEAR(bad, 0, 1e-5);   // |x| <= 2, |cs|, |sn| <= 1: a few fp32 ulps
            free(x), free(cs), free(sn), free(a), free(b);
        }
        static const int64_t lens[] = {0, 1, 7, 8, 9, 15, 17, 257, 1000, 4099};
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
            int64_t n = lens[li];
            float *x = randv((size_t)n + 1, &st, 6.0f), *y = randv((size_t)n + 1, &st, 3.0f);
            float *a = malloc(((size_t)n + 1) * 4), *b = malloc(((size_t)n + 1) * 4);
            memcpy(a, y, ((size_t)n + 1) * 4), memcpy(b, y, ((size_t)n + 1) * 4);
            r->add(a, x, n);
            k->add(b, x, n);
            CHECK_MEM_EQ(a, b, ((size_t)n + 1) * 4);
            for (int64_t i = 0; i < n; i++) CHECK_EQ_DBL(a[i], y[i] + x[i]);
            r->scale(a, n, 0.37f);
            k->scale(b, n, 0.37f);
            CHECK_MEM_EQ(a, b, ((size_t)n + 1) * 4);
            long double ss = 0;
            for (int64_t i = 0; i < n; i++) ss += (long double)x[i] * x[i];
            CHECK_NEAR(k->sum_squares(x, n), (double)ss, 1e-14 * (double)ss);
            if (n > 0) {
                // logits spread over +-30 (far-apart and near-equal values), targets at both ends
                int V = (int)n;
                for (int i = 0; i < V; i++) x[i] *= 5.0f;
                for (int target = 0; target < V; target += V > 1 ? V - 1 : 1) {
                    long double mx = -INFINITY, sum = 0;
                    for (int i = 0; i < V; i++) mx = x[i] > mx ? x[i] : mx;
                    for (int i = 0; i < V; i++) sum += expl((long double)x[i] - mx);
                    double want = (double)(logl(sum) + mx - x[target]);
                    float *dz = malloc((size_t)V * 4);
                    double got = k->cross_entropy(dz, x, V, target, 0.5f);
                    CHECK_NEAR(got, want, 1e-6 * (1 + fabs(want)));
                    CHECK_EQ_DBL(k->cross_entropy(NULL, x, V, target, 0.5f), got);
                    double worst_dz = 0;
                    for (int i = 0; i < V; i++) {
                        double w = 0.5 * (double)(expl((long double)x[i] - mx) / sum) - (i == target ? 0.5 : 0.0);
                        double e = fabs(dz[i] - w);
                        if (!(e <= worst_dz)) worst_dz = e;
                    }
                    CHECK_NEAR(worst_dz, 0, 1e-6);
                    free(dz);
                }
            }
            free(x), free(y), free(a), free(b);
        }
    }
}

int main(int argc, char **argv) {
    static const mxt_test tests[] = {
        {"bf16_reference_vs_oracle", test_bf16_reference_vs_oracle},
        {"bf16_kernels_vs_reference", test_bf16_kernels_vs_reference},
        {"layer_kernels_vs_reference", test_layer_kernels_vs_reference},
        {"elementwise_kernels", test_elementwise_kernels},
    };
    return MXT_RUN(tests, argc, argv);
}
