/* AVX-512 kernels of the network's non-GEMM layers (see ops/nn_kernels.h; F, BW, DQ, VL):
 * the AVX2 table's arithmetic (ops/x86/nn_avx2.c) on 16 lanes, with the last, partial
 * vector of a row or array read and written through mask registers instead of scalar
 * code. The bf16 conversions, RoPE, add, scale and AdamW do the reference's operations in
 * its order on every lane, so they are bit-identical to it; the sums (softmax, RMSNorm,
 * sum of squares, cross-entropy) are taken in another order and the exp is a polynomial,
 * as in the AVX2 table. NaN and infinities propagate as in the reference (ops/nn_kernels.h):
 * the maxima skip NaN and the exp passes it on.
 *
 * bf16 rounding does not use AVX512_BF16's vcvtneps2bf16: that instruction treats input
 * denormals as zero (Intel SDM), where the reference rounds them (0x00008001 -> 0x0001).
 * Only attention's P and dS operands take it, on a CPU that has it, where vdpbf16ps, which
 * treats denormals as zero too, is their only reader.
 *
 * Built on SIMDe instead of AVX-512 with MXI_AVX512_SIMDE (see numerics/x86/simd512.h). */
#include <math.h>
#include <pthread.h>
#include <string.h>
#ifndef MXI_AVX512_SIMDE
#include <cpuid.h>
#endif

#include "numerics/x86/simd512.h"

#include "core/bits.h"
#include "ops/nn_kernels.h"
#include "ops/x86/bf16_avx512.h"

/* Mask of the first n lanes (all 16 for n >= 16). */
static inline __mmask16 lanes16(int64_t n) { return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1); }

/* Lanes of k from p, zero elsewhere; only those elements are read. */
static inline __m512 loadm(const float *p, __mmask16 k) { return _mm512_castsi512_ps(_mm512_maskz_loadu_epi32(k, p)); }

/* Up to 16 floats at p (n >= 1 of them), zero past n; nothing past p + n is touched. */
static inline __m512 load_n(const float *p, int64_t n) { return n >= 16 ? _mm512_loadu_ps(p) : loadm(p, lanes16(n)); }

static inline void store_n(float *p, __m512 v, int64_t n) {
    if (n >= 16) _mm512_storeu_ps(p, v);
    else _mm512_mask_storeu_ps(p, lanes16(n), v);
}

static inline void zero_fill(float *p, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) store_n(p + i, _mm512_setzero_ps(), n - i);
}

/* e^x for x <= 0, exp256_neg of the AVX2 table on 16 lanes: x = n ln2 + r, |r| <= ln2/2,
 * Cephes' degree-6 polynomial for e^r, then 2^n through the exponent field; 0 below -87.3
 * and for -Inf, NaN for NaN.
 * n is rounded by adding 1.5 * 2^23 (|x log2 e| < 2^22, so the sum rounds to the nearest
 * integer, ties to even, as vroundps does), and the low bits of that sum plus 127, moved
 * to the exponent field, are 2^n: the same n and 2^n as the AVX2 kernel's
 * vroundps/vcvtps2dq (the latter has no SIMDe version for 512 bits). */
static inline __m512 exp512_neg(__m512 x) {
    const __m512 lo = _mm512_set1_ps(-87.3f), magic = _mm512_set1_ps(12582912.0f);
    __mmask16 under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
    x = _mm512_max_ps(lo, x);   // vmaxps returns its second operand when one is NaN: a NaN stays NaN
    __m512 t = _mm512_add_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), magic);
    __m512 n = _mm512_sub_ps(t, magic);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 y = _mm512_set1_ps(1.9875691500e-4f);
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_castps_si512(t), _mm512_set1_epi32(127)), 23);
    y = _mm512_mul_ps(y, _mm512_castsi512_ps(e));
    return _mm512_maskz_mov_ps((__mmask16)~under, y);
}

/* 2^u, exp2_256 of the AVX2 table on 16 lanes (attention's exps, see mxi_att_exp2_scale)
 * but for the last step: y 2^n by vscalefps, which makes the denormals of u in (-150,
 * -126) where exp2_256 makes 0, and 0 below; -Inf (taken as -151) gives 0, NaN NaN. */
static inline __m512 exp2_512(__m512 u) {
    u = _mm512_max_ps(_mm512_set1_ps(-151.0f), u);   // vmaxps returns its second operand when one is NaN
    __m512 n = _mm512_roundscale_ps(u, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(u, n);
    __m512 y = _mm512_set1_ps(mxi_exp2_poly[0]);
    for (int i = 1; i < 6; i++) y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(mxi_exp2_poly[i]));
    return _mm512_scalef_ps(y, n);
}

/* The upper 8 lanes (vextractf64x4: F, where vextractf32x8 needs DQ and has no SIMDe version). */
static inline __m256 upper8(__m512 v) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)); }

