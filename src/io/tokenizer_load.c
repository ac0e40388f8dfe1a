/* tokenizer.json -> the lookup tables of a byte-level BPE tokenizer (tokenizer_internal.h).
 * Whatever the file declares that the encoder does not implement is refused here, with one
 * line naming the file, the key, the value and what is allowed. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/diag.h"
#include "core/file.h"
#include "core/text.h"
#include "io/io_internal.h"
#include "io/tokenizer_internal.h"

/* GPT-2's pre-tokenizer regex: the one ByteLevel applies when use_regex is true. */
static const char gpt2_regex[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* A string from the file, quoted for a one-line message (control characters escaped). */
#define Q(s) mxi_quote((char[MXI_QUOTE_SIZE]){0}, MXI_QUOTE_SIZE, (s), strlen(s))

typedef struct {
    mxi_tokenizer *t;
    const char *name;
    mx_diag *diag;
    int16_t cp_byte[512]; /* byte-level alphabet: code point -> the byte it stands for, -1 none */
} loader;

/* GPT-2's bytes_to_unicode: printable bytes stand for themselves, the others for 256, 257, ... */
static void byte_alphabet(int16_t cp_byte[512]) {
    for (int i = 0; i < 512; i++) cp_byte[i] = -1;
    int next = 256;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        cp_byte[printable ? b : next++] = (int16_t)b;
    }
}

/* Decode one UTF-8 code point at s (n bytes left); its length, or 0 if malformed. */
static int utf8_next(const unsigned char *s, size_t n, uint32_t *cp) {
    if (s[0] < 0x80) { *cp = s[0]; return 1; }
    int len = (s[0] & 0xE0) == 0xC0 ? 2 : (s[0] & 0xF0) == 0xE0 ? 3 : (s[0] & 0xF8) == 0xF0 ? 4 : 0;
    if (len == 0 || (size_t)len > n) return 0;
    uint32_t c = s[0] & (0x7F >> len);
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        c = c << 6 | (s[i] & 0x3F);
    }
    *cp = c;
    return len;
}

/* A token as tokenizer.json spells it -> its bytes (in place: never longer). Code points
 * outside the byte-level alphabet stay as they are, as Hugging Face's ByteLevel decoder
 * keeps them. */
static size_t unmap(const int16_t cp_byte[512], char *s, size_t n) {
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int l = utf8_next((const unsigned char *)s + i, n - i, &cp);
        if (l == 0) { s[o++] = s[i++]; continue; }
        if (cp < 512 && cp_byte[cp] >= 0) s[o++] = (char)cp_byte[cp];
        else { memmove(s + o, s + i, (size_t)l); o += (size_t)l; }
        i += (size_t)l;
    }
    return o;
}

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

static uint64_t hash_pair(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return k;
}

int64_t mxi_tok_vocab_find(const mxi_tokenizer *t, const char *s, size_t n) {
    if (!t->vocab_slots) return -1;
    for (uint64_t i = hash_bytes(s, n) & t->vocab_mask;; i = (i + 1) & t->vocab_mask) {
        int32_t id = t->vocab_slots[i];
        if (id < 0) return -1;
        const tok_entry *e = &t->entries[id];
        if (e->len == n && memcmp(t->bytes + e->off, s, n) == 0) return id;
    }
}

static int oom(loader *L, size_t bytes) {
    return mxi_diag(L->diag, MX_ENOMEM, "%s: out of memory (%zu bytes)", L->name, bytes);
}

