/* mxtrain: entry point and subcommand dispatch. */
#define _GNU_SOURCE   // sched_getaffinity, CPU_COUNT
#include <errno.h>
#include <sched.h>
#include <stdbool.h>
#include <malloc.h>
#include <stdio.h>
#include <stdio_ext.h>   // __fpending
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "core/file.h"
#include "mxtrain/mx.h"

static const char usage[] =
    "usage: mxtrain <command> [options]\n"
    "\n"
    "commands:\n"
    "  demo      quantize a large heavy-tailed matrix to MXFP8 under both scale modes and\n"
    "            print throughput and error statistics\n"
    "  train     train the model of a config\n"
    "  plan      show which modules a config's quantization plan converts, and why\n"
    "  init      write a config's initial weights as safetensors\n"
    "  grads     one forward and backward pass: loss and gradients as safetensors\n"
    "  export    write a checkpoint as a Hugging Face model directory (config.json, safetensors)\n"
    "  generate  continue prompts with text a checkpoint's model writes (greedy or sampled)\n"
    "  prepare   turn text files into llm.c token shards with a byte-level tokenizer\n"
    "  plot      draw the loss curves of runs' metrics files as a PNG (through gnuplot)\n"
    "  help      print this help (also --help); `mxtrain <command> --help` for a command\n"
    "  version   print the version\n";

int cli_parse_positive(const char *cmd, const char *name, const char *text, long long max, long long *out) {
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno || end == text || *end || v <= 0 || v > max) {
        fprintf(stderr, "mxtrain %s: --%s: '%s' is not allowed (allowed: an integer from 1 to %lld)\n", cmd, name, text, max);
        return 0;
    }
    *out = v;
    return 1;
}

int cli_out_not_input(const char *cmd, const char *opt, const char *out, const char *const *inputs, int n) {
    for (int i = 0; i < n; i++)
        if (inputs[i] && mxi_same_file(out, inputs[i])) {
            fprintf(stderr, "mxtrain %s: %s: '%s' is the input '%s' (allowed: a path that is none of the command's "
                    "inputs)\n", cmd, opt, out, inputs[i]);
            return 0;
        }
    return 1;
}

/* Threads per process the OpenMP runtime will start: OMP_NUM_THREADS's first entry, else
 * one per CPU the process may run on. */
static int planned_threads(int cpus) {
    const char *env = getenv("OMP_NUM_THREADS");
    if (!env || !*env) return cpus;
    long n = strtol(env, NULL, 10);
    return n > 0 && n < 1 << 20 ? (int)n : cpus;
}

/* Ranks of this job on this host, as launchers announce it (1 without a launcher). */
static int local_ranks(void) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && atoi(v) > 0) return atoi(v);
    }
    return 1;
}

static bool any_set(const char *const *vars, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (getenv(vars[i])) return true;
    return false;
}

/* How the OpenMP threads wait and where they run, unless the user chose (docs/training.md#threads).
 *
 * Wait: threads that spin at barriers for long turn a shared machine into a collapse (a
 * run beside one busy process went 37x slower with libgomp's default of 300000 rounds): a
 * spinning thread holds the core the thread it waits for needs. Threads that sleep at once
 * cost a quiet machine a wake-up at every barrier (Zen 5: the 20.7M Llama's step 7-10% slower,
 * a small model's 50-65%). So a thread spins SPIN_ROUNDS rounds, tens of microseconds,
 * then sleeps: GOMP_SPINCOUNT for libgomp; LLVM's libomp, whose block time counts
 * milliseconds, sleeps at once (KMP_BLOCKTIME=0).
 *
 * Place: a sleeping thread woken by another tends to be woken on the waker's core (the
 * scheduler's wake-affine choice) and the two then share one core while the other idles;
 * oneDNN's fp32 GEMMs of 2048x512x512 ran no faster on 2 threads than on 1 that way. So
 * when the process uses every CPU it may run on (as many threads as CPUs in its affinity
 * mask, and no other rank of the job on the host to share them with) each thread is bound
 * to one CPU (OMP_PROC_BIND=true, OMP_PLACES=threads). A process with fewer threads than
 * CPUs, or sharing them with other ranks, is left to the scheduler: binding would stack
 * every such process on the first CPUs.
 *
 * The runtime reads these variables when it loads, before main, hence the re-exec; where
 * that fails the run goes on with the runtime's defaults. */
#define SPIN_ROUNDS "10000"