static inline float hsum16(__m512 v) {
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), upper8(v));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float hmax16(__m512 v) {
    __m256 h = _mm256_max_ps(_mm512_castps512_ps256(v), upper8(v));
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* ---- flash attention's pieces ----
 * att_gemm: register tiles of MR rows x NV vectors of 16 columns (at most 4 x 4: 16
 * accumulators), the last vector masked; B's vectors loaded once per k for the MR rows.
 * Each element is c + a0 b0 + a1 b1 + ... by fused multiply-adds in k order, whatever tile
 * it falls in. */
/* The loops over a tile's rows and vectors unrolled, so that its accumulators stay in registers. */
#define UNROLL4 _Pragma("GCC unroll 4")

/* The mask of vector v of a tile's nv (all lanes but in the last). */
static inline __mmask16 vmask(int v, int nv, __mmask16 last) { return v == nv - 1 ? last : (__mmask16)0xFFFF; }

/* A tile's accumulator at the start: c's lanes (add) or 0. */
static inline __m512 acc_init(const float *c, int add, __mmask16 k) { return add ? loadm(c, k) : _mm512_setzero_ps(); }

static inline __attribute__((always_inline)) void gemm_tile16(float *c, int64_t ldc, const float *a, int64_t lda,
                                                              int64_t acs, const float *b, int64_t ldb, int64_t k, int mr,
                                                              int nv, int add, __mmask16 last) {
    __m512 acc[4][4];
    UNROLL4 for (int i = 0; i < mr; i++)
        UNROLL4 for (int v = 0; v < nv; v++) acc[i][v] = acc_init(c + i * ldc + 16 * v, add, vmask(v, nv, last));
    for (int64_t x = 0; x < k; x++) {
        __m512 bv[4];
        UNROLL4 for (int v = 0; v < nv; v++) bv[v] = loadm(b + x * ldb + 16 * v, vmask(v, nv, last));
        UNROLL4 for (int i = 0; i < mr; i++) {
            __m512 av = _mm512_set1_ps(a[i * lda + x * acs]);
            UNROLL4 for (int v = 0; v < nv; v++) acc[i][v] = _mm512_fmadd_ps(av, bv[v], acc[i][v]);
        }
    }
    UNROLL4 for (int i = 0; i < mr; i++)
        UNROLL4 for (int v = 0; v < nv; v++)
            _mm512_mask_storeu_ps(c + i * ldc + 16 * v, vmask(v, nv, last), acc[i][v]);
}

#define GEMM_TILES16(MR) do { \
    switch (nv) { \
    case 1: gemm_tile16(cc, ldc, aa, lda, acs, bb, ldb, k, MR, 1, add, last); break; \
    case 2: gemm_tile16(cc, ldc, aa, lda, acs, bb, ldb, k, MR, 2, add, last); break; \
    case 3: gemm_tile16(cc, ldc, aa, lda, acs, bb, ldb, k, MR, 3, add, last); break; \
    default: gemm_tile16(cc, ldc, aa, lda, acs, bb, ldb, k, MR, 4, add, last); break; \
    } \
} while (0)

static void avx512_att_gemm(float *c, int64_t ldc, const float *a, int64_t lda, int64_t acs, const float *b,
                            int64_t ldb, int64_t m, int64_t n, int64_t k, mxi_att_write write) {
    int add = write == MXI_ATT_ADD;
    for (int64_t j0 = 0; j0 < n; j0 += 64) {
        int64_t w = n - j0 < 64 ? n - j0 : 64;
        int nv = (int)((w + 15) / 16);
        __mmask16 last = lanes16(w - 16 * (nv - 1));
        const float *bb = b + j0;
        int64_t i = 0;
        for (; i + 4 <= m; i += 4) {
            float *cc = c + i * ldc + j0;
            const float *aa = a + i * lda;
            GEMM_TILES16(4);
        }
        for (; i < m; i++) {
            float *cc = c + i * ldc + j0;
            const float *aa = a + i * lda;
            GEMM_TILES16(1);
        }
    }
}

/* att_gemm_bf16: the same register tiles on pairs of bf16; vdpbf16ps where the CPU has
 * AVX512_BF16, else two fused multiply-adds per pair on the widened halves (the same
 * numbers: the products are exact), as also in the SIMDe build. */
#ifndef MXI_AVX512_SIMDE
#define BF16_NATIVE 1
static pthread_once_t bf16_once = PTHREAD_ONCE_INIT;
static int bf16_cpu;

static void probe_bf16(void) {
    unsigned a, b, c, d;
    bf16_cpu = __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a >> 5 & 1);   // CPUID.(7,1):EAX[5] AVX512_BF16
}

static inline __attribute__((always_inline, target("avx512bf16"))) void
gemm_tile_dp(float *c, int64_t ldc, const uint32_t *a, int64_t lda, int64_t acs, const uint32_t *b, int64_t ldb,
             int64_t kp, int mr, int nv, int add, __mmask16 last) {
    __m512 acc[4][4];
    UNROLL4 for (int i = 0; i < mr; i++)
        UNROLL4 for (int v = 0; v < nv; v++) acc[i][v] = acc_init(c + i * ldc + 16 * v, add, vmask(v, nv, last));
    for (int64_t p = 0; p < kp; p++) {
        __m512i bv[4];
        UNROLL4 for (int v = 0; v < nv; v++)
            bv[v] = _mm512_maskz_loadu_epi32(vmask(v, nv, last), b + p * ldb + 16 * v);
        UNROLL4 for (int i = 0; i < mr; i++) {
            __m512i av = _mm512_set1_epi32((int)a[i * lda + p * acs]);
            UNROLL4 for (int v = 0; v < nv; v++) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], (__m512bh)av, (__m512bh)bv[v]);
        }
    }
    UNROLL4 for (int i = 0; i < mr; i++)
        UNROLL4 for (int v = 0; v < nv; v++)
            _mm512_mask_storeu_ps(c + i * ldc + 16 * v, vmask(v, nv, last), acc[i][v]);
}
#else
#define BF16_NATIVE 0
#endif

