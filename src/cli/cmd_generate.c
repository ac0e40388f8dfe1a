/* mxtrain generate: text from a checkpoint or a Hugging Face model directory. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "core/diag.h"
#include "core/file.h"
#include "io/text_codec.h"
#include "model/generate.h"
#include "model/units.h"
#include "mxtrain/config.h"
#include "mxtrain/model.h"
#include "train/checkpoint.h"

static const char generate_usage[] =
    "usage: mxtrain generate CHECKPOINT (--prompt TEXT ... | --prompt-file FILE) [--max-new-tokens N]\n"
    "                        [--temperature T] [--top-k K] [--top-p P] [--seed S] [--dtype fp32|bf16]\n"
    "                        [--plan CONFIG]\n"
    "\n"
    "Continues each prompt with text the model of CHECKPOINT writes: an iter_NNNNNNN directory, a\n"
    "training.save directory (its latest checkpoint), or a Hugging Face model directory\n"
    "(config.json and safetensors). --prompt may be given several times and --prompt-file holds\n"
    "one prompt per line: the prompts are decoded together, over a KV cache. The generated text\n"
    "alone goes to standard output (one prompt: as it comes; several: each prompt's in order, each\n"
    "ended by a newline), everything else (tokens/s) to standard error. A sequence ends at the\n"
    "model's end-of-text token or after --max-new-tokens (default 128).\n"
    "\n"
    "  --temperature T   0 (default): greedy, the most probable token; > 0: sampled from softmax(z/T)\n"
    "  --top-k K         sample among the K most probable tokens only (default 0: all)\n"
    "  --top-p P         ... and among the fewest whose probabilities sum to P (default 1: all)\n"
    "  --seed S          the sampling's seed (default 0)\n"
    "  --dtype fp32|bf16 the products' operands (default fp32; bf16 rounds them, fp32 accumulation)\n"
    "  --plan CONFIG     run the linear layers CONFIG's training.quantization_plan converts on MX\n"
    "                    operands, as its training's forward does (the others, without --dtype, at\n"
    "                    its parallel.fsdp_plan.param_dtype)\n"
    "\n"
    "Text goes through the tokenizer.json the checkpoint carries (`prepare --tokenizer`), else it\n"
    "is byte-level, the vocabulary of `mxtrain prepare` (257 tokens); a prompt is the start of a\n"
    "document (the end-of-document token, then its tokens).\n";

enum { MAX_PROMPTS = 256 };

typedef struct {
    const mxi_text_codec *codec;
    int n;
    char **text;        // (n) each sequence's output so far (several prompts)
    size_t *len, *cap;  // (n)
    int rc;
} sink;

static int emit(void *ctx, int s, int32_t token) {
    sink *k = ctx;
    char buf[256];
    size_t n = mxi_text_decode(k->codec, token, buf, sizeof buf);
    if (k->n == 1) {   // streamed
        if (n && (fwrite(buf, 1, n, stdout) != n || fflush(stdout) != 0)) return MX_EIO;
        return MX_OK;
    }
    if (k->len[s] + n > k->cap[s]) {   // past the room reserved for it (a long token)
        size_t cap = 2 * (k->len[s] + n);
        char *t = realloc(k->text[s], cap);
        if (!t) return MX_ENOMEM;
        k->text[s] = t, k->cap[s] = cap;
    }
    memcpy(k->text[s] + k->len[s], buf, n);
    k->len[s] += n;
    return MX_OK;
}

static int bad(const char *opt, const char *text, const char *allowed) {
    fprintf(stderr, "mxtrain generate: %s: '%s' is not allowed (allowed: %s)\n", opt, text, allowed);
    return 2;
}

/* The prompts of FILE, one a line (the newline not part of it). */
static int read_prompts(const char *path, const char **prompts, size_t *lens, int *n, char **data) {
    mx_diag diag = {{0}};
    size_t len;
    if (mxi_read_input(path, "a text file of prompts, one a line", (uint64_t)64 << 20, data, &len, &diag)) {
        fprintf(stderr, "mxtrain generate: --prompt-file: %s\n", diag.msg);
        return 1;
    }
    char *p = *data, *end = *data + len;
    int before = *n;
    while (p < end) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        char *stop = nl ? nl : end;
        if (*n == MAX_PROMPTS) {
            fprintf(stderr, "mxtrain generate: --prompt-file: %s: more than %d prompts (allowed: at most %d in all)\n",
                    path, MAX_PROMPTS, MAX_PROMPTS);
            return 2;
        }
        size_t l = (size_t)(stop - p);
        if (l && p[l - 1] == '\r') l--;
        prompts[*n] = p, lens[(*n)++] = l;
        p = nl ? nl + 1 : end;
    }
    if (*n == before) {
        fprintf(stderr, "mxtrain generate: --prompt-file: %s: no prompt in it (allowed: a file of one prompt a line)\n",
                path);
        return 2;
    }
    return 0;
}

