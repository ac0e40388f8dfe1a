/* Where an MoE model's training step goes: forward and backward of a Qwen3-MoE (the model
 * of bench/moe33m.sh by default) on a new random batch each step, so that the tokens each
 * expert receives change from step to step as in training, timed per op (model/profile.h),
 * with the oneDNN primitives the step creates and the process's memory.
 *
 *   build/bench/bench_moe [--steps N] [--precision bf16|fp32|mxfp8] [--shapes runtime|fixed]
 *                         [--experts E] [--top-k K] [--hidden C] [--moe-intermediate FE]
 *                         [--layers L] [--heads NH] [--kv-heads NKV] [--batch B] [--seq T]
 *
 * --shapes fixed runs the experts' GEMMs as before run-time dims: one primitive per group
 * size. The first step is a warm-up (it creates every primitive of the fixed shapes) and is
 * reported apart. Model forward and backward only: no FSDP, no optimizer (bench_train.sh
 * times whole steps); fp32 weights, so bf16 rounds them and MXFP8 quantizes them at every
 * GEMM (in training FSDP gathers them so). OMP_NUM_THREADS sets the threads; set
 * OMP_WAIT_POLICY=passive as mxtrain does (docs/training.md#threads). Per op it prints wall
 * and the model thread's CPU milliseconds: at 1 thread the CPU figures are what the op
 * costs, whatever else runs on the machine. Prints Markdown. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"
#include "model/profile.h"
#include "mxtrain/model.h"
#include "mxtrain/plan.h"
#include "ops/gemm.h"

/* Virtual and resident size of this process, in MiB, from /proc/self/status. */
static void memory(double *vm_mib, double *rss_mib, double *hwm_mib) {
    *vm_mib = *rss_mib = *hwm_mib = 0;
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return;
    char line[256];
    long long kb;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "VmSize: %lld kB", &kb) == 1) *vm_mib = kb / 1024.0;
        if (sscanf(line, "VmRSS: %lld kB", &kb) == 1) *rss_mib = kb / 1024.0;
        if (sscanf(line, "VmHWM: %lld kB", &kb) == 1) *hwm_mib = kb / 1024.0;
    }
    fclose(f);
}

static const char usage[] =
    "usage: bench_moe [--steps N] [--precision bf16|fp32|mxfp8] [--shapes runtime|fixed] [--experts E] [--top-k K]\n"
    "                 [--hidden C] [--moe-intermediate FE] [--layers L] [--heads NH] [--kv-heads NKV] [--batch B]\n"
    "                 [--seq T]\n";

