/* Quantization statistics (src/model/quant_stats.c) against an oracle written from the
 * definitions in docs/training.md#quantization-statistics: codes decoded from their bit
 * fields, sums in long double, the clamp thresholds as constants. */
#include <math.h>
#include <stdlib.h>

#include "harness.h"
#include "model/quant_stats.h"
#include "mxtrain/mx.h"

static long double e4m3(uint8_t c) {
    int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
    if (e == 15 && m == 7) return NAN;
    long double v = e == 0 ? ldexpl(m / 8.0L, -6) : ldexpl(1 + m / 8.0L, e - 7);
    return s ? -v : v;
}

static long double e5m2(uint8_t c) {
    int s = c >> 7, e = (c >> 2) & 31, m = c & 3;
    if (e == 31) return m ? NAN : s ? -INFINITY : INFINITY;
    long double v = e == 0 ? ldexpl(m / 4.0L, -14) : ldexpl(1 + m / 4.0L, e - 15);
    return s ? -v : v;
}

typedef struct {
    long double numel, nonfinite, under, over, signal, error, smin, smax;
} oracle;

/* The figures of x (rows, cols) with codes q, each element's dequantization scale from sc(r, c). */
static oracle measure(const float *x, const uint8_t *q, int rows, int cols, mx_elem elem, const long double *scale_of) {
    oracle o = {.smin = INFINITY, .smax = -INFINITY};
    long double clamp = elem == MX_E4M3 ? 464.0L : 61440.0L;
    for (int i = 0; i < rows * cols; i++) {
        long double v = x[i], s = scale_of[i], dq = (elem == MX_E4M3 ? e4m3(q[i]) : e5m2(q[i])) * s;
        o.numel++;
        if (!isfinite(v) || !isfinite(dq)) {
            o.nonfinite++;
            continue;
        }
        o.under += v != 0 && dq == 0;
        o.over += fabsl(v) / s > clamp;
        o.signal += v * v;
        o.error += (v - dq) * (v - dq);
    }
    return o;
}

static void fold_scale(oracle *o, long double s) {
    if (!isfinite(s)) return;
    if (s < o->smin) o->smin = s;
    if (s > o->smax) o->smax = s;
}

static void check_same(const mxi_qs_acc *a, const oracle *o) {
    CHECK_EQ_DBL(a->numel, (double)o->numel);
    CHECK_EQ_DBL(a->nonfinite, (double)o->nonfinite);
    CHECK_EQ_DBL(a->underflows, (double)o->under);
    CHECK_EQ_DBL(a->overflows, (double)o->over);
    CHECK_NEAR(a->signal, (double)o->signal, 1e-12 * (double)o->signal);
    CHECK_NEAR(a->error, (double)o->error, 1e-12 * (double)o->error);
    CHECK_EQ_DBL(a->scale_min, (double)o->smin);
    CHECK_EQ_DBL(a->scale_max, (double)o->smax);
}

/* Known values, one scale of 1: a zero, an underflow, saturations, the edge of the clamp, a
 * NaN; counted by hand. */
static void test_known(void) {
    const float x[] = {0.0f, 1e-6f, 500.0f, -470.0f, 448.0f, 464.0f, NAN, 3.0f, INFINITY, -0.0005f};
    enum { N = sizeof x / sizeof x[0] };
    uint8_t q[N];
    for (int i = 0; i < N; i++) q[i] = mx_f32_to_fp8(x[i], MX_E4M3);
    float one = 1.0f;
    mxi_qs_operand op = {.q = q, .rows = 1, .cols = N, .elem = MX_E4M3, .scaling = MXI_QS_TENSOR, .scale = &one};
    mxi_qs_acc a = mxi_qs_acc_empty();
    mxi_qs_measure(&a, x, &op);
    CHECK_EQ_DBL(a.numel, 10);
    CHECK_EQ_DBL(a.nonfinite, 2);     // NaN, Inf
    CHECK_EQ_DBL(a.underflows, 2);    // 1e-6, -0.0005 (E4M3 rounds below 2^-10 to 0)
    CHECK_EQ_DBL(a.overflows, 2);     // 500, -470; 464 is the tie, kept at 448
    CHECK_EQ_DBL(a.scale_min, 1.0);
    CHECK_EQ_DBL(a.scale_max, 1.0);
    CHECK_EQ_DBL(mxi_qs_underflows_pct(&a), 20.0);
    CHECK_EQ_DBL(mxi_qs_overflows_pct(&a), 20.0);
    // (500-448)^2 + (470-448)^2 + (464-448)^2 + 1e-12 + 1e-6, with 1e-6 and 0.0005 as floats
    long double e = 52.0L * 52 + 22.0L * 22 + 16.0L * 16 + (long double)1e-6f * 1e-6f + (long double)0.0005f * 0.0005f;
    CHECK_NEAR(a.error, (double)e, 1e-9);
    CHECK_NEAR(mxi_qs_mse(&a), (double)(e / 8), 1e-9);
    long double sig = 500.0L * 500 + 470.0L * 470 + 448.0L * 448 + 464.0L * 464 + 9 + (long double)1e-6f * 1e-6f +
                      (long double)0.0005f * 0.0005f;
    CHECK_NEAR(mxi_qs_sqnr_db(&a), (double)(10 * log10l(sig / e)), 1e-9);
    CHECK_EQ_DBL(mxi_qs_clamp_threshold(MX_E4M3), 464.0);
    CHECK_EQ_DBL(mxi_qs_clamp_threshold(MX_E5M2), 61440.0);
    CHECK_EQ_DBL(mxi_qs_clamp_threshold(MX_HIF8), 40960.0);
}

