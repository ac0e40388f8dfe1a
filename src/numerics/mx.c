/* Public MX entry points: argument checks, kernel choice, and the split across threads. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/diag.h"
#include "numerics/mx_internal.h"

/* ---- kernel choice ---- */

/* The kernels' names, indexed by mx_kernel, in order of preference from the last. Their
 * tables are the kernels' bundles (ops/kernels.h). */
static const char *const kernel_names[] = {
    [MX_KERNEL_AUTO] = "auto",
    [MX_KERNEL_REF] = "ref",
    [MX_KERNEL_AVX2] = "avx2",
    [MX_KERNEL_AVX512] = "avx512",
};
enum { N_KERNELS = sizeof kernel_names / sizeof kernel_names[0] };

static mx_kernel active_id = MX_KERNEL_REF;
static pthread_once_t kernel_once = PTHREAD_ONCE_INIT;

/* ---- what the CPU runs, probed once ---- */

static const char *missing_avx2 = "not built for x86", *missing_avx512 = "not built for x86";
static pthread_once_t probe_once = PTHREAD_ONCE_INIT;

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

#define NEED(feature) if (!__builtin_cpu_supports(feature)) return "CPU lacks " feature

static const char *probe_avx2(void) {
    NEED("avx2");
    NEED("fma");
    NEED("bmi2");
    return NULL;
}

#ifndef MXI_AVX512_SIMDE
/* AVX-512F/BW/DQ/VL in CPUID, the ZMM and opmask state enabled by the OS in XCR0 (bits 1-2:
 * SSE and AVX state; 5-7: opmask, upper halves of ZMM0-15, ZMM16-31), and the compiler's
 * runtime agreeing. Without the OS's part the first AVX-512 instruction faults. */
static const char *probe_avx512(void) {
    const char *base = probe_avx2();   // the kernels use AVX2, FMA and BMI2 instructions too
    if (base) return base;
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return "CPU lacks avx512f";
    if (!(b & 1u << 16)) return "CPU lacks avx512f";
    if (!(b & 1u << 30)) return "CPU lacks avx512bw";
    if (!(b & 1u << 17)) return "CPU lacks avx512dq";
    if (!(b & 1u << 31)) return "CPU lacks avx512vl";
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & 1u << 27)) return "the OS does not enable XSAVE (no OSXSAVE)";
    uint32_t xcr0_lo, xcr0_hi;
    __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
    (void)xcr0_hi;
    if ((xcr0_lo & 0xE6u) != 0xE6u) return "the OS does not enable the AVX-512 registers (XCR0)";
    NEED("avx512f");
    NEED("avx512bw");
    NEED("avx512dq");
    NEED("avx512vl");
    return NULL;
}
#else
/* The SIMDe build runs the AVX-512 kernels' source compiled for AVX2. */
static const char *probe_avx512(void) { return probe_avx2(); }
#endif

static void probe(void) {
    missing_avx2 = probe_avx2();
    missing_avx512 = probe_avx512();
}
#else
static void probe(void) {}
#endif

const char *mx_kernel_missing(mx_kernel kernel) {
    pthread_once(&probe_once, probe);
    switch (kernel) {
    case MX_KERNEL_AUTO:
    case MX_KERNEL_REF: return NULL;
    case MX_KERNEL_AVX2: return missing_avx2;
    case MX_KERNEL_AVX512: return missing_avx512;
    default: return "no such kernel";
    }
}

bool mx_kernel_available(mx_kernel kernel) { return mx_kernel_missing(kernel) == NULL; }

bool mxi_kernel_emulated(mx_kernel kernel) {
#ifdef MXI_AVX512_SIMDE
    return kernel == MX_KERNEL_AVX512;
#else
    (void)kernel;
    return false;
#endif
}

const char *mx_kernel_name(mx_kernel kernel) {
    return (unsigned)kernel < N_KERNELS ? kernel_names[kernel] : NULL;
}

/* The best kernel the CPU runs: the last available one of the table. */
static mx_kernel best_kernel(void) {
    mx_kernel best = MX_KERNEL_REF;
    for (int k = MX_KERNEL_REF; k < N_KERNELS; k++)
        if (mx_kernel_available((mx_kernel)k)) best = (mx_kernel)k;
    return best;
}

