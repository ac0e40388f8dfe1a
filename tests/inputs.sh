#!/bin/bash
# Files a user names that are not what they should be: a FIFO (which used to block open()
# forever), a device (/dev/zero used to be read until memory ran out), a directory, a file
# over the size limit; each is refused at once with one line naming the path, what it is
# and what is allowed, exit status 1, and no output file.
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
exit 0
