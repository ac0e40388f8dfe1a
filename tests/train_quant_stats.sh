#!/bin/bash
# training.quant_stats_interval (docs/training.md#quantization-statistics): a tiny Qwen3-MoE
# on 2 ranks with mxfp8, tensorwise, mxfp8-32x32, rowwise and blockwise writes, at every second step,
# a record per converted tensor and role its products quantize, with figures summed over both ranks
# (fprop_x counts every token of both ranks' micro-batches; the weights, gathered as codes,
# each rank's shard: the whole weight once) and in range; the losses are those of the same
# run without statistics, bit for bit; with expert parallelism and the mxfp8 dispatch the
# experts' input is measured where it is quantized; `mxtrain plot --quant-stats` draws
# them, and refuses a field that is not one.
# tests/run: launches MPI ranks
. "$(dirname "$0")/common.bash"
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"   # Open MPI's (see fsdp.sh)

write_tokens "$tmp/tokens.bin" 4000 7 1
# config FILE RECIPE INTERVAL
config() {
    cat > "$1" <<YAML
$(uneven_model qwen3_moe 2)
data:
  data_path: $tmp/tokens.bin
  seq_length: 32
training:
  micro_batch_size: 2
  lr: 3.0e-3
  train_iters: 4
  metrics_path: $1.jsonl
  quant_stats_interval: $3
  quantization_plan:
    recipe_name: $2
YAML
}
for recipe in mxfp8 tensorwise mxfp8-32x32 rowwise blockwise; do
    cfg="$tmp/$recipe.yaml"
    config "$cfg" $recipe 2
    OMP_NUM_THREADS=1 train_on 2 "$cfg"
    if [ $recipe = mxfp8 ] || [ $recipe = tensorwise ]; then   # (32x32 tiles: one plane for both weight roles)
        config "$tmp/$recipe-off.yaml" $recipe 0
        OMP_NUM_THREADS=1 train_on 2 "$tmp/$recipe-off.yaml"
        compare_runs "$cfg.jsonl" "$tmp/$recipe-off.yaml.jsonl" 0 || fail "$recipe: statistics changed the run"
    fi
    "$bin" plan "$cfg" --json --ranks 2 > "$cfg.plan" || fail "$recipe: plan failed"
    "$py" - "$cfg.jsonl" "$cfg.plan" "$recipe" <<'PY' || fail "$recipe: the statistics records are off"
import json, math, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
stats = [r for r in recs if "quant_stats" in r]
plan = json.load(open(sys.argv[2]))
want = set()
for m in plan["modules"]:
    if not m["converted"]:
        continue
    name = m["module"]
    if name.endswith(".experts"):
        want |= {name + ".gate_up_proj", name + ".down_proj"}
    else:
        want.add(name + ".weight")
assert want, plan["modules"][:3]
roles = {"fprop_x", "fprop_w", "dgrad_dy", "dgrad_w", "wgrad_dy", "wgrad_x"}
assert {r["step"] for r in stats} == {2, 4}, sorted({r["step"] for r in stats})
for step in (2, 4):
    got = {(r["tensor"], r["role"]) for r in stats if r["step"] == step}
    for t in want:
        for role in roles:
            assert (t, role) in got, (step, t, role, sorted(got)[:8])
    assert {t for t, _ in got} == want, sorted({t for t, _ in got} ^ want)
