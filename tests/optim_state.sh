#!/bin/bash
# AdamW's moments in lower precision (training.exp_avg_dtype, exp_avg_sq_dtype), on one
# process:
#  - the optimizer memory `plan` predicts and `train` reports is the stored size: 8 bytes a
#    parameter in fp32, 4 in bf16, 2 x 33/32 in MXFP8 (of the shard, padding included), and
#    2 x 1 in FP8 plus a 4-byte scale per tensor and moment;
#  - a checkpoint holds the moments as fp32 safetensors whatever they are stored as: with
#    MXFP8, each block of 32 values of exp_avg is E4M3 values times one power of two, and
#    each block of exp_avg_sq the squares of such; with FP8, each tensor's values (one
#    rank: its span is the tensor) are E4M3 values times the one scale_inv
#    optimizer_scales.safetensors holds for it, the largest 448 of it (read here with
#    Python, not mxtrain);
#  - a run with FP8 moments resumed from its checkpoint is the uninterrupted run, bit for
#    bit (weights, moments and scales of the last checkpoint, and every loss);
#  - a checkpoint resumes under other moment dtypes (fp32 from MXFP8, MXFP8 from fp32, FP8
#    from MXFP8 and fp32 from FP8), with a note naming each change;
#  - training.main_grads_dtype bf16: the gradients' memory predicted and reported is 2 bytes a
#    parameter of the shard, the run trains, and a checkpoint resumes across the change with
#    a note;
#  - a value outside fp32, bf16, mxfp8, fp8 is one line naming the key, the value and the
#    choices.
. "$(dirname "$0")/common.bash"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive

write_tokens "$tmp/tokens.bin" 20000 7919
moments() { printf '  exp_avg_dtype: %s\n  exp_avg_sq_dtype: %s\n' "$1" "$2"; }

# the optimizer's memory by dtype: predicted and reported, against the master weights' 4 bytes
for d in fp32 bf16 mxfp8 fp8; do
    tiny_llama_config "$tmp/$d.yaml" 3 "$(moments $d $d)"
    "$bin" plan "$tmp/$d.yaml" --json > "$tmp/$d.json" 2>"$tmp/err" || fail "plan $d: $(cat "$tmp/err")"
    "$bin" train "$tmp/$d.yaml" > "$tmp/$d.out" 2>&1 || fail "train $d: $(tail -2 "$tmp/$d.out")"
done
tiny_llama_config "$tmp/count.yaml" 1 "  save: $tmp/count"
"$bin" train "$tmp/count.yaml" > "$tmp/count.out" 2>&1 || fail "train: $(tail -2 "$tmp/count.out")"
$py - "$tmp" <<'PY' || fail "the optimizer's memory is not the stored size of the moments"
import json, struct, sys
raw = open(f"{sys.argv[1]}/count/iter_0000001/optimizer.safetensors", "rb").read()
tensors = len([k for k in json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]]) if k != "__metadata__"]) // 2
for d, per32, per_tensor in (("fp32", 256, 0), ("bf16", 128, 0), ("mxfp8", 66, 0), ("fp8", 64, 8)):
    plan = json.load(open(f"{sys.argv[1]}/{d}.json"))["per_step"]
    run = [json.loads(l) for l in open(f"{sys.argv[1]}/{d}.yaml.jsonl") if '"loss"' in l][-1]
    shard = plan["mem_master_bytes"] // 4
    want = shard // 32 * per32 + tensors * per_tensor
    assert plan["mem_optimizer_bytes"] == run["mem_optimizer_bytes"] == want, (d, want, plan, run)
PY

# a checkpoint of MXFP8 moments: fp32 values on the MX grid, blocks of the flat tensor (one
# rank: a tensor's span of the shard is the tensor, padded at its end)
tiny_llama_config "$tmp/mx.yaml" 4 "$(moments mxfp8 mxfp8)
  save: $tmp/ck"
"$bin" train "$tmp/mx.yaml" > "$tmp/out" 2>&1 || fail "train with MXFP8 moments: $(tail -2 "$tmp/out")"
$py - "$tmp/ck/iter_0000004/optimizer.safetensors" <<'PY' || fail "the saved MXFP8 moments are not on the MX grid"
import json, math, struct, sys
import numpy as np
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
head = json.loads(raw[8:8 + n])
grid = sorted({(1 + m / 8) * 2.0 ** (e - 7) if e else m / 8 * 2.0 ** -6 for e in range(16) for m in range(8)} - {480.0})
checked = 0
for name, t in head.items():
    if name == "__metadata__": continue
    a, b = t["data_offsets"]
    x = np.frombuffer(raw[8 + n + a:8 + n + b], dtype="<f4").astype(np.float64)
    sq = name.startswith("exp_avg_sq.")
    if sq:
        assert (x >= 0).all(), name
        x = np.sqrt(x)
    for k in range(0, len(x), 32):
        blk = np.abs(x[k:k + 32])
        amax = blk.max()
        if amax == 0: continue
        e = math.floor(math.log2(amax)) - 8
        for v in blk:
            assert v / 2.0 ** e in grid or v == 0, (name, k, v, e)
        checked += 1
