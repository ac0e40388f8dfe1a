#!/bin/bash
# mxtrain init / grads / plan / train from the command line: `grads` agrees with PyTorch on
# the same safetensors weights and token file; settings given as --SECTION.KEY VALUE take
# the place of the file's (train, init, plan, which says where each setting came from);
# every misuse is one line, the right exit status, and no output file.
. "$(dirname "$0")/common.bash"

# awkward sizes: hidden 96 over 3 heads and 1 KV head, sequence 37, 5 experts of which some
# receive no tokens, layer 1 dense
cat > "$tmp/moe.yaml" <<YAML
model:
  model_type: qwen3_moe
  vocab_size: 67
  hidden_size: 96
  intermediate_size: 80
  num_hidden_layers: 3
  num_attention_heads: 3
  num_key_value_heads: 1
  head_dim: 32
  max_position_embeddings: 64
  initializer_range: 0.1
  num_experts: 5
  num_experts_per_tok: 2
  moe_intermediate_size: 24
  norm_topk_prob: true
  mlp_only_layers: [1]
  output_router_logits: true
  router_aux_loss_coef: 0.05
data:
  data_path: $tmp/tokens.bin
  seq_length: 37
parallel:
  fsdp_plan:
    param_dtype: fp32
training:
  micro_batch_size: 2
  seed: 12
  lr: 1.0e-3
  train_iters: 3
YAML
/usr/bin/python3 - "$tmp/tokens.bin" <<'PY'
import sys, numpy as np
toks = (np.arange(500) * 7919 % 67).astype("<u2")
head = np.zeros(256, dtype="<i4"); head[:3] = (20240520, 1, len(toks))
with open(sys.argv[1], "wb") as f: f.write(head.tobytes()); f.write(toks.tobytes())
PY
"$bin" init "$tmp/moe.yaml" --out "$tmp/w.safetensors" > /dev/null || fail "init failed"
"$bin" grads "$tmp/moe.yaml" --weights "$tmp/w.safetensors" --tokens "$tmp/tokens.bin" --out "$tmp/g.safetensors" \
    > /dev/null || fail "grads failed"
cfg='{"B": 2, "T": 37, "model_type": 2, "hidden_size": 96, "num_attention_heads": 3, "num_key_value_heads": 1,
      "head_dim": 32, "num_hidden_layers": 3, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "num_experts": 5,
      "num_experts_per_tok": 2, "norm_topk_prob": 1, "output_router_logits": 1, "router_aux_loss_coef": 0.05}'
"$pyrun" tests/py/grads_check.py "$cfg" "$tmp/w.safetensors" "$tmp/tokens.bin" "$tmp/g.safetensors" \
    || fail "grads disagree with PyTorch"
# with the router z-loss (training.moe_z_loss_coeff) beside the load-balancing loss
"$bin" grads "$tmp/moe.yaml" --training.moe_z_loss_coeff 0.1 --weights "$tmp/w.safetensors" --tokens "$tmp/tokens.bin" \
    --out "$tmp/gz.safetensors" > /dev/null || fail "grads with the z-loss failed"
"$pyrun" tests/py/grads_check.py "${cfg%\}}, \"z_loss_coef\": 0.1}" "$tmp/w.safetensors" "$tmp/tokens.bin" \
    "$tmp/gz.safetensors" || fail "grads with the z-loss disagree with PyTorch"
cmp -s "$tmp/g.safetensors" "$tmp/gz.safetensors" && fail "the z-loss changed no gradient"

# the same weights as a sharded Hugging Face checkpoint directory (two files and
# model.safetensors.index.json) give the same gradients, byte for byte
mkdir "$tmp/ckpt"
/usr/bin/python3 - "$tmp/w.safetensors" "$tmp/ckpt" <<'PY' || fail "could not write the sharded checkpoint"
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
(n,) = struct.unpack("<Q", raw[:8])
header, data = json.loads(raw[8:8 + n]), raw[8 + n:]
names = sorted(k for k in header if k != "__metadata__")
shards, weight_map = {}, {}
for i, name in enumerate(names):
    file = f"model-0000{i % 2 + 1}-of-00002.safetensors"
    b, e = header[name]["data_offsets"]
    shards.setdefault(file, []).append((name, header[name], data[b:e]))
    weight_map[name] = file
