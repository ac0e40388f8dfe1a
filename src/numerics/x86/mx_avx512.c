/* AVX-512 MX quantization (F, BW, DQ, VL), bit-identical to the reference kernel
 * (numerics/ref/mx_ref.c).
 *
 * The algorithm is the AVX2 kernel's (numerics/x86/mx_avx2.c, whose comments explain the
 * arithmetic), on wider vectors:
 *
 * - fp32 input with RCEIL scales: a 32-element block is two 16-lane vectors instead of
 *   four 8-lane ones; rowwise-only jobs stream along each row, jobs with a colwise or tile
 *   plane work on 32x32 tiles of one 32-row strip. Codes are narrowed with vpmovdb (in lane
 *   order, so no permute after packing), and partial blocks are read and written with
 *   masked loads and stores (zero-filled lanes leave every block maximum unchanged). With
 *   floor scales fp32 tiles are rounded to odd onto bf16 (jam_tile) and take the bf16 path.
 * - bf16 input: a 32-element row is one 32-lane vector of 16-bit patterns, in element
 *   order. Codes are narrowed to bytes with vpmovuswb after clamping at zero (which is what
 *   AVX2's packus does to the same values), and everything after the narrowing (the zone
 *   window test, the final codes, the sign, the NaN blends) runs on the same 32 bytes as
 *   in the AVX2 kernel. The 32 row maxima of a tile come from a five-step butterfly
 *   (rowmax32) and one permute into row order.
 *
 * Only called after mx_kernel_available(MX_KERNEL_AVX512) said yes. With MXI_AVX512_SIMDE
 * defined the same source is built on SIMDe's portable implementations of the intrinsics
 * (see numerics/x86/simd512.h), so that its algorithm is tested on CPUs without AVX-512. */
#include <string.h>

#include "numerics/x86/fp8_avx512.h"

#include "numerics/mx_internal.h"

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* What a kernel instance is specialised for; always a compile-time constant. */
typedef struct {
    int mbits, bias, emax, max_code;
    float max;
    mx_scale_mode mode;
    mxi_src src;
} spec;

#define I32(v) _mm512_set1_epi32(v)

/* Lane masks of the first n (0..32) elements of a 32-element block. */
ALWAYS_INLINE uint32_t lanes32(int64_t n) { return n >= 32 ? 0xFFFFFFFFu : (1u << n) - 1; }

/* ---- fp32 input (also bf16 widened to fp32 bits, where the fp32 encoder is used) ---- */

/* FP8 magnitude codes (not yet saturated) of |x| * mul: AVX2's encode8 on 16 lanes. */
ALWAYS_INLINE __m512i encode16(__m512i x, __m512 mul, spec f) {
    __m512 a = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_and_si512(x, I32(0x7FFFFFFF))), mul);
    return fp8_grid_codes16(a, f.mbits, f.bias);
}

/* 2^(127-code) per lane; code <= 246 for any finite block, so the result is a normal fp32. */
ALWAYS_INLINE __m512 scale_mul(__m512i code) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_sub_epi32(I32(254), code), 23));
}

/* 16 FP8 codes from encode16's magnitude codes and the inputs' sign bits: saturate to
 * max_code, put the sign back, narrow to bytes in lane order. */
ALWAYS_INLINE __m128i finish16(__m512i c, __m512i x, spec f) {
    __m512i mag = _mm512_min_epu32(c, I32(f.max_code));
    __m512i sign = _mm512_and_si512(_mm512_srli_epi32(x, 24), I32(0x80));
    return _mm512_cvtepi32_epi8(_mm512_or_si512(mag, sign));
}

ALWAYS_INLINE __m256i join128(__m128i lo, __m128i hi) {
    return _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
}

ALWAYS_INLINE __m256i finish32(__m512i c0, __m512i c1, __m512i x0, __m512i x1, spec f) {
    return join128(finish16(c0, x0, f), finish16(c1, x1, f));
}

/* n <= 32 bytes to dst; masked, so nothing past dst + n is touched. */
ALWAYS_INLINE void store_bytes(uint8_t *dst, __m256i v, int64_t n) {
    if (n == 32) _mm256_storeu_si256((__m256i *)dst, v);
    else _mm256_mask_storeu_epi8(dst, (__mmask32)lanes32(n), v);
}

/* Sixteen elements from src as fp32 bits. */
ALWAYS_INLINE __m512i load16(const void *src, mxi_src kind, int64_t i) {
    if (kind == MXI_SRC_F32) return _mm512_loadu_si512((const float *)src + i);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)src + i));
    return _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16);
}

/* The elements of mask m (of 16) from src as fp32 bits, zeros elsewhere. Masked loads
 * touch no memory outside the mask; an empty mask loads nothing at all. */
ALWAYS_INLINE __m512i load16_mask(const void *src, mxi_src kind, int64_t i, __mmask16 m) {
    if (m == 0) return _mm512_setzero_si512();
    if (kind == MXI_SRC_F32) return _mm512_maskz_loadu_epi32(m, (const float *)src + i);
    __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)src + i);
    return _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16);
}

ALWAYS_INLINE __m512i abs32(__m512i v) { return _mm512_and_si512(v, I32(0x7FFFFFFF)); }

ALWAYS_INLINE uint32_t hmax8(__m256i v) {
    __m128i m = _mm_max_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    m = _mm_max_epi32(m, _mm_shuffle_epi32(m, _MM_SHUFFLE(1, 0, 3, 2)));
    m = _mm_max_epi32(m, _mm_shuffle_epi32(m, _MM_SHUFFLE(2, 3, 0, 1)));
    return (uint32_t)_mm_cvtsi128_si32(m);
}

