/* Matrix products through oneDNN's matmul primitive, with a primitive cache and
 * context-owned buffers so the steady state creates and allocates nothing. */
#define _DEFAULT_SOURCE   // MAP_ANONYMOUS
#include <dnnl.h>
#include <dnnl_debug.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "core/clock.h"
#include "core/diag.h"
#include "ops/gemm.h"
#include "ops/ops_kernels.h"


/* Everything a primitive is specialised on. All int64_t so the struct has no padding and
 * compares with memcmp. dtypes are those the primitive sees (after any widening). oneDNN
 * fixes the thread count of some kernels (brgemm) at creation, so it is part of the key. */
typedef struct {
    int64_t m, n, k, lda, ldb, ldc;   // m, k: 0 when left to run time (runtime)
    int64_t a_type, b_type;   // dnnl_data_type_t
    int64_t trans_a, trans_b, accumulate;
    int64_t threads;          // omp_get_max_threads() at creation
    int64_t runtime;          // MXI_GEMM_RUNTIME_* dims given at execution, not creation
} prim_key;

typedef struct {
    prim_key key;
    dnnl_primitive_t prim;
    dnnl_memory_t mem_a, mem_b, mem_c, mem_scratch;   // data handles are set at every call;
                                                      // a run-time shape makes a, b, c per call
    size_t scratch_bytes;
    uint64_t last_use;
} prim_entry;

typedef struct {
    void *p;
    size_t cap;
} buffer;

struct mxi_gemm_ctx {
    dnnl_engine_t engine;
    dnnl_stream_t stream;
    prim_entry cache[MXI_GEMM_CACHE_CAP];
    int cached;
    uint64_t tick;
    buffer widen_a, widen_b;          // bf16 operands widened to fp32
    buffer scratch;                   // oneDNN user-managed scratchpad
    buffer slots[MXI_GEMM_SLOTS];     // for callers (mxi_gemm_ctx_buffer)
    int bf16_native;                  // -1 not probed, 0 widen, 1 native
    bool runtime_off[2];              // by [bf16]: run-time shapes have no fast implementation
    mxi_gemm_stats stats;
};

/* ---- errors ---- */

int mxi_gemm_dnnl_error(mx_diag *diag, int dnnl_status, const char *what) {
    int code = dnnl_status == dnnl_out_of_memory ? MX_ENOMEM
             : dnnl_status == dnnl_unimplemented ? MX_EUNSUPPORTED
             : MX_EINVAL;
    return mxi_diag(diag, code, "%s: oneDNN status %s", what, dnnl_status2str((dnnl_status_t)dnnl_status));
}

/* ---- buffers ---- */

static void *buffer_get(buffer *b, size_t bytes) {
    if (bytes <= b->cap) return b->p;
    size_t cap = (bytes + 63) / 64 * 64;
    void *p = aligned_alloc(64, cap);
    if (!p) return NULL;
    free(b->p);
    b->p = p;
    b->cap = cap;
    return p;
}

static void buffer_free(buffer *b) {
    free(b->p);
    b->p = NULL;
    b->cap = 0;
}

void *mxi_gemm_ctx_buffer(mxi_gemm_ctx *ctx, int slot, size_t bytes) {
    if (!ctx || slot < 0 || slot >= MXI_GEMM_SLOTS) return NULL;
    return buffer_get(&ctx->slots[slot], bytes ? bytes : 1);
}

/* ---- context ---- */

int mxi_gemm_ctx_create(mxi_gemm_ctx **out, mx_diag *diag) {
    if (!out) return mxi_diag(diag, MX_ENULL, "mxi_gemm_ctx_create: out is NULL");
    *out = NULL;
    mxi_gemm_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return mxi_diag(diag, MX_ENOMEM, "mxi_gemm_ctx_create: out of memory (%zu bytes)", sizeof *ctx);
    ctx->bf16_native = -1;
    ctx->stats.bf16_native = -1;
    dnnl_status_t st = dnnl_engine_create(&ctx->engine, dnnl_cpu, 0);
    if (st != dnnl_success) {
        free(ctx);
        return mxi_gemm_dnnl_error(diag, st, "creating the oneDNN CPU engine");
    }
    st = dnnl_stream_create(&ctx->stream, ctx->engine, dnnl_stream_default_flags);
    if (st != dnnl_success) {
        dnnl_engine_destroy(ctx->engine);
        free(ctx);
        return mxi_gemm_dnnl_error(diag, st, "creating a oneDNN stream");
    }
    *out = ctx;
    return MX_OK;
}

