/* MX GEMM (dequantize both planes + fp32 GEMM) against oneDNN matmuls on the same
 * operands, timed in the same run.
 *
 *   build/bench/bench_mx_gemm [--reps N] [--quick] [--case I]
 *
 * Operands are MXFP8 E4M3 planes (floor scales) of heavy-tailed random data. Baselines:
 *   - oneDNN's bf16 x bf16 -> f32 matmul on the dequantized operands (bf16 holds them
 *     exactly), if this CPU has one; oneDNN 2.6 has none without AVX-512 and the table
 *     says so;
 *   - the bf16 GEMM this library runs instead, mxi_matmul on bf16 operands (widened to
 *     fp32, then oneDNN's fp32 matmul);
 *   - oneDNN's fp32 matmul alone on the dequantized fp32 operands (a primitive created
 *     once, outside the timing): the floor of what dequantize-then-GEMM can reach.
 * Each is timed with 1 and 2 OpenMP threads, best of --reps runs, in GFLOP/s (2MNK/t).
 * Prints a Markdown table with the CPU model for docs/benchmarks.md. --quick runs small
 * shapes once (a smoke test); --case I runs only the I-th row group (0..3). */
#include <dnnl.h>
#include <dnnl_debug.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_common.h"
#include "core/rng.h"
#include "mxtrain/mx.h"
#include "ops/gemm.h"
#include "ops/mx_gemm.h"

static uint64_t rng_state = 0xA4093822299F31D0ull;
static uint64_t rng_next(void) { return mxi_rng_next(&rng_state); }

/* Heavy-tailed values (cube of a uniform), columns scaled over a few binades. */
static float *random_matrix(int64_t rows, int64_t cols) {
    float *x = malloc((size_t)(rows * cols) * sizeof *x);
    if (!x) return NULL;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            double u = (double)(rng_next() >> 11) / 9007199254740992.0 * 2.0 - 1.0;
            x[r * cols + c] = (float)ldexp(u * u * u, (int)((c * 2654435761u) % 7) - 3);
        }
    return x;
}

/* ---- a raw oneDNN matmul, created once: C (M, N) = A (M, K) op(B), B stored (N, K) when
 * trans_b else (K, N); A stored (K, M) when trans_a ---- */

typedef struct {
    dnnl_primitive_t prim;
    dnnl_memory_t a, b, c;
    dnnl_status_t status;   // of creation
    char impl[64];
} raw_matmul;

static raw_matmul raw_create(dnnl_engine_t eng, dnnl_data_type_t dt, int64_t M, int64_t N, int64_t K,
                             int trans_a, int trans_b, void *A, void *B, float *C) {
    raw_matmul r;
    memset(&r, 0, sizeof r);
    dnnl_memory_desc_t a_md, b_md, c_md;
    dnnl_dims_t ad = {M, K}, bd = {K, N}, cd = {M, N};
    dnnl_dims_t as = {K, 1}, bs = {N, 1}, cs = {N, 1};
    if (trans_a) { as[0] = 1; as[1] = M; }
    if (trans_b) { bs[0] = 1; bs[1] = K; }
    dnnl_memory_desc_init_by_strides(&a_md, 2, ad, dt, as);
    dnnl_memory_desc_init_by_strides(&b_md, 2, bd, dt, bs);
    dnnl_memory_desc_init_by_strides(&c_md, 2, cd, dnnl_f32, cs);
    dnnl_matmul_desc_t desc;
    dnnl_matmul_desc_init(&desc, &a_md, &b_md, NULL, &c_md);
    dnnl_primitive_desc_t pd;
    r.status = dnnl_primitive_desc_create(&pd, &desc, NULL, eng, NULL);
    if (r.status != dnnl_success) return r;
    const char *impl = NULL;
    dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
    snprintf(r.impl, sizeof r.impl, "%s", impl ? impl : "?");
    r.status = dnnl_primitive_create(&r.prim, pd);
    dnnl_primitive_desc_destroy(pd);
    if (r.status != dnnl_success) return r;
    dnnl_memory_create(&r.a, &a_md, eng, A);
    dnnl_memory_create(&r.b, &b_md, eng, B);
    dnnl_memory_create(&r.c, &c_md, eng, C);
    return r;
}

