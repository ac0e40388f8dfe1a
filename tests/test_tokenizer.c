/* The Hugging Face tokenizer.json reader and byte-level BPE encoder/decoder on a tokenizer
 * small enough to encode by hand: the expected ids below are worked out from its merge
 * ranks (tests/tokenizer.sh holds real tokenizers to Hugging Face's own library). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "io/tokenizer.h"

/* Bytes a b c, ' ' (spelled Ġ), 0xC3 (Ã) and 0xA9 (©), the merges a+b, ab+c, Ġ+a, Ã+©
 * (é in UTF-8), and the added tokens <|eos|> (special) and <|bos|>. */
static const char base_json[] =
    "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"c\": 2, \"\\u0120\": 3, \"ab\": 4, \"abc\": 5,"
    " \"\\u0120a\": 6, \"\\u00c3\": 9, \"\\u00a9\": 10, \"\\u00c3\\u00a9\": 11, \"ca\": 12},"
    " \"merges\": [\"a b\", [\"ab\", \"c\"], \"\\u0120 a\", \"\\u00c3 \\u00a9\"]},"
    " \"added_tokens\": [{\"id\": 7, \"content\": \"<|eos|>\", \"special\": true, \"normalized\": false},"
    " {\"id\": 8, \"content\": \"<|bos|>\", \"special\": true, \"normalized\": false}],"
    " \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": true}}";

/* The tokenizer of base_json with `key` set to the JSON value `value` (NULL: as it is). */
static mxi_tokenizer *load(const char *key, const char *value, int want_rc, char *msg) {
    json_error_t err;
    json_t *root = json_loads(base_json, 0, &err);
    CHECK(root != NULL);
    if (key) json_object_set_new(root, key, json_loads(value, JSON_DECODE_ANY, &err));
    json_t *config = json_loads("{\"eos_token\": \"<|eos|>\", \"bos_token\": {\"content\": \"<|bos|>\"}}", 0, &err);
    mxi_tokenizer *t = NULL;
    mx_diag d = {{0}};
    int rc = mxi_tokenizer_from_json(root, config, "tiny.json", &t, &d);
    if (rc != want_rc) printf("    %s\n", d.msg);
    CHECK_EQ_INT(rc, want_rc);
    if (msg) strcpy(msg, d.msg);
    json_decref(root);
    json_decref(config);
    return t;
}

/* encode text and compare with the n ids of want */
static void check_encode(const mxi_tokenizer *t, const char *text, mxi_tok_encode_mode mode, const uint32_t *want,
                         int n) {
    mxi_tok_ids ids = {0};
    mx_diag d = {{0}};
    CHECK_EQ_INT(mxi_tokenizer_encode(t, text, strlen(text), mode, &ids, &d), 0);
    CHECK_EQ_INT(ids.n, n);
    for (int i = 0; i < n && i < ids.n; i++) CHECK_EQ_INT(ids.ids[i], want[i]);
    mxi_tokenizer_ids_free(&ids);
}

