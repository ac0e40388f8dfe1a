/* Byte-level BPE encoding in Hugging Face tokenizers' order: added tokens split out of the
 * raw text, the normalizer, added tokens marked normalized split out of the normalized
 * text, the pre-tokenizer's regex splits (PCRE2, Unicode properties), BPE merges by rank
 * within each piece, the post-processor's template. And decoding: ids -> bytes. */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "core/diag.h"
#include "io/tokenizer_internal.h"

typedef struct {
    uint32_t rank;
    int32_t pos;              /* index of the pair's left symbol */
    uint32_t left, right;     /* the ids it was pushed for (stale once either side merged) */
} merge_cand;

typedef struct {
    int32_t id, prev, next;   /* id -1: a byte without a vocabulary entry, dropped */
} symbol;

typedef struct {
    const mxi_tokenizer *t;
    mxi_tok_ids *out;
    mx_diag *diag;
    pcre2_match_data **md;    /* (t->n_splits) */
    symbol *sym;
    size_t sym_cap;
    merge_cand *heap;
    size_t heap_n, heap_cap;
} enc;

static int push(enc *E, uint32_t id) {
    mxi_tok_ids *o = E->out;
    if (o->n == o->cap) {
        int64_t cap = o->cap ? 2 * o->cap : 256;
        uint32_t *p = realloc(o->ids, (size_t)cap * sizeof *p);
        if (!p) return mxi_diag(E->diag, MX_ENOMEM, "tokenizer: out of memory (%zu bytes of token ids)",
                                (size_t)cap * sizeof *p);
        o->ids = p;
        o->cap = cap;
    }
    o->ids[o->n++] = id;
    return 0;
}

static bool merge_of(const mxi_tokenizer *t, uint32_t a, uint32_t b, uint32_t *rank, uint32_t *id) {
    uint64_t key = (uint64_t)a << 32 | b, k = key;
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    for (uint64_t s = k & t->merge_mask;; s = (s + 1) & t->merge_mask) {
        if (t->merge_keys[s] == UINT64_MAX) return false;
        if (t->merge_keys[s] == key) {
            *rank = t->merge_rank[s];
            *id = t->merge_id[s];
            return true;
        }
    }
}

static bool cand_less(const merge_cand *a, const merge_cand *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static int heap_push(enc *E, int32_t pos) {
    symbol *s = E->sym;
    int32_t nx = s[pos].next;
    uint32_t rank, id;
    if (nx < 0 || s[pos].id < 0 || s[nx].id < 0 || !merge_of(E->t, (uint32_t)s[pos].id, (uint32_t)s[nx].id, &rank, &id))
        return 0;
    if (E->heap_n == E->heap_cap) {
        size_t cap = E->heap_cap ? 2 * E->heap_cap : 64;
        merge_cand *h = realloc(E->heap, cap * sizeof *h);
        if (!h) return mxi_diag(E->diag, MX_ENOMEM, "tokenizer: out of memory (%zu bytes)", cap * sizeof *h);
        E->heap = h;
        E->heap_cap = cap;
    }
    merge_cand c = {.rank = rank, .pos = pos, .left = (uint32_t)s[pos].id, .right = (uint32_t)s[nx].id};
    size_t i = E->heap_n++;
    while (i > 0 && cand_less(&c, &E->heap[(i - 1) / 2])) {
        E->heap[i] = E->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    E->heap[i] = c;
    return 0;
}

static merge_cand heap_pop(enc *E) {
    merge_cand top = E->heap[0], last = E->heap[--E->heap_n];
    size_t i = 0, n = E->heap_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && cand_less(&E->heap[c + 1], &E->heap[c])) c++;
        if (!cand_less(&E->heap[c], &last)) break;
        E->heap[i] = E->heap[c];
        i = c;
    }
    if (n) E->heap[i] = last;
    return top;
}

/* One pre-tokenized piece: BPE from its bytes, the lowest-ranked mergeable pair first (the
 * leftmost among equal ranks), as tokenizers' word merging does. */
