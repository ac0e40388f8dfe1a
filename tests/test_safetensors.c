/* safetensors reader and writer (SPEC §8). Expected values come from hand-computed
 * constants, an independent bf16 rounding written here with frexp/nearbyint, and files
 * built byte by byte in the test. tests/safetensors_torch.sh runs this binary with
 * MXT_ORACLE_DIR set to exchange files with a Python reader/writer (struct + json + numpy +
 * torch). */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "mxtrain/safetensors.h"

/* ---- helpers ------------------------------------------------------------------------ */

/* A file with the given header text (no padding) and data bytes. */
static const char *make_file(const char *name, const char *header, const void *data, size_t data_len) {
    const char *path = mxt_tmp_path(name);
    size_t hl = strlen(header);
    unsigned char *buf = malloc(8 + hl + data_len + 1);
    uint64_t n = hl;
    memcpy(buf, &n, 8);
    memcpy(buf + 8, header, hl);
    if (data_len) memcpy(buf + 8 + hl, data, data_len);
    mxt_write_bytes(path, buf, 8 + hl + data_len);
    free(buf);
    return path;
}

/* Open must fail with code and a message containing each of the NULL-terminated needles. */
#define EXPECT_OPEN_FAIL(path, code, ...) do { \
    mx_st_file *f_ = (mx_st_file *)1; mx_diag d_ = {{0}}; \
    int rc_ = mx_st_open(path, &f_, &d_); \
    CHECK_EQ_INT(rc_, code); CHECK(f_ == NULL); \
    const char *needles_[] = {__VA_ARGS__, NULL}; \
    for (int k_ = 0; needles_[k_]; k_++) CHECK_STR_CONTAINS(d_.msg, needles_[k_]); \
    CHECK(strchr(d_.msg, '\n') == NULL); \
    if (rc_ == 0) mx_st_close(f_); \
} while (0)

/* Independent fp32 -> bf16 (round to nearest even) for finite normal values: keep 8
 * significant bits of the mantissa with nearbyint (the default rounding mode is ties to
 * even). */
static float bf16_oracle(float x) {
    int e;
    double m = frexp((double)x, &e); /* x = m * 2^e, 0.5 <= |m| < 1 */
    return (float)ldexp(nearbyint(ldexp(m, 8)), e - 8);
}

/* Values of an exact fp32 pattern: 24-bit integers scaled by 2^-20. */
static float pattern(int64_t i) {
    int64_t k = (int64_t)(((uint64_t)i * 2654435761u) % (1u << 24)) - (1 << 23);
    return (float)ldexp((double)k, -20);
}

/* ---- round trips -------------------------------------------------------------------- */

static void test_roundtrip_odd_shapes(void) {
    float scalar = 3.25f;
    float vec[7], mat[15], cube[24];
    for (int i = 0; i < 7; i++) vec[i] = pattern(i);
    for (int i = 0; i < 15; i++) mat[i] = pattern(100 + i);
    for (int i = 0; i < 24; i++) cube[i] = pattern(1000 + i);
    int64_t s_vec[] = {7}, s_mat[] = {5, 3}, s_zero[] = {3, 0, 2}, s_cube[] = {2, 3, 4}, s_one[] = {1, 1, 1};
    mx_st_writer *w;
    mx_diag d = {{0}};
    CHECK_EQ_INT(mx_st_writer_new(&w), 0);
    /* added out of name order: the file must hold them sorted */
    CHECK_EQ_INT(mx_st_writer_add_f32(w, "z.vec", MX_ST_F32, s_vec, 1, vec, &d), 0);
    CHECK_EQ_INT(mx_st_writer_add_f32(w, "a.scalar", MX_ST_F32, NULL, 0, &scalar, &d), 0);
    CHECK_EQ_INT(mx_st_writer_add_f32(w, "m.bf16", MX_ST_BF16, s_mat, 2, mat, &d), 0);
    CHECK_EQ_INT(mx_st_writer_add_f32(w, "e.zero", MX_ST_BF16, s_zero, 3, NULL, &d), 0);
    CHECK_EQ_INT(mx_st_writer_add_f32(w, "c.cube", MX_ST_F32, s_cube, 3, cube, &d), 0);
    CHECK_EQ_INT(mx_st_writer_add_f32(w, "o.one", MX_ST_BF16, s_one, 3, &scalar, &d), 0);
    CHECK_EQ_INT(mx_st_writer_set_metadata(w, "format", "pt", &d), 0);
    CHECK_EQ_INT(mx_st_writer_set_metadata(w, "note", "first", &d), 0);
    CHECK_EQ_INT(mx_st_writer_set_metadata(w, "note", "ünïcode ok", &d), 0);
    const char *path = mxt_tmp_path("rt.safetensors");
    int rc = mx_st_write(w, path, &d);
    CHECK_EQ_INT(rc, 0);
    if (rc) printf("    %s\n", d.msg);
    mx_st_writer_free(w);

    /* Layout, read back independently: header length, 8-byte alignment, space padding. */
    FILE *fp = fopen(path, "rb");
    CHECK(fp != NULL);
    uint64_t n = 0;
    CHECK_EQ_INT(fread(&n, 8, 1, fp), 1);
    CHECK_EQ_INT((8 + n) % 8, 0);
    char *hdr = calloc(n + 1, 1);
    CHECK_EQ_INT(fread(hdr, 1, n, fp), n);
    fclose(fp);
    CHECK(hdr[0] == '{');
    size_t end = strlen(hdr);
    while (end > 0 && hdr[end - 1] == ' ') end--;
    CHECK(hdr[end - 1] == '}');
    CHECK(n - end < 8);
    CHECK_STR_CONTAINS(hdr, "\"__metadata__\":{\"format\":\"pt\",\"note\":\"ünïcode ok\"}");
    CHECK_STR_CONTAINS(hdr, "\"a.scalar\":{\"data_offsets\":[0,4],\"dtype\":\"F32\",\"shape\":[]}");
    CHECK_STR_CONTAINS(hdr, "\"e.zero\":{\"data_offsets\":[100,100],\"dtype\":\"BF16\",\"shape\":[3,0,2]}");
    free(hdr);

    mx_st_file *f;
    rc = mx_st_open(path, &f, &d);
    CHECK_EQ_INT(rc, 0);
    if (rc) {
        printf("    %s\n", d.msg);
        return;
    }
    CHECK_EQ_INT(mx_st_count(f), 6);
    const char *names[] = {"a.scalar", "c.cube", "e.zero", "m.bf16", "o.one", "z.vec"};
    uint64_t offsets[] = {0, 4, 100, 100, 130, 132};
    for (int i = 0; i < 6; i++) {
        const mx_st_tensor *t = mx_st_get(f, i);
        CHECK_STR_EQ(t->name, names[i]);
        CHECK_EQ_INT(t->offset, offsets[i]);
    }
    CHECK(mx_st_get(f, 6) == NULL && mx_st_get(f, -1) == NULL);
    const mx_st_tensor *t = mx_st_find(f, "e.zero");
    CHECK(t && t->dtype == MX_ST_BF16 && t->ndim == 3 && t->shape[1] == 0 && t->numel == 0 && t->nbytes == 0);
    t = mx_st_find(f, "a.scalar");
    CHECK(t && t->ndim == 0 && t->numel == 1 && t->nbytes == 4);
    CHECK(mx_st_find(f, "nope") == NULL);

    float got[32];
    CHECK_EQ_INT(mx_st_read_f32(f, "a.scalar", NULL, 0, got, &d), 0);
    CHECK_EQ_DBL(got[0], 3.25);
    CHECK_EQ_INT(mx_st_read_f32(f, "z.vec", s_vec, 1, got, &d), 0);
    CHECK_MEM_EQ(got, vec, sizeof vec);
    CHECK_EQ_INT(mx_st_read_f32(f, "c.cube", s_cube, 3, got, &d), 0);
    CHECK_MEM_EQ(got, cube, sizeof cube);
    CHECK_EQ_INT(mx_st_read_f32(f, "m.bf16", s_mat, 2, got, &d), 0);
    for (int i = 0; i < 15; i++) CHECK_EQ_DBL(got[i], bf16_oracle(mat[i]));
    CHECK_EQ_INT(mx_st_read_f32(f, "e.zero", s_zero, 3, NULL, &d), 0);
    CHECK_EQ_INT(mx_st_read_f32(f, "o.one", s_one, 3, got, &d), 0);
    CHECK_EQ_DBL(got[0], 3.25);

    CHECK_STR_EQ(mx_st_metadata(f, "format"), "pt");
    CHECK_STR_EQ(mx_st_metadata(f, "note"), "ünïcode ok");
    CHECK(mx_st_metadata(f, "absent") == NULL);
    CHECK_EQ_INT(mx_st_metadata_count(f), 2);
    const char *k, *v;
    CHECK_EQ_INT(mx_st_metadata_at(f, 1, &k, &v), 0);
    CHECK_STR_EQ(k, "note");
    CHECK_EQ_INT(mx_st_metadata_at(f, 2, &k, &v), MX_EINVAL);
    mx_st_close(f);
}

