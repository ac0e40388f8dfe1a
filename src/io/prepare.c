/* prepare: text files -> byte-level llm.c token shards (see include/mxtrain/tokens.h).
 *
 * Every input is read and split into documents before anything is written; the train and
 * val token streams are built in memory (uint16: the vocabulary is 257 tokens), then every
 * shard is written to a temporary file and only when all of them are complete are they
 * renamed into place. */
#include "mxtrain/tokens.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/diag.h"
#include "core/file.h"
#include "core/text.h"
#include "io/io_internal.h"
#include "io/prepare_internal.h"

void mx_prepare_defaults(mx_prepare_opts *o) {
    if (!o) return;
    o->fortune = false;
    o->val_fraction = 0.05;
    o->out_dir = "data";
    o->shard_tokens = 100000000;
    o->tokenizer = NULL;
    o->eod = NULL;
    o->progress = NULL;
    o->progress_arg = NULL;
}

typedef struct {
    char **paths;           /* (n) input files in order */
    unsigned char **data;   /* (n) their contents */
    size_t *len;            /* (n) */
    int n, cap;
} file_list;

typedef mxi_doc doc;

typedef struct {
    doc *docs;
    int64_t n, cap;
} doc_list;

static void files_free(file_list *fl) {
    for (int i = 0; i < fl->n; i++) {
        free(fl->paths[i]);
        free(fl->data[i]);
    }
    free(fl->paths);
    free(fl->data);
    free(fl->len);
}

static char *join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    size_t o = a;
    if (a == 0 || dir[a - 1] != '/') p[o++] = '/';
    memcpy(p + o, name, b + 1);
    return p;
}

static int add_file(file_list *fl, char *path, mx_diag *diag) { /* takes path */
    if (fl->n == fl->cap) {
        int cap = fl->cap ? 2 * fl->cap : 16;
        char **p = realloc(fl->paths, (size_t)cap * sizeof *p);
        if (p) fl->paths = p;
        unsigned char **d = p ? realloc(fl->data, (size_t)cap * sizeof *d) : NULL;
        if (d) fl->data = d;
        size_t *l = d ? realloc(fl->len, (size_t)cap * sizeof *l) : NULL;
        if (l) fl->len = l;
        if (!l) {
            free(path);
            return mxi_diag(diag, MX_ENOMEM, "prepare: out of memory (%zu bytes for %d input files)",
                            (size_t)cap * (sizeof(char *) + sizeof(unsigned char *) + sizeof(size_t)), cap);
        }
        fl->cap = cap;
    }
    fl->paths[fl->n] = path;
    fl->data[fl->n] = NULL;
    fl->len[fl->n] = 0;
    fl->n++;
    return 0;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The regular files of a directory, sorted by name (hidden files, and with fortune the
 * *.dat / *.u8 index files, skipped). */
static int add_dir(file_list *fl, const char *dir, bool fortune, mx_diag *diag) {
    DIR *d = opendir(dir);
    if (!d) return mxi_diag(diag, MX_EIO, "%s: cannot read the directory (%s)", dir, strerror(errno));
    char **names = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    struct dirent *e;
    while (rc == 0 && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        if (fortune && (ends_with(e->d_name, ".dat") || ends_with(e->d_name, ".u8"))) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            char **p = realloc(names, cap * sizeof *p);
            if (!p) {
                rc = mxi_diag(diag, MX_ENOMEM, "prepare: out of memory (%zu bytes for %zu file names)", cap * sizeof *p,
                              cap);
                break;
            }
            names = p;
        }
        names[n] = join(dir, e->d_name);
        if (!names[n])
            rc = mxi_diag(diag, MX_ENOMEM, "prepare: out of memory (%zu bytes)", strlen(dir) + strlen(e->d_name) + 2);
        else n++;
    }
    closedir(d);
    if (names) qsort(names, n, sizeof *names, cmp_str);
    int added = 0;
    for (size_t i = 0; i < n; i++) {
        struct stat st;
        if (rc == 0 && stat(names[i], &st) == 0 && S_ISREG(st.st_mode)) {
            rc = add_file(fl, names[i], diag);
            added++;
        } else {
            free(names[i]);
        }
    }
    free(names);
    if (rc == 0 && added == 0)
        rc = mxi_diag(diag, MX_EINVAL, "%s: the directory has no input files (allowed: a directory of text files%s)",
                      dir, fortune ? "; *.dat and *.u8 are skipped" : "");
    return rc;
}

