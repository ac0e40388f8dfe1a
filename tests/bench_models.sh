#!/bin/bash
# The benchmark models: the configs of bench/llama20m.sh and bench/moe33m.sh, with the MXFP8
# plan bench_train.sh adds, are valid mxtrain configs that convert the blocks' linear layers
# (and the experts) but not the routers; and build/bench/bench_moe runs a small MoE model,
# creating no oneDNN primitive after its warm-up step (with fixed expert shapes it does),
# and refuses a bad argument with one line. (PyTorch's side: tests/bench_torch.sh.)
. "$(dirname "$0")/common.bash"
root=$(cd "$(dirname "$0")/.." && pwd)

for m in llama20m moe33m; do
    . "$root/bench/$m.sh"
    { "${m}_yaml" "$tmp/data_*.bin" 10
      printf '  quantization_plan:\n    recipe_name: mxfp8\n    apply_modules: [%s]\n' "'model.layers.{*}'"
      printf "    ignored_modules: ['*lm_head', '*gate']\n    quant_converters: ['quantize.linear.mx', 'quantize.moe.mx']\n"
    } > "$tmp/$m.yaml"
    out=$("$bin" plan "$tmp/$m.yaml" --json 2>&1) || fail "mxtrain plan $m: $out"
    "$py" -c '
import json, sys
d, moe = json.loads(sys.argv[1]), sys.argv[2] == "moe33m"
conv = {m["module"] for m in d["modules"] if m["converted"]}
want = {f"model.layers.{l}.mlp.experts" for l in range(6)} if moe else {f"model.layers.{l}.mlp.down_proj" for l in range(6)}
assert want <= conv, sorted(want - conv)
assert not any(m.endswith("mlp.gate") for m in conv)
' "$out" "$m" || fail "plan --json of $m: $out"
done

moe="$build/bench/bench_moe"
[ -x "$moe" ] || fail "$moe is not built"
small=(--steps 3 --hidden 64 --heads 2 --kv-heads 1 --layers 2 --experts 6 --top-k 2 --moe-intermediate 32 --batch 2 --seq 24)
for prec in bf16 mxfp8; do
    out=$(OMP_NUM_THREADS=1 "$moe" "${small[@]}" --precision $prec 2>&1) || fail "bench_moe $prec: $out"
    grep -q '^oneDNN primitives: 0.0 created per timed step' <<<"$out" || fail "bench_moe $prec creates primitives after warm-up: $out"
    grep -q '^| expert GEMMs (grouped) |' <<<"$out" || fail "bench_moe $prec: no per-op table: $out"
    out=$(OMP_NUM_THREADS=1 "$moe" "${small[@]}" --precision $prec --shapes fixed 2>&1) || fail "bench_moe $prec fixed: $out"
    grep -q '^oneDNN primitives: 0.0 created per timed step' <<<"$out" && fail "bench_moe --shapes fixed created none: $out"
done
out=$("$moe" --experts 0 2>&1) && fail "bench_moe --experts 0 was accepted"
grep -q -- "--experts 0" <<<"$out" || fail "bench_moe --experts 0: $out"
exit 0