static int store_bytes(loader *L, const char *s, size_t n, uint32_t *off) {
    mxi_tokenizer *t = L->t;
    if (n == 0) {   // an empty token: nothing to copy (the buffer may not exist yet)
        *off = (uint32_t)t->bytes_len;
        return 0;
    }
    if (t->bytes_len + n > UINT32_MAX) return mxi_diag(L->diag, MX_EFORMAT, "%s: the tokens exceed 4 GiB", L->name);
    if (t->bytes_len + n > t->bytes_cap) {
        size_t cap = t->bytes_cap ? 2 * t->bytes_cap : 1 << 20;
        while (cap < t->bytes_len + n) cap *= 2;
        char *b = realloc(t->bytes, cap);
        if (!b) return oom(L, cap);
        t->bytes = b;
        t->bytes_cap = cap;
    }
    memcpy(t->bytes + t->bytes_len, s, n);
    *off = (uint32_t)t->bytes_len;
    t->bytes_len += n;
    return 0;
}

static int get_id(loader *L, const json_t *v, const char *key, const char *token, int64_t *id) {
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= MXI_TOKENIZER_MAX_VOCAB)
        return mxi_diag(L->diag, MX_EFORMAT, "%s: %s '%s': id %s (allowed: an integer from 0 to %d)", L->name, key,
                        Q(token), json_is_integer(v) ? "out of range" : "is not an integer", MXI_TOKENIZER_MAX_VOCAB - 1);
    *id = json_integer_value(v);
    return 0;
}

static bool flag(const json_t *obj, const char *key, bool dflt) {
    const json_t *v = json_object_get(obj, key);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

static const char *type_of(const json_t *obj) {
    const json_t *v = json_object_get(obj, "type");
    return json_is_string(v) ? json_string_value(v) : "(none)";
}

static int load_vocab(loader *L, const json_t *model, const json_t *added) {
    mxi_tokenizer *t = L->t;
    const json_t *vocab = json_object_get(model, "vocab");
    if (!json_is_object(vocab) || json_object_size(vocab) == 0)
        return mxi_diag(L->diag, MX_EFORMAT, "%s: model.vocab is %s (allowed: an object of token: id)", L->name,
                        vocab ? "not an object or empty" : "missing");
    int64_t max_id = -1, id;
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)vocab, key, v) {
        int rc = get_id(L, v, "model.vocab", key, &id);
        if (rc) return rc;
        if (id > max_id) max_id = id;
    }
    size_t i;
    json_array_foreach(added, i, v) {
        int rc = get_id(L, json_object_get(v, "id"), "added_tokens id of", json_string_value(json_object_get(v, "content"))
                        ? json_string_value(json_object_get(v, "content")) : "?", &id);
        if (rc) return rc;
        if (id > max_id) max_id = id;
    }
    t->vocab_size = max_id + 1;
    t->entries = calloc((size_t)t->vocab_size, sizeof *t->entries);
    uint64_t slots = 1;
    while (slots < 2 * json_object_size(vocab)) slots *= 2;
    t->vocab_mask = slots - 1;
    t->vocab_slots = malloc(slots * sizeof *t->vocab_slots);
    if (!t->entries || !t->vocab_slots) return oom(L, slots * sizeof(int32_t) + (size_t)t->vocab_size * sizeof(tok_entry));
    memset(t->vocab_slots, 0xFF, slots * sizeof *t->vocab_slots);
    for (int64_t k = 0; k < t->vocab_size; k++) t->entries[k].added = -1;
    for (int b = 0; b < 256; b++) t->byte_id[b] = -1;
    char *buf = NULL;
    size_t buf_cap = 0;
    int rc = 0;
    json_object_foreach((json_t *)vocab, key, v) {
        id = json_integer_value(v);
        size_t n = strlen(key);
        if (n + 1 > buf_cap) {
            free(buf);
            buf_cap = 2 * n + 64;
            if (!(buf = malloc(buf_cap))) { rc = oom(L, buf_cap); break; }
        }
        memcpy(buf, key, n);
        n = unmap(L->cp_byte, buf, n);
        if (t->entries[id].present) {
            rc = mxi_diag(L->diag, MX_EFORMAT, "%s: model.vocab: id %lld is given to two tokens (allowed: one token per id)",
                          L->name, (long long)id);
            break;
        }
        if (mxi_tok_vocab_find(t, buf, n) >= 0) continue; /* two spellings of one byte string: keep the first */
        if ((rc = store_bytes(L, buf, n, &t->entries[id].off))) break;
        t->entries[id].len = (uint32_t)n;
        t->entries[id].present = true;
        uint64_t s = hash_bytes(buf, n) & t->vocab_mask;
        while (t->vocab_slots[s] >= 0) s = (s + 1) & t->vocab_mask;
        t->vocab_slots[s] = (int32_t)id;
        if (n == 1) t->byte_id[(unsigned char)buf[0]] = (int32_t)id;
    }
    free(buf);
    return rc;
}