static void set_kernel(mx_kernel kernel) {
    if (kernel == MX_KERNEL_AUTO) kernel = best_kernel();
    active_id = kernel;
}

/* The kernel MXTRAIN_KERNEL forces, or where it is unset or empty, MXTRAIN_MX_KERNEL (its
 * older name, kept so existing scripts keep working): AUTO when neither is set; < 0 for a
 * value that cannot be used, with a message naming the variable that holds it. */
static int env_kernel(mx_kernel *out, mx_diag *diag) {
    *out = MX_KERNEL_AUTO;
    const char *var = "MXTRAIN_KERNEL", *env = getenv(var);
    if (!env || !*env) env = getenv(var = "MXTRAIN_MX_KERNEL");
    if (!env || !*env) return MX_OK;
    for (int k = 0; k < N_KERNELS; k++) {
        if (strcmp(env, kernel_names[k]) != 0) continue;
        const char *missing = mx_kernel_missing((mx_kernel)k);
        if (missing) {
            char runs[64] = "";
            for (int j = MX_KERNEL_REF; j < N_KERNELS; j++)
                if (mx_kernel_available((mx_kernel)j)) {
                    strcat(runs, runs[0] ? ", " : "");
                    strcat(runs, kernel_names[j]);
                }
            return mxi_diag(diag, MX_EUNSUPPORTED, "%s: '%s' cannot run here: %s (allowed here: auto, %s)", var,
                            env, missing, runs);
        }
        *out = (mx_kernel)k;
        return MX_OK;
    }
    return mxi_diag(diag, MX_EINVAL, "%s: '%s' is not a kernel (allowed: auto, ref, avx2, avx512; unset means auto)",
                    var, env);
}

int mx_kernel_check_env(mx_diag *diag) {
    mx_kernel k;
    return env_kernel(&k, diag);
}

static void choose_kernel_once(void) {
    mx_kernel k;
    if (env_kernel(&k, NULL) != MX_OK) k = MX_KERNEL_AUTO;   // refused by mx_kernel_check_env
    set_kernel(k);
}

int mx_kernel_select(mx_kernel kernel) {
    if (!mx_kernel_name(kernel)) return MX_EENUM;
    if (!mx_kernel_available(kernel)) return MX_EUNSUPPORTED;
    pthread_once(&kernel_once, choose_kernel_once);
    set_kernel(kernel);
    return MX_OK;
}

const mxi_mx_kernels *mxi_mx_kernels_of(mx_kernel kernel) {
    // one slot, implemented by every instruction set: nothing for the reference to fill
    static const mxi_mx_kernels *const tables[] = {
        [MX_KERNEL_REF] = &mxi_mx_kernels_ref, [MX_KERNEL_AVX2] = &mxi_mx_kernels_avx2,
        [MX_KERNEL_AVX512] = &mxi_mx_kernels_avx512};
    if (kernel == MX_KERNEL_AUTO) kernel = mx_kernel_active();
    if (kernel == MX_KERNEL_AUTO || (unsigned)kernel >= sizeof tables / sizeof tables[0]) return NULL;
    return tables[kernel];
}

mx_kernel mx_kernel_active(void) {
    pthread_once(&kernel_once, choose_kernel_once);
    return active_id;
}

/* ---- argument checks ---- */

static int check_sizes(int64_t rows, int64_t cols) {
    if (rows < 0 || cols < 0) return MX_ESIZE;
    if (rows > 0 && cols > INT64_MAX / rows) return MX_ESIZE;
    if ((uint64_t)(rows * cols) > SIZE_MAX / 4) return MX_ESIZE;
    return MX_OK;
}

int64_t mx_scale_count(int64_t rows, int64_t cols, mx_axis axis) {
    int rc = check_sizes(rows, cols);
    if (rc) return rc;
    if (axis == MX_ROWWISE) return rows * ((cols + MX_BLOCK - 1) / MX_BLOCK);
    if (axis == MX_COLWISE) return ((rows + MX_BLOCK - 1) / MX_BLOCK) * cols;
    return MX_EENUM;
}

int64_t mx_tile_scale_count(int64_t rows, int64_t cols) {
    int rc = check_sizes(rows, cols);
    if (rc) return rc;
    return ((rows + MX_BLOCK - 1) / MX_BLOCK) * ((cols + MX_BLOCK - 1) / MX_BLOCK);
}

