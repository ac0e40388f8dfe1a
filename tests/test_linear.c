/* linear_share_input: calls reading one input (q, k, v; gate, up) round it to bf16 once, in
 * forward and backward; they must give bit for bit what unshared calls give, and a new
 * share must not reuse the rounding of an earlier one.
 *
 * linear_backward's halves: the input gradient alone (dw NULL) and the weight gradient alone
 * (dinp NULL), as expert parallelism's overlap runs them apart (docs/distributed.md,
 * "Exchanges beside compute"), give bit for bit what one call computing both gives, in
 * fp32, bf16 and MX (each recipe element format for the gradients, with an input plane saved
 * in forward or quantized in backward), at sizes with partial MX blocks on every axis. The
 * one call is checked against PyTorch and the MX emulation elsewhere (test_model,
 * test_layers); this test holds the split to it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "model/linear.h"
#include "ops/gemm.h"

static uint64_t rng_state = 0x243F6A8885A308D3ull;
static float rng_unit(void) { return (float)mxt_uniform(&rng_state); }

static float *random_floats(int64_t n) {
    float *x = malloc((size_t)n * sizeof *x);
    for (int64_t i = 0; x && i < n; i++) x[i] = rng_unit();
    return x;
}

/* One layer (M tokens, K in, N out): both at once against the two halves. */
static void halves_case(bool bf16, const mxi_linear_mx *mx, bool saved_plane, int64_t M, int64_t K, int64_t N) {
    mxi_linear_ctx *ctx = NULL;
    CHECK_EQ_INT(mxi_linear_ctx_create(&ctx, bf16, NULL), 0);
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
        CHECK_EQ_INT(mxi_linear_save_input(ctx, mx, &sv, inp, M, K), 0);
    }
    mxi_linear_input in = {.inp = saved_plane ? NULL : inp, .saved = saved_plane ? &sv : NULL};
    mxi_linear_params p = {.w = w}, none = {0};
    mxi_linear_shape shape = {M, K, N};
    CHECK_EQ_INT(mxi_linear_backward(ctx, mx, (mxi_linear_grads){.dinp = dinp1, .dw = dw1}, dout, in, p, shape), 0);
    CHECK_EQ_INT(mxi_linear_backward(ctx, mx, (mxi_linear_grads){.dinp = dinp2}, dout, in, p, shape), 0);
    CHECK_EQ_INT(mxi_linear_backward(ctx, mx, (mxi_linear_grads){.dw = dw2}, dout, in, none, shape), 0);
    CHECK_EQ_INT(mxi_linear_ctx_error(ctx, NULL), 0);
    CHECK_MEM_EQ(dinp1, dinp2, (size_t)(M * K) * sizeof(float));
    CHECK_MEM_EQ(dw1, dw2, (size_t)(N * K) * sizeof(float));
    // the accumulating form of the input gradient too (the router's, onto the experts')
    memcpy(dinp2, dinp1, (size_t)(M * K) * sizeof(float));
    mxi_linear_grads both = {.dinp = dinp1, .dinp_write = MXI_WRITE_ADD, .dw = dw1},
                     dx_only = {.dinp = dinp2, .dinp_write = MXI_WRITE_ADD};
    CHECK_EQ_INT(mxi_linear_backward(ctx, mx, both, dout, in, p, shape), 0);
    CHECK_EQ_INT(mxi_linear_backward(ctx, mx, dx_only, dout, in, p, shape), 0);
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
        {.inputs = MX_E4M3, .weight = MX_E4M3, .grads = MX_E4M3, .mode = MX_SCALE_FLOOR},
        {.inputs = MX_E4M3, .weight = MX_E4M3, .grads = MX_E5M2, .mode = MX_SCALE_RCEIL},
        {.inputs = MX_E4M3, .weight = MX_E4M3, .grads = MX_E4M3, .mode = MX_SCALE_FLOOR,
         .weight_tiles = true},   // 32x32 weight tiles (mxfp8-32x32)
    };
    for (size_t r = 0; r < sizeof recipes / sizeof recipes[0]; r++)
        for (int saved = 0; saved < 2; saved++) {
            halves_case(false, &recipes[r], saved, 1, 1, 1);
            halves_case(false, &recipes[r], saved, 37, 70, 45);
            halves_case(true, &recipes[r], saved, 64, 96, 33);
        }
}

/* Two layers (K in; N1 and N2 out) reading one input x (M, K), forward then backward, with
 * and without sharing it. */
