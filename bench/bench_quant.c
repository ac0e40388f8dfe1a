/* Quantization throughput against memcpy of the same input bytes, timed in the same run.
 *
 *   build/bench/bench_quant [--rows N] [--cols N] [--reps N]
 *
 * Cases: bf16 -> MXFP8 both planes (what a linear layer needs for an activation or a
 * weight), fp32 -> MXFP8 one rowwise plane. Each is timed single-threaded and with every
 * OpenMP thread, best of --reps runs, in GB/s of input; the ratio is quantize / memcpy.
 * Prints a Markdown table (with the CPU model) for docs/. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mxtrain/mx.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void cpu_model(char *out, size_t size) {
    snprintf(out, size, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) == 0) {
            char *v = strchr(line, ':');
            if (v) {
                v += 2;
                v[strcspn(v, "\n")] = 0;
                snprintf(out, size, "%s", v);
            }
            break;
        }
    }
    fclose(f);
}

typedef struct {
    const void *src;
    void *dst;
    size_t bytes;
    const uint16_t *xb;
    const float *xf;
    int64_t rows, cols;
    uint8_t *q_row, *s_row, *q_col, *s_col;
} bench_data;

static void run_memcpy(const bench_data *d) {
    // memcpy split the way the quantizer splits work, so both use the same threads
    int threads = omp_get_max_threads();
    size_t chunk = (d->bytes + (size_t)threads - 1) / (size_t)threads;
    #pragma omp parallel for schedule(static)
    for (int t = 0; t < threads; t++) {
        size_t off = (size_t)t * chunk;
        if (off < d->bytes)
            memcpy((char *)d->dst + off, (const char *)d->src + off, off + chunk > d->bytes ? d->bytes - off : chunk);
    }
}

static void run_dual_bf16(const bench_data *d) {
    mx_quantize_dual_bf16(d->xb, d->rows, d->cols, MX_E4M3, MX_SCALE_FLOOR, d->q_row, d->s_row, d->q_col, d->s_col);
}

static void run_row_f32(const bench_data *d) {
    mx_quantize_f32(d->xf, d->rows, d->cols, MX_ROWWISE, MX_E4M3, MX_SCALE_FLOOR, d->q_row, d->s_row);
}

static double best_seconds(void (*fn)(const bench_data *), const bench_data *d, int reps) {
    fn(d);   // warm up: page faults, thread pool
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        fn(d);
        double t = now() - t0;
        if (t < best) best = t;
    }
    return best;
}

int main(int argc, char **argv) {
    int64_t rows = 4096, cols = 4096;
    int reps = 20;
    for (int i = 1; i < argc; i++) {
        if (i + 1 < argc && strcmp(argv[i], "--rows") == 0) rows = atoll(argv[++i]);
        else if (i + 1 < argc && strcmp(argv[i], "--cols") == 0) cols = atoll(argv[++i]);
        else if (i + 1 < argc && strcmp(argv[i], "--reps") == 0) reps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--rows N] [--cols N] [--reps N]\n", argv[0]);
            return 2;
        }
    }
    if (rows <= 0 || cols <= 0 || reps <= 0) {
        fprintf(stderr, "bench_quant: --rows, --cols and --reps must be positive\n");
        return 2;
    }
    int64_t n = rows * cols;
    float *xf = malloc((size_t)n * 4);
    uint16_t *xb = malloc((size_t)n * 2);
    void *dst = malloc((size_t)n * 4);
    uint8_t *q_row = malloc((size_t)n), *q_col = malloc((size_t)n);
    uint8_t *s_row = malloc((size_t)mx_scale_count(rows, cols, MX_ROWWISE));
    uint8_t *s_col = malloc((size_t)mx_scale_count(rows, cols, MX_COLWISE));
    if (!xf || !xb || !dst || !q_row || !q_col || !s_row || !s_col) {
        fprintf(stderr, "bench_quant: out of memory\n");
        return 1;
    }
    // heavy-tailed values: a Student-t(3)-like ratio of uniforms, scaled per row
    uint64_t s = 1;
    for (int64_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        double u = ((s >> 11) + 0.5) / 9007199254740992.0, v = ((s >> 7 & 0xFFFF) + 0.5) / 65536.0;
        float x = (float)((u - 0.5) / (v * v) * 1e-2);
        xf[i] = x;
        uint32_t b;
        memcpy(&b, &x, 4);
        xb[i] = (uint16_t)(b >> 16);
    }
    memset(dst, 1, (size_t)n * 4);
    memset(q_row, 1, (size_t)n);
    memset(q_col, 1, (size_t)n);

    char cpu[256];
    cpu_model(cpu, sizeof cpu);
    int all_threads = omp_get_max_threads();
    printf("# MX quantization throughput\n\n");
    printf("CPU: %s; %d threads available; kernel: %s; matrix %lld x %lld; best of %d runs.\n\n", cpu,
           all_threads, mx_kernel_name(mx_kernel_active()), (long long)rows, (long long)cols, reps);
    printf("| case | threads | quantize GB/s | memcpy GB/s | ratio |\n|---|---|---|---|---|\n");

    struct {
        const char *name;
        void (*fn)(const bench_data *);
        size_t elem_bytes;
    } cases[] = {{"bf16 -> MXFP8 E4M3, both planes", run_dual_bf16, 2},
                 {"fp32 -> MXFP8 E4M3, rowwise plane", run_row_f32, 4}};
    int thread_counts[2] = {1, all_threads};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int t = 0; t < (all_threads > 1 ? 2 : 1); t++) {
            omp_set_num_threads(thread_counts[t]);
            size_t bytes = (size_t)n * cases[c].elem_bytes;
            bench_data d = {cases[c].elem_bytes == 2 ? (const void *)xb : (const void *)xf, dst, bytes, xb, xf,
                            rows, cols, q_row, s_row, q_col, s_col};
            double tq = best_seconds(cases[c].fn, &d, reps);
            double tm = best_seconds(run_memcpy, &d, reps);
            printf("| %s | %d | %.2f | %.2f | %.2f |\n", cases[c].name, thread_counts[t], bytes / tq * 1e-9,
                   bytes / tm * 1e-9, tm / tq);
        }
    free(xf), free(xb), free(dst), free(q_row), free(q_col), free(s_row), free(s_col);
    return 0;
}
