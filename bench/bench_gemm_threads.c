/* How the GEMMs and attention of the 20.7M Llama of bench/llama20m.sh (micro-batch 8 x 256
 * tokens: M = 2048 rows) scale from 1 to 2 OpenMP threads, under whatever wait policy and
 * placement the environment gives the OpenMP runtime. bench/bench_threads.sh runs it under
 * several and joins the tables.
 *
 *   build/bench/bench_gemm_threads [--reps N] [--bf16] [--attention]
 *
 * Prints one tab-separated line per case: name, ms with 1 thread, ms with 2 threads (best
 * of --reps after one warm-up call), calls per training step. fp32 operands by default: the
 * GEMMs of the bf16 and MXFP8 paths on a CPU without a bf16 matmul; --bf16: bf16 operands,
 * the GEMMs of the bf16 path where oneDNN has a bf16 matmul (widened to fp32 where it has
 * none), plus q/k/v and gate/up fused into one product each (0 calls per step: what fusing
 * them would run instead). Attention runs at both compute precisions (bf16: rounded
 * operands, on the bf16 matmul where the CPU has one); --attention runs only attention at
 * bf16 (what `perf record` of it should see). */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"
#include "ops/attention.h"
#include "ops/gemm.h"
#include "ops/nn_kernels.h"

typedef struct {
    const char *name;
    bool trans_a, trans_b;
    int64_t M, N, K;
    int per_step;   // calls per training step (6 layers; q, k, v, o count 4)
} gemm_case;

static double best_of(int reps, int threads, void (*run)(void *), void *arg) {
    omp_set_num_threads(threads);
    run(arg);   // warm-up: creates the primitive for this thread count
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = mxi_now_seconds();
        run(arg);
        double dt = mxi_now_seconds() - t0;
        if (dt < best) best = dt;
    }
    return best;
}

typedef struct {
    mxi_gemm_ctx *ctx;
    const gemm_case *c;
    const void *A, *B;
    mxi_dtype type;
    float *C;
} gemm_arg;

static void run_gemm(void *p) {
    gemm_arg *g = p;
    mx_diag d;
    const gemm_case *c = g->c;
    if (mxi_matmul(g->ctx, g->C, 0, g->A, g->type, c->trans_a, 0, g->B, g->type, c->trans_b, 0, c->M, c->N, c->K,
                   false, &d)) {
        fprintf(stderr, "bench_gemm_threads: %s\n", d.msg);
        exit(1);
    }
}

typedef struct {
    mxi_gemm_ctx *ctx;
    int B, T, NH, HD;
    bool bf16;   // bf16 compute precision: operands rounded to bf16 (native bf16 matmul where there is one)
    float *q, *k, *v, *out, *att, *dq, *dk, *dv, *scratch;
} attn_arg;

static void run_attention(void *p) {
    attn_arg *a = p;
    mx_diag d;
    if (mxi_attention_forward(a->ctx, a->out, a->att, a->scratch, a->q, a->k, a->v, NULL, a->B, a->T, a->NH, a->NH, a->HD,
                              a->bf16, &d) ||
        mxi_attention_backward(a->ctx, a->dq, a->dk, a->dv, a->scratch, a->out, (mxi_att_output){.f32 = a->out}, a->att,
                               a->q, a->k, a->v, NULL, a->B, a->T, a->NH, a->NH, a->HD, a->bf16, &d)) {
        fprintf(stderr, "bench_gemm_threads: %s\n", d.msg);
        exit(1);
    }
}

static float *filled(int64_t n, float step) {
    float *x = malloc((size_t)n * sizeof *x);
    if (!x) {
        fprintf(stderr, "bench_gemm_threads: out of memory\n");
        exit(1);
    }
    for (int64_t i = 0; i < n; i++) x[i] = (float)(i % 7) * step;
    return x;
}