static int read_all(const char *path, unsigned char **data, size_t *len, mx_diag *diag) {
    char *text;
    int rc = mxi_read_input(path, "a text file (split larger corpora into several files)", MXI_MAX_TEXT_BYTES, &text,
                            len, diag);
    *data = (unsigned char *)text;
    return rc;
}

static int add_doc(doc_list *dl, const unsigned char *text, size_t len, mx_diag *diag) {
    bool blank = true;
    for (size_t i = 0; blank && i < len; i++)
        blank = text[i] == ' ' || text[i] == '\t' || text[i] == '\n' || text[i] == '\r' || text[i] == '\f' ||
                text[i] == '\v';
    if (blank) return 0; /* an empty document teaches nothing but the EOT token */
    if (dl->n == dl->cap) {
        int64_t cap = dl->cap ? 2 * dl->cap : 1024;
        doc *d = realloc(dl->docs, (size_t)cap * sizeof *d);
        if (!d)
            return mxi_diag(diag, MX_ENOMEM, "prepare: out of memory (%zu bytes for %lld documents)",
                            (size_t)cap * sizeof *d, (long long)cap);
        dl->docs = d;
        dl->cap = cap;
    }
    dl->docs[dl->n++] = (doc){text, len};
    return 0;
}

/* Fortune files: entries separated by lines that are exactly "%" (a trailing \r allowed). */
static int split_fortune(doc_list *dl, const unsigned char *t, size_t len, mx_diag *diag) {
    size_t doc_start = 0, line = 0;
    int rc = 0;
    while (rc == 0 && line < len) {
        const unsigned char *nl = memchr(t + line, '\n', len - line);
        size_t end = nl ? (size_t)(nl - t) : len; /* line is [line, end) */
        size_t next = nl ? end + 1 : len;
        size_t l = end - line;
        if ((l == 1 && t[line] == '%') || (l == 2 && t[line] == '%' && t[line + 1] == '\r')) {
            rc = add_doc(dl, t + doc_start, line - doc_start, diag);
            doc_start = next;
        }
        line = next;
    }
    if (rc == 0 && doc_start < len) rc = add_doc(dl, t + doc_start, len - doc_start, diag);
    return rc;
}

static bool is_val(int64_t i, double f) { return floor((double)(i + 1) * f + 0.5) > floor((double)i * f + 0.5); }

typedef struct {
    mxi_atomic a;
    bool begun, renamed;
} out_file;

static char *shard_path(const char *dir, const char *split, int index) {
    char name[64];
    snprintf(name, sizeof name, "%s_%06d.bin", split, index);
    return join(dir, name);
}

