/* AVX2 MX quantization, bit-identical to the reference kernel (numerics/ref/mx_ref.c).
 *
 * fp32 input with RCEIL scales: rowwise-only jobs stream along each row, one 32-element
 * block (four 8-lane vectors) at a time. Jobs with a colwise or tile plane work on 32x32
 * tiles of one 32-row strip: the tile is loaded once, its column maxima give the colwise
 * scales (and their maximum the tile's scale), and every plane is encoded from the tile
 * while it sits in L1. Partial blocks are zero-padded in the tile, which leaves every block
 * maximum unchanged. fp32 input with floor scales is rounded to odd onto bf16 a tile at a
 * time (jam_tile) and takes the bf16 encoder.
 *
 * bf16 input works on the 16-bit patterns directly, sixteen lanes per vector, on 32x32
 * tiles for every plane: see "bf16 input" below.
 *
 * Every loop is instantiated per (element format, scale mode, input type), and for the
 * 16-bit encoder per set of planes, so that shifts and constants are immediates: see
 * numerics/x86/mx_instances.h. */
#include <immintrin.h>
#include <string.h>

#include "numerics/mx_internal.h"
#include "numerics/x86/fp8_avx2.h"

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* What a kernel instance is specialised for; always a compile-time constant. */
typedef struct {
    int mbits, bias, emax, max_code;
    float max;
    mx_scale_mode mode;
    mxi_src src;
} spec;

#define I32(v) _mm256_set1_epi32(v)

/* FP8 magnitude codes (not yet saturated) of |x| * mul, mul a power of two: the product is
 * exact, and fp8_grid_codes8 rounds it. Codes stay <= 0x80, so saturation and the sign are
 * applied after packing. */
