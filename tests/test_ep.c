/* Expert parallelism's mxfp8 dispatch inside one process (docs/distributed.md#expert-parallelism):
 * two models are the two ranks of an EP group, each on its own thread, exchanging rows
 * through shared memory instead of MPI. Checked against a one-rank model whose micro-batch
 * is both ranks' rows: the experts' first forward GEMM on rank 0 reads, as its input plane,
 * the codes and scales quantized on the sending ranks, byte for byte the plane the one rank
 * quantizes itself (and the same rows), and the forward losses of mxfp8 and fp32 dispatch
 * are the same bits. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "model/units.h"
#include "mxtrain/model.h"
#include "mxtrain/plan.h"

enum { RANKS = 2, T = 24 };

/* The group: what each rank posted for the exchange under way. */
typedef struct {
    pthread_barrier_t bar;
    const void *send[RANKS];
    const int *send_rows[RANKS];
    double *sum[RANKS];
} group;

typedef struct {
    group *g;
    int rank;
    mx_model *m;
    const int32_t *inputs, *targets;
    double loss;
} rank_ctx;

/* MPI_Alltoallv's semantics: rank r's rows for me follow its rows for ranks 0..me-1. */
static int fake_alltoallv(void *ctx, const void *send, const int *send_rows, void *recv, const int *recv_rows,
                          size_t row_bytes, const char *what, mx_diag *diag) {
    (void)what, (void)diag;
    rank_ctx *c = ctx;
    group *g = c->g;
    g->send[c->rank] = send, g->send_rows[c->rank] = send_rows;
    pthread_barrier_wait(&g->bar);
    size_t at = 0;
    for (int r = 0; r < RANKS; r++) {
        size_t from = 0;
        for (int d = 0; d < c->rank; d++) from += (size_t)g->send_rows[r][d];
        memcpy((char *)recv + at * row_bytes, (const char *)g->send[r] + from * row_bytes, (size_t)recv_rows[r] * row_bytes);
        at += (size_t)recv_rows[r];
    }
    pthread_barrier_wait(&g->bar);
    return 0;
}

static int fake_sum(void *ctx, double *x, int n, const char *what, mx_diag *diag) {
    (void)what, (void)diag;
    rank_ctx *c = ctx;
    group *g = c->g;
    g->sum[c->rank] = x;
    pthread_barrier_wait(&g->bar);
    double *s = calloc((size_t)n, sizeof *s);
    for (int r = 0; r < RANKS; r++)
        for (int i = 0; i < n; i++) s[i] += g->sum[r][i];
    pthread_barrier_wait(&g->bar);
    memcpy(x, s, (size_t)n * sizeof *x);
    free(s);
    pthread_barrier_wait(&g->bar);
    return 0;
}

static void *rank_main(void *arg) {
    rank_ctx *c = arg;
    c->loss = mx_model_forward(c->m, c->inputs, c->targets);
    mx_model_backward(c->m, 1.0f);
    return NULL;
}

static mx_model_config moe_config(void) {
    mx_model_config c = {0};
    c.type = MX_MODEL_QWEN3_MOE;
    c.vocab_size = 67, c.hidden_size = 96, c.intermediate_size = 80, c.num_hidden_layers = 2;
    c.num_attention_heads = 3, c.num_key_value_heads = 1, c.head_dim = 32;
    c.rms_norm_eps = 1e-6f, c.rope_theta = 1000000.0f, c.max_position_embeddings = 64, c.initializer_range = 0.1f;
    c.num_experts = 4, c.num_experts_per_tok = 2, c.moe_intermediate_size = 48, c.decoder_sparse_step = 1;
    c.norm_topk_prob = true, c.output_router_logits = true, c.router_aux_loss_coef = 0.01f;
    return c;
}

static size_t file_size(const char *dir, const char *name) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    struct stat st;
    return stat(path, &st) == 0 ? (size_t)st.st_size : 0;
}

static unsigned char *slurp(const char *dir, const char *name, size_t *n) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    *n = file_size(dir, name);
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    unsigned char *b = malloc(*n ? *n : 1);
    if (fread(b, 1, *n, f) != *n) *n = 0;
    fclose(f);
    return b;
}