typedef struct {
    const char *ckpt, *prompt_file, *plan, *dtype;
    const char *prompts[MAX_PROMPTS];
    size_t lens[MAX_PROMPTS];
    int n;
    long long max_new;
    mxi_gen_options gen;
} gen_args;

static int parse(int argc, char **argv, gen_args *a) {
    const char *max_new = "128", *temp = "0", *top_k = "0", *top_p = "1", *seed = "0";
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        if (!strcmp(o, "--help") || !strcmp(o, "-h")) {
            fputs(generate_usage, stdout);
            return 0;
        }
        const char **value = !strcmp(o, "--prompt-file") ? &a->prompt_file : !strcmp(o, "--plan") ? &a->plan
                             : !strcmp(o, "--dtype") ? &a->dtype : !strcmp(o, "--max-new-tokens") ? &max_new
                             : !strcmp(o, "--temperature") ? &temp : !strcmp(o, "--top-k") ? &top_k
                             : !strcmp(o, "--top-p") ? &top_p : !strcmp(o, "--seed") ? &seed : NULL;
        bool prompt = !strcmp(o, "--prompt");
        if ((value || prompt) && i + 1 >= argc) {
            fprintf(stderr, "mxtrain generate: %s needs a value\n%s", o, generate_usage);
            return 2;
        }
        if (prompt) {
            if (a->n == MAX_PROMPTS) {
                fprintf(stderr, "mxtrain generate: --prompt: more than %d prompts (allowed: at most %d)\n",
                        MAX_PROMPTS, MAX_PROMPTS);
                return 2;
            }
            a->prompts[a->n] = argv[++i], a->lens[a->n] = strlen(argv[i]), a->n++;
        } else if (value) {
            *value = argv[++i];
        } else if (o[0] == '-' && o[1]) {
            fprintf(stderr, "mxtrain generate: unknown option '%s'\n%s", o, generate_usage);
            return 2;
        } else if (a->ckpt) {
            fprintf(stderr, "mxtrain generate: unexpected argument '%s' (one CHECKPOINT only)\n%s", o, generate_usage);
            return 2;
        } else {
            a->ckpt = o;
        }
    }
    if (!a->ckpt || (!a->n && !a->prompt_file)) {
        fprintf(stderr, "mxtrain generate: missing %s\n%s", a->ckpt ? "--prompt or --prompt-file" : "CHECKPOINT",
                generate_usage);
        return 2;
    }
    if (!cli_parse_positive("generate", "max-new-tokens", max_new, 1 << 20, &a->max_new)) return 2;
    char *end;
    errno = 0;
    double t = strtod(temp, &end);
    if (errno || end == temp || *end || !(t >= 0) || t > 1e6)
        return bad("--temperature", temp, "a number from 0 to 1e6; 0 is greedy");
    long k = strtol(top_k, &end, 10);
    if (errno || end == top_k || *end || k < 0 || k > (1 << 30))
        return bad("--top-k", top_k, "an integer >= 0; 0 keeps every token");
    double p = strtod(top_p, &end);
    if (errno || end == top_p || *end || !(p > 0 && p <= 1))
        return bad("--top-p", top_p, "a number in (0, 1]; 1 keeps every token");
    unsigned long long s = strtoull(seed, &end, 10);
    if (errno || end == seed || *end || seed[0] == '-') return bad("--seed", seed, "an integer >= 0");
    if (a->dtype && strcmp(a->dtype, "fp32") && strcmp(a->dtype, "float32") && strcmp(a->dtype, "bf16") &&
        strcmp(a->dtype, "bfloat16"))
        return bad("--dtype", a->dtype, "fp32 (alias float32), bf16 (alias bfloat16)");
    a->gen = (mxi_gen_options){.max_new_tokens = (int)a->max_new, .temperature = (float)t, .top_k = (int)k,
                               .top_p = (float)p, .seed = s, .eos = -1};
    return -1;   // parsed: go on
}