/* ---- quantize ---- */

enum { MIN_ELEMENTS_PER_THREAD = 1 << 16 };

/* Runs the job over row chunks, in parallel when it is large. Chunks are whole 32-row
 * strips so colwise blocks never straddle two threads. */
static void run_job(const mxi_quant_job *job) {
    const mxi_mx_kernels *kernels = mxi_mx_kernels_of(MX_KERNEL_AUTO);
    int64_t rows = job->rows, cols = job->cols;
    if (rows == 0 || cols == 0) return;
    int64_t strips = (rows + MX_BLOCK - 1) / MX_BLOCK;
    int64_t strip_elems = MX_BLOCK * cols;
    int64_t strips_per_chunk = (MIN_ELEMENTS_PER_THREAD + strip_elems - 1) / strip_elems;
    int64_t chunks = (strips + strips_per_chunk - 1) / strips_per_chunk;
    if (chunks <= 1) {
        kernels->quantize_rows(job, 0, rows);
        return;
    }
    #pragma omp parallel for schedule(static)
    for (int64_t ch = 0; ch < chunks; ch++) {
        int64_t r0 = ch * strips_per_chunk * MX_BLOCK;
        int64_t r1 = r0 + strips_per_chunk * MX_BLOCK;
        kernels->quantize_rows(job, r0, r1 < rows ? r1 : rows);
    }
}

/* Checks the sizes and enums of a job whose pointers are already checked, then runs it. */
static int quantize(mxi_quant_job *job, mx_elem elem) {
    int rc = check_sizes(job->rows, job->cols);
    if (rc) return rc;
    job->elem = mx_elem_traits_of(elem);
    if (!job->elem || (job->mode != MX_SCALE_FLOOR && job->mode != MX_SCALE_RCEIL)) return MX_EENUM;
    if (job->q_row && !job->q_col && !job->q_tile && job->cols % MX_BLOCK == 0) {
        // Rowwise blocks do not care which row they are in: (rows, cols) is
        // (rows * cols/32, 32) to the kernels, whose 32x32 tiles then cover 32 consecutive
        // blocks, one stream of whole cache lines, instead of 32 rows far apart (bf16: 32
        // half-lines).
        job->rows *= job->cols / MX_BLOCK;
        job->cols = MX_BLOCK;
    }
    run_job(job);
    return MX_OK;
}

static int quantize_one(const void *x, mxi_src src, int64_t rows, int64_t cols, mx_axis axis,
                        mx_elem elem, mx_scale_mode mode, uint8_t *q, uint8_t *scales) {
    if (!x || !q || !scales) return MX_ENULL;
    mxi_quant_job job = {.x = x, .src = src, .rows = rows, .cols = cols, .mode = mode};
    if (axis == MX_ROWWISE) job.q_row = q, job.s_row = scales;
    else if (axis == MX_COLWISE) job.q_col = q, job.s_col = scales;
    else return MX_EENUM;
    return quantize(&job, elem);
}

static int quantize_dual(const void *x, mxi_src src, int64_t rows, int64_t cols, mx_elem elem,
                         mx_scale_mode mode, uint8_t *q_row, uint8_t *s_row, uint8_t *q_col, uint8_t *s_col) {
    if (!x || !q_row || !s_row || !q_col || !s_col) return MX_ENULL;
    mxi_quant_job job = {.x = x, .src = src, .rows = rows, .cols = cols, .mode = mode,
                         .q_row = q_row, .s_row = s_row, .q_col = q_col, .s_col = s_col};
    return quantize(&job, elem);
}

static int quantize_tiles(const void *x, mxi_src src, int64_t rows, int64_t cols, mx_elem elem,
                          mx_scale_mode mode, uint8_t *q, uint8_t *scales) {
    if (!x || !q || !scales) return MX_ENULL;
    mxi_quant_job job = {.x = x, .src = src, .rows = rows, .cols = cols, .mode = mode,
                         .q_tile = q, .s_tile = scales};
    return quantize(&job, elem);
}

int mx_quantize_f32(const float *x, int64_t rows, int64_t cols, mx_axis axis,
                    mx_elem elem, mx_scale_mode mode, uint8_t *q, uint8_t *scales) {
    return quantize_one(x, MXI_SRC_F32, rows, cols, axis, elem, mode, q, scales);
}