assert checked > 50, checked
PY

# a checkpoint of FP8 moments: each tensor's fp32 values are E4M3 values times its scale_inv
tiny_llama_config "$tmp/f8.yaml" 6 "$(moments fp8 fp8)
  save: $tmp/f8
  save_interval: 2"
"$bin" train "$tmp/f8.yaml" > "$tmp/out" 2>&1 || fail "train with FP8 moments: $(tail -2 "$tmp/out")"
$py - "$tmp/f8/iter_0000006" <<'PY' || fail "the saved FP8 moments are not E4M3 values of one scale a tensor"
import json, struct, sys
import numpy as np
def tensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    return {k: np.frombuffer(raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]], dtype="<f4").reshape(v["shape"])
            for k, v in head.items() if k != "__metadata__"}
grid = np.array(sorted({(1 + m / 8) * 2.0 ** (e - 7) if e else m / 8 * 2.0 ** -6 for e in range(16) for m in range(8)} - {480.0}))
opt, sc = tensors(sys.argv[1] + "/optimizer.safetensors"), tensors(sys.argv[1] + "/optimizer_scales.safetensors")
names = sorted(k[len("exp_avg."):] for k in opt if k.startswith("exp_avg."))
assert sorted(sc) == ["exp_avg.scale_inv", "exp_avg_sq.scale_inv"] and sc["exp_avg.scale_inv"].shape == (1, len(names)), sc
# the scales are in the trainer's tensor order: match each tensor to the scale whose grid it is on
for moment in ("exp_avg", "exp_avg_sq"):
    scales = sc[moment + ".scale_inv"][0].astype(np.float64)
    used = set()
    for name in names:
        x = np.abs(opt[f"{moment}.{name}"].astype(np.float64)).ravel()
        assert moment == "exp_avg" or (opt[f"{moment}.{name}"] >= 0).all(), name
        fits = [i for i, s in enumerate(scales) if i not in used and x.max() == np.float32(448 * np.float32(s))
                and np.allclose(grid[np.abs(grid[None, :] - (x / s)[:, None]).argmin(1)], x / s, rtol=1e-6, atol=0)]
        assert fits, (moment, name, x.max(), scales)
        used.add(fits[0])
PY

# resumed from step 2, the same run to step 6, bit for bit (a span of step 2's checkpoint
# quantized again from its values, rather than with its saved scale, reads back otherwise)
tiny_llama_config "$tmp/f8r.yaml" 6 "$(moments fp8 fp8)
  save: $tmp/f8r
  load: $tmp/f8r"
mkdir "$tmp/f8r" && cp -r "$tmp/f8/iter_0000002" "$tmp/f8r/"
"$bin" train "$tmp/f8r.yaml" > "$tmp/out" 2>&1 || fail "resuming FP8 moments failed: $(tail -2 "$tmp/out")"
for f in model.safetensors optimizer.safetensors optimizer_scales.safetensors; do
    cmp -s "$tmp/f8/iter_0000006/$f" "$tmp/f8r/iter_0000006/$f" || fail "the resumed run's $f differs from the uninterrupted run's"
done
compare_runs --from 3 "$tmp/f8.yaml.jsonl" "$tmp/f8r.yaml.jsonl" 0 || fail "the resumed run's losses differ"

# resume under other dtypes, both ways, each change a note
tiny_llama_config "$tmp/back.yaml" 6 "$(moments fp32 fp32)
  save: $tmp/ck
  load: $tmp/ck"
out=$("$bin" train "$tmp/back.yaml" 2>&1) || fail "resuming MXFP8 moments in fp32 failed: $(tail -2 <<<"$out")"
for k in exp_avg_dtype exp_avg_sq_dtype; do
    grep -qx "note: resuming with training.$k fp32 (checkpoint: mxfp8)" <<<"$out" || fail "no note for $k: $out"
done
tiny_llama_config "$tmp/again.yaml" 8 "$(moments mxfp8 bf16)
  save: $tmp/ck
  load: $tmp/ck"
