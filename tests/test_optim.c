/* AdamW against torch.optim.AdamW; the learning-rate schedule against values worked out by
 * hand; gradient-norm helpers against plain sums. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "mxtrain/mx.h"
#include "train/optim.h"

enum { N = 1000, STEPS = 5 };

static void test_adamw_matches_torch(void) {
    char dir[] = "/tmp/mxtrain-adamw-XXXXXX";
    if (!mkdtemp(dir)) {
        mxt_fail(__FILE__, __LINE__, "mkdtemp failed");
        return;
    }
    static float w0[N], grads[STEPS][N], lrs[STEPS] = {1e-3f, 2e-3f, 3e-3f, 1.5e-3f, 1e-4f};
    uint64_t s = 42;
    for (int i = 0; i < N; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        w0[i] = (float)((double)(s >> 11) / 9007199254740992.0 - 0.5);
        for (int t = 0; t < STEPS; t++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            grads[t][i] = (float)(((double)(s >> 11) / 9007199254740992.0 - 0.5) * (t + 1) * (i % 7 ? 1 : 1e-4));
        }
    }
    char path[256];
    FILE *f;
    snprintf(path, sizeof path, "%s/w0.bin", dir), f = fopen(path, "wb"), fwrite(w0, 4, N, f), fclose(f);
    snprintf(path, sizeof path, "%s/grads.bin", dir), f = fopen(path, "wb"), fwrite(grads, 4, N * STEPS, f), fclose(f);
    snprintf(path, sizeof path, "%s/lrs.bin", dir), f = fopen(path, "wb"), fwrite(lrs, 4, STEPS, f), fclose(f);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "tests/py/oracle %s tests/py/adamw_ref.py %s %d", dir, dir, N);
    CHECK_EQ_INT(system(cmd), 0);
    for (int decay = 0; decay < 2; decay++) {
        static float want[STEPS][N], w[N], m[N], v[N];
        snprintf(path, sizeof path, "%s/w_decay%d.bin", dir, decay);
        f = fopen(path, "rb");
        size_t got = f ? fread(want, 4, N * STEPS, f) : 0;
        if (f) fclose(f);
        CHECK_EQ_INT(got, N * STEPS);
        memcpy(w, w0, sizeof w);
        memset(m, 0, sizeof m), memset(v, 0, sizeof v);
        for (int t = 0; t < STEPS; t++) {
            adamw_step st = {lrs[t], 0.9f, 0.95f, 1e-8f, 0.1f, t + 1};
            mxi_adamw_update(w, m, v, grads[t], N, &st, decay);
            double err = 0;
            for (int i = 0; i < N; i++) err = fmax(err, fabs((double)w[i] - want[t][i]) / (fabs(want[t][i]) + 1e-3));
            if (!(err < 1e-5)) mxt_fail(__FILE__, __LINE__, "decay %d step %d: max relative error %.3g", decay, t + 1, err);
        }
    }
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK_EQ_INT(system(cmd), 0);
}

/* One corrupted element of the optimizer state or gradient stays in its own weight, with
 * every kernel (mxi_adamw_update runs the selected one), as in torch.optim.AdamW: a flipped
 * sign bit in exp_avg_sq (v < 0: sqrt(v) is NaN), a NaN or infinite gradient, moment or
 * weight make that weight NaN or infinite; every other weight is the reference kernel's,
 * bit for bit. */
