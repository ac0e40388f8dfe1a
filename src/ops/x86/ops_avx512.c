/* AVX-512 kernels of the ops layer (F, BW, DQ, VL), bit-identical to ops/ref/ops_ref.c.
 * With job->y16 the dequantized vectors are rounded to bf16 in registers and stored as
 * bf16 (the bf16 MX GEMM's operands), with no fp32 pass in between.
 *
 * The AVX2 kernel's dequantization (ops/x86/ops_avx2.c, which explains why it is exact)
 * on 16 lanes: an FP8 code sign-extended to 32 bits, shifted and masked, is exactly
 * value(c) * 2^-(127 - bias) as an fp32, and one multiply by K = 2^(s - 127 + 127 - bias)
 * gives value(c) * 2^(s-127) with the reference's single rounding, while K is a normal
 * fp32. Blocks with a larger or NaN scale, or holding a NaN/infinity code, go through the
 * reference per element. Row and column tails are done with masked loads and stores
 * instead of scalar code. Where the CPU has AVX512_VBMI, bf16 output goes by byte permutes
 * instead (below). Built on SIMDe instead of AVX-512 with MXI_AVX512_SIMDE (see
 * numerics/x86/simd512.h). */
#include <string.h>

#include "numerics/x86/simd512.h"

#include "ops/ops_kernels.h"
#include "ops/x86/bf16_avx512.h"

typedef struct {
    int shift;         // 23 - mbits: where the FP8 mantissa lands in an fp32
    uint32_t keep;     // sign bit and the bits below the shifted FP8 sign
    int adj;           // 127 - bias
    int limit;         // largest scale code whose K = 2^(s-127+adj) is a normal fp32
    uint8_t special;   // smallest low-7-bit pattern of a NaN or infinity code
    int lo16, hi16;    // scale codes that keep every nonzero value a normal bf16 (the permute path)
} fmt_consts;

// E4M3 magnitudes are 2^-9 .. 1.75 * 2^8, E5M2's 2^-16 .. 1.75 * 2^15; bf16 normals 2^-126 .. ~2^128
static const fmt_consts E4M3_K = {.shift = 20, .keep = 0x87FFFFFFu, .adj = 120, .limit = 254 - 120,
                                  .special = 0x7F, .lo16 = 127 - 126 + 9, .hi16 = 127 + 127 - 8};   // 0x7F is NaN
static const fmt_consts E5M2_K = {.shift = 21, .keep = 0x8FFFFFFFu, .adj = 112, .limit = 254 - 112,
                                  .special = 0x7C, .lo16 = 127 - 126 + 16, .hi16 = 127 + 127 - 15};   // 0x7C.. inf/NaN

static inline uint32_t lanes32(int64_t n) { return n >= 32 ? 0xFFFFFFFFu : (1u << n) - 1; }

/* Whether any of 16 or 32 codes is a NaN or infinity code (zero-filled lanes are not). */
static inline bool has_special16(__m128i q, const fmt_consts *f) {
    return _mm_cmpge_epu8_mask(_mm_and_si128(q, _mm_set1_epi8(0x7F)), _mm_set1_epi8((char)f->special)) != 0;
}
static inline bool has_special32(__m256i q, const fmt_consts *f) {
    return _mm256_cmpge_epu8_mask(_mm256_and_si256(q, _mm256_set1_epi8(0x7F)), _mm256_set1_epi8((char)f->special)) != 0;
}
static inline bool has_special64(__m512i q, const fmt_consts *f) {
    return _mm512_cmpge_epu8_mask(_mm512_and_si512(q, _mm512_set1_epi8(0x7F)), _mm512_set1_epi8((char)f->special)) != 0;
}

/* 16 codes to fp32 value(c) * 2^-adj, exactly. */
static inline __m512 fake16(__m128i q, const fmt_consts *f) {
    __m512i x = _mm512_sll_epi32(_mm512_cvtepi8_epi32(q), _mm_cvtsi32_si128(f->shift));
    return _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32((int)f->keep)));
}

/* 1 <= n <= 16 floats to y; masked when n < 16, so nothing past y + n is touched. */
static inline void store16(float *y, __m512 v, int64_t n) {
    if (n == 16) _mm512_storeu_ps(y, v);
    else _mm512_mask_storeu_ps(y, (__mmask16)lanes32(n), v);
}

