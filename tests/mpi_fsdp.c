/* FSDP under MPI (run by tests/fsdp.sh with mpirun -np 1 and -np 3, and by tests/hsdp.sh
 * with -np 4): the gathered MX planes are byte-identical to quantizing the unsharded weight,
 * and the gather bytes of converted weights are what SPEC §6 says: on-demand = (1 + 1/32) / 2
 * of the bf16 gather, `all` twice on-demand, exactly, and as `mxtrain plan` predicts. HSDP,
 * for every number of replicas D dividing the ranks: the gathers within a group still give
 * the whole weights' planes; the gradients (sums over every rank's rows) equal those of one
 * FSDP group of all ranks, exactly with fp64 reductions; every replica holds the same bits;
 * the counters are the predicted ones. Under recompute, on-demand adds the rowwise plane to
 * the backward gathers of the recomputed blocks only (1.5 planes per step when all are), with
 * gradients bit-identical to no recompute. A wait for a late rank times out as
 * parallel.timeout_s says, and can be waited again. Under expert parallelism the experts'
 * planes gathered within their expert shard groups are those of the rank's experts, whole. The
 * per-tensor recipes gather codes quantized with the whole weight's scale (a delayed one's after
 * its first update: its all-reduced amax).
 * Every rank checks; any failure fails. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/clock.h"
#include "distributed/comm.h"
#include "distributed/ep.h"
#include "distributed/fsdp.h"
#include "harness.h"
#include "model/profile.h"
#include "model/units.h"
#include "mxtrain/plan.h"
#include "train/checkpoint.h"

/* More lines for the next setups' plan (scale_mode: pow2), or "". */
static const char *plan_extra = "";