static inline __attribute__((always_inline)) void gemm_tile_fma2(float *c, int64_t ldc, const uint32_t *a,
                                                                 int64_t lda, int64_t acs, const uint32_t *b, int64_t ldb,
                                                                 int64_t kp, int mr, int nv, int add, __mmask16 last) {
    const __m512i hi = _mm512_set1_epi32((int)0xFFFF0000u);
    __m512 acc[4][4];
    UNROLL4 for (int i = 0; i < mr; i++)
        UNROLL4 for (int v = 0; v < nv; v++) acc[i][v] = acc_init(c + i * ldc + 16 * v, add, vmask(v, nv, last));
    for (int64_t p = 0; p < kp; p++) {
        __m512 bh[4], bl[4];
        UNROLL4 for (int v = 0; v < nv; v++) {
            __m512i x = _mm512_maskz_loadu_epi32(vmask(v, nv, last), b + p * ldb + 16 * v);
            bh[v] = _mm512_castsi512_ps(_mm512_and_si512(x, hi));
            bl[v] = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
        }
        UNROLL4 for (int i = 0; i < mr; i++) {
            uint32_t x = a[i * lda + p * acs];
            __m512 ah = _mm512_set1_ps(mxi_bits_f32(x & 0xFFFF0000u)), al = _mm512_set1_ps(mxi_bits_f32(x << 16));
            UNROLL4 for (int v = 0; v < nv; v++) {
                acc[i][v] = _mm512_fmadd_ps(ah, bh[v], acc[i][v]);
                acc[i][v] = _mm512_fmadd_ps(al, bl[v], acc[i][v]);
            }
        }
    }
    UNROLL4 for (int i = 0; i < mr; i++)
        UNROLL4 for (int v = 0; v < nv; v++)
            _mm512_mask_storeu_ps(c + i * ldc + 16 * v, vmask(v, nv, last), acc[i][v]);
}

/* One register tile of a kernel (TILE: gemm_tile_dp or gemm_tile_fma2), its last vector's
 * mask LAST: a constant all-ones mask when the tile is 64 columns wide, so that its loads
 * and stores are plain ones (masked loads and stores cost more). */
#define GEMM_BF16_TILE(TILE, LAST) do { \
    switch (nv * 8 + mr) { \
    case 12: TILE(cc, ldc, aa, lda, acs, bb, ldb, kp, 4, 1, add, LAST); break; \
    case 20: TILE(cc, ldc, aa, lda, acs, bb, ldb, kp, 4, 2, add, LAST); break; \
    case 28: TILE(cc, ldc, aa, lda, acs, bb, ldb, kp, 4, 3, add, LAST); break; \
    case 36: TILE(cc, ldc, aa, lda, acs, bb, ldb, kp, 4, 4, add, LAST); break; \
    case 9: TILE(cc, ldc, aa, lda, acs, bb, ldb, kp, 1, 1, add, LAST); break; \
    case 17: TILE(cc, ldc, aa, lda, acs, bb, ldb, kp, 1, 2, add, LAST); break; \
    case 25: TILE(cc, ldc, aa, lda, acs, bb, ldb, kp, 1, 3, add, LAST); break; \
    default: TILE(cc, ldc, aa, lda, acs, bb, ldb, kp, 1, 4, add, LAST); break; \
    } \
} while (0)

/* The tiles of one kernel over c (m, n). */
#define GEMM_BF16_WITH(TILE) do { \
    for (int64_t j0 = 0; j0 < n; j0 += 64) { \
        int64_t w = n - j0 < 64 ? n - j0 : 64; \
        int nv = (int)((w + 15) / 16); \
        __mmask16 last = lanes16(w - 16 * (nv - 1)); \
        int64_t i = 0; \
        for (; i < m; i += i + 4 <= m ? 4 : 1) { \
            float *cc = c + i * ldc + j0; \
            const uint32_t *aa = a + i * lda, *bb = b + j0; \
            int mr = i + 4 <= m ? 4 : 1; \
            if (w == 64) GEMM_BF16_TILE(TILE, (__mmask16)0xFFFF); \
            else GEMM_BF16_TILE(TILE, last); \
        } \
    } \
} while (0)

#if BF16_NATIVE
static __attribute__((target("avx512bf16"))) void gemm_bf16_dp(float *c, int64_t ldc, const uint32_t *a, int64_t lda,
                                                               int64_t acs, const uint32_t *b, int64_t ldb, int64_t m,
                                                               int64_t n, int64_t kp, int add) {
    GEMM_BF16_WITH(gemm_tile_dp);
}
#endif

static void avx512_att_gemm_bf16(float *c, int64_t ldc, const uint32_t *a, int64_t lda, int64_t acs, const uint32_t *b,
                                 int64_t ldb, int64_t m, int64_t n, int64_t kp, mxi_att_write write) {
    int add = write == MXI_ATT_ADD;
#if BF16_NATIVE
    pthread_once(&bf16_once, probe_bf16);
    if (bf16_cpu) {
        gemm_bf16_dp(c, ldc, a, lda, acs, b, ldb, m, n, kp, add);
        return;
    }
#endif
    GEMM_BF16_WITH(gemm_tile_fma2);
}

/* Columns of row outside [c0, c1) of n become 0. */
static inline void zero_outside16(float *row, int64_t n, int64_t c0, int64_t c1) {
    if (c0 <= 0 && c1 >= n) return;
    zero_fill(row, c0 < n ? c0 : n);
    if (c1 < c0) c1 = c0;
    if (c1 < n) zero_fill(row + c1, n - c1);
}

/* Up to 16 floats (n >= 1 of them) rounded to bf16 at y; nothing past y + n is written. */
static inline void store_bf16_n(uint16_t *y, __m512 x, int64_t n) {
    __m256i h = _mm512_cvtepi32_epi16(_mm512_srli_epi32(mxi_bf16_bits16(x), 16));
    if (n >= 16) _mm256_storeu_si256((__m256i *)y, h);
    else _mm256_mask_storeu_epi16(y, lanes16(n), h);
}

/* Halves of y outside [c0, c1) of n become 0. */
static void zero_outside_halves(uint16_t *y, int64_t n, int64_t c0, int64_t c1) {
    if (c0 <= 0 && c1 >= n) return;
    int64_t a = c0 < n ? c0 : n, b = c1 > c0 ? c1 : c0;
    memset(y, 0, (size_t)a * sizeof *y);
    if (b < n) memset(y + b, 0, (size_t)(n - b) * sizeof *y);
}