/* Reserved tensors: the file is laid out with holes, and their bytes written afterwards,
 * in pieces, at mx_st_writer_data_offsets (what each rank does with its rows of a
 * checkpoint). The offsets are checked against the reader's, the holes read as zeros. */
static void test_reserved_tensors(void) {
    float given[7], res[15];
    uint16_t res16[9];
    for (int i = 0; i < 7; i++) given[i] = pattern(i);
    for (int i = 0; i < 15; i++) res[i] = pattern(200 + i);
    for (int i = 0; i < 9; i++) res16[i] = mx_st_f32_to_bf16(pattern(300 + i));
    int64_t s_given[] = {7}, s_res[] = {5, 3}, s_res16[] = {9};
    mx_st_writer *w;
    mx_diag d = {{0}};
    CHECK_EQ_INT(mx_st_writer_new(&w), 0);
    CHECK_EQ_INT(mx_st_writer_reserve(w, "b.res", MX_ST_F32, s_res, 2, &d), 0);
    CHECK_EQ_INT(mx_st_writer_add_f32(w, "a.given", MX_ST_F32, s_given, 1, given, &d), 0);
    CHECK_EQ_INT(mx_st_writer_reserve(w, "z.res16", MX_ST_BF16, s_res16, 1, &d), 0);   // last: a hole at the end
    CHECK_EQ_INT(mx_st_writer_reserve(w, "a.given", MX_ST_F32, s_given, 1, &d), MX_EINVAL);   // a duplicate
    uint64_t off[3], again[3];
    CHECK_EQ_INT(mx_st_writer_data_offsets(w, off, &d), 0);
    CHECK_EQ_INT(mx_st_writer_data_offsets(w, again, &d), 0);
    CHECK_MEM_EQ(off, again, sizeof off);
    CHECK_EQ_INT(mx_st_writer_data_offsets(w, NULL, &d), MX_ENULL);
    const char *path = mxt_tmp_path("reserved.safetensors");
    CHECK_EQ_INT(mx_st_write(w, path, &d), 0);
    mx_st_writer_free(w);
    mx_st_file *f;
    int rc = mx_st_open(path, &f, &d);
    CHECK_EQ_INT(rc, 0);
    if (rc) return;
    uint64_t data_start = 0;
    FILE *fp = fopen(path, "rb");
    CHECK(fp && fread(&data_start, 8, 1, fp) == 1);
    if (fp) fclose(fp);
    data_start += 8;
    const char *names[] = {"b.res", "a.given", "z.res16"};   // in the order added
    for (int i = 0; i < 3; i++) CHECK_EQ_INT(off[i], data_start + mx_st_find(f, names[i])->offset);
    struct stat st;
    CHECK_EQ_INT(stat(path, &st), 0);
    CHECK_EQ_INT((uint64_t)st.st_size, data_start + 7 * 4 + 15 * 4 + 9 * 2);
    float got[15];
    CHECK_EQ_INT(mx_st_read_f32(f, "b.res", s_res, 2, got, &d), 0);
    for (int i = 0; i < 15; i++) CHECK_EQ_DBL(got[i], 0.0);
    CHECK_EQ_INT(mx_st_read_f32(f, "a.given", s_given, 1, got, &d), 0);
    CHECK_MEM_EQ(got, given, sizeof given);
    mx_st_close(f);
    // rows 2..4 first, then rows 0..1, as two ranks might; the bf16 tensor in one piece
    int fd = open(path, O_WRONLY);
    CHECK(fd >= 0);
    CHECK_EQ_INT(pwrite(fd, res + 6, 9 * 4, (off_t)(off[0] + 6 * 4)), 9 * 4);
    CHECK_EQ_INT(pwrite(fd, res, 6 * 4, (off_t)off[0]), 6 * 4);
    CHECK_EQ_INT(pwrite(fd, res16, sizeof res16, (off_t)off[2]), (int)sizeof res16);
    close(fd);
    CHECK_EQ_INT(mx_st_open(path, &f, &d), 0);
    CHECK_EQ_INT(mx_st_read_f32(f, "b.res", s_res, 2, got, &d), 0);
    CHECK_MEM_EQ(got, res, sizeof res);
    CHECK_EQ_INT(mx_st_read_f32(f, "z.res16", s_res16, 1, got, &d), 0);
    for (int i = 0; i < 9; i++) CHECK_EQ_DBL(got[i], bf16_oracle(pattern(300 + i)));
    CHECK_EQ_INT(mx_st_read_f32(f, "a.given", s_given, 1, got, &d), 0);
    CHECK_MEM_EQ(got, given, sizeof given);
    // parts, as a rank reads its rows: rows 2..4 of b.res, 5 bf16 elements from the 3rd
    memset(got, 0, sizeof got);
    CHECK_EQ_INT(mx_st_read_f32_part(f, "b.res", s_res, 2, 6, 9, got, &d), 0);
    CHECK_MEM_EQ(got, res + 6, 9 * sizeof(float));
    CHECK_EQ_INT(mx_st_read_f32_part(f, "z.res16", s_res16, 1, 2, 5, got, &d), 0);
    for (int i = 0; i < 5; i++) CHECK_EQ_DBL(got[i], bf16_oracle(pattern(302 + i)));
    CHECK_EQ_INT(mx_st_read_f32_part(f, "b.res", s_res, 2, 15, 0, NULL, &d), 0);   // nothing, at the end
    CHECK_EQ_INT(mx_st_read_f32_part(f, "b.res", s_res, 2, 10, 6, got, &d), MX_EINVAL);
    CHECK_STR_CONTAINS(d.msg, "elements [10, 10 + 6) are not within its 15");
    CHECK_EQ_INT(mx_st_read_f32_part(f, "b.res", s_given, 1, 0, 1, got, &d), MX_EINVAL);   // the shape is checked
    mx_st_close(f);
}

