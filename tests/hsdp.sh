#!/bin/bash
# HSDP end to end (SPEC §6, docs/distributed.md#hsdp) on 4 ranks, with mpirun as CI runs it
# (root, --oversubscribe); layouts are data_parallel_size x fully_shard_parallel_size:
#  - build/tests/mpi_fsdp on 4 ranks: on 1x4, 2x2 and 4x1 the gradients equal one FSDP group's
#    (exactly with fp64 reductions), every replica holds the same bits, the planes gathered
#    within a group are the whole weights', the counters are the predicted ones;
#  - 2x2, 1x4 and 4x1 give the losses of one rank with the same global batch and the same
#    per-rank micro-batch (gradient accumulation on the one rank), within 1e-5: a dense
#    model in fp32, and an MoE model in bf16 with the MXFP8 plan and fp64 reductions;
#  - every run's per-step byte and memory counters equal `mxtrain plan --ranks 4 --dp D`'s
#    prediction exactly, and for the fp32 model also the figures computed here from the
#    checkpoint's tensor shapes (shards of 32 x ceil(R / 32F) rows);
#  - a checkpoint written by 2x2 resumes on 4x1 and on 1x3 (3 ranks), continuing the
#    uninterrupted run's losses and learning-rate schedule;
#  - layouts that do not fit the job stop it at start with one line naming both keys.
# tests/run: launches MPI ranks
. "$(dirname "$0")/common.bash"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
# as in tests/fsdp.sh: Open MPI's plugins defeat the leak check; containers forbid CMA
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
export OMPI_MCA_btl_vader_single_copy_mechanism=none

out=$(mpi_run -np 4 "$build/tests/mpi_fsdp" 2>&1) || { echo "$out"; fail "mpi_fsdp on 4 ranks failed"; }
[ "$(grep -c '^# tally [0-9]* 0$' <<<"$out")" -eq 4 ] || { echo "$out"; fail "mpi_fsdp on 4 ranks: not every rank passed"; }

prep=$("$bin" prepare --out "$tmp/data" 2>&1) || fail "prepare failed: $prep"