/* Per 16 rows: every row's max first, then every row's exps and their sum, then the
 * corrections 2^(rmax - mx) of the 16 in one vector (the same lanes' operations as one
 * row's at a time). A row's exps wait for its max; apart, the maxima wait for nothing and
 * one row's exps overlap the next row's. The exps go to p16 through STORE16. */
#define ONLINE_SOFTMAX_WITH(STORE16) do { \
    const __m512 vc = _mm512_set1_ps(mxi_att_exp2_scale(scale)); \
    for (int64_t r0 = 0; r0 < rows; r0 += 16) { \
        int64_t nr = rows - r0 < 16 ? rows - r0 : 16; \
        float mxs[16], sums[16]; \
        __mmask16 seen = 0; \
        for (int64_t i = 0; i < nr; i++) { \
            int64_t r = r0 + i, lo = c0[r], hi = c1[r]; \
            float *row = s + r * ld; \
            if (p16) zero_outside_halves(p16 + r * ld, n + (n & 1), lo, hi);   /* the exps' bf16 go there */ \
            else zero_outside16(row, n, lo, hi); \
            mxs[i] = rmax[r], sums[i] = 0.0f; \
            if (lo >= hi) continue; \
            seen |= (__mmask16)(1u << i); \
            __m512 vmax = _mm512_set1_ps(rmax[r]); \
            if (lo == 0 && hi == 64) {   /* a whole row of a whole tile: unmasked */ \
                UNROLL4 for (int v = 0; v < 4; v++) \
                    vmax = _mm512_max_ps(_mm512_mul_ps(_mm512_loadu_ps(row + 16 * v), vc), vmax); \
            } else { \
                for (int64_t j = lo; j < hi; j += 16) {   /* skips a NaN, as the reference's `>` */ \
                    __m512 x = _mm512_mul_ps(load_n(row + j, hi - j), vc); \
                    vmax = _mm512_mask_max_ps(vmax, lanes16(hi - j), x, vmax); \
                } \
            } \
            mxs[i] = hmax16(vmax); \
        } \
        for (int64_t i = 0; i < nr; i++) { \
            int64_t r = r0 + i, lo = c0[r], hi = c1[r]; \
            if (!(seen >> i & 1)) continue; \
            float *row = s + r * ld; \
            uint16_t *h = p16 ? p16 + r * ld : NULL; \
            __m512 m = _mm512_set1_ps(mxs[i]); \
            if (lo == 0 && hi == 64 && h) { \
                __m512 e4[4]; \
                UNROLL4 for (int v = 0; v < 4; v++) { \
                    e4[v] = exp2_512(_mm512_sub_ps(_mm512_mul_ps(_mm512_loadu_ps(row + 16 * v), vc), m)); \
                    STORE16(h + 16 * v, e4[v], 16); \
                } \
                __m512 s4 = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(_mm512_add_ps(_mm512_setzero_ps(), e4[0]), \
                                                                      e4[1]), e4[2]), e4[3]); \
                sums[i] = hsum16(s4); \
                continue; \
            } \
            __m512 vsum = _mm512_setzero_ps(); \
            for (int64_t j = lo; j < hi; j += 16) { \
                __mmask16 tm = lanes16(hi - j); \
                __m512 e = exp2_512(_mm512_sub_ps(_mm512_mul_ps(load_n(row + j, hi - j), vc), m)); \
                if (h) STORE16(h + j, e, hi - j); \
                else store_n(row + j, e, hi - j); \
                vsum = _mm512_mask_add_ps(vsum, tm, vsum, e); \
            } \
            sums[i] = hsum16(vsum); \
        } \
        __mmask16 k = lanes16(nr); \
        __m512 old = loadm(rmax + r0, k), mx = loadm(mxs, k); \
        __m512 cr = _mm512_mask_mov_ps(_mm512_set1_ps(1.0f), seen, exp2_512(_mm512_sub_ps(old, mx))); \
        __m512 sum = _mm512_add_ps(_mm512_mul_ps(loadm(rsum + r0, k), cr), loadm(sums, k)); \
        _mm512_mask_storeu_ps(corr + r0, k, cr); \
        _mm512_mask_storeu_ps(rsum + r0, seen & k, sum); \
        _mm512_mask_storeu_ps(rmax + r0, seen & k, mx); \
    } \
} while (0)

static void online_softmax_exact(float *s, int64_t ld, int64_t rows, int64_t n, const int32_t *c0, const int32_t *c1,
                                 float scale, float *rmax, float *rsum, float *corr, uint16_t *p16) {
    ONLINE_SOFTMAX_WITH(store_bf16_n);
}

#if BF16_NATIVE
/* Up to 16 floats (n >= 1) to bf16 at y by vcvtneps2bf16: store_bf16_n's bits but for an
 * fp32 denormal, which becomes 0 (see dscores_store_cvt). */
static inline __attribute__((always_inline, target("avx512bf16"))) void store_bf16_cvt(uint16_t *y, __m512 x,
                                                                                        int64_t n) {
    __m256i h = (__m256i)_mm512_cvtneps_pbh(x);
    if (n >= 16) _mm256_storeu_si256((__m256i *)y, h);
    else _mm256_mask_storeu_epi16(y, lanes16(n), h);
}

static __attribute__((target("avx512bf16"))) void online_softmax_cvt(float *s, int64_t ld, int64_t rows, int64_t n,
                                                                     const int32_t *c0, const int32_t *c1, float scale,
                                                                     float *rmax, float *rsum, float *corr,
                                                                     uint16_t *p16) {
    ONLINE_SOFTMAX_WITH(store_bf16_cvt);
}
#endif

static void avx512_att_online_softmax(float *s, int64_t ld, int64_t rows, int64_t n, const int32_t *c0,
                                      const int32_t *c1, float scale, float *rmax, float *rsum, float *corr,
                                      uint16_t *p16) {
#if BF16_NATIVE
    pthread_once(&bf16_once, probe_bf16);
    if (p16 && bf16_cpu) {
        online_softmax_cvt(s, ld, rows, n, c0, c1, scale, rmax, rsum, corr, p16);
        return;
    }
#endif
    online_softmax_exact(s, ld, rows, n, c0, c1, scale, rmax, rsum, corr, p16);
}

