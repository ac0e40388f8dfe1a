#!/bin/bash
# Files a user names that are not what they should be: a FIFO (a plain open() blocks
# forever), a device (/dev/zero would be read until memory ran out), a directory, a file
# over the size limit; weights holding a NaN or an infinity (which would train on to
# `loss nan`). Each is refused at once with one line naming the path (and the tensor), what
# it is and what is allowed, exit status 1, and no output file.
. "$(dirname "$0")/common.bash"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive

"$bin" prepare --out "$tmp/data" >/dev/null 2>&1 || fail "prepare failed"
good="$tmp/good.yaml"
sed -e "s|data/fortunes/|$tmp/data/|" -e 's/train_iters: 200/train_iters: 2/' examples/llama_tiny.yaml > "$good"
mkfifo "$tmp/fifo"
mkdir "$tmp/dir"

# expect "message part" args...: exit 1 within 20 s, exactly one line on stderr
expect() {
    local part=$1; shift
    local err rc
    err=$(timeout 20 "$bin" "$@" 2>&1 >/dev/null); rc=$?
    [ "$rc" -ne 124 ] || fail "mxtrain $*: still running after 20 s"
    [ "$rc" -eq 1 ] || fail "mxtrain $*: exit $rc, want 1 ($err)"
    [ "$(grep -c . <<<"$err")" -eq 1 ] || fail "mxtrain $*: not one line: $err"
    grep -qF -- "$part" <<<"$err" || fail "mxtrain $*: message lacks '$part': $err"
}

# the config
for cmd in train plan init; do
    args=()
    [ $cmd = init ] && args=(--out "$tmp/w.safetensors")
    expect "$tmp/fifo: is a FIFO, not a regular file (allowed: a YAML config file)" $cmd "$tmp/fifo" "${args[@]}"
    expect "/dev/zero: is a character device, not a regular file (allowed: a YAML config file)" $cmd /dev/zero "${args[@]}"
    expect "$tmp/dir: is a directory (allowed: a YAML config file)" $cmd "$tmp/dir" "${args[@]}"
done
truncate -s $(( (16 << 20) + 1 )) "$tmp/huge.yaml"
expect "$tmp/huge.yaml: is 16777217 bytes (allowed: a YAML config file of at most 16 MiB)" train "$tmp/huge.yaml"
[ ! -e "$tmp/w.safetensors" ] || fail "init wrote its output after an error"

# token shards: a FIFO matched by the data pattern, /dev/zero named directly
cp "$tmp/data/train_000000.bin" "$tmp/dir/train_a.bin"
mkfifo "$tmp/dir/train_b.bin"
sed "s|data_path: .*|data_path: $tmp/dir/train_*.bin|" "$good" > "$tmp/fifo_data.yaml"
expect "$tmp/dir/train_b.bin: is a FIFO, not a regular file (allowed: an llm.c token shard)" train "$tmp/fifo_data.yaml"
sed "s|data_path: .*|data_path: /dev/zero|" "$good" > "$tmp/zero_data.yaml"
expect "/dev/zero: is a character device, not a regular file (allowed: an llm.c token shard)" train "$tmp/zero_data.yaml"

# weights: model_name_or_path's config.json, and grads --weights / --tokens
mkdir "$tmp/hf"
mkfifo "$tmp/hf/config.json"
printf 'model:\n  model_name_or_path: %s\n' "$tmp/hf" > "$tmp/hf.yaml"
sed -n '/^data:/,$p' "$good" >> "$tmp/hf.yaml"
expect "model.model_name_or_path: cannot read $tmp/hf/config.json: is a FIFO, not a regular file" train "$tmp/hf.yaml"
expect "$tmp/fifo: is a FIFO, not a regular file (allowed: a safetensors file)" \
    grads "$good" --weights "$tmp/fifo" --tokens "$tmp/data/train_000000.bin" --out "$tmp/g.safetensors"
"$bin" init "$good" --out "$tmp/w.safetensors" >/dev/null || fail "init failed"
expect "/dev/zero: is a character device, not a regular file (allowed: an llm.c token shard)" \
    grads "$good" --weights "$tmp/w.safetensors" --tokens /dev/zero --out "$tmp/g.safetensors"
# a sharded checkpoint directory whose index is a FIFO
mkdir "$tmp/sharded"
mkfifo "$tmp/sharded/model.safetensors.index.json"
expect "model.safetensors.index.json: is a FIFO, not a regular file (allowed: a Hugging Face model.safetensors.index.json)" \
    grads "$good" --weights "$tmp/sharded" --tokens "$tmp/data/train_000000.bin" --out "$tmp/g.safetensors"