static void test_adamw_special_values(void) {
    enum { M = 67 };
    float w0[M], m0[M], v0[M], g0[M], want[M];
    for (int i = 0; i < M; i++)
        w0[i] = 0.01f * (i - 30), m0[i] = 1e-3f * (i % 7), v0[i] = 1e-6f * (1 + i % 5), g0[i] = 0.02f * (i % 11 - 5);
    struct { float *slot; int at; float value, w_after; } cases[] = {
        {v0, 3, -1.0f, NAN},               // exp_avg_sq with its sign bit flipped
        {g0, 9, NAN, NAN}, {g0, 17, INFINITY, NAN},   // inf / sqrt(inf) is inf / inf
        {m0, 33, NAN, NAN}, {m0, 40, INFINITY, -INFINITY}, {v0, 41, INFINITY, w0[41] * (1 - 1e-3f * 0.1f)},
        {w0, 50, NAN, NAN}, {w0, 66, -INFINITY, -INFINITY},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) cases[c].slot[cases[c].at] = cases[c].value;
    adamw_step st = {1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 7};
    for (mx_kernel k = MX_KERNEL_REF; mx_kernel_name(k); k = (mx_kernel)(k + 1)) {
        if (mx_kernel_select(k) != 0) {
            printf("  kernel %s: not run (%s)\n", mx_kernel_name(k), mx_kernel_missing(k));
            continue;
        }
        float w[M], m[M], v[M];
        memcpy(w, w0, sizeof w), memcpy(m, m0, sizeof m), memcpy(v, v0, sizeof v);
        mxi_adamw_update(w, m, v, g0, M, &st, 1);
        if (k == MX_KERNEL_REF) memcpy(want, w, sizeof want);
        int before = mxt_current_failures();
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            float got = w[cases[c].at], wa = cases[c].w_after;
            if (isnan(wa) ? !isnan(got) : isinf(wa) ? got != wa : !(isfinite(got) && fabsf(got - wa) < 1e-6f))
                mxt_fail(__FILE__, __LINE__, "kernel %s, case %zu: weight %d is %.9g, want %.9g", mx_kernel_name(k), c,
                         cases[c].at, got, wa);
        }
        for (int i = 0; i < M; i++)
            if (isfinite(want[i]) && memcmp(&w[i], &want[i], 4) != 0) {
                mxt_fail(__FILE__, __LINE__, "kernel %s: weight %d is %.9g, the reference's %.9g", mx_kernel_name(k), i,
                         w[i], want[i]);
                break;
            }
        printf("  kernel %s: %scorrupted elements stay in their own weights\n", mx_kernel_name(k),
               mxt_current_failures() > before ? "FAILED: " : "");
    }
    mx_kernel_select(MX_KERNEL_AUTO);
}

/* The schedule as Megatron-LM and Hugging Face define it, written out independently: update
 * k (1-based) of n with w warmup updates runs at lr k / w while k <= w, else at the decay
 * after k - 1 completed updates. */
static double want_lr(int k, int n, int w, double lr, double min_lr, mx_lr_decay style) {
    if (k <= w) return lr * k / w;
    if (style == MX_LR_CONSTANT) return lr;
    double p = (double)(k - 1 - w) / (n - w);
    if (style == MX_LR_LINEAR) return min_lr + (lr - min_lr) * (1 - p);
    return min_lr + (lr - min_lr) * 0.5 * (1 + cos(3.141592653589793 * p));
}

/* The schedule of a config's keys, as the trainer takes it. warmup_iters -1: from the ratio. */
static float lr_cfg(int64_t k, int n, float lr, float min_lr, double ratio, int warmup_iters, int decay_iters,
                    mx_lr_decay style, mx_wsd_decay wsd_style, int wsd_iters) {
    mx_training_config tc = {0};
    tc.train_iters = n, tc.lr = lr, tc.min_lr = min_lr, tc.lr_warmup_ratio = ratio, tc.lr_warmup_iters = warmup_iters;
    tc.lr_decay_iters = decay_iters, tc.lr_decay_style = style, tc.lr_wsd_decay_style = wsd_style;
    tc.lr_wsd_decay_iters = wsd_iters;
    lr_schedule s = mxi_lr_schedule_of(&tc);
    return mxi_lr_at(&s, k);
}
static float lr_of(int64_t k, int n, float lr, float min_lr, double ratio, mx_lr_decay style) {
    return lr_cfg(k, n, lr, min_lr, ratio, -1, 0, style, MX_WSD_EXPONENTIAL, 0);
}

/* Megatron-LM's WSD and lr_decay_iters, written out independently: after warmup, n = k - 1
 * completed updates; past D min_lr; WSD at lr until n = D - S, then the anneal over S. */
static double want_megatron(int k, int w, int d, int s, double lr, double min_lr, mx_lr_decay style,
                            mx_wsd_decay wsd) {
    int n = k - 1;
    if (k <= w) return lr * k / w;
    if (style == MX_LR_CONSTANT) return lr;
    if (n > d) return min_lr;
    double coeff;
    if (style == MX_LR_WSD) {
        if (n <= d - s) {
            coeff = 1;
        } else {
            double r = (double)(n - (d - s)) / s;
            coeff = wsd == MX_WSD_LINEAR ? 1 - r : wsd == MX_WSD_COSINE ? 0.5 * (cos(3.141592653589793 * r) + 1)
                    : wsd == MX_WSD_MINUS_SQRT ? 1 - sqrt(r) : 2 * pow(0.5, r) - 1;
        }
    } else {
        double p = (double)(n - w) / (d - w);
        coeff = style == MX_LR_LINEAR ? 1 - p : 0.5 * (cos(3.141592653589793 * p) + 1);
    }
    return min_lr + coeff * (lr - min_lr);
}

