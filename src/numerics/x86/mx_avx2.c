/* AVX2 MX quantization, bit-identical to the reference kernel (numerics/ref/mx_ref.c).
 *
 * Rowwise-only jobs stream along each row, one 32-element block (four 8-lane vectors) at a
 * time. Jobs with a colwise plane work on 32x32 tiles of one 32-row strip: the tile is
 * loaded once (bf16 widened to fp32), its column maxima give the colwise scales, and both
 * planes are encoded from the tile while it sits in L1. Partial blocks are zero-padded in
 * the tile, which leaves every block maximum unchanged.
 *
 * Every loop is instantiated per (element format, scale mode, input type) so that shifts
 * and constants are immediates: see the spec_* table at the end. */
#include <immintrin.h>

#include "numerics/mx_internal.h"

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* What a kernel instance is specialised for; always a compile-time constant. */
typedef struct {
    int mbits, bias, emax, max_code;
    float max;
    mx_scale_mode mode;
    mxi_src src;
} spec;

#define I32(v) _mm256_set1_epi32(v)

/* FP8 magnitude codes (one per 32-bit lane, not yet saturated) of |x| * mul, mul a power
 * of two. With a = |x| * mul and E the exponent of max(a, min normal), adding
 * C = 2^(E+23-mbits) rounds a to the FP8 grid (spacing 2^(E-mbits)) with the FPU's
 * round-to-nearest-even, and the mantissa field of a + C counts grid steps; adding E's code
 * offset gives the FP8 code for normals and subnormals alike, a carry into the next binade
 * included. Codes stay <= 0x80, so saturation and the sign are applied after packing. */
ALWAYS_INLINE __m256i encode8(__m256i x, __m256 mul, spec f) {
    __m256 a = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_and_si256(x, I32(0x7FFFFFFF))), mul);
    __m256i e = _mm256_max_epi32(_mm256_and_si256(_mm256_castps_si256(a), I32(0x7F800000)), I32((128 - f.bias) << 23));
    __m256i c = _mm256_add_epi32(e, I32((23 - f.mbits) << 23));
    __m256i steps = _mm256_and_si256(_mm256_castps_si256(_mm256_add_ps(a, _mm256_castsi256_ps(c))), I32(0x7FFFFF));
    return _mm256_add_epi32(steps, _mm256_sub_epi32(_mm256_srli_epi32(e, 23 - f.mbits), I32((128 - f.bias) << f.mbits)));
}

/* 2^(127-code) per lane; code <= 246 for any finite block, so the result is a normal fp32. */
ALWAYS_INLINE __m256 scale_mul(__m256i code) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_sub_epi32(I32(254), code), 23));
}

/* Four vectors of 8 values (0..255) to 32 bytes in lane order. */
ALWAYS_INLINE __m256i pack32(__m256i c0, __m256i c1, __m256i c2, __m256i c3) {
    __m256i b = _mm256_packus_epi16(_mm256_packus_epi32(c0, c1), _mm256_packus_epi32(c2, c3));
    return _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* 32 FP8 codes from the magnitude codes of encode8 and the inputs' sign bits: saturate to
 * max_code and put the sign back, a byte at a time. Signed packing keeps each input's sign. */
ALWAYS_INLINE __m256i finish32(__m256i c0, __m256i c1, __m256i c2, __m256i c3,
                               __m256i x0, __m256i x1, __m256i x2, __m256i x3, spec f) {
    __m256i sign = _mm256_packs_epi16(_mm256_packs_epi32(x0, x1), _mm256_packs_epi32(x2, x3));
    sign = _mm256_permutevar8x32_epi32(sign, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    __m256i mag = _mm256_min_epu8(pack32(c0, c1, c2, c3), _mm256_set1_epi8((char)f.max_code));
    return _mm256_or_si256(mag, _mm256_and_si256(sign, _mm256_set1_epi8((char)0x80)));
}

ALWAYS_INLINE void store_bytes(uint8_t *dst, __m256i v, int64_t n) {
    if (n == 32) {
        _mm256_storeu_si256((__m256i *)dst, v);
    } else {
        uint8_t tmp[32];
        _mm256_storeu_si256((__m256i *)tmp, v);
        memcpy(dst, tmp, (size_t)n);
    }
}

/* Eight elements from src as fp32 bits. */
ALWAYS_INLINE __m256i load8(const void *src, mxi_src kind, int64_t i) {
    if (kind == MXI_SRC_F32) return _mm256_loadu_si256((const __m256i *)((const float *)src + i));
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)src + i));
    return _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
}

/* n <= 32 elements from src into a zero-padded block of fp32 bits. */
static void load_partial(uint32_t *dst, const void *src, mxi_src kind, int64_t i, int64_t n) {
    for (int64_t k = 0; k < 32; k++) {
        uint32_t v = 0;
        if (k < n) v = kind == MXI_SRC_F32 ? mxi_f32_bits(((const float *)src)[i + k])
                                           : (uint32_t)((const uint16_t *)src)[i + k] << 16;
        dst[k] = v;
    }
}

