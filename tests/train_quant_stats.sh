#!/bin/bash
# training.quant_stats_interval (docs/training.md#quantization-statistics): a tiny Qwen3-MoE
# on 2 ranks with mxfp8 and with tensorwise writes, at every second step, a record per
# converted tensor and role its products quantize, with figures summed over both ranks
# (fprop_x counts every token of both ranks' micro-batches) and in range; the losses are
# those of the same run without statistics, bit for bit; `mxtrain plot --quant-stats` draws
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
for recipe in mxfp8 tensorwise; do
    cfg="$tmp/$recipe.yaml"
    config "$cfg" $recipe 2
    OMP_NUM_THREADS=1 train_on 2 "$cfg"
    config "$tmp/$recipe-off.yaml" $recipe 0
    OMP_NUM_THREADS=1 train_on 2 "$tmp/$recipe-off.yaml"
    compare_runs "$cfg.jsonl" "$tmp/$recipe-off.yaml.jsonl" 0 || fail "$recipe: statistics changed the run"
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
roles = {"fprop_x", "dgrad_dy", "wgrad_dy", "wgrad_x"}   # the weights come gathered as codes: no fprop_w, dgrad_w
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
    if sys.argv[3] == "tensorwise":   # current scaling: amax becomes the format's max, nothing is clamped
        assert r["overflows"] == 0, r
PY
    "$bin" plot "$cfg.jsonl" --quant-stats --out "$tmp/$recipe.png" > "$tmp/plot.out" || fail "$recipe: plot failed"
    head -c 8 "$tmp/$recipe.png" | od -An -tx1 | grep -q "89 50 4e 47" || fail "$recipe: no PNG drawn"
    "$bin" plot "$cfg.jsonl" --quant-stats=underflows_pct --role wgrad_dy --out "$tmp/$recipe-u.png" > /dev/null ||
        fail "$recipe: plot of one role failed"
done
out=$("$bin" plot "$tmp/mxfp8.yaml.jsonl" --quant-stats=snr --out "$tmp/x.png" 2>&1) && fail "a bad field was drawn"
[ "$(printf '%s\n' "$out" | head -1)" = "mxtrain plot: --quant-stats: 'snr' is not a field of the statistics records (allowed: sqnr_db, mse, underflows_pct, overflows_pct, scale_inv_min, scale_inv_max, numel, nonfinite, underflows, overflows)" ] ||
    fail "unexpected message: $out"
[ ! -e "$tmp/x.png" ] || fail "a refused plot left a file"
out=$("$bin" plot "$tmp/mxfp8-off.yaml.jsonl" --quant-stats --out "$tmp/x.png" 2>&1) && fail "a run without statistics was drawn"
printf '%s\n' "$out" | grep -q "no quantization statistics record" || fail "unexpected message: $out"
echo "ok"
