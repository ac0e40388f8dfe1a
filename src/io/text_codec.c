/* Text to token ids and back (see text_codec.h). */
#include "io/text_codec.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include <stdlib.h>

#include "core/diag.h"
#include "io/tokenizer.h"
#include "mxtrain/tokens.h"

/* config.json's eos_token_id (an id, or a list whose first id counts), or -1. */
static int config_eos(const char *dir) {
    char path[4096];
    struct stat st;
    if (snprintf(path, sizeof path, "%s/config.json", dir) >= (int)sizeof path || stat(path, &st) != 0) return -1;
    json_t *root = json_load_file(path, 0, NULL);
    json_t *e = json_object_get(root, "eos_token_id");
    if (json_is_array(e)) e = json_array_get(e, 0);
    int eos = json_is_integer(e) && json_integer_value(e) >= 0 && json_integer_value(e) < (1 << 30)
                  ? (int)json_integer_value(e) : -1;
    json_decref(root);
    return eos;
}

/* Every token's text, decoded once (special tokens skipped), so that decoding a token in the
 * generation loop is a copy. */
static int bpe_table(mxi_text_codec *c, mx_diag *diag) {
    int64_t n = mxi_tokenizer_vocab_size(c->tok), size = 0, cap = 1 << 16;
    c->at = calloc((size_t)c->vocab + 1, sizeof *c->at);
    c->text = malloc((size_t)cap);
    if (!c->at || !c->text) return mxi_diag(diag, MX_ENOMEM, "out of memory for the tokens' text (%zu bytes)", (size_t)cap);
    for (int64_t i = 0; i < c->vocab; i++) {
        c->at[i] = size;
        if (i >= n) continue;
        uint32_t id = (uint32_t)i;
        char *t = NULL;
        size_t len = 0;
        int rc = mxi_tokenizer_decode(c->tok, &id, 1, MXI_TOK_DECODE_SKIP_SPECIAL, &t, &len, diag);
        if (rc == MX_EINVAL) continue;   // an id the tokenizer leaves out: no text
        if (rc) return rc;
        if (size + (int64_t)len > cap) {
            while (size + (int64_t)len > cap) cap *= 2;
            char *grown = realloc(c->text, (size_t)cap);
            if (!grown) {
                free(t);
                return mxi_diag(diag, MX_ENOMEM, "out of memory for the tokens' text (%zu bytes)", (size_t)cap);
            }
            c->text = grown;
        }
        memcpy(c->text + size, t, len);
        size += (int64_t)len;
        free(t);
    }
    c->at[c->vocab] = size;
    return MX_OK;
}

static int open_bpe(mxi_text_codec *c, const char *dir, int vocab_size, mx_diag *diag) {
    *c = (mxi_text_codec){.kind = MXI_CODEC_BPE, .vocab = vocab_size};
    int rc = mxi_tokenizer_load(dir, &c->tok, diag);
    if (!rc && mxi_tokenizer_vocab_size(c->tok) > vocab_size)
        rc = mxi_diag(diag, MX_ECONFIG, "%s: the tokenizer has %lld tokens, more than the model's vocab_size %d "
                      "(allowed: at most %d)", dir, (long long)mxi_tokenizer_vocab_size(c->tok), vocab_size, vocab_size);
    if (!rc) rc = bpe_table(c, diag);
    if (rc) {
        mxi_text_codec_close(c);
        return rc;
    }
    int eos = config_eos(dir);
    if (eos < 0 || eos >= vocab_size) eos = (int)mxi_tokenizer_eos(c->tok);
    c->eos = eos >= 0 && eos < vocab_size ? eos : -1;
    return MX_OK;
}

void mxi_text_codec_close(mxi_text_codec *c) {
    mxi_tokenizer_free(c->tok);
    free(c->text), free(c->at);
    c->tok = NULL, c->text = NULL, c->at = NULL;
}

int mxi_text_codec_open(mxi_text_codec *c, const char *dir, int vocab_size, mx_diag *diag) {
    char path[4096];
    struct stat st;
    if (dir && snprintf(path, sizeof path, "%s/tokenizer.json", dir) < (int)sizeof path && stat(path, &st) == 0)
        return open_bpe(c, dir, vocab_size, diag);
    if (vocab_size != MX_PREPARE_EOT + 1)
        return mxi_diag(diag, MX_EUNSUPPORTED, "vocab_size %d is not the byte-level vocabulary of `mxtrain prepare` "
                        "(allowed: %d; text for other vocabularies needs their tokenizer)", vocab_size,
                        MX_PREPARE_EOT + 1);
    int eos = dir ? config_eos(dir) : -1;
    *c = (mxi_text_codec){.kind = MXI_CODEC_BYTES, .vocab = vocab_size,
                          .eos = eos >= 0 && eos < vocab_size ? eos : MX_PREPARE_EOT};
    return MX_OK;
}

int mxi_text_encode(const mxi_text_codec *c, const char *text, size_t len, int32_t *out, int max, int *n,
                    mx_diag *diag) {
    if (c->kind == MXI_CODEC_BPE) {
        mxi_tok_ids ids = {0};
        int rc = mxi_tokenizer_encode(c->tok, text, len, MXI_TOK_ENCODE_ADD_SPECIAL, &ids, diag);
        int64_t lead = c->eos >= 0;
        if (!rc && ids.n + lead > max)
            rc = mxi_diag(diag, MX_ESIZE, "a prompt of %lld tokens (allowed: at most %d)", (long long)(ids.n + lead), max);
        if (!rc) {
            if (lead) out[0] = c->eos;
            for (int64_t i = 0; i < ids.n; i++) out[lead + i] = (int32_t)ids.ids[i];
            *n = (int)(ids.n + lead);
        }
        mxi_tokenizer_ids_free(&ids);
        return rc;
    }
    if (len + 1 > (size_t)max)
        return mxi_diag(diag, MX_ESIZE, "a prompt of %zu tokens (allowed: at most %d)", len + 1, max);
    out[0] = MX_PREPARE_EOT;
    for (size_t i = 0; i < len; i++) out[i + 1] = (unsigned char)text[i];
    *n = (int)len + 1;
    return MX_OK;
}

size_t mxi_text_decode(const mxi_text_codec *c, int32_t token, char *buf, size_t size) {
    if (c->kind == MXI_CODEC_BPE) {
        if (token < 0 || token >= c->vocab) return 0;
        size_t n = (size_t)(c->at[token + 1] - c->at[token]);
        n = n < size ? n : size;
        memcpy(buf, c->text + c->at[token], n);
        return n;
    }
    if (token < 0 || token >= MX_PREPARE_EOT || size < 1) return 0;
    buf[0] = (char)token;
    return 1;
}
