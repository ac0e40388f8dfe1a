/* Fuzz target: the Hugging Face tokenizer.json reader (jansson, PCRE2), reached as prepare
 * reaches it (a path), then an encode of a short text with added tokens, combining marks,
 * whitespace runs and bytes that are not UTF-8, and a decode of the ids in both modes. */
#include "fuzz.h"

#include "io/tokenizer.h"

static const char text[] = "Hello, world's <|endoftext|> e\xCC\x81t\xC3\xA9   \t\n\n 12345 \xF0\x9F\x91\xA8\xE2\x80\x8D"
                           "\xF0\x9F\x91\xA9 \xE4\xBD\xA0\xE5\xA5\xBD \xFF\xC0 <|im_start|>ab c";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_file(0, data, size);
    mxi_tokenizer *tok = NULL;
    mx_diag diag = {{0}};
    int rc = mxi_tokenizer_load(path, &tok, &diag);
    fuzz_check_status(rc, &diag);
    if (rc) return 0;
    FUZZ_REQUIRE(mxi_tokenizer_vocab_size(tok) >= 1 && mxi_tokenizer_vocab_size(tok) <= MXI_TOKENIZER_MAX_VOCAB);
    for (int mode = MXI_TOK_ENCODE_PLAIN; mode <= MXI_TOK_ENCODE_ADD_SPECIAL; mode++) {
        mxi_tok_ids ids = {0};
        rc = mxi_tokenizer_encode(tok, text, sizeof text - 1, (mxi_tok_encode_mode)mode, &ids, &diag);
        fuzz_check_status(rc, &diag);
        for (int64_t i = 0; rc == 0 && i < ids.n; i++) FUZZ_REQUIRE(ids.ids[i] < mxi_tokenizer_vocab_size(tok));
        for (int dm = MXI_TOK_DECODE_KEEP_SPECIAL; rc == 0 && dm <= MXI_TOK_DECODE_SKIP_SPECIAL; dm++) {
            char *s = NULL;
            size_t n = 0;
            /* the template's ids need not be in the vocabulary, so decode may refuse them */
            int drc = mxi_tokenizer_decode(tok, ids.ids, ids.n, (mxi_tok_decode_mode)dm, &s, &n, &diag);
            fuzz_check_status(drc, &diag);
            FUZZ_REQUIRE(drc != 0 || (s && strlen(s) <= n));
            free(s);
        }
        mxi_tokenizer_ids_free(&ids);
    }
    mxi_tokenizer_free(tok);
    return 0;
}