static void shared_case(bool bf16, int64_t M, int64_t K, int64_t N1, int64_t N2) {
    mxi_linear_ctx *plain = NULL, *shared = NULL;
    CHECK_EQ_INT(mxi_linear_ctx_create(&plain, bf16, NULL), 0);
    CHECK_EQ_INT(mxi_linear_ctx_create(&shared, bf16, NULL), 0);
    if (!plain || !shared) return;
    int64_t N[2] = {N1, N2};
    float *x = random_floats(M * K), *w[2], *y[2][2], *dy[2], *dw[2][2], *dx[2];
    for (int l = 0; l < 2; l++) {
        w[l] = random_floats(N[l] * K), dy[l] = random_floats(N[l] * M);
        dx[l] = calloc((size_t)(M * K), sizeof(float));
        for (int c = 0; c < 2; c++) {
            y[c][l] = malloc((size_t)(M * N[l]) * sizeof(float));
            dw[c][l] = calloc((size_t)(N[l] * K), sizeof(float));
        }
    }
    mxi_linear_ctx *ctxs[2] = {plain, shared};
    for (int c = 0; c < 2; c++) {   // c = 1 shares x
        if (c) mxi_linear_share_input(shared, x);
        for (int l = 0; l < 2; l++)
            CHECK_EQ_INT(mxi_linear_forward(ctxs[c], NULL, y[c][l], x, (mxi_linear_params){.w = w[l]},
                                            (mxi_linear_shape){M, K, N[l]}), 0);
        for (int l = 0; l < 2; l++) {
            mxi_linear_grads g = {.dinp = dx[c], .dinp_write = l > 0 ? MXI_WRITE_ADD : MXI_WRITE_SET, .dw = dw[c][l]};
            CHECK_EQ_INT(mxi_linear_backward(ctxs[c], NULL, g, dy[l], (mxi_linear_input){.inp = x},
                                             (mxi_linear_params){.w = w[l]}, (mxi_linear_shape){M, K, N[l]}), 0);
        }
        if (c) mxi_linear_share_input(shared, NULL);
    }
    for (int l = 0; l < 2; l++) {
        CHECK_MEM_EQ(y[0][l], y[1][l], (size_t)(M * N[l]) * sizeof(float));
        CHECK_MEM_EQ(dw[0][l], dw[1][l], (size_t)(N[l] * K) * sizeof(float));
    }
    CHECK_MEM_EQ(dx[0], dx[1], (size_t)(M * K) * sizeof(float));
    // new values in the same buffer, shared again: rounded anew
    for (int64_t i = 0; i < M * K; i++) x[i] = -2.0f * x[i] + 0.5f;
    mxi_linear_share_input(shared, x);
    CHECK_EQ_INT(mxi_linear_forward(shared, NULL, y[1][0], x, (mxi_linear_params){.w = w[0]}, (mxi_linear_shape){M, K, N[0]}),
                 0);
    mxi_linear_share_input(shared, NULL);
    CHECK_EQ_INT(mxi_linear_forward(plain, NULL, y[0][0], x, (mxi_linear_params){.w = w[0]}, (mxi_linear_shape){M, K, N[0]}),
                 0);
    CHECK_MEM_EQ(y[0][0], y[1][0], (size_t)(M * N[0]) * sizeof(float));
    CHECK_EQ_INT(mxi_linear_ctx_error(shared, NULL), 0);
    free(x);
    for (int l = 0; l < 2; l++) {
        free(w[l]), free(dy[l]), free(dx[l]);
        for (int c = 0; c < 2; c++) free(y[c][l]), free(dw[c][l]);
    }
    mxi_linear_ctx_free(plain);
    mxi_linear_ctx_free(shared);
}

static void test_shared_input(void) {
    for (int bf16 = 0; bf16 < 2; bf16++) {
        shared_case(bf16, 1, 1, 1, 2);
        shared_case(bf16, 37, 70, 45, 19);
        shared_case(bf16, 128, 64, 96, 64);
    }
}

/* The blockwise and rowwise recipes where the product multiplies bf16 natively: activations
 * and gradients go straight to their bf16 values in the quantizer's pass (linear_blockwise.c,
 * linear_rowwise.c), while with statistics on they go through codes. Both must give the same
 * bits in forward and in backward's two products, also with the first row of the input
 * scaled by row_scale: so small that its blocks' scales leave the values' range (blockwise:
 * codes then), or so large that a product's sums would leave fp32's normal range (rowwise:
 * the product takes the values back to codes); and with the weight scaled by w_scale, so
 * small that its tiles' scales leave bf16's range (blockwise: the products run in fp32 on
 * the values widened). */