/* Largest of 16 lanes holding values <= 0x7FFFFFFF. */
ALWAYS_INLINE uint32_t hmax16(__m512i v) {
    return hmax8(_mm256_max_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1)));
}

/* One rowwise block of 32 fp32-bit lanes (v0, v1) to 32 codes and its scale. */
ALWAYS_INLINE __m256i rowwise_block(__m512i v0, __m512i v1, spec f, uint8_t *scale) {
    uint8_t code = mxi_scale_code_bits(hmax16(_mm512_max_epi32(abs32(v0), abs32(v1))), f.emax, f.max, f.mode);
    *scale = code;
    if (code == MX_E8M0_NAN) return _mm256_set1_epi8(0x7F);
    __m512 mul = scale_mul(I32(code));
    return finish32(encode16(v0, mul, f), encode16(v1, mul, f), v0, v1, f);
}

ALWAYS_INLINE void rowwise_rows(const mxi_quant_job *job, int64_t r0, int64_t r1, spec f) {
    int64_t cols = job->cols, cb = (cols + MX_BLOCK - 1) / MX_BLOCK, full = cols / MX_BLOCK;
    for (int64_t r = r0; r < r1; r++) {
        int64_t row = r * cols;
        for (int64_t b = 0; b < full; b++) {
            int64_t i = row + b * MX_BLOCK;
            __m256i out = rowwise_block(load16(job->x, f.src, i), load16(job->x, f.src, i + 16), f,
                                        &job->s_row[r * cb + b]);
            _mm256_storeu_si256((__m256i *)(job->q_row + i), out);
        }
        if (full < cb) {   // the partial block: masked loads zero the missing lanes
            int64_t i = row + full * MX_BLOCK, n = cols - full * MX_BLOCK;
            uint32_t m = lanes32(n);
            __m256i out = rowwise_block(load16_mask(job->x, f.src, i, (__mmask16)m),
                                        load16_mask(job->x, f.src, i + 16, (__mmask16)(m >> 16)), f,
                                        &job->s_row[r * cb + full]);
            store_bytes(job->q_row + i, out, n);
        }
    }
}

/* Scale codes of 16 columns from their maxima (vector form of mxi_scale_code_bits). */
ALWAYS_INLINE __m512i scale_codes16(__m512i amax, spec f) {
    __m512i code, zero = _mm512_setzero_si512();
    if (f.mode == MX_SCALE_FLOOR) {
        code = _mm512_max_epi32(_mm512_sub_epi32(_mm512_srli_epi32(amax, 23), I32(f.emax)), zero);
    } else {
        __m512i d = _mm512_castps_si512(_mm512_mul_ps(_mm512_castsi512_ps(amax), _mm512_set1_ps(1.0f / f.max)));
        __m512i E = _mm512_srli_epi32(d, 23), M = _mm512_and_si512(d, I32(0x7FFFFF));
        __m512i normal = _mm512_mask_add_epi32(E, _mm512_test_epi32_mask(M, M), E, I32(1));   // E + (M != 0)
        __m512i sub = _mm512_maskz_mov_epi32(_mm512_cmpgt_epi32_mask(M, I32(0x400000)), I32(1));
        code = _mm512_mask_mov_epi32(normal, _mm512_cmpeq_epi32_mask(E, zero), sub);
    }
    return _mm512_mask_mov_epi32(code, _mm512_cmpgt_epi32_mask(amax, I32(0x7F7FFFFF)), I32(MX_E8M0_NAN));
}

/* Row maxima of 16 rows of a tile (t[r][0..1]: a row's 32 elements as fp32 bits), in row
 * order: a butterfly in which each step joins two vectors of partial maxima of n rows into
 * one of 2n rows with half as many partials, instead of a horizontal maximum per row.
 * After the last step lane 4c + d holds row 4d + c; one permute puts the rows in order. */
ALWAYS_INLINE __m512i rowmax16_f32(__m512i (*t)[2]) {
    __m512i p[8], q[4], r[2];
    for (int i = 0; i < 8; i++) {   // lanes 0-7: row 2i, lanes 8-15: row 2i+1
        __m512i a = _mm512_max_epi32(abs32(t[2 * i][0]), abs32(t[2 * i][1]));
        __m512i b = _mm512_max_epi32(abs32(t[2 * i + 1][0]), abs32(t[2 * i + 1][1]));
        p[i] = _mm512_max_epi32(_mm512_shuffle_i64x2(a, b, 0x44), _mm512_shuffle_i64x2(a, b, 0xEE));
    }
    for (int k = 0; k < 4; k++)   // 128-bit chunk c: row 4k + c
        q[k] = _mm512_max_epi32(_mm512_shuffle_i64x2(p[2 * k], p[2 * k + 1], 0x88),
                                _mm512_shuffle_i64x2(p[2 * k], p[2 * k + 1], 0xDD));
    for (int h = 0; h < 2; h++)   // chunk c, lanes 0-1: row 8h + c, lanes 2-3: row 8h + 4 + c
        r[h] = _mm512_max_epi32(_mm512_unpacklo_epi64(q[2 * h], q[2 * h + 1]),
                                _mm512_unpackhi_epi64(q[2 * h], q[2 * h + 1]));
    __m512 u = _mm512_castsi512_ps(r[0]), v = _mm512_castsi512_ps(r[1]);
    __m512i m = _mm512_max_epi32(_mm512_castps_si512(_mm512_shuffle_ps(u, v, _MM_SHUFFLE(2, 0, 2, 0))),
                                 _mm512_castps_si512(_mm512_shuffle_ps(u, v, _MM_SHUFFLE(3, 1, 3, 1))));
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return _mm512_permutexvar_epi32(order, m);
}

