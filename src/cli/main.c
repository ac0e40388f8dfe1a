/* mxtrain: entry point and subcommand dispatch. */
#include <errno.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
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

/* OpenMP threads that spin at barriers turn a shared machine into a collapse (a run beside
 * one busy process went 37x slower): a spinning thread holds the core the thread it waits
 * for needs. So unless the user chose a wait policy, threads sleep when they wait
 * (OMP_WAIT_POLICY=passive, which libgomp and LLVM's libomp both honour). The runtime
 * reads the variable when it loads, before main, hence the re-exec; where that fails the
 * run goes on with the runtime's default. See docs/training.md#threads. */
static void choose_wait_policy(char **argv) {
    static const char *const chosen[] = {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME", "KMP_LIBRARY"};
    for (size_t i = 0; i < sizeof chosen / sizeof chosen[0]; i++)
        if (getenv(chosen[i])) return;
    if (setenv("OMP_WAIT_POLICY", "passive", 1) != 0) return;
    execv("/proc/self/exe", argv);
}

int main(int argc, char **argv) {
    // One malloc arena for all threads. glibc gives each thread that allocates an arena of its
    // own, reserving 64 MiB of address space; near a memory limit, that reservation made by an
    // OpenMP thread inside oneDNN's code generation leaves oneDNN without memory, and it
    // crashes there instead of failing. mxtrain allocates at start, so sharing costs little.
    mallopt(M_ARENA_MAX, 1);
    choose_wait_policy(argv);
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
    // a kernel forced by MXTRAIN_MX_KERNEL must exist and run on this CPU, or nothing runs
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
    fprintf(stderr, "mxtrain: unknown command '%s' (allowed: train, plan, init, grads, export, prepare, plot, demo, help, version)\n", cmd);
    fputs(usage, stderr);
    return 2;
}
