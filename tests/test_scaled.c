/* HiF8 and the per-tensor / per-block scalings against oracles written here.
 *
 * The HiF8 oracle is the value set the paper (arXiv 2409.16626) defines, built from binade
 * widths alone (no codes): rounding picks the nearest element of that set with ties away
 * from zero, decided in double where every midpoint is exact. The FP8 oracle enumerates each
 * grid from the OCP definition and rounds to nearest even code. Scales are computed in
 * double and rounded once to fp32: for +, *, / of fp32 operands that double rounding is
 * the correctly rounded fp32 result (53 >= 2*24 + 2), i.e. what an fp32 operation gives. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "mx_kernels.h"
#include "mxtrain/scaled.h"

static uint64_t rng_state = 0x243F6A8885A308D3ull;

/* ---- HiF8 oracle: the positive finite values, sorted ---- */

static double hif8_vals[128];
static int hif8_count;

static int cmp_dbl(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void hif8_oracle_build(void) {
    hif8_count = 0;
    for (int e = -22; e <= -16; e++) hif8_vals[hif8_count++] = ldexp(1.0, e);   // denormals
    for (int e = -15; e <= 15; e++) {
        int a = abs(e), mb = a >= 8 ? 1 : a >= 4 ? 2 : 3;   // tapered mantissa widths
        for (int k = 0; k < (1 << mb); k++) {
            if (e == 15 && k == 1) continue;                   // 1.5 * 2^15 is the Inf slot
            hif8_vals[hif8_count++] = ldexp(1.0 + (double)k / (1 << mb), e);
        }
    }
    qsort(hif8_vals, (size_t)hif8_count, sizeof(double), cmp_dbl);
}

/* Value HiF8 gives x: nearest of {0} and the set, ties away; Inf (or max when saturating)
 * from the midpoint 40960 of 32768 and the Inf slot up. */
static double hif8_oracle(double x, bool saturate) {
    if (isnan(x)) return NAN;
    double a = fabs(x), s = x < 0 ? -1.0 : 1.0;
    if (a >= 40960.0) return saturate ? s * 32768.0 : s * INFINITY;
    double lo = 0.0;
    for (int i = 0; i < hif8_count; i++) {
        double hi = hif8_vals[i];
        if (a < hi) {
            double mid = (lo + hi) / 2;
            double r = a >= mid ? hi : lo;
            return r == 0.0 ? 0.0 : s * r;
        }
        lo = hi;
    }
    return s * 32768.0;
}

static void test_hif8_decode_all_codes(void) {
    // The value set the codes decode to is exactly the paper's, each value once.
    double got[256];
    int n = 0, nan_codes = 0, inf_codes = 0, zeros = 0;
    for (int c = 0; c < 256; c++) {
        float v = mx_hif8_to_f32((uint8_t)c);
        if (isnan(v)) { nan_codes++; continue; }
        if (isinf(v)) { inf_codes++; continue; }
        if (v == 0.0f) { zeros++; continue; }
        if (c < 0x80) got[n++] = v;
        CHECK_EQ_DBL(mx_hif8_to_f32((uint8_t)(c ^ 0x80)), -v);
    }
    CHECK_EQ_INT(nan_codes, 1);
    CHECK_EQ_INT(inf_codes, 2);
    CHECK_EQ_INT(zeros, 1);
    CHECK_EQ_INT(n, 126);
    CHECK_EQ_INT(hif8_count, 126);
    qsort(got, (size_t)n, sizeof(double), cmp_dbl);
    for (int i = 0; i < n && i < hif8_count; i++) CHECK_EQ_DBL(got[i], hif8_vals[i]);
    // Codes worked by hand from the bit layout (sign | dot | exponent | mantissa).
    CHECK_EQ_DBL(mx_hif8_to_f32(0x00), 0.0);
    CHECK(isnan(mx_hif8_to_f32(0x80)));
    CHECK_EQ_DBL(mx_hif8_to_f32(0x6F), INFINITY);
    CHECK_EQ_DBL(mx_hif8_to_f32(0xEF), -INFINITY);
    CHECK_EQ_DBL(mx_hif8_to_f32(0x6E), 32768.0);            // 0 11 0111 0
    CHECK_EQ_DBL(mx_hif8_to_f32(0x01), ldexp(1, -22));
    CHECK_EQ_DBL(mx_hif8_to_f32(0x07), ldexp(1, -16));
    CHECK_EQ_DBL(mx_hif8_to_f32(0x08), 1.0);                // 0 0001 000
    CHECK_EQ_DBL(mx_hif8_to_f32(0x0F), 1.875);
    CHECK_EQ_DBL(mx_hif8_to_f32(0x10), 2.0);                // 0 001 0 000
    CHECK_EQ_DBL(mx_hif8_to_f32(0x18), 0.5);                // 0 001 1 000
    CHECK_EQ_DBL(mx_hif8_to_f32(0x2F), 15.0);               // 0 01 01 111: 1.875 * 2^3
    CHECK_EQ_DBL(mx_hif8_to_f32(0x4F), 224.0);              // 0 10 011 11: 1.75 * 2^7
    CHECK_EQ_DBL(mx_hif8_to_f32(0x60), 256.0);              // 0 11 0000 0
    CHECK_EQ_DBL(mx_hif8_to_f32(0x7F), ldexp(1.5, -15));    // 0 11 1111 1
    CHECK_EQ_DBL(mx_hif8_to_f32(0xDF), -ldexp(1.75, -7));   // 1 10 111 11
}

static void check_hif8_encode(float x) {
    for (int sat = 0; sat < 2; sat++) {
        double want = hif8_oracle(x, sat);
        uint8_t c = mx_f32_to_hif8(x, sat ? MX_HIF8_SATURATE : MX_HIF8_OVERFLOW_INF);
        double got = mx_hif8_to_f32(c);
        if (isnan(want)) {
            CHECK_EQ_HEX(c, 0x80);
        } else if (!(got == want)) {
            mxt_fail(__FILE__, __LINE__, "hif8(%.9g, sat %d): code 0x%02x = %.17g, want %.17g",
                     (double)x, sat, c, got, want);
        }
        if (want == 0.0) CHECK_EQ_HEX(c, 0x00);
    }
}

static void test_hif8_encode_edges(void) {
    // Every value, every midpoint and their fp32 neighbours, both signs.
    double prev = 0.0;
    for (int i = 0; i <= hif8_count; i++) {
        double v = i < hif8_count ? hif8_vals[i] : 49152.0;     // the Inf slot's value
        double pts[2] = {v, (prev + v) / 2};
        for (int k = 0; k < 2; k++) {
            float p = (float)pts[k];
            CHECK_EQ_DBL(p, pts[k]);                              // midpoints are exact in fp32
            float cand[3] = {p, nextafterf(p, 0.0f), nextafterf(p, INFINITY)};
            for (int j = 0; j < 3; j++) {
                check_hif8_encode(cand[j]);
                check_hif8_encode(-cand[j]);
            }
        }
        prev = v;
    }
    float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, FLT_MAX, FLT_MIN, 1e-45f,
                        ldexpf(1, -23), ldexpf(1, -24), 40960.0f, 40959.996f, 65536.0f};
    for (size_t i = 0; i < sizeof specials / sizeof specials[0]; i++) {
        check_hif8_encode(specials[i]);
        check_hif8_encode(-specials[i]);
    }
    CHECK_EQ_HEX(mx_f32_to_hif8(ldexpf(1, -23), MX_HIF8_OVERFLOW_INF), 0x01);
    CHECK_EQ_HEX(mx_f32_to_hif8(-0.0f, MX_HIF8_OVERFLOW_INF), 0x00);
    CHECK_EQ_HEX(mx_f32_to_hif8(INFINITY, MX_HIF8_OVERFLOW_INF), 0x6F);
    CHECK_EQ_HEX(mx_f32_to_hif8(-INFINITY, MX_HIF8_SATURATE), 0xEE);
    CHECK_EQ_HEX(mx_f32_to_hif8(40960.0f, MX_HIF8_OVERFLOW_INF), 0x6F);
    CHECK_EQ_HEX(mx_f32_to_hif8(1.0625f, MX_HIF8_OVERFLOW_INF), 0x09);   // tie 1 | 1.125: away
    CHECK_EQ_HEX(mx_f32_to_hif8(1.0f, (mx_hif8_overflow)7), 0x80);
}