/* A merge's two sides: "a b" or ["a", "b"], unmapped into bytes (a at *a, b at *b). */
static int merge_sides(loader *L, const json_t *m, size_t i, char **a, size_t *na, char **b, size_t *nb) {
    const char *sa = NULL, *sb = NULL;
    size_t la = 0, lb = 0;
    if (json_is_string(m)) {
        const char *s = json_string_value(m), *sp = strchr(s, ' ');
        if (sp && !strchr(sp + 1, ' ')) { sa = s; la = (size_t)(sp - s); sb = sp + 1; lb = strlen(sb); }
    } else if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
               json_is_string(json_array_get(m, 1))) {
        sa = json_string_value(json_array_get(m, 0));
        sb = json_string_value(json_array_get(m, 1));
        la = strlen(sa);
        lb = strlen(sb);
    }
    if (!sa || la == 0 || lb == 0)
        return mxi_diag(L->diag, MX_EFORMAT, "%s: model.merges[%zu] is malformed (allowed: \"A B\" or [\"A\", \"B\"])",
                        L->name, i);
    *a = malloc(la + lb + 1);
    if (!*a) return oom(L, la + lb + 1);
    memcpy(*a, sa, la);
    memcpy(*a + la, sb, lb);
    *na = unmap(L->cp_byte, *a, la);
    /* b right after a, so a b is the merged token's bytes */
    memmove(*a + *na, *a + la, lb);
    *nb = unmap(L->cp_byte, *a + *na, lb);
    *b = *a + *na;
    return 0;
}

static int load_merges(loader *L, const json_t *model) {
    mxi_tokenizer *t = L->t;
    const json_t *merges = json_object_get(model, "merges");
    if (!json_is_array(merges))
        return mxi_diag(L->diag, MX_EFORMAT, "%s: model.merges is %s (allowed: an array of merges)", L->name,
                        merges ? "not an array" : "missing");
    size_t n = json_array_size(merges);
    uint64_t slots = 1;
    while (slots < 2 * n + 2) slots *= 2;
    t->merge_mask = slots - 1;
    t->merge_keys = malloc(slots * sizeof *t->merge_keys);
    t->merge_rank = malloc(slots * sizeof *t->merge_rank);
    t->merge_id = malloc(slots * sizeof *t->merge_id);
    if (!t->merge_keys || !t->merge_rank || !t->merge_id) return oom(L, slots * 16);
    memset(t->merge_keys, 0xFF, slots * sizeof *t->merge_keys);
    for (size_t i = 0; i < n; i++) {
        char *a = NULL, *b = NULL;
        size_t na = 0, nb = 0;
        int rc = merge_sides(L, json_array_get(merges, i), i, &a, &na, &b, &nb);
        if (rc) return rc;
        int64_t ia = mxi_tok_vocab_find(t, a, na), ib = mxi_tok_vocab_find(t, b, nb),
                im = mxi_tok_vocab_find(t, a, na + nb);
        free(a);
        if (ia < 0 || ib < 0 || im < 0)
            return mxi_diag(L->diag, MX_EFORMAT, "%s: model.merges[%zu]: its %s is not in model.vocab (allowed: merges of "
                            "vocabulary tokens into a vocabulary token)", L->name, i,
                            ia < 0 ? "first token" : ib < 0 ? "second token" : "merged token");
        uint64_t key = (uint64_t)ia << 32 | (uint64_t)ib;
        uint64_t s = hash_pair(key) & t->merge_mask;
        while (t->merge_keys[s] != UINT64_MAX && t->merge_keys[s] != key) s = (s + 1) & t->merge_mask;
        if (t->merge_keys[s] == key) continue; /* a repeated merge keeps its first rank */
        t->merge_keys[s] = key;
        t->merge_rank[s] = (uint32_t)i;
        t->merge_id[s] = (uint32_t)im;
    }
    return 0;
}

