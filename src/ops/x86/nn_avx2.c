/* AVX2 kernels of the network's non-GEMM layers (see ops/nn_kernels.h): 8 lanes, fused
 * multiply-adds, and a vector exp. NaN and infinities propagate as in the reference: the
 * maxima skip NaN, as its `>` and fmaxf do, and the exp passes NaN on, so a NaN score
 * makes its row NaN there too. */
#include <immintrin.h>
#include <math.h>

#include "core/bits.h"
#include "ops/nn_kernels.h"
#include "ops/x86/bf16_avx2.h"

/* e^x for x <= 0 to about 1 ulp (Cephes' expf: x = n ln2 + r, |r| <= ln2/2, a degree-6
 * polynomial for e^r, then 2^n through the exponent field). Below -87.3 the result is 0,
 * where e^x is under fp32's smallest normal; -Inf gives 0 and NaN gives NaN, as expf. */
static inline __m256 exp256_neg(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.3f);
    __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_max_ps(lo, x);   // maxps returns its second operand when one is NaN: a NaN stays NaN
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    y = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
    return _mm256_andnot_ps(under, y);
}

/* 2^u to about 1.5 ulp for u up to a little above 0 (attention's exps, see
 * mxi_att_exp2_scale): u = n + f with n = round(u) and f = u - n exact (|f| <= 1/2), a
 * degree-5 polynomial for 2^f (mxi_exp2_poly), then 2^n through the exponent field. Below
 * -126 the result is 0, where 2^u is under fp32's smallest normal; -Inf gives 0 and NaN
 * gives NaN, as exp2f. */
static inline __m256 exp2_256(__m256 u) {
    const __m256 lo = _mm256_set1_ps(-126.0f);
    __m256 under = _mm256_cmp_ps(u, lo, _CMP_LT_OQ);
    u = _mm256_max_ps(lo, u);   // maxps returns its second operand when one is NaN: a NaN stays NaN
    __m256 n = _mm256_round_ps(u, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 f = _mm256_sub_ps(u, n);
    __m256 y = _mm256_set1_ps(mxi_exp2_poly[0]);
    for (int i = 1; i < 6; i++) y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(mxi_exp2_poly[i]));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    y = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
    return _mm256_andnot_ps(under, y);
}

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float hmax(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Lanes s < n of 8 columns starting at s0 (a mask for the row's last, partial vector). */
static inline __m256i tail_mask(int64_t left) {
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)left), idx);
}

/* ---- flash attention's pieces ----
 * att_gemm: register tiles of MR rows x NV vectors of 8 columns (at most 4 x 2), the last
 * vector masked; each element is c + a0 b0 + a1 b1 + ... by fused multiply-adds in k order. */
/* The loops over a tile's rows and vectors unrolled, so that its accumulators stay in registers. */
#define UNROLL4 _Pragma("GCC unroll 4")

static inline __attribute__((always_inline)) void gemm_tile8(float *c, int64_t ldc, const float *a, int64_t lda,
                                                             int64_t acs, const float *b, int64_t ldb, int64_t k, int mr,
                                                             int nv, int add, __m256i last) {
    const __m256i all = _mm256_set1_epi32(-1);
    __m256 acc[4][2];
    UNROLL4 for (int i = 0; i < mr; i++)
        UNROLL4 for (int v = 0; v < nv; v++)
            acc[i][v] = add ? _mm256_maskload_ps(c + i * ldc + 8 * v, v == nv - 1 ? last : all) : _mm256_setzero_ps();
    for (int64_t x = 0; x < k; x++) {
        __m256 bv[2];
        // a masked load only for a partial last vector (nv 1 is called for those)
        UNROLL4 for (int v = 0; v < nv; v++)
            bv[v] = nv == 2 ? _mm256_loadu_ps(b + x * ldb + 8 * v) : _mm256_maskload_ps(b + x * ldb, last);
        UNROLL4 for (int i = 0; i < mr; i++) {
            __m256 av = _mm256_broadcast_ss(a + i * lda + x * acs);
            UNROLL4 for (int v = 0; v < nv; v++) acc[i][v] = _mm256_fmadd_ps(av, bv[v], acc[i][v]);
        }
    }
    UNROLL4 for (int i = 0; i < mr; i++)
        UNROLL4 for (int v = 0; v < nv; v++)
            _mm256_maskstore_ps(c + i * ldc + 8 * v, v == nv - 1 ? last : all, acc[i][v]);
}

