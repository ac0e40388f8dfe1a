/* Hugging Face `tokenizers` byte-level BPE (Qwen2/Qwen3, Llama 3, GPT-2, GPT-4o): a
 * tokenizer.json read into lookup tables, text encoded to token ids and ids decoded back
 * to bytes. What a tokenizer.json may declare and what is refused: docs/files.md. */
#ifndef MXI_TOKENIZER_H
#define MXI_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "mxtrain/error.h"

/* Largest token id + 1 accepted (the biggest real vocabularies are ~260k). */
#define MXI_TOKENIZER_MAX_VOCAB (1 << 22)

typedef struct mxi_tokenizer mxi_tokenizer;

/* Whether encode applies the post-processor's template (TemplateProcessing adds e.g. the
 * BOS token, as Hugging Face's add_special_tokens=True); ByteLevel post-processors add no
 * ids either way. */
typedef enum { MXI_TOK_ENCODE_PLAIN, MXI_TOK_ENCODE_ADD_SPECIAL } mxi_tok_encode_mode;

/* Whether decode writes the bytes of special added tokens (<|endoftext|>) or skips them. */
typedef enum { MXI_TOK_DECODE_KEEP_SPECIAL, MXI_TOK_DECODE_SKIP_SPECIAL } mxi_tok_decode_mode;

/* A growable id array that encode appends to. */
typedef struct {
    uint32_t *ids; /* (n) */
    int64_t n, cap;
} mxi_tok_ids;

/* Load PATH: a tokenizer.json, or a directory holding one; tokenizer_config.json beside it,
 * if present, gives the EOS and BOS tokens. Errors (one line naming the file): MX_EIO
 * unreadable, MX_EFORMAT malformed JSON or tables, MX_EUNSUPPORTED a model, pre-tokenizer,
 * normalizer or post-processor this reader does not implement. */
int mxi_tokenizer_load(const char *path, mxi_tokenizer **out, mx_diag *diag);

/* The same from parsed JSON (config may be NULL); name is the file named in messages. */
int mxi_tokenizer_from_json(const json_t *root, const json_t *config, const char *name, mxi_tokenizer **out,
                            mx_diag *diag);

/* Append the ids of text (len bytes; bytes that are not UTF-8 are read as U+FFFD) to out.
 * Thread-safe: one tokenizer may encode on many threads. */
int mxi_tokenizer_encode(const mxi_tokenizer *tok, const char *text, size_t len, mxi_tok_encode_mode mode,
                         mxi_tok_ids *out, mx_diag *diag);

/* The bytes of ids (n of them) in a malloc'ed NUL-terminated string (*text, *len without the
 * NUL). MX_EINVAL naming an id that is not in the vocabulary. */
int mxi_tokenizer_decode(const mxi_tokenizer *tok, const uint32_t *ids, int64_t n, mxi_tok_decode_mode mode,
                         char **text, size_t *len, mx_diag *diag);

/* The id of a token given by its text (an added token's content or a vocabulary entry as
 * tokenizer.json spells it), or -1. */
int64_t mxi_tokenizer_token_id(const mxi_tokenizer *tok, const char *token);

int64_t mxi_tokenizer_vocab_size(const mxi_tokenizer *tok); /* largest id + 1 */
int64_t mxi_tokenizer_eos(const mxi_tokenizer *tok);        /* tokenizer_config.json's eos_token, or -1 */
int64_t mxi_tokenizer_bos(const mxi_tokenizer *tok);        /* its bos_token, or -1 */
/* The tokenizer.json read (the file itself when load was given a directory). */
const char *mxi_tokenizer_path(const mxi_tokenizer *tok);

void mxi_tokenizer_ids_free(mxi_tok_ids *ids);
void mxi_tokenizer_free(mxi_tokenizer *tok);

#endif
