/* Internal: matrix products through oneDNN.
 *
 *   C (M, N) = op(A) op(B)          (accumulate: C += op(A) op(B))
 *
 * A is (M, K), or (K, M) when trans_a; B is (K, N), or (N, K) when trans_b. Every matrix
 * is row-major with a leading dimension (elements between consecutive rows; 0 means dense).
 * Inputs are fp32 or bf16 (uint16_t bit patterns), the output is fp32, and products are
 * accumulated in fp32.
 *
 * What runs (see docs/gemm.md): fp32 x fp32 is oneDNN's matmul primitive (jit sgemm on
 * AVX2). oneDNN 2.6 has no bf16 matmul on a CPU without AVX-512 (primitive creation says
 * "unimplemented"), so a bf16 operand is widened to fp32 (exact: bf16 is the top half of
 * fp32) into a buffer of the context and the fp32 primitive runs. A context first tries a
 * native bf16 primitive and keeps it when oneDNN has a non-reference implementation.
 *
 * A context owns the oneDNN engine and stream, a cache of primitives keyed by everything
 * oneDNN fixes at creation (shape, leading dims, transposes,
 * dtypes, accumulate, and the OpenMP thread count), and grow-only buffers (widened operands,
 * the user-managed scratchpad), so a training loop that repeats its shapes creates no
 * primitive and allocates nothing after the first step. Products whose sizes change from
 * call to call (the experts of an MoE layer: each gets the tokens routed to it) leave that
 * dim to run time (mxi_matmul_ex), so one primitive serves every size. A context is not thread-safe: use
 * one per thread that issues GEMMs. oneDNN itself runs on OpenMP threads (OMP_NUM_THREADS).
 */
#ifndef MXI_GEMM_H
#define MXI_GEMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "mxtrain/error.h"

typedef enum { MXI_F32 = 0, MXI_BF16 = 1 } mxi_dtype;

/* Primitives a context keeps (least recently used dropped first): a handful per layer kind,
 * and one per attention product and block of query rows. */
enum { MXI_GEMM_CACHE_CAP = 160 };

typedef struct mxi_gemm_ctx mxi_gemm_ctx;

/* Create a context (oneDNN engine + stream; no primitive yet). Returns 0, MX_ENULL,
 * MX_ENOMEM, or the code of a oneDNN failure with its status name in diag. */
int mxi_gemm_ctx_create(mxi_gemm_ctx **out, mx_diag *diag);

/* Free the context, its primitives and its buffers. NULL is fine. */
void mxi_gemm_ctx_destroy(mxi_gemm_ctx *ctx);

/* C (M, N) = op(A) op(B), or C += op(A) op(B) when accumulate: the BLAS-style shorthand
 * of mxi_matmul_ex for fixed dims.
 *   A: (M, K) row-major with leading dim lda, or (K, M) when trans_a
 *   B: (K, N) row-major with leading dim ldb, or (N, K) when trans_b
 *   C: (M, N) row-major with leading dim ldc
 * A leading dim of 0 means dense (the row length); otherwise it must be >= the row length.
 * M == 0 or N == 0 does nothing; K == 0 writes zeros (or leaves C alone when accumulating).
 * A pointer may be NULL only when its matrix is empty.
 * Returns 0, MX_ENULL, MX_ESIZE (negative or overflowing sizes, leading dim too small),
 * MX_EENUM (dtype), MX_ENOMEM, or a oneDNN failure (MX_EUNSUPPORTED for "unimplemented",
 * MX_ENOMEM for "out_of_memory", MX_EINVAL otherwise) with a one-line message in diag. */
int mxi_matmul(mxi_gemm_ctx *ctx, float *C, int64_t ldc,
               const void *A, mxi_dtype a_type, bool trans_a, int64_t lda,
               const void *B, mxi_dtype b_type, bool trans_b, int64_t ldb,
               int64_t M, int64_t N, int64_t K, bool accumulate, mx_diag *diag);

