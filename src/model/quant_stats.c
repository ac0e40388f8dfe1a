/* Quantization statistics (see quant_stats.h): a plain scalar pass per operand, in double. */
#include "model/quant_stats.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/diag.h"
#include "mxtrain/scaled.h"

const char *mxi_qs_role_name(mxi_qs_role role) {
    static const char *const names[MXI_QS_ROLES] = {
        [MXI_QS_FPROP_X] = "fprop_x", [MXI_QS_FPROP_W] = "fprop_w", [MXI_QS_DGRAD_DY] = "dgrad_dy",
        [MXI_QS_DGRAD_W] = "dgrad_w", [MXI_QS_WGRAD_DY] = "wgrad_dy", [MXI_QS_WGRAD_X] = "wgrad_x"};
    return (unsigned)role < MXI_QS_ROLES ? names[role] : NULL;
}

mxi_qs_acc mxi_qs_acc_empty(void) { return (mxi_qs_acc){.scale_min = INFINITY, .scale_max = -INFINITY}; }

double mxi_qs_clamp_threshold(mx_elem elem) {
    if (elem == MX_HIF8) return 1.25 * MX_HIF8_MAX;   // the top band has 1 mantissa bit: ulp 2^14
    const mx_elem_traits *t = mx_elem_traits_of(elem);
    return t ? (double)t->max + ldexp(0.5, t->emax - t->mbits) : INFINITY;
}

static double decode(uint8_t code, mx_elem elem) {
    return elem == MX_HIF8 ? (double)mx_hif8_to_f32(code) : (double)mx_fp8_to_f32(code, elem);
}

/* The dequantization scale of element (r, c). */
static double scale_at(const mxi_qs_operand *op, int64_t r, int64_t c) {
    switch (op->scaling) {
    case MXI_QS_BLOCKS: {
        int64_t i = op->axis == MX_ROWWISE ? r * ((op->cols + MX_BLOCK - 1) / MX_BLOCK) + c / MX_BLOCK
                                           : (r / MX_BLOCK) * op->cols + c;
        return (double)mx_e8m0_to_f32(op->e8m0[i]);
    }
    case MXI_QS_TILES: return (double)mx_e8m0_to_f32(op->e8m0[(r / MX_BLOCK) * ((op->cols + MX_BLOCK - 1) / MX_BLOCK) +
                                                             c / MX_BLOCK]);
    case MXI_QS_TENSOR: return op->scale[0];
    case MXI_QS_ROWS: return op->scale[r];
    case MXI_QS_COLS: return op->scale[c];
    case MXI_QS_FP32_BLOCKS: return op->scale[(r / op->brows) * ((op->cols + op->bcols - 1) / op->bcols) + c / op->bcols];
    }
    return NAN;
}

static int64_t scale_count(const mxi_qs_operand *op) {
    switch (op->scaling) {
    case MXI_QS_BLOCKS: return mx_scale_count(op->rows, op->cols, op->axis);
    case MXI_QS_TILES: return mx_tile_scale_count(op->rows, op->cols);
    case MXI_QS_TENSOR: return 1;
    case MXI_QS_ROWS: return op->rows;
    case MXI_QS_COLS: return op->cols;
    case MXI_QS_FP32_BLOCKS: return ((op->rows + op->brows - 1) / op->brows) * ((op->cols + op->bcols - 1) / op->bcols);
    }
    return 0;
}

void mxi_qs_measure(mxi_qs_acc *acc, const float *x, const mxi_qs_operand *op) {
    double clamp = mxi_qs_clamp_threshold(op->elem);
    for (int64_t r = 0; r < op->rows; r++)
        for (int64_t c = 0; c < op->cols; c++) {
            int64_t i = r * op->cols + c;
            double v = x[i], s = scale_at(op, r, c), dq = decode(op->q[i], op->elem) * s;
            acc->numel += 1;
            if (!isfinite(v) || !isfinite(dq)) {
                acc->nonfinite += 1;
                continue;
            }
            if (v != 0 && dq == 0) acc->underflows += 1;
            if (fabs(v) > clamp * s) acc->overflows += 1;   // exact: clamp has few bits, s is a float
            acc->signal += v * v;
            acc->error += (v - dq) * (v - dq);
        }
    int64_t ns = scale_count(op);
    for (int64_t k = 0; k < ns; k++) {
        bool e8m0 = op->scaling == MXI_QS_BLOCKS || op->scaling == MXI_QS_TILES;
        double s = e8m0 ? (double)mx_e8m0_to_f32(op->e8m0[k]) : (double)op->scale[k];
        if (!isfinite(s)) continue;   // a block holding a NaN or an infinity
        if (s < acc->scale_min) acc->scale_min = s;
        if (s > acc->scale_max) acc->scale_max = s;
    }
}

double mxi_qs_underflows_pct(const mxi_qs_acc *a) { return a->numel > 0 ? 100.0 * a->underflows / a->numel : NAN; }
double mxi_qs_overflows_pct(const mxi_qs_acc *a) { return a->numel > 0 ? 100.0 * a->overflows / a->numel : NAN; }

double mxi_qs_mse(const mxi_qs_acc *a) {
    double finite = a->numel - a->nonfinite;
    return finite > 0 ? a->error / finite : NAN;
}

double mxi_qs_sqnr_db(const mxi_qs_acc *a) {
    return a->error > 0 && a->numel > 0 ? 10.0 * log10(a->signal / a->error) : NAN;
}

typedef struct {
    const uint8_t *q;   // the saved plane's codes: its key
    mxi_qs_acc acc;
} saved_plane;

