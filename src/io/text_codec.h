/* Internal: text to token ids and back, for generation and the samples a training run
 * prints. Two codecs: the byte-level vocabulary of `mxtrain prepare` (include/mxtrain/
 * tokens.h: each byte a token 0..255, MX_PREPARE_EOT = 256 before every document), and the
 * Hugging Face tokenizer a model directory carries (io/tokenizer.h) as `prepare --tokenizer`
 * uses it. Either way a prompt is the start of a document as prepare writes one: the
 * end-of-document token, then the prompt's tokens. */
#ifndef MXI_TEXT_CODEC_H
#define MXI_TEXT_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "mxtrain/error.h"

typedef enum { MXI_CODEC_BYTES = 0, MXI_CODEC_BPE = 1 } mxi_codec_kind;

struct mxi_tokenizer;

typedef struct {
    mxi_codec_kind kind;
    int vocab;    // the model's vocabulary size
    int eos;      // the token that ends a document (generation stops there), or -1
    struct mxi_tokenizer *tok;   // BPE: the directory's tokenizer.json
    char *text;   // BPE: every token's text back to back (special tokens have none)
    int64_t *at;  // BPE: (vocab + 1) token i's text is text[at[i], at[i + 1])
} mxi_text_codec;

/* The codec of a model of vocab_size tokens whose directory is dir (NULL: none, e.g. a
 * training run): BPE when dir holds a tokenizer.json (its vocabulary within vocab_size),
 * else byte-level for the vocabulary of `prepare` (257). eos: config.json's eos_token_id
 * when dir has one (its first, for a list), else the tokenizer's, else the byte-level
 * end-of-text. Another vocabulary without a tokenizer is MX_EUNSUPPORTED naming it. */
int mxi_text_codec_open(mxi_text_codec *codec, const char *dir, int vocab_size, mx_diag *diag);
void mxi_text_codec_close(mxi_text_codec *codec);

/* The ids of a prompt text[0..len) into out (at most max; *n receives how many): the
 * end-of-document token, then the bytes (byte-level) or the tokenizer's ids with its
 * template, as prepare encodes a document. MX_ESIZE when they do not fit. */
int mxi_text_encode(const mxi_text_codec *codec, const char *text, size_t len, int32_t *out, int max, int *n,
                    mx_diag *diag);

/* The text of one token into buf (size bytes); returns its length (0 for a token without
 * text: end-of-text, special tokens, ids past the vocabulary). */
size_t mxi_text_decode(const mxi_text_codec *codec, int32_t token, char *buf, size_t size);

#endif