/* Exact and all-zero operands: no error, SQNR undefined (NAN, null in the records). */
static void test_exact(void) {
    const float x[4] = {1.0f, -2.0f, 0.5f, 0.0f}, z[4] = {0};
    uint8_t q[4], qz[4] = {0};
    for (int i = 0; i < 4; i++) q[i] = mx_f32_to_fp8(x[i], MX_E4M3);
    float one = 1.0f;
    mxi_qs_operand op = {.q = q, .rows = 2, .cols = 2, .elem = MX_E4M3, .scaling = MXI_QS_TENSOR, .scale = &one};
    mxi_qs_acc a = mxi_qs_acc_empty(), b = mxi_qs_acc_empty();
    mxi_qs_measure(&a, x, &op);
    CHECK_EQ_DBL(a.error, 0.0);
    CHECK(isnan(mxi_qs_sqnr_db(&a)));
    CHECK_EQ_DBL(mxi_qs_mse(&a), 0.0);
    op.q = qz;
    mxi_qs_measure(&b, z, &op);
    CHECK_EQ_DBL(b.signal, 0.0);
    CHECK(isnan(mxi_qs_sqnr_db(&b)));
    CHECK_EQ_DBL(b.underflows, 0.0);
}

/* Random data with zeros, tiny values, large ones, a NaN and an infinity, quantized by the
 * MX quantizer (floor scales: some blocks saturate) rowwise, colwise and in 32x32 tiles,
 * odd shapes. */
static void test_mx_blocks(void) {
    enum { R = 37, C = 45 };
    static float x[R * C];
    static uint8_t q[R * C], s[R * C];
    static long double sc[R * C];
    uint64_t st = 7;
    for (int i = 0; i < R * C; i++) {
        double u = mxt_uniform(&st);
        x[i] = (float)(u * ldexp(1.0, (int)(mxt_uniform(&st) * 20)));
        if (i % 17 == 0) x[i] = 0.0f;
        if (i % 23 == 0) x[i] = (float)(u * 1e-9);
    }
    x[100] = NAN, x[700] = INFINITY, x[5] = 1e30f;
    for (int e = 0; e < 2; e++)
        for (int ax = 0; ax < 2; ax++) {
            mx_elem elem = e ? MX_E5M2 : MX_E4M3;
            mx_axis axis = ax ? MX_COLWISE : MX_ROWWISE;
            CHECK_EQ_INT(mx_quantize_f32(x, R, C, axis, elem, MX_SCALE_FLOOR, q, s), 0);
            oracle want;
            int nb = (C + 31) / 32;
            for (int r = 0; r < R; r++)
                for (int c = 0; c < C; c++) {
                    uint8_t code = axis == MX_ROWWISE ? s[r * nb + c / 32] : s[(r / 32) * C + c];
                    sc[r * C + c] = code == 0xFF ? NAN : ldexpl(1.0L, code - 127);
                }
            want = measure(x, q, R, C, elem, sc);
            int64_t ns = mx_scale_count(R, C, axis);
            for (int64_t k = 0; k < ns; k++) fold_scale(&want, s[k] == 0xFF ? NAN : ldexpl(1.0L, s[k] - 127));
            mxi_qs_operand op = {.q = q, .rows = R, .cols = C, .elem = elem, .scaling = MXI_QS_BLOCKS, .axis = axis,
                                 .e8m0 = s};
            mxi_qs_acc a = mxi_qs_acc_empty();
            mxi_qs_measure(&a, x, &op);
            check_same(&a, &want);
            CHECK(want.under > 0);
            CHECK(want.nonfinite >= 2);
            if (e == 0) CHECK(want.over > 0);   // floor scales leave E4M3 blocks above 464
        }
    // 32x32 tiles (mxfp8-32x32 weights): one scale per tile, (ceil(R/32), ceil(C/32)) row-major
    int nb = (C + 31) / 32;
    CHECK_EQ_INT(mx_quantize_tiles_f32(x, R, C, MX_E4M3, MX_SCALE_FLOOR, q, s), 0);
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) {
            uint8_t code = s[(r / 32) * nb + c / 32];
            sc[r * C + c] = code == 0xFF ? NAN : ldexpl(1.0L, code - 127);
        }
    oracle want = measure(x, q, R, C, MX_E4M3, sc);
    for (int k = 0; k < ((R + 31) / 32) * nb; k++) fold_scale(&want, s[k] == 0xFF ? NAN : ldexpl(1.0L, s[k] - 127));
    mxi_qs_operand op = {.q = q, .rows = R, .cols = C, .elem = MX_E4M3, .scaling = MXI_QS_TILES, .e8m0 = s};
    mxi_qs_acc a = mxi_qs_acc_empty();
    mxi_qs_measure(&a, x, &op);
    check_same(&a, &want);
}

