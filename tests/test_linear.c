/* linear_backward's halves: the input gradient alone (dw NULL) and the weight gradient alone
 * (dinp NULL), as expert parallelism's overlap runs them apart (docs/distributed.md,
 * "Exchanges beside compute"), give bit for bit what one call computing both gives, in
 * fp32, bf16 and MX (each recipe element format for the gradients, with an input plane saved
 * in forward or quantized in backward), at sizes with partial MX blocks on every axis. The
 * one call is checked against PyTorch and the MX emulation elsewhere (test_model,
 * test_layers); this test holds the split to it. */
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "model/linear.h"

static uint64_t rng_state = 0x243F6A8885A308D3ull;
static float rng_unit(void) {   // splitmix64, to [-1, 1)
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)((double)(z >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static float *random_floats(int64_t n) {
    float *x = malloc((size_t)n * sizeof *x);
    for (int64_t i = 0; x && i < n; i++) x[i] = rng_unit();
    return x;
}

/* One layer (M tokens, K in, N out): both at once against the two halves. */
static void halves_case(bool bf16, const mxi_linear_mx *mx, bool saved_plane, int64_t M, int64_t K, int64_t N) {
    mxi_linear_ctx *ctx = NULL;
    CHECK_EQ_INT(mxi_linear_ctx_create(&ctx, bf16), 0);
    if (!ctx) return;
    float *dout = random_floats(M * N), *inp = random_floats(M * K), *w = random_floats(N * K);
    float *dinp1 = calloc((size_t)(M * K), sizeof(float)), *dinp2 = calloc((size_t)(M * K), sizeof(float));
    float *dw1 = random_floats(N * K), *dw2 = malloc((size_t)(N * K) * sizeof(float));   // dw accumulates
    memcpy(dw2, dw1, (size_t)(N * K) * sizeof(float));
    mxi_saved_input sv = {0};
    int64_t S = (M + 31) / 32 * K;   // colwise scales: (ceil(M/32), K)
    if (saved_plane) {
        sv.q = malloc((size_t)(M * K));
        sv.scales = malloc((size_t)S);
        CHECK_EQ_INT(linear_save_input(ctx, mx, &sv, inp, M, K), 0);
    }
    const mxi_saved_input *saved = saved_plane ? &sv : NULL;
    const float *x = saved_plane ? NULL : inp;
    CHECK_EQ_INT(linear_backward(ctx, mx, dinp1, false, dw1, NULL, dout, x, saved, w, NULL, M, K, N), 0);
    CHECK_EQ_INT(linear_backward(ctx, mx, dinp2, false, NULL, NULL, dout, x, saved, w, NULL, M, K, N), 0);
    CHECK_EQ_INT(linear_backward(ctx, mx, NULL, false, dw2, NULL, dout, x, saved, NULL, NULL, M, K, N), 0);
    CHECK_EQ_INT(mxi_linear_ctx_error(ctx, NULL), 0);
    CHECK_MEM_EQ(dinp1, dinp2, (size_t)(M * K) * sizeof(float));
    CHECK_MEM_EQ(dw1, dw2, (size_t)(N * K) * sizeof(float));
    // the accumulating form of the input gradient too (the router's, onto the experts')
    memcpy(dinp2, dinp1, (size_t)(M * K) * sizeof(float));
    CHECK_EQ_INT(linear_backward(ctx, mx, dinp1, true, dw1, NULL, dout, x, saved, w, NULL, M, K, N), 0);
    CHECK_EQ_INT(linear_backward(ctx, mx, dinp2, true, NULL, NULL, dout, x, saved, w, NULL, M, K, N), 0);
    CHECK_MEM_EQ(dinp1, dinp2, (size_t)(M * K) * sizeof(float));
    free(dout), free(inp), free(w), free(dinp1), free(dinp2), free(dw1), free(dw2), free(sv.q), free(sv.scales);
    mxi_linear_ctx_free(ctx);
}

static void test_fp32_and_bf16(void) {
    for (int bf16 = 0; bf16 < 2; bf16++) {
        halves_case(bf16, NULL, false, 1, 1, 1);
        halves_case(bf16, NULL, false, 37, 70, 45);
        halves_case(bf16, NULL, false, 128, 64, 96);
    }
}

static void test_mx(void) {
    static const mxi_linear_mx recipes[] = {
        {MX_E4M3, MX_E4M3, MX_E4M3, MX_SCALE_FLOOR, false},
        {MX_E4M3, MX_E4M3, MX_E5M2, MX_SCALE_RCEIL, false},
        {MX_E4M3, MX_E4M3, MX_E4M3, MX_SCALE_FLOOR, true},   // 32x32 weight tiles (mxfp8-32x32)
    };
    for (size_t r = 0; r < sizeof recipes / sizeof recipes[0]; r++)
        for (int saved = 0; saved < 2; saved++) {
            halves_case(false, &recipes[r], saved, 1, 1, 1);
            halves_case(false, &recipes[r], saved, 37, 70, 45);
            halves_case(true, &recipes[r], saved, 64, 96, 33);
        }
}

static const mxt_test tests[] = {
    {"fp32_and_bf16", test_fp32_and_bf16},
    {"mx", test_mx},
};

int main(int argc, char **argv) { return MXT_RUN(tests, argc, argv); }