static int load_added(loader *L, const json_t *added) {
    mxi_tokenizer *t = L->t;
    size_t n = json_array_size(added), i;
    t->added = calloc(n ? n : 1, sizeof *t->added);
    if (!t->added) return oom(L, n * sizeof *t->added);
    const json_t *a;
    json_array_foreach(added, i, a) {
        const json_t *c = json_object_get(a, "content");
        if (!json_is_string(c) || json_string_length(c) == 0)
            return mxi_diag(L->diag, MX_EFORMAT, "%s: added_tokens[%zu].content is %s (allowed: a non-empty string)",
                            L->name, i, c ? "not a string or empty" : "missing");
        if (flag(a, "single_word", false))
            return mxi_diag(L->diag, MX_EUNSUPPORTED, "%s: added_tokens[%zu] '%s': single_word true is not implemented "
                            "(allowed: false)", L->name, i, Q(json_string_value(c)));
        int64_t id = json_integer_value(json_object_get(a, "id"));
        tok_entry *e = &t->entries[id];
        if (e->added >= 0)
            return mxi_diag(L->diag, MX_EFORMAT, "%s: added_tokens[%zu] '%s': id %lld is given to another added token "
                            "(allowed: one token per id)", L->name, i, Q(json_string_value(c)), (long long)id);
        bool special = flag(a, "special", false);
        tok_added *d = &t->added[t->n_added];
        *d = (tok_added){.id = (uint32_t)id, .len = (uint32_t)json_string_length(c),
                         .normalized = flag(a, "normalized", !special), .lstrip = flag(a, "lstrip", false),
                         .rstrip = flag(a, "rstrip", false)};
        int rc = store_bytes(L, json_string_value(c), json_string_length(c), &d->off);
        if (rc) return rc;
        e->added = t->n_added++;
        e->special = special;
        t->added_first[d->normalized][(unsigned char)json_string_value(c)[0]] = true;
    }
    return 0;
}

static int load_normalizer(loader *L, const json_t *n, const char *key) {
    if (!n || json_is_null(n)) return 0;
    const char *type = type_of(n);
    static const struct { const char *name; tok_norm norm; } forms[] = {
        {"NFC", TOK_NORM_NFC}, {"NFD", TOK_NORM_NFD}, {"NFKC", TOK_NORM_NFKC}, {"NFKD", TOK_NORM_NFKD}};
    for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++) {
        if (strcmp(type, forms[i].name) != 0) continue;
        if (L->t->norm != TOK_NORM_NONE && L->t->norm != forms[i].norm)
            return mxi_diag(L->diag, MX_EUNSUPPORTED, "%s: %s: two Unicode normal forms in one Sequence are not "
                            "implemented (allowed: one of NFC, NFD, NFKC, NFKD)", L->name, key);
        L->t->norm = forms[i].norm;
        return 0;
    }
    if (strcmp(type, "Sequence") == 0) {
        const json_t *seq = json_object_get(n, "normalizers"), *e;
        size_t i;
        json_array_foreach(seq, i, e) {
            int rc = load_normalizer(L, e, "normalizer.normalizers[]");
            if (rc) return rc;
        }
        return 0;
    }
    return mxi_diag(L->diag, MX_EUNSUPPORTED, "%s: %s type '%s' is not implemented (allowed: NFC, NFD, NFKC, NFKD, "
                    "a Sequence of one of them, or null)", L->name, key, Q(type));
}