static void avx512_att_probs(float *s, float *d, int64_t ld, int64_t rows, int64_t n, const int32_t *c0,
                             const int32_t *c1, float scale, const float *stats, const float *dsum,
                             mxi_att_probs_mode mode) {
    const __m512 vscale = _mm512_set1_ps(scale), vc = _mm512_set1_ps(mxi_att_exp2_scale(scale));
    for (int64_t r = 0; r < rows; r++) {
        float *row = s + r * ld, *dr = d ? d + r * ld : NULL;
        int64_t lo = c0[r], hi = c1[r];
        int dscores = mode == MXI_ATT_DSCORES;
        __m512 m = _mm512_set1_ps(stats[2 * r]), inv = _mm512_set1_ps(stats[2 * r + 1]);
        __m512 dd = _mm512_set1_ps(dscores ? dsum[r] : 0.0f);
        for (int64_t j = lo; j < hi; j += 16) {
            int64_t left = hi - j;
            __m512 x = _mm512_mul_ps(load_n(row + j, left), vc);
            __m512 p = _mm512_mul_ps(exp2_512(_mm512_sub_ps(x, m)), inv);
            store_n(row + j, p, left);
            if (dscores) {
                __m512 g = _mm512_mul_ps(_mm512_mul_ps(p, _mm512_sub_ps(load_n(dr + j, left), dd)), vscale);
                store_n(dr + j, g, left);
            }
        }
        zero_outside16(row, n, lo, hi);
        if (dscores) zero_outside16(dr, n, lo, hi);
    }
}

/* The lanes of [j, j + 16) in [c0, c1) and before n. */
static inline __mmask16 seen16(int64_t j, int64_t n, int64_t c0, int64_t c1) {
    int64_t lo = c0 - j, hi = (c1 < n ? c1 : n) - j;
    lo = lo < 0 ? 0 : lo > 16 ? 16 : lo;
    hi = hi < lo ? lo : hi > 16 ? 16 : hi;
    return (__mmask16)(lanes16(hi) & ~lanes16(lo));
}

/* One chunk of att_dscores_bf16's outputs, 16 columns of which left before n: P's and dS's
 * pairs vp, vd at pp, pd, and dS's two rows r0, r1 at h0 and h1 (unless NULL). */
static inline __attribute__((always_inline)) void dscores_chunk(uint32_t *pp, uint32_t *pd, uint16_t *h0, uint16_t *h1,
                                                                __m512i vp, __m512i vd, __m256i r0, __m256i r1,
                                                                int64_t left) {
    if (left >= 16) {   // whole vectors unmasked: a masked store costs more
        _mm512_storeu_si512(pp, vp), _mm512_storeu_si512(pd, vd);
        _mm256_storeu_si256((__m256i *)h0, r0);
        if (h1) _mm256_storeu_si256((__m256i *)h1, r1);
    } else {
        __mmask16 k = lanes16(left);
        _mm512_mask_storeu_epi32(pp, k, vp), _mm512_mask_storeu_epi32(pd, k, vd);
        _mm256_mask_storeu_epi16(h0, k, r0);
        if (h1) _mm256_mask_storeu_epi16(h1, k, r1);
    }
}

/* att_dscores_bf16's outputs of rows r and r + 1's P (p0, p1) and dS (e0, e1) in a chunk,
 * with bf16_round's arithmetic. */
static inline __attribute__((always_inline)) void dscores_store_exact(uint32_t *pp, uint32_t *pd, uint16_t *h0,
                                                                      uint16_t *h1, __m512 p0, __m512 p1, __m512 e0,
                                                                      __m512 e1, int64_t left) {
    __m512i b0 = _mm512_srli_epi32(mxi_bf16_bits16(e0), 16), b1 = mxi_bf16_bits16(e1);
    __m512i vp = _mm512_or_si512(_mm512_srli_epi32(mxi_bf16_bits16(p0), 16), mxi_bf16_bits16(p1));
    dscores_chunk(pp, pd, h0, h1, vp, _mm512_or_si512(b0, b1), _mm512_cvtepi32_epi16(b0),
                  _mm512_cvtepi32_epi16(_mm512_srli_epi32(b1, 16)), left);
}

/* Two rows at a time, 16 columns at a time: P and dS of each (att_probs's operations, so
 * its bits) go straight to their bf16 pairs and dS's rows through STORE. */