/* Both ranks' forward and backward with dispatch d; rank 0 traces its MX GEMMs into dir. */
static void run_ep(const mx_model_config *c, const mx_plan *plan, mx_ep_dispatch d, const int32_t *in,
                   const int32_t *tg, const char *dir, double loss[RANKS]) {
    group g;
    pthread_barrier_init(&g.bar, NULL, RANKS);
    rank_ctx ctx[RANKS];
    pthread_t th[RANKS];
    mx_diag diag;
    for (int r = 0; r < RANKS; r++) {
        mx_model_options o = {.batch = 1, .seq = T, .plan = plan, .expert_parallel = RANKS, .ep_dispatch = d};
        ctx[r] = (rank_ctx){&g, r, NULL, in + r * T, tg + r * T, 0};
        CHECK_EQ_INT(mx_model_create(c, &o, &ctx[r].m, &diag), 0);
        mx_model_init(ctx[r].m, 7);
        mxi_model_set_ep(ctx[r].m, &(mxi_model_ep){.ctx = &ctx[r], .rank = r, .size = RANKS,
                                                   .alltoallv = fake_alltoallv, .sum = fake_sum});
        CHECK(mxi_model_ep_layer(ctx[r].m, 0) && mxi_model_ep_layer(ctx[r].m, 1));
        CHECK_EQ_INT(mxi_model_ep_wire(ctx[r].m, 0, MXI_EP_FWD_DISPATCH),
                     d == MX_EP_DISPATCH_MXFP8 ? MXI_EP_WIRE_MXFP8 : MXI_EP_WIRE_FP32);
    }
    if (dir) mx_model_trace_mx(ctx[0].m, dir);
    for (int r = 0; r < RANKS; r++) pthread_create(&th[r], NULL, rank_main, &ctx[r]);
    for (int r = 0; r < RANKS; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < RANKS; r++) {
        CHECK_EQ_INT(mx_model_error(ctx[r].m, &diag), 0);
        mxi_model_ep_bytes b;
        mxi_model_take_ep_bytes(ctx[r].m, &b);
        // the counters: rows times row bytes, 96 codes + 3 scales per mxfp8 row
        if (d == MX_EP_DISPATCH_MXFP8)
            CHECK(b.dispatch_mx_data == b.dispatch_rows * 96 && b.dispatch_mx_scale == b.dispatch_rows * 3 &&
                  b.dispatch_fp32 == b.dispatch_rows * 4 * 96 && b.dispatch_bf16 == 0);
        else
            CHECK(b.dispatch_fp32 == 2 * b.dispatch_rows * 4 * 96 && b.dispatch_mx_data == 0);
        CHECK_EQ_INT((long long)b.combine_fp32, (long long)(2 * b.combine_rows * 4 * 96));
        loss[r] = ctx[r].loss;
        mx_model_free(ctx[r].m);
    }
    pthread_barrier_destroy(&g.bar);
}

static void test_mxfp8_dispatch_planes(void) {
    mx_model_config c = moe_config();
    mx_plan plan;
    mx_diag diag;
    static const char yaml[] = "training:\n  quantization_plan:\n    recipe_name: mxfp8\n"
                               "    quant_converters: ['quantize.moe.mx']\n";
    CHECK_EQ_INT(mx_plan_load_string(yaml, "test", &plan, &diag), 0);
    int32_t in[RANKS * T], tg[RANKS * T];
    for (int i = 0; i < RANKS * T; i++) in[i] = (i * 37 + 11) % 67, tg[i] = (i * 53 + 5) % 67;
    const char *ref = mxt_tmp_mkdir("ep_ref"), *ep = mxt_tmp_mkdir("ep_rank0");

    // one rank, both rows: its experts quantize their input rows themselves
    mx_model *one;
    mx_model_options o = {.batch = RANKS, .seq = T, .plan = &plan};
    CHECK_EQ_INT(mx_model_create(&c, &o, &one, &diag), 0);
    CHECK_EQ_INT(mx_model_converted_modules(one), 2);   // the experts of both layers, nothing else
    mx_model_init(one, 7);
    mx_model_trace_mx(one, ref);
    double one_loss = mx_model_forward(one, in, tg);
    mx_model_backward(one, 1.0f);
    CHECK_EQ_INT(mx_model_error(one, &diag), 0);
    mx_model_free(one);

    double lmx[RANKS], lf[RANKS];
    run_ep(&c, &plan, MX_EP_DISPATCH_MXFP8, in, tg, ep, lmx);
    run_ep(&c, &plan, MX_EP_DISPATCH_FP32, in, tg, NULL, lf);

    // rank 0's first expert GEMM (layer 0, its first expert with rows) is the one rank's:
    // the same rows (meta) and the same input plane, whose codes came over the wire
    static const char *const files[] = {"forward_a_meta.bin", "forward_a_q.bin", "forward_a_s.bin"};
    for (int i = 0; i < 3; i++) {
        size_t na, nb;
        unsigned char *a = slurp(ref, files[i], &na), *b = slurp(ep, files[i], &nb);
        CHECK(a && b && na > 0);
        CHECK_EQ_INT((long long)na, (long long)nb);
        if (a && b && na == nb) CHECK_MEM_EQ(a, b, na);
        free(a), free(b);
    }
    // the forward reads the same codes either way: the same losses, bit for bit
    for (int r = 0; r < RANKS; r++) CHECK_EQ_DBL(lmx[r], lf[r]);
    // and the one rank's loss (mean over both rows) to rounding
    CHECK_NEAR((lmx[0] + lmx[1]) / 2, one_loss, 1e-6 * one_loss);
    CHECK_EQ_INT(mxt_remove_tree(ref), 0);
    CHECK_EQ_INT(mxt_remove_tree(ep), 0);
    mx_plan_free(&plan);
}

static const mxt_test tests[] = {
    {"mxfp8_dispatch_planes", test_mxfp8_dispatch_planes},
};

int main(int argc, char **argv) { return MXT_RUN(tests, argc, argv); }