static int add_split(loader *L, const char *pattern, bool literal, tok_split_keep keep, const char *key) {
    mxi_tokenizer *t = L->t;
    tok_split *s = realloc(t->splits, (size_t)(t->n_splits + 1) * sizeof *s);
    if (!s) return oom(L, (size_t)(t->n_splits + 1) * sizeof *s);
    t->splits = s;
    int err;
    PCRE2_SIZE at;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0), &err, &at, NULL);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(err, msg, sizeof msg);
        return mxi_diag(L->diag, MX_EFORMAT, "%s: %s pattern '%s': %s at offset %zu (allowed: a regex PCRE2 reads)",
                        L->name, key, Q(pattern), (const char *)msg, (size_t)at);
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* without JIT support pcre2_match interprets */
    t->splits[t->n_splits++] = (tok_split){.re = re, .keep = keep};
    return 0;
}

static int load_pre(loader *L, const json_t *p, bool *byte_level) {
    const char *type = type_of(p);
    if (strcmp(type, "Sequence") == 0) {
        const json_t *seq = json_object_get(p, "pretokenizers"), *e;
        size_t i;
        json_array_foreach(seq, i, e) {
            int rc = load_pre(L, e, byte_level);
            if (rc) return rc;
        }
        return 0;
    }
    if (strcmp(type, "ByteLevel") == 0) {
        *byte_level = true;
        if (flag(p, "add_prefix_space", true)) {
            if (L->t->n_splits > 0)
                return mxi_diag(L->diag, MX_EUNSUPPORTED, "%s: pre_tokenizer: ByteLevel with add_prefix_space true after "
                                "a Split is not implemented (allowed: first, or add_prefix_space false)", L->name);
            L->t->prefix_space = true;
        }
        return flag(p, "use_regex", true) ? add_split(L, gpt2_regex, false, TOK_SPLIT_ISOLATED, "ByteLevel") : 0;
    }
    if (strcmp(type, "Split") == 0) {
        const json_t *pat = json_object_get(p, "pattern"), *beh = json_object_get(p, "behavior");
        const json_t *re = json_object_get(pat, "Regex"), *str = json_object_get(pat, "String");
        if (!json_is_string(re) && !json_is_string(str))
            return mxi_diag(L->diag, MX_EFORMAT, "%s: pre_tokenizer Split: pattern is missing (allowed: {\"Regex\": ...} "
                            "or {\"String\": ...})", L->name);
        const char *b = json_is_string(beh) ? json_string_value(beh) : "(none)";
        bool invert = flag(p, "invert", false);
        tok_split_keep keep;
        if (strcmp(b, "Isolated") == 0) keep = TOK_SPLIT_ISOLATED;
        else if (strcmp(b, "Removed") == 0 && invert) keep = TOK_SPLIT_MATCHES_ONLY;
        else
            return mxi_diag(L->diag, MX_EUNSUPPORTED, "%s: pre_tokenizer Split: behavior '%s' with invert %s is not "
                            "implemented (allowed: Isolated, or Removed with invert true)", L->name, Q(b),
                            invert ? "true" : "false");
        return add_split(L, json_string_value(re ? re : str), !re, keep, "pre_tokenizer Split");
    }
    return mxi_diag(L->diag, MX_EUNSUPPORTED, "%s: pre_tokenizer type '%s' is not implemented (allowed: ByteLevel, "
                    "Split, Sequence)", L->name, Q(type));
}