static void test_hif8_encode_random(void) {
    for (int i = 0; i < 200000; i++) {
        uint64_t r = mxt_splitmix64(&rng_state);
        int e = (int)(r % 48) - 28;                              // 2^-28 .. 2^19
        float x = ldexpf(1.0f + (float)((r >> 8) & 0x7FFFFF) / 8388608.0f, e);
        check_hif8_encode((r >> 40) & 1 ? -x : x);
        if (mxt_current_failures()) return;
    }
}

/* ---- FP8 oracle ---- */

static double fp8_grid[2][128];   // positive codes' values, NaN for NaN/Inf codes

static void fp8_oracle_build(void) {
    for (int f = 0; f < 2; f++) {
        int eb = f ? 5 : 4, mb = f ? 2 : 3, bias = f ? 15 : 7, n = 0;
        for (int e = 0; e < (1 << eb); e++)
            for (int k = 0; k < (1 << mb); k++)
                fp8_grid[f][n++] = e ? ldexp((1 << mb) + k, e - bias - mb) : ldexp(k, 1 - bias - mb);
        if (f) for (int k = 124; k < 128; k++) fp8_grid[f][k] = NAN;
        else fp8_grid[f][127] = NAN;
    }
}

/* FP8 code of x: nearest, ties to the even code, saturating at the largest finite code. */
static uint8_t fp8_oracle(double x, mx_elem elem) {
    const double *g = fp8_grid[elem == MX_E5M2];
    int top = elem == MX_E5M2 ? 123 : 126;
    if (isnan(x)) return 0x7F;
    uint8_t s = signbit(x) ? 0x80 : 0;
    double a = fabs(x);
    if (a >= g[top]) return s | (uint8_t)top;
    int c = 0;
    while (g[c + 1] <= a) c++;
    double mid = (g[c] + g[c + 1]) / 2;
    if (a > mid || (a == mid && (c & 1))) c++;
    return s | (uint8_t)c;
}

static float amax_oracle(const float *x, int64_t n) {
    double m = 0.0;
    for (int64_t i = 0; i < n; i++)
        if (!isnan(x[i]) && fabs(x[i]) > m) m = fabs(x[i]);
    return (float)m;
}

static float scale_oracle(float amax, mx_elem elem, mx_tscale_mode mode) {
    double max = elem == MX_E4M3 ? 448.0 : 57344.0;
    if (amax == 0.0f || isinf(amax) || isnan(amax)) return 1.0f;
    double s = max / amax;
    float sf = s > FLT_MAX ? FLT_MAX : (float)s;
    if (mode == MX_TSCALE_POW2) {
        int e;
        frexp(sf, &e);
        sf = (float)ldexp(1.0, e - 1);
    }
    return sf;
}

static void test_fp8_scale(void) {
    float amaxes[] = {0.0f, INFINITY, NAN, 1.0f, 448.0f, 3.0f, 1e-38f, 1e-45f, FLT_MAX, 0.1f, 7e5f};
    for (int f = 0; f < 2; f++)
        for (int m = 0; m < 2; m++)
            for (size_t i = 0; i < sizeof amaxes / sizeof amaxes[0]; i++)
                CHECK_EQ_DBL(mx_fp8_scale_from_amax(amaxes[i], (mx_elem)f, (mx_tscale_mode)m),
                             scale_oracle(amaxes[i], (mx_elem)f, (mx_tscale_mode)m));
    CHECK_EQ_DBL(mx_fp8_scale_from_amax(3.0f, MX_E4M3, MX_TSCALE_POW2), 128.0);   // 149.33 -> 128
    CHECK_EQ_DBL(mx_fp8_scale_from_amax(1e-45f, MX_E4M3, MX_TSCALE_FP32), FLT_MAX);
    float x[] = {1.0f, NAN, -5.0f, 2.0f, NAN};
    CHECK_EQ_DBL(mx_amax_f32(x, 5), 5.0);
}

static void fill(float *x, int64_t n, int kind) {
    for (int64_t i = 0; i < n; i++) {
        uint64_t r = mxt_splitmix64(&rng_state);
        int e = (int)(r % 40) - 20;
        x[i] = ldexpf((float)mxt_uniform(&rng_state), kind == 2 ? e - 120 : e);   // 2: subnormal-ish
        if (kind == 1 && r % 7 == 0) x[i] = 0.0f;
    }
}

static void test_fp8_tensor(void) {
    int64_t sizes[] = {0, 1, 3, 127, 1000};
    for (int f = 0; f < 2; f++)
        for (int m = 0; m < 2; m++)
            for (size_t si = 0; si < 5; si++)
                for (int kind = 0; kind < 4; kind++) {
                    int64_t n = sizes[si];
                    float *x = malloc((size_t)(n + 1) * 4);
                    uint8_t *q = malloc((size_t)n + 1);
                    fill(x, n, kind);
                    if (kind == 3 && n > 2) { x[1] = NAN; x[2] = -INFINITY; }
                    if (kind == 1 && n > 0) x[n - 1] = NAN;          // NaN last: ignored by amax
                    float sinv = -1.0f;
                    CHECK_EQ_INT(mx_fp8_quantize_tensor_f32(x, n, (mx_elem)f, (mx_tscale_mode)m, q, &sinv), 0);
                    float s = scale_oracle(amax_oracle(x, n), (mx_elem)f, (mx_tscale_mode)m);
                    CHECK_EQ_DBL(sinv, (float)(1.0 / s));
                    for (int64_t i = 0; i < n; i++) {
                        uint8_t want = fp8_oracle((float)((double)x[i] * s), (mx_elem)f);
                        if (q[i] != want) {
                            mxt_fail(__FILE__, __LINE__, "fp8 f%d m%d n%lld [%lld] x %.9g: 0x%02x != 0x%02x",
                                     f, m, (long long)n, (long long)i, (double)x[i], q[i], want);
                            break;
                        }
                    }
                    free(x);
                    free(q);
                }
    uint8_t q;
    float si;
    CHECK_EQ_INT(mx_fp8_quantize_tensor_f32(NULL, 1, MX_E4M3, MX_TSCALE_FP32, &q, &si), MX_ENULL);
    CHECK_EQ_INT(mx_fp8_quantize_tensor_f32(&si, -1, MX_E4M3, MX_TSCALE_FP32, &q, &si), MX_ESIZE);
    CHECK_EQ_INT(mx_fp8_quantize_tensor_f32(&si, 1, (mx_elem)9, MX_TSCALE_FP32, &q, &si), MX_EENUM);
}

