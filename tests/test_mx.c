/* MX numerics against an independent exact oracle written here.
 *
 * The oracle shares no code with the library: it enumerates each FP8 format's value grid
 * from the format's definition, finds the nearest grid value by comparing against exact
 * midpoints in double (every fp32 times a power of two, and every midpoint of two FP8 grid
 * values, is exact in double), and takes block exponents with frexp. Every kernel the CPU
 * can run (the scalar reference and the SIMD fast paths: the library's kernel list, each
 * reported by name) is checked against it, and each fast path against the reference bit
 * for bit on millions of random elements. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "harness.h"
#include "mx_kernels.h"
#include "mxtrain/mx.h"

/* ---- random numbers ---- */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rng_next(void) { return mxt_splitmix64(&rng_state); }
static int64_t rng_range(int64_t lo, int64_t hi) { return lo + (int64_t)(rng_next() % (uint64_t)(hi - lo + 1)); }

static float f32_from_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint32_t bits_of_f32(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

/* ---- the oracle ---- */

typedef struct {
    const char *name;
    int ebits, mbits, bias;
    bool ieee_specials;      // E5M2: infinities and NaNs at the top exponent; E4M3: only S.1111.111 is NaN
    double max;              // from the OCP spec, as a literal
    double grid[128];        // value of each positive code, NaN for NaN/inf codes
    int max_code;            // largest finite positive code
} fmt_oracle;

static fmt_oracle E4M3 = {"E4M3", 4, 3, 7, false, 448.0, {0}, 0};
static fmt_oracle E5M2 = {"E5M2", 5, 2, 15, true, 57344.0, {0}, 0};

/* Enumerate the positive grid in code order: 2^mbits subnormal steps of 2^(1-bias-mbits),
 * then each binade 2^e .. 2^(e+1) in 2^mbits steps. Codes count steps, so code n is the
 * n-th value of that list. */
static void oracle_build(fmt_oracle *f) {
    int n = 0, steps = 1 << f->mbits, top = (1 << f->ebits) - 1;
    for (int k = 0; k < steps; k++) f->grid[n++] = ldexp(k, 1 - f->bias - f->mbits);
    for (int e = 1; e <= top; e++)
        for (int k = 0; k < steps; k++) f->grid[n++] = ldexp(steps + k, e - f->bias - f->mbits);
    if (f->ieee_specials) {
        for (int k = 0; k < steps; k++) f->grid[top * steps + k] = NAN;
    } else {
        f->grid[127] = NAN;
    }
    f->max_code = 0;
    for (int c = 0; c < 128; c++)
        if (!isnan(f->grid[c])) f->max_code = c;
}

static fmt_oracle *oracle_of(mx_elem e) { return e == MX_E4M3 ? &E4M3 : &E5M2; }

/* Nearest grid value to v (exact double), ties to the even code, saturating; NaN -> 0x7F. */
static uint8_t oracle_encode(double v, const fmt_oracle *f) {
    if (isnan(v)) return 0x7F;
    uint8_t sign = signbit(v) ? 0x80 : 0;
    double a = fabs(v);
    if (a >= f->max) return sign | (uint8_t)f->max_code;
    int lo = 0;
    while (lo + 1 <= f->max_code && f->grid[lo + 1] <= a) lo++;
    if (f->grid[lo] == a) return sign | (uint8_t)lo;
    double mid = (f->grid[lo] + f->grid[lo + 1]) / 2;   // exact
    int c = a < mid ? lo : a > mid ? lo + 1 : (lo % 2 == 0 ? lo : lo + 1);
    return sign | (uint8_t)c;
}

static double oracle_decode(uint8_t code, const fmt_oracle *f) {
    double v = f->grid[code & 0x7F];
    if (f->ieee_specials && (code & 0x7F) == (f->max_code + 1)) v = INFINITY;
    return (code & 0x80) ? -v : v;
}

/* Block scale code from the block's magnitudes, per SPEC §4, in double. */
static int oracle_scale(const double *mag, int n, const fmt_oracle *f, mx_scale_mode mode) {
    double amax = 0;
    for (int i = 0; i < n; i++) {
        if (isnan(mag[i]) || isinf(mag[i])) return 0xFF;
        if (mag[i] > amax) amax = mag[i];
    }
    int emax = (int)floor(log2(f->max));   // 8 or 15
    if (mode == MX_SCALE_FLOOR) {
        if (amax == 0) return 0;
        int ex;
        frexp(amax, &ex);                  // amax = m * 2^ex, m in [0.5, 1)
        int e = (ex - 1) - emax;
        if (e < -127) e = -127;
        if (e > 127) e = 127;
        return e + 127;
    }
    float inv = 1.0f / (float)f->max;              // fp32(1/max)
    float d = (float)(amax * (double)inv);         // exact product, one rounding to fp32
    if (d == 0) return 0;
    int ex;
    double m = frexp(d, &ex);
    int ceil_log2 = m == 0.5 ? ex - 1 : ex;
    int code = ceil_log2 + 127;
    return code < 0 ? 0 : code;
}

/* Quantize a (rows x cols) matrix given as exact doubles into q and s, with blocks of
 * br x bc elements (1x32 rowwise, 32x1 colwise, 32x32 tiles); s is row-major with one
 * entry per block. Partial blocks simply have fewer elements. */
static void oracle_quantize_blocks(const double *x, int64_t rows, int64_t cols, int br, int bc,
                                   const fmt_oracle *f, mx_scale_mode mode, uint8_t *q, uint8_t *s) {
    int64_t nb_outer = (rows + br - 1) / br, nb_inner = (cols + bc - 1) / bc;
    int64_t *idx = malloc((size_t)br * (size_t)bc * sizeof *idx);
    double *mag = malloc((size_t)br * (size_t)bc * sizeof *mag);
    for (int64_t bo = 0; bo < nb_outer; bo++)
        for (int64_t bi = 0; bi < nb_inner; bi++) {
            int n = 0;
            for (int64_t r = bo * br; r < bo * br + br && r < rows; r++)
                for (int64_t c = bi * bc; c < bi * bc + bc && c < cols; c++) {
                    idx[n] = r * cols + c;
                    mag[n] = fabs(x[idx[n]]);
                    n++;
                }
            int code = oracle_scale(mag, n, f, mode);
            s[bo * nb_inner + bi] = (uint8_t)code;
            for (int k = 0; k < n; k++)
                q[idx[k]] = code == 0xFF ? 0x7F : oracle_encode(ldexp(x[idx[k]], 127 - code), f);
        }
    free(idx), free(mag);
}

/* ---- kernels under test: mx_kernels.h ---- */

static const mx_elem elems[] = {MX_E4M3, MX_E5M2};
static const mx_scale_mode modes[] = {MX_SCALE_FLOOR, MX_SCALE_RCEIL};

/* ---- matrices with every hard case ---- */

typedef enum { FILL_WIDE, FILL_SPECIAL } fill_kind;

/* One random fp32 whose exponent field lies in [emin_field, emax_field]. */
static uint32_t random_f32_bits(int emin_field, int emax_field) {
    uint32_t sign = (uint32_t)(rng_next() & 1) << 31;
    uint32_t e = (uint32_t)rng_range(emin_field, emax_field);
    return sign | e << 23 | (uint32_t)(rng_next() & 0x7FFFFF);
}

/* Fill blocks with heavy-tailed values: each 32-element span gets its own magnitude range,
 * from fp32 subnormals to near FLT_MAX; FILL_SPECIAL also plants NaN, Inf, zero blocks,
 * signed zeros, exact FP8 ties, values near each format's max and amax mantissas >= 1.75. */
static void fill_matrix(float *x, int64_t n, fill_kind kind) {
    for (int64_t i = 0; i < n; i++) {
        int64_t block = i / 32;
        uint64_t h = (uint64_t)block * 0x9E3779B97F4A7C15ull;
        int top = (int)(1 + (h >> 40) % 254);           // block's largest exponent field
        int spread = (int)(1 + (h >> 20) % 30);
        int lo = top - spread < 0 ? 0 : top - spread;
        uint32_t b = random_f32_bits(lo, top);
        if (kind == FILL_SPECIAL) {
            switch (rng_next() % 40) {
            case 0: b = 0x7FC00000; break;                          // NaN
            case 1: b = (rng_next() & 1) ? 0x7F800000 : 0xFF800000; break;  // +/-Inf
            case 2: b = 0x80000000; break;                          // -0
            case 3: b = 0; break;
            case 4: b = (uint32_t)(rng_next() & 0x807FFFFF); break; // fp32 subnormal
            case 5: b = bits_of_f32(957.0f); break;                 // mantissa >= 1.75
            case 6: b = bits_of_f32((rng_next() & 1) ? 464.0f : 448.0f); break;  // E4M3 max and tie above
            case 7: b = bits_of_f32((rng_next() & 1) ? 61440.0f : 57344.0f); break;  // E5M2 max and tie above
            case 8: b = bits_of_f32(nextafterf(448.0f, 0)); break;
            case 9: b = bits_of_f32(nextafterf(464.0f, 1e9f)); break;
            case 10: b = bits_of_f32(1.0625f * 256.0f); break;     // exact E4M3 tie after scaling
            case 11: b = bits_of_f32(0.0f - 2.0f * 1.9375f); break;
            default: break;
            }
        }
        x[i] = f32_from_bits(b);
    }
    // whole special blocks along rows: an all-zero block and an all-signed-zero block
    if (kind == FILL_SPECIAL && n >= 96) {
        for (int k = 0; k < 32; k++) x[k] = 0.0f;
        for (int k = 32; k < 64; k++) x[k] = (k % 2) ? -0.0f : 0.0f;
    }
}

/* Dense hard cases for the bf16 fast path, shaped by 32x32 tiles: every row block and
 * every column block holds one element near its tile's top exponent (where (r + c) % 32
 * is 0), and the others spread over 36 binades below it, so the scaled values fall in the
 * FP8 subnormal range of both formats (about 2^-18..2^-14 below the block maximum for
 * E4M3, 2^-32..2^-30 for E5M2), at exact ties, and below the grid; among them zeros of
 * both signs and bf16 subnormals. Some tiles have a tiny top (scale codes below 20), some
 * an all-zero row or column, a few are all zeros or hold a NaN or an infinity. */
static void fill_zone(float *x, int64_t rows, int64_t cols) {
    int64_t tr = (rows + 31) / 32, tc = (cols + 31) / 32;
    for (int64_t t = 0; t < tr * tc; t++) {
        int64_t r0 = t / tc * 32, c0 = t % tc * 32;
        uint64_t kind = rng_next() % 64;
        int top = kind < 6 ? (int)rng_range(1, 30) : (int)rng_range(40, 250);
        int zero_row = kind >= 6 && kind < 12 ? (int)rng_range(0, 31) : -1;
        int zero_col = kind >= 12 && kind < 18 ? (int)rng_range(0, 31) : -1;
        for (int64_t r = r0; r < r0 + 32 && r < rows; r++)
            for (int64_t c = c0; c < c0 + 32 && c < cols; c++) {
                uint32_t sign = (uint32_t)(rng_next() & 1) << 31, b;
                uint32_t mant = (uint32_t)(rng_next() & 0x7FFFFF);
                if (rng_next() & 1) mant &= 0x7F0000u;                      // bf16-exact: ties after scaling
                if (rng_next() % 4 == 0) mant &= 0x700000u;                 // exact FP8-grid values and ties
                uint64_t pick = rng_next() % 32;
                if ((r + c) % 32 == 0) {
                    b = (uint32_t)top << 23 | mant;                          // the block's maximum binade
                } else if (pick == 0) {
                    b = 0;                                                  // +0 / -0
                } else if (pick == 1) {
                    b = (uint32_t)rng_range(1, 0x7F) << 16 | (mant & 0xFFFF);   // bf16 subnormal
                } else {
                    int e = top - (int)rng_range(0, 36);
                    b = e >= 1 ? (uint32_t)e << 23 | mant : 0;
                }
                if (r - r0 == zero_row || c - c0 == zero_col || kind == 18) b = 0;
                x[r * cols + c] = f32_from_bits(sign | b);
            }
        if (kind == 19) x[(r0 + rng_range(0, 31) % (rows - r0)) * cols + c0] = NAN;
        if (kind == 20) x[r0 * cols + c0 + rng_range(0, 31) % (cols - c0)] = -INFINITY;
    }
}

static double *to_double(const float *x, int64_t n) {
    double *d = malloc((size_t)n * sizeof *d);
    for (int64_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}

static uint16_t *to_bf16(const float *x, int64_t n) {   // truncation: any bf16 pattern will do
    uint16_t *b = malloc((size_t)n * sizeof *b);
    for (int64_t i = 0; i < n; i++) b[i] = (uint16_t)(bits_of_f32(x[i]) >> 16);
    return b;
}

static float *bf16_values(const uint16_t *b, int64_t n) {
    float *x = malloc((size_t)n * sizeof *x);
    for (int64_t i = 0; i < n; i++) x[i] = f32_from_bits((uint32_t)b[i] << 16);
    return x;
}

/* ---- tests: codecs ---- */

static void test_traits(void) {
    const mx_elem_traits *a = mx_elem_traits_of(MX_E4M3), *b = mx_elem_traits_of(MX_E5M2);
    CHECK(a && b);
    if (!a || !b) return;
    CHECK_STR_EQ(a->name, "E4M3");
    CHECK_STR_EQ(b->name, "E5M2");
    CHECK_EQ_DBL(a->max, 448.0);
    CHECK_EQ_DBL(b->max, 57344.0);
    CHECK_EQ_INT(a->emax, 8);
    CHECK_EQ_INT(b->emax, 15);
    CHECK_EQ_DBL(a->to_f32(a->max_code), 448.0);
    CHECK_EQ_DBL(b->to_f32(b->max_code), 57344.0);
    CHECK_EQ_INT(E4M3.max_code, a->max_code);
    CHECK_EQ_INT(E5M2.max_code, b->max_code);
    CHECK_EQ_DBL(E4M3.grid[E4M3.max_code], 448.0);
    CHECK_EQ_DBL(E5M2.grid[E5M2.max_code], 57344.0);
    CHECK(mx_elem_traits_of((mx_elem)2) == NULL);
    CHECK(mx_elem_traits_of((mx_elem)-1) == NULL);
}

static void test_decode_every_code(void) {
    for (int ei = 0; ei < 2; ei++) {
        const fmt_oracle *f = oracle_of(elems[ei]);
        for (int c = 0; c < 256; c++) {
            double want = oracle_decode((uint8_t)c, f);
            float got = mx_fp8_to_f32((uint8_t)c, elems[ei]);
            if (isnan(want)) CHECK(isnan(got));
            else CHECK_EQ_DBL(got, want);
            if (want == 0) CHECK_EQ_INT(signbit(got) != 0, (c & 0x80) != 0);
        }
    }
    CHECK(isnan(mx_fp8_to_f32(0x7F, MX_E4M3)) && isnan(mx_fp8_to_f32(0xFF, MX_E4M3)));
    CHECK_EQ_DBL(mx_fp8_to_f32(0x7E, MX_E4M3), 448.0);
    CHECK_EQ_DBL(mx_fp8_to_f32(0x01, MX_E4M3), ldexp(1, -9));
    CHECK_EQ_DBL(mx_fp8_to_f32(0x01, MX_E5M2), ldexp(1, -16));
    CHECK(isinf(mx_fp8_to_f32(0x7C, MX_E5M2)) && mx_fp8_to_f32(0xFC, MX_E5M2) < 0);
    CHECK(isnan(mx_fp8_to_f32(0x7D, MX_E5M2)));
    CHECK(isnan(mx_fp8_to_f32(0, (mx_elem)7)));
}

/* Every code re-encodes to itself, NaN aside; E5M2 infinities saturate to max. */
static void test_reencode_every_code(void) {
    for (int ei = 0; ei < 2; ei++) {
        const fmt_oracle *f = oracle_of(elems[ei]);
        for (int c = 0; c < 256; c++) {
            float v = mx_fp8_to_f32((uint8_t)c, elems[ei]);
            if (isnan(v)) {
                CHECK_EQ_HEX(mx_f32_to_fp8(v, elems[ei]), 0x7F);
                continue;
            }
            uint8_t want = isinf(v) ? (uint8_t)((c & 0x80) | f->max_code) : (uint8_t)c;
            CHECK_EQ_HEX(mx_f32_to_fp8(v, elems[ei]), want);
        }
    }
}

/* The element codec against the oracle: every bf16 pattern, exact ties and their
 * neighbours, values around max, and random fp32 of every magnitude. */
static void test_encode_against_oracle(void) {
    for (int ei = 0; ei < 2; ei++) {
        mx_elem e = elems[ei];
        const fmt_oracle *f = oracle_of(e);
        for (uint32_t h = 0; h < 65536; h++) {
            float v = f32_from_bits(h << 16);
            CHECK_EQ_HEX(mx_f32_to_fp8(v, e), isinf(v) ? ((h >> 15) << 7 | f->max_code) : oracle_encode(v, f));
            if (mxt_current_failures()) return;
        }
        for (int c = 0; c < f->max_code; c++) {
            double mid = (f->grid[c] + f->grid[c + 1]) / 2;
            float m = (float)mid;
            CHECK_EQ_DBL(m, mid);   // every midpoint is an fp32
            for (int s = 0; s < 2; s++) {
                float vs[3] = {m, nextafterf(m, 0), nextafterf(m, INFINITY)};
                for (int k = 0; k < 3; k++) {
                    float v = s ? -vs[k] : vs[k];
                    CHECK_EQ_HEX(mx_f32_to_fp8(v, e), oracle_encode(v, f));
                }
            }
            // a tie goes to the even code
            CHECK_EQ_INT(mx_f32_to_fp8(m, e) & 1, 0);
        }
        float around_max[] = {(float)f->max, nextafterf((float)f->max, 0), nextafterf((float)f->max, INFINITY),
                              (float)(f->max * 1.0625), (float)(f->max * 1.125), 1e30f, 3.4e38f};
        for (size_t k = 0; k < sizeof around_max / sizeof around_max[0]; k++) {
            CHECK_EQ_HEX(mx_f32_to_fp8(around_max[k], e), f->max_code);
            CHECK_EQ_HEX(mx_f32_to_fp8(-around_max[k], e), 0x80 | f->max_code);
        }
        for (int i = 0; i < 200000; i++) {
            float v = f32_from_bits(random_f32_bits(0, 254));
            CHECK_EQ_HEX(mx_f32_to_fp8(v, e), oracle_encode(v, f));
            if (mxt_current_failures()) return;
        }
        CHECK_EQ_HEX(mx_f32_to_fp8(-0.0f, e), 0x80);
        CHECK_EQ_HEX(mx_f32_to_fp8(0.0f, e), 0x00);
        CHECK_EQ_HEX(mx_f32_to_fp8(NAN, e), 0x7F);
    }
}

static void test_e8m0(void) {
    for (int c = 0; c < 255; c++) CHECK_EQ_DBL(mx_e8m0_to_f32((uint8_t)c), ldexp(1, c - 127));
    CHECK(isnan(mx_e8m0_to_f32(0xFF)));
}

static void test_scale_code_against_oracle(void) {
    for (int ei = 0; ei < 2; ei++)
        for (int mi = 0; mi < 2; mi++) {
            const fmt_oracle *f = oracle_of(elems[ei]);
            for (uint32_t h = 0; h < 0x8000; h++) {          // every positive bf16 pattern
                double a = f32_from_bits(h << 16);
                CHECK_EQ_INT(mx_scale_code((float)a, elems[ei], modes[mi]), oracle_scale(&a, 1, f, modes[mi]));
                if (mxt_current_failures()) return;
            }
            for (int i = 0; i < 200000; i++) {
                double a = f32_from_bits(random_f32_bits(0, 254) & 0x7FFFFFFF);
                CHECK_EQ_INT(mx_scale_code((float)a, elems[ei], modes[mi]), oracle_scale(&a, 1, f, modes[mi]));
                if (mxt_current_failures()) return;
            }
        }
    // Worked examples from SPEC §4: 957 has mantissa 1.87 >= 1.75, so FLOOR saturates it.
    uint8_t q[32], s[1];
    float x[32] = {957.0f};
    CHECK_EQ_INT(mx_quantize_f32(x, 1, 32, MX_ROWWISE, MX_E4M3, MX_SCALE_FLOOR, q, s), 0);
    CHECK_EQ_INT(s[0], 127 + 1);                         // floor(log2 957) = 9, minus 8
    CHECK_EQ_DBL(mx_fp8_to_f32(q[0], MX_E4M3) * mx_e8m0_to_f32(s[0]), 896.0);
    CHECK_EQ_INT(mx_quantize_f32(x, 1, 32, MX_ROWWISE, MX_E4M3, MX_SCALE_RCEIL, q, s), 0);
    CHECK_EQ_INT(s[0], 127 + 2);                         // 957/448 = 2.14 -> 4
    CHECK_EQ_DBL(mx_fp8_to_f32(q[0], MX_E4M3) * mx_e8m0_to_f32(s[0]), 960.0);
    CHECK_EQ_INT(mx_scale_code(INFINITY, MX_E4M3, MX_SCALE_FLOOR), 0xFF);
    CHECK_EQ_INT(mx_scale_code(NAN, MX_E5M2, MX_SCALE_RCEIL), 0xFF);
    CHECK_EQ_INT(mx_scale_code(0.0f, MX_E5M2, MX_SCALE_RCEIL), 0);
}

/* ---- tests: matrices ---- */

/* Partial blocks of 1, 7, 8, 18 and 31 elements: within the first and the second half of
 * a 32-element block, as SIMD kernels split it. */
static const int64_t shapes[][2] = {{1, 1}, {1, 31}, {1, 33}, {2, 32}, {33, 1}, {31, 31}, {32, 32}, {33, 65},
                                    {64, 64}, {70, 97}, {5, 200}, {97, 40}, {129, 7}, {40, 257}, {45, 50}};
enum { N_SHAPES = sizeof shapes / sizeof shapes[0] };

/* Quantize x with the active kernel, one plane, as fp32 or bf16 input. */
static int quantize_plane(const float *x, const uint16_t *xb, int64_t rows, int64_t cols, mx_axis axis,
                          mx_elem e, mx_scale_mode m, uint8_t *q, uint8_t *s) {
    return xb ? mx_quantize_bf16(xb, rows, cols, axis, e, m, q, s) : mx_quantize_f32(x, rows, cols, axis, e, m, q, s);
}

/* Quantize x with the active kernel into plane 0 (rowwise), 1 (colwise) or 2 (32x32 tiles). */
static int quantize_plane3(const float *x, const uint16_t *xb, int64_t rows, int64_t cols, int plane,
                           mx_elem e, mx_scale_mode m, uint8_t *q, uint8_t *s) {
    if (plane < 2) return quantize_plane(x, xb, rows, cols, (mx_axis)plane, e, m, q, s);
    return xb ? mx_quantize_tiles_bf16(xb, rows, cols, e, m, q, s) : mx_quantize_tiles_f32(x, rows, cols, e, m, q, s);
}

static int64_t scale_count3(int64_t rows, int64_t cols, int plane) {
    return plane < 2 ? mx_scale_count(rows, cols, (mx_axis)plane) : mx_tile_scale_count(rows, cols);
}

enum { PLANE_ROWWISE = 1, PLANE_COLWISE = 2, PLANE_TILES = 4 };

/* Every kernel against the oracle on the shapes given, for the planes in plane_mask.
 * zone: fill_zone; else FILL_WIDE and FILL_SPECIAL alternately. */
static void check_against_oracle_ex(bool bf16_input, bool zone, int plane_mask, const int64_t (*shp)[2], int nshapes) {
    mx_kernel kernels[MAX_KERNELS];
    int nk = available_kernels(kernels);
    int64_t checked[MAX_KERNELS] = {0};
    bool failed[MAX_KERNELS] = {false};
    for (int si = 0; si < nshapes && !mxt_current_failures(); si++) {
        int64_t rows = shp[si][0], cols = shp[si][1], n = rows * cols;
        float *x = malloc((size_t)n * sizeof *x);
        if (zone) fill_zone(x, rows, cols);
        else fill_matrix(x, n, si % 2 ? FILL_SPECIAL : FILL_WIDE);
        uint16_t *xb = bf16_input ? to_bf16(x, n) : NULL;
        float *xv = bf16_input ? bf16_values(xb, n) : x;
        double *xd = to_double(xv, n);
        uint8_t *q = malloc((size_t)n), *qo = malloc((size_t)n);
        int64_t ns = (rows + 31) / 32 * cols + rows * ((cols + 31) / 32);
        uint8_t *s = malloc((size_t)ns), *so = malloc((size_t)ns);
        for (int pi = 0; pi < 3; pi++)
            for (int ei = 0; ei < 2; ei++)
                for (int mi = 0; mi < 2; mi++) {
                    if (!(plane_mask >> pi & 1)) continue;
                    int64_t nsc = scale_count3(rows, cols, pi);
                    static const int extent[3][2] = {{1, 32}, {32, 1}, {32, 32}};
                    oracle_quantize_blocks(xd, rows, cols, extent[pi][0], extent[pi][1], oracle_of(elems[ei]), modes[mi], qo, so);
                    for (int k = 0; k < nk; k++) {
                        mx_kernel_select(kernels[k]);
                        memset(q, 0xAA, (size_t)n);
                        memset(s, 0xAA, (size_t)nsc);
                        int before = mxt_current_failures();
                        CHECK_EQ_INT(quantize_plane3(x, xb, rows, cols, pi, elems[ei], modes[mi], q, s), 0);
                        CHECK_MEM_EQ(s, so, nsc);
                        CHECK_MEM_EQ(q, qo, n);
                        checked[k] += n;
                        if (mxt_current_failures() > before) {
                            failed[k] = true;
                            printf("    shape %lldx%lld plane %d elem %d mode %d kernel %s\n", (long long)rows,
                                   (long long)cols, pi, ei, mi, kernel_label(kernels[k]));
                            goto done;
                        }
                    }
                }
    done:
        mx_kernel_select(MX_KERNEL_AUTO);
        free(x), free(xb), free(xd), free(q), free(qo), free(s), free(so);
        if (bf16_input) free(xv);
    }
    for (int k = 0; k < nk; k++) {
        char what[128];
        snprintf(what, sizeof what, "%lld elements equal to the oracle", (long long)checked[k]);
        kernel_report(kernels[k], failed[k], what);
    }
    report_unavailable();
}

static void check_against_oracle(bool bf16_input) {
    check_against_oracle_ex(bf16_input, false, PLANE_ROWWISE | PLANE_COLWISE, shapes, N_SHAPES);
}

static void test_quantize_f32_against_oracle(void) { check_against_oracle(false); }
static void test_quantize_bf16_against_oracle(void) { check_against_oracle(true); }

/* fill_zone's dense FP8-subnormal cases on every plane, with extra shapes of many tiles. */
static const int64_t zone_shapes[][2] = {{32, 32}, {33, 65}, {64, 64}, {70, 97}, {1, 200}, {97, 40}, {129, 7},
                                         {40, 257}, {128, 256}, {96, 161}, {64, 87}};
enum { N_ZONE_SHAPES = sizeof zone_shapes / sizeof zone_shapes[0] };

static void test_quantize_bf16_zone_against_oracle(void) {
    for (int rep = 0; rep < 3 && !mxt_current_failures(); rep++)
        check_against_oracle_ex(true, true, PLANE_ROWWISE | PLANE_COLWISE | PLANE_TILES, zone_shapes, N_ZONE_SHAPES);
}

static void test_quantize_f32_zone_against_oracle(void) {
    check_against_oracle_ex(false, true, PLANE_ROWWISE | PLANE_COLWISE | PLANE_TILES, zone_shapes, N_ZONE_SHAPES);
}

/* 32x32 tiles against the oracle, whose block is then a 32x32 tile, on the odd shapes. */
static void test_tiles_f32_against_oracle(void) {
    check_against_oracle_ex(false, false, PLANE_TILES, shapes, N_SHAPES);
}

static void test_tiles_bf16_against_oracle(void) {
    check_against_oracle_ex(true, false, PLANE_TILES, shapes, N_SHAPES);
}

/* The fill above really lands elements in the FP8 subnormal range of their blocks, for
 * both formats and both planes: counted here with the oracle's own scales. */
static void test_zone_fill_is_dense(void) {
    const int64_t rows = 128, cols = 256, n = rows * cols;
    float *x = malloc((size_t)n * 4);
    fill_zone(x, rows, cols);
    uint16_t *xb = to_bf16(x, n);
    float *xv = bf16_values(xb, n);
    double *xd = to_double(xv, n);
    uint8_t *q = malloc((size_t)n), *s = malloc((size_t)n);
    for (int ei = 0; ei < 2; ei++)
        for (int pi = 0; pi < 3; pi++) {
            static const int extent[3][2] = {{1, 32}, {32, 1}, {32, 32}};
            const fmt_oracle *f = oracle_of(elems[ei]);
            oracle_quantize_blocks(xd, rows, cols, extent[pi][0], extent[pi][1], f, MX_SCALE_FLOOR, q, s);
            int64_t subnormal = 0, zero_but_nonzero = 0, bf16_sub = 0;
            for (int64_t i = 0; i < n; i++) {
                int c = q[i] & 0x7F;
                if (c >= 1 && c < (1 << f->mbits)) subnormal++;
                if (c == 0 && xd[i] != 0) zero_but_nonzero++;
                if ((xb[i] & 0x7F80) == 0 && (xb[i] & 0x7F)) bf16_sub++;
            }
            CHECK(subnormal > n / 50);        // thousands of FP8 subnormal codes per plane
            CHECK(zero_but_nonzero > n / 50); // and values flushed below the grid
            CHECK(bf16_sub > n / 100);
        }
    free(x), free(xb), free(xv), free(xd), free(q), free(s);
}

/* The hard cases one by one, where a human can read the expected bytes. */
static void test_special_blocks(void) {
    mx_kernel kernels[MAX_KERNELS];
    int nk = available_kernels(kernels);
    for (int k = 0; k < nk; k++) {
        mx_kernel_select(kernels[k]);
        int before = mxt_current_failures();
        float x[64];
        uint8_t q[64], s[2];
        // block 0: a NaN among finite values -> scale 0xFF, every element NaN.
        // block 1: all -0.0 -> scale 0, every element -0.
        for (int i = 0; i < 32; i++) x[i] = (float)i;
        x[7] = NAN;
        for (int i = 32; i < 64; i++) x[i] = -0.0f;
        CHECK_EQ_INT(mx_quantize_f32(x, 1, 64, MX_ROWWISE, MX_E4M3, MX_SCALE_FLOOR, q, s), 0);
        CHECK_EQ_HEX(s[0], 0xFF);
        CHECK_EQ_HEX(s[1], 0);
        for (int i = 0; i < 32; i++) CHECK_EQ_HEX(q[i], 0x7F);
        for (int i = 32; i < 64; i++) CHECK_EQ_HEX(q[i], 0x80);
        // an infinity poisons its block in both formats
        x[7] = -INFINITY;
        CHECK_EQ_INT(mx_quantize_f32(x, 1, 64, MX_ROWWISE, MX_E5M2, MX_SCALE_RCEIL, q, s), 0);
        CHECK_EQ_HEX(s[0], 0xFF);
        CHECK_EQ_HEX(q[0], 0x7F);
        // partial block of 3 behaves as if zero-padded: [448, -1, 0.5] -> scale 2^0
        float p[3] = {448.0f, -1.0f, 0.5f};
        uint8_t pq[3], ps[1];
        CHECK_EQ_INT(mx_quantize_f32(p, 1, 3, MX_ROWWISE, MX_E4M3, MX_SCALE_FLOOR, pq, ps), 0);
        CHECK_EQ_HEX(ps[0], 127);
        CHECK_EQ_HEX(pq[0], 0x7E);
        CHECK_EQ_HEX(pq[1], 0xB8);
        CHECK_EQ_HEX(pq[2], 0x30);
        // colwise partial block down a 3x1 column gives the same bytes
        CHECK_EQ_INT(mx_quantize_f32(p, 3, 1, MX_COLWISE, MX_E4M3, MX_SCALE_FLOOR, pq, ps), 0);
        CHECK_EQ_HEX(ps[0], 127);
        CHECK_EQ_HEX(pq[0], 0x7E);
        CHECK_EQ_HEX(pq[1], 0xB8);
        // fp32 subnormals: amax 2^-140 gives the clamped scale 2^-127, so 2^-140 becomes
        // 2^-13 (an E5M2 normal) and -2^-149 becomes -2^-22, flushed to -0.
        float sub[2] = {ldexpf(1, -140), -ldexpf(1, -149)};
        uint8_t sq[2], ss[1];
        CHECK_EQ_INT(mx_quantize_f32(sub, 1, 2, MX_ROWWISE, MX_E5M2, MX_SCALE_FLOOR, sq, ss), 0);
        CHECK_EQ_HEX(ss[0], 0);
        CHECK_EQ_DBL(mx_fp8_to_f32(sq[0], MX_E5M2), ldexp(1, -13));
        CHECK_EQ_HEX(sq[1], 0x80);                    // flushed to zero, sign kept
        kernel_report(kernels[k], mxt_current_failures() > before, "the hand-checked blocks");
    }
    report_unavailable();
    mx_kernel_select(MX_KERNEL_AUTO);
}

/* FLOOR saturates the largest values of a block whose amax mantissa is >= 1.75; RCEIL
 * never does. Counted over random blocks against the exact rule. */
static void test_floor_saturation(void) {
    for (int ei = 0; ei < 2; ei++) {
        const fmt_oracle *f = oracle_of(elems[ei]);
        int saturated_blocks = 0;
        for (int t = 0; t < 2000; t++) {
            float x[32];
            for (int i = 0; i < 32; i++) x[i] = f32_from_bits(random_f32_bits(120, 130));
            float amax = 0;
            for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[i]));
            uint8_t q[32], s[1];
            CHECK_EQ_INT(mx_quantize_f32(x, 1, 32, MX_ROWWISE, elems[ei], MX_SCALE_FLOOR, q, s), 0);
            int mant_ge_175 = (bits_of_f32(amax) & 0x7FFFFF) >= 0x600000;
            int hit_max = 0;
            for (int i = 0; i < 32; i++) hit_max |= (q[i] & 0x7F) == f->max_code && fabsf(x[i]) * ldexp(1, 127 - s[0]) > f->max;
            // amax / scale is in [2^emax, 2^(emax+1)): beyond max exactly when mantissa > max's (1.75)
            CHECK_EQ_INT(hit_max, (bits_of_f32(amax) & 0x7FFFFF) > 0x600000);
            saturated_blocks += mant_ge_175;
            CHECK_EQ_INT(mx_quantize_f32(x, 1, 32, MX_ROWWISE, elems[ei], MX_SCALE_RCEIL, q, s), 0);
            for (int i = 0; i < 32; i++) CHECK(fabs(x[i]) * ldexp(1, 127 - s[0]) <= f->max * (1 + 1e-6));
        }
        CHECK(saturated_blocks > 100);
    }
}

