/* mxtrain — token data (SPEC §8): llm.c `.bin` shards, a batch loader over them, and the
 * byte-level `prepare` step that makes shards from text. See docs/files.md.
 *
 * Shard layout: a 1024-byte header of 256 little-endian int32 — [0] magic, [1] version,
 * [2] token count, the rest 0 — then exactly `count` little-endian tokens:
 *   magic 20240520, version 1: uint16 tokens (llm.c's GPT-2 shards)
 *   magic 20240801, version 7: uint32 tokens (llm.c's Llama 3 shards)
 * so data prepared for llm.c trains here unchanged, and shards written here load in llm.c.
 */
#ifndef MXTRAIN_TOKENS_H
#define MXTRAIN_TOKENS_H

#include <stdbool.h>
#include <stdint.h>

#include "mxtrain/error.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MX_SHARD_HEADER_BYTES 1024
#define MX_SHARD_MAGIC_U16 20240520
#define MX_SHARD_VERSION_U16 1
#define MX_SHARD_MAGIC_U32 20240801
#define MX_SHARD_VERSION_U32 7
/* Most tokens one shard can hold: the count is an int32. */
#define MX_SHARD_MAX_TOKENS 2147483647ll

/* ---- Shards --------------------------------------------------------------------------- */

typedef struct {
    int width;      /* bytes per token: 2 (uint16) or 4 (uint32) */
    int64_t count;  /* tokens in the shard, >= 1 */
} mx_shard_info;

/* Check a shard's header against its size without reading the tokens. Errors, each one line
 * naming the file: MX_EIO cannot open / a directory / read failure; MX_EFORMAT shorter than
 * the 1024-byte header, unknown magic/version pair (the message lists the allowed pairs),
 * count 0 or negative, file size != 1024 + count * width (the expected and actual sizes,
 * "truncated" or "trailing bytes"). */
int mx_shard_inspect(const char *path, mx_shard_info *info, mx_diag *diag);

/* Read a whole shard into a malloc'ed array (*tokens, *count; free with free()), checked as
 * above and every token < vocab_size (MX_EFORMAT naming the first offending index, its value
 * and vocab_size). vocab_size: 1 to 2^31-1 (MX_EINVAL otherwise). */
int mx_shard_read(const char *path, int64_t vocab_size, uint32_t **tokens, int64_t *count, mx_diag *diag);

/* Write a shard atomically (temporary file beside path, fsync, rename; nothing is left at
 * path on failure). uint16 when every token is < 65536 and force_u32 is false, else uint32.
 * count: 1 to MX_SHARD_MAX_TOKENS (MX_EINVAL otherwise). */
int mx_shard_write(const char *path, const uint32_t *tokens, int64_t count, bool force_u32, mx_diag *diag);

/* ---- Batch loader ------------------------------------------------------------------- */

/* Yields batches of B*T next-token pairs from a list of shards, in llm.c's order.
 *
 * A global step covers world*B*T+1 consecutive tokens of one shard starting at the current
 * offset p: rank r reads the B*T+1 tokens at p + r*B*T, and its inputs are the first B*T of
 * them, its targets the last B*T (row-major (B, T)). Then p advances by world*B*T. When
 * fewer than world*B*T+1 tokens remain from p, the rest of the shard is skipped and the next
 * shard starts at 0; after the last shard the first comes again and the epoch counter goes
 * up. With world = 1 this is plain llm.c: B*T+1 tokens per batch, p advancing by B*T. */
typedef struct mx_loader mx_loader;

/* Where the next batch comes from (the same on every rank). */
#define MX_LOADER_MAX_DATASETS 64
typedef struct {
    int64_t shard;  /* index into the sorted shard list */
    int64_t offset; /* token offset of the global step in that shard */
    int64_t epoch;  /* completed passes over all shards; of a blend, the fewest over one dataset */
    int n_datasets; /* a blend (mx_loader_open_blend): its datasets; 0 otherwise */
    int64_t rows[MX_LOADER_MAX_DATASETS]; /* a blend: the rows taken from each dataset so far */
} mx_loader_pos;

