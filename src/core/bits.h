/* Internal: fp32 bit casts and the scalar bf16 conversions, one copy for every layer.
 * memcpy is the cast C defines for any bit pattern (compilers make it a register move).
 * The SIMD kernels round bf16 the same way in their own registers (ops/x86/bf16_*.h). */
#ifndef MXI_BITS_H
#define MXI_BITS_H

#include <stdint.h>
#include <string.h>

/* The one NaN every decoder of 8-bit codes writes, so kernels agree bit for bit. */
#define MXI_CANONICAL_NAN 0x7FC00000u

static inline uint32_t mxi_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float mxi_bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* The bf16 of x in the top half (low half zero): nearest even, a NaN quieted with its sign
 * and top payload bits. */
static inline uint32_t mxi_bf16_bits(float x) {
    uint32_t u = mxi_f32_bits(x);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (u | 0x00400000u) & 0xFFFF0000u;   // quiet NaN
    return (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;                        // nearest even
}

/* The same rounding as a bf16 bit pattern. */
static inline uint16_t mxi_f32_to_bf16(float x) { return (uint16_t)(mxi_bf16_bits(x) >> 16); }

/* A bf16 bit pattern widened to fp32, exactly: bf16 is the top half of fp32. */
static inline float mxi_bf16_to_f32(uint16_t h) { return mxi_bits_f32((uint32_t)h << 16); }

#endif
