/* FP8 element formats as data, their codecs, and the E8M0 scale codec (SPEC §4). */
#include <math.h>

#include "numerics/mx_internal.h"

static float e4m3_to_f32(uint8_t code);
static float e5m2_to_f32(uint8_t code);
static uint8_t e4m3_from_f32(float x);
static uint8_t e5m2_from_f32(float x);

static const mx_elem_traits elem_traits[] = {
    [MX_E4M3] = {.name = "E4M3", .bits = 8, .ebits = 4, .mbits = 3, .bias = 7, .emax = 8, .max = 448.0f,
                 .max_code = 0x7E, .nan_code = 0x7F, .has_inf = false, .to_f32 = e4m3_to_f32, .from_f32 = e4m3_from_f32},
    [MX_E5M2] = {.name = "E5M2", .bits = 8, .ebits = 5, .mbits = 2, .bias = 15, .emax = 15, .max = 57344.0f,
                 .max_code = 0x7B, .nan_code = 0x7F, .has_inf = true, .to_f32 = e5m2_to_f32, .from_f32 = e5m2_from_f32},
};

const mx_elem_traits *mx_elem_traits_of(mx_elem elem) {
    if ((unsigned)elem >= sizeof elem_traits / sizeof elem_traits[0]) return NULL;
    return &elem_traits[elem];
}

/* Decode from the fields: subnormals are mf * 2^(1-bias-mbits), normals (2^mbits + mf) *
 * 2^(ef-bias-mbits). E4M3 spends only S.1111.111 on NaN; E5M2 has IEEE specials. */
static float fp8_decode(uint8_t code, const mx_elem_traits *t) {
    int mbits = t->mbits, emask = (1 << t->ebits) - 1;
    int ef = (code >> mbits) & emask, mf = code & ((1 << mbits) - 1);
    float sign = (code & 0x80) ? -1.0f : 1.0f;
    if (t->has_inf && ef == emask) return mf ? NAN : sign * INFINITY;
    if (!t->has_inf && ef == emask && mf == (1 << mbits) - 1) return NAN;
    if (ef == 0) return sign * ldexpf((float)mf, 1 - t->bias - mbits);
    return sign * ldexpf((float)((1 << mbits) + mf), ef - t->bias - mbits);
}

static float e4m3_to_f32(uint8_t code) { return fp8_decode(code, &elem_traits[MX_E4M3]); }
static float e5m2_to_f32(uint8_t code) { return fp8_decode(code, &elem_traits[MX_E5M2]); }
static uint8_t e4m3_from_f32(float x) { return mxi_encode_scaled_ref(mxi_f32_bits(x), 0, &elem_traits[MX_E4M3]); }
static uint8_t e5m2_from_f32(float x) { return mxi_encode_scaled_ref(mxi_f32_bits(x), 0, &elem_traits[MX_E5M2]); }

uint8_t mxi_encode_scaled_ref(uint32_t x_bits, int shift, const mx_elem_traits *t) {
    uint8_t sign = (x_bits >> 31) ? 0x80 : 0;
    uint32_t ef = (x_bits >> 23) & 0xFF, mf = x_bits & 0x7FFFFF;
    if (ef == 0xFF && mf != 0) return t->nan_code;
    if (ef == 0xFF) return sign | t->max_code;          // infinity saturates
    if (ef == 0 && mf == 0) return sign;                // signed zero
    // |x| * 2^shift = m * 2^e2 exactly, m a 24-bit integer.
    uint64_t m = ef ? (mf | 0x800000u) : mf;
    int64_t e2 = (int64_t)(ef ? ef : 1) - 150 + shift;
    int64_t p = e2 + (63 - __builtin_clzll(m));          // value in [2^p, 2^(p+1))
    int64_t emin = 1 - t->bias;
    int64_t qexp = (p < emin ? emin : p) - t->mbits;     // spacing of the FP8 grid there
    int64_t sh = qexp - e2;                              // n = round(m / 2^sh)
    uint64_t n;
    if (sh <= 0) {
        n = m << -sh;                                    // exact; sh >= -23 here
    } else if (sh > 40) {
        n = 0;                                           // below half the smallest step
    } else {
        uint64_t kept = m >> sh, rest = m & ((1ull << sh) - 1), half = 1ull << (sh - 1);
        n = kept + (rest > half || (rest == half && (kept & 1)));
    }
    // One formula covers subnormals (qexp = emin - mbits) and normals, and a rounding
    // carry into the next binade lands on the right code by itself.
    int64_t code = ((qexp - emin + t->mbits) << t->mbits) + (int64_t)n;
    if (code > t->max_code) code = t->max_code;
    return sign | (uint8_t)code;
}

float mx_fp8_to_f32(uint8_t code, mx_elem elem) {
    const mx_elem_traits *t = mx_elem_traits_of(elem);
    return t ? t->to_f32(code) : NAN;
}

uint8_t mx_f32_to_fp8(float x, mx_elem elem) {
    const mx_elem_traits *t = mx_elem_traits_of(elem);
    return t ? t->from_f32(x) : 0xFF;
}

float mx_e8m0_to_f32(uint8_t code) {
    if (code == MX_E8M0_NAN) return NAN;
    // 2^(code-127): a normal fp32 for code >= 1; code 0 is the subnormal 2^-127.
    return mxi_bits_f32(code ? (uint32_t)code << 23 : 0x00400000u);
}

uint8_t mx_scale_code(float amax, mx_elem elem, mx_scale_mode mode) {
    const mx_elem_traits *t = mx_elem_traits_of(elem);
    if (!t || (mode != MX_SCALE_FLOOR && mode != MX_SCALE_RCEIL)) return MX_E8M0_NAN;
    return mxi_scale_code_bits(mxi_f32_bits(amax) & 0x7FFFFFFFu, t->emax, t->max, mode);
}