/* 16 fp32 to bf16: the shared rounding, narrowed. */
static inline __m256i bf16_16(__m512 x) { return _mm512_cvtepi32_epi16(_mm512_srli_epi32(mxi_bf16_bits16(x), 16)); }

/* 1 <= n <= 16 values to the job's output at element offset o: fp32 to y, or bf16 to y16. */
static inline void put16(const mxi_dequant_job *job, int64_t o, __m512 v, int64_t n) {
    if (!job->y16) {
        store16(job->y + o, v, n);
    } else if (n == 16) {
        _mm256_storeu_si256((__m256i *)(job->y16 + o), bf16_16(v));
    } else {
        _mm256_mask_storeu_epi16(job->y16 + o, (__mmask16)lanes32(n), bf16_16(v));
    }
}

/* Rows [r0, r1), columns [c0, cols) (c0 a multiple of 32). */
static void dequant_rowwise(const mxi_dequant_job *job, int64_t r0, int64_t r1, int64_t c0, const fmt_consts *f) {
    const mxi_mx_plane *p = job->p;
    int64_t cols = p->cols, cb = (cols + MX_BLOCK - 1) / MX_BLOCK;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *q = p->q + r * cols, *s = p->scales + r * cb;
        int64_t o = r * cols;
        for (int64_t c = c0; c < cols; c += MX_BLOCK) {
            int64_t n = cols - c < MX_BLOCK ? cols - c : MX_BLOCK;   // the last block may be partial
            int code = s[c / MX_BLOCK];
            __m256i v = n == MX_BLOCK ? _mm256_loadu_si256((const __m256i *)(q + c))
                                      : _mm256_maskz_loadu_epi8((__mmask32)lanes32(n), q + c);
            if (code > f->limit || has_special32(v, f)) {
                mxi_dequant_run_ref(job, o + c, &s[c / MX_BLOCK], 0, n);
                continue;
            }
            __m512 k = _mm512_castsi512_ps(_mm512_set1_epi32((code + f->adj) << 23));
            put16(job, o + c, _mm512_mul_ps(fake16(_mm256_castsi256_si128(v), f), k), n < 16 ? n : 16);
            if (n > 16) put16(job, o + c + 16, _mm512_mul_ps(fake16(_mm256_extracti128_si256(v, 1), f), k), n - 16);
        }
    }
}

enum { PANEL = 4096 };   // columns whose K vectors are built once per 32-row strip (16 KB)

/* Rows [r0, r1) (r0 a multiple of 32), columns [c_from, cols). */
static void dequant_colwise(const mxi_dequant_job *job, int64_t r0, int64_t r1, int64_t c_from, const fmt_consts *f) {
    const mxi_mx_plane *p = job->p;
    int64_t cols = p->cols;
    float kbuf[PANEL] __attribute__((aligned(64)));   // (PANEL) K of each column of the panel
    uint8_t bad[PANEL / 16];   // group of 16 columns with a scale above the limit (or NaN)
    for (int64_t rs = r0; rs < r1; rs += MX_BLOCK) {
        int64_t re = rs + MX_BLOCK < r1 ? rs + MX_BLOCK : r1;
        const uint8_t *s = p->scales + (rs / MX_BLOCK) * cols;   // (cols) this strip's scales
        for (int64_t c0 = c_from; c0 < cols; c0 += PANEL) {
            int64_t width = cols - c0 < PANEL ? cols - c0 : PANEL, groups = (width + 15) / 16;
            for (int64_t g = 0; g < groups; g++) {   // the last group may be partial: masked
                int64_t n = width - 16 * g < 16 ? width - 16 * g : 16;
                __m128i sb = n == 16 ? _mm_loadu_si128((const __m128i *)(s + c0 + 16 * g))
                                     : _mm_maskz_loadu_epi8((__mmask16)lanes32(n), s + c0 + 16 * g);
                __m512i sc = _mm512_cvtepu8_epi32(sb);
                bad[g] = _mm512_cmpgt_epi32_mask(sc, _mm512_set1_epi32(f->limit)) != 0;
                __m512i kb = _mm512_slli_epi32(_mm512_add_epi32(sc, _mm512_set1_epi32(f->adj)), 23);
                _mm512_store_si512(kbuf + 16 * g, kb);
            }
            for (int64_t r = rs; r < re; r++) {
                const uint8_t *q = p->q + r * cols + c0;
                int64_t o = r * cols + c0;
                for (int64_t g = 0; g < groups; g++) {
                    int64_t n = width - 16 * g < 16 ? width - 16 * g : 16;
                    __m128i v = n == 16 ? _mm_loadu_si128((const __m128i *)(q + 16 * g))
                                        : _mm_maskz_loadu_epi8((__mmask16)lanes32(n), q + 16 * g);
                    if (bad[g] || has_special16(v, f)) {
                        mxi_dequant_run_ref(job, o + 16 * g, s + c0 + 16 * g, 1, n);
                        continue;
                    }
                    put16(job, o + 16 * g, _mm512_mul_ps(fake16(v, f), _mm512_load_ps(kbuf + 16 * g)), n);
                }
            }
        }
    }
}

