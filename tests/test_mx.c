/* MX numerics against an independent exact oracle written here.
 *
 * The oracle shares no code with the library: it enumerates each FP8 format's value grid
 * from the format's definition, finds the nearest grid value by comparing against exact
 * midpoints in double (every fp32 times a power of two, and every midpoint of two FP8 grid
 * values, is exact in double), and takes block exponents with frexp. Every kernel the CPU
 * can run (the scalar reference and the SIMD fast path) is checked against it, and the fast
 * path against the reference bit for bit on millions of random elements. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "harness.h"
#include "mxtrain/mx.h"

/* ---- random numbers ---- */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rng_next(void) {   // splitmix64
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
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

/* Quantize a (rows x cols) matrix given as exact doubles, one plane, into q and s. */
static void oracle_quantize(const double *x, int64_t rows, int64_t cols, mx_axis axis,
                            const fmt_oracle *f, mx_scale_mode mode, uint8_t *q, uint8_t *s) {
    int64_t nb_outer = axis == MX_ROWWISE ? rows : (rows + 31) / 32;
    int64_t nb_inner = axis == MX_ROWWISE ? (cols + 31) / 32 : cols;
    for (int64_t bo = 0; bo < nb_outer; bo++)
        for (int64_t bi = 0; bi < nb_inner; bi++) {
            int64_t idx[32];
            double mag[32];
            int n = 0;
            for (int k = 0; k < 32; k++) {
                int64_t r = axis == MX_ROWWISE ? bo : bo * 32 + k;
                int64_t c = axis == MX_ROWWISE ? bi * 32 + k : bi;
                if (r >= rows || c >= cols) break;
                idx[n] = r * cols + c;
                mag[n] = fabs(x[idx[n]]);
                n++;
            }
            int code = oracle_scale(mag, n, f, mode);
            s[bo * nb_inner + bi] = (uint8_t)code;
            for (int k = 0; k < n; k++)
                q[idx[k]] = code == 0xFF ? 0x7F : oracle_encode(ldexp(x[idx[k]], 127 - code), f);
        }
}

/* ---- kernels under test ---- */

static const mx_kernel all_kernels[] = {MX_KERNEL_REF, MX_KERNEL_AVX2};
enum { N_KERNELS = sizeof all_kernels / sizeof all_kernels[0] };

static int available_kernels(mx_kernel *out) {
    int n = 0;
    for (int i = 0; i < N_KERNELS; i++)
        if (mx_kernel_available(all_kernels[i])) out[n++] = all_kernels[i];
    return n;
}

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

static const int64_t shapes[][2] = {{1, 1}, {1, 31}, {1, 33}, {2, 32}, {33, 1}, {31, 31}, {32, 32}, {33, 65},
                                    {64, 64}, {70, 97}, {5, 200}, {97, 40}, {129, 7}, {40, 257}};
enum { N_SHAPES = sizeof shapes / sizeof shapes[0] };

/* Quantize x with the active kernel, one plane, as fp32 or bf16 input. */
static int quantize_plane(const float *x, const uint16_t *xb, int64_t rows, int64_t cols, mx_axis axis,
                          mx_elem e, mx_scale_mode m, uint8_t *q, uint8_t *s) {
    return xb ? mx_quantize_bf16(xb, rows, cols, axis, e, m, q, s) : mx_quantize_f32(x, rows, cols, axis, e, m, q, s);
}

static void check_against_oracle(bool bf16_input) {
    mx_kernel kernels[N_KERNELS];
    int nk = available_kernels(kernels);
    for (int si = 0; si < N_SHAPES; si++) {
        int64_t rows = shapes[si][0], cols = shapes[si][1], n = rows * cols;
        float *x = malloc((size_t)n * sizeof *x);
        fill_matrix(x, n, si % 2 ? FILL_SPECIAL : FILL_WIDE);
        uint16_t *xb = bf16_input ? to_bf16(x, n) : NULL;
        float *xv = bf16_input ? bf16_values(xb, n) : x;
        double *xd = to_double(xv, n);
        uint8_t *q = malloc((size_t)n), *qo = malloc((size_t)n);
        int64_t ns = (rows + 31) / 32 * cols + rows * ((cols + 31) / 32);
        uint8_t *s = malloc((size_t)ns), *so = malloc((size_t)ns);
        for (int ai = 0; ai < 2; ai++)
            for (int ei = 0; ei < 2; ei++)
                for (int mi = 0; mi < 2; mi++) {
                    mx_axis axis = (mx_axis)ai;
                    int64_t nsc = mx_scale_count(rows, cols, axis);
                    oracle_quantize(xd, rows, cols, axis, oracle_of(elems[ei]), modes[mi], qo, so);
                    for (int k = 0; k < nk; k++) {
                        mx_kernel_select(kernels[k]);
                        memset(q, 0xAA, (size_t)n);
                        memset(s, 0xAA, (size_t)nsc);
                        CHECK_EQ_INT(quantize_plane(x, xb, rows, cols, axis, elems[ei], modes[mi], q, s), 0);
                        CHECK_MEM_EQ(s, so, nsc);
                        CHECK_MEM_EQ(q, qo, n);
                        if (mxt_current_failures()) {
                            printf("    shape %lldx%lld axis %d elem %d mode %d kernel %s\n", (long long)rows,
                                   (long long)cols, ai, ei, mi, mx_kernel_name(kernels[k]));
                            goto done;
                        }
                    }
                }
    done:
        mx_kernel_select(MX_KERNEL_AUTO);
        free(x), free(xb), free(xd), free(q), free(qo), free(s), free(so);
        if (bf16_input) free(xv);
        if (mxt_current_failures()) return;
    }
}

static void test_quantize_f32_against_oracle(void) { check_against_oracle(false); }
static void test_quantize_bf16_against_oracle(void) { check_against_oracle(true); }

/* The hard cases one by one, where a human can read the expected bytes. */
static void test_special_blocks(void) {
    mx_kernel kernels[N_KERNELS];
    int nk = available_kernels(kernels);
    for (int k = 0; k < nk; k++) {
        mx_kernel_select(kernels[k]);
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
    }
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
    mx_kernel kernels[N_KERNELS];
    int nk = available_kernels(kernels);
    const int64_t dims[][2] = {{1, 1}, {33, 65}, {64, 96}, {97, 31}, {300, 301}};
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
        int64_t rows = dims[di][0], cols = dims[di][1], n = rows * cols;
        int64_t nr = mx_scale_count(rows, cols, MX_ROWWISE), nc = mx_scale_count(rows, cols, MX_COLWISE);
        float *x = malloc((size_t)n * 4);
        fill_matrix(x, n, FILL_SPECIAL);
        uint16_t *xb = to_bf16(x, n);
        uint8_t *q1 = malloc((size_t)n), *q2 = malloc((size_t)n), *q3 = malloc((size_t)n), *q4 = malloc((size_t)n);
        uint8_t *s1 = malloc((size_t)nr), *s2 = malloc((size_t)nc), *s3 = malloc((size_t)nr), *s4 = malloc((size_t)nc);
        for (int k = 0; k < nk; k++) {
            mx_kernel_select(kernels[k]);
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
        }
        mx_kernel_select(MX_KERNEL_AUTO);
        free(x), free(xb), free(q1), free(q2), free(q3), free(q4), free(s1), free(s2), free(s3), free(s4);
    }
}

