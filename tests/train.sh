#!/bin/bash
# Training end to end on the demo corpus (Debian's fortunes, byte-level): a small Qwen3-MoE
# trained in bf16 and with the MXFP8 plan of MindSpeed MM's guide. Both must end far below
# the byte-unigram entropy of the corpus, and MXFP8's final loss (mean of the last 20 steps)
# must be within 2% of bf16's. 300 steps in the optimised build; in the clang and sanitizer
# builds the same run is 40 steps and must only lower the loss (they check memory, not
# convergence, and are several times slower).
. "$(dirname "$0")/common.bash"
steps=300
[ "$build" = build ] || steps=40

prep=$("$bin" prepare --out "$tmp/data" 2>&1) || fail "prepare failed: $prep"
entropy=$(sed -n 's/.* = \([0-9.]*\) nats per token.*/\1/p' <<<"$prep")
[ -n "$entropy" ] || fail "no entropy in the prepare summary: $prep"

write_config() {   # write_config FILE PLAN_BLOCK
    cat > "$1" <<YAML
model:
  model_type: qwen3_moe
  vocab_size: 257
  hidden_size: 64
  intermediate_size: 128
  num_hidden_layers: 2
  num_attention_heads: 4
  num_key_value_heads: 2
  head_dim: 16
  max_position_embeddings: 128
  num_experts: 4
  num_experts_per_tok: 2
  moe_intermediate_size: 64
  norm_topk_prob: true
  mlp_only_layers: [0]
data:
  data_path: $tmp/data/train_*.bin
  seq_length: 128
training:
  micro_batch_size: 8
  seed: 7
  lr: 3.0e-3
  min_lr: 3.0e-4
  lr_decay_style: cosine
  lr_warmup_ratio: 0.05
  weight_decay: 0.1
  train_iters: $steps
  clip_grad: 1.0
  log_interval: 50
  metrics_path: $1.jsonl
$2
YAML
}
write_config "$tmp/bf16.yaml" ""
write_config "$tmp/mxfp8.yaml" "  quantization_plan:
    recipe_name: mxfp8
    apply_modules: ['model.layers.{*}']
    ignored_modules: ['*lm_head', '*gate']
    quant_converters: ['quantize.linear.mx', 'quantize.moe.mx']
    enable_fsdp_low_precision_all_gather: True
    fsdp_low_precision_all_gather_mode: 'on-demand'"

for run in bf16 mxfp8; do
    out=$("$bin" train "$tmp/$run.yaml" 2>&1) || fail "$run training failed: $out"
    printf '%s\n' "$out" | tail -2 | sed "s/^/    $run: /"
    # the precision line names the matmul this CPU runs: bf16 where it has AVX512_BF16 or AMX,
    # fp32 without AVX-512 (oneDNN 2.6 may emulate bf16 on other AVX-512 CPUs)
    line=$(printf '%s\n' "$out" | grep '^precision: bf16 operands, fp32 accumulation, on oneDNN' || true)
    [ -n "$line" ] || fail "$run: no precision line"
    echo "    $run: $line"
    if grep -qwE 'avx512_bf16|amx_bf16' /proc/cpuinfo; then
        grep -q "on oneDNN's bf16 matmul" <<<"$line" || fail "$run: a bf16 CPU, but: $line"
    elif ! grep -qw avx512f /proc/cpuinfo; then
        grep -q "on oneDNN's fp32 matmul (this CPU has no bf16 matmul)" <<<"$line" || fail "$run: an AVX2 CPU, but: $line"
    fi
done

"$py" - "$tmp/bf16.yaml.jsonl" "$tmp/mxfp8.yaml.jsonl" "$entropy" "$steps" <<'PY'
import json, sys
bf16, mx = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
entropy, steps = float(sys.argv[3]), int(sys.argv[4])
for name, log in (("bf16", bf16), ("mxfp8", mx)):
    assert len(log) == steps, f"{name}: {len(log)} metric lines, want {steps}"
    for i, rec in enumerate(log):
        for key in ("step", "loss", "lr", "grad_norm", "tokens_per_s"):
            assert key in rec, f"{name}: line {i + 1} has no {key}"
        assert rec["step"] == i + 1
tail = lambda log: sum(r["loss"] for r in log[-20:]) / 20
first = lambda log: log[0]["loss"]
if steps >= 300:
    for name, log in (("bf16", bf16), ("mxfp8", mx)):
        assert tail(log) < 0.85 * entropy, f"{name}: final loss {tail(log):.4f} not far below the unigram entropy {entropy:.4f}"
    gap = abs(tail(mx) - tail(bf16)) / tail(bf16)
    assert gap <= 0.02, f"mxfp8 final loss {tail(mx):.4f} is {gap:.1%} from bf16's {tail(bf16):.4f} (allowed: 2%)"
    print(f"    unigram entropy {entropy:.4f}; final loss bf16 {tail(bf16):.4f}, mxfp8 {tail(mx):.4f} ({gap:.2%} apart)")
else:
    for name, log in (("bf16", bf16), ("mxfp8", mx)):
        assert tail(log) < first(log) - 0.5, f"{name}: loss went from {first(log):.4f} to {tail(log):.4f}"
    print(f"    {steps}-step smoke run: loss falls in both runs")
PY