static void test_lr_wsd_and_decay_iters(void) {
    // hand-worked WSD points: D 100 = train_iters, 10 warmup, an anneal of 20, lr 1 -> 0
    static const double half[4] = {0.41421356237309503 /* 2 sqrt(1/2) - 1 */, 0.5, 0.5, 0.29289321881345254};
    for (int st = 0; st < 4; st++) {
        CHECK_NEAR(lr_cfg(5, 100, 1.0f, 0.0f, 0, 10, 0, MX_LR_WSD, (mx_wsd_decay)st, 20), 0.5, 1e-7);   // warmup
        CHECK_NEAR(lr_cfg(11, 100, 1.0f, 0.0f, 0, 10, 0, MX_LR_WSD, (mx_wsd_decay)st, 20), 1.0, 1e-7);  // stable
        CHECK_NEAR(lr_cfg(81, 100, 1.0f, 0.0f, 0, 10, 0, MX_LR_WSD, (mx_wsd_decay)st, 20), 1.0, 1e-7);  // anneal: r 0
        CHECK_NEAR(lr_cfg(91, 100, 1.0f, 0.0f, 0, 10, 0, MX_LR_WSD, (mx_wsd_decay)st, 20), half[st], 1e-6);
    }
    // lr_decay_iters 50 of 100 steps: warmup 10% of D (5 updates), min_lr from update 51 on
    CHECK_NEAR(lr_cfg(5, 100, 1.0f, 0.1f, 0.1, -1, 50, MX_LR_LINEAR, MX_WSD_EXPONENTIAL, 0), 1.0, 1e-7);
    CHECK_NEAR(lr_cfg(6, 100, 1.0f, 0.1f, 0.1, -1, 50, MX_LR_LINEAR, MX_WSD_EXPONENTIAL, 0), 1.0, 1e-7);
    CHECK_NEAR(lr_cfg(24, 100, 1.0f, 0.1f, 0.1, -1, 50, MX_LR_LINEAR, MX_WSD_EXPONENTIAL, 0), 0.64, 1e-6);   // p 0.4
    CHECK_NEAR(lr_cfg(51, 100, 1.0f, 0.1f, 0.1, -1, 50, MX_LR_COSINE, MX_WSD_EXPONENTIAL, 0), 0.1, 1e-7);
    CHECK_NEAR(lr_cfg(100, 100, 1.0f, 0.1f, 0.1, -1, 50, MX_LR_COSINE, MX_WSD_EXPONENTIAL, 0), 0.1, 1e-7);
    CHECK_NEAR(lr_cfg(100, 100, 1.0f, 0.1f, 0.1, -1, 50, MX_LR_CONSTANT, MX_WSD_EXPONENTIAL, 0), 1.0, 1e-7);
    // lr_decay_iters past train_iters: the run ends part-way down
    CHECK_NEAR(lr_cfg(101, 100, 1.0f, 0.0f, 0, 0, 200, MX_LR_LINEAR, MX_WSD_EXPONENTIAL, 0), 0.5, 1e-7);
    // every update of several schedules against Megatron's formulas
    static const struct { int n, w, d, s; } runs[] = {{1, 0, 0, 1}, {10, 3, 0, 7}, {10, 0, 4, 1}, {37, 5, 30, 25},
                                                      {100, 10, 150, 40}, {1000, 50, 800, 100}};
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++)
        for (int style = 0; style < 4; style++)
            for (int wsd = 0; wsd < (style == MX_LR_WSD ? 4 : 1); wsd++) {
                int n = runs[r].n, d = runs[r].d ? runs[r].d : n;
                double worst = 0;
                for (int k = 1; k <= n; k++) {
                    double got = lr_cfg(k, n, 3e-3f, 3e-4f, 0, runs[r].w, runs[r].d, (mx_lr_decay)style,
                                        (mx_wsd_decay)wsd, runs[r].s);
                    double want = want_megatron(k, runs[r].w, d, runs[r].s, (double)3e-3f, (double)3e-4f,
                                                (mx_lr_decay)style, (mx_wsd_decay)wsd);
                    worst = fmax(worst, fabs(got - want) / want);
                }
                if (!(worst < 1e-6))
                    mxt_fail(__FILE__, __LINE__, "n %d w %d d %d s %d style %d wsd %d: relative error %.3g", n,
                             runs[r].w, d, runs[r].s, style, wsd, worst);
            }
}