static void choose_thread_policy(char **argv) {
    static const char *const wait_vars[] = {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME", "KMP_LIBRARY"};
    static const char *const place_vars[] = {"OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY", "KMP_AFFINITY"};
    bool set_wait = !any_set(wait_vars, sizeof wait_vars / sizeof wait_vars[0]);
    bool set_place = !any_set(place_vars, sizeof place_vars / sizeof place_vars[0]);
    if (set_place) {
        cpu_set_t mask;
        int cpus = sched_getaffinity(0, sizeof mask, &mask) == 0 ? CPU_COUNT(&mask) : 0;
        set_place = cpus >= 2 && planned_threads(cpus) == cpus && local_ranks() == 1;
    }
    if (!set_wait && !set_place) return;
    if (set_wait && (setenv("GOMP_SPINCOUNT", SPIN_ROUNDS, 1) != 0 || setenv("KMP_BLOCKTIME", "0", 1) != 0)) return;
    if (set_place && (setenv("OMP_PROC_BIND", "true", 1) != 0 || setenv("OMP_PLACES", "threads", 1) != 0)) return;
    execv("/proc/self/exe", argv);
}

/* The exit status once standard output and error are flushed and closed: a write that
 * failed there (`> /dev/full`, a full disk) is an error, never a silent exit 0. A stream
 * closed by the caller (`>&-`) with nothing written to it is not (as coreutils' close_stdout). */
static int close_std(int code) {
    bool pending = __fpending(stdout) > 0;
    if (ferror(stdout) | (fclose(stdout) != 0 && (pending || errno != EBADF))) {
        int e = errno;
        fprintf(stderr, "mxtrain: cannot write to standard output (%s)\n", strerror(e));
        if (code == 0) code = 1;
    }
    pending = __fpending(stderr) > 0;
    if (ferror(stderr) | (fclose(stderr) != 0 && (pending || errno != EBADF))) {
        if (code == 0) code = 1;   // nowhere left to say it
    }
    return code;
}

static int run(int argc, char **argv);

int main(int argc, char **argv) { return close_std(run(argc, argv)); }

static int run(int argc, char **argv) {
    // One malloc arena for all threads. glibc gives each thread that allocates an arena of its
    // own, reserving 64 MiB of address space; near a memory limit, that reservation made by an
    // OpenMP thread inside oneDNN's code generation leaves oneDNN without memory, and it
    // crashes there instead of failing. mxtrain allocates at start, so sharing costs little.
    mallopt(M_ARENA_MAX, 1);
    choose_thread_policy(argv);
    // Start the OpenMP threads before anything else holds memory: near a memory limit a
    // thread that cannot be created is the runtime's own error (libgomp: one line and exit;
    // LLVM's libomp: its message and abort), and the earlier, the less likely.
    #pragma omp parallel
    { }
    if (argc < 2) {
        fputs(usage, stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        fputs(usage, stdout);
        return 0;
    }
    if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0) {
        puts("mxtrain 0.1.0");
        return 0;
    }
    // a kernel forced by MXTRAIN_KERNEL (or MXTRAIN_MX_KERNEL) must exist and run on this CPU, or nothing runs
    mx_diag diag;
    if (mx_kernel_check_env(&diag) != MX_OK) {
        fprintf(stderr, "mxtrain: %s\n", diag.msg);
        return 2;
    }
    if (strcmp(cmd, "demo") == 0) return cli_demo(argc - 1, argv + 1);
    if (strcmp(cmd, "prepare") == 0) return cli_prepare(argc - 1, argv + 1);
    if (strcmp(cmd, "train") == 0) return cli_train(argc - 1, argv + 1);
    if (strcmp(cmd, "plan") == 0) return cli_plan(argc - 1, argv + 1);
    if (strcmp(cmd, "init") == 0) return cli_init(argc - 1, argv + 1);
    if (strcmp(cmd, "grads") == 0) return cli_grads(argc - 1, argv + 1);
    if (strcmp(cmd, "export") == 0) return cli_export(argc - 1, argv + 1);
    if (strcmp(cmd, "plot") == 0) return cli_plot(argc - 1, argv + 1);
    if (strcmp(cmd, "generate") == 0) return cli_generate(argc - 1, argv + 1);
    fprintf(stderr, "mxtrain: unknown command '%s' (allowed: train, plan, init, grads, export, generate, prepare, plot, demo, help, version)\n", cmd);
    fputs(usage, stderr);
    return 2;
}