static void entry_destroy(prim_entry *e) {
    if (e->prim) dnnl_primitive_destroy(e->prim);
    if (e->mem_a) dnnl_memory_destroy(e->mem_a);
    if (e->mem_b) dnnl_memory_destroy(e->mem_b);
    if (e->mem_c) dnnl_memory_destroy(e->mem_c);
    if (e->mem_scratch) dnnl_memory_destroy(e->mem_scratch);
    memset(e, 0, sizeof *e);
}

void mxi_gemm_ctx_destroy(mxi_gemm_ctx *ctx) {
    if (!ctx) return;
    for (int i = 0; i < ctx->cached; i++) entry_destroy(&ctx->cache[i]);
    buffer_free(&ctx->widen_a);
    buffer_free(&ctx->widen_b);
    buffer_free(&ctx->scratch);
    for (int i = 0; i < MXI_GEMM_SLOTS; i++) buffer_free(&ctx->slots[i]);
    dnnl_stream_destroy(ctx->stream);
    dnnl_engine_destroy(ctx->engine);
    free(ctx);
}

void mxi_gemm_ctx_stats(const mxi_gemm_ctx *ctx, mxi_gemm_stats *out) {
    if (!ctx || !out) return;
    *out = ctx->stats;
    out->cached = ctx->cached;
    out->bf16_native = ctx->bf16_native;
    out->buffer_bytes = ctx->widen_a.cap + ctx->widen_b.cap + ctx->scratch.cap;
    for (int i = 0; i < MXI_GEMM_SLOTS; i++) out->buffer_bytes += ctx->slots[i].cap;
}

/* ---- primitives ---- */

/* oneDNN generates machine code while it creates a primitive and does not survive running
 * out of memory there (it crashes instead of returning out_of_memory). So a primitive is
 * only created with this much memory free: the first of a context (the first in a process
 * generates oneDNN's GEMM kernels, about 6 MiB), then the rest (about 0.3 MiB each). Checked
 * by mapping it, which ulimit -v and strict overcommit both count. */
enum { FIRST_HEADROOM = 64 << 20, HEADROOM = 4 << 20 };

static bool have_headroom(size_t bytes) {
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return false;
    munmap(p, bytes);
    return true;
}

/* The memory descriptors of key's operands with M = m and K = k (DNNL_RUNTIME_DIM_VAL for a
 * dim left to run time). Logical shapes are (M, K) x (K, N); a transpose is just swapped
 * strides. */
static dnnl_status_t make_mds(const prim_key *key, int64_t m, int64_t k, dnnl_memory_desc_t *a_md,
                              dnnl_memory_desc_t *b_md, dnnl_memory_desc_t *c_md) {
    enum { nd = 2 };
    dnnl_dims_t a_dims = {m, k}, b_dims = {k, key->n}, c_dims = {m, key->n};
    dnnl_dims_t a_str = {key->lda, 1}, b_str = {key->ldb, 1}, c_str = {key->ldc, 1};
    if (key->trans_a) { a_str[0] = 1; a_str[1] = key->lda; }
    if (key->trans_b) { b_str[0] = 1; b_str[1] = key->ldb; }
    dnnl_status_t st;
    if ((st = dnnl_memory_desc_init_by_strides(a_md, nd, a_dims, (dnnl_data_type_t)key->a_type, a_str))) return st;
    if ((st = dnnl_memory_desc_init_by_strides(b_md, nd, b_dims, (dnnl_data_type_t)key->b_type, b_str))) return st;
    return dnnl_memory_desc_init_by_strides(c_md, nd, c_dims, dnnl_f32, c_str);
}

