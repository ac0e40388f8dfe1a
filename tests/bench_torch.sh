#!/bin/bash
# The PyTorch baselines of bench/bench_train.sh stay honest: the fast fp32 MXFP8 fake
# quantization of bench/py/train_torch.py (--precision mxfp8) equals, bit for bit, the
# specification's emulation (tests/py/mx_ref.py, float64, written from SPEC §4) on values
# across E4M3's range (zeros, subnormal codes, saturation, odd sizes, both axes); both
# implementations of its Llama and Qwen3-MoE (--model moe), the nn.Module and the
# functional one, agree with tests/py/model_ref.py, the oracle of the C model tests, in loss
# and every gradient, and with each other over 3 training steps in every precision
# (--check); every mode of the benchmark script trains a tiny dense and a tiny MoE model for
# 2 steps to a finite loss, the two implementations taking turns; a wrong --impl is a
# one-line error.
# tests/run: the first build only
. "$(dirname "$0")/common.bash"
here=$(cd "$(dirname "$0")" && pwd)
"$py" - "$here/py" "$here/../bench/py/train_torch.py" <<'PY' || fail "fake quantization differs from the emulation"
import importlib.util, sys, torch
sys.path.insert(0, sys.argv[1])
import mx_ref
spec = importlib.util.spec_from_file_location("train_torch", sys.argv[2])
tt = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tt)
torch.manual_seed(0)
bad = 0
for shape in [(1, 1), (7, 45), (64, 96), (33, 1), (3, 200)]:
    x = torch.randn(*shape) * torch.exp(torch.randn(*shape) * 4)   # magnitudes over ~2^-20 .. 2^20
    x.view(-1)[0] = 0.0
    if x.numel() > 40:
        x[1, :] = 0.0    # an all-zero block
        x[2, 5] = 1e30   # one huge element: the rest of its block rounds to subnormal codes or zero
    for dim, axis in ((1, mx_ref.ROWWISE), (0, mx_ref.COLWISE)):
        got, want = tt.mx_fake(x, dim), mx_ref.mx_fake(x, axis, 0, 0)
        if not torch.equal(got, want):
            bad += 1
            print(f"    shape {shape} dim {dim}: max difference {(got - want).abs().max().item()}")
sys.exit(1 if bad else 0)
PY
out=$("$pyrun" "$here/../bench/py/train_torch.py" --check 2>&1) || fail "train_torch.py --check: $out"
printf '%s\n' "$out" | sed 's/^/    /'
"$bin" prepare --out "$tmp/data" > /dev/null || fail "prepare failed"
impl=module   # the implementations take turns, so that each trains every model and most modes
for model in dense moe; do
    for mode in fp32 bf16 mxfp8; do
        impl=$([ $impl = module ] && echo functional || echo module)
        "$pyrun" "$here/../bench/py/train_torch.py" --shard "$tmp/data/train_000000.bin" --metrics "$tmp/$model.$mode.jsonl" \
            --impl $impl --precision $mode --steps 2 --batch 2 --seq 16 --hidden 64 --layers 1 --heads 2 --kv-heads 1 \
            --intermediate 96 --model $model --experts 4 --top-k 2 --moe-intermediate 32 > "$tmp/$model.$mode.log" 2>&1 \
            || { cat "$tmp/$model.$mode.log"; fail "train_torch.py --impl $impl --model $model --precision $mode failed"; }
        "$py" -c "import json, math, sys; r = [json.loads(l) for l in open(sys.argv[1])]; sys.exit(0 if len(r) == 2 and all(math.isfinite(x['loss']) for x in r) else 1)" \
            "$tmp/$model.$mode.jsonl" || fail "train_torch.py --impl $impl --model $model --precision $mode: no 2 finite losses in its metrics"
    done
done
tiny=(--shard "$tmp/data/train_000000.bin" --steps 2 --batch 2 --seq 16 --hidden 64 --layers 1 --heads 2 --kv-heads 1
      --intermediate 96 --model dense --precision fp32)
err=$("$pyrun" "$here/../bench/py/train_torch.py" "${tiny[@]}" --impl modular --metrics "$tmp/bad.jsonl" 2>&1) \
    && fail "train_torch.py --impl modular was accepted"
[ "$(printf '%s\n' "$err" | wc -l)" = 1 ] && [[ "$err" == *"--impl"*"modular"* ]] || fail "train_torch.py --impl modular: not a one-line error: $err"
[ ! -e "$tmp/bad.jsonl" ] || fail "train_torch.py --impl modular left a metrics file"
echo "    fake quantization = emulation; fp32, bf16 and mxfp8 modes train, dense and MoE, functional and module"