/* Write every shard of both splits; rename them into place only when all are complete. */
static int write_outputs(const mx_prepare_opts *o, const void *train, int64_t n_train, const void *val,
                         int64_t n_val, int in_width, int out_width, mx_prepare_stats *st, mx_diag *diag) {
    int64_t per = o->shard_tokens;
    int n_tr = (int)((n_train + per - 1) / per), n_va = (int)((n_val + per - 1) / per), total = n_tr + n_va;
    out_file *outs = calloc((size_t)total, sizeof *outs);
    if (!outs)
        return mxi_diag(diag, MX_ENOMEM, "prepare: out of memory (%zu bytes for %d shards)", (size_t)total * sizeof *outs,
                        total);
    int rc = 0;
    if (mxi_make_dirs(o->out_dir) != 0)
        rc = errno == ENOTDIR ? mxi_diag(diag, MX_EIO, "%s: is not a directory (allowed: an output directory)", o->out_dir)
                              : mxi_diag(diag, MX_EIO, "%s: cannot create the output directory (%s)", o->out_dir,
                                         strerror(errno));
    for (int k = 0; rc == 0 && k < total; k++) {
        bool is_train = k < n_tr;
        int idx = is_train ? k : k - n_tr;
        const char *src = is_train ? train : val;
        int64_t n = is_train ? n_train : n_val, first = (int64_t)idx * per;
        int64_t count = n - first < per ? n - first : per;
        char *path = shard_path(o->out_dir, is_train ? "train" : "val", idx);
        if (!path) {
            rc = mxi_diag(diag, MX_ENOMEM, "prepare: out of memory (%zu bytes)", strlen(o->out_dir) + 66);
            break;
        }
        rc = mxi_atomic_begin(&outs[k].a, path, diag);
        free(path);
        if (rc) break;
        outs[k].begun = true;
        rc = mxi_shard_emit(&outs[k].a, src + first * in_width, in_width, count, out_width, diag);
        if (rc == 0) rc = mxi_atomic_close(&outs[k].a, diag);
    }
    for (int k = 0; rc == 0 && k < total; k++) {
        rc = mxi_atomic_rename(&outs[k].a, diag);
        if (rc == 0) outs[k].renamed = true;
    }
    for (int k = 0; k < total; k++) {
        if (!outs[k].begun) continue;
        if (rc && outs[k].renamed) unlink(outs[k].a.path); /* all or nothing */
        if (outs[k].renamed) mxi_atomic_free(&outs[k].a);
        else mxi_atomic_abort(&outs[k].a);
    }
    free(outs);
    if (rc) return rc;
    /* Remove shards an earlier run left with higher numbers, so train_*.bin is this run. */
    for (int s = 0; s < 2; s++) {
        for (int idx = s == 0 ? n_tr : n_va;; idx++) {
            char *path = shard_path(o->out_dir, s == 0 ? "train" : "val", idx);
            if (!path) break;
            int gone = unlink(path);
            free(path);
            if (gone != 0) break;
        }
    }
    st->train_shards = n_tr;
    st->val_shards = n_va;
    return 0;
}

static int load_tokenizer(const mx_prepare_opts *o, mxi_tokenizer **tok, uint32_t *eod, mx_diag *diag) {
    int rc = mxi_tokenizer_load(o->tokenizer, tok, diag);
    if (rc) return rc;
    int64_t id = o->eod ? mxi_tokenizer_token_id(*tok, o->eod) : mxi_tokenizer_eos(*tok);
    if (id < 0 && o->eod)
        return mxi_diag(diag, MX_EINVAL, "--eod '%s' is not a token of %s (allowed: one of its added tokens or "
                        "vocabulary entries)", mxi_quote((char[MXI_QUOTE_SIZE]){0}, MXI_QUOTE_SIZE, o->eod,
                        strlen(o->eod)), mxi_tokenizer_path(*tok));
    if (id < 0)
        return mxi_diag(diag, MX_EINVAL, "%s has no end-of-document token (no tokenizer_config.json beside it naming an "
                        "eos_token; allowed: --eod TOKEN)", mxi_tokenizer_path(*tok));
    *eod = (uint32_t)id;
    return 0;
}

/* The unigram entropy, in nats, of n tokens whose counts by id are counts (vocab). */
static double unigram_entropy(const int64_t *counts, int64_t vocab, int64_t n) {
    double h = 0;
    for (int64_t k = 0; k < vocab; k++)
        if (counts[k]) {
            double p = (double)counts[k] / (double)n;
            h -= p * log(p);
        }
    return h;
}

/* With a tokenizer: every document encoded (prepare_encode.c), the train and val streams
 * put together in document order, their entropy, the shards written. */
