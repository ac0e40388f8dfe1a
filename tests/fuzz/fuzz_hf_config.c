/* Fuzz target: the Hugging Face config.json reader (jansson), reached as a user does:
 * a YAML config whose model.model_name_or_path names the file, with every required key
 * but the model's, which come from config.json. */
#include "fuzz.h"

#include "mxtrain/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *json = fuzz_file(0, data, size);
    char yaml[512];
    snprintf(yaml, sizeof yaml,
             "model:\n  model_name_or_path: %s\n"
             "data:\n  data_path: data/train_*.bin\n  seq_length: 16\n"
             "training:\n  micro_batch_size: 1\n  lr: 1.0e-3\n  train_iters: 1\n",
             json);
    mx_config cfg;
    mx_diag diag = {{0}};
    int rc = mx_config_load_string(yaml, "fuzz.yaml", &cfg, &diag);
    fuzz_check_status(rc, &diag);
    if (rc == 0) {
        char buf[4096];
        for (int i = 0; i < mx_config_key_count(); i++) {
            const char *key = mx_config_key_name(i);
            FUZZ_REQUIRE(mx_config_format_value(&cfg, key, buf, sizeof buf) >= 0);
            FUZZ_REQUIRE(mx_config_format_origin(&cfg, key, buf, sizeof buf) >= 0);
        }
        mx_config_free(&cfg);
    }
    return 0;
}