ALWAYS_INLINE __m256i encode8(__m256i x, __m256 mul, spec f) {
    __m256 a = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_and_si256(x, I32(0x7FFFFFFF))), mul);
    return fp8_grid_codes8(a, f.mbits, f.bias);
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
        if (job->q_tile) {   // one scale for the whole tile, from the largest column maximum
            __m256i m = _mm256_max_epi32(_mm256_max_epi32(amax[0], amax[1]), _mm256_max_epi32(amax[2], amax[3]));
            uint8_t code = mxi_scale_code_bits(hmax8(m), f.emax, f.max, f.mode);
            job->s_tile[(r0 / MX_BLOCK) * cb + c0 / MX_BLOCK] = code;
            __m256 mul = scale_mul(I32(code));
            for (int64_t r = 0; r < nr; r++) {
                __m256i *v = tile[r];
                __m256i out = code == MX_E8M0_NAN
                                  ? _mm256_set1_epi8(0x7F)
                                  : finish32(encode8(v[0], mul, f), encode8(v[1], mul, f), encode8(v[2], mul, f),
                                             encode8(v[3], mul, f), v[0], v[1], v[2], v[3], f);
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

/* ---- bf16 input: 16-bit lanes ----
 *
 * A bf16 element is the top half of an fp32, so a block's scaling and rounding can be done
 * on its 16 bits directly, sixteen elements per vector instead of eight. With
 * a = |x| bits (E << 7 | f) and k = 127 - code, the scaled value's bits are
 * m' = a + (k << 7): exact while the scaled exponent E + k stays >= 1 (smaller values are
 * far below the FP8 grid and come out as code 0 anyway), and within int16 because a finite
 * block's scaled values are below 2^(emax+1). For an FP8 normal result, round-to-nearest-
 * even to mbits mantissa bits is the integer step
 *     code = ((m' + 2^(s-1) - 1 + bit_s(m')) >> s) - ((127 - bias) << mbits),  s = 7 - mbits,
 * a carry into the next binade landing on the right code by itself. bit_s(m') = bit_s(a)
 * because k << 7 has no bits below 7, so a2 = a + bit_s(a) is shared by every plane, and
 * each plane adds one per-block constant (kco below) and shifts. The codes are packed to
 * bytes with an offset of 255 - max_code, so that packus's unsigned saturation clamps
 * both ends and one saturating subtract leaves the final magnitude code.
 *
 * The formula is wrong only where the scaled value lies in the FP8 subnormal range (or just
 * below it). Those lanes show up as packed codes in a small window (zone_mask), one test
 * per row for every plane, and are recomputed exactly (zone_codes16), each lane on its own.
 * Activation-like data puts 0.1-5% of 16-lane vectors there (outlier channels the most).
 *
 * Two kinds of block do not fit the shortcut and are handled aside: a block of zeros
 * (amax 0, scale code 0) encodes as if its code were 127 so its zeros stay below the grid;
 * a block with a tiny nonzero amax (code < MIN_FAST_CODE, amax below about 2^-108 for
 * E4M3) would let zeros and bf16 subnormals alias FP8 values, so it goes through the fp32
 * encoder. NaN/Inf blocks get 0x7F.
 *
 * Work is done on 32x32 tiles of a 32-row strip, read straight from the input (partial edge
 * tiles are copied into a zero-padded tile): a first pass takes the column maxima and the
 * row maxima (a butterfly of unpack + max), a second pass encodes every plane asked for
 * from the same loads. */

#define I16(v) _mm256_set1_epi16((short)(v))

enum { PLANE_ROW = 1, PLANE_COL = 2, PLANE_TILE = 4 };

#define SHIFT(f) (7 - (f).mbits)                  /* bf16 mantissa bits dropped */
#define E_LO_M(mbits, bias) (127 - (bias) - (mbits))
#define E_LO(f) E_LO_M((f).mbits, (f).bias)       /* biased exponent of half the smallest FP8 subnormal */
/* Offset of the packed codes: packus's unsigned saturation then clamps codes above max_code
 * to 255 and negative ones to 0, and one saturating subtract of it gives the final code. */
#define OFF_M(max_code) (255 - (max_code))
/* Per-block constant beside k << 7: rounding bias, FP8 exponent rebias, the pack offset. */
#define KCONST_M(mbits, bias, max_code) \
    ((1 << (6 - (mbits))) - 1 - (((127 - (bias)) << (mbits)) << (7 - (mbits))) + (OFF_M(max_code) << (7 - (mbits))))
#define KCONST(f) KCONST_M((f).mbits, (f).bias, (f).max_code)
/* Smallest scale code for which zeros and bf16 subnormals scale below E_LO (11, 18). */
#define MIN_FAST_CODE(f) (128 - E_LO(f))
/* Window of packed codes (code + offset) that may need the exact recomputation: every code
 * the formula gives for a scaled value in [2^(E_LO-127), smallest FP8 normal), that is
 * -(mbits << mbits) .. 2^mbits - 1, widened downwards to a power of two. */
#define ZWIDTH_M(mbits) ((mbits) == 3 ? 32 : 16)
#define ZLO_M(mbits, max_code) (OFF_M(max_code) + (1 << (mbits)) - ZWIDTH_M(mbits))

/* The hot loop's constants as static data, so they are memory operands: built with set1
 * inside the loop, the compiler rematerializes them there on every row. */
#define REP16(v) ((long long)(0x0001000100010001ull * (uint16_t)(v)))
#define REP8(v) ((long long)(0x0101010101010101ull * (uint8_t)(v)))
#define V16(v) {REP16(v), REP16(v), REP16(v), REP16(v)}
#define V8(v) {REP8(v), REP8(v), REP8(v), REP8(v)}
typedef struct {
    __m256i abs, bit_s, zlo, zadd, off, sign;   // the fast path
    __m256i zk, pow2, bit8, c127;               // zone_codes16
} consts16;
#define CONSTS16(mbits, bias, max_code)                                                                  \
    {.abs = V16(0x7FFF), .bit_s = V16(1 << (7 - (mbits))), .zlo = V8(ZLO_M(mbits, max_code)),           \
     .zadd = V8(128 - ZWIDTH_M(mbits)), .off = V8(OFF_M(max_code)), .sign = V8(0x80),                    \
     .zk = V16(KCONST_M(mbits, bias, max_code) + ((E_LO_M(mbits, bias) - 1) << 7)),                      \
     .pow2 = {0x0804020100, 0, 0x0804020100, 0}, .bit8 = V16(0x100), .c127 = V16(127)}
static const consts16 consts16_of[] = {[MX_E4M3] = CONSTS16(3, 7, 0x7E), [MX_E5M2] = CONSTS16(2, 15, 0x7B)};

/* The constants of a format, behind a pointer the compiler cannot see through. */
ALWAYS_INLINE const consts16 *k16_of(spec f) {
    const consts16 *k = &consts16_of[f.mbits == 3 ? MX_E4M3 : MX_E5M2];
    __asm__("" : "+r"(k));
    return k;
}

/* One 32-element bf16 row, loaded so that packing (v0, v1) to bytes gives element order:
 * v0 holds elements 0-7 and 16-23, v1 elements 8-15 and 24-31. */
ALWAYS_INLINE void load_row16(const uint16_t *p, __m256i *v0, __m256i *v1) {
    *v0 = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)p)),
                                  _mm_loadu_si128((const __m128i *)(p + 16)), 1);
    *v1 = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(p + 8))),
                                  _mm_loadu_si128((const __m128i *)(p + 24)), 1);
}

