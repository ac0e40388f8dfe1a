/* llm.c token shards, the batch loader and byte-level prepare (SPEC §8). Expected values are
 * hand-computed literals or come from files the test builds byte by byte; shard headers are
 * checked by reading the raw bytes back with fread. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "mxtrain/tokens.h"

/* ---- helpers ------------------------------------------------------------------------ */

/* A shard built by hand: header ints h0..h2, then nbytes of token data. */
static const char *raw_shard(const char *name, int32_t magic, int32_t version, int32_t count, const void *data,
                             size_t nbytes) {
    unsigned char *buf = calloc(1, 1024 + nbytes);
    int32_t h[3] = {magic, version, count};
    memcpy(buf, h, sizeof h);
    if (nbytes) memcpy(buf + 1024, data, nbytes);
    const char *p = mxt_tmp_path(name);
    mxt_write_bytes(p, buf, 1024 + nbytes);
    free(buf);
    return p;
}

/* A uint16 shard holding base, base+1, ..., base+count-1. */
static const char *iota_shard(const char *name, int count, int base) {
    uint16_t *t = malloc((size_t)count * 2);
    for (int i = 0; i < count; i++) t[i] = (uint16_t)(base + i);
    const char *p = raw_shard(name, 20240520, 1, count, t, (size_t)count * 2);
    free(t);
    return p;
}

static int read_file(const char *path, unsigned char *buf, size_t cap) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    int n = (int)fread(buf, 1, cap, f);
    fclose(f);
    return n;
}

static bool exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

#define EXPECT_READ_FAIL(path, vocab, code, needle) do { \
    uint32_t *t_ = (uint32_t *)1; int64_t cnt_ = -1; mx_diag d_ = {{0}}; \
    CHECK_EQ_INT(mx_shard_read(path, vocab, &t_, &cnt_, &d_), code); \
    CHECK(t_ == NULL && cnt_ == 0); \
    CHECK_STR_CONTAINS(d_.msg, needle); \
    CHECK(strchr(d_.msg, '\n') == NULL); \
} while (0)

/* ---- shards ------------------------------------------------------------------------- */

static void test_roundtrip_u16(void) {
    uint32_t tok[] = {0, 1, 255, 256, 50256, 65535, 7};
    const char *p = mxt_tmp_path("u16.bin");
    mx_diag d;
    CHECK_EQ_INT(mx_shard_write(p, tok, 7, false, &d), 0);
    unsigned char raw[2048];
    CHECK_EQ_INT(read_file(p, raw, sizeof raw), 1024 + 7 * 2);
    int32_t h[256];
    memcpy(h, raw, sizeof h);
    CHECK_EQ_INT(h[0], 20240520);
    CHECK_EQ_INT(h[1], 1);
    CHECK_EQ_INT(h[2], 7);
    for (int i = 3; i < 256; i++) CHECK_EQ_INT(h[i], 0);
    uint16_t u[7];
    memcpy(u, raw + 1024, sizeof u);
    for (int i = 0; i < 7; i++) CHECK_EQ_INT(u[i], tok[i]);
    mx_shard_info info;
    CHECK_EQ_INT(mx_shard_inspect(p, &info, &d), 0);
    CHECK_EQ_INT(info.width, 2);
    CHECK_EQ_INT(info.count, 7);
    uint32_t *back;
    int64_t n;
    CHECK_EQ_INT(mx_shard_read(p, 65536, &back, &n, &d), 0);
    CHECK_EQ_INT(n, 7);
    if (back) CHECK_MEM_EQ(back, tok, sizeof tok);
    free(back);
}

static void test_roundtrip_u32(void) {
    uint32_t tok[] = {0, 65536, 128255, 3};
    const char *p = mxt_tmp_path("u32.bin");
    mx_diag d;
    CHECK_EQ_INT(mx_shard_write(p, tok, 4, false, &d), 0); /* a token >= 65536: uint32 */
    unsigned char raw[2048];
    CHECK_EQ_INT(read_file(p, raw, sizeof raw), 1024 + 4 * 4);
    int32_t h[3];
    memcpy(h, raw, sizeof h);
    CHECK_EQ_INT(h[0], 20240801);
    CHECK_EQ_INT(h[1], 7);
    CHECK_EQ_INT(h[2], 4);
    CHECK_MEM_EQ(raw + 1024, tok, sizeof tok);
    uint32_t *back;
    int64_t n;
    CHECK_EQ_INT(mx_shard_read(p, 128256, &back, &n, &d), 0);
    CHECK_EQ_INT(n, 4);
    if (back) CHECK_MEM_EQ(back, tok, sizeof tok);
    free(back);
    /* small tokens, uint32 on request */
    uint32_t small[] = {1, 2, 3};
    CHECK_EQ_INT(mx_shard_write(p, small, 3, true, &d), 0);
    mx_shard_info info;
    CHECK_EQ_INT(mx_shard_inspect(p, &info, &d), 0);
    CHECK_EQ_INT(info.width, 4);
    CHECK_EQ_INT(info.count, 3);
}

static void test_bad_shards(void) {
    uint16_t t[32] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    unsigned char small[100] = {0};
    const char *p = mxt_tmp_path("short.bin");
    mxt_write_bytes(p, small, sizeof small);
    EXPECT_READ_FAIL(p, 300, MX_EFORMAT, "short.bin: file is 100 bytes, shorter than the 1024-byte llm.c shard header");
    EXPECT_READ_FAIL(raw_shard("magic.bin", 12345, 1, 10, t, 20), 300, MX_EFORMAT,
                     "magic.bin: bad magic number 12345, not an llm.c token shard (allowed: magic 20240520 version 1 "
                     "(uint16 tokens) or magic 20240801 version 7 (uint32 tokens))");
    EXPECT_READ_FAIL(raw_shard("version.bin", 20240520, 7, 10, t, 20), 300, MX_EFORMAT,
                     "version.bin: magic 20240520 with version 7 is not a known shard format (allowed: magic 20240520 version 1");
    EXPECT_READ_FAIL(raw_shard("version2.bin", 20240801, 1, 10, t, 40), 300, MX_EFORMAT,
                     "magic 20240801 with version 1 is not a known shard format");
    EXPECT_READ_FAIL(raw_shard("zero.bin", 20240520, 1, 0, t, 0), 300, MX_EFORMAT,
                     "zero.bin: the header's token count is 0 (allowed: at least 1)");
    EXPECT_READ_FAIL(raw_shard("neg.bin", 20240520, 1, -5, t, 0), 300, MX_EFORMAT, "token count is -5 (allowed: at least 1)");
    EXPECT_READ_FAIL(raw_shard("trunc.bin", 20240520, 1, 10, t, 16), 300, MX_EFORMAT,
                     "trunc.bin: file is truncated: the header says 10 uint16 tokens, so the file should be 1044 bytes, "
                     "but it is 1040 bytes (4 missing)");
    EXPECT_READ_FAIL(raw_shard("trail.bin", 20240520, 1, 10, t, 23), 300, MX_EFORMAT,
                     "trail.bin: file has 3 trailing bytes: the header says 10 uint16 tokens, so the file should be "
                     "1044 bytes, but it is 1047 bytes");
    EXPECT_READ_FAIL(raw_shard("trunc32.bin", 20240801, 7, 10, t, 20), 300, MX_EFORMAT,
                     "the header says 10 uint32 tokens, so the file should be 1064 bytes, but it is 1044 bytes");
    /* tokens 1..10 against vocab 8: index 7 holds 8 */
    EXPECT_READ_FAIL(raw_shard("vocab.bin", 20240520, 1, 10, t, 20), 8, MX_EFORMAT,
                     "vocab.bin: token 8 at index 7 is out of range (allowed: 0 to 7 for vocab_size 8)");
    EXPECT_READ_FAIL(mxt_tmp_path("nope.bin"), 300, MX_EIO, "nope.bin: cannot open (No such file or directory)");
    EXPECT_READ_FAIL(mxt_tmpdir(), 300, MX_EIO, ": is a directory (allowed: an llm.c token shard)");
    EXPECT_READ_FAIL(raw_shard("ok.bin", 20240520, 1, 10, t, 20), 0, MX_EINVAL,
                     "vocab_size 0 is out of range (allowed: 1 to 2147483647)");
    mx_shard_info info;
    mx_diag d;
    CHECK_EQ_INT(mx_shard_inspect(mxt_tmp_path("trail.bin"), &info, &d), MX_EFORMAT);
    CHECK_STR_CONTAINS(d.msg, "3 trailing bytes");
}

