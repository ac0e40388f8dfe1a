#!/bin/bash
# A diverging run (training.check_for_nan_in_loss_and_grad): the tiny Llama at lr 1e8 has a
# finite loss but NaN gradients at step 2 (the first step's update, +-lr everywhere, makes
# backward overflow). The run must stop there with one line naming the step, the non-finite
# gradient norm and the tensor where backward first met a non-finite gradient, before the
# optimizer step: no iter_0000002, `latest` still names iter_0000001, which training.load
# resumes from; the metrics file is JSON line by line and plots. Which tensor: `mxtrain
# grads` on iter_0000001's weights and step 2's batch gives every gradient, and Python takes
# the last tensor in model order with a non-finite value (backward runs from the loss down).
# At lr 1e20 the loss itself is NaN at step 2 too. With the check off the steps are applied
# (as Megatron does) and the metrics hold null where a number is not finite, which still
# parses and plots. On 2 ranks, whose gradient shards hold different non-finite tensors, both
# stop with the line of one process training the same global batch.
# tests/run: launches MPI ranks
. "$(dirname "$0")/common.bash"

write_tokens "$tmp/tokens.bin" 4000 7 1
tiny_llama_config "$tmp/d.yaml" 6 "  save: $tmp/S
  save_interval: 1"

# run_diverging NAME ARGS...: a run that must stop: exit 1, exactly one line on stderr
run_diverging() {
    local name=$1; shift
    "$bin" train "$tmp/d.yaml" "$@" >"$tmp/$name.out" 2>"$tmp/$name.err"
    local rc=$?
    [ $rc -eq 1 ] || fail "$name: exit $rc, want 1: $(tail -3 "$tmp/$name.err")"
    [ "$(wc -l <"$tmp/$name.err")" -eq 1 ] || fail "$name: not one line on stderr: $(cat "$tmp/$name.err")"
}

# the tensor where backward first meets a non-finite gradient, by `mxtrain grads` on the
# weights of CHECKPOINT and the batch of step 2 (tokens 32.. of the shard: one rank, 2 x 16)
origin_of() {
    "$py" - "$tmp/tokens.bin" "$tmp/step2.bin" <<'PY' || fail "could not cut the step-2 shard"
import sys, numpy as np
raw = np.fromfile(sys.argv[1], dtype="<u2", offset=1024)
head = np.zeros(256, dtype="<i4"); head[:3] = (20240520, 1, len(raw) - 32)
with open(sys.argv[2], "wb") as f: f.write(head.tobytes()); f.write(raw[32:].tobytes())
PY
    "$bin" grads "$tmp/d.yaml" --weights "$1/model.safetensors" --tokens "$tmp/step2.bin" --out "$tmp/g.safetensors" \
        >/dev/null 2>"$tmp/grads.err" || fail "mxtrain grads failed: $(cat "$tmp/grads.err")"
    "$py" - "$tmp/g.safetensors" <<'PY'
import json, struct, sys, numpy as np
buf = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", buf[:8])[0]
head = json.loads(buf[8:8 + n])
def bad(name):
    a, b = head["grad." + name]["data_offsets"]
    return not np.isfinite(np.frombuffer(buf[8 + n + a:8 + n + b], dtype="<f4")).all()
order = ["model.embed_tokens.weight"]   # the model's order: Hugging Face's modules, layer by layer
for l in range(2):
    p = f"model.layers.{l}."
    order += [p + "input_layernorm.weight"] + [p + f"self_attn.{x}_proj.weight" for x in "qkvo"]
    order += [p + "post_attention_layernorm.weight"] + [p + f"mlp.{x}_proj.weight" for x in ("gate", "up", "down")]
order += ["model.norm.weight", "lm_head.weight"]
assert sorted(order) == sorted(k[5:] for k in head if k.startswith("grad.")), "tensor list differs from the model's"
bad_ones = [t for t in order if bad(t)]
print(f"{len(bad_ones)} {bad_ones[-1] if bad_ones else 'none'}")
PY
}

# metrics_ok FILE: every line is JSON (Python's parser refuses NaN only when asked: ask)
metrics_ok() {
    "$py" - "$1" <<'PY'
import json, sys
def refuse(c): raise ValueError(f"non-JSON constant {c}")
for i, line in enumerate(open(sys.argv[1]), 1):
    try: json.loads(line, parse_constant=refuse)
    except ValueError as e: sys.exit(f"    {sys.argv[1]}:{i}: not JSON: {e}: {line[:120]}")
PY
}

# 1. NaN gradients, finite loss.
run_diverging nan_grad --training.lr 1e8
read -r count origin <<<"$(origin_of "$tmp/S/iter_0000001")"
[ "$origin" != none ] || fail "the oracle finds no non-finite gradient at step 2"
want="mxtrain train: step 2: the gradient norm is nan: non-finite gradients in $count of 21 tensors, first in backward: $origin (loss "
line=$(cat "$tmp/nan_grad.err")
[[ "$line" == "$want"* ]] || fail "the line: $line
    want it to start: $want"
grep -q "diverged: the step is not applied and not saved" <<<"$line" || fail "the line: $line"
echo "    $line"
[ ! -e "$tmp/S/iter_0000002" ] || fail "the diverged step 2 was saved"
[ "$(cat "$tmp/S/latest_checkpointed_iteration.txt")" = 1 ] ||
    fail "latest names $(cat "$tmp/S/latest_checkpointed_iteration.txt"), want 1"