static void test_merges_by_rank(void) {
    mxi_tokenizer *t = load(NULL, NULL, 0, NULL);
    /* "abc": a b c -> ab c (rank 0) -> abc (rank 1). " abc": Ġ a b c has Ġ+a (rank 2) and
     * a+b (rank 0): a+b first, then ab+c; Ġ and abc do not merge. */
    check_encode(t, "abc abc", MXI_TOK_ENCODE_PLAIN, (const uint32_t[]){5, 3, 5}, 3);
    /* " a": Ġ+a. "ca" has no merge (12 is reached only with ignore_merges). */
    check_encode(t, "ca a", MXI_TOK_ENCODE_PLAIN, (const uint32_t[]){2, 0, 6}, 3);
    /* a byte without a vocabulary entry (z) is dropped, as tokenizers does without unk */
    check_encode(t, "azb", MXI_TOK_ENCODE_PLAIN, (const uint32_t[]){0, 1}, 2);
    check_encode(t, "", MXI_TOK_ENCODE_PLAIN, NULL, 0);
    CHECK_EQ_INT(mxi_tokenizer_vocab_size(t), 13);
    CHECK_EQ_INT(mxi_tokenizer_eos(t), 7);
    CHECK_EQ_INT(mxi_tokenizer_bos(t), 8);
    CHECK_EQ_INT(mxi_tokenizer_token_id(t, "\xC4\xA0" "a"), 6); /* as tokenizer.json spells it */
    CHECK_EQ_INT(mxi_tokenizer_token_id(t, "<|eos|>"), 7);
    CHECK_EQ_INT(mxi_tokenizer_token_id(t, "zz"), -1);
    mxi_tokenizer_free(t);
    t = load("model", "{\"type\": \"BPE\", \"ignore_merges\": true, \"vocab\": {\"a\": 0, \"c\": 2, \"ca\": 12},"
             " \"merges\": []}", 0, NULL);
    check_encode(t, "ca", MXI_TOK_ENCODE_PLAIN, (const uint32_t[]){12}, 1);
    mxi_tokenizer_free(t);
}

static void test_added_tokens(void) {
    mxi_tokenizer *t = load(NULL, NULL, 0, NULL);
    /* split out before the pre-tokenizer: "ab" | <|eos|> | "ca" */
    check_encode(t, "ab<|eos|>ca", MXI_TOK_ENCODE_PLAIN, (const uint32_t[]){4, 7, 2, 0}, 4);
    check_encode(t, "<|eos|><|bos|><|eos", MXI_TOK_ENCODE_PLAIN, (const uint32_t[]){7, 8}, 2); /* "<|eos": no id */
    mxi_tokenizer_free(t);
    /* lstrip and rstrip take the spaces beside the token along */
    t = load("added_tokens", "[{\"id\": 7, \"content\": \"<|eos|>\", \"special\": true, \"lstrip\": true,"
             " \"rstrip\": true}, {\"id\": 8, \"content\": \"<|bos|>\"}]", 0, NULL);
    check_encode(t, "a  <|eos|>  a", MXI_TOK_ENCODE_PLAIN, (const uint32_t[]){0, 7, 0}, 3);
    mxi_tokenizer_free(t);
}

static void test_normalizer_and_template(void) {
    mxi_tokenizer *t = load("normalizer", "{\"type\": \"NFC\"}", 0, NULL);
    /* e + U+0301 (combining acute) -> é (C3 A9) -> Ã+© = 11; without NFC no id for 'e' */
    check_encode(t, "e\xCC\x81", MXI_TOK_ENCODE_PLAIN, (const uint32_t[]){11}, 1);
    mxi_tokenizer_free(t);
    t = load("post_processor", "{\"type\": \"Sequence\", \"processors\": [{\"type\": \"ByteLevel\"},"
             " {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<|bos|>\"}},"
             " {\"Sequence\": {\"id\": \"A\"}}, {\"SpecialToken\": {\"id\": \"<|eos|>\"}}], \"special_tokens\":"
             " {\"<|bos|>\": {\"ids\": [8]}, \"<|eos|>\": {\"ids\": [7]}}}]}", 0, NULL);
    check_encode(t, "ab", MXI_TOK_ENCODE_ADD_SPECIAL, (const uint32_t[]){8, 4, 7}, 3);
    check_encode(t, "ab", MXI_TOK_ENCODE_PLAIN, (const uint32_t[]){4}, 1);
    mxi_tokenizer_free(t);
    /* invalid UTF-8 is read as U+FFFD, which has no id here: dropped, the rest encoded */
    t = load(NULL, NULL, 0, NULL);
    check_encode(t, "ab\xFF" "c", MXI_TOK_ENCODE_PLAIN, (const uint32_t[]){4, 2}, 2);
    mxi_tokenizer_free(t);
}