# write_config FILE TYPE ACCUM PARALLEL TRAINING: 6 steps of 1 row per rank and micro-batch
write_config() {
    cat > "$1" <<YAML
$(uneven_model "$2" 2)
data:
  data_path: $tmp/data/train_*.bin
  seq_length: 37
parallel:
$4
training:
  micro_batch_size: 1
  gradient_accumulation_steps: $3
  seed: 11
  lr: 3.0e-3
  lr_warmup_ratio: 0.2
  lr_decay_style: linear
  weight_decay: 0.1
  train_iters: 6
  clip_grad: 1.0
  log_interval: 100
  metrics_path: $1.jsonl
$5
YAML
}
# same A B FIRST: the losses and gradient norms of B equal A's from step FIRST on, within
# 1e-5 (relative), and the learning rates exactly
same() {
    $py - "$1" "$2" "$3" <<'PY' || fail "$2 does not continue $1's losses"
import json, sys
a = {r["step"]: r for r in map(json.loads, open(sys.argv[1])) if "loss" in r}
b = [r for r in map(json.loads, open(sys.argv[2])) if "loss" in r]
first = int(sys.argv[3])
assert [r["step"] for r in b] == list(range(first, 7)), [r["step"] for r in b]
for r in b:
    for k in "loss", "grad_norm":
        x, y = a[r["step"]][k], r[k]
        assert abs(x - y) <= 1e-5 * abs(x), f"step {r['step']}: {k} {x!r} vs {y!r}"
    assert a[r["step"]]["lr"] == r["lr"], (r["step"], a[r["step"]]["lr"], r["lr"])
PY
}
# predicted CONFIG D N: every step's byte and memory counters equal plan's prediction for
# D replicas on N ranks
predicted() {
    local ranks=$3
    "$bin" plan "$1" --json --ranks "$ranks" --dp "$2" > "$1.plan" || fail "plan --ranks $ranks --dp $2 failed for $1"
    $py - "$1.jsonl" "$1.plan" "$2" "$ranks" <<'PY' || fail "$1: the counters are not plan's prediction"
import json, sys
steps = [r for r in map(json.loads, open(sys.argv[1])) if "loss" in r]
plan = json.load(open(sys.argv[2]))
D, N = int(sys.argv[3]), int(sys.argv[4])
assert plan["layout"] == {"ranks": N, "data_parallel_size": D, "fully_shard_parallel_size": N // D}, plan["layout"]
want = {k: v for k, v in plan["per_step"].items() if k != "gather_mode"}
for r in steps:
    got = {k: r[k] for k in want}
    assert got == want, (r["step"], got, want)
assert (want["ar_bytes"] > 0) == (D > 1), want
PY
}

# dense, fp32: one rank x 12 micro-batches against 4 ranks x 3 in three layouts; 2x2 saves at step 3
fp32="  fsdp_plan:
    param_dtype: fp32"
write_config "$tmp/one.yaml" llama 12 "$fp32" ""
train_on 1 "$tmp/one.yaml"
write_config "$tmp/h22.yaml" llama 3 "  data_parallel_size: 2
  fully_shard_parallel_size: 2
$fp32" "  save: $tmp/ckpt
  save_interval: 3"
write_config "$tmp/h14.yaml" llama 3 "  data_parallel_size: 1
  fully_shard_parallel_size: 4
$fp32" ""
write_config "$tmp/h41.yaml" llama 3 "  data_parallel_size: 4
$fp32" ""
for l in 22 14 41; do
    train_on 4 "$tmp/h$l.yaml"
    same "$tmp/one.yaml.jsonl" "$tmp/h$l.yaml.jsonl" 1
    predicted "$tmp/h$l.yaml" "${l:0:1}" 4
done
grep -q "4 ranks (2 replicas x FSDP groups of 2)" "$tmp/h22.yaml.log" || fail "2x2: the first line does not give the layout"
grep -q "all-reduced [0-9.]* MiB across 4 replicas" "$tmp/h41.yaml.log" || fail "4x1: the summary has no all-reduce bytes"
grep -q "all-reduced" "$tmp/h14.yaml.log" && fail "1x4: the summary shows an all-reduce"
# the 2x2 checkpoint, each rank of replica 0 writing its rows into it (replica 1, holding
# the same rows, writes none): the bytes rank 0 writes whole
write_config "$tmp/h22r.yaml" llama 3 "  data_parallel_size: 2
  fully_shard_parallel_size: 2
$fp32" "  save: $tmp/ckpt0
  save_interval: 3
  save_parallel: false"
train_on 4 "$tmp/h22r.yaml"
for f in model optimizer; do
    cmp "$tmp/ckpt/iter_0000003/$f.safetensors" "$tmp/ckpt0/iter_0000003/$f.safetensors" ||
        fail "2x2: $f.safetensors written by the ranks differs from rank 0's"
done

# the bytes from first principles: every tensor of R rows (the shapes in the checkpoint) is
# sharded in 32 x ceil(R / 32F) rows per rank; per step, 3 micro-batches, each
# gathering the root (final norm, lm_head) and the embedding (a unit of its own, lm_head not
# tied to it, whose backward reads no weights) once and each block twice (reshard after
# forward), then reduce-scattering every unit and (D > 1) all-reducing each rank's shard of
# it, all in fp32
$py - "$tmp/ckpt/iter_0000003/optimizer.safetensors" "$tmp"/h{22,14,41}.yaml.jsonl <<'PY' || fail "the bytes are not what the shapes give"
import json, math, struct, sys
f = open(sys.argv[1], "rb")
header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
shapes = {k[len("exp_avg."):]: v["shape"] for k, v in header.items() if k.startswith("exp_avg.")}
assert len(shapes) > 10, shapes
for path, (D, F) in zip(sys.argv[2:], [(2, 2), (1, 4), (4, 1)]):
    root = blocks = 0
    for name, shape in shapes.items():
        assert len(shape) in (1, 2), (name, shape)   # a dense model: matrices and vectors
        R, K = shape[0], shape[1] if len(shape) == 2 else 1
        n = 32 * math.ceil(R / (32 * F)) * K
        if name.startswith("model.layers."): blocks += n
        else: root += n
    shard, accum = root + blocks, 3
    want = {"rs_bytes": accum * F * 4 * shard, "ar_bytes": accum * 4 * shard if D > 1 else 0,
            "ag_param_bytes": accum * F * 4 * (root + 2 * blocks), "ag_mx_data_bytes": 0,
            "mem_master_bytes": 4 * shard, "mem_grad_bytes": 4 * shard, "mem_optimizer_bytes": 8 * shard}
    r = json.loads(open(path).readline())
    assert {k: r[k] for k in want} == want, (path, {k: r[k] for k in want}, want)
PY
$py -c '
import json, sys
s = json.load(open(sys.argv[1]))
assert (s["world"], s["data_parallel_size"], s["fully_shard_parallel_size"]) == (4, 2, 2), s
' "$tmp/ckpt/iter_0000003/trainer_state.json" || fail "trainer_state.json does not record the layout"

# the 2x2 checkpoint of step 3 resumes on 4x1 and on one group of 3 ranks (4 micro-batches:
# the same global batch), continuing the uninterrupted run: weights, AdamW moments, step,
# learning rate and data position
write_config "$tmp/r41.yaml" llama 3 "  data_parallel_size: 4
$fp32" "  load: $tmp/ckpt/iter_0000003"
write_config "$tmp/r13.yaml" llama 4 "  fully_shard_parallel_size: 3
$fp32" "  load: $tmp/ckpt/iter_0000003"
train_on 4 "$tmp/r41.yaml"
train_on 3 "$tmp/r13.yaml"
grep -q "resumed from .*iter_0000003 at step 3" "$tmp/r41.yaml.log" || fail "4x1: no resume line"
same "$tmp/h22.yaml.jsonl" "$tmp/r41.yaml.jsonl" 4
same "$tmp/h22.yaml.jsonl" "$tmp/r13.yaml.jsonl" 4
predicted "$tmp/r13.yaml" 1 3

# MoE in bf16 with MXFP8 (on-demand MX-plane gathers within each group) and fp64 reductions:
# one rank x 4 micro-batches of 1 row against 4 ranks x 1 in the three layouts
mx="  fsdp_plan:
    param_dtype: bf16
    reduce_dtype: fp64"
plan="  quantization_plan:
    recipe_name: mxfp8
    apply_modules: ['model.layers.{*}']
    ignored_modules: ['*gate']"
write_config "$tmp/mone.yaml" qwen3_moe 4 "$mx" "$plan"
train_on 1 "$tmp/mone.yaml"
for l in 22 14 41; do
    write_config "$tmp/m$l.yaml" qwen3_moe 1 "  data_parallel_size: ${l:0:1}
$mx" "$plan"
    train_on 4 "$tmp/m$l.yaml"
    same "$tmp/mone.yaml.jsonl" "$tmp/m$l.yaml.jsonl" 1
    predicted "$tmp/m$l.yaml" "${l:0:1}" 4
done
grep -q "weights gathered as on-demand" "$tmp/m22.yaml.log" || fail "MXFP8 2x2 did not gather on-demand"

# layouts that do not fit: one line naming both keys, their values and the ranks
write_config "$tmp/bad.yaml" llama 1 "  data_parallel_size: 2
  fully_shard_parallel_size: 3" ""
out=$(mpi_run -np 4 "$bin" train "$tmp/bad.yaml" 2>&1) && fail "2 x 3 on 4 ranks was accepted"
grep -q "rank [0-3]: $tmp/bad.yaml: parallel.data_parallel_size: 2 x parallel.fully_shard_parallel_size: 3 does not fit this job of 4 ranks (2 x 3 = 6;" <<<"$out" ||
    { echo "$out"; fail "no clear message for 2 x 3 on 4 ranks"; }
[ -e "$tmp/bad.yaml.jsonl" ] && fail "the bad layout wrote metrics"
write_config "$tmp/bad2.yaml" llama 1 "  data_parallel_size: 3" ""
out=$("$bin" plan "$tmp/bad2.yaml" --ranks 4 2>&1) && fail "plan accepted 3 replicas on 4 ranks"
[ "$(wc -l <<<"$out")" -eq 1 ] || { echo "$out"; fail "the layout error is not one line"; }
grep -q "parallel.data_parallel_size: 3 x parallel.fully_shard_parallel_size: auto does not fit this job of 4 ranks (3 does not divide 4;" <<<"$out" ||
    { echo "$out"; fail "no clear message for 3 replicas on 4 ranks"; }
out=$("$bin" train "$tmp/bad2.yaml" 2>&1) && fail "3 replicas on one process were accepted"
[ "$(wc -l <<<"$out")" -eq 1 ] && grep -q "data_parallel_size: 3 x parallel.fully_shard_parallel_size: auto does not fit this job of 1 rank " <<<"$out" ||
    { echo "$out"; fail "no one-line message for 3 replicas on one process"; }
out=$("$bin" plan "$tmp/one.yaml" --ranks 4 --dp 3 2>&1) && fail "plan accepted --dp 3 on 4 ranks"
grep -q -- "--dp: 3 does not divide --ranks 4" <<<"$out" || { echo "$out"; fail "no clear message for --dp 3"; }
exit 0
