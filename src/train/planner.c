/* The planner behind `mxtrain plan` (see include/mxtrain/train.h): a config's layout of the
 * ranks and what one step of it costs each rank, from the config alone, and the options the
 * trainer derives from a config for the model and the FSDP engine, so that a plan and a run
 * agree. */
#include <stdio.h>
#include <string.h>

#include "core/diag.h"
#include "core/host.h"
#include "distributed/fsdp.h"
#include "model/delayed.h"
#include "model/units.h"
#include "mxtrain/tokens.h"
#include "mxtrain/train.h"
#include "train/moments.h"
#include "train/planner.h"

static int dense_layout(const mx_config *cfg, int ranks, int D, int F, mx_layout *out, mx_diag *diag);

/* Micro-batches per optimizer step on `ranks` ranks: gradient_accumulation_steps, or
 * Megatron's training.global_batch_size / (micro_batch_size x ranks), which must divide it
 * (and agree with gradient_accumulation_steps where both are given). */
static int accumulation_of(const mx_config *cfg, int ranks, int *out, mx_diag *diag) {
    const mx_training_config *tc = &cfg->training;
    *out = tc->gradient_accumulation_steps;
    if (!tc->global_batch_size) return MX_OK;
    mx_origin gbs, accum;
    mx_config_origin(cfg, "training.global_batch_size", &gbs);
    mx_config_origin(cfg, "training.gradient_accumulation_steps", &accum);
    char at[32] = "";
    if (gbs.line) snprintf(at, sizeof at, ":%d", gbs.line);
    long long per = (long long)tc->micro_batch_size * ranks;
    if (tc->global_batch_size % per)
        return mxi_diag(diag, MX_ECONFIG, "%s%s: training.global_batch_size: %d is not a multiple of micro_batch_size "
                        "%d x %d rank%s = %lld (allowed: a multiple of %lld)", cfg->source, at, tc->global_batch_size,
                        tc->micro_batch_size, ranks, ranks == 1 ? "" : "s", per, per);
    int steps = (int)(tc->global_batch_size / per);
    if (accum.kind != MX_ORIGIN_DEFAULT && steps != tc->gradient_accumulation_steps)
        return mxi_diag(diag, MX_ECONFIG, "%s%s: training.global_batch_size: %d is micro_batch_size %d x %d rank%s x %d "
                        "accumulation step%s, but gradient_accumulation_steps is %d (allowed: one of the two, or "
                        "values that agree)", cfg->source, at, tc->global_batch_size, tc->micro_batch_size, ranks,
                        ranks == 1 ? "" : "s", steps, steps == 1 ? "" : "s", tc->gradient_accumulation_steps);
    *out = steps;
    return MX_OK;
}