/* The dual-plane entry points give exactly the two single planes. */
static void test_dual_equals_single(void) {
    mx_kernel kernels[MAX_KERNELS];
    int nk = available_kernels(kernels);
    const int64_t dims[][2] = {{1, 1}, {33, 65}, {64, 96}, {97, 31}, {300, 301}};
    for (int k = 0; k < nk; k++) {
        mx_kernel_select(kernels[k]);
        int before = mxt_current_failures();
        for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
            int64_t rows = dims[di][0], cols = dims[di][1], n = rows * cols;
            int64_t nr = mx_scale_count(rows, cols, MX_ROWWISE), nc = mx_scale_count(rows, cols, MX_COLWISE);
            float *x = malloc((size_t)n * 4);
            fill_matrix(x, n, FILL_SPECIAL);
            uint16_t *xb = to_bf16(x, n);
            uint8_t *q1 = malloc((size_t)n), *q2 = malloc((size_t)n), *q3 = malloc((size_t)n), *q4 = malloc((size_t)n);
            uint8_t *s1 = malloc((size_t)nr), *s2 = malloc((size_t)nc), *s3 = malloc((size_t)nr), *s4 = malloc((size_t)nc);
            for (int ei = 0; ei < 2; ei++)
                for (int mi = 0; mi < 2; mi++)
                    for (int bf = 0; bf < 2; bf++) {
                        if (bf) {
                            CHECK_EQ_INT(mx_quantize_dual_bf16(xb, rows, cols, elems[ei], modes[mi], q1, s1, q2, s2), 0);
                            CHECK_EQ_INT(mx_quantize_bf16(xb, rows, cols, MX_ROWWISE, elems[ei], modes[mi], q3, s3), 0);
                            CHECK_EQ_INT(mx_quantize_bf16(xb, rows, cols, MX_COLWISE, elems[ei], modes[mi], q4, s4), 0);
                        } else {
                            CHECK_EQ_INT(mx_quantize_dual_f32(x, rows, cols, elems[ei], modes[mi], q1, s1, q2, s2), 0);
                            CHECK_EQ_INT(mx_quantize_f32(x, rows, cols, MX_ROWWISE, elems[ei], modes[mi], q3, s3), 0);
                            CHECK_EQ_INT(mx_quantize_f32(x, rows, cols, MX_COLWISE, elems[ei], modes[mi], q4, s4), 0);
                        }
                        CHECK_MEM_EQ(q1, q3, n);
                        CHECK_MEM_EQ(s1, s3, nr);
                        CHECK_MEM_EQ(q2, q4, n);
                        CHECK_MEM_EQ(s2, s4, nc);
                    }
            free(x), free(xb), free(q1), free(q2), free(q3), free(q4), free(s1), free(s2), free(s3), free(s4);
        }
        kernel_report(kernels[k], mxt_current_failures() > before, "dual planes equal the single planes, 5 shapes");
    }
    report_unavailable();
    mx_kernel_select(MX_KERNEL_AUTO);
}