/* AVX512_VBMI (byte permutes), probed once: the bf16 dequantizers below and lut16 use it
 * where the CPU has it. The SIMDe build runs those paths (SIMDe emulates the permutes). */
#ifndef MXI_AVX512_SIMDE
#include <cpuid.h>
#include <pthread.h>
#define LUT_VBMI __attribute__((target("avx512vbmi")))
static pthread_once_t vbmi_once = PTHREAD_ONCE_INIT;
static int vbmi_cpu;

static void probe_vbmi(void) {
    unsigned a, b, c, d;
    vbmi_cpu = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (c >> 1 & 1);   // CPUID.(7,0):ECX[1] AVX512_VBMI
}
static int have_vbmi(void) {
    pthread_once(&vbmi_once, probe_vbmi);
    return vbmi_cpu;
}
#else
#define LUT_VBMI
static int have_vbmi(void) { return 1; }
#endif

/* ---- bf16 output by byte permutes (AVX512_VBMI) ----
 * value(c) is exact in bf16, and so is value(c) * 2^k while it stays a normal bf16: its
 * exponent field plus k. So, 64 codes at a time: vpermi2b looks each code's magnitude up in
 * the 128-entry tables of its bf16 bytes (mxi_code_values.lo / hi; the permute reads 7 index
 * bits), bit 7 of the code is the sign, and k << 7 is added to the words of the nonzero
 * values. Blocks whose scale could take a value out of bf16's normal range (outside
 * [lo16, hi16]) or holding a NaN or infinity code go through the reference per element;
 * the columns past the last multiple of 64 go the fp32 way above. */

typedef struct { __m512i lo0, lo1, hi0, hi1; } byte_tables;

static LUT_VBMI byte_tables tables_of(const mxi_code_values *v) {
    return (byte_tables){_mm512_loadu_si512(v->lo), _mm512_loadu_si512(v->lo + 64), _mm512_loadu_si512(v->hi),
                         _mm512_loadu_si512(v->hi + 64)};
}

/* The bf16 values of 64 codes to y, k0 (k1) added to the exponents of the lanes of add among
 * the first (last) 32: a scale's exponent << 7 in each 16-bit lane. The code's sign goes to
 * the lanes of signed (all but NaN codes: their NaN is the canonical one). */
static LUT_VBMI inline void bf16_64(uint16_t *y, __m512i idx, const byte_tables *t, __m512i k0, __m512i k1,
                                    __mmask64 add, __mmask64 signed_) {
    __m512i bl = _mm512_permutex2var_epi8(t->lo0, idx, t->lo1);
    __m512i bh = _mm512_permutex2var_epi8(t->hi0, idx, t->hi1);
    bh = _mm512_or_si512(bh, _mm512_maskz_mov_epi8(signed_, _mm512_and_si512(idx, _mm512_set1_epi8((char)0x80))));
    for (int half = 0; half < 2; half++) {
        __m256i l = half ? _mm512_extracti64x4_epi64(bl, 1) : _mm512_castsi512_si256(bl);
        __m256i h = half ? _mm512_extracti64x4_epi64(bh, 1) : _mm512_castsi512_si256(bh);
        __m512i w = _mm512_or_si512(_mm512_cvtepu8_epi16(l), _mm512_slli_epi16(_mm512_cvtepu8_epi16(h), 8));
        w = _mm512_mask_add_epi16(w, (__mmask32)(add >> (32 * half)), w, half ? k1 : k0);
        _mm512_storeu_si512(y + 32 * half, w);
    }
}

