/* The nn kernel tables (ops/nn_kernels.h): every table the library has (ref, avx2, avx512),
 * each run where the CPU executes it (the AVX-512 one also in the SIMDe build, emulated)
 * and reported by name, or reported as not run. bf16 rounding and widening: the reference
 * against an independent oracle (the two bf16 neighbours of x compared in double, ties to
 * even), every vector table against the reference bit for bit, over odd lengths so every
 * tail path runs. The layer kernels (RMSNorm, SwiGLU, AdamW) against the reference; the
 * reference layers themselves are checked against PyTorch in test_layers and test_optim.
 * RoPE, add, scale, sum of squares and cross-entropy against the reference and oracles.
 * Every kernel on NaN, +-Inf, all-NaN and all -Inf rows: the reference against what its
 * formulas give, the others against the reference (the contract of ops/nn_kernels.h).
 * Decoding attention (attend) against an oracle. The softmax kernels are checked in test_attention. The kernel bundles (ops/kernels.h):
 * one per kernel, each family's accessor a view of it, and the reference filling the slots
 * an instruction set leaves NULL. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "mxtrain/mx.h"
#include "numerics/mx_internal.h"   // mxi_kernel_emulated
#include "ops/kernels.h"
#include "ops/nn_kernels.h"

/* Every kernel the library lists, the reference first (mx_kernel_name() is NULL past the
 * last), so a new table is tested here without touching this file. */
#define FOR_EACH_KERNEL(k) for (mx_kernel k = MX_KERNEL_REF; mx_kernel_name(k); k = (mx_kernel)(k + 1))

/* Kernel k's table if the CPU runs it; otherwise NULL, after a line saying why it was not
 * run (that is not a pass: nothing was checked for it). */
static const mxi_nn_kernels *runnable(mx_kernel k) {
    if (mx_kernel_available(k)) return mxi_nn_kernels_of(k);
    printf("  nn kernel %s: not run (%s)\n", mx_kernel_name(k), mx_kernel_missing(k));
    return NULL;
}

/* A kernel's closing line in a test: what was checked, FAILED when a check failed since
 * `before` failures. */
static void report(mx_kernel k, int before, const char *what) {
    printf("  nn kernel %s%s: %s%s\n", mx_kernel_name(k), mxi_kernel_emulated(k) ? " (SIMDe emulation)" : "",
           mxt_current_failures() > before ? "FAILED: " : "", what);
}

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
    while (k < count) p[k++] = (uint32_t)(mxt_lcg64(&st) >> 32);
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
    static const int64_t lens[] = {0, 1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 47, 100003};
    FOR_EACH_KERNEL(id) {
        if (id == MX_KERNEL_REF) continue;   // the reference is held to the oracle above
        const mxi_nn_kernels *k = runnable(id);
        if (!k) continue;
        int before = mxt_current_failures();
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
            for (size_t off = 0; off + (size_t)lens[li] <= n; off += n / 3 + 1) {
                int64_t m = lens[li];
                const float *xs = x + off;
                uint16_t *a = calloc((size_t)m + 1, 2), *b = calloc((size_t)m + 1, 2);
                float *fa = calloc((size_t)m + 1, 4), *fb = calloc((size_t)m + 1, 4);
                mxi_nn_kernels_ref.bf16_round(a, xs, m);
                k->bf16_round(b, xs, m);
                CHECK_MEM_EQ(a, b, (size_t)m * 2 + 2);   // the element past the end is untouched too
                mxi_nn_kernels_ref.bf16_round_f32(fa, xs, m);
                k->bf16_round_f32(fb, xs, m);
                CHECK_MEM_EQ(fa, fb, (size_t)m * 4 + 4);
                for (int64_t i = 0; i <= m; i++) fa[i] = fb[i] = (float)i * 0.25f;
                mxi_nn_kernels_ref.bf16_widen(fa, a, m, 1);
                k->bf16_widen(fb, a, m, 1);
                CHECK_MEM_EQ(fa, fb, (size_t)m * 4 + 4);
                mxi_nn_kernels_ref.bf16_widen(fa, a, m, 0);
                k->bf16_widen(fb, a, m, 0);
                CHECK_MEM_EQ(fa, fb, (size_t)m * 4 + 4);
                free(a), free(b), free(fa), free(fb);
            }
        }
        report(id, before, "bf16 round, round to fp32, widen, widen-add equal to the reference");
    }
    // the threaded wrappers use the selected kernel's table and split work into chunks:
    // the same bits as one call of the reference
    int64_t m = (int64_t)n;
    uint16_t *a = malloc(n * 2), *b = malloc(n * 2);
    float *fa = malloc(n * 4), *fb = malloc(n * 4);
    mxi_nn_kernels_ref.bf16_round(a, x, m);
    mxi_nn_kernels_ref.bf16_widen(fa, a, m, 0);
    FOR_EACH_KERNEL(id) {
        if (!mx_kernel_available(id)) continue;   // said above
        CHECK_EQ_INT(mx_kernel_select(id), 0);
        CHECK(mxi_nn_kernels_active() == mxi_nn_kernels_of(id));
        memset(b, 0, n * 2);
        mxi_bf16_round(b, x, m);
        CHECK_MEM_EQ(a, b, n * 2);
        mxi_bf16_widen(fb, a, m, 0);
        CHECK_MEM_EQ(fa, fb, n * 4);
    }
    CHECK_EQ_INT(mx_kernel_select(MX_KERNEL_AUTO), 0);
    free(a), free(b), free(fa), free(fb), free(p), free(x);
}