static void test_fp8_blocks(void) {
    int64_t shapes[][2] = {{1, 1}, {3, 130}, {129, 257}, {200, 128}, {0, 5}, {300, 260}};   // the last in threads
    // 1x128, 128x128, 128x1, and whole rows / whole columns (the rowwise recipe's scales)
    int64_t blocks[][2] = {{1, 128}, {128, 128}, {128, 1}, {1, 1 << 20}, {1 << 20, 1}};
    for (size_t si = 0; si < 5; si++)
        for (size_t bi = 0; bi < 5; bi++)
            for (int m = 0; m < 2; m++) {
                int64_t R = shapes[si][0], C = shapes[si][1], br = blocks[bi][0], bc = blocks[bi][1];
                int64_t nbr = (R + br - 1) / br, nbc = (C + bc - 1) / bc;
                float *x = malloc((size_t)(R * C + 1) * 4), *sinv = malloc((size_t)(nbr * nbc + 1) * 4);
                uint8_t *q = malloc((size_t)(R * C + 1));
                fill(x, R * C, 1);
                if (R * C > 300) {
                    for (int64_t c = 0; c < C; c++) x[c] = 0.0f;         // a zero row: zero 1x128 blocks
                    x[C + 5] = NAN;
                    x[2 * C + 1] = INFINITY;
                    x[C - 1] = ldexpf(1.0f, -140);                     // a subnormal in a partial block
                }
                CHECK_EQ_INT(mx_fp8_quantize_blocks_f32(x, R, C, br, bc, MX_E4M3, (mx_tscale_mode)m, q, sinv), 0);
                for (int64_t I = 0; I < nbr; I++)
                    for (int64_t J = 0; J < nbc; J++) {
                        double am = 0.0;
                        for (int64_t r = I * br; r < R && r < (I + 1) * br; r++)
                            for (int64_t c = J * bc; c < C && c < (J + 1) * bc; c++)
                                if (!isnan(x[r * C + c]) && fabs(x[r * C + c]) > am) am = fabs(x[r * C + c]);
                        float s = scale_oracle((float)am, MX_E4M3, (mx_tscale_mode)m);
                        CHECK_EQ_DBL(sinv[I * nbc + J], (float)(1.0 / s));
                        for (int64_t r = I * br; r < R && r < (I + 1) * br; r++)
                            for (int64_t c = J * bc; c < C && c < (J + 1) * bc; c++)
                                CHECK_EQ_HEX(q[r * C + c], fp8_oracle((float)((double)x[r * C + c] * s), MX_E4M3));
                        if (mxt_current_failures()) break;
                    }
                free(x);
                free(sinv);
                free(q);
            }
    float x = 1.0f, s;
    uint8_t q;
    CHECK_EQ_INT(mx_fp8_quantize_blocks_f32(&x, 1, 1, 0, 128, MX_E4M3, MX_TSCALE_POW2, &q, &s), MX_ESIZE);
}

/* mx_fp8_quantize_blocks_f32 of x (R, C) in br x bc blocks against the oracle: each block's
 * amax (NaN ignored) in double, its scale (scale_oracle), its codes fp8(fp32(x * scale)). */
static void check_blocks(const float *x, int64_t R, int64_t C, int64_t br, int64_t bc, mx_elem elem, mx_tscale_mode mode,
                         const char *what) {
    int64_t nbr = (R + br - 1) / br, nbc = (C + bc - 1) / bc;
    float *sinv = malloc((size_t)(nbr * nbc + 1) * 4);
    uint8_t *q = malloc((size_t)(R * C + 1));
    CHECK_EQ_INT(mx_fp8_quantize_blocks_f32(x, R, C, br, bc, elem, mode, q, sinv), 0);
    int bad = 0;
    for (int64_t I = 0; I < nbr && bad < 3; I++)
        for (int64_t J = 0; J < nbc && bad < 3; J++) {
            long double am = 0.0L;
            for (int64_t r = I * br; r < R && r < (I + 1) * br; r++)
                for (int64_t c = J * bc; c < C && c < (J + 1) * bc; c++)
                    if (!isnan(x[r * C + c]) && fabsl((long double)x[r * C + c]) > am) am = fabsl((long double)x[r * C + c]);
            float s = scale_oracle((float)am, elem, mode);
            if (sinv[I * nbc + J] != (float)(1.0L / s) && bad++ < 3)
                mxt_fail(__FILE__, __LINE__, "%s %lldx%lld mode %d block (%lld, %lld): scale_inv %.9g, want %.9g", what,
                         (long long)br, (long long)bc, mode, (long long)I, (long long)J, (double)sinv[I * nbc + J],
                         (double)(float)(1.0L / s));
            for (int64_t r = I * br; r < R && r < (I + 1) * br; r++)
                for (int64_t c = J * bc; c < C && c < (J + 1) * bc; c++) {
                    uint8_t want = fp8_oracle((float)((long double)x[r * C + c] * s), elem);
                    if (q[r * C + c] != want && bad++ < 3)
                        mxt_fail(__FILE__, __LINE__, "%s %lldx%lld mode %d [%lld, %lld] x %.9g (scale %.9g): 0x%02x, "
                                 "want 0x%02x", what, (long long)br, (long long)bc, mode, (long long)r, (long long)c,
                                 (double)x[r * C + c], (double)s, q[r * C + c], want);
                }
        }
    free(sinv), free(q);
}

/* The blockwise recipe's quantizer (1x128, 128x128, 128x1 blocks) on adversarial blocks:
 * every 128-column band holds one kind, in every row, so that all three block shapes see
 * it; 130 rows and 14 * 128 + 77 columns leave partial blocks at both edges. */