static void raw_run(const raw_matmul *r, dnnl_stream_t st) {
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, r->a}, {DNNL_ARG_WEIGHTS, r->b}, {DNNL_ARG_DST, r->c}};
    dnnl_primitive_execute(r->prim, st, 3, args);
    dnnl_stream_wait(st);
}

static void raw_destroy(raw_matmul *r) {
    if (r->prim) dnnl_primitive_destroy(r->prim);
    if (r->a) dnnl_memory_destroy(r->a);
    if (r->b) dnnl_memory_destroy(r->b);
    if (r->c) dnnl_memory_destroy(r->c);
}

/* ---- one case ---- */

typedef enum { FORWARD, DINPUT, DWEIGHT } kind_t;
static const char *kind_name[] = {"Y = X W^T", "dX = dY W", "dW = dY^T X"};

typedef struct {
    kind_t kind;
    int64_t M, N, K;   // of the GEMM: C (M, N), contraction K
} shape_t;

typedef struct {
    mxi_gemm_ctx *ctx;
    dnnl_stream_t stream;
    mxi_mx_plane A, B;        // MX operands
    bool ta, tb;
    float *Af, *Bf;           // dequantized, (A.rows, A.cols) and (B.rows, B.cols)
    uint16_t *Ab, *Bb;        // the same as bf16
    float *C;
    int64_t M, N, K;
    raw_matmul f32, bf16;
} bench_ctx;

typedef enum { RUN_MX, RUN_DEQUANT, RUN_WIDEN_BF16, RUN_F32, RUN_BF16 } run_t;

static int run_once(bench_ctx *b, run_t what) {
    switch (what) {
    case RUN_MX: return mxi_mx_gemm(b->ctx, b->C, 0, &b->A, b->ta, &b->B, b->tb, false, NULL);
    case RUN_DEQUANT: return mxi_mx_dequantize(b->Af, &b->A) | mxi_mx_dequantize(b->Bf, &b->B);
    case RUN_WIDEN_BF16:
        return mxi_matmul(b->ctx, b->C, 0, b->Ab, MXI_BF16, b->ta, 0, b->Bb, MXI_BF16, b->tb, 0, b->M, b->N, b->K, false, NULL);
    case RUN_F32: raw_run(&b->f32, b->stream); return 0;
    case RUN_BF16: raw_run(&b->bf16, b->stream); return 0;
    }
    return -1;
}

/* Best time of each run kind over reps rounds; each round times every kind in turn, so a
 * burst of load from elsewhere hits all of them alike. best[k] < 0: kind not run. */
static void best_seconds(bench_ctx *b, const run_t *kinds, int nkinds, int reps, double *best) {
    for (int k = 0; k < nkinds; k++) {
        best[k] = 1e30;
        if (run_once(b, kinds[k])) best[k] = -1;   // warm up: primitive creation, buffers, page faults
    }
    for (int r = 0; r < reps; r++)
        for (int k = 0; k < nkinds; k++) {
            if (best[k] < 0) continue;
            double t0 = mxi_now_seconds();
            run_once(b, kinds[k]);
            double t = mxi_now_seconds() - t0;
            if (t < best[k]) best[k] = t;
        }
}

static uint8_t *quantize(const float *x, int64_t rows, int64_t cols, mx_axis axis, uint8_t **scales) {
    uint8_t *q = malloc((size_t)(rows * cols));
    *scales = malloc((size_t)mx_scale_count(rows, cols, axis));
    if (!q || !*scales) exit(1);
    mx_quantize_f32(x, rows, cols, axis, MX_E4M3, MX_SCALE_FLOOR, q, *scales);
    return q;
}

