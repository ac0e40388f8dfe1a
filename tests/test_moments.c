/* AdamW's stored moments (train/moments.h) against references written here: bf16 by the
 * nearer of the two bf16 neighbours (ties to the even one), MXFP8 blocks by the OCP rules in
 * double (scale 2^(floor(log2 amax) - 8), each value the nearest E4M3 one, ties to the even
 * code, saturating at 448), the second moment through its square root; FP8 spans by
 * TransformerEngine FusedAdam's per-tensor arithmetic (scale = amax / 448, q = 1 / scale,
 * scale_inv = 1 / q, each in fp32; each value the nearest E4M3 one of x * q, read back as
 * that times scale_inv), both moments as they are; and AdamW over stored moments against
 * the fp32 update of the moments read back. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/bits.h"
#include "harness.h"
#include "train/optim.h"

static float ref_bf16(float x) {
    uint32_t u = mxi_f32_bits(x);
    float lo = mxi_bits_f32(u & 0xFFFF0000u), hi = mxi_bits_f32((u & 0xFFFF0000u) + 0x10000u);   // toward zero, away
    double dl = fabs((double)x - lo), dh = fabs((double)x - hi);
    if (dl != dh) return dl < dh ? lo : hi;
    return (u >> 16) & 1 ? hi : lo;
}

/* E4M3's value of a positive code 0 .. 0x7E (0x7F is NaN). */
static double e4m3(int code) {
    int e = code >> 3, m = code & 7;
    return e == 0 ? m / 8.0 * ldexp(1, -6) : (1 + m / 8.0) * ldexp(1, e - 7);
}

static double ref_e4m3_round(double y) {
    double a = fabs(y);
    int best = 0;
    for (int c = 1; c <= 0x7E; c++) {
        double d = fabs(a - e4m3(c)), db = fabs(a - e4m3(best));
        if (d < db || (d == db && (c & 1) == 0)) best = c;
    }
    if (a >= 448) best = 0x7E;
    return signbit(y) ? -e4m3(best) : e4m3(best);
}

/* One block of 32 stored as MXFP8 and read back; root: the second moment (its square root stored). */
static void ref_mx_block(const float *x, float *out, bool root) {
    float y[32];
    double amax = 0;
    for (int i = 0; i < 32; i++) y[i] = root ? sqrtf(x[i]) : x[i], amax = fmax(amax, fabs(y[i]));
    int e = amax > 0 ? (int)floor(log2(amax)) - 8 : -127;
    e = e < -127 ? -127 : e > 127 ? 127 : e;
    for (int i = 0; i < 32; i++) {
        float v = (float)(ref_e4m3_round(y[i] / ldexp(1, e)) * ldexp(1, e));
        out[i] = root ? v * v : v;
    }
}

static float ref_stored(mx_state_dtype dtype, float x) { return dtype == MX_STATE_BF16 ? ref_bf16(x) : x; }

/* Magnitudes over 2^-24 .. 2^6, zeros among them; non-negative for a second moment. */
static void fill(float *x, int64_t n, uint64_t seed, bool second) {
    for (int64_t i = 0; i < n; i++) {
        double u = (double)(mxt_splitmix64(&seed) >> 11) / 9007199254740992.0;
        double mag = ldexp(1 + u, (int)(mxt_splitmix64(&seed) % 31) - 24);
        x[i] = i % 13 == 5 ? 0.0f : (float)(second || mxt_splitmix64(&seed) & 1 ? mag : -mag);
    }
}