/* Create the primitive of key into e. impl receives oneDNN's implementation name. */
static dnnl_status_t entry_create(mxi_gemm_ctx *ctx, const prim_key *key, prim_entry *e,
                                  char *impl, size_t impl_size) {
    memset(e, 0, sizeof *e);
    e->key = *key;
    dnnl_memory_desc_t a_md, b_md, c_md;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t post_ops = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_matmul_desc_t desc;
    dnnl_status_t st;
    double t0 = mxi_now_seconds();
    int64_t m = key->runtime & MXI_GEMM_RUNTIME_M ? DNNL_RUNTIME_DIM_VAL : key->m;
    int64_t k = key->runtime & MXI_GEMM_RUNTIME_K ? DNNL_RUNTIME_DIM_VAL : key->k;
    if ((st = make_mds(key, m, k, &a_md, &b_md, &c_md))) goto done;
    if ((st = dnnl_matmul_desc_init(&desc, &a_md, &b_md, NULL, &c_md))) goto done;
    if ((st = dnnl_primitive_attr_create(&attr))) goto done;
    // The scratchpad comes from the context, so executing allocates nothing of oneDNN's own
    // beyond what its GEMM kernels do internally.
    if ((st = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user))) goto done;
    if (key->accumulate) {
        if ((st = dnnl_post_ops_create(&post_ops))) goto done;
        if ((st = dnnl_post_ops_append_sum(post_ops, 1.0f))) goto done;
        if ((st = dnnl_primitive_attr_set_post_ops(attr, post_ops))) goto done;
    }
    // the descriptor's creation already allocates inside oneDNN: the headroom first
    if (!have_headroom(ctx->stats.primitives_created ? HEADROOM : FIRST_HEADROOM)) {
        st = dnnl_out_of_memory;
        goto done;
    }
    if ((st = dnnl_primitive_desc_create(&pd, &desc, attr, ctx->engine, NULL))) goto done;
    const char *name = NULL;
    if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &name) == dnnl_success && name)
        snprintf(impl, impl_size, "%s", name);
    const dnnl_memory_desc_t *s_md = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    e->scratch_bytes = s_md ? dnnl_memory_desc_get_size(s_md) : 0;
    if (e->scratch_bytes == DNNL_RUNTIME_SIZE_VAL) {   // a scratchpad sized at run time: not for us
        st = dnnl_unimplemented;
        goto done;
    }
    if (!have_headroom(ctx->stats.primitives_created ? HEADROOM : FIRST_HEADROOM)) {
        st = dnnl_out_of_memory;
        goto done;
    }
    if ((st = dnnl_primitive_create(&e->prim, pd))) goto done;
    if (!key->runtime) {   // run-time shapes: the call makes memory objects of its own shape
        if ((st = dnnl_memory_create(&e->mem_a, &a_md, ctx->engine, DNNL_MEMORY_NONE))) goto done;
        if ((st = dnnl_memory_create(&e->mem_b, &b_md, ctx->engine, DNNL_MEMORY_NONE))) goto done;
        if ((st = dnnl_memory_create(&e->mem_c, &c_md, ctx->engine, DNNL_MEMORY_NONE))) goto done;
    }
    if (e->scratch_bytes && (st = dnnl_memory_create(&e->mem_scratch, s_md, ctx->engine, DNNL_MEMORY_NONE))) goto done;
done:
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (post_ops) dnnl_post_ops_destroy(post_ops);
    if (attr) dnnl_primitive_attr_destroy(attr);
    if (st != dnnl_success) entry_destroy(e);
    ctx->stats.create_seconds += mxi_now_seconds() - t0;
    return st;
}

static prim_entry *cache_find(mxi_gemm_ctx *ctx, const prim_key *key) {
    for (int i = 0; i < ctx->cached; i++)
        if (memcmp(&ctx->cache[i].key, key, sizeof *key) == 0) return &ctx->cache[i];
    return NULL;
}

/* A free cache slot, evicting the least recently used primitive when full. */
static prim_entry *cache_slot(mxi_gemm_ctx *ctx) {
    if (ctx->cached < MXI_GEMM_CACHE_CAP) return &ctx->cache[ctx->cached++];
    prim_entry *lru = &ctx->cache[0];
    for (int i = 1; i < MXI_GEMM_CACHE_CAP; i++)
        if (ctx->cache[i].last_use < lru->last_use) lru = &ctx->cache[i];
    entry_destroy(lru);
    ctx->stats.cache_evictions++;
    return lru;
}