static void avx2_att_gemm(float *c, int64_t ldc, const float *a, int64_t lda, int64_t acs, const float *b,
                          int64_t ldb, int64_t m, int64_t n, int64_t k, mxi_att_write write) {
    int add = write == MXI_ATT_ADD;
    for (int64_t j0 = 0; j0 < n;) {
        int64_t w = n - j0 >= 16 ? 16 : n - j0 >= 8 ? 8 : n - j0;   // two vectors, one, or one masked
        __m256i last = tail_mask(w);
        int64_t i = 0;
        for (; i + 4 <= m; i += 4) {
            if (w == 16) gemm_tile8(c + i * ldc + j0, ldc, a + i * lda, lda, acs, b + j0, ldb, k, 4, 2, add, last);
            else gemm_tile8(c + i * ldc + j0, ldc, a + i * lda, lda, acs, b + j0, ldb, k, 4, 1, add, last);
        }
        for (; i < m; i++) {
            if (w == 16) gemm_tile8(c + i * ldc + j0, ldc, a + i * lda, lda, acs, b + j0, ldb, k, 1, 2, add, last);
            else gemm_tile8(c + i * ldc + j0, ldc, a + i * lda, lda, acs, b + j0, ldb, k, 1, 1, add, last);
        }
        j0 += w;
    }
}

/* att_gemm_bf16: two fused multiply-adds per pair on the widened halves (the products are
 * exact, so the numbers of vdpbf16ps), tiles of at most 4 rows x 2 vectors. */
static inline __attribute__((always_inline)) void gemm_tile_fma2(float *c, int64_t ldc, const uint32_t *a,
                                                                 int64_t lda, int64_t acs, const uint32_t *b, int64_t ldb,
                                                                 int64_t kp, int mr, int nv, int add, __m256i last) {
    const __m256i all = _mm256_set1_epi32(-1), hi = _mm256_set1_epi32((int)0xFFFF0000u);
    __m256 acc[4][2];
    UNROLL4 for (int i = 0; i < mr; i++)
        UNROLL4 for (int v = 0; v < nv; v++)
            acc[i][v] = add ? _mm256_maskload_ps(c + i * ldc + 8 * v, v == nv - 1 ? last : all) : _mm256_setzero_ps();
    for (int64_t p = 0; p < kp; p++) {
        __m256 bh[2], bl[2];
        UNROLL4 for (int v = 0; v < nv; v++) {
            __m256i x = nv == 2 ? _mm256_loadu_si256((const __m256i *)(b + p * ldb + 8 * v))
                                : _mm256_maskload_epi32((const int *)(b + p * ldb), last);
            bh[v] = _mm256_castsi256_ps(_mm256_and_si256(x, hi));
            bl[v] = _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
        }
        UNROLL4 for (int i = 0; i < mr; i++) {
            uint32_t x = a[i * lda + p * acs];
            __m256 ah = _mm256_set1_ps(mxi_bits_f32(x & 0xFFFF0000u)), al = _mm256_set1_ps(mxi_bits_f32(x << 16));
            UNROLL4 for (int v = 0; v < nv; v++) {
                acc[i][v] = _mm256_fmadd_ps(ah, bh[v], acc[i][v]);
                acc[i][v] = _mm256_fmadd_ps(al, bl[v], acc[i][v]);
            }
        }
    }
    UNROLL4 for (int i = 0; i < mr; i++)
        UNROLL4 for (int v = 0; v < nv; v++)
            _mm256_maskstore_ps(c + i * ldc + 8 * v, v == nv - 1 ? last : all, acc[i][v]);
}