static LUT_VBMI inline __mmask64 nonzero64(__m512i idx) { return _mm512_test_epi8_mask(idx, _mm512_set1_epi8(0x7F)); }

static inline bool in16(int s, const fmt_consts *f) { return s >= f->lo16 && s <= f->hi16; }
static inline __m512i k16(int s) { return _mm512_set1_epi16((short)((s - 127) * 128)); }

static LUT_VBMI void dequant_rowwise16(const mxi_dequant_job *job, int64_t r0, int64_t r1, const fmt_consts *f) {
    const mxi_mx_plane *p = job->p;
    int64_t cols = p->cols, cb = (cols + MX_BLOCK - 1) / MX_BLOCK, full = cols / 64 * 64;
    byte_tables t = tables_of(job->values);
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *q = p->q + r * cols, *s = p->scales + r * cb;
        int64_t o = r * cols;
        for (int64_t c = 0; c < full; c += 64) {
            int s0 = s[c / MX_BLOCK], s1 = s[c / MX_BLOCK + 1];
            __m512i idx = _mm512_loadu_si512(q + c);
            if (!in16(s0, f) || !in16(s1, f) || has_special64(idx, f)) {
                mxi_dequant_run_ref(job, o + c, &s[c / MX_BLOCK], 0, MX_BLOCK);
                mxi_dequant_run_ref(job, o + c + MX_BLOCK, &s[c / MX_BLOCK + 1], 0, MX_BLOCK);
                continue;
            }
            bf16_64(job->y16 + o + c, idx, &t, k16(s0), k16(s1), nonzero64(idx), ~0ull);
        }
    }
    if (full < cols) dequant_rowwise(job, r0, r1, full, f);
}

static LUT_VBMI void dequant_colwise16(const mxi_dequant_job *job, int64_t r0, int64_t r1, const fmt_consts *f) {
    const mxi_mx_plane *p = job->p;
    int64_t cols = p->cols, full = cols / 64 * 64;
    byte_tables t = tables_of(job->values);
    int16_t kw[PANEL] __attribute__((aligned(64)));   // (PANEL) (s - 127) << 7 of each column of the panel
    bool ok[PANEL / 64];                               // every scale of the group of 64 columns in [lo16, hi16]
    for (int64_t rs = r0; rs < r1; rs += MX_BLOCK) {
        int64_t re = rs + MX_BLOCK < r1 ? rs + MX_BLOCK : r1;
        const uint8_t *s = p->scales + (rs / MX_BLOCK) * cols;   // (cols) this strip's scales
        for (int64_t c0 = 0; c0 < full; c0 += PANEL) {
            int64_t groups = (full - c0 < PANEL ? full - c0 : PANEL) / 64;
            for (int64_t g = 0; g < groups; g++) {
                __m512i sc = _mm512_loadu_si512(s + c0 + 64 * g);
                ok[g] = !_mm512_cmplt_epu8_mask(sc, _mm512_set1_epi8((char)f->lo16)) &&
                        !_mm512_cmpgt_epu8_mask(sc, _mm512_set1_epi8((char)f->hi16));
                for (int half = 0; half < 2; half++) {
                    __m256i b = half ? _mm512_extracti64x4_epi64(sc, 1) : _mm512_castsi512_si256(sc);
                    __m512i k = _mm512_slli_epi16(_mm512_sub_epi16(_mm512_cvtepu8_epi16(b), _mm512_set1_epi16(127)), 7);
                    _mm512_store_si512(kw + 64 * g + 32 * half, k);
                }
            }
            for (int64_t r = rs; r < re; r++) {
                const uint8_t *q = p->q + r * cols + c0;
                int64_t o = r * cols + c0;
                for (int64_t g = 0; g < groups; g++) {
                    __m512i idx = _mm512_loadu_si512(q + 64 * g);
                    if (!ok[g] || has_special64(idx, f)) {
                        mxi_dequant_run_ref(job, o + 64 * g, s + c0 + 64 * g, 1, 64);
                        continue;
                    }
                    bf16_64(job->y16 + o + 64 * g, idx, &t, _mm512_load_si512(kw + 64 * g),
                            _mm512_load_si512(kw + 64 * g + 32), nonzero64(idx), ~0ull);
                }
            }
        }
    }
    if (full < cols) dequant_colwise(job, r0, r1, full, f);
}