static int prepare_bpe(const mxi_tokenizer *tok, uint32_t eod, const doc_list *dl, const mx_prepare_opts *o,
                       mx_prepare_stats *st, mx_diag *diag) {
    mxi_tok_ids *ids = calloc((size_t)dl->n, sizeof *ids);
    if (!ids) return mxi_diag(diag, MX_ENOMEM, "prepare: out of memory (%zu bytes)", (size_t)dl->n * sizeof *ids);
    int rc = mxi_prepare_encode(tok, dl->docs, dl->n, eod, o, ids, &st->encode_seconds, diag);
    int64_t n_train = 0, n_val = 0, vocab = mxi_tokenizer_vocab_size(tok);
    for (int64_t i = 0; i < dl->n; i++) {
        *(is_val(i, o->val_fraction) ? &n_val : &n_train) += ids[i].n;
        st->text_bytes += (int64_t)dl->docs[i].len;
    }
    uint32_t *train = NULL, *val = NULL;
    int64_t *counts = NULL;
    if (rc == 0) {
        train = malloc((size_t)n_train * sizeof *train);
        val = malloc((size_t)(n_val ? n_val : 1) * sizeof *val);
        counts = calloc((size_t)vocab, sizeof *counts);
        if (!train || !val || !counts)
            rc = mxi_diag(diag, MX_ENOMEM, "prepare: out of memory for %lld tokens", (long long)(n_train + n_val));
    }
    if (rc == 0) {
        int64_t t = 0, v = 0;
        for (int64_t i = 0; i < dl->n; i++) {
            bool to_val = is_val(i, o->val_fraction);
            memcpy((to_val ? val + v : train + t), ids[i].ids, (size_t)ids[i].n * sizeof *train);
            *(to_val ? &v : &t) += ids[i].n;
            mxi_tokenizer_ids_free(&ids[i]);
        }
        for (int64_t i = 0; i < n_train; i++) counts[train[i]]++;
        double h = unigram_entropy(counts, vocab, n_train);
        st->entropy_nats = h;
        st->entropy_bits = h / log(2.0);
        st->vocab_size = vocab;
        st->eod = eod;
        st->token_bytes = vocab > 65536 ? 4 : 2;
        st->train_tokens = n_train;
        st->val_tokens = n_val;
        rc = write_outputs(o, train, n_train, val, n_val, 4, st->token_bytes, st, diag);
    }
    for (int64_t i = 0; i < dl->n; i++) mxi_tokenizer_ids_free(&ids[i]);
    free(ids);
    free(train);
    free(val);
    free(counts);
    return rc;
}