ALWAYS_INLINE __m256i abs16(__m256i v, const consts16 *K) { return _mm256_and_si256(v, K->abs); }

/* Row maxima of two rows: the result's 32-bit lanes hold (row 0, row 1) partial maxima. The
 * column maxima cm0 (cols 0-15), cm1 (cols 16-31) are updated on the way. */
ALWAYS_INLINE __m256i rowmax2(const uint16_t *p, int64_t stride, __m256i *cm0, __m256i *cm1, const consts16 *K) {
    __m256i x0 = abs16(_mm256_loadu_si256((const __m256i *)p), K);
    __m256i x1 = abs16(_mm256_loadu_si256((const __m256i *)(p + 16)), K);
    __m256i y0 = abs16(_mm256_loadu_si256((const __m256i *)(p + stride)), K);
    __m256i y1 = abs16(_mm256_loadu_si256((const __m256i *)(p + stride + 16)), K);
    *cm0 = _mm256_max_epu16(*cm0, _mm256_max_epu16(x0, y0));
    *cm1 = _mm256_max_epu16(*cm1, _mm256_max_epu16(x1, y1));
    __m256i mx = _mm256_max_epu16(x0, x1), my = _mm256_max_epu16(y0, y1);
    return _mm256_max_epu16(_mm256_unpacklo_epi16(mx, my), _mm256_unpackhi_epi16(mx, my));
}

/* Four rows: 16-bit lanes (r0, r1, r2, r3, r0, r1, r2, r3) in each 128-bit half. */
ALWAYS_INLINE __m256i rowmax4(const uint16_t *p, int64_t stride, __m256i *cm0, __m256i *cm1, const consts16 *K) {
    __m256i u0 = rowmax2(p, stride, cm0, cm1, K), u1 = rowmax2(p + 2 * stride, stride, cm0, cm1, K);
    return _mm256_max_epu16(_mm256_unpacklo_epi32(u0, u1), _mm256_unpackhi_epi32(u0, u1));
}

/* Sixteen rows: lane j of the result is the maximum |x| of row j. */
ALWAYS_INLINE __m256i rowmax16(const uint16_t *p, int64_t stride, __m256i *cm0, __m256i *cm1, const consts16 *K) {
    __m256i v0 = rowmax4(p, stride, cm0, cm1, K), v1 = rowmax4(p + 4 * stride, stride, cm0, cm1, K);
    __m256i w0 = _mm256_max_epu16(_mm256_unpacklo_epi64(v0, v1), _mm256_unpackhi_epi64(v0, v1));
    __m256i v2 = rowmax4(p + 8 * stride, stride, cm0, cm1, K), v3 = rowmax4(p + 12 * stride, stride, cm0, cm1, K);
    __m256i w1 = _mm256_max_epu16(_mm256_unpacklo_epi64(v2, v3), _mm256_unpackhi_epi64(v2, v3));
    return _mm256_max_epu16(_mm256_permute2x128_si256(w0, w1, 0x20), _mm256_permute2x128_si256(w0, w1, 0x31));
}

