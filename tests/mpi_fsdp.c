/* FSDP under MPI (run by tests/fsdp.sh with mpirun -np 1 and -np 3): the gathered MX planes
 * are byte-identical to quantizing the unsharded weight, and the gather bytes of converted
 * weights are what SPEC §6 says: on-demand = (1 + 1/32) / 2 of the bf16 gather, `all` twice
 * on-demand, exactly, and as `mxtrain plan` predicts; a wait for a late rank times out as
 * parallel.timeout_s says, and can be waited again. Every rank checks; any failure fails. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/clock.h"
#include "distributed/comm.h"
#include "distributed/fsdp.h"
#include "harness.h"
#include "model/units.h"
#include "mxtrain/plan.h"
#include "train/checkpoint.h"

static const char *plan_yaml(const char *recipe, const char *mode) {
    static char buf[512];
    snprintf(buf, sizeof buf,
             "training:\n  quantization_plan:\n    recipe_name: %s\n    apply_modules: ['model.layers.{*}']\n"
             "    quant_converters: ['quantize.linear.mx', 'quantize.moe.mx']\n"
             "    enable_fsdp_low_precision_all_gather: true\n    fsdp_low_precision_all_gather_mode: %s\n",
             recipe, mode);
    return buf;
}

/* A Qwen3-MoE whose sizes do not divide by 32 or by the ranks (awkward), or all multiples of 32. */
static mx_model_config moe_config(bool awkward) {
    mx_model_config c = {0};
    c.type = MX_MODEL_QWEN3_MOE;
    c.vocab_size = 257, c.hidden_size = awkward ? 80 : 64, c.intermediate_size = awkward ? 100 : 96;
    c.num_hidden_layers = 2, c.num_attention_heads = awkward ? 5 : 4, c.num_key_value_heads = 1, c.head_dim = 16;
    c.rms_norm_eps = 1e-6f, c.rope_theta = 10000.0f, c.max_position_embeddings = 64, c.initializer_range = 0.02f;
    c.num_experts = 3, c.num_experts_per_tok = 2, c.moe_intermediate_size = awkward ? 40 : 32;
    c.norm_topk_prob = true, c.decoder_sparse_step = 2;   // layer 1 MoE, layer 0 dense
    return c;
}

typedef struct {
    mx_model *model;
    mxi_fsdp *fsdp;
    mx_plan plan;
} setup;

static int make(setup *s, const mx_model_config *c, const char *recipe, const char *mode, bool reshard, bool lp) {
    memset(s, 0, sizeof *s);
    mx_diag diag = {{0}};
    int rc = mx_plan_load_string(plan_yaml(recipe, mode), "test", &s->plan, &diag);
    mx_model_options opt = {.batch = 2, .seq = 9, .bf16 = true, .plan = &s->plan, .external_params = true};
    if (!rc) rc = mx_model_create(c, &opt, &s->model, &diag);
    mxi_comm *comm = NULL;
    if (!rc) rc = mxi_comm_init(&comm, &diag);
    mxi_fsdp_options fo = {true, false, reshard, 1, 1, lp, strcmp(mode, "all") == 0};
    if (!rc) rc = mxi_fsdp_create(s->model, comm, &fo, &s->fsdp, &diag);
    if (!rc) {
        float *scratch = malloc(1 << 22);
        mxi_init_sharded_weights(s->model, s->fsdp, 7, scratch);
        free(scratch);
        rc = mxi_fsdp_begin_step(s->fsdp, &diag);
    }
    if (rc) mxt_fail(__FILE__, __LINE__, "setup: %s", diag.msg);
    return rc;
}

static void release(setup *s) {
    mxi_fsdp_free(s->fsdp);
    mx_model_free(s->model);
    mx_plan_free(&s->plan);
}

static void batch(int32_t *in, int32_t *tg, int n) {
    for (int i = 0; i < n; i++) in[i] = (i * 37 + 11) % 257, tg[i] = (i * 53 + 5) % 257;
}

/* After a forward with reshard_after_forward off every converted weight's planes stay in its
 * unit buffer: compare them with the planes of the whole tensor quantized in one piece. */