static void avx512_dequant_rows(const mxi_dequant_job *job, int64_t r0, int64_t r1) {
    const fmt_consts *f = job->p->elem == MX_E5M2 ? &E5M2_K : &E4M3_K;
    bool permute = job->y16 && have_vbmi();
    if (job->p->axis == MX_ROWWISE) {
        if (permute) dequant_rowwise16(job, r0, r1, f);
        else dequant_rowwise(job, r0, r1, 0, f);
    } else {
        if (permute) dequant_colwise16(job, r0, r1, f);
        else dequant_colwise(job, r0, r1, 0, f);
    }
}

/* pow2_rows16 (ops_kernels.h) by the byte permutes; the reference where the CPU lacks VBMI.
 * The exponent goes to the lanes whose magnitude code is neither 0 nor NaN / infinity. */
typedef struct {
    byte_tables t;
    __m512i below, nan;   // special - 1 and the NaN magnitude code, in every byte
} pow2_consts;

/* 64 codes of q to y, the exponents k0 and k1 (<< 7) added as bf16_64 adds them. */
static LUT_VBMI inline void pow2_64(uint16_t *y, const uint8_t *q, __m512i k0, __m512i k1, const pow2_consts *pc) {
    __m512i idx = _mm512_loadu_si512(q);
    __m512i mag = _mm512_and_si512(idx, _mm512_set1_epi8(0x7F));
    __mmask64 add = _mm512_cmplt_epu8_mask(_mm512_sub_epi8(mag, _mm512_set1_epi8(1)), pc->below);   // 1 <= mag < special
    bf16_64(y, idx, &pc->t, k0, k1, add, _mm512_cmplt_epu8_mask(mag, pc->nan));
}

/* pow2_64 of the first n codes: fewer than 64 through copies (zero codes past n: nothing
 * added to them). */
static LUT_VBMI inline void pow2_n(uint16_t *y, const uint8_t *q, int64_t n, __m512i k0, __m512i k1,
                                   const pow2_consts *pc) {
    if (n >= 64) {
        pow2_64(y, q, k0, k1, pc);
        return;
    }
    uint8_t qt[64] = {0};
    uint16_t yt[64];
    memcpy(qt, q, (size_t)n);
    pow2_64(yt, qt, k0, k1, pc);
    memcpy(y, yt, (size_t)n * sizeof *yt);
}

/* The exponents e[0, n) (<< 7) of 64 lanes as two vectors of 32 (zeros past n). */
static LUT_VBMI inline void exps_64(__m512i *k0, __m512i *k1, const int16_t *e, int64_t n) {
    int16_t et[64] = {0};
    if (n < 64) memcpy(et, e, (size_t)n * sizeof *et), e = et;
    *k0 = _mm512_slli_epi16(_mm512_loadu_si512(e), 7);
    *k1 = _mm512_slli_epi16(_mm512_loadu_si512(e + 32), 7);
}

/* A run of n codes whose exponents are e[i / width] (width 1 or a multiple of 64). */
static LUT_VBMI void pow2_run(uint16_t *y, const uint8_t *q, int64_t n, const int16_t *e, int64_t width,
                              const pow2_consts *pc) {
    __m512i k0 = _mm512_setzero_si512(), k1 = k0;
    for (int64_t i = 0, next = 0; i < n; i += 64) {   // next: where the next block (of width > 1) starts
        if (width == 1) {
            exps_64(&k0, &k1, e + i, n - i);
        } else if (i == next) {
            k0 = k1 = _mm512_set1_epi16((short)(*e++ * 128));
            next += width;
        }
        pow2_n(y + i, q + i, n - i, k0, k1, pc);
    }
}

/* Rows as long runs where the blocks allow: all rows at once when each row is one block a
 * multiple of 64 wide (an exponent per row); rows of at most 64 one vector each, with their
 * block's exponent or the columns'; a band of rows when a block spans whole rows (one
 * exponent); else row by row. */