static int template_ids(loader *L, const json_t *specials, const char *name, uint32_t **ids, int *n) {
    const json_t *sp = json_object_get(json_object_get(specials, name), "ids"), *v;
    if (!json_is_array(sp))
        return mxi_diag(L->diag, MX_EFORMAT, "%s: post_processor TemplateProcessing: special token '%s' has no ids "
                        "(allowed: a token of special_tokens)", L->name, Q(name));
    size_t i;
    json_array_foreach(sp, i, v) {
        int64_t id;
        int rc = get_id(L, v, "post_processor special token", name, &id);
        if (rc) return rc;
        if (id >= L->t->vocab_size)   // a token id the model's vocabulary cannot hold
            return mxi_diag(L->diag, MX_EFORMAT, "%s: post_processor TemplateProcessing: special token '%s' has id %lld, "
                            "outside the vocabulary (allowed: an id from 0 to %lld)", L->name, Q(name), (long long)id,
                            (long long)L->t->vocab_size - 1);
        uint32_t *p = realloc(*ids, (size_t)(*n + 1) * sizeof *p);
        if (!p) return oom(L, (size_t)(*n + 1) * sizeof *p);
        *ids = p;
        p[(*n)++] = (uint32_t)id;
    }
    return 0;
}

static int load_post(loader *L, const json_t *p) {
    if (!p || json_is_null(p)) return 0;
    const char *type = type_of(p);
    if (strcmp(type, "ByteLevel") == 0) return 0; /* it trims offsets only: no ids change */
    if (strcmp(type, "Sequence") == 0) {
        const json_t *seq = json_object_get(p, "processors"), *e;
        size_t i;
        json_array_foreach(seq, i, e) {
            int rc = load_post(L, e);
            if (rc) return rc;
        }
        return 0;
    }
    if (strcmp(type, "TemplateProcessing") == 0) {
        const json_t *single = json_object_get(p, "single"), *specials = json_object_get(p, "special_tokens"), *e;
        if (L->t->n_pre || L->t->n_post)
            return mxi_diag(L->diag, MX_EUNSUPPORTED, "%s: post_processor: two TemplateProcessing are not implemented "
                            "(allowed: one)", L->name);
        bool seen_a = false;
        size_t i;
        json_array_foreach(single, i, e) {
            const json_t *st = json_object_get(json_object_get(e, "SpecialToken"), "id");
            if (json_is_string(st)) {
                int rc = seen_a ? template_ids(L, specials, json_string_value(st), &L->t->tmpl_post, &L->t->n_post)
                                : template_ids(L, specials, json_string_value(st), &L->t->tmpl_pre, &L->t->n_pre);
                if (rc) return rc;
            } else if (json_object_get(e, "Sequence") && !seen_a) {
                seen_a = true;
            } else {
                return mxi_diag(L->diag, MX_EFORMAT, "%s: post_processor TemplateProcessing: single[%zu] is malformed "
                                "(allowed: SpecialToken items around one Sequence)", L->name, i);
            }
        }
        if (!seen_a)
            return mxi_diag(L->diag, MX_EFORMAT, "%s: post_processor TemplateProcessing: single has no Sequence "
                            "(allowed: SpecialToken items around one Sequence)", L->name);
        return 0;
    }
    return mxi_diag(L->diag, MX_EUNSUPPORTED, "%s: post_processor type '%s' is not implemented (allowed: ByteLevel, "
                    "TemplateProcessing, Sequence, or null)", L->name, Q(type));
}

static int load_model(loader *L, const json_t *model) {
    if (!json_is_object(model))
        return mxi_diag(L->diag, MX_EFORMAT, "%s: model is %s (allowed: an object)", L->name,
                        model ? "not an object" : "missing");
    const char *type = type_of(model);
    if (strcmp(type, "BPE") != 0)
        return mxi_diag(L->diag, MX_EUNSUPPORTED, "%s: model type '%s' is not implemented (allowed: BPE)", L->name,
                        Q(type));
    const json_t *d = json_object_get(model, "dropout");
    if (json_is_number(d) && json_number_value(d) > 0)
        return mxi_diag(L->diag, MX_EUNSUPPORTED, "%s: model.dropout %g is not implemented (allowed: null or 0)", L->name,
                        json_number_value(d));
    static const char *const affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        const json_t *a = json_object_get(model, affixes[i]);
        if (json_is_string(a) && json_string_length(a) > 0)
            return mxi_diag(L->diag, MX_EUNSUPPORTED, "%s: model.%s '%s' is not implemented (allowed: null or \"\")",
                            L->name, affixes[i], Q(json_string_value(a)));
    }
    L->t->ignore_merges = flag(model, "ignore_merges", false);
    return 0;
}

