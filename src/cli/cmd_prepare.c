/* mxtrain prepare: text -> byte-level llm.c token shards (train + val), with a summary and
 * the unigram entropy of the training tokens (the loss a model that learned only byte
 * frequencies would reach; training should go below it). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "mxtrain/tokens.h"

#define FORTUNES_DIR "/usr/share/games/fortunes"

static const char prepare_usage[] =
    "usage: mxtrain prepare [--fortune] [--val-fraction X] [--out DIR] [--shard-tokens N]\n"
    "                       [--tokenizer PATH [--eod TOKEN]] [FILE|DIR ...]\n"
    "\n"
    "Tokenizes text byte by byte: each byte is a token 0..255 and every document is preceded\n"
    "by the end-of-text token 256, so a model needs vocab_size >= 257. Writes llm.c uint16\n"
    "shards DIR/train_000000.bin and DIR/val_000000.bin. A FILE is one document; a DIR means\n"
    "its files, sorted by name.\n"
    "\n"
    "  --fortune         split files into documents at lines that are exactly \"%\" (fortune\n"
    "                    files), and skip *.dat and *.u8 files in directories\n"
    "  --val-fraction X  fraction of documents for validation, spread evenly (default 0.05;\n"
    "                    0 <= X < 1; 0 writes no val shard)\n"
    "  --out DIR         output directory, created if missing (default data, or data/fortunes\n"
    "                    for the default corpus: where the example configs read it)\n"
    "  --shard-tokens N  most tokens per shard (default 100000000)\n"
    "  --tokenizer PATH  encode with a Hugging Face byte-level BPE tokenizer.json (Qwen2/3,\n"
    "                    Llama 3, GPT-2), or a directory holding one, instead of bytes; each\n"
    "                    document is preceded by the end-of-document token; uint32 shards when\n"
    "                    the vocabulary exceeds 65536\n"
    "  --eod TOKEN       the end-of-document token (default: eos_token of tokenizer_config.json\n"
    "                    beside the tokenizer)\n"
    "\n"
    "With no FILE or DIR: " FORTUNES_DIR " (Debian's fortunes package) with --fortune.\n";

static int usage_error(const char *fmt, const char *arg) {
    fputs("mxtrain prepare: ", stderr);
    fprintf(stderr, fmt, arg);
    fputc('\n', stderr);
    fputs(prepare_usage, stderr);
    return 2;
}

/* "123 train tokens to DIR/train_000000.bin" (or "... to DIR/train_000000.bin .. train_000002.bin
 * (3 shards)", or "no val shard"). */
static void describe(char *buf, size_t size, const char *dir, const char *split, int64_t tokens, int shards) {
    const char *sep = dir[strlen(dir) - 1] == '/' ? "" : "/";
    if (shards == 0) snprintf(buf, size, "no %s shard", split);
    else if (shards == 1) snprintf(buf, size, "%lld %s tokens to %s%s%s_000000.bin", (long long)tokens, split, dir, sep, split);
    else
        snprintf(buf, size, "%lld %s tokens to %s%s%s_000000.bin .. %s_%06d.bin (%d shards)", (long long)tokens, split,
                 dir, sep, split, split, shards - 1, shards);
}

static void progress(int64_t done, int64_t total, double seconds, void *arg) {
    (void)arg;
    fprintf(stderr, "mxtrain prepare: encoded %.1f of %.1f MB (%.0f%%, %.2f MB/s)\n", (double)done / 1e6,
            (double)total / 1e6, 100.0 * (double)done / (double)(total ? total : 1), (double)done / 1e6 / seconds);
}

