#!/bin/bash
# Expert parallelism end to end (docs/distributed.md#expert-parallelism), with mpirun as CI
# runs it (root, --oversubscribe):
#  - EP=2 on 2 ranks and EP=4 on 4 ranks (one row each) give, within 1e-5 relative in fp32,
#    the losses and gradient norms of one rank whose micro-batch is the EP group's rows
#    concatenated in rank order (micro_batch_size x EP; the loader gives rank r the rows
#    after ranks 0..r-1's), with the load-balancing loss on; EP=2 on 4 ranks (two EP groups)
#    those of 2 ranks with 2 rows each, also with HSDP (2 x 2);
#  - groups of 0 tokens: 8 experts, top-1, 3 tokens per rank, EP=4: every rank sends rows to
#    at most 3 of the 4 ranks, so some (source, expert rank) pairs carry nothing, and experts
#    get no token at all; still the single rank's losses;
#  - dispatch_bytes and combine_bytes in the metrics: 0 without EP; with EP the fp32 rows
#    that left rank 0, the same rows in every pass (forward and backward; recompute's second
#    forward a third), at most its routed rows towards the experts and the other ranks' back;
#  - with the MXFP8 plan (bf16, fp64 reductions) EP=2 is the concatenated rank (close),
#    and EP=2 x EFSDP=2 on 4 ranks 2 ranks of 2 rows, gathering the bytes plan predicts;
#  - the experts' layout: EP=2 with EFSDP=2 or EFSDP=1 x EDP=2 on one FSDP group of 4, and on
#    2 x 2 HSDP, give the losses of 2 ranks of 2 rows (fp32; bf16 with fp64 reductions: close,
#    below); every
#    step's byte and memory counters equal plan's (--ep --efsdp --edp), the experts' shards
#    are what their shapes give and their gathered buffers 1/EP of those without EP;
#  - checkpoints across expert layouts: EP=2 x EFSDP=2 saves (trainer_state.json records the
#    expert layout), one rank and EP=4 resume and continue its losses; the file holds the
#    tensors one rank writes;
#  - bad layouts stop the job at start with one line naming the keys, and write nothing
#    (expert sizes that do not multiply to the ranks, or given without EP or experts).
#  - parallel.ep_plan (docs/distributed.md#expert-parallelism): in bf16 the default dispatch
#    (auto: bf16 rows where the experts' GEMMs round them to bf16 anyway) gives exactly the
#    losses of fp32 rows, and EP=2 / EP=4 the one rank's within 1e-5; the counters are the
#    routed rows (dispatch_rows, combine_rows) times each exchange's row bytes, computed
#    here from the config; apply_modules selecting one of two MoE layers exchanges only
#    there and still gives the one rank's losses; with the MXFP8 plan, mxfp8 dispatch gives
#    bit for bit the first step's loss of fp32 dispatch (the forward reads the same FC1
#    codes, quantized on the sending rank) and stays within 1e-2 of bf16 dispatch over 20
#    steps, its dispatch bytes per row 33/64 of bf16's; top-k = num_experts; every token
#    routed to one expert (a zero router) gives the combine bytes of `mxtrain plan`'s worst
#    case exactly, and every run's counters lie within [0, plan's worst case]; bad ep_plan
#    values are one-line errors before any work.
# tests/run: launches MPI ranks
. "$(dirname "$0")/common.bash"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
export OMPI_MCA_btl_vader_single_copy_mechanism=none

prep=$("$bin" prepare --out "$tmp/data" 2>&1) || fail "prepare failed: $prep"

# write_config FILE MICRO SEQ EXPERTS TOPK PARALLEL [TRAINING]: 5 steps, 2 micro-batches each
write_config() {
    cat > "$1" <<YAML
model:
  model_type: qwen3_moe
  vocab_size: 257
  hidden_size: 64
  intermediate_size: 96
  num_hidden_layers: 2
  num_attention_heads: 4
  num_key_value_heads: 2
  head_dim: 16
  max_position_embeddings: 64
  num_experts: $4
  num_experts_per_tok: $5
  moe_intermediate_size: 40
  norm_topk_prob: true
  output_router_logits: true
  router_aux_loss_coef: 0.05
data:
  data_path: $tmp/data/train_*.bin
  seq_length: $3
parallel:
  fsdp_plan:
    param_dtype: ${DTYPE:-fp32}
    reduce_dtype: ${REDUCE:-fp32}
$6
training:
  micro_batch_size: $2
  gradient_accumulation_steps: 2
  seed: 5
  lr: 3.0e-3
  lr_warmup_ratio: 0.2
  weight_decay: 0.1
  train_iters: 5
  clip_grad: 1.0
  log_interval: 100
  metrics_path: $1.jsonl
${7:-}
YAML
}
# same A B: B's losses (and their cross-entropy and aux parts) and gradient norms equal A's
# within 1e-5 relative, the learning rates exactly
same() {
    $py - "$1.jsonl" "$2.jsonl" <<'PY' || fail "$2 does not give $1's losses"
import json, sys
a, b = ([r for r in map(json.loads, open(p)) if "loss" in r] for p in sys.argv[1:3])
assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2, 3, 4, 5], ([r["step"] for r in a], [r["step"] for r in b])
for x, y in zip(a, b):
    for k in "loss", "ce_loss", "aux_loss", "grad_norm":
        assert abs(x[k] - y[k]) <= 1e-5 * abs(x[k]), f"step {x['step']}: {k} {x[k]!r} vs {y[k]!r}"
    assert x["lr"] == y["lr"], (x["step"], x["lr"], y["lr"])
