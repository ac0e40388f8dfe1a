#!/bin/bash
# Validation (training.eval_interval, training.eval_iters, data.val_data_path):
#  - the JSONL val_loss of each evaluation equals the loss of the checkpoint of that step on
#    the first batches of the validation shard, computed independently: in plain PyTorch
#    from the checkpoint's config.json and weights (fp32, 3 batches), and by `mxtrain grads`
#    with the MXFP8 plan (the quantized forward), on 1 rank and on 2 ranks (each rank its own
#    rows; the mean over both equals grads on a batch of both ranks' rows);
#  - every evaluation reads the same batches (steps 2 and 4 both match their checkpoints);
#  - evaluating does not change training: the losses equal a run without validation, exactly;
#  - progress line, summary and JSONL report it; bad keys and missing files are one line.
# tests/run: launches MPI ranks
. "$(dirname "$0")/common.bash"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"   # Open MPI's (see fsdp.sh)
export OMPI_MCA_btl_vader_single_copy_mechanism=none

write_tokens "$tmp/train.bin" 20000 7919 1
write_tokens "$tmp/val.bin" 20000 104729 1
write_config() {   # write_config FILE MODEL(llama|moe) DTYPE MICRO EXTRA_DATA EXTRA_TRAINING
    local model
    if [ "$2" = llama ]; then model="  model_type: llama
  vocab_size: 61
  hidden_size: 32
  intermediate_size: 48
  num_hidden_layers: 2
  num_attention_heads: 2
  max_position_embeddings: 16"
    else model="  model_type: qwen3_moe
  vocab_size: 61
  hidden_size: 64
  intermediate_size: 64
  num_hidden_layers: 2
  num_attention_heads: 2
  num_key_value_heads: 1
  head_dim: 32
  max_position_embeddings: 16
  num_experts: 4
  num_experts_per_tok: 2
  moe_intermediate_size: 32
  mlp_only_layers: [0]"
    fi
    cat > "$1" <<YAML
model:
$model
data:
  data_path: $tmp/train.bin
  seq_length: 16
$5
parallel:
  fsdp_plan:
    param_dtype: $3
training:
  micro_batch_size: $4
  lr: 3.0e-3
  train_iters: 4
  metrics_path: $1.jsonl
$6
YAML
}
mxfp8="  quantization_plan:
    recipe_name: mxfp8
    apply_modules: ['model.layers.{*}']
    ignored_modules: ['*gate', '*lm_head']"
val="  val_data_path: $tmp/val.bin"
run() {   # run N CONFIG
    mpi_run -np "$1" "$bin" train "$2" > "$2.log" 2>&1 || { tail -3 "$2.log"; fail "training $2 on $1 ranks failed"; }
}
val_losses() {   # "STEP:LOSS ..." of the validation records
    $py -c 'import json,sys; print(" ".join("%d:%r" % (r["step"], r["val_loss"]) for r in map(json.loads, open(sys.argv[1])) if "val_loss" in r))' "$1"
}

# fp32 dense model, 3 batches per evaluation, against PyTorch from the checkpoints
write_config "$tmp/d.yaml" llama fp32 2 "$val" "  eval_interval: 2
  eval_iters: 3
  save: $tmp/d_ck
  save_interval: 2"
run 1 "$tmp/d.yaml"
$py - "$tmp/d.yaml.jsonl" "$tmp/d_ck" "$tmp/val.bin" <<'PY' || fail "val_loss is not the PyTorch loss of the checkpoint"
import json, os, sys
sys.path.insert(0, "tests/py")
import torch, hf_reader
torch.set_num_threads(1)
recs = [r for r in map(json.loads, open(sys.argv[1])) if "val_loss" in r]
assert [r["step"] for r in recs] == [2, 4], recs
for r in recs:
    assert r["val_iters"] == 3 and r["val_tokens"] == 3 * 2 * 16, r
    cfg, W = hf_reader.load(os.path.join(sys.argv[2], f"iter_{r['step']:07d}"))
    want = sum(hf_reader.batch_loss(cfg, W, sys.argv[3], 2, 16, first=i * 32)[0] for i in range(3)) / 3
    assert abs(r["val_loss"] - want) <= 1e-5 * want, (r, want)
PY
grep -q "^validation: every 2 steps and after the last step, 3 batches per rank from data.val_data_path (624 in one pass)$" "$tmp/d.yaml.log" ||
    fail "no validation line: $(head -3 "$tmp/d.yaml.log")"
grep -q "^step     2/4 | loss [0-9.]* | val loss [0-9.]* | lr" "$tmp/d.yaml.log" || fail "no val loss on the progress line"
grep -q "^done: 4 steps in .* | val loss [0-9.]* |" "$tmp/d.yaml.log" || fail "no val loss in the summary"
# the same run without validation trains the same
write_config "$tmp/d0.yaml" llama fp32 2 "" ""
run 1 "$tmp/d0.yaml"
$py - "$tmp/d0.yaml.jsonl" "$tmp/d.yaml.jsonl" <<'PY' || fail "validation changed the training losses"
import json, sys
a, b = ([r["loss"] for r in map(json.loads, open(p)) if "loss" in r] for p in sys.argv[1:3])
assert len(a) == 4 and a == b, (a, b)
PY