enum { ADV_KINDS = 14 };
static float adversarial(int kind, int64_t r, int64_t c) {
    float u = (float)mxt_uniform(&rng_state);   // [-1, 1)
    int64_t k = c % 128;
    switch (kind) {
    case 0: return (r + c) % 2 ? 0.0f : -0.0f;                                    // all zero: scale 1
    case 1: return (r + k) % 5 == 0 ? NAN : u;                                    // NaN ignored by the amax
    case 2: return k == r % 128 ? INFINITY : u * 1e3f;                            // +Inf: scale 1, Inf saturates
    case 3: return k == (r + 7) % 128 ? -INFINITY : u;                            // -Inf
    case 4: return NAN;                                                           // all NaN: amax 0, scale 1
    case 5: return ldexpf(u, -130);                                               // subnormal amax: scale FLT_MAX
    // amax exactly 448 (scale 1): ties between E4M3 neighbours round to even
    case 6: {
        static const float ties[] = {448.0f, -448.0f, 1.0625f, 1.1875f, -1.1875f, 0x1p-10f, 0x1.8p-9f, 0x1.4p-7f,
                                     232.0f, 240.0f, 0.0f, 0x1p-9f, 416.0f, 432.0f, 440.0f};
        return ties[(r * 3 + k) % (int64_t)(sizeof ties / sizeof ties[0])];
    }
    case 7: return k == 0 ? 449.0f : k == 1 ? -448.5f : u * 448.0f;               // just past 448
    case 8: return k == r % 128 ? 0x1p-9f : ldexpf(u, -10);                       // amax the smallest subnormal
    case 9: return k == 3 ? FLT_MAX : u * 1e30f;                                   // amax FLT_MAX: a tiny scale
    case 10: return k == 5 ? -3.0f : u;                                            // amax from a negative element
    case 11: return ldexpf(1.0f + (float)(k % 8) / 8.0f, (int)(k % 30) - 15) * (r % 2 ? -1.0f : 1.0f);   // on the grid
    case 12: return ldexpf(u, (int)(r % 40) - 20);                                // wide dynamic range
    default: return u * 0.01f;                                                    // the partial band
    }
}

static void test_fp8_blocks_adversarial(void) {
    enum { R = 130, C = ADV_KINDS * 128 + 77 - 128 };
    float *x = malloc((size_t)R * C * 4);
    for (int64_t r = 0; r < R; r++)
        for (int64_t c = 0; c < C; c++) x[r * C + c] = adversarial((int)(c / 128), r, c);
    static const int64_t shapes[3][2] = {{1, 128}, {128, 128}, {128, 1}};
    for (int m = 0; m < 2; m++)
        for (int b = 0; b < 3; b++) {
            check_blocks(x, R, C, shapes[b][0], shapes[b][1], MX_E4M3, (mx_tscale_mode)m, "adversarial");
            check_blocks(x, 1, 77, shapes[b][0], shapes[b][1], MX_E4M3, (mx_tscale_mode)m, "one partial row");
            check_blocks(x + 5 * 128, 129, C, shapes[b][0], shapes[b][1], MX_E4M3, (mx_tscale_mode)m, "shifted");
        }
    // spot values the definition fixes, whatever the oracle: band 0 is all zero (scale 1, the
    // sign of zero kept), band 4 all NaN (scale 1, NaN codes), band 2 holds +Inf (scale 1, Inf
    // saturates to 448), band 6 has amax 448 (scale 1: 1.0625 ties to 1.0, 1.1875 to 1.25)
    uint8_t *q = malloc((size_t)R * C);
    float *sinv = malloc((size_t)R * ((C + 127) / 128) * 4);
    CHECK_EQ_INT(mx_fp8_quantize_blocks_f32(x, R, C, 1, 128, MX_E4M3, MX_TSCALE_POW2, q, sinv), 0);
    int64_t nbc = (C + 127) / 128;
    CHECK_EQ_DBL(sinv[0], 1.0);
    CHECK_EQ_HEX(q[0], 0x80);   // -0
    CHECK_EQ_HEX(q[1], 0x00);
    CHECK_EQ_DBL(sinv[4], 1.0);
    CHECK_EQ_HEX(q[4 * 128], 0x7F);
    CHECK_EQ_DBL(sinv[2], 1.0);
    CHECK_EQ_HEX(q[2 * 128], 0x7E);   // row 0, k 0: +Inf
    CHECK_EQ_DBL(sinv[6], 1.0);
    CHECK_EQ_HEX(q[6 * 128 + 2], 0x38);   // r 0, k 2: 1.0625 -> 1.0
    CHECK_EQ_HEX(q[6 * 128 + 3], 0x3A);   // 1.1875 -> 1.25
    CHECK_EQ_DBL(sinv[5], 0x1p-127);      // subnormal amax: 448 / amax overflows, FLT_MAX truncated to 2^127
    CHECK_EQ_DBL(sinv[1 * nbc + 7], 2.0); // amax 449: 448 / 449 truncated to 0.5
    free(q), free(sinv), free(x);
}


/* MindSpeed's fp32 dequantization scale of amax for target: amax * fp32(1 / target), 1 where
 * that is 0 or Inf. */
/* ---- blocks straight to bf16 values (mxi_fp8_quantize_blocks_values16) ---- */

/* The bf16 bits of the value of FP8 code q times d (a power of two; exact in double), the
 * NaN code's value the canonical NaN. */
static uint16_t value16_oracle(uint8_t q, mx_elem elem, double d) {
    double v = fp8_grid[elem == MX_E5M2][q & 0x7F];
    if (isnan(v)) return 0x7FC0;
    float f = (float)((q & 0x80 ? -v : v) * d);
    uint32_t b = mxi_f32_bits(f);
    if (b & 0xFFFF) mxt_fail(__FILE__, __LINE__, "value of 0x%02x times %g is no bf16", q, d);
    return (uint16_t)(b >> 16);
}

/* mxi_fp8_quantize_blocks_values16 of x (R, C) in br x bc blocks against the oracle (want
 * true), or its refusal (want false): each block's amax in double, its power-of-two scale,
 * each element's code, that code's value over the scale as bf16. On every kernel. */
static void check_values16(const float *x, int64_t R, int64_t C, int64_t br, int64_t bc, mx_elem elem, bool want,
                           const char *what) {
    int64_t nbr = (R + br - 1) / br, nbc = (C + bc - 1) / bc;
    float *sinv = malloc((size_t)(nbr * nbc + 1) * 4);
    uint16_t *y = malloc((size_t)(R * C + 1) * 2);
    mx_kernel ks[MAX_KERNELS];
    int nk = available_kernels(ks);
    for (int ki = 0; ki < nk; ki++) {
        mx_kernel_select(ks[ki]);
        bool got = mxi_fp8_quantize_blocks_values16(y, sinv, x, R, C, br, bc, elem);
        if (got != want) {
            mxt_fail(__FILE__, __LINE__, "%s %lldx%lld %s kernel %s: %s, want %s", what, (long long)br, (long long)bc,
                     mx_elem_traits_of(elem)->name, mx_kernel_name(ks[ki]), got ? "taken" : "refused",
                     want ? "taken" : "refused");
            continue;
        }
        int bad = 0;
        for (int64_t I = 0; got && I < nbr && bad < 3; I++)
            for (int64_t J = 0; J < nbc && bad < 3; J++) {
                long double am = 0.0L;
                for (int64_t r = I * br; r < R && r < (I + 1) * br; r++)
                    for (int64_t c = J * bc; c < C && c < (J + 1) * bc; c++)
                        if (!isnan(x[r * C + c]) && fabsl((long double)x[r * C + c]) > am)
                            am = fabsl((long double)x[r * C + c]);
                float s = scale_oracle((float)am, elem, MX_TSCALE_POW2);
                if (sinv[I * nbc + J] != (float)(1.0L / s) && bad++ < 3)
                    mxt_fail(__FILE__, __LINE__, "%s block (%lld, %lld): scale_inv %.9g, want %.9g", what, (long long)I,
                             (long long)J, (double)sinv[I * nbc + J], (double)(float)(1.0L / s));
                for (int64_t r = I * br; r < R && r < (I + 1) * br; r++)
                    for (int64_t c = J * bc; c < C && c < (J + 1) * bc; c++) {
                        uint8_t q = fp8_oracle((float)((long double)x[r * C + c] * s), elem);
                        uint16_t w = value16_oracle(q, elem, 1.0 / (double)s);
                        if (y[r * C + c] != w && bad++ < 3)
                            mxt_fail(__FILE__, __LINE__, "%s %lldx%lld %s kernel %s [%lld, %lld] x %.9g (scale %.9g): "
                                     "0x%04x, want 0x%04x", what, (long long)br, (long long)bc,
                                     mx_elem_traits_of(elem)->name, mx_kernel_name(ks[ki]), (long long)r, (long long)c,
                                     (double)x[r * C + c], (double)s, y[r * C + c], w);
                    }
            }
    }
    mx_kernel_select(MX_KERNEL_AUTO);
    free(sinv), free(y);
}