/* One strip of up to 32 rows starting at r0 (a multiple of 32), in 32x32 tiles. */
ALWAYS_INLINE void tile_strip(const mxi_quant_job *job, int64_t r0, int64_t nr, spec f) {
    int64_t cols = job->cols, cb = (cols + MX_BLOCK - 1) / MX_BLOCK;
    __m512i tile[32][2];   // (32 rows, 32 cols) as fp32 bits
    for (int64_t c0 = 0; c0 < cols; c0 += MX_BLOCK) {
        int64_t nc = cols - c0 < MX_BLOCK ? cols - c0 : MX_BLOCK;
        uint32_t m = lanes32(nc);
        __m512i amax[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
        for (int64_t r = 0; r < MX_BLOCK; r++) {
            int64_t i = (r0 + r) * cols + c0;
            if (r < nr && nc == MX_BLOCK) {
                tile[r][0] = load16(job->x, f.src, i);
                tile[r][1] = load16(job->x, f.src, i + 16);
            } else if (r < nr) {
                tile[r][0] = load16_mask(job->x, f.src, i, (__mmask16)m);
                tile[r][1] = load16_mask(job->x, f.src, i + 16, (__mmask16)(m >> 16));
            } else {
                tile[r][0] = tile[r][1] = _mm512_setzero_si512();
            }
            for (int j = 0; j < 2; j++) amax[j] = _mm512_max_epi32(amax[j], abs32(tile[r][j]));
        }
        if (job->q_col) {
            __m512i code[2];
            __m512 mul[2];
            for (int j = 0; j < 2; j++) {
                code[j] = scale_codes16(amax[j], f);
                mul[j] = scale_mul(code[j]);
            }
            store_bytes(job->s_col + (r0 / MX_BLOCK) * cols + c0,
                        join128(_mm512_cvtepi32_epi8(code[0]), _mm512_cvtepi32_epi8(code[1])), nc);
            // NaN columns: the scale code is 0xFF exactly where the column holds a NaN or Inf
            __mmask32 nan_cols = (__mmask32)((uint32_t)_mm512_cmpeq_epi32_mask(code[0], I32(MX_E8M0_NAN)) |
                                             (uint32_t)_mm512_cmpeq_epi32_mask(code[1], I32(MX_E8M0_NAN)) << 16);
            for (int64_t r = 0; r < nr; r++) {
                __m512i *v = tile[r];
                __m256i out = finish32(encode16(v[0], mul[0], f), encode16(v[1], mul[1], f), v[0], v[1], f);
                store_bytes(job->q_col + (r0 + r) * cols + c0, _mm256_mask_blend_epi8(nan_cols, out, _mm256_set1_epi8(0x7F)), nc);
            }
        }
        if (job->q_row) {   // the 32 rows' scale codes and multipliers from the butterfly's maxima
            uint32_t code[32] __attribute__((aligned(64)));
            float mul[32] __attribute__((aligned(64)));
            for (int h = 0; h < 2; h++) {
                __m512i cd = scale_codes16(rowmax16_f32(tile + 16 * h), f);
                _mm512_store_si512(code + 16 * h, cd);
                _mm512_store_ps(mul + 16 * h, scale_mul(cd));
            }
            for (int64_t r = 0; r < nr; r++) {
                job->s_row[(r0 + r) * cb + c0 / MX_BLOCK] = (uint8_t)code[r];
                __m512i *v = tile[r];
                __m512 mr = _mm512_set1_ps(mul[r]);
                __m256i out = code[r] == MX_E8M0_NAN ? _mm256_set1_epi8(0x7F)
                                                     : finish32(encode16(v[0], mr, f), encode16(v[1], mr, f), v[0], v[1], f);
                store_bytes(job->q_row + (r0 + r) * cols + c0, out, nc);
            }
        }
        if (job->q_tile) {   // one scale for the whole tile, from the largest column maximum
            uint8_t code = mxi_scale_code_bits(hmax16(_mm512_max_epi32(amax[0], amax[1])), f.emax, f.max, f.mode);
            job->s_tile[(r0 / MX_BLOCK) * cb + c0 / MX_BLOCK] = code;
            __m512 mul = scale_mul(I32(code));
            for (int64_t r = 0; r < nr; r++) {
                __m512i *v = tile[r];
                __m256i out = code == MX_E8M0_NAN ? _mm256_set1_epi8(0x7F)
                                                  : finish32(encode16(v[0], mul, f), encode16(v[1], mul, f), v[0], v[1], f);
                store_bytes(job->q_tile + (r0 + r) * cols + c0, out, nc);
            }
        }
    }
}

ALWAYS_INLINE void quantize_rows_spec(const mxi_quant_job *job, int64_t r0, int64_t r1, spec f) {
    if (!job->q_col && !job->q_tile) {
        rowwise_rows(job, r0, r1, f);
        return;
    }
    for (int64_t r = r0; r < r1; r += MX_BLOCK) tile_strip(job, r, r1 - r < MX_BLOCK ? r1 - r : MX_BLOCK, f);
}

/* ---- bf16 input: 16-bit lanes, one 32-element row per vector ----
 *
 * The arithmetic is the AVX2 kernel's (see "bf16 input" there): a = |x| bits, a2 = a +
 * bit_s(a), each plane adds its per-block constant (k << 7) + KCONST and shifts right by
 * s = 7 - mbits; codes are narrowed with the pack offset 255 - max_code so that the
 * narrowing's saturation clamps both ends; lanes whose packed code falls in the zone
 * window are recomputed exactly; zero blocks, tiny blocks and NaN/Inf blocks are handled
 * aside exactly as there. */

#define I16(v) _mm512_set1_epi16((short)(v))

enum { PLANE_ROW = 1, PLANE_COL = 2, PLANE_TILE = 4 };

#define SHIFT(f) (7 - (f).mbits)                  /* bf16 mantissa bits dropped */
#define E_LO_M(mbits, bias) (127 - (bias) - (mbits))
#define E_LO(f) E_LO_M((f).mbits, (f).bias)       /* biased exponent of half the smallest FP8 subnormal */
#define OFF_M(max_code) (255 - (max_code))        /* offset of the packed codes */
/* Per-block constant beside k << 7: rounding bias, FP8 exponent rebias, the pack offset. */
#define KCONST_M(mbits, bias, max_code) \
    ((1 << (6 - (mbits))) - 1 - (((127 - (bias)) << (mbits)) << (7 - (mbits))) + (OFF_M(max_code) << (7 - (mbits))))
#define KCONST(f) KCONST_M((f).mbits, (f).bias, (f).max_code)
/* Smallest scale code for which zeros and bf16 subnormals scale below E_LO (11, 18). */
#define MIN_FAST_CODE(f) (128 - E_LO(f))
/* Window of packed codes that may need the exact recomputation (see the AVX2 kernel). */
#define ZWIDTH_M(mbits) ((mbits) == 3 ? 32 : 16)
#define ZLO_M(mbits, max_code) (OFF_M(max_code) + (1 << (mbits)) - ZWIDTH_M(mbits))

/* The hot loop's constants as static data, so they are memory operands (as in the AVX2
 * kernel: built with set1 inside the loop, they are rematerialized on every row). */
#define REP16(v) ((long long)(0x0001000100010001ull * (uint16_t)(v)))
#define REP8(v) ((long long)(0x0101010101010101ull * (uint8_t)(v)))
#define W16(v) {REP16(v), REP16(v), REP16(v), REP16(v), REP16(v), REP16(v), REP16(v), REP16(v)}
#define B8(v) {REP8(v), REP8(v), REP8(v), REP8(v)}
typedef struct {
    __m512i abs, bit_s, one;              // 16-bit lanes: the fast path
    __m512i zk, pow2, hibits, bit8, c127; // 16-bit lanes: zone_codes32
    __m256i zlo, zadd, off, sign;         // bytes: the fast path after narrowing
} consts16;
#define POW2_TABLE 0x0804020100ll         /* bytes 0, 1, 2, 4, 8: 2^(index-1), index 0 gives 0 */
#define CONSTS16(mbits, bias, max_code)                                                                    \
    {.abs = W16(0x7FFF), .bit_s = W16(1 << (7 - (mbits))), .one = W16(1),                                 \
     .zk = W16(KCONST_M(mbits, bias, max_code) + ((E_LO_M(mbits, bias) - 1) << 7)),                        \
     .pow2 = {POW2_TABLE, 0, POW2_TABLE, 0, POW2_TABLE, 0, POW2_TABLE, 0}, .hibits = W16(0x8080),          \
     .bit8 = W16(0x100), .c127 = W16(127), .zlo = B8(ZLO_M(mbits, max_code)),                              \
     .zadd = B8(128 - ZWIDTH_M(mbits)), .off = B8(OFF_M(max_code)), .sign = B8(0x80)}
static const consts16 consts16_of[] = {[MX_E4M3] = CONSTS16(3, 7, 0x7E), [MX_E5M2] = CONSTS16(2, 15, 0x7B)};

/* Lane j of rowmax32's butterfly result holding row j's maximum: lane 8k + 2d + s holds
 * row 16s + 4d + k (see rowmax32). */
#define ROW_LANE(j) (8 * ((j) & 3) + 2 * (((j) >> 2) & 3) + ((j) >> 4))
#define ROW_LANES4(j) ROW_LANE(j), ROW_LANE(j + 1), ROW_LANE(j + 2), ROW_LANE(j + 3)
static const uint16_t row_order[32] __attribute__((aligned(64))) = {
    ROW_LANES4(0), ROW_LANES4(4), ROW_LANES4(8), ROW_LANES4(12),
    ROW_LANES4(16), ROW_LANES4(20), ROW_LANES4(24), ROW_LANES4(28)};

/* The constants of a format, behind a pointer the compiler cannot see through. */
ALWAYS_INLINE const consts16 *k16_of(spec f) {
    const consts16 *k = &consts16_of[f.mbits == 3 ? MX_E4M3 : MX_E5M2];
    __asm__("" : "+r"(k));
    return k;
}

ALWAYS_INLINE __m512i abs16(__m512i v, const consts16 *K) { return _mm512_and_si512(v, K->abs); }

/* The butterfly of row maxima. Each step takes two vectors holding partial maxima of n
 * rows each and returns one holding half as many partials of 2n rows: two shuffles gather
 * the two halves of every row's partials into matching lanes, and a max joins them.
 * Column maxima (cm, element order) are taken on the way. */

/* Two rows: lanes 0-15 hold partial maxima of row 0, lanes 16-31 of row 1. */
ALWAYS_INLINE __m512i rowmax2(const uint16_t *p, int64_t stride, __m512i *cm, const consts16 *K) {
    __m512i x = abs16(_mm512_loadu_si512(p), K), y = abs16(_mm512_loadu_si512(p + stride), K);
    *cm = _mm512_max_epu16(*cm, _mm512_max_epu16(x, y));
    // 0x44: (x 256-bit half 0, y half 0); 0xEE: (x half 1, y half 1)
    return _mm512_max_epu16(_mm512_shuffle_i64x2(x, y, 0x44), _mm512_shuffle_i64x2(x, y, 0xEE));
}

/* Four rows: 128-bit chunk k holds 8 partial maxima of row k. */
ALWAYS_INLINE __m512i rowmax4(const uint16_t *p, int64_t stride, __m512i *cm, const consts16 *K) {
    __m512i u = rowmax2(p, stride, cm, K), v = rowmax2(p + 2 * stride, stride, cm, K);
    // 0x88: chunks (u0, u2, v0, v2); 0xDD: (u1, u3, v1, v3)
    return _mm512_max_epu16(_mm512_shuffle_i64x2(u, v, 0x88), _mm512_shuffle_i64x2(u, v, 0xDD));
}

/* Eight rows: in chunk k, lanes 0-3 hold 4 partial maxima of row k, lanes 4-7 of row k+4. */
ALWAYS_INLINE __m512i rowmax8(const uint16_t *p, int64_t stride, __m512i *cm, const consts16 *K) {
    __m512i u = rowmax4(p, stride, cm, K), v = rowmax4(p + 4 * stride, stride, cm, K);
    return _mm512_max_epu16(_mm512_unpacklo_epi64(u, v), _mm512_unpackhi_epi64(u, v));
}

/* Sixteen rows: in chunk k, 32-bit lane d holds 2 partial maxima of row 4d + k. */
ALWAYS_INLINE __m512i rowmax16(const uint16_t *p, int64_t stride, __m512i *cm, const consts16 *K) {
    __m512 u = _mm512_castsi512_ps(rowmax8(p, stride, cm, K));
    __m512 v = _mm512_castsi512_ps(rowmax8(p + 8 * stride, stride, cm, K));
    __m512i lo = _mm512_castps_si512(_mm512_shuffle_ps(u, v, _MM_SHUFFLE(2, 0, 2, 0)));   // (u0, u2, v0, v2)
    __m512i hi = _mm512_castps_si512(_mm512_shuffle_ps(u, v, _MM_SHUFFLE(3, 1, 3, 1)));   // (u1, u3, v1, v3)
    return _mm512_max_epu16(lo, hi);
}

/* 32 rows: lane j of the result is the maximum |x| of row j. Rows 0-15 end in the low
 * 16 bits of each 32-bit lane, rows 16-31 in the high 16 bits, so lane 8k + 2d + s holds
 * row 16s + 4d + k; one permute puts the rows in order. */
ALWAYS_INLINE __m512i rowmax32(const uint16_t *p, int64_t stride, __m512i *cm, const consts16 *K) {
    __m512i u = rowmax16(p, stride, cm, K), v = rowmax16(p + 16 * stride, stride, cm, K);
    __m512i mu = _mm512_max_epu16(u, _mm512_srli_epi32(u, 16));   // low halves: rows 0-15
    __m512i mv = _mm512_max_epu16(v, _mm512_slli_epi32(v, 16));   // high halves: rows 16-31
    __m512i r = _mm512_mask_blend_epi16((__mmask32)0xAAAAAAAAu, mu, mv);
    return _mm512_permutexvar_epi16(_mm512_load_si512(row_order), r);
}

/* Largest of 32 16-bit lanes. */
ALWAYS_INLINE uint32_t hmax32_16(__m512i v) {
    __m256i h = _mm256_max_epu16(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
    __m128i m = _mm_max_epu16(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    m = _mm_max_epu16(m, _mm_shuffle_epi32(m, _MM_SHUFFLE(1, 0, 3, 2)));
    m = _mm_max_epu16(m, _mm_shuffle_epi32(m, _MM_SHUFFLE(2, 3, 0, 1)));
    m = _mm_max_epu16(m, _mm_srli_epi32(m, 16));
    return (uint32_t)_mm_cvtsi128_si32(m) & 0xFFFF;
}

/* Scale codes (16-bit lanes) of 32 blocks from the bf16 bits of their maxima: the vector
 * form of mxi_scale_code_bits(amax << 16). */
ALWAYS_INLINE __m512i scale_codes32(__m512i amax, spec f) {
    if (f.mode == MX_SCALE_FLOOR) {
        __m512i code = _mm512_max_epi16(_mm512_sub_epi16(_mm512_srli_epi16(amax, 7), I16(f.emax)), _mm512_setzero_si512());
        return _mm512_mask_mov_epi16(code, _mm512_cmpgt_epi16_mask(amax, I16(0x7F7F)), I16(MX_E8M0_NAN));
    }
    // RCEIL multiplies in fp32: widen, reuse the 16-lane code, narrow back in order
    __m512i lo = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(amax)), 16);
    __m512i hi = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(amax, 1)), 16);
    __m256i clo = _mm512_cvtepi32_epi16(scale_codes16(lo, f)), chi = _mm512_cvtepi32_epi16(scale_codes16(hi, f));
    return _mm512_inserti64x4(_mm512_castsi256_si512(clo), chi, 1);
}

