/* Fuzz target: the quantization-plan loader (mx_plan_load_file, libyaml). A plan that loads
 * selects over a small model's modules and explains every decision in one line. */
#include "fuzz.h"

#include "mxtrain/plan.h"

static const mx_module modules[] = {
    {"model.embed_tokens", MX_MODULE_OTHER},
    {"model.layers.0.self_attn.q_proj", MX_MODULE_LINEAR},
    {"model.layers.0.mlp.down_proj", MX_MODULE_LINEAR},
    {"model.layers.1.mlp.gate", MX_MODULE_LINEAR},
    {"model.layers.1.mlp.experts", MX_MODULE_EXPERTS},
    {"model.layers.12.input_layernorm", MX_MODULE_OTHER},
    {"lm_head", MX_MODULE_LINEAR},
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_file(0, data, size);
    mx_plan plan;
    mx_diag diag = {{0}};
    int rc = mx_plan_load_file(path, &plan, &diag);
    fuzz_check_status(rc, &diag);
    if (rc == 0) {
        int n = (int)(sizeof modules / sizeof modules[0]);
        mx_selection sel;
        FUZZ_REQUIRE(mx_plan_select(&plan, modules, n, &sel) == 0);
        FUZZ_REQUIRE(sel.n_modules == n);
        for (int i = 0; i < n; i++) {
            char buf[1024];
            FUZZ_REQUIRE(mx_decision_explain(&plan, &modules[i], &sel.decisions[i], buf, sizeof buf) > 0);
            FUZZ_REQUIRE(strchr(buf, '\n') == NULL);
            FUZZ_REQUIRE(!sel.decisions[i].converted || plan.enabled);
        }
        for (int i = 0; i < sel.n_warnings; i++) FUZZ_REQUIRE(strchr(sel.warnings[i], '\n') == NULL);
        mx_selection_free(&sel);
        mx_plan_free(&plan);
    }
    return 0;
}