/* Values in place of codes: random shapes and the adversarial blocks, both formats, taken
 * where every block's scale leaves each value a normal bf16, refused where a block's amax
 * is subnormal or FLT_MAX (and for 128x128 tiles, which it does not do). */
static void test_fp8_blocks_values16(void) {
    int64_t shapes[][2] = {{1, 1}, {3, 130}, {129, 257}, {200, 128}, {300, 260}};   // the last in threads
    int64_t blocks[][2] = {{1, 128}, {128, 1}, {1, 1 << 20}, {1 << 20, 1}, {1, 16}, {5, 1}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (size_t bi = 0; bi < sizeof blocks / sizeof blocks[0]; bi++)
            for (int e = MX_E4M3; e <= MX_E5M2; e++) {
                int64_t R = shapes[si][0], C = shapes[si][1];
                float *x = malloc((size_t)(R * C + 1) * 4);
                fill(x, R * C, 1);
                if (R * C > 300) {
                    for (int64_t c = 0; c < C; c++) x[c] = c % 2 ? 0.0f : -0.0f;   // a zero row: zero blocks
                    x[C + 5] = NAN;
                    x[2 * C + 1] = -INFINITY;
                }
                check_values16(x, R, C, blocks[bi][0], blocks[bi][1], (mx_elem)e, true, "random");
                free(x);
            }
    enum { R = 130, C = ADV_KINDS * 128 + 77 - 128 };
    float *x = malloc((size_t)R * C * 4);
    for (int64_t r = 0; r < R; r++)
        for (int64_t c = 0; c < C; c++) {
            int kind = (int)(c / 128);
            x[r * C + c] = adversarial(kind == 5 || kind == 9 ? 12 : kind, r, c);   // no out-of-range block
        }
    static const int64_t shapes2[2][2] = {{1, 128}, {128, 1}};
    for (int e = MX_E4M3; e <= MX_E5M2; e++)
        for (int b = 0; b < 2; b++) check_values16(x, R, C, shapes2[b][0], shapes2[b][1], (mx_elem)e, true, "adversarial");
    for (int kind = 5; kind <= 9; kind += 4) {   // a subnormal amax, then FLT_MAX: out of range
        for (int64_t r = 0; r < R; r++)
            for (int64_t c = 0; c < C; c++) x[r * C + c] = c / 128 == kind ? adversarial(kind, r, c) : 1.0f;
        for (int b = 0; b < 2; b++) check_values16(x, R, C, shapes2[b][0], shapes2[b][1], MX_E4M3, false, "out of range");
    }
    check_values16(x, R, C, 128, 128, MX_E4M3, false, "tiles");
    free(x);
}

static float mindspeed_scale(float amax, float target) {
    float s = (float)((double)amax * (double)(float)(1.0 / target));
    return s == 0.0f || isinf(s) ? 1.0f : s;
}

/* Every code of q (n) equal to the oracle's HiF8 of fp32(x / s); what names the case. */
static void check_hif8_codes(const float *x, const uint8_t *q, int64_t n, double s, const char *what, float target) {
    for (int64_t i = 0; i < n; i++) {
        double want = hif8_oracle((float)((double)x[i] / s), true);
        double got = mx_hif8_to_f32(q[i]);
        if (!(got == want) && !(isnan(got) && isnan(want))) {
            mxt_fail(__FILE__, __LINE__, "%s t %g [%lld]: %.17g != %.17g", what, (double)target, (long long)i, got, want);
            break;
        }
    }
}

static void test_hif8_tensor(void) {
    float targets[] = {15.0f, 224.0f};
    int64_t sizes[] = {0, 1, 5, 333};
    for (int t = 0; t < 2; t++)
        for (int si = 0; si < 4; si++)
            for (int kind = 0; kind < 4; kind++) {
                int64_t n = sizes[si];
                float *x = malloc((size_t)(n + 1) * 4), sinv = -1.0f;
                uint8_t *q = malloc((size_t)n + 1);
                fill(x, n, kind);
                if (kind == 3 && n > 2) { x[0] = NAN; x[2] = 0.0f; }
                CHECK_EQ_INT(mx_hif8_quantize_tensor_f32(x, n, targets[t], q, &sinv), 0);
                float s = mindspeed_scale(amax_oracle(x, n), targets[t]);
                CHECK_EQ_DBL(sinv, s);
                check_hif8_codes(x, q, n, s, "hif8 tensor", targets[t]);
                free(x);
                free(q);
            }
    float x = 1.0f, s;
    uint8_t q;
    CHECK_EQ_INT(mx_hif8_quantize_tensor_f32(&x, 1, 14.5f, &q, &s), MX_EINVAL);   // not a HiF8 value
    CHECK_EQ_INT(mx_hif8_quantize_tensor_f32(&x, 1, 0.0f, &q, &s), MX_EINVAL);
}

/* scale_mode pow2: the dequantization scale is the smallest power of two at or above
 * MindSpeed's fp32 one (found here by doubling and halving in double), the codes HiF8(x / it);
 * amax 15 makes MindSpeed's scale exactly 1 (kept), just above 15 it becomes 2. */
static void test_hif8_tensor_pow2(void) {
    float targets[] = {15.0f, 224.0f};
    int64_t sizes[] = {0, 1, 5, 333};
    for (int t = 0; t < 2; t++)
        for (int si = 0; si < 4; si++)
            for (int kind = 0; kind < 6; kind++) {
                int64_t n = sizes[si];
                float *x = malloc((size_t)(n + 1) * 4), sinv = -1.0f;
                uint8_t *q = malloc((size_t)n + 1);
                fill(x, n, kind < 4 ? kind : 0);
                if (kind == 3 && n > 2) { x[0] = NAN; x[2] = 0.0f; }
                for (int64_t i = 0; kind >= 4 && i < n; i++) x[i] = ldexpf(x[i], -20);   // below 0.5
                if (kind >= 4 && n > 0) x[n / 2] = kind == 4 ? 15.0f : nextafterf(15.0f, 16.0f);
                CHECK_EQ_INT(mx_hif8_quantize_tensor_ex_f32(x, n, targets[t], MX_TSCALE_POW2, q, &sinv), 0);
                float amax = amax_oracle(x, n), s = mindspeed_scale(amax, targets[t]);
                double p = 1.0;
                while (p < s) p *= 2.0;
                while (p / 2.0 >= s) p /= 2.0;
                CHECK_EQ_DBL(sinv, p);
                CHECK_EQ_DBL(mx_hif8_scale_from_amax_ex(amax, targets[t], MX_TSCALE_POW2), p);
                if (kind == 4 && t == 0 && n > 0 && amax == 15.0f) CHECK_EQ_DBL(sinv, 1.0);
                if (kind == 5 && t == 0 && n > 0 && amax == nextafterf(15.0f, 16.0f)) CHECK_EQ_DBL(sinv, 2.0);
                check_hif8_codes(x, q, n, p, "hif8 pow2", targets[t]);
                free(x);
                free(q);
            }
    float x = 1.0f, s;
    uint8_t q;
    CHECK_EQ_INT(mx_hif8_quantize_tensor_ex_f32(&x, 1, 15.0f, (mx_tscale_mode)7, &q, &s), MX_EENUM);
    CHECK_EQ_DBL(mx_hif8_scale_from_amax_ex(FLT_MAX, 0x1p-22f, MX_TSCALE_POW2), 1.0);   // an Inf scale: 1, as fp32's
    CHECK_EQ_DBL(mx_hif8_scale_from_amax_ex(0x1p100f, 0x1p-22f, MX_TSCALE_POW2), 0x1p122);
    CHECK_EQ_DBL(mx_hif8_scale_from_amax_ex(0x1.8p100f, 0x1p-22f, MX_TSCALE_POW2), 0x1p123);
}

/* The element pass with a known scale gives the codes the whole quantizer gives with that
 * scale, and refuses what is not a scale. */
static void test_encode_known_scale(void) {
    enum { N = 1001 };
    float x[N];
    uint8_t q1[N], q2[N];
    for (int i = 0; i < N; i++) x[i] = (float)((i * 7919) % 2003 - 1001) * 0.37f;
    for (int e = MX_E4M3; e <= MX_E5M2; e++) {
        float si;
        CHECK_EQ_INT(mx_fp8_quantize_tensor_f32(x, N, (mx_elem)e, MX_TSCALE_FP32, q1, &si), 0);
        float scale = mx_fp8_scale_from_amax(mx_amax_f32(x, N), (mx_elem)e, MX_TSCALE_FP32);
        CHECK_EQ_INT(mx_fp8_encode_f32(x, N, (mx_elem)e, scale, q2), 0);
        CHECK_MEM_EQ(q1, q2, N);
    }
    float si;
    CHECK_EQ_INT(mx_hif8_quantize_tensor_f32(x, N, 15.0f, q1, &si), 0);
    CHECK_EQ_INT(mx_hif8_encode_f32(x, N, si, q2), 0);
    CHECK_MEM_EQ(q1, q2, N);
    const float bad[] = {0.0f, -1.0f, INFINITY, NAN};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK_EQ_INT(mx_fp8_encode_f32(x, N, MX_E4M3, bad[i], q2), MX_EINVAL);
        CHECK_EQ_INT(mx_hif8_encode_f32(x, N, bad[i], q2), MX_EINVAL);
    }
    CHECK_EQ_INT(mx_fp8_encode_f32(x, N, (mx_elem)9, 1.0f, q2), MX_EENUM);
    CHECK_EQ_INT(mx_fp8_encode_f32(NULL, N, MX_E4M3, 1.0f, q2), MX_ENULL);
    CHECK_EQ_INT(mx_hif8_encode_f32(x, -1, 1.0f, q2), MX_ESIZE);
}

