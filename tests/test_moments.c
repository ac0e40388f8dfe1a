/* AdamW's stored moments (train/moments.h) against references written here: bf16 by the
 * nearer of the two bf16 neighbours (ties to the even one), MXFP8 blocks by the OCP rules in
 * double (scale 2^(floor(log2 amax) - 8), each value the nearest E4M3 one, ties to the even
 * code, saturating at 448), the second moment through its square root; and AdamW over
 * stored moments against the fp32 update of the moments read back. */
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
            CHECK_EQ_INT(mxi_moment_alloc(&m, dtypes[d], second, N), MX_OK);
            CHECK_EQ_INT(mxi_moment_bytes(dtypes[d], N), dtypes[d] == MX_STATE_FP32 ? 4 * N : dtypes[d] == MX_STATE_BF16 ? 2 * N : N + N / 32);
            mxi_moment_write(&m, 0, N, x);
            mxi_moment_read(&m, 0, N, got);
            for (int64_t b = 0; b < N; b += 32)
                if (dtypes[d] == MX_STATE_MXFP8) ref_mx_block(x + b, want + b, second);
                else for (int i = 0; i < 32; i++) want[b + i] = ref_stored(dtypes[d], x[b + i]);
            for (int i = 0; i < N; i++) CHECK_EQ_HEX(mxi_f32_bits(got[i]), mxi_f32_bits(want[i]));
            // a write that ends inside a block: the block again from the new values and its stored tail
            float x2[45], block[32];
            fill(x2, 45, 99, second);
            mxi_moment_write(&m, 64, 45, x2);
            mxi_moment_read(&m, 64, 64, got);
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
    CHECK_EQ_INT(mxi_moment_alloc(&m, MX_STATE_MXFP8, false, 33), MX_ESIZE);   // not whole blocks
}

/* AdamW over stored moments: the weights are those of the fp32 update on the moments read
 * back, bit for bit, and the moments that update's results as stored; over several pieces
 * of the span and a span that does not start at the store's first element. */
static void test_adamw_over_stored(void) {
    enum { AT = 64, SPAN = 32 * 200, N = AT + SPAN + 64 };
    const mx_state_dtype dtypes[] = {MX_STATE_BF16, MX_STATE_MXFP8};
    static float w[SPAN], w1[SPAN], g[SPAN], m0[N], v0[N], M[N], V[N], got[N], want[32];
    adamw_step st = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .step = 3};
    for (int d = 0; d < 2; d++)
        for (int dm = 0; dm < 2; dm++) {   // the first moment in fp32 or as the second
            fill(w, SPAN, 3, false), fill(g, SPAN, 4, false), fill(m0, N, 5, false), fill(v0, N, 6, true);
            mxi_moment m, v;
            CHECK_EQ_INT(mxi_moment_alloc(&m, dm ? dtypes[d] : MX_STATE_FP32, false, N), MX_OK);
            CHECK_EQ_INT(mxi_moment_alloc(&v, dtypes[d], true, N), MX_OK);
            mxi_moment_write(&m, 0, N, m0), mxi_moment_write(&v, 0, N, v0);
            mxi_moment_read(&m, 0, N, M), mxi_moment_read(&v, 0, N, V);
            memcpy(w1, w, sizeof w);
            mxi_adamw_update(w1, M + AT, V + AT, g, SPAN, &st, 1);
            mxi_adamw_update_moments(w, &m, &v, g, AT, SPAN, &st, 1);
            int bad = 0;
            for (int i = 0; i < SPAN; i++) bad += memcmp(&w[i], &w1[i], 4) != 0;
            CHECK_EQ_INT(bad, 0);
            for (int k = 0; k < 2; k++) {
                const mxi_moment *s = k ? &v : &m;
                const float *upd = k ? V : M;
                mxi_moment_read(s, 0, N, got);
                bad = 0;
                for (int64_t b = 0; b < N; b += 32) {
                    if (s->dtype == MX_STATE_MXFP8) ref_mx_block(upd + b, want, k == 1);
                    else for (int i = 0; i < 32; i++) want[i] = ref_stored(s->dtype, upd[b + i]);
                    for (int i = 0; i < 32; i++) {
                        if (memcmp(&got[b + i], &want[i], 4) != 0 && bad < 5)
                            fprintf(stderr, "d %d dm %d k %d i %lld: %a %a (upd %a)\n", d, dm, k, (long long)(b + i), got[b + i], want[i], upd[b + i]);
                        bad += memcmp(&got[b + i], &want[i], 4) != 0;
                    }
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
    const mx_state_dtype dtypes[] = {MX_STATE_FP32, MX_STATE_BF16, MX_STATE_MXFP8};
    static float w[SPAN], w1[SPAN], g[SPAN], m0[N], v0[N], got[N], ref[N];
    static uint16_t g16[SPAN];
    adamw_step st = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .step = 5};
    for (int d = 0; d < 3; d++)
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
            CHECK_EQ_INT(mxi_moment_alloc(&m, dtypes[d], false, N), MX_OK);
            CHECK_EQ_INT(mxi_moment_alloc(&v, dtypes[d], true, N), MX_OK);
            CHECK_EQ_INT(mxi_moment_alloc(&m1, dtypes[d], false, N), MX_OK);
            CHECK_EQ_INT(mxi_moment_alloc(&v1, dtypes[d], true, N), MX_OK);
            mxi_moment_write(&m, 0, N, m0), mxi_moment_write(&v, 0, N, v0);
            mxi_moment_write(&m1, 0, N, m0), mxi_moment_write(&v1, 0, N, v0);
            memcpy(w1, w, sizeof w);
            mxi_adamw_update_moments(w1, &m1, &v1, g, AT, SPAN, &st, 1);
            mxi_adamw_update_bf16_grads(w, &m, &v, g16, scale, AT, SPAN, &st, 1);
            CHECK_MEM_EQ(w, w1, sizeof w);
            mxi_moment_read(&m, 0, N, got), mxi_moment_read(&m1, 0, N, ref);
            CHECK_MEM_EQ(got, ref, sizeof got);
            mxi_moment_read(&v, 0, N, got), mxi_moment_read(&v1, 0, N, ref);
            CHECK_MEM_EQ(got, ref, sizeof got);
            mxi_moment_free(&m), mxi_moment_free(&v), mxi_moment_free(&m1), mxi_moment_free(&v1);
        }
}

static const mxt_test tests[] = {
    {"store_round_trip", test_store_round_trip},
    {"adamw_over_stored", test_adamw_over_stored},
    {"adamw_bf16_grads", test_adamw_bf16_grads},
};

int main(int argc, char **argv) { return MXT_RUN(tests, argc, argv); }
