/* torchao's axiswise FP8 scaling (mx_fp8_quantize_axiswise_f32, the rowwise recipes) against
 * an oracle written here from torchao's definition (float8_utils.amax_to_scale,
 * to_fp8_saturated): amax of a line with NaN propagating; scale = fp32(fp64(max /
 * max(amax, 1e-12))); power of two: exp2(floor(fp32(log2(scale)))); code = FP8 of
 * clamp(fp32(x * scale), +/-max), nearest with ties to the even code. The oracle computes in
 * long double and rounds each of those steps once; its FP8 grid is enumerated from the OCP
 * definition. Lines: zeros, NaN, Inf, subnormals, ties, values at E4M3's edges, a scale that
 * lands on 2^k from below, over odd shapes and both axes. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "mx_kernels.h"
#include "mxtrain/scaled.h"
#include "numerics/mx_internal.h"   // mxi_fp8_quantize_axiswise_values16

static uint64_t rng_state = 0x13198A2E03707344ull;
static double fp8_grid[2][128];

static void grid_build(void) {
    for (int f = 0; f < 2; f++) {
        int eb = f ? 5 : 4, mb = f ? 2 : 3, bias = f ? 15 : 7, n = 0;
        for (int e = 0; e < (1 << eb); e++)
            for (int k = 0; k < (1 << mb); k++)
                fp8_grid[f][n++] = e ? ldexp((1 << mb) + k, e - bias - mb) : ldexp(k, 1 - bias - mb);
    }
}

/* FP8 code of x (already within +/-max or NaN): nearest, ties to the even code. */
static uint8_t fp8_oracle(long double x, mx_elem elem) {
    const double *g = fp8_grid[elem == MX_E5M2];
    int top = elem == MX_E5M2 ? 123 : 126;
    if (isnan(x)) return 0x7F;
    uint8_t s = signbit(x) ? 0x80 : 0;
    long double a = fabsl(x);
    int c = 0;
    while (c < top && g[c + 1] <= a) c++;
    if (c < top) {
        long double mid = ((long double)g[c] + g[c + 1]) / 2;
        if (a > mid || (a == mid && (c & 1))) c++;
    }
    return s | (uint8_t)c;
}

static float scale_oracle(long double amax, mx_elem elem, mx_tscale_mode mode) {
    long double max = elem == MX_E4M3 ? 448.0L : 57344.0L;
    if (isnan(amax)) return NAN;
    long double a = amax < 1e-12 ? (long double)1e-12 : amax;   // torchao's EPS, a Python float
    float s = (float)(double)(max / a);                         // float64 division, then .to(float32)
    if (mode == MX_TSCALE_FP32) return s;
    float l = (float)log2l((long double)s);                     // torch.log2 of an fp32 tensor
    return (float)exp2l(floorl((long double)l));
}

static bool same_f32(float a, float b) { return (isnan(a) && isnan(b)) || memcmp(&a, &b, 4) == 0; }

/* The line's values: kind 0 random over 40 binades, 1 zeros, 2 a NaN among them, 3 an Inf,
 * 4 subnormals only (amax below 1e-12), 5 E4M3 ties and edges at scale 1 (amax 448),
 * 6 amax just above 1.75 (the power-of-two scale rounds up to 256), 7 random with a -Inf. */
static void fill_line(float *x, int64_t len, int64_t stride, int kind) {
    static const float ties[] = {448.0f, -448.0f, 1.0625f, 1.1875f, -17.0f, 464.0f, 0x1p-10f, 0x3p-10f, 0x1p-9f,
                                 0x1.1p-7f, 240.0f, 0x1.ep7f, 0.0f, -0.0f};
    for (int64_t i = 0; i < len; i++) {
        float v;
        uint64_t r = mxt_splitmix64(&rng_state);
        switch (kind) {
        case 1: v = 0.0f; break;
        case 4: v = ldexpf((float)mxt_uniform(&rng_state), -140 + (int)(r % 10)); break;
        case 5: v = i == 0 ? 448.0f : ties[r % (sizeof ties / sizeof ties[0])]; break;
        case 6: v = i == 0 ? nextafterf(1.75f, 2.0f) : (float)(mxt_uniform(&rng_state) * 1.5); break;
        default: v = ldexpf((float)(mxt_uniform(&rng_state) - 0.5), (int)(r % 40) - 20); break;
        }
        if (kind == 2 && i == len / 2) v = NAN;
        if (kind == 3 && i == len / 3) v = INFINITY;
        if (kind == 7 && i == len - 1) v = -INFINITY;
        x[i * stride] = v;
    }
}