# MXFP8 Qwen3-MoE on 1 and 2 ranks (bf16 param_dtype, the quantized forward), against grads
for n in 1 2; do
    write_config "$tmp/m$n.yaml" moe bf16 $((4 / n)) "$val" "$mxfp8
  eval_interval: 2
  eval_iters: 1
  save: $tmp/m${n}_ck
  save_interval: 2"
    run $n "$tmp/m$n.yaml"
    grep -q "weights gathered as on-demand" "$tmp/m$n.yaml.log" || fail "the MXFP8 run does not gather MX planes"
    write_config "$tmp/g.yaml" moe bf16 4 "" "$mxfp8"
    for step in 2 4; do
        "$bin" grads "$tmp/g.yaml" --weights "$tmp/m${n}_ck/iter_000000$step" --tokens "$tmp/val.bin" \
            --out "$tmp/g$n$step.safetensors" > /dev/null || fail "grads failed"
    done
    $py - "$tmp/m$n.yaml.jsonl" "$tmp/g${n}2.safetensors" "$tmp/g${n}4.safetensors" <<'PY' || fail "MXFP8 val_loss on $n ranks is not grads' loss"
import json, struct, sys
def loss(path):
    raw = open(path, "rb").read(); (n,) = struct.unpack("<Q", raw[:8]); h = json.loads(raw[8:8 + n])
    b, _ = h["loss"]["data_offsets"]; return struct.unpack("<f", raw[8 + n + b: 8 + n + b + 4])[0]
recs = [r for r in map(json.loads, open(sys.argv[1])) if "val_loss" in r]
assert [r["step"] for r in recs] == [2, 4], recs
for r, g in zip(recs, sys.argv[2:4]):
    want = loss(g)
    # grads computes with the weights rounded to bf16 as the trainer gathers them (norms and
    # embedding too): the same forward, up to grads' fp32 loss (its float rounding)
    assert abs(r["val_loss"] - want) <= 1e-6 * want, (r["step"], r["val_loss"], want)
PY
done
# and validation changes nothing in the 2-rank MXFP8 run
write_config "$tmp/m0.yaml" moe bf16 2 "" "$mxfp8"
run 2 "$tmp/m0.yaml"
$py - "$tmp/m0.yaml.jsonl" "$tmp/m2.yaml.jsonl" <<'PY' || fail "validation changed the 2-rank MXFP8 losses"
import json, sys
a, b = ([r["loss"] for r in map(json.loads, open(p)) if "loss" in r] for p in sys.argv[1:3])
assert len(a) == 4 and a == b, (a, b)
PY

# eval_interval 0 (the default): once, after the last step; more eval_iters than batches is said
write_config "$tmp/e.yaml" llama fp32 2 "  val_data_path: $tmp/small_val.bin" "  eval_iters: 5"
$py - "$tmp/val.bin" "$tmp/small_val.bin" <<'PY'
import sys, numpy as np
toks = np.fromfile(sys.argv[1], dtype="<u2", offset=1024, count=100)
head = np.zeros(256, dtype="<i4"); head[:3] = (20240520, 1, len(toks))
open(sys.argv[2], "wb").write(head.tobytes() + toks.tobytes())
PY
run 1 "$tmp/e.yaml"
[ "$(val_losses "$tmp/e.yaml.jsonl" | wc -w)" = 1 ] && val_losses "$tmp/e.yaml.jsonl" | grep -q "^4:" ||
    fail "eval_interval 0 did not evaluate once at the end: $(val_losses "$tmp/e.yaml.jsonl")"
grep -q "^note: data.val_data_path holds 3 batches of 1 x 2 x 16 tokens; training.eval_iters 5 evaluates some of them more than once$" "$tmp/e.yaml.log" ||
    fail "no note about too few validation batches: $(grep note "$tmp/e.yaml.log")"

# errors, one line each, before any step
expect() {   # expect "message part" CONFIG
    local err
    err=$("$bin" train "$2" 2>&1) && fail "$2 was accepted"
    grep -qF -- "$1" <<<"$err" || fail "$2: message lacks '$1': $err"
    [ "$(wc -l <<<"$err")" -eq 1 ] || fail "$2: not one line: $err"
}
write_config "$tmp/x1.yaml" llama fp32 2 "  val_data_path: $tmp/nothing_*.bin" ""
expect "x1.yaml:12: data.val_data_path: $tmp/nothing_*.bin: no file matches this pattern" "$tmp/x1.yaml"
write_config "$tmp/x2.yaml" llama fp32 2 "  val_data_path: $tmp/missing.bin" ""
expect "data.val_data_path: $tmp/missing.bin: cannot open (No such file or directory)" "$tmp/x2.yaml"
write_config "$tmp/x3.yaml" llama fp32 2 "" "  eval_interval: 10"
expect "training.eval_interval: 10 needs data.val_data_path" "$tmp/x3.yaml"
write_config "$tmp/x4.yaml" llama fp32 2 "" "  eval_iters: 4"
expect "training.eval_iters: 4 needs data.val_data_path" "$tmp/x4.yaml"
write_config "$tmp/x5.yaml" llama fp32 2 "$val" "  eval_iters: 0"
expect "training.eval_iters: 0 is out of range (allowed: an integer >= 1)" "$tmp/x5.yaml"
write_config "$tmp/x6.yaml" llama fp32 2 "$val" "  eval_interval: -1"
expect "training.eval_interval: -1 is out of range (allowed: an integer >= 0)" "$tmp/x6.yaml"
write_config "$tmp/x7.yaml" llama fp32 2 "$val" "  eval_intervall: 5"
expect "eval_intervall" "$tmp/x7.yaml"
exit 0
