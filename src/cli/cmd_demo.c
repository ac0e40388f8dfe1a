/* mxtrain demo: quantize a large matrix of LLM-activation-like values (heavy-tailed, with
 * outlier channels) to MXFP8 under both scale modes and both element formats, and report
 * throughput and what the quantization did to the numbers. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "core/clock.h"
#include "core/synth.h"
#include "mxtrain/mx.h"

static const char demo_usage[] =
    "usage: mxtrain demo [--rows N] [--cols N] [--seed N]\n"
    "\n"
    "Quantizes a rows x cols fp32 matrix (default 4096 x 4096) of Student-t(3) values whose\n"
    "columns are scaled log-normally (a few outlier channels, as in transformer activations)\n"
    "to MXFP8, rowwise, under scale modes floor and rceil and formats E4M3 and E5M2; prints\n"
    "throughput (GB/s of fp32 input), SQNR, and the counts of saturated and flushed-to-zero\n"
    "elements. Threads: OMP_NUM_THREADS. Kernel: MXTRAIN_KERNEL=ref|avx2|avx512 (default:\n"
    "the fastest this CPU runs).\n";

int cli_demo(int argc, char **argv) {
    long long rows = 4096, cols = 4096, seed = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            fputs(demo_usage, stdout);
            return 0;
        }
        long long *dst = strcmp(a, "--rows") == 0 ? &rows : strcmp(a, "--cols") == 0 ? &cols
                       : strcmp(a, "--seed") == 0 ? &seed : NULL;
        if (!dst) {
            fprintf(stderr, "mxtrain demo: unknown option '%s'\n%s", a, demo_usage);
            return 2;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "mxtrain demo: %s needs a value\n%s", a, demo_usage);
            return 2;
        }
        if (!cli_parse_positive("demo", a + 2, argv[++i], 1 << 20, dst)) return 2;
    }
    if (rows * cols > (1ll << 31)) {
        fprintf(stderr, "mxtrain demo: --rows x --cols = %lld is too large (allowed: at most 2^31 elements)\n", rows * cols);
        return 2;
    }
    int64_t n = rows * cols, nscales = mx_scale_count(rows, cols, MX_ROWWISE);
    float *x = malloc((size_t)n * sizeof *x), *y = malloc((size_t)n * sizeof *y);
    uint8_t *q = malloc((size_t)n), *scales = malloc((size_t)nscales);
    if (!x || !y || !q || !scales || mxi_fill_heavy_tailed(x, rows, cols, (uint64_t)seed)) {
        fprintf(stderr, "mxtrain demo: out of memory for a %lld x %lld matrix\n", rows, cols);
        free(x), free(y), free(q), free(scales);
        return 1;
    }
    double amax = 0;
    for (int64_t i = 0; i < n; i++) amax = fmax(amax, fabs(x[i]));
    printf("mxtrain demo: %lld x %lld fp32 matrix, heavy-tailed (Student-t(3) x log-normal column scales),"
           " max |x| = %.3g\n", rows, cols, amax);
    printf("kernel %s, %d threads; quantize rowwise (1x32 blocks), best of 5 runs\n\n",
           mx_kernel_name(mx_kernel_active()), omp_get_max_threads());
    printf("%-6s %-6s %10s %10s %12s %12s\n", "format", "scale", "GB/s", "SQNR dB", "saturated", "flushed-to-0");

    const mx_elem elems[] = {MX_E4M3, MX_E5M2};
    const mx_scale_mode modes[] = {MX_SCALE_FLOOR, MX_SCALE_RCEIL};
    const char *mode_names[] = {"floor", "rceil"};
    for (int ei = 0; ei < 2; ei++)
        for (int mi = 0; mi < 2; mi++) {
            const mx_elem_traits *t = mx_elem_traits_of(elems[ei]);
            double best = 1e30;
            for (int rep = 0; rep < 5; rep++) {
                double t0 = mxi_now_seconds();
                int rc = mx_quantize_f32(x, rows, cols, MX_ROWWISE, elems[ei], modes[mi], q, scales);
                best = fmin(best, mxi_now_seconds() - t0);
                if (rc) {
                    fprintf(stderr, "mxtrain demo: quantize failed: %s\n", mx_strerror(rc));
                    return 1;
                }
            }
            mx_dequantize_f32(q, scales, rows, cols, MX_ROWWISE, elems[ei], y);
            double signal = 0, noise = 0;
            long long saturated = 0, flushed = 0;
            int64_t cb = (cols + MX_BLOCK - 1) / MX_BLOCK;
            #pragma omp parallel for reduction(+ : signal, noise, saturated, flushed)
            for (int64_t r = 0; r < rows; r++)
                for (int64_t c = 0; c < cols; c++) {
                    double xv = x[r * cols + c], d = xv - y[r * cols + c];
                    signal += xv * xv;
                    noise += d * d;
                    saturated += fabs(xv) > t->max * (double)mx_e8m0_to_f32(scales[r * cb + c / MX_BLOCK]);
                    flushed += xv != 0 && (q[r * cols + c] & 0x7F) == 0;
                }
            printf("%-6s %-6s %10.2f %10.2f %12lld %12lld\n", t->name, mode_names[mi], n * 4.0 / best * 1e-9,
                   10 * log10(signal / noise), saturated, flushed);
        }
    printf("\nsaturated: |x| beyond the format's max at its block scale (floor mode clips blocks whose\n"
           "max has a mantissa >= 1.75; rceil rounds the scale up and never clips).\n"
           "flushed-to-0: nonzero values that became zero (too small next to their block's max).\n");
    free(x), free(y), free(q), free(scales);
    return 0;
}