/* Open a loader. paths: n_paths entries, each a shard path or a glob(3) pattern (an entry
 * with *, ? or [) expanded to its matches sorted by name; the entries' shards are used in
 * the order given. Every shard is validated up front (mx_shard_read's checks, tokens <
 * vocab_size included), so a bad shard never fails a run halfway. Errors: MX_EINVAL B, T,
 * rank, world or vocab_size out of range, a pattern that matches nothing, a shard with fewer
 * than world*B*T+1 tokens (naming the shard and both sizes); the shard errors above. */
int mx_loader_open(const char *const *paths, int n_paths, int B, int T, int rank, int world, int64_t vocab_size,
                   mx_loader **out, mx_diag *diag);
/* A blend of datasets, Megatron-LM's weighted data_path: paths[d] (a shard or a glob) is
 * dataset d, drawn from in proportion weights[d] (> 0) one row at a time. The rows of all
 * ranks form one stream: row g of it (global step s, rank r, batch row b: g = (s world + r)
 * B + b) comes from the dataset d with the largest w_d max(g, 1) - n_d, n_d the rows taken
 * from d before g, w normalised to sum 1, the lowest d on ties (Megatron's
 * build_blending_indices), and is that dataset's row n_d: T+1 tokens at offset k T of one of
 * its shards, its shards holding (tokens - 1) / T rows each, in order, again from the first
 * after the last. Every shard needs T+1 tokens. The position is the rows taken per dataset. */
int mx_loader_open_blend(const char *const *paths, const double *weights, int n_datasets, int B, int T, int rank,
                         int world, int64_t vocab_size, mx_loader **out, mx_diag *diag);
/* With weights NULL, paths[0 .. n_datasets) are one dataset of weight 1: its rows in the
 * blend's way (what mx_loader_shuffle needs of a single stream of shards). */

/* A blend's rows in a keyed order (data.shuffle): dataset d's row k of pass e is its row
 * mx_loader_permute(k, R_d, mx_loader_shuffle_key(seed, d, e)), R_d its rows, a new order
 * each pass. MX_EINVAL for a loader of mx_loader_open. */
int mx_loader_shuffle(mx_loader *loader, uint64_t seed, mx_diag *diag);
/* The permutation: a 4-round Feistel network on [0, 4^h) (4^h the least power of 4 >= n,
 * halves of h bits; round r = 1..4 maps (L, R) to (R, L ^ (mix(key ^ r 0x9E3779B97F4A7C15 ^
 * R) & (2^h - 1))), mix splitmix64's finaliser), applied again until it lands below n. A
 * bijection of [0, n) for every key; k itself for n <= 1. */
int64_t mx_loader_permute(int64_t k, int64_t n, uint64_t key);
/* The key of dataset d's pass e: mix(mix(mix(seed) ^ (d + 1)) ^ (e + 1)). */
uint64_t mx_loader_shuffle_key(uint64_t seed, int dataset, int64_t epoch);
void mx_loader_close(mx_loader *loader);
/* Back to the first batch (a blend: no rows taken). */
void mx_loader_rewind(mx_loader *loader);

/* Fill inputs and targets, both (B, T) int32, with the next batch and advance.
 * MX_EIO/MX_EFORMAT only if a shard changed on disk after opening. */
int mx_loader_next(mx_loader *loader, int32_t *inputs, int32_t *targets, mx_diag *diag);

void mx_loader_get_pos(const mx_loader *loader, mx_loader_pos *pos);
/* Resume at pos. MX_EINVAL (naming the shard and sizes) unless 0 <= shard < shard count,
 * epoch >= 0 and 0 <= offset <= that shard's token count. A position with fewer than
 * world*B*T+1 tokens left in its shard (saved by a job of fewer ranks or smaller batches)
 * moves to the start of the next shard, as mx_loader_next does. */
