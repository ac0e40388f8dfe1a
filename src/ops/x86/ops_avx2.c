/* AVX2 kernels of the ops layer, bit-identical to ops/ref/ops_ref.c.
 *
 * Dequantization without a table lookup: an FP8 code c, sign-extended to 32 bits and
 * shifted left by (23 - mbits), then masked to its sign bit and its low 7 + (23 - mbits)
 * bits, is an fp32 whose exponent field is the FP8 exponent field and whose mantissa starts
 * with the FP8 mantissa. That fp32 is exactly value(c) * 2^-(127 - bias), for subnormal
 * codes too (they land on fp32 subnormals with the same significand). One multiply by
 * K = 2^(s - 127) * 2^(127 - bias) then gives value(c) * 2^(s-127) with a single rounding,
 * the same as the reference's value * scale, as long as K is a normal fp32: s + 127 - bias
 * <= 254. Blocks with a larger or NaN scale, or holding a NaN/infinity code, go through
 * the reference per element (never for a plane a real tensor produces). */
#include <immintrin.h>

#include "ops/ops_kernels.h"
#include "ops/x86/bf16_avx2.h"

typedef struct {
    int shift;         // 23 - mbits: where the FP8 mantissa lands in an fp32
    uint32_t keep;     // sign bit and the bits below the shifted FP8 sign
    int adj;           // 127 - bias
    int limit;         // largest scale code whose K = 2^(s-127+adj) is a normal fp32
    uint64_t special;  // SWAR add: a byte whose low 7 bits are a NaN/inf code carries into bit 7
} fmt_consts;

static const fmt_consts E4M3_K = {.shift = 20, .keep = 0x87FFFFFFu, .adj = 120, .limit = 254 - 120,
                                  .special = 0x0101010101010101ull};   // 0x7F is NaN
static const fmt_consts E5M2_K = {.shift = 21, .keep = 0x8FFFFFFFu, .adj = 112, .limit = 254 - 112,
                                  .special = 0x0404040404040404ull};   // 0x7C.. inf/NaN

/* Whether any of 8 codes is a NaN or infinity code. */
static inline int has_special8(const uint8_t *q, const fmt_consts *f) {
    uint64_t x;
    __builtin_memcpy(&x, q, 8);
    return (((x & 0x7F7F7F7F7F7F7F7Full) + f->special) & 0x8080808080808080ull) != 0;
}

/* 8 codes to fp32 value(c) * 2^-adj, exactly. */
static inline __m256 fake8(const uint8_t *q, const fmt_consts *f) {
    __m256i x = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)q));
    x = _mm256_sll_epi32(x, _mm_cvtsi32_si128(f->shift));
    return _mm256_castsi256_ps(_mm256_and_si256(x, _mm256_set1_epi32((int)f->keep)));
}

/* 8 values to the job's output at element offset o: fp32 to y, or bf16 to y16. */
static inline void put8(const mxi_dequant_job *job, int64_t o, __m256 v) {
    if (!job->y16) {
        _mm256_storeu_ps(job->y + o, v);
        return;
    }
    __m256i r = _mm256_srli_epi32(mxi_bf16_bits8(v), 16);
    __m128i h = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));   // 16-bit values: no clamping
    _mm_storeu_si128((__m128i *)(job->y16 + o), h);
}

static void dequant_rowwise(const mxi_dequant_job *job, int64_t r0, int64_t r1, const fmt_consts *f) {
    const mxi_mx_plane *p = job->p;
    int64_t cols = p->cols, cb = (cols + MX_BLOCK - 1) / MX_BLOCK;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *q = p->q + r * cols, *s = p->scales + r * cb;
        int64_t o = r * cols, c = 0;
        for (; c + MX_BLOCK <= cols; c += MX_BLOCK) {
            int code = s[c / MX_BLOCK];
            if (code > f->limit || has_special8(q + c, f) || has_special8(q + c + 8, f) ||
                has_special8(q + c + 16, f) || has_special8(q + c + 24, f)) {
                mxi_dequant_run_ref(job, o + c, &s[c / MX_BLOCK], 0, MX_BLOCK);
                continue;
            }
            __m256 k = _mm256_castsi256_ps(_mm256_set1_epi32((code + f->adj) << 23));
            for (int j = 0; j < MX_BLOCK; j += 8) put8(job, o + c + j, _mm256_mul_ps(fake8(q + c + j, f), k));
        }
        if (c < cols) mxi_dequant_run_ref(job, o + c, &s[c / MX_BLOCK], 0, cols - c);
    }
}

enum { PANEL = 4096 };   // columns whose K vectors are built once per 32-row strip (16 KB)

