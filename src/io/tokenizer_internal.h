/* The tables of a loaded tokenizer, shared by its loader (tokenizer_load.c) and encoder
 * (tokenizer_encode.c). Token strings are kept as raw bytes: the byte-level alphabet of
 * tokenizer.json (bytes mapped to printable code points, ' ' as 'Ġ') is undone on load. */
#ifndef MXI_TOKENIZER_INTERNAL_H
#define MXI_TOKENIZER_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdbool.h>

#include "io/tokenizer.h"

typedef enum { TOK_NORM_NONE, TOK_NORM_NFC, TOK_NORM_NFD, TOK_NORM_NFKC, TOK_NORM_NFKD } tok_norm;

/* A pre-tokenizer step: a regex split (Split, or ByteLevel with use_regex) keeping the
 * matches and the text between them (isolated) or the matches only (removed gaps). */
typedef enum { TOK_SPLIT_ISOLATED, TOK_SPLIT_MATCHES_ONLY } tok_split_keep;
typedef struct {
    pcre2_code *re;
    tok_split_keep keep;
} tok_split;

typedef struct {
    uint32_t off, len; /* the vocabulary entry's bytes in tokenizer.bytes */
    bool present;      /* the id is in the model's vocabulary */
    bool special;      /* an added token marked special (decode may skip it) */
    int32_t added;     /* index into tokenizer.added, or -1 */
} tok_entry;

typedef struct {
    uint32_t id;
    uint32_t off, len; /* its content in tokenizer.bytes */
    bool normalized; /* matched in normalized text (else in the raw text) */
    bool lstrip, rstrip;
} tok_added;

struct mxi_tokenizer {
    char *path;
    char *bytes;       /* every token's bytes, back to back */
    size_t bytes_len, bytes_cap;
    tok_entry *entries; /* (vocab_size) */
    int64_t vocab_size;
    /* the model's vocabulary: open addressing over ids keyed by their bytes */
    int32_t *vocab_slots; /* (vocab_mask + 1), -1 empty */
    uint64_t vocab_mask;
    int32_t byte_id[256]; /* id of each single byte, -1 if absent */
    /* merges: key (left << 32 | right) -> rank, merged id */
    uint64_t *merge_keys; /* (merge_mask + 1), UINT64_MAX empty */
    uint32_t *merge_rank, *merge_id;
    uint64_t merge_mask;
    bool ignore_merges;   /* a word that is a whole vocabulary entry is that token */
    tok_added *added;     /* (n_added) */
    int n_added;
    bool added_first[2][256]; /* [normalized] some added token starts with this byte */
    tok_norm norm;
    bool prefix_space;    /* ByteLevel add_prefix_space: a segment gets a leading ' ' */
    tok_split *splits;    /* (n_splits) applied in order */
    int n_splits;
    uint32_t *tmpl_pre, *tmpl_post; /* TemplateProcessing's single: ids before / after */
    int n_pre, n_post;
    int64_t eos, bos;
};

/* The id of a byte string in the model's vocabulary, or -1. */
int64_t mxi_tok_vocab_find(const mxi_tokenizer *tok, const char *s, size_t len);

#endif