/* The per-block constant (k << 7) + KCONST of 32 blocks. An all-zero block encodes with
 * k = 0 (its stored scale code stays 0): its zeros then land far below the FP8 grid. */
ALWAYS_INLINE __m512i kco32(__m512i code, __m512i amax, spec f) {
    __m512i enc = _mm512_mask_mov_epi16(code, _mm512_cmpeq_epi16_mask(amax, _mm512_setzero_si512()), I16(127));
    return _mm512_add_epi16(_mm512_slli_epi16(_mm512_sub_epi16(I16(127), enc), 7), I16(KCONST(f)));
}

ALWAYS_INLINE int kco_scalar(uint32_t code, uint32_t amax, spec f) {
    int enc = amax == 0 ? 127 : (int)code;
    return (127 - enc) * 128 + KCONST(f);
}

/* Blocks (of 32) the 16-bit encoder cannot take: NaN/Inf blocks and tiny nonzero ones. */
ALWAYS_INLINE __mmask32 special32(__m512i code, __m512i amax, spec f) {
    __mmask32 nonzero = _mm512_test_epi16_mask(amax, amax);
    __mmask32 tiny = _mm512_mask_cmplt_epi16_mask(nonzero, code, I16(MIN_FAST_CODE(f)));
    return tiny | _mm512_cmpeq_epi16_mask(code, I16(MX_E8M0_NAN));
}