static void check_planes(const char *recipe) {
    mx_model_config c = moe_config(true);
    setup s;
    if (make(&s, &c, recipe, "on-demand", false, true)) return;
    int32_t in[18], tg[18];
    batch(in, tg, 18);
    mx_model_forward(s.model, in, tg);
    mx_diag diag = {{0}};
    CHECK_EQ_INT(mx_model_error(s.model, &diag), 0);
    const mxi_linear_mx *spec = mxi_model_mx_spec(s.model);
    int checked = 0;
    for (int i = 0; i < mx_model_num_tensors(s.model); i++) {
        mxi_tensor_shape t = mxi_model_tensor_shape(s.model, i);
        const mxi_mx_weight *p = mxi_fsdp_gathered_planes(s.fsdp, i);
        CHECK((p != NULL) == t.converted);
        if (!p) continue;
        checked++;
        int64_t n = t.groups * t.rows * t.cols, R = t.rows, K = t.cols, KB = (K + 31) / 32, RB = (R + 31) / 32;
        float *w = malloc((size_t)n * 4);
        uint8_t *q = malloc((size_t)R * K), *sr = malloc((size_t)(R * KB)), *sc = malloc((size_t)(RB * K)),
                *tiles = malloc((size_t)(RB * KB));
        mxi_model_init_tensor(s.model, i, 7, w);
        for (int64_t g = 0; g < t.groups; g++) {
            const float *wg = w + g * R * K;
            if (spec->weight_tiles) {
                CHECK_EQ_INT(mx_quantize_tiles_f32(wg, R, K, spec->weight, spec->mode, q, tiles), 0);
                mxi_tiles_spread(sr, tiles, R, K, MX_ROWWISE);
                mxi_tiles_spread(sc, tiles, R, K, MX_COLWISE);
                CHECK_MEM_EQ(p->row.q + g * R * K, q, (size_t)(R * K));
                CHECK_MEM_EQ(p->row.scales + g * R * KB, sr, (size_t)(R * KB));
                CHECK_MEM_EQ(p->col.scales + g * RB * K, sc, (size_t)(RB * K));
            } else {
                CHECK_EQ_INT(mx_quantize_f32(wg, R, K, MX_ROWWISE, spec->weight, spec->mode, q, sr), 0);
                CHECK_MEM_EQ(p->row.q + g * R * K, q, (size_t)(R * K));
                CHECK_MEM_EQ(p->row.scales + g * R * KB, sr, (size_t)(R * KB));
                CHECK_EQ_INT(mx_quantize_f32(wg, R, K, MX_COLWISE, spec->weight, spec->mode, q, sc), 0);
                CHECK_MEM_EQ(p->col.q + g * R * K, q, (size_t)(R * K));
                CHECK_MEM_EQ(p->col.scales + g * RB * K, sc, (size_t)(RB * K));
            }
        }
        free(w), free(q), free(sr), free(sc), free(tiles);
    }
    CHECK(checked >= 9);   // 2 layers x q, k, v, o + dense gate/up/down + expert tensors
    release(&s);
}

static void test_planes_1x32(void) { check_planes("mxfp8"); }
static void test_planes_tiles(void) { check_planes("dynamic_mx-1-32-32_E4M3_E4M3_E4M3"); }

/* One micro-batch, forward and backward, with reshard_after_forward on: the step's counters,
 * and in *gathered the bytes of the engine's gather buffers. */
static mxi_fsdp_counters one_step(const char *mode, bool lp, uint64_t expected[3], uint64_t *gathered) {
    mx_model_config c = moe_config(false);
    setup s;
    mxi_fsdp_counters none = {0};
    if (make(&s, &c, "mxfp8", mode, true, lp)) return none;
    int32_t in[18], tg[18];
    batch(in, tg, 18);
    mx_model_forward(s.model, in, tg);
    mx_model_backward(s.model, 1.0f);
    mx_diag diag = {{0}};
    CHECK_EQ_INT(mx_model_error(s.model, &diag), 0);
    CHECK_EQ_INT(mxi_fsdp_end_backward(s.fsdp, &diag), 0);
    mxi_fsdp_counters k = mxi_fsdp_counters_of(s.fsdp);
    *gathered = mxi_fsdp_memory_of(s.fsdp).gathered;
    mxi_comm *comm;
    mxi_comm_init(&comm, &diag);
    if (expected) mxi_fsdp_expected_gather(s.model, mxi_comm_world(comm), true, &expected[0], &expected[1], &expected[2]);
    release(&s);
    return k;
}

