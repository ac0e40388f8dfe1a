/* Delayed scaling (model/delayed.h): TE DelayedScaling's update of one slot against a
 * written-out reference in double (histories with zeros, Inf, NaN; max and most_recent;
 * margins; HiF8's targets), the roll as torch.roll(-1) with slot 0 zeroed, the phases of an
 * update and its all-reduce, and the casts with a known scale against the current-scaling
 * quantizers. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "model/delayed.h"
#include "mxtrain/scaled.h"

/* The reference: TE's scale from the history, in double, rounded once to fp32 (a quotient of
 * two floats rounded through double is the correctly rounded fp32 quotient). */
static float ref_scale(const float *hist, int len, mx_amax_algo algo, double max, int margin, bool hif8,
                       float prev) {
    double amax = 0.0;   // TE starts its fmaxf reduction at 0
    for (int i = 0; i < len; i++)
        if (hist[i] > amax) amax = hist[i];   // false for NaN: TE's fmaxf skips it
    if (algo == MX_AMAX_MOST_RECENT) amax = hist[0];
    if (!(amax > 0.0) || isinf(amax)) return prev;   // NaN fails amax > 0
    if (hif8) {
        double r = (float)(1.0 / max);                   // fp32(1 / target)
        double s = (double)(float)(amax * r) * ldexp(1.0, margin);
        float f = (float)s;
        return f > 0.0f && !isinf(f) ? f : prev;
    }
    float f = (float)(max * ldexp(1.0, -margin) / amax);
    return isinf(f) ? FLT_MAX : f;
}

/* torch.roll(hist, -1) then hist[0] = 0, as TE's pytorch path writes it. */
static void ref_roll(float *out, const float *hist, int len) {
    for (int i = 0; i < len; i++) out[i] = hist[(i + 1) % len];
    out[0] = 0.0f;
}

typedef struct {
    int len;
    float hist[6];
    mx_amax_algo algo;
    int margin;
    bool hif8;
    float max;
    float prev;
    float want;   // the scale written out by hand (0: compare with ref_scale only)
} slot_case;

static const float INF = INFINITY;