static void values_case(const mxi_linear_mx *mx, int64_t M, int64_t K, int64_t N, float row_scale, float w_scale) {
    mxi_linear_ctx *ctx[2] = {NULL, NULL};
    mxi_quant_stats *qs = NULL;
    CHECK_EQ_INT(mxi_linear_ctx_create(&ctx[0], true, NULL), 0);
    CHECK_EQ_INT(mxi_linear_ctx_create(&ctx[1], true, NULL), 0);
    CHECK_EQ_INT(mxi_quant_stats_create(&qs, 1, 4), 0);
    if (!ctx[0] || !ctx[1] || !qs) return;
    mxi_quant_stats_begin(qs);
    mxi_linear_ctx_stats(ctx[1], qs);   // codes: the statistics read them
    float *x = random_floats(M * K), *w = random_floats(N * K), *dy = random_floats(M * N), *y[2], *dx[2], *dw[2];
    for (int64_t k = 0; k < K; k++) x[k] *= row_scale;
    for (int64_t i = 0; i < N * K; i++) w[i] *= w_scale;
    for (int c = 0; c < 2; c++) {
        y[c] = malloc((size_t)(M * N) * sizeof(float));
        dx[c] = malloc((size_t)(M * K) * sizeof(float));
        dw[c] = calloc((size_t)(N * K), sizeof(float));
        mxi_linear_params p = {.w = w};
        mxi_linear_shape shape = {M, K, N};
        CHECK_EQ_INT(mxi_linear_forward(ctx[c], mx, y[c], x, p, shape), 0);
        CHECK_EQ_INT(mxi_linear_backward(ctx[c], mx, (mxi_linear_grads){.dinp = dx[c], .dw = dw[c]}, dy,
                                         (mxi_linear_input){.inp = x}, p, shape), 0);
        CHECK_EQ_INT(mxi_linear_ctx_error(ctx[c], NULL), 0);
    }
    CHECK_MEM_EQ(y[0], y[1], (size_t)(M * N) * sizeof(float));
    CHECK_MEM_EQ(dx[0], dx[1], (size_t)(M * K) * sizeof(float));
    CHECK_MEM_EQ(dw[0], dw[1], (size_t)(N * K) * sizeof(float));
    for (int c = 0; c < 2; c++) free(y[c]), free(dx[c]), free(dw[c]), mxi_linear_ctx_free(ctx[c]);
    free(x), free(w), free(dy);
    mxi_quant_stats_free(qs);
}

static void test_values_or_codes(void) {
    mxi_linear_ctx *probe = NULL;
    CHECK_EQ_INT(mxi_linear_ctx_create(&probe, true, NULL), 0);
    if (!probe) return;
    if (!mxi_gemm_bf16_native(mxi_linear_ctx_gemm(probe)))
        printf("    values path not run: oneDNN multiplies bf16 natively only on AVX-512 BF16 or AMX CPUs\n");
    mxi_linear_ctx_free(probe);
    static const mxi_linear_mx recipes[] = {
        {.inputs = MX_E4M3, .weight = MX_E4M3, .grads = MX_E4M3, .scaling = MXI_SCALE_BLOCKS128, .tmode = MX_TSCALE_POW2},
        {.inputs = MX_E4M3, .weight = MX_E4M3, .grads = MX_E4M3, .scaling = MXI_SCALE_ROWS, .tmode = MX_TSCALE_POW2},
        {.inputs = MX_E4M3, .weight = MX_E4M3, .grads = MX_E5M2, .scaling = MXI_SCALE_ROWS, .tmode = MX_TSCALE_POW2},
    };
    for (size_t r = 0; r < sizeof recipes / sizeof recipes[0]; r++) {
        const mxi_linear_mx *mx = &recipes[r];
        values_case(mx, 1, 1, 1, 1.0f, 1.0f);
        values_case(mx, 146, 160, 97, 1.0f, 1.0f);    // partial blocks along every dim
        values_case(mx, 300, 260, 129, 1.0f, 1.0f);   // operands large enough for the threads
        values_case(mx, 146, 160, 97, mx->scaling == MXI_SCALE_ROWS ? 1e37f : 1e-36f, 1.0f);
        values_case(mx, 146, 160, 97, 1.0f, 1e-36f);
    }
}

static const mxt_test tests[] = {
    {"fp32_and_bf16", test_fp32_and_bf16},
    {"mx", test_mx},
    {"shared_input", test_shared_input},
    {"values_or_codes", test_values_or_codes},
};

int main(int argc, char **argv) { return MXT_RUN(tests, argc, argv); }