static void test_store_round_trip(void) {
    enum { N = 32 * 7 };
    const mx_state_dtype dtypes[] = {MX_STATE_FP32, MX_STATE_BF16, MX_STATE_MXFP8};
    for (int d = 0; d < 3; d++)
        for (int second = 0; second < 2; second++) {
            float x[N], got[N], want[N];
            fill(x, N, 7 + (uint64_t)d, second);
            mxi_moment m;
            CHECK_EQ_INT(mxi_moment_alloc(&m, dtypes[d], second, N, 1), MX_OK);
            CHECK_EQ_INT(mxi_moment_bytes(dtypes[d], N, 1), dtypes[d] == MX_STATE_FP32 ? 4 * N : dtypes[d] == MX_STATE_BF16 ? 2 * N : N + N / 32);
            mxi_moment_write(&m, 0, 0, N, x);
            mxi_moment_read(&m, 0, 0, N, got);
            for (int64_t b = 0; b < N; b += 32)
                if (dtypes[d] == MX_STATE_MXFP8) ref_mx_block(x + b, want + b, second);
                else for (int i = 0; i < 32; i++) want[b + i] = ref_stored(dtypes[d], x[b + i]);
            for (int i = 0; i < N; i++) CHECK_EQ_HEX(mxi_f32_bits(got[i]), mxi_f32_bits(want[i]));
            // a write that ends inside a block: the block again from the new values and its stored tail
            float x2[45], block[32];
            fill(x2, 45, 99, second);
            mxi_moment_write(&m, 0, 64, 45, x2);
            mxi_moment_read(&m, 0, 64, 64, got);
            float old[N];
            for (int64_t b = 0; b < N; b += 32)
                if (dtypes[d] == MX_STATE_MXFP8) ref_mx_block(x + b, old + b, second);
                else for (int i = 0; i < 32; i++) old[b + i] = ref_stored(dtypes[d], x[b + i]);
            if (dtypes[d] == MX_STATE_MXFP8) {
                ref_mx_block(x2, want, second);
                memcpy(block, x2 + 32, 13 * sizeof(float));
                memcpy(block + 13, old + 64 + 45, 19 * sizeof(float));   // the stored tail, as read back
                ref_mx_block(block, want + 32, second);
            } else {
                for (int i = 0; i < 45; i++) want[i] = ref_stored(dtypes[d], x2[i]);
                memcpy(want + 45, old + 64 + 45, 19 * sizeof(float));
            }
            for (int i = 0; i < 64; i++) CHECK_EQ_HEX(mxi_f32_bits(got[i]), mxi_f32_bits(want[i]));
            mxi_moment_free(&m);
        }
    mxi_moment m;
    CHECK_EQ_INT(mxi_moment_alloc(&m, MX_STATE_MXFP8, false, 33, 1), MX_ESIZE);   // not whole blocks
    CHECK_EQ_INT(mxi_moment_alloc(&m, MX_STATE_FP8, false, 32, -1), MX_ESIZE);
}

/* FP8: a span of values stored and read back, by TE's arithmetic written out here. */
static void ref_fp8_span(const float *x, int64_t n, float *out, float *scale_inv) {
    float amax = 0.0f;
    for (int64_t i = 0; i < n; i++) amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
    float scale = amax / 448.0f, q = amax > 0 ? 1.0f / scale : 1.0f, sinv = 1.0f / q;
    for (int64_t i = 0; i < n; i++) {
        float y = x[i] * q;
        out[i] = (float)(ref_e4m3_round(y) * sinv);   // c * scale_inv is exact in double: fp32's product
    }
    *scale_inv = sinv;
}

/* Three spans of one store: [0, 64), [64, 64 + 32 * 70) and the 96 after it, each with its
 * own scale; both moments stored as they are. */