static int bpe(enc *E, const char *p, size_t n) {
    const mxi_tokenizer *t = E->t;
    if (t->ignore_merges) {
        int64_t id = mxi_tok_vocab_find(t, p, n);
        if (id >= 0) return push(E, (uint32_t)id);
    }
    if (n > E->sym_cap) {
        symbol *s = realloc(E->sym, n * sizeof *s);
        if (!s) return mxi_diag(E->diag, MX_ENOMEM, "tokenizer: out of memory (%zu bytes)", n * sizeof *s);
        E->sym = s;
        E->sym_cap = n;
    }
    symbol *s = E->sym;
    for (size_t i = 0; i < n; i++)
        s[i] = (symbol){.id = t->byte_id[(unsigned char)p[i]], .prev = (int32_t)i - 1,
                        .next = i + 1 < n ? (int32_t)i + 1 : -1};
    E->heap_n = 0;
    int rc = 0;
    for (size_t i = 0; rc == 0 && i + 1 < n; i++) rc = heap_push(E, (int32_t)i);
    while (rc == 0 && E->heap_n > 0) {
        merge_cand c = heap_pop(E);
        int32_t a = c.pos, b = s[a].next;
        if (s[a].id != (int32_t)c.left || b < 0 || s[b].id != (int32_t)c.right) continue; /* stale */
        uint32_t rank, id;
        merge_of(t, c.left, c.right, &rank, &id);
        s[a].id = (int32_t)id;
        s[a].next = s[b].next;
        if (s[b].next >= 0) s[s[b].next].prev = a;
        s[b].id = -2; /* merged away: a stale candidate at b never matches */
        if (s[a].prev >= 0) rc = heap_push(E, s[a].prev);
        if (rc == 0) rc = heap_push(E, a);
    }
    for (int32_t i = 0; rc == 0 && i >= 0; i = s[i].next)
        if (s[i].id >= 0) rc = push(E, (uint32_t)s[i].id);
    return rc;
}