/* A token deep in a large shard, past the first read chunk. */
static void test_vocab_check_late_index(void) {
    int n = 100000;
    uint32_t *t = malloc((size_t)n * 4);
    for (int i = 0; i < n; i++) t[i] = (uint32_t)(i % 256);
    t[87654] = 300;
    const char *p = mxt_tmp_path("late.bin");
    mx_diag d;
    CHECK_EQ_INT(mx_shard_write(p, t, n, false, &d), 0);
    EXPECT_READ_FAIL(p, 257, MX_EFORMAT, "token 300 at index 87654 is out of range (allowed: 0 to 256 for vocab_size 257)");
    free(t);
}

static void test_write_errors(void) {
    uint32_t t[2] = {1, 2};
    mx_diag d;
    CHECK_EQ_INT(mx_shard_write(mxt_tmp_path("w0.bin"), t, 0, false, &d), MX_EINVAL);
    CHECK_STR_CONTAINS(d.msg, "cannot write 0 tokens (allowed: 1 to 2147483647 per shard)");
    CHECK(!exists(mxt_tmp_path("w0.bin")));
    CHECK_EQ_INT(mx_shard_write(mxt_tmp_path("missing/dir/w.bin"), t, 2, false, &d), MX_EIO);
    CHECK_STR_CONTAINS(d.msg, "w.bin: cannot create the output file in directory");
    const char *dir = mxt_tmp_path("wdir");
    mkdir(dir, 0777);
    CHECK_EQ_INT(mx_shard_write(dir, t, 2, false, &d), MX_EIO);
    CHECK_STR_CONTAINS(d.msg, "wdir: is a directory");
    CHECK_EQ_INT(mxt_count_entries(dir), 0);
    CHECK_EQ_INT(mx_shard_write(NULL, t, 2, false, &d), MX_ENULL);
}

/* ---- loader ------------------------------------------------------------------------- */

static void test_batches_hand_computed(void) {
    /* tokens 10..29, B=2, T=3: a batch is 7 tokens, the position advances by 6 */
    const char *p = iota_shard("iota.bin", 20, 10);
    mx_loader *l;
    mx_diag d;
    int rc = mx_loader_open(&p, 1, 2, 3, 0, 1, 1000, &l, &d);
    CHECK_EQ_INT(rc, 0);
    if (rc) {
        printf("    %s\n", d.msg);
        return;
    }
    int32_t in[6], tg[6];
    const int32_t want_in[3][6] = {{10, 11, 12, 13, 14, 15}, {16, 17, 18, 19, 20, 21}, {22, 23, 24, 25, 26, 27}};
    const int32_t want_tg[3][6] = {{11, 12, 13, 14, 15, 16}, {17, 18, 19, 20, 21, 22}, {23, 24, 25, 26, 27, 28}};
    /* offsets 0, 6, 12 (12 + 7 <= 20); 18 + 7 > 20 so the 4th batch wraps to offset 0 */
    for (int b = 0; b < 3; b++) {
        CHECK_EQ_INT(mx_loader_next(l, in, tg, &d), 0);
        CHECK_MEM_EQ(in, want_in[b], sizeof in);
        CHECK_MEM_EQ(tg, want_tg[b], sizeof tg);
    }
    mx_loader_pos pos;
    mx_loader_get_pos(l, &pos);
    CHECK_EQ_INT(pos.shard, 0);
    CHECK_EQ_INT(pos.offset, 0);
    CHECK_EQ_INT(pos.epoch, 1);
    CHECK_EQ_INT(mx_loader_next(l, in, tg, &d), 0);
    CHECK_MEM_EQ(in, want_in[0], sizeof in);
    CHECK_EQ_INT(mx_loader_steps_per_epoch(l), 3);
    mx_loader_close(l);
}

static void test_wrap_across_shards(void) {
    const char *paths[2] = {iota_shard("s0.bin", 13, 100), iota_shard("s1.bin", 7, 200)};
    mx_loader *l;
    mx_diag d;
    CHECK_EQ_INT(mx_loader_open(paths, 2, 1, 3, 0, 1, 1000, &l, &d), 0);
    if (!l) return;
    CHECK_EQ_INT(mx_loader_shard_count(l), 2);
    CHECK_EQ_INT(mx_loader_shard_tokens(l, 0), 13);
    CHECK_EQ_INT(mx_loader_steps_per_epoch(l), 6);
    /* B=1, T=3: shard 0 offsets 0, 3, 6, 9 (9+4 = 13); shard 1 offsets 0, 3 (3+4 = 7); wrap */
    const int32_t first[] = {100, 103, 106, 109, 200, 203, 100, 103};
    const int64_t shard_after[] = {0, 0, 0, 1, 1, 0, 0, 0};
    const int64_t epoch_after[] = {0, 0, 0, 0, 0, 1, 1, 1};
    for (int b = 0; b < 8; b++) {
        int32_t in[3], tg[3];
        CHECK_EQ_INT(mx_loader_next(l, in, tg, &d), 0);
        CHECK_EQ_INT(in[0], first[b]);
        CHECK_EQ_INT(in[2], first[b] + 2);
        CHECK_EQ_INT(tg[2], first[b] + 3);
        mx_loader_pos pos;
        mx_loader_get_pos(l, &pos);
        CHECK_EQ_INT(pos.shard, shard_after[b]);
        CHECK_EQ_INT(pos.epoch, epoch_after[b]);
    }
    mx_loader_close(l);
}