/* Packed codes (code + offset) of one row of 32 elements (a2 = a + bit_s(a)) for blocks
 * with constants k (per lane or broadcast). Clamping at zero before the unsigned-saturating
 * narrowing gives what AVX2's packus gives: negative codes 0, codes above 255 255. */
ALWAYS_INLINE __m256i packed32(__m512i a2, __m512i k, spec f) {
    __m512i c = _mm512_srai_epi16(_mm512_add_epi16(a2, k), SHIFT(f));
    return _mm512_cvtusepi16_epi8(_mm512_max_epi16(c, _mm512_setzero_si512()));
}

/* a + bit_s(a): the round-to-even correction, shared by every plane. */
ALWAYS_INLINE __m512i plus_odd(__m512i a, const consts16 *K) {
    return _mm512_mask_add_epi16(a, _mm512_test_epi16_mask(a, K->bit_s), a, K->one);
}

/* Bit 7 of each byte set where the packed code is outside the zone window (the common case). */
ALWAYS_INLINE __m256i zone_mask(__m256i p, const consts16 *K) {
    return _mm256_adds_epu8(_mm256_sub_epi8(p, K->zlo), K->zadd);
}

/* Final magnitude codes from packed codes: remove the offset. */
ALWAYS_INLINE __m256i codes_of(__m256i p, const consts16 *K) {
    return _mm256_subs_epu8(p, K->off);
}

