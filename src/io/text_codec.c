/* Text to token ids and back (see text_codec.h). */
#include "io/text_codec.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "core/diag.h"
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

int mxi_text_codec_open(mxi_text_codec *c, const char *dir, int vocab_size, mx_diag *diag) {
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
    (void)c;
    if (len + 1 > (size_t)max)
        return mxi_diag(diag, MX_ESIZE, "a prompt of %zu tokens (allowed: at most %d)", len + 1, max);
    out[0] = MX_PREPARE_EOT;
    for (size_t i = 0; i < len; i++) out[i + 1] = (unsigned char)text[i];
    *n = (int)len + 1;
    return MX_OK;
}

size_t mxi_text_decode(const mxi_text_codec *c, int32_t token, char *buf, size_t size) {
    (void)c;
    if (token < 0 || token >= MX_PREPARE_EOT || size < 1) return 0;
    buf[0] = (char)token;
    return 1;
}