int mx_parallel_layout(const mx_config *cfg, int ranks, mx_layout *out, mx_diag *diag) {
    if (!cfg || !out) return mxi_diag(diag, MX_ENULL, "mx_parallel_layout: NULL argument");
    if (ranks < 1) return mxi_diag(diag, MX_EINVAL, "ranks: %d is not allowed (allowed: >= 1)", ranks);
    int D = cfg->parallel.data_parallel_size, F = cfg->parallel.fully_shard_parallel_size;
    *out = (mx_layout){.ranks = ranks, .data_parallel_size = 1, .fully_shard_parallel_size = ranks,
                       .expert_parallel_size = 1, .expert_fully_shard_parallel_size = 1,
                       .expert_data_parallel_size = 1, .accumulation = 1};
    int arc = accumulation_of(cfg, ranks, &out->accumulation, diag);
    if (arc) return arc;
    int ep = cfg->parallel.expert_parallel_size > 1 ? cfg->parallel.expert_parallel_size : 1;
    int EF = cfg->parallel.expert_fully_shard_parallel_size, ED = cfg->parallel.expert_data_parallel_size;
    const mx_model_config *mc = &cfg->model;
    if (ep == 1 && (EF || ED))   // they lay out the experts of EP ranks: nothing to lay out without
        return mxi_diag(diag, MX_ECONFIG, "%s: parallel.%s: %d needs parallel.expert_parallel_size > 1 (it is 1%s; "
                        "allowed: auto, or leave it out)", cfg->source,
                        EF ? "expert_fully_shard_parallel_size" : "expert_data_parallel_size", EF ? EF : ED,
                        mc->type != MX_MODEL_QWEN3_MOE || mc->num_experts < 1 ? ", and the model has no experts" : "");
    if (ep > 1 && (mc->type != MX_MODEL_QWEN3_MOE || mc->num_experts < 1))
        return mxi_diag(diag, MX_ECONFIG, "%s: parallel.expert_parallel_size: %d needs an MoE model (model.model_type "
                        "is not qwen3_moe or it has no experts; allowed: 1)", cfg->source, ep);
    if (ep > 1 && mc->num_experts % ep)
        return mxi_diag(diag, MX_ECONFIG, "%s: parallel.expert_parallel_size: %d does not divide model.num_experts: %d "
                        "(allowed: a divisor of %d)", cfg->source, ep, mc->num_experts, mc->num_experts);
    if (ep > 1 && ranks % ep)
        return mxi_diag(diag, MX_ECONFIG, "%s: parallel.expert_parallel_size: %d does not divide this job of %d rank%s "
                        "(allowed: a divisor of %d)", cfg->source, ep, ranks, ranks == 1 ? "" : "s", ranks);
    out->expert_parallel_size = ep;
    int rc = dense_layout(cfg, ranks, D, F, out, diag);
    if (rc || ep == 1) return rc;
    // the experts: EDP x EFSDP x EP; by default the expert shard group is the FSDP group's
    // ranks of one EP rank (EFSDP = F / EP) and the expert replicas the dense ones
    char ef[16] = "auto", ed[16] = "auto";
    if (EF) snprintf(ef, sizeof ef, "%d", EF);
    if (ED) snprintf(ed, sizeof ed, "%d", ED);
    int rest = ranks / ep;   // EFSDP x EDP
    bool fits = EF && ED ? (long long)EF * ED == rest : EF ? rest % EF == 0 : ED ? rest % ED == 0 : true;
    if (!fits)
        return mxi_diag(diag, MX_ECONFIG, "%s: parallel.expert_data_parallel_size: %s x "
                        "parallel.expert_fully_shard_parallel_size: %s x parallel.expert_parallel_size: %d does not fit "
                        "this job of %d ranks (allowed: expert_data_parallel_size x expert_fully_shard_parallel_size = %d / %d "
                        "= %d, either may be auto)", cfg->source, ed, ef, ep, ranks, ranks, ep, rest);
    if (!EF && !ED) EF = out->fully_shard_parallel_size % ep == 0 ? out->fully_shard_parallel_size / ep : 1;
    if (!EF) EF = rest / ED;
    out->expert_fully_shard_parallel_size = EF;
    out->expert_data_parallel_size = rest / EF;
    return MX_OK;
}

/* The dense part of mx_parallel_layout. */
static int dense_layout(const mx_config *cfg, int ranks, int D, int F, mx_layout *out, mx_diag *diag) {
    if (!D && !F) return MX_OK;   // one FSDP group of every rank
    char d[16] = "auto", f[16] = "auto";
    if (D) snprintf(d, sizeof d, "%d", D);
    if (F) snprintf(f, sizeof f, "%d", F);
    int known = D ? D : F;
    bool fits = D && F ? (long long)D * F == ranks : ranks % known == 0;
    if (!fits) {
        char why[96];
        if (D && F) snprintf(why, sizeof why, "%d x %d = %lld", D, F, (long long)D * F);
        else snprintf(why, sizeof why, "%d does not divide %d", known, ranks);
        return mxi_diag(diag, MX_ECONFIG, "%s: parallel.data_parallel_size: %s x parallel.fully_shard_parallel_size: %s "
                        "does not fit this job of %d rank%s (%s; allowed: sizes whose product is %d, either may be "
                        "auto)", cfg->source, d, f, ranks, ranks == 1 ? "" : "s", why, ranks);
    }
    out->data_parallel_size = D ? D : ranks / F;
    out->fully_shard_parallel_size = ranks / out->data_parallel_size;
    return MX_OK;
}

/* What the config says (recompute keeps the gather mode: the engine gathers both planes where
 * a recomputed block's backward needs them). */