/* Exact codes of 32 lanes whose scaled value lies in the FP8 subnormal range: AVX2's
 * zone_codes16 on 32 lanes (the byte shuffle indexes a table repeated in every 128-bit
 * chunk). */
ALWAYS_INLINE __m512i zone_codes32(__m512i a, __m512i kco, const consts16 *K) {
    __m512i idx = _mm512_srai_epi16(_mm512_add_epi16(a, _mm512_sub_epi16(kco, K->zk)), 7);
    __m512i pow2 = _mm512_shuffle_epi8(K->pow2, idx);
    __m512i w = _mm512_maddubs_epi16(_mm512_or_si512(a, K->hibits), pow2);   // (0x80 | f) * 2^e
    __m512i odd = _mm512_srli_epi16(_mm512_and_si512(w, K->bit8), 8);                                // bit 8 of w
    return _mm512_srli_epi16(_mm512_add_epi16(_mm512_add_epi16(w, K->c127), odd), 8);
}

/* Magnitude codes of one plane for a row: the fast codes, with the zone lanes recomputed
 * when there are any. */
ALWAYS_INLINE __m256i plane_codes(__m256i p, __m256i zone, __m512i a, __m512i k, const consts16 *K) {
    __m256i code = codes_of(p, K);
    if (_mm256_movemask_epi8(zone) != -1) {
        __m256i exact = _mm512_cvtepi16_epi8(zone_codes32(a, k, K));   // codes 0..8: no saturation
        code = _mm256_blendv_epi8(exact, code, zone);
    }
    return code;
}

/* One row of n <= 32 elements (bf16 bits or fp32) of blocks whose scale codes are given
 * per element, through the fp32 encoder: for blocks with a tiny nonzero amax. NaN codes
 * give garbage here and are overwritten by the caller. Lanes from n on encode zeros. */
static __attribute__((noinline)) void slow_row32(uint8_t *dst, const void *p, mxi_src kind, int64_t n,
                                                 const uint8_t *codes, spec f) {
    __m512i x[2], c[2];
    uint32_t m = lanes32(n);
    for (int j = 0; j < 2; j++) {
        x[j] = load16_mask(p, kind, 16 * j, (__mmask16)(m >> (16 * j)));
        __m512 mul = scale_mul(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(codes + 16 * j))));
        c[j] = encode16(x[j], mul, f);
    }
    _mm256_storeu_si256((__m256i *)dst, finish32(c[0], c[1], x[0], x[1], f));
}

/* Element-plane bytes of a job from which the plane lines two tiles ahead are prefetched
 * (see the AVX2 kernel). */
#define PREFETCH_MIN_BYTES (8 << 20)