ALWAYS_INLINE uint32_t hmax16(__m256i v) {
    __m128i m = _mm_max_epu16(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    m = _mm_max_epu16(m, _mm_shuffle_epi32(m, _MM_SHUFFLE(1, 0, 3, 2)));
    m = _mm_max_epu16(m, _mm_shuffle_epi32(m, _MM_SHUFFLE(2, 3, 0, 1)));
    m = _mm_max_epu16(m, _mm_srli_epi32(m, 16));
    return (uint32_t)_mm_cvtsi128_si32(m) & 0xFFFF;
}

/* Scale codes (16-bit lanes) of 16 blocks from the bf16 bits of their maxima: the vector
 * form of mxi_scale_code_bits(amax << 16). */
ALWAYS_INLINE __m256i scale_codes16(__m256i amax, spec f) {
    if (f.mode == MX_SCALE_FLOOR) {
        __m256i code = _mm256_max_epi16(_mm256_sub_epi16(_mm256_srli_epi16(amax, 7), I16(f.emax)), _mm256_setzero_si256());
        return _mm256_blendv_epi8(code, I16(MX_E8M0_NAN), _mm256_cmpgt_epi16(amax, I16(0x7F7F)));
    }
    // RCEIL multiplies in fp32: widen, reuse the 8-lane code, narrow back in order
    __m256i lo = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(amax)), 16);
    __m256i hi = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_extracti128_si256(amax, 1)), 16);
    __m256i c = _mm256_packus_epi32(scale_codes8(lo, f), scale_codes8(hi, f));
    return _mm256_permute4x64_epi64(c, _MM_SHUFFLE(3, 1, 2, 0));
}

/* The per-block constant (k << 7) + KCONST of 16 blocks. An all-zero block encodes with
 * k = 0 (its stored scale code stays 0): its zeros then land far below the FP8 grid. */
ALWAYS_INLINE __m256i kco16(__m256i code, __m256i amax, spec f) {
    __m256i enc = _mm256_blendv_epi8(code, I16(127), _mm256_cmpeq_epi16(amax, _mm256_setzero_si256()));
    return _mm256_add_epi16(_mm256_slli_epi16(_mm256_sub_epi16(I16(127), enc), 7), I16(KCONST(f)));
}

ALWAYS_INLINE int kco_scalar(uint32_t code, uint32_t amax, spec f) {
    int enc = amax == 0 ? 127 : (int)code;
    return (127 - enc) * 128 + KCONST(f);
}

/* Lanes of 16 blocks the 16-bit encoder cannot take: NaN/Inf blocks and tiny nonzero ones. */
ALWAYS_INLINE __m256i special16(__m256i code, __m256i amax, spec f) {
    __m256i tiny = _mm256_andnot_si256(_mm256_cmpeq_epi16(amax, _mm256_setzero_si256()),
                                       _mm256_cmpgt_epi16(I16(MIN_FAST_CODE(f)), code));
    return _mm256_or_si256(tiny, _mm256_cmpeq_epi16(code, I16(MX_E8M0_NAN)));
}

/* Packed codes (code + offset) of 32 elements (a2 = a + bit_s(a), load_row16 order) for
 * blocks with constants k0, k1 (per lane or broadcast). Zen's integer ALU ops share three
 * pipes and its shifts have their own, so the division is a shift and bit_s a compare. */
ALWAYS_INLINE __m256i packed32(__m256i a2_0, __m256i a2_1, __m256i k0, __m256i k1, spec f) {
    __m256i c0 = _mm256_srai_epi16(_mm256_add_epi16(a2_0, k0), SHIFT(f));
    __m256i c1 = _mm256_srai_epi16(_mm256_add_epi16(a2_1, k1), SHIFT(f));
    return _mm256_packus_epi16(c0, c1);
}

/* a + bit_s(a): the round-to-even correction, shared by every plane. */
ALWAYS_INLINE __m256i plus_odd(__m256i a, const consts16 *K) {
    return _mm256_sub_epi16(a, _mm256_cmpeq_epi16(_mm256_and_si256(a, K->bit_s), K->bit_s));
}

/* Bit 7 of each byte set where the packed code is outside the zone window (the common case). */
ALWAYS_INLINE __m256i zone_mask(__m256i p, const consts16 *K) {
    return _mm256_adds_epu8(_mm256_sub_epi8(p, K->zlo), K->zadd);
}

/* Final magnitude codes from packed codes: remove the offset (negative codes clamp to 0;
 * codes above max_code were clamped to 255 by the pack, so they come out as max_code). */
ALWAYS_INLINE __m256i codes_of(__m256i p, const consts16 *K) {
    return _mm256_subs_epu8(p, K->off);
}

