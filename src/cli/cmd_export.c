/* mxtrain export: a checkpoint as a standalone Hugging Face model directory. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cli/cli.h"
#include "mxtrain/train.h"

static const char export_usage[] =
    "usage: mxtrain export CHECKPOINT --out DIR [--dtype fp32|bf16] [--max-shard-size SIZE]\n"
    "\n"
    "Writes the model of CHECKPOINT (an iter_NNNNNNN directory, or a training.save directory:\n"
    "its latest checkpoint) as a Hugging Face model directory DIR: config.json and the weights\n"
    "in --dtype (default fp32, as trained; bf16 rounds to nearest even), in model.safetensors\n"
    "or, past --max-shard-size (default 5GB; units B, KB, MB, GB = 1000^k, KiB, MiB, GiB =\n"
    "1024^k), in model-0000K-of-0000N.safetensors files with model.safetensors.index.json.\n"
    "DIR must be new or empty; nothing is left there on error.\n";

/* "5GB", "500MB", "20KiB", "123" -> bytes; 0 when malformed. */
static unsigned long long parse_size(const char *text) {
    static const struct { const char *unit; unsigned long long scale; } units[] = {
        {"", 1}, {"B", 1}, {"KB", 1000ull}, {"MB", 1000000ull}, {"GB", 1000000000ull}, {"TB", 1000000000000ull},
        {"KiB", 1ull << 10}, {"MiB", 1ull << 20}, {"GiB", 1ull << 30}, {"TiB", 1ull << 40}};
    char *end;
    errno = 0;
    if (text[0] < '0' || text[0] > '9') return 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno || v == 0) return 0;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (strcasecmp(end, units[i].unit) == 0) return v > ~0ull / units[i].scale ? 0 : v * units[i].scale;
    return 0;
}

int cli_export(int argc, char **argv) {
    const char *ckpt = NULL, *out = NULL, *dtype_text = "fp32", *size_text = "5GB";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char **value = !strcmp(a, "--out") ? &out : !strcmp(a, "--dtype") ? &dtype_text
                             : !strcmp(a, "--max-shard-size") ? &size_text : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(export_usage, stdout);
            return 0;
        }
        if (value) {
            if (i + 1 >= argc) {
                fprintf(stderr, "mxtrain export: %s needs a value\n%s", a, export_usage);
                return 2;
            }
            *value = argv[++i];
        } else if (a[0] == '-') {
            fprintf(stderr, "mxtrain export: unknown option '%s'\n%s", a, export_usage);
            return 2;
        } else if (ckpt) {
            fprintf(stderr, "mxtrain export: unexpected argument '%s' (one CHECKPOINT only)\n%s", a, export_usage);
            return 2;
        } else {
            ckpt = a;
        }
    }
    if (!ckpt || !out) {
        fprintf(stderr, "mxtrain export: missing %s\n%s", ckpt ? "--out" : "CHECKPOINT", export_usage);
        return 2;
    }
    mx_dtype dtype;
    if (!strcmp(dtype_text, "fp32") || !strcmp(dtype_text, "float32")) dtype = MX_DTYPE_FP32;
    else if (!strcmp(dtype_text, "bf16") || !strcmp(dtype_text, "bfloat16")) dtype = MX_DTYPE_BF16;
    else {
        fprintf(stderr, "mxtrain export: --dtype: '%s' is not allowed (allowed: fp32 (alias float32), bf16 (alias "
                "bfloat16))\n", dtype_text);
        return 2;
    }
    unsigned long long max_shard = parse_size(size_text);
    if (!max_shard) {
        fprintf(stderr, "mxtrain export: --max-shard-size: '%s' is not allowed (allowed: a positive whole number of "
                "bytes, with an optional unit B, KB, MB, GB, TB, KiB, MiB, GiB, TiB; e.g. 5GB)\n", size_text);
        return 2;
    }
    mx_export_info info;
    mx_diag diag = {{0}};
    if (mx_checkpoint_export(ckpt, out, dtype, max_shard, &info, &diag)) {
        fprintf(stderr, "mxtrain export: %s\n", diag.msg);
        return 1;
    }
    printf("exported %s to %s: %d tensors, %.2f MiB in %s, %d safetensors file%s%s\n", info.source, out, info.tensors,
           info.bytes / 1048576.0, dtype == MX_DTYPE_BF16 ? "bf16" : "fp32", info.files, info.files == 1 ? "" : "s",
           info.files == 1 ? "" : " and model.safetensors.index.json");
    if (!info.verified) printf("note: %s has no checksums.json: its weights are not verified\n", info.source);
    return 0;
}
