/* Where the model's passes spend their time (model/profile.h). */
#include <string.h>
#include <time.h>

#include "core/clock.h"
#include "model/model_internal.h"

static double thread_cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

mxi_prof_t mxi_prof_start(const mx_model *m) {
    return m->prof_on ? (mxi_prof_t){mxi_now_seconds(), thread_cpu_seconds()} : (mxi_prof_t){0, 0};
}

void mxi_prof_stop(mx_model *m, mxi_model_op op, mxi_prof_t t0) {
    if (!m->prof_on) return;
    m->prof.seconds[op] += mxi_now_seconds() - t0.wall;
    m->prof.cpu_seconds[op] += thread_cpu_seconds() - t0.cpu;
}

void mxi_prof_pass(mx_model *m, mxi_prof_t t0, bool forward) {
    if (!m->prof_on) return;
    double wall = mxi_now_seconds() - t0.wall, cpu = thread_cpu_seconds() - t0.cpu;
    if (forward) m->prof.forward_s += wall, m->prof.forward_cpu_s += cpu, m->prof.forwards++;
    else m->prof.backward_s += wall, m->prof.backward_cpu_s += cpu, m->prof.backwards++;
}

void mxi_model_profile_enable(mx_model *m, bool on) {
    m->prof_on = on;
    memset(&m->prof, 0, sizeof m->prof);
}

mxi_model_profile mxi_model_profile_get(const mx_model *m) { return m->prof; }

const char *mxi_model_op_name(mxi_model_op op) {
    static const char *const names[MXI_OPS] = {
        "attention (products, softmax)", "linear layers (q, k, v, o, dense MLP, lm_head)", "router GEMMs",
        "routing (softmax, top-k, aux loss)", "token permutation (sort, gather, combine)", "expert GEMMs (grouped)",
        "expert SwiGLU"};
    return op >= 0 && op < MXI_OPS ? names[op] : "?";
}

mxi_gemm_ctx *mxi_model_gemm(mx_model *m) { return mxi_linear_ctx_gemm(m->lin); }

void mxi_model_fixed_expert_shapes(mx_model *m, bool yes) { m->fixed_expert_shapes = yes; }
