#!/bin/bash
# What a resumed run is held to (docs/distributed.md#what-resuming-checks), on one process:
#  - checksums.json holds each tensor's CRC-32, checked here against Python's zlib.crc32 of
#    the tensor's bytes in the file;
#  - a model key of the checkpoint's config.json that differs (heads, rope_theta,
#    rms_norm_eps) is refused with one line naming each;
#  - a trainer_state.json whose step contradicts its directory, a data file of another size,
#    another seed with data.shuffle (or shuffle turned on) are refused; another seed without
#    shuffle, another lr, micro-batch, plan or recipe is a note;
#  - train_iters at or below the checkpoint's step: one line, exit 0;
#  - a flipped bit in a tensor's data (a finite value) is refused by train and by export,
#    naming the file and the tensor; a negative exp_avg_sq is refused; a checkpoint without
#    checksums.json loads with a note.
. "$(dirname "$0")/common.bash"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive

write_tokens "$tmp/tokens.bin" 20000 7919
plan="  quantization_plan:
    recipe_name: RECIPE
    apply_modules: ['model.layers.{*}']"
tiny_llama_config "$tmp/a.yaml" 3 "  save: $tmp/ck
${plan/RECIPE/mxfp8}"
"$bin" train "$tmp/a.yaml" > "$tmp/a.log" 2>&1 || fail "the first run failed: $(tail -2 "$tmp/a.log")"
ck=$tmp/ck/iter_0000003
cp -r "$tmp/ck" "$tmp/good"