static void test_fp8_store(void) {
    enum { A = 64, B = 32 * 70, C = 96, N = A + B + C };
    const int64_t at[3] = {0, A, A + B}, len[3] = {A, B, C};
    for (int second = 0; second < 2; second++) {
        static float x[N], got[N], want[N];
        mxi_moment m;
        CHECK_EQ_INT(mxi_moment_alloc(&m, MX_STATE_FP8, second, N, 3), MX_OK);
        CHECK_EQ_INT(mxi_moment_bytes(MX_STATE_FP8, N, 3), N + 3 * 4);
        mxi_moment_read(&m, 1, 0, N, got);   // a new store: zeros, scale_inv 1
        for (int i = 0; i < N; i++) CHECK_EQ_HEX(mxi_f32_bits(got[i]), 0u);
        CHECK_EQ_HEX(mxi_f32_bits(m.scale_inv[1]), mxi_f32_bits(1.0f));
        fill(x, N, 21 + (uint64_t)second, second);
        for (int64_t i = 0; i < A; i++) x[i] *= 1e-3f;   // spans of other magnitudes: scales of their own
        for (int k = 0; k < 3; k++) mxi_moment_write(&m, k, at[k], len[k], x + at[k]);
        for (int k = 0; k < 3; k++) {
            float sinv;
            ref_fp8_span(x + at[k], len[k], want + at[k], &sinv);
            CHECK_EQ_HEX(mxi_f32_bits(m.scale_inv[k]), mxi_f32_bits(sinv));
            mxi_moment_read(&m, k, at[k], len[k], got + at[k]);
        }
        int bad = 0, zeros = 0;
        for (int i = 0; i < N; i++) bad += mxi_f32_bits(got[i]) != mxi_f32_bits(want[i]), zeros += x[i] != 0 && got[i] == 0;
        CHECK_EQ_INT(bad, 0);
        CHECK(zeros > 0);   // values 2^-18.8 of their span's largest or smaller flush to zero (the fill spans 2^30)
        // rewriting span 1 leaves the others as they were
        for (int64_t i = A; i < A + B; i++) x[i] *= 3.0f;
        mxi_moment_write(&m, 1, A, B, x + A);
        float sinv;
        ref_fp8_span(x + A, B, want + A, &sinv);
        for (int k = 0; k < 3; k++) mxi_moment_read(&m, k, at[k], len[k], got + at[k]);
        bad = 0;
        for (int i = 0; i < N; i++) bad += mxi_f32_bits(got[i]) != mxi_f32_bits(want[i]);
        CHECK_EQ_INT(bad, 0);
        // a span of zeros (padding rows): zeros, with TE's initial scale 1 rather than 1 / 0
        memset(x, 0, A * sizeof *x);
        mxi_moment_write(&m, 0, 0, A, x);
        mxi_moment_read(&m, 0, 0, A, got);
        for (int i = 0; i < A; i++) CHECK_EQ_HEX(mxi_f32_bits(got[i]), 0u);
        CHECK_EQ_HEX(mxi_f32_bits(m.scale_inv[0]), mxi_f32_bits(1.0f));
        mxi_moment_free(&m);
    }
}

/* FP8's E4M3 rounding at points worked out by hand. With amax 448 the scales are 1, so each
 * value is stored as the E4M3 value nearest to it, ties to the even code: 2^-10 is half the
 * smallest subnormal 2^-9, a tie between 0 and code 0x01: 0; a little more gives 2^-9;
 * 3 * 2^-10 ties between codes 0x01 and 0x02 (2^-8): 2^-8; 17 ties between 16 (0x58) and
 * 18 (0x59): 16; 19 between 18 and 20 (0x5A): 20; 440 lies nearer 448 than 416. Then an
 * amax of 1000 saturates at the largest code, 448 * scale_inv. */