/* ---- the vector kernels against the reference kernels ---- */

/* Inputs that reach every corner of the element passes: each fp32 binade with mantissas
 * at 0, 1, all ones, and the half-step and tie patterns of every mantissa width 0..3 (and
 * one step either side), both signs; zeros, Infs, NaNs among them; then random bits. */
static void corner_values(float *x, int64_t cap) {
    int64_t n = 0;
    for (uint32_t ef = 0; ef < 256; ef++)
        for (int mb = 0; mb <= 3; mb++) {
            uint32_t half = 1u << (22 - mb);
            uint32_t ms[] = {0, 1, 0x7FFFFF, half, half - 1, half + 1, half * 3, half * 3 - 1, half * 3 + 1};
            for (size_t k = 0; k < sizeof ms / sizeof ms[0] && n + 2 <= cap; k++) {
                uint32_t u = ef << 23 | (ms[k] & 0x7FFFFF);
                x[n++] = mxi_bits_f32(u);
                x[n++] = mxi_bits_f32(u | 0x80000000u);
            }
        }
    while (n < cap) {
        rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
        x[n++] = mxi_bits_f32((uint32_t)(rng_state >> 32));
    }
}

/* The definition of amax_bits: the largest of the bits of |x[i * stride]|, i < n. */
static uint32_t amax_bits_def(const float *x, int64_t n, int64_t stride) {
    uint32_t want = 0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t b;
        memcpy(&b, &x[i * stride], 4);
        want = (b & 0x7FFFFFFFu) > want ? b & 0x7FFFFFFFu : want;
    }
    return want;
}

/* The row kernels of k: matrices cut from x, every width to 70 and a few heights; the codes
 * of each row against the reference's encode_fp8 with that row's scale and its encode_fp8_vec
 * with a scale per column (scales in turn), the row amaxes against the definition; nothing
 * written past the matrix. */
static void check_row_kernels(const mxi_mx_kernels *kt, const mxi_mx_kernels *ref, const float *x, uint8_t *qa,
                              uint8_t *qb, const float *scales, size_t n_scales) {
    enum { GUARD = 16 };
    for (int64_t rows = 0; rows <= 37; rows += rows < 3 ? 1 : 17)
        for (int64_t cols = 1; cols <= 70; cols++) {
            const float *xm = x + rows * cols;
            float rs[37], cs[70];
            uint32_t m[37 + 1];
            for (int64_t r = 0; r < rows; r++) rs[r] = scales[(r + cols) % (int64_t)n_scales];
            for (int64_t c = 0; c < cols; c++) cs[c] = scales[(c + rows) % (int64_t)n_scales];
            for (int e = MX_E4M3; e <= MX_E5M2; e++) {
                const mx_elem_traits *t = mx_elem_traits_of((mx_elem)e);
                memset(qb, 0xAA, (size_t)(rows * cols) + GUARD);
                kt->encode_fp8_rows(qb, xm, rows, cols, rs, t);
                for (int64_t r = 0; r < rows; r++) ref->encode_fp8(qa + r * cols, xm + r * cols, cols, rs[r], t);
                CHECK_MEM_EQ(qa, qb, rows * cols);
                CHECK_EQ_HEX(qb[rows * cols], 0xAA);
                memset(qb, 0xAA, (size_t)(rows * cols) + GUARD);
                kt->encode_fp8_cols(qb, xm, rows, cols, cs, t);
                for (int64_t r = 0; r < rows; r++) ref->encode_fp8_vec(qa + r * cols, xm + r * cols, cols, cs, t);
                CHECK_MEM_EQ(qa, qb, rows * cols);
                CHECK_EQ_HEX(qb[rows * cols], 0xAA);
            }
            m[rows] = 0xA5A5A5A5u;
            kt->amax_bits_rows(m, xm, rows, cols);
            for (int64_t r = 0; r < rows; r++) {
                uint32_t want = amax_bits_def(xm + r * cols, cols, 1);
                if (m[r] != want) {
                    mxt_fail(__FILE__, __LINE__, "amax_bits_rows %lld x %lld: row %lld 0x%08x, want 0x%08x",
                             (long long)rows, (long long)cols, (long long)r, m[r], want);
                    break;
                }
            }
            CHECK_EQ_HEX(m[rows], 0xA5A5A5A5u);
        }
}