/* One 32x32 tile (nr x nc valid) at src with row stride `stride` (32 readable elements
 * per row, 32 rows), into the planes asked for; (r0, c0) is its position in the job. With
 * an fp32 job src holds its values rounded to odd (jam_tile) and the slow paths encode the
 * fp32 values themselves, the job's element (r0, c0) on. */
ALWAYS_INLINE void bf16_tile(const mxi_quant_job *job, const uint16_t *src, int64_t stride, int64_t r0, int64_t c0,
                             int64_t nr, int64_t nc, spec f, int planes, bool prefetch) {
    int64_t cols = job->cols, cb = (cols + MX_BLOCK - 1) / MX_BLOCK, b = c0 / MX_BLOCK;
    const __m512i zero = _mm512_setzero_si512();
    const consts16 *K = k16_of(f);

    // pass 1: maxima
    __m512i cm = zero;                              // column maxima, element order
    __m512i rm = rowmax32(src, stride, &cm, K);     // row maxima, row order

    // rows: codes, constants, specials
    uint16_t kr[32] __attribute__((aligned(64)));
    __mmask32 row_special = 0;
    uint8_t row_code[32];
    if (planes & PLANE_ROW) {
        __m512i cd = scale_codes32(rm, f);
        _mm512_store_si512(kr, kco32(cd, rm, f));
        _mm256_storeu_si256((__m256i *)row_code, _mm512_cvtepi16_epi8(cd));
        row_special = special32(cd, rm, f);
        for (int64_t r = 0; r < nr; r++) job->s_row[(r0 + r) * cb + b] = row_code[r];
    }

    // columns
    __m512i kc = zero;
    __m256i col_nan = _mm256_setzero_si256();
    bool col_nan_any = false, col_slow = false;
    uint8_t col_code[32];
    if (planes & PLANE_COL) {
        __m512i cd = scale_codes32(cm, f);
        kc = kco32(cd, cm, f);
        __m256i codes = _mm512_cvtepi16_epi8(cd);   // codes 0..255: no saturation
        _mm256_storeu_si256((__m256i *)col_code, codes);
        store_bytes(job->s_col + (r0 / MX_BLOCK) * cols + c0, codes, nc);
        col_nan = _mm256_cmpeq_epi8(codes, _mm256_set1_epi8(-1));
        col_nan_any = !_mm256_testz_si256(col_nan, col_nan);
        __mmask32 tiny = _mm512_mask_cmplt_epi16_mask(_mm512_test_epi16_mask(cm, cm), cd, I16(MIN_FAST_CODE(f)));
        col_slow = tiny != 0;
    }

    // the tile
    __m512i kt = zero;
    uint8_t tile_code = 0;
    bool tile_special = false;
    if (planes & PLANE_TILE) {
        uint32_t amax = hmax32_16(cm);
        tile_code = mxi_scale_code_bits(amax << 16, f.emax, f.max, f.mode);
        job->s_tile[(r0 / MX_BLOCK) * cb + b] = tile_code;
        kt = I16(kco_scalar(tile_code, amax, f));
        tile_special = tile_code == MX_E8M0_NAN || (amax != 0 && tile_code < MIN_FAST_CODE(f));
    }

    // pass 2: encode
    const __m256i nan8 = _mm256_set1_epi8(0x7F);
    for (int64_t r = 0; r < nr; r++) {
        const uint16_t *p = src + r * stride;
        int64_t o = (r0 + r) * cols + c0;
        // what the slow paths encode: the row as the job holds it
        const void *exact = f.src == MXI_SRC_F32 ? (const void *)((const float *)job->x + o) : (const void *)p;
        if (prefetch) {   // the plane lines two tiles ahead: their reads overlap this work
            if (planes & PLANE_ROW) _mm_prefetch((const char *)(job->q_row + o + 2 * MX_BLOCK), _MM_HINT_T0);
            if (planes & PLANE_COL) _mm_prefetch((const char *)(job->q_col + o + 2 * MX_BLOCK), _MM_HINT_T0);
            if (planes & PLANE_TILE) _mm_prefetch((const char *)(job->q_tile + o + 2 * MX_BLOCK), _MM_HINT_T0);
        }
        __m512i x = _mm512_loadu_si512(p);
        __m512i a = abs16(x, K);
        __m512i a2 = plus_odd(a, K);
        __m256i sign = _mm256_maskz_mov_epi8(_mm512_movepi16_mask(x), K->sign);
        // packed codes and window masks of every plane first: one test for all of them
        const __m256i none = _mm256_set1_epi8(-1);   // a plane not asked for has no window lanes
        const __m256i zero8 = _mm256_setzero_si256();
        __m512i kr_r = zero;
        __m256i p_row = zero8, p_col = zero8, p_tile = zero8, z_row = none, z_col = none, z_tile = none;
        if (planes & PLANE_ROW) {
            kr_r = I16(kr[r]);
            p_row = packed32(a2, kr_r, f);
            z_row = zone_mask(p_row, K);
        }
        if (planes & PLANE_COL) {
            p_col = packed32(a2, kc, f);
            z_col = zone_mask(p_col, K);
        }
        if (planes & PLANE_TILE) {
            p_tile = packed32(a2, kt, f);
            z_tile = zone_mask(p_tile, K);
        }
        __m256i c_row = codes_of(p_row, K), c_col = codes_of(p_col, K), c_tile = codes_of(p_tile, K);
        __m256i z = _mm256_and_si256(_mm256_and_si256(z_row, z_col), z_tile);
        if (__builtin_expect(_mm256_movemask_epi8(z) != -1, 0)) {
            if (planes & PLANE_ROW) c_row = plane_codes(p_row, z_row, a, kr_r, K);
            if (planes & PLANE_COL) c_col = plane_codes(p_col, z_col, a, kc, K);
            if (planes & PLANE_TILE) c_tile = plane_codes(p_tile, z_tile, a, kt, K);
        }
        if (planes & PLANE_ROW) {
            __m256i out = _mm256_or_si256(c_row, sign);
            if (__builtin_expect((row_special >> r) & 1, 0)) {
                if (row_code[r] == MX_E8M0_NAN) {
                    out = nan8;
                } else {
                    uint8_t codes[32], tmp[32];
                    memset(codes, row_code[r], sizeof codes);
                    slow_row32(tmp, exact, f.src, nc, codes, f);
                    out = _mm256_loadu_si256((const __m256i *)tmp);
                }
            }
            store_bytes(job->q_row + o, out, nc);
        }
        if (planes & PLANE_COL) {
            __m256i out = _mm256_or_si256(c_col, sign);
            if (__builtin_expect(col_slow, 0)) {
                uint8_t tmp[32];
                slow_row32(tmp, exact, f.src, nc, col_code, f);
                out = _mm256_loadu_si256((const __m256i *)tmp);   // exact for every column
            }
            if (__builtin_expect(col_nan_any, 0)) out = _mm256_blendv_epi8(out, nan8, col_nan);
            store_bytes(job->q_col + o, out, nc);
        }
        if (planes & PLANE_TILE) {
            __m256i out = _mm256_or_si256(c_tile, sign);
            if (__builtin_expect(tile_special, 0)) {
                if (tile_code == MX_E8M0_NAN) {
                    out = nan8;
                } else {
                    uint8_t codes[32], tmp[32];
                    memset(codes, tile_code, sizeof codes);
                    slow_row32(tmp, exact, f.src, nc, codes, f);
                    out = _mm256_loadu_si256((const __m256i *)tmp);
                }
            }
            store_bytes(job->q_tile + o, out, nc);
        }
    }
}