static void test_fp8_rounding(void) {
    enum { N = 32 };
    float x[N] = {448.0f, 0x1p-10f, 0x1.0001p-10f, 3 * 0x1p-10f, 17.0f, 19.0f, 440.0f, -0x1p-9f, 0x1p-6f, 0.0f};
    float want[N] = {448.0f, 0.0f, 0x1p-9f, 0x1p-8f, 16.0f, 20.0f, 448.0f, -0x1p-9f, 0x1p-6f, 0.0f};
    mxi_moment m;
    CHECK_EQ_INT(mxi_moment_alloc(&m, MX_STATE_FP8, false, N, 1), MX_OK);
    mxi_moment_write(&m, 0, 0, N, x);
    CHECK_EQ_HEX(mxi_f32_bits(m.scale_inv[0]), mxi_f32_bits(1.0f));
    float got[N];
    mxi_moment_read(&m, 0, 0, N, got);
    for (int i = 0; i < N; i++) CHECK_EQ_HEX(mxi_f32_bits(got[i]), mxi_f32_bits(want[i]));
    x[0] = 1000.0f;   // amax 1000: scale_inv 1000 / 448 as fp32 computes it, the largest code 448 of it
    mxi_moment_write(&m, 0, 0, N, x);
    float scale = 1000.0f / 448.0f, sinv = 1.0f / (1.0f / scale);
    CHECK_EQ_HEX(mxi_f32_bits(m.scale_inv[0]), mxi_f32_bits(sinv));
    mxi_moment_read(&m, 0, 0, 1, got);
    CHECK_EQ_HEX(mxi_f32_bits(got[0]), mxi_f32_bits(448.0f * sinv));
    mxi_moment_free(&m);
}

/* A checkpoint's FP8 span stored again with its saved scale_inv: the same codes, read back
 * bit for bit, where quantizing the values read back anew (TE's load_state_dict) need not
 * give them (a span found here for which it does not); values that are not codes of it (one
 * ulp off) are refused, the store kept. */
static void test_fp8_restore(void) {
    enum { N = 32 * 9 };
    float x[N], stored[N], got[N], before[N];
    fill(x, N, 31, false);
    mxi_moment m, r;
    CHECK_EQ_INT(mxi_moment_alloc(&m, MX_STATE_FP8, false, N, 2), MX_OK);
    CHECK_EQ_INT(mxi_moment_alloc(&r, MX_STATE_FP8, false, N, 2), MX_OK);
    mxi_moment_write(&m, 1, 0, N, x);
    mxi_moment_read(&m, 1, 0, N, stored);
    CHECK(mxi_moment_restore_fp8(&r, 1, 0, N, stored, m.scale_inv[1]));
    CHECK_EQ_HEX(mxi_f32_bits(r.scale_inv[1]), mxi_f32_bits(m.scale_inv[1]));
    CHECK_MEM_EQ(r.q, m.q, N);
    mxi_moment_read(&r, 1, 0, N, got);
    CHECK_MEM_EQ(got, stored, sizeof got);
    memcpy(before, got, sizeof before);
    int k = 0;
    while (stored[k] == 0) k++;
    stored[k] = mxi_bits_f32(mxi_f32_bits(stored[k]) + 1);
    CHECK(!mxi_moment_restore_fp8(&r, 1, 0, N, stored, m.scale_inv[1]));
    mxi_moment_read(&r, 1, 0, N, got);
    CHECK_MEM_EQ(got, before, sizeof got);
    CHECK(!mxi_moment_restore_fp8(&r, 1, 0, N, before, 0.0f));
    // the amax of the values as read back is not the amax they were quantized with: the
    // scale taken anew may differ (double reciprocals), and with it the values
    uint64_t seed = 41;
    int tries = 0;
    float again[N];
    for (bool found = false; !found && tries < 10000; tries++) {
        for (int i = 0; i < N; i++) x[i] = (float)(mxt_uniform(&seed) * ldexp(1, (int)(mxt_splitmix64(&seed) % 40) - 30));
        mxi_moment_write(&m, 0, 0, N, x);
        mxi_moment_read(&m, 0, 0, N, stored);
        mxi_moment_write(&r, 0, 0, N, stored);
        mxi_moment_read(&r, 0, 0, N, again);
        found = memcmp(again, stored, sizeof again) != 0;
    }
    CHECK(tries < 10000);
    CHECK(mxi_moment_restore_fp8(&r, 0, 0, N, stored, m.scale_inv[0]));
    mxi_moment_read(&r, 0, 0, N, got);
    CHECK_MEM_EQ(got, stored, sizeof got);
    mxi_moment_free(&m), mxi_moment_free(&r);
}