static void test_empty_file(void) {
    mx_st_writer *w;
    mx_diag d;
    CHECK_EQ_INT(mx_st_writer_new(&w), 0);
    const char *path = mxt_tmp_path("empty.safetensors");
    CHECK_EQ_INT(mx_st_write(w, path, &d), 0);
    mx_st_writer_free(w);
    mx_st_file *f;
    CHECK_EQ_INT(mx_st_open(path, &f, &d), 0);
    CHECK_EQ_INT(mx_st_count(f), 0);
    CHECK_EQ_INT(mx_st_metadata_count(f), 0);
    mx_st_close(f);
    /* The same by hand: "{}" and no data. */
    CHECK_EQ_INT(mx_st_open(make_file("empty2.safetensors", "{}", NULL, 0), &f, &d), 0);
    mx_st_close(f);
}

static void test_bf16_rounding_specials(void) {
    /* Hand-computed bf16 codes. */
    struct {
        uint32_t in;
        uint16_t out;
    } cases[] = {
        {0x3F800000u, 0x3F80}, /* 1.0 */
        {0x3F808000u, 0x3F80}, /* 1 + 2^-8: a tie, to even (down) */
        {0x3F818000u, 0x3F82}, /* 1 + 3*2^-8: a tie, to even (up) */
        {0x3F808001u, 0x3F81}, /* just above the tie: up */
        {0x7F7FFFFFu, 0x7F80}, /* FLT_MAX rounds to +inf */
        {0xFF800000u, 0xFF80}, /* -inf */
        {0x80000000u, 0x8000}, /* -0 */
        {0x00000001u, 0x0000}, /* smallest subnormal: to 0 */
        {0x00018000u, 0x0002}, /* subnormal tie to even */
        {0x7FC00000u, 0x7FC0}, /* quiet NaN */
        {0x7F800001u, 0x7FC0}, /* signalling NaN: quieted, not rounded to inf */
        {0xFFFFFFFFu, 0xFFFF}, /* negative NaN with payload stays NaN */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        float x;
        memcpy(&x, &cases[i].in, 4);
        CHECK_EQ_HEX(mx_st_f32_to_bf16(x), cases[i].out);
    }
    CHECK_EQ_DBL(mx_st_bf16_to_f32(0xC040), -3.0);
    CHECK_EQ_DBL(mx_st_f16_to_f32(0x3C00), 1.0);
    CHECK_EQ_DBL(mx_st_f16_to_f32(0xC000), -2.0);
    CHECK_EQ_DBL(mx_st_f16_to_f32(0x0001), ldexp(1, -24));
    CHECK_EQ_DBL(mx_st_f16_to_f32(0x03FF), ldexp(1023, -24));
    CHECK_EQ_DBL(mx_st_f16_to_f32(0x7BFF), 65504.0);
    CHECK_EQ_DBL(mx_st_f16_to_f32(0x3555), 0.333251953125);
    CHECK(isinf(mx_st_f16_to_f32(0xFC00)) && mx_st_f16_to_f32(0xFC00) < 0);
    CHECK(isnan(mx_st_f16_to_f32(0x7E00)));
    CHECK(signbit(mx_st_f16_to_f32(0x8000)) && mx_st_f16_to_f32(0x8000) == 0);
}