/* Rank r's batch is rows [r*B, (r+1)*B) of the world=1 batch with B*world rows. */
static void test_rank_slicing(void) {
    const char *p = iota_shard("ranks.bin", 11, 0);
    mx_loader *r0, *r1, *all;
    mx_diag d;
    CHECK_EQ_INT(mx_loader_open(&p, 1, 1, 2, 0, 2, 100, &r0, &d), 0);
    CHECK_EQ_INT(mx_loader_open(&p, 1, 1, 2, 1, 2, 100, &r1, &d), 0);
    CHECK_EQ_INT(mx_loader_open(&p, 1, 2, 2, 0, 1, 100, &all, &d), 0);
    if (!r0 || !r1 || !all) return;
    /* hand-computed: world*B*T = 4, a step needs 5 tokens: offsets 0 and 4 (4+5 <= 11) */
    const int32_t want0[][2] = {{0, 1}, {4, 5}, {0, 1}};
    const int32_t want1[][2] = {{2, 3}, {6, 7}, {2, 3}};
    for (int s = 0; s < 3; s++) {
        int32_t a[2], at[2], b[2], bt[2], c[4], ct[4];
        CHECK_EQ_INT(mx_loader_next(r0, a, at, &d), 0);
        CHECK_EQ_INT(mx_loader_next(r1, b, bt, &d), 0);
        CHECK_EQ_INT(mx_loader_next(all, c, ct, &d), 0);
        CHECK_MEM_EQ(a, want0[s], sizeof a);
        CHECK_MEM_EQ(b, want1[s], sizeof b);
        CHECK_EQ_INT(at[1], want0[s][1] + 1);
        CHECK_EQ_INT(bt[1], want1[s][1] + 1);
        CHECK_MEM_EQ(c, a, sizeof a);
        CHECK_MEM_EQ(c + 2, b, sizeof b);
        CHECK_MEM_EQ(ct, at, sizeof at);
        CHECK_MEM_EQ(ct + 2, bt, sizeof bt);
    }
    mx_loader_pos pos;
    mx_loader_get_pos(r1, &pos);
    CHECK_EQ_INT(pos.epoch, 1);
    CHECK_EQ_INT(pos.offset, 4);
    mx_loader_close(r0);
    mx_loader_close(r1);
    mx_loader_close(all);
    /* a shard too small for world*B*T+1 */
    CHECK_EQ_INT(mx_loader_open(&p, 1, 2, 3, 0, 2, 100, &r0, &d), MX_EINVAL);
    CHECK(r0 == NULL);
    CHECK_STR_CONTAINS(d.msg, "ranks.bin: shard has 11 tokens, too few for one batch (allowed: at least world*B*T+1 = 2*2*3+1 = 13 tokens)");
}

/* The next `steps` batches of n tokens of a and b are the same. */
static void same_batches(mx_loader *a, mx_loader *b, int steps, int n) {
    int32_t x[64], y[64], u[64], v[64];
    mx_diag d;
    for (int i = 0; i < steps && n <= 64; i++) {
        CHECK_EQ_INT(mx_loader_next(a, x, y, &d), 0);
        CHECK_EQ_INT(mx_loader_next(b, u, v, &d), 0);
        CHECK_MEM_EQ(x, u, (size_t)n * sizeof *x);
        CHECK_MEM_EQ(y, v, (size_t)n * sizeof *y);
    }
}

static void test_resume(void) {
    const char *paths[2] = {iota_shard("r0.bin", 50, 0), iota_shard("r1.bin", 30, 1000)};
    mx_loader *a, *b;
    mx_diag d;
    CHECK_EQ_INT(mx_loader_open(paths, 2, 2, 4, 0, 1, 2000, &a, &d), 0);
    CHECK_EQ_INT(mx_loader_open(paths, 2, 2, 4, 0, 1, 2000, &b, &d), 0);
    if (!a || !b) return;
    int32_t x[8], y[8], u[8], v[8];
    for (int i = 0; i < 7; i++) mx_loader_next(a, x, y, &d);
    mx_loader_pos pos;
    mx_loader_get_pos(a, &pos);
    CHECK_EQ_INT(pos.shard, 1); /* shard 0: 6 steps (offsets 0..40), then shard 1 offset 8 */
    CHECK_EQ_INT(pos.offset, 8);
    CHECK_EQ_INT(mx_loader_set_pos(b, &pos, &d), 0);
    same_batches(a, b, 10, 8);
    mx_loader_pos bad = {.shard = 2, .offset = 0, .epoch = 0};
    CHECK_EQ_INT(mx_loader_set_pos(b, &bad, &d), MX_EINVAL);
    CHECK_STR_CONTAINS(d.msg, "resume position names shard 2 (allowed: 0 to 1, 2 shards)");
    bad = (mx_loader_pos){.shard = -1, .offset = 0, .epoch = 0};
    CHECK_EQ_INT(mx_loader_set_pos(b, &bad, &d), MX_EINVAL);
    bad = (mx_loader_pos){.shard = 1, .offset = 31, .epoch = 0};
    CHECK_EQ_INT(mx_loader_set_pos(b, &bad, &d), MX_EINVAL);
    CHECK_STR_CONTAINS(d.msg, "r1.bin: resume offset 31 is beyond the shard (allowed: 0 to 30, its token count)");
    /* too few tokens left for a step (a position saved by a job with a smaller step): the
       next shard, wrapping to the first and the next epoch after the last */
    mx_loader_pos late = {.shard = 1, .offset = 22, .epoch = 4};
    CHECK_EQ_INT(mx_loader_set_pos(b, &late, &d), 0);
    mx_loader_get_pos(b, &late);
    CHECK_EQ_INT(late.shard, 0);
    CHECK_EQ_INT(late.offset, 0);
    CHECK_EQ_INT(late.epoch, 5);
    CHECK_EQ_INT(mx_loader_next(b, u, v, &d), 0);
    CHECK_EQ_INT(u[0], 0);
    bad = (mx_loader_pos){.shard = 1, .offset = -1, .epoch = 0};
    CHECK_EQ_INT(mx_loader_set_pos(b, &bad, &d), MX_EINVAL);
    bad = (mx_loader_pos){.shard = 0, .offset = 0, .epoch = -1};
    CHECK_EQ_INT(mx_loader_set_pos(b, &bad, &d), MX_EINVAL);
    CHECK_STR_CONTAINS(d.msg, "epoch -1 (allowed: >= 0)");
    /* an offset that is not a multiple of B*T is still a valid start */
    bad = (mx_loader_pos){.shard = 1, .offset = 21, .epoch = 3};
    CHECK_EQ_INT(mx_loader_set_pos(b, &bad, &d), 0);
    CHECK_EQ_INT(mx_loader_next(b, u, v, &d), 0);
    CHECK_EQ_INT(u[0], 1021);
    CHECK_EQ_INT(v[7], 1029);
    mx_loader_get_pos(b, &pos);
    CHECK_EQ_INT(pos.shard, 0);
    CHECK_EQ_INT(pos.epoch, 4);
    mx_loader_close(a);
    mx_loader_close(b);
}

