#!/bin/bash
# torchao's rowwise recipes and high_precision_gemms in training (docs/quantization-plan.md):
# a tiny Qwen3-MoE (ragged expert groups) trained with rowwise and rowwise_with_gw_hp, both
# float8 converters, at bf16 on 2 ranks: the loss decreases; the weights are gathered as
# FP8 codes (fprop's with one fp32 scale a row, dgrad's alone), and the gathered bytes `plan`
# predicts are the ones the run counts. With fp32 parameters on 3 ranks (80 and 100 rows cut
# unevenly), training with the low-precision all-gather is bit-identical to gathering fp32
# weights and quantizing them whole, and its gathers are the planned ones. mxfp8 with
# high_precision_gemms [wgrad] still gathers MX planes (wgrad does not read the weight), with
# [dgrad] it gathers bf16. `mxtrain plan` prints the operand tables.
# tests/run: launches MPI ranks
. "$(dirname "$0")/common.bash"
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"   # Open MPI's (see fsdp.sh)

write_tokens "$tmp/tokens.bin" 6000 7 1
# check NAME STEPS LOWPREC: the run's loss falls and its gathers are the planned ones
check() {
    "$py" - "$tmp/$1.yaml.jsonl" "$tmp/$1.yaml.plan" "$1" "$2" "$3" <<'PY' || fail "$1: training or its prediction is off"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss": ' in l]
plan = json.load(open(sys.argv[2]))
name, steps, lowprec = sys.argv[3], int(sys.argv[4]), sys.argv[5] == "1"
head = sum(r["loss"] for r in rows[:5]) / 5
tail = sum(r["loss"] for r in rows[-5:]) / 5
assert len(rows) == steps and tail < 0.9 * head, (name, head, tail)
p = plan["per_step"]
assert plan["low_precision_gather"] == lowprec and (plan["gather_fallback"] is None) == lowprec, plan["gather_fallback"]
if lowprec:
    assert p["gather_mode"] == "on-demand" and p["ag_mx_data_bytes"] > 0, p
else:
    assert p["gather_mode"] == "bf16" and p["ag_mx_data_bytes"] == 0 and p["ag_param_bytes"] > 0, p
for r in rows:
    for k in ("ag_param_bytes", "ag_mx_data_bytes", "ag_mx_scale_bytes"):
        assert r[k] == p[k], (k, r, p)
print(f"    {name}: loss {head:.4f} -> {tail:.4f} over {steps} steps; gathered {p['ag_param_bytes']} bytes of bf16 and "
      f"{p['ag_mx_data_bytes'] + p['ag_mx_scale_bytes']} of MX planes per step, as planned")
PY
}
for recipe in rowwise rowwise_with_gw_hp; do
    cfg="$tmp/$recipe.yaml"
    recipe_config "$cfg" $recipe bf16 30
    OMP_NUM_THREADS=1 train_on 2 "$cfg"
    grep -aq "weights gathered as on-demand; " "$cfg.log" ||
        fail "$recipe: the log does not say the weights gather quantized: $(grep -a '^quantization' "$cfg.log")"
    "$bin" plan "$cfg" --json --ranks 2 > "$cfg.plan" || fail "$recipe: plan failed"
    "$bin" plan "$cfg" > "$cfg.txt" || fail "$recipe: plan failed"
    grep -q "^low-precision all-gather: not for this plan" "$cfg.txt" && fail "$recipe: plan says the weights gather in the param dtype"
    grep -q "^communication per step and rank: .* MiB FP8 codes, .* MiB fp32 scales)" "$cfg.txt" ||
        fail "$recipe: communication line: $(grep '^communication' "$cfg.txt")"
    check $recipe 30 1
    grep -q '"ag_mx_scale_bytes": 0,' "$cfg.jsonl" && fail "$recipe: no row scales gathered"
done