static void check_shape(int64_t R, int64_t C, mx_axis axis, mx_elem elem, mx_tscale_mode mode) {
    bool rows = axis == MX_ROWWISE;
    int64_t lines = rows ? R : C, len = rows ? C : R, stride = rows ? 1 : C, next = rows ? C : 1;
    float *x = malloc((size_t)(R * C) * 4 + 4), *sinv = malloc((size_t)lines * 4 + 4);
    uint8_t *q = malloc((size_t)(R * C) + 1);
    for (int64_t l = 0; l < lines; l++) fill_line(x + l * next, len, stride, (int)(l % 8));
    CHECK_EQ_INT(mx_fp8_quantize_axiswise_f32(x, R, C, axis, elem, mode, q, sinv), 0);
    long double max = elem == MX_E4M3 ? 448.0L : 57344.0L;
    for (int64_t l = 0; l < lines && !mxt_current_failures(); l++) {
        long double amax = 0;
        for (int64_t i = 0; i < len; i++) {
            long double a = fabsl((long double)x[l * next + i * stride]);
            if (isnan(a) || a > amax) amax = isnan(amax) ? amax : a;
        }
        float s = scale_oracle(amax, elem, mode);
        float want_inv = (float)(1.0L / s);
        if (!same_f32(sinv[l], want_inv))
            mxt_fail(__FILE__, __LINE__, "%lldx%lld axis %d elem %d mode %d line %lld (kind %d): scale_inv %a, want %a",
                     (long long)R, (long long)C, axis, elem, mode, (long long)l, (int)(l % 8), sinv[l], want_inv);
        for (int64_t i = 0; i < len; i++) {
            int64_t at = l * next + i * stride;
            long double v = (float)((long double)x[at] * s);   // the fp32 product
            if (v > max) v = max;
            if (v < -max) v = -max;
            uint8_t want = fp8_oracle(v, elem);
            if (q[at] != want) {
                mxt_fail(__FILE__, __LINE__, "%lldx%lld axis %d elem %d mode %d line %lld [%lld] x %a scale %a: "
                         "0x%02X, want 0x%02X", (long long)R, (long long)C, axis, elem, mode, (long long)l,
                         (long long)i, x[at], s, q[at], want);
                break;
            }
        }
    }
    free(x), free(sinv), free(q);
}

static void test_against_oracle(void) {
    static const int64_t shapes[][2] = {{1, 1}, {8, 3}, {3, 130}, {129, 257}, {37, 1}, {16, 45}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int a = 0; a < 2; a++)
            for (int e = 0; e < 2; e++)
                for (int m = 0; m < 2; m++)
                    check_shape(shapes[si][0], shapes[si][1], (mx_axis)a, (mx_elem)e, (mx_tscale_mode)m);
}

/* mxi_fp8_quantize_axiswise_values16 (power-of-two scales, each line's values as bf16 in
 * place of its codes) against the oracle on every kernel: each line's scale, each element's
 * code from the oracle, that code's value over the scale in double, as bf16 bits. Lines
 * of the kinds whose scales fit (random, zeros, subnormals, ties and edges, a scale rounding
 * up); with a NaN or an Inf line the call must refuse (their scales are NaN and 0). */