assert a[0]["aux_loss"] > 0, a[0]
PY
}
# close A B: in bf16, B's losses against A's: step 1 within 1e-5, the later steps within
# 1e-3. Near 1e-5 bf16 runs on different layouts part anyway: sums over different token
# counts (the weight gradients over 19 or 38 rows; attention's products on other batch
# shapes) round apart in their last bits, a probability or weight then lands across a bf16
# rounding boundary, and the runs drift apart by 1e-6 to 1e-4 in 5 steps, whatever the
# learning rate (the dispatch has no part in it: below, bf16 rows give fp32 rows' losses
# bit for bit)
close() {
    $py - "$1.jsonl" "$2.jsonl" <<'PY' || fail "$2 does not give $1's losses (step 1 within 1e-5, the others 1e-3)"
import json, sys
a, b = ([r for r in map(json.loads, open(p)) if "loss" in r] for p in sys.argv[1:3])
assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2, 3, 4, 5]
for k in "loss", "ce_loss", "aux_loss", "grad_norm":
    assert abs(a[0][k] - b[0][k]) <= 1e-5 * abs(a[0][k]), (k, a[0][k], b[0][k])
for x, y in zip(a, b):
    assert abs(x["loss"] - y["loss"]) <= 1e-3 * abs(x["loss"]), (x["step"], x["loss"], y["loss"])
PY
}
# bytes CONFIG EP C ROWS PASSES: dispatch_bytes and combine_bytes 0 without EP; with EP
# multiples of PASSES rows of C fp32 and at most PASSES exchanges per MoE layer (2) and
# micro-batch (2) of ROWS routed rows per rank (towards the experts), (EP - 1) ROWS (back)
bytes() {
    $py - "$1.jsonl" "$2" "$3" "$4" "$5" <<'PY' || fail "$1: dispatch/combine bytes are wrong"
import json, sys
ep, C, rows, passes = map(int, sys.argv[2:])
for r in (r for r in map(json.loads, open(sys.argv[1])) if "loss" in r):
    d, c = r["dispatch_bytes"], r["combine_bytes"]
    if ep == 1:
        assert d == c == 0, r
    else:
        # each pass moves the same rows: towards the experts at most this rank's routed rows,
        # back at most the other ranks'
        unit = passes * C * 4
        assert d % unit == 0 and c % unit == 0, (r, unit)
        assert 0 < d <= unit * 2 * 2 * rows and 0 < c <= unit * 2 * 2 * rows * (ep - 1), r
PY
}

# EP=2 on 2 ranks, EP=4 on 4 ranks: 8 experts, top-2, 1 row of 19 tokens per rank
write_config "$tmp/one2.yaml" 2 19 8 2 ""
write_config "$tmp/one4.yaml" 4 19 8 2 ""
write_config "$tmp/ep2.yaml" 1 19 8 2 "  expert_parallel_size: 2"
write_config "$tmp/ep4.yaml" 1 19 8 2 "  expert_parallel_size: 4"
train_on 1 "$tmp/one2.yaml"
train_on 1 "$tmp/one4.yaml"
train_on 2 "$tmp/ep2.yaml"
train_on 4 "$tmp/ep4.yaml"
same "$tmp/one2.yaml" "$tmp/ep2.yaml"
grep -q "4 ranks (EP groups of 4, 2 experts each)" "$tmp/ep4.yaml.log" || fail "ep4: the first line does not give the layout"
grep -q "tokens dispatched [0-9.]* MiB ([0-9.]* MiB fp32) and combined [0-9.]* MiB (fp32), last step" "$tmp/ep4.yaml.log" ||
    fail "ep4: the summary has no dispatch bytes"
grep -q "tokens dispatched" "$tmp/one4.yaml.log" && fail "one4: the summary shows dispatch bytes without EP"
same "$tmp/one4.yaml" "$tmp/ep4.yaml"
bytes "$tmp/one2.yaml" 1 64 38 2
bytes "$tmp/ep2.yaml" 2 64 38 2
bytes "$tmp/ep4.yaml" 4 64 38 2

# two EP groups of 2 in a world of 4 (one FSDP group of 4) against 2 ranks of 2 rows
write_config "$tmp/dp2.yaml" 2 19 8 2 ""
write_config "$tmp/ep2w4.yaml" 1 19 8 2 "  expert_parallel_size: 2"
train_on 2 "$tmp/dp2.yaml"
train_on 4 "$tmp/ep2w4.yaml"
same "$tmp/dp2.yaml" "$tmp/ep2w4.yaml"
# the same with HSDP (2 replicas x FSDP groups of 2): EP groups are independent of FSDP groups
write_config "$tmp/ep2h.yaml" 1 19 8 2 "  expert_parallel_size: 2
  data_parallel_size: 2"
train_on 4 "$tmp/ep2h.yaml"
same "$tmp/dp2.yaml" "$tmp/ep2h.yaml"

# the experts' layout (EDP x EFSDP x EP) independent of the dense one: on 4 ranks in one FSDP
# group, EP=2 with EFSDP=2 (the default: ep2w4 above) and EFSDP=1 x EDP=2, and EP=2 on 2x2
# HSDP with EFSDP=2 x EDP=1 (expert shard groups across the dense replicas); bf16 with fp64
# reductions too. Each gives the losses of 2 ranks of 2 rows
write_config "$tmp/ep2e1.yaml" 1 19 8 2 "  expert_parallel_size: 2
  expert_fully_shard_parallel_size: 1"
write_config "$tmp/ep2hx.yaml" 1 19 8 2 "  expert_parallel_size: 2
  data_parallel_size: 2
  expert_fully_shard_parallel_size: 2"