int cli_generate(int argc, char **argv) {
    static gen_args a;   // large: prompts' tables
    memset(&a, 0, sizeof a);
    int code = parse(argc, argv, &a);
    if (code >= 0) return code;
    char *file_data = NULL;
    if (a.prompt_file && (code = read_prompts(a.prompt_file, a.prompts, a.lens, &a.n, &file_data))) {
        free(file_data);
        return code;
    }
    // a Hugging Face model directory (an iter_N holds config.json) as it is; a save
    // directory stands for its latest checkpoint
    mx_diag diag = {{0}};
    char dir[4096], path[4200];
    struct stat st;
    snprintf(path, sizeof path, "%s/config.json", a.ckpt);
    int rc = MX_OK;
    if (stat(path, &st) == 0) snprintf(dir, sizeof dir, "%s", a.ckpt);
    else rc = mxi_checkpoint_resolve(a.ckpt, "CHECKPOINT", dir, sizeof dir, &diag);
    mx_model_config mc;
    mx_config cfg = {0};
    bool have_cfg = false;
    mxi_text_codec codec = {0};
    if (!rc) rc = mx_hf_config_load(dir, &mc, &diag);
    if (!rc) rc = mxi_text_codec_open(&codec, dir, mc.vocab_size, &diag);
    if (!rc && a.plan) {
        rc = mx_config_load(a.plan, &cfg, &diag);
        have_cfg = !rc;
    }
    // the prompts' tokens, and the positions the cache needs
    int32_t *tokens = NULL;
    int32_t *starts[MAX_PROMPTS];
    int lens[MAX_PROMPTS], longest = 0;
    size_t total = 0;
    // at most a token a byte, the end-of-document token before them and a tokenizer
    // template's special tokens around them
    enum { SPECIALS = 16 };
    for (int s = 0; s < a.n; s++) total += a.lens[s] + 1 + SPECIALS;
    if (!rc && !(tokens = malloc(total * sizeof *tokens))) rc = mxi_diag(&diag, MX_ENOMEM, "out of memory for the prompts");
    for (int s = 0, at = 0; s < a.n && !rc; s++) {
        starts[s] = tokens + at;
        long long room = (long long)a.lens[s] + 1 + SPECIALS;
        int max = room < mc.max_position_embeddings ? (int)room : mc.max_position_embeddings;
        rc = mxi_text_encode(&codec, a.prompts[s], a.lens[s], starts[s], max, &lens[s], &diag);
        if (rc) {
            char why[sizeof diag.msg];
            snprintf(why, sizeof why, "%s", diag.msg);
            rc = mxi_diag(&diag, rc, "prompt %d: %s: the model's max_position_embeddings", s + 1, why);
        }
        at += lens[s];
        if (lens[s] > longest) longest = lens[s];
    }
    // a delayed recipe casts with the scales its training learned: without them every scale is 1
    snprintf(path, sizeof path, "%s/%s", dir, MXI_DELAYED_FILE);
    if (!rc && have_cfg && cfg.training.quantization_plan.enabled &&
        cfg.training.quantization_plan.recipe.strategy == MX_STRATEGY_DELAYED && stat(path, &st) != 0)
        rc = mxi_diag(&diag, MX_EINVAL, "--plan %s: recipe '%s' casts with the scales a delayed-scaling run learned, "
                      "and '%s' has no delayed_scaling.safetensors (its checkpoints hold them, and `mxtrain export` "
                      "copies them)", a.plan, cfg.training.quantization_plan.recipe_name, dir);
    // --plan without --dtype: the run's precision, param_dtype, for the layers it does not convert
    bool bf16 = a.dtype ? a.dtype[0] == 'b' : have_cfg && cfg.parallel.param_dtype == MX_DTYPE_BF16;
    mxi_infer *inf = NULL;
    long long want = longest + a.max_new;
    int TC = want < mc.max_position_embeddings ? (int)want : mc.max_position_embeddings;
    if (!rc) {
        int chunk = longest < 128 ? longest : 128;
        mxi_infer_options io = {.batch = a.n, .max_seq = TC, .max_rows = a.n * chunk,
                                .bf16 = bf16, .plan = have_cfg ? &cfg.training.quantization_plan : NULL};
        rc = mxi_infer_create(&mc, &io, &inf, &diag);
    }
    if (!rc) rc = mx_model_load(mxi_infer_model(inf), dir, &diag);
    sink k = {.codec = &codec, .n = a.n};
    mxi_gen_stats stats = {0};
    if (!rc && a.n > 1) {
        k.text = calloc((size_t)a.n, sizeof *k.text);
        k.len = calloc((size_t)a.n, sizeof *k.len);
        k.cap = calloc((size_t)a.n, sizeof *k.cap);
        for (int s = 0; s < a.n && k.cap; s++) k.cap[s] = (size_t)a.max_new * 4 + 64;
        for (int s = 0; s < a.n && k.text; s++) k.text[s] = malloc(k.cap[s]);
        for (int s = 0; s < a.n && !rc; s++)
            if (!k.text || !k.len || !k.cap || !k.text[s]) rc = mxi_diag(&diag, MX_ENOMEM, "out of memory for the outputs");
    }
    if (!rc) {
        if (want > TC)
            fprintf(stderr, "note: the model's max_position_embeddings %d ends generation before %lld new tokens\n",
                    mc.max_position_embeddings, a.max_new);
        a.gen.eos = codec.eos;
        rc = mxi_generate(inf, (const int32_t *const *)starts, lens, a.n, &a.gen, emit, &k, &stats, &diag);
        if (rc == MX_EIO) diag = (mx_diag){{0}}, rc = mxi_diag(&diag, MX_EIO, "cannot write to standard output (%s)",
                                                              strerror(errno));
    }
    if (!rc) {
        if (a.n == 1) fputc('\n', stdout);
        for (int s = 0; s < a.n && a.n > 1; s++) fwrite(k.text[s], 1, k.len[s], stdout), fputc('\n', stdout);
        fflush(stdout);
        double dps = stats.decode_seconds > 0 ? stats.decode_tokens / stats.decode_seconds : 0;
        fprintf(stderr, "mxtrain generate: %s (%s, %lld parameters, %s%s): %d prompt%s, %lld prompt tokens in %.3f s; "
                "%lld new tokens, %lld of them in %.3f s: %.1f tokens/s\n", dir,
                mc.type == MX_MODEL_LLAMA ? "llama" : mc.type == MX_MODEL_QWEN3 ? "qwen3" : "qwen3_moe",
                (long long)mx_model_num_params(mxi_infer_model(inf)), bf16 ? "bf16" : "fp32",
                have_cfg && cfg.training.quantization_plan.enabled ? ", with the quantization plan" : "", a.n,
                a.n == 1 ? "" : "s", (long long)stats.prompt_tokens, stats.prefill_seconds, (long long)stats.new_tokens,
                (long long)stats.decode_tokens, stats.decode_seconds, dps);
    } else {
        fprintf(stderr, "mxtrain generate: %s\n", diag.msg);
    }
    for (int s = 0; s < a.n && k.text; s++) free(k.text[s]);
    free(k.text), free(k.len), free(k.cap);
    mxi_infer_free(inf);
    mxi_text_codec_close(&codec);
    free(tokens), free(file_data);
    if (have_cfg) mx_config_free(&cfg);
    return rc ? 1 : 0;
}