/* Drop a slot cache_slot handed out whose primitive could not be created. */
static void cache_unslot(mxi_gemm_ctx *ctx, prim_entry *e) {
    prim_entry *last = &ctx->cache[ctx->cached - 1];
    if (e != last) *e = *last;
    memset(last, 0, sizeof *last);
    ctx->cached--;
}

/* The cached primitive of key, created at first use; m and k are the call's sizes. A key
 * with run-time dims whose primitive oneDNN cannot make, or makes only with its reference
 * implementation (far slower than a fixed-shape primitive), becomes a fixed-shape key, and
 * the context stops asking for run-time dims of that dtype. */
static int get_entry(mxi_gemm_ctx *ctx, prim_key *key, int64_t m, int64_t k, prim_entry **out, mx_diag *diag) {
    prim_entry *e = cache_find(ctx, key);
    if (e) {
        ctx->stats.cache_hits++;
    } else {
        e = cache_slot(ctx);
        char impl[64] = "";
        dnnl_status_t st = entry_create(ctx, key, e, impl, sizeof impl);
        if (key->runtime && st != dnnl_out_of_memory && (st != dnnl_success || strncmp(impl, "ref", 3) == 0)) {
            snprintf(ctx->stats.runtime_impl, sizeof ctx->stats.runtime_impl, "fixed shapes (run-time dims: %.60s)",
                     st != dnnl_success ? dnnl_status2str(st) : impl);
            if (st == dnnl_success) entry_destroy(e);
            cache_unslot(ctx, e);
            ctx->runtime_off[key->a_type == dnnl_bf16] = true;
            key->runtime = 0, key->m = m, key->k = k;
            return get_entry(ctx, key, m, k, out, diag);
        }
        if (st != dnnl_success) {
            cache_unslot(ctx, e);
            char what[160];
            snprintf(what, sizeof what, "a oneDNN matmul (M=%lld, N=%lld, K=%lld, %s x %s)",
                     (long long)m, (long long)key->n, (long long)k,
                     dnnl_dt2str((dnnl_data_type_t)key->a_type), dnnl_dt2str((dnnl_data_type_t)key->b_type));
            if (st == dnnl_out_of_memory)
                return mxi_diag(diag, MX_ENOMEM, "out of memory creating %s: it needs %d MiB free", what,
                                (ctx->stats.primitives_created ? HEADROOM : FIRST_HEADROOM) >> 20);
            char creating[192];
            snprintf(creating, sizeof creating, "creating %s", what);
            return mxi_gemm_dnnl_error(diag, st, creating);
        }
        ctx->stats.primitives_created++;
        if (key->runtime) {
            ctx->stats.runtime_primitives++;
            snprintf(ctx->stats.runtime_impl, sizeof ctx->stats.runtime_impl, "%s", impl);
        }
        if (key->a_type == dnnl_f32 && key->b_type == dnnl_f32)
            snprintf(ctx->stats.f32_impl, sizeof ctx->stats.f32_impl, "%s", impl);
    }
    e->last_use = ++ctx->tick;
    *out = e;
    return MX_OK;
}

/* Run e on A, B, C with M = m and K = k (its own sizes unless its key leaves them to run
 * time: then memory objects of this call's shape are made and dropped, a few hundred bytes,
 * while the primitive and its generated code are reused). */