for file, items in shards.items():
    head, blob = {"__metadata__": {"format": "pt"}}, b""
    for name, info, payload in items:
        head[name] = {"dtype": info["dtype"], "shape": info["shape"], "data_offsets": [len(blob), len(blob) + len(payload)]}
        blob += payload
    hj = json.dumps(head).encode()
    hj += b" " * (-len(hj) % 8)
    open(f"{sys.argv[2]}/{file}", "wb").write(struct.pack("<Q", len(hj)) + hj + blob)
json.dump({"metadata": {"total_size": len(data)}, "weight_map": weight_map}, open(f"{sys.argv[2]}/model.safetensors.index.json", "w"))
PY
"$bin" grads "$tmp/moe.yaml" --weights "$tmp/ckpt" --tokens "$tmp/tokens.bin" --out "$tmp/g_sharded.safetensors" \
    > /dev/null || fail "grads from the sharded checkpoint failed"
cmp -s "$tmp/g.safetensors" "$tmp/g_sharded.safetensors" || fail "the sharded checkpoint gives other gradients"

# the per-tensor, rowwise and blockwise recipes: `grads` against PyTorch's emulation of their three
# products (1e-2), every linear layer and the experts converted (both converters of the
# family by default); the emulation's spec is "inputs weight grads mode tiles granularity
# high_precision_gemms dgrad_weight_per_tensor" (tests/py/model_ref.py)
for recipe in "tensorwise 0 0 1 0 0 1 0 0" "hif8 2 2 2 0 0 1 0 0" "rowwise 0 0 0 1 0 2 0 0" \
              "rowwise_with_gw_hp 0 0 0 1 0 2 4 1" "blockwise 0 0 0 1 0 3 0 0"; do
    set -- $recipe
    sed "s/^  train_iters: 3$/  train_iters: 3\n  quantization_plan:\n    recipe_name: $1/" "$tmp/moe.yaml" > "$tmp/$1.yaml"
    "$bin" grads "$tmp/$1.yaml" --weights "$tmp/w.safetensors" --tokens "$tmp/tokens.bin" --out "$tmp/g_$1.safetensors" \
        > /dev/null || fail "grads with $1 failed"
    "$bin" plan "$tmp/$1.yaml" --json > "$tmp/$1.plan" || fail "plan of $1 failed"
    "$pyrun" tests/py/grads_check.py "$cfg" "$tmp/w.safetensors" "$tmp/tokens.bin" "$tmp/g_$1.safetensors" \
        "$2 $3 $4 $5 $6 $7 $8 $9" "$tmp/$1.plan" || fail "grads with $1 disagree with PyTorch's emulation"
    cmp -s "$tmp/g.safetensors" "$tmp/g_$1.safetensors" && fail "$1 changed no gradient"
done

# the delayed recipes: 3 steps of training leave scales off 1 in the checkpoint's amax
# histories; `grads` on that checkpoint casts with them (and records nothing), and agrees
# with PyTorch's emulation given those scales
for recipe in "delayed 0 0 1" "delayed_hif8_pertensor 2 2 2"; do
    set -- $recipe
    sed "s/^  train_iters: 3$/  train_iters: 3\n  save: $(sed 's/[\/&]/\\&/g' <<<"$tmp/ck_$1")\n  quantization_plan:\n    recipe_name: $1\n    amax_history_len: 1/" "$tmp/moe.yaml" > "$tmp/$1.yaml"
    "$bin" train "$tmp/$1.yaml" > "$tmp/$1.train" 2>&1 || fail "training with $1 failed: $(tail -2 "$tmp/$1.train")"
    ck="$tmp/ck_$1/iter_0000003"
    cp "$ck/delayed_scaling.safetensors" "$tmp/$1.state"
    "$bin" grads "$tmp/$1.yaml" --weights "$ck" --tokens "$tmp/tokens.bin" --out "$tmp/g_$1.safetensors" \
        > /dev/null || fail "grads with $1 failed"
    cmp -s "$ck/delayed_scaling.safetensors" "$tmp/$1.state" || fail "grads with $1 changed the checkpoint"
    "$bin" plan "$tmp/$1.yaml" --json > "$tmp/$1.plan" || fail "plan of $1 failed"
    /usr/bin/python3 - "$ck/delayed_scaling.safetensors" <<'PY' || fail "$1: the scales are still 1"