int main(int argc, char **argv) {
    int steps = 6, B = 8, T = 256;
    const char *precision = "bf16", *shapes = "runtime";
    mx_model_config c = {0};
    c.type = MX_MODEL_QWEN3_MOE;
    c.vocab_size = 257, c.hidden_size = 512, c.num_hidden_layers = 6, c.num_attention_heads = 8;
    c.num_key_value_heads = 4, c.head_dim = 64, c.intermediate_size = 1536, c.rms_norm_eps = 1e-6f;
    c.rope_theta = 1000000.0f, c.max_position_embeddings = 256, c.initializer_range = 0.02f;
    c.num_experts = 16, c.num_experts_per_tok = 2, c.moe_intermediate_size = 192, c.decoder_sparse_step = 1;
    c.norm_topk_prob = true, c.output_router_logits = true, c.router_aux_loss_coef = 0.001f;
    for (int i = 1; i < argc; i += 2) {   // every option takes a value
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int *n = !strcmp(a, "--steps") ? &steps : !strcmp(a, "--experts") ? &c.num_experts
               : !strcmp(a, "--top-k") ? &c.num_experts_per_tok : !strcmp(a, "--hidden") ? &c.hidden_size
               : !strcmp(a, "--moe-intermediate") ? &c.moe_intermediate_size : !strcmp(a, "--layers") ? &c.num_hidden_layers
               : !strcmp(a, "--heads") ? &c.num_attention_heads : !strcmp(a, "--kv-heads") ? &c.num_key_value_heads
               : !strcmp(a, "--batch") ? &B : !strcmp(a, "--seq") ? &T : NULL;
        if (v && n) {
            char *end;
            long x = strtol(v, &end, 10);
            if (*end || x < 1 || x > 1 << 20) {
                fprintf(stderr, "bench_moe: %s %s: allowed: an integer from 1 to %d\n", a, v, 1 << 20);
                return 2;
            }
            *n = (int)x;
        } else if (v && !strcmp(a, "--precision") && (!strcmp(v, "bf16") || !strcmp(v, "fp32") || !strcmp(v, "mxfp8"))) {
            precision = v;
        } else if (v && !strcmp(a, "--shapes") && (!strcmp(v, "runtime") || !strcmp(v, "fixed"))) {
            shapes = v;
        } else {
            fprintf(stderr, "bench_moe: bad argument '%s'\n%s", a, usage);
            return 2;
        }
    }
    if (steps < 2) {
        fprintf(stderr, "bench_moe: --steps %d: allowed: at least 2 (one warm-up)\n", steps);
        return 2;
    }
    c.head_dim = c.hidden_size / c.num_attention_heads;
    c.max_position_embeddings = T;
    mx_diag diag = {{0}};
    int rc = mx_model_config_check(&c, &diag);
    if (rc) {
        fprintf(stderr, "bench_moe: %s\n", diag.msg);
        return 2;
    }
    mx_plan plan;
    bool mx = !strcmp(precision, "mxfp8");
    if (mx) {   // the plan of examples/qwen3_moe_mxfp8.yaml
        static const char yaml[] =
            "training:\n  quantization_plan:\n    recipe_name: mxfp8\n    apply_modules: ['model.layers.{*}']\n"
            "    ignored_modules: ['*lm_head', '*gate']\n    quant_converters: ['quantize.linear.mx', 'quantize.moe.mx']\n";
        if ((rc = mx_plan_load_string(yaml, "bench_moe plan", &plan, &diag))) {
            fprintf(stderr, "bench_moe: %s\n", diag.msg);
            return 1;
        }
    }
    mx_model_options opt = {.batch = B, .seq = T, .bf16 = strcmp(precision, "fp32") != 0, .plan = mx ? &plan : NULL};
    mx_model *m = NULL;
    if ((rc = mx_model_create(&c, &opt, &m, &diag))) {
        fprintf(stderr, "bench_moe: %s\n", diag.msg);
        return 1;
    }
    mx_model_init(m, 1234);
    mxi_model_fixed_expert_shapes(m, !strcmp(shapes, "fixed"));
    int N = B * T;
    int32_t *inputs = malloc((size_t)(N + 1) * sizeof *inputs);
    if (!inputs) return 1;
    uint64_t s = 88172645463325252ull;
    mxi_gemm_stats st0, st1;
    mxi_model_profile warm = {0};
    double warm_s = 0, t_start = 0;
    int64_t created_warm = 0;
    for (int step = 0; step < steps; step++) {
        for (int i = 0; i <= N; i++) {   // a new batch each step: new group sizes
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            inputs[i] = (int32_t)(s % (uint64_t)c.vocab_size);
        }
        if (step == 1) {   // the timed steps start here
            warm = mxi_model_profile_get(m);
            mxi_gemm_ctx_stats(mxi_model_gemm(m), &st0);
            created_warm = st0.primitives_created;
            mxi_model_profile_enable(m, true);
            t_start = mxi_now_seconds();
        }
        if (step == 0) {
            mxi_model_profile_enable(m, true);
            t_start = mxi_now_seconds();
        }
        mx_model_forward(m, inputs, inputs + 1);
        mx_model_backward(m, 1.0f);
        if ((rc = mx_model_error(m, &diag))) {
            fprintf(stderr, "bench_moe: step %d: %s\n", step + 1, diag.msg);
            return 1;
        }
        if (step == 0) warm_s = mxi_now_seconds() - t_start;
    }
    double wall = mxi_now_seconds() - t_start;
    int timed = steps - 1;
    mxi_model_profile p = mxi_model_profile_get(m);
    mxi_gemm_ctx_stats(mxi_model_gemm(m), &st1);
    double vm, rss, hwm;
    memory(&vm, &rss, &hwm);
    char cpu[256];
    cpu_model(cpu, sizeof cpu);
    const char *threads = getenv("OMP_NUM_THREADS");
    printf("# bench_moe: %s, OMP_NUM_THREADS=%s, %s, expert GEMM shapes: %s\n", cpu, threads ? threads : "(unset)",
           precision, shapes);
    printf("Model: Qwen3-MoE, hidden %d, %d layers, %d heads (%d KV), %d experts, top-%d, expert intermediate %d, "
           "vocab %d; batch %d x %d = %d tokens, %d routed rows per layer.\n\n", c.hidden_size, c.num_hidden_layers,
           c.num_attention_heads, c.num_key_value_heads, c.num_experts, c.num_experts_per_tok,
           c.moe_intermediate_size, c.vocab_size, B, T, N, N * c.num_experts_per_tok);
    // wall ms, and the model thread's CPU ms (all the CPU time at 1 thread), per timed step
    printf("| op (forward + backward) | wall ms per step | CPU ms per step (model thread) | share of CPU |\n"
           "|---|---|---|---|\n");
    double total = 1e3 * (p.forward_s + p.backward_s) / timed, total_cpu = 1e3 * (p.forward_cpu_s + p.backward_cpu_s) / timed;
    double named = 0, named_cpu = 0;
    for (int op = 0; op < MXI_OPS; op++) {
        double ms = 1e3 * p.seconds[op] / timed, cpu_ms = 1e3 * p.cpu_seconds[op] / timed;
        named += ms, named_cpu += cpu_ms;
        printf("| %s | %.1f | %.1f | %.1f %% |\n", mxi_model_op_name((mxi_model_op)op), ms, cpu_ms,
               100 * cpu_ms / total_cpu);
    }
    printf("| everything else (norms, RoPE, residuals, embedding, dense SwiGLU, cross-entropy) | %.1f | %.1f | %.1f %% |\n",
           total - named, total_cpu - named_cpu, 100 * (total_cpu - named_cpu) / total_cpu);
    printf("| **model step (forward + backward)** | **%.1f** | **%.1f** | |\n\n", total, total_cpu);
    printf("Wall time per timed step %.1f ms (%d timed steps after 1 warm-up step of %.1f ms, %.1f CPU ms on the model "
           "thread, of which %.1f in the expert GEMMs; warm-up: %lld primitives created in %.1f ms).\n",
           1e3 * wall / timed, timed, 1e3 * warm_s, 1e3 * (warm.forward_cpu_s + warm.backward_cpu_s),
           1e3 * warm.cpu_seconds[MXI_OP_EXPERT_GEMM], (long long)created_warm, 1e3 * st0.create_seconds);
    printf("oneDNN primitives: %.1f created per timed step (%lld in all, %lld with run-time dims, implementation %s), "
           "%.2f ms per step creating them, %lld cache evictions, %d cached; fp32 implementation %s.\n",
           (double)(st1.primitives_created - st0.primitives_created) / timed, (long long)st1.primitives_created,
           (long long)st1.runtime_primitives, st1.runtime_impl[0] ? st1.runtime_impl : "-",
           1e3 * (st1.create_seconds - st0.create_seconds) / timed, (long long)st1.cache_evictions, st1.cached,
           st1.f32_impl);
    printf("Process memory at the end: VmSize %.0f MiB, VmRSS %.0f MiB, VmHWM %.0f MiB.\n", vm, rss, hwm);
    free(inputs);
    mx_model_free(m);
    if (mx) mx_plan_free(&plan);
    return 0;
}