#define DSCORES_WITH(STORE) do { \
    const __m512 vscale = _mm512_set1_ps(scale), vc = _mm512_set1_ps(mxi_att_exp2_scale(scale)); \
    for (int64_t r = 0; r < rows; r += 2) { \
        int64_t r1 = r + 1 < rows ? r + 1 : r;   /* an odd last row: its pair's high half 0 */ \
        __m512 m0 = _mm512_set1_ps(stats[2 * r]), inv0 = _mm512_set1_ps(stats[2 * r + 1]); \
        __m512 m1 = _mm512_set1_ps(stats[2 * r1]), inv1 = _mm512_set1_ps(stats[2 * r1 + 1]); \
        __m512 dd0 = _mm512_set1_ps(dsum[r]), dd1 = _mm512_set1_ps(dsum[r1]); \
        const float *s0 = s + r * ld, *s1 = s + r1 * ld, *g0 = d + r * ld, *g1 = d + r1 * ld; \
        if (r1 > r && !(n & 15) && c0[r] <= 0 && c0[r1] <= 0 && c1[r] >= n && c1[r1] >= n) { \
            /* both rows see every column: no masks */ \
            for (int64_t j = 0; j < n; j += 16) { \
                __m512 x0 = _mm512_mul_ps(_mm512_loadu_ps(s0 + j), vc); \
                __m512 x1 = _mm512_mul_ps(_mm512_loadu_ps(s1 + j), vc); \
                __m512 p0 = _mm512_mul_ps(exp2_512(_mm512_sub_ps(x0, m0)), inv0); \
                __m512 p1 = _mm512_mul_ps(exp2_512(_mm512_sub_ps(x1, m1)), inv1); \
                __m512 e0 = _mm512_mul_ps(_mm512_mul_ps(p0, _mm512_sub_ps(_mm512_loadu_ps(g0 + j), dd0)), vscale); \
                __m512 e1 = _mm512_mul_ps(_mm512_mul_ps(p1, _mm512_sub_ps(_mm512_loadu_ps(g1 + j), dd1)), vscale); \
                STORE(p2 + r / 2 * ld + j, ds2 + r / 2 * ld + j, ds16 + r * ld + j, ds16 + r1 * ld + j, p0, p1, e0, e1, \
                      16); \
            } \
            continue; \
        } \
        for (int64_t j = 0; j < n; j += 16) { \
            int64_t left = n - j; \
            __mmask16 v0 = seen16(j, n, c0[r], c1[r]), v1 = r1 > r ? seen16(j, n, c0[r1], c1[r1]) : 0; \
            __m512 x0 = _mm512_mul_ps(load_n(s0 + j, left), vc), x1 = _mm512_mul_ps(load_n(s1 + j, left), vc); \
            __m512 p0 = _mm512_maskz_mov_ps(v0, _mm512_mul_ps(exp2_512(_mm512_sub_ps(x0, m0)), inv0)); \
            __m512 p1 = _mm512_maskz_mov_ps(v1, _mm512_mul_ps(exp2_512(_mm512_sub_ps(x1, m1)), inv1)); \
            __m512 e0 = _mm512_mul_ps(_mm512_mul_ps(p0, _mm512_sub_ps(load_n(g0 + j, left), dd0)), vscale); \
            __m512 e1 = _mm512_mul_ps(_mm512_mul_ps(p1, _mm512_sub_ps(load_n(g1 + j, left), dd1)), vscale); \
            STORE(p2 + r / 2 * ld + j, ds2 + r / 2 * ld + j, ds16 + r * ld + j, r1 > r ? ds16 + r1 * ld + j : NULL, \
                  p0, p1, _mm512_maskz_mov_ps(v0, e0), _mm512_maskz_mov_ps(v1, e1), left); \
        } \
        if (n & 1) { \
            ds16[r * ld + n] = 0; \
            if (r1 > r) ds16[r1 * ld + n] = 0; \
        } \
    } \
} while (0)

static void dscores_exact(uint32_t *p2, uint32_t *ds2, uint16_t *ds16, const float *s, const float *d, int64_t ld,
                          int64_t rows, int64_t n, const int32_t *c0, const int32_t *c1, float scale,
                          const float *stats, const float *dsum) {
    DSCORES_WITH(dscores_store_exact);
}

#if BF16_NATIVE
/* The same with vcvtne2ps2bf16, 32 values an instruction: the same bits but for an fp32
 * denormal, which it makes 0, as vdpbf16ps, the only reader of these pairs here, takes it. */
static inline __attribute__((always_inline, target("avx512bf16"))) void
dscores_store_cvt(uint32_t *pp, uint32_t *pd, uint16_t *h0, uint16_t *h1, __m512 p0, __m512 p1, __m512 e0, __m512 e1,
                  int64_t left) {
    // word 2j from the low half (row r's column j), word 2j + 1 from the high half (row r + 1's)
    static const uint16_t zip[32] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
                                     8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    __m512i idx = _mm512_loadu_si512(zip);
    __m512i hp = (__m512i)_mm512_cvtne2ps_pbh(p1, p0), hd = (__m512i)_mm512_cvtne2ps_pbh(e1, e0);
    dscores_chunk(pp, pd, h0, h1, _mm512_permutexvar_epi16(idx, hp), _mm512_permutexvar_epi16(idx, hd),
                  _mm512_castsi512_si256(hd), _mm512_extracti64x4_epi64(hd, 1), left);
}

static __attribute__((target("avx512bf16"))) void dscores_cvt(uint32_t *p2, uint32_t *ds2, uint16_t *ds16,
                                                              const float *s, const float *d, int64_t ld, int64_t rows,
                                                              int64_t n, const int32_t *c0, const int32_t *c1,
                                                              float scale, const float *stats, const float *dsum) {
    DSCORES_WITH(dscores_store_cvt);
}
#endif

static void avx512_att_dscores_bf16(uint32_t *p2, uint32_t *ds2, uint16_t *ds16, float *s, float *d, int64_t ld,
                                    int64_t rows, int64_t n, const int32_t *c0, const int32_t *c1, float scale,
                                    const float *stats, const float *dsum) {
#if BF16_NATIVE
    pthread_once(&bf16_once, probe_bf16);
    if (bf16_cpu) {
        dscores_cvt(p2, ds2, ds16, s, d, ld, rows, n, c0, c1, scale, stats, dsum);
        return;
    }
#endif
    dscores_exact(p2, ds2, ds16, s, d, ld, rows, n, c0, c1, scale, stats, dsum);
}

static void avx512_bf16_round(uint16_t *y, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) store_bf16_n(y + i, load_n(x + i, n - i), n - i);
}

static void avx512_bf16_pair_rows(uint32_t *y, const float *x0, const float *x1, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) {
        __m512i lo = _mm512_srli_epi32(mxi_bf16_bits16(load_n(x0 + i, n - i)), 16);
        __m512i hi = mxi_bf16_bits16(load_n(x1 + i, n - i));
        __m512i v = _mm512_or_si512(lo, hi);
        if (n - i >= 16) _mm512_storeu_si512(y + i, v);
        else _mm512_mask_storeu_epi32(y + i, lanes16(n - i), v);
    }
}