import sys
sys.path.insert(0, "tests/py")
import grads_check
s = grads_check.delayed_scales(sys.argv[1])
moved = sum(v != 1.0 for t in s.values() for v in t)
assert moved >= 2 * len(s), (moved, len(s))
PY
    "$pyrun" tests/py/grads_check.py "$cfg" "$ck/model.safetensors" "$tmp/tokens.bin" "$tmp/g_$1.safetensors" \
        "$2 $3 $4 0 0 1" "$tmp/$1.plan" "$ck/delayed_scaling.safetensors" || fail "grads with $1 disagree with PyTorch's emulation"
done

# init is deterministic for a seed
"$bin" init "$tmp/moe.yaml" --out "$tmp/w2.safetensors" > /dev/null && cmp -s "$tmp/w.safetensors" "$tmp/w2.safetensors" \
    || fail "init is not reproducible"

# plan --json is JSON and names every module
"$bin" plan "$tmp/moe.yaml" --json | /usr/bin/python3 -c 'import json,sys; d=json.load(sys.stdin); assert d["recipe"] is None and d["converted"] == 0 and len(d["modules"]) > 20' \
    || fail "plan --json"

expect() {   # expect STATUS "message part" args...
    local want=$1 part=$2; shift 2
    local err rc
    err=$("$bin" "$@" 2>&1 >/dev/null); rc=$?
    [ "$rc" -eq "$want" ] || fail "mxtrain $*: exit $rc, want $want ($err)"
    [ "$(printf '%s\n' "$err" | head -c 2000 | grep -c .)" -ge 1 ] || fail "mxtrain $*: no message"
    grep -qF -- "$part" <<<"$err" || fail "mxtrain $*: message lacks '$part': $err"
}
expect 2 "missing --out" init "$tmp/moe.yaml"
expect 2 "unknown option '--bogus'" grads "$tmp/moe.yaml" --bogus
expect 2 "missing CONFIG" train
expect 2 "--weights needs a value" grads "$tmp/moe.yaml" --weights
expect 1 "$tmp/none.yaml" train "$tmp/none.yaml"
printf 'model:\n  model_type: llama\n  hidden_size: [1\n' > "$tmp/broken.yaml"
expect 1 "broken.yaml:4:1: YAML syntax error" plan "$tmp/broken.yaml"
sed 's/num_experts_per_tok: 2/num_experts_per_tok: 9/' "$tmp/moe.yaml" > "$tmp/topk.yaml"
expect 1 "num_experts_per_tok" train "$tmp/topk.yaml"
# a truncated weights file: one line, exit 1, no gradient file written
head -c 300 "$tmp/w.safetensors" > "$tmp/cut.safetensors"
expect 1 "cut.safetensors" grads "$tmp/moe.yaml" --weights "$tmp/cut.safetensors" --tokens "$tmp/tokens.bin" --out "$tmp/g2.safetensors"
[ ! -e "$tmp/g2.safetensors" ] || fail "grads left an output file after an error"
# weights of another model: a missing tensor is named
sed 's/num_hidden_layers: 3/num_hidden_layers: 4/' "$tmp/moe.yaml" > "$tmp/deeper.yaml"
expect 1 "model.layers.3" grads "$tmp/deeper.yaml" --weights "$tmp/w.safetensors" --tokens "$tmp/tokens.bin" --out "$tmp/g3.safetensors"
# tokens beyond the vocabulary
sed 's/vocab_size: 67/vocab_size: 50/' "$tmp/moe.yaml" > "$tmp/small_vocab.yaml"
expect 1 "vocab" train "$tmp/small_vocab.yaml"
# a save directory that cannot be created fails at start, before any step
printf 'x' > "$tmp/afile"
sed "s|  train_iters: 3|  train_iters: 3\n  save: $tmp/afile/ckpt|" "$tmp/moe.yaml" > "$tmp/badsave.yaml"
expect 1 "training.save: cannot create the directory '$tmp/afile/ckpt'" train "$tmp/badsave.yaml"
# plan predicts the gather bytes of the converted weights; --ranks must be a positive integer
expect 2 "--ranks: 'two' is not allowed" plan "$tmp/moe.yaml" --ranks two
# (the example's sizes are multiples of 32: on-demand is (1 + 1/32) / 2 of bf16 exactly)
out=$("$bin" plan examples/qwen3_moe_mxfp8.yaml --json --ranks 3) || fail "plan --json --ranks 3 failed"
/usr/bin/python3 -c '
import json, sys
g = json.loads(sys.argv[1])["gather_bytes_per_step"]
assert g["ranks"] == 3 and g["bf16"] > 0 and 64 * g["on_demand"] == 33 * g["bf16"] and g["all"] == 2 * g["on_demand"], g
' "$out" || fail "plan --json has no consistent gather_bytes_per_step: $out"
# a checkpoint directory that holds no checkpoint, and one whose state file is damaged
sed "s|  train_iters: 3|  train_iters: 3\n  load: $tmp/nockpt|" "$tmp/moe.yaml" > "$tmp/load.yaml"
mkdir -p "$tmp/nockpt"
expect 1 "training.load: '$tmp/nockpt' holds no checkpoint (no latest_checkpointed_iteration.txt or trainer_state.json)" train "$tmp/load.yaml"
echo '{"step": 3}' > "$tmp/nockpt/trainer_state.json"
expect 1 "trainer_state.json: expected {\"step\", \"data\"" train "$tmp/load.yaml"
# an FSDP group larger than the job (one process: world size 1)
sed "s/^parallel:/parallel:\n  fully_shard_parallel_size: 2/" "$tmp/moe.yaml" > "$tmp/fsdp2.yaml"
expect 1 "parallel.data_parallel_size: auto x parallel.fully_shard_parallel_size: 2 does not fit this job of 1 rank (2 does not divide 1; allowed: sizes whose product is 1, either may be auto)" train "$tmp/fsdp2.yaml"
# settings on the command line over the file's
"$bin" train "$tmp/moe.yaml" --training.train_iters 2 --training.metrics_path="$tmp/ov.jsonl" \
    --parallel.fsdp_plan.param_dtype fp32 > "$tmp/ov.log" 2>&1 || { cat "$tmp/ov.log"; fail "train with overrides failed"; }