/* ---- fast kernels against the reference, bit for bit ---- */

typedef enum { PATH_DUAL, PATH_ROW, PATH_COL, PATH_TILES, N_PATHS } quant_path;
static const char *const path_names[N_PATHS] = {"dual", "rowwise", "colwise", "tiles"};

/* Quantize with the active kernel through one entry point: the planes into q[0], s[0] (and
 * for dual the colwise plane into q[1], s[1]). */
static int run_path(quant_path path, const float *x, const uint16_t *xb, int64_t rows, int64_t cols,
                    mx_elem e, mx_scale_mode m, uint8_t **q, uint8_t **s) {
    switch (path) {
    case PATH_DUAL:
        return xb ? mx_quantize_dual_bf16(xb, rows, cols, e, m, q[0], s[0], q[1], s[1])
                  : mx_quantize_dual_f32(x, rows, cols, e, m, q[0], s[0], q[1], s[1]);
    case PATH_ROW:
    case PATH_COL: {
        mx_axis axis = path == PATH_ROW ? MX_ROWWISE : MX_COLWISE;
        return xb ? mx_quantize_bf16(xb, rows, cols, axis, e, m, q[0], s[0]) : mx_quantize_f32(x, rows, cols, axis, e, m, q[0], s[0]);
    }
    default:
        return xb ? mx_quantize_tiles_bf16(xb, rows, cols, e, m, q[0], s[0]) : mx_quantize_tiles_f32(x, rows, cols, e, m, q[0], s[0]);
    }
}