DTYPE=bf16 REDUCE=fp64 write_config "$tmp/bdp2.yaml" 2 19 8 2 ""
DTYPE=bf16 REDUCE=fp64 write_config "$tmp/bep2e1.yaml" 1 19 8 2 "  expert_parallel_size: 2
  expert_data_parallel_size: 2"
train_on 4 "$tmp/ep2e1.yaml"
train_on 4 "$tmp/ep2hx.yaml"
train_on 2 "$tmp/bdp2.yaml"
train_on 4 "$tmp/bep2e1.yaml"
same "$tmp/dp2.yaml" "$tmp/ep2e1.yaml"
same "$tmp/dp2.yaml" "$tmp/ep2hx.yaml"
close "$tmp/bdp2.yaml" "$tmp/bep2e1.yaml"
grep -q "experts on 4 ranks: 2 replicas x expert shard groups of 1 x EP groups of 2" <("$bin" plan "$tmp/ep2e1.yaml" --ranks 4) ||
    fail "ep2e1: plan does not give the expert layout"

# counters CONFIG RANKS EP EF ED [DP]: every step's byte and memory counters (and the experts'
# memory) equal plan's prediction, exactly; the experts' shards are what their shapes give:
# per rank E / EP experts of gate_up (80 x 64) and down (64 x 40) in each of the 2 layers,
# ceil(R / (32 EF)) x 32 rows each, 16 bytes per element (master, gradient, two moments); the
# experts in a unit buffer (fp32) and their unsharded gradients E / EP x (80 x 64 + 64 x 40) x 4
counters() {
    "$bin" plan "$1" --json --ranks "$2" --ep "$3" --efsdp "$4" --edp "$5" ${6:+--dp $6} > "$1.plan" ||
        fail "plan failed for $1"
    $py - "$1.jsonl" "$1.plan" "$3" "$4" "$5" <<'PY' || fail "$1: the counters are not plan's prediction"
import json, math, sys
steps = [r for r in map(json.loads, open(sys.argv[1])) if "loss" in r]
plan = json.load(open(sys.argv[2]))
ep, ef, ed = map(int, sys.argv[3:6])
x = plan["experts"]
assert (x["expert_parallel_size"], x["expert_fully_shard_parallel_size"], x["expert_data_parallel_size"]) == (ep, ef, ed), x
want = {k: v for k, v in plan["per_step"].items() if k != "gather_mode"}
want.update({k: v for k, v in x.items() if k.startswith("mem_")})
for r in steps:
    for k, v in want.items():
        assert r[k] == v, (r["step"], k, r[k], v)
El = 8 // ep
shards = sum(El * math.ceil(R / (32 * ef)) * 32 * K * 16 for R, K in ((80, 64), (64, 40))) * 2
unit = El * (80 * 64 + 64 * 40) * 4
assert x["mem_expert_shard_bytes"] == shards, (x, shards)
assert x["mem_expert_unit_bytes"] == x["mem_expert_grad_bytes"] == unit, (x, unit)
PY
}
counters "$tmp/ep2w4.yaml" 4 2 2 1
counters "$tmp/ep2e1.yaml" 4 2 1 2
counters "$tmp/ep4.yaml" 4 4 1 1
counters "$tmp/ep2h.yaml" 4 2 1 2 2
counters "$tmp/ep2hx.yaml" 4 2 2 1 2
# the experts gathered per block are 1/EP of those without EP (one4: all 8 experts)
$py - "$tmp/one4.yaml.jsonl" "$tmp/ep2w4.yaml.jsonl" "$tmp/ep4.yaml.jsonl" <<'PY' || fail "EP does not divide the experts' gathered memory by EP"
import json, sys
one, ep2, ep4 = (json.loads(open(p).readline()) for p in sys.argv[1:4])
for k in "mem_expert_unit_bytes", "mem_expert_grad_bytes":
    assert one[k] == 2 * ep2[k] == 4 * ep4[k] > 0, (k, one[k], ep2[k], ep4[k])
PY

# checkpoints across expert layouts (no load-balancing loss, so that any split of the global
# batch gives the same losses): EP=2 x EFSDP=2 on 4 ranks saves step 3; one rank (4 rows)
# and EP=4 on 4 ranks resume from it and continue the uninterrupted run's losses; the
# files hold every expert once, as on one rank (the format does not depend on the layout)
ckpt() {   # ckpt FILE PARALLEL MICRO [load]
    write_config "$1" "$3" 19 8 2 "$2" "  save: $tmp/ck${4:+_$(basename "$1" .yaml)}
  save_interval: 3${4:+
  load: $tmp/ck}"
    sed -i 's/output_router_logits: true/output_router_logits: false/' "$1"
}
ckpt "$tmp/cs.yaml" "  expert_parallel_size: 2
  expert_fully_shard_parallel_size: 2" 1
ckpt "$tmp/cr1.yaml" "" 4 load
ckpt "$tmp/cr4.yaml" "  expert_parallel_size: 4" 1 load
train_on 4 "$tmp/cs.yaml"
cp -r "$tmp/ck" "$tmp/ck_saved"
# the files as rank 0 writes them alone (save_parallel: false), from a run whose exchanges
# do not run beside other work (ep_plan.overlap: false): the same bytes as the ranks'
ckpt "$tmp/csr.yaml" "  expert_parallel_size: 2
  expert_fully_shard_parallel_size: 2
  ep_plan:
    overlap: false" 1
