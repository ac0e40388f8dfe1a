#!/bin/bash
# The per-tensor recipes in training (docs/quantization-plan.md): a tiny Qwen3-MoE (ragged
# expert groups) trained with tensorwise and hif8, both converters of the family (no
# quant_converters), at bf16 on 2 ranks: the loss decreases; the converted weights are
# gathered as codes (1 byte an element, no scales on the wire) and the gathered bytes the
# plan predicts are the ones the run counts. With fp32 parameters on 3 ranks (80 and 100
# rows cut unevenly), training with the low-precision all-gather is bit-identical to
# gathering fp32 weights and quantizing them whole (each rank's shard is quantized with the
# scale of the whole weight), HiF8 with power-of-two scales and HiF8/FP8 mixes too. `mxtrain
# plan` prints each recipe's operand table. The delayed recipes resume bit for bit and
# recompute changes no bit of them. blockwise trains on 2 ranks, gathering its weights' codes
# (bit-identical at fp32 on 3 ranks to gathering fp32), and `plan` prints its operand table.
# tests/run: launches MPI ranks
. "$(dirname "$0")/common.bash"
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"   # Open MPI's (see fsdp.sh)

write_tokens "$tmp/tokens.bin" 6000 7 1
for recipe in tensorwise hif8; do
    cfg="$tmp/$recipe.yaml"
    recipe_config "$cfg" $recipe bf16 30
    OMP_NUM_THREADS=1 train_on 2 "$cfg"
    "$bin" plan "$cfg" --json --ranks 2 > "$cfg.plan" || fail "$recipe: plan failed"
    "$bin" plan "$cfg" > "$cfg.txt" || fail "$recipe: plan failed"
    "$py" - "$cfg.jsonl" "$cfg.plan" "$recipe" <<'PY' || fail "$recipe: training or its prediction is off"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss": ' in l]
plan = json.load(open(sys.argv[2]))
recipe = sys.argv[3]
head = sum(r["loss"] for r in rows[:5]) / 5
tail = sum(r["loss"] for r in rows[-5:]) / 5
assert len(rows) == 30 and tail < 0.9 * head, (recipe, head, tail)
kinds = {m["converter"] for m in plan["modules"] if m["converted"]}
fam = "float8" if recipe == "tensorwise" else "hif8"
assert kinds == {f"quantize.linear.{fam}", f"quantize.moe.{fam}"}, kinds
p = plan["per_step"]
assert p["gather_mode"] == "on-demand" and p["ag_mx_data_bytes"] > 0 and p["ag_mx_scale_bytes"] == 0, p
# the codes stand for half the bytes of a bf16 gather of the same weights
assert p["ag_bf16_equiv_bytes"] == 2 * p["ag_mx_data_bytes"], p
for r in rows:
    for k in ("ag_param_bytes", "ag_mx_data_bytes", "ag_mx_scale_bytes"):
        assert r[k] == p[k], (k, r, p)
print(f"    {recipe}: loss {head:.4f} -> {tail:.4f} over 30 steps; gathered {p['ag_mx_data_bytes']} bytes of codes "
      f"and {p['ag_param_bytes']} of bf16 per step, as planned")
PY
done

# fp32 parameters, 3 ranks: the low-precision all-gather changes no bit of the training (delayed:
# each rank quantizes its rows with the known scale; without it each layer casts the gathered
# weight with that scale)
for recipe in tensorwise hif8 delayed; do
    recipe_config "$tmp/lp_$recipe.yaml" $recipe fp32 6
    recipe_config "$tmp/hp_$recipe.yaml" $recipe fp32 6 "    enable_fsdp_low_precision_all_gather: false"
    OMP_NUM_THREADS=1 train_on 3 "$tmp/lp_$recipe.yaml"
    OMP_NUM_THREADS=1 train_on 3 "$tmp/hp_$recipe.yaml"
    grep -q '"ag_mx_data_bytes": 0,' "$tmp/lp_$recipe.yaml.jsonl" && fail "$recipe: the low-precision run gathered no codes"
    compare_runs --keys "loss grad_norm" "$tmp/hp_$recipe.yaml.jsonl" "$tmp/lp_$recipe.yaml.jsonl" 0 ||
        fail "$recipe: training with the low-precision all-gather differs from gathering fp32 weights"
    echo "    $recipe: 6 steps on 3 ranks bit-identical with and without the low-precision all-gather"
