/* Internal: the one random generator of the project (splitmix64): model initialisation,
 * synthetic data for the demo and the benchmarks, and the tests' inputs. A stream is a
 * uint64_t state; the same seed gives the same numbers on every machine. */
#ifndef MXI_RNG_H
#define MXI_RNG_H

#include <math.h>
#include <stdint.h>

/* splitmix64's finaliser: a bijective mix of 64 bits (seeds, keys). */
static inline uint64_t mxi_mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* The stream's next 64 bits. */
static inline uint64_t mxi_rng_next(uint64_t *s) { return mxi_mix64(*s += 0x9E3779B97F4A7C15ull); }

/* Uniform in (0, 1): 53 bits, never 0 or 1. */
static inline double mxi_rng_uniform(uint64_t *s) { return ((mxi_rng_next(s) >> 11) + 0.5) * 0x1.0p-53; }

/* std * N(0, 1) by Box-Muller, two uniforms drawn in order; std multiplies first, so that
 * std * sqrt(-2 ln u1) * cos(2 pi u2) rounds the same way wherever it is used. */
static inline double mxi_rng_normal(uint64_t *s, double std) {
    double u1 = mxi_rng_uniform(s), u2 = mxi_rng_uniform(s);
    return std * sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2);
}

#endif
