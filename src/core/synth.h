/* Internal: synthetic data for `mxtrain demo` and the benchmarks, and the mix behind it. */
#ifndef MXI_SYNTH_H
#define MXI_SYNTH_H

#include <stdint.h>

#include "core/rng.h"

/* x (rows, cols): Student-t(3) values times 0.05, each column scaled by exp(1.5 N(0,1)),
 * like transformer activations with a few outlier channels. The same matrix for a seed
 * whatever the thread count (one generator per row). Returns 0 or MX_ENOMEM. */
int mxi_fill_heavy_tailed(float *x, int64_t rows, int64_t cols, uint64_t seed);

#endif