mxi_fsdp_options mxi_train_fsdp_options(const mx_config *cfg, mx_model *model, const mx_layout *layout) {
    const mx_parallel_config *pc = &cfg->parallel;
    const mx_plan *plan = &cfg->training.quantization_plan;
    bool lp = mx_model_converted_modules(model) > 0 && mx_plan_low_precision_gather(plan);
    bool all = plan->all_gather_mode == MX_AG_ALL;
    mxi_wire_dtype reduce = pc->reduce_dtype == MX_DTYPE_BF16 ? MXI_WIRE_BF16
                            : pc->reduce_dtype == MX_DTYPE_FP64 ? MXI_WIRE_F64 : MXI_WIRE_F32;
    return (mxi_fsdp_options){
        .param_bf16 = pc->param_dtype == MX_DTYPE_BF16,
        .hold_bf16 = mx_model_bf16_native(model),   // the model computes in bf16 with param_dtype bf16
        .reduce = reduce,
        .reshard_after_forward = pc->reshard_after_forward,
        .forward_prefetch = pc->num_to_forward_prefetch,
        .backward_prefetch = pc->num_to_backward_prefetch,
        .low_precision = lp,
        .gather_all = all,
        .quant_stats = cfg->training.quant_stats_interval > 0,
        .replicas = layout->data_parallel_size,
        .expert_parallel = layout->expert_parallel_size,
        .expert_replicas = layout->expert_data_parallel_size,
        .micro_batches = layout->accumulation,
        .grads = cfg->training.main_grads_dtype == MX_DTYPE_BF16 ? MXI_WIRE_BF16 : MXI_WIRE_F32,
        .moment_bytes32 = mxi_moment_bytes(cfg->training.exp_avg_dtype, 32, 0) +
                          mxi_moment_bytes(cfg->training.exp_avg_sq_dtype, 32, 0),
        .moment_bytes_span = mxi_moment_bytes(cfg->training.exp_avg_dtype, 0, 1) +
                             mxi_moment_bytes(cfg->training.exp_avg_sq_dtype, 0, 1),
    };
}

const char *mxi_train_gather_mode(const mx_config *cfg, const mxi_fsdp_options *fo) {
    return !fo->low_precision ? (cfg->parallel.param_dtype == MX_DTYPE_BF16 ? "bf16" : "fp32")
                              : fo->gather_all ? "all" : "on-demand";
}

mx_model_documents mxi_train_documents(const mx_config *cfg) {
    const mx_data_config *d = &cfg->data;
    return (mx_model_documents){.eod_token = d->eod_token_id >= 0 ? d->eod_token_id : MX_PREPARE_EOT,
                                .reset_attention_mask = d->reset_attention_mask,
                                .reset_position_ids = d->reset_position_ids, .eod_mask_loss = d->eod_mask_loss};
}

mx_model_options mxi_train_model_options(const mx_config *cfg, const mx_layout *layout, int B, int T) {
    const mx_parallel_config *pc = &cfg->parallel;
    mx_model_options opt = {.batch = B, .seq = T, .bf16 = pc->param_dtype == MX_DTYPE_BF16,
                            .plan = &cfg->training.quantization_plan, .external_params = true,
                            .expert_parallel = layout->expert_parallel_size,
                            .ep_modules = pc->ep_modules, .n_ep_modules = pc->n_ep_modules,
                            .ep_dispatch = pc->ep_dispatch_dtype, .ep_overlap = pc->ep_overlap,
                            .z_loss_coef = cfg->training.moe_z_loss_coeff};
    if (cfg->features.recompute)   // on-demand gathers both planes for the backward of a recomputed block
        opt.recompute = cfg->features.recompute_modules, opt.n_recompute = cfg->features.n_recompute_modules;
    opt.recompute_granularity = cfg->features.recompute_granularity;
    opt.documents = mxi_train_documents(cfg);
    return opt;
}

/* The smallest model of this config: the layout is what counts, not the activations. */
static int layout_model(const mx_config *cfg, const mx_layout *layout, mx_model **m, mx_diag *diag) {
    mx_model_options opt = mxi_train_model_options(cfg, layout, 1, 1);
    return mx_model_create(&cfg->model, &opt, m, diag);
}

