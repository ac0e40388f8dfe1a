#!/bin/bash
# The per-tensor recipes in training (docs/quantization-plan.md): a tiny Qwen3-MoE (ragged
# expert groups) trained with tensorwise and hif8, both converters of the family (no
# quant_converters), at bf16 on 2 ranks: the loss decreases; the log and `mxtrain plan` say
# that the converted weights are gathered in the param dtype, and the gathered bytes the
# plan predicts are the ones the run counts.
# tests/run: launches MPI ranks
. "$(dirname "$0")/common.bash"

write_tokens "$tmp/tokens.bin" 6000 7 1
for recipe in tensorwise hif8; do
    cfg="$tmp/$recipe.yaml"
    cat > "$cfg" <<YAML
$(uneven_model qwen3_moe 2)
data:
  data_path: $tmp/tokens.bin
  seq_length: 32
parallel:
  fsdp_plan:
    param_dtype: bf16
training:
  micro_batch_size: 2
  lr: 3.0e-3
  train_iters: 30
  log_interval: 1
  metrics_path: $cfg.jsonl
  quantization_plan:
    recipe_name: $recipe
YAML
    OMP_NUM_THREADS=1 train_on 2 "$cfg"
    grep -q "enable_fsdp_low_precision_all_gather: recipe $recipe has no low-precision all-gather yet; its converted weights are gathered in the param dtype (bf16)" "$cfg.log" ||
        fail "$recipe: the log does not say the weights are gathered in bf16: $(head -20 "$cfg.log")"
    "$bin" plan "$cfg" --json --ranks 2 > "$cfg.plan" || fail "$recipe: plan failed"
    "$bin" plan "$cfg" > "$cfg.txt" || fail "$recipe: plan failed"
    grep -q "^enable_fsdp_low_precision_all_gather: recipe $recipe has no low-precision all-gather yet; its converted weights are gathered in the param dtype (bf16)" "$cfg.txt" ||
        fail "$recipe: plan does not say the weights are gathered in bf16"
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
assert p["gather_mode"] == "bf16" and p["ag_mx_data_bytes"] == 0 and p["ag_mx_scale_bytes"] == 0, p
for r in rows:
    assert r["ag_param_bytes"] == p["ag_param_bytes"] and r["ag_mx_data_bytes"] == 0, (r, p)
print(f"    {recipe}: loss {head:.4f} -> {tail:.4f} over 30 steps; {p['ag_param_bytes']} bytes gathered per step, as planned")
PY
done

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
grep -q "low-precision all-gather yet" "$tmp/mx.txt" && fail "mxfp8: plan says it has no low-precision all-gather"
echo "    operand tables of tensorwise, hif8 and mxfp8 as documented"
