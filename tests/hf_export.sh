#!/bin/bash
# Checkpoints as Hugging Face model directories:
#  - every iter_N holds a complete config.json beside model.safetensors ({"format": "pt"}),
#    which tests/py/hf_reader.py turns into a plain PyTorch model from config.json alone
#    (every tensor and shape must be the ones the config implies); its loss on fixed tokens
#    equals `mxtrain grads` on the same directory, for Qwen3-MoE and for a tied, biased Llama;
#  - `model_name_or_path: ckpt/iter_N` builds that model and starts from those weights;
#  - `mxtrain export` writes a standalone directory: fp32 equal to the checkpoint bit for
#    bit, bf16 sharded past --max-shard-size with model.safetensors.index.json (checked by
#    the same reader and by grads), from a save directory or an iter_N;
#  - export errors are one line, with no output directory left behind.
. "$(dirname "$0")/common.bash"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive

write_tokens "$tmp/tokens.bin" 20000 7919
data="data:
  data_path: $tmp/tokens.bin
  seq_length: 16
parallel:
  fsdp_plan:
    param_dtype: fp32"
cat > "$tmp/moe.yaml" <<YAML
model:
  model_type: qwen3_moe
  vocab_size: 61
  hidden_size: 32
  intermediate_size: 48
  num_hidden_layers: 3
  num_attention_heads: 4
  num_key_value_heads: 2
  head_dim: 8
  max_position_embeddings: 16
  rms_norm_eps: 1.0e-5
  rope_theta: 500000.0
  num_experts: 4
  num_experts_per_tok: 2
  moe_intermediate_size: 16
  norm_topk_prob: true
  mlp_only_layers: [1]
  output_router_logits: true
  router_aux_loss_coef: 0.02
$data
training:
  micro_batch_size: 2
  lr: 3.0e-3
  train_iters: 3
  save: $tmp/moe_ck
YAML
cat > "$tmp/llama.yaml" <<YAML
model:
  model_type: llama
  vocab_size: 61
  hidden_size: 32
  intermediate_size: 40
  num_hidden_layers: 2
  num_attention_heads: 2
  max_position_embeddings: 16
  tie_word_embeddings: true
  attention_bias: true
$data
training:
  micro_batch_size: 2
  lr: 3.0e-3
  train_iters: 2
  save: $tmp/llama_ck
YAML
# a config that takes the whole model from a directory
from_dir() {   # from_dir FILE DIR
    cat > "$1" <<YAML
model:
  model_name_or_path: $2
$data
training:
  micro_batch_size: 2
  lr: 1.0e-3
  train_iters: 1
  metrics_path: $1.jsonl
YAML
}
# reader_check DIR: the PyTorch reader's loss on the tokens equals grads' on the same directory
reader_check() {
    from_dir "$tmp/grads.yaml" "$1"
    "$bin" grads "$tmp/grads.yaml" --weights "$1" --tokens "$tmp/tokens.bin" --out "$tmp/g.safetensors" > /dev/null ||
        fail "grads could not use $1"
    "$pyrun" tests/py/hf_reader.py "$1" "$tmp/tokens.bin" 2 16 "$tmp/g.safetensors" || fail "$1 is not read as it should be"
}

for m in moe llama; do
    "$bin" train "$tmp/$m.yaml" > "$tmp/$m.log" 2>&1 || fail "training $m failed: $(tail -2 "$tmp/$m.log")"
done
reader_check "$tmp/moe_ck/iter_0000003"
reader_check "$tmp/llama_ck/iter_0000002"

# model_name_or_path: ckpt/iter_N: the model of its config.json, from its weights (step 1's
# loss is the loss of those weights on the first batch, as grads computed it)
from_dir "$tmp/cont.yaml" "$tmp/moe_ck/iter_0000003"
"$bin" plan "$tmp/cont.yaml" | grep -q "model.layers.2.mlp.experts" || fail "plan does not see the checkpoint's model"
"$bin" train "$tmp/cont.yaml" > "$tmp/cont.log" 2>&1 || fail "training from iter_N failed: $(tail -2 "$tmp/cont.log")"
"$bin" grads "$tmp/cont.yaml" --weights "$tmp/moe_ck/iter_0000003" --tokens "$tmp/tokens.bin" --out "$tmp/g1.safetensors" > /dev/null
$py - "$tmp/cont.yaml.jsonl" "$tmp/g1.safetensors" <<'PY' || fail "model_name_or_path: iter_N did not start from its weights"
import json, struct, sys
first = json.loads(open(sys.argv[1]).readline())["loss"]
raw = open(sys.argv[2], "rb").read(); (n,) = struct.unpack("<Q", raw[:8]); h = json.loads(raw[8:8 + n])
b, _ = h["loss"]["data_offsets"]; (want,) = struct.unpack("<f", raw[8 + n + b: 8 + n + b + 4])
assert abs(first - want) <= 1e-5 * want, (first, want)
PY