int mx_quantize_bf16(const uint16_t *x, int64_t rows, int64_t cols, mx_axis axis,
                     mx_elem elem, mx_scale_mode mode, uint8_t *q, uint8_t *scales) {
    return quantize_one(x, MXI_SRC_BF16, rows, cols, axis, elem, mode, q, scales);
}

int mx_quantize_dual_f32(const float *x, int64_t rows, int64_t cols, mx_elem elem,
                         mx_scale_mode mode, uint8_t *q_row, uint8_t *s_row,
                         uint8_t *q_col, uint8_t *s_col) {
    return quantize_dual(x, MXI_SRC_F32, rows, cols, elem, mode, q_row, s_row, q_col, s_col);
}

int mx_quantize_dual_bf16(const uint16_t *x, int64_t rows, int64_t cols, mx_elem elem,
                          mx_scale_mode mode, uint8_t *q_row, uint8_t *s_row,
                          uint8_t *q_col, uint8_t *s_col) {
    return quantize_dual(x, MXI_SRC_BF16, rows, cols, elem, mode, q_row, s_row, q_col, s_col);
}

int mx_quantize_tiles_f32(const float *x, int64_t rows, int64_t cols, mx_elem elem,
                          mx_scale_mode mode, uint8_t *q, uint8_t *scales) {
    return quantize_tiles(x, MXI_SRC_F32, rows, cols, elem, mode, q, scales);
}

int mx_quantize_tiles_bf16(const uint16_t *x, int64_t rows, int64_t cols, mx_elem elem,
                           mx_scale_mode mode, uint8_t *q, uint8_t *scales) {
    return quantize_tiles(x, MXI_SRC_BF16, rows, cols, elem, mode, q, scales);
}

/* ---- dequantize ---- */

int mx_dequantize_f32(const uint8_t *q, const uint8_t *scales, int64_t rows, int64_t cols,
                      mx_axis axis, mx_elem elem, float *y) {
    if (!q || !scales || !y) return MX_ENULL;
    int rc = check_sizes(rows, cols);
    if (rc) return rc;
    const mx_elem_traits *t = mx_elem_traits_of(elem);
    if (!t || (axis != MX_ROWWISE && axis != MX_COLWISE)) return MX_EENUM;
    float value[256];
    for (int c = 0; c < 256; c++) value[c] = t->to_f32((uint8_t)c);
    int64_t cb = (cols + MX_BLOCK - 1) / MX_BLOCK;
    // value * 2^k with |k| <= 127 is exact: FP8 significands have at most 4 bits.
    #pragma omp parallel for schedule(static) if (rows * cols >= MIN_ELEMENTS_PER_THREAD)
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *srow = axis == MX_ROWWISE ? scales + r * cb : scales + (r / MX_BLOCK) * cols;
        for (int64_t c = 0; c < cols; c++) {
            uint8_t s = axis == MX_ROWWISE ? srow[c / MX_BLOCK] : srow[c];
            y[r * cols + c] = value[q[r * cols + c]] * mx_e8m0_to_f32(s);
        }
    }
    return MX_OK;
}

int mx_dequantize_tiles_f32(const uint8_t *q, const uint8_t *scales, int64_t rows, int64_t cols,
                            mx_elem elem, float *y) {
    if (!q || !scales || !y) return MX_ENULL;
    int rc = check_sizes(rows, cols);
    if (rc) return rc;
    const mx_elem_traits *t = mx_elem_traits_of(elem);
    if (!t) return MX_EENUM;
    float value[256];
    for (int c = 0; c < 256; c++) value[c] = t->to_f32((uint8_t)c);
    int64_t cb = (cols + MX_BLOCK - 1) / MX_BLOCK;
    // exact for the same reason as above
    #pragma omp parallel for schedule(static) if (rows * cols >= MIN_ELEMENTS_PER_THREAD)
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *srow = scales + (r / MX_BLOCK) * cb;   // (CB) scales of this row's tiles
        for (int64_t c = 0; c < cols; c++)
            y[r * cols + c] = value[q[r * cols + c]] * mx_e8m0_to_f32(srow[c / MX_BLOCK]);
    }
    return MX_OK;
}