/* Scale bytes of plane i of a path. */
static int64_t path_scale_count(quant_path path, int plane, int64_t rows, int64_t cols) {
    if (path == PATH_TILES) return mx_tile_scale_count(rows, cols);
    bool colwise = path == PATH_COL || (path == PATH_DUAL && plane == 1);
    return mx_scale_count(rows, cols, colwise ? MX_COLWISE : MX_ROWWISE);
}

typedef struct {
    uint8_t *qa[2], *sa[2], *qb[2], *sb[2];   // the reference's planes, a fast kernel's
    int64_t checked[MAX_KERNELS], tile_checked[MAX_KERNELS];
    bool failed[MAX_KERNELS];
} compare_state;

static void compare_alloc(compare_state *st, int64_t rows, int64_t cols) {
    memset(st, 0, sizeof *st);
    size_t n = (size_t)(rows * cols + rows + cols + 1);   // room for any plane's scales
    for (int p = 0; p < 2; p++)
        st->qa[p] = malloc(n), st->sa[p] = malloc(n), st->qb[p] = malloc(n), st->sb[p] = malloc(n);
}

static void compare_free(compare_state *st) {
    for (int p = 0; p < 2; p++) free(st->qa[p]), free(st->sa[p]), free(st->qb[p]), free(st->sb[p]);
}

