/* Text samples of a training run (see sample.h). */
#include "train/sample.h"

#include <stdlib.h>
#include <string.h>

#include "core/diag.h"
#include "core/rng.h"
#include "io/text_codec.h"
#include "model/generate.h"

/* How samples are drawn: softmax at temperature 1 over the 40 most probable tokens (llm.c
 * samples at temperature 1; the cut keeps a small model's rare tokens out). */
enum { SAMPLE_TOP_K = 40 };

struct mxi_sampler {
    mxi_infer *inf;
    mxi_text_codec codec;
    int32_t *prompt;   // (n_prompt)
    int n_prompt;
    char *text;        // (cap) the continuation
    size_t len, cap;
};

bool mxi_sample_enabled(const mx_config *c) {
    mxi_text_codec codec;
    return c->training.sample_tokens > 0 && mxi_text_codec_open(&codec, NULL, c->model.vocab_size, NULL) == MX_OK;
}

/* Tokens of the prompt: end-of-text, then its bytes. */
static size_t prompt_tokens(const mx_config *c) {
    return (c->training.sample_prompt ? strlen(c->training.sample_prompt) : 0) + 1;
}

int mxi_sample_check(const mx_config *c, mx_diag *diag) {
    if (!mxi_sample_enabled(c)) return MX_OK;
    size_t n = prompt_tokens(c);
    if (n > (size_t)c->model.max_position_embeddings)
        return mxi_diag(diag, MX_ECONFIG, "training.sample_prompt: %zu bytes and the end-of-text token before them "
                        "exceed model.max_position_embeddings %d (allowed: a shorter prompt)", n - 1,
                        c->model.max_position_embeddings);
    return MX_OK;
}

void mxi_sampler_free(mxi_sampler *s) {
    if (!s) return;
    mxi_infer_free(s->inf);
    free(s->prompt), free(s->text);
    free(s);
}

static int sampler_create(mxi_sampler **out, const mx_config *c, mx_diag *diag) {
    mxi_sampler *s = calloc(1, sizeof *s);
    if (!s) return mxi_diag(diag, MX_ENOMEM, "out of memory for the sampler");
    const char *p = c->training.sample_prompt ? c->training.sample_prompt : "";
    int cap = (int)prompt_tokens(c), rc = mxi_text_codec_open(&s->codec, NULL, c->model.vocab_size, diag);
    long long want = (long long)cap + c->training.sample_tokens;
    int TC = want < c->model.max_position_embeddings ? (int)want : c->model.max_position_embeddings;
    s->cap = (size_t)c->training.sample_tokens * 4 + 1;
    s->prompt = malloc((size_t)cap * sizeof *s->prompt);
    s->text = malloc(s->cap);
    if (!rc && (!s->prompt || !s->text)) rc = mxi_diag(diag, MX_ENOMEM, "out of memory for the sampler");
    if (!rc) rc = mxi_text_encode(&s->codec, p, strlen(p), s->prompt, cap, &s->n_prompt, diag);
    mxi_infer_options o = {.batch = 1, .max_seq = TC, .max_rows = s->n_prompt};
    if (!rc) rc = mxi_infer_create(&c->model, &o, &s->inf, diag);
    if (rc) {
        mxi_sampler_free(s);
        return rc;
    }
    *out = s;
    return MX_OK;
}

static int emit(void *ctx, int seq, int32_t token) {
    (void)seq;
    mxi_sampler *s = ctx;
    char buf[64];
    size_t n = mxi_text_decode(&s->codec, token, buf, sizeof buf);
    if (s->len + n + 1 > s->cap) return MX_OK;   // room for 4 bytes a token: more is cut
    memcpy(s->text + s->len, buf, n);
    s->len += n;
    return MX_OK;
}

int mxi_sample(mxi_sampler **sp, const mx_config *c, mx_model *model, mxi_fsdp *f, mxi_comm *comm, int64_t step,
               const char **text, size_t *len, mx_diag *diag) {
    *text = NULL, *len = 0;
    if (!mxi_sample_enabled(c)) return MX_OK;   // the same answer on every rank
    bool lead = mxi_comm_rank(comm) == 0;
    mx_diag own = {{0}};
    int own_rc = lead && !*sp ? sampler_create(sp, c, &own) : MX_OK;
    double failed = own_rc != 0;
    int rc = mxi_comm_allreduce_max(comm, &failed, 1, "whether rank 0 can sample", diag);
    if (rc) return rc;
    if (failed) {
        if (lead) return mxi_diag(diag, own_rc, "training.sample_tokens: %s", own.msg);
        return mxi_diag(diag, MX_EINVAL, "training.sample_tokens: rank 0 could not make a sample");
    }
    mx_model *dst = lead ? mxi_infer_model((*sp)->inf) : NULL;
    for (int i = 0; i < mx_model_num_tensors(model) && !rc; i++) {
        mxi_shard_span span = mxi_fsdp_span(f, i);
        rc = mxi_fsdp_gather_tensor(f, i, mxi_fsdp_master(f) + span.offset, lead ? mx_model_tensor(dst, i).data : NULL,
                                    diag);
    }
    if (rc || !lead) return rc;
    mxi_sampler *s = *sp;
    mxi_gen_options o = {.max_new_tokens = c->training.sample_tokens, .temperature = 1.0f, .top_k = SAMPLE_TOP_K,
                         .top_p = 1.0f, .seed = c->training.seed + (uint64_t)step,
                         .eos = s->codec.eos};
    const int32_t *prompt = s->prompt;
    mxi_gen_stats stats;
    s->len = 0;
    rc = mxi_generate(s->inf, &prompt, &s->n_prompt, 1, &o, emit, s, &stats, diag);
    s->text[s->len] = '\0';
    *text = s->text, *len = s->len;
    return rc;
}