static int execute(mxi_gemm_ctx *ctx, prim_entry *e, const void *A, const void *B, float *C, int64_t m, int64_t k,
                   mx_diag *diag) {
    void *scratch = NULL;
    if (e->scratch_bytes) {
        scratch = buffer_get(&ctx->scratch, e->scratch_bytes);
        if (!scratch) return mxi_diag(diag, MX_ENOMEM, "oneDNN matmul scratchpad: out of memory (%zu bytes)", e->scratch_bytes);
    }
    dnnl_memory_t mem[3] = {e->mem_a, e->mem_b, e->mem_c};
    dnnl_status_t st = dnnl_success;
    if (e->key.runtime) {
        dnnl_memory_desc_t md[3];
        mem[0] = mem[1] = mem[2] = NULL;
        if (!(st = make_mds(&e->key, m, k, &md[0], &md[1], &md[2])) &&
            !(st = dnnl_memory_create(&mem[0], &md[0], ctx->engine, (void *)A)) &&
            !(st = dnnl_memory_create(&mem[1], &md[1], ctx->engine, (void *)B)))
            st = dnnl_memory_create(&mem[2], &md[2], ctx->engine, C);
    } else if (!(st = dnnl_memory_set_data_handle(mem[0], (void *)A)) &&
               !(st = dnnl_memory_set_data_handle(mem[1], (void *)B))) {
        st = dnnl_memory_set_data_handle(mem[2], C);
    }
    if (!st && scratch) st = dnnl_memory_set_data_handle(e->mem_scratch, scratch);
    if (st) {
        if (e->key.runtime)
            for (int i = 0; i < 3; i++) if (mem[i]) dnnl_memory_destroy(mem[i]);
        return mxi_gemm_dnnl_error(diag, st, "setting oneDNN matmul buffers");
    }
    dnnl_exec_arg_t args[4] = {
        {DNNL_ARG_SRC, mem[0]}, {DNNL_ARG_WEIGHTS, mem[1]}, {DNNL_ARG_DST, mem[2]},
        {DNNL_ARG_SCRATCHPAD, e->mem_scratch},
    };
    st = dnnl_primitive_execute(e->prim, ctx->stream, scratch ? 4 : 3, args);
    if (st == dnnl_success) st = dnnl_stream_wait(ctx->stream);
    if (e->key.runtime)
        for (int i = 0; i < 3; i++) dnnl_memory_destroy(mem[i]);
    if (st != dnnl_success) return mxi_gemm_dnnl_error(diag, st, "executing a oneDNN matmul");
    return MX_OK;
}

/* Whether this context runs bf16 x bf16 natively: decided once, by trying to create the
 * primitive of the first bf16 call. oneDNN's reference implementation does not count (it
 * is far slower than widening to fp32). On success the primitive stays in the cache. */
static void probe_bf16(mxi_gemm_ctx *ctx, const prim_key *key) {
    prim_entry *e = cache_slot(ctx);
    char impl[64] = "";
    dnnl_status_t st = entry_create(ctx, key, e, impl, sizeof impl);
    if (st != dnnl_success) {
        cache_unslot(ctx, e);
        snprintf(ctx->stats.bf16_probe, sizeof ctx->stats.bf16_probe, "%s", dnnl_status2str(st));
        ctx->bf16_native = 0;
        return;
    }
    snprintf(ctx->stats.bf16_probe, sizeof ctx->stats.bf16_probe, "%s", impl);
    if (strncmp(impl, "ref", 3) == 0) {
        entry_destroy(e);
        cache_unslot(ctx, e);
        ctx->bf16_native = 0;
        return;
    }
    ctx->stats.primitives_created++;
    e->last_use = ++ctx->tick;
    ctx->bf16_native = 1;
}

bool mxi_gemm_bf16_native(mxi_gemm_ctx *ctx) {
    if (ctx->bf16_native < 0) {
        prim_key key = {.m = 64, .n = 64, .k = 64, .lda = 64, .ldb = 64, .ldc = 64, .a_type = dnnl_bf16,
                        .b_type = dnnl_bf16, .threads = omp_get_max_threads()};
        probe_bf16(ctx, &key);
    }
    return ctx->bf16_native == 1;
}

/* ---- the product ---- */

enum { MIN_ELEMENTS_PER_THREAD = 1 << 16 };

