/* Internal: the tile loop and the instances of an x86 MX quantization kernel (mx_avx2.c,
 * mx_avx512.c) and the choice among them, included by each after it has defined its `spec`,
 * PLANE_ROW / COL / TILE, PREFETCH_MIN_BYTES, quantize_rows_spec (the fp32 encoder),
 * bf16_tile (the 16-bit encoder's tile) and jam_tile (fp32 rounded to odd onto bf16). One
 * instance per (format, mode, input type), and for the 16-bit encoder per set of planes;
 * every spec is a compile-time constant inside its instance. The NaN code 0x7F is the same
 * for both formats. */
#ifndef MXI_MX_INSTANCES_H
#define MXI_MX_INSTANCES_H

/* Rows [r0, r1) of a job whose elements the 16-bit encoder takes (bf16, or fp32 with
 * FLOOR scales), strip by strip, tile by tile. */
ALWAYS_INLINE void tile_rows(const mxi_quant_job *job, int64_t r0, int64_t r1, spec f, int planes) {
    int64_t cols = job->cols;
    int nplanes = (job->q_row != NULL) + (job->q_col != NULL) + (job->q_tile != NULL);
    bool large = job->rows * cols * nplanes >= PREFETCH_MIN_BYTES;
    uint16_t pad[32 * 32] __attribute__((aligned(64)));
    for (int64_t r = r0; r < r1; r += MX_BLOCK) {
        int64_t nr = r1 - r < MX_BLOCK ? r1 - r : MX_BLOCK;
        for (int64_t c = 0; c < cols; c += MX_BLOCK) {
            int64_t nc = cols - c < MX_BLOCK ? cols - c : MX_BLOCK;
            bool prefetch = large && nr == MX_BLOCK && c + 3 * MX_BLOCK <= cols;   // within the row
            if (f.src == MXI_SRC_F32) {
                const float *x = job->x, *next = c + MX_BLOCK < cols ? x + r * cols + c + MX_BLOCK
                                                 : r + MX_BLOCK < r1 ? x + (r + MX_BLOCK) * cols : NULL;
                jam_tile(pad, x + r * cols + c, cols, nr, nc, large ? next : NULL);
                bf16_tile(job, pad, 32, r, c, nr, nc, f, planes, prefetch);
            } else if (nr == MX_BLOCK && nc == MX_BLOCK) {
                bf16_tile(job, (const uint16_t *)job->x + r * cols + c, cols, r, c, nr, nc, f, planes, prefetch);
            } else {   // an edge tile: zero-padded copy, which leaves every maximum unchanged
                const uint16_t *x = job->x;
                memset(pad, 0, sizeof pad);
                for (int64_t i = 0; i < nr; i++) memcpy(pad + 32 * i, x + (r + i) * cols + c, (size_t)nc * 2);
                bf16_tile(job, pad, 32, r, c, nr, nc, f, planes, false);
            }
        }
    }
}

#define E4M3_SPEC(mode_, src_) \
    ((spec){.mbits = 3, .bias = 7, .emax = 8, .max_code = 0x7E, .max = 448.0f, .mode = mode_, .src = src_})
#define E5M2_SPEC(mode_, src_) \
    ((spec){.mbits = 2, .bias = 15, .emax = 15, .max_code = 0x7B, .max = 57344.0f, .mode = mode_, .src = src_})
#define INSTANCE(name, s) \
    static void name(const mxi_quant_job *job, int64_t r0, int64_t r1) { quantize_rows_spec(job, r0, r1, s); }
INSTANCE(e4m3_rceil_f32, E4M3_SPEC(MX_SCALE_RCEIL, MXI_SRC_F32))
INSTANCE(e5m2_rceil_f32, E5M2_SPEC(MX_SCALE_RCEIL, MXI_SRC_F32))

#define TILE_INSTANCES(name, s) \
    static void name##_row(const mxi_quant_job *job, int64_t r0, int64_t r1) { tile_rows(job, r0, r1, s, PLANE_ROW); } \
    static void name##_col(const mxi_quant_job *job, int64_t r0, int64_t r1) { tile_rows(job, r0, r1, s, PLANE_COL); } \
    static void name##_dual(const mxi_quant_job *job, int64_t r0, int64_t r1) { tile_rows(job, r0, r1, s, PLANE_ROW | PLANE_COL); } \
    static void name##_tile(const mxi_quant_job *job, int64_t r0, int64_t r1) { tile_rows(job, r0, r1, s, PLANE_TILE); }
TILE_INSTANCES(e4m3_floor_bf16, E4M3_SPEC(MX_SCALE_FLOOR, MXI_SRC_BF16))
TILE_INSTANCES(e4m3_rceil_bf16, E4M3_SPEC(MX_SCALE_RCEIL, MXI_SRC_BF16))
TILE_INSTANCES(e5m2_floor_bf16, E5M2_SPEC(MX_SCALE_FLOOR, MXI_SRC_BF16))
TILE_INSTANCES(e5m2_rceil_bf16, E5M2_SPEC(MX_SCALE_RCEIL, MXI_SRC_BF16))
TILE_INSTANCES(e4m3_floor_f32, E4M3_SPEC(MX_SCALE_FLOOR, MXI_SRC_F32))
TILE_INSTANCES(e5m2_floor_f32, E5M2_SPEC(MX_SCALE_FLOOR, MXI_SRC_F32))

typedef void (*instance_fn)(const mxi_quant_job *, int64_t, int64_t);
static const instance_fn rceil_f32_instances[2] = {[MX_E4M3] = e4m3_rceil_f32, [MX_E5M2] = e5m2_rceil_f32};
enum { SET_ROW, SET_COL, SET_DUAL, SET_TILE, N_SETS };   // the sets of planes a job asks for
#define TILE_SETS(name) \
    {[SET_ROW] = name##_row, [SET_COL] = name##_col, [SET_DUAL] = name##_dual, [SET_TILE] = name##_tile}
static const instance_fn tile_instances[2][2][N_SETS] = {   // [elem][src][set], FLOOR scales
    [MX_E4M3] = {[MXI_SRC_F32] = TILE_SETS(e4m3_floor_f32), [MXI_SRC_BF16] = TILE_SETS(e4m3_floor_bf16)},
    [MX_E5M2] = {[MXI_SRC_F32] = TILE_SETS(e5m2_floor_f32), [MXI_SRC_BF16] = TILE_SETS(e5m2_floor_bf16)},
};
static const instance_fn rceil_bf16_instances[2][N_SETS] = {   // [elem][set]
    [MX_E4M3] = TILE_SETS(e4m3_rceil_bf16), [MX_E5M2] = TILE_SETS(e5m2_rceil_bf16)};

/* The kernel's quantize_rows: fp32 with RCEIL scales on the fp32 encoder, everything else
 * on the 16-bit one. */
static void quantize_rows(const mxi_quant_job *job, int64_t r0, int64_t r1) {
    mx_elem elem = job->elem == mx_elem_traits_of(MX_E4M3) ? MX_E4M3 : MX_E5M2;
    if (job->src == MXI_SRC_F32 && job->mode == MX_SCALE_RCEIL) {
        rceil_f32_instances[elem](job, r0, r1);
        return;
    }
    // the public entry points ask for one of these four sets of planes
    int set = job->q_tile ? SET_TILE : job->q_row && job->q_col ? SET_DUAL : job->q_col ? SET_COL : SET_ROW;
    if (job->mode == MX_SCALE_FLOOR) tile_instances[elem][job->src][set](job, r0, r1);
    else rceil_bf16_instances[elem][set](job, r0, r1);
}

#endif