int mx_loader_set_pos(mx_loader *loader, const mx_loader_pos *pos, mx_diag *diag);
/* A blend's position must be of a blend of as many datasets, its rows >= 0 (MX_EINVAL). */

int mx_loader_shard_count(const mx_loader *loader);
const char *mx_loader_shard_path(const mx_loader *loader, int shard);
int64_t mx_loader_shard_tokens(const mx_loader *loader, int shard);
/* Global steps in one pass over every shard. */
int64_t mx_loader_steps_per_epoch(const mx_loader *loader);

/* ---- prepare: byte-level tokenization ------------------------------------------------ */

/* Each byte is a token 0..255; every document is preceded by the end-of-text token 256
 * (as llm.c's preprocessing does), so a model needs vocab_size >= 257. */
#define MX_PREPARE_EOT 256
#define MX_PREPARE_VOCAB 257

typedef struct {
    bool fortune;          /* split files into documents at lines that are exactly "%" */
    double val_fraction;   /* fraction of documents for validation, in [0, 1); default 0.05 */
    const char *out_dir;   /* created if missing; default "data" */
    int64_t shard_tokens;  /* most tokens per output shard; default 100000000 */
    /* A Hugging Face tokenizer.json (or a directory holding one) to encode with instead of
     * bytes; NULL (the default) for byte-level tokens. */
    const char *tokenizer;
    /* With a tokenizer: the end-of-document token's text; NULL for the tokenizer's EOS
     * (tokenizer_config.json's eos_token). */
    const char *eod;
    /* With a tokenizer, called now and then while documents are encoded (may be NULL). */
    void (*progress)(int64_t done_bytes, int64_t total_bytes, double seconds, void *arg);
    void *progress_arg;
} mx_prepare_opts;

typedef struct {
    int64_t files;                            /* input files read */
    int64_t documents;                        /* non-empty documents found */
    int64_t train_documents, val_documents;
    int64_t train_tokens, val_tokens;         /* EOT tokens included */
    int train_shards, val_shards;             /* files written: train_NNNNNN.bin, val_NNNNNN.bin */
    double entropy_bits, entropy_nats;        /* unigram entropy of the training tokens, per token */
    int64_t vocab_size;                       /* the tokens' vocabulary: 257, or the tokenizer's */
    int64_t eod;                              /* the end-of-document token */
    int token_bytes;                          /* 2 (uint16 shards) or 4 (uint32: vocabularies > 65536) */
    int64_t text_bytes;                       /* bytes of the documents encoded */
    double encode_seconds;                    /* time spent encoding them */
} mx_prepare_stats;

void mx_prepare_defaults(mx_prepare_opts *opts);

/* Tokenize inputs (files, or directories: their regular files, sorted by name, skipping
 * names that start with "."; with opts->fortune also the *.dat and *.u8 index files) and
 * write OUT_DIR/train_000000.bin ... and OUT_DIR/val_000000.bin ... as uint16 shards
 * (uint32 when opts->tokenizer's vocabulary exceeds 65536 tokens). With a tokenizer every
 * document is preceded by the end-of-document token and encoded as Hugging Face's
 * tokenizer.encode(text) would (its post-processor's template included), on all threads.
 * Document i (counting across all inputs in order) goes to validation when
 * floor((i+1)*f + 0.5) > floor(i*f + 0.5), f = val_fraction: round(n*f) documents spread
 * evenly. All inputs are read before anything is written, and shards appear atomically, so
 * on error no output file is created. Shards of an earlier run with higher numbers are
 * removed so that a glob over OUT_DIR sees only this run. Errors: MX_EIO an input cannot
 * be read, the output cannot be written; MX_EINVAL no documents, no training documents,
 * an option out of range, an end-of-document token the tokenizer does not have; the
 * tokenizer's errors (MX_EFORMAT, MX_EUNSUPPORTED, naming its file). */
int mx_prepare(const char *const *inputs, int n_inputs, const mx_prepare_opts *opts, mx_prepare_stats *stats,
               mx_diag *diag);

#ifdef __cplusplus
}
#endif

#endif