/* F16, F64 and the FP8 dtypes written raw, read as fp32; integer dtypes only raw. */
static void test_read_other_dtypes(void) {
    uint16_t f16[] = {0x3C00, 0xC000, 0x0001, 0x7BFF, 0x7C00, 0x8000};
    double f64[] = {1.5, -2.25, 1e300, 0.1, 1e-50};
    uint8_t e4m3[] = {0x38, 0x7E, 0x01, 0xB8, 0x7F};
    uint8_t e5m2[] = {0x3C, 0x7B, 0x01, 0x7C};
    uint8_t e8m0[] = {127, 0, 254, 0xFF};
    int64_t i64[] = {-1, 1ll << 40, 7};
    int64_t s6[] = {6}, s5[] = {5}, s4[] = {4}, s3[] = {3}, s22[] = {2, 2};
    mx_st_writer *w;
    mx_diag d = {{0}};
    mx_st_writer_new(&w);
    CHECK_EQ_INT(mx_st_writer_add_raw(w, "f16", MX_ST_F16, s6, 1, f16, &d), 0);
    CHECK_EQ_INT(mx_st_writer_add_raw(w, "f64", MX_ST_F64, s5, 1, f64, &d), 0);
    CHECK_EQ_INT(mx_st_writer_add_raw(w, "e4m3", MX_ST_F8_E4M3, s5, 1, e4m3, &d), 0);
    CHECK_EQ_INT(mx_st_writer_add_raw(w, "e5m2", MX_ST_F8_E5M2, s22, 2, e5m2, &d), 0);
    CHECK_EQ_INT(mx_st_writer_add_raw(w, "e8m0", MX_ST_F8_E8M0, s4, 1, e8m0, &d), 0);
    CHECK_EQ_INT(mx_st_writer_add_raw(w, "i64", MX_ST_I64, s3, 1, i64, &d), 0);
    const char *path = mxt_tmp_path("dtypes.safetensors");
    CHECK_EQ_INT(mx_st_write(w, path, &d), 0);
    mx_st_writer_free(w);
    mx_st_file *f;
    CHECK_EQ_INT(mx_st_open(path, &f, &d), 0);
    if (!f) return;
    float y[8];
    CHECK_EQ_INT(mx_st_read_f32(f, "f16", s6, 1, y, &d), 0);
    CHECK_EQ_DBL(y[0], 1.0);
    CHECK_EQ_DBL(y[1], -2.0);
    CHECK_EQ_DBL(y[2], ldexp(1, -24));
    CHECK_EQ_DBL(y[3], 65504.0);
    CHECK(isinf(y[4]));
    CHECK(y[5] == 0 && signbit(y[5]));
    CHECK_EQ_INT(mx_st_read_f32(f, "f64", s5, 1, y, &d), 0);
    CHECK_EQ_DBL(y[0], 1.5);
    CHECK_EQ_DBL(y[1], -2.25);
    CHECK(isinf(y[2]));
    CHECK_EQ_DBL(y[3], 0.1f);
    CHECK_EQ_DBL(y[4], 0.0);
    CHECK_EQ_INT(mx_st_read_f32(f, "e4m3", s5, 1, y, &d), 0);
    CHECK_EQ_DBL(y[0], 1.0);
    CHECK_EQ_DBL(y[1], 448.0);
    CHECK_EQ_DBL(y[2], ldexp(1, -9));
    CHECK_EQ_DBL(y[3], -1.0);
    CHECK(isnan(y[4]));
    CHECK_EQ_INT(mx_st_read_f32(f, "e5m2", s22, 2, y, &d), 0);
    CHECK_EQ_DBL(y[0], 1.0);
    CHECK_EQ_DBL(y[1], 57344.0);
    CHECK_EQ_DBL(y[2], ldexp(1, -16));
    CHECK(isinf(y[3]));
    CHECK_EQ_INT(mx_st_read_f32(f, "e8m0", s4, 1, y, &d), 0);
    CHECK_EQ_DBL(y[0], 1.0);
    CHECK_EQ_DBL(y[1], ldexp(1, -127));
    CHECK_EQ_DBL(y[2], ldexp(1, 127));
    CHECK(isnan(y[3]));
    /* I64 is recognised but not convertible; its bytes are readable raw. */
    CHECK_EQ_INT(mx_st_read_f32(f, "i64", s3, 1, y, &d), MX_EUNSUPPORTED);
    CHECK_STR_CONTAINS(d.msg, "tensor 'i64' has dtype I64, which cannot be read as fp32 (allowed: F64, F32, F16, BF16");
    int64_t back[3];
    CHECK_EQ_INT(mx_st_read_raw(f, "i64", back, sizeof back, &d), 0);
    CHECK_MEM_EQ(back, i64, sizeof i64);
    CHECK_EQ_INT(mx_st_read_raw(f, "i64", back, 16, &d), MX_ESIZE);
    CHECK_STR_CONTAINS(d.msg, "tensor 'i64' has 24 bytes, the buffer 16");
    mx_st_close(f);
}

/* A tensor large enough to cross the 64 KiB conversion chunks. */
static void test_large_bf16(void) {
    int64_t n = 100003;
    float *x = malloc((size_t)n * sizeof *x), *y = malloc((size_t)n * sizeof *y);
    for (int64_t i = 0; i < n; i++) x[i] = pattern(i * 7 + 3);
    int64_t shape[] = {n};
    mx_st_writer *w;
    mx_diag d;
    mx_st_writer_new(&w);
    CHECK_EQ_INT(mx_st_writer_add_f32(w, "big", MX_ST_BF16, shape, 1, x, &d), 0);
    CHECK_EQ_INT(mx_st_writer_add_f32(w, "big32", MX_ST_F32, shape, 1, x, &d), 0);
    const char *path = mxt_tmp_path("big.safetensors");
    CHECK_EQ_INT(mx_st_write(w, path, &d), 0);
    mx_st_writer_free(w);
    mx_st_file *f;
    CHECK_EQ_INT(mx_st_open(path, &f, &d), 0);
    if (f) {
        CHECK_EQ_INT(mx_st_read_f32(f, "big", shape, 1, y, &d), 0);
        for (int64_t i = 0; i < n && !mxt_current_failures(); i++) CHECK_EQ_DBL(y[i], bf16_oracle(x[i]));
        CHECK_EQ_INT(mx_st_read_f32(f, "big32", shape, 1, y, &d), 0);
        CHECK_MEM_EQ(y, x, (size_t)n * 4);
        mx_st_close(f);
    }
    free(x);
    free(y);
}

/* ---- reader errors ------------------------------------------------------------------ */

static const char *valid_file(void) {
    float v[6] = {1, 2, 3, 4, 5, 6};
    int64_t s[] = {2, 3};
    mx_st_writer *w;
    mx_diag d;
    mx_st_writer_new(&w);
    mx_st_writer_add_f32(w, "w", MX_ST_F32, s, 2, v, &d);
    const char *path = mxt_tmp_path("valid.safetensors");
    CHECK_EQ_INT(mx_st_write(w, path, &d), 0);
    mx_st_writer_free(w);
    return path;
}

static void test_missing_and_directory(void) {
    EXPECT_OPEN_FAIL(mxt_tmp_path("does-not-exist.safetensors"), MX_EIO, "does-not-exist.safetensors: cannot open",
                     "No such file or directory");
    EXPECT_OPEN_FAIL(mxt_tmpdir(), MX_EIO, ": is a directory (allowed: a safetensors file)");
}

static void test_truncated(void) {
    const char *good = valid_file();
    FILE *fp = fopen(good, "rb");
    unsigned char buf[4096];
    size_t size = fread(buf, 1, sizeof buf, fp);
    fclose(fp);
    uint64_t n;
    memcpy(&n, buf, 8);
    CHECK_EQ_INT(size, 8 + n + 24);
    const char *p = mxt_tmp_path("trunc.safetensors");
    mxt_write_bytes(p, buf, 0);
    EXPECT_OPEN_FAIL(p, MX_EFORMAT, "trunc.safetensors: file is 0 bytes, too short for a safetensors file");
    mxt_write_bytes(p, buf, 5); /* inside the header length */
    EXPECT_OPEN_FAIL(p, MX_EFORMAT, "file is 5 bytes, too short", "8-byte little-endian header length");
    mxt_write_bytes(p, buf, 8 + n / 2); /* inside the header */
    char want[128];
    snprintf(want, sizeof want, "header length is %llu bytes but only %llu bytes follow", (unsigned long long)n,
             (unsigned long long)(n / 2));
    EXPECT_OPEN_FAIL(p, MX_EFORMAT, want, "truncated");
    mxt_write_bytes(p, buf, 8 + n + 10); /* inside the data */
    EXPECT_OPEN_FAIL(p, MX_EFORMAT, "data_offsets run past the end of the file (tensor 'w': data_offsets [0, 24], but the data section holds 10 bytes");
    mxt_write_bytes(p, buf, 8 + n + 23);
    EXPECT_OPEN_FAIL(p, MX_EFORMAT, "holds 23 bytes");
    mxt_write_bytes(p, buf, 8 + n); /* no data at all */
    EXPECT_OPEN_FAIL(p, MX_EFORMAT, "holds 0 bytes");
    /* and one byte too many: a hole at the end */
    buf[size] = 0;
    mxt_write_bytes(p, buf, size + 1);
    EXPECT_OPEN_FAIL(p, MX_EFORMAT, "hole in the data section (bytes [24, 25) after the last tensor 'w'");
}