static float *randv(size_t n, uint64_t *st, float scale) {
    float *x = malloc((n ? n : 1) * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = ((float)(mxt_lcg64(st) >> 40) / 16777216.0f - 0.5f) * scale;
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
 * length, column ranges across the weight gradient's 64- and 128-column passes): RMSNorm
 * and SwiGLU within a few fp32 ulps (other summation order, vector exp), AdamW bit for bit
 * (the same operations in the same order, no contraction). */
static void layer_kernels_vs_reference(mx_kernel id, const mxi_nn_kernels *k) {
    const mxi_nn_kernels *r = &mxi_nn_kernels_ref;
    int before = mxt_current_failures();
    static const int Cs[] = {1, 7, 8, 9, 15, 16, 17, 63, 64, 65, 127, 128, 129, 130, 255, 517};
    uint64_t st = 5;
    for (size_t ci = 0; ci < sizeof Cs / sizeof Cs[0]; ci++) {
        int C = Cs[ci];
        int64_t rows = 13;
        size_t n = (size_t)rows * C;
        float *x = randv(n, &st, 4.0f), *w = randv((size_t)C, &st, 2.0f), *dy = randv(n, &st, 3.0f);
        // the vector kernel's outputs have one more element, which it must leave alone
        float *y0 = malloc(n * 4), *y1 = malloc((n + 1) * 4), *r0 = malloc(rows * 4), *r1 = malloc(rows * 4);
        y1[n] = -7.0f;
        r->rmsnorm_forward(y0, r0, x, w, rows, C, 1e-6f);
        k->rmsnorm_forward(y1, r1, x, w, rows, C, 1e-6f);
        CHECK(worst(y1, y0, n, 1e-6, 1e-5) <= 1);
        CHECK(worst(r1, r0, (size_t)rows, 0, 1e-5) <= 1);
        r->rmsnorm_backward(y0, dy, x, w, r0, rows, C);
        k->rmsnorm_backward(y1, dy, x, w, r0, rows, C);
        CHECK(worst(y1, y0, n, 1e-5, 1e-4) <= 1);
        float *g0 = calloc((size_t)C, 4), *g1 = calloc((size_t)C + 1, 4);
        g1[C] = -7.0f;
        for (int c = 0; c < C; c++) g0[c] = g1[c] = 0.5f;   // accumulates
        r->rmsnorm_dweight(g0, dy, x, r0, rows, C, 0, C);
        k->rmsnorm_dweight(g1, dy, x, r0, rows, C, C / 3, C);   // two column ranges cover C
        k->rmsnorm_dweight(g1, dy, x, r0, rows, C, 0, C / 3);
        CHECK(worst(g1, g0, (size_t)C, 1e-5, 1e-4) <= 1);
        CHECK_EQ_DBL(g1[C], -7.0);
        // SwiGLU over gates from -20 to 20: sigmoid on both sides of 0 and near saturation
        float *gt = randv(n, &st, 40.0f), *up = randv(n, &st, 2.0f), *d0 = malloc(n * 4), *d1 = malloc((n + 1) * 4);
        d1[n] = -7.0f;
        r->swiglu_forward(y0, gt, up, (int64_t)n);
        k->swiglu_forward(y1, gt, up, (int64_t)n);
        CHECK(worst(y1, y0, n, 1e-6, 1e-5) <= 1);
        r->swiglu_backward(d0, y0, dy, gt, up, (int64_t)n);
        k->swiglu_backward(d1, y1, dy, gt, up, (int64_t)n);
        CHECK(worst(d1, d0, n, 1e-6, 1e-5) <= 1);
        CHECK(worst(y1, y0, n, 1e-6, 1e-5) <= 1);
        memcpy(y1, dy, n * 4);   // dup in dout's place (the model's d_up is its d_h): the same bits
        k->swiglu_backward(d0, y1, y1, gt, up, (int64_t)n);
        k->swiglu_backward(d1, y0, dy, gt, up, (int64_t)n);
        CHECK_MEM_EQ(y1, y0, n * 4);
        // AdamW: bit for bit
        float *wa = randv(n, &st, 1.0f), *ma = randv(n, &st, 0.1f), *va = randv(n, &st, 0.01f);
        for (size_t i = 0; i < n; i++) va[i] = fabsf(va[i]);
        float *wb = malloc((n + 1) * 4), *mb = malloc((n + 1) * 4), *vb = malloc((n + 1) * 4);
        wb[n] = mb[n] = vb[n] = -7.0f;
        memcpy(wb, wa, n * 4), memcpy(mb, ma, n * 4), memcpy(vb, va, n * 4);
        r->adamw(wa, ma, va, dy, (int64_t)n, 0.9f, 0.95f, 3e-4f, 0.3f, 1e-8f, 0.99997f);
        k->adamw(wb, mb, vb, dy, (int64_t)n, 0.9f, 0.95f, 3e-4f, 0.3f, 1e-8f, 0.99997f);
        CHECK_MEM_EQ(wa, wb, n * 4);
        CHECK_MEM_EQ(ma, mb, n * 4);
        CHECK_MEM_EQ(va, vb, n * 4);
        CHECK(y1[n] == -7.0f && d1[n] == -7.0f && wb[n] == -7.0f && mb[n] == -7.0f && vb[n] == -7.0f);
        free(x), free(w), free(dy), free(y0), free(y1), free(r0), free(r1), free(g0), free(g1), free(gt), free(up);
        free(d0), free(d1), free(wa), free(ma), free(va), free(wb), free(mb), free(vb);
    }
    report(id, before, "rmsnorm forward, backward, weight gradient, swiglu forward, backward near the reference; "
                       "adamw equal to it");
}

static void test_layer_kernels_vs_reference(void) {
    FOR_EACH_KERNEL(id) {
        if (id == MX_KERNEL_REF) continue;   // what the others are held to
        const mxi_nn_kernels *k = runnable(id);
        if (k) layer_kernels_vs_reference(id, k);
    }
}

/* RoPE, add, scale bit for bit against the reference (the same operations in the same
 * order); the sum of squares and the cross-entropy against long-double oracles, and the
 * vector kernels within a few ulps of them; odd sizes so every tail runs. */
static void test_elementwise_kernels(void) {
    const mxi_nn_kernels *r = &mxi_nn_kernels_ref;
    uint64_t st = 17;
    FOR_EACH_KERNEL(id) {
        const mxi_nn_kernels *k = runnable(id);
        if (!k) continue;
        int before = mxt_current_failures();
        static const int HDs[] = {2, 6, 16, 18, 30, 32, 34, 62, 64, 66, 130};
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
        static const int64_t lens[] = {0, 1, 7, 8, 9, 15, 16, 17, 31, 33, 257, 1000, 4099};
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
                // logits spread over +-30 (far-apart and near-equal values), targets at both ends;
                // then all of them near -200, where e^z underflows unless the maximum is taken out
                int V = (int)n;
                for (int i = 0; i < V; i++) x[i] *= 5.0f;
                for (int pass = 0; pass < 4; pass++) {
                    int target = pass % 2 ? V - 1 : 0;
                    if (pass == 2)
                        for (int i = 0; i < V; i++) x[i] -= 200.0f;
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
        report(id, before, "rope, add, scale equal to the reference; sum of squares, cross-entropy near the oracles");
    }
}

/* ---- Special values: each vector kernel propagates NaN and infinities as the reference
 * does (ops/nn_kernels.h states the contract). */

/* What a row of test values holds besides finite numbers. */
typedef enum {
    SP_FINITE,         // nothing special (the control)
    SP_NAN,            // one quiet NaN
    SP_ODD_NANS,       // a negative quiet NaN and a signalling NaN
    SP_ALL_NAN,        // every element NaN
    SP_POS_INF,        // one +Inf
    SP_NEG_INF,        // one -Inf
    SP_HALF_NEG_INF,   // every other element -Inf
    SP_ALL_NEG_INF,    // every element -Inf
    SP_NEG_INF_NAN,    // a -Inf and a NaN
    SP_INF_MIX,        // a +Inf and a -Inf
    SP_KINDS
} special_kind;

static const char *const special_names[SP_KINDS] = {
    "finite", "one NaN", "-NaN and sNaN", "all NaN", "one +Inf", "one -Inf", "half -Inf", "all -Inf",
    "-Inf and NaN", "+Inf and -Inf",
};

/* Plants kind into the n finite values of x, at index `at` where it takes one position
 * (and at n-1-at for a second one). */
static void plant(float *x, int64_t n, special_kind kind, int64_t at) {
    int64_t other = n - 1 - at;
    switch (kind) {
    case SP_FINITE: break;
    case SP_NAN: x[at] = NAN; break;
    case SP_ODD_NANS: x[at] = from_bits(0xFFC00000u), x[other] = from_bits(0x7F800001u); break;
    case SP_ALL_NAN: for (int64_t i = 0; i < n; i++) x[i] = NAN; break;
    case SP_POS_INF: x[at] = INFINITY; break;
    case SP_NEG_INF: x[at] = -INFINITY; break;
    case SP_HALF_NEG_INF: for (int64_t i = at % 2; i < n; i += 2) x[i] = -INFINITY; break;
    case SP_ALL_NEG_INF: for (int64_t i = 0; i < n; i++) x[i] = -INFINITY; break;
    case SP_NEG_INF_NAN: x[at] = -INFINITY, x[other] = NAN; break;
    case SP_INF_MIX: x[at] = INFINITY, x[other] = -INFINITY; break;
    default: break;
    }
}

/* The contract on one value: NaN exactly where the reference has NaN, the same infinity
 * where it has one, within atol + rtol |want| elsewhere. */
static bool agrees(double got, double want, double atol, double rtol) {
    if (isnan(want) || isnan(got)) return isnan(want) && isnan(got);
    if (isinf(want) || isinf(got)) return got == want;
    return fabs(got - want) <= atol + rtol * fabs(want);
}

/* agrees() over n floats; the first disagreement is reported with its context. */
static void check_agree(const float *got, const float *want, size_t n, double atol, double rtol, const char *what,
                        const char *kind, int64_t len, int line) {
    for (size_t i = 0; i < n; i++)
        if (!agrees(got[i], want[i], atol, rtol)) {
            mxt_fail(__FILE__, line, "%s, %s, n=%lld: element %zu is %.9g, the reference's %.9g", what, kind,
                     (long long)len, i, got[i], want[i]);
            return;
        }
}

/* Bit for bit, except that a NaN's sign and payload are free (which operand's NaN an
 * instruction passes on is the compiler's choice for a commutative operation). */
static void check_same(const float *got, const float *want, size_t n, const char *what, const char *kind,
                       int64_t len, int line) {
    for (size_t i = 0; i < n; i++)
        if (to_bits(got[i]) != to_bits(want[i]) && !(isnan(got[i]) && isnan(want[i]))) {
            mxt_fail(__FILE__, line, "%s, %s, n=%lld: element %zu is 0x%08X, the reference's 0x%08X", what, kind,
                     (long long)len, i, to_bits(got[i]), to_bits(want[i]));
            return;
        }
}

#define AGREE(got, want, n, atol, rtol, what) \
    check_agree(got, want, n, atol, rtol, what, special_names[kind], len, __LINE__)
#define SAME(got, want, n, what) check_same(got, want, n, what, special_names[kind], len, __LINE__)

/* The reference's cross-entropy on special logits, by what the formula must give: a NaN,
 * a +Inf or only -Infs make the loss and every gradient NaN (max - max, as PyTorch); a
 * -Inf logit elsewhere gets probability 0 and gradient exactly 0; a -Inf target logit
 * makes the loss +Inf. */
static void check_ce_semantics(const float *x, int64_t V, int target, double loss, const float *dz, special_kind kind,
                               int64_t len) {
    bool nan_or_inf = false, finite_any = false;
    for (int64_t i = 0; i < V; i++) nan_or_inf |= isnan(x[i]) || x[i] == INFINITY, finite_any |= isfinite(x[i]);
    if (nan_or_inf || !finite_any) {
        if (!isnan(loss))
            mxt_fail(__FILE__, __LINE__, "cross-entropy, %s, V=%lld: loss %.9g, want NaN", special_names[kind],
                     (long long)len, loss);
        for (int64_t i = 0; i < V; i++)
            if (!isnan(dz[i])) {
                mxt_fail(__FILE__, __LINE__, "cross-entropy, %s, V=%lld: dz[%lld] = %.9g, want NaN", special_names[kind],
                         (long long)len, (long long)i, dz[i]);
                break;
            }
        return;
    }
    if (x[target] == -INFINITY) CHECK_EQ_DBL(loss, INFINITY);
    else CHECK(isfinite(loss));
    for (int64_t i = 0; i < V; i++)
        if (i != target && x[i] == -INFINITY) CHECK_EQ_DBL(dz[i], 0.0);
}

/* Every kernel on rows holding each special kind at the start, middle and end, over odd
 * lengths (every tail path): the reference against what the formulas give, the vector
 * kernels against the reference by the contract; AdamW, RoPE, add and scale bit for bit
 * but for NaN payloads. */
static void special_values(mx_kernel id, const mxi_nn_kernels *k) {
    const mxi_nn_kernels *r = &mxi_nn_kernels_ref;
    int before = mxt_current_failures();
    static const int64_t lens[] = {1, 2, 7, 8, 9, 15, 16, 17, 31, 33, 100};
    uint64_t st = 23;
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
        int64_t len = lens[li], n = len;
        for (int kind = 0; kind < SP_KINDS; kind++)
            for (int pos = 0; pos < 3; pos++) {
                int64_t at = pos == 0 ? 0 : pos == 1 ? n / 2 : n - 1;
                float *x = randv((size_t)n, &st, 12.0f), *y = randv((size_t)n, &st, 3.0f);
                plant(x, n, (special_kind)kind, at);
                // cross-entropy: targets at both ends and on the special value
                int targets[3] = {0, (int)n - 1, (int)at};
                for (int ti = 0; ti < 3; ti++) {
                    float *dz0 = malloc((size_t)n * 4), *dz1 = malloc((size_t)n * 4);
                    double l0 = r->cross_entropy(dz0, x, (int)n, targets[ti], 0.5f);
                    double l1 = k->cross_entropy(dz1, x, (int)n, targets[ti], 0.5f);
                    double l2 = k->cross_entropy(NULL, x, (int)n, targets[ti], 0.5f);
                    if (id == MX_KERNEL_REF) check_ce_semantics(x, n, targets[ti], l0, dz0, (special_kind)kind, len);
                    if (!agrees(l1, l0, 1e-6, 1e-6) || !agrees(l2, l0, 1e-6, 1e-6))
                        mxt_fail(__FILE__, __LINE__, "cross-entropy, %s, V=%lld, target %d: loss %.9g (no dz: %.9g), "
                                 "the reference's %.9g", special_names[kind], (long long)n, targets[ti], l1, l2, l0);
                    AGREE(dz1, dz0, (size_t)n, 1e-6, 1e-5, "cross-entropy dz");
                    free(dz0), free(dz1);
                }
                // RMSNorm: the special row between two finite ones, as input and as gradient
                {
                    int C = (int)n;
                    int64_t rows = 3;
                    size_t m = (size_t)rows * C;
                    float *xs = randv(m, &st, 4.0f), *w = randv((size_t)C, &st, 2.0f), *dy = randv(m, &st, 3.0f);
                    memcpy(xs + C, x, (size_t)C * 4);
                    float *y0 = malloc(m * 4), *y1 = malloc(m * 4), *r0 = malloc(rows * 4), *r1 = malloc(rows * 4);
                    r->rmsnorm_forward(y0, r0, xs, w, rows, C, 1e-6f);
                    k->rmsnorm_forward(y1, r1, xs, w, rows, C, 1e-6f);
                    AGREE(y1, y0, m, 1e-6, 1e-5, "rmsnorm forward");
                    AGREE(r1, r0, (size_t)rows, 0, 1e-5, "rmsnorm rstd");
                    for (int pass = 0; pass < 2; pass++) {   // special x (and rstd), then special dy
                        float *xi = xs, *dyi = dy;
                        if (pass) {
                            xi = randv(m, &st, 4.0f), dyi = xs;
                            r->rmsnorm_forward(y0, r0, xi, w, rows, C, 1e-6f);
                        }
                        r->rmsnorm_backward(y0, dyi, xi, w, r0, rows, C);
                        k->rmsnorm_backward(y1, dyi, xi, w, r0, rows, C);
                        AGREE(y1, y0, m, 1e-5, 1e-4, "rmsnorm backward");
                        float *g0 = calloc((size_t)C, 4), *g1 = calloc((size_t)C, 4);
                        r->rmsnorm_dweight(g0, dyi, xi, r0, rows, C, 0, C);
                        k->rmsnorm_dweight(g1, dyi, xi, r0, rows, C, 0, C);
                        AGREE(g1, g0, (size_t)C, 1e-5, 1e-4, "rmsnorm weight gradient");
                        free(g0), free(g1);
                        if (pass) free(xi);
                    }
                    free(xs), free(w), free(dy), free(y0), free(y1), free(r0), free(r1);
                }
                // SwiGLU: the special values as gate, then as up and as the gradient
                {
                    float *o0 = malloc((size_t)n * 4), *o1 = malloc((size_t)n * 4), *d0 = malloc((size_t)n * 4),
                          *d1 = malloc((size_t)n * 4), *g = randv((size_t)n, &st, 40.0f);
                    const float *gate[3] = {x, g, g}, *up[3] = {y, x, y}, *dout[3] = {y, y, x};
                    for (int c = 0; c < 3; c++) {
                        r->swiglu_forward(o0, gate[c], up[c], n);
                        k->swiglu_forward(o1, gate[c], up[c], n);
                        AGREE(o1, o0, (size_t)n, 1e-6, 1e-5, "swiglu forward");
                        r->swiglu_backward(d0, o0, dout[c], gate[c], up[c], n);
                        k->swiglu_backward(d1, o1, dout[c], gate[c], up[c], n);
                        AGREE(d1, d0, (size_t)n, 1e-6, 1e-5, "swiglu dgate");
                        AGREE(o1, o0, (size_t)n, 1e-6, 1e-5, "swiglu dup");
                    }
                    free(o0), free(o1), free(d0), free(d1), free(g);
                }
                // AdamW: the special values as gradient, first moment, second moment (a
                // negative one too: a flipped sign bit) and weight
                for (int slot = 0; slot < 5; slot++) {
                    float *st4[2][4];   // w, m, v, g of the reference's run and the kernel's
                    float *base[4] = {randv((size_t)n, &st, 1.0f), randv((size_t)n, &st, 0.1f),
                                      randv((size_t)n, &st, 0.01f), randv((size_t)n, &st, 2.0f)};
                    for (int64_t i = 0; i < n; i++) base[2][i] = fabsf(base[2][i]);
                    int into = slot < 4 ? slot : 2;
                    for (int64_t i = 0; i < n; i++)
                        base[into][i] = slot == 4 ? -fabsf(base[into][i]) : x[i];   // slot 4: v < 0 everywhere
                    if (slot == 4) base[into][at] = from_bits(to_bits(fabsf(x[at])) | 0x80000000u);
                    for (int s = 0; s < 2; s++)
                        for (int j = 0; j < 4; j++)
                            st4[s][j] = malloc((size_t)n * 4), memcpy(st4[s][j], base[j], (size_t)n * 4);
                    r->adamw(st4[0][0], st4[0][1], st4[0][2], st4[0][3], n, 0.9f, 0.95f, 3e-4f, 0.3f, 1e-8f, 0.99997f);
                    k->adamw(st4[1][0], st4[1][1], st4[1][2], st4[1][3], n, 0.9f, 0.95f, 3e-4f, 0.3f, 1e-8f, 0.99997f);
                    SAME(st4[1][0], st4[0][0], (size_t)n, "adamw weight");
                    SAME(st4[1][1], st4[0][1], (size_t)n, "adamw first moment");
                    SAME(st4[1][2], st4[0][2], (size_t)n, "adamw second moment");
                    for (int s = 0; s < 2; s++)
                        for (int j = 0; j < 4; j++) free(st4[s][j]);
                    for (int j = 0; j < 4; j++) free(base[j]);
                }
                // RoPE (the special values as one head's row, or as the angles), add, scale
                if (n % 2 == 0) {
                    int HD = (int)n, H = 2, half = HD / 2;
                    float *row0 = randv((size_t)H * HD, &st, 4.0f), *row1 = malloc((size_t)H * HD * 4);
                    float *cs = randv((size_t)half, &st, 2.0f), *sn = randv((size_t)half, &st, 2.0f);
                    memcpy(row0 + HD, x, (size_t)HD * 4);
                    memcpy(row1, row0, (size_t)H * HD * 4);
                    r->rope(row0, cs, sn, H, HD, 1.0f);
                    k->rope(row1, cs, sn, H, HD, 1.0f);
                    SAME(row1, row0, (size_t)H * HD, "rope");
                    r->rope(row0, x, x + half, H, HD, -1.0f);
                    k->rope(row1, x, x + half, H, HD, -1.0f);
                    SAME(row1, row0, (size_t)H * HD, "rope, special angles");
                    free(row0), free(row1), free(cs), free(sn);
                }
                {
                    float *a = malloc((size_t)n * 4), *b = malloc((size_t)n * 4);
                    memcpy(a, y, (size_t)n * 4), memcpy(b, y, (size_t)n * 4);
                    r->add(a, x, n), k->add(b, x, n);
                    SAME(b, a, (size_t)n, "add");
                    memcpy(a, x, (size_t)n * 4), memcpy(b, x, (size_t)n * 4);
                    r->add(a, y, n), k->add(b, y, n);
                    SAME(b, a, (size_t)n, "add to special");
                    memcpy(a, x, (size_t)n * 4), memcpy(b, x, (size_t)n * 4);
                    r->scale(a, n, 0.37f), k->scale(b, n, 0.37f);
                    SAME(b, a, (size_t)n, "scale");
                    memcpy(a, y, (size_t)n * 4), memcpy(b, y, (size_t)n * 4);
                    r->scale(a, n, x[at]), k->scale(b, n, x[at]);
                    SAME(b, a, (size_t)n, "scale by a special factor");
                    double s0 = r->sum_squares(x, n), s1 = k->sum_squares(x, n);
                    if (!agrees(s1, s0, 0, 1e-14))
                        mxt_fail(__FILE__, __LINE__, "sum of squares, %s, n=%lld: %.17g, the reference's %.17g",
                                 special_names[kind], (long long)n, s1, s0);
                    free(a), free(b);
                }
                free(x), free(y);
            }
    }
    report(id, before, "NaN, +-Inf, all-NaN and all -Inf rows: cross-entropy, rmsnorm, swiglu, adamw, rope, add, "
                       "scale, sum of squares as the reference");
}

static void test_special_values(void) {
    FOR_EACH_KERNEL(id) {
        const mxi_nn_kernels *k = runnable(id);
        if (k) special_values(id, k);
    }
}

/* Decoding attention (attend) against softmax(q k^T scale) v in long double: keys and
 * values strided as in a KV cache, head dims with tails, one position to many, and scores
 * of hundreds (e^z overflows unless the maximum is taken out). */
static void test_attend(void) {
    uint64_t st = 23;
    FOR_EACH_KERNEL(id) {
        const mxi_nn_kernels *k = runnable(id);
        if (!k) continue;
        int before = mxt_current_failures();
        static const int HDs[] = {2, 8, 16, 18, 64, 130};
        static const int64_t ts[] = {1, 2, 7, 33, 200};
        for (size_t hi = 0; hi < sizeof HDs / sizeof HDs[0]; hi++)
            for (size_t ti = 0; ti < sizeof ts / sizeof ts[0]; ti++)
                for (int big = 0; big < 2; big++) {
                    int HD = HDs[hi];
                    int64_t t = ts[ti], ld = 3 * HD + 1;
                    float *q = randv((size_t)HD, &st, big ? 30.0f : 1.0f), *kc = randv((size_t)(t * ld), &st, 1.0f);
                    float *vc = randv((size_t)(t * ld), &st, 2.0f), *out = malloc((size_t)HD * 4), *p = malloc((size_t)t * 4);
                    float scale = 1.0f / sqrtf((float)HD);
                    k->attend(out, p, q, kc, vc, t, ld, HD, scale);
                    long double *z = malloc((size_t)t * sizeof *z), mx = -INFINITY, sum = 0;
                    for (int64_t s = 0; s < t; s++) {
                        z[s] = 0;
                        for (int i = 0; i < HD; i++) z[s] += (long double)q[i] * kc[s * ld + i];
                        z[s] *= scale;
                        if (z[s] > mx) mx = z[s];
                    }
                    for (int64_t s = 0; s < t; s++) sum += expl(z[s] - mx);
                    double bad = 0;
                    for (int i = 0; i < HD; i++) {
                        long double w = 0;
                        for (int64_t s = 0; s < t; s++) w += expl(z[s] - mx) / sum * vc[s * ld + i];
                        double e = fabs((double)(out[i] - w));
                        if (!(e <= bad)) bad = e;
                    }
                    // fp32 scores of |z| up to hundreds: their rounding moves the weights by ~1e-4 relative
                    CHECK_NEAR(bad, 0, big ? 2e-3 : 2e-5);
                    free(q), free(kc), free(vc), free(out), free(p), free(z);
                }
        report(id, before, "attend near the oracle");
    }
}

/* One bundle per kernel, named like it, that every family's accessor points into; AUTO is
 * the active kernel's; a slot left NULL runs the reference's function, the others stay. */
static void test_bundles(void) {
    FOR_EACH_KERNEL(id) {
        const mxi_kernels *b = mxi_kernels_of(id);
        CHECK(b != NULL);
        if (!b) continue;
        CHECK_STR_EQ(b->mx.name, mx_kernel_name(id));
        CHECK_STR_EQ(b->ops.name, mx_kernel_name(id));
        CHECK_STR_EQ(b->nn.name, mx_kernel_name(id));
        CHECK(mxi_mx_kernels_of(id)->quantize_rows == b->mx.quantize_rows);   // numerics' own lookup, the same table
        CHECK(mxi_ops_kernels_of(id) == &b->ops);
        CHECK(mxi_nn_kernels_of(id) == &b->nn);
    }
    CHECK(mxi_kernels_of(MX_KERNEL_AUTO) == mxi_kernels_of(mx_kernel_active()));
    CHECK(mxi_nn_kernels_active() == &mxi_kernels_of(mx_kernel_active())->nn);
    CHECK(mxi_ops_kernels_active() == &mxi_kernels_of(mx_kernel_active())->ops);
    CHECK(mxi_kernels_of((mx_kernel)99) == NULL);
    CHECK(mxi_nn_kernels_of((mx_kernel)-1) == NULL);

    mx_kernel last = MX_KERNEL_REF;
    FOR_EACH_KERNEL(id) last = id;
    mxi_kernels b = *mxi_kernels_of(last);
    b.mx.quantize_rows = NULL;
    b.ops.widen_bf16 = NULL;
    b.nn.adamw = NULL;
    b.nn.cross_entropy = NULL;
    mxi_kernels_fill(&b);
    const mxi_kernels *full = mxi_kernels_of(last);
    CHECK(b.mx.quantize_rows == mxi_mx_kernels_ref.quantize_rows);
    CHECK(b.ops.widen_bf16 == mxi_ops_kernels_ref.widen_bf16);
    CHECK(b.nn.adamw == mxi_nn_kernels_ref.adamw);
    CHECK(b.nn.cross_entropy == mxi_nn_kernels_ref.cross_entropy);
    CHECK(b.ops.dequant_rows == full->ops.dequant_rows);
    CHECK(b.nn.rope == full->nn.rope);
    CHECK(b.nn.att_probs == full->nn.att_probs);
    printf("  bundles of %s..%s checked; NULL slots of %s filled from the reference\n", mx_kernel_name(MX_KERNEL_REF),
           mx_kernel_name(last), mx_kernel_name(last));
}

int main(int argc, char **argv) {
    static const mxt_test tests[] = {
        {"bf16_reference_vs_oracle", test_bf16_reference_vs_oracle},
        {"bf16_kernels_vs_reference", test_bf16_kernels_vs_reference},
        {"layer_kernels_vs_reference", test_layer_kernels_vs_reference},
        {"elementwise_kernels", test_elementwise_kernels},
        {"special_values", test_special_values},
        {"attend", test_attend},
        {"bundles", test_bundles},
    };
    return MXT_RUN(tests, argc, argv);
}