static void test_decode(void) {
    mxi_tokenizer *t = load(NULL, NULL, 0, NULL);
    char *s;
    size_t n;
    mx_diag d = {{0}};
    const uint32_t ids[] = {8, 5, 3, 5, 7, 11};
    CHECK_EQ_INT(mxi_tokenizer_decode(t, ids, 6, MXI_TOK_DECODE_KEEP_SPECIAL, &s, &n, &d), 0);
    CHECK_STR_EQ(s, "<|bos|>abc abc<|eos|>\xC3\xA9");
    CHECK_EQ_INT(n, strlen("<|bos|>abc abc<|eos|>\xC3\xA9"));
    free(s);
    CHECK_EQ_INT(mxi_tokenizer_decode(t, ids, 6, MXI_TOK_DECODE_SKIP_SPECIAL, &s, &n, &d), 0);
    CHECK_STR_EQ(s, "abc abc\xC3\xA9");
    free(s);
    const uint32_t bad[] = {4, 13};
    CHECK_EQ_INT(mxi_tokenizer_decode(t, bad, 2, MXI_TOK_DECODE_KEEP_SPECIAL, &s, &n, &d), MX_EINVAL);
    CHECK_STR_EQ(d.msg, "tiny.json: token id 13 is not in the vocabulary (allowed: the ids of tokenizer.json, 0 to 12)");
    mxi_tokenizer_free(t);
}

static void test_refused(void) {
    char msg[1024];
    static const struct { const char *key, *value; int rc; const char *msg; } cases[] = {
        {"model", "{\"type\": \"WordPiece\", \"vocab\": {}}", MX_EUNSUPPORTED,
         "tiny.json: model type 'WordPiece' is not implemented (allowed: BPE)"},
        {"normalizer", "{\"type\": \"Lowercase\"}", MX_EUNSUPPORTED,
         "tiny.json: normalizer type 'Lowercase' is not implemented (allowed: NFC, NFD, NFKC, NFKD, a Sequence of one "
         "of them, or null)"},
        {"pre_tokenizer", "{\"type\": \"Metaspace\"}", MX_EUNSUPPORTED,
         "tiny.json: pre_tokenizer type 'Metaspace' is not implemented (allowed: ByteLevel, Split, Sequence)"},
        {"pre_tokenizer", "null", MX_EUNSUPPORTED,
         "tiny.json: pre_tokenizer has no ByteLevel step: only byte-level BPE is implemented (allowed: ByteLevel, "
         "alone or in a Sequence)"},
        {"pre_tokenizer", "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"(a\"}, \"behavior\": \"Isolated\"}",
         MX_EFORMAT, "tiny.json: pre_tokenizer Split pattern '(a': missing closing parenthesis at offset 2 (allowed: "
         "a regex PCRE2 reads)"},
        {"post_processor", "{\"type\": \"RobertaProcessing\"}", MX_EUNSUPPORTED,
         "tiny.json: post_processor type 'RobertaProcessing' is not implemented (allowed: ByteLevel, "
         "TemplateProcessing, Sequence, or null)"},
        {"added_tokens", "[{\"id\": 9999999, \"content\": \"x\"}]", MX_EFORMAT,
         "tiny.json: added_tokens id of 'x': id out of range (allowed: an integer from 0 to 4194303)"},
        {"model", "{\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a b\"]}", MX_EFORMAT,
         "tiny.json: model.merges[0]: its second token is not in model.vocab (allowed: merges of vocabulary tokens "
         "into a vocabulary token)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        mxi_tokenizer *t = load(cases[i].key, cases[i].value, cases[i].rc, msg);
        CHECK(t == NULL);
        CHECK_STR_EQ(msg, cases[i].msg);
    }
}

int main(int argc, char **argv) {
    static const mxt_test tests[] = {
        {"merges_by_rank", test_merges_by_rank},
        {"added_tokens", test_added_tokens},
        {"normalizer_and_template", test_normalizer_and_template},
        {"decode", test_decode},
        {"refused", test_refused},
    };
    return MXT_RUN(tests, argc, argv);
}