# export fp32 from the save directory (its latest): the checkpoint's tensors, bit for bit
out=$("$bin" export "$tmp/moe_ck" --out "$tmp/exp32") || fail "export fp32 failed"
grep -q "exported $tmp/moe_ck/iter_0000003 to $tmp/exp32: .* 1 safetensors file$" <<<"$out" || fail "export summary: $out"
[ "$(ls "$tmp/exp32")" = "config.json
model.safetensors" ] || fail "export fp32 wrote $(ls "$tmp/exp32")"
$py - "$tmp/moe_ck/iter_0000003" "$tmp/exp32" <<'PY' || fail "the fp32 export is not the checkpoint"
import json, struct, sys
def tensors(path):
    raw = open(path, "rb").read(); (n,) = struct.unpack("<Q", raw[:8]); h = json.loads(raw[8:8 + n])
    assert h["__metadata__"] == {"format": "pt"}, h["__metadata__"]
    return {k: (v["dtype"], v["shape"], raw[8 + n + v["data_offsets"][0]: 8 + n + v["data_offsets"][1]])
            for k, v in h.items() if k != "__metadata__"}
a, b = (tensors(d + "/model.safetensors") for d in sys.argv[1:3])
assert a == b
ca, cb = (json.load(open(d + "/config.json")) for d in sys.argv[1:3])
assert ca == cb and cb["torch_dtype"] == "float32"
PY
reader_check "$tmp/exp32"

# export bf16 from iter_N with a tiny shard limit: several shards and an index
out=$("$bin" export "$tmp/moe_ck/iter_0000003" --out "$tmp/exp16/" --dtype bf16 --max-shard-size 6KB) || fail "export bf16 failed"
ls "$tmp/exp16" | grep -q "^model-00001-of-000[0-9][0-9].safetensors$" || fail "no shards: $(ls "$tmp/exp16")"
[ -e "$tmp/exp16/model.safetensors" ] && fail "a sharded export also wrote model.safetensors"
$py - "$tmp/exp16" 6000 <<'PY' || fail "the shards are not split by the limit"
import json, os, struct, sys
d, limit = sys.argv[1], int(sys.argv[2])
idx = json.load(open(d + "/model.safetensors.index.json"))
files = sorted(set(idx["weight_map"].values()))
assert len(files) > 2 and files == [f"model-{k:05d}-of-{len(files):05d}.safetensors" for k in range(1, len(files) + 1)], files
for f in files:
    raw = open(os.path.join(d, f), "rb").read(); (n,) = struct.unpack("<Q", raw[:8]); h = json.loads(raw[8:8 + n])
    sizes = [v["data_offsets"][1] - v["data_offsets"][0] for k, v in h.items() if k != "__metadata__"]
    assert sum(sizes) <= limit or len(sizes) == 1, (f, sizes)
assert json.load(open(d + "/config.json"))["torch_dtype"] == "bfloat16"
PY
reader_check "$tmp/exp16"
"$bin" export "$tmp/llama_ck/iter_0000002" --out "$tmp/expl" --dtype bf16 > /dev/null || fail "export llama failed"
reader_check "$tmp/expl"

# errors: one line, the right status, nothing written
expect() {   # expect STATUS "message part" args...
    local want=$1 part=$2; shift 2
    local err rc
    err=$("$bin" "$@" 2>&1 >/dev/null); rc=$?
    [ "$rc" -eq "$want" ] || fail "mxtrain $*: exit $rc, want $want ($err)"
    grep -qF -- "$part" <<<"$err" || fail "mxtrain $*: message lacks '$part': $err"
    [ "$rc" -eq 2 ] || [ "$(wc -l <<<"$err")" -eq 1 ] || fail "mxtrain $*: not one line: $err"
}
expect 2 "missing --out" export "$tmp/moe_ck"
expect 2 "--dtype: 'fp16' is not allowed (allowed: fp32" export "$tmp/moe_ck" --out "$tmp/x" --dtype fp16
expect 2 "--max-shard-size: '5 GB' is not allowed" export "$tmp/moe_ck" --out "$tmp/x" --max-shard-size "5 GB"
expect 2 "--max-shard-size: '0' is not allowed" export "$tmp/moe_ck" --out "$tmp/x" --max-shard-size 0
expect 1 "mxtrain export: '$tmp/nothing' holds no checkpoint" export "$tmp/nothing" --out "$tmp/x"
expect 1 "--out: '$tmp/exp32' is a directory that is not empty" export "$tmp/moe_ck" --out "$tmp/exp32"
[ "$(ls "$tmp/exp32" | wc -l)" -eq 2 ] || fail "a refused export touched its --out"
expect 1 "--out: '$tmp/tokens.bin' exists and is not a directory" export "$tmp/moe_ck" --out "$tmp/tokens.bin"
cp -r "$tmp/moe_ck/iter_0000003" "$tmp/cut"
head -c 1000 "$tmp/moe_ck/iter_0000003/model.safetensors" > "$tmp/cut/model.safetensors"
mkdir -p "$tmp/.x.tmp-export" && echo stale > "$tmp/.x.tmp-export/model.safetensors"
expect 1 "cut/model.safetensors" export "$tmp/cut" --out "$tmp/x"
[ ! -e "$tmp/x" ] || fail "a failed export left $tmp/x"
"$bin" export "$tmp/moe_ck" --out "$tmp/x" > /dev/null || fail "export next to a stale temporary directory failed"
[ ! -e "$tmp/.x.tmp-export" ] || fail "the temporary directory of an export stayed"
sed 's/"num_experts": 4/"num_experts": 5/' "$tmp/moe_ck/iter_0000003/config.json" > "$tmp/cut/config.json"
cp "$tmp/moe_ck/iter_0000003/model.safetensors" "$tmp/cut/"
expect 1 "model.layers.0.mlp.gate.weight' has shape [4, 32] (F32), expected [5, 32]" export "$tmp/cut" --out "$tmp/y"
[ ! -e "$tmp/y" ] || fail "a failed export left $tmp/y"
exit 0