[ ! -e "$tmp/g.safetensors" ] || fail "grads wrote its output after an error"

# training.load: a latest-step file that is a FIFO
mkdir "$tmp/ckpt"
mkfifo "$tmp/ckpt/latest_checkpointed_iteration.txt"
sed "s|  train_iters: 2|  train_iters: 2\n  load: $tmp/ckpt|" "$good" > "$tmp/load.yaml"
expect "training.load: $tmp/ckpt/latest_checkpointed_iteration.txt: is a FIFO, not a regular file" train "$tmp/load.yaml"

# prepare's inputs
expect "$tmp/fifo: is a FIFO, not a regular file (allowed: a text file" prepare --out "$tmp/p" "$tmp/fifo"
expect "/dev/zero: is a character device, not a regular file (allowed: a text file" prepare --out "$tmp/p" /dev/zero
[ ! -e "$tmp/p" ] || fail "prepare wrote output after an error"

# NaN and Inf in loaded weights: the file, the tensor and the element are named.
# poke FILE TENSOR INDEX VALUE: set one fp32 element of a safetensors file
poke() {
    "$py" - "$@" <<'PY'
import json, struct, sys
path, name, index, value = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
raw = bytearray(open(path, "rb").read())
(n,) = struct.unpack("<Q", raw[:8])
t = json.loads(raw[8:8 + n])[name]
assert t["dtype"] == "F32"
struct.pack_into("<f", raw, 8 + n + t["data_offsets"][0] + 4 * index, value)
open(path, "wb").write(raw)
PY
}
cp "$tmp/w.safetensors" "$tmp/nan.safetensors"
poke "$tmp/nan.safetensors" model.layers.1.mlp.down_proj.weight $((5 * 192 + 7)) nan   # (64, 192): [5, 7]
expect "$tmp/nan.safetensors: tensor 'model.layers.1.mlp.down_proj.weight' holds NaN at [5, 7] (allowed: finite values" \
    grads "$good" --weights "$tmp/nan.safetensors" --tokens "$tmp/data/train_000000.bin" --out "$tmp/g.safetensors"
cp "$tmp/w.safetensors" "$tmp/inf.safetensors"
poke "$tmp/inf.safetensors" model.norm.weight 63 -inf
expect "$tmp/inf.safetensors: tensor 'model.norm.weight' holds -Inf at [63]" \
    grads "$good" --weights "$tmp/inf.safetensors" --tokens "$tmp/data/train_000000.bin" --out "$tmp/g.safetensors"
[ ! -e "$tmp/g.safetensors" ] || fail "grads wrote its output from NaN weights"
# train from a Hugging Face directory with a NaN: stops at start, before the save directory
mkdir "$tmp/hfnan"
cp "$tmp/nan.safetensors" "$tmp/hfnan/model.safetensors"
cat > "$tmp/hfnan/config.json" <<'JSON'
{"model_type": "llama", "vocab_size": 257, "hidden_size": 64, "intermediate_size": 192, "num_hidden_layers": 2,
 "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256, "tie_word_embeddings": false}
JSON
printf 'model:\n  model_name_or_path: %s\n' "$tmp/hfnan" > "$tmp/hfnan.yaml"
sed -n '/^data:/,$p' "$good" | sed "s|  train_iters: 2|  train_iters: 2\n  save: $tmp/nan_ckpt|" >> "$tmp/hfnan.yaml"
expect "$tmp/hfnan/model.safetensors: tensor 'model.layers.1.mlp.down_proj.weight' holds NaN at [5, 7]" train "$tmp/hfnan.yaml"
[ ! -e "$tmp/nan_ckpt" ] || fail "train created its save directory before refusing NaN weights"
# a checkpoint whose optimizer moment holds a NaN
sed "s|  train_iters: 2|  train_iters: 1\n  save: $tmp/ck1|" "$good" > "$tmp/save1.yaml"
"$bin" train "$tmp/save1.yaml" >/dev/null 2>&1 || fail "a 1-step run with save failed"
poke "$tmp/ck1/iter_0000001/optimizer.safetensors" exp_avg_sq.model.embed_tokens.weight 1 nan
rm "$tmp/ck1/iter_0000001/checksums.json"   # else its checksum refuses it first (tests/resume.sh)
sed "s|  train_iters: 2|  train_iters: 2\n  load: $tmp/ck1|" "$good" > "$tmp/load1.yaml"
expect "$tmp/ck1/iter_0000001/optimizer.safetensors: tensor 'exp_avg_sq.model.embed_tokens.weight' holds NaN at [0, 1]" \
    train "$tmp/load1.yaml"
exit 0