static LUT_VBMI void pow2_rows16_vbmi(uint16_t *y, const uint8_t *q, int64_t rows, int64_t cols, const int16_t *e,
                                      int64_t brows, int64_t bcols, const mxi_code_values *v) {
    pow2_consts pc = {.t = tables_of(v), .below = _mm512_set1_epi8((char)(v->special - 1)),
                      .nan = _mm512_set1_epi8((char)v->nan)};
    int64_t nbc = (cols + bcols - 1) / bcols;
    if (nbc == 1 && brows == 1 && cols % 64 == 0) {
        pow2_run(y, q, rows * cols, e, cols, &pc);
        return;
    }
    if (cols <= 64 && (nbc == 1 || bcols == 1)) {   // blk: the rows' block of exponents (no division a row)
        __m512i k0 = _mm512_setzero_si512(), k1 = k0;
        const int16_t *blk = e;
        int64_t r = 0, left = brows;   // rows left in blk's block
        if (cols == 32 && (brows >= rows || (nbc == 1 && brows == 1))) {   // two rows a vector (a head's width)
            bool per_row = brows < rows;   // an exponent a row; else the columns' or one for all
            if (nbc > 1) exps_64(&k0, &k1, e, 32), k1 = k0;
            else if (!per_row) k0 = k1 = _mm512_set1_epi16((short)(e[0] * 128));
            for (; r + 2 <= rows; r += 2) {
                if (per_row) k0 = _mm512_set1_epi16((short)(e[r] * 128)), k1 = _mm512_set1_epi16((short)(e[r + 1] * 128));
                pow2_64(y + r * 32, q + r * 32, k0, k1, &pc);
            }
            blk = e + (per_row ? r : 0), left = per_row ? 1 : brows - r;
        }
        for (bool load = true; r < rows; r++) {
            if (load && nbc == 1) k0 = k1 = _mm512_set1_epi16((short)(blk[0] * 128));
            else if (load) exps_64(&k0, &k1, blk, cols);
            pow2_n(y + r * cols, q + r * cols, cols, k0, k1, &pc);
            load = --left == 0;
            if (load) blk += nbc, left = brows;
        }
        return;
    }
    if (nbc == 1 && bcols > 1) {
        for (int64_t r0 = 0, b = 0; r0 < rows; r0 += brows, b++) {
            int64_t n = (r0 + brows < rows ? brows : rows - r0) * cols;
            pow2_run(y + r0 * cols, q + r0 * cols, n, e + b, (n + 63) / 64 * 64, &pc);   // one exponent for all n
        }
        return;
    }
    for (int64_t r = 0; r < rows; r++) pow2_run(y + r * cols, q + r * cols, cols, e + (r / brows) * nbc, bcols, &pc);
}

static void avx512_pow2_rows16(uint16_t *y, const uint8_t *q, int64_t rows, int64_t cols, const int16_t *e,
                               int64_t brows, int64_t bcols, const mxi_code_values *v) {
    if (have_vbmi()) pow2_rows16_vbmi(y, q, rows, cols, e, brows, bcols, v);
    else mxi_ops_kernels_ref.pow2_rows16(y, q, rows, cols, e, brows, bcols, v);
}

static void avx512_widen_bf16(float *y, const uint16_t *x, int64_t ld, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        const uint16_t *xr = x + r * ld;
        float *yr = y + r * cols;
        for (int64_t c = 0; c < cols; c += 16) {
            int64_t n = cols - c < 16 ? cols - c : 16;
            __mmask16 m = (__mmask16)lanes32(n);
            __m256i h = n == 16 ? _mm256_loadu_si256((const __m256i *)(xr + c)) : _mm256_maskz_loadu_epi16(m, xr + c);
            store16(yr + c, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)), n);
        }
    }
}

/* Table lookups by gathers, sixteen codes at a time; the tail through the reference loop. */
static void avx512_lut32(uint32_t *y, const uint8_t *q, int64_t n, const uint32_t table[256]) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i idx = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(q + i)));
        _mm512_storeu_si512(y + i, _mm512_i32gather_epi32(idx, (const int *)table, 4));
    }
    for (; i < n; i++) y[i] = table[q[i]];
}

/* lut16 with AVX512_VBMI: the table's low and high bytes as four 64-byte vectors each;
 * vpermi2b looks 64 codes up in two 128-entry halves, bit 7 of the code picks the half,
 * and the two byte planes widen and join into words. Where the CPU lacks VBMI, gathers.
 * The codes of q[0, n) in blocks of 64; returns how many it did. */
