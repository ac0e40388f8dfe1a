/* AVX2 MX quantization, bit-identical to the reference kernel (numerics/ref/mx_ref.c).
 *
 * Rowwise-only jobs stream along each row, one 32-element block (four 8-lane vectors) at a
 * time. Jobs with a colwise plane work on 32x32 tiles of one 32-row strip: the tile is
 * loaded once (bf16 widened to fp32), its column maxima give the colwise scales, and both
 * planes are encoded from the tile while it sits in L1. Partial blocks are zero-padded in
 * the tile, which leaves every block maximum unchanged. */
#include <immintrin.h>

#include "numerics/mx_internal.h"

#define ALWAYS_INLINE static inline __attribute__((always_inline))

typedef struct {
    __m256i abs_mask, exp_mask, min_normal, grid_shift, code_bias, max_code, nan_code;
    int mbits;
} enc_consts;

ALWAYS_INLINE enc_consts enc_consts_of(const mx_elem_traits *t) {
    enc_consts k;
    k.abs_mask = _mm256_set1_epi32(0x7FFFFFFF);
    k.exp_mask = _mm256_set1_epi32(0x7F800000);
    k.min_normal = _mm256_set1_epi32((128 - t->bias) << 23);    // bits of 2^(1-bias)
    k.grid_shift = _mm256_set1_epi32((23 - t->mbits) << 23);     // times 2^(23-mbits)
    k.code_bias = _mm256_set1_epi32((128 - t->bias) << t->mbits);
    k.max_code = _mm256_set1_epi32(t->max_code);
    k.nan_code = _mm256_set1_epi32(t->nan_code);
    k.mbits = t->mbits;
    return k;
}

/* FP8 codes (one per 32-bit lane) of x * mul, mul a power of two.
 * With a = |x| * mul and E the exponent of max(a, min normal), adding C = 2^(E+23-mbits)
 * rounds a to the FP8 grid (spacing 2^(E-mbits)) with the FPU's round-to-nearest-even, and
 * bits(a + C) - bits(C) counts grid steps; adding E's code offset gives the FP8 code for
 * normals and subnormals alike, a carry into the next binade included. */
ALWAYS_INLINE __m256i encode8(__m256i x, __m256 mul, const enc_consts *k) {
    __m256i sign = _mm256_srli_epi32(_mm256_andnot_si256(k->abs_mask, x), 24);
    __m256 a = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_and_si256(x, k->abs_mask)), mul);
    __m256i e = _mm256_max_epi32(_mm256_and_si256(_mm256_castps_si256(a), k->exp_mask), k->min_normal);
    __m256i c = _mm256_add_epi32(e, k->grid_shift);
    __m256i steps = _mm256_sub_epi32(_mm256_castps_si256(_mm256_add_ps(a, _mm256_castsi256_ps(c))), c);
    __m256i code = _mm256_add_epi32(steps, _mm256_sub_epi32(_mm256_srli_epi32(e, 23 - k->mbits), k->code_bias));
    return _mm256_or_si256(_mm256_min_epi32(code, k->max_code), sign);
}

/* 2^(127-code) per lane; code <= 246 for any finite block, so the result is a normal fp32. */
ALWAYS_INLINE __m256 scale_mul(__m256i code) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_sub_epi32(_mm256_set1_epi32(254), code), 23));
}

