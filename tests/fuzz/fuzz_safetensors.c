/* Fuzz target: the safetensors reader (mx_st_open validates the header against the file).
 * A file that opens has tensors inside its data section, found by name, whose raw bytes and
 * (for floating dtypes) fp32 values read without error. */
#include "fuzz.h"

#include "mxtrain/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_file(0, data, size);
    mx_st_file *f = NULL;
    mx_diag diag = {{0}};
    int rc = mx_st_open(path, &f, &diag);
    fuzz_check_status(rc, &diag);
    FUZZ_REQUIRE((rc == 0) == (f != NULL));
    if (!f) return 0;
    int n = mx_st_count(f);
    for (int i = 0; i < n; i++) {
        const mx_st_tensor *t = mx_st_get(f, i);
        FUZZ_REQUIRE(t != NULL && mx_st_find(f, t->name) == t);
        FUZZ_REQUIRE(t->nbytes <= size && t->offset <= size - t->nbytes);
        FUZZ_REQUIRE(t->ndim >= 0 && t->ndim <= MX_ST_MAX_NDIM);
        void *raw = malloc(t->nbytes ? t->nbytes : 1);
        FUZZ_REQUIRE(raw != NULL);
        rc = mx_st_read_raw(f, t->name, raw, t->nbytes, &diag);
        fuzz_check_status(rc, &diag);
        FUZZ_REQUIRE(rc == 0);
        free(raw);
        /* Every element takes at least 4 bits, so numel is bounded by the bytes. */
        FUZZ_REQUIRE(t->numel >= 0 && (uint64_t)t->numel <= 2 * t->nbytes + 1);
        float *x = malloc((size_t)t->numel * sizeof *x + 1);
        FUZZ_REQUIRE(x != NULL);
        rc = mx_st_read_f32(f, t->name, t->shape, t->ndim, x, &diag);
        fuzz_check_status(rc, &diag);
        free(x);
    }
    for (int i = 0; i < mx_st_metadata_count(f); i++) {
        const char *k, *v;
        FUZZ_REQUIRE(mx_st_metadata_at(f, i, &k, &v) == 0);
        FUZZ_REQUIRE(mx_st_metadata(f, k) == v);
    }
    mx_st_close(f);
    return 0;
}