/* One input through the paths in path_mask: the reference once per path, then every fast
 * kernel, compared with it byte for byte. */
static void compare_with_reference(compare_state *st, const mx_kernel *fast, int nf, int path_mask, const float *x,
                                   const uint16_t *xb, int64_t rows, int64_t cols, mx_elem e, mx_scale_mode m) {
    int64_t n = rows * cols;
    for (int path = 0; path < N_PATHS; path++) {
        if (!(path_mask >> path & 1)) continue;
        int planes = path == PATH_DUAL ? 2 : 1;
        mx_kernel_select(MX_KERNEL_REF);
        CHECK_EQ_INT(run_path((quant_path)path, x, xb, rows, cols, e, m, st->qa, st->sa), 0);
        for (int k = 0; k < nf; k++) {
            int before = mxt_current_failures();
            CHECK_EQ_INT(mx_kernel_select(fast[k]), 0);
            for (int p = 0; p < planes; p++) memset(st->qb[p], 0xAA, (size_t)n);
            CHECK_EQ_INT(run_path((quant_path)path, x, xb, rows, cols, e, m, st->qb, st->sb), 0);
            for (int p = 0; p < planes; p++) {
                CHECK_MEM_EQ(st->qa[p], st->qb[p], n);
                CHECK_MEM_EQ(st->sa[p], st->sb[p], path_scale_count((quant_path)path, p, rows, cols));
            }
            st->checked[k] += planes * n;
            if (path == PATH_TILES) st->tile_checked[k] += n;
            if (mxt_current_failures() > before) {
                st->failed[k] = true;
                printf("    %lldx%lld %s path, %s %s, %s input, kernel %s\n", (long long)rows, (long long)cols,
                       path_names[path], mx_elem_traits_of(e)->name, m == MX_SCALE_FLOOR ? "floor" : "rceil",
                       xb ? "bf16" : "fp32", kernel_label(fast[k]));
            }
        }
    }
    mx_kernel_select(MX_KERNEL_AUTO);
}