/* One fp32 scale per row and per column (the rowwise recipes). */
static void test_lines(void) {
    enum { R = 5, C = 7 };
    float x[R * C], rs[R], cs[C];
    uint8_t q[R * C];
    long double sc[R * C];
    uint64_t st = 11;
    for (int i = 0; i < R * C; i++) x[i] = (float)(mxt_uniform(&st) * 1000);
    for (int r = 0; r < R; r++) rs[r] = ldexpf(1.0f, r - 2) * 0.75f;
    for (int c = 0; c < C; c++) cs[c] = 0.01f * (float)(c + 1);
    for (int lines = 0; lines < 2; lines++) {
        oracle want = {0};
        for (int r = 0; r < R; r++)
            for (int c = 0; c < C; c++) {
                float s = lines ? cs[c] : rs[r];
                sc[r * C + c] = s;
                q[r * C + c] = mx_f32_to_fp8(x[r * C + c] / s, MX_E5M2);
            }
        want = measure(x, q, R, C, MX_E5M2, sc);
        want.smin = INFINITY, want.smax = -INFINITY;
        for (int k = 0; k < (lines ? C : R); k++) fold_scale(&want, lines ? cs[k] : rs[k]);
        mxi_qs_operand op = {.q = q, .rows = R, .cols = C, .elem = MX_E5M2,
                             .scaling = lines ? MXI_QS_COLS : MXI_QS_ROWS, .scale = lines ? cs : rs};
        mxi_qs_acc a = mxi_qs_acc_empty();
        mxi_qs_measure(&a, x, &op);
        check_same(&a, &want);
    }
}

/* fp32 scales per block of brows x bcols (the blockwise recipe's), partial blocks at both
 * edges, one NaN scale (its block non-finite, its scale not an extreme). */
static void test_fp32_blocks(void) {
    enum { R = 11, C = 19, BR = 4, BC = 8, NBR = (R + BR - 1) / BR, NBC = (C + BC - 1) / BC };
    float x[R * C], bs[NBR * NBC];
    uint8_t q[R * C];
    long double sc[R * C];
    uint64_t st = 5;
    for (int i = 0; i < R * C; i++) x[i] = (float)((mxt_uniform(&st) - 0.5) * 2000);
    for (int b = 0; b < NBR * NBC; b++) bs[b] = b % 3 ? ldexpf(1.0f, b % 7 - 3) : 0.37f * (float)(b + 1);
    bs[4] = NAN;
    oracle want;
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) {
            float s = bs[(r / BR) * NBC + c / BC];
            sc[r * C + c] = s;
            q[r * C + c] = mx_f32_to_fp8(x[r * C + c] / s, MX_E4M3);
        }
    want = measure(x, q, R, C, MX_E4M3, sc);
    for (int b = 0; b < NBR * NBC; b++) fold_scale(&want, bs[b]);
    mxi_qs_operand op = {.q = q, .rows = R, .cols = C, .elem = MX_E4M3, .scaling = MXI_QS_FP32_BLOCKS, .scale = bs,
                         .brows = BR, .bcols = BC};
    mxi_qs_acc a = mxi_qs_acc_empty();
    mxi_qs_measure(&a, x, &op);
    check_same(&a, &want);
    CHECK_EQ_DBL(a.nonfinite, (double)(BR * BC));   // the NaN scale's block, a whole one
}