static void test_absurd_header_length(void) {
    unsigned char buf[16];
    memset(buf, 0xFF, sizeof buf);
    const char *p = mxt_tmp_path("absurd.safetensors");
    mxt_write_bytes(p, buf, sizeof buf);
    EXPECT_OPEN_FAIL(p, MX_EFORMAT, "header length 18446744073709551615 is absurd (allowed: at most 100000000 bytes");
    uint64_t n = 100000001;
    memcpy(buf, &n, 8);
    mxt_write_bytes(p, buf, sizeof buf);
    EXPECT_OPEN_FAIL(p, MX_EFORMAT, "header length 100000001 is absurd");
    n = 9; /* plausible but larger than the file */
    memcpy(buf, &n, 8);
    mxt_write_bytes(p, buf, sizeof buf);
    EXPECT_OPEN_FAIL(p, MX_EFORMAT, "header length is 9 bytes but only 8 bytes follow");
}

static void test_bad_json(void) {
    EXPECT_OPEN_FAIL(make_file("j1.safetensors", "garbage", NULL, 0), MX_EFORMAT, "j1.safetensors: header is not valid JSON",
                     "line 1, column", "of the 7-byte header");
    EXPECT_OPEN_FAIL(make_file("j2.safetensors", "{\n  \"w\": {\"dtype\": \"F32\",\n  \"shape\": [1,, 2]}}", NULL, 0),
                     MX_EFORMAT, "header is not valid JSON", "line 3, column");
    EXPECT_OPEN_FAIL(make_file("j3.safetensors", "{\"w\": {", NULL, 0), MX_EFORMAT, "header is not valid JSON");
    EXPECT_OPEN_FAIL(make_file("j4.safetensors", "", NULL, 0), MX_EFORMAT, "header is not valid JSON");
    EXPECT_OPEN_FAIL(make_file("j5.safetensors", "[1, 2]", NULL, 0), MX_EFORMAT,
                     "header is a JSON list, not an object (allowed: {NAME: {\"dtype\"");
    EXPECT_OPEN_FAIL(make_file("j6.safetensors", "{\"w\": 3}", NULL, 0), MX_EFORMAT,
                     "header entry is a integer, not an object (tensor 'w'");
    /* invalid UTF-8 in a name: jansson rejects it */
    EXPECT_OPEN_FAIL(make_file("j7.safetensors", "{\"\xff\": {}}", NULL, 0), MX_EFORMAT, "header is not valid JSON",
                     "unable to decode byte 0xff");
}

static void test_bad_entries(void) {
    unsigned char data[64] = {0};
    EXPECT_OPEN_FAIL(make_file("e1.safetensors", "{\"w\": {\"dtype\": \"F17\", \"shape\": [2], \"data_offsets\": [0, 8]}}", data, 8),
                     MX_EFORMAT, "e1.safetensors: unknown dtype 'F17' (tensor 'w'; allowed: BOOL, U8, I8");
    EXPECT_OPEN_FAIL(make_file("e2.safetensors", "{\"w\": {\"dtype\": \"f32\", \"shape\": [2], \"data_offsets\": [0, 8]}}", data, 8),
                     MX_EFORMAT, "unknown dtype 'f32'");
    EXPECT_OPEN_FAIL(make_file("e3.safetensors", "{\"w\": {\"shape\": [2], \"data_offsets\": [0, 8]}}", data, 8),
                     MX_EFORMAT, "missing \"dtype\" (tensor 'w'");
    EXPECT_OPEN_FAIL(make_file("e4.safetensors", "{\"w\": {\"dtype\": \"F32\", \"shape\": [2, -1], \"data_offsets\": [0, 8]}}", data, 8),
                     MX_EFORMAT, "bad shape entry (tensor 'w': shape[1] is -1; allowed: non-negative integers)");
    EXPECT_OPEN_FAIL(make_file("e5.safetensors", "{\"w\": {\"dtype\": \"F32\", \"shape\": [1.5], \"data_offsets\": [0, 8]}}", data, 8),
                     MX_EFORMAT, "shape[0] is 1.5;");
    EXPECT_OPEN_FAIL(make_file("e6.safetensors", "{\"w\": {\"dtype\": \"F32\", \"shape\": [\"2\"], \"data_offsets\": [0, 8]}}", data, 8),
                     MX_EFORMAT, "shape[0] is \"2\";");
    EXPECT_OPEN_FAIL(make_file("e7.safetensors", "{\"w\": {\"dtype\": \"F32\", \"shape\": 2, \"data_offsets\": [0, 8]}}", data, 8),
                     MX_EFORMAT, "non-list \"shape\" (tensor 'w'; allowed: a list of non-negative integers)");
    EXPECT_OPEN_FAIL(make_file("e8.safetensors", "{\"w\": {\"dtype\": \"F32\", \"data_offsets\": [0, 8]}}", data, 8),
                     MX_EFORMAT, "missing \"shape\"");
    EXPECT_OPEN_FAIL(make_file("e9.safetensors",
                               "{\"w\": {\"dtype\": \"F32\", \"shape\": [4294967296, 4294967296, 16], \"data_offsets\": [0, 8]}}",
                               data, 8),
                     MX_EFORMAT, "shape too large (tensor 'w': F32 [4294967296, 4294967296, 16]");
    EXPECT_OPEN_FAIL(make_file("e10.safetensors",
                               "{\"w\": {\"dtype\": \"F64\", \"shape\": [4611686018427387904], \"data_offsets\": [0, 8]}}",
                               data, 8),
                     MX_EFORMAT, "shape too large");
    EXPECT_OPEN_FAIL(make_file("e11.safetensors", "{\"w\": {\"dtype\": \"F32\", \"shape\": [1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1], \"data_offsets\": [0, 4]}}", data, 4),
                     MX_EUNSUPPORTED, "shape has 17 dimensions (tensor 'w'; allowed: at most 16)");
    EXPECT_OPEN_FAIL(make_file("e12.safetensors", "{\"w\": {\"dtype\": \"F4\", \"shape\": [3], \"data_offsets\": [0, 2]}}", data, 2),
                     MX_EFORMAT, "tensor does not fill whole bytes (tensor 'w': F4 [3] is 12 bits");
}