int mx_prepare(const char *const *inputs, int n_inputs, const mx_prepare_opts *opts, mx_prepare_stats *stats,
               mx_diag *diag) {
    if (!inputs || !opts || !stats) return mxi_diag(diag, MX_ENULL, "mx_prepare: NULL argument");
    memset(stats, 0, sizeof *stats);
    if (n_inputs < 1) return mxi_diag(diag, MX_EINVAL, "prepare: no inputs (allowed: one or more files or directories)");
    if (!(opts->val_fraction >= 0 && opts->val_fraction < 1))
        return mxi_diag(diag, MX_EINVAL, "prepare: val fraction %g is out of range (allowed: 0 <= fraction < 1)",
                        opts->val_fraction);
    if (opts->shard_tokens < 1 || opts->shard_tokens > MX_SHARD_MAX_TOKENS)
        return mxi_diag(diag, MX_EINVAL, "prepare: shard size %lld tokens (allowed: 1 to %lld)",
                        (long long)opts->shard_tokens, MX_SHARD_MAX_TOKENS);
    if (!opts->out_dir || !*opts->out_dir)
        return mxi_diag(diag, MX_EINVAL, "prepare: empty output directory (allowed: a directory path)");

    mxi_tokenizer *tok = NULL;
    uint32_t eod = MX_PREPARE_EOT;
    int rc = opts->tokenizer ? load_tokenizer(opts, &tok, &eod, diag) : 0;
    file_list fl = {0};
    doc_list dl = {0};
    uint16_t *train = NULL, *val = NULL;
    for (int i = 0; rc == 0 && i < n_inputs; i++) {
        const char *p = inputs[i];
        struct stat st;
        if (!p) rc = mxi_diag(diag, MX_ENULL, "prepare: input %d is NULL", i);
        else if (stat(p, &st) != 0) rc = mxi_diag(diag, MX_EIO, "%s: cannot open (%s)", p, strerror(errno));
        else if (S_ISDIR(st.st_mode)) rc = add_dir(&fl, p, opts->fortune, diag);
        else {
            char *copy = strdup(p);
            rc = copy ? add_file(&fl, copy, diag)
                      : mxi_diag(diag, MX_ENOMEM, "prepare: out of memory (%zu bytes)", strlen(p) + 1);
        }
    }
    for (int i = 0; rc == 0 && i < fl.n; i++) {
        rc = read_all(fl.paths[i], &fl.data[i], &fl.len[i], diag);
        if (rc) break;
        if (opts->fortune) rc = split_fortune(&dl, fl.data[i], fl.len[i], diag);
        else rc = add_doc(&dl, fl.data[i], fl.len[i], diag);
    }
    if (rc == 0 && dl.n == 0)
        rc = fl.n == 1 ? mxi_diag(diag, MX_EINVAL, "prepare: the input file holds no documents (it is empty or blank)")
                       : mxi_diag(diag, MX_EINVAL, "prepare: the %d input files hold no documents (all empty or blank)",
                                  fl.n);

    /* Token streams: EOT before every document, then its bytes. */
    int64_t n_train = 0, n_val = 0, d_train = 0, d_val = 0;
    for (int64_t i = 0; rc == 0 && i < dl.n; i++) {
        if (is_val(i, opts->val_fraction)) {
            n_val += 1 + (int64_t)dl.docs[i].len;
            d_val++;
        } else {
            n_train += 1 + (int64_t)dl.docs[i].len;
            d_train++;
        }
    }
    if (rc == 0 && d_train == 0)
        rc = dl.n == 1 ? mxi_diag(diag, MX_EINVAL, "prepare: the only document went to validation (allowed: a smaller "
                                  "--val-fraction)")
                       : mxi_diag(diag, MX_EINVAL, "prepare: all %lld documents went to validation (allowed: a smaller "
                                  "--val-fraction)", (long long)dl.n);
    if (rc == 0 && tok) {
        rc = prepare_bpe(tok, eod, &dl, opts, stats, diag);
    } else if (rc == 0) {
        train = malloc((size_t)n_train * sizeof *train);
        val = malloc((size_t)(n_val ? n_val : 1) * sizeof *val);
        if (!train || !val)
            rc = mxi_diag(diag, MX_ENOMEM, "prepare: out of memory for %lld tokens (%zu bytes)", (long long)(n_train + n_val),
                          (size_t)(n_train + n_val) * sizeof *train);
    }
    if (rc == 0 && !tok) {
        int64_t t = 0, v = 0;
        for (int64_t i = 0; i < dl.n; i++) {
            bool to_val = is_val(i, opts->val_fraction);
            uint16_t *dst = to_val ? val : train;
            int64_t *pos = to_val ? &v : &t;
            dst[(*pos)++] = MX_PREPARE_EOT;
            for (size_t k = 0; k < dl.docs[i].len; k++) dst[(*pos)++] = dl.docs[i].text[k];
        }
        int64_t counts[MX_PREPARE_VOCAB] = {0};
        for (int64_t i = 0; i < n_train; i++) counts[train[i]]++;
        double h = unigram_entropy(counts, MX_PREPARE_VOCAB, n_train);
        stats->entropy_nats = h;
        stats->entropy_bits = h / log(2.0);
        stats->vocab_size = MX_PREPARE_VOCAB;
        stats->eod = MX_PREPARE_EOT;
        stats->token_bytes = 2;
        stats->train_tokens = n_train;
        stats->val_tokens = n_val;
        rc = write_outputs(opts, train, n_train, val, n_val, 2, 2, stats, diag);
    }
    if (rc == 0) {
        stats->files = fl.n;
        stats->documents = dl.n;
        stats->train_documents = d_train;
        stats->val_documents = d_val;
    } else {
        memset(stats, 0, sizeof *stats);
    }
    free(train);
    free(val);
    free(dl.docs);
    files_free(&fl);
    mxi_tokenizer_free(tok);
    return rc;
}