/* AdamW over stored moments: the weights are those of the fp32 update on the moments read
 * back, bit for bit, and the moments that update's results as stored; over several pieces
 * of the span and a span that does not start at the store's first element (the store's
 * spans: [0, AT), the updated one, the 64 after it). FP8: the span's scale from the amax of
 * the updated values, the spans around it untouched. */
static void test_adamw_over_stored(void) {
    enum { AT = 64, SPAN = 32 * 200, N = AT + SPAN + 64 };
    const int64_t at[3] = {0, AT, AT + SPAN}, len[3] = {AT, SPAN, 64};
    const mx_state_dtype dtypes[] = {MX_STATE_BF16, MX_STATE_MXFP8, MX_STATE_FP8};
    static float w[SPAN], w1[SPAN], g[SPAN], m0[N], v0[N], M[N], V[N], got[N], want[N];
    adamw_step st = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .step = 3};
    for (int d = 0; d < 3; d++)
        for (int dm = 0; dm < 3; dm++) {   // the first moment in fp32, as the second, or the second in fp32
            mx_state_dtype dtm = dm == 0 ? MX_STATE_FP32 : dtypes[d], dtv = dm == 2 ? MX_STATE_FP32 : dtypes[d];
            fill(w, SPAN, 3, false), fill(g, SPAN, 4, false), fill(m0, N, 5, false), fill(v0, N, 6, true);
            mxi_moment m, v;
            CHECK_EQ_INT(mxi_moment_alloc(&m, dtm, false, N, 3), MX_OK);
            CHECK_EQ_INT(mxi_moment_alloc(&v, dtv, true, N, 3), MX_OK);
            for (int k = 0; k < 3; k++) {
                mxi_moment_write(&m, k, at[k], len[k], m0 + at[k]), mxi_moment_write(&v, k, at[k], len[k], v0 + at[k]);
                mxi_moment_read(&m, k, at[k], len[k], M + at[k]), mxi_moment_read(&v, k, at[k], len[k], V + at[k]);
            }
            memcpy(w1, w, sizeof w);
            mxi_adamw_update(w1, M + AT, V + AT, g, SPAN, &st, 1);
            mxi_adamw_update_moments(w, &m, &v, g, 1, AT, SPAN, &st, 1);
            int bad = 0;
            for (int i = 0; i < SPAN; i++) bad += memcmp(&w[i], &w1[i], 4) != 0;
            CHECK_EQ_INT(bad, 0);
            for (int k = 0; k < 2; k++) {
                const mxi_moment *s = k ? &v : &m;
                const float *upd = k ? V : M;
                for (int j = 0; j < 3; j++) mxi_moment_read(s, j, at[j], len[j], got + at[j]);
                if (s->dtype == MX_STATE_FP8) {   // the spans around the update as they were
                    memcpy(want, upd, AT * sizeof *want), memcpy(want + AT + SPAN, upd + AT + SPAN, 64 * sizeof *want);
                    float sinv;
                    ref_fp8_span(upd + AT, SPAN, want + AT, &sinv);
                    CHECK_EQ_HEX(mxi_f32_bits(s->scale_inv[1]), mxi_f32_bits(sinv));
                } else {
                    for (int64_t b = 0; b < N; b += 32)
                        if (s->dtype == MX_STATE_MXFP8) ref_mx_block(upd + b, want + b, k == 1);
                        else for (int i = 0; i < 32; i++) want[b + i] = ref_stored(s->dtype, upd[b + i]);
                }
                bad = 0;
                for (int i = 0; i < N; i++) {
                    if (memcmp(&got[i], &want[i], 4) != 0 && bad < 5)
                        fprintf(stderr, "d %d dm %d k %d i %d: %a %a (upd %a)\n", d, dm, k, i, got[i], want[i], upd[i]);
                    bad += memcmp(&got[i], &want[i], 4) != 0;
                }
                CHECK_EQ_INT(bad, 0);
            }
            mxi_moment_free(&m), mxi_moment_free(&v);
        }
}