static void test_bad_offsets(void) {
    unsigned char data[64] = {0};
    EXPECT_OPEN_FAIL(make_file("o1.safetensors", "{\"w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0]}}", data, 8),
                     MX_EFORMAT, "bad data_offsets (tensor 'w': data_offsets is [0]; allowed: [begin, end]");
    EXPECT_OPEN_FAIL(make_file("o2.safetensors", "{\"w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [\"0\", 8]}}", data, 8),
                     MX_EFORMAT, "data_offsets is [\"0\",8];");
    EXPECT_OPEN_FAIL(make_file("o3.safetensors", "{\"w\": {\"dtype\": \"F32\", \"shape\": [2]}}", data, 8),
                     MX_EFORMAT, "data_offsets is missing");
    EXPECT_OPEN_FAIL(make_file("o4.safetensors", "{\"w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [8, 0]}}", data, 8),
                     MX_EFORMAT, "data_offsets [8, 0] end before they begin");
    EXPECT_OPEN_FAIL(make_file("o5.safetensors", "{\"w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, -8]}}", data, 8),
                     MX_EFORMAT, "bad data_offsets");
    EXPECT_OPEN_FAIL(make_file("o6.safetensors", "{\"w\": {\"dtype\": \"BF16\", \"shape\": [2, 3], \"data_offsets\": [0, 10]}}", data, 10),
                     MX_EFORMAT,
                     "data_offsets do not match dtype and shape (tensor 'w': BF16 [2, 3] needs 12 bytes, data_offsets [0, 10] hold 10)");
    EXPECT_OPEN_FAIL(make_file("o7.safetensors", "{\"w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [8, 16]}}", data, 8),
                     MX_EFORMAT, "data_offsets run past the end of the file (tensor 'w': data_offsets [8, 16], but the data section holds 8 bytes");
}

static void test_overlap_hole_duplicate(void) {
    unsigned char data[64] = {0};
    EXPECT_OPEN_FAIL(make_file("x1.safetensors",
                               "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
                               " \"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]}}",
                               data, 12),
                     MX_EFORMAT, "tensors overlap (tensor 'a' data_offsets [0, 8] and tensor 'b' data_offsets [4, 12]");
    /* the same bytes claimed twice */
    EXPECT_OPEN_FAIL(make_file("x2.safetensors",
                               "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
                               " \"b\": {\"dtype\": \"I32\", \"shape\": [2], \"data_offsets\": [0, 8]}}",
                               data, 8),
                     MX_EFORMAT, "tensors overlap");
    EXPECT_OPEN_FAIL(make_file("x3.safetensors",
                               "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
                               " \"b\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [8, 12]}}",
                               data, 12),
                     MX_EFORMAT, "hole in the data section (bytes [4, 8) belong to no tensor, before tensor 'b' and after tensor 'a'");
    EXPECT_OPEN_FAIL(make_file("x4.safetensors", "{\"b\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}", data, 8),
                     MX_EFORMAT, "hole in the data section (bytes [0, 4) belong to no tensor, before tensor 'b';");
    EXPECT_OPEN_FAIL(make_file("x5.safetensors", "{}", data, 4), MX_EFORMAT,
                     "the header lists no tensors but 4 bytes of data follow it");
    EXPECT_OPEN_FAIL(make_file("x6.safetensors",
                               "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
                               " \"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}",
                               data, 8),
                     MX_EFORMAT, "duplicate name in the header", "near '\"a\"'", "allowed: each tensor name once");
    EXPECT_OPEN_FAIL(make_file("x7.safetensors", "{\"__metadata__\": {\"k\": 1}}", NULL, 0), MX_EFORMAT,
                     "__metadata__ value is not a string (key 'k' is 1; allowed: strings)");
    EXPECT_OPEN_FAIL(make_file("x8.safetensors", "{\"__metadata__\": [\"k\"]}", NULL, 0), MX_EFORMAT,
                     "__metadata__ is a list (allowed: an object of string values)");
    /* zero-sized tensors at a shared offset are fine (as in the reference implementation) */
    mx_st_file *f;
    mx_diag d;
    CHECK_EQ_INT(mx_st_open(make_file("x9.safetensors",
                                      "{\"a\": {\"dtype\": \"F32\", \"shape\": [0], \"data_offsets\": [4, 4]},"
                                      " \"b\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
                                      " \"c\": {\"dtype\": \"F16\", \"shape\": [2, 0], \"data_offsets\": [4, 4]},"
                                      " \"__metadata__\": {\"format\": \"pt\"}, \"extra\": {\"dtype\": \"U8\", "
                                      "\"shape\": [3], \"data_offsets\": [4, 7], \"ignored_key\": true}}",
                                      data, 7),
                            &f, &d),
                 0);
    if (f) {
        CHECK_EQ_INT(mx_st_count(f), 4);
        CHECK_STR_EQ(mx_st_metadata(f, "format"), "pt");
        mx_st_close(f);
    }
}

static void test_read_errors(void) {
    float v[32] = {0};
    int64_t s[] = {4, 8};
    mx_st_writer *w;
    mx_diag d;
    mx_st_writer_new(&w);
    mx_st_writer_add_f32(w, "model.layers.0.self_attn.q_proj.weight", MX_ST_BF16, s, 2, v, &d);
    mx_st_writer_add_f32(w, "model.embed_tokens.weight", MX_ST_F32, s, 2, v, &d);
    mx_st_writer_add_f32(w, "model.norm.weight", MX_ST_F32, s, 1, v, &d);
    mx_st_writer_add_f32(w, "lm_head.weight", MX_ST_F32, s, 1, v, &d);
    const char *path = mxt_tmp_path("m.safetensors");
    CHECK_EQ_INT(mx_st_write(w, path, &d), 0);
    mx_st_writer_free(w);
    mx_st_file *f;
    CHECK_EQ_INT(mx_st_open(path, &f, &d), 0);
    if (!f) return;
    float out[32];
    int64_t want[] = {8, 4};
    CHECK_EQ_INT(mx_st_read_f32(f, "model.layers.0.self_attn.q_proj.weight", want, 2, out, &d), MX_EINVAL);
    char msg[512];
    snprintf(msg, sizeof msg, "%s: tensor 'model.layers.0.self_attn.q_proj.weight' has shape [4, 8] (BF16), expected [8, 4]", path);
    CHECK_STR_EQ(d.msg, msg);
    int64_t want3[] = {4, 8, 1};
    CHECK_EQ_INT(mx_st_read_f32(f, "model.layers.0.self_attn.q_proj.weight", want3, 3, out, &d), MX_EINVAL);
    CHECK_STR_CONTAINS(d.msg, "has shape [4, 8] (BF16), expected [4, 8, 1]");
    CHECK_EQ_INT(mx_st_read_f32(f, "model.norm.weight", NULL, 0, out, &d), MX_EINVAL);
    CHECK_STR_CONTAINS(d.msg, "tensor 'model.norm.weight' has shape [4] (F32), expected []");
    CHECK_EQ_INT(mx_st_read_f32(f, "model.layers.1.self_attn.q_proj.weight", s, 2, out, &d), MX_EINVAL);
    CHECK_STR_CONTAINS(d.msg, "no tensor named 'model.layers.1.self_attn.q_proj.weight' (the file has 4 tensors: "
                              "'lm_head.weight', 'model.embed_tokens.weight', 'model.layers.0.self_attn.q_proj.weight', ...)");
    CHECK_EQ_INT(mx_st_read_raw(f, "nope", out, 4, &d), MX_EINVAL);
    CHECK_EQ_INT(mx_st_read_f32(f, "model.norm.weight", s, 1, out, &d), 0);
    mx_st_close(f);
}

