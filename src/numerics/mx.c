/* Public MX entry points: argument checks, kernel choice, and the split across threads. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "numerics/mx_internal.h"

/* ---- kernel choice ---- */

static const char *const kernel_names[] = {"auto", "ref", "avx2"};
static const mxi_mx_kernels *active_kernels = &mxi_mx_kernels_ref;
static mx_kernel active_id = MX_KERNEL_REF;
static pthread_once_t kernel_once = PTHREAD_ONCE_INIT;

bool mx_kernel_available(mx_kernel kernel) {
    switch (kernel) {
    case MX_KERNEL_AUTO:
    case MX_KERNEL_REF: return true;
#if defined(__x86_64__) || defined(__i386__)
    case MX_KERNEL_AVX2:
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
               __builtin_cpu_supports("bmi2");
#endif
    default: return false;
    }
}

const char *mx_kernel_name(mx_kernel kernel) {
    return (unsigned)kernel < sizeof kernel_names / sizeof kernel_names[0] ? kernel_names[kernel] : NULL;
}

static void set_kernel(mx_kernel kernel) {
    if (kernel == MX_KERNEL_AUTO) kernel = mx_kernel_available(MX_KERNEL_AVX2) ? MX_KERNEL_AVX2 : MX_KERNEL_REF;
    active_id = kernel;
    active_kernels = kernel == MX_KERNEL_AVX2 ? &mxi_mx_kernels_avx2 : &mxi_mx_kernels_ref;
}

static void choose_kernel_once(void) {
    const char *env = getenv("MXTRAIN_MX_KERNEL");
    mx_kernel k = MX_KERNEL_AUTO;
    if (env && strcmp(env, "ref") == 0) k = MX_KERNEL_REF;
    if (env && strcmp(env, "avx2") == 0 && mx_kernel_available(MX_KERNEL_AVX2)) k = MX_KERNEL_AVX2;
    set_kernel(k);
}

int mx_kernel_select(mx_kernel kernel) {
    if (!mx_kernel_name(kernel)) return MX_EENUM;
    if (!mx_kernel_available(kernel)) return MX_EUNSUPPORTED;
    pthread_once(&kernel_once, choose_kernel_once);
    set_kernel(kernel);
    return MX_OK;
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
    pthread_once(&kernel_once, choose_kernel_once);
    const mxi_mx_kernels *kernels = active_kernels;
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