static int twice(void *ctx, double *x, int n, mx_diag *diag) {   // two ranks with the same figures
    (void)ctx, (void)diag;
    for (int i = 0; i < n; i++) x[i] *= 2;
    return 0;
}

static int same(void *ctx, double *x, int n, mx_diag *diag) {
    (void)ctx, (void)x, (void)n, (void)diag;
    return 0;
}

/* The collector: records only while on, forward paused in a recompute, saved planes folded
 * in where read, the reduction's sums and extremes. */
static void test_collector(void) {
    const float x[4] = {1.0f, 1e-7f, 600.0f, 3.5f};
    uint8_t q[4];
    float sc = 1.0f;
    for (int i = 0; i < 4; i++) q[i] = mx_f32_to_fp8(x[i], MX_E4M3);
    mxi_qs_operand op = {.q = q, .rows = 2, .cols = 2, .elem = MX_E4M3, .scaling = MXI_QS_TENSOR, .scale = &sc};
    mxi_quant_stats *qs;
    CHECK_EQ_INT(mxi_quant_stats_create(&qs, 3, 2), 0);
    mxi_quant_stats_record(qs, 1, MXI_QS_FPROP_X, x, &op);   // off: nothing
    mxi_quant_stats_begin(qs);
    CHECK_EQ_DBL(mxi_quant_stats_get(qs, 1, MXI_QS_FPROP_X)->numel, 0);
    mxi_quant_stats_record(qs, 1, MXI_QS_FPROP_X, x, &op);
    mxi_quant_stats_pause_forward(qs, true);
    mxi_quant_stats_record(qs, 1, MXI_QS_FPROP_X, x, &op);   // recompute: not again
    mxi_quant_stats_record(qs, 1, MXI_QS_DGRAD_DY, x, &op);  // backward's still count
    mxi_quant_stats_save(qs, x, &op);
    mxi_quant_stats_pause_forward(qs, false);
    mxi_quant_stats_saved(qs, 2, MXI_QS_WGRAD_X, q);
    mxi_quant_stats_saved(qs, 0, MXI_QS_WGRAD_X, q + 1);   // an unknown plane: nothing
    mxi_quant_stats_end(qs);
    mxi_quant_stats_record(qs, 1, MXI_QS_FPROP_X, x, &op);
    const mxi_qs_acc *f = mxi_quant_stats_get(qs, 1, MXI_QS_FPROP_X), *w = mxi_quant_stats_get(qs, 2, MXI_QS_WGRAD_X);
    CHECK_EQ_DBL(f->numel, 4);
    CHECK_EQ_DBL(f->underflows, 1);
    CHECK_EQ_DBL(f->overflows, 1);
    CHECK_EQ_DBL(mxi_quant_stats_get(qs, 1, MXI_QS_DGRAD_DY)->numel, 4);
    CHECK_EQ_DBL(w->numel, 4);
    CHECK_EQ_DBL(w->error, f->error);
    CHECK_EQ_DBL(mxi_quant_stats_get(qs, 0, MXI_QS_WGRAD_X)->numel, 0);
    CHECK_EQ_INT(mxi_quant_stats_reduce(qs, twice, same, NULL, NULL), 0);
    CHECK_EQ_DBL(f->numel, 8);
    CHECK_EQ_DBL(f->underflows, 2);
    CHECK_EQ_DBL(f->scale_min, 1.0);   // extremes stay extremes
    CHECK_EQ_DBL(f->scale_max, 1.0);
    CHECK(isinf(mxi_quant_stats_get(qs, 0, MXI_QS_FPROP_W)->scale_min));
    mxi_quant_stats_free(qs);
}

int main(int argc, char **argv) {
    static const mxt_test tests[] = {
        {"known", test_known},       {"exact", test_exact},         {"mx_blocks", test_mx_blocks},
        {"lines", test_lines},       {"fp32_blocks", test_fp32_blocks}, {"collector", test_collector},
    };
    return MXT_RUN(tests, argc, argv);
}