/* Every fast kernel's encode_fp8, encode_fp8_vec, encode_fp8_rows, encode_fp8_cols, encode_hif8
 * and amax equal the reference's bit for bit, over scales that put the inputs anywhere on the
 * grids, and over every length 0..40 (the partial last vector), touching no byte past n. */
static void test_kernels_equal_reference(void) {
    mx_kernel fast[MAX_KERNELS];
    int nf = fast_kernels(fast);
    enum { N = 20000, GUARD = 16 };
    float *x = malloc(N * sizeof(float));
    uint8_t *qa = malloc(N + GUARD), *qb = malloc(N + GUARD);
    corner_values(x, N);
    const float scales[] = {1.0f, 0.75f, 1.0f / 3.0f, 448.0f / 3.1f, 0x1p-20f, 0x1p20f, 15.0f / 1e-6f, 3.4e38f, 1.17e-38f};
    const mxi_mx_kernels *ref = mxi_mx_kernels_of(MX_KERNEL_REF);
    for (int k = 0; k < nf; k++) {
        const mxi_mx_kernels *kt = mxi_mx_kernels_of(fast[k]);
        int before = mxt_current_failures();
        for (size_t si = 0; si < sizeof scales / sizeof scales[0]; si++) {
            float sc = scales[si];
            for (int e = MX_E4M3; e <= MX_E5M2; e++) {
                const mx_elem_traits *t = mx_elem_traits_of((mx_elem)e);
                ref->encode_fp8(qa, x, N, sc, t);
                kt->encode_fp8(qb, x, N, sc, t);
                CHECK_MEM_EQ(qa, qb, N);
                for (int64_t n = 0; n <= 40; n++) {
                    memset(qb, 0xAA, (size_t)n + GUARD);
                    kt->encode_fp8(qb, x + 1000 + n, n, sc, t);
                    ref->encode_fp8(qa, x + 1000 + n, n, sc, t);
                    CHECK_MEM_EQ(qa, qb, n);
                    CHECK_EQ_HEX(qb[n], 0xAA);
                }
            }
            // a scale per element: the scales above in turn, shifted by si
            float *sv = malloc(N * sizeof(float));
            for (int64_t i = 0; i < N; i++) sv[i] = scales[(i + (int64_t)si) % (int64_t)(sizeof scales / sizeof scales[0])];
            for (int e = MX_E4M3; e <= MX_E5M2; e++) {
                const mx_elem_traits *t = mx_elem_traits_of((mx_elem)e);
                ref->encode_fp8_vec(qa, x, N, sv, t);
                kt->encode_fp8_vec(qb, x, N, sv, t);
                CHECK_MEM_EQ(qa, qb, N);
                for (int64_t n = 0; n <= 40; n++) {
                    memset(qb, 0xAA, (size_t)n + GUARD);
                    kt->encode_fp8_vec(qb, x + 3000 + n, n, sv + n, t);
                    ref->encode_fp8_vec(qa, x + 3000 + n, n, sv + n, t);
                    CHECK_MEM_EQ(qa, qb, n);
                    CHECK_EQ_HEX(qb[n], 0xAA);
                }
            }
            free(sv);
            ref->encode_hif8(qa, x, N, sc);
            kt->encode_hif8(qb, x, N, sc);
            CHECK_MEM_EQ(qa, qb, N);
            for (int64_t n = 0; n <= 40; n++) {
                memset(qb, 0xAA, (size_t)n + GUARD);
                kt->encode_hif8(qb, x + 2000 + n, n, sc);
                ref->encode_hif8(qa, x + 2000 + n, n, sc);
                CHECK_MEM_EQ(qa, qb, n);
                CHECK_EQ_HEX(qb[n], 0xAA);
            }
        }
        // amax over windows with and without NaNs, Infs and subnormals, of many lengths
        for (int64_t off = 0; off < N - 64; off += 97)
            for (int64_t n = 0; n <= 64; n += (n < 40 ? 1 : 7))
                CHECK_EQ_HEX(mxi_f32_bits(ref->amax(x + off, n)), mxi_f32_bits(kt->amax(x + off, n)));
        // amax_bits against the definition, the same windows
        for (int64_t off = 0; off < N - 64; off += 97)
            for (int64_t n = 0; n <= 64; n += (n < 40 ? 1 : 7)) {
                uint32_t want = amax_bits_def(x + off, n, 1);
                CHECK_EQ_HEX(kt->amax_bits(x + off, n), want);
                CHECK_EQ_HEX(ref->amax_bits(x + off, n), want);
            }
        // amax_bits_cols against the definition: matrices cut from x (NaN, Inf, subnormals),
        // every width to 70 (the masked and scalar last columns) and a few heights
        for (int64_t rows = 0; rows <= 37; rows += rows < 3 ? 1 : 17)
            for (int64_t cols = 1; cols <= 70; cols++) {
                uint32_t m[70 + 1];
                m[cols] = 0xA5A5A5A5u;
                kt->amax_bits_cols(m, x + rows * cols, rows, cols);
                for (int64_t c = 0; c < cols; c++) {
                    uint32_t want = amax_bits_def(x + rows * cols + c, rows, cols);
                    if (m[c] != want) {
                        mxt_fail(__FILE__, __LINE__, "amax_bits_cols %lld x %lld: column %lld 0x%08x, want 0x%08x",
                                 (long long)rows, (long long)cols, (long long)c, m[c], want);
                        break;
                    }
                }
                CHECK_EQ_HEX(m[cols], 0xA5A5A5A5u);
            }
        check_row_kernels(kt, ref, x, qa, qb, scales, sizeof scales / sizeof scales[0]);
        float few[3] = {NAN, -INFINITY, 2.0f};
        CHECK_EQ_HEX(mxi_f32_bits(kt->amax(few, 3)), mxi_f32_bits(INFINITY));
        CHECK_EQ_HEX(mxi_f32_bits(kt->amax(few, 1)), 0u);   // a NaN alone: ignored
        CHECK(kt->amax_bits(few, 3) > 0x7F800000u);   // the NaN's bits
        CHECK_EQ_HEX(kt->amax_bits(few + 1, 2), 0x7F800000u);
        kernel_report(fast[k], mxt_current_failures() > before,
                      "encode_fp8, encode_fp8_vec, encode_fp8_rows, encode_fp8_cols, encode_hif8, amax equal the "
                      "reference, amax_bits, amax_bits_cols and amax_bits_rows the definition");
    }
    check_row_kernels(ref, ref, x, qa, qb, scales, sizeof scales / sizeof scales[0]);   // the reference's own rows
    report_unavailable();
    free(x), free(qa), free(qb);
}