static void avx512_bf16_round_f32(float *y, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i += 16)
        store_n(y + i, _mm512_castsi512_ps(mxi_bf16_bits16(load_n(x + i, n - i))), n - i);
}

static void avx512_bf16_widen(float *y, const uint16_t *x, int64_t n, int add) {
    for (int64_t i = 0; i < n; i += 16) {
        int64_t left = n - i;
        __m256i h = left >= 16 ? _mm256_loadu_si256((const __m256i *)(x + i)) : _mm256_maskz_loadu_epi16(lanes16(left), x + i);
        __m512 w = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));   // bf16 is the top half of fp32
        store_n(y + i, add ? _mm512_add_ps(load_n(y + i, left), w) : w, left);
    }
}

static void avx512_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int64_t rows,
                                   int C, float eps) {
    for (int64_t n = 0; n < rows; n++) {
        const float *x = inp + n * C;
        float *y = out + n * C;
        __m512 acc = _mm512_setzero_ps();
        for (int c = 0; c < C; c += 16) {
            __m512 v = load_n(x + c, C - c);
            acc = _mm512_fmadd_ps(v, v, acc);
        }
        float r = 1.0f / sqrtf(hsum16(acc) / C + eps);
        __m512 vr = _mm512_set1_ps(r);
        for (int c = 0; c < C; c += 16)
            store_n(y + c, _mm512_mul_ps(_mm512_mul_ps(load_n(x + c, C - c), vr), load_n(weight + c, C - c)), C - c);
        rstd[n] = r;
    }
}

static void avx512_rmsnorm_backward(float *dinp, const float *dout, const float *inp, const float *weight,
                                    const float *rstd, int64_t rows, int C) {
    for (int64_t n = 0; n < rows; n++) {
        const float *x = inp + n * C, *dy = dout + n * C;
        float *dx = dinp + n * C;
        float r = rstd[n];
        __m512 acc = _mm512_setzero_ps();
        for (int c = 0; c < C; c += 16)
            acc = _mm512_fmadd_ps(_mm512_mul_ps(load_n(weight + c, C - c), load_n(dy + c, C - c)), load_n(x + c, C - c), acc);
        float k = hsum16(acc) * r * r * r / C;
        __m512 vr = _mm512_set1_ps(r), vk = _mm512_set1_ps(k);
        for (int c = 0; c < C; c += 16) {
            __m512 t = _mm512_mul_ps(_mm512_mul_ps(vr, load_n(weight + c, C - c)), load_n(dy + c, C - c));
            store_n(dx + c, _mm512_fnmadd_ps(vk, load_n(x + c, C - c), t), C - c);
        }
    }
}

static void avx512_rmsnorm_dweight(float *dweight, const float *dout, const float *inp, const float *rstd,
                                   int64_t rows, int C, int c0, int c1) {
    enum { W = 128 };   // columns per pass: 8 accumulators stay in registers
    for (int cb = c0; cb < c1; cb += W) {
        int ce = cb + W < c1 ? cb + W : c1, nv = (ce - cb + 15) / 16;   // the last vector may be partial
        __m512 acc[W / 16];
        for (int j = 0; j < W / 16; j++) acc[j] = _mm512_setzero_ps();
        for (int64_t n = 0; n < rows; n++) {
            const float *dy = dout + n * C, *x = inp + n * C;
            __m512 r = _mm512_set1_ps(rstd[n]);
            for (int j = 0; j < nv; j++) {
                int c = cb + 16 * j;
                acc[j] = _mm512_fmadd_ps(_mm512_mul_ps(load_n(dy + c, ce - c), load_n(x + c, ce - c)), r, acc[j]);
            }
        }
        for (int j = 0; j < nv; j++) {
            int c = cb + 16 * j;
            store_n(dweight + c, _mm512_add_ps(load_n(dweight + c, ce - c), acc[j]), ce - c);
        }
    }
}

/* sigmoid(g) = 1 / (1 + e^-g), from e^-|g| (<= 1, in the range of exp512_neg). */
static inline __m512 sigmoid512(__m512 g) {
    __m512 e = exp512_neg(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(g)));
    __m512 inv = _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_add_ps(_mm512_set1_ps(1.0f), e));
    __mmask16 neg = _mm512_cmp_ps_mask(g, _mm512_setzero_ps(), _CMP_LT_OQ);
    return _mm512_mask_blend_ps(neg, inv, _mm512_mul_ps(e, inv));   // g < 0: e^g / (1 + e^g)
}

static void avx512_swiglu_forward(float *out, const float *gate, const float *up, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) {
        __m512 g = load_n(gate + i, n - i);
        store_n(out + i, _mm512_mul_ps(_mm512_mul_ps(g, sigmoid512(g)), load_n(up + i, n - i)), n - i);
    }
}

static void avx512_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up,
                                   int64_t n) {
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t i = 0; i < n; i += 16) {
        int64_t left = n - i;
        __m512 g = load_n(gate + i, left), u = load_n(up + i, left), d = load_n(dout + i, left);
        __m512 s = sigmoid512(g);
        __m512 dg = _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(d, u), s), _mm512_fmadd_ps(g, _mm512_sub_ps(one, s), one));
        store_n(dup + i, _mm512_mul_ps(d, _mm512_mul_ps(g, s)), left);
        store_n(dgate + i, dg, left);
    }
}