out=$("$bin" train "$tmp/again.yaml" 2>&1) || fail "resuming fp32 moments in MXFP8 failed: $(tail -2 <<<"$out")"
grep -qx "note: resuming with training.exp_avg_dtype mxfp8 (checkpoint: fp32)" <<<"$out" || fail "no note: $out"
grep -q "^done: 8 steps" <<<"$out" || fail "the resumed run did not reach step 8: $out"
tiny_llama_config "$tmp/f8in.yaml" 10 "$(moments fp8 fp8)
  save: $tmp/ck
  load: $tmp/ck"
out=$("$bin" train "$tmp/f8in.yaml" 2>&1) || fail "resuming MXFP8 moments in FP8 failed: $(tail -2 <<<"$out")"
grep -qx "note: resuming with training.exp_avg_dtype fp8 (checkpoint: mxfp8)" <<<"$out" || fail "no note: $out"
grep -qx "note: resuming with training.exp_avg_sq_dtype fp8 (checkpoint: bf16)" <<<"$out" || fail "no note: $out"
tiny_llama_config "$tmp/f8out.yaml" 12 "$(moments fp32 fp32)
  save: $tmp/ck
  load: $tmp/ck"
out=$("$bin" train "$tmp/f8out.yaml" 2>&1) || fail "resuming FP8 moments in fp32 failed: $(tail -2 <<<"$out")"
grep -qx "note: resuming with training.exp_avg_dtype fp32 (checkpoint: fp8)" <<<"$out" || fail "no note: $out"
grep -q "^done: 12 steps" <<<"$out" || fail "the resumed run did not reach step 12: $out"

# gradients in bf16: 2 bytes a parameter, predicted and reported; the loss falls as in fp32
tiny_llama_config "$tmp/g16.yaml" 4 "  main_grads_dtype: bf16
  save: $tmp/ckg"
"$bin" plan "$tmp/g16.yaml" --json > "$tmp/g16.json" 2>"$tmp/err" || fail "plan with bf16 gradients: $(cat "$tmp/err")"
"$bin" train "$tmp/g16.yaml" > "$tmp/g16.out" 2>&1 || fail "train with bf16 gradients: $(tail -2 "$tmp/g16.out")"
$py - "$tmp" <<'PY' || fail "the gradients' memory in bf16 is not 2 bytes a parameter, or the loss did not fall"
import json, sys
plan = json.load(open(f"{sys.argv[1]}/g16.json"))["per_step"]
runs = {d: [json.loads(l) for l in open(f"{sys.argv[1]}/{d}.yaml.jsonl") if '"loss"' in l] for d in ("g16", "fp32")}
run = runs["g16"][-1]
assert plan["mem_grad_bytes"] == run["mem_grad_bytes"] == plan["mem_master_bytes"] // 2, (plan, run)
# the same first step as fp32 gradients (one micro-batch: the same sums, rounded), then close
assert runs["g16"][0]["loss"] == runs["fp32"][0]["loss"], (runs["g16"][0], runs["fp32"][0])
assert abs(runs["g16"][2]["loss"] - runs["fp32"][2]["loss"]) < 0.05, (runs["g16"][2], runs["fp32"][2])
PY
tiny_llama_config "$tmp/g32.yaml" 6 "  save: $tmp/ckg
  load: $tmp/ckg"
out=$("$bin" train "$tmp/g32.yaml" 2>&1) || fail "resuming bf16 gradients in fp32 failed: $(tail -2 <<<"$out")"
grep -qx "note: resuming with training.main_grads_dtype fp32 (checkpoint: bf16)" <<<"$out" || fail "no note for main_grads_dtype: $out"

# a dtype mxtrain does not store moments in
tiny_llama_config "$tmp/bad.yaml" 2 "$(moments fp16 fp32)"
out=$("$bin" train "$tmp/bad.yaml" 2>&1) && fail "exp_avg_dtype: fp16 was accepted"
grep -q "training.exp_avg_dtype.*fp16.*fp32.*bf16.*mxfp8.*fp8" <<<"$out" || fail "the refusal does not name the key, value and choices: $out"
[ "$(wc -l <<<"$out")" -eq 1 ] || fail "not one line: $out"
tiny_llama_config "$tmp/badg.yaml" 2 "  main_grads_dtype: mxfp8"
out=$("$bin" train "$tmp/badg.yaml" 2>&1) && fail "main_grads_dtype: mxfp8 was accepted"
grep -q "training.main_grads_dtype.*mxfp8.*bf16.*fp32" <<<"$out" || fail "the refusal does not name the key, value and choices: $out"