grep -q "^mxtrain train: $tmp/moe.yaml, .* 2 steps$" "$tmp/ov.log" || fail "--training.train_iters 2 did not make 2 steps: $(head -1 "$tmp/ov.log")"
[ "$(wc -l < "$tmp/ov.jsonl")" -eq 2 ] || fail "--training.metrics_path=: not 2 metrics lines in $tmp/ov.jsonl"
out=$("$bin" plan "$tmp/moe.yaml" --training.lr 5e-4 --json) || fail "plan with an override failed: $out"
$py -c '
import json, sys
s = json.loads(sys.argv[1])["settings"]
assert s["training.lr"] == {"value": "0.0005", "from": "command line"}, s["training.lr"]
assert s["model.hidden_size"]["from"].endswith("moe.yaml:4"), s["model.hidden_size"]
assert s["training.adam_eps"]["from"] == "default", s["training.adam_eps"]
' "$out" || fail "plan --json does not say where the settings came from"
"$bin" plan "$tmp/moe.yaml" --training.lr=5e-4 | grep -qx "  training.lr: 0.0005 (command line)" || fail "plan does not list the override"
"$bin" init "$tmp/moe.yaml" --model.num_hidden_layers 1 --model.mlp_only_layers "[]" --out "$tmp/w1.safetensors" > /dev/null || fail "init with an override failed"
$py - "$tmp/w1.safetensors" <<'PY' || fail "init --model.num_hidden_layers 1 did not write a 1-layer model"
import json, struct, sys
raw = open(sys.argv[1], "rb").read(); (n,) = struct.unpack("<Q", raw[:8]); h = json.loads(raw[8:8 + n])
assert any(k.startswith("model.layers.0.") for k in h) and not any(k.startswith("model.layers.1.") for k in h), sorted(h)
PY
expect 1 "command line: training.lr: 'fast' is not a number (allowed: a number > 0)" train "$tmp/moe.yaml" --training.lr fast
expect 1 "command line: --training.lrr: unknown key 'lrr'; did you mean 'lr'?" plan "$tmp/moe.yaml" --training.lrr 1
expect 2 "--training.lr needs a value" train "$tmp/moe.yaml" --training.lr
[ "$("$bin" train "$tmp/moe.yaml" --training.lr fast 2>&1 | grep -c .)" -eq 1 ] || fail "a bad override is not one line"
exit 0