sed -i "s|save: $tmp/ck$|save: $tmp/ck_rank0\n  save_parallel: false|" "$tmp/csr.yaml"
train_on 4 "$tmp/csr.yaml"
for f in model optimizer; do
    cmp "$tmp/ck/iter_0000003/$f.safetensors" "$tmp/ck_rank0/iter_0000003/$f.safetensors" ||
        fail "EP 2 x EFSDP 2: $f.safetensors of the ranks' writes and overlapped exchanges differs from rank 0's without overlap"
done
$py -c '
import json, sys
s = json.load(open(sys.argv[1]))
got = [s.get(k) for k in ("world", "expert_parallel_size", "expert_fully_shard_parallel_size", "expert_data_parallel_size")]
assert got == [4, 2, 2, 1], s
' "$tmp/ck/iter_0000003/trainer_state.json" || fail "trainer_state.json does not record the expert layout"
rm -rf "$tmp/ck/iter_0000005" && echo 3 > "$tmp/ck/latest_checkpointed_iteration.txt"
train_on 1 "$tmp/cr1.yaml"
train_on 4 "$tmp/cr4.yaml"
$py - "$tmp/cs.yaml.jsonl" "$tmp/cr1.yaml.jsonl" "$tmp/cr4.yaml.jsonl" <<'PY' || fail "a resumed run does not continue the saved run"
import json, sys
a = {r["step"]: r for r in map(json.loads, open(sys.argv[1])) if "loss" in r}
for p in sys.argv[2:]:
    b = [r for r in map(json.loads, open(p)) if "loss" in r]
    assert [r["step"] for r in b] == [4, 5], (p, [r["step"] for r in b])
    for r in b:
        for k in "loss", "grad_norm":
            assert abs(r[k] - a[r["step"]][k]) <= 1e-5 * abs(a[r["step"]][k]), (p, r["step"], k, r[k], a[r["step"]][k])
        assert r["lr"] == a[r["step"]]["lr"], (p, r["step"])
PY
# the saved files: one tensor per expert, as one rank writes them
write_config "$tmp/c1.yaml" 4 19 8 2 "" "  save: $tmp/ck1
  train_iters: 3"
sed -i -e 's/output_router_logits: true/output_router_logits: false/' -e '/train_iters: 5/d' "$tmp/c1.yaml"
train_on 1 "$tmp/c1.yaml"
$py - "$tmp/ck_saved/iter_0000003/model.safetensors" "$tmp/ck1/iter_0000003/model.safetensors" <<'PY' || fail "the EP checkpoint's tensors are not one rank's"
import json, struct, sys
def header(p):
    f = open(p, "rb")
    h = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    h.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"]) for k, v in h.items()}
a, b = map(header, sys.argv[1:3])
assert a == b, set(a) ^ set(b)
assert "model.layers.1.mlp.experts.7.down_proj.weight" in a
PY

# groups of 0 tokens: top-1 of 8 experts, 3 tokens per rank, EP=4; with recompute too
write_config "$tmp/zone.yaml" 4 3 8 1 ""
write_config "$tmp/zep.yaml" 1 3 8 1 "  expert_parallel_size: 4"
write_config "$tmp/zrc.yaml" 1 3 8 1 "  expert_parallel_size: 4" "features:
  recompute: true"
train_on 1 "$tmp/zone.yaml"
train_on 4 "$tmp/zep.yaml"
train_on 4 "$tmp/zrc.yaml"
same "$tmp/zone.yaml" "$tmp/zep.yaml"
same "$tmp/zone.yaml" "$tmp/zrc.yaml"
bytes "$tmp/zep.yaml" 4 64 3 2
bytes "$tmp/zrc.yaml" 4 64 3 3

# the MXFP8 plan on the experts (and attention), in bf16 with fp64 reductions: the grouped
# GEMMs' token-axis MX blocks (the colwise planes of the weight gradients) are those of the
# concatenated rank only if each expert's rows are in (source rank, token) order (rows in
# another order quantize other blocks: step 1's gradient norm, held to 1e-5 by close, shows
# it; the later steps part by bf16 rounding as close says). Rows of
# 32 tokens, so that the dense layers' token-axis blocks are the concatenated rank's too
plan="  quantization_plan:
    recipe_name: mxfp8
    apply_modules: ['model.layers.{*}']
    ignored_modules: ['*gate']"
DTYPE=bf16 REDUCE=fp64 write_config "$tmp/mxone.yaml" 2 32 8 2 "" "$plan"
DTYPE=bf16 REDUCE=fp64 write_config "$tmp/mxep.yaml" 1 32 8 2 "  expert_parallel_size: 2" "$plan"
train_on 1 "$tmp/mxone.yaml"
train_on 2 "$tmp/mxep.yaml"
grep -q "8 modules converted" "$tmp/mxep.yaml.log" || fail "mxep: the plan does not convert 8 modules"
"$bin" plan "$tmp/mxep.yaml" --ranks 2 | grep -q "model.layers.1.mlp.experts" || fail "mxep: the plan does not convert the experts"
close "$tmp/mxone.yaml" "$tmp/mxep.yaml"
# the same with the experts' MX planes gathered within expert shard groups of 2 (EP=2 x
# EFSDP=2 on 4 ranks) against 2 ranks of 2 rows; the planes' bytes are plan's
DTYPE=bf16 REDUCE=fp64 write_config "$tmp/mxdp2.yaml" 2 32 8 2 "" "$plan"
DTYPE=bf16 REDUCE=fp64 write_config "$tmp/mxep4.yaml" 1 32 8 2 "  expert_parallel_size: 2" "$plan"
train_on 2 "$tmp/mxdp2.yaml"
train_on 4 "$tmp/mxep4.yaml"
close "$tmp/mxdp2.yaml" "$tmp/mxep4.yaml"
"$bin" plan "$tmp/mxep4.yaml" --json --ranks 4 > "$tmp/mxep4.plan" || fail "plan failed for mxep4"
$py - "$tmp/mxep4.yaml.jsonl" "$tmp/mxep4.plan" <<'PY' || fail "mxep4: the gathered MX bytes are not plan's"
import json, sys
plan = json.load(open(sys.argv[2]))
assert plan["experts"]["expert_fully_shard_parallel_size"] == 2, plan["experts"]
for r in (r for r in map(json.loads, open(sys.argv[1])) if "loss" in r):
    for k, v in plan["per_step"].items():
        assert k == "gather_mode" or r[k] == v, (k, r[k], v)
    assert r["ag_mx_data_bytes"] > 0, r