/* Every fast kernel's values16_fp8_blocks and values16_fp8_cols equal the reference's bit
 * for bit: the corner values, power-of-two scales across the range the contract allows,
 * every width to 70 (the 32-wide stores, the masked last 16) and block widths that end
 * inside and on a vector, touching nothing past the matrix. */
static void test_values16_kernels_equal_reference(void) {
    mx_kernel fast[MAX_KERNELS];
    int nf = fast_kernels(fast);
    enum { N = 20000, GUARD = 16 };
    float *x = malloc(N * sizeof(float));
    uint16_t *ya = malloc((N + GUARD) * 2), *yb = malloc((N + GUARD) * 2);
    corner_values(x, N);
    const float pow2[] = {1.0f, 0x1p-20f, 0x1p20f, 0x1p-100f, 0x1p100f, 0x1p117f, 0x1p-112f, 0.5f, 0x1p9f};
    const int64_t widths[] = {1, 5, 16, 32, 33, 128};
    const mxi_mx_kernels *ref = mxi_mx_kernels_of(MX_KERNEL_REF);
    for (int k = 0; k < nf; k++) {
        const mxi_mx_kernels *kt = mxi_mx_kernels_of(fast[k]);
        if (kt->values16_fp8_blocks == ref->values16_fp8_blocks && kt->values16_fp8_cols == ref->values16_fp8_cols) {
            printf("    kernel %s: values16_fp8_* are the reference's own (nothing to compare)\n", kernel_label(fast[k]));
            continue;
        }
        int before = mxt_current_failures();
        for (int e = MX_E4M3; e <= MX_E5M2; e++) {
            const mx_elem_traits *t = mx_elem_traits_of((mx_elem)e);
            int lo, hi;
            mxi_fp8_values16_range(t, &lo, &hi);
            float sc[70 * 70];
            int64_t ns = 0;
            for (size_t i = 0; ns < 70 * 70; i++) {   // the scales above that the format allows, in turn
                float v = pow2[i % (sizeof pow2 / sizeof pow2[0])];
                int kx = ilogbf(v);
                if (-kx >= lo && -kx <= hi) sc[ns++] = v;
            }
            for (int64_t rows = 0; rows <= 37; rows += rows < 3 ? 1 : 17)
                for (int64_t cols = 1; cols <= 70; cols++) {
                    const float *xm = x + rows * cols;
                    size_t n = (size_t)(rows * cols);
                    for (size_t wi = 0; wi < sizeof widths / sizeof widths[0]; wi++) {
                        memset(yb, 0xAA, (n + GUARD) * 2);
                        kt->values16_fp8_blocks(yb, xm, rows, cols, widths[wi], sc + wi, t);
                        ref->values16_fp8_blocks(ya, xm, rows, cols, widths[wi], sc + wi, t);
                        CHECK_MEM_EQ(ya, yb, n * 2);
                        CHECK_EQ_HEX(yb[n], 0xAAAA);
                    }
                    memset(yb, 0xAA, (n + GUARD) * 2);
                    kt->values16_fp8_cols(yb, xm, rows, cols, sc + cols, t);
                    ref->values16_fp8_cols(ya, xm, rows, cols, sc + cols, t);
                    CHECK_MEM_EQ(ya, yb, n * 2);
                    CHECK_EQ_HEX(yb[n], 0xAAAA);
                    if (mxt_current_failures() > before) break;
                }
        }
        kernel_report(fast[k], mxt_current_failures() > before, "values16_fp8_blocks and values16_fp8_cols equal the reference");
    }
    report_unavailable();
    free(x), free(ya), free(yb);
}

/* Every fast kernel's encode_hif8 over every fp32 sign, exponent and top 7 mantissa bits
 * (the rounding bit of every binade is among them) with the low bits 0, 0x7FFF, 0x8000 and
 * 0xFFFF: at scale 1 the codes against the oracle's values (saturating) and the reference's
 * bytes; at scale 3 (a divide that rounds) against the reference's bytes. */
static void test_hif8_kernels_every_binade(void) {
    mx_kernel fast[MAX_KERNELS];
    int nf = fast_kernels(fast);
    enum { N = 1 << 18 };
    static const uint32_t low[4] = {0x0000, 0x7FFF, 0x8000, 0xFFFF};
    float *x = malloc(N * sizeof(float));
    uint8_t *qa = malloc(N), *qb = malloc(N);
    for (uint32_t i = 0; i < N; i++) x[i] = mxi_bits_f32((i >> 2) << 16 | low[i & 3]);
    const mxi_mx_kernels *ref = mxi_mx_kernels_of(MX_KERNEL_REF);
    ref->encode_hif8(qa, x, N, 1.0f);
    for (uint32_t i = 0; i < N && !mxt_current_failures(); i++) {
        double want = hif8_oracle(x[i], true), got = mx_hif8_to_f32(qa[i]);
        if (isnan(want)) CHECK_EQ_HEX(qa[i], MX_HIF8_NAN);
        else if (!(got == want) || (want == 0.0 && qa[i] != 0))
            mxt_fail(__FILE__, __LINE__, "hif8(%a): code 0x%02x = %.17g, want %.17g", (double)x[i], qa[i], got, want);
    }
    for (int k = 0; k < nf; k++) {
        const mxi_mx_kernels *kt = mxi_mx_kernels_of(fast[k]);
        int before = mxt_current_failures();
        for (int si = 0; si < 2; si++) {
            float sc = si ? 3.0f : 1.0f;
            ref->encode_hif8(qa, x, N, sc);
            kt->encode_hif8(qb, x, N, sc);
            CHECK_MEM_EQ(qa, qb, N);
        }
        kernel_report(fast[k], mxt_current_failures() > before, "encode_hif8 equals the reference in every binade");
    }
    report_unavailable();
    free(x), free(qa), free(qb);
}

static const mxt_test tests[] = {
    {"hif8_decode_all_codes", test_hif8_decode_all_codes},
    {"hif8_encode_edges", test_hif8_encode_edges},
    {"hif8_encode_random", test_hif8_encode_random},
    {"fp8_scale", test_fp8_scale},
    {"fp8_tensor", test_fp8_tensor},
    {"fp8_blocks", test_fp8_blocks},
    {"fp8_blocks_adversarial", test_fp8_blocks_adversarial},
    {"fp8_blocks_values16", test_fp8_blocks_values16},
    {"hif8_tensor", test_hif8_tensor},
    {"hif8_tensor_pow2", test_hif8_tensor_pow2},
    {"encode_known_scale", test_encode_known_scale},
    {"kernels_equal_reference", test_kernels_equal_reference},
    {"hif8_kernels_every_binade", test_hif8_kernels_every_binade},
    {"values16_kernels_equal_reference", test_values16_kernels_equal_reference},
};

int main(int argc, char **argv) {
    hif8_oracle_build();
    fp8_oracle_build();
    return MXT_RUN(tests, argc, argv);
}