# the checksums, held to an independent CRC-32
"$py" - "$ck" <<'PY' || fail "checksums.json does not hold each tensor's CRC-32"
import json, struct, sys, zlib
d = sys.argv[1]
sums = json.load(open(d + "/checksums.json"))
assert sums["algorithm"] == "crc32", sums["algorithm"]
assert sorted(sums["files"]) == ["model.safetensors", "optimizer.safetensors"], sorted(sums["files"])
for name, recorded in sums["files"].items():
    b = open(d + "/" + name, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    header = json.loads(b[8:8 + n])
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    assert sorted(tensors) == sorted(recorded), (name, sorted(set(tensors) ^ set(recorded)))
    for t, v in tensors.items():
        lo, hi = v["data_offsets"]
        want = format(zlib.crc32(b[8 + n + lo:8 + n + hi]), "08x")
        assert recorded[t] == want, (name, t, recorded[t], want)
PY

# one error line, and nothing trained: run CONFIG ARGS...; expects failure
refused() {
    local what=$1; shift
    rm -f "$tmp/r.yaml.jsonl"
    out=$("$bin" train "$@" 2>&1) && fail "$what was not refused: $out"
    err=$(grep -v "^mxtrain train: $tmp.*parameters\|^precision:\|^quantization:" <<<"$out")
    [ "$(grep -c . <<<"$err")" -eq 1 ] || fail "$what: not one error line: $out"
    grep -q '"step": 4' "$tmp/r.yaml.jsonl" 2>/dev/null && fail "$what: a step ran: $out"
    echo "$err"
}
tiny_llama_config "$tmp/r.yaml" 5 "  load: $tmp/ck
${plan/RECIPE/mxfp8}"

# the model: every key that differs on the one line
err=$(refused "another architecture" "$tmp/r.yaml" --model.num_attention_heads 4 --model.head_dim 16 \
      --model.rope_theta 500000 --model.rms_norm_eps 1e-5)
for d in "model.num_attention_heads 4 (checkpoint: 2)" "model.rope_theta 500000 (checkpoint: 10000)" \
         "model.rms_norm_eps 1e-05 (checkpoint: 1e-06)" "model.num_key_value_heads 4 (checkpoint: 2)"; do
    grep -qF "$d" <<<"$err" || fail "the refusal does not name '$d': $err"
done
grep -q "^mxtrain train: training.load: the model is not the checkpoint's ($ck/config.json): " <<<"$err" ||
    fail "the refusal does not name the checkpoint's config.json: $err"

# the state's step against its directory
cp -r "$ck" "$tmp/ck/iter_0000002"
err=$(refused "a step that contradicts its directory" "$tmp/r.yaml" --training.load "$tmp/ck/iter_0000002")
grep -qF "training.load: $tmp/ck/iter_0000002/trainer_state.json: step 3 contradicts its directory iter_0000002 (allowed: 2;" <<<"$err" ||
    fail "the refusal does not name the step and the directory: $err"
rm -r "$tmp/ck/iter_0000002"
sed -i 's/"step": 3/"step": 4611686018427387904/' "$ck/trainer_state.json"
err=$(refused "step 2^62" "$tmp/r.yaml")
grep -qF "step 4611686018427387904 contradicts its directory iter_0000003" <<<"$err" || fail "step 2^62: $err"
rm -r "$tmp/ck" && cp -r "$tmp/good" "$tmp/ck"

# the data and the order of its rows
err=$(refused "shuffle turned on" "$tmp/r.yaml" --data.shuffle true)
grep -qF "data.shuffle true (checkpoint: false): the rows would come in another order" <<<"$err" || fail "shuffle: $err"
tiny_llama_config "$tmp/s.yaml" 3 "  save: $tmp/cks
  seed: 5" && sed -i 's/^  seq_length: 16/  seq_length: 16\n  shuffle: true/' "$tmp/s.yaml"
"$bin" train "$tmp/s.yaml" > "$tmp/s.log" 2>&1 || fail "the shuffled run failed: $(tail -2 "$tmp/s.log")"
sed -i "s/train_iters: 3/train_iters: 5/; s|  save: $tmp/cks|  load: $tmp/cks|" "$tmp/s.yaml"
err=$(refused "another seed with shuffle" "$tmp/s.yaml" --training.seed 6)
grep -qF "training.seed 6 (checkpoint: 5) with data.shuffle: the rows would come in another order" <<<"$err" ||
    fail "the seed: $err"
"$bin" train "$tmp/s.yaml" > "$tmp/s2.log" 2>&1 || fail "resuming the shuffled run failed: $(tail -2 "$tmp/s2.log")"
cp "$tmp/tokens.bin" "$tmp/tokens.keep"
write_tokens "$tmp/tokens.bin" 15000 7919
err=$(refused "a data file of another size" "$tmp/r.yaml")
grep -qF "the data is not the checkpoint's ($ck/trainer_state.json): '$tmp/tokens.bin' is 31024 bytes (checkpoint: 41024)" <<<"$err" ||
    fail "the data file: $err"
mv "$tmp/tokens.keep" "$tmp/tokens.bin"

# what may change: a note each, before step 1 of the resumed run
"$bin" train "$tmp/r.yaml" --training.lr 3e-4 --training.micro_batch_size 4 --training.seed 9 \
    --data.reset_attention_mask true --data.eod_token_id 0 > "$tmp/n.log" 2>&1 ||
    fail "resuming with another lr failed: $(tail -2 "$tmp/n.log")"
for n in "note: resuming with training.lr 0.0003 (checkpoint: 0.001)" \
         "note: resuming with data.reset_attention_mask true (checkpoint: false)" \
         "note: resuming with data.eod_token_id 0 (checkpoint: -1)" \
         "note: resuming with training.micro_batch_size 4 (checkpoint: 2)" \
         "note: resuming with training.seed 9 (checkpoint: 1234): no effect"; do
    grep -qF "$n" "$tmp/n.log" || fail "no '$n': $(cat "$tmp/n.log")"
done
[ "$(grep -n "^note: resuming" "$tmp/n.log" | tail -1 | cut -d: -f1)" -lt "$(grep -n "^step" "$tmp/n.log" | head -1 | cut -d: -f1)" ] ||
    fail "the notes come after step 1: $(cat "$tmp/n.log")"
rm -r "$tmp/ck" && cp -r "$tmp/good" "$tmp/ck"
tiny_llama_config "$tmp/off.yaml" 5 "  load: $tmp/ck"
"$bin" train "$tmp/off.yaml" > "$tmp/off.log" 2>&1 || fail "resuming without the plan failed: $(tail -2 "$tmp/off.log")"
grep -qF "note: resuming with training.quantization_plan off (checkpoint: dynamic_mx-1-1-32_E4M3_E4M3_E4M3)" "$tmp/off.log" ||
    fail "no note for the plan turned off: $(cat "$tmp/off.log")"
rm -r "$tmp/ck" && cp -r "$tmp/good" "$tmp/ck"
tiny_llama_config "$tmp/tiles.yaml" 5 "  load: $tmp/ck
${plan/RECIPE/mxfp8-32x32}"
"$bin" train "$tmp/tiles.yaml" > "$tmp/tiles.log" 2>&1 || fail "resuming with another recipe failed: $(tail -2 "$tmp/tiles.log")"
grep -qF "note: resuming with training.quantization_plan dynamic_mx-1-32-32_E4M3_E4M3_E4M3 (checkpoint: dynamic_mx-1-1-32_E4M3_E4M3_E4M3)" "$tmp/tiles.log" ||
    fail "no note for another recipe: $(cat "$tmp/tiles.log")"
rm -r "$tmp/ck" && cp -r "$tmp/good" "$tmp/ck"

# nothing to do
out=$("$bin" train "$tmp/r.yaml" --training.train_iters 3 2>&1) || fail "train_iters at the saved step failed: $out"
grep -qx "nothing to do: the checkpoint is at step 3 and training.train_iters is 3 (raise it to train further)" <<<"$out" ||
    fail "no line saying there is nothing to do: $out"

# a flipped bit: a finite value, refused by train and export
flip() {   # flip FILE TENSOR ELEMENT VALUE: write VALUE (a float) over one element of the tensor's data
    "$py" - "$@" <<'PY'
import json, struct, sys
path, tensor, i, value = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
b = bytearray(open(path, "rb").read())
n = struct.unpack("<Q", b[:8])[0]
at = 8 + n + json.loads(b[8:8 + n])[tensor]["data_offsets"][0] + 4 * i
b[at:at + 4] = struct.pack("<f", value)
open(path, "wb").write(b)
PY
}
flip "$ck/model.safetensors" model.layers.1.self_attn.q_proj.weight 5 -6.5e36
err=$(refused "a flipped bit" "$tmp/r.yaml")
grep -q "^mxtrain train: $ck/model.safetensors: tensor 'model.layers.1.self_attn.q_proj.weight' does not match its checksum (crc32 [0-9a-f]*, checksums.json records [0-9a-f]*): the file is damaged$" <<<"$err" ||
    fail "the refusal does not name the file and the tensor: $err"
out=$("$bin" export "$tmp/ck" --out "$tmp/exp" 2>&1) && fail "export took a flipped bit: $out"
grep -qx "mxtrain export: $ck/model.safetensors: tensor 'model.layers.1.self_attn.q_proj.weight' does not match its checksum (crc32 [0-9a-f]*, checksums.json records [0-9a-f]*): the file is damaged" <<<"$out" ||
    fail "export's refusal does not name the file and the tensor: $out"
[ -e "$tmp/exp" ] && fail "export left output: $(ls -A "$tmp")"
rm -r "$tmp/ck" && cp -r "$tmp/good" "$tmp/ck"

# a negative second moment (its checksum made to match: only the value is wrong)
flip "$ck/optimizer.safetensors" exp_avg_sq.model.layers.0.mlp.up_proj.weight 50 -0.5   # (48, 32): [1, 18]
rm "$ck/checksums.json"
err=$(refused "a negative exp_avg_sq" "$tmp/r.yaml")
grep -qx "mxtrain train: $ck/optimizer.safetensors: tensor 'exp_avg_sq.model.layers.0.mlp.up_proj.weight' holds -0.5 at \[1, 18\] (allowed: values >= 0: a second moment is a mean of squares; the file is damaged)" <<<"$err" ||
    fail "the refusal does not name the tensor and the value: $err"
rm -r "$tmp/ck" && cp -r "$tmp/good" "$tmp/ck"

# an older checkpoint: no checksums.json, no record of the run
rm "$ck/checksums.json"
"$py" - "$ck/trainer_state.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1])); del s["run"]; json.dump(s, open(sys.argv[1], "w"))
PY
"$bin" train "$tmp/r.yaml" > "$tmp/old.log" 2>&1 || fail "an older checkpoint did not load: $(tail -2 "$tmp/old.log")"
grep -qx "note: training.load: $ck has no checksums.json (an older mxtrain's checkpoint): its tensors are not verified" "$tmp/old.log" ||
    fail "no note for the missing checksums: $(cat "$tmp/old.log")"
grep -qF "note: $ck/trainer_state.json records no data files or settings (an older mxtrain's checkpoint): they are not compared" "$tmp/old.log" ||
    fail "no note for the missing record: $(cat "$tmp/old.log")"
grep -q "^step     5/5" "$tmp/old.log" || fail "the older checkpoint did not train on: $(cat "$tmp/old.log")"
out=$("$bin" export "$tmp/ck" --out "$tmp/exp" 2>&1) || fail "exporting an older checkpoint failed: $out"
grep -qx "note: $ck has no checksums.json: its weights are not verified" <<<"$out" || fail "export's note: $out"
exit 0