/* x (rows, cols) bf16 with leading dim ld -> a dense fp32 buffer. */
static float *widen(buffer *buf, const uint16_t *x, int64_t ld, int64_t rows, int64_t cols) {
    float *y = buffer_get(buf, (size_t)(rows * cols) * sizeof(float));
    if (!y) return NULL;
    const mxi_ops_kernels *k = mxi_ops_kernels_active();
    int64_t chunk = MIN_ELEMENTS_PER_THREAD / (cols ? cols : 1) + 1;   // rows per task
    int64_t chunks = (rows + chunk - 1) / chunk;
    #pragma omp parallel for schedule(static) if (chunks > 1)
    for (int64_t i = 0; i < chunks; i++) {
        int64_t r0 = i * chunk, n = rows - r0 < chunk ? rows - r0 : chunk;
        k->widen_bf16(y + r0 * cols, x + r0 * ld, ld, n, cols);
    }
    return y;
}

/* Check one matrix of rows x cols with leading dim *ld (0 becomes cols). */
static int check_matrix(const char *name, int64_t rows, int64_t cols, int64_t *ld, size_t elem, mx_diag *diag) {
    if (*ld == 0) *ld = cols;
    if (*ld < cols || *ld < 0)
        return mxi_diag(diag, MX_ESIZE, "mxi_matmul: leading dim of %s is %lld; allowed: 0 (dense) or >= its row length %lld",
                        name, (long long)*ld, (long long)cols);
    // the last element is at (rows-1)*ld + cols-1: that many elements must be addressable
    if (rows > 0 && cols > 0 &&
        ((uint64_t)(rows - 1) > (uint64_t)(INT64_MAX - cols) / (uint64_t)(*ld ? *ld : 1) ||
         (uint64_t)((rows - 1) * *ld + cols) > SIZE_MAX / elem))
        return mxi_diag(diag, MX_ESIZE, "mxi_matmul: %s of %lld x %lld with leading dim %lld overflows the address space",
                        name, (long long)rows, (long long)cols, (long long)*ld);
    return MX_OK;
}

int mxi_matmul(mxi_gemm_ctx *ctx, float *C, int64_t ldc,
               const void *A, mxi_dtype a_type, bool trans_a, int64_t lda,
               const void *B, mxi_dtype b_type, bool trans_b, int64_t ldb,
               int64_t M, int64_t N, int64_t K, bool accumulate, mx_diag *diag) {
    mxi_matmul_args args = {.C = C, .ldc = ldc, .a = {A, a_type, trans_a, lda}, .b = {B, b_type, trans_b, ldb},
                            .M = M, .N = N, .K = K, .accumulate = accumulate};
    return mxi_matmul_ex(ctx, &args, diag);
}

/* The key of a product; dims in runtime (unless the context found no fast implementation
 * for them in this dtype) are left out, so every size of them shares one primitive. */
static prim_key make_key(const mxi_gemm_ctx *ctx, unsigned runtime, int64_t M, int64_t N, int64_t K, int64_t lda,
                         int64_t ldb, int64_t ldc, int type, bool trans_a, bool trans_b, bool accumulate) {
    prim_key key = {.m = M, .n = N, .k = K, .lda = lda, .ldb = ldb, .ldc = ldc, .a_type = type, .b_type = type,
                    .trans_a = trans_a, .trans_b = trans_b, .accumulate = accumulate,
                    .threads = omp_get_max_threads()};
    if (runtime && !ctx->runtime_off[type == dnnl_bf16]) {
        key.runtime = runtime;
        if (runtime & MXI_GEMM_RUNTIME_M) key.m = 0;
        if (runtime & MXI_GEMM_RUNTIME_K) key.k = 0;
    }
    return key;
}

