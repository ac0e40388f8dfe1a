/* Checkpoint file writes report the system's reason (trainer_state.json goes through
 * mxi_write_file): a full device, a missing directory; a good write holds the bytes. The
 * checksums of checkpoint tensors: CRC-32's check value, and pieces joined in order give
 * the whole's (what rank 0 does with the ranks' rows); a negative second moment named. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "harness.h"
#include "io/checksum.h"
#include "model/units.h"
#include "train/checkpoint.h"

static void test_write_file_reasons(void) {
    mx_diag diag = {{0}};
    CHECK_EQ_INT(mxi_write_file("/dev/full", "{}\n", 3, &diag), MX_EIO);
    CHECK_STR_CONTAINS(diag.msg, "cannot write '/dev/full' (No space left on device)");
    CHECK_EQ_INT(mxi_write_file("/nonexistent-mxtrain-dir/trainer_state.json", "{}", 2, &diag), MX_EIO);
    CHECK_STR_CONTAINS(diag.msg, "/nonexistent-mxtrain-dir/trainer_state.json' (No such file or directory)");
    char path[] = "/tmp/mxtrain-write-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0) return;
    close(fd);
    CHECK_EQ_INT(mxi_write_file(path, "step 7\n", 7, &diag), MX_OK);
    char buf[16] = {0};
    FILE *f = fopen(path, "rb");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f) fclose(f);
    CHECK_EQ_INT(n, 7);
    CHECK_STR_EQ(buf, "step 7\n");
    unlink(path);
}

static void test_crc32_pieces(void) {
    const char *s = "123456789";
    CHECK_EQ_HEX(mxi_crc32(0, s, 9), 0xcbf43926u);   // CRC-32's published check value
    CHECK_EQ_HEX(mxi_crc32(0, s, 0), 0);
    for (size_t cut = 0; cut <= 9; cut++)   // any split, joined: the whole's
        CHECK_EQ_HEX(mxi_crc32_combine(mxi_crc32(0, s, cut), mxi_crc32(0, s + cut, 9 - cut), 9 - cut), 0xcbf43926u);
    // three pieces, as three ranks' rows
    uint32_t a = mxi_crc32(0, s, 2), b = mxi_crc32(0, s + 2, 3), c = mxi_crc32(0, s + 5, 4);
    CHECK_EQ_HEX(mxi_crc32_combine(mxi_crc32_combine(a, b, 3), c, 4), 0xcbf43926u);
}

static void test_negative_moment(void) {
    mx_diag diag = {{0}};
    const int64_t shape[2] = {3, 4};
    const float rows[4] = {0.0f, -0.0f, 2.5f, -1e-30f};   // elements 4..7: row 1
    CHECK_EQ_INT(mxi_check_nonnegative_part("opt.safetensors", "exp_avg_sq.w", shape, 2, 4, 3, rows, &diag), MX_OK);
    CHECK_EQ_INT(mxi_check_nonnegative_part("opt.safetensors", "exp_avg_sq.w", shape, 2, 4, 4, rows, &diag),
                 MX_EFORMAT);
    CHECK_STR_EQ(diag.msg, "opt.safetensors: tensor 'exp_avg_sq.w' holds -1e-30 at [1, 3] (allowed: values >= 0: a "
                 "second moment is a mean of squares; the file is damaged)");
}

static const mxt_test tests[] = {
    {"write_file_reasons", test_write_file_reasons},
    {"crc32_pieces", test_crc32_pieces},
    {"negative_moment", test_negative_moment},
};

int main(int argc, char **argv) { return MXT_RUN(tests, argc, argv); }