static void avx2_att_gemm_bf16(float *c, int64_t ldc, const uint32_t *a, int64_t lda, int64_t acs, const uint32_t *b,
                               int64_t ldb, int64_t m, int64_t n, int64_t kp, mxi_att_write write) {
    int add = write == MXI_ATT_ADD;
    for (int64_t j0 = 0; j0 < n;) {
        int64_t w = n - j0 >= 16 ? 16 : n - j0 >= 8 ? 8 : n - j0;   // two vectors, one, or one masked
        __m256i last = tail_mask(w);
        int64_t i = 0;
        for (; i + 4 <= m; i += 4) {
            if (w == 16) gemm_tile_fma2(c + i * ldc + j0, ldc, a + i * lda, lda, acs, b + j0, ldb, kp, 4, 2, add, last);
            else gemm_tile_fma2(c + i * ldc + j0, ldc, a + i * lda, lda, acs, b + j0, ldb, kp, 4, 1, add, last);
        }
        for (; i < m; i++) {
            if (w == 16) gemm_tile_fma2(c + i * ldc + j0, ldc, a + i * lda, lda, acs, b + j0, ldb, kp, 1, 2, add, last);
            else gemm_tile_fma2(c + i * ldc + j0, ldc, a + i * lda, lda, acs, b + j0, ldb, kp, 1, 1, add, last);
        }
        j0 += w;
    }
}

/* Columns of row outside [c0, c1) of n become 0. */
static void zero_outside8(float *row, int64_t n, int64_t c0, int64_t c1) {
    for (int64_t j = 0; j < c0 && j < n; j++) row[j] = 0.0f;
    for (int64_t j = c1 > c0 ? c1 : c0; j < n; j++) row[j] = 0.0f;
}

static void avx2_bf16_round(uint16_t *y, const float *x, int64_t n);

static void avx2_att_online_softmax(float *s, int64_t ld, int64_t rows, int64_t n, const int32_t *c0, const int32_t *c1,
                                    float scale, float *rmax, float *rsum, float *corr, uint16_t *p16) {
    const __m256 vc = _mm256_set1_ps(mxi_att_exp2_scale(scale)), ninf = _mm256_set1_ps(-INFINITY);
    for (int64_t r = 0; r < rows; r++) {
        float *row = s + r * ld;
        int64_t lo = c0[r], hi = c1[r];
        zero_outside8(row, n, lo, hi);
        corr[r] = 1.0f;
        if (lo >= hi) continue;
        // the scaled scores stay in registers (or the stack) up to 64 columns (a tile's),
        // which a load after the masked store of the same lanes would wait for
        __m256 xs[8], vmax = _mm256_set1_ps(rmax[r]);
        int64_t nv = (hi - lo + 7) / 8;
        for (int64_t j = lo; j < hi; j += 8) {
            __m256i tm = tail_mask(hi - j);
            __m256 x = _mm256_mul_ps(_mm256_maskload_ps(row + j, tm), vc);
            if (nv <= 8) xs[(j - lo) / 8] = x;
            else _mm256_maskstore_ps(row + j, tm, x);
            vmax = _mm256_max_ps(_mm256_blendv_ps(ninf, x, _mm256_castsi256_ps(tm)), vmax);   // skips a NaN
        }
        float mx = hmax(vmax);
        __m256 m = _mm256_set1_ps(mx), vsum = _mm256_setzero_ps();
        for (int64_t j = lo; j < hi; j += 8) {
            __m256i tm = tail_mask(hi - j);
            __m256 x = nv <= 8 ? xs[(j - lo) / 8] : _mm256_maskload_ps(row + j, tm);
            __m256 e = _mm256_and_ps(exp2_256(_mm256_sub_ps(x, m)), _mm256_castsi256_ps(tm));
            _mm256_maskstore_ps(row + j, tm, e);
            vsum = _mm256_add_ps(vsum, e);
        }
        float cr = _mm_cvtss_f32(_mm256_castps256_ps128(exp2_256(_mm256_set1_ps(rmax[r] - mx))));
        corr[r] = cr;
        rsum[r] = rsum[r] * cr + hsum(vsum);
        rmax[r] = mx;
    }
    for (int64_t r = 0; p16 && r < rows; r++) {
        avx2_bf16_round(p16 + r * ld, s + r * ld, n);
        if (n & 1) p16[r * ld + n] = 0;
    }
}

