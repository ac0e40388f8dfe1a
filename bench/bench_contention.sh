#!/bin/bash
# Training speed on a shared machine: a 2-thread run of a small dense and a small MoE model
# (--model small, the default), or of the benchmark models of bench_train.sh (--model dense:
# the ~20M Llama of bench/llama20m.sh; --model moe: the ~33M Qwen3-MoE of bench/moe33m.sh),
# quiet and beside a busy process (a spinning loop pinned to core 0), with mxtrain's default
# wait policy (threads sleep when they wait) and with the OpenMP runtime's (spin first,
# OMP_WAIT_POLICY=active). Prints Markdown: median step time of each and the slowdown the
# busy process causes. Goal: within 2.5x of the quiet step with the busy process beside.
# --policies lists the wait policies to run: default (mxtrain's), active, passive
# (OMP_WAIT_POLICY=passive) and spin:N (GOMP_SPINCOUNT=N: spin N rounds, then sleep).
#
#   bench/bench_contention.sh [--steps N] [--model small|dense|moe] [--policies "default active"]
#   (from anywhere after `make -j2`)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="$root/build/mxtrain"
py=/usr/bin/python3
steps=30
models="dense moe"   # --model small: the small pair below
policies="default active"
usage="usage: bench/bench_contention.sh [--steps N] [--model small|dense|moe] [--policies \"default active passive spin:N\"]"
while [ $# -gt 0 ]; do
    case "$1" in
    --steps) steps="${2:?$usage}"; shift 2 ;;
    --policies) policies="${2:?$usage}"; shift 2 ;;
    --model) case "${2:-}" in
             small) models="dense moe" ;;
             dense) models="llama20m" ;;
             moe) models="moe33m" ;;
             *) echo "--model ${2:-}: allowed: small, dense, moe" >&2; exit 2 ;;
             esac; shift 2 ;;
    *) echo "$usage" >&2; exit 2 ;;
    esac
done
for p in $policies; do
    case "$p" in default|active|passive|spin:[0-9]*) ;; *) echo "--policies: unknown policy '$p' (allowed: default, active, passive, spin:N)" >&2; exit 2 ;; esac
done
case "$steps" in ''|*[!0-9]*) echo "--steps $steps: allowed: an integer >= 4" >&2; exit 2 ;; esac
[ "$steps" -ge 4 ] || { echo "--steps $steps: allowed: an integer >= 4 (3 warm-up steps + 1)" >&2; exit 2; }
[ -x "$bin" ] || { echo "$bin is missing: run 'make -j2' in $root first" >&2; exit 1; }
tmp=$(mktemp -d)
hog=""
trap '[ -n "$hog" ] && kill $hog 2>/dev/null; rm -rf "$tmp"' EXIT
cp "$bin" "$tmp/mxtrain" && bin="$tmp/mxtrain"
"$bin" prepare --out "$tmp/data" > /dev/null

model() {   # model dense|moe
    if [ "$1" = dense ]; then
        printf '  model_type: llama\n  hidden_size: 256\n  intermediate_size: 768\n  num_hidden_layers: 4\n'
        printf '  num_attention_heads: 4\n  num_key_value_heads: 4\n'
    else
        printf '  model_type: qwen3_moe\n  hidden_size: 256\n  intermediate_size: 768\n  moe_intermediate_size: 256\n'
        printf '  num_hidden_layers: 4\n  num_attention_heads: 4\n  num_key_value_heads: 2\n  head_dim: 64\n'
        printf '  num_experts: 8\n  num_experts_per_tok: 2\n  norm_topk_prob: true\n'
    fi
}
for m in $models; do
    if [ "$m" = llama20m ] || [ "$m" = moe33m ]; then   # a benchmark model of bench_train.sh
        . "$root/bench/$m.sh"
        { "${m}_yaml" "$tmp/data/train_*.bin" "$steps"
          printf '  log_interval: 1000\n  metrics_path: METRICS\n'; } > "$tmp/$m.yaml"
        continue
    fi
    cat > "$tmp/$m.yaml" <<YAML
model:
$(model $m)
  vocab_size: 257
  max_position_embeddings: 128
  tie_word_embeddings: true
data:
  data_path: $tmp/data/train_*.bin
  seq_length: 128
training:
  micro_batch_size: 8
  seed: 1
  lr: 3.0e-4
  train_iters: $steps
  log_interval: 1000
  metrics_path: METRICS
YAML
done

median() { "$py" -c "
import json, statistics, sys
st = [json.loads(l)['step_s'] for l in open(sys.argv[1])][3:]
print(f'{statistics.median(st):.4f}')" "$1"; }

run() {   # run MODEL POLICY -> median step seconds
    local out="$tmp/$1.$2.jsonl"
    sed "s#METRICS#$out#" "$tmp/$1.yaml" > "$tmp/run.yaml"
    local policy=(-u OMP_WAIT_POLICY -u GOMP_SPINCOUNT)
    case "$2" in
    active|passive) policy+=(OMP_WAIT_POLICY="$2") ;;
    spin:*) policy+=(GOMP_SPINCOUNT="${2#spin:}") ;;
    esac
    env "${policy[@]}" OMP_NUM_THREADS=2 "$bin" train "$tmp/run.yaml" > /dev/null
    median "$out"
}

cpu=$(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)
echo "Machine: $cpu, $(nproc) cores; load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| model | wait policy | quiet step s | beside a busy process | slowdown |"
echo "|---|---|---|---|---|"
for m in $models; do
    for p in $policies; do
        quiet=$(run $m $p)
        taskset -c 0 sh -c 'while :; do :; done' & hog=$!
        busy=$(run $m $p)
        kill $hog; wait $hog 2>/dev/null || true; hog=""
        case $p in
        default) label="mxtrain's" ;;
        spin:*) label="GOMP_SPINCOUNT=${p#spin:}" ;;
        *) label="OMP_WAIT_POLICY=$p" ;;
        esac
        echo "| $m | $label | $quiet | $busy | $("$py" -c "print(f'{$busy / $quiet:.2f}x')") |"
    done
done