/* Four vectors of 8 codes (0..255) to 32 bytes in lane order. */
ALWAYS_INLINE __m256i pack32(__m256i c0, __m256i c1, __m256i c2, __m256i c3) {
    __m256i b = _mm256_packus_epi16(_mm256_packus_epi32(c0, c1), _mm256_packus_epi32(c2, c3));
    return _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
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

/* One rowwise block of 32 fp32-bit lanes (v0..v3) to 32 codes and its scale. */
ALWAYS_INLINE __m256i rowwise_block(__m256i v0, __m256i v1, __m256i v2, __m256i v3,
                                    const mxi_quant_job *job, const enc_consts *k, uint8_t *scale) {
    __m256i m = _mm256_max_epi32(_mm256_max_epi32(_mm256_and_si256(v0, k->abs_mask), _mm256_and_si256(v1, k->abs_mask)),
                                 _mm256_max_epi32(_mm256_and_si256(v2, k->abs_mask), _mm256_and_si256(v3, k->abs_mask)));
    uint8_t code = mxi_scale_code_bits(hmax8(m), job->elem, job->mode);
    *scale = code;
    if (code == MX_E8M0_NAN) return _mm256_set1_epi8((char)job->elem->nan_code);
    __m256 mul = scale_mul(_mm256_set1_epi32(code));
    return pack32(encode8(v0, mul, k), encode8(v1, mul, k), encode8(v2, mul, k), encode8(v3, mul, k));
}

ALWAYS_INLINE void rowwise_rows(const mxi_quant_job *job, int64_t r0, int64_t r1, mxi_src kind) {
    enc_consts k = enc_consts_of(job->elem);
    int64_t cols = job->cols, cb = (cols + MX_BLOCK - 1) / MX_BLOCK, full = cols / MX_BLOCK;
    for (int64_t r = r0; r < r1; r++) {
        int64_t row = r * cols;
        for (int64_t b = 0; b < full; b++) {
            int64_t i = row + b * MX_BLOCK;
            __m256i out = rowwise_block(load8(job->x, kind, i), load8(job->x, kind, i + 8),
                                        load8(job->x, kind, i + 16), load8(job->x, kind, i + 24),
                                        job, &k, &job->s_row[r * cb + b]);
            _mm256_storeu_si256((__m256i *)(job->q_row + i), out);
        }
        if (full < cb) {
            uint32_t tail[32] __attribute__((aligned(32)));
            int64_t n = cols - full * MX_BLOCK;
            load_partial(tail, job->x, kind, row + full * MX_BLOCK, n);
            const __m256i *t = (const __m256i *)tail;
            __m256i out = rowwise_block(t[0], t[1], t[2], t[3], job, &k, &job->s_row[r * cb + full]);
            store_bytes(job->q_row + row + full * MX_BLOCK, out, n);
        }
    }
}

/* Scale codes of 8 columns from their maxima (vector form of mxi_scale_code_bits). */
ALWAYS_INLINE __m256i scale_codes8(__m256i amax, const mxi_quant_job *job) {
    __m256i code;
    if (job->mode == MX_SCALE_FLOOR) {
        code = _mm256_max_epi32(_mm256_sub_epi32(_mm256_srli_epi32(amax, 23), _mm256_set1_epi32(job->elem->emax)),
                                _mm256_setzero_si256());
    } else {
        __m256i d = _mm256_castps_si256(_mm256_mul_ps(_mm256_castsi256_ps(amax), _mm256_set1_ps(1.0f / job->elem->max)));
        __m256i E = _mm256_srli_epi32(d, 23), M = _mm256_and_si256(d, _mm256_set1_epi32(0x7FFFFF));
        __m256i one = _mm256_set1_epi32(1);
        __m256i normal = _mm256_add_epi32(_mm256_add_epi32(E, one), _mm256_cmpeq_epi32(M, _mm256_setzero_si256()));
        __m256i sub = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_cmpgt_epi32(M, _mm256_set1_epi32(0x400000)));
        code = _mm256_blendv_epi8(normal, sub, _mm256_cmpeq_epi32(E, _mm256_setzero_si256()));
    }
    __m256i nonfinite = _mm256_cmpgt_epi32(amax, _mm256_set1_epi32(0x7F7FFFFF));
    return _mm256_blendv_epi8(code, _mm256_set1_epi32(MX_E8M0_NAN), nonfinite);
}