static void test_update_slot(void) {
    const float nan = NAN;
    const slot_case cases[] = {
        {4, {0, 0, 0, 0}, MX_AMAX_MAX, 0, false, 448, 1.0f, 1.0f},          // no amax yet: the scale stays
        {4, {3, 1, 7, 2}, MX_AMAX_MAX, 0, false, 448, 1.0f, 64.0f},         // 448 / 7
        {4, {3, 1, 7, 2}, MX_AMAX_MOST_RECENT, 0, false, 448, 1.0f, 0},     // 448 / 3
        {4, {3, 1, 7, 2}, MX_AMAX_MAX, 2, false, 448, 1.0f, 16.0f},         // (448 / 4) / 7
        {4, {0, 1, 7, 2}, MX_AMAX_MOST_RECENT, 0, false, 448, 5.0f, 5.0f},  // newest 0: the scale stays
        {3, {nan, 8, 2}, MX_AMAX_MAX, 0, false, 448, 1.0f, 56.0f},          // NaN ignored by the max
        {3, {nan, 8, 2}, MX_AMAX_MOST_RECENT, 0, false, 448, 3.0f, 3.0f},   // NaN newest: the scale stays
        {3, {2, INF, 1}, MX_AMAX_MAX, 0, false, 448, 3.0f, 3.0f},           // Inf: the scale stays
        {3, {INF, 4, 1}, MX_AMAX_MOST_RECENT, 0, false, 57344, 3.0f, 3.0f},
        {2, {1e-45f, 0}, MX_AMAX_MAX, 0, false, 448, 1.0f, FLT_MAX},        // the quotient overflows
        {1, {5}, MX_AMAX_MAX, 0, false, 57344, 1.0f, 0},                    // a history of one
        {4, {0.3f, 1e-3f, 0, 2.5f}, MX_AMAX_MAX, 1, false, 57344, 1.0f, 0}, // E5M2
        {4, {-1, 0, 0, 0}, MX_AMAX_MAX, 0, false, 448, 7.0f, 7.0f},         // no positive amax
        {3, {448, 0, 0}, MX_AMAX_MAX, 0, true, 224, 1.0f, 0},               // HiF8 gradients: 448 * fp32(1/224)
        {3, {6, 30, 0}, MX_AMAX_MAX, 0, true, 15, 1.0f, 0},                 // HiF8 inputs and weights
        {3, {6, 30, 0}, MX_AMAX_MOST_RECENT, 3, true, 15, 1.0f, 0},         // times 2^3
        {3, {1e-45f, 0, 0}, MX_AMAX_MAX, 0, true, 15, 2.0f, 2.0f},          // a HiF8 scale of 0 keeps the last
        {3, {3e38f, 0, 0}, MX_AMAX_MAX, 5, true, 15, 2.0f, 2.0f},           // one that overflows too
        {3, {nan, INF, 0}, MX_AMAX_MAX, 0, true, 224, 2.0f, 2.0f},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const slot_case *k = &cases[c];
        float h[6], rolled[6], scale = k->prev;
        memcpy(h, k->hist, sizeof h);
        ref_roll(rolled, k->hist, k->len);
        float want = ref_scale(k->hist, k->len, k->algo, k->max, k->margin, k->hif8, k->prev);
        if (k->want != 0) CHECK_EQ_DBL(want, k->want);   // the reference against the hand-written value
        mxi_delayed_update_slot(h, k->len, k->algo, k->max, k->margin, k->hif8, &scale);
        int before = mxt_current_failures();
        uint32_t got_bits, want_bits;
        memcpy(&got_bits, &scale, 4), memcpy(&want_bits, &want, 4);
        CHECK_EQ_HEX(got_bits, want_bits);
        for (int i = 0; i < k->len; i++)
            if (!(isnan(rolled[i]) && isnan(h[i]))) CHECK_EQ_DBL(h[i], rolled[i]);
        if (mxt_current_failures() > before) mxt_fail(__FILE__, __LINE__, "case %zu", c);
    }
    // the exact products of the written-out HiF8 cases
    float s = 1.0f, h[3] = {448, 0, 0};
    mxi_delayed_update_slot(h, 3, MX_AMAX_MAX, 224, 0, true, &s);
    CHECK_EQ_DBL(s, (float)(448.0 * (double)(1.0f / 224.0f)));
}

/* Many updates in a row against the reference (random amaxes, zeros and Infs among them). */
static void test_update_sequence(void) {
    enum { LEN = 5, STEPS = 40 };
    uint64_t rng = 12345;
    for (int algo = 0; algo < 2; algo++) {
        float h[LEN] = {0}, ref[LEN] = {0}, scale = 1.0f, want = 1.0f;
        for (int step = 0; step < STEPS; step++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            int kind = (int)(rng >> 60);
            float a = kind == 0 ? 0.0f : kind == 1 ? INF : ldexpf((float)((rng >> 20) & 0xFFFFF) / 1048576.0f, (int)(rng >> 40 & 15) - 8);
            h[0] = ref[0] = a;
            want = ref_scale(ref, LEN, (mx_amax_algo)algo, 448, 1, false, want);
            float rolled[LEN];
            ref_roll(rolled, ref, LEN);
            memcpy(ref, rolled, sizeof ref);
            mxi_delayed_update_slot(h, LEN, (mx_amax_algo)algo, 448, 1, false, &scale);
            CHECK_EQ_DBL(scale, want);
            CHECK_MEM_EQ(h, ref, sizeof h);
            if (mxt_current_failures()) return;
        }
    }
}

static mx_plan plan_of(mx_strategy strategy, mx_elem in, mx_elem w, mx_elem g, int len, mx_amax_algo algo, int margin) {
    mx_plan p;
    memset(&p, 0, sizeof p);
    p.enabled = true;
    p.recipe = (mx_recipe){.strategy = strategy, .granularity = MX_GRANULARITY_PER_TENSOR, .inputs = in, .weight = w,
                           .grads = g};
    p.amax_history_len = len, p.amax_compute_algo = algo, p.margin = margin;
    return p;
}