int main(int argc, char **argv) {
    int reps = 5;
    bool bf16 = false, attention_only = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) reps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--bf16") == 0) bf16 = true;
        else if (strcmp(argv[i], "--attention") == 0) attention_only = true;
        else {
            fprintf(stderr, "usage: %s [--reps N] [--bf16] [--attention]\n", argv[0]);
            return 2;
        }
    }
    if (reps < 1) reps = 1;
    static const gemm_case cases[] = {
        {"Y = X W^T: q, k, v, o (2048 x 512 x 512)", false, true, 2048, 512, 512, 24},
        {"Y = X W^T: gate, up (2048 x 1536 x 512)", false, true, 2048, 1536, 512, 12},
        {"Y = X W^T: down (2048 x 512 x 1536)", false, true, 2048, 512, 1536, 6},
        {"Y = X W^T: lm_head (2048 x 257 x 512)", false, true, 2048, 257, 512, 1},
        {"dX = dY W: q, k, v, o (2048 x 512 x 512)", false, false, 2048, 512, 512, 24},
        {"dX = dY W: gate, up (2048 x 512 x 1536)", false, false, 2048, 512, 1536, 12},
        {"dX = dY W: down (2048 x 1536 x 512)", false, false, 2048, 1536, 512, 6},
        {"dW = dY^T X: q, k, v, o (512 x 512 x 2048)", true, false, 512, 512, 2048, 24},
        {"dW = dY^T X: gate, up (1536 x 512 x 2048)", true, false, 1536, 512, 2048, 12},
        {"dW = dY^T X: down (512 x 1536 x 2048)", true, false, 512, 1536, 2048, 6},
        {"dW = dY^T X: lm_head (257 x 512 x 2048)", true, false, 257, 512, 2048, 1},
        {"Y = X W^T: q|k|v fused (2048 x 1536 x 512)", false, true, 2048, 1536, 512, 0},
        {"Y = X W^T: gate|up fused (2048 x 3072 x 512)", false, true, 2048, 3072, 512, 0},
        {"dX = dY W: q|k|v fused (2048 x 512 x 1536)", false, false, 2048, 512, 1536, 0},
        {"dX = dY W: gate|up fused (2048 x 512 x 3072)", false, false, 2048, 512, 3072, 0},
        {"dW = dY^T X: q|k|v fused (1536 x 512 x 2048)", true, false, 1536, 512, 2048, 0},
        {"dW = dY^T X: gate|up fused (3072 x 512 x 2048)", true, false, 3072, 512, 2048, 0},
    };
    int n_cases = attention_only ? 0 : (int)(sizeof cases / sizeof cases[0]) - (bf16 ? 0 : 6);   // fused: --bf16
    mxi_gemm_ctx *ctx;
    mx_diag d;
    if (mxi_gemm_ctx_create(&ctx, &d)) {
        fprintf(stderr, "bench_gemm_threads: %s\n", d.msg);
        return 1;
    }
    int64_t big = 2048 * 3072;
    float *A = filled(big, 0.1f), *B = filled(big, 0.2f), *C = filled(big, 0.0f);
    uint16_t *A16 = malloc((size_t)big * 2), *B16 = malloc((size_t)big * 2);
    if (!A16 || !B16) {
        fprintf(stderr, "bench_gemm_threads: out of memory\n");
        return 1;
    }
    mxi_bf16_round(A16, A, big);
    mxi_bf16_round(B16, B, big);
    if (bf16)
        printf("# GEMMs on bf16 operands: %s\n", mxi_gemm_bf16_native(ctx) ? "oneDNN's bf16 matmul" : "widened to fp32 (no bf16 matmul here)");
    for (int i = 0; i < n_cases; i++) {
        gemm_arg g = {ctx, &cases[i], bf16 ? (const void *)A16 : A, bf16 ? (const void *)B16 : B,
                      bf16 ? MXI_BF16 : MXI_F32, C};
        double t1 = best_of(reps, 1, run_gemm, &g), t2 = best_of(reps, 2, run_gemm, &g);
        printf("%s\t%.3f\t%.3f\t%d\n", cases[i].name, t1 * 1e3, t2 * 1e3, cases[i].per_step);
    }
    attn_arg a = {.ctx = ctx, .B = 8, .T = 256, .NH = 8, .HD = 64};
    int64_t n = (int64_t)a.B * a.T * a.NH * a.HD;
    a.q = filled(n, 0.01f), a.k = filled(n, 0.02f), a.v = filled(n, 0.03f), a.out = filled(n, 0);
    a.dq = filled(n, 0), a.dk = filled(n, 0), a.dv = filled(n, 0);
    a.att = filled((int64_t)a.B * a.NH * a.T * a.T, 0);
    int64_t s32 = mxi_attention_scratch(a.B, a.T, a.NH, a.NH, a.HD, false),
            s16 = mxi_attention_scratch(a.B, a.T, a.NH, a.NH, a.HD, true);
    a.scratch = filled(s32 > s16 ? s32 : s16, 0);   // both precisions run on it
    for (int prec = attention_only; prec < 2; prec++) {
        a.bf16 = prec;
        double t1 = best_of(reps, 1, run_attention, &a), t2 = best_of(reps, 2, run_attention, &a);
        printf("attention forward + backward (B 8, T 256, 8 heads of 64), %s\t%.3f\t%.3f\t6\n",
               !prec ? "fp32" : "bf16 operands", t1 * 1e3, t2 * 1e3);
    }
    mxi_gemm_ctx_destroy(ctx);
    free(A16), free(B16);
    return 0;
}