static void test_lr_schedule(void) {
    // hand-worked points: 100 updates, 10 of warmup, lr 1 -> 0.1
    CHECK_NEAR(lr_of(1, 100, 1.0f, 0.1f, 0.1f, MX_LR_COSINE), 0.1, 1e-7);    // the first update is not at 0
    CHECK_NEAR(lr_of(10, 100, 1.0f, 0.1f, 0.1f, MX_LR_COSINE), 1.0, 1e-7);
    CHECK_NEAR(lr_of(11, 100, 1.0f, 0.1f, 0.1f, MX_LR_COSINE), 1.0, 1e-7);   // decay progress 0
    CHECK_NEAR(lr_of(56, 100, 1.0f, 0.1f, 0.1f, MX_LR_COSINE), 0.55, 1e-6);  // progress 1/2: cos = 0
    CHECK_NEAR(lr_of(56, 100, 1.0f, 0.1f, 0.1f, MX_LR_LINEAR), 0.55, 1e-6);
    // the last update runs one step before the end of the decay, not at min_lr
    CHECK_NEAR(lr_of(100, 100, 1.0f, 0.0f, 0.1f, MX_LR_LINEAR), 1.0 / 90, 1e-7);
    CHECK_NEAR(lr_of(70, 100, 2.0f, 0.0f, 0.1f, MX_LR_CONSTANT), 2.0, 1e-7);
    // no warmup: update 1 runs at lr, update 10 of 10 at lr * (1 - 9/10)
    CHECK_NEAR(lr_of(1, 10, 3e-4f, 0.0f, 0.0f, MX_LR_LINEAR), 3e-4, 1e-10);
    CHECK_NEAR(lr_of(1, 10, 3e-4f, 0.0f, 0.0f, MX_LR_COSINE), 3e-4, 1e-10);
    CHECK_NEAR(lr_of(10, 10, 3e-4f, 0.0f, 0.0f, MX_LR_LINEAR), 3e-5, 1e-10);
    // a one-update run trains at lr, with or without warmup, in every style
    for (int style = 0; style < 3; style++) {
        CHECK_NEAR(lr_of(1, 1, 3e-4f, 1e-5f, 0.0f, (mx_lr_decay)style), 3e-4, 1e-10);
        CHECK_NEAR(lr_of(1, 1, 3e-4f, 1e-5f, 1.0f, (mx_lr_decay)style), 3e-4, 1e-10);
    }
    // every update of several schedules against the formula above (warmup rounded from the ratio)
    static const struct { int n; double ratio; } runs[] = {{1, 0}, {2, 0.5}, {7, 0.3}, {10, 0}, {10, 1}, {37, 0.05},
                                                           {1000, 0.05}};
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++)
        for (int style = 0; style < 3; style++) {
            int n = runs[r].n, w = (int)llround(runs[r].ratio * n);
            double worst = 0;
            for (int k = 1; k <= n; k++) {
                double got = lr_of(k, n, 3e-3f, 3e-4f, (float)runs[r].ratio, (mx_lr_decay)style);
                double want = want_lr(k, n, w, (double)3e-3f, (double)3e-4f, (mx_lr_decay)style);
                worst = fmax(worst, fabs(got - want) / want);
            }
            if (!(worst < 1e-6))
                mxt_fail(__FILE__, __LINE__, "n %d warmup %d style %d: relative error %.3g", n, w, style, worst);
        }
}

static void test_norm_helpers(void) {
    float x[5] = {3, -4, 0, 1e-20f, 12};
    CHECK_NEAR(mxi_sum_squares(x, 5), 169.0, 1e-9);
    mxi_scale_inplace(x, 5, 0.5f);
    CHECK_EQ_DBL(x[0], 1.5);
    CHECK_EQ_DBL(x[1], -2.0);
}

static const mxt_test tests[] = {
    {"adamw_matches_torch", test_adamw_matches_torch},
    {"adamw_special_values", test_adamw_special_values},
    {"lr_schedule", test_lr_schedule},
    {"lr_wsd_and_decay_iters", test_lr_wsd_and_decay_iters},
    {"norm_helpers", test_norm_helpers},
};

int main(int argc, char **argv) { return MXT_RUN(tests, argc, argv); }