int mx_gather_bytes_expected(const mx_config *cfg, const mx_layout *layout, uint64_t *bf16, uint64_t *on_demand,
                             uint64_t *all, mx_diag *diag) {
    *bf16 = *on_demand = *all = 0;
    if (layout->fully_shard_parallel_size < 1)
        return mxi_diag(diag, MX_EINVAL, "fully_shard_parallel_size: %d is not allowed (allowed: >= 1)",
                        layout->fully_shard_parallel_size);
    mx_model *m = NULL;
    int rc = layout_model(cfg, layout, &m, diag);
    if (rc) return rc;
    mxi_fsdp_expected_gather(m, layout->fully_shard_parallel_size, layout->expert_parallel_size,
                             layout->expert_fully_shard_parallel_size, cfg->parallel.reshard_after_forward, bf16,
                             on_demand, all);
    mx_model_free(m);
    uint64_t micro = (uint64_t)layout->accumulation;   // every micro-batch gathers again
    *bf16 *= micro, *on_demand *= micro, *all *= micro;
    return MX_OK;
}

/* The EP exchanges of one optimizer step per rank (docs/distributed.md#expert-parallelism):
 * per EP layer and micro-batch, R = micro_batch_size x seq_length x num_experts_per_tok
 * routed rows, each exchange moving them in its wire format; a recomputed block's forward
 * exchanges run twice. Worst case: all R rows of this rank leave it, and all R of each other
 * rank come to it (and go back); uniform routing: (EP - 1) / EP of that each way, i.e. R
 * (EP - 1) / EP rows out and as many in. */
static void predict_ep(const mx_config *cfg, const mx_model *m, const mx_layout *layout, mx_step_prediction *out) {
    int ep = layout->expert_parallel_size;
    if (ep <= 1) return;
    static const char *const wires[] = {"fp32", "bf16", "mxfp8"};
    uint64_t R = (uint64_t)cfg->training.micro_batch_size * cfg->data.seq_length * cfg->model.num_experts_per_tok;
    uint64_t micro = (uint64_t)layout->accumulation, C = (uint64_t)cfg->model.hidden_size;
    uint64_t out_bytes = 0, back_bytes = 0;   // per row sent: towards the experts, back
    for (int l = 0; l < cfg->model.num_hidden_layers; l++) {
        if (!mxi_model_ep_layer(m, l)) continue;
        uint64_t fwd = 1 + (uint64_t)mxi_model_unit_recomputes(m, l + 1);
        out_bytes += fwd * mxi_ep_row_bytes(mxi_model_ep_wire(m, l, MXI_EP_FWD_DISPATCH), (int64_t)C) +
                     mxi_ep_row_bytes(mxi_model_ep_wire(m, l, MXI_EP_BWD_DISPATCH), (int64_t)C);
        back_bytes += fwd * mxi_ep_row_bytes(mxi_model_ep_wire(m, l, MXI_EP_FWD_COMBINE), (int64_t)C) +
                      mxi_ep_row_bytes(mxi_model_ep_wire(m, l, MXI_EP_BWD_COMBINE), (int64_t)C);
        const char *w = wires[mxi_model_ep_wire(m, l, MXI_EP_FWD_DISPATCH)];
        out->dispatch_wire = !out->dispatch_wire || !strcmp(out->dispatch_wire, w) ? w : "mixed";
    }
    out->dispatch_worst_bytes = micro * R * out_bytes;
    out->combine_worst_bytes = micro * R * (uint64_t)(ep - 1) * back_bytes;
    out->dispatch_uniform_bytes = (double)out->dispatch_worst_bytes * (ep - 1) / ep;
    out->combine_uniform_bytes = (double)out->combine_worst_bytes / ep;
}

/* The products' scratch, an estimate (docs/memory.md#the-parts): per token row of the widest
 * layer, the copies of a product's input and of a shared input in its operand dtype (bf16
 * with a native bf16 matmul, else fp32; none at fp32 compute), and for converted layers the
 * input's and the output gradient's MX planes; besides, the bf16 copy of the largest weight a
 * product rounds at each call (unconverted and not held as bf16 in its unit buffer). */
