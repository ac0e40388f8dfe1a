#!/bin/bash
# Checkpoint checksums on several ranks (tests/resume.sh has the rest of resuming):
#  - a tensor's checksum is of its whole bytes whatever the save: the ranks writing their
#    own rows (training.save_parallel) and rank 0 writing gathered tensors give the same
#    checksums.json, each checksum Python's zlib.crc32 of the tensor's bytes; on an uneven
#    MoE model (rows that the ranks do not divide evenly, experts in Hugging Face slices);
#  - two ranks share the verification on load: a flipped bit in a tensor only one of them
#    hashes is refused with a line naming the file and the tensor;
#  - FP8 moments (one scale per tensor's span of each rank's shard): a run resumed from
#    step 2 of a gathered save, saving its own rows, ends as the uninterrupted run, bit
#    for bit (its spans quantized again from their values, not with the saved scales, would
#    read back otherwise).
# tests/run: launches MPI ranks
. "$(dirname "$0")/common.bash"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"   # Open MPI's (see fsdp.sh)

write_tokens "$tmp/tokens.bin" 20000 7919
config() {   # config FILE SAVE STEPS EXTRA_TRAINING: the uneven MoE model, STEPS steps, saved to SAVE
    { uneven_model qwen3_moe 2
      printf 'data:\n  data_path: %s\n  seq_length: 16\n' "$tmp/tokens.bin"
      printf 'training:\n  micro_batch_size: 2\n  lr: 1.0e-3\n  train_iters: %d\n  save: %s\n%s\n' "$3" "$2" "${4:-}"
      printf 'parallel:\n  fsdp_plan:\n    param_dtype: fp32\n    reduce_dtype: fp64\n'; } > "$1"
}
config "$tmp/par.yaml" "$tmp/par" 2
config "$tmp/gat.yaml" "$tmp/gat" 2 "  save_parallel: false"
train_on 2 "$tmp/par.yaml"
train_on 2 "$tmp/gat.yaml"
cmp "$tmp/par/iter_0000002/model.safetensors" "$tmp/gat/iter_0000002/model.safetensors" ||
    fail "the two saves wrote other weights"
cmp "$tmp/par/iter_0000002/checksums.json" "$tmp/gat/iter_0000002/checksums.json" ||
    fail "the ranks' pieces and the gathered tensors give other checksums"
"$py" - "$tmp/par/iter_0000002" <<'PY' || fail "checksums.json does not hold each tensor's CRC-32"
import json, struct, sys, zlib
d = sys.argv[1]
sums = json.load(open(d + "/checksums.json"))["files"]
for name, recorded in sums.items():
    b = open(d + "/" + name, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    header = {k: v for k, v in json.loads(b[8:8 + n]).items() if k != "__metadata__"}
    assert sorted(header) == sorted(recorded), name
    for t, v in header.items():
        lo, hi = v["data_offsets"]
        assert recorded[t] == format(zlib.crc32(b[8 + n + lo:8 + n + hi]), "08x"), (name, t)
PY

# a flipped bit, in the last tensor of optimizer.safetensors and in the first of
# model.safetensors: with two ranks taking turns, one of them hashes each
ck=$tmp/par/iter_0000002
cp -r "$tmp/par" "$tmp/keep"
config "$tmp/load.yaml" "$tmp/out" 3 "  load: $tmp/par"
train_on 2 "$tmp/load.yaml"
for tensor in model.safetensors:model.embed_tokens.weight optimizer.safetensors:LAST; do
    rm -r "$tmp/par" && cp -r "$tmp/keep" "$tmp/par"
    file=${tensor%%:*} name=${tensor#*:}
    name=$("$py" - "$ck/$file" "$name" <<'PY'
import json, struct, sys
path, name = sys.argv[1], sys.argv[2]
b = bytearray(open(path, "rb").read())
n = struct.unpack("<Q", b[:8])[0]
header = {k: v for k, v in json.loads(b[8:8 + n]).items() if k != "__metadata__"}
if name == "LAST": name = max(header, key=lambda k: header[k]["data_offsets"][0])
b[8 + n + header[name]["data_offsets"][0] + 2] ^= 0x10   # a mantissa bit: still finite
open(path, "wb").write(b)
print(name)
PY
)
    out=$(mpi_run -np 2 "$bin" train "$tmp/load.yaml" 2>&1) && fail "a flipped bit in $file was not refused: $out"
    grep -q "rank [01]: $ck/$file: tensor '$name' does not match its checksum" <<<"$out" ||
        fail "the refusal does not name $file and '$name': $out"
done
# FP8 moments, resumed on two ranks
f8=$(printf '  exp_avg_dtype: fp8\n  exp_avg_sq_dtype: fp8')
config "$tmp/f8.yaml" "$tmp/f8" 4 "$f8
  save_interval: 2
  save_parallel: false"
train_on 2 "$tmp/f8.yaml"
mkdir "$tmp/f8r" && cp -r "$tmp/f8/iter_0000002" "$tmp/f8r/"
config "$tmp/f8r.yaml" "$tmp/f8r" 4 "$f8
  load: $tmp/f8r"
train_on 2 "$tmp/f8r.yaml"
for f in model.safetensors optimizer.safetensors optimizer_scales.safetensors; do
    cmp -s "$tmp/f8/iter_0000004/$f" "$tmp/f8r/iter_0000004/$f" || fail "the resumed run's $f differs from the uninterrupted run's"
done
exit 0