static void bench_case(dnnl_engine_t eng, dnnl_stream_t stream, mxi_gemm_ctx *ctx, shape_t s, int reps,
                       const int *threads, int nthreads) {
    // The linear layer's operands: X (T, I), W (O, I), dY (T, O). Map the GEMM's (M, N, K).
    bench_ctx b;
    memset(&b, 0, sizeof b);
    b.ctx = ctx;
    b.stream = stream;
    b.M = s.M; b.N = s.N; b.K = s.K;
    int64_t ar, ac, br, bc;
    mx_axis aa, ba;
    switch (s.kind) {
    case FORWARD: ar = s.M; ac = s.K; aa = MX_ROWWISE; br = s.N; bc = s.K; ba = MX_ROWWISE; b.ta = false; b.tb = true; break;
    case DINPUT:  ar = s.M; ac = s.K; aa = MX_ROWWISE; br = s.K; bc = s.N; ba = MX_COLWISE; b.ta = false; b.tb = false; break;
    default:      ar = s.K; ac = s.M; aa = MX_COLWISE; br = s.K; bc = s.N; ba = MX_COLWISE; b.ta = true; b.tb = false; break;
    }
    float *a = random_matrix(ar, ac), *bm = random_matrix(br, bc);
    uint8_t *as, *bs;
    uint8_t *aq = quantize(a, ar, ac, aa, &as), *bq = quantize(bm, br, bc, ba, &bs);
    b.A = (mxi_mx_plane){aq, as, ar, ac, aa, MX_E4M3};
    b.B = (mxi_mx_plane){bq, bs, br, bc, ba, MX_E4M3};
    b.Af = malloc((size_t)(ar * ac) * sizeof(float));
    b.Bf = malloc((size_t)(br * bc) * sizeof(float));
    b.Ab = malloc((size_t)(ar * ac) * sizeof(uint16_t));
    b.Bb = malloc((size_t)(br * bc) * sizeof(uint16_t));
    b.C = malloc((size_t)(s.M * s.N) * sizeof(float));
    float *C_ref = malloc((size_t)(s.M * s.N) * sizeof(float));
    if (!b.Af || !b.Bf || !b.Ab || !b.Bb || !b.C || !C_ref) exit(1);
    mxi_mx_dequantize(b.Af, &b.A);
    mxi_mx_dequantize(b.Bf, &b.B);
    // bf16 copies: exact, because a dequantized FP8 value has at most 4 significant bits
    int64_t inexact = 0;
    for (int64_t i = 0; i < ar * ac; i++) {
        uint32_t u;
        memcpy(&u, &b.Af[i], 4);
        b.Ab[i] = (uint16_t)(u >> 16);
        inexact += (u & 0xFFFF) != 0;
    }
    for (int64_t i = 0; i < br * bc; i++) {
        uint32_t u;
        memcpy(&u, &b.Bf[i], 4);
        b.Bb[i] = (uint16_t)(u >> 16);
        inexact += (u & 0xFFFF) != 0;
    }
    double flop = 2.0 * (double)s.M * (double)s.N * (double)s.K;
    bool mx_bf16 = mxi_gemm_bf16_native(b.ctx);   // which matmul the MX GEMM runs here
    for (int t = 0; t < nthreads; t++) {
        omp_set_num_threads(threads[t]);
        // oneDNN's brgemm fixes its threads at creation: fresh primitives per thread count
        b.f32 = raw_create(eng, dnnl_f32, s.M, s.N, s.K, b.ta, b.tb, b.Af, b.Bf, C_ref);
        b.bf16 = raw_create(eng, dnnl_bf16, s.M, s.N, s.K, b.ta, b.tb, b.Ab, b.Bb, C_ref);
        if (b.f32.status != dnnl_success) {
            fprintf(stderr, "oneDNN fp32 matmul: %s\n", dnnl_status2str(b.f32.status));
            exit(1);
        }
        run_t kinds[5] = {RUN_MX, RUN_DEQUANT, RUN_WIDEN_BF16, RUN_F32, RUN_BF16};
        double best[5];
        best_seconds(&b, kinds, b.bf16.status == dnnl_success ? 5 : 4, reps, best);
        double t_mx = best[0], t_deq = best[1], t_wid = best[2], t_f32 = best[3];
        double t_bf16 = b.bf16.status == dnnl_success ? best[4] : -1;
        // the MX GEMM and the matmul it runs (bf16 where native, else fp32) on its dequantized operands agree
        run_once(&b, RUN_MX);
        run_once(&b, mx_bf16 ? RUN_BF16 : RUN_F32);
        double maxdiff = 0;
        for (int64_t i = 0; i < s.M * s.N; i++) maxdiff = fmax(maxdiff, fabs((double)b.C[i] - C_ref[i]));
        char bf16_col[160], bf16_ratio[32];
        if (t_bf16 > 0) {
            snprintf(bf16_col, sizeof bf16_col, "%.1f (%s)", flop / t_bf16 * 1e-9, b.bf16.impl);
            snprintf(bf16_ratio, sizeof bf16_ratio, "%.2f", t_bf16 / t_mx);
        } else {
            snprintf(bf16_col, sizeof bf16_col, "none (%s)", dnnl_status2str(b.bf16.status));
            snprintf(bf16_ratio, sizeof bf16_ratio, "-");
        }
        printf("| %s | %lld | %lld | %lld | %d | %.1f | %.1f | %s | %.1f | %.1f | %s | %.2f | %.2f |%s\n",
               kind_name[s.kind], (long long)s.M, (long long)s.N, (long long)s.K, threads[t],
               flop / t_mx * 1e-9, t_deq * 1e3, bf16_col, flop / t_wid * 1e-9, flop / t_f32 * 1e-9,
               bf16_ratio, t_wid / t_mx, t_f32 / t_mx,
               maxdiff == 0 && inexact == 0 ? "" : " (check failed)");
        fflush(stdout);
        raw_destroy(&b.f32);
        raw_destroy(&b.bf16);
    }
    free(a); free(bm); free(aq); free(as); free(bq); free(bs);
    free(b.Af); free(b.Bf); free(b.Ab); free(b.Bb); free(b.C); free(C_ref);
}