static void avx512_adamw(float *w, float *m, float *v, const float *g, int64_t n, float b1, float b2,
                         float step_size, float bc2_sqrt, float eps, float shrink) {
    const __m512 vb1 = _mm512_set1_ps(b1), vb2 = _mm512_set1_ps(b2), c1 = _mm512_set1_ps(1.0f - b1),
                 c2 = _mm512_set1_ps(1.0f - b2), vss = _mm512_set1_ps(step_size), vbc = _mm512_set1_ps(bc2_sqrt),
                 veps = _mm512_set1_ps(eps), vsh = _mm512_set1_ps(shrink);
    for (int64_t i = 0; i < n; i += 16) {
        int64_t left = n - i;
        __m512 gi = load_n(g + i, left);
        __m512 mi = _mm512_add_ps(_mm512_mul_ps(vb1, load_n(m + i, left)), _mm512_mul_ps(c1, gi));
        __m512 vi = _mm512_add_ps(_mm512_mul_ps(vb2, load_n(v + i, left)), _mm512_mul_ps(_mm512_mul_ps(c2, gi), gi));
        __m512 den = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vi), vbc), veps);
        __m512 wi = _mm512_sub_ps(_mm512_mul_ps(load_n(w + i, left), vsh), _mm512_div_ps(_mm512_mul_ps(vss, mi), den));
        store_n(m + i, mi, left);
        store_n(v + i, vi, left);
        store_n(w + i, wi, left);
    }
}

static void avx512_rope(float *x, const float *cs, const float *sn, int H, int HD, float sign) {
    int half = HD / 2;
    const __m512 vsign = _mm512_set1_ps(sign);
    for (int h = 0; h < H; h++) {
        float *row = x + (int64_t)h * HD;
        for (int i = 0; i < half; i += 16) {   // HD/2 need not be a multiple of 16: the last vector is masked
            int left = half - i;
            __m512 x1 = load_n(row + i, left), x2 = load_n(row + i + half, left);
            __m512 c = load_n(cs + i, left), s = _mm512_mul_ps(vsign, load_n(sn + i, left));
            store_n(row + i, _mm512_sub_ps(_mm512_mul_ps(x1, c), _mm512_mul_ps(x2, s)), left);
            store_n(row + i + half, _mm512_add_ps(_mm512_mul_ps(x2, c), _mm512_mul_ps(x1, s)), left);
        }
    }
}

static void avx512_add(float *y, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) store_n(y + i, _mm512_add_ps(load_n(y + i, n - i), load_n(x + i, n - i)), n - i);
}

static void avx512_scale(float *x, int64_t n, float s) {
    const __m512 vs = _mm512_set1_ps(s);
    for (int64_t i = 0; i < n; i += 16) store_n(x + i, _mm512_mul_ps(load_n(x + i, n - i), vs), n - i);
}

static double avx512_sum_squares(const float *x, int64_t n) {
    __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd();
    for (int64_t i = 0; i < n; i += 16) {
        __m512 v = load_n(x + i, n - i);   // lanes past n are 0
        __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v)), hi = _mm512_cvtps_pd(upper8(v));
        a0 = _mm512_fmadd_pd(lo, lo, a0);   // exact products: fp32 squares fit in a double
        a1 = _mm512_fmadd_pd(hi, hi, a1);
    }
    __m512d a = _mm512_add_pd(a0, a1);
    __m256d s = _mm256_add_pd(_mm512_castpd512_pd256(a), _mm512_extractf64x4_pd(a, 1));
    double lanes[4];
    _mm256_storeu_pd(lanes, s);
    return (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
}

static double avx512_cross_entropy(float *dz, const float *z, int V, int target, float dscale) {
    int full = V / 16 * 16;
    __mmask16 tm = lanes16(V - full);
    __m512 vmax = _mm512_set1_ps(-INFINITY);
    // a NaN logit is skipped, as by the reference's fmaxf; its exp makes the sum NaN
    for (int i = 0; i < full; i += 16) vmax = _mm512_max_ps(_mm512_loadu_ps(z + i), vmax);
    if (tm) vmax = _mm512_mask_max_ps(vmax, tm, loadm(z + full, tm), vmax);   // lanes past V keep -inf
    float maxv = hmax16(vmax);
    __m512 m = _mm512_set1_ps(maxv), vsum = _mm512_setzero_ps();
    for (int i = 0; i < full; i += 16) {
        __m512 e = exp512_neg(_mm512_sub_ps(_mm512_loadu_ps(z + i), m));
        if (dz) _mm512_storeu_ps(dz + i, e);
        vsum = _mm512_add_ps(vsum, e);
    }
    if (tm) {
        __m512 e = _mm512_maskz_mov_ps(tm, exp512_neg(_mm512_sub_ps(loadm(z + full, tm), m)));
        if (dz) _mm512_mask_storeu_ps(dz + full, tm, e);
        vsum = _mm512_add_ps(vsum, e);
    }
    double sum = hsum16(vsum);
    if (dz) {
        avx512_scale(dz, V, (float)(1.0 / sum) * dscale);
        dz[target] -= dscale;
    }
    return log(sum) + maxv - z[target];
}

const mxi_nn_kernels mxi_nn_kernels_avx512 = {
    .name = "avx512",
    .att_gemm = avx512_att_gemm,
    .att_gemm_bf16 = avx512_att_gemm_bf16,
    .att_online_softmax = avx512_att_online_softmax,
    .att_probs = avx512_att_probs,
    .att_dscores_bf16 = avx512_att_dscores_bf16,
    .bf16_round = avx512_bf16_round,
    .bf16_pair_rows = avx512_bf16_pair_rows,
    .bf16_round_f32 = avx512_bf16_round_f32,
    .bf16_widen = avx512_bf16_widen,
    .rmsnorm_forward = avx512_rmsnorm_forward,
    .rmsnorm_backward = avx512_rmsnorm_backward,
    .rmsnorm_dweight = avx512_rmsnorm_dweight,
    .swiglu_forward = avx512_swiglu_forward,
    .swiglu_backward = avx512_swiglu_backward,
    .adamw = avx512_adamw,
    .rope = avx512_rope,
    .add = avx512_add,
    .scale = avx512_scale,
    .sum_squares = avx512_sum_squares,
    .cross_entropy = avx512_cross_entropy,
};
