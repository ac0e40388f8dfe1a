#!/bin/bash
# Memory: Qwen3-0.6B's published architecture (hidden 1024, 28 layers, 16 heads, 8 KV heads,
# head_dim 128, intermediate 3072, vocabulary 151936, tied) on one rank, micro-batch 1, in
# bf16 and with the guide's plan (MXFP8 linear layers in every block, lm_head left out,
# on-demand low-precision all-gather), on the fortunes corpus of `mxtrain prepare`. For each:
# the peak `mxtrain plan` predicts (memory.predicted_bytes), the process's peak RSS
# (/usr/bin/time) and the figures `train` reports by category (the metrics' mem_* fields).
# Goals: MXFP8's peak <= 0.9 of bf16's; each prediction within 10% of the measured peak.
# With --model 1.7b, Qwen3-1.7B's architecture (hidden 2048, intermediate 6144, 16 heads,
# the rest as 0.6B's) at seq 4096 with the guide's plan, full recompute and bf16 gradients
# (training.main_grads_dtype), its AdamW moments in bf16 and in MXFP8: goals <= 20 GiB and
# <= 16 GiB. Before each run its prediction is held to 90% of MemAvailable, and a run that
# would not fit is skipped with a line saying so. Prints Markdown for docs/benchmarks.md
# with the CPU.
#
#   bench/bench_memory.sh [--model 0.6b|1.7b] [--threads N] [--steps N] [--seq N]
#
# Run from anywhere after `make -j2`. --steps: optimizer steps per run (default 2, 1 for
# 1.7b: the peak is reached in the first); --seq: tokens per sequence (default 1024, 4096
# for 1.7b). Takes about 10 minutes with the defaults on 2 quiet cores, 25 with 1.7b.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="$root/build/mxtrain"
py=/usr/bin/python3

threads=$(nproc)
model=0.6b
steps=
seq=
usage="usage: bench/bench_memory.sh [--model 0.6b|1.7b] [--threads N] [--steps N] [--seq N]"
while [ $# -gt 0 ]; do
    case "$1" in
    --model) model="${2:?$usage}"; shift 2 ;;
    --threads) threads="${2:?$usage}"; shift 2 ;;
    --steps) steps="${2:?$usage}"; shift 2 ;;
    --seq) seq="${2:?$usage}"; shift 2 ;;
    -h|--help) echo "$usage"; exit 0 ;;
    *) echo "$usage" >&2; exit 2 ;;
    esac
done
case "$model" in 0.6b) steps=${steps:-2} seq=${seq:-1024} ;; 1.7b) steps=${steps:-1} seq=${seq:-4096} ;;
    *) echo "--model takes 0.6b or 1.7b" >&2; exit 2 ;; esac
case "$threads$steps$seq" in ''|*[!0-9]*) echo "--threads, --steps and --seq take positive integers" >&2; exit 2 ;; esac
[ "$steps" -gt 0 ] && [ "$seq" -gt 0 ] || { echo "--steps and --seq must be positive" >&2; exit 2; }
[ -x "$bin" ] || { echo "$bin is missing: run 'make -j2' in $root first" >&2; exit 1; }
[ -x /usr/bin/time ] || { echo "/usr/bin/time is missing (apt-get install time)" >&2; exit 1; }

. "$root/bench/common.sh"
bench_start "$root"
echo "# bench_memory: $(date -u '+%Y-%m-%d %H:%M UTC'), mxtrain $rev, $cpu, $threads threads, Qwen3-$model, seq $seq, micro-batch 1, 1 rank, $steps steps"

