/* Delayed scaling's state and arithmetic (see delayed.h). */
#include "model/delayed.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/linear.h"
#include "mxtrain/scaled.h"
#include "numerics/mx_internal.h"

struct mxi_delayed {
    int len;
    mx_amax_algo algo;
    int margin;
    mx_elem elem[MXI_DELAYED_ROLES];
    int64_t n;            // slots: 3 per (tensor, group)
    float *hist;          // (n, len)
    float *scale;         // (n) the scales the next forward uses
    float *used;          // (n) those of the last forward's start
    double *buf;          // (n) the amaxes an update reduces
    int64_t *first;       // (n_tensors) first slot, -1 where a tensor has none
    int64_t *groups;      // (n_tensors)
    int n_tensors;
    bool training;
    bool record[MXI_DELAYED_ROLES];
};

float mxi_delayed_target(mx_elem elem, mxi_delayed_role role) {
    if (elem == MX_HIF8) return role == MXI_DELAYED_GRAD ? MXI_HIF8_TARGET_GRAD : MXI_HIF8_TARGET_ACT;
    const mx_elem_traits *t = mx_elem_traits_of(elem);
    return t ? t->max : 1.0f;
}

/* The largest of 0 and the entries, a NaN ignored: TE's fmaxf over the history, in four
 * independent lanes (`>` is false for NaN) rather than a libm call an entry. */
