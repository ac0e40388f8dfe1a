#!/bin/bash
# The learning-rate schedule of a real run (Megatron-LM / Hugging Face semantics, the
# formulas written out here in Python): the `lr` of every JSONL step record for warmup +
# cosine, linear without warmup and constant, and for Megatron's lr_warmup_iters,
# lr_decay_iters and WSD; a run resumed mid-schedule continues it (lr,
# loss and grad norm equal to the uninterrupted run's); a one-step run trains at lr and so
# changes the weights.
. "$(dirname "$0")/common.bash"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive

write_tokens "$tmp/tokens.bin" 20000 7919
write_config() {   # write_config FILE STEPS STYLE WARMUP_RATIO EXTRA_TRAINING
    cat > "$1" <<YAML
$(tiny_llama_model)
data:
  data_path: $tmp/tokens.bin
  seq_length: 16
parallel:
  fsdp_plan:
    param_dtype: fp32
training:
  micro_batch_size: 2
  seed: 5
  lr: 2.0e-3
  min_lr: 2.0e-4
  lr_decay_style: $3
  lr_warmup_ratio: $4
  train_iters: $2
  metrics_path: $1.jsonl
$5
YAML
}
train() { "$bin" train "$1" > "$1.log" 2>&1 || { tail -3 "$1.log"; fail "training $1 failed"; }; }
# check_lr JSONL STEPS STYLE WARMUP_RATIO: every step's lr is the formula's (the JSONL has 7 digits)
check_lr() {
    $py - "$@" <<'PY' || fail "$1: the learning rates are not the schedule's"
import json, math, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if '"lr"' in l]
n, style, ratio = int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
lr, min_lr, w = 2.0e-3, 2.0e-4, round(ratio * n)
def want(k):   # optimizer step k (1-based) runs at the schedule after k - 1 completed steps
    if k <= w: return lr * k / w
    if style == "constant": return lr
    p = (k - 1 - w) / (n - w)
    f = 1 - p if style == "linear" else 0.5 * (1 + math.cos(math.pi * p))
    return min_lr + (lr - min_lr) * f
assert [r["step"] for r in recs] == list(range(1, n + 1)), [r["step"] for r in recs]
for r in recs:
    assert abs(r["lr"] - want(r["step"])) <= 1e-6 * want(r["step"]), (r["step"], r["lr"], want(r["step"]))
PY
}

write_config "$tmp/cos.yaml" 10 cosine 0.2 ""
train "$tmp/cos.yaml"
check_lr "$tmp/cos.yaml.jsonl" 10 cosine 0.2
write_config "$tmp/lin.yaml" 7 linear 0 ""
train "$tmp/lin.yaml"
check_lr "$tmp/lin.yaml.jsonl" 7 linear 0
write_config "$tmp/const.yaml" 5 constant 0.4 ""
train "$tmp/const.yaml"
check_lr "$tmp/const.yaml.jsonl" 5 constant 0.4
grep -q "^step     1/7 .* lr 2.000e-03" "$tmp/lin.yaml.log" || fail "step 1 of 7 without warmup is not at lr: $(grep '^step' "$tmp/lin.yaml.log" | head -1)"

# Megatron's lr_warmup_iters, lr_decay_iters (min_lr after them) and WSD (lr until the
# anneal's last S steps of D, then exponential, minus_sqrt, ...), every step of real runs
# check_megatron JSONL STEPS STYLE W D S WSD_STYLE
check_megatron() {
    $py - "$@" <<'PY' || fail "$1: the learning rates are not Megatron's schedule"
import json, math, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if '"lr"' in l]
n, style, w, d, s, wsd = int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), sys.argv[7]
lr, min_lr = 2.0e-3, 2.0e-4
def want(k):   # Megatron's OptimizerParamScheduler.get_lr after k - 1 completed steps, warmup counting this one
    steps = k - 1
    if k <= w: return lr * k / w
    if steps > d: return min_lr
    if style == "WSD":
        start = d - s
        if steps <= start: c = 1.0
        else:
            r = (steps - start) / s
            c = {"linear": 1 - r, "cosine": 0.5 * (math.cos(math.pi * r) + 1), "exponential": 2 * 0.5 ** r - 1,
                 "minus_sqrt": 1 - math.sqrt(r)}[wsd]
    else:
        r = (steps - w) / (d - w)
        c = 1 - r if style == "linear" else 0.5 * (math.cos(math.pi * r) + 1)
    return min_lr + c * (lr - min_lr)
