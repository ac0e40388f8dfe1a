/* Fuzz target: the YAML training-config loader (mx_config_load, libyaml), from a file (an
 * in-memory one, so NUL bytes and the file reading are covered too). A config that loads
 * answers every key's value and origin query. */
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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_file(0, data, size);
    mx_config cfg;
    mx_diag diag = {{0}};
    int rc = mx_config_load(path, &cfg, &diag);
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
    return 0;
}