grep -q '^step     2' "$tmp/nan_grad.out" && fail "a progress line for the diverged step"
metrics_ok "$tmp/d.yaml.jsonl" || fail "the metrics file is not JSON"
[ "$(count_steps "$tmp/d.yaml.jsonl")" = 1 ] || fail "metrics of $(count_steps "$tmp/d.yaml.jsonl") steps, want 1"
"$bin" plot "$tmp/d.yaml.jsonl" --out "$tmp/d.png" >/dev/null 2>"$tmp/plot.err" || fail "plot: $(cat "$tmp/plot.err")"
# the latest checkpoint loads: training.load resumes from it (its weights are those step 1's
# update at lr 1e8 left, so the resumed run meets the same step 2 and says the same line)
"$bin" train "$tmp/d.yaml" --training.load "$tmp/S" --training.lr 1e8 >"$tmp/resume.out" 2>"$tmp/resume.err" &&
    fail "the resumed run did not stop at step 2"
grep -q "^resumed from $tmp/S/iter_0000001 at step 1$" "$tmp/resume.out" ||
    fail "not resumed: $(cat "$tmp/resume.err")"
[ "$(cat "$tmp/resume.err")" = "$line" ] || fail "resumed: $(cat "$tmp/resume.err")
    the first run: $line"
metrics_ok "$tmp/d.yaml.jsonl" || fail "the resumed metrics file is not JSON"
echo "    no step 2 saved; latest names iter_0000001, which loads and resumes into the same line; the metrics are JSON and plot"

# 2. The loss is NaN too (lr 1e20): the same, both named.
rm -rf "$tmp/S" "$tmp/d.yaml.jsonl"
run_diverging nan_loss --training.lr 1e20
read -r count origin <<<"$(origin_of "$tmp/S/iter_0000001")"
want="mxtrain train: step 2: the loss is nan and the gradient norm is nan: non-finite gradients in $count of 21 tensors, first in backward: $origin; diverged:"
line=$(cat "$tmp/nan_loss.err")
[[ "$line" == "$want"* ]] || fail "the line: $line
    want it to start: $want"
echo "    $line"
[ ! -e "$tmp/S/iter_0000002" ] && [ "$(cat "$tmp/S/latest_checkpointed_iteration.txt")" = 1 ] ||
    fail "with a NaN loss: $(ls "$tmp/S"), latest $(cat "$tmp/S/latest_checkpointed_iteration.txt")"
metrics_ok "$tmp/d.yaml.jsonl" || fail "the metrics file is not JSON"

# 3. The check off: every step is applied; NaN and infinity are null in the metrics.
rm -rf "$tmp/S" "$tmp/d.yaml.jsonl"
"$bin" train "$tmp/d.yaml" --training.lr 1e8 --training.check_for_nan_in_loss_and_grad false >"$tmp/off.out" 2>&1 ||
    fail "with the check off the run stopped: $(tail -3 "$tmp/off.out")"
grep -q '^step     2/6 | loss 4\.[0-9]* | lr [^|]* | grad norm *-\?nan' "$tmp/off.out" ||
    fail "the progress line of step 2: $(grep '^step     2' "$tmp/off.out")"
metrics_ok "$tmp/d.yaml.jsonl" || fail "with the check off the metrics file is not JSON"
"$py" - "$tmp/d.yaml.jsonl" <<'PY' || fail "with the check off: the metrics"
import json, math, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
assert [r["step"] for r in recs] == [1, 2, 3, 4, 5, 6], [r["step"] for r in recs]
assert math.isfinite(recs[0]["grad_norm"]) and recs[1]["grad_norm"] is None, recs[:2]
assert math.isfinite(recs[1]["loss"]) and all(r["loss"] is None for r in recs[2:]), [r["loss"] for r in recs]
PY
"$bin" plot "$tmp/d.yaml.jsonl" --out "$tmp/off.png" >/dev/null 2>"$tmp/plot.err" || fail "plot: $(cat "$tmp/plot.err")"
echo "    check off: 6 steps applied, grad_norm null from step 2, loss from step 3; plotted"

# 4. Two ranks against one process with the same global batch (2 micro-batches of 2): each
# rank's gradient shard holds its own set of non-finite tensors, yet both stop with the line
# the one process gives.
rm -rf "$tmp/S" "$tmp/d.yaml.jsonl"
run_diverging one --training.lr 1e8 --training.global_batch_size 4
one=$(sed 's/^mxtrain train: //' "$tmp/one.err")
rm -rf "$tmp/S"
OMP_NUM_THREADS=1 mpi_run -np 2 "$bin" train "$tmp/d.yaml" --training.lr 1e8 >"$tmp/two.out" 2>"$tmp/two.err" &&
    fail "2 ranks: the run did not stop"
lines=$(grep '^mxtrain train: rank [01]: ' "$tmp/two.err") || fail "2 ranks: no line: $(head -5 "$tmp/two.err")"
while read -r l; do
    [ "${l#mxtrain train: rank [01]: }" = "$one" ] || fail "2 ranks: $l
    one process: $one"
done <<<"$lines"
[ ! -e "$tmp/S/iter_0000002" ] && [ "$(cat "$tmp/S/latest_checkpointed_iteration.txt")" = 1 ] ||
    fail "2 ranks: $(ls "$tmp/S"), latest $(cat "$tmp/S/latest_checkpointed_iteration.txt")"
echo "    2 ranks: $(wc -l <<<"$lines") rank line(s), each the one process's"