/* The fast path equals the reference on millions of elements of widely varying magnitude,
 * every format, mode, input type and plane; large enough to run on several threads. */
static void test_fast_path_equals_reference(void) {
    if (!mx_kernel_available(MX_KERNEL_AVX2)) {
        printf("    this CPU has no AVX2: only the reference kernel exists here\n");
        CHECK(mx_kernel_select(MX_KERNEL_AVX2) == MX_EUNSUPPORTED);
        return;
    }
    const int64_t rows = 515, cols = 1027, n = rows * cols;   // 529k elements, odd edges
    int64_t nr = mx_scale_count(rows, cols, MX_ROWWISE), nc = mx_scale_count(rows, cols, MX_COLWISE);
    float *x = malloc((size_t)n * 4);
    uint8_t *qa[2], *qb[2], *sa[2], *sb[2];
    for (int p = 0; p < 2; p++) {
        qa[p] = malloc((size_t)n), qb[p] = malloc((size_t)n);
        sa[p] = malloc((size_t)(p ? nc : nr)), sb[p] = malloc((size_t)(p ? nc : nr));
    }
    int64_t checked = 0;
    for (int round = 0; round < 4; round++) {
        fill_matrix(x, n, round % 2 ? FILL_SPECIAL : FILL_WIDE);
        uint16_t *xb = to_bf16(x, n);
        for (int ei = 0; ei < 2; ei++)
            for (int mi = 0; mi < 2; mi++)
                for (int bf = 0; bf < 2; bf++) {
                    for (int k = 0; k < 2; k++) {
                        mx_kernel_select(k ? MX_KERNEL_AVX2 : MX_KERNEL_REF);
                        uint8_t **q = k ? qb : qa, **s = k ? sb : sa;
                        int rc = bf ? mx_quantize_dual_bf16(xb, rows, cols, elems[ei], modes[mi], q[0], s[0], q[1], s[1])
                                    : mx_quantize_dual_f32(x, rows, cols, elems[ei], modes[mi], q[0], s[0], q[1], s[1]);
                        CHECK_EQ_INT(rc, 0);
                    }
                    CHECK_MEM_EQ(qa[0], qb[0], n);
                    CHECK_MEM_EQ(sa[0], sb[0], nr);
                    CHECK_MEM_EQ(qa[1], qb[1], n);
                    CHECK_MEM_EQ(sa[1], sb[1], nc);
                    // the rowwise-only streaming path too
                    for (int k = 0; k < 2; k++) {
                        mx_kernel_select(k ? MX_KERNEL_AVX2 : MX_KERNEL_REF);
                        int rc = bf ? mx_quantize_bf16(xb, rows, cols, MX_ROWWISE, elems[ei], modes[mi], k ? qb[0] : qa[0], k ? sb[0] : sa[0])
                                    : mx_quantize_f32(x, rows, cols, MX_ROWWISE, elems[ei], modes[mi], k ? qb[0] : qa[0], k ? sb[0] : sa[0]);
                        CHECK_EQ_INT(rc, 0);
                    }
                    CHECK_MEM_EQ(qa[0], qb[0], n);
                    CHECK_MEM_EQ(sa[0], sb[0], nr);
                    checked += 3 * n;
                }
        free(xb);
    }
    mx_kernel_select(MX_KERNEL_AUTO);
    CHECK(checked > 10 * 1000 * 1000);
    free(x);
    for (int p = 0; p < 2; p++) free(qa[p]), free(qb[p]), free(sa[p]), free(sb[p]);
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

static void test_bad_arguments(void) {
    float x[4] = {0};
    uint16_t xb[4] = {0};
    uint8_t q[4], s[4];
    float y[4];
    CHECK_EQ_INT(mx_quantize_f32(NULL, 2, 2, MX_ROWWISE, MX_E4M3, MX_SCALE_FLOOR, q, s), MX_ENULL);
    CHECK_EQ_INT(mx_quantize_f32(x, 2, 2, MX_ROWWISE, MX_E4M3, MX_SCALE_FLOOR, NULL, s), MX_ENULL);
    CHECK_EQ_INT(mx_quantize_f32(x, 2, 2, MX_ROWWISE, MX_E4M3, MX_SCALE_FLOOR, q, NULL), MX_ENULL);
    CHECK_EQ_INT(mx_quantize_f32(x, -1, 2, MX_ROWWISE, MX_E4M3, MX_SCALE_FLOOR, q, s), MX_ESIZE);
    CHECK_EQ_INT(mx_quantize_f32(x, 2, -5, MX_ROWWISE, MX_E4M3, MX_SCALE_FLOOR, q, s), MX_ESIZE);
    CHECK_EQ_INT(mx_quantize_f32(x, INT64_MAX, 3, MX_ROWWISE, MX_E4M3, MX_SCALE_FLOOR, q, s), MX_ESIZE);
    CHECK_EQ_INT(mx_quantize_f32(x, 2, 2, (mx_axis)2, MX_E4M3, MX_SCALE_FLOOR, q, s), MX_EENUM);
    CHECK_EQ_INT(mx_quantize_f32(x, 2, 2, MX_ROWWISE, (mx_elem)2, MX_SCALE_FLOOR, q, s), MX_EENUM);
    CHECK_EQ_INT(mx_quantize_f32(x, 2, 2, MX_ROWWISE, MX_E4M3, (mx_scale_mode)-1, q, s), MX_EENUM);
    CHECK_EQ_INT(mx_quantize_bf16(xb, 2, 2, MX_COLWISE, (mx_elem)9, MX_SCALE_FLOOR, q, s), MX_EENUM);
    CHECK_EQ_INT(mx_quantize_bf16(NULL, 2, 2, MX_COLWISE, MX_E5M2, MX_SCALE_FLOOR, q, s), MX_ENULL);
    CHECK_EQ_INT(mx_quantize_dual_f32(x, 2, 2, MX_E4M3, MX_SCALE_FLOOR, q, s, NULL, s), MX_ENULL);
    CHECK_EQ_INT(mx_quantize_dual_bf16(xb, 2, -2, MX_E4M3, MX_SCALE_FLOOR, q, s, q, s), MX_ESIZE);
    CHECK_EQ_INT(mx_dequantize_f32(q, s, 2, 2, (mx_axis)5, MX_E4M3, y), MX_EENUM);
    CHECK_EQ_INT(mx_dequantize_f32(q, NULL, 2, 2, MX_ROWWISE, MX_E4M3, y), MX_ENULL);
    CHECK_EQ_INT(mx_dequantize_f32(q, s, -2, 2, MX_ROWWISE, MX_E4M3, y), MX_ESIZE);
    CHECK_EQ_INT(mx_scale_count(3, 65, MX_ROWWISE), 9);
    CHECK_EQ_INT(mx_scale_count(65, 3, MX_COLWISE), 9);
    CHECK_EQ_INT(mx_scale_count(3, 3, (mx_axis)3), MX_EENUM);
    CHECK_EQ_INT(mx_scale_count(-3, 3, MX_ROWWISE), MX_ESIZE);
    // empty matrices are fine and write nothing
    CHECK_EQ_INT(mx_quantize_f32(x, 0, 5, MX_COLWISE, MX_E4M3, MX_SCALE_FLOOR, q, s), 0);
    CHECK_EQ_INT(mx_quantize_dual_bf16(xb, 7, 0, MX_E5M2, MX_SCALE_RCEIL, q, s, q, s), 0);
    // every code has a name and a message; unknown ones are answered too
    for (int c = 0; c >= MX_EFORMAT; c--) {
        CHECK(strcmp(mx_errname(c), "MX_EUNKNOWN") != 0);
        CHECK(strcmp(mx_strerror(c), "unknown error code") != 0);
    }
    CHECK_STR_EQ(mx_errname(-999), "MX_EUNKNOWN");
    CHECK_STR_EQ(mx_strerror(42), "unknown error code");
    CHECK_EQ_INT(mx_kernel_select((mx_kernel)77), MX_EENUM);
    CHECK(mx_kernel_name((mx_kernel)77) == NULL);
    CHECK_STR_EQ(mx_kernel_name(MX_KERNEL_REF), "ref");
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
    {"fast_path_equals_reference", test_fast_path_equals_reference},
    {"dequantize", test_dequantize},
    {"bad_arguments", test_bad_arguments},
};

int main(int argc, char **argv) {
    oracle_build(&E4M3);
    oracle_build(&E5M2);
    printf("# kernel in use: %s\n", mx_kernel_name(mx_kernel_active()));
    return MXT_RUN(tests, argc, argv);
}