static uint64_t workspace_bytes(const mx_config *cfg, mx_model *m, const mxi_fsdp_options *fo) {
    const mx_model_config *c = &cfg->model;
    uint64_t rows = (uint64_t)cfg->training.micro_batch_size * (uint64_t)cfg->data.seq_length;
    int64_t wide = c->hidden_size;
    int64_t dims[] = {c->intermediate_size, (int64_t)c->num_attention_heads * c->head_dim, 2 * (int64_t)c->moe_intermediate_size};
    for (int i = 0; i < 3; i++) wide = dims[i] > wide ? dims[i] : wide;
    bool bf16 = cfg->parallel.param_dtype == MX_DTYPE_BF16, native = bf16 && mx_model_bf16_native(m);
    uint64_t per_row = !bf16 ? 0 : native ? 2 + 2 : 4 + 4, weight = 0;
    if (mx_model_converted_modules(m) > 0) per_row += 3;   // an input plane; dY's rowwise and colwise planes
    for (int i = 0; native && i < mx_model_num_tensors(m); i++) {
        mxi_tensor_shape t = mxi_model_tensor_shape(m, i);
        uint64_t n = (uint64_t)(t.groups * t.rows * t.cols);
        bool held = fo->hold_bf16 && mxi_model_takes_bf16(m, i);
        if (t.decay && !t.converted && !held && 2 * n > weight) weight = 2 * n;
    }
    return rows * (uint64_t)wide * per_row + weight;
}

int mx_predict_step(const mx_config *cfg, const mx_layout *layout, mx_step_prediction *out, mx_diag *diag) {
    memset(out, 0, sizeof *out);
    if (layout->data_parallel_size < 1 || layout->fully_shard_parallel_size < 1 ||
        (long long)layout->data_parallel_size * layout->fully_shard_parallel_size != layout->ranks)
        return mxi_diag(diag, MX_EINVAL, "mx_predict_step: %d x %d is not a layout of %d ranks",
                        layout->data_parallel_size, layout->fully_shard_parallel_size, layout->ranks);
    mx_model *m = NULL;
    int rc = layout_model(cfg, layout, &m, diag);
    if (rc) return rc;
    mxi_fsdp_options fo = mxi_train_fsdp_options(cfg, m, layout);
    predict_ep(cfg, m, layout, out);
    mxi_fsdp_counters c;
    mxi_fsdp_memory mem;
    rc = mxi_fsdp_expected(m, &fo, layout->ranks, &c, &mem, diag);
    uint64_t workspace = workspace_bytes(cfg, m, &fo), scaling = mxi_delayed_bytes(mxi_model_delayed(m));
    mx_model_free(m);
    if (rc) return rc;
    size_t act = 0;   // the activations of the run's micro-batch, measured, not allocated
    mx_model_options opt = mxi_train_model_options(cfg, layout, cfg->training.micro_batch_size, cfg->data.seq_length);
    if ((rc = mx_model_measure_activations(&cfg->model, &opt, &act, diag))) return rc;
    uint64_t micro = (uint64_t)layout->accumulation;   // the counters are per micro-batch
    mx_step_prediction ep = *out;
    *out = (mx_step_prediction){
        .ag_param_bytes = c.ag_param_bytes * micro,
        .ag_mx_data_bytes = c.ag_mx_data_bytes * micro,
        .ag_mx_scale_bytes = c.ag_mx_scale_bytes * micro,
        .ag_bf16_equiv = c.ag_bf16_equiv * micro,
        .rs_bytes = c.rs_bytes * micro,
        .ar_bytes = c.ar_bytes * micro,
        .master_bytes = mem.master,
        .grad_bytes = mem.grads,
        .optimizer_bytes = mem.optimizer,
        .mx_shard_bytes = mem.mx_shards,
        .gathered_bytes = mem.gathered,
        .activation_bytes = act,
        .workspace_bytes = workspace,
        .scaling_state_bytes = scaling,
        .process_bytes = mxi_host_self_rss_bytes(),
        .gather_mode = mxi_train_gather_mode(cfg, &fo),
        .expert_shard_bytes = mem.expert_shards,
        .expert_unit_bytes = mem.expert_unit,
        .expert_grad_bytes = mem.expert_grad,
        .dispatch_worst_bytes = ep.dispatch_worst_bytes,
        .combine_worst_bytes = ep.combine_worst_bytes,
        .dispatch_uniform_bytes = ep.dispatch_uniform_bytes,
        .combine_uniform_bytes = ep.combine_uniform_bytes,
        .dispatch_wire = ep.dispatch_wire,
    };
    return MX_OK;
}

uint64_t mx_predicted_bytes(const mx_step_prediction *p) {
    return p->master_bytes + p->grad_bytes + p->optimizer_bytes + p->mx_shard_bytes + p->gathered_bytes +
           p->activation_bytes + p->workspace_bytes + p->scaling_state_bytes + p->process_bytes;
}