static void avx2_att_probs(float *s, float *d, int64_t ld, int64_t rows, int64_t n, const int32_t *c0, const int32_t *c1,
                           float scale, const float *stats, const float *dsum, mxi_att_probs_mode mode) {
    const __m256 vscale = _mm256_set1_ps(scale), vc = _mm256_set1_ps(mxi_att_exp2_scale(scale));
    for (int64_t r = 0; r < rows; r++) {
        float *row = s + r * ld, *dr = d ? d + r * ld : NULL;
        int64_t lo = c0[r], hi = c1[r];
        int dscores = mode == MXI_ATT_DSCORES;
        __m256 m = _mm256_set1_ps(stats[2 * r]), inv = _mm256_set1_ps(stats[2 * r + 1]);
        __m256 dd = _mm256_set1_ps(dscores ? dsum[r] : 0.0f);
        for (int64_t j = lo; j < hi; j += 8) {
            __m256i tm = tail_mask(hi - j);
            __m256 x = _mm256_mul_ps(_mm256_maskload_ps(row + j, tm), vc);
            __m256 p = _mm256_and_ps(_mm256_mul_ps(exp2_256(_mm256_sub_ps(x, m)), inv), _mm256_castsi256_ps(tm));
            _mm256_maskstore_ps(row + j, tm, p);
            if (dscores) {
                __m256 g = _mm256_mul_ps(_mm256_mul_ps(p, _mm256_sub_ps(_mm256_maskload_ps(dr + j, tm), dd)), vscale);
                _mm256_maskstore_ps(dr + j, tm, g);
            }
        }
        zero_outside8(row, n, lo, hi);
        if (dscores) zero_outside8(dr, n, lo, hi);
    }
}

static void avx2_att_dscores_bf16(uint32_t *p2, uint32_t *ds2, uint16_t *ds16, float *s, float *d, int64_t ld,
                                  int64_t rows, int64_t n, const int32_t *c0, const int32_t *c1, float scale,
                                  const float *stats, const float *dsum) {
    mxi_att_dscores_composed(&mxi_nn_kernels_avx2, p2, ds2, ds16, s, d, ld, rows, n, c0, c1, scale, stats, dsum);
}

static void avx2_bf16_round(uint16_t *y, const float *x, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i a = _mm256_srli_epi32(mxi_bf16_bits8(_mm256_loadu_ps(x + i)), 16);
        __m256i b = _mm256_srli_epi32(mxi_bf16_bits8(_mm256_loadu_ps(x + i + 8)), 16);
        // packus works within 128-bit lanes: a0 b0 a1 b1 -> reorder to a0 a1 b0 b1
        __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xD8);
        _mm256_storeu_si256((__m256i *)(y + i), p);
    }
    for (; i < n; i++) {
        __m256i v = mxi_bf16_bits8(_mm256_set1_ps(x[i]));
        y[i] = (uint16_t)((uint32_t)_mm256_extract_epi32(v, 0) >> 16);
    }
}

static void avx2_bf16_pair_rows(uint32_t *y, const float *x0, const float *x1, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i lo = _mm256_srli_epi32(mxi_bf16_bits8(_mm256_loadu_ps(x0 + i)), 16);
        __m256i hi = mxi_bf16_bits8(_mm256_loadu_ps(x1 + i));
        _mm256_storeu_si256((__m256i *)(y + i), _mm256_or_si256(lo, hi));
    }
    for (; i < n; i++) y[i] = (uint32_t)mxi_f32_to_bf16(x1[i]) << 16 | mxi_f32_to_bf16(x0[i]);
}

static void avx2_bf16_round_f32(float *y, const float *x, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_castsi256_ps(mxi_bf16_bits8(_mm256_loadu_ps(x + i))));
    if (i < n) {
        __m256i m = tail_mask(n - i);
        __m256 v = _mm256_maskload_ps(x + i, m);
        _mm256_maskstore_ps(y + i, m, _mm256_castsi256_ps(mxi_bf16_bits8(v)));
    }
}

static void avx2_bf16_widen(float *y, const uint16_t *x, int64_t n, int add) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 w = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(x + i))), 16));
        _mm256_storeu_ps(y + i, add ? _mm256_add_ps(_mm256_loadu_ps(y + i), w) : w);
    }
    for (; i < n; i++) {
        float f = mxi_bf16_to_f32(x[i]);
        y[i] = add ? y[i] + f : f;
    }
}