int cli_prepare(int argc, char **argv) {
    mx_prepare_opts opts;
    mx_prepare_defaults(&opts);
    const char **inputs = calloc((size_t)argc + 1, sizeof *inputs);
    if (!inputs) {
        fprintf(stderr, "mxtrain prepare: out of memory (%zu bytes)\n", ((size_t)argc + 1) * sizeof *inputs);
        return 1;
    }
    int n_inputs = 0;
    bool options_done = false;
    bool out_given = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (options_done || a[0] != '-' || strcmp(a, "-") == 0) {
            inputs[n_inputs++] = a;
            continue;
        }
        if (strcmp(a, "--") == 0) {
            options_done = true;
        } else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            fputs(prepare_usage, stdout);
            free(inputs);
            return 0;
        } else if (strcmp(a, "--fortune") == 0) {
            opts.fortune = true;
        } else if (strcmp(a, "--tokenizer") == 0 || strcmp(a, "--eod") == 0) {
            if (i + 1 >= argc || !*argv[i + 1]) {
                free(inputs);
                return usage_error("%s needs a value", a);
            }
            *(strcmp(a, "--eod") == 0 ? &opts.eod : &opts.tokenizer) = argv[++i];
        } else if (strcmp(a, "--val-fraction") == 0 || strcmp(a, "--out") == 0 || strcmp(a, "--shard-tokens") == 0) {
            if (i + 1 >= argc) {
                free(inputs);
                return usage_error("%s needs a value", a);
            }
            const char *v = argv[++i];
            if (strcmp(a, "--out") == 0) {
                if (!*v) {
                    free(inputs);
                    return usage_error("--out: '%s' is not allowed (allowed: a directory path)", v);
                }
                opts.out_dir = v;
                out_given = true;
            } else if (strcmp(a, "--val-fraction") == 0) {
                char *end;
                errno = 0;
                double x = strtod(v, &end);
                if (errno || end == v || *end || !(x >= 0 && x < 1)) {
                    free(inputs);
                    return usage_error("--val-fraction: '%s' is not allowed (allowed: a number from 0 up to, not "
                                       "including, 1)", v);
                }
                opts.val_fraction = x;
            } else {
                long long n;
                if (!cli_parse_positive("prepare", "shard-tokens", v, MX_SHARD_MAX_TOKENS, &n)) {
                    free(inputs);
                    fputs(prepare_usage, stderr);
                    return 2;
                }
                opts.shard_tokens = n;
            }
        } else {
            free(inputs);
            return usage_error("unknown option '%s'", a);
        }
    }
    if (opts.eod && !opts.tokenizer) {
        free(inputs);
        return usage_error("%s needs --tokenizer (byte-level tokens end documents with 256)", "--eod");
    }
    opts.progress = progress;
    if (n_inputs == 0) {
        inputs[n_inputs++] = FORTUNES_DIR;
        opts.fortune = true;
        if (!out_given) opts.out_dir = "data/fortunes";  // where examples/*.yaml read it
    }
    mx_prepare_stats st;
    mx_diag diag = {{0}};
    int rc = mx_prepare(inputs, n_inputs, &opts, &st, &diag);
    if (rc < 0) {
        /* the hint belongs to a default corpus that cannot be read, not to an output that
           cannot be written */
        bool no_corpus = n_inputs == 1 && strcmp(inputs[0], FORTUNES_DIR) == 0 &&
                         strncmp(diag.msg, FORTUNES_DIR, strlen(FORTUNES_DIR)) == 0;
        fprintf(stderr, "mxtrain prepare: %s%s\n", diag.msg[0] ? diag.msg : mx_strerror(rc),
                no_corpus ? "; the default corpus comes from Debian's fortunes package (apt-get install fortunes)" : "");
        free(inputs);
        return 1;
    }
    free(inputs);
    char tr[700], va[700];
    describe(tr, sizeof tr, opts.out_dir, "train", st.train_tokens, st.train_shards);
    describe(va, sizeof va, opts.out_dir, "val", st.val_tokens, st.val_shards);
    printf("prepared %lld document%s (%lld train, %lld val) from %lld file%s: wrote %s and %s\n",
           (long long)st.documents, st.documents == 1 ? "" : "s", (long long)st.train_documents,
           (long long)st.val_documents, (long long)st.files, st.files == 1 ? "" : "s", tr, va);
    if (opts.tokenizer)
        fprintf(stderr, "mxtrain prepare: encoded %.1f MB in %.2f s (%.2f MB/s), end-of-document token %lld, uint%d "
                "shards\n", (double)st.text_bytes / 1e6, st.encode_seconds,
                (double)st.text_bytes / 1e6 / (st.encode_seconds > 0 ? st.encode_seconds : 1e-9), (long long)st.eod,
                8 * st.token_bytes);
    printf("unigram entropy of the train tokens: %.4f bits = %.4f nats per token (vocab_size >= %lld)\n",
           st.entropy_bits, st.entropy_nats, (long long)st.vocab_size);
    return 0;
}