/* Every fast kernel equals the reference on millions of elements of widely varying
 * magnitude, every format, mode, input type and entry point (dual, rowwise, colwise,
 * tiles); large enough to run on several threads. */
static void test_fast_path_equals_reference(void) {
    mx_kernel fast[MAX_KERNELS];
    int nf = fast_kernels(fast);
    if (nf == 0) {
        report_unavailable();
        printf("    no SIMD kernel runs on this CPU: only the reference exists here\n");
        CHECK(mx_kernel_select(MX_KERNEL_AVX2) == MX_EUNSUPPORTED);
        return;
    }
    const int64_t rows = 515, cols = 1027, n = rows * cols;   // 529k elements, odd edges
    float *x = malloc((size_t)n * 4);
    compare_state st;
    compare_alloc(&st, rows, cols);
    for (int round = 0; round < 6 && !mxt_current_failures(); round++) {
        // rounds 4 and 5: dense FP8-subnormal cases, zeros and bf16 subnormals (fill_zone)
        if (round < 4) fill_matrix(x, n, round % 2 ? FILL_SPECIAL : FILL_WIDE);
        else fill_zone(x, rows, cols);
        uint16_t *xb = to_bf16(x, n);
        for (int ei = 0; ei < 2; ei++)
            for (int mi = 0; mi < 2; mi++)
                for (int bf = 0; bf < 2; bf++)
                    compare_with_reference(&st, fast, nf, (1 << N_PATHS) - 1, x, bf ? xb : NULL, rows, cols,
                                           elems[ei], modes[mi]);
        free(xb);
    }
    for (int k = 0; k < nf; k++) {
        if (!st.failed[k]) {
            CHECK(st.checked[k] > 10 * 1000 * 1000);
            CHECK(st.tile_checked[k] > 1000 * 1000);
        }
        char what[128];
        snprintf(what, sizeof what, "%lld elements equal to the reference (%lld of them in tiles)",
                 (long long)st.checked[k], (long long)st.tile_checked[k]);
        kernel_report(fast[k], st.failed[k], what);
    }
    report_unavailable();
    free(x);
    compare_free(&st);
}