/* Megatron's blend, written out independently: row g comes from the dataset with the
 * largest w_d max(g, 1) - n_d (the first on ties), as that dataset's row n_d. */
typedef struct {
    int n_shards, count[2], base[2];   // a dataset: its shards' token counts and first tokens
} blend_set;
static int blend_first_token(const blend_set *set, int T, int64_t row) {
    int64_t rows = 0;
    for (int s = 0; s < set->n_shards; s++) rows += (set->count[s] - 1) / T;
    int64_t k = row % rows;
    for (int s = 0;; s++) {
        int64_t here = (set->count[s] - 1) / T;
        if (k < here) return set->base[s] + (int)(k * T);
        k -= here;
    }
}

static void test_blend(void) {
    // dataset 0: 4 + 2 rows of 3 over two shards; dataset 1: 3 rows; dataset 2: 6 rows
    const blend_set sets[3] = {{2, {13, 8}, {100, 200}}, {1, {10, 0}, {300, 0}}, {1, {21, 0}, {400, 0}}};
    iota_shard("blend0a.bin", 13, 100), iota_shard("blend0b.bin", 8, 200);
    iota_shard("blend1.bin", 10, 300), iota_shard("blend2.bin", 21, 400);
    char pattern0[300];
    snprintf(pattern0, sizeof pattern0, "%s/blend0?.bin", mxt_tmpdir());
    const char *paths[3] = {pattern0, mxt_tmp_path("blend1.bin"), NULL};
    char p2[300];
    snprintf(p2, sizeof p2, "%s", mxt_tmp_path("blend2.bin"));
    paths[2] = p2;
    const double weights[3] = {5, 2, 3};   // normalised: 0.5, 0.2, 0.3
    mx_diag d;
    mx_loader *one, *r[2];
    // hand-computed at world 1, B 6: datasets 0, 2, 1, 0, 2, 0 (errors w max(g, 1) - n)
    CHECK_EQ_INT(mx_loader_open_blend(paths, weights, 3, 6, 3, 0, 1, 1000, &one, &d), 0);
    if (!one) return;
    int32_t in[18], tg[18];
    CHECK_EQ_INT(mx_loader_next(one, in, tg, &d), 0);
    const int32_t firsts[6] = {100, 400, 300, 103, 403, 106};
    for (int b = 0; b < 6; b++) {
        CHECK_EQ_INT(in[3 * b], firsts[b]);
        CHECK_EQ_INT(in[3 * b + 2], firsts[b] + 2);
        CHECK_EQ_INT(tg[3 * b + 2], firsts[b] + 3);
    }
    mx_loader_pos pos;
    mx_loader_get_pos(one, &pos);
    CHECK_EQ_INT(pos.n_datasets, 3);
    CHECK_EQ_INT(pos.rows[0], 3);
    CHECK_EQ_INT(pos.rows[1], 1);
    CHECK_EQ_INT(pos.rows[2], 2);
    mx_loader_close(one);
    // world 2, B 2, 12 steps (past every dataset's end): each rank's rows are its part of the stream
    for (int k = 0; k < 2; k++) CHECK_EQ_INT(mx_loader_open_blend(paths, weights, 3, 2, 3, k, 2, 1000, &r[k], &d), 0);
    if (!r[0] || !r[1]) return;
    int64_t n[3] = {0, 0, 0}, g = 0;
    mx_loader_pos at4;
    for (int step = 0; step < 12; step++) {
        int want[4];
        for (int q = 0; q < 4; q++, g++) {
            double at = g > 1 ? (double)g : 1.0, best_error = -1e300;
            int best = 0;
            for (int k = 0; k < 3; k++) {
                double error = weights[k] / 10.0 * at - (double)n[k];
                if (error > best_error) best_error = error, best = k;
            }
            want[q] = blend_first_token(&sets[best], 3, n[best]++);
        }
        for (int k = 0; k < 2; k++) {
            int32_t x[6], y[6];
            CHECK_EQ_INT(mx_loader_next(r[k], x, y, &d), 0);
            for (int b = 0; b < 2; b++) {
                CHECK_EQ_INT(x[3 * b], want[2 * k + b]);
                CHECK_EQ_INT(x[3 * b + 1], want[2 * k + b] + 1);
                CHECK_EQ_INT(y[3 * b + 2], want[2 * k + b] + 3);
            }
        }
        if (step == 3) mx_loader_get_pos(r[1], &at4);
    }
    mx_loader_get_pos(r[0], &pos);
    const int64_t rows_of[3] = {6, 3, 6};
    int64_t fewest = INT64_MAX;
    for (int k = 0; k < 3; k++) {
        CHECK_EQ_INT(pos.rows[k], n[k]);
        if (n[k] / rows_of[k] < fewest) fewest = n[k] / rows_of[k];
    }
    CHECK_EQ_INT(pos.rows[0] + pos.rows[1] + pos.rows[2], 48);
    CHECK_EQ_INT(pos.epoch, fewest);   // the fewest passes over one dataset
    // resumed after step 4, a loader gives the same batches as the one that went on
    mx_loader *again, *ref;
    CHECK_EQ_INT(mx_loader_open_blend(paths, weights, 3, 2, 3, 1, 2, 1000, &again, &d), 0);
    CHECK_EQ_INT(mx_loader_open_blend(paths, weights, 3, 2, 3, 1, 2, 1000, &ref, &d), 0);
    if (!again || !ref) return;
    CHECK_EQ_INT(mx_loader_set_pos(again, &at4, &d), 0);
    for (int step = 0; step < 4; step++) mx_loader_next(ref, in, tg, &d);
    same_batches(again, ref, 8, 6);
    // a stream's position does not fit a blend, nor a blend's a stream
    mx_loader_pos stream = {.shard = 0, .offset = 0, .epoch = 0};
    CHECK_EQ_INT(mx_loader_set_pos(again, &stream, &d), MX_EINVAL);
    CHECK_STR_CONTAINS(d.msg, "the resume position is of one stream of shards, the data of a blend of 3 datasets");
    mx_loader *plain;
    CHECK_EQ_INT(mx_loader_open(&paths[2], 1, 2, 3, 0, 1, 1000, &plain, &d), 0);
    if (plain) {
        CHECK_EQ_INT(mx_loader_set_pos(plain, &at4, &d), MX_EINVAL);
        CHECK_STR_CONTAINS(d.msg, "the resume position is of a blend of 3 datasets, the data of one stream of shards");
        mx_loader_close(plain);
    }
    mx_loader_rewind(again);
    mx_loader_get_pos(again, &pos);
    CHECK_EQ_INT(pos.n_datasets, 3);
    CHECK_EQ_INT(pos.rows[0] + pos.rows[1] + pos.rows[2], 0);
    mx_loader_close(again);
    mx_loader_close(ref);
    mx_loader_close(r[0]);
    mx_loader_close(r[1]);
    // many shards (past the first allocation of the shard list) behind a second dataset's
    // pattern: with one dataset of weight 1 the rows go through them in order, 2 a shard
    char many[300];
    for (int k = 0; k < 10; k++) {
        snprintf(many, sizeof many, "blend_many%d.bin", k);
        iota_shard(many, 7, 1000 + 100 * k);
    }
    snprintf(many, sizeof many, "%s/blend_many?.bin", mxt_tmpdir());
    const char *two[2] = {mxt_tmp_path("blend1.bin"), many};
    const double only_second[2] = {1e-300, 1};
    CHECK_EQ_INT(mx_loader_open_blend(two, only_second, 2, 1, 3, 0, 1, 2000, &one, &d), 0);
    if (one) {
        CHECK_EQ_INT(mx_loader_shard_count(one), 11);
        for (int row = 0, seen_first = 0; row < 22; row++) {
            int32_t x[3], y[3];
            CHECK_EQ_INT(mx_loader_next(one, x, y, &d), 0);
            if (x[0] == 300) {   // the first dataset's one row, early in the stream
                seen_first++;
                CHECK_EQ_INT(seen_first, 1);
                row--;
                continue;
            }
            CHECK_EQ_INT(x[0], 1000 + 100 * (row / 2 % 10) + 3 * (row % 2));
        }
        mx_loader_close(one);
    }
    // errors: a weight that is not > 0, a shard without one row
    const double bad_w[3] = {1, 0, 1};
    CHECK_EQ_INT(mx_loader_open_blend(paths, bad_w, 3, 2, 3, 0, 1, 1000, &one, &d), MX_EINVAL);
    CHECK_STR_CONTAINS(d.msg, "dataset 1 has weight 0 (allowed: a number > 0)");
    const char *tiny[1] = {iota_shard("blend_tiny.bin", 3, 0)};
    CHECK_EQ_INT(mx_loader_open_blend(tiny, weights, 1, 2, 3, 0, 1, 1000, &one, &d), MX_EINVAL);
    CHECK(one == NULL);
    CHECK_STR_CONTAINS(d.msg, "blend_tiny.bin: shard has 3 tokens, too few for one row (allowed: at least seq_length+1 = 3+1 = 4 tokens)");
}