/* Exact codes of 16 lanes whose scaled value m' = a + (k << 7) has biased exponent
 * E' in [E_LO - 2, 128 - bias): the FP8 subnormal range, where the grid step is fixed at
 * 2^(1-bias-mbits). There code = RNE(mant * 2^e / 256), with mant the 8-bit significand
 * and e = E' - E_LO in 0..mbits (the shift s + (128-bias-E') is 8 - e); e < 0 gives 0.
 * 2^e comes from a byte shuffle indexed by e + 1 (table 0, 1, 2, 4, ...; a negative index
 * and the high byte's index 0 give 0), and the product from maddubs. */
ALWAYS_INLINE __m256i zone_codes16(__m256i a, __m256i kco, const consts16 *K) {
    __m256i idx = _mm256_srai_epi16(_mm256_add_epi16(a, _mm256_sub_epi16(kco, K->zk)), 7);
    __m256i pow2 = _mm256_shuffle_epi8(K->pow2, idx);
    __m256i w = _mm256_maddubs_epi16(_mm256_or_si256(a, K->sign), pow2);   // (0x80 | f) * 2^e
    __m256i odd = _mm256_cmpeq_epi16(_mm256_and_si256(w, K->bit8), K->bit8);
    return _mm256_srli_epi16(_mm256_sub_epi16(_mm256_add_epi16(w, K->c127), odd), 8);
}

/* Magnitude codes of one plane for 32 elements: the fast codes, with the zone lanes
 * recomputed when there are any. */
ALWAYS_INLINE __m256i plane_codes(__m256i p, __m256i zone, __m256i a0, __m256i a1, __m256i k0, __m256i k1,
                                  const consts16 *K) {
    __m256i code = codes_of(p, K);
    if (_mm256_movemask_epi8(zone) != -1) {
        __m256i exact = _mm256_packus_epi16(zone_codes16(a0, k0, K), zone_codes16(a1, k1, K));
        code = _mm256_blendv_epi8(exact, code, zone);
    }
    return code;
}

/* n <= 32 elements (bf16 bits or fp32, element order) of blocks whose scale codes are
 * given per element, through the fp32 encoder: for blocks with a tiny nonzero amax. NaN
 * codes give garbage here and are overwritten by the caller. Lanes from n on encode zeros. */
static __attribute__((noinline)) void slow_row32(uint8_t *dst, const void *p, mxi_src kind, int64_t n,
                                                 const uint8_t *codes, spec f) {
    __m256i x[4], c[4];
    __m256 mul[4];
    uint32_t part[32];
    if (n < MX_BLOCK) {
        load_partial(part, p, kind, 0, n);
        p = part, kind = MXI_SRC_F32;
    }
    for (int j = 0; j < 4; j++) {
        x[j] = load8(p, kind, 8 * j);
        mul[j] = scale_mul(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(codes + 8 * j))));
        c[j] = encode8(x[j], mul[j], f);
    }
    _mm256_storeu_si256((__m256i *)dst, finish32(c[0], c[1], c[2], c[3], x[0], x[1], x[2], x[3], f));
}

/* Element-plane bytes of a job from which the plane lines two tiles ahead are prefetched:
 * a tile writes only half of each line it touches, and without the prefetch the read for
 * ownership of the line stalls the stores. About the last-level cache size; below it the
 * lines are often still cached and the prefetches only cost issue slots (measured on Zen:
 * +10-20% from DRAM, -7% when everything fits in L2). prefetchw would be the exact hint,
 * but not every AVX2 CPU has it, and plain prefetcht0 measured within noise of it. */
#define PREFETCH_MIN_BYTES (8 << 20)

/* One 32x32 tile (nr x nc valid) at src with row stride `stride`, into the planes asked
 * for; (r0, c0) is its position in the job. With an fp32 job src holds its values rounded
 * to odd (jam_tile) and the slow paths encode the fp32 values themselves. */