static float history_max(const float *hist, int len) {
    float m[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    int i = 0;
    for (; i + 4 <= len; i += 4)
        for (int j = 0; j < 4; j++) m[j] = hist[i + j] > m[j] ? hist[i + j] : m[j];
    for (; i < len; i++) m[0] = hist[i] > m[0] ? hist[i] : m[0];
    for (int j = 1; j < 4; j++) m[0] = m[j] > m[0] ? m[j] : m[0];
    return m[0];
}

void mxi_delayed_update_slot(float *hist, int len, mx_amax_algo algo, float max, int margin, bool hif8,
                             float *scale) {
    float last = hist[0], amax = history_max(hist, len);
    if (algo == MX_AMAX_MOST_RECENT) amax = last;
    if (isfinite(amax) && amax > 0.0f) {
        float s;
        if (hif8) {   // the hif8 recipe's dequantization scale, widened by the margin
            s = ldexpf(amax * (1.0f / max), margin);
            if (!(s > 0.0f) || isinf(s)) s = *scale;
        } else {      // TE: scaled_max = fp8_max * 2^-margin, scale = scaled_max / amax
            s = ldexpf(max, -margin) / amax;
            if (isinf(s)) s = FLT_MAX;
        }
        *scale = s;
    }
    // TE's roll: entry i + 1 to i, the newest (slot 0) to the end, slot 0 zeroed for the next
    for (int i = 1; i < len - 1; i++) hist[i] = hist[i + 1];
    if (len > 1) hist[len - 1] = last;
    hist[0] = 0.0f;
}

int mxi_delayed_create(mxi_delayed **out, const mx_plan *plan, int n_tensors, const int64_t *groups) {
    *out = NULL;
    mxi_delayed *d = calloc(1, sizeof *d);
    if (!d) return MX_ENOMEM;
    d->len = plan->amax_history_len > 0 ? plan->amax_history_len : 1;
    d->algo = plan->amax_compute_algo;
    d->margin = plan->margin;
    d->elem[MXI_DELAYED_INPUT] = plan->recipe.inputs;
    d->elem[MXI_DELAYED_WEIGHT] = plan->recipe.weight;
    d->elem[MXI_DELAYED_GRAD] = plan->recipe.grads;
    d->n_tensors = n_tensors;
    d->first = malloc((size_t)(n_tensors + 1) * sizeof *d->first);
    d->groups = malloc((size_t)(n_tensors + 1) * sizeof *d->groups);
    if (!d->first || !d->groups) {
        mxi_delayed_free(d);
        return MX_ENOMEM;
    }
    for (int i = 0; i < n_tensors; i++) {
        d->first[i] = groups[i] > 0 ? d->n : -1;
        d->groups[i] = groups[i];
        if (groups[i] > 0) d->n += MXI_DELAYED_ROLES * groups[i];
    }
    size_t n = (size_t)d->n + 1;
    d->hist = calloc(n * (size_t)d->len, sizeof *d->hist);
    d->scale = malloc(n * sizeof *d->scale);
    d->used = malloc(n * sizeof *d->used);
    d->buf = malloc(n * sizeof *d->buf);
    if (!d->hist || !d->scale || !d->used || !d->buf) {
        mxi_delayed_free(d);
        return MX_ENOMEM;
    }
    for (int64_t s = 0; s < d->n; s++) d->scale[s] = d->used[s] = 1.0f;   // TE's initial scale
    *out = d;
    return MX_OK;
}

uint64_t mxi_delayed_bytes(const mxi_delayed *d) {
    if (!d) return 0;
    uint64_t n = (uint64_t)d->n + 1;   // as mxi_delayed_create allocates
    return sizeof *d + n * ((uint64_t)d->len * sizeof *d->hist + sizeof *d->scale + sizeof *d->used + sizeof *d->buf) +
           (uint64_t)(d->n_tensors + 1) * (sizeof *d->first + sizeof *d->groups);
}

void mxi_delayed_free(mxi_delayed *d) {
    if (!d) return;
    free(d->hist), free(d->scale), free(d->used), free(d->buf), free(d->first), free(d->groups);
    free(d);
}

mxi_delayed_site mxi_delayed_site_of(mxi_delayed *d, int tensor, int64_t group) {
    if (!d || tensor < 0 || tensor >= d->n_tensors || d->first[tensor] < 0 || group < 0 ||
        group >= d->groups[tensor])
        return (mxi_delayed_site){0};
    return (mxi_delayed_site){.state = d, .slot = d->first[tensor] + MXI_DELAYED_ROLES * group};
}

void mxi_delayed_set_training(mxi_delayed *d, bool on) {
    if (d) d->training = on;
}

void mxi_delayed_begin_forward(mxi_delayed *d) {
    if (!d) return;
    memcpy(d->used, d->scale, (size_t)d->n * sizeof *d->used);
    d->record[MXI_DELAYED_INPUT] = d->record[MXI_DELAYED_WEIGHT] = d->training;
    d->record[MXI_DELAYED_GRAD] = false;
}

void mxi_delayed_begin_backward(mxi_delayed *d) {
    if (!d) return;
    d->record[MXI_DELAYED_INPUT] = d->record[MXI_DELAYED_WEIGHT] = false;
    d->record[MXI_DELAYED_GRAD] = d->training;
}

float mxi_delayed_scale(const mxi_delayed_site *site, mxi_delayed_role role) {
    return site->state->used[site->slot + role];
}

static void fold(mxi_delayed *d, int64_t slot, float amax) {
    float *h0 = &d->hist[slot * d->len];
    if (amax > *h0) *h0 = amax;
}

bool mxi_delayed_records(const mxi_delayed_site *site, mxi_delayed_role role) { return site->state->record[role]; }

void mxi_delayed_note(const mxi_delayed_site *site, mxi_delayed_role role, float amax) {
    if (site->state->record[role]) fold(site->state, site->slot + role, amax);
}

float mxi_delayed_next_scale(const mxi_delayed_site *site, mxi_delayed_role role) {
    return site->state->scale[site->slot + role];
}

void mxi_delayed_note_shard(const mxi_delayed_site *site, mxi_delayed_role role, float amax) {
    if (site->state->training) fold(site->state, site->slot + role, amax);
}

static bool in_phase(int64_t slot, mxi_delayed_phase phase) {
    return (slot % MXI_DELAYED_ROLES == MXI_DELAYED_GRAD) == (phase == MXI_DELAYED_BACKWARD);
}

int mxi_delayed_update(mxi_delayed *d, mxi_delayed_phase phase, mxi_amax_reduce reduce, void *ctx, mx_diag *diag) {
    if (!d) return MX_OK;
    int k = 0;
    for (int64_t s = 0; s < d->n; s++)
        if (in_phase(s, phase)) d->buf[k++] = d->hist[s * d->len];
    if (reduce && k > 0) {   // one all-reduce for every tensor; the rest of each history is the ranks' already
        int rc = reduce(ctx, d->buf, k, diag);
        if (rc) return rc;
    }
    k = 0;
    for (int64_t s = 0; s < d->n; s++) {
        if (!in_phase(s, phase)) continue;
        mxi_delayed_role role = (mxi_delayed_role)(s % MXI_DELAYED_ROLES);
        float *h = &d->hist[s * d->len];
        h[0] = (float)d->buf[k++];   // a max of floats: exact
        mxi_delayed_update_slot(h, d->len, d->algo, mxi_delayed_target(d->elem[role], role), d->margin,
                                d->elem[role] == MX_HIF8, &d->scale[s]);
    }
    return MX_OK;
}

int64_t mxi_delayed_slots(const mxi_delayed *d) { return d ? d->n : 0; }
int mxi_delayed_history_len(const mxi_delayed *d) { return d ? d->len : 0; }
float *mxi_delayed_history(mxi_delayed *d) { return d->hist; }
float *mxi_delayed_scales(mxi_delayed *d) { return d->scale; }
int64_t mxi_delayed_first_slot(const mxi_delayed *d, int tensor) {
    return d && tensor >= 0 && tensor < d->n_tensors ? d->first[tensor] : -1;
}

void mxi_delayed_encode(const float *x, int64_t n, mx_elem elem, float scale, uint8_t *q, float *scale_inv, float *amax) {
    // a slot's scale is positive and finite (1 at first, and an update keeps it so), so the
    // element passes cannot refuse it
    const mx_elem_traits *fp8 = elem == MX_HIF8 ? NULL : mx_elem_traits_of(elem);
    if (amax) *amax = mxi_encode_amax(q, x, n, scale, fp8);
    else if (fp8) mx_fp8_encode_f32(x, n, elem, scale, q);
    else mx_hif8_encode_f32(x, n, scale, q);
    *scale_inv = fp8 ? 1.0f / scale : scale;
}
