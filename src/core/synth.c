/* Synthetic data (see synth.h). */
#include "core/synth.h"

#include "core/rng.h"

#include <math.h>
#include <stdlib.h>

#include "mxtrain/error.h"

static double normal(uint64_t *s) { return mxi_rng_normal(s, 1.0); }

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
