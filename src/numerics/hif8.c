/* The HiF8 element format (Ascend HiFloat8, arXiv 2409.16626) as data, and its codec.
 *
 * After the sign, a dot prefix names a band of exponents; the band fixes how many bits the
 * exponent and the mantissa get (tapered precision: 3 mantissa bits near 1, 1 bit near
 * 2^+-15). The exponent field is sign-magnitude without bias: its top bit is the exponent's
 * sign, the rest is |E| minus the band's smallest |E| (its implicit leading one). Prefix
 * 0000 holds the denormals 2^(M-23), M = 1..7. */
#include <math.h>
#include <pthread.h>
#include <stdbool.h>

#include "core/bits.h"
#include "mxtrain/scaled.h"
#include "numerics/mx_internal.h"

typedef struct {
    uint8_t prefix, mask;  // (code & 0x7F & mask) == prefix selects the band
    int abs_lo, abs_hi;    // |E| range
    int absbits, mbits;    // magnitude bits of the exponent field (after its sign bit), mantissa bits
} hif8_band;

static const hif8_band hif8_bands[] = {
    {.prefix = 0x60, .mask = 0x60, .abs_lo = 8, .abs_hi = 15, .absbits = 3, .mbits = 1},  // dot 11
    {.prefix = 0x40, .mask = 0x60, .abs_lo = 4, .abs_hi = 7, .absbits = 2, .mbits = 2},   // dot 10
    {.prefix = 0x20, .mask = 0x60, .abs_lo = 2, .abs_hi = 3, .absbits = 1, .mbits = 3},   // dot 01
    {.prefix = 0x10, .mask = 0x70, .abs_lo = 1, .abs_hi = 1, .absbits = 0, .mbits = 3},   // dot 001
    {.prefix = 0x08, .mask = 0x78, .abs_lo = 0, .abs_hi = 0, .absbits = 0, .mbits = 3},   // dot 0001, E = 0
};
enum { HIF8_BANDS = sizeof hif8_bands / sizeof hif8_bands[0] };

static const hif8_band *band_of_exp(int e) {
    int a = e < 0 ? -e : e;
    for (int i = 0; i < HIF8_BANDS; i++)
        if (a >= hif8_bands[i].abs_lo && a <= hif8_bands[i].abs_hi) return &hif8_bands[i];
    return NULL;
}

float mx_hif8_to_f32(uint8_t code) {
    float sign = (code & 0x80) ? -1.0f : 1.0f;
    uint8_t c = code & 0x7F;
    if (code == MX_HIF8_NAN) return NAN;
    if (c == MX_HIF8_INF) return sign * INFINITY;
    if ((c & 0x78) == 0) return c ? sign * ldexpf(1.0f, (int)c - 23) : 0.0f;   // denormals, zero
    for (int i = 0; i < HIF8_BANDS; i++) {
        const hif8_band *b = &hif8_bands[i];
        if ((c & b->mask) != b->prefix) continue;
        int f = c & ((1 << b->mbits) - 1), e = 0;
        if (b->abs_lo > 0) {
            int field = c >> b->mbits;
            e = b->abs_lo + (field & ((1 << b->absbits) - 1));
            if (field & (1 << b->absbits)) e = -e;
        }
        return sign * ldexpf((float)((1 << b->mbits) + f), e - b->mbits);
    }
    return NAN;   // unreachable: the bands and the denormals cover every code
}

static uint8_t hif8_overflow_code(uint8_t sign, mx_hif8_overflow overflow) {
    return sign | (overflow == MX_HIF8_SATURATE ? 0x6E : MX_HIF8_INF);
}

uint8_t mx_f32_to_hif8(float x, mx_hif8_overflow overflow) {
    if (overflow != MX_HIF8_OVERFLOW_INF && overflow != MX_HIF8_SATURATE) return MX_HIF8_NAN;
    uint32_t u = mxi_f32_bits(x), ef = (u >> 23) & 0xFF, mf = u & 0x7FFFFFu;
    uint8_t sign = (u >> 31) ? 0x80 : 0;
    if (ef == 0xFF) return mf ? MX_HIF8_NAN : hif8_overflow_code(sign, overflow);
    if (ef == 0) return 0;                                // zeros and fp32 subnormals (< 2^-126)
    int p = (int)ef - 127;                                // |x| in [2^p, 2^(p+1))
    if (p < -23) return 0;
    if (p == -23) return sign | 0x01;                     // [2^-23, 2^-22): ties away to 2^-22
    if (p >= 16) return hif8_overflow_code(sign, overflow);
    // Round the 24-bit significand to the band's mantissa bits, ties away from zero (the
    // denormal binades -22..-16 keep no mantissa bit: their grid is 2^p, 2^(p+1)).
    int mb = p < -15 ? 0 : band_of_exp(p)->mbits;
    uint32_t m = mf | 0x800000u;
    int sh = 23 - mb;
    uint32_t n = (m >> sh) + ((m >> (sh - 1)) & 1u);
    if (n == (2u << mb)) {                                // carried into the next binade
        p += 1;
        n = 1u << mb;
    }
    uint32_t f = n - (1u << mb);
    if (p < -15) return sign | (uint8_t)(p + 23);          // a denormal (f is 0 there)
    if (p == 16 || (p == 15 && f != 0)) return hif8_overflow_code(sign, overflow);
    const hif8_band *b = band_of_exp(p);                 // f is 0 after a carry: any band fits
    int a = p < 0 ? -p : p;
    uint32_t code = b->prefix | f;
    if (b->abs_lo > 0) {
        uint32_t field = (uint32_t)(a - b->abs_lo) | (p < 0 ? 1u << b->absbits : 0);
        code |= field << b->mbits;
    }
    return sign | (uint8_t)code;
}

static mxi_hif8_rounding rounding;
static pthread_once_t rounding_once = PTHREAD_ONCE_INIT;

static void rounding_fill(void) {
    for (int ef = 0; ef < 257; ef++) {
        int p = ef - 127;
        bool coded = p >= -23 && p <= 15;
        const hif8_band *b = p < -15 ? NULL : band_of_exp(p);
        int sh = 23 - (coded && b ? b->mbits : 0);
        if (ef < 256) rounding.step[ef] = 1u << (sh - 1) | (uint32_t)sh;
        rounding.code[ef] = coded ? mx_f32_to_hif8(ldexpf(1.0f, p), MX_HIF8_SATURATE) : 0;
    }
}

const mxi_hif8_rounding *mxi_hif8_rounding_table(void) {
    pthread_once(&rounding_once, rounding_fill);
    return &rounding;
}