static void avx2_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int64_t rows, int C,
                                 float eps) {
    int full = C / 8 * 8;
    for (int64_t n = 0; n < rows; n++) {
        const float *x = inp + n * C;
        float *y = out + n * C;
        __m256 acc = _mm256_setzero_ps();
        for (int c = 0; c < full; c += 8) {
            __m256 v = _mm256_loadu_ps(x + c);
            acc = _mm256_fmadd_ps(v, v, acc);
        }
        float ss = hsum(acc);
        for (int c = full; c < C; c++) ss += x[c] * x[c];
        float r = 1.0f / sqrtf(ss / C + eps);
        __m256 vr = _mm256_set1_ps(r);
        for (int c = 0; c < full; c += 8)
            _mm256_storeu_ps(y + c, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + c), vr), _mm256_loadu_ps(weight + c)));
        for (int c = full; c < C; c++) y[c] = x[c] * r * weight[c];
        rstd[n] = r;
    }
}

static void avx2_rmsnorm_backward(float *dinp, const float *dout, const float *inp, const float *weight,
                                  const float *rstd, int64_t rows, int C) {
    int full = C / 8 * 8;
    for (int64_t n = 0; n < rows; n++) {
        const float *x = inp + n * C, *dy = dout + n * C;
        float *dx = dinp + n * C;
        float r = rstd[n];
        __m256 acc = _mm256_setzero_ps();
        for (int c = 0; c < full; c += 8)
            acc = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_loadu_ps(weight + c), _mm256_loadu_ps(dy + c)),
                                  _mm256_loadu_ps(x + c), acc);
        float dot = hsum(acc);
        for (int c = full; c < C; c++) dot += weight[c] * dy[c] * x[c];
        float k = dot * r * r * r / C;
        __m256 vr = _mm256_set1_ps(r), vk = _mm256_set1_ps(k);
        for (int c = 0; c < full; c += 8) {
            __m256 t = _mm256_mul_ps(_mm256_mul_ps(vr, _mm256_loadu_ps(weight + c)), _mm256_loadu_ps(dy + c));
            _mm256_storeu_ps(dx + c, _mm256_fnmadd_ps(vk, _mm256_loadu_ps(x + c), t));
        }
        for (int c = full; c < C; c++) dx[c] = r * weight[c] * dy[c] - k * x[c];
    }
}

static void avx2_rmsnorm_dweight(float *dweight, const float *dout, const float *inp, const float *rstd, int64_t rows,
                                 int C, int c0, int c1) {
    enum { W = 64 };   // columns per pass: 8 accumulators stay in registers
    for (int cb = c0; cb < c1; cb += W) {
        int ce = cb + W < c1 ? cb + W : c1, vec = cb + (ce - cb) / 8 * 8;
        __m256 acc[W / 8];
        float tail[8] = {0};
        for (int j = 0; j < W / 8; j++) acc[j] = _mm256_setzero_ps();
        for (int64_t n = 0; n < rows; n++) {
            const float *dy = dout + n * C, *x = inp + n * C;
            __m256 r = _mm256_set1_ps(rstd[n]);
            for (int c = cb, j = 0; c < vec; c += 8, j++)
                acc[j] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_loadu_ps(dy + c), _mm256_loadu_ps(x + c)), r, acc[j]);
            for (int c = vec; c < ce; c++) tail[c - vec] += dy[c] * x[c] * rstd[n];
        }
        for (int c = cb, j = 0; c < vec; c += 8, j++)
            _mm256_storeu_ps(dweight + c, _mm256_add_ps(_mm256_loadu_ps(dweight + c), acc[j]));
        for (int c = vec; c < ce; c++) dweight[c] += tail[c - vec];
    }
}

/* sigmoid(g) = 1 / (1 + e^-g), from e^-|g| (<= 1, in the range of exp256_neg). */
static inline __m256 sigmoid256(__m256 g) {
    __m256 absg = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), g);
    __m256 e = exp256_neg(_mm256_sub_ps(_mm256_setzero_ps(), absg));
    __m256 inv = _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_add_ps(_mm256_set1_ps(1.0f), e));
    __m256 neg = _mm256_cmp_ps(g, _mm256_setzero_ps(), _CMP_LT_OQ);
    return _mm256_blendv_ps(inv, _mm256_mul_ps(e, inv), neg);   // g < 0: e^g / (1 + e^g)
}