/* One strip of up to 32 rows starting at r0 (a multiple of 32), in 32x32 tiles. */
ALWAYS_INLINE void tile_strip(const mxi_quant_job *job, int64_t r0, int64_t nr, mxi_src kind) {
    enc_consts k = enc_consts_of(job->elem);
    int64_t cols = job->cols, cb = (cols + MX_BLOCK - 1) / MX_BLOCK;
    __m256i tile[32][4];   // (32 rows, 32 cols) as fp32 bits
    for (int64_t c0 = 0; c0 < cols; c0 += MX_BLOCK) {
        int64_t nc = cols - c0 < MX_BLOCK ? cols - c0 : MX_BLOCK;
        __m256i amax[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
        for (int64_t r = 0; r < MX_BLOCK; r++) {
            int64_t i = (r0 + r) * cols + c0;
            if (r < nr && nc == MX_BLOCK) {
                for (int j = 0; j < 4; j++) tile[r][j] = load8(job->x, kind, i + 8 * j);
            } else if (r < nr) {
                load_partial((uint32_t *)tile[r], job->x, kind, i, nc);
            } else {
                for (int j = 0; j < 4; j++) tile[r][j] = _mm256_setzero_si256();
            }
            for (int j = 0; j < 4; j++) amax[j] = _mm256_max_epi32(amax[j], _mm256_and_si256(tile[r][j], k.abs_mask));
        }
        if (job->q_col) {
            __m256i code[4], nan[4];
            __m256 mul[4];
            for (int j = 0; j < 4; j++) {
                code[j] = scale_codes8(amax[j], job);
                nan[j] = _mm256_cmpeq_epi32(code[j], _mm256_set1_epi32(MX_E8M0_NAN));
                mul[j] = scale_mul(code[j]);
            }
            store_bytes(job->s_col + (r0 / MX_BLOCK) * cols + c0, pack32(code[0], code[1], code[2], code[3]), nc);
            for (int64_t r = 0; r < nr; r++) {
                __m256i e[4];
                for (int j = 0; j < 4; j++) e[j] = _mm256_blendv_epi8(encode8(tile[r][j], mul[j], &k), k.nan_code, nan[j]);
                store_bytes(job->q_col + (r0 + r) * cols + c0, pack32(e[0], e[1], e[2], e[3]), nc);
            }
        }
        if (job->q_row) {
            for (int64_t r = 0; r < nr; r++) {
                __m256i out = rowwise_block(tile[r][0], tile[r][1], tile[r][2], tile[r][3], job, &k,
                                            &job->s_row[(r0 + r) * cb + c0 / MX_BLOCK]);
                store_bytes(job->q_row + (r0 + r) * cols + c0, out, nc);
            }
        }
    }
}

static void rowwise_f32(const mxi_quant_job *job, int64_t r0, int64_t r1) { rowwise_rows(job, r0, r1, MXI_SRC_F32); }
static void rowwise_bf16(const mxi_quant_job *job, int64_t r0, int64_t r1) { rowwise_rows(job, r0, r1, MXI_SRC_BF16); }
static void tiles_f32(const mxi_quant_job *job, int64_t r0, int64_t nr) { tile_strip(job, r0, nr, MXI_SRC_F32); }
static void tiles_bf16(const mxi_quant_job *job, int64_t r0, int64_t nr) { tile_strip(job, r0, nr, MXI_SRC_BF16); }

static void avx2_quantize_rows(const mxi_quant_job *job, int64_t r0, int64_t r1) {
    if (!job->q_col) {
        (job->src == MXI_SRC_F32 ? rowwise_f32 : rowwise_bf16)(job, r0, r1);
        return;
    }
    for (int64_t r = r0; r < r1; r += MX_BLOCK) {
        int64_t nr = r1 - r < MX_BLOCK ? r1 - r : MX_BLOCK;
        (job->src == MXI_SRC_F32 ? tiles_f32 : tiles_bf16)(job, r, nr);
    }
}

const mxi_mx_kernels mxi_mx_kernels_avx2 = {"avx2", avx2_quantize_rows};