/* AdamW from bf16 gradients (training.main_grads_dtype: bf16): the weights and moments of
 * the fp32 update on the gradients widened here (bf16 is fp32's top half) and multiplied by
 * the clipping factor, bit for bit, over every moment dtype and with and without clipping. */
static void test_adamw_bf16_grads(void) {
    enum { AT = 32, SPAN = 32 * 300 + 32, N = AT + SPAN };
    const mx_state_dtype dtypes[] = {MX_STATE_FP32, MX_STATE_BF16, MX_STATE_MXFP8, MX_STATE_FP8};
    static float w[SPAN], w1[SPAN], g[SPAN], m0[N], v0[N], got[N], ref[N];
    static uint16_t g16[SPAN];
    adamw_step st = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .step = 5};
    for (int d = 0; d < 4; d++)
        for (int clip = 0; clip < 2; clip++) {
            float scale = clip ? 0.3f : 1.0f;
            fill(w, SPAN, 7, false), fill(g, SPAN, 8, false), fill(m0, N, 9, false), fill(v0, N, 10, true);
            for (int i = 0; i < SPAN; i++) {
                uint32_t u;
                memcpy(&u, &g[i], 4);
                g16[i] = (uint16_t)(u >> 16);   // any bf16 values will do
                u = (uint32_t)g16[i] << 16;
                memcpy(&g[i], &u, 4);
                g[i] *= scale;
            }
            mxi_moment m, v, m1, v1;
            CHECK_EQ_INT(mxi_moment_alloc(&m, dtypes[d], false, N, 2), MX_OK);
            CHECK_EQ_INT(mxi_moment_alloc(&v, dtypes[d], true, N, 2), MX_OK);
            CHECK_EQ_INT(mxi_moment_alloc(&m1, dtypes[d], false, N, 2), MX_OK);
            CHECK_EQ_INT(mxi_moment_alloc(&v1, dtypes[d], true, N, 2), MX_OK);
            mxi_moment_write(&m, 1, AT, SPAN, m0 + AT), mxi_moment_write(&v, 1, AT, SPAN, v0 + AT);
            mxi_moment_write(&m1, 1, AT, SPAN, m0 + AT), mxi_moment_write(&v1, 1, AT, SPAN, v0 + AT);
            memcpy(w1, w, sizeof w);
            mxi_adamw_update_moments(w1, &m1, &v1, g, 1, AT, SPAN, &st, 1);
            mxi_adamw_update_bf16_grads(w, &m, &v, g16, scale, 1, AT, SPAN, &st, 1);
            CHECK_MEM_EQ(w, w1, sizeof w);
            mxi_moment_read(&m, 1, AT, SPAN, got), mxi_moment_read(&m1, 1, AT, SPAN, ref);
            CHECK_MEM_EQ(got, ref, SPAN * sizeof *got);
            mxi_moment_read(&v, 1, AT, SPAN, got), mxi_moment_read(&v1, 1, AT, SPAN, ref);
            CHECK_MEM_EQ(got, ref, SPAN * sizeof *got);
            mxi_moment_free(&m), mxi_moment_free(&v), mxi_moment_free(&m1), mxi_moment_free(&v1);
        }
}

static const mxt_test tests[] = {
    {"store_round_trip", test_store_round_trip},
    {"fp8_store", test_fp8_store},
    {"fp8_rounding", test_fp8_rounding},
    {"fp8_restore", test_fp8_restore},
    {"adamw_over_stored", test_adamw_over_stored},
    {"adamw_bf16_grads", test_adamw_bf16_grads},
};

int main(int argc, char **argv) { return MXT_RUN(tests, argc, argv); }
