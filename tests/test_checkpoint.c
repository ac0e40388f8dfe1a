/* Checkpoint file writes report the system's reason (trainer_state.json goes through
 * mxi_write_file): a full device, a missing directory; a good write holds the bytes. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "harness.h"
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

static const mxt_test tests[] = {
    {"write_file_reasons", test_write_file_reasons},
};

int main(int argc, char **argv) { return MXT_RUN(tests, argc, argv); }