/* The documented permutation, written out again: splitmix64's finaliser, 4 Feistel rounds
 * on halves of h bits (4^h >= n), walked until below n. */
static uint64_t mix_again(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static int64_t permute_again(int64_t k, int64_t n, uint64_t key) {
    if (n <= 1) return k;
    int h = 1;
    while (((int64_t)1 << (2 * h)) < n) h++;
    uint64_t x = (uint64_t)k, m = ((uint64_t)1 << h) - 1;
    for (;;) {
        uint64_t a = x >> h, b = x & m;
        for (uint64_t r = 1; r <= 4; r++) {
            uint64_t t = a ^ (mix_again(key ^ r * 0x9E3779B97F4A7C15ull ^ b) & m);
            a = b, b = t;
        }
        x = (a << h) | b;
        if (x < (uint64_t)n) return (int64_t)x;
    }
}

static void test_shuffle(void) {
    // a bijection of [0, n) for every n and key, and the documented function
    static const int64_t sizes[] = {1, 2, 3, 4, 5, 7, 16, 17, 100, 1000, 4097};
    bool *hit = calloc(4097, sizeof *hit);
    if (!hit) return;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        for (uint64_t key = 0; key < 3; key++) {
            int64_t n = sizes[i], bad = 0;
            uint64_t k_key = mix_again(key * 977 + 1);
            memset(hit, 0, 4097 * sizeof *hit);
            for (int64_t k = 0; k < n; k++) {
                int64_t p = mx_loader_permute(k, n, k_key);
                if (p < 0 || p >= n || hit[p] || p != permute_again(k, n, k_key)) bad++;
                else hit[p] = true;
            }
            if (bad) mxt_fail(__FILE__, __LINE__, "n %lld key %llu: %lld bad values", (long long)n,
                              (unsigned long long)key, (long long)bad);
        }
    free(hit);
    CHECK_EQ_INT((long long)mx_loader_shuffle_key(7, 2, 5),
                 (long long)mix_again(mix_again(mix_again(7) ^ 3) ^ 6));
    // a shuffled stream of two shards (one dataset): every row once a pass, in another
    // order each pass, the ranks' rows the stream's; 4 + 2 rows of T 3
    const char *paths[2] = {iota_shard("shuf0.bin", 13, 100), iota_shard("shuf1.bin", 8, 200)};
    char p0[300], p1[300];
    snprintf(p0, sizeof p0, "%s", paths[0]);
    snprintf(p1, sizeof p1, "%s", paths[1]);
    const char *both[2] = {p0, p1};
    mx_loader *one, *r[2], *plain;
    mx_diag d;
    CHECK_EQ_INT(mx_loader_open_blend(both, NULL, 2, 1, 3, 0, 1, 1000, &one, &d), 0);
    for (int k = 0; k < 2; k++) CHECK_EQ_INT(mx_loader_open_blend(both, NULL, 2, 1, 3, k, 2, 1000, &r[k], &d), 0);
    if (!one || !r[0] || !r[1]) return;
    CHECK_EQ_INT(mx_loader_shuffle(one, 42, &d), 0);
    for (int k = 0; k < 2; k++) CHECK_EQ_INT(mx_loader_shuffle(r[k], 42, &d), 0);
    static const int32_t rows[6] = {100, 103, 106, 109, 200, 203};   // in order
    int32_t order[2][6];
    for (int pass = 0; pass < 2; pass++) {
        bool seen[6] = {false};
        for (int j = 0; j < 6; j++) {
            int32_t x[3], y[3];
            CHECK_EQ_INT(mx_loader_next(one, x, y, &d), 0);
            int want = (int)permute_again(j, 6, mx_loader_shuffle_key(42, 0, pass));
            CHECK_EQ_INT(x[0], rows[want]);
            CHECK_EQ_INT(y[2], rows[want] + 3);
            order[pass][j] = x[0];
            if (want >= 0 && want < 6) seen[want] = true;
        }
        for (int j = 0; j < 6; j++) CHECK(seen[j]);
    }
    CHECK(memcmp(order[0], order[1], sizeof order[0]) != 0);   // another order the next pass
    CHECK(memcmp(order[0], rows, sizeof rows) != 0);           // not the file's order
    for (int step = 0; step < 6; step++) {                     // 2 ranks x 1 row: the same stream
        int32_t x[3], y[3];
        for (int k = 0; k < 2; k++) {
            CHECK_EQ_INT(mx_loader_next(r[k], x, y, &d), 0);
            CHECK_EQ_INT(x[0], order[step / 3][(2 * step + k) % 6]);
        }
    }
    CHECK_EQ_INT(mx_loader_open(both, 2, 1, 3, 0, 1, 1000, &plain, &d), 0);
    if (plain) {
        CHECK_EQ_INT(mx_loader_shuffle(plain, 42, &d), MX_EINVAL);
        CHECK_STR_CONTAINS(d.msg, "only a blend's rows can be shuffled");
        mx_loader_close(plain);
    }
    mx_loader_close(one);
    mx_loader_close(r[0]);
    mx_loader_close(r[1]);
}

static void test_glob(void) {
    const char *dir = mxt_tmp_path("globdir");
    mkdir(dir, 0777);
    /* created out of order; a val shard and a non-matching name beside them */
    iota_shard("globdir/train_000002.bin", 9, 300);
    iota_shard("globdir/train_000000.bin", 9, 100);
    iota_shard("globdir/train_000001.bin", 9, 200);
    iota_shard("globdir/val_000000.bin", 9, 900);
    char pattern[600];
    snprintf(pattern, sizeof pattern, "%s/train_*.bin", dir);
    const char *pp = pattern;
    mx_loader *l;
    mx_diag d;
    CHECK_EQ_INT(mx_loader_open(&pp, 1, 1, 4, 0, 1, 1000, &l, &d), 0);
    if (!l) return;
    CHECK_EQ_INT(mx_loader_shard_count(l), 3);
    CHECK_STR_CONTAINS(mx_loader_shard_path(l, 0), "train_000000.bin");
    CHECK_STR_CONTAINS(mx_loader_shard_path(l, 2), "train_000002.bin");
    int32_t in[4], tg[4];
    for (int s = 0; s < 3; s++) {
        CHECK_EQ_INT(mx_loader_next(l, in, tg, &d), 0);
        CHECK_EQ_INT(in[0], 100 * (s + 1));
        CHECK_EQ_INT(mx_loader_next(l, in, tg, &d), 0); /* offset 4: 4+5 = 9 */
        CHECK_EQ_INT(in[0], 100 * (s + 1) + 4);
    }
    mx_loader_close(l);
    snprintf(pattern, sizeof pattern, "%s/test_*.bin", dir);
    CHECK_EQ_INT(mx_loader_open(&pp, 1, 1, 4, 0, 1, 1000, &l, &d), MX_EINVAL);
    CHECK_STR_CONTAINS(d.msg, "test_*.bin: no file matches this pattern");
}

static void test_loader_errors(void) {
    const char *good = iota_shard("good.bin", 40, 0);
    uint16_t t[3] = {1, 2, 3};
    const char *bad = raw_shard("badtok.bin", 20240520, 1, 3, (uint16_t[]){1, 999, 3}, 6);
    (void)t;
    mx_loader *l = (mx_loader *)1;
    mx_diag d;
    const char *two[2] = {good, bad};
    CHECK_EQ_INT(mx_loader_open(two, 2, 1, 2, 0, 1, 500, &l, &d), MX_EFORMAT);
    CHECK(l == NULL);
    CHECK_STR_CONTAINS(d.msg, "badtok.bin: token 999 at index 1 is out of range (allowed: 0 to 499 for vocab_size 500)");
    const char *missing[2] = {good, mxt_tmp_path("gone.bin")};
    CHECK_EQ_INT(mx_loader_open(missing, 2, 1, 2, 0, 1, 500, &l, &d), MX_EIO);
    CHECK_STR_CONTAINS(d.msg, "gone.bin: cannot open");
    CHECK_EQ_INT(mx_loader_open(&good, 1, 0, 2, 0, 1, 500, &l, &d), MX_EINVAL);
    CHECK_STR_CONTAINS(d.msg, "batch 0 x 2 (allowed: B >= 1 and T >= 1)");
    CHECK_EQ_INT(mx_loader_open(&good, 1, 1, 2, 2, 2, 500, &l, &d), MX_EINVAL);
    CHECK_STR_CONTAINS(d.msg, "rank 2 of world 2 (allowed: world >= 1, 0 <= rank < world)");
    CHECK_EQ_INT(mx_loader_open(&good, 1, 1, 2, 0, 0, 500, &l, &d), MX_EINVAL);
    CHECK_EQ_INT(mx_loader_open(&good, 1, 1 << 16, 1 << 16, 0, 1, 500, &l, &d), MX_EINVAL);
    CHECK_STR_CONTAINS(d.msg, "more than a shard can hold");
    CHECK_EQ_INT(mx_loader_open(&good, 0, 1, 2, 0, 1, 500, &l, &d), MX_EINVAL);
    CHECK_EQ_INT(mx_loader_open(&good, 1, 1, 2, 0, 1, -3, &l, &d), MX_EINVAL);
    CHECK_STR_CONTAINS(d.msg, "vocab_size -3 is out of range");
    /* a shard with exactly B*T+1 tokens is enough */
    const char *tiny = iota_shard("tiny.bin", 5, 0);
    CHECK_EQ_INT(mx_loader_open(&tiny, 1, 2, 2, 0, 1, 500, &l, &d), 0);
    int32_t in[4], tg[4];
    CHECK_EQ_INT(mx_loader_next(l, in, tg, &d), 0);
    CHECK_EQ_INT(tg[3], 4);
    mx_loader_close(l);
}

static void test_loader_u32(void) {
    uint32_t t[9];
    for (int i = 0; i < 9; i++) t[i] = 70000u + (uint32_t)i;
    const char *p = mxt_tmp_path("l32.bin");
    mx_diag d;
    CHECK_EQ_INT(mx_shard_write(p, t, 9, false, &d), 0);
    mx_loader *l;
    CHECK_EQ_INT(mx_loader_open(&p, 1, 2, 2, 0, 1, 128256, &l, &d), 0);
    if (!l) return;
    int32_t in[4], tg[4];
    CHECK_EQ_INT(mx_loader_next(l, in, tg, &d), 0);
    CHECK_EQ_INT(in[0], 70000);
    CHECK_EQ_INT(in[3], 70003);
    CHECK_EQ_INT(tg[3], 70004);
    CHECK_EQ_INT(mx_loader_next(l, in, tg, &d), 0);
    CHECK_EQ_INT(in[0], 70004);
    CHECK_EQ_INT(tg[3], 70008);
    mx_loader_close(l);
    CHECK_EQ_INT(mx_loader_open(&p, 1, 2, 2, 0, 1, 70005, &l, &d), MX_EFORMAT);
    CHECK_STR_CONTAINS(d.msg, "token 70005 at index 5 is out of range");
}

/* ---- prepare ------------------------------------------------------------------------ */


/* The shard's tokens as a vector (count in *n); NULL on error. */
static uint32_t *load(const char *path, int64_t *n) {
    uint32_t *t = NULL;
    mx_diag d;
    if (mx_shard_read(path, MX_PREPARE_VOCAB, &t, n, &d) != 0) {
        printf("    %s\n", d.msg);
        return NULL;
    }
    return t;
}

static void check_tokens(const char *path, const char *expect_text) {
    /* expect_text: '|' stands for the EOT token 256, every other byte for itself */
    int64_t n;
    uint32_t *t = load(path, &n);
    CHECK(t != NULL);
    if (!t) return;
    size_t m = strlen(expect_text);
    CHECK_EQ_INT(n, (int64_t)m);
    for (size_t i = 0; i < m && i < (size_t)n; i++) {
        uint32_t want = expect_text[i] == '|' ? 256u : (unsigned char)expect_text[i];
        if (t[i] != want) {
            CHECK_EQ_INT(t[i], want);
            printf("    at token %zu of %s\n", i, path);
            break;
        }
    }
    free(t);
}

static void test_prepare_fortune(void) {
    const char *in = mxt_tmp_path("f1.txt");
    mxt_write_text(in, "a\n%\nbb\n%\n  \n%\nccc\n%\n");
    char out[600];
    snprintf(out, sizeof out, "%s/pf_out", mxt_tmpdir());
    mx_prepare_opts o;
    mx_prepare_defaults(&o);
    o.fortune = true;
    o.val_fraction = 0;
    o.out_dir = out;
    mx_prepare_stats st;
    mx_diag d;
    int rc = mx_prepare(&in, 1, &o, &st, &d);
    CHECK_EQ_INT(rc, 0);
    if (rc) printf("    %s\n", d.msg);
    CHECK_EQ_INT(st.files, 1);
    CHECK_EQ_INT(st.documents, 3); /* the blank entry is skipped */
    CHECK_EQ_INT(st.train_documents, 3);
    CHECK_EQ_INT(st.val_documents, 0);
    CHECK_EQ_INT(st.train_tokens, 12);
    CHECK_EQ_INT(st.train_shards, 1);
    CHECK_EQ_INT(st.val_shards, 0);
    char p[700];
    snprintf(p, sizeof p, "%s/train_000000.bin", out);
    check_tokens(p, "|a\n|bb\n|ccc\n");
    snprintf(p, sizeof p, "%s/val_000000.bin", out);
    CHECK(!exists(p));
    /* counts: EOT 3, '\n' 3, 'c' 3, 'b' 2, 'a' 1 of 12 (hand-counted) */
    double h = -(3 * (3 / 12.0) * log2(3 / 12.0) + (2 / 12.0) * log2(2 / 12.0) + (1 / 12.0) * log2(1 / 12.0));
    CHECK_NEAR(st.entropy_bits, h, 1e-12);
    CHECK_NEAR(st.entropy_nats, h * log(2.0), 1e-12);
    CHECK_EQ_INT(mxt_count_entries(out), 1); /* no temporary files left */

    /* Without --fortune the whole file is one document, separators included. */
    o.fortune = false;
    CHECK_EQ_INT(mx_prepare(&in, 1, &o, &st, &d), 0);
    snprintf(p, sizeof p, "%s/train_000000.bin", out);
    check_tokens(p, "|a\n%\nbb\n%\n  \n%\nccc\n%\n");
}

/* Documents 4 and 14 of 20 go to validation with fraction 0.1:
 * floor((i+1)*0.1 + 0.5) > floor(i*0.1 + 0.5) exactly at i = 4 and i = 14. */
static void test_prepare_val_split_and_shards(void) {
    char text[400] = "", train_expect[400] = "", val_expect[64] = "";
    for (int i = 0; i < 20; i++) {
        char doc[16];
        snprintf(doc, sizeof doc, "d%02d\n", i);
        strcat(text, doc);
        strcat(text, "%\r\n"); /* a CRLF separator counts too */
        strcat((i == 4 || i == 14) ? val_expect : train_expect, "|");
        strcat((i == 4 || i == 14) ? val_expect : train_expect, doc);
    }
    const char *in = mxt_tmp_path("f20.txt");
    mxt_write_text(in, text);
    char out[600];
    snprintf(out, sizeof out, "%s/pv_out", mxt_tmpdir());
    mkdir(out, 0777);
    /* stale shards of an earlier, larger run */
    char p[700];
    snprintf(p, sizeof p, "%s/train_000004.bin", out);
    mxt_write_text(p, "stale");
    snprintf(p, sizeof p, "%s/train_000005.bin", out);
    mxt_write_text(p, "stale");
    snprintf(p, sizeof p, "%s/val_000001.bin", out);
    mxt_write_text(p, "stale");
    mx_prepare_opts o;
    mx_prepare_defaults(&o);
    o.fortune = true;
    o.val_fraction = 0.1;
    o.out_dir = out;
    o.shard_tokens = 20; /* 18 docs * 5 tokens = 90 train tokens: 5 shards; val 10: 1 shard */
    mx_prepare_stats st;
    mx_diag d;
    int rc = mx_prepare(&in, 1, &o, &st, &d);
    CHECK_EQ_INT(rc, 0);
    if (rc) printf("    %s\n", d.msg);
    CHECK_EQ_INT(st.documents, 20);
    CHECK_EQ_INT(st.train_documents, 18);
    CHECK_EQ_INT(st.val_documents, 2);
    CHECK_EQ_INT(st.train_tokens, 90);
    CHECK_EQ_INT(st.val_tokens, 10);
    CHECK_EQ_INT(st.train_shards, 5);
    CHECK_EQ_INT(st.val_shards, 1);
    /* the train shards concatenate to the expected stream */
    char got[400] = "";
    for (int s = 0; s < 5; s++) {
        snprintf(p, sizeof p, "%s/train_%06d.bin", out, s);
        int64_t n;
        uint32_t *t = load(p, &n);
        CHECK(t != NULL);
        if (!t) return;
        CHECK_EQ_INT(n, s < 4 ? 20 : 10);
        size_t o2 = strlen(got);
        for (int64_t i = 0; i < n; i++) got[o2 + (size_t)i] = t[i] == 256 ? '|' : (char)t[i];
        got[o2 + (size_t)n] = '\0';
        free(t);
    }
    CHECK_STR_EQ(got, train_expect);
    snprintf(p, sizeof p, "%s/val_000000.bin", out);
    check_tokens(p, val_expect);
    snprintf(p, sizeof p, "%s/train_000005.bin", out); /* removed: it followed train_000004 */
    CHECK(!exists(p));
    snprintf(p, sizeof p, "%s/val_000001.bin", out);
    CHECK(!exists(p));
    CHECK_EQ_INT(mxt_count_entries(out), 6);
}

static void test_prepare_directory(void) {
    char dir[600];
    snprintf(dir, sizeof dir, "%s/corpus", mxt_tmpdir());
    mkdir(dir, 0777);
    char p[700];
    snprintf(p, sizeof p, "%s/b.txt", dir);
    mxt_write_text(p, "BB");
    snprintf(p, sizeof p, "%s/a.txt", dir);
    mxt_write_text(p, "A");
    snprintf(p, sizeof p, "%s/.hidden", dir);
    mxt_write_text(p, "H");
    snprintf(p, sizeof p, "%s/x.dat", dir);
    mxt_write_text(p, "X");
    snprintf(p, sizeof p, "%s/sub", dir);
    mkdir(p, 0777);
    char out[600];
    snprintf(out, sizeof out, "%s/pd_out/nested", mxt_tmpdir()); /* created, parents too */
    mx_prepare_opts o;
    mx_prepare_defaults(&o);
    o.val_fraction = 0;
    o.out_dir = out;
    mx_prepare_stats st;
    mx_diag d;
    const char *in = dir;
    CHECK_EQ_INT(mx_prepare(&in, 1, &o, &st, &d), 0);
    CHECK_EQ_INT(st.files, 3);
    snprintf(p, sizeof p, "%s/train_000000.bin", out);
    check_tokens(p, "|A|BB|X");
    o.fortune = true; /* skips *.dat */
    CHECK_EQ_INT(mx_prepare(&in, 1, &o, &st, &d), 0);
    CHECK_EQ_INT(st.files, 2);
    check_tokens(p, "|A|BB");
}

static void test_prepare_errors(void) {
    const char *good = mxt_tmp_path("good.txt");
    mxt_write_text(good, "hello\n");
    char out[600];
    snprintf(out, sizeof out, "%s/pe_out", mxt_tmpdir());
    mx_prepare_opts o;
    mx_prepare_defaults(&o);
    o.out_dir = out;
    mx_prepare_stats st;
    mx_diag d;
    /* a missing input: an error, and no output at all (not even the directory) */
    const char *two[2] = {good, mxt_tmp_path("missing.txt")};
    CHECK_EQ_INT(mx_prepare(two, 2, &o, &st, &d), MX_EIO);
    CHECK_STR_CONTAINS(d.msg, "missing.txt: cannot open (No such file or directory)");
    CHECK(!exists(out));
    CHECK_EQ_INT(st.documents, 0);
    const char *empty = mxt_tmp_path("empty.txt");
    mxt_write_text(empty, " \n\n");
    CHECK_EQ_INT(mx_prepare(&empty, 1, &o, &st, &d), MX_EINVAL);
    CHECK_STR_EQ(d.msg, "prepare: the input file holds no documents (it is empty or blank)");
    const char *empties[2] = {empty, empty};
    CHECK_EQ_INT(mx_prepare(empties, 2, &o, &st, &d), MX_EINVAL);
    CHECK_STR_EQ(d.msg, "prepare: the 2 input files hold no documents (all empty or blank)");
    o.val_fraction = 1;
    CHECK_EQ_INT(mx_prepare(&good, 1, &o, &st, &d), MX_EINVAL);
    CHECK_STR_CONTAINS(d.msg, "val fraction 1 is out of range (allowed: 0 <= fraction < 1)");
    o.val_fraction = 0.9; /* one document: round(0.9) = 1 goes to val, none left */
    CHECK_EQ_INT(mx_prepare(&good, 1, &o, &st, &d), MX_EINVAL);
    CHECK_STR_EQ(d.msg, "prepare: the only document went to validation (allowed: a smaller --val-fraction)");
    CHECK(!exists(out));
    o.val_fraction = 0.05;
    char edir[600];
    snprintf(edir, sizeof edir, "%s/emptydir", mxt_tmpdir());
    mkdir(edir, 0777);
    const char *ed = edir;
    CHECK_EQ_INT(mx_prepare(&ed, 1, &o, &st, &d), MX_EINVAL);
    CHECK_STR_CONTAINS(d.msg, "emptydir: the directory has no input files");
    /* the output directory is a file */
    o.out_dir = good;
    CHECK_EQ_INT(mx_prepare(&good, 1, &o, &st, &d), MX_EIO);
    CHECK_STR_CONTAINS(d.msg, "good.txt: is not a directory (allowed: an output directory)");
    o.out_dir = out;
    o.shard_tokens = 0;
    CHECK_EQ_INT(mx_prepare(&good, 1, &o, &st, &d), MX_EINVAL);
    CHECK_STR_CONTAINS(d.msg, "shard size 0 tokens");
}

/* The real default corpus, when the fortunes package is installed: prepare runs, every
 * token is < 257, and the document count matches a separate count of "%" entries. */
static void test_prepare_real_fortunes(void) {
    const char *dir = "/usr/share/games/fortunes";
    const char *file = "/usr/share/games/fortunes/fortunes";
    if (!exists(file)) {
        printf("    (skipped: %s not installed)\n", file);
        return;
    }
    (void)dir;
    FILE *f = fopen(file, "rb");
    char line[4096];
    int entries = 0, nonblank = 0;
    while (fgets(line, sizeof line, f)) {
        if (strcmp(line, "%\n") == 0) {
            entries += nonblank > 0;
            nonblank = 0;
        } else if (strspn(line, " \t\r\n") != strlen(line)) {
            nonblank++;
        }
    }
    entries += nonblank > 0;
    fclose(f);
    char out[600];
    snprintf(out, sizeof out, "%s/real_out", mxt_tmpdir());
    mx_prepare_opts o;
    mx_prepare_defaults(&o);
    o.fortune = true;
    o.out_dir = out;
    mx_prepare_stats st;
    mx_diag d;
    CHECK_EQ_INT(mx_prepare(&file, 1, &o, &st, &d), 0);
    CHECK_EQ_INT(st.documents, entries);
    CHECK(st.val_documents > 0);
    char p[700];
    snprintf(p, sizeof p, "%s/train_000000.bin", out);
    int64_t n;
    uint32_t *t = load(p, &n);
    CHECK(t != NULL);
    CHECK_EQ_INT(n, st.train_tokens);
    free(t);
    CHECK(st.entropy_bits > 3 && st.entropy_bits < 6);
}

static const mxt_test tests[] = {
    {"roundtrip_u16", test_roundtrip_u16},
    {"roundtrip_u32", test_roundtrip_u32},
    {"bad_shards", test_bad_shards},
    {"vocab_check_late_index", test_vocab_check_late_index},
    {"write_errors", test_write_errors},
    {"batches_hand_computed", test_batches_hand_computed},
    {"wrap_across_shards", test_wrap_across_shards},
    {"rank_slicing", test_rank_slicing},
    {"resume", test_resume},
    {"blend", test_blend},
    {"shuffle", test_shuffle},
    {"glob", test_glob},
    {"loader_errors", test_loader_errors},
    {"loader_u32", test_loader_u32},
    {"prepare_fortune", test_prepare_fortune},
    {"prepare_val_split_and_shards", test_prepare_val_split_and_shards},
    {"prepare_directory", test_prepare_directory},
    {"prepare_errors", test_prepare_errors},
    {"prepare_real_fortunes", test_prepare_real_fortunes},
};

int main(int argc, char **argv) { return MXT_RUN(tests, argc, argv); }
