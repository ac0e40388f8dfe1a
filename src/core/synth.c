/* Synthetic data (see synth.h). */
#include "core/synth.h"

#include <math.h>
#include <stdlib.h>

#include "mxtrain/error.h"

uint64_t mxi_mix64(uint64_t z) {   // splitmix64's finaliser
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double uniform(uint64_t *s) { return ((mxi_mix64(*s += 0x9E3779B97F4A7C15ull) >> 11) + 0.5) * 0x1.0p-53; }
static double normal(uint64_t *s) { return sqrt(-2 * log(uniform(s))) * cos(6.283185307179586 * uniform(s)); }

int mxi_fill_heavy_tailed(float *x, int64_t rows, int64_t cols, uint64_t seed) {
    float *col_scale = malloc((size_t)(cols > 0 ? cols : 1) * sizeof *col_scale);   // (cols)
    if (!col_scale) return MX_ENOMEM;
    uint64_t s = seed;
    for (int64_t c = 0; c < cols; c++) col_scale[c] = (float)exp(1.5 * normal(&s));
    #pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        uint64_t rs = mxi_mix64(seed ^ (uint64_t)(r + 1) * 0xD1B54A32D192ED03ull);
        for (int64_t c = 0; c < cols; c++) {
            double z = normal(&rs), chi2 = 0;
            for (int k = 0; k < 3; k++) {
                double g = normal(&rs);
                chi2 += g * g;
            }
            x[r * cols + c] = (float)(z / sqrt(chi2 / 3) * col_scale[c] * 0.05);
        }
    }
    free(col_scale);
    return MX_OK;
}
