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
#  - with the MXFP8 plan (bf16, fp64 reductions) EP=2 is the concatenated rank within 1e-5;
#  - bad layouts stop the job at start with one line naming the keys, and write nothing.
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
run 2 "$tmp/dp2.yaml"
run 4 "$tmp/ep2w4.yaml"
same "$tmp/dp2.yaml" "$tmp/ep2w4.yaml"
# the same with HSDP (2 replicas x FSDP groups of 2): EP groups are independent of FSDP groups
write_config "$tmp/ep2h.yaml" 1 19 8 2 "  expert_parallel_size: 2
  data_parallel_size: 2"
run 4 "$tmp/ep2h.yaml"
same "$tmp/dp2.yaml" "$tmp/ep2h.yaml"

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
exit 0