static void test_gather_bytes(void) {
    uint64_t exp[3] = {0};
    uint64_t mem_bf16, mem_od, mem_all;
    mxi_fsdp_counters bf16 = one_step("on-demand", false, NULL, &mem_bf16);
    mxi_fsdp_counters od = one_step("on-demand", true, exp, &mem_od);
    mxi_fsdp_counters all = one_step("all", true, NULL, &mem_all);
    // on-demand holds one plane of a block at a time, `all` both: "slightly more memory"
    CHECK(mem_od < mem_all);
    CHECK(mem_od < mem_bf16);
    uint64_t converted_bf16 = bf16.ag_param_bytes - od.ag_param_bytes;   // what the converted weights cost in bf16
    uint64_t mx_od = od.ag_mx_data_bytes + od.ag_mx_scale_bytes, mx_all = all.ag_mx_data_bytes + all.ag_mx_scale_bytes;
    CHECK(converted_bf16 > 0);
    CHECK_EQ_INT((long long)(mx_od * 64), (long long)(converted_bf16 * 33));   // (1 + 1/32) / 2, exactly
    CHECK_EQ_INT((long long)mx_all, (long long)(2 * mx_od));
    CHECK_EQ_INT((long long)od.ag_bf16_equiv, (long long)converted_bf16);
    CHECK_EQ_INT((long long)exp[0], (long long)converted_bf16);   // what `mxtrain plan` prints
    CHECK_EQ_INT((long long)exp[1], (long long)mx_od);
    CHECK_EQ_INT((long long)exp[2], (long long)mx_all);
    CHECK_EQ_INT((long long)od.ag_param_bytes, (long long)all.ag_param_bytes);
    CHECK_EQ_INT(od.reduce_scatters, 3);   // one per unit: the root and two blocks
    CHECK_EQ_INT(od.all_gathers, 5);       // the root once, each block in forward and in backward
}

/* The watchdog: the last rank joins an all-gather 1.5 s late. The others, waiting with a
 * 0.3 s limit, get MX_ETIMEOUT naming the call and the label, after 0.3 s and well before
 * 1.5 s; waiting again (the request is still in flight) completes with every rank's value. */
static void test_watchdog(void) {
    mxi_comm *comm;
    mx_diag diag = {{0}};
    if (mxi_comm_init(&comm, &diag)) {
        mxt_fail(__FILE__, __LINE__, "%s", diag.msg);
        return;
    }
    int rank = mxi_comm_rank(comm), world = mxi_comm_world(comm);
    if (world == 1 || world > 8) {   // one rank never waits for anyone
        CHECK(world == 1);
        return;
    }
    bool late = rank == world - 1;
    int mine = 100 + rank, all[8] = {0};
    double before = mxi_comm_timeout();
    mxi_comm_set_timeout(0.3);
    if (late) {
        struct timespec ts = {1, 500000000};
        nanosleep(&ts, NULL);
    }
    mxi_request req;
    CHECK_EQ_INT(mxi_comm_iallgather(comm, &mine, all, sizeof mine, &req, &diag), MX_OK);
    mxi_comm_label(&req, "a test of %s", "the watchdog");
    if (!late) {
        double t0 = mxi_now_seconds();
        int rc = mxi_comm_wait(comm, &req, &diag);
        double waited = mxi_now_seconds() - t0;
        CHECK_EQ_INT(rc, MX_ETIMEOUT);
        CHECK_STR_CONTAINS(diag.msg, "no progress for 0.3 s in MPI_Iallgather (a test of the watchdog)");
        CHECK_STR_CONTAINS(diag.msg, "(the limit is parallel.timeout_s)");
        CHECK(waited >= 0.3 && waited < 1.2);
        CHECK(req.active);
    }
    mxi_comm_set_timeout(60);
    CHECK_EQ_INT(mxi_comm_wait(comm, &req, &diag), MX_OK);
    CHECK(!req.active);
    for (int r = 0; r < world; r++) CHECK_EQ_INT(all[r], 100 + r);
    // the blocking forms wait under the watchdog too, and still sum
    double x[2] = {1, rank};
    CHECK_EQ_INT(mxi_comm_allreduce_sum(comm, x, 2, "a test", &diag), MX_OK);
    CHECK_EQ_DBL(x[0], world);
    CHECK_EQ_DBL(x[1], world * (world - 1) / 2);
    mxi_comm_set_timeout(before);
    CHECK_EQ_DBL(mxi_comm_timeout(), before);
}

int main(int argc, char **argv) {
    static const mxt_test tests[] = {
        {"planes_identical_1x32", test_planes_1x32},
        {"planes_identical_tiles", test_planes_tiles},
        {"gather_bytes", test_gather_bytes},
        {"watchdog", test_watchdog},
    };
    int rc = MXT_RUN(tests, argc, argv);
    mxi_comm *comm;
    mx_diag diag;
    if (mxi_comm_init(&comm, &diag) == 0 && mxi_comm_finalize(comm, rc, &diag) != 0) {
        fprintf(stderr, "mpi_fsdp: %s\n", diag.msg);
        rc = 1;
    }
    return rc;
}