assert [r["step"] for r in recs] == list(range(1, n + 1)), [r["step"] for r in recs]
for r in recs:
    assert abs(r["lr"] - want(r["step"])) <= 1e-6 * want(r["step"]), (r["step"], r["lr"], want(r["step"]))
PY
}
megatron_run() {   # megatron_run NAME STEPS STYLE W D S WSD_STYLE
    local wsd_keys=""
    [ "$3" = WSD ] && wsd_keys="  lr_wsd_decay_iters: $6
  lr_wsd_decay_style: $7"
    write_config "$tmp/$1.yaml" "$2" "$3" 0 "  lr_warmup_iters: $4
  lr_decay_iters: $5
$wsd_keys"
    sed -i '/lr_warmup_ratio/d' "$tmp/$1.yaml"
    train "$tmp/$1.yaml"
    check_megatron "$tmp/$1.yaml.jsonl" "$2" "$3" "$4" "$5" "$6" "$7"
}
megatron_run wsd_exp 12 WSD 2 10 4 exponential
megatron_run wsd_sqrt 9 WSD 0 9 5 minus_sqrt
megatron_run decay_iters 9 linear 1 6 0 -
grep -q "^step     9/9 .* lr 2.000e-04" "$tmp/decay_iters.yaml.log" || fail "step 9 past lr_decay_iters 6 is not at min_lr"

# resume mid-schedule: 10 steps with a checkpoint at 4, then a run loading iter_4
write_config "$tmp/full.yaml" 10 cosine 0.2 "  save: $tmp/ck
  save_interval: 4"
train "$tmp/full.yaml"
check_lr "$tmp/full.yaml.jsonl" 10 cosine 0.2
write_config "$tmp/resumed.yaml" 10 cosine 0.2 "  load: $tmp/ck/iter_0000004"
train "$tmp/resumed.yaml"
$py - "$tmp/full.yaml.jsonl" "$tmp/resumed.yaml.jsonl" <<'PY' || fail "the resumed run does not continue the schedule"
import json, sys
full = {r["step"]: r for r in map(json.loads, open(sys.argv[1])) if "lr" in r}
res = [r for r in map(json.loads, open(sys.argv[2])) if "lr" in r]
assert [r["step"] for r in res] == list(range(5, 11)), [r["step"] for r in res]
for r in res:
    f = full[r["step"]]
    assert (r["lr"], r["loss"], r["grad_norm"]) == (f["lr"], f["loss"], f["grad_norm"]), (r, f)
PY

# one step: at lr (also with all of it warmup), so the saved weights are not the initial ones
for ratio in 0 1; do
    write_config "$tmp/one$ratio.yaml" 1 linear $ratio "  save: $tmp/one$ratio"
    train "$tmp/one$ratio.yaml"
    check_lr "$tmp/one$ratio.yaml.jsonl" 1 linear $ratio
done
"$bin" init "$tmp/one0.yaml" --out "$tmp/init.safetensors" > /dev/null || fail "init failed"
$py - "$tmp/init.safetensors" "$tmp/one0/iter_0000001/model.safetensors" <<'PY' || fail "a one-step run did not change the weights"
import json, struct, sys
def tensors(path):
    raw = open(path, "rb").read(); (n,) = struct.unpack("<Q", raw[:8]); h = json.loads(raw[8:8 + n])
    return {k: raw[8 + n + v["data_offsets"][0]: 8 + n + v["data_offsets"][1]] for k, v in h.items() if k != "__metadata__"}
a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
assert a.keys() == b.keys()
changed = [k for k in a if a[k] != b[k]]
assert len(changed) == len(a), f"unchanged after one step: {sorted(set(a) - set(changed))}"
PY
exit 0