int mxi_matmul_ex(mxi_gemm_ctx *ctx, const mxi_matmul_args *args, mx_diag *diag) {
    if (!ctx || !args) return mxi_diag(diag, MX_ENULL, "mxi_matmul: %s is NULL", !ctx ? "context" : "args");
    unsigned runtime = args->runtime;
    float *C = args->C;
    int64_t ldc = args->ldc, lda = args->a.ld, ldb = args->b.ld, M = args->M, N = args->N, K = args->K;
    const void *A = args->a.data, *B = args->b.data;
    mxi_dtype a_type = args->a.type, b_type = args->b.type;
    bool trans_a = args->a.trans, trans_b = args->b.trans, accumulate = args->accumulate;
    if (runtime & ~(unsigned)(MXI_GEMM_RUNTIME_M | MXI_GEMM_RUNTIME_K))
        return mxi_diag(diag, MX_EENUM, "mxi_matmul: run-time dims 0x%x; allowed: MXI_GEMM_RUNTIME_M, MXI_GEMM_RUNTIME_K",
                        runtime);
    if (M < 0 || N < 0 || K < 0)
        return mxi_diag(diag, MX_ESIZE, "mxi_matmul: sizes M=%lld N=%lld K=%lld; allowed: >= 0",
                        (long long)M, (long long)N, (long long)K);
    if (a_type != MXI_F32 && a_type != MXI_BF16)
        return mxi_diag(diag, MX_EENUM, "mxi_matmul: dtype of A is %d; allowed: MXI_F32, MXI_BF16", (int)a_type);
    if (b_type != MXI_F32 && b_type != MXI_BF16)
        return mxi_diag(diag, MX_EENUM, "mxi_matmul: dtype of B is %d; allowed: MXI_F32, MXI_BF16", (int)b_type);
    size_t a_size = a_type == MXI_F32 ? 4 : 2, b_size = b_type == MXI_F32 ? 4 : 2;
    // stored shapes: A (M, K) or (K, M); B (K, N) or (N, K)
    int64_t a_rows = trans_a ? K : M, a_cols = trans_a ? M : K;
    int64_t b_rows = trans_b ? N : K, b_cols = trans_b ? K : N;
    int rc;
    if ((rc = check_matrix("A", a_rows, a_cols, &lda, a_size, diag)) ||
        (rc = check_matrix("B", b_rows, b_cols, &ldb, b_size, diag)) ||
        (rc = check_matrix("C", M, N, &ldc, sizeof(float), diag)))
        return rc;
    if (M == 0 || N == 0) return MX_OK;
    if (!C) return mxi_diag(diag, MX_ENULL, "mxi_matmul: C is NULL for a %lld x %lld product", (long long)M, (long long)N);
    if (K == 0) {   // an empty sum
        if (!accumulate)
            for (int64_t i = 0; i < M; i++) memset(C + i * ldc, 0, (size_t)N * sizeof(float));
        return MX_OK;
    }
    if (!A || !B) return mxi_diag(diag, MX_ENULL, "mxi_matmul: %s is NULL", !A ? "A" : "B");

    if (a_type == MXI_BF16 && b_type == MXI_BF16 && ctx->bf16_native != 0) {
        prim_key key = make_key(ctx, runtime, M, N, K, lda, ldb, ldc, dnnl_bf16, trans_a, trans_b, accumulate);
        if (ctx->bf16_native < 0) {   // probed with this call's own primitive, unless it has run-time dims
            if (key.runtime) mxi_gemm_bf16_native(ctx);
            else probe_bf16(ctx, &key);
        }
        if (ctx->bf16_native == 1) {
            prim_entry *e;
            if ((rc = get_entry(ctx, &key, M, K, &e, diag))) return rc;
            return execute(ctx, e, A, B, C, M, K, diag);
        }
    }
    // No fast bf16 matmul here: widen bf16 operands to fp32 (exact) and run the fp32 one.
    prim_key key = make_key(ctx, runtime, M, N, K, lda, ldb, ldc, dnnl_f32, trans_a, trans_b, accumulate);
    if (a_type == MXI_BF16) {
        A = widen(&ctx->widen_a, A, lda, a_rows, a_cols);
        if (!A) return mxi_diag(diag, MX_ENOMEM, "mxi_matmul: out of memory widening A (%lld x %lld) to fp32",
                                (long long)a_rows, (long long)a_cols);
        key.lda = a_cols;
    }
    if (b_type == MXI_BF16) {
        B = widen(&ctx->widen_b, B, ldb, b_rows, b_cols);
        if (!B) return mxi_diag(diag, MX_ENOMEM, "mxi_matmul: out of memory widening B (%lld x %lld) to fp32",
                                (long long)b_rows, (long long)b_cols);
        key.ldb = b_cols;
    }
    prim_entry *e;
    if ((rc = get_entry(ctx, &key, M, K, &e, diag))) return rc;
    return execute(ctx, e, A, B, C, M, K, diag);
}