/* The pre-tokenizer's split k over [p, p + n), then the next split on each piece, BPE last. */
static int split(enc *E, int k, const char *p, size_t n) {
    if (n == 0) return 0;
    if (k == E->t->n_splits) return bpe(E, p, n);
    const tok_split *sp = &E->t->splits[k];
    size_t at = 0, prev = 0;
    int rc = 0;
    while (rc == 0 && at <= n) {
        int m = pcre2_match(sp->re, (PCRE2_SPTR)p, n, at, PCRE2_NO_UTF_CHECK, E->md[k], NULL);
        if (m == PCRE2_ERROR_JIT_STACKLIMIT) /* the interpreter keeps its backtracking on the heap */
            m = pcre2_match(sp->re, (PCRE2_SPTR)p, n, at, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, E->md[k], NULL);
        if (m == PCRE2_ERROR_NOMATCH) break;
        if (m < 0) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(m, msg, sizeof msg);
            return mxi_diag(E->diag, MX_EINVAL, "%s: the pre-tokenizer's regex failed on a piece of %zu bytes: %s",
                            E->t->path, n, (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(E->md[k]);
        size_t s = ov[0], e = ov[1];
        if (e == s) { /* an empty match splits nothing: step over one character */
            at = s + 1;
            while (at < n && ((unsigned char)p[at] & 0xC0) == 0x80) at++;
            continue;
        }
        if (s > prev && sp->keep == TOK_SPLIT_ISOLATED) rc = split(E, k + 1, p + prev, s - prev);
        if (rc == 0) rc = split(E, k + 1, p + s, e - s);
        prev = at = e;
    }
    if (rc == 0 && prev < n && sp->keep == TOK_SPLIT_ISOLATED) rc = split(E, k + 1, p + prev, n - prev);
    return rc;
}

static int pretokenize(enc *E, const char *p, size_t n) {
    if (n == 0) return 0;
    if (!E->t->prefix_space || p[0] == ' ') return split(E, 0, p, n);
    char *q = malloc(n + 1);
    if (!q) return mxi_diag(E->diag, MX_ENOMEM, "tokenizer: out of memory (%zu bytes)", n + 1);
    q[0] = ' ';
    memcpy(q + 1, p, n);
    int rc = split(E, 0, q, n + 1);
    free(q);
    return rc;
}

static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

typedef int (*segment_fn)(enc *E, const char *p, size_t n);

/* Split the added tokens of one class (normalized or not) out of [p, p + n): the leftmost
 * match, the longest there; lstrip / rstrip take the whitespace beside it along. The text
 * between goes to `rest`. */
static int split_added(enc *E, bool normalized, const char *p, size_t n, segment_fn rest) {
    const mxi_tokenizer *t = E->t;
    size_t pos = 0;
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        if (!t->added_first[normalized][(unsigned char)p[i]]) continue;
        const tok_added *best = NULL;
        for (int k = 0; k < t->n_added; k++) {
            const tok_added *a = &t->added[k];
            if (a->normalized == normalized && a->len <= n - i && (!best || a->len > best->len) &&
                memcmp(p + i, t->bytes + a->off, a->len) == 0)
                best = a;
        }
        if (!best) continue;
        size_t start = i, end = i + best->len;
        if (best->lstrip)
            while (start > pos && is_space(p[start - 1])) start--;
        if (best->rstrip)
            while (end < n && is_space(p[end])) end++;
        rc = rest(E, p + pos, start - pos);
        if (rc == 0) rc = push(E, best->id);
        pos = end;
        i = end - 1;
    }
    return rc ? rc : rest(E, p + pos, n - pos);
}

static int normalized_segment(enc *E, const char *p, size_t n) { return split_added(E, true, p, n, pretokenize); }

static int raw_segment(enc *E, const char *p, size_t n) {
    if (n == 0) return 0;
    bool ascii = true; /* every normal form leaves ASCII as it is */
    for (size_t i = 0; ascii && i < n; i++) ascii = (unsigned char)p[i] < 0x80;
    if (E->t->norm == TOK_NORM_NONE || ascii) return normalized_segment(E, p, n);
    static const utf8proc_option_t forms[] = {
        [TOK_NORM_NFC] = UTF8PROC_STABLE | UTF8PROC_COMPOSE,
        [TOK_NORM_NFD] = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE,
        [TOK_NORM_NFKC] = UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT,
        [TOK_NORM_NFKD] = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT,
    };
    utf8proc_uint8_t *q = NULL;
    utf8proc_ssize_t m = utf8proc_map((const utf8proc_uint8_t *)p, (utf8proc_ssize_t)n, &q, forms[E->t->norm]);
    if (m < 0)
        return mxi_diag(E->diag, m == UTF8PROC_ERROR_NOMEM ? MX_ENOMEM : MX_EINVAL,
                        "%s: the normalizer failed on a piece of %zu bytes: %s", E->t->path, n, utf8proc_errmsg(m));
    int rc = normalized_segment(E, (const char *)q, (size_t)m);
    free(q);
    return rc;
}

/* Length of a well-formed UTF-8 sequence at s (n bytes left; no overlongs, surrogates or
 * code points past U+10FFFF, as PCRE2 requires), or 0. */
static int utf8_valid(const unsigned char *s, size_t n) {
    if (s[0] < 0x80) return 1;
    int len = s[0] >= 0xC2 && s[0] <= 0xDF ? 2 : s[0] >= 0xE0 && s[0] <= 0xEF ? 3 : s[0] >= 0xF0 && s[0] <= 0xF4 ? 4 : 0;
    if (len == 0 || (size_t)len > n) return 0;
    for (int i = 1; i < len; i++)
        if ((s[i] & 0xC0) != 0x80) return 0;
    if (s[0] == 0xE0 && s[1] < 0xA0) return 0;
    if (s[0] == 0xED && s[1] >= 0xA0) return 0;
    if (s[0] == 0xF0 && s[1] < 0x90) return 0;
    if (s[0] == 0xF4 && s[1] >= 0x90) return 0;
    return len;
}

/* text with every byte that does not start a well-formed sequence replaced by U+FFFD, or
 * NULL (and *copy NULL) when text is all well-formed. */
static int sanitize(const char *text, size_t len, char **copy, size_t *copy_len, mx_diag *diag) {
    *copy = NULL;
    size_t i = 0;
    const unsigned char *s = (const unsigned char *)text;
    int l;
    while (i < len && (l = utf8_valid(s + i, len - i)) > 0) i += (size_t)l;
    if (i == len) return 0;
    char *c = malloc(3 * len);
    if (!c) return mxi_diag(diag, MX_ENOMEM, "tokenizer: out of memory (%zu bytes)", 3 * len);
    memcpy(c, text, i);
    size_t o = i;
    while (i < len) {
        if ((l = utf8_valid(s + i, len - i)) > 0) {
            memcpy(c + o, s + i, (size_t)l);
            o += (size_t)l;
            i += (size_t)l;
        } else {
            memcpy(c + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i++;
        }
    }
    *copy = c;
    *copy_len = o;
    return 0;
}

int mxi_tokenizer_encode(const mxi_tokenizer *t, const char *text, size_t len, mxi_tok_encode_mode mode,
                         mxi_tok_ids *out, mx_diag *diag) {
    if (!t || (!text && len) || !out) return mxi_diag(diag, MX_ENULL, "mxi_tokenizer_encode: NULL argument");
    if (mode != MXI_TOK_ENCODE_PLAIN && mode != MXI_TOK_ENCODE_ADD_SPECIAL)
        return mxi_diag(diag, MX_EENUM, "mxi_tokenizer_encode: mode %d (allowed: MXI_TOK_ENCODE_PLAIN, "
                        "MXI_TOK_ENCODE_ADD_SPECIAL)", (int)mode);
    enc E = {.t = t, .out = out, .diag = diag};
    char *copy;
    size_t copy_len;
    int rc = sanitize(text ? text : "", len, &copy, &copy_len, diag);
    if (rc) return rc;
    if (copy) {
        text = copy;
        len = copy_len;
    }
    E.md = calloc((size_t)t->n_splits + 1, sizeof *E.md);
    if (!E.md) rc = mxi_diag(diag, MX_ENOMEM, "tokenizer: out of memory");
    for (int k = 0; rc == 0 && k < t->n_splits; k++)
        if (!(E.md[k] = pcre2_match_data_create_from_pattern(t->splits[k].re, NULL)))
            rc = mxi_diag(diag, MX_ENOMEM, "tokenizer: out of memory (PCRE2 match data)");
    bool add = mode == MXI_TOK_ENCODE_ADD_SPECIAL;
    for (int k = 0; rc == 0 && add && k < t->n_pre; k++) rc = push(&E, t->tmpl_pre[k]);
    if (rc == 0) rc = split_added(&E, false, text ? text : "", len, raw_segment);
    for (int k = 0; rc == 0 && add && k < t->n_post; k++) rc = push(&E, t->tmpl_post[k]);
    for (int k = 0; E.md && k < t->n_splits; k++) pcre2_match_data_free(E.md[k]);
    free(E.md);
    free(E.sym);
    free(E.heap);
    free(copy);
    return rc;
}

int mxi_tokenizer_decode(const mxi_tokenizer *t, const uint32_t *ids, int64_t n, mxi_tok_decode_mode mode,
                         char **text, size_t *len, mx_diag *diag) {
    if (!t || (!ids && n) || n < 0 || !text || !len) return mxi_diag(diag, MX_ENULL, "mxi_tokenizer_decode: NULL argument");
    *text = NULL;
    *len = 0;
    size_t total = 0;
    for (int64_t i = 0; i < n; i++) {
        const tok_entry *e = ids[i] < t->vocab_size ? &t->entries[ids[i]] : NULL;
        if (!e || (!e->present && e->added < 0))
            return mxi_diag(diag, MX_EINVAL, "%s: token id %u is not in the vocabulary (allowed: the ids of "
                            "tokenizer.json, 0 to %lld)", t->path, ids[i], (long long)t->vocab_size - 1);
        if (e->added >= 0) total += e->special && mode == MXI_TOK_DECODE_SKIP_SPECIAL ? 0 : t->added[e->added].len;
        else total += e->len;
    }
    char *s = malloc(total + 1);
    if (!s) return mxi_diag(diag, MX_ENOMEM, "tokenizer: out of memory (%zu bytes of text)", total + 1);
    size_t o = 0;
    for (int64_t i = 0; i < n; i++) {
        const tok_entry *e = &t->entries[ids[i]];
        if (e->added >= 0) {
            if (e->special && mode == MXI_TOK_DECODE_SKIP_SPECIAL) continue;
            memcpy(s + o, t->bytes + t->added[e->added].off, t->added[e->added].len);
            o += t->added[e->added].len;
        } else {
            memcpy(s + o, t->bytes + e->off, e->len);
            o += e->len;
        }
    }
    s[o] = 0;
    *text = s;
    *len = o;
    return 0;
}

void mxi_tokenizer_ids_free(mxi_tok_ids *ids) {
    if (!ids) return;
    free(ids->ids);
    *ids = (mxi_tok_ids){0};
}