/* ---- writer errors and atomicity ---------------------------------------------------- */

static void test_writer_errors(void) {
    mx_st_writer *w;
    mx_diag d;
    float x[4] = {0};
    int64_t s[] = {4}, neg[] = {2, -2}, big[17] = {0};
    mx_st_writer_new(&w);
    CHECK_EQ_INT(mx_st_writer_add_f32(w, "a", MX_ST_F32, s, 1, x, &d), 0);
    CHECK_EQ_INT(mx_st_writer_add_f32(w, "a", MX_ST_BF16, s, 1, x, &d), MX_EINVAL);
    CHECK_STR_CONTAINS(d.msg, "duplicate tensor name 'a'");
    CHECK_EQ_INT(mx_st_writer_add_f32(w, "", MX_ST_F32, s, 1, x, &d), MX_EINVAL);
    CHECK_STR_CONTAINS(d.msg, "empty tensor name");
    CHECK_EQ_INT(mx_st_writer_add_f32(w, "__metadata__", MX_ST_F32, s, 1, x, &d), MX_EINVAL);
    CHECK_STR_CONTAINS(d.msg, "reserved");
    CHECK_EQ_INT(mx_st_writer_add_f32(w, "bad\xff", MX_ST_F32, s, 1, x, &d), MX_EINVAL);
    CHECK_STR_CONTAINS(d.msg, "not valid UTF-8");
    CHECK_EQ_INT(mx_st_writer_add_f32(w, "h", MX_ST_F16, s, 1, x, &d), MX_EUNSUPPORTED);
    CHECK_STR_CONTAINS(d.msg, "tensor 'h': fp32 data can be stored as F32 or BF16, not F16");
    CHECK_EQ_INT(mx_st_writer_add_f32(w, "n", MX_ST_F32, neg, 2, x, &d), MX_EINVAL);
    CHECK_STR_CONTAINS(d.msg, "tensor 'n': shape [2, -2] has a negative dimension");
    CHECK_EQ_INT(mx_st_writer_add_f32(w, "b", MX_ST_F32, big, 17, x, &d), MX_EUNSUPPORTED);
    CHECK_EQ_INT(mx_st_writer_add_f32(w, "z", MX_ST_F32, s, 1, NULL, &d), MX_ENULL);
    CHECK_EQ_INT(mx_st_writer_add_raw(w, "f4", MX_ST_F4, (int64_t[]){3}, 1, x, &d), MX_EINVAL);
    CHECK_STR_CONTAINS(d.msg, "F4 [3] does not fill whole bytes");
    CHECK_EQ_INT(mx_st_writer_set_metadata(w, "k", "bad\xc3", &d), MX_EINVAL);
    mx_st_writer_free(w);
}

static void test_unwritable_output(void) {
    mx_st_writer *w;
    mx_diag d;
    float x[4] = {1, 2, 3, 4};
    int64_t s[] = {4};
    mx_st_writer_new(&w);
    mx_st_writer_add_f32(w, "a", MX_ST_F32, s, 1, x, &d);
    /* a directory that does not exist */
    const char *p = mxt_tmp_path("no/such/dir/out.safetensors");
    CHECK_EQ_INT(mx_st_write(w, p, &d), MX_EIO);
    CHECK_STR_CONTAINS(d.msg, "out.safetensors: cannot create the output file in directory");
    CHECK_STR_CONTAINS(d.msg, "No such file or directory");
    /* the target is a directory */
    const char *dir = mxt_tmp_path("outdir");
    mkdir(dir, 0777);
    CHECK_EQ_INT(mx_st_write(w, dir, &d), MX_EIO);
    CHECK_STR_CONTAINS(d.msg, "outdir: is a directory");
    CHECK_EQ_INT(mxt_count_entries(dir), 0);
    mx_st_writer_free(w);
}

/* A write that fails halfway (the file-size limit hits) leaves no temporary file and keeps
 * the previous file intact. */
static void test_failed_write_leaves_nothing(void) {
    const char *dir = mxt_tmp_path("atomic");
    mkdir(dir, 0777);
    char target[600];
    snprintf(target, sizeof target, "%s/model.safetensors", dir);
    float small[2] = {7, 8};
    int64_t s2[] = {2};
    mx_st_writer *w;
    mx_diag d;
    mx_st_writer_new(&w);
    mx_st_writer_add_f32(w, "old", MX_ST_F32, s2, 1, small, &d);
    CHECK_EQ_INT(mx_st_write(w, target, &d), 0);
    mx_st_writer_free(w);

    int64_t n = 1 << 20;
    float *big = calloc((size_t)n, sizeof *big);
    int64_t sb[] = {n};
    mx_st_writer_new(&w);
    mx_st_writer_add_f32(w, "new", MX_ST_F32, sb, 1, big, &d);
    struct rlimit old;
    getrlimit(RLIMIT_FSIZE, &old);
    struct rlimit lim = old;
    lim.rlim_cur = 200000;
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    CHECK_EQ_INT(setrlimit(RLIMIT_FSIZE, &lim), 0);
    int rc = mx_st_write(w, target, &d);
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, prev);
    CHECK_EQ_INT(rc, MX_EIO);
    CHECK_STR_CONTAINS(d.msg, "model.safetensors: write failed (File too large); no file was written");
    CHECK_EQ_INT(mxt_count_entries(dir), 1);
    mx_st_writer_free(w);
    free(big);
    mx_st_file *f;
    CHECK_EQ_INT(mx_st_open(target, &f, &d), 0);
    if (f) {
        float y[2];
        CHECK_EQ_INT(mx_st_read_f32(f, "old", s2, 1, y, &d), 0);
        CHECK_EQ_DBL(y[1], 8.0);
        mx_st_close(f);
    }
}