done

# HiF8 with power-of-two scales, and per-role mixes of HiF8 and FP8: the same, 6 steps on 3 ranks
for pair in hif8:pow2 dynamic_per_tensor_HIF8_HIF8_E5M2:fp32 dynamic_per_tensor_E4M3_E4M3_HIF8:pow2; do
    recipe=${pair%%:*} mode=${pair#*:}
    recipe_config "$tmp/lp_$recipe$mode.yaml" $recipe fp32 6 "    scale_mode: $mode"
    recipe_config "$tmp/hp_$recipe$mode.yaml" $recipe fp32 6 "    scale_mode: $mode
    enable_fsdp_low_precision_all_gather: false"
    OMP_NUM_THREADS=1 train_on 3 "$tmp/lp_$recipe$mode.yaml" > /dev/null
    OMP_NUM_THREADS=1 train_on 3 "$tmp/hp_$recipe$mode.yaml" > /dev/null
    grep -q '"ag_mx_data_bytes": 0,' "$tmp/lp_$recipe$mode.yaml.jsonl" && fail "$recipe $mode: the low-precision run gathered no codes"
    compare_runs --keys "loss grad_norm" "$tmp/hp_$recipe$mode.yaml.jsonl" "$tmp/lp_$recipe$mode.yaml.jsonl" 0 ||
        fail "$recipe $mode: training with the low-precision all-gather differs from gathering fp32 weights"
    echo "    $recipe, scale_mode $mode: 6 steps on 3 ranks bit-identical with and without the low-precision all-gather"
done

# delayed scaling (TE DelayedScaling), fp32 parameters on 2 ranks, two micro-batches a rank:
# training resumed from step 3 is the uninterrupted run to step 6, bit for bit (weights,
# moments, the amax histories and scales), and the histories hold amaxes (the scales moved
# off their initial 1)
for recipe in delayed delayed_hif8_pertensor; do
    extra="    amax_history_len: 4
  global_batch_size: 8
  save_interval: 3"
    recipe_config "$tmp/dl_$recipe.yaml" $recipe fp32 6 "$extra
  save: $tmp/dl_$recipe"
    recipe_config "$tmp/dr_$recipe.yaml" $recipe fp32 6 "$extra
  save: $tmp/dr_$recipe
  load: $tmp/dr_$recipe"
    OMP_NUM_THREADS=1 train_on 2 "$tmp/dl_$recipe.yaml"
    mkdir "$tmp/dr_$recipe" && cp -r "$tmp/dl_$recipe/iter_0000003" "$tmp/dr_$recipe/"
    OMP_NUM_THREADS=1 train_on 2 "$tmp/dr_$recipe.yaml"
    for f in model.safetensors optimizer.safetensors delayed_scaling.safetensors; do
        cmp -s "$tmp/dl_$recipe/iter_0000006/$f" "$tmp/dr_$recipe/iter_0000006/$f" ||
            fail "$recipe: the resumed run's $f differs from the uninterrupted run's"
    done
    compare_runs --from 4 --keys "loss grad_norm" "$tmp/dl_$recipe.yaml.jsonl" "$tmp/dr_$recipe.yaml.jsonl" 0 ||
        fail "$recipe: the resumed run's losses differ"
    "$bin" plan "$tmp/dl_$recipe.yaml" --json --ranks 2 > "$tmp/dl_$recipe.plan" || fail "$recipe: plan failed"
    "$py" - "$tmp/dl_$recipe/iter_0000006/delayed_scaling.safetensors" "$recipe" "$tmp/dl_$recipe.yaml.jsonl" \
        "$tmp/dl_$recipe.plan" <<'PY' || fail "$recipe: the saved state is off"
import json, struct, sys
import numpy as np
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
head = json.loads(raw[8:8 + n])
get = lambda k: np.frombuffer(raw[8 + n + head[k]["data_offsets"][0]:8 + n + head[k]["data_offsets"][1]], "<f4").reshape(head[k]["shape"])
hist = [k for k in head if k.endswith(".amax_history")]
assert "model.layers.1.mlp.experts.gate_up_proj.amax_history" in head, sorted(head)[:8]
for k in hist:
    h, s = get(k), get(k[:-len("amax_history")] + "scale")
    assert h.shape[-1] == 4 and h.shape[-2] == 3 and s.shape == h.shape[:-1], (k, h.shape, s.shape)
    assert (h[..., 0] == 0).all(), k           # rolled after the last update
    assert (h >= 0).all() and np.isfinite(h).all(), k
    # each role's scale from its last amax entries (history 4: the max of the 3 kept and the newest)
    live = h[..., 1:].max(-1) > 0
    assert live.any() and (s[live] != 1).all(), (k, s)
# the state's memory, as plan predicts it and the run reports it: per slot the history
# (4 floats), the scale, the scale in use (floats) and the all-reduce's amax (a double)
slots = sum(get(k).size // 4 for k in hist)
plan = json.load(open(sys.argv[4]))["per_step"]["mem_scaling_state_bytes"]
runs = {json.loads(l)["mem_scaling_state_bytes"] for l in open(sys.argv[3]) if '"loss": ' in l}
assert runs == {plan}, (runs, plan)
assert slots * (4 * 4 + 4 + 4 + 8) <= plan <= slots * (4 * 4 + 4 + 4 + 8) + 65536, (slots, plan)
print(f"    {sys.argv[2]}: {len(hist)} tensors' histories and scales saved; {plan} bytes of state, as planned")
PY
    grep -q "^memory per rank: .*, delayed scaling state [0-9.]* MiB; peak resident" "$tmp/dl_$recipe.yaml.log" ||
        fail "$recipe: the summary does not name the delayed scaling state"

    echo "    $recipe: resumed from step 3 of 6 on 2 ranks, bit-identical to the uninterrupted run"
    # a history of another length than the checkpoint's: one line naming the file and the key
    recipe_config "$tmp/dh_$recipe.yaml" $recipe fp32 6 "    amax_history_len: 8
  global_batch_size: 8
  load: $tmp/dl_$recipe"
    if "$bin" train "$tmp/dh_$recipe.yaml" > "$tmp/dh.log" 2>&1; then fail "$recipe: a history of 8 loaded one of 4"; fi
    grep -q "delayed_scaling.safetensors: .*(training.quantization_plan.amax_history_len is 8)" "$tmp/dh.log" ||
        fail "$recipe: loading a history of another length: $(tail -3 "$tmp/dh.log")"
    # recompute: the blocks' forward again in backward with the forward's scales, recording
    # nothing: the same run, bit for bit, the same histories and scales
    recipe_config "$tmp/rc_$recipe.yaml" $recipe fp32 6 "$extra
  save: $tmp/rc_$recipe
features:
  recompute: true"
    OMP_NUM_THREADS=1 train_on 2 "$tmp/rc_$recipe.yaml"
    for f in model.safetensors delayed_scaling.safetensors; do
        cmp -s "$tmp/dl_$recipe/iter_0000006/$f" "$tmp/rc_$recipe/iter_0000006/$f" ||
            fail "$recipe: recompute changed $f"
    done
    compare_runs --keys "loss grad_norm" "$tmp/dl_$recipe.yaml.jsonl" "$tmp/rc_$recipe.yaml.jsonl" 0 ||
        fail "$recipe: recompute changed the losses"
    echo "    $recipe: recompute bit-identical to no recompute"
    # generation casts with the learned scales: export carries them, and a directory without
    # them is refused for a delayed plan
    "$bin" export "$tmp/dl_$recipe" --out "$tmp/ex_$recipe" > /dev/null || fail "$recipe: export failed"
    cmp -s "$tmp/dl_$recipe/iter_0000006/delayed_scaling.safetensors" "$tmp/ex_$recipe/delayed_scaling.safetensors" ||
        fail "$recipe: export did not carry the delayed scaling state"
    "$bin" generate "$tmp/ex_$recipe" --plan "$tmp/dl_$recipe.yaml" --prompt 7 --max-new-tokens 4 > /dev/null 2> "$tmp/g.err" ||
        fail "$recipe: generate --plan from the export failed: $(cat "$tmp/g.err")"
    rm "$tmp/ex_$recipe/delayed_scaling.safetensors"
    if "$bin" generate "$tmp/ex_$recipe" --plan "$tmp/dl_$recipe.yaml" --prompt 7 --max-new-tokens 4 > "$tmp/g.out" 2> "$tmp/g.err"; then
        fail "$recipe: generate --plan without the learned scales did not fail"
    fi
    [ ! -s "$tmp/g.out" ] && [ "$(wc -l < "$tmp/g.err")" -eq 1 ] && grep -q "has no delayed_scaling.safetensors" "$tmp/g.err" ||
        fail "$recipe: generate without the learned scales: $(cat "$tmp/g.err")"
    echo "    $recipe: export carries the learned scales; generation without them is refused"
    "$bin" plan "$tmp/dl_$recipe.yaml" > "$tmp/dl_$recipe.txt" || fail "$recipe: plan failed"
    grep -qxF "delayed scaling: amax_history_len 4, amax_compute_algo max, margin 0 (each tensor's scale per role and expert from its amax history, updated after each micro-batch's forward and backward)" "$tmp/dl_$recipe.txt" ||
        fail "$recipe: plan shows no delayed scaling line: $(grep -A8 '^operands' "$tmp/dl_$recipe.txt")"
done
grep -qxF "  dgrad  dY  E5M2  fp32 per tensor, max / amax history  the whole tensor (one per expert group)" "$tmp/dl_delayed.txt" ||
    fail "delayed: no dgrad row: $(grep -A6 '^operands' "$tmp/dl_delayed.txt")"
grep -qxF "  fprop  X   HIF8  fp32 per tensor, amax history / 15   the whole tensor (the micro-batch's rows; one per expert group)" "$tmp/dl_delayed_hif8_pertensor.txt" ||
    fail "delayed_hif8_pertensor: no fprop row: $(grep -A6 '^operands' "$tmp/dl_delayed_hif8_pertensor.txt")"

# the operand tables: per tensor (E5M2 gradients; HiF8's targets 15 and 224) and mxfp8
grep -qxF "  dgrad  dY  E5M2  fp32 per tensor, max / amax          the whole tensor (one per expert group)" "$tmp/tensorwise.yaml.txt" ||
    fail "tensorwise: no dgrad row: $(grep -A6 '^operands' "$tmp/tensorwise.yaml.txt")"
grep -qxF "         X   E4M3  fp32 per tensor, max / amax          the whole tensor (the micro-batch's rows; one per expert group)" "$tmp/tensorwise.yaml.txt" ||
    fail "tensorwise: no wgrad X row"
grep -qxF "  fprop  X   HIF8  fp32 per tensor, amax / 15           the whole tensor (the micro-batch's rows; one per expert group)" "$tmp/hif8.yaml.txt" ||
    fail "hif8: no fprop row: $(grep -A6 '^operands' "$tmp/hif8.yaml.txt")"
grep -qxF "  wgrad  dY  HIF8  fp32 per tensor, amax / 224          the whole tensor (one per expert group)" "$tmp/hif8.yaml.txt" ||
    fail "hif8: no wgrad row"
"$bin" plan examples/qwen3_moe_mxfp8.yaml > "$tmp/mx.txt" || fail "plan of the mxfp8 example failed"
[ "$(grep -A6 '^operands of a converted layer' "$tmp/mx.txt")" = "operands of a converted layer (X inputs, W weight, dY output gradients):
  fprop  X   E4M3  E8M0 per 32 elements (floor)         along in (rowwise)
         W   E4M3  E8M0 per 32 elements (floor)         along in (rowwise)
  dgrad  dY  E4M3  E8M0 per 32 elements (floor)         along out (rowwise)
         W   E4M3  E8M0 per 32 elements (floor)         along out (colwise)
  wgrad  dY  E4M3  E8M0 per 32 elements (floor)         along rows (colwise)
         X   E4M3  E8M0 per 32 elements (floor)         along rows (colwise)" ] || fail "mxfp8: operand table: $(grep -A6 '^operands' "$tmp/mx.txt")"
echo "    operand tables of tensorwise, hif8 and mxfp8 as documented"

# blockwise (DeepSeek-V3, TE Float8BlockScaling) on 2 ranks: a Qwen3-MoE whose hidden size (160),
# expert width (136) and 128 rows a micro-batch give whole and partial 128-element blocks; the
# loss falls; the weights gather as FP8 codes (the tiles' scales from amaxes all-reduced over
# the shards), and the gathered bytes are the planned ones. With fp32 parameters on 3 ranks
# (shards of 32-row multiples crossing the tiles' edges) training is bit-identical with and
# without the low-precision all-gather.
blockwise_config() {   # blockwise_config FILE PARAM_DTYPE STEPS [EXTRA]
    cat > "$1" <<YAML
model:
  model_type: qwen3_moe
  vocab_size: 257
  hidden_size: 160
  intermediate_size: 200
  num_hidden_layers: 2
  num_attention_heads: 5
  num_key_value_heads: 1
  head_dim: 32
  max_position_embeddings: 64
  num_experts: 5
  num_experts_per_tok: 2
  moe_intermediate_size: 136
  norm_topk_prob: true
  mlp_only_layers: [0]
data:
  data_path: $tmp/tokens.bin
  seq_length: 64
parallel:
  fsdp_plan:
    param_dtype: $2
training:
  micro_batch_size: 2
  lr: 3.0e-3
  train_iters: $3
  log_interval: 1
  metrics_path: $1.jsonl
  quantization_plan:
    recipe_name: blockwise
${4:-}
YAML
}
blockwise_config "$tmp/blockwise.yaml" bf16 12
OMP_NUM_THREADS=1 train_on 2 "$tmp/blockwise.yaml"
grep -aq "^quantization: dynamic_per_block-1-128-128_E4M3_E4M3_E4M3, .*weights gathered as on-demand" "$tmp/blockwise.yaml.log" ||
    fail "blockwise: the log does not say the weights gather as codes: $(grep -a '^quantization' "$tmp/blockwise.yaml.log")"
"$bin" plan "$tmp/blockwise.yaml" --json --ranks 2 > "$tmp/blockwise.yaml.plan" || fail "blockwise: plan failed"
"$bin" plan "$tmp/blockwise.yaml" > "$tmp/blockwise.yaml.txt" || fail "blockwise: plan failed"
"$py" - "$tmp/blockwise.yaml.jsonl" "$tmp/blockwise.yaml.plan" <<'PY' || fail "blockwise: training or its prediction is off"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss": ' in l]
plan = json.load(open(sys.argv[2]))
head = sum(r["loss"] for r in rows[:3]) / 3
tail = sum(r["loss"] for r in rows[-3:]) / 3
assert len(rows) == 12 and tail < 0.9 * head, (head, tail)
kinds = {m["converter"] for m in plan["modules"] if m["converted"]}
assert kinds == {"quantize.linear.float8", "quantize.moe.float8"}, kinds
assert plan["low_precision_gather"] and plan["gather_fallback"] is None, plan
p = plan["per_step"]
assert p["gather_mode"] == "on-demand" and p["ag_mx_data_bytes"] > 0 and p["ag_mx_scale_bytes"] == 0, p
assert p["ag_bf16_equiv_bytes"] == 2 * p["ag_mx_data_bytes"], p   # the codes: half of bf16's bytes
for r in rows:
    for k in ("ag_param_bytes", "ag_mx_data_bytes", "ag_mx_scale_bytes"):
        assert r[k] == p[k], (k, r, p)
print(f"    blockwise: loss {head:.4f} -> {tail:.4f} over 12 steps; gathered {p['ag_mx_data_bytes']} bytes of codes "
      f"and {p['ag_param_bytes']} of bf16 per step, as planned")
PY
grep -q "^communication per step and rank: .* MiB FP8 codes, 0.00 MiB fp32 scales)" "$tmp/blockwise.yaml.txt" ||
    fail "blockwise: communication line: $(grep '^communication' "$tmp/blockwise.yaml.txt")"
blockwise_config "$tmp/lp_blockwise.yaml" fp32 6
blockwise_config "$tmp/hp_blockwise.yaml" fp32 6 "    enable_fsdp_low_precision_all_gather: false"
OMP_NUM_THREADS=1 train_on 3 "$tmp/lp_blockwise.yaml"
OMP_NUM_THREADS=1 train_on 3 "$tmp/hp_blockwise.yaml"
[ "$(grep -o '"loss": [^,]*' "$tmp/lp_blockwise.yaml.jsonl")" = "$(grep -o '"loss": [^,]*' "$tmp/hp_blockwise.yaml.jsonl")" ] &&
    [ "$(count_steps "$tmp/lp_blockwise.yaml.jsonl")" -eq 6 ] ||
    fail "blockwise: the low-precision all-gather changed the fp32 training"
echo "    blockwise: 6 steps on 3 ranks bit-identical with and without the low-precision all-gather"
[ "$(grep -A6 '^operands of a converted layer' "$tmp/blockwise.yaml.txt")" = "operands of a converted layer (X inputs, W weight, dY output gradients):
  fprop  X   E4M3  power of two per block, max / amax   1x128 blocks of X, along in
         W   E4M3  power of two per block, max / amax   128x128 tiles of W (out x in)
  dgrad  dY  E4M3  power of two per block, max / amax   1x128 blocks of dY, along out
         W   E4M3  power of two per block, max / amax   128x128 tiles of W (out x in)
  wgrad  dY  E4M3  power of two per block, max / amax   128x1 blocks of dY, along rows (of one expert group)
         X   E4M3  power of two per block, max / amax   128x1 blocks of X, along rows (of one expert group)" ] ||
    fail "blockwise: operand table: $(grep -A6 '^operands' "$tmp/blockwise.yaml.txt")"
echo "    operand table of blockwise as documented"

# the gathered codes named by the family, in plan's communication line
for pair in "tensorwise:FP8 codes, 0.00 MiB fp32 scales" "hif8:HiF8 codes, 0.00 MiB fp32 scales"; do
    grep -q "^communication per step and rank: .* MiB ${pair#*:})" "$tmp/${pair%%:*}.yaml.txt" ||
        fail "${pair%%:*}: communication line: $(grep '^communication' "$tmp/${pair%%:*}.yaml.txt")"
done
grep -q "^communication per step and rank: .* MiB MX codes, .* MiB MX scales)" "$tmp/mx.txt" ||
    fail "mxfp8: communication line: $(grep '^communication' "$tmp/mx.txt")"
echo "    plan names the gathered codes: FP8, HiF8, MX"