/* Every bf16 magnitude under every block scale: block i is one row of 32 whose element 0
 * is the largest value of binade E (so it fixes the scale), the other 31 walk through every
 * bf16 pattern of exponent <= E with both signs. Every fast kernel must equal the reference
 * on the dual planes and the tiles (whose colwise and tile blocks then mix binades, which
 * is fine). */
static void test_bf16_exhaustive_fast_equals_reference(void) {
    mx_kernel fast[MAX_KERNELS];
    int nf = fast_kernels(fast);
    if (nf == 0) {
        report_unavailable();
        printf("    no SIMD kernel runs on this CPU: only the reference exists here\n");
        return;
    }
    int64_t n = 0;
    for (int e = 0; e < 255; e++) n += ((int64_t)(e + 1) * 128 * 2 + 30) / 31 * 32;
    int64_t rows = n / 32, cols = 32;
    uint16_t *x = malloc((size_t)n * 2);
    int64_t i = 0;
    for (int e = 0; e < 255; e++) {
        int64_t count = (int64_t)(e + 1) * 128 * 2, k = 0;
        while (k < count) {
            x[i++] = (uint16_t)(e << 7 | 0x7F);                   // the block maximum
            for (int j = 1; j < 32; j++, k++) {
                int64_t v = k < count ? k : count - 1;
                x[i++] = (uint16_t)((v & 1) << 15 | v >> 1);     // every pattern of exponent <= e, +/-
            }
        }
    }
    CHECK_EQ_INT(i, n);
    compare_state st;
    compare_alloc(&st, rows, cols);
    for (int ei = 0; ei < 2 && !mxt_current_failures(); ei++)
        for (int mi = 0; mi < 2 && !mxt_current_failures(); mi++)
            compare_with_reference(&st, fast, nf, 1 << PATH_DUAL | 1 << PATH_TILES, NULL, x, rows, cols, elems[ei], modes[mi]);
    for (int k = 0; k < nf; k++) {
        char what[128];
        snprintf(what, sizeof what, "%lld elements equal to the reference", (long long)st.checked[k]);
        kernel_report(fast[k], st.failed[k], what);
    }
    report_unavailable();
    free(x);
    compare_free(&st);
}

static void test_dequantize(void) {
    const int64_t rows = 45, cols = 70, n = rows * cols;
    float *x = malloc((size_t)n * 4), *y = malloc((size_t)n * 4);
    uint8_t *q = malloc((size_t)n), *s = malloc((size_t)(2 * n));
    fill_matrix(x, n, FILL_SPECIAL);
    for (int ai = 0; ai < 2; ai++)
        for (int ei = 0; ei < 2; ei++) {
            mx_axis axis = (mx_axis)ai;
            CHECK_EQ_INT(mx_quantize_f32(x, rows, cols, axis, elems[ei], MX_SCALE_FLOOR, q, s), 0);
            CHECK_EQ_INT(mx_dequantize_f32(q, s, rows, cols, axis, elems[ei], y), 0);
            for (int64_t r = 0; r < rows; r++)
                for (int64_t c = 0; c < cols; c++) {
                    uint8_t sc = axis == MX_ROWWISE ? s[r * ((cols + 31) / 32) + c / 32] : s[(r / 32) * cols + c];
                    double want = sc == 0xFF ? NAN : ldexp(oracle_decode(q[r * cols + c], oracle_of(elems[ei])), sc - 127);
                    if (isnan(want)) CHECK(isnan(y[r * cols + c]));
                    else CHECK_EQ_DBL(y[r * cols + c], want);
                }
        }
    // values already on an MX grid come back unchanged
    float g[64];
    for (int i = 0; i < 64; i++) g[i] = (float)ldexp((i % 16) - 8, i / 16 - 3);
    uint8_t gq[64], gs[2];
    float gy[64];
    CHECK_EQ_INT(mx_quantize_f32(g, 2, 32, MX_ROWWISE, MX_E4M3, MX_SCALE_FLOOR, gq, gs), 0);
    CHECK_EQ_INT(mx_dequantize_f32(gq, gs, 2, 32, MX_ROWWISE, MX_E4M3, gy), 0);
    for (int i = 0; i < 64; i++) CHECK_EQ_DBL(gy[i], g[i]);
    free(x), free(y), free(q), free(s);
}