ALWAYS_INLINE void bf16_tile(const mxi_quant_job *job, const uint16_t *src, int64_t stride, int64_t r0, int64_t c0,
                             int64_t nr, int64_t nc, spec f, int planes, bool prefetch) {
    int64_t cols = job->cols, cb = (cols + MX_BLOCK - 1) / MX_BLOCK, b = c0 / MX_BLOCK;
    const __m256i zero = _mm256_setzero_si256();
    const consts16 *K = k16_of(f);

    // pass 1: maxima
    __m256i cn0 = zero, cn1 = zero;   // column maxima, cols 0-15 and 16-31
    __m256i rm0 = rowmax16(src, stride, &cn0, &cn1, K), rm1 = rowmax16(src + 16 * stride, stride, &cn0, &cn1, K);
    // the column maxima in load_row16 order: cols 0-7 and 16-23, cols 8-15 and 24-31
    __m256i cm0 = _mm256_permute2x128_si256(cn0, cn1, 0x20), cm1 = _mm256_permute2x128_si256(cn0, cn1, 0x31);

    // rows: codes, constants, specials
    uint16_t kr[32] __attribute__((aligned(32)));
    uint32_t row_special[2] = {0, 0};
    uint8_t row_code[32];
    if (planes & PLANE_ROW) {
        __m256i cd0 = scale_codes16(rm0, f), cd1 = scale_codes16(rm1, f);
        _mm256_store_si256((__m256i *)kr, kco16(cd0, rm0, f));
        _mm256_store_si256((__m256i *)(kr + 16), kco16(cd1, rm1, f));
        __m256i codes = _mm256_permute4x64_epi64(_mm256_packus_epi16(cd0, cd1), _MM_SHUFFLE(3, 1, 2, 0));
        _mm256_storeu_si256((__m256i *)row_code, codes);
        row_special[0] = (uint32_t)_mm256_movemask_epi8(special16(cd0, rm0, f));
        row_special[1] = (uint32_t)_mm256_movemask_epi8(special16(cd1, rm1, f));
        for (int64_t r = 0; r < nr; r++) job->s_row[(r0 + r) * cb + b] = row_code[r];
    }

    // columns
    __m256i kc0 = zero, kc1 = zero, col_nan = zero;
    bool col_nan_any = false, col_slow = false;
    uint8_t col_code[32];
    if (planes & PLANE_COL) {
        __m256i cd0 = scale_codes16(cm0, f), cd1 = scale_codes16(cm1, f);
        kc0 = kco16(cd0, cm0, f), kc1 = kco16(cd1, cm1, f);
        __m256i codes = _mm256_packus_epi16(cd0, cd1);   // element order, thanks to load_row16's order
        _mm256_storeu_si256((__m256i *)col_code, codes);
        store_bytes(job->s_col + (r0 / MX_BLOCK) * cols + c0, codes, nc);
        col_nan = _mm256_cmpeq_epi8(codes, _mm256_set1_epi8(-1));
        col_nan_any = !_mm256_testz_si256(col_nan, col_nan);
        __m256i tiny = _mm256_andnot_si256(_mm256_cmpeq_epi16(cm0, zero), _mm256_cmpgt_epi16(I16(MIN_FAST_CODE(f)), cd0));
        tiny = _mm256_or_si256(tiny, _mm256_andnot_si256(_mm256_cmpeq_epi16(cm1, zero),
                                                         _mm256_cmpgt_epi16(I16(MIN_FAST_CODE(f)), cd1)));
        col_slow = !_mm256_testz_si256(tiny, tiny);
    }

    // the tile
    __m256i kt = zero;
    uint8_t tile_code = 0;
    bool tile_special = false;
    if (planes & PLANE_TILE) {
        uint32_t amax = hmax16(_mm256_max_epu16(cm0, cm1));
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
        __m256i b0, b1;
        load_row16(p, &b0, &b1);
        __m256i a0 = abs16(b0, K), a1 = abs16(b1, K);
        __m256i a2_0 = plus_odd(a0, K), a2_1 = plus_odd(a1, K);
        __m256i sign = _mm256_and_si256(_mm256_packs_epi16(b0, b1), K->sign);
        // packed codes and window masks of every plane first: one test for all of them
        const __m256i none = _mm256_set1_epi8(-1);   // a plane not asked for has no window lanes
        __m256i kr_r = zero, p_row = zero, p_col = zero, p_tile = zero, z_row = none, z_col = none, z_tile = none;
        if (planes & PLANE_ROW) {
            kr_r = I16(kr[r]);
            p_row = packed32(a2_0, a2_1, kr_r, kr_r, f);
            z_row = zone_mask(p_row, K);
        }
        if (planes & PLANE_COL) {
            p_col = packed32(a2_0, a2_1, kc0, kc1, f);
            z_col = zone_mask(p_col, K);
        }
        if (planes & PLANE_TILE) {
            p_tile = packed32(a2_0, a2_1, kt, kt, f);
            z_tile = zone_mask(p_tile, K);
        }
        __m256i c_row = codes_of(p_row, K), c_col = codes_of(p_col, K), c_tile = codes_of(p_tile, K);
        __m256i z = _mm256_and_si256(_mm256_and_si256(z_row, z_col), z_tile);
        if (__builtin_expect(_mm256_movemask_epi8(z) != -1, 0)) {
            if (planes & PLANE_ROW) c_row = plane_codes(p_row, z_row, a0, a1, kr_r, kr_r, K);
            if (planes & PLANE_COL) c_col = plane_codes(p_col, z_col, a0, a1, kc0, kc1, K);
            if (planes & PLANE_TILE) c_tile = plane_codes(p_tile, z_tile, a0, a1, kt, kt, K);
        }
        if (planes & PLANE_ROW) {
            __m256i out = _mm256_or_si256(c_row, sign);
            if (__builtin_expect((row_special[r >> 4] >> (2 * (r & 15))) & 1, 0)) {
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
 * pad (32 x 32, zero elsewhere): why the 16-bit encoder then gives the fp32 values' codes
 * with FLOOR scales is said at the AVX-512 kernel's jam_tile, and so is `next`. */
ALWAYS_INLINE void jam_tile(uint16_t *pad, const float *x, int64_t cols, int64_t nr, int64_t nc, const float *next) {
    const __m256i low = I32(0xFFFF), one = I32(1);
    uint32_t part[32];
    int64_t r = 0;
    for (; r < nr; r++) {
        const void *p = x + r * cols;
        if (next) {
            _mm_prefetch((const char *)(next + r * cols), _MM_HINT_T0);
            _mm_prefetch((const char *)(next + r * cols + 16), _MM_HINT_T0);
        }
        if (nc < MX_BLOCK) {
            load_partial(part, p, MXI_SRC_F32, 0, nc);
            p = part;
        }
        for (int j = 0; j < 2; j++) {
            __m256i w[2];
            for (int k = 0; k < 2; k++) {   // the top 16 bits | (the low 16 bits != 0)
                __m256i v = load8(p, MXI_SRC_F32, 16 * j + 8 * k);
                w[k] = _mm256_or_si256(_mm256_srli_epi32(v, 16), _mm256_min_epu32(_mm256_and_si256(v, low), one));
            }
            // packus interleaves the 128-bit halves: (w0 lo, w1 lo, w0 hi, w1 hi) back in order
            __m256i h = _mm256_permute4x64_epi64(_mm256_packus_epi32(w[0], w[1]), _MM_SHUFFLE(3, 1, 2, 0));
            _mm256_store_si256((__m256i *)(pad + 32 * r + 16 * j), h);
        }
    }
    for (; r < MX_BLOCK; r++) {
        _mm256_store_si256((__m256i *)(pad + 32 * r), _mm256_setzero_si256());
        _mm256_store_si256((__m256i *)(pad + 32 * r + 16), _mm256_setzero_si256());
    }
}

#include "numerics/x86/mx_instances.h"

const mxi_mx_kernels mxi_mx_kernels_avx2 = {.name = "avx2", .quantize_rows = quantize_rows,
                                            .encode_fp8 = mxi_encode_fp8_avx2,
                                            .encode_fp8_vec = mxi_encode_fp8_vec_avx2, .encode_hif8 = mxi_encode_hif8_avx2,
                                            .amax = mxi_amax_avx2, .amax_bits = mxi_amax_bits_avx2,
                                            .amax_bits_cols = mxi_amax_bits_cols_avx2,
                                            .amax_bits_rows = mxi_amax_bits_rows_avx2,
                                            .encode_fp8_rows = mxi_encode_fp8_rows_avx2,
                                            .encode_fp8_cols = mxi_encode_fp8_cols_avx2,
                                            // bf16 operands serve oneDNN's native bf16 GEMM (AVX-512): no AVX2 CPU asks
                                            .values16_fp8_blocks = mxi_values16_fp8_blocks_ref,
                                            .values16_fp8_cols = mxi_values16_fp8_cols_ref};
