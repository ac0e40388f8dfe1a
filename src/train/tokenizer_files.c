/* Tokenizer files beside config.json in checkpoints and exports (tokenizer_files.h). */
#include "train/tokenizer_files.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/diag.h"
#include "core/file.h"
#include "io/tokenizer.h"
#include "train/checkpoint.h"

static const char *const companions[] = {"tokenizer_config.json", "special_tokens_map.json"};

/* The directory of src (a tokenizer.json, or a directory) into out. */
static void dir_of(const char *src, char *out, size_t size) {
    struct stat st;
    if (stat(src, &st) == 0 && S_ISDIR(st.st_mode)) {
        snprintf(out, size, "%s", src);
        return;
    }
    const char *slash = strrchr(src, '/');
    if (slash) snprintf(out, size, "%.*s", (int)(slash - src), src);
    else snprintf(out, size, ".");
}

static bool has_tokenizer(const char *src) {
    char dir[4096], path[4200];
    struct stat st;
    if (stat(src, &st) != 0) return false;
    if (S_ISREG(st.st_mode)) return true;
    dir_of(src, dir, sizeof dir);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

const char *mxi_tokenizer_source(const mx_config *cfg, const char **key) {
    if (cfg->data.tokenizer) {
        *key = "data.tokenizer";
        return cfg->data.tokenizer;
    }
    *key = "model.model_name_or_path";
    return cfg->model_name_or_path && has_tokenizer(cfg->model_name_or_path) &&
                   strcmp(cfg->model_name_or_path + strlen(cfg->model_name_or_path) - 5, ".json") != 0
               ? cfg->model_name_or_path
               : NULL;
}

int mxi_tokenizer_source_check(const mx_config *cfg, mx_diag *diag) {
    if (!cfg->data.tokenizer || has_tokenizer(cfg->data.tokenizer)) return 0;
    return mxi_diag(diag, MX_ECONFIG, "data.tokenizer: '%s' is not a tokenizer.json or a directory holding one "
                    "(allowed: a Hugging Face tokenizer.json, a directory with one, or null)", cfg->data.tokenizer);
}

static int copy_file(const char *from, const char *to, const char *key, mx_diag *diag) {
    return mxi_copy_file(from, to, "a tokenizer file", 1ull << 30, key, diag);
}

/* config.json's bos_token_id / eos_token_id from the tokenizer, added as text before its
 * closing brace, so that the rest of the file keeps mx_hf_config_dumps' number formatting. */
static int set_ids(const char *dir, const mxi_tokenizer *tok, mx_diag *diag) {
    int64_t bos = mxi_tokenizer_bos(tok), eos = mxi_tokenizer_eos(tok);
    if (bos < 0 && eos < 0) return 0;
    char path[4200], ids[96] = "";
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (bos >= 0) snprintf(ids, sizeof ids, ",\n  \"bos_token_id\": %lld", (long long)bos);
    if (eos >= 0) snprintf(ids + strlen(ids), sizeof ids - strlen(ids), ",\n  \"eos_token_id\": %lld", (long long)eos);
    char *text;
    size_t len;
    int rc = mxi_read_input(path, "the config.json just written", MXI_MAX_CONFIG_BYTES, &text, &len, diag);
    if (rc) return rc;
    size_t end = len;
    while (end > 0 && text[end - 1] != '}') end--;
    size_t at = end ? end - 1 : 0; /* the closing brace; the ids go after the last value */
    while (at > 0 && (text[at - 1] == '\n' || text[at - 1] == ' ')) at--;
    size_t n = strlen(ids);
    char *out = end ? malloc(len + n + 1) : NULL;
    if (!end) rc = mxi_diag(diag, MX_EFORMAT, "%s: no closing brace", path);
    else if (!out) rc = mxi_diag(diag, MX_ENOMEM, "out of memory (%zu bytes)", len + n + 1);
    if (rc == 0) {
        memcpy(out, text, at);
        memcpy(out + at, ids, n);
        memcpy(out + at + n, text + at, len - at);
        rc = mxi_write_file(path, out, len + n, diag);
    }
    free(out);
    free(text);
    return rc;
}

int mxi_tokenizer_files_copy(const char *dir, const char *src, const char *key, mx_diag *diag) {
    mxi_tokenizer *tok = NULL;
    int rc = mxi_tokenizer_load(src, &tok, diag);
    if (rc) {
        mx_diag inner = *diag;
        return mxi_diag(diag, rc, "%s: %s", key, inner.msg);
    }
    char from_dir[4096], from[4200], to[4200];
    dir_of(src, from_dir, sizeof from_dir);
    snprintf(to, sizeof to, "%s/tokenizer.json", dir);
    rc = copy_file(mxi_tokenizer_path(tok), to, key, diag);
    for (size_t i = 0; rc == 0 && i < sizeof companions / sizeof companions[0]; i++) {
        struct stat st;
        snprintf(from, sizeof from, "%s/%s", from_dir, companions[i]);
        snprintf(to, sizeof to, "%s/%s", dir, companions[i]);
        if (stat(from, &st) == 0) rc = copy_file(from, to, key, diag);
    }
    if (rc == 0) rc = set_ids(dir, tok, diag);
    mxi_tokenizer_free(tok);
    return rc;
}