/* 32x32 tiles by hand: one scale per tile from the tile's maximum, wherever it sits. */
static void test_tiles_special(void) {
    mx_kernel kernels[MAX_KERNELS];
    int nk = available_kernels(kernels);
    enum { R = 40, C = 70 };   // 2 x 3 tiles, the last row and column of tiles partial
    static float x[R * C];
    static uint16_t xb[R * C];
    static uint8_t q[R * C], q2[R * C], q3[R * C], s[6], s2[R * 3], s3[2 * C];
    CHECK_EQ_INT(mx_tile_scale_count(R, C), 6);
    for (int k = 0; k < nk; k++) {
        mx_kernel_select(kernels[k]);
        int before = mxt_current_failures();
        for (int bf = 0; bf < 2; bf++) {
            for (int i = 0; i < R * C; i++) x[i] = 1.0f;
            x[5 * C + 40] = 448.0f;     // tile (0, 1)
            x[35 * C + 3] = -957.0f;    // tile (1, 0): mantissa 1.87, saturates under FLOOR
            for (int i = 0; i < R * C; i++) xb[i] = (uint16_t)(bits_of_f32(x[i]) >> 16);   // all exact in bf16
            int rc = bf ? mx_quantize_tiles_bf16(xb, R, C, MX_E4M3, MX_SCALE_FLOOR, q, s)
                        : mx_quantize_tiles_f32(x, R, C, MX_E4M3, MX_SCALE_FLOOR, q, s);
            CHECK_EQ_INT(rc, 0);
            // amax 1 -> 2^(0-8); 448 -> 2^(8-8); 957 -> 2^(9-8)
            const uint8_t want_s[6] = {119, 127, 119, 128, 119, 119};
            CHECK_MEM_EQ(s, want_s, 6);
            CHECK_EQ_HEX(q[0], 0x78);                 // 1 * 2^8 = 256
            CHECK_EQ_HEX(q[5 * C + 40], 0x7E);        // 448
            CHECK_EQ_HEX(q[5 * C + 41], 0x38);        // 1 in the 448 tile
            CHECK_EQ_HEX(q[35 * C + 3], 0xFE);        // -957 / 2 = -478.5 saturates to -448
            CHECK_EQ_HEX(q[35 * C + 4], 0x30);        // 0.5
            CHECK_EQ_HEX(q[39 * C + 31], 0x30);       // the partial tile's last row
            CHECK_EQ_HEX(q[39 * C + 69], 0x78);       // the corner of the partial corner tile
            // a NaN poisons its tile only; so does an infinity; an all -0 tile is scale 0
            x[10 * C + 65] = NAN;
            x[33 * C + 50] = -INFINITY;
            for (int r = 32; r < R; r++)
                for (int c = 64; c < C; c++) x[r * C + c] = -0.0f;
            for (int i = 0; i < R * C; i++) xb[i] = (uint16_t)(bits_of_f32(x[i]) >> 16);
            rc = bf ? mx_quantize_tiles_bf16(xb, R, C, MX_E5M2, MX_SCALE_RCEIL, q, s)
                    : mx_quantize_tiles_f32(x, R, C, MX_E5M2, MX_SCALE_RCEIL, q, s);
            CHECK_EQ_INT(rc, 0);
            CHECK_EQ_HEX(s[2], 0xFF);
            CHECK_EQ_HEX(s[4], 0xFF);
            CHECK_EQ_HEX(s[5], 0);
            for (int r = 0; r < 32; r++)
                for (int c = 64; c < C; c++) CHECK_EQ_HEX(q[r * C + c], 0x7F);
            for (int r = 32; r < R; r++)
                for (int c = 32; c < 64; c++) CHECK_EQ_HEX(q[r * C + c], 0x7F);
            for (int r = 32; r < R; r++)
                for (int c = 64; c < C; c++) CHECK_EQ_HEX(q[r * C + c], 0x80);
            // RCEIL: 1 / 57344 rounds up to 2^-15 (code 112); 1 -> 2^15 = E5M2 0x78
            CHECK_EQ_HEX(s[0], 112);
            CHECK_EQ_HEX(q[0], 0x78);
            if (mxt_current_failures()) {
                printf("    kernel %s bf16 %d\n", kernel_label(kernels[k]), bf);
                break;
            }
        }
        // one shared scale along both axes: on a matrix whose every 32-block holds the same
        // maximum, the tile plane is byte for byte the rowwise and the colwise plane
        for (int r = 0; r < R; r++)
            for (int c = 0; c < C; c++) x[r * C + c] = (r + c) % 32 == 0 ? 3.0f : (float)((r * 7 + c * 3) % 11) * 0.25f;
        CHECK_EQ_INT(mx_quantize_tiles_f32(x, R, C, MX_E4M3, MX_SCALE_FLOOR, q, s), 0);
        CHECK_EQ_INT(mx_quantize_dual_f32(x, R, C, MX_E4M3, MX_SCALE_FLOOR, q2, s2, q3, s3), 0);
        CHECK_MEM_EQ(q, q2, R * C);
        CHECK_MEM_EQ(q, q3, R * C);
        kernel_report(kernels[k], mxt_current_failures() > before, "the hand-checked tiles");
    }
    report_unavailable();
    mx_kernel_select(MX_KERNEL_AUTO);
}

static void test_tiles_dequantize(void) {
    const int64_t rows = 45, cols = 70, n = rows * cols, cb = (cols + 31) / 32;
    float *x = malloc((size_t)n * 4), *y = malloc((size_t)n * 4);
    uint8_t *q = malloc((size_t)n), *s = malloc((size_t)mx_tile_scale_count(rows, cols));
    for (int fill = 0; fill < 2; fill++) {
        if (fill) fill_zone(x, rows, cols);
        else fill_matrix(x, n, FILL_SPECIAL);
        for (int ei = 0; ei < 2; ei++) {
            CHECK_EQ_INT(mx_quantize_tiles_f32(x, rows, cols, elems[ei], MX_SCALE_FLOOR, q, s), 0);
            CHECK_EQ_INT(mx_dequantize_tiles_f32(q, s, rows, cols, elems[ei], y), 0);
            for (int64_t r = 0; r < rows; r++)
                for (int64_t c = 0; c < cols; c++) {
                    uint8_t sc = s[(r / 32) * cb + c / 32];
                    double want = sc == 0xFF ? NAN : ldexp(oracle_decode(q[r * cols + c], oracle_of(elems[ei])), sc - 127);
                    if (isnan(want)) CHECK(isnan(y[r * cols + c]));
                    else CHECK_EQ_DBL(y[r * cols + c], want);
                }
        }
    }
    // values already on the grid of their tile come back unchanged
    float g[64 * 40], gy[64 * 40];
    uint8_t gq[64 * 40], gs[4];
    for (int i = 0; i < 64 * 40; i++) g[i] = (float)ldexp((i % 16) - 8, (i / 40) % 4 - 3);
    CHECK_EQ_INT(mx_quantize_tiles_f32(g, 64, 40, MX_E4M3, MX_SCALE_FLOOR, gq, gs), 0);
    CHECK_EQ_INT(mx_dequantize_tiles_f32(gq, gs, 64, 40, MX_E4M3, gy), 0);
    for (int i = 0; i < 64 * 40; i++) CHECK_EQ_DBL(gy[i], g[i]);
    free(x), free(y), free(q), free(s);
}

static const mxt_test tests[] = {
    {"traits", test_traits},
    {"decode_every_code", test_decode_every_code},
    {"reencode_every_code", test_reencode_every_code},
    {"encode_against_oracle", test_encode_against_oracle},
    {"e8m0", test_e8m0},
    {"scale_code_against_oracle", test_scale_code_against_oracle},
    {"quantize_f32_against_oracle", test_quantize_f32_against_oracle},
    {"quantize_bf16_against_oracle", test_quantize_bf16_against_oracle},
    {"special_blocks", test_special_blocks},
    {"floor_saturation", test_floor_saturation},
    {"dual_equals_single", test_dual_equals_single},
    {"quantize_bf16_zone_against_oracle", test_quantize_bf16_zone_against_oracle},
    {"quantize_f32_zone_against_oracle", test_quantize_f32_zone_against_oracle},
    {"zone_fill_is_dense", test_zone_fill_is_dense},
    {"tiles_f32_against_oracle", test_tiles_f32_against_oracle},
    {"tiles_bf16_against_oracle", test_tiles_bf16_against_oracle},
    {"tiles_special", test_tiles_special},
    {"tiles_dequantize", test_tiles_dequantize},
    {"fast_path_equals_reference", test_fast_path_equals_reference},
    {"bf16_exhaustive_fast_equals_reference", test_bf16_exhaustive_fast_equals_reference},
    {"dequantize", test_dequantize},
};

int main(int argc, char **argv) {
    oracle_build(&E4M3);
    oracle_build(&E5M2);
    printf("# kernel in use: %s\n", kernel_label(mx_kernel_active()));
    return MXT_RUN(tests, argc, argv);
}