qwen3() {   # qwen3 RUN(bf16|mxfp8|state_bf16|state_mxfp8): the last two 1.7b's
    local hidden=1024 inter=3072
    [ "$model" = 1.7b ] && hidden=2048 inter=6144
    cat <<YAML
model:
  model_type: qwen3
  vocab_size: 151936
  hidden_size: $hidden
  intermediate_size: $inter
  num_hidden_layers: 28
  num_attention_heads: 16
  num_key_value_heads: 8
  head_dim: 128
  max_position_embeddings: 40960
  rms_norm_eps: 1.0e-6
  rope_theta: 1000000.0
  tie_word_embeddings: true
data:
  data_path: $tmp/data/train_*.bin
  seq_length: $seq
parallel:
  fully_shard_parallel_size: auto
  fsdp_plan:
    param_dtype: bf16
    reduce_dtype: fp32
training:
  micro_batch_size: 1
  seed: 1234
  lr: 3.0e-4
  lr_decay_style: constant
  train_iters: $steps
  log_interval: 1
  metrics_path: $tmp/$1.jsonl
YAML
    case "$1" in state_*) cat <<YAML
  main_grads_dtype: bf16
  exp_avg_dtype: ${1#state_}
  exp_avg_sq_dtype: ${1#state_}
YAML
    esac
    [ "$1" = bf16 ] || cat <<YAML
  quantization_plan:
    recipe_name: mxfp8
    apply_modules: ['model.layers.{*}']
    ignored_modules: ['*lm_head']
    quant_converters: ['quantize.linear.mx']
    enable_fsdp_low_precision_all_gather: true
    fsdp_low_precision_all_gather_mode: on-demand
YAML
    case "$1" in state_*) printf 'features:\n  recompute: true\n' ;; esac
}

avail_kib=$(sed -n 's/^MemAvailable:[[:space:]]*\([0-9]*\) kB/\1/p' /proc/meminfo)
rows=()
runs="bf16 mxfp8"
[ "$model" = 1.7b ] && runs="state_bf16 state_mxfp8"
for p in $runs; do
    qwen3 $p > "$tmp/$p.yaml"
    predicted=$("$bin" plan "$tmp/$p.yaml" --json 2>/dev/null | "$py" -c 'import json,sys; print(json.load(sys.stdin)["memory"]["predicted_bytes"])')
    if [ $((predicted / 1024)) -gt $((avail_kib * 9 / 10)) ]; then
        echo "    $p: skipped, predicted peak $((predicted >> 20)) MiB against $((avail_kib / 1024)) MiB available"
        continue
    fi
    load=$(cut -d' ' -f1-3 /proc/loadavg)
    OMP_NUM_THREADS=$threads /usr/bin/time -f "maxrss_kib %M" "$bin" train "$tmp/$p.yaml" > "$tmp/$p.log" 2>&1 ||
        { tail -5 "$tmp/$p.log" >&2; exit 1; }
    rss=$(sed -n 's/^maxrss_kib //p' "$tmp/$p.log")
    rows+=("$p|$load|$predicted|$rss|$tmp/$p.jsonl")
done
[ ${#rows[@]} -gt 0 ] || exit 0
"$py" - "${rows[@]}" <<'PY'
import json, sys
MiB = 1 << 20
cats = [("master", "mem_master_bytes"), ("gradients", "mem_grad_bytes"), ("optimizer", "mem_optimizer_bytes"),
        ("MX shards", "mem_mx_shard_bytes"), ("gather buffers", "mem_gathered_bytes"), ("activations", "mem_activation_bytes")]
print("| run | load avg before | " + " | ".join(c + " MiB" for c, _ in cats) +
      " | predicted peak MiB | peak RSS MiB | predicted / measured | peak against bf16 |")
print("|---|---|" + "---|" * len(cats) + "---|---|---|---|")
base = None
for row in sys.argv[1:]:
    plan, load, predicted, rss_kib, path = row.split("|")
    step = [json.loads(l) for l in open(path) if '"loss"' in l][-1]
    rss = int(rss_kib) * 1024
    base = base or (rss if plan == "bf16" else None)
    against = f"{rss / base:.3f}x" if base else "-"
    print(f"| {plan} | {load} | " + " | ".join(f"{step[k] / MiB:.0f}" for _, k in cats) +
          f" | {int(predicted) / MiB:.0f} | {rss / MiB:.0f} | {int(predicted) / rss:.3f} | {against} |")
PY
