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
#  - with the MXFP8 plan (bf16, fp64 reductions) EP=2 is the concatenated rank within 1e-5,
#    and EP=2 x EFSDP=2 on 4 ranks 2 ranks of 2 rows, gathering the bytes plan predicts;
#  - the experts' layout: EP=2 with EFSDP=2 or EFSDP=1 x EDP=2 on one FSDP group of 4, and on
#    2 x 2 HSDP, give the losses of 2 ranks of 2 rows (fp32; bf16 with fp64 reductions); every
#    step's byte and memory counters equal plan's (--ep --efsdp --edp), the experts' shards
#    are what their shapes give and their gathered buffers 1/EP of those without EP;
#  - checkpoints across expert layouts: EP=2 x EFSDP=2 saves, one rank and EP=4 resume and
#    continue its losses; the file holds the tensors one rank writes;
#  - bad layouts stop the job at start with one line naming the keys, and write nothing
#    (expert sizes that do not multiply to the ranks, or given without EP or experts).
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
run() {   # run N CONFIG: train on N ranks (N = 1: one process, no MPI), quietly
    local log="$2.log"
    if [ "$1" = 1 ]; then "$bin" train "$2" >"$log" 2>&1; else mpi_run -np "$1" "$bin" train "$2" >"$log" 2>&1; fi ||
        { tail -5 "$log"; fail "training $2 on $1 ranks failed"; }
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
run 1 "$tmp/one2.yaml"
run 1 "$tmp/one4.yaml"
run 2 "$tmp/ep2.yaml"
run 4 "$tmp/ep4.yaml"
same "$tmp/one2.yaml" "$tmp/ep2.yaml"
grep -q "4 ranks (EP groups of 4, 2 experts each)" "$tmp/ep4.yaml.log" || fail "ep4: the first line does not give the layout"
grep -q "tokens dispatched [0-9.]* MiB and combined [0-9.]* MiB (fp32, last step)" "$tmp/ep4.yaml.log" ||
    fail "ep4: the summary has no dispatch bytes"
grep -q "tokens dispatched" "$tmp/one4.yaml.log" && fail "one4: the summary shows dispatch bytes without EP"
same "$tmp/one4.yaml" "$tmp/ep4.yaml"
bytes "$tmp/one2.yaml" 1 64 38 2
bytes "$tmp/ep2.yaml" 2 64 38 2
bytes "$tmp/ep4.yaml" 4 64 38 2

# two EP groups of 2 in a world of 4 (one FSDP group of 4) against 2 ranks of 2 rows
write_config "$tmp/dp2.yaml" 2 19 8 2 ""
write_config "$tmp/ep2w4.yaml" 1 19 8 2 "  expert_parallel_size: 2"
run 2 "$tmp/dp2.yaml"
run 4 "$tmp/ep2w4.yaml"
same "$tmp/dp2.yaml" "$tmp/ep2w4.yaml"
# the same with HSDP (2 replicas x FSDP groups of 2): EP groups are independent of FSDP groups
write_config "$tmp/ep2h.yaml" 1 19 8 2 "  expert_parallel_size: 2
  data_parallel_size: 2"
run 4 "$tmp/ep2h.yaml"
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
run 4 "$tmp/ep2e1.yaml"
run 4 "$tmp/ep2hx.yaml"
run 2 "$tmp/bdp2.yaml"
run 4 "$tmp/bep2e1.yaml"
same "$tmp/dp2.yaml" "$tmp/ep2e1.yaml"
same "$tmp/dp2.yaml" "$tmp/ep2hx.yaml"
same "$tmp/bdp2.yaml" "$tmp/bep2e1.yaml"
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
run 4 "$tmp/cs.yaml"
cp -r "$tmp/ck" "$tmp/ck_saved"
rm -rf "$tmp/ck/iter_0000005" && echo 3 > "$tmp/ck/latest_checkpointed_iteration.txt"
run 1 "$tmp/cr1.yaml"
run 4 "$tmp/cr4.yaml"
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
run 1 "$tmp/c1.yaml"
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
run 1 "$tmp/zone.yaml"
run 4 "$tmp/zep.yaml"
run 4 "$tmp/zrc.yaml"
same "$tmp/zone.yaml" "$tmp/zep.yaml"
same "$tmp/zone.yaml" "$tmp/zrc.yaml"
bytes "$tmp/zep.yaml" 4 64 3 2
bytes "$tmp/zrc.yaml" 4 64 3 3

# the MXFP8 plan on the experts (and attention), in bf16 with fp64 reductions: the grouped
# GEMMs' token-axis MX blocks (the colwise planes of the weight gradients) are those of the
# concatenated rank only if each expert's rows are in (source rank, token) order. Rows of
# 32 tokens, so that the dense layers' token-axis blocks are the concatenated rank's too
plan="  quantization_plan:
    recipe_name: mxfp8
    apply_modules: ['model.layers.{*}']
    ignored_modules: ['*gate']"
DTYPE=bf16 REDUCE=fp64 write_config "$tmp/mxone.yaml" 2 32 8 2 "" "$plan"
DTYPE=bf16 REDUCE=fp64 write_config "$tmp/mxep.yaml" 1 32 8 2 "  expert_parallel_size: 2" "$plan"
run 1 "$tmp/mxone.yaml"
run 2 "$tmp/mxep.yaml"
grep -q "8 modules converted" "$tmp/mxep.yaml.log" || fail "mxep: the plan does not convert 8 modules"
"$bin" plan "$tmp/mxep.yaml" --ranks 2 | grep -q "model.layers.1.mlp.experts" || fail "mxep: the plan does not convert the experts"
same "$tmp/mxone.yaml" "$tmp/mxep.yaml"
# the same with the experts' MX planes gathered within expert shard groups of 2 (EP=2 x
# EFSDP=2 on 4 ranks) against 2 ranks of 2 rows; the planes' bytes are plan's
DTYPE=bf16 REDUCE=fp64 write_config "$tmp/mxdp2.yaml" 2 32 8 2 "" "$plan"
DTYPE=bf16 REDUCE=fp64 write_config "$tmp/mxep4.yaml" 1 32 8 2 "  expert_parallel_size: 2" "$plan"
run 2 "$tmp/mxdp2.yaml"
run 4 "$tmp/mxep4.yaml"
same "$tmp/mxdp2.yaml" "$tmp/mxep4.yaml"
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