ALWAYS_INLINE uint32_t hmax8(__m256i v) {
    __m128i m = _mm_max_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    m = _mm_max_epi32(m, _mm_shuffle_epi32(m, _MM_SHUFFLE(1, 0, 3, 2)));
    m = _mm_max_epi32(m, _mm_shuffle_epi32(m, _MM_SHUFFLE(2, 3, 0, 1)));
    return (uint32_t)_mm_cvtsi128_si32(m);
}

ALWAYS_INLINE __m256i abs8(__m256i v) { return _mm256_and_si256(v, I32(0x7FFFFFFF)); }

/* One rowwise block of 32 fp32-bit lanes (v0..v3) to 32 codes and its scale. */
ALWAYS_INLINE __m256i rowwise_block(__m256i v0, __m256i v1, __m256i v2, __m256i v3, spec f, uint8_t *scale) {
    __m256i m = _mm256_max_epi32(_mm256_max_epi32(abs8(v0), abs8(v1)), _mm256_max_epi32(abs8(v2), abs8(v3)));
    uint8_t code = mxi_scale_code_bits(hmax8(m), f.emax, f.max, f.mode);
    *scale = code;
    if (code == MX_E8M0_NAN) return _mm256_set1_epi8(0x7F);
    __m256 mul = scale_mul(I32(code));
    return finish32(encode8(v0, mul, f), encode8(v1, mul, f), encode8(v2, mul, f), encode8(v3, mul, f),
                    v0, v1, v2, v3, f);
}

ALWAYS_INLINE void rowwise_rows(const mxi_quant_job *job, int64_t r0, int64_t r1, spec f) {
    int64_t cols = job->cols, cb = (cols + MX_BLOCK - 1) / MX_BLOCK, full = cols / MX_BLOCK;
    for (int64_t r = r0; r < r1; r++) {
        int64_t row = r * cols;
        for (int64_t b = 0; b < full; b++) {
            int64_t i = row + b * MX_BLOCK;
            __m256i out = rowwise_block(load8(job->x, f.src, i), load8(job->x, f.src, i + 8),
                                        load8(job->x, f.src, i + 16), load8(job->x, f.src, i + 24),
                                        f, &job->s_row[r * cb + b]);
            _mm256_storeu_si256((__m256i *)(job->q_row + i), out);
        }
        if (full < cb) {
            uint32_t tail[32] __attribute__((aligned(32)));
            int64_t n = cols - full * MX_BLOCK;
            load_partial(tail, job->x, f.src, row + full * MX_BLOCK, n);
            const __m256i *t = (const __m256i *)tail;
            __m256i out = rowwise_block(t[0], t[1], t[2], t[3], f, &job->s_row[r * cb + full]);
            store_bytes(job->q_row + row + full * MX_BLOCK, out, n);
        }
    }
}

/* Scale codes of 8 columns from their maxima (vector form of mxi_scale_code_bits). */
ALWAYS_INLINE __m256i scale_codes8(__m256i amax, spec f) {
    __m256i code, zero = _mm256_setzero_si256();
    if (f.mode == MX_SCALE_FLOOR) {
        code = _mm256_max_epi32(_mm256_sub_epi32(_mm256_srli_epi32(amax, 23), I32(f.emax)), zero);
    } else {
        __m256i d = _mm256_castps_si256(_mm256_mul_ps(_mm256_castsi256_ps(amax), _mm256_set1_ps(1.0f / f.max)));
        __m256i E = _mm256_srli_epi32(d, 23), M = _mm256_and_si256(d, I32(0x7FFFFF));
        __m256i normal = _mm256_add_epi32(_mm256_add_epi32(E, I32(1)), _mm256_cmpeq_epi32(M, zero));
        __m256i sub = _mm256_sub_epi32(zero, _mm256_cmpgt_epi32(M, I32(0x400000)));
        code = _mm256_blendv_epi8(normal, sub, _mm256_cmpeq_epi32(E, zero));
    }
    __m256i nonfinite = _mm256_cmpgt_epi32(amax, I32(0x7F7FFFFF));
    return _mm256_blendv_epi8(code, I32(MX_E8M0_NAN), nonfinite);
}