static void check_values(int64_t R, int64_t C, mx_axis axis, mx_elem elem, bool with_special) {
    static const int fitting[] = {0, 1, 4, 5, 6};
    bool rows = axis == MX_ROWWISE;
    int64_t lines = rows ? R : C, len = rows ? C : R, stride = rows ? 1 : C, next = rows ? C : 1;
    float *x = malloc((size_t)(R * C) * 4 + 4), *sinv = malloc((size_t)lines * 4 + 4);
    uint16_t *y = malloc((size_t)(R * C) * 2 + 2);
    for (int64_t l = 0; l < lines; l++) fill_line(x + l * next, len, stride, fitting[l % 5]);
    if (with_special) fill_line(x + (lines / 2) * next, len, stride, lines % 2 ? 2 : 3);
    long double max = elem == MX_E4M3 ? 448.0L : 57344.0L;
    mx_kernel ks[MAX_KERNELS];
    int nk = available_kernels(ks);
    for (int ki = 0; ki < nk; ki++) {
        mx_kernel_select(ks[ki]);
        bool got = mxi_fp8_quantize_axiswise_values16(y, sinv, x, R, C, axis, elem);
        CHECK_EQ_INT(got, !with_special);
        for (int64_t l = 0; got && l < lines && !mxt_current_failures(); l++) {
            long double amax = 0;
            for (int64_t i = 0; i < len; i++) amax = fmaxl(amax, fabsl((long double)x[l * next + i * stride]));
            float s = scale_oracle(amax, elem, MX_TSCALE_POW2);
            if (!same_f32(sinv[l], (float)(1.0L / s)))
                mxt_fail(__FILE__, __LINE__, "values %lldx%lld axis %d line %lld: scale_inv %a, want %a", (long long)R,
                         (long long)C, axis, (long long)l, sinv[l], (float)(1.0L / s));
            for (int64_t i = 0; i < len; i++) {
                int64_t at = l * next + i * stride;
                long double v = (float)((long double)x[at] * s);
                v = v > max ? max : v < -max ? -max : v;
                uint8_t q = fp8_oracle(v, elem);
                double value = fp8_grid[elem == MX_E5M2][q & 0x7F] * (q & 0x80 ? -1.0 : 1.0);
                uint32_t bits;
                float f = (float)(value / (double)s);   // exact: a power of two, a normal result
                memcpy(&bits, &f, 4);
                if (y[at] != (uint16_t)(bits >> 16) || (bits & 0xFFFF)) {
                    mxt_fail(__FILE__, __LINE__, "values %lldx%lld axis %d elem %d kernel %s line %lld [%lld] x %a: "
                             "0x%04X, want 0x%04X", (long long)R, (long long)C, axis, elem, mx_kernel_name(ks[ki]),
                             (long long)l, (long long)i, x[at], y[at], bits >> 16);
                    break;
                }
            }
        }
    }
    mx_kernel_select(MX_KERNEL_AUTO);
    free(x), free(sinv), free(y);
}

static void test_values16(void) {
    static const int64_t shapes[][2] = {{1, 1}, {8, 3}, {3, 130}, {129, 257}, {37, 1}, {16, 45}, {300, 260}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int a = 0; a < 2; a++)
            for (int e = 0; e < 2; e++) {
                check_values(shapes[si][0], shapes[si][1], (mx_axis)a, (mx_elem)e, false);
                check_values(shapes[si][0], shapes[si][1], (mx_axis)a, (mx_elem)e, true);
            }
}

/* The power-of-two scale where the fp32 scale lies within a few hundred ulps of a power of
 * two, on both sides, over 240 binades (where fp32's log2 rounds up or does not), each amax
 * against the oracle's. */