static void test_null_arguments(void) {
    mx_st_file *f;
    mx_diag d;
    CHECK_EQ_INT(mx_st_open(NULL, &f, &d), MX_ENULL);
    CHECK_EQ_INT(mx_st_open("x", NULL, &d), MX_ENULL);
    CHECK_EQ_INT(mx_st_count(NULL), 0);
    CHECK(mx_st_find(NULL, "x") == NULL);
    mx_st_close(NULL);
    mx_st_writer_free(NULL);
    mx_st_dtype dt;
    CHECK_EQ_INT(mx_st_dtype_parse("BF16", &dt), 0);
    CHECK_EQ_INT(dt, MX_ST_BF16);
    CHECK_EQ_INT(mx_st_dtype_parse("bf16", &dt), MX_EENUM);
    CHECK_STR_EQ(mx_st_dtype_name(MX_ST_F8_E4M3), "F8_E4M3");
    CHECK_EQ_INT(mx_st_dtype_bits(MX_ST_F6_E2M3), 6);
    CHECK_STR_EQ(mx_st_dtype_name((mx_st_dtype)99), "?");
}

/* ---- the Python oracle exchange (tests/safetensors_torch.sh) ------------------------ */

static char oracle_path_buf[600];
static const char *oracle_path(const char *name) {
    snprintf(oracle_path_buf, sizeof oracle_path_buf, "%s/%s", getenv("MXT_ORACLE_DIR"), name);
    return oracle_path_buf;
}

/* Read the file tests/py/safetensors_oracle.py wrote in the HF layout. Its values follow
 * formulas both sides compute: f32/f64 exact, f16 = k/64 exact, bf16 = torch's rounding of
 * the fp32 pattern (compared with this test's own rounding). */
static void test_oracle_read_python(void) {
    mx_st_file *f;
    mx_diag d;
    int rc = mx_st_open(oracle_path("hf_written.safetensors"), &f, &d);
    CHECK_EQ_INT(rc, 0);
    if (rc) {
        printf("    %s\n", d.msg);
        return;
    }
    CHECK_EQ_INT(mx_st_count(f), 5);
    CHECK_STR_EQ(mx_st_metadata(f, "format"), "pt");
    CHECK_STR_EQ(mx_st_metadata(f, "writer"), "safetensors_oracle.py");
    float y[4096];
    int64_t s_f32[] = {6, 7}, s_bf16[] = {3, 5, 4}, s_f16[] = {33}, s_f64[] = {2, 2}, s_scalar[1];
    CHECK_EQ_INT(mx_st_read_f32(f, "model.layers.0.mlp.up_proj.weight", s_f32, 2, y, &d), 0);
    for (int i = 0; i < 42; i++) CHECK_EQ_DBL(y[i], pattern(i));
    CHECK_EQ_INT(mx_st_read_f32(f, "model.layers.0.self_attn.q_proj.weight", s_bf16, 3, y, &d), 0);
    for (int i = 0; i < 60; i++) CHECK_EQ_DBL(y[i], bf16_oracle(pattern(1000 + i)));
    CHECK_EQ_INT(mx_st_read_f32(f, "model.norm.weight", s_f16, 1, y, &d), 0);
    for (int i = 0; i < 33; i++) CHECK_EQ_DBL(y[i], ((i * 7919) % 2001 - 1000) / 64.0);
    CHECK_EQ_INT(mx_st_read_f32(f, "lm_head.bias", s_f64, 2, y, &d), 0);
    for (int i = 0; i < 4; i++) CHECK_EQ_DBL(y[i], (float)(0.1 * (i + 1)));
    CHECK_EQ_INT(mx_st_read_f32(f, "step", s_scalar, 0, y, &d), 0);
    CHECK_EQ_DBL(y[0], 42.0);
    mx_st_close(f);
}

/* Write the file the Python oracle checks (dtypes, shapes, offsets, padding, values). */
static void test_oracle_write_for_python(void) {
    float a[15], b[24], nan_etc[8];
    for (int i = 0; i < 15; i++) a[i] = pattern(i);
    for (int i = 0; i < 24; i++) b[i] = pattern(500 + i);
    /* NaN, +-inf, -0, a subnormal, FLT_MAX (rounds to inf), two ties (to even: down, up) */
    uint32_t specials[8] = {0x7FC00000u, 0x7F800000u, 0xFF800000u, 0x80000000u,
                            0x0000A000u, 0x7F7FFFFFu, 0x3F808000u, 0x3F818000u};
    memcpy(nan_etc, specials, sizeof specials);
    float c = 3.25f;
    int64_t sa[] = {3, 5}, sb[] = {4, 3, 2}, sd[] = {2, 0}, ss[] = {8};
    mx_st_writer *w;
    mx_diag d;
    mx_st_writer_new(&w);
    CHECK_EQ_INT(mx_st_writer_add_f32(w, "a.f32", MX_ST_F32, sa, 2, a, &d), 0);
    CHECK_EQ_INT(mx_st_writer_add_f32(w, "b.bf16", MX_ST_BF16, sb, 3, b, &d), 0);
    CHECK_EQ_INT(mx_st_writer_add_f32(w, "c.scalar", MX_ST_F32, NULL, 0, &c, &d), 0);
    CHECK_EQ_INT(mx_st_writer_add_f32(w, "d.empty", MX_ST_BF16, sd, 2, NULL, &d), 0);
    CHECK_EQ_INT(mx_st_writer_add_f32(w, "e.specials", MX_ST_BF16, ss, 1, nan_etc, &d), 0);
    CHECK_EQ_INT(mx_st_writer_set_metadata(w, "format", "pt", &d), 0);
    CHECK_EQ_INT(mx_st_writer_set_metadata(w, "writer", "mxtrain", &d), 0);
    CHECK_EQ_INT(mx_st_write(w, oracle_path("c_written.safetensors"), &d), 0);
    mx_st_writer_free(w);
}

static const mxt_test tests[] = {
    {"roundtrip_odd_shapes", test_roundtrip_odd_shapes},
    {"reserved_tensors", test_reserved_tensors},
    {"empty_file", test_empty_file},
    {"bf16_rounding_specials", test_bf16_rounding_specials},
    {"read_other_dtypes", test_read_other_dtypes},
    {"large_bf16", test_large_bf16},
    {"missing_and_directory", test_missing_and_directory},
    {"truncated", test_truncated},
    {"absurd_header_length", test_absurd_header_length},
    {"bad_json", test_bad_json},
    {"bad_entries", test_bad_entries},
    {"bad_offsets", test_bad_offsets},
    {"overlap_hole_duplicate", test_overlap_hole_duplicate},
    {"read_errors", test_read_errors},
    {"writer_errors", test_writer_errors},
    {"unwritable_output", test_unwritable_output},
    {"failed_write_leaves_nothing", test_failed_write_leaves_nothing},
    {"null_arguments", test_null_arguments},
};

/* Run only by tests/safetensors_torch.sh, which sets MXT_ORACLE_DIR. */
static const mxt_test oracle_tests[] = {
    {"oracle_read_python", test_oracle_read_python},
    {"oracle_write_for_python", test_oracle_write_for_python},
};

int main(int argc, char **argv) {
    return getenv("MXT_ORACLE_DIR") ? MXT_RUN(oracle_tests, argc, argv) : MXT_RUN(tests, argc, argv);
}