for r in stats:
    assert r["numel"] > 0 and r["nonfinite"] == 0, r
    assert 0 <= r["underflows_pct"] <= 100 and 0 <= r["overflows_pct"] <= 100, r
    assert abs(r["underflows_pct"] - 100 * r["underflows"] / r["numel"]) < 1e-3, r
    assert 0 < r["scale_inv_min"] <= r["scale_inv_max"] < 1e30, r
    assert r["mse"] >= 0 and (r["sqnr_db"] is None or 5 < r["sqnr_db"] < 200), r
    if r["tensor"].endswith("q_proj.weight") and r["role"] == "fprop_x":
        assert r["numel"] == 2 * 2 * 32 * 80, r   # both ranks' tokens of one micro-batch, hidden 80
    # the weights: each rank's shard of the gathered codes, so the whole weight once (q_proj
    # 80 x 80; the experts' gate_up 5 x 80 x 80; the padding rows of the shards left out)
    if r["tensor"].endswith("q_proj.weight") and r["role"] in ("fprop_w", "dgrad_w"):
        assert r["numel"] == 80 * 80, r
    if r["tensor"].endswith("experts.gate_up_proj") and r["role"] in ("fprop_w", "dgrad_w"):
        assert r["numel"] == 5 * 80 * 80, r
    if sys.argv[3] == "tensorwise":   # current scaling: amax becomes the format's max, nothing is clamped
        assert r["overflows"] == 0, r
PY
    "$bin" plot "$cfg.jsonl" --quant-stats --out "$tmp/$recipe.png" > "$tmp/plot.out" || fail "$recipe: plot failed"
    head -c 8 "$tmp/$recipe.png" | od -An -tx1 | grep -q "89 50 4e 47" || fail "$recipe: no PNG drawn"
    "$bin" plot "$cfg.jsonl" --quant-stats=underflows_pct --role wgrad_dy --out "$tmp/$recipe-u.png" > /dev/null ||
        fail "$recipe: plot of one role failed"
done
# expert parallelism with the mxfp8 dispatch: FC1's input plane is made on the tokens' rank,
# and measured there (the expert side holds its dequantized values, which would measure exact)
config "$tmp/ep.yaml" mxfp8 2
sed -i 's/num_experts: 5/num_experts: 4/; s/^data:/parallel:\n  expert_parallel_size: 2\n  ep_plan:\n    dispatch_dtype: mxfp8\ndata:/
        s/recipe_name: mxfp8$/recipe_name: mxfp8\n    quant_converters: [quantize.linear.mx, quantize.moe.mx]/' "$tmp/ep.yaml"
OMP_NUM_THREADS=1 train_on 2 "$tmp/ep.yaml"
"$py" - "$tmp/ep.yaml.jsonl" <<'PY' || fail "ep: the experts' input statistics are off"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if '"quant_stats"' in l]
fc1 = [r for r in recs if r["tensor"] == "model.layers.1.mlp.experts.gate_up_proj" and r["role"] == "fprop_x"]
assert len(fc1) == 2, fc1
for r in fc1:   # every routed row of both ranks (2 x 32 tokens, top-2), hidden 80
    assert r["numel"] == 2 * 2 * 32 * 2 * 80 and r["sqnr_db"] is not None and r["mse"] > 0, r
for r in recs:   # each EP rank's two experts: the 4 experts once
    if r["tensor"] == "model.layers.1.mlp.experts.gate_up_proj" and r["role"] in ("fprop_w", "dgrad_w"):
        assert r["numel"] == 4 * 80 * 80, r
PY
out=$("$bin" plot "$tmp/mxfp8.yaml.jsonl" --quant-stats=snr --out "$tmp/x.png" 2>&1) && fail "a bad field was drawn"
[ "$(printf '%s\n' "$out" | head -1)" = "mxtrain plot: --quant-stats: 'snr' is not a field of the statistics records (allowed: sqnr_db, mse, underflows_pct, overflows_pct, scale_inv_min, scale_inv_max, numel, nonfinite, underflows, overflows)" ] ||
    fail "unexpected message: $out"
[ ! -e "$tmp/x.png" ] || fail "a refused plot left a file"
out=$("$bin" plot "$tmp/mxfp8-off.yaml.jsonl" --quant-stats --out "$tmp/x.png" 2>&1) && fail "a run without statistics was drawn"
printf '%s\n' "$out" | grep -q "no quantization statistics record" || fail "unexpected message: $out"
echo "ok"
