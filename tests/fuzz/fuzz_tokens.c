/* Fuzz target: the llm.c token-shard reader (mx_shard_inspect, mx_shard_read) and the batch
 * loader over one shard, checked against the format read here directly from the bytes: a
 * shard that inspects has the size its header says; it reads exactly when every token is
 * below the vocabulary, giving the tokens of the file; the loader's batches are consecutive
 * windows of those tokens (targets = inputs shifted by one). */
#include "fuzz.h"

#include "mxtrain/tokens.h"

enum { B = 2, T = 3 };

static uint32_t token_at(const uint8_t *data, int width, int64_t i) {
    const uint8_t *p = data + MX_SHARD_HEADER_BYTES + i * width;
    return width == 2 ? (uint32_t)(p[0] | p[1] << 8) : (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                                                           (uint32_t)p[3] << 24;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_file(0, data, size);
    mx_shard_info info;
    mx_diag diag = {{0}};
    int rc = mx_shard_inspect(path, &info, &diag);
    fuzz_check_status(rc, &diag);
    uint32_t max_token = 0;
    if (rc == 0) {
        FUZZ_REQUIRE((info.width == 2 || info.width == 4) && info.count >= 1 &&
                     (uint64_t)info.count * (uint64_t)info.width + MX_SHARD_HEADER_BYTES == size);
        for (int64_t i = 0; i < info.count; i++)
            if (token_at(data, info.width, i) > max_token) max_token = token_at(data, info.width, i);
    }
    const int64_t vocabs[3] = {257, 65536, 2147483647};
    int64_t loader_vocab = 0;
    for (int v = 0; v < 3; v++) {
        uint32_t *tok = NULL;
        int64_t count = 0;
        int rc2 = mx_shard_read(path, vocabs[v], &tok, &count, &diag);
        fuzz_check_status(rc2, &diag);
        FUZZ_REQUIRE((rc2 == 0) == (rc == 0 && max_token < vocabs[v]));
        if (rc2 == 0) {
            FUZZ_REQUIRE(count == info.count);
            for (int64_t i = 0; i < count; i++) FUZZ_REQUIRE(tok[i] == token_at(data, info.width, i));
            if (!loader_vocab) loader_vocab = vocabs[v];
        }
        free(tok);
    }
    if (!loader_vocab) return 0;
    mx_loader *l = NULL;
    const char *paths[1] = {path};
    rc = mx_loader_open(paths, 1, B, T, 0, 1, loader_vocab, &l, &diag);
    fuzz_check_status(rc, &diag);
    FUZZ_REQUIRE((rc == 0) == (info.count >= B * T + 1));
    if (rc != 0) return 0;
    int32_t in[B * T], tg[B * T];
    int64_t off = 0;
    for (int step = 0; step < 3; step++) {
        if (off + B * T + 1 > info.count) off = 0;
        rc = mx_loader_next(l, in, tg, &diag);
        fuzz_check_status(rc, &diag);
        FUZZ_REQUIRE(rc == 0);
        for (int k = 0; k < B * T; k++)
            FUZZ_REQUIRE(in[k] == (int32_t)token_at(data, info.width, off + k) &&
                         tg[k] == (int32_t)token_at(data, info.width, off + k + 1));
        off += B * T;
    }
    mx_loader_close(l);
    return 0;
}