/* The other rank's amaxes, folded in by the fake all-reduce. */
static double other_rank[16];
static int reduce_calls, reduce_n;
static int fake_max(void *ctx, double *x, int n, mx_diag *diag) {
    (void)ctx, (void)diag;
    reduce_calls++, reduce_n = n;
    for (int i = 0; i < n; i++) x[i] = x[i] > other_rank[i] ? x[i] : other_rank[i];
    return 0;
}

/* A forward update touches the input and weight slots only, a backward one the grad slots;
 * one all-reduce each, over slot 0 of every history of the phase; casts record only while
 * training, and forward's roles not in backward. */
static void test_phases(void) {
    mx_plan p = plan_of(MX_STRATEGY_DELAYED, MX_E4M3, MX_E4M3, MX_E5M2, 2, MX_AMAX_MAX, 0);
    int64_t groups[3] = {1, 0, 2};   // tensor 0 plain, 1 not converted, 2 with two experts
    mxi_delayed *d;
    CHECK_EQ_INT(mxi_delayed_create(&d, &p, 3, groups), 0);
    CHECK_EQ_INT(mxi_delayed_slots(d), 9);
    CHECK(mxi_delayed_site_of(d, 1, 0).state == NULL);
    CHECK(mxi_delayed_site_of(d, 2, 2).state == NULL);
    mxi_delayed_site s0 = mxi_delayed_site_of(d, 0, 0), s2 = mxi_delayed_site_of(d, 2, 1);
    CHECK_EQ_INT(s2.slot, 6);
    mxi_delayed_begin_forward(d);
    mxi_delayed_note(&s0, MXI_DELAYED_INPUT, 10.0f);   // not training: nothing recorded
    CHECK_EQ_DBL(mxi_delayed_history(d)[0], 0.0);
    mxi_delayed_set_training(d, true);
    mxi_delayed_begin_forward(d);
    mxi_delayed_note(&s0, MXI_DELAYED_INPUT, 7.0f);
    mxi_delayed_note(&s0, MXI_DELAYED_INPUT, 2.0f);    // a second cast of the same tensor: the max stays
    mxi_delayed_note(&s2, MXI_DELAYED_WEIGHT, 3.5f);
    mxi_delayed_note(&s2, MXI_DELAYED_GRAD, 1.0f);     // forward records no gradient
    for (int i = 0; i < 16; i++) other_rank[i] = 0;
    other_rank[1] = 14.0;   // the forward phase's slots: 0, 1, 3, 4, 6, 7; the other rank's weight of tensor 0
    reduce_calls = 0;
    CHECK_EQ_INT(mxi_delayed_update(d, MXI_DELAYED_FORWARD, fake_max, NULL, NULL), 0);
    CHECK_EQ_INT(reduce_calls, 1);
    CHECK_EQ_INT(reduce_n, 6);
    float *scale = mxi_delayed_scales(d);
    CHECK_EQ_DBL(scale[0], 64.0);    // 448 / 7
    CHECK_EQ_DBL(scale[1], 32.0);    // 448 / 14, the other rank's amax
    CHECK_EQ_DBL(scale[2], 1.0);     // grads: not this phase
    CHECK_EQ_DBL(scale[7], 128.0);   // 448 / 3.5
    CHECK_EQ_DBL(scale[8], 1.0);
    // the casts of this pass keep the scales of its start
    CHECK_EQ_DBL(mxi_delayed_scale(&s0, MXI_DELAYED_INPUT), 1.0);
    CHECK_EQ_DBL(mxi_delayed_next_scale(&s0, MXI_DELAYED_INPUT), 64.0);
    mxi_delayed_begin_backward(d);
    mxi_delayed_note(&s0, MXI_DELAYED_INPUT, 100.0f);  // backward's cast of the input again: not recorded
    mxi_delayed_note(&s2, MXI_DELAYED_GRAD, 0.5f);
    for (int i = 0; i < 16; i++) other_rank[i] = 0;
    reduce_calls = 0;
    CHECK_EQ_INT(mxi_delayed_update(d, MXI_DELAYED_BACKWARD, fake_max, NULL, NULL), 0);
    CHECK_EQ_INT(reduce_calls, 1);
    CHECK_EQ_INT(reduce_n, 3);
    CHECK_EQ_DBL(scale[8], 114688.0);   // 57344 / 0.5
    CHECK_EQ_DBL(scale[0], 64.0);
    const float *h = mxi_delayed_history(d);
    CHECK_EQ_DBL(h[0 * 2 + 0], 0.0);   // rolled: slot 0 zeroed, the newest at the end
    CHECK_EQ_DBL(h[0 * 2 + 1], 7.0);
    CHECK_EQ_DBL(h[8 * 2 + 1], 0.5);
    mxi_delayed_begin_forward(d);
    CHECK_EQ_DBL(mxi_delayed_scale(&s0, MXI_DELAYED_INPUT), 64.0);
    mxi_delayed_free(d);
}