static void dequant_colwise(const mxi_dequant_job *job, int64_t r0, int64_t r1, const fmt_consts *f) {
    const mxi_mx_plane *p = job->p;
    int64_t cols = p->cols, full = cols / 8 * 8;
    float kbuf[PANEL];   // (PANEL) K of each column of the panel
    uint8_t bad[PANEL / 8];  // group of 8 columns with a scale above the limit (or NaN)
    for (int64_t rs = r0; rs < r1; rs += MX_BLOCK) {
        int64_t re = rs + MX_BLOCK < r1 ? rs + MX_BLOCK : r1;
        const uint8_t *s = p->scales + (rs / MX_BLOCK) * cols;   // (cols) this strip's scales
        for (int64_t c0 = 0; c0 < full; c0 += PANEL) {
            int64_t groups = (full - c0 < PANEL ? full - c0 : PANEL) / 8;
            for (int64_t g = 0; g < groups; g++) {
                __m256i sc = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(s + c0 + 8 * g)));
                bad[g] = _mm256_movemask_epi8(_mm256_cmpgt_epi32(sc, _mm256_set1_epi32(f->limit))) != 0;
                __m256i kb = _mm256_slli_epi32(_mm256_add_epi32(sc, _mm256_set1_epi32(f->adj)), 23);
                _mm256_storeu_ps(kbuf + 8 * g, _mm256_castsi256_ps(kb));
            }
            for (int64_t r = rs; r < re; r++) {
                const uint8_t *q = p->q + r * cols + c0;
                int64_t o = r * cols + c0;
                for (int64_t g = 0; g < groups; g++) {
                    if (bad[g] || has_special8(q + 8 * g, f)) {
                        mxi_dequant_run_ref(job, o + 8 * g, s + c0 + 8 * g, 1, 8);
                        continue;
                    }
                    put8(job, o + 8 * g, _mm256_mul_ps(fake8(q + 8 * g, f), _mm256_loadu_ps(kbuf + 8 * g)));
                }
            }
        }
        if (full < cols)
            for (int64_t r = rs; r < re; r++)
                mxi_dequant_run_ref(job, r * cols + full, s + full, 1, cols - full);
    }
}

static void avx2_dequant_rows(const mxi_dequant_job *job, int64_t r0, int64_t r1) {
    const fmt_consts *f = job->p->elem == MX_E5M2 ? &E5M2_K : &E4M3_K;
    if (job->p->axis == MX_ROWWISE) dequant_rowwise(job, r0, r1, f);
    else dequant_colwise(job, r0, r1, f);
}

static void avx2_widen_bf16(float *y, const uint16_t *x, int64_t ld, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        const uint16_t *xr = x + r * ld;
        float *yr = y + r * cols;
        int64_t c = 0;
        for (; c + 8 <= cols; c += 8) {
            __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(xr + c)));
            _mm256_storeu_si256((__m256i *)(yr + c), _mm256_slli_epi32(w, 16));
        }
        for (; c < cols; c++) yr[c] = mxi_bf16_to_f32(xr[c]);
    }
}

/* Table lookups by gathers, eight codes at a time; the tail through the reference loop. */
static void avx2_lut32(uint32_t *y, const uint8_t *q, int64_t n, const uint32_t table[256]) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(q + i)));
        _mm256_storeu_si256((__m256i *)(y + i), _mm256_i32gather_epi32((const int *)table, idx, 4));
    }
    for (; i < n; i++) y[i] = table[q[i]];
}

static void avx2_lut16(uint16_t *y, const uint8_t *q, int64_t n, const uint32_t table[256]) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i a = _mm256_i32gather_epi32((const int *)table, _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(q + i))), 4);
        __m256i b = _mm256_i32gather_epi32((const int *)table, _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(q + i + 8))), 4);
        // the low halves (masked, so that the unsigned saturating pack keeps them), back in order
        __m256i lo = _mm256_set1_epi32(0xFFFF);
        __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(_mm256_and_si256(a, lo), _mm256_and_si256(b, lo)),
                                             _MM_SHUFFLE(3, 1, 2, 0));
        _mm256_storeu_si256((__m256i *)(y + i), p);
    }
    for (; i < n; i++) y[i] = (uint16_t)table[q[i]];
}

static void avx2_scale_row(float *c, const float *acc, int64_t n, float sa, const float *sb, float s, mxi_row_write w) {
    __m256 va = _mm256_set1_ps(sa), vs = _mm256_set1_ps(sa * s);
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 f = sb ? _mm256_mul_ps(va, _mm256_loadu_ps(sb + j)) : vs;
        __m256 t = _mm256_mul_ps(f, _mm256_loadu_ps(acc + j));
        if (w == MXI_ROW_ADD) t = _mm256_add_ps(_mm256_loadu_ps(c + j), t);
        _mm256_storeu_ps(c + j, t);
    }
    mxi_ops_kernels_ref.scale_row(c + j, acc + j, n - j, sa, sb ? sb + j : NULL, s, w);
}

const mxi_ops_kernels mxi_ops_kernels_avx2 = {.name = "avx2", .dequant_rows = avx2_dequant_rows,
                                              .widen_bf16 = avx2_widen_bf16, .lut32 = avx2_lut32, .lut16 = avx2_lut16,
                                              .scale_row = avx2_scale_row};