/* Dequantization alone, single-threaded: each kernel on an n x n plane of each axis, in
 * G elements/s (4 bytes written per element). */
static void dequant_speed(int64_t n, int reps) {
    float *x = random_matrix(n, n), *y = malloc((size_t)(n * n) * sizeof(float));
    if (!x || !y) exit(1);
    omp_set_num_threads(1);
    printf("\nDequantization to fp32, %lld x %lld E4M3, 1 thread, G elements/s:", (long long)n, (long long)n);
    mx_kernel saved = mx_kernel_active();
    for (int axis = 0; axis < 2; axis++) {
        uint8_t *s;
        uint8_t *q = quantize(x, n, n, (mx_axis)axis, &s);
        mxi_mx_plane p = {q, s, n, n, (mx_axis)axis, MX_E4M3};
        for (int k = MX_KERNEL_REF; mx_kernel_name((mx_kernel)k); k++) {   // every kernel the CPU runs
            if (mx_kernel_select((mx_kernel)k)) continue;
            double best = 1e30;
            mxi_mx_dequantize(y, &p);
            for (int r = 0; r < reps; r++) {
                double t0 = mxi_now_seconds();
                mxi_mx_dequantize(y, &p);
                double t = mxi_now_seconds() - t0;
                if (t < best) best = t;
            }
            printf(" %s %s %.2f;", axis ? "colwise" : "rowwise", mx_kernel_name((mx_kernel)k), (double)(n * n) / best * 1e-9);
        }
        free(q);
        free(s);
    }
    mx_kernel_select(saved);
    printf("\n");
    free(x);
    free(y);
}