struct mxi_quant_stats {
    int n_tensors, max_saves, n_saves;
    bool on, forward_paused;
    mxi_qs_acc *acc;     // (n_tensors * MXI_QS_ROLES)
    saved_plane *saves;  // (max_saves)
    double *sums, *ext;  // reduce scratch: (entries * 6) counts and sums, (entries * 2) -scale_min and scale_max
};

int mxi_quant_stats_create(mxi_quant_stats **out, int n_tensors, int max_saves) {
    mxi_quant_stats *qs = calloc(1, sizeof *qs);
    size_t entries = (size_t)n_tensors * MXI_QS_ROLES;
    if (qs) {
        qs->acc = calloc(entries, sizeof *qs->acc);
        qs->saves = calloc((size_t)max_saves + 1, sizeof *qs->saves);
        qs->sums = calloc(entries * 6 + 1, sizeof *qs->sums);
        qs->ext = calloc(entries * 2 + 1, sizeof *qs->ext);
    }
    if (!qs || !qs->acc || !qs->saves || !qs->sums || !qs->ext) {
        mxi_quant_stats_free(qs);
        return MX_ENOMEM;
    }
    qs->n_tensors = n_tensors, qs->max_saves = max_saves;
    *out = qs;
    return MX_OK;
}

void mxi_quant_stats_free(mxi_quant_stats *qs) {
    if (!qs) return;
    free(qs->acc);
    free(qs->saves);
    free(qs->sums);
    free(qs->ext);
    free(qs);
}

void mxi_quant_stats_begin(mxi_quant_stats *qs) {
    for (int i = 0; i < qs->n_tensors * MXI_QS_ROLES; i++) qs->acc[i] = mxi_qs_acc_empty();
    qs->n_saves = 0;
    qs->on = true, qs->forward_paused = false;
}

void mxi_quant_stats_end(mxi_quant_stats *qs) { qs->on = false; }

bool mxi_quant_stats_on(const mxi_quant_stats *qs) { return qs && qs->on; }

void mxi_quant_stats_pause_forward(mxi_quant_stats *qs, bool paused) {
    if (qs) qs->forward_paused = paused;
}

void mxi_quant_stats_record(mxi_quant_stats *qs, int tensor, mxi_qs_role role, const float *x, const mxi_qs_operand *op) {
    if (!mxi_quant_stats_on(qs) || !x || tensor < 0 || tensor >= qs->n_tensors) return;
    if (qs->forward_paused && (role == MXI_QS_FPROP_X || role == MXI_QS_FPROP_W)) return;
    mxi_qs_measure(&qs->acc[tensor * MXI_QS_ROLES + role], x, op);
}

void mxi_quant_stats_save(mxi_quant_stats *qs, const float *x, const mxi_qs_operand *op) {
    if (!mxi_quant_stats_on(qs) || !x) return;
    int k = 0;
    while (k < qs->n_saves && qs->saves[k].q != op->q) k++;   // a recompute saves the same plane again
    if (k == qs->n_saves) {
        if (k == qs->max_saves) return;   // sized for every plane of a pass: not reached
        qs->n_saves++;
    }
    qs->saves[k] = (saved_plane){.q = op->q, .acc = mxi_qs_acc_empty()};
    mxi_qs_measure(&qs->saves[k].acc, x, op);
}

void mxi_quant_stats_saved(mxi_quant_stats *qs, int tensor, mxi_qs_role role, const uint8_t *q) {
    if (!mxi_quant_stats_on(qs) || tensor < 0 || tensor >= qs->n_tensors) return;
    for (int k = 0; k < qs->n_saves; k++) {
        if (qs->saves[k].q != q) continue;
        mxi_qs_acc *a = &qs->acc[tensor * MXI_QS_ROLES + role];
        const mxi_qs_acc *b = &qs->saves[k].acc;
        a->numel += b->numel, a->nonfinite += b->nonfinite, a->underflows += b->underflows;
        a->overflows += b->overflows, a->signal += b->signal, a->error += b->error;
        a->scale_min = fmin(a->scale_min, b->scale_min), a->scale_max = fmax(a->scale_max, b->scale_max);
        return;
    }
}

const mxi_qs_acc *mxi_quant_stats_get(const mxi_quant_stats *qs, int tensor, mxi_qs_role role) {
    return &qs->acc[tensor * MXI_QS_ROLES + role];
}

int mxi_quant_stats_reduce(mxi_quant_stats *qs, mxi_qs_reduce sum, mxi_qs_reduce max, void *ctx, mx_diag *diag) {
    int n = qs->n_tensors * MXI_QS_ROLES;
    for (int i = 0; i < n; i++) {
        const mxi_qs_acc *a = &qs->acc[i];
        double *s = qs->sums + 6 * i;
        s[0] = a->numel, s[1] = a->nonfinite, s[2] = a->underflows, s[3] = a->overflows, s[4] = a->signal, s[5] = a->error;
        qs->ext[2 * i] = -a->scale_min, qs->ext[2 * i + 1] = a->scale_max;
    }
    int rc = sum(ctx, qs->sums, 6 * n, diag);
    if (!rc) rc = max(ctx, qs->ext, 2 * n, diag);
    for (int i = 0; !rc && i < n; i++) {
        const double *s = qs->sums + 6 * i;
        qs->acc[i] = (mxi_qs_acc){.numel = s[0], .nonfinite = s[1], .underflows = s[2], .overflows = s[3],
                                  .signal = s[4], .error = s[5], .scale_min = -qs->ext[2 * i],
                                  .scale_max = qs->ext[2 * i + 1]};
    }
    return rc;
}
