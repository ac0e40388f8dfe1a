/* Fuzz target: the recipe parser (mx_recipe_parse). A recipe that parses (implemented or
 * not) formats to its long form, which parses back to the same recipe. */
#include "fuzz.h"

#include "mxtrain/plan.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = fuzz_cstr(data, size);
    mx_recipe r;
    mx_diag diag = {{0}};
    int rc = mx_recipe_parse(text, &r, &diag);
    fuzz_check_status(rc, &diag);
    FUZZ_REQUIRE(rc == 0 || rc == MX_EUNSUPPORTED || rc == MX_ERECIPE);
    if (rc == 0 || rc == MX_EUNSUPPORTED) {
        char buf[256];
        int n = mx_recipe_format(&r, buf, sizeof buf);
        FUZZ_REQUIRE(n > 0 && (size_t)n < sizeof buf);
        mx_recipe back;
        mx_diag diag2 = {{0}};
        FUZZ_REQUIRE(mx_recipe_parse(buf, &back, &diag2) == rc);
        FUZZ_REQUIRE(back.strategy == r.strategy && back.granularity == r.granularity &&
                     back.inputs == r.inputs && back.weight == r.weight && back.grads == r.grads);
        if (r.granularity == MX_GRANULARITY_MX || r.has_block)
            FUZZ_REQUIRE(back.block[0] == r.block[0] && back.block[1] == r.block[1] && back.block[2] == r.block[2]);
    }
    free(text);
    return 0;
}