static LUT_VBMI int64_t lut16_vbmi(uint16_t *y, const uint8_t *q, int64_t n, const uint32_t table[256]) {
    uint8_t lo[256], hi[256];
    for (int c = 0; c < 256; c += 16) {   // the two byte planes, sixteen entries a narrowing
        __m512i w = _mm512_loadu_si512(table + c);
        _mm_storeu_si128((__m128i *)(lo + c), _mm512_cvtepi32_epi8(w));
        _mm_storeu_si128((__m128i *)(hi + c), _mm512_cvtepi32_epi8(_mm512_srli_epi32(w, 8)));
    }
    __m512i l0 = _mm512_loadu_si512(lo), l1 = _mm512_loadu_si512(lo + 64), l2 = _mm512_loadu_si512(lo + 128),
            l3 = _mm512_loadu_si512(lo + 192), h0 = _mm512_loadu_si512(hi), h1 = _mm512_loadu_si512(hi + 64),
            h2 = _mm512_loadu_si512(hi + 128), h3 = _mm512_loadu_si512(hi + 192);
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __m512i idx = _mm512_loadu_si512(q + i);
        __mmask64 upper = _mm512_movepi8_mask(idx);   // codes 128..255
        __m512i bl = _mm512_mask_blend_epi8(upper, _mm512_permutex2var_epi8(l0, idx, l1),
                                            _mm512_permutex2var_epi8(l2, idx, l3));
        __m512i bh = _mm512_mask_blend_epi8(upper, _mm512_permutex2var_epi8(h0, idx, h1),
                                            _mm512_permutex2var_epi8(h2, idx, h3));
        for (int half = 0; half < 2; half++) {
            __m256i l = half ? _mm512_extracti64x4_epi64(bl, 1) : _mm512_castsi512_si256(bl);
            __m256i h = half ? _mm512_extracti64x4_epi64(bh, 1) : _mm512_castsi512_si256(bh);
            __m512i w = _mm512_or_si512(_mm512_cvtepu8_epi16(l), _mm512_slli_epi16(_mm512_cvtepu8_epi16(h), 8));
            _mm512_storeu_si512(y + i + 32 * half, w);
        }
    }
    return i;
}

static void avx512_lut16(uint16_t *y, const uint8_t *q, int64_t n, const uint32_t table[256]) {
    int64_t i = n >= 64 && have_vbmi() ? lut16_vbmi(y, q, n, table) : 0;
    for (; i + 16 <= n; i += 16) {
        __m512i idx = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(q + i)));
        _mm256_storeu_si256((__m256i *)(y + i), _mm512_cvtepi32_epi16(_mm512_i32gather_epi32(idx, (const int *)table, 4)));
    }
    for (; i < n; i++) y[i] = (uint16_t)table[q[i]];
}

static inline __m512 load16(const float *p, __mmask16 m) { return _mm512_castsi512_ps(_mm512_maskz_loadu_epi32(m, p)); }

static void avx512_scale_row(float *c, const float *acc, int64_t n, float sa, const float *sb, float s,
                             mxi_row_write w) {
    __m512 va = _mm512_set1_ps(sa), vs = _mm512_set1_ps(sa * s);
    for (int64_t j = 0; j < n; j += 16) {
        __mmask16 m = n - j >= 16 ? 0xFFFF : (__mmask16)((1u << (n - j)) - 1);
        __m512 f = sb ? _mm512_mul_ps(va, load16(sb + j, m)) : vs;
        __m512 t = _mm512_mul_ps(f, load16(acc + j, m));
        if (w == MXI_ROW_ADD) t = _mm512_add_ps(load16(c + j, m), t);
        _mm512_mask_storeu_ps(c + j, m, t);
    }
}

const mxi_ops_kernels mxi_ops_kernels_avx512 = {.name = "avx512", .dequant_rows = avx512_dequant_rows,
                                                .widen_bf16 = avx512_widen_bf16, .lut32 = avx512_lut32,
                                                .lut16 = avx512_lut16, .pow2_rows16 = avx512_pow2_rows16,
                                                .scale_row = avx512_scale_row};