static void avx2_swiglu_forward(float *out, const float *gate, const float *up, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 g = _mm256_loadu_ps(gate + i);
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(g, sigmoid256(g)), _mm256_loadu_ps(up + i)));
    }
    if (i < n) {
        __m256i m = tail_mask(n - i);
        __m256 g = _mm256_maskload_ps(gate + i, m);
        _mm256_maskstore_ps(out + i, m, _mm256_mul_ps(_mm256_mul_ps(g, sigmoid256(g)), _mm256_maskload_ps(up + i, m)));
    }
}

static inline void swiglu_bwd8(float *dgate, float *dup, const float *dout, const float *gate, const float *up,
                               __m256i m) {
    __m256 g = _mm256_maskload_ps(gate, m), u = _mm256_maskload_ps(up, m), d = _mm256_maskload_ps(dout, m);
    __m256 s = sigmoid256(g), one = _mm256_set1_ps(1.0f);
    __m256 dg = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(d, u), s), _mm256_fmadd_ps(g, _mm256_sub_ps(one, s), one));
    _mm256_maskstore_ps(dup, m, _mm256_mul_ps(d, _mm256_mul_ps(g, s)));
    _mm256_maskstore_ps(dgate, m, dg);
}

static void avx2_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up,
                                 int64_t n) {
    int64_t i = 0;
    __m256i all = _mm256_set1_epi32(-1);
    for (; i + 8 <= n; i += 8) swiglu_bwd8(dgate + i, dup + i, dout + i, gate + i, up + i, all);
    if (i < n) swiglu_bwd8(dgate + i, dup + i, dout + i, gate + i, up + i, tail_mask(n - i));
}

static void avx2_adamw(float *w, float *m, float *v, const float *g, int64_t n, float b1, float b2, float step_size,
                       float bc2_sqrt, float eps, float shrink) {
    __m256 vb1 = _mm256_set1_ps(b1), vb2 = _mm256_set1_ps(b2), c1 = _mm256_set1_ps(1.0f - b1),
           c2 = _mm256_set1_ps(1.0f - b2), vss = _mm256_set1_ps(step_size), vbc = _mm256_set1_ps(bc2_sqrt),
           veps = _mm256_set1_ps(eps), vsh = _mm256_set1_ps(shrink);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 gi = _mm256_loadu_ps(g + i);
        __m256 mi = _mm256_add_ps(_mm256_mul_ps(vb1, _mm256_loadu_ps(m + i)), _mm256_mul_ps(c1, gi));
        __m256 vi = _mm256_add_ps(_mm256_mul_ps(vb2, _mm256_loadu_ps(v + i)), _mm256_mul_ps(_mm256_mul_ps(c2, gi), gi));
        __m256 den = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vi), vbc), veps);
        __m256 wi = _mm256_sub_ps(_mm256_mul_ps(_mm256_loadu_ps(w + i), vsh), _mm256_div_ps(_mm256_mul_ps(vss, mi), den));
        _mm256_storeu_ps(m + i, mi);
        _mm256_storeu_ps(v + i, vi);
        _mm256_storeu_ps(w + i, wi);
    }
    for (; i < n; i++) {
        float gi = g[i];
        m[i] = b1 * m[i] + (1.0f - b1) * gi;
        v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
        w[i] = w[i] * shrink - step_size * m[i] / (sqrtf(v[i]) / bc2_sqrt + eps);
    }
}

static void avx2_rope(float *x, const float *cs, const float *sn, int H, int HD, float sign) {
    int half = HD / 2, full = half / 8 * 8;
    __m256 vsign = _mm256_set1_ps(sign);
    for (int h = 0; h < H; h++) {
        float *row = x + (int64_t)h * HD;
        for (int i = 0; i < half; i += 8) {
            // the last, partial vector of a half is masked: HD/2 need not be a multiple of 8
            __m256i m = i < full ? _mm256_set1_epi32(-1) : tail_mask(half - i);
            __m256 x1 = _mm256_maskload_ps(row + i, m), x2 = _mm256_maskload_ps(row + i + half, m);
            __m256 c = _mm256_maskload_ps(cs + i, m), s = _mm256_mul_ps(vsign, _mm256_maskload_ps(sn + i, m));
            _mm256_maskstore_ps(row + i, m, _mm256_sub_ps(_mm256_mul_ps(x1, c), _mm256_mul_ps(x2, s)));
            _mm256_maskstore_ps(row + i + half, m, _mm256_add_ps(_mm256_mul_ps(x2, c), _mm256_mul_ps(x1, s)));
        }
    }
}