# fp32 parameters, 3 ranks: the low-precision all-gather changes no bit of the training, and
# the lp run's gathers are the planned ones
for recipe in rowwise rowwise_with_gw_hp; do
    recipe_config "$tmp/lp_$recipe.yaml" $recipe fp32 6
    recipe_config "$tmp/hp_$recipe.yaml" $recipe fp32 6 "    enable_fsdp_low_precision_all_gather: false"
    OMP_NUM_THREADS=1 train_on 3 "$tmp/lp_$recipe.yaml" > /dev/null
    OMP_NUM_THREADS=1 train_on 3 "$tmp/hp_$recipe.yaml" > /dev/null
    "$bin" plan "$tmp/lp_$recipe.yaml" --json --ranks 3 > "$tmp/lp_$recipe.yaml.plan" || fail "$recipe: plan failed"
    "$py" - "$tmp/lp_$recipe.yaml.jsonl" "$tmp/lp_$recipe.yaml.plan" <<'PY' || fail "$recipe: the fp32 run's gathers are not the planned ones"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss": ' in l]
p = json.load(open(sys.argv[2]))["per_step"]
assert p["ag_mx_data_bytes"] > 0 and p["ag_mx_scale_bytes"] > 0, p
for r in rows:
    for k in ("ag_param_bytes", "ag_mx_data_bytes", "ag_mx_scale_bytes", "ag_bf16_equiv_bytes"):
        assert r[k] == p[k], (k, r, p)
PY
    compare_runs --keys "loss grad_norm" "$tmp/hp_$recipe.yaml.jsonl" "$tmp/lp_$recipe.yaml.jsonl" 0 ||
        fail "$recipe: training with the low-precision all-gather differs from gathering fp32 weights"
    echo "    $recipe: 6 steps on 3 ranks bit-identical with and without the low-precision all-gather, gathers as planned"
done

recipe_config "$tmp/mx_hp_wgrad.yaml" mxfp8 bf16 20 "    high_precision_gemms: [wgrad]"
OMP_NUM_THREADS=1 train_on 2 "$tmp/mx_hp_wgrad.yaml" > /dev/null
"$bin" plan "$tmp/mx_hp_wgrad.yaml" --json --ranks 2 > "$tmp/mx_hp_wgrad.yaml.plan" || fail "plan failed"
check mx_hp_wgrad 20 1
recipe_config "$tmp/mx_hp_dgrad.yaml" mxfp8 bf16 20 "    high_precision_gemms: [dgrad]"
OMP_NUM_THREADS=1 train_on 2 "$tmp/mx_hp_dgrad.yaml" > /dev/null
"$bin" plan "$tmp/mx_hp_dgrad.yaml" --json --ranks 2 > "$tmp/mx_hp_dgrad.yaml.plan" || fail "plan failed"
check mx_hp_dgrad 20 0

[ "$(grep -A6 '^operands of a converted layer' "$tmp/rowwise.yaml.txt")" = "operands of a converted layer (X inputs, W weight, dY output gradients):
  fprop  X   E4M3  power of two per line (torchao)      each row of X, along in
         W   E4M3  power of two per line (torchao)      each row of W, along in
  dgrad  dY  E4M3  power of two per line (torchao)      each row of dY, along out
         W   E4M3  power of two per line (torchao)      each column of W, along out
  wgrad  dY  E4M3  power of two per line (torchao)      each column of dY, along rows (of one expert group)
         X   E4M3  power of two per line (torchao)      each column of X, along rows (of one expert group)" ] ||
    fail "rowwise: operand table: $(grep -A6 '^operands' "$tmp/rowwise.yaml.txt")"
[ "$(grep -A6 '^operands of a converted layer' "$tmp/rowwise_with_gw_hp.yaml.txt")" = "operands of a converted layer (X inputs, W weight, dY output gradients):
  fprop  X   E4M3  power of two per line (torchao)      each row of X, along in
         W   E4M3  power of two per line (torchao)      each row of W, along in
  dgrad  dY  E4M3  power of two per line (torchao)      each row of dY, along out
         W   E4M3  power of two per tensor (torchao)    the whole tensor (the weight; one per expert)
  wgrad  dY  model none (high_precision_gemms)          unquantized, in the model's precision
         X   model none (high_precision_gemms)          unquantized, in the model's precision" ] ||
    fail "rowwise_with_gw_hp: operand table: $(grep -A6 '^operands' "$tmp/rowwise_with_gw_hp.yaml.txt")"
echo "    operand tables of rowwise and rowwise_with_gw_hp as documented"