static void test_pow2_scale_boundaries(void) {
    int64_t checked = 0;
    for (int e = 0; e < 2; e++) {
        mx_elem elem = (mx_elem)e;
        float max = elem == MX_E4M3 ? 448.0f : 57344.0f;
        for (int k = -120; k <= 120 && !mxt_current_failures(); k++) {
            float amax = (float)((double)max / ldexp(1.0, k));   // scale about 2^k
            for (int d = 0; d < 400; d++) amax = nextafterf(amax, 0.0f);
            for (int d = -400; d <= 400; d++, amax = nextafterf(amax, INFINITY)) {
                float got = mx_torchao_scale_from_amax(amax, elem, MX_TSCALE_POW2);
                float want = scale_oracle((long double)amax, elem, MX_TSCALE_POW2);
                checked++;
                if (!same_f32(got, want)) {
                    mxt_fail(__FILE__, __LINE__, "%s amax %a: scale %a, want %a", elem ? "E5M2" : "E4M3", amax, got, want);
                    break;
                }
            }
        }
    }
    printf("    %lld amaxes next to power-of-two scales equal to the oracle's\n", (long long)checked);
}

/* The pinned cases, by hand: torchao's scale differs from TransformerEngine's at these. */
static void test_scale_cases(void) {
    CHECK_EQ_DBL(mx_torchao_scale_from_amax(0.0f, MX_E4M3, MX_TSCALE_FP32), (float)(448.0 / 1e-12));
    CHECK_EQ_DBL(mx_torchao_scale_from_amax(0.0f, MX_E4M3, MX_TSCALE_POW2), 0x1p48);
    CHECK_EQ_DBL(mx_torchao_scale_from_amax(INFINITY, MX_E4M3, MX_TSCALE_POW2), 0.0);
    CHECK(isnan(mx_torchao_scale_from_amax(NAN, MX_E4M3, MX_TSCALE_POW2)));
    CHECK_EQ_DBL(mx_torchao_scale_from_amax(3.0f, MX_E4M3, MX_TSCALE_POW2), 128.0);    // 149.33 -> 128
    CHECK_EQ_DBL(mx_torchao_scale_from_amax(nextafterf(1.75f, 2.0f), MX_E4M3, MX_TSCALE_POW2), 256.0);   // 255.99998
    CHECK_EQ_DBL(mx_torchao_scale_from_amax(448.0f, MX_E4M3, MX_TSCALE_POW2), 1.0);
    CHECK_EQ_DBL(mx_torchao_scale_from_amax(1e-13f, MX_E5M2, MX_TSCALE_FP32), (float)(57344.0 / 1e-12));
    // a line holding Inf: scale 0, its finite elements 0, the Inf NaN, dequantization Inf
    float x[3] = {1.0f, INFINITY, -2.0f}, s;
    uint8_t q[3];
    CHECK_EQ_INT(mx_fp8_quantize_axiswise_f32(x, 1, 3, MX_ROWWISE, MX_E4M3, MX_TSCALE_POW2, q, &s), 0);
    CHECK_EQ_HEX(q[0], 0x00);
    CHECK_EQ_HEX(q[1], 0x7F);
    CHECK_EQ_HEX(q[2], 0x80);
    CHECK(isinf(s));
    CHECK_EQ_INT(mx_fp8_quantize_axiswise_f32(x, -1, 3, MX_ROWWISE, MX_E4M3, MX_TSCALE_POW2, q, &s), MX_ESIZE);
    CHECK_EQ_INT(mx_fp8_quantize_axiswise_f32(x, 1, 3, (mx_axis)2, MX_E4M3, MX_TSCALE_POW2, q, &s), MX_EENUM);
    CHECK_EQ_INT(mx_fp8_quantize_axiswise_f32(NULL, 1, 3, MX_ROWWISE, MX_E4M3, MX_TSCALE_POW2, q, &s), MX_ENULL);
    CHECK_EQ_INT(mx_fp8_quantize_axiswise_f32(NULL, 0, 3, MX_ROWWISE, MX_E4M3, MX_TSCALE_POW2, NULL, NULL), 0);
}

static const mxt_test tests[] = {
    {"rowwise_against_oracle", test_against_oracle},
    {"rowwise_scale_cases", test_scale_cases},
    {"rowwise_pow2_scale_boundaries", test_pow2_scale_boundaries},
    {"rowwise_values16", test_values16},
};

int main(int argc, char **argv) {
    grid_build();
    return MXT_RUN(tests, argc, argv);
}