int main(int argc, char **argv) {
    mx_diag kdiag;
    if (mx_kernel_check_env(&kdiag) != MX_OK) {   // a forced kernel must run here
        fprintf(stderr, "%s: %s\n", argv[0], kdiag.msg);
        return 2;
    }
    int reps = 5;
    bool quick = false;
    int only = -1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) reps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--quick") == 0) quick = true;
        else if (strcmp(argv[i], "--case") == 0 && i + 1 < argc) only = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--reps N] [--quick] [--case I]\n", argv[0]);
            return 2;
        }
    }
    if (reps < 1) reps = 1;
    shape_t full[] = {
        {FORWARD, 2048, 2048, 2048},
        {FORWARD, 8192, 1024, 1024},
        {DINPUT, 8192, 1024, 1024},
        {DWEIGHT, 1024, 1024, 8192},
    };
    shape_t small[] = {{FORWARD, 256, 128, 160}, {DINPUT, 256, 96, 64}, {DWEIGHT, 64, 96, 256}};
    shape_t *shapes = quick ? small : full;
    int nshapes = quick ? 3 : 4;
    if (quick) reps = 1;
    int threads[2] = {1, 2};
    int nthreads = omp_get_num_procs() >= 2 ? 2 : 1;

    dnnl_engine_t eng;
    dnnl_stream_t stream;
    mxi_gemm_ctx *ctx;
    mx_diag diag;
    if (dnnl_engine_create(&eng, dnnl_cpu, 0) || dnnl_stream_create(&stream, eng, dnnl_stream_default_flags)) return 1;
    if (mxi_gemm_ctx_create(&ctx, &diag)) {
        fprintf(stderr, "%s\n", diag.msg);
        return 1;
    }
    char cpu[256];
    cpu_model(cpu, sizeof cpu);
    printf("MX GEMM: dequantize both MXFP8 E4M3 planes + oneDNN %s matmul; best of %d, GFLOP/s = 2MNK/t\n",
           mxi_gemm_bf16_native(ctx) ? "bf16 (native on this CPU)" : "fp32 (no native bf16 matmul on this CPU)", reps);
    char load[128] = "?";
    FILE *lf = fopen("/proc/loadavg", "r");
    if (lf) {
        if (fgets(load, sizeof load, lf)) load[strcspn(load, "\n")] = 0;
        fclose(lf);
    }
    printf("CPU: %s, %d logical CPUs; dequant kernel: %s; oneDNN %d.%d.%d; load average at start: %s\n\n", cpu,
           omp_get_num_procs(), mx_kernel_name(mx_kernel_active()), DNNL_VERSION_MAJOR, DNNL_VERSION_MINOR,
           DNNL_VERSION_PATCH, load);
    printf("| GEMM | M | N | K | threads | MX GEMM GFLOP/s | dequant ms | oneDNN bf16 matmul GFLOP/s | mxi_matmul bf16 operands GFLOP/s | oneDNN fp32 matmul GFLOP/s | MX / oneDNN bf16 | MX / mxi_matmul bf16 | MX / fp32 |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int i = 0; i < nshapes; i++)
        if (only < 0 || only == i) bench_case(eng, stream, ctx, shapes[i], reps, threads, nthreads);
    if (only < 0) dequant_speed(quick ? 256 : 2048, reps);
    mxi_gemm_stats st;
    mxi_gemm_ctx_stats(ctx, &st);
    printf("\nfp32 implementation: %s; bf16 probe: %s; primitives created: %lld, cache hits: %lld\n",
           st.f32_impl, st.bf16_probe, (long long)st.primitives_created, (long long)st.cache_hits);
    mxi_gemm_ctx_destroy(ctx);
    dnnl_stream_destroy(stream);
    dnnl_engine_destroy(eng);
    return 0;
}