/* The amax of x (n), NaN ignored, in double. */
static float amax_oracle(const float *x, int n) {
    double m = 0.0;
    for (int i = 0; i < n; i++)
        if (x[i] == x[i] && fabs((double)x[i]) > m) m = fabs((double)x[i]);
    return (float)m;
}

/* A cast with a known scale gives the codes of the current-scaling quantizers when the scale
 * is theirs (the same element arithmetic), and the tensor's amax in the same pass (over
 * several cache pieces, the largest in the last one), or none when not asked. */
static void test_encode(void) {
    enum { N = 3 * 4096 + 301 };
    float *x = malloc(N * sizeof *x);
    uint8_t *q = malloc(N), *want = malloc(N);
    uint64_t rng = 99;
    for (int i = 0; i < N; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = ldexpf((float)(int32_t)(rng >> 32) / 2147483648.0f, (int)(rng >> 8 & 15) - 6);
    }
    x[5] = NAN, x[17] = 0.0f, x[40] = -0.0f, x[N - 7] = -1000.0f;
    float sinv, want_sinv, amax = -1.0f, a = amax_oracle(x, N);
    CHECK_EQ_DBL(a, 1000.0);
    for (int e = 0; e < 2; e++) {
        mx_elem elem = e ? MX_E5M2 : MX_E4M3;
        float scale = mx_fp8_scale_from_amax(a, elem, MX_TSCALE_FP32);
        mxi_delayed_encode(x, N, elem, scale, q, &sinv, &amax);
        CHECK_EQ_INT(mx_fp8_quantize_tensor_f32(x, N, elem, MX_TSCALE_FP32, want, &want_sinv), 0);
        CHECK_MEM_EQ(q, want, N);
        CHECK_EQ_DBL(sinv, want_sinv);
        CHECK_EQ_DBL(amax, a);
        memset(q, 0, N);
        mxi_delayed_encode(x, N, elem, scale, q, &sinv, NULL);
        CHECK_MEM_EQ(q, want, N);
    }
    mxi_delayed_encode(x, N, MX_HIF8, mx_hif8_scale_from_amax(a, 224.0f), q, &sinv, &amax);
    CHECK_EQ_INT(mx_hif8_quantize_tensor_f32(x, N, 224.0f, want, &want_sinv), 0);
    CHECK_MEM_EQ(q, want, N);
    CHECK_EQ_DBL(sinv, want_sinv);
    CHECK_EQ_DBL(amax, a);
    CHECK_EQ_DBL(mxi_delayed_target(MX_HIF8, MXI_DELAYED_GRAD), 224.0);
    CHECK_EQ_DBL(mxi_delayed_target(MX_HIF8, MXI_DELAYED_WEIGHT), 15.0);
    CHECK_EQ_DBL(mxi_delayed_target(MX_E5M2, MXI_DELAYED_GRAD), 57344.0);
    free(x), free(q), free(want);
}

int main(int argc, char **argv) {
    static const mxt_test tests[] = {
        {"update_slot", test_update_slot},
        {"update_sequence", test_update_sequence},
        {"phases", test_phases},
        {"encode", test_encode},
    };
    return MXT_RUN(tests, argc, argv);
}