/* Dims of mxi_matmul_ex left to run time: the primitive is created without them, so one
 * primitive (and its generated code) serves every size of them. oneDNN 2.6's brgemm matmul
 * takes fixed shapes only, so run-time dims run its jit GEMM ("gemm:jit"; bf16: its AVX-512
 * bf16 GEMM); on an AVX2 CPU that is also what fixed shapes run, and the products are the
 * same bit for bit. Where oneDNN has nothing for run-time dims but its reference
 * implementation, the context uses fixed shapes for that dtype instead (stats.runtime_impl
 * says so). Leading dims stay part of the key: where a transposed operand's rows vary, give
 * them explicitly. */
enum { MXI_GEMM_RUNTIME_M = 1, MXI_GEMM_RUNTIME_K = 2 };

/* One input of a product: row-major data of type (uint16_t bit patterns for bf16), used
 * transposed or not, with leading dim ld (0: dense). */
typedef struct {
    const void *data;
    mxi_dtype type;
    bool trans;
    int64_t ld;
} mxi_gemm_in;

/* A product for mxi_matmul_ex: C (M, N) = op(A) op(B), or += with accumulate, with the dims
 * in runtime (MXI_GEMM_RUNTIME_* bits) left to run time; the rest as in mxi_matmul. */
typedef struct {
    float *C;
    int64_t ldc;
    mxi_gemm_in a, b;
    int64_t M, N, K;
    bool accumulate;
    unsigned runtime;
} mxi_matmul_args;

/* Each call with run-time dims makes (and frees) three small oneDNN memory objects of its
 * own shape. Returns what mxi_matmul returns, or MX_EENUM for unknown runtime bits. */
int mxi_matmul_ex(mxi_gemm_ctx *ctx, const mxi_matmul_args *args, mx_diag *diag);

/* Whether bf16 x bf16 products run natively here (probed once, with a small primitive):
 * where not, a caller that makes bf16 operands does better to keep them as fp32. */
bool mxi_gemm_bf16_native(mxi_gemm_ctx *ctx);

/* What a context has done, for tests and benchmarks. */
typedef struct {
    int64_t primitives_created;  // oneDNN primitives created (cache misses)
    int64_t cache_hits;          // calls that reused a cached primitive
    int64_t cache_evictions;     // primitives dropped to make room (least recently used)
    int64_t runtime_primitives;  // of primitives_created, those with run-time dims
    double create_seconds;       // spent creating primitives (oneDNN's descriptors and code generation)
    int cached;                  // primitives in the cache now
    size_t buffer_bytes;         // bytes held by the context's buffers
    int bf16_native;             // 1: bf16 matmul runs natively; 0: widened to fp32; -1: not probed yet
    char f32_impl[64];           // oneDNN implementation of the last fp32 primitive created ("gemm:jit")
    char bf16_probe[96];         // what the bf16 probe found ("unimplemented", or an implementation name)
    char runtime_impl[96];       // implementation of the last run-time-dims primitive, or why fixed shapes run
} mxi_gemm_stats;

void mxi_gemm_ctx_stats(const mxi_gemm_ctx *ctx, mxi_gemm_stats *out);

/* Context-owned scratch buffers for layers above mxi_matmul (the MX GEMM dequantizes its
 * operands into them). Grow-only and 64-byte aligned; the contents are not kept when a
 * buffer grows. Slots are independent of the buffers mxi_matmul uses itself. Returns NULL
 * when out of memory. */
enum { MXI_GEMM_SLOT_A = 0, MXI_GEMM_SLOT_B = 1, MXI_GEMM_SLOT_A16 = 2, MXI_GEMM_SLOT_B16 = 3, MXI_GEMM_SLOT_C = 4,
       MXI_GEMM_SLOTS = 5 };
void *mxi_gemm_ctx_buffer(mxi_gemm_ctx *ctx, int slot, size_t bytes);

/* Map a oneDNN status (dnnl_status_t as int) to an mx_status and write
 * "<what>: oneDNN status <name>" into diag. Exposed for tests. */
int mxi_gemm_dnnl_error(mx_diag *diag, int dnnl_status, const char *what);

#endif
