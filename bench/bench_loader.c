/* Batch loader throughput against memcpy of the same token bytes, timed in the same run.
 *
 *   build/bench/bench_loader [--tokens N] [--batch B] [--seq T] [--steps S] [--reps R]
 *
 * One shard of N uint16 tokens (default 32M, 64 MB, in the page cache after the first pass)
 * is read as B x T batches (default 8 x 1024) by the stream loader (llm.c's order), as a
 * blend of the same shard in two datasets (0.7 / 0.3), and shuffled (data.shuffle: one
 * pread per row wherever it falls). Each is timed for S batches, best of R runs, alternating
 * with a memcpy of the bytes the batches hold (2 (B T + 1) per batch, from a buffer of the
 * shard's size, so that it leaves the caches as the loader's reads do). Prints a Markdown
 * table with the CPU model. A training step of the 20.7M Llama (B 8, T 256) takes about 1 s
 * on two cores here, so a loader costs a step nothing while it is far above its batches. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_common.h"
#include "mxtrain/tokens.h"

static long arg(int argc, char **argv, const char *name, long dflt) {
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], name)) return strtol(argv[i + 1], NULL, 10);
    return dflt;
}

/* Seconds for `steps` batches of l (0 on error, printed). */
static double time_loader(mx_loader *l, int steps, int32_t *in, int32_t *tg) {
    mx_diag d;
    double t0 = mxi_now_seconds();
    for (int s = 0; s < steps; s++)
        if (mx_loader_next(l, in, tg, &d)) {
            fprintf(stderr, "bench_loader: %s\n", d.msg);
            return 0;
        }
    return mxi_now_seconds() - t0;
}

static double time_memcpy(unsigned char *dst, const unsigned char *src, size_t size, size_t chunk, int steps) {
    double t0 = mxi_now_seconds();
    size_t at = 0;
    for (int s = 0; s < steps; s++) {
        if (at + chunk > size) at = 0;
        memcpy(dst, src + at, chunk);
        at += chunk * 7 % size;   // elsewhere in the buffer each time, as rows are
    }
    return mxi_now_seconds() - t0;
}

int main(int argc, char **argv) {
    long n = arg(argc, argv, "--tokens", 32L << 20), B = arg(argc, argv, "--batch", 8), T = arg(argc, argv, "--seq", 1024);
    int steps = (int)arg(argc, argv, "--steps", 2000), reps = (int)arg(argc, argv, "--reps", 5);
    if (n < 2 * B * T + 1 || B < 1 || T < 1 || steps < 1 || reps < 1) {
        fprintf(stderr, "usage: bench_loader [--tokens N] [--batch B] [--seq T] [--steps S] [--reps R] "
                        "(N > 2 B T)\n");
        return 2;
    }
    char path[] = "/tmp/mxtrain-bench-loader-XXXXXX";
    int fd = mkstemp(path);
    uint32_t *tok = malloc((size_t)n * sizeof *tok);   // written as uint16 (every token < 2^16)
    int32_t *in = malloc((size_t)(B * T) * sizeof *in), *tg = malloc((size_t)(B * T) * sizeof *tg);
    size_t chunk = (size_t)(B * T + 1) * sizeof(uint16_t);   // a batch's bytes in the shard
    unsigned char *dst = malloc(chunk);
    if (fd < 0 || !tok || !in || !tg || !dst) return 1;
    close(fd);
    for (long i = 0; i < n; i++) tok[i] = (uint32_t)(i * 7919 % 50257);
    mx_diag d;
    if (mx_shard_write(path, tok, n, false, &d)) {
        fprintf(stderr, "bench_loader: %s\n", d.msg);
        return 1;
    }
    const char *paths[2] = {path, path};
    const double weights[2] = {0.7, 0.3};
    mx_loader *stream = NULL, *blend = NULL, *shuffled = NULL;
    if (mx_loader_open(paths, 1, (int)B, (int)T, 0, 1, 50257, &stream, &d) ||
        mx_loader_open_blend(paths, weights, 2, (int)B, (int)T, 0, 1, 50257, &blend, &d) ||
        mx_loader_open_blend(paths, NULL, 1, (int)B, (int)T, 0, 1, 50257, &shuffled, &d) ||
        mx_loader_shuffle(shuffled, 1234, &d)) {
        fprintf(stderr, "bench_loader: %s\n", d.msg);
        return 1;
    }
    struct { const char *name; mx_loader *l; double best, copy; } cases[] = {
        {"stream (llm.c order)", stream, 1e30, 1e30},
        {"blend 0.7 / 0.3", blend, 1e30, 1e30},
        {"shuffled (data.shuffle)", shuffled, 1e30, 1e30},
    };
    for (int r = 0; r < reps; r++)
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            double t = time_loader(cases[c].l, steps, in, tg);
            if (t <= 0) return 1;
            double m = time_memcpy(dst, (const unsigned char *)tok, (size_t)n * sizeof(uint16_t), chunk, steps);
            if (t < cases[c].best) cases[c].best = t;
            if (m < cases[c].copy) cases[c].copy = m;
        }
    char cpu[256];
    cpu_model(cpu, sizeof cpu);
    printf("CPU: %s; shard of %ld tokens; batches %ld x %ld; %d batches, best of %d\n\n", cpu, n, B, T, steps, reps);
    printf("| loader | batches/s | GB/s of batch tokens | memcpy GB/s | loader / memcpy |\n|---|---|---|---|---|\n");
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        double gb = (double)chunk * steps / 1e9;
        printf("| %s | %.0f | %.2f | %.2f | %.2f |\n", cases[c].name, steps / cases[c].best, gb / cases[c].best,
               gb / cases[c].copy, cases[c].copy / cases[c].best);
        mx_loader_close(cases[c].l);
    }
    unlink(path);
    free(tok), free(in), free(tg), free(dst);
    return 0;
}