/* One strip of up to 32 rows starting at r0 (a multiple of 32), in 32x32 tiles. */
ALWAYS_INLINE void tile_strip(const mxi_quant_job *job, int64_t r0, int64_t nr, spec f) {
    int64_t cols = job->cols, cb = (cols + MX_BLOCK - 1) / MX_BLOCK;
    __m256i tile[32][4];   // (32 rows, 32 cols) as fp32 bits
    for (int64_t c0 = 0; c0 < cols; c0 += MX_BLOCK) {
        int64_t nc = cols - c0 < MX_BLOCK ? cols - c0 : MX_BLOCK;
        __m256i amax[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
        for (int64_t r = 0; r < MX_BLOCK; r++) {
            int64_t i = (r0 + r) * cols + c0;
            if (r < nr && nc == MX_BLOCK) {
                for (int j = 0; j < 4; j++) tile[r][j] = load8(job->x, f.src, i + 8 * j);
            } else if (r < nr) {
                load_partial((uint32_t *)tile[r], job->x, f.src, i, nc);
            } else {
                for (int j = 0; j < 4; j++) tile[r][j] = _mm256_setzero_si256();
            }
            for (int j = 0; j < 4; j++) amax[j] = _mm256_max_epi32(amax[j], abs8(tile[r][j]));
        }
        if (job->q_col) {
            __m256i code[4];
            __m256 mul[4];
            for (int j = 0; j < 4; j++) {
                code[j] = scale_codes8(amax[j], f);
                mul[j] = scale_mul(code[j]);
            }
            __m256i codes = pack32(code[0], code[1], code[2], code[3]);
            store_bytes(job->s_col + (r0 / MX_BLOCK) * cols + c0, codes, nc);
            // NaN columns: the scale code is 0xFF exactly where the column holds a NaN or Inf
            __m256i nan_cols = _mm256_cmpeq_epi8(codes, _mm256_set1_epi8(-1));
            for (int64_t r = 0; r < nr; r++) {
                __m256i *v = tile[r];
                __m256i out = finish32(encode8(v[0], mul[0], f), encode8(v[1], mul[1], f), encode8(v[2], mul[2], f),
                                       encode8(v[3], mul[3], f), v[0], v[1], v[2], v[3], f);
                store_bytes(job->q_col + (r0 + r) * cols + c0, _mm256_blendv_epi8(out, _mm256_set1_epi8(0x7F), nan_cols), nc);
            }
        }
        if (job->q_row) {
            for (int64_t r = 0; r < nr; r++) {
                __m256i out = rowwise_block(tile[r][0], tile[r][1], tile[r][2], tile[r][3], f,
                                            &job->s_row[(r0 + r) * cb + c0 / MX_BLOCK]);
                store_bytes(job->q_row + (r0 + r) * cols + c0, out, nc);
            }
        }
    }
}

ALWAYS_INLINE void quantize_rows_spec(const mxi_quant_job *job, int64_t r0, int64_t r1, spec f) {
    if (!job->q_col) {
        rowwise_rows(job, r0, r1, f);
        return;
    }
    for (int64_t r = r0; r < r1; r += MX_BLOCK) tile_strip(job, r, r1 - r < MX_BLOCK ? r1 - r : MX_BLOCK, f);
}

/* One instance per (format, mode, input type). The NaN code 0x7F is the same for both formats. */
#define E4M3_SPEC(mode, src) ((spec){3, 7, 8, 0x7E, 448.0f, mode, src})
#define E5M2_SPEC(mode, src) ((spec){2, 15, 15, 0x7B, 57344.0f, mode, src})
#define INSTANCE(name, s) \
    static void name(const mxi_quant_job *job, int64_t r0, int64_t r1) { quantize_rows_spec(job, r0, r1, s); }
INSTANCE(e4m3_floor_f32, E4M3_SPEC(MX_SCALE_FLOOR, MXI_SRC_F32))
INSTANCE(e4m3_floor_bf16, E4M3_SPEC(MX_SCALE_FLOOR, MXI_SRC_BF16))
INSTANCE(e4m3_rceil_f32, E4M3_SPEC(MX_SCALE_RCEIL, MXI_SRC_F32))
INSTANCE(e4m3_rceil_bf16, E4M3_SPEC(MX_SCALE_RCEIL, MXI_SRC_BF16))
INSTANCE(e5m2_floor_f32, E5M2_SPEC(MX_SCALE_FLOOR, MXI_SRC_F32))
INSTANCE(e5m2_floor_bf16, E5M2_SPEC(MX_SCALE_FLOOR, MXI_SRC_BF16))
INSTANCE(e5m2_rceil_f32, E5M2_SPEC(MX_SCALE_RCEIL, MXI_SRC_F32))
INSTANCE(e5m2_rceil_bf16, E5M2_SPEC(MX_SCALE_RCEIL, MXI_SRC_BF16))

typedef void (*instance_fn)(const mxi_quant_job *, int64_t, int64_t);
static const instance_fn instances[2][2][2] = {   // [elem][mode][src]
    {{e4m3_floor_f32, e4m3_floor_bf16}, {e4m3_rceil_f32, e4m3_rceil_bf16}},
    {{e5m2_floor_f32, e5m2_floor_bf16}, {e5m2_rceil_f32, e5m2_rceil_bf16}},
};

static void avx2_quantize_rows(const mxi_quant_job *job, int64_t r0, int64_t r1) {
    int elem = job->elem == mx_elem_traits_of(MX_E4M3) ? 0 : 1;
    instances[elem][job->mode][job->src](job, r0, r1);
}

const mxi_mx_kernels mxi_mx_kernels_avx2 = {"avx2", avx2_quantize_rows};