static void avx2_add(float *y, const float *x, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i), _mm256_loadu_ps(x + i)));
    if (i < n) {
        __m256i m = tail_mask(n - i);
        _mm256_maskstore_ps(y + i, m, _mm256_add_ps(_mm256_maskload_ps(y + i, m), _mm256_maskload_ps(x + i, m)));
    }
}

static void avx2_scale(float *x, int64_t n, float s) {
    __m256 vs = _mm256_set1_ps(s);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), vs));
    if (i < n) {
        __m256i m = tail_mask(n - i);
        _mm256_maskstore_ps(x + i, m, _mm256_mul_ps(_mm256_maskload_ps(x + i, m), vs));
    }
}

static double avx2_sum_squares(const float *x, int64_t n) {
    __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256d lo = _mm256_cvtps_pd(_mm_loadu_ps(x + i)), hi = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 4));
        a0 = _mm256_fmadd_pd(lo, lo, a0);   // exact products: fp32 squares fit in a double
        a1 = _mm256_fmadd_pd(hi, hi, a1);
    }
    double lanes[4];
    _mm256_storeu_pd(lanes, _mm256_add_pd(a0, a1));
    double acc = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
    for (; i < n; i++) acc += (double)x[i] * x[i];
    return acc;
}

static double avx2_cross_entropy(float *dz, const float *z, int V, int target, float dscale) {
    int full = V / 8 * 8;
    __m256i tm = tail_mask(V - full);
    __m256 vmax = _mm256_set1_ps(-INFINITY);
    // a NaN logit is skipped, as by the reference's fmaxf; its exp makes the sum NaN
    for (int i = 0; i < full; i += 8) vmax = _mm256_max_ps(_mm256_loadu_ps(z + i), vmax);
    if (full < V)
        vmax = _mm256_max_ps(_mm256_blendv_ps(_mm256_set1_ps(-INFINITY), _mm256_maskload_ps(z + full, tm),
                                              _mm256_castsi256_ps(tm)), vmax);
    float maxv = hmax(vmax);
    __m256 m = _mm256_set1_ps(maxv), vsum = _mm256_setzero_ps();
    for (int i = 0; i < full; i += 8) {
        __m256 e = exp256_neg(_mm256_sub_ps(_mm256_loadu_ps(z + i), m));
        if (dz) _mm256_storeu_ps(dz + i, e);
        vsum = _mm256_add_ps(vsum, e);
    }
    if (full < V) {
        __m256 e = _mm256_and_ps(exp256_neg(_mm256_sub_ps(_mm256_maskload_ps(z + full, tm), m)), _mm256_castsi256_ps(tm));
        if (dz) _mm256_maskstore_ps(dz + full, tm, e);
        vsum = _mm256_add_ps(vsum, e);
    }
    double sum = hsum(vsum);
    if (dz) {
        avx2_scale(dz, V, (float)(1.0 / sum) * dscale);
        dz[target] -= dscale;
    }
    return log(sum) + maxv - z[target];
}

const mxi_nn_kernels mxi_nn_kernels_avx2 = {
    .name = "avx2",
    .att_gemm = avx2_att_gemm,
    .att_gemm_bf16 = avx2_att_gemm_bf16,
    .att_online_softmax = avx2_att_online_softmax,
    .att_probs = avx2_att_probs,
    .att_dscores_bf16 = avx2_att_dscores_bf16,
    .bf16_round = avx2_bf16_round,
    .bf16_pair_rows = avx2_bf16_pair_rows,
    .bf16_round_f32 = avx2_bf16_round_f32,
    .bf16_widen = avx2_bf16_widen,
    .rmsnorm_forward = avx2_rmsnorm_forward,
    .rmsnorm_backward = avx2_rmsnorm_backward,
    .rmsnorm_dweight = avx2_rmsnorm_dweight,
    .swiglu_forward = avx2_swiglu_forward,
    .swiglu_backward = avx2_swiglu_backward,
    .adamw = avx2_adamw,
    .rope = avx2_rope,
    .add = avx2_add,
    .scale = avx2_scale,
    .sum_squares = avx2_sum_squares,
    .cross_entropy = avx2_cross_entropy,
};
