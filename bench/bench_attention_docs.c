/* What document masking (data.reset_attention_mask) saves in attention: forward + backward of
 * one sequence of T tokens, 8 heads of 64 at bf16 compute (the model's), plain causal against
 * documents of L tokens each. Times are the calling thread's CPU seconds, best of --reps
 * after a warm-up: run it with OMP_NUM_THREADS=1 so that other work on the machine does not
 * count.
 *
 * --batch B runs B such sequences at once (the documents cut each of them alike).
 *
 *   OMP_NUM_THREADS=1 build/bench/bench_attention_docs [--seq T] [--batch B] [--doc L] [--reps N] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_common.h"
#include "ops/attention.h"

static double cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static float *filled(int64_t n, float step) {
    float *x = malloc((size_t)n * sizeof *x);
    if (!x) abort();
    for (int64_t i = 0; i < n; i++) x[i] = step * (float)(i % 97) - 0.4f;
    return x;
}

int main(int argc, char **argv) {
    int T = 2048, B = 1, L = 256, reps = 3, NH = 8, HD = 64;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--seq") == 0 && i + 1 < argc) T = atoi(argv[++i]);
        else if (strcmp(argv[i], "--batch") == 0 && i + 1 < argc) B = atoi(argv[++i]);
        else if (strcmp(argv[i], "--doc") == 0 && i + 1 < argc) L = atoi(argv[++i]);
        else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) reps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--seq T] [--batch B] [--doc L] [--reps N]\n", argv[0]);
            return 2;
        }
    }
    if (T < 1 || B < 1 || L < 1 || reps < 1) {
        fprintf(stderr, "%s: --seq, --batch, --doc and --reps must be positive\n", argv[0]);
        return 2;
    }
    mxi_gemm_ctx *ctx = NULL;
    mx_diag diag = {{0}};
    if (mxi_gemm_ctx_create(&ctx, &diag)) {
        fprintf(stderr, "%s\n", diag.msg);
        return 1;
    }
    int64_t n = (int64_t)B * T * NH * HD;
    float *q = filled(n, 0.01f), *k = filled(n, 0.02f), *v = filled(n, 0.03f), *out = filled(n, 0);
    float *dq = filled(n, 0), *dk = filled(n, 0), *dv = filled(n, 0), *stats = filled((int64_t)B * NH * T * 2, 0);
    float *scratch = filled(mxi_attention_scratch(B, T, NH, NH, HD, true), 0);
    int32_t *doc = malloc((size_t)B * T * sizeof *doc);
    for (int64_t t = 0; t < (int64_t)B * T; t++) doc[t] = (int32_t)(t % T / L * L);
    char cpu[256];
    cpu_model(cpu, sizeof cpu);
    printf("# %s; attention forward + backward, B %d, T %d, 8 heads of 64, bf16 operands; CPU ms, best of %d\n", cpu,
           B, T, reps);
    double best[2] = {0, 0};
    for (int masked = 0; masked < 2; masked++) {
        const int32_t *d = masked ? doc : NULL;
        for (int r = 0; r <= reps; r++) {   // r = 0: the warm-up
            double t0 = cpu_seconds();
            if (mxi_attention_forward(ctx, out, stats, scratch, q, k, v, d, B, T, NH, NH, HD, true, &diag) ||
                mxi_attention_backward(ctx, dq, dk, dv, scratch, out, (mxi_att_output){.f32 = out}, stats, q, k, v, d, B,
                                       T, NH, NH, HD, true, &diag)) {
                fprintf(stderr, "%s\n", diag.msg);
                return 1;
            }
            double s = cpu_seconds() - t0;
            if (r && (r == 1 || s < best[masked])) best[masked] = s;
        }
        printf("%s\t%.1f\n", masked ? "documents of L tokens" : "causal, no documents", best[masked] * 1e3);
    }
    printf("# documents of %d: %.2fx the causal time\n", L, best[1] / best[0]);
    free(q), free(k), free(v), free(out), free(dq), free(dk), free(dv), free(stats), free(scratch), free(doc);
    mxi_gemm_ctx_destroy(ctx);
    return 0;
}
