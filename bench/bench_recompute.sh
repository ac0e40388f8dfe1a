#!/bin/bash
# Activation recompute (features.recompute, recompute_granularity): what none, selective and
# full keep and cost.
#   - The ~20M-parameter Llama of bench/bench_train.sh (bench/llama20m.sh: seq 256, micro-batch
#     8, bf16, one process) trained a few steps in each mode, the modes in turn for --rounds
#     rounds: tokens/s (tokens of a step / the median step time after the warm-up steps, the
#     least of the rounds: on a shared machine the least disturbed), the activations `train`
#     reports and the process's peak RSS.
#   - Qwen3-0.6B's published architecture (as bench/bench_memory.sh: seq 1024, micro-batch 1,
#     one rank) in bf16 and with the guide's plan: the activations and the whole peak that
#     `mxtrain plan` predicts in each mode (plan only: nothing is trained).
# Prints Markdown for docs/benchmarks.md with the CPU model and the load average before each run.
#
#   bench/bench_recompute.sh [--threads N] [--steps N] [--warmup N] [--rounds N]
#
# Run from anywhere after `make -j2`. --steps: optimizer steps per run (default 8); --warmup:
# steps left out of the median (default 3); --rounds: runs of each mode (default 2). Takes
# about 2 minutes with the defaults on 2 cores.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="$root/build/mxtrain"
py=/usr/bin/python3

threads=$(nproc)
steps=8
warmup=3
rounds=2
usage="usage: bench/bench_recompute.sh [--threads N] [--steps N] [--warmup N] [--rounds N]"
while [ $# -gt 0 ]; do
    case "$1" in
    --threads) threads="${2:?$usage}"; shift 2 ;;
    --steps) steps="${2:?$usage}"; shift 2 ;;
    --warmup) warmup="${2:?$usage}"; shift 2 ;;
    --rounds) rounds="${2:?$usage}"; shift 2 ;;
    -h|--help) echo "$usage"; exit 0 ;;
    *) echo "$usage" >&2; exit 2 ;;
    esac
done
case "$threads$steps$warmup$rounds" in ''|*[!0-9]*) echo "--threads, --steps and --warmup take non-negative integers" >&2; exit 2 ;; esac
[ "$steps" -gt "$warmup" ] || { echo "--steps must exceed --warmup" >&2; exit 2; }
[ "$rounds" -gt 0 ] || { echo "--rounds must be positive" >&2; exit 2; }
[ -x "$bin" ] || { echo "$bin is missing: run 'make -j2' in $root first" >&2; exit 1; }
[ -x /usr/bin/time ] || { echo "/usr/bin/time is missing (apt-get install time)" >&2; exit 1; }

. "$root/bench/llama20m.sh"
. "$root/bench/common.sh"
bench_start "$root"
echo "# bench_recompute: $(date -u '+%Y-%m-%d %H:%M UTC'), mxtrain $rev, $cpu, $threads threads, $steps steps per run ($warmup warm-up), $rounds rounds"

features() {   # features MODE: the features: section of a mode
    case "$1" in
    none) ;;
    *) printf 'features:\n  recompute: true\n  recompute_granularity: %s\n' "$1" ;;
    esac
}

rows=()
for round in $(seq "$rounds"); do
    for mode in none selective full; do
        run="$mode-$round"
        { llama20m_yaml "$tmp/data/train_*.bin" "$steps"
          echo "  log_interval: 1"
          echo "  metrics_path: $tmp/$run.jsonl"
          features "$mode"; } > "$tmp/$run.yaml"
        load=$(cut -d' ' -f1-3 /proc/loadavg)
        OMP_NUM_THREADS=$threads /usr/bin/time -f "maxrss_kib %M" "$bin" train "$tmp/$run.yaml" > "$tmp/$run.log" 2>&1 ||
            { tail -5 "$tmp/$run.log" >&2; exit 1; }
        rows+=("$mode|$load|$(sed -n 's/^maxrss_kib //p' "$tmp/$run.log")|$tmp/$run.jsonl")
    done
done
echo
echo "20.7M Llama, seq $T x micro-batch $B, bf16:"
echo
"$py" - "$warmup" "${rows[@]}" <<'PY'
import json, statistics, sys
warmup, rows = int(sys.argv[1]), sys.argv[2:]
print("| recompute | load avg before (each round) | step s (median, least of the rounds) | tokens/s | against none | activations MiB | peak RSS MiB |")
print("|---|---|---|---|---|---|---|")
best = {}   # mode: (step s, tokens, activations, rss, loads)
for r in rows:
    mode, load, rss, path = r.split("|")
    recs = [json.loads(l) for l in open(path)]
    st = statistics.median(x["step_s"] for x in recs[warmup:])
    prev = best.get(mode)
    loads = (prev[4] + "; " if prev else "") + load
    if not prev or st < prev[0]:
        prev = (st, recs[-1]["tokens"], recs[-1]["mem_activation_bytes"], int(rss))
    best[mode] = prev[:4] + (loads,)
base = best["none"][1] / best["none"][0]
for mode, (st, tokens, act, rss, loads) in best.items():
    tps = tokens / st
    print(f"| {mode} | {loads} | {st:.3f} | {tps:.0f} | {tps / base:.2f} | {act / 2**20:.1f} | {rss / 1024:.0f} |")
PY

qwen3_06b() {   # qwen3_06b PLAN(bf16|mxfp8) MODE
    cat <<YAML
model:
  model_type: qwen3
  vocab_size: 151936
  hidden_size: 1024
  intermediate_size: 3072
  num_hidden_layers: 28
  num_attention_heads: 16
  num_key_value_heads: 8
  head_dim: 128
  max_position_embeddings: 40960
  tie_word_embeddings: true
data:
  data_path: $tmp/data/train_*.bin
  seq_length: 1024
parallel:
  fsdp_plan:
    param_dtype: bf16
$(features "$2")
training:
  micro_batch_size: 1
  lr: 3.0e-4
  train_iters: 1
YAML
    [ "$1" = bf16 ] || cat <<YAML
  quantization_plan:
    recipe_name: mxfp8
    apply_modules: ['model.layers.{*}']
    ignored_modules: ['*lm_head']
YAML
}
echo
echo "Qwen3-0.6B, seq 1024 x micro-batch 1, one rank (\`mxtrain plan\`):"
echo
plans=()
for plan in bf16 mxfp8; do
    for mode in none selective full; do
        qwen3_06b "$plan" "$mode" > "$tmp/q-$plan-$mode.yaml"
        "$bin" plan "$tmp/q-$plan-$mode.yaml" --json > "$tmp/q-$plan-$mode.json" 2>"$tmp/q.err" ||
            { cat "$tmp/q.err" >&2; exit 1; }
        plans+=("$plan|$mode|$tmp/q-$plan-$mode.json")
    done
done
"$py" - "${plans[@]}" <<'PY'
import json, sys
print("| plan | recompute | activations MiB | against none | predicted peak GiB |")
print("|---|---|---|---|---|")
base = {}
for r in sys.argv[1:]:
    plan, mode, path = r.split("|")
    p = json.load(open(path))
    act = p["per_step"]["mem_activation_bytes"]
    base.setdefault(plan, act)
    print(f"| {'the guide' + chr(39) + 's' if plan == 'mxfp8' else plan} | {mode} | {act / 2**20:.0f} | "
          f"{act / base[plan]:.3f} | {p['memory']['predicted_bytes'] / 2**30:.2f} |")
PY