/* A token named in tokenizer_config.json: "<|x|>" or {"content": "<|x|>", ...}; -1 if absent. */
static int config_token(loader *L, const json_t *config, const char *key, int64_t *id) {
    *id = -1;
    const json_t *v = json_object_get(config, key);
    if (json_is_object(v)) v = json_object_get(v, "content");
    if (!v || json_is_null(v)) return 0;
    if (!json_is_string(v) || (*id = mxi_tokenizer_token_id(L->t, json_string_value(v))) < 0)
        return mxi_diag(L->diag, MX_EFORMAT, "%s: tokenizer_config.json %s '%s' is not a token of the tokenizer "
                        "(allowed: one of its added tokens or vocabulary)", L->name, key,
                        Q(json_is_string(v) ? json_string_value(v) : "(not a string)"));
    return 0;
}

int mxi_tokenizer_from_json(const json_t *root, const json_t *config, const char *name, mxi_tokenizer **out,
                            mx_diag *diag) {
    if (!root || !name || !out) return mxi_diag(diag, MX_ENULL, "mxi_tokenizer_from_json: NULL argument");
    *out = NULL;
    if (!json_is_object(root))
        return mxi_diag(diag, MX_EFORMAT, "%s: is not a tokenizer.json (allowed: a JSON object with model, "
                        "pre_tokenizer, ...)", name);
    mxi_tokenizer *t = calloc(1, sizeof *t);
    if (!t || !(t->path = strdup(name))) {
        free(t);
        return mxi_diag(diag, MX_ENOMEM, "%s: out of memory", name);
    }
    t->eos = t->bos = -1;
    loader L = {.t = t, .name = name, .diag = diag};
    byte_alphabet(L.cp_byte);
    const json_t *model = json_object_get(root, "model"), *added = json_object_get(root, "added_tokens");
    const json_t *pre = json_object_get(root, "pre_tokenizer");
    if (added && !json_is_null(added) && !json_is_array(added)) {
        mxi_tokenizer_free(t);
        return mxi_diag(diag, MX_EFORMAT, "%s: added_tokens is not an array (allowed: an array of tokens)", name);
    }
    bool byte_level = false;
    int rc = load_model(&L, model);
    if (rc == 0) rc = load_vocab(&L, model, added);
    if (rc == 0) rc = load_merges(&L, model);
    if (rc == 0) rc = load_added(&L, added);
    if (rc == 0) rc = load_normalizer(&L, json_object_get(root, "normalizer"), "normalizer");
    if (rc == 0 && pre && !json_is_null(pre)) rc = load_pre(&L, pre, &byte_level);
    if (rc == 0 && !byte_level)
        rc = mxi_diag(diag, MX_EUNSUPPORTED, "%s: pre_tokenizer has no ByteLevel step: only byte-level BPE is "
                      "implemented (allowed: ByteLevel, alone or in a Sequence)", name);
    if (rc == 0) rc = load_post(&L, json_object_get(root, "post_processor"));
    if (rc == 0 && config) rc = config_token(&L, config, "eos_token", &t->eos);
    if (rc == 0 && config) rc = config_token(&L, config, "bos_token", &t->bos);
    if (rc) {
        mxi_tokenizer_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

/* tokenizer_config.json: integers as reals, since model_max_length is often 1e30 written out. */
static int read_config(const char *path, json_t **out, mx_diag *diag) {
    char *text;
    size_t len;
    int rc = mxi_read_input(path, "a Hugging Face tokenizer_config.json", MXI_MAX_CONFIG_BYTES, &text, &len, diag);
    if (rc) return rc;
    json_error_t err;
    *out = json_loadb(text, len, JSON_DECODE_INT_AS_REAL, &err);
    free(text);
    if (!*out) return mxi_diag(diag, MX_EFORMAT, "%s:%d: %s", path, err.line, Q(err.text));
    return 0;
}

int mxi_tokenizer_load(const char *path, mxi_tokenizer **out, mx_diag *diag) {
    if (!path || !out) return mxi_diag(diag, MX_ENULL, "mxi_tokenizer_load: NULL argument");
    *out = NULL;
    struct stat st;
    bool dir = stat(path, &st) == 0 && S_ISDIR(st.st_mode);
    size_t n = strlen(path);
    char *file = malloc(n + 32), *cfg = malloc(n + 40);
    if (!file || !cfg) {
        free(file);
        free(cfg);
        return mxi_diag(diag, MX_ENOMEM, "%s: out of memory", path);
    }
    if (dir) {
        snprintf(file, n + 32, "%s%stokenizer.json", path, path[n - 1] == '/' ? "" : "/");
    } else {
        memcpy(file, path, n + 1);
    }
    const char *slash = strrchr(file, '/');
    int d = slash ? (int)(slash - file + 1) : 0;
    snprintf(cfg, n + 40, "%.*stokenizer_config.json", d, file);
    json_t *root = NULL, *config = NULL;
    int rc = 0;
    if (stat(file, &st) != 0)
        rc = mxi_diag(diag, MX_EIO, "%s: cannot open (%s; allowed: a Hugging Face tokenizer.json, or a directory "
                      "holding one)", file, strerror(errno));
    if (rc == 0) rc = mxi_read_json(file, "a Hugging Face tokenizer.json, or a directory holding one", 1ull << 30, &root, diag);
    if (rc == 0 && stat(cfg, &st) == 0) rc = read_config(cfg, &config, diag);
    if (rc == 0) rc = mxi_tokenizer_from_json(root, config, file, out, diag);
    json_decref(root);
    json_decref(config);
    free(file);
    free(cfg);
    return rc;
}

int64_t mxi_tokenizer_token_id(const mxi_tokenizer *t, const char *token) {
    if (!t || !token) return -1;
    size_t n = strlen(token);
    for (int i = 0; i < t->n_added; i++) {
        const tok_added *a = &t->added[i];
        if (a->len == n && memcmp(t->bytes + a->off, token, n) == 0) return a->id;
    }
    char *buf = malloc(n + 1);
    if (!buf) return -1;
    memcpy(buf, token, n);
    int16_t cp_byte[512];
    byte_alphabet(cp_byte);
    int64_t id = mxi_tok_vocab_find(t, buf, unmap(cp_byte, buf, n));
    free(buf);
    return id;
}

int64_t mxi_tokenizer_vocab_size(const mxi_tokenizer *t) { return t ? t->vocab_size : 0; }
int64_t mxi_tokenizer_eos(const mxi_tokenizer *t) { return t ? t->eos : -1; }
int64_t mxi_tokenizer_bos(const mxi_tokenizer *t) { return t ? t->bos : -1; }
const char *mxi_tokenizer_path(const mxi_tokenizer *t) { return t ? t->path : NULL; }

void mxi_tokenizer_free(mxi_tokenizer *t) {
    if (!t) return;
    for (int i = 0; i < t->n_splits; i++) pcre2_code_free(t->splits[i].re);
    free(t->splits);
    free(t->path);
    free(t->bytes);
    free(t->entries);
    free(t->vocab_slots);
    free(t->merge_keys);
    free(t->merge_rank);
    free(t->merge_id);
    free(t->added);
    free(t->tmpl_pre);
    free(t->tmpl_post);
    free(t);
}