/* Linear layers and experts converted: the mx converters named, the other families' by default. */
static const char *plan_yaml(const char *recipe, const char *mode) {
    static char buf[640];
    bool mx = strncmp(recipe, "mxfp8", 5) == 0 || strncmp(recipe, "dynamic_mx", 10) == 0;
    snprintf(buf, sizeof buf,
             "training:\n  quantization_plan:\n    recipe_name: %s\n    apply_modules: ['model.layers.{*}']\n"
             "%s    enable_fsdp_low_precision_all_gather: true\n    fsdp_low_precision_all_gather_mode: %s\n%s",
             recipe, mx ? "    quant_converters: ['quantize.linear.mx', 'quantize.moe.mx']\n" : "", mode, plan_extra);
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

/* replicas FSDP groups, gradients reduced in reduce; recompute: the recompute_plan pattern of
 * the blocks to recompute, or NULL. */
/* Expert parallelism for the next setups (test_planes_ep): EP and EDP, 1 without. */
static int ep_size = 1, ep_replicas = 1, ep_rank_of_world;
/* Micro-batches a step for the next setups (a step of several keeps its MX shards cached). */
static int micro_batches = 1;
/* The gradient shards' dtype for the next setups (training.main_grads_dtype). */
static mxi_wire_dtype grads_dtype = MXI_WIRE_F32;
/* Whether the next setups hold the vocabulary tables as bf16 in their unit buffers (hold_bf16). */
static bool hold_bf16 = false;
static mxi_ep_link ep_link;

static int make_with(setup *s, const mx_model_config *c, const char *recipe, const char *mode, bool reshard, bool lp,
                     int replicas, mxi_wire_dtype reduce, const char *recompute) {
    memset(s, 0, sizeof *s);
    mx_diag diag = {{0}};
    int rc = mx_plan_load_string(plan_yaml(recipe, mode), "test", &s->plan, &diag);
    char text[64];   // the pattern's text is not const there
    snprintf(text, sizeof text, "%s", recompute ? recompute : "");
    mx_plan_pattern rp = {text, NULL, 0};
    if (!rc && recompute) rc = mx_pattern_compile(text, &rp.compiled, &diag);
    mx_model_options opt = {.batch = 2, .seq = 9, .bf16 = true, .plan = &s->plan, .external_params = true,
                            .recompute = recompute ? &rp : NULL, .n_recompute = recompute != NULL,
                            .expert_parallel = ep_size, .ep_overlap = true};
    if (!rc) rc = mx_model_create(c, &opt, &s->model, &diag);
    mx_pattern_free(rp.compiled);   // the model matched it against its blocks at create
    mxi_comm *comm = NULL;
    if (!rc) rc = mxi_comm_init(&comm, &diag);
    mxi_fsdp_options fo = {.param_bf16 = true, .reduce = reduce, .reshard_after_forward = reshard, .forward_prefetch = 1,
                           .backward_prefetch = 1, .low_precision = lp, .gather_all = strcmp(mode, "all") == 0,
                           .replicas = replicas, .expert_parallel = ep_size, .expert_replicas = ep_replicas,
                           .micro_batches = micro_batches, .grads = grads_dtype, .hold_bf16 = hold_bf16};
    if (!rc) rc = mxi_fsdp_create(s->model, comm, &fo, &s->fsdp, &diag);
    if (!rc && ep_size > 1) {   // EP groups of consecutive ranks, as the trainer makes them
        int r = ep_rank_of_world = mxi_comm_rank(comm);
        mxi_comm_free(ep_link.group), ep_link.group = NULL;
        rc = mxi_comm_split(comm, r / ep_size, r, &ep_link.group, &diag);
        mxi_model_ep hooks = rc ? (mxi_model_ep){0} : mxi_ep_hooks(&ep_link);
        if (!rc) mxi_model_set_ep(s->model, &hooks);
    }
    if (!rc) {
        float *scratch = malloc(1 << 22);
        mxi_init_sharded_weights(s->model, s->fsdp, 7, scratch);
        free(scratch);
        rc = mxi_fsdp_begin_step(s->fsdp, &diag);
    }
    if (rc) mxt_fail(__FILE__, __LINE__, "setup: %s", diag.msg);
    return rc;
}

static int make_hsdp(setup *s, const mx_model_config *c, const char *recipe, const char *mode, bool reshard, bool lp,
                     int replicas, mxi_wire_dtype reduce) {
    return make_with(s, c, recipe, mode, reshard, lp, replicas, reduce, NULL);
}

static int make(setup *s, const mx_model_config *c, const char *recipe, const char *mode, bool reshard, bool lp) {
    return make_with(s, c, recipe, mode, reshard, lp, 1, MXI_WIRE_F32, NULL);
}

static void release(setup *s) {
    mxi_fsdp_free(s->fsdp);
    mx_model_free(s->model);
    mx_plan_free(&s->plan);
}

static void batch(int32_t *in, int32_t *tg, int n) {
    for (int i = 0; i < n; i++) in[i] = (i * 37 + 11) % 257, tg[i] = (i * 53 + 5) % 257;
}

static mxi_comm *world_comm(void);

static int amax_max(void *ctx, double *x, int n, mx_diag *diag) {
    return mxi_comm_allreduce_max(ctx, x, n, "the delayed scaling amaxes", diag);
}

/* After a forward with reshard_after_forward off every converted weight's planes stay in its
 * unit buffer: compare them with the planes of the whole tensor quantized in one piece. A
 * delayed recipe's are those of the second micro-batch: the first recorded each rank's rows'
 * amax, the update after its forward all-reduced them, and the codes of the scale so made
 * are the current scaling's of the whole weight (its amax the max of its rows'). */
static bool wide_mlp;   // the next check_planes' MLPs several 128-row tiles tall (blockwise)

static void check_planes_of(const char *recipe, int replicas, int experts) {
    mx_model_config c = moe_config(true);
    if (experts) c.num_experts = experts;
    if (wide_mlp) c.intermediate_size = 300, c.moe_intermediate_size = 136;
    setup s;
    if (make_hsdp(&s, &c, recipe, "on-demand", false, true, replicas, MXI_WIRE_F32)) return;
    int32_t in[18], tg[18];
    batch(in, tg, 18);
    mx_diag diag = {{0}};
    mxi_delayed *dl = mxi_model_delayed(s.model);
    if (dl) {
        mxi_delayed_set_training(dl, true);
        CHECK_EQ_INT(mxi_fsdp_begin_step(s.fsdp, &diag), 0);
        mx_model_forward(s.model, in, tg);
        CHECK_EQ_INT(mxi_delayed_update(dl, MXI_DELAYED_FORWARD, amax_max, world_comm(), &diag), 0);
        CHECK_EQ_INT(mxi_fsdp_begin_micro(s.fsdp, &diag), 0);
    }
    mx_model_forward(s.model, in, tg);
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
        // with EP the experts gathered are this EP rank's: groups g0 .. g0 + E / EP
        int64_t G = t.groups, g0 = 0;
        if (ep_size > 1 && t.groups > 1) G = t.groups / ep_size, g0 = (ep_rank_of_world % ep_size) * G;
        for (int64_t g = 0; g < G; g++) {
            const float *wg = w + (g0 + g) * R * K;
            if (spec->scaling == MXI_SCALE_ROWS) {   // fprop's plane per row, dgrad's per column (or whole)
                float *s1 = malloc((size_t)(R > K ? R : K) * 4);
                CHECK_EQ_INT(mx_fp8_quantize_axiswise_f32(wg, R, K, MX_ROWWISE, spec->weight, spec->tmode, q, s1), 0);
                CHECK(p->row.q != NULL && p->row_scales != NULL);
                if (p->row.q && p->row_scales) {
                    CHECK_MEM_EQ(p->row.q + g * R * K, q, (size_t)(R * K));
                    CHECK_MEM_EQ(p->row_scales + g * R, s1, (size_t)R * 4);
                }
                int64_t lines = spec->dgrad_weight_tensor ? 1 : K;
                CHECK_EQ_INT(spec->dgrad_weight_tensor
                                 ? mx_fp8_quantize_axiswise_f32(wg, 1, R * K, MX_ROWWISE, spec->weight, spec->tmode, q, s1)
                                 : mx_fp8_quantize_axiswise_f32(wg, R, K, MX_COLWISE, spec->weight, spec->tmode, q, s1),
                             0);
                CHECK(p->col.q != NULL && p->col_scales != NULL);
                CHECK_EQ_INT(p->col_per_group, lines);
                if (p->col.q && p->col_scales) {
                    CHECK_MEM_EQ(p->col.q + g * R * K, q, (size_t)(R * K));
                    CHECK_MEM_EQ(p->col_scales + g * lines, s1, (size_t)lines * 4);
                }
                free(s1);
            } else if (spec->scaling == MXI_SCALE_TENSOR) {   // one rank's quantization of the whole weight (expert)
                float scale = 0;
                CHECK_EQ_INT(spec->weight == MX_HIF8 ? mx_hif8_quantize_tensor_ex_f32(wg, R * K, MXI_HIF8_TARGET_ACT, spec->tmode,
                                                                                      q, &scale)
                                                     : mx_fp8_quantize_tensor_f32(wg, R * K, spec->weight, spec->tmode, q, &scale),
                             0);
                CHECK_MEM_EQ(p->row.q + g * R * K, q, (size_t)(R * K));
                CHECK(p->tscale != NULL);
                if (p->tscale) CHECK_EQ_DBL(p->tscale[g], scale);
            } else if (spec->scaling == MXI_SCALE_BLOCKS128) {   // the whole weight (expert) in 128x128 tiles
                int64_t nt = ((R + 127) / 128) * ((K + 127) / 128);
                float *ts = malloc((size_t)nt * 4);
                CHECK_EQ_INT(mx_fp8_quantize_blocks_f32(wg, R, K, 128, 128, spec->weight, spec->tmode, q, ts), 0);
                CHECK(p->row.q != NULL && p->bscale != NULL);
                if (p->row.q && p->bscale) {
                    CHECK_MEM_EQ(p->row.q + g * R * K, q, (size_t)(R * K));
                    CHECK_MEM_EQ(p->bscale + g * nt, ts, (size_t)nt * 4);
                }
                free(ts);
            } else if (spec->weight_tiles) {
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

static void check_planes(const char *recipe, int replicas) { check_planes_of(recipe, replicas, 0); }

static void test_planes_1x32(void) { check_planes("mxfp8", 1); }
static void test_planes_tiles(void) { check_planes("dynamic_mx-1-32-32_E4M3_E4M3_E4M3", 1); }

/* Per-tensor recipes: every rank quantizes its rows with the scale of the amax all-reduced
 * over the shards; the codes gathered and the scales are one rank's quantization of each
 * whole weight (each expert), on any number of ranks (80 and 100 rows cut over 3). */
static void test_planes_tensorwise(void) {
    check_planes("tensorwise", 1);
    check_planes("hif8", 1);
    check_planes("dynamic_per_tensor_E5M2_E5M2_E5M2", 1);
    check_planes("dynamic_per_tensor_E4M3_HIF8_E5M2", 1);   // each role its format: HiF8 weights
    plan_extra = "    scale_mode: pow2\n";   // HiF8's power of two at or above MindSpeed's scale
    check_planes("hif8", 1);
    check_planes("tensorwise", 1);
    plan_extra = "";
}

/* Delayed scaling: each rank quantizes its rows with the weight's known scale and gathers
 * codes; after the first update they are byte for byte one rank's quantization of each whole
 * weight (each expert) with its amax, on any number of ranks; with HSDP and with EP too. */
static void test_planes_delayed(void) {
    check_planes("delayed", 1);
    check_planes("delayed_hif8_pertensor", 1);
    check_planes("delayed_per_tensor_E5M2_E5M2_E5M2", 1);
    int W = mxi_comm_world(world_comm());
    if (W % 2 == 0) check_planes("delayed", 2);
}

/* The rowwise recipes: fprop's plane quantized row by row by each row's owner (codes and
 * row scales gathered), dgrad's with the column (rowwise_with_gw_hp: tensor) scales of the
 * amaxes all-reduced over the shards (codes gathered): both byte for byte one rank's
 * quantization of each whole weight (each expert), on any number of ranks (80 and 100 rows
 * cut over 3), with HSDP (even ranks) and with EP (3 and 4 ranks). */
static void test_planes_rowwise(void) {
    static const char *const recipes[] = {"rowwise", "rowwise_with_gw_hp", "dynamic_per_channel_E5M2_E5M2_E5M2"};
    for (int k = 0; k < 3; k++) check_planes(recipes[k], 1);
    int W = mxi_comm_world(world_comm());
    if (W % 2 == 0) check_planes("rowwise", 2), check_planes("rowwise_with_gw_hp", W);
    static const int layouts[][4] = {{4, 2, 1, 1}, {4, 2, 2, 2}, {4, 4, 1, 1}, {3, 3, 1, 1}};
    for (size_t k = 0; k < sizeof layouts / sizeof layouts[0]; k++) {   // world, EP, EDP, dense replicas
        if (layouts[k][0] != W) continue;
        ep_size = layouts[k][1], ep_replicas = layouts[k][2];
        check_planes_of("rowwise", layouts[k][3], W == 3 ? 3 : 4);
        check_planes_of("rowwise_with_gw_hp", layouts[k][3], W == 3 ? 3 : 4);
    }
    ep_size = ep_replicas = 1;
    mxi_comm_free(ep_link.group), ep_link.group = NULL;
}

/* The blockwise recipe: every rank quantizes its rows with the scales of its tiles' amaxes
 * all-reduced over the shards (a tile's rows may lie on several ranks); the codes gathered
 * and the tile scales are byte for byte one rank's quantization of each whole weight (each
 * expert), MLPs 300 and 272 rows tall (3 tile rows; shards of 128, 160 or 96 rows on 3, 2 and
 * 4 ranks cross the tiles' edges), both scale modes, E5M2 weights, with HSDP (even ranks) and
 * with EP (3 and 4 ranks). */
static void test_planes_blockwise(void) {
    wide_mlp = true;
    check_planes("blockwise", 1);
    check_planes("dynamic_per_block-1-128-128_E5M2_E5M2_E5M2", 1);
    plan_extra = "    scale_mode: fp32\n";
    check_planes("blockwise", 1);
    plan_extra = "";
    int W = mxi_comm_world(world_comm());
    if (W % 2 == 0) check_planes("blockwise", 2);
    static const int layouts[][4] = {{4, 2, 1, 1}, {4, 2, 2, 2}, {3, 3, 1, 1}};
    for (size_t k = 0; k < sizeof layouts / sizeof layouts[0]; k++) {   // world, EP, EDP, dense replicas
        if (layouts[k][0] != W) continue;
        ep_size = layouts[k][1], ep_replicas = layouts[k][2];
        check_planes_of("blockwise", layouts[k][3], W == 3 ? 3 : 4);
    }
    ep_size = ep_replicas = 1;
    mxi_comm_free(ep_link.group), ep_link.group = NULL;
    wide_mlp = false;
}

static mxi_comm *world_comm(void) {
    mxi_comm *comm = NULL;
    mx_diag diag;
    mxi_comm_init(&comm, &diag);
    return comm;
}

/* HSDP: the planes gathered within each group of W / 2 ranks (on an even number of ranks). */
static void test_planes_hsdp(void) {
    int W = mxi_comm_world(world_comm());
    if (W % 2) return;
    check_planes("mxfp8", 2);
    check_planes("dynamic_mx-1-32-32_E4M3_E4M3_E4M3", W);
    check_planes("hif8", 2);
}

/* Expert parallelism: each rank gathers its E / EP experts' planes within its expert shard
 * group, byte-identical to quantizing those experts unsharded: on 4 ranks (4 experts) EP = 2
 * with EFSDP = 2 and with EFSDP = 1 x EDP = 2 (on 2 x 2 HSDP too), and EP = 4; on 3 ranks
 * EP = 3 (3 experts). */
static void test_planes_ep(void) {
    int W = mxi_comm_world(world_comm());
    static const int layouts[][4] = {{4, 2, 1, 1}, {4, 2, 2, 1}, {4, 2, 2, 2}, {4, 4, 1, 1}, {3, 3, 1, 1}};
    for (size_t k = 0; k < sizeof layouts / sizeof layouts[0]; k++) {   // world, EP, EDP, dense replicas
        if (layouts[k][0] != W) continue;
        ep_size = layouts[k][1], ep_replicas = layouts[k][2];
        check_planes_of("mxfp8", layouts[k][3], W == 3 ? 3 : 4);
        check_planes_of("dynamic_mx-1-32-32_E4M3_E4M3_E4M3", layouts[k][3], W == 3 ? 3 : 4);
        check_planes_of("tensorwise", layouts[k][3], W == 3 ? 3 : 4);
        check_planes_of("delayed", layouts[k][3], W == 3 ? 3 : 4);   // each EP rank's experts' slots
    }
    ep_size = ep_replicas = 1;
    mxi_comm_free(ep_link.group), ep_link.group = NULL;
}

/* One micro-batch, forward and backward, with reshard_after_forward on unless keep, the
 * blocks matching recompute (or none) recomputed: the step's counters, in *gathered the bytes
 * of the engine's gather buffers, in *grads (unless NULL; the caller frees) a copy of this
 * rank's gradient shard. */
static const char *step_recipe = "mxfp8";   // the recipe of step_with's setups

static mxi_fsdp_counters step_with(const char *mode, bool lp, bool keep, const char *recompute, uint64_t expected[3],
                                   uint64_t *gathered, float **grads) {
    mx_model_config c = moe_config(false);
    setup s;
    mxi_fsdp_counters none = {0};
    if (grads) *grads = NULL;
    if (make_with(&s, &c, step_recipe, mode, !keep, lp, 1, MXI_WIRE_F32, recompute)) return none;
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
    if (expected) mxi_fsdp_expected_gather(s.model, mxi_comm_world(comm), 1, 1, !keep, &expected[0], &expected[1], &expected[2]);
    // and what the step prediction (`mxtrain plan`'s per_step) says: every counter, the buffers
    mxi_fsdp_counters e;
    mxi_fsdp_memory mem;
    mxi_fsdp_options fo = {.param_bf16 = true, .reduce = MXI_WIRE_F32, .reshard_after_forward = !keep, .forward_prefetch = 1,
                           .backward_prefetch = 1, .low_precision = lp, .gather_all = strcmp(mode, "all") == 0,
                           .micro_batches = micro_batches};
    CHECK_EQ_INT(mxi_fsdp_expected(s.model, &fo, mxi_comm_world(comm), &e, &mem, &diag), 0);
    CHECK_EQ_INT(k.ag_param_bytes, e.ag_param_bytes);
    CHECK_EQ_INT(k.ag_mx_data_bytes, e.ag_mx_data_bytes);
    CHECK_EQ_INT(k.ag_mx_scale_bytes, e.ag_mx_scale_bytes);
    CHECK_EQ_INT(k.ag_bf16_equiv, e.ag_bf16_equiv);
    CHECK_EQ_INT(k.all_gathers, e.all_gathers);
    CHECK_EQ_INT(*gathered, mem.gathered);
    if (grads) {
        size_t n = (size_t)mxi_fsdp_shard_numel(s.fsdp) * sizeof(float);
        *grads = malloc(n);
        if (*grads) memcpy(*grads, mxi_fsdp_grads(s.fsdp), n);
    }
    release(&s);
    return k;
}

static mxi_fsdp_counters one_step(const char *mode, bool lp, uint64_t expected[3], uint64_t *gathered) {
    return step_with(mode, lp, false, NULL, expected, gathered, NULL);
}

static void test_gather_bytes(void) {
    uint64_t exp[3] = {0};
    uint64_t mem_bf16, mem_od, mem_all;
    mxi_fsdp_counters bf16 = one_step("on-demand", false, NULL, &mem_bf16);
    mxi_fsdp_counters od = one_step("on-demand", true, exp, &mem_od);
    mxi_fsdp_counters all = one_step("all", true, NULL, &mem_all);
    // on-demand holds one plane of a block at a time, `all` both: "slightly more memory" (on
    // one rank only the unit buffers differ, and this model's embedding unit sizes them)
    if (mxi_comm_world(world_comm()) > 1) CHECK(mem_od < mem_all);
    else CHECK(mem_od <= mem_all);
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
    CHECK_EQ_INT(od.reduce_scatters, 4);   // one per unit: the root, the embedding and two blocks
    CHECK_EQ_INT(od.all_gathers, 6);       // the root once, the embedding once (its backward reads no
                                           // weights), each block in forward and in backward
}

/* The rowwise recipes' gathers, from the shapes alone: forward carries fprop's codes (one
 * byte an element) and one fp32 scale a row, backward dgrad's codes only; each group's rows
 * padded to 32 * ceil(R / (32 W)) per rank. `all` carries both planes in both gathers. The
 * counters are what the step prediction (`mxtrain plan`) says (step_with checks it). */
static void test_gather_bytes_rowwise(void) {
    int W = mxi_comm_world(world_comm());
    uint64_t codes = 0, rows = 0;
    setup s;
    mx_model_config c = moe_config(false);
    if (make(&s, &c, "rowwise", "on-demand", true, true)) return;
    for (int i = 0; i < mx_model_num_tensors(s.model); i++) {
        mxi_tensor_shape t = mxi_model_tensor_shape(s.model, i);
        if (!t.converted) continue;
        int64_t G = t.groups > 1 && t.rows % 32 == 0 ? 1 : t.groups, R = t.groups * t.rows / G;
        int64_t S = 32 * ((R + 32 * W - 1) / (32 * W));
        codes += (uint64_t)(G * S * W * t.cols), rows += (uint64_t)(G * S * W);
    }
    release(&s);
    CHECK(codes > 0);
    static const char *const recipes[] = {"rowwise", "rowwise_with_gw_hp"};
    for (int k = 0; k < 2; k++) {
        uint64_t exp[3] = {0}, mem;
        step_recipe = recipes[k];
        mxi_fsdp_counters bf16 = one_step("on-demand", false, NULL, &mem);
        mxi_fsdp_counters od = one_step("on-demand", true, exp, &mem);
        mxi_fsdp_counters all = one_step("all", true, NULL, &mem);
        // every converted weight is in a resharded block: gathered in forward and in backward
        CHECK_EQ_INT((long long)od.ag_mx_data_bytes, (long long)(2 * codes));
        CHECK_EQ_INT((long long)od.ag_mx_scale_bytes, (long long)(4 * rows));
        CHECK_EQ_INT((long long)all.ag_mx_data_bytes, (long long)(4 * codes));
        CHECK_EQ_INT((long long)all.ag_mx_scale_bytes, (long long)(8 * rows));
        CHECK_EQ_INT((long long)(bf16.ag_param_bytes - od.ag_param_bytes), (long long)(4 * codes));
        CHECK_EQ_INT((long long)od.ag_bf16_equiv, (long long)(4 * codes));
        CHECK_EQ_INT((long long)exp[0], (long long)(4 * codes));
        CHECK_EQ_INT((long long)exp[1], (long long)(od.ag_mx_data_bytes + od.ag_mx_scale_bytes));
        CHECK_EQ_INT((long long)exp[2], (long long)(all.ag_mx_data_bytes + all.ag_mx_scale_bytes));
    }
    step_recipe = "mxfp8";
}

/* A rank's gather buffers, from the shapes alone: the root's unit buffer and one buffer for
 * each block in flight, each tensor's part on 64 bytes. On one rank one block is (its
 * gathers copy from the shard when the block runs: nothing is prefetched) and nothing more
 * (the model adds its fp32 gradients straight into the shard); on more ranks two (this one
 * and the one prefetched), the wire buffers and the unsharded gradients besides. */
static void test_one_rank_buffers(void) {
    uint64_t gathered;
    one_step("on-demand", false, NULL, &gathered);
    setup s;
    mx_model_config c = moe_config(false);
    if (make(&s, &c, "mxfp8", "on-demand", true, false)) return;
    int units = mxi_model_num_units(s.model);
    uint64_t *slot = calloc((size_t)units, sizeof *slot);
    for (int i = 0; i < mx_model_num_tensors(s.model); i++) {
        mxi_tensor_shape t = mxi_model_tensor_shape(s.model, i);
        slot[t.unit] += ((uint64_t)(t.groups * t.rows * t.cols) * 4 + 63) / 64 * 64;
    }
    uint64_t block = 0;
    for (int u = 1; u < units; u++) block = slot[u] > block ? slot[u] : block;
    if (mxi_comm_world(world_comm()) == 1) CHECK_EQ_INT(gathered, slot[0] + block);
    else CHECK(gathered > slot[0] + 2 * block);
    free(slot);
    release(&s);
}

/* The MX planes of the shards are kept for the step only where a plane would otherwise be
 * quantized again: with several micro-batches or `all`; on-demand with one micro-batch
 * quantizes each plane as it is gathered, recomputed blocks too (their rowwise plane again
 * in backward: recompute is for memory). Either way the same bits. */
static mxi_fsdp_memory memory_with(const char *mode, const char *recompute) {
    setup s;
    mx_model_config c = moe_config(false);
    mxi_fsdp_memory none = {0};
    if (make_with(&s, &c, "mxfp8", mode, true, true, 1, MXI_WIRE_F32, recompute)) return none;
    mxi_fsdp_memory m = mxi_fsdp_memory_of(s.fsdp);
    release(&s);
    return m;
}

static void test_shard_cache(void) {
    CHECK_EQ_INT(memory_with("on-demand", NULL).mx_shards, 0);
    CHECK(memory_with("all", NULL).mx_shards > 0);
    CHECK_EQ_INT(memory_with("on-demand", "model.layers.{*}").mx_shards, 0);
    micro_batches = 2;
    CHECK(memory_with("on-demand", NULL).mx_shards > 0);
    uint64_t gathered;
    float *cached, *direct;
    step_with("on-demand", true, false, NULL, NULL, &gathered, &cached);
    micro_batches = 1;
    step_with("on-demand", true, false, NULL, NULL, &gathered, &direct);
    setup s;
    mx_model_config c = moe_config(false);
    if (cached && direct && !make(&s, &c, "mxfp8", "on-demand", true, true)) {
        size_t n = (size_t)mxi_fsdp_shard_numel(s.fsdp);
        CHECK_EQ_INT(memcmp(cached, direct, n * sizeof(float)), 0);
        release(&s);
    }
    free(cached), free(direct);
}

static uint64_t mx_bytes(const mxi_fsdp_counters *k) { return k->ag_mx_data_bytes + k->ag_mx_scale_bytes; }

/* The rowwise plane of unit's converted weights as gathered on W ranks, from the shapes alone:
 * each group's rows padded to 32 * ceil(R / (32 W)) per rank, one code per element and one
 * scale per 32 elements of a row (the sizes of moe_config(false) are multiples of 32). */
static uint64_t rowwise_bytes(int unit, int W) {
    mx_model_config c = moe_config(false);
    setup s;
    if (make(&s, &c, "mxfp8", "on-demand", true, true)) return 0;
    uint64_t bytes = 0;
    for (int i = 0; i < mx_model_num_tensors(s.model); i++) {
        mxi_tensor_shape t = mxi_model_tensor_shape(s.model, i);
        if (!t.converted || t.unit != unit) continue;
        // fused experts of 32-row multiples are cut as one tensor of E R rows, else expert by expert
        int64_t G = t.groups > 1 && t.rows % 32 == 0 ? 1 : t.groups, R = t.groups * t.rows / G;
        int64_t S = 32 * ((R + 32 * W - 1) / (32 * W)), codes = G * S * W * t.cols;
        bytes += (uint64_t)(codes + codes / 32);
    }
    release(&s);
    return bytes;
}

static bool same_grads(const float *a, const float *b) {
    mx_model_config c = moe_config(false);
    setup s;
    if (!a || !b || make(&s, &c, "mxfp8", "on-demand", true, true)) return false;
    bool same = memcmp(a, b, (size_t)mxi_fsdp_shard_numel(s.fsdp) * sizeof(float)) == 0;
    release(&s);
    return same;
}

/* Recompute with on-demand: the forward gathers the rowwise plane, the backward of a
 * recomputed block both planes (its forward runs again there), of the others the colwise
 * plane; the gradients are bit-identical to not recomputing, in every mode and layout. */
static void test_gather_recompute(void) {
    mx_diag diag = {{0}};
    mxi_comm *comm;
    CHECK_EQ_INT(mxi_comm_init(&comm, &diag), 0);
    int W = mxi_comm_world(comm);
    uint64_t e_od[3], e_rc[3], e_part[3], e_keep[3], e_keep_rc[3], m_od, m_all, m_rc, m_rca, m_part, m;
    float *g_od, *g_rc, *g_rca, *g_part, *g_keep, *g_keep_rc;
    mxi_fsdp_counters od = step_with("on-demand", true, false, NULL, e_od, &m_od, &g_od);
    mxi_fsdp_counters all = step_with("all", true, false, NULL, NULL, &m_all, NULL);
    mxi_fsdp_counters rc = step_with("on-demand", true, false, "model.layers.{*}", e_rc, &m_rc, &g_rc);
    mxi_fsdp_counters rca = step_with("all", true, false, "model.layers.{*}", NULL, &m_rca, &g_rca);
    mxi_fsdp_counters part = step_with("on-demand", true, false, "model.layers.1", e_part, &m_part, &g_part);
    mxi_fsdp_counters keep = step_with("on-demand", true, true, NULL, e_keep, &m, &g_keep);
    mxi_fsdp_counters keep_rc = step_with("on-demand", true, true, "model.layers.{*}", e_keep_rc, &m, &g_keep_rc);
    // the same gradients, bit for bit
    CHECK(same_grads(g_od, g_rc));
    CHECK(same_grads(g_od, g_rca));
    CHECK(same_grads(g_od, g_part));
    CHECK(same_grads(g_od, g_keep));
    CHECK(same_grads(g_od, g_keep_rc));
    // every block recomputed: one plane in forward, two in backward, where on-demand moves two
    // and `all` four (rowwise and colwise planes are the same size here)
    CHECK(mx_bytes(&od) > 0);
    CHECK_EQ_INT((long long)(2 * mx_bytes(&rc)), (long long)(mx_bytes(&od) + mx_bytes(&all)));
    CHECK(mx_bytes(&rc) < mx_bytes(&all));
    CHECK_EQ_INT((long long)mx_bytes(&rca), (long long)mx_bytes(&all));   // `all` as written, recompute or not
    // only block 2 (layer 1, the MoE layer) recomputed: its rowwise plane once more
    CHECK_EQ_INT((long long)mx_bytes(&part), (long long)(mx_bytes(&od) + rowwise_bytes(2, W)));
    CHECK(rowwise_bytes(2, W) > 0 && rowwise_bytes(1, W) > 0);
    // kept after forward: gathered once with both planes, recompute or not
    CHECK_EQ_INT((long long)mx_bytes(&keep_rc), (long long)mx_bytes(&keep));
    // what `mxtrain plan` predicts, exactly
    CHECK_EQ_INT((long long)e_od[1], (long long)mx_bytes(&od));
    CHECK_EQ_INT((long long)e_rc[1], (long long)mx_bytes(&rc));
    CHECK_EQ_INT((long long)e_rc[2], (long long)mx_bytes(&all));
    CHECK_EQ_INT((long long)e_rc[0], (long long)e_od[0]);
    CHECK_EQ_INT((long long)e_part[1], (long long)mx_bytes(&part));
    CHECK_EQ_INT((long long)e_keep[1], (long long)mx_bytes(&keep));
    CHECK_EQ_INT((long long)e_keep_rc[1], (long long)mx_bytes(&keep_rc));
    // the unconverted weights and the number of collectives do not change
    CHECK_EQ_INT((long long)rc.ag_param_bytes, (long long)od.ag_param_bytes);
    CHECK_EQ_INT(rc.all_gathers, 6);
    CHECK_EQ_INT(part.all_gathers, 6);
    CHECK_EQ_INT(rc.reduce_scatters, 4);
    // a recomputed block holds both planes in backward: the buffers of `all`
    CHECK(m_od <= m_part && m_part <= m_rc);
    if (W > 1) CHECK(m_od < m_part);   // on one rank only the unit buffers differ (see gather_bytes)
    CHECK_EQ_INT((long long)m_rc, (long long)m_all);
    CHECK_EQ_INT((long long)m_rca, (long long)m_all);
    free(g_od), free(g_rc), free(g_rca), free(g_part), free(g_keep), free(g_keep_rc);
}

/* FNV-1a of n bytes. */
static uint64_t hash_bytes(const void *p, size_t n) {
    const uint8_t *b = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

/* One micro-batch on `replicas` FSDP groups with reduce_dtype `reduce`, each world rank on rows
 * of its own: into grads (rank 0; P floats, flat layout) the whole gradient of every tensor,
 * the sum over all ranks' rows (finish_grads with count 1). Checks that every replica holds
 * the same gradient shards, bit for bit, and that the counters are the predicted ones. */
static void hsdp_step(int replicas, mxi_wire_dtype reduce, const char *mode, bool lp, float *grads) {
    mx_model_config c = moe_config(true);
    setup s;
    if (make_hsdp(&s, &c, "mxfp8", mode, true, lp, replicas, reduce)) return;
    mxi_comm *world = world_comm();
    int W = mxi_comm_world(world), rank = mxi_comm_rank(world), F = W / replicas;
    int32_t in[18], tg[18];
    for (int i = 0; i < 18; i++) in[i] = (i * 37 + 11 + 29 * rank) % 257, tg[i] = (i * 53 + 5 + 71 * rank) % 257;
    mx_model_forward(s.model, in, tg);
    mx_model_backward(s.model, 1.0f);
    mx_diag diag = {{0}};
    CHECK_EQ_INT(mx_model_error(s.model, &diag), 0);
    CHECK_EQ_INT(mxi_fsdp_end_backward(s.fsdp, &diag), 0);
    mxi_fsdp_finish_grads(s.fsdp, 1.0);
    CHECK_EQ_INT(mxi_fsdp_replicas(s.fsdp), replicas);
    CHECK_EQ_INT(mxi_fsdp_replica(s.fsdp), rank / F);
    // the counters: as predicted; all-reduced = reduce-scattered / F, one per reduce-scatter
    mxi_fsdp_counters k = mxi_fsdp_counters_of(s.fsdp), e;
    mxi_fsdp_memory mem;
    mxi_fsdp_options fo = {.param_bf16 = true, .reduce = reduce, .reshard_after_forward = true, .forward_prefetch = 1,
                           .backward_prefetch = 1, .low_precision = lp, .gather_all = strcmp(mode, "all") == 0,
                           .replicas = replicas};
    CHECK_EQ_INT(mxi_fsdp_expected(s.model, &fo, W, &e, &mem, &diag), 0);
    CHECK_EQ_INT(k.ag_param_bytes, e.ag_param_bytes);
    CHECK_EQ_INT(k.ag_mx_data_bytes, e.ag_mx_data_bytes);
    CHECK_EQ_INT(k.ag_mx_scale_bytes, e.ag_mx_scale_bytes);
    CHECK_EQ_INT(k.ag_bf16_equiv, e.ag_bf16_equiv);
    CHECK_EQ_INT(k.rs_bytes, e.rs_bytes);
    CHECK_EQ_INT(k.ar_bytes, e.ar_bytes);
    CHECK_EQ_INT(k.all_gathers, e.all_gathers);
    CHECK_EQ_INT(k.reduce_scatters, 4);   // the root, the embedding, two blocks
    CHECK_EQ_INT(k.all_reduces, replicas > 1 ? 4 : 0);
    CHECK_EQ_INT(k.ar_bytes * (uint64_t)F, replicas > 1 ? k.rs_bytes : 0);
    mxi_fsdp_memory have = mxi_fsdp_memory_of(s.fsdp);
    CHECK_EQ_INT(have.master, mem.master);
    CHECK_EQ_INT(have.grads, mem.grads);
    CHECK_EQ_INT(have.optimizer, mem.optimizer);
    CHECK_EQ_INT(have.mx_shards, mem.mx_shards);
    CHECK_EQ_INT(have.gathered, mem.gathered);
    if (lp) {   // the MX planes gathered within the group: what SPEC §6 says for F ranks
        uint64_t x[3];
        mxi_fsdp_expected_gather(s.model, F, 1, 1, true, &x[0], &x[1], &x[2]);
        CHECK_EQ_INT(k.ag_mx_data_bytes + k.ag_mx_scale_bytes, strcmp(mode, "all") == 0 ? x[2] : x[1]);
    }
    // every replica holds the same gradient shards: rank r's equal rank (r % F)'s, bit for bit
    uint64_t h = hash_bytes(mxi_fsdp_grads(s.fsdp), (size_t)mxi_fsdp_shard_numel(s.fsdp) * sizeof(float));
    uint64_t *all = rank == 0 ? calloc((size_t)W, sizeof *all) : NULL;
    CHECK_EQ_INT(mxi_comm_gather(world, &h, all, sizeof h, 0, "the gradient hashes", &diag), 0);
    if (all)
        for (int r = 0; r < W; r++) CHECK_EQ_HEX(all[r], all[r % F]);
    free(all);
    for (int i = 0; i < mx_model_num_tensors(s.model); i++) {
        float *dst = rank == 0 ? grads + mxi_model_tensor_shape(s.model, i).offset : NULL;
        CHECK_EQ_INT(mxi_fsdp_gather_tensor(s.fsdp, i, mxi_fsdp_grads(s.fsdp) + mxi_fsdp_span(s.fsdp, i).offset, dst, &diag), 0);
    }
    release(&s);
}

/* max |a - b| <= tol * max |b| over each tensor. */
static void check_grads_close(const float *a, const float *b, double tol) {
    mx_model_config c = moe_config(true);
    mx_model_options opt = {.batch = 1, .seq = 1, .external_params = true};
    mx_model *m = NULL;
    mx_diag diag;
    if (mx_model_create(&c, &opt, &m, &diag)) return;
    for (int i = 0; i < mx_model_num_tensors(m); i++) {
        mxi_tensor_shape t = mxi_model_tensor_shape(m, i);
        int64_t n = t.groups * t.rows * t.cols;
        double big = 0, diff = 0;
        for (int64_t j = 0; j < n; j++) {
            double d = fabs((double)a[t.offset + j] - b[t.offset + j]);
            diff = d > diff ? d : diff;
            big = fabs((double)b[t.offset + j]) > big ? fabs((double)b[t.offset + j]) : big;
        }
        if (!(diff <= tol * big)) mxt_fail(__FILE__, __LINE__, "%s: max difference %g > %g x %g", t.name, diff, tol, big);
    }
    mx_model_free(m);
}

/* HSDP on every D dividing the world against one FSDP group of all ranks: the same gradient
 * sums, exactly in fp64 (the sums of a few fp32 terms are exact there, in any order), to
 * fp32 rounding in fp32, to bf16 rounding in bf16. */
static void test_hsdp_grads(void) {
    mx_model_config c = moe_config(true);
    mx_model_options opt = {.batch = 1, .seq = 1, .external_params = true};
    mx_model *m = NULL;
    mx_diag diag;
    if (mx_model_create(&c, &opt, &m, &diag)) return;
    size_t P = (size_t)mx_model_num_params(m);
    mx_model_free(m);
    int W = mxi_comm_world(world_comm());
    bool root = mxi_comm_rank(world_comm()) == 0;
    float *one = calloc(P, 4), *rep = calloc(P, 4), *one32 = calloc(P, 4);
    hsdp_step(1, MXI_WIRE_F64, "on-demand", false, one);
    hsdp_step(1, MXI_WIRE_F32, "on-demand", false, one32);
    if (root) check_grads_close(one32, one, 1e-6);
    for (int D = 2; D <= W; D++) {
        if (W % D) continue;
        hsdp_step(D, MXI_WIRE_F64, "on-demand", false, rep);
        if (root) CHECK_MEM_EQ(rep, one, P * 4);
        hsdp_step(D, MXI_WIRE_F32, "on-demand", false, rep);
        if (root) check_grads_close(rep, one, 1e-6);
        hsdp_step(D, MXI_WIRE_BF16, "on-demand", false, rep);
        if (root) check_grads_close(rep, one, 2e-2);
        hsdp_step(D, MXI_WIRE_F32, "on-demand", true, rep);   // MX planes gathered within the groups
        hsdp_step(D, MXI_WIRE_F32, "all", true, rep);
    }
    free(one), free(rep), free(one32);
}

/* The bf16 of x, nearest even, written here from the bits (finite x: all a gradient holds). */
static float bf16_rne(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}

/* One step of micro-batches (tokens of micro-batch k shifted by k) on every rank into
 * grads: the gradient shards after finish_grads(count), widened to fp32 when they are bf16. */
/* lm_head's span of the gradient shards in the last grads_step, and whether it was sunk (one
 * rank, bf16: its gradient made a slice of the vocabulary at a time, mxi_model_sinks_grad). */
static mxi_shard_span lm_span;
static bool lm_sunk;
/* The untied embedding's span, and the world's ranks, in the last grads_step. */
static mxi_shard_span emb_span;
static int ranks_step;
/* Whether the next grads_step ties lm_head to the embedding (one tensor, both gradients). */
static bool tie_step;
/* The vocabulary of the next grads_step's model (0: moe_config's). */
static int vocab_step;

static uint64_t grads_step(mxi_wire_dtype grads, int micro, const int *which, double count, float **out, int64_t *n) {
    mx_model_config c = moe_config(true);
    c.tie_word_embeddings = tie_step;
    if (vocab_step) c.vocab_size = vocab_step;
    setup s;
    micro_batches = micro, grads_dtype = grads;
    int rc = make_with(&s, &c, "mxfp8", "on-demand", true, true, 1, MXI_WIRE_F32, NULL);
    micro_batches = 1, grads_dtype = MXI_WIRE_F32;
    if (rc) return 0;
    int rank = mxi_comm_rank(world_comm());
    mx_diag diag = {{0}};
    for (int k = 0; k < micro; k++) {
        int32_t in[18], tg[18];
        for (int i = 0; i < 18; i++)
            in[i] = (i * 37 + 11 + 29 * rank + 13 * which[k]) % 257, tg[i] = (i * 53 + 5 + 71 * rank + 7 * which[k]) % 257;
        mx_model_forward(s.model, in, tg);
        mx_model_backward(s.model, 1.0f);
        CHECK_EQ_INT(mx_model_error(s.model, &diag), 0);
        CHECK_EQ_INT(mxi_fsdp_end_backward(s.fsdp, &diag), 0);
    }
    mxi_fsdp_finish_grads(s.fsdp, count);
    *n = mxi_fsdp_shard_numel(s.fsdp);
    for (int i = 0; i < mx_model_num_tensors(s.model); i++)
        if (!strcmp(mxi_model_tensor_shape(s.model, i).name, tie_step ? "model.embed_tokens.weight" : "lm_head.weight"))
            lm_span = mxi_fsdp_span(s.fsdp, i);
        else if (!strcmp(mxi_model_tensor_shape(s.model, i).name, "model.embed_tokens.weight"))
            emb_span = mxi_fsdp_span(s.fsdp, i);
    ranks_step = mxi_comm_world(world_comm());
    lm_sunk = grads == MXI_WIRE_BF16;
    *out = malloc((size_t)*n * sizeof(float));
    const uint16_t *g16 = mxi_fsdp_grads_bf16(s.fsdp);
    CHECK((grads == MXI_WIRE_BF16) == (g16 != NULL) && (g16 != NULL) == (mxi_fsdp_grads(s.fsdp) == NULL));
    for (int64_t i = 0; i < *n; i++) {
        uint32_t u = g16 ? (uint32_t)g16[i] << 16 : 0;
        if (g16) memcpy(&(*out)[i], &u, 4);
        else (*out)[i] = mxi_fsdp_grads(s.fsdp)[i];
    }
    mxi_fsdp_memory have = mxi_fsdp_memory_of(s.fsdp), want;
    CHECK_EQ_INT(have.grads, (uint64_t)*n * (grads == MXI_WIRE_BF16 ? 2 : 4));
    mxi_fsdp_counters e;   // and the buffers as `mxtrain plan` predicts them
    mxi_fsdp_options fo = {.param_bf16 = true, .reduce = MXI_WIRE_F32, .reshard_after_forward = true, .forward_prefetch = 1,
                           .backward_prefetch = 1, .low_precision = true, .micro_batches = micro, .grads = grads,
                           .hold_bf16 = hold_bf16};
    CHECK_EQ_INT(mxi_fsdp_expected(s.model, &fo, mxi_comm_world(world_comm()), &e, &want, &diag), 0);
    CHECK_EQ_INT(have.gathered, want.gathered);
    mxi_fsdp_counters k = mxi_fsdp_counters_of(s.fsdp);   // the slices' reduce-scatters too
    CHECK_EQ_INT(k.rs_bytes, e.rs_bytes * (uint64_t)micro);
    CHECK_EQ_INT(k.reduce_scatters, e.reduce_scatters * micro);
    release(&s);
    return have.gathered;
}

/* training.main_grads_dtype bf16: the gradient shards hold each micro-batch's reduced fp32
 * gradients added in fp32 to what they hold and rounded to bf16 (nearest even), then the
 * quotient by count rounded: here against fp32 runs of each micro-batch alone, rounded by
 * this test's own bf16_rne. One micro-batch (one rank: the unit's gradients added from its
 * buffer; more: the reduce-scatter's sums) and two. lm_head's gradient is made a slice of
 * the vocabulary at a time from the rows' log-sum-exps (its softmax computed apart from the
 * cross-entropy kernel's; on more ranks each slice reduce-scattered): there within a bf16
 * ulp, mostly the same bits; the embedding's, summed per token in row order, is exact on one
 * rank. ce_rows: mxi_model_ce_rows. */
static void main_grads_bf16(int ce_rows, bool tie) {
    mxi_model_ce_rows(ce_rows);
    tie_step = tie;
    const int ab[2] = {0, 1}, b_only[1] = {1};
    float *a = NULL, *b = NULL, *one = NULL, *two = NULL;
    int64_t na = 0, nb = 0, n1 = 0, n2 = 0;
    uint64_t wide = grads_step(MXI_WIRE_F32, 1, ab, 1.0, &a, &na);
    grads_step(MXI_WIRE_F32, 1, b_only, 1.0, &b, &nb);
    uint64_t sunk = grads_step(MXI_WIRE_BF16, 1, ab, 1.0, &one, &n1);
    if (mxi_comm_world(world_comm()) > 1 && vocab_step) {
        // more ranks: the vocabulary table's unsharded fp32 gradient and its reduce-scatter
        // buffers (V x C each) give way to one slice of it (here the whole table)
        mx_model_config c = moe_config(true);
        CHECK_EQ_INT(wide - sunk >= (uint64_t)vocab_step * (uint64_t)c.hidden_size * 4, 1);
    }
    grads_step(MXI_WIRE_BF16, 2, ab, 2.0, &two, &n2);
    CHECK(na > 0 && na == nb && na == n1 && na == n2 && lm_span.numel > 0);
    int64_t bad1 = 0, bad2 = 0, nonzero = 0, held = 0, lm_same = 0, lm_far = 0;
    float big = 0;   // lm_head's largest gradient
    for (int64_t i = lm_span.offset; i < lm_span.offset + lm_span.numel && i < na; i++) big = fmaxf(big, fabsf(a[i]));
    for (int64_t i = 0; i < na && i < nb && i < n1 && i < n2; i++) {
        float w1 = bf16_rne(a[i]), w2 = bf16_rne(bf16_rne(bf16_rne(a[i]) + b[i]) / 2.0f);
        nonzero += a[i] != 0 && a[i] != w1;
        held += a[i] != 0;
        // more ranks: the untied embedding's slices are summed over the ranks by another
        // reduce-scatter than its unit's, whose order of additions may differ (4 ranks)
        if (lm_sunk && ranks_step > 2 && !tie_step && i >= emb_span.offset && i < emb_span.offset + emb_span.numel) {
            lm_far += fabsf(one[i] - w1) > fabsf(w1) / 128 || fabsf(two[i] - w2) > 2 * fabsf(w2) / 128;
            continue;
        }
        if (lm_sunk && i >= lm_span.offset && i < lm_span.offset + lm_span.numel) {
            lm_same += one[i] == w1;
            // where a sum over rows cancels, the softmax's ulps of its terms remain: an ulp of
            // the largest (tied: of lm_head's and the embedding's parts)
            float tol = tie_step ? big / 256 : big / 4096;
            lm_far += fabsf(one[i] - w1) > fabsf(w1) / 128 + tol || fabsf(two[i] - w2) > 2 * fabsf(w2) / 128 + tol;
            continue;
        }
        bad1 += one[i] != w1;
        bad2 += two[i] != w2;
    }
    CHECK_EQ_INT(bad1, 0);
    CHECK_EQ_INT(bad2, 0);
    CHECK_EQ_INT(lm_far, 0);
    if (lm_sunk) CHECK(lm_same > lm_span.numel * 9 / 10);
    CHECK(nonzero * 4 >= held);   // the fp32 gradients are not bf16 values already (a rank may hold padding only)
    free(a), free(b), free(one), free(two);
    mxi_model_ce_rows(0);
    tie_step = false;
}

/* As it comes, and with the logits made 8 rows at a time (the one-rank sunk lm_head then
 * takes 3 chunks of rows and 3 slices of the vocabulary), untied and tied (the embedding's
 * rows then added, and rounded, after lm_head's: within a bf16 ulp again). */
static void test_main_grads_bf16(void) {
    main_grads_bf16(0, false);
    main_grads_bf16(8, false);
    main_grads_bf16(8, true);
    vocab_step = 4099;   // the tables larger than a block: on more ranks their buffers dominate
    main_grads_bf16(0, true);
    vocab_step = 0;
}

/* The vocabulary tables held as bf16 bits in their unit buffers (hold_bf16: the root's
 * tied embedding and lm_head, V x C): the same gradients, bit for bit, as held widened to
 * fp32 (the same bf16 values reach the products, and the lookup widens them as the gather
 * did); the buffers smaller, as predicted. Whatever the CPU: where the
 * products are not bf16, the held bits are widened for each. */
static void test_hold_bf16(void) {
    const int first[1] = {0};
    float *a = NULL, *b = NULL;
    int64_t na = 0, nb = 0;
    uint64_t wide = grads_step(MXI_WIRE_F32, 1, first, 1.0, &a, &na);
    hold_bf16 = true;
    uint64_t held = grads_step(MXI_WIRE_F32, 1, first, 1.0, &b, &nb);
    hold_bf16 = false;
    CHECK(na > 0 && na == nb);
    if (a && b && na == nb) CHECK_MEM_EQ(a, b, (size_t)na * sizeof(float));
    // lm_head's V x C (257 x 80) in the root's buffer 2 bytes an element smaller at least (the
    // embedding's unit shares the block buffers, sized by the largest unit)
    CHECK(wide - held >= ((uint64_t)257 * 80 * 4 + 63) / 64 * 64 - ((uint64_t)257 * 80 * 2 + 63) / 64 * 64);
    free(a), free(b);
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
        {"planes_identical_tensorwise", test_planes_tensorwise},
        {"planes_identical_rowwise", test_planes_rowwise},
        {"planes_identical_blockwise", test_planes_blockwise},
        {"gather_bytes_rowwise", test_gather_bytes_rowwise},
        {"planes_identical_delayed", test_planes_delayed},
        {"gather_bytes", test_gather_bytes},
        {"gather_recompute", test_gather_recompute},
        {"one_rank_buffers", test_one_rank_buffers},
        {"shard_cache", test_shard_cache},
        {"planes_identical_hsdp", test_planes_hsdp},
        {"hsdp_grads", test_hsdp_grads},
        {"main_grads_bf16", test_main_grads_bf16},
        {"hold_bf16", test_hold_bf16},
        {"planes_identical_ep", test_planes_ep},
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