/* A tile of fp32 values (nr x nc of rows `cols` apart) as bf16 bits rounded to odd into
 * pad (32 x 32, zero elsewhere): the top 16 bits, with the lowest set when any bit below
 * was. Rounding to odd at bf16's 8 significant bits and then to nearest even on the FP8
 * grid (at most 4 bits) gives what rounding the fp32 value to that grid gives, two bits
 * being to spare; so does rounding to odd onto bf16's subnormal grid, 2^-133, which lies 8
 * bits below the smallest FP8 step of every block the 16-bit encoder takes (scale codes
 * from MIN_FAST_CODE on; the slow paths encode the fp32 values). Exponents are kept, so
 * are FLOOR scales, zero blocks and NaN/Inf blocks: the 16-bit encoder serves fp32 input.
 * (RCEIL scales divide the maximum and are not kept: those jobs take the fp32 encoder.)
 * next: the tile after this one, whose lines are prefetched row by row while this one is
 * read (inputs beyond the last-level cache: each tile's rows lie `cols` apart), or NULL. */
ALWAYS_INLINE void jam_tile(uint16_t *pad, const float *x, int64_t cols, int64_t nr, int64_t nc, const float *next) {
    const __m512i one = I16(1);
    uint32_t m = lanes32(nc);
    int64_t r = 0;
    for (; r < nr; r++) {
        const float *p = x + r * cols;
        if (next) {
            _mm_prefetch((const char *)(next + r * cols), _MM_HINT_T0);
            _mm_prefetch((const char *)(next + r * cols + 16), _MM_HINT_T0);
        }
        __m512i v0 = nc == MX_BLOCK ? load16(p, MXI_SRC_F32, 0) : load16_mask(p, MXI_SRC_F32, 0, (__mmask16)m);
        __m512i v1 = nc == MX_BLOCK ? load16(p, MXI_SRC_F32, 16) : load16_mask(p, MXI_SRC_F32, 16, (__mmask16)(m >> 16));
        __m512i hi = fp8_halves32(v0, v1, true), lo = fp8_halves32(v0, v1, false);
        _mm512_store_si512(pad + 32 * r, _mm512_or_si512(hi, _mm512_min_epu16(lo, one)));   // hi | (lo != 0)
    }
    for (; r < MX_BLOCK; r++) _mm512_store_si512(pad + 32 * r, _mm512_setzero_si512());
}

#include "numerics/x86/mx_instances.h"

const mxi_mx_kernels mxi_mx_kernels_avx512 = {.name = "avx512", .quantize_rows = quantize_rows,
                                              .encode_fp8 = mxi_encode_fp8_avx512,
                                              .encode_fp8_vec = mxi_encode_fp8_vec_avx512, .encode_hif8 = mxi_encode_hif8_avx512,
                                              .amax = mxi_amax_avx512, .amax_bits = mxi_amax_bits_avx512,
                                              .amax_bits_cols = mxi_amax_bits_cols_avx512,
                                              .amax_bits_rows = mxi_amax_bits_rows_avx512,
                                              .encode_fp8_rows = mxi_encode_fp8_rows_avx512,
                                              .encode_fp8_cols = mxi_encode_fp8_cols_avx512,
                                              .values16_fp8_blocks = mxi_values16_fp8_blocks_avx512,
                                              .values16_fp8_cols = mxi_values16_fp8_cols_avx512};
