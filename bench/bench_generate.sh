#!/bin/bash
# Generation: `mxtrain generate` against a plain PyTorch decoding with a KV cache of the same
# weights (tests/py/generate_ref.py, fp32, the decode loop transformers' generate runs without
# its extras), on the same cores (OMP_NUM_THREADS and torch.set_num_threads both N, 1 and
# --threads) and the same OpenMP policy (the one mxtrain chooses for itself, docs/training.md#
# threads, exported for both: PyTorch's libgomp spinning at its default ran the MoE 13x slower
# on 2 shared cores than with it): greedy,
# one prompt, the same tokens (the texts are checked equal), tokens/s of the decoding steps
# after the first new token. Models: the ~20M-parameter Llama of bench/llama20m.sh and the
# README main job's tiny Qwen3-MoE (examples/qwen3_moe_mxfp8.yaml's model), both trained one
# step on the fortunes corpus (the weights' values do not change the speed). The best of
# --reps runs each. Goal: >= 2x PyTorch's tokens/s. Prints Markdown for docs/benchmarks.md
# with the CPU model and the load average.
#
#   bench/bench_generate.sh [--threads N] [--tokens N] [--reps N]
#
# Run from anywhere after `make -j2`; takes about 3 minutes on 2 cores.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="$root/build/mxtrain"
py=/usr/bin/python3
. "$root/bench/common.sh"
. "$root/bench/llama20m.sh"

threads=$(nproc)
tokens=200
reps=3
usage="usage: bench/bench_generate.sh [--threads N] [--tokens N] [--reps N]"
while [ $# -gt 0 ]; do
    case "$1" in
    --threads) threads="${2:?$usage}"; shift 2 ;;
    --tokens) tokens="${2:?$usage}"; shift 2 ;;
    --reps) reps="${2:?$usage}"; shift 2 ;;
    -h|--help) echo "$usage"; exit 0 ;;
    *) echo "$usage" >&2; exit 2 ;;
    esac
done
bench_start "$root"
export GOMP_SPINCOUNT=10000 KMP_BLOCKTIME=0

{ llama20m_yaml "$tmp/data/train_*.bin" 1; printf '  save: %s\n' "$tmp/llama20m"; } > "$tmp/llama20m.yaml"
sed -e "s|data/fortunes/|$tmp/data/|" -e 's/train_iters: 1000/train_iters: 1/' -e "s|checkpoints/qwen3_moe_mxfp8|$tmp/moe|" \
    -e '/^  val_data_path/d' -e '/^  eval_/d' -e '/^  plot_path/d' -e 's/save_interval: 500/save_interval: 0/' \
    "$root/examples/qwen3_moe_mxfp8.yaml" > "$tmp/moe.yaml"

rate() { sed -n 's/.* \([0-9.]*\) tokens\/s.*/\1/p' "$1" | tail -1; }
best() { printf '%s\n' "$@" | sort -g | tail -1; }

echo "### bench_generate.sh"
echo
echo "CPU: $cpu; revision $rev; greedy, prompt \"The\", $tokens new tokens; best of $reps runs;"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| model | parameters | threads | mxtrain tokens/s | PyTorch tokens/s | mxtrain / PyTorch |"
echo "|---|---|---|---|---|---|"
for m in llama20m moe; do
    "$bin" train "$tmp/$m.yaml" --parallel.fsdp_plan.param_dtype fp32 --training.sample_tokens 0 > "$tmp/$m.train" 2>&1 ||
        { tail -3 "$tmp/$m.train" >&2; exit 1; }
    ck=$(ls -d "$tmp/$m"/iter_* | tail -1)
    for n in $(printf '%s\n' 1 "$threads" | sort -nu); do
        export OMP_NUM_THREADS=$n
        if [ "$n" = "$(nproc)" ]; then export OMP_PROC_BIND=true OMP_PLACES=threads; else unset OMP_PROC_BIND OMP_PLACES; fi
        ours=() theirs=()
        for r in $(seq "$reps"); do
            "$bin" generate "$ck" --prompt The --max-new-tokens "$tokens" > "$tmp/c.txt" 2> "$tmp/c.err"
            "$py" "$root/tests/py/generate_ref.py" "$ck" "$tokens" The > "$tmp/t.txt" 2> "$tmp/t.err"
            cmp -s "$tmp/c.txt" "$tmp/t.txt" || { echo "$m: the texts differ" >&2; exit 1; }
            ours+=("$(rate "$tmp/c.err")") theirs+=("$(rate "$tmp/t.err")")
        done
        len=$(wc -c < "$tmp/c.txt")
        a=$(best "${ours[@]}") b=$(best "${theirs[@]}")
        params=$(sed -n 's/.*, \([0-9]*\) parameters.*/\1/p' "$tmp/c.err")
        echo "| $m ($((len - 1)) tokens) | $params | $n | $a | $b | $(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.2fx", a / b }') |"
    done
done
