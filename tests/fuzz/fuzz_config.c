/* Fuzz target: the YAML training-config loader (mx_config_load, libyaml), from a file (an
 * in-memory one, so NUL bytes and the file reading are covered too), with the command
 * line's settings (mx_config_load_with): after a line "%%", each line KEY=VALUE is one. A
 * config that loads answers every key's value and origin query. */
#include "fuzz.h"

#include "mxtrain/config.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    /* Relative paths a mutated config names (model_name_or_path) find nothing. */
    char dir[] = "/tmp/mxtrain-fuzz-XXXXXX";
    FUZZ_REQUIRE(mkdtemp(dir) != NULL && chdir(dir) == 0 && rmdir(dir) == 0);
    return 0;
}

enum { MAX_SETTINGS = 8 };

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *split = NULL;   // the "\n%%\n" that starts the settings
    for (size_t i = 0; !split && i + 4 <= size; i++)
        if (!memcmp(data + i, "\n%%\n", 4)) split = data + i;
    size_t file_size = split ? (size_t)(split - data) + 1 : size;
    const char *path = fuzz_file(0, data, file_size);
    // the settings: KEY=VALUE lines (NUL-terminated copies; a NUL inside ends the text there)
    mx_config_override settings[MAX_SETTINGS];
    char *text = NULL;
    int n = 0;
    if (split) {
        size_t len = size - file_size - 3;
        text = malloc(len + 1);
        FUZZ_REQUIRE(text != NULL);
        memcpy(text, split + 4, len);
        text[len] = '\0';
        for (char *line = text; line && n < MAX_SETTINGS;) {
            char *next = strchr(line, '\n');
            if (next) *next++ = '\0';
            char *eq = strchr(line, '=');
            if (eq) *eq = '\0';
            settings[n++] = (mx_config_override){line, eq ? eq + 1 : ""};
            line = next;
        }
    }
    mx_config cfg;
    mx_diag diag = {{0}};
    int rc = mx_config_load_with(path, settings, n, &cfg, &diag);
    fuzz_check_status(rc, &diag);
    if (rc == 0) {
        char buf[4096];
        for (int i = 0; i < mx_config_key_count(); i++) {
            const char *key = mx_config_key_name(i);
            FUZZ_REQUIRE(key != NULL);
            FUZZ_REQUIRE(mx_config_format_value(&cfg, key, buf, sizeof buf) >= 0);
            FUZZ_REQUIRE(mx_config_format_origin(&cfg, key, buf, sizeof buf) >= 0);
        }
        mx_config_free(&cfg);
    }
    free(text);
    return 0;
}