PY

# ---- parallel.ep_plan ----
# counted CONFIG EP C FD BD: every step's counters are the routed rows times the row bytes of
# each exchange (FD, BD: the forward and backward dispatch's wire, fp32 | bf16 | mxfp8;
# combines fp32), without recompute (the backward moves the forward's rows)
counted() {
    $py - "$1.jsonl" "$2" "$3" "$4" "$5" <<'PY' || fail "$1: the dispatch/combine counters are not the routed rows' bytes"
import json, sys
ep, C = int(sys.argv[2]), int(sys.argv[3])
row = {"fp32": 4 * C, "bf16": 2 * C, "mxfp8": C + (C + 31) // 32}
fd, bd = sys.argv[4], sys.argv[5]
for r in (r for r in map(json.loads, open(sys.argv[1])) if "loss" in r):
    n, back = r["dispatch_rows"], r["combine_rows"]
    assert n > 0 and back > 0, r
    kinds = {"fp32": 0, "bf16": 0, "mxfp8": 0}
    kinds[fd] += n * row[fd]
    kinds[bd] += n * row[bd]
    assert r["dispatch_fp32_bytes"] == kinds["fp32"] and r["dispatch_bf16_bytes"] == kinds["bf16"], (r, kinds)
    assert r["dispatch_mx_data_bytes"] + r["dispatch_mx_scale_bytes"] == kinds["mxfp8"], (r, kinds)
    assert r["dispatch_mx_data_bytes"] == (n * C if fd == "mxfp8" else 0), r
    assert r["dispatch_bytes"] == sum(kinds.values()), r
    assert r["combine_bytes"] == 2 * 4 * C * back, r
PY
}
# within_plan CONFIG RANKS [STEP1_COMBINE_WORST]: plan's worst case is the formula below, from
# the config alone, and every step's counters lie within [0, worst case]; with the third
# argument, step 1's combine bytes are the worst case exactly
within_plan() {
    "$bin" plan "$1" --ranks "$2" --json > "$1.plan.json" || fail "$1: mxtrain plan failed"
    $py - "$1" "$1.plan.json" "$1.jsonl" "${3:-}" <<'PY' || fail "$1: the dispatch/combine bytes are not within plan's worst case"
import json, sys, re
cfg = open(sys.argv[1]).read()
def get(key, default=None):
    m = re.search(r"^\s*%s:\s*(\S+)" % key, cfg, re.M)
    return m.group(1) if m else default
C, L, K = int(get("hidden_size")), int(get("num_hidden_layers")), int(get("num_experts_per_tok"))
B, T, micro = int(get("micro_batch_size")), int(get("seq_length")), int(get("gradient_accumulation_steps"))
ep, dtype, wire = int(get("expert_parallel_size")), get("param_dtype"), get("dispatch_dtype", "auto")
converted = "quantization_plan" in cfg
apply = get("apply_modules")
layers = 1 if apply and re.match(r"\['model\.layers\.\d+\.mlp\.experts'\]", apply) else L
row = {"fp32": 4 * C, "bf16": 2 * C, "mxfp8": C + (C + 31) // 32}
exact = "bf16" if dtype == "bf16" and not converted and wire != "fp32" else "fp32"
fd = {"auto": exact, "fp32": "fp32", "bf16": "bf16", "mxfp8": "mxfp8"}[wire]
R = B * T * K
worst_d = micro * layers * R * (row[fd] + row[exact])
worst_c = micro * layers * (ep - 1) * R * 2 * 4 * C
e = json.load(open(sys.argv[2]))["expert_parallel"]
assert e["expert_parallel_size"] == ep and e["dispatch_wire"] == fd, e
assert e["overlap"] == (get("overlap", "true") == "true"), e
assert e["dispatch_worst_bytes"] == worst_d and e["combine_worst_bytes"] == worst_c, (e, worst_d, worst_c)
assert abs(e["dispatch_uniform_bytes"] - worst_d * (ep - 1) / ep) <= 0.1, e
assert abs(e["combine_uniform_bytes"] - worst_c / ep) <= 0.1, e
steps = [r for r in map(json.loads, open(sys.argv[3])) if "loss" in r]
for r in steps:
    assert 0 <= r["dispatch_bytes"] <= worst_d and 0 <= r["combine_bytes"] <= worst_c, (r, worst_d, worst_c)
if sys.argv[4]:
    assert steps[0]["combine_bytes"] == worst_c and steps[0]["dispatch_bytes"] == 0, (steps[0], worst_c)
PY
}
# exact A B: B's losses and gradient norms equal A's bit for bit, every step (exact A B 1: the
# first step's losses only)
exact() {
    $py - "$1.jsonl" "$2.jsonl" "${3:-0}" <<'PY' || fail "$2 does not give exactly $1's losses"
import json, sys
a, b = ([r for r in map(json.loads, open(p)) if "loss" in r] for p in sys.argv[1:3])
n = int(sys.argv[3]) or len(a)
assert len(a) == len(b) >= n
for x, y in zip(a[:n], b[:n]):
    assert x["loss"] == y["loss"] and x["ce_loss"] == y["ce_loss"], (x["step"], x["loss"], y["loss"])
    assert sys.argv[3] != "0" or x["grad_norm"] == y["grad_norm"], (x["step"], x["grad_norm"], y["grad_norm"])
PY
}

# bf16: auto sends bf16 rows both ways towards the experts (their GEMMs round them to bf16),
# exactly: the losses of fp32 rows bit for bit. Against one rank, in bf16: close (above).
DTYPE=bf16 REDUCE=fp64 write_config "$tmp/b1.yaml" 2 19 8 2 ""
DTYPE=bf16 REDUCE=fp64 write_config "$tmp/b2.yaml" 1 19 8 2 "  expert_parallel_size: 2"
DTYPE=bf16 REDUCE=fp64 write_config "$tmp/b2f.yaml" 1 19 8 2 "  expert_parallel_size: 2
  ep_plan:
    dispatcher: alltoall
    dispatch_dtype: fp32"
DTYPE=bf16 REDUCE=fp64 write_config "$tmp/b4one.yaml" 4 19 8 2 ""
DTYPE=bf16 REDUCE=fp64 write_config "$tmp/b4.yaml" 1 19 8 2 "  expert_parallel_size: 4"
train_on 1 "$tmp/b1.yaml"
train_on 2 "$tmp/b2.yaml"
train_on 2 "$tmp/b2f.yaml"
train_on 1 "$tmp/b4one.yaml"
train_on 4 "$tmp/b4.yaml"
exact "$tmp/b2f.yaml" "$tmp/b2.yaml"
close "$tmp/b1.yaml" "$tmp/b2.yaml"
close "$tmp/b4one.yaml" "$tmp/b4.yaml"
counted "$tmp/b2.yaml" 2 64 bf16 bf16
counted "$tmp/b2f.yaml" 2 64 fp32 fp32
counted "$tmp/b4.yaml" 4 64 bf16 bf16
counted "$tmp/ep4.yaml" 4 64 fp32 fp32
within_plan "$tmp/b2.yaml" 2
within_plan "$tmp/b2f.yaml" 2
within_plan "$tmp/b4.yaml" 4
within_plan "$tmp/ep2.yaml" 2
grep -q "tokens dispatched [0-9.]* MiB ([0-9.]* MiB bf16) and combined" "$tmp/b2.yaml.log" ||
    fail "b2: the summary does not give the bf16 dispatch"

# apply_modules: EP in layer 1 only; layer 0's experts run on every rank's own tokens
write_config "$tmp/l1.yaml" 1 19 8 2 "  expert_parallel_size: 2
  ep_plan:
    apply_modules: ['model.layers.1.mlp.experts']"
train_on 2 "$tmp/l1.yaml"
same "$tmp/one2.yaml" "$tmp/l1.yaml"
counted "$tmp/l1.yaml" 2 64 fp32 fp32
within_plan "$tmp/l1.yaml" 2
"$bin" plan "$tmp/l1.yaml" --ranks 2 | grep -q "expert parallelism: EP groups of 2 ranks, 4 experts each, in 1 of 2 MoE layers" ||
    fail "l1: plan does not say EP applies to 1 of 2 MoE layers"
$py - "$tmp/l1.yaml.jsonl" "$tmp/ep2.yaml.jsonl" <<'PY' || fail "l1: one layer does not exchange fewer rows than two"
import json, sys
a, b = ([r for r in map(json.loads, open(p)) if "loss" in r] for p in sys.argv[1:3])
assert sum(r["dispatch_rows"] for r in a) < sum(r["dispatch_rows"] for r in b), (a[0], b[0])
PY

# top-k = num_experts: every rank sends rows to every expert
write_config "$tmp/k1.yaml" 2 19 4 4 ""
write_config "$tmp/k2.yaml" 1 19 4 4 "  expert_parallel_size: 2"
train_on 1 "$tmp/k1.yaml"
train_on 2 "$tmp/k2.yaml"
same "$tmp/k1.yaml" "$tmp/k2.yaml"
within_plan "$tmp/k2.yaml" 2

# every token to one expert: zero router weights tie every expert, and ties go to expert 0
# (rank 0's): in step 1 rank 0 sends nothing and receives every routed row of rank 1, the
# plan's worst case exactly
write_config "$tmp/zsave.yaml" 2 19 8 1 "" "  save: $tmp/zck"
sed -i 's/train_iters: 5/train_iters: 1/' "$tmp/zsave.yaml"
train_on 1 "$tmp/zsave.yaml"
$py - "$tmp/zck/iter_0000001/model.safetensors" <<'PY' || fail "could not zero the routers"
import json, struct, sys
f = open(sys.argv[1], "r+b")
n = struct.unpack("<Q", f.read(8))[0]
h = json.loads(f.read(n))
gates = [k for k in h if k.endswith("mlp.gate.weight")]
assert len(gates) == 2, gates
for k in gates:
    a, b = h[k]["data_offsets"]
    f.seek(8 + n + a)
    f.write(bytes(b - a))
PY
write_config "$tmp/z1.yaml" 2 19 8 1 ""
write_config "$tmp/z2.yaml" 1 19 8 1 "  expert_parallel_size: 2"
sed -i "s|^model:|model:\n  model_name_or_path: $tmp/zck/iter_0000001|" "$tmp/z1.yaml" "$tmp/z2.yaml"
train_on 1 "$tmp/z1.yaml"
train_on 2 "$tmp/z2.yaml"
close "$tmp/z1.yaml" "$tmp/z2.yaml"   # after step 1 the routers' near-ties may break apart
within_plan "$tmp/z2.yaml" 2 worst

# the MXFP8 plan on the experts: bf16 dispatch, mxfp8 dispatch and fp32 dispatch, 20 steps
mxplan="  quantization_plan:
    recipe_name: mxfp8
    apply_modules: ['model.layers.{*}']
    ignored_modules: ['*gate']
    quant_converters: ['quantize.linear.mx', 'quantize.moe.mx']"
for d in bf16 mxfp8 fp32; do
    DTYPE=bf16 write_config "$tmp/mx_$d.yaml" 1 32 8 2 "  expert_parallel_size: 2
  ep_plan:
    dispatch_dtype: $d" "$mxplan"
    sed -i 's/train_iters: 5/train_iters: 20/' "$tmp/mx_$d.yaml"
    train_on 2 "$tmp/mx_$d.yaml"
    within_plan "$tmp/mx_$d.yaml" 2
done
counted "$tmp/mx_bf16.yaml" 2 64 bf16 fp32
counted "$tmp/mx_mxfp8.yaml" 2 64 mxfp8 fp32
counted "$tmp/mx_fp32.yaml" 2 64 fp32 fp32
exact "$tmp/mx_fp32.yaml" "$tmp/mx_mxfp8.yaml" 1
# the exchanges beside the work that does not need them (ep_plan.overlap, the default: the
# router's and the experts' weight gradients in the backward apart from their input gradients,
# the saved planes after the combine has started) against every exchange at its place:
# the same losses and gradient norms, bit for bit, over the 20 steps
sed "s|^  ep_plan:|  ep_plan:\n    overlap: false|; s|mx_mxfp8.yaml.jsonl|mx_serial.yaml.jsonl|" "$tmp/mx_mxfp8.yaml" \
    > "$tmp/mx_serial.yaml"
train_on 2 "$tmp/mx_serial.yaml"
within_plan "$tmp/mx_serial.yaml" 2   # plan says overlap: false
exact "$tmp/mx_serial.yaml" "$tmp/mx_mxfp8.yaml"
$py - "$tmp/mx_bf16.yaml.jsonl" "$tmp/mx_mxfp8.yaml.jsonl" <<'PY' || fail "mxfp8 dispatch is not within 1e-2 of bf16 dispatch"
import json, sys
a, b = ([r for r in map(json.loads, open(p)) if "loss" in r] for p in sys.argv[1:3])
assert len(a) == len(b) == 20
for x, y in zip(a, b):
    assert abs(x["loss"] - y["loss"]) <= 1e-2 * abs(x["loss"]), (x["step"], x["loss"], y["loss"])
assert a[-1]["loss"] != b[-1]["loss"]   # the weight gradients' planes differ: not the same run
# per routed row, mxfp8 moves 33/64 of bf16's bytes forward (C + C/32 against 2 C)
for x, y in zip(a, b):
    mx = y["dispatch_mx_data_bytes"] + y["dispatch_mx_scale_bytes"]
    assert mx * 64 * x["dispatch_rows"] == x["dispatch_bf16_bytes"] * 33 * y["dispatch_rows"], (x, y)
PY
grep -q "tokens dispatched [0-9.]* MiB ([0-9.]* MiB fp32, [0-9.]* MiB MXFP8 codes and scales) and combined" \
    "$tmp/mx_mxfp8.yaml.log" || fail "mx_mxfp8: the summary does not give the MXFP8 dispatch"

# bad layouts: one line naming the keys and values, before any work (no metrics file)
bad() {   # bad RANKS CONFIG PATTERN
    rm -f "$2.jsonl"
    local out
    if [ "$1" = 1 ]; then out=$("$bin" train "$2" 2>&1); else out=$(mpi_run -np "$1" "$bin" train "$2" 2>&1); fi &&
        fail "$2 on $1 ranks was accepted"
    grep -q -- "$3" <<<"$out" || { echo "$out"; fail "$2 on $1 ranks: no line matching '$3'"; }
    [ ! -e "$2.jsonl" ] || fail "$2: a metrics file was written"
}
write_config "$tmp/b3.yaml" 1 19 8 2 "  expert_parallel_size: 3"
bad 1 "$tmp/b3.yaml" "b3.yaml: parallel.expert_parallel_size: 3 does not divide model.num_experts: 8 (allowed: a divisor of 8)"
write_config "$tmp/b4.yaml" 1 19 8 2 "  expert_parallel_size: 4"
bad 2 "$tmp/b4.yaml" "b4.yaml: parallel.expert_parallel_size: 4 does not divide this job of 2 ranks (allowed: a divisor of 2)"
write_config "$tmp/bdense.yaml" 1 19 8 2 "  expert_parallel_size: 2"
sed -i -e 's/qwen3_moe/llama/' -e '/experts\|moe_\|topk\|router/d' "$tmp/bdense.yaml"
bad 1 "$tmp/bdense.yaml" "parallel.expert_parallel_size: 2 needs an MoE model"
write_config "$tmp/b0.yaml" 1 19 8 2 "  expert_parallel_size: 0"
bad 1 "$tmp/b0.yaml" "parallel.expert_parallel_size"
# bad ep_plan values: one line naming the key and the value, before any work
write_config "$tmp/e1.yaml" 1 19 8 2 "  expert_parallel_size: 2
  ep_plan:
    dispatcher: allgather"
bad 1 "$tmp/e1.yaml" "e1.yaml:[0-9]*: parallel.ep_plan.dispatcher: 'allgather' is not allowed (allowed: 'alltoall')"
write_config "$tmp/e2.yaml" 1 19 8 2 "  expert_parallel_size: 2
  ep_plan:
    dispatch_dtype: fp8"
bad 1 "$tmp/e2.yaml" "e2.yaml:[0-9]*: parallel.ep_plan.dispatch_dtype: 'fp8' is not allowed (allowed: 'auto', 'fp32' (alias 'float32'), 'bf16' (alias 'bfloat16'), 'mxfp8')"
write_config "$tmp/e3.yaml" 1 19 8 2 "  expert_parallel_size: 2
  ep_plan:
    apply_modules: ['model.layers.{*}.self_attn']"
bad 1 "$tmp/e3.yaml" "e3.yaml:[0-9]*: parallel.ep_plan.apply_modules: 'model.layers.{\*}.self_attn' names model.layers.0.self_attn, which is not an MoE expert module (allowed: "
write_config "$tmp/e4.yaml" 1 19 8 2 "  expert_parallel_size: 2
  ep_plan:
    apply_modules: ['model.layers.1.mlp.experts', 'model.layers.7.mlp.experts']"
bad 1 "$tmp/e4.yaml" "e4.yaml:[0-9]*: parallel.ep_plan.apply_modules: 'model.layers.7.mlp.experts' matches no module (allowed: "
write_config "$tmp/e5.yaml" 1 19 8 2 "  ep_plan:
    dispatch_dtype: bf16"
bad 1 "$tmp/e5.yaml" "e5.yaml:[0-9]*: parallel.ep_plan.dispatch_dtype: given with parallel.expert_parallel_size 1"
write_config "$tmp/e6.yaml" 1 19 8 2 "  expert_parallel_size: 2
  ep_plan:
    dispatch_dtype: mxfp8"
bad 1 "$tmp/e6.yaml" "e6.yaml:[0-9]*: parallel.ep_plan.dispatch_dtype: mxfp8 sends the rowwise MXFP8 plane of converted experts' input, but model.layers.0.mlp.experts is not converted"
write_config "$tmp/e10.yaml" 1 19 8 2 "  expert_parallel_size: 2
  ep_plan:
    dispatch_dtype: mxfp8" "  quantization_plan:
    recipe_name: mxfp8
    quant_converters: ['quantize.linear.mx', 'quantize.moe.mx']
    high_precision_gemms: [fprop]"
bad 1 "$tmp/e10.yaml" "e10.yaml:[0-9]*: parallel.ep_plan.dispatch_dtype: mxfp8 sends the experts' input quantized, but training.quantization_plan.high_precision_gemms runs fprop unquantized"
write_config "$tmp/e8.yaml" 1 19 8 2 "  expert_parallel_size: 2
  ep_plan:
    overlap: sometimes"
bad 1 "$tmp/e8.yaml" "e8.yaml:[0-9]*: parallel.ep_plan.overlap: 'sometimes' is not a boolean (allowed: true, false)"
write_config "$tmp/e9.yaml" 1 19 8 2 "  ep_plan:
    overlap: false"
bad 1 "$tmp/e9.yaml" "e9.yaml:[0-9]*: parallel.ep_plan.overlap: given with parallel.expert_parallel_size 1"
write_config "$tmp/e7.yaml" 1 19 8 2 "  ep_plan:
    dispatcher: alltoall"
sed -i -e 's/qwen3_moe/llama/' -e '/experts\|moe_\|topk\|router/d' "$tmp/e7.yaml"
bad 1 "$tmp/e7.yaml" "e7.yaml:[0-9]*: parallel.ep_plan.dispatcher: given for a dense model"
for f in e1 e3 e5 e6 e10; do   # plan says the same
    "$bin" plan "$tmp/$f.yaml" --ranks 2 >/dev/null 2>"$tmp/$f.plan.err" && fail "$f: plan accepted it"
    [ "$(wc -l < "$tmp/$f.plan.err")" = 1 ] || { cat "$tmp/$f.plan.err"; fail "$f: plan's error is not one line"; }
done

write_config "$tmp/bef.yaml" 1 19 8 2 "  expert_parallel_size: 2
  expert_fully_shard_parallel_size: 3"
bad 4 "$tmp/bef.yaml" "bef.yaml: parallel.expert_data_parallel_size: auto x parallel.expert_fully_shard_parallel_size: 3 x parallel.expert_parallel_size: 2 does not fit this job of 4 ranks (allowed: expert_data_parallel_size x expert_fully_shard_parallel_size = 4 / 2 = 2, either may be auto)"
write_config "$tmp/bed.yaml" 1 19 8 2 "  expert_parallel_size: 2
  expert_fully_shard_parallel_size: 1
  expert_data_parallel_size: 1"
bad 4 "$tmp/bed.yaml" "parallel.expert_data_parallel_size: 1 x parallel.expert_fully_shard_parallel_size: 1 x parallel.expert_parallel_size: 2 does not fit this job of 4 ranks"
write_config "$tmp/bnoep.yaml" 1 19 8 2 "  expert_data_parallel_size: 2"
bad 2 "$tmp/bnoep.yaml" "bnoep.yaml: parallel.expert_data_parallel_size: 2 needs parallel.expert_parallel_size > 1 (it is 1; allowed: auto, or leave it out)"
cp "$tmp/bdense.yaml" "$tmp/bdense2.yaml"
sed -i 's/expert_parallel_size: 2/expert_fully_shard_parallel_size: 2/' "$tmp/bdense2.yaml"
bad 1 "$tmp/bdense2.yaml" "parallel.expert_fully_shard_parallel_size: 2 needs parallel.expert_parallel_size > 1 (it is 1, and the model has no experts"
exit 0
