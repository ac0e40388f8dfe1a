#!/bin/bash
# Sequence length: the ~20M-parameter Llama of bench/bench_train.sh (bench/llama20m.sh:
# byte-level vocabulary 257, Debian's fortunes corpus from `mxtrain prepare`), trained in
# bf16 on one process at the sequence lengths given (default 256 with micro-batch 8, and
# 8192 with micro-batch 1), the same OpenMP threads for each. Measures, from the per-step
# JSON metrics (training.metrics_path) and /usr/bin/time:
#   - tokens/s (tokens of a step / median step time after the warm-up steps), and each
#     length's tokens/s against the first length's;
#   - the activations `train` reports and the process's peak RSS.
# Goals: at 8192 a peak under 3 GiB, and tokens/s >= 0.45x those at 256.
# Attention's memory is linear in T, so before each longer run the peak is predicted from
# the first run's (its peak RSS, with the activations scaled by the tokens of a
# micro-batch), and a run that would not fit in 90% of the available memory is skipped with
# a line saying so (`mxtrain plan` does not predict activations yet). Prints Markdown for
# docs/benchmarks.md with the CPU model and the load average before each run.
#
#   bench/bench_seq.sh [--threads N] [--steps N] [--warmup N] [--rounds N] [--lengths "256:8 8192:1"]
#
# Run from anywhere after `make -j2`. --lengths: SEQ:MICRO_BATCH pairs, the first the
# baseline; --steps: optimizer steps per run (default 10); --warmup: steps left out of the
# median (default 3); --rounds: runs of every length in turn (default 1): each length's
# fastest round is reported, and the ratios of every round (a shared machine's speed
# changes between runs, and each round sees both lengths close together). Takes about 4
# minutes a round on 2 cores.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="$root/build/mxtrain"
py=/usr/bin/python3

threads=$(nproc)
rounds=1
steps=10
warmup=3
lengths="256:8 8192:1"
usage="usage: bench/bench_seq.sh [--threads N] [--steps N] [--warmup N] [--rounds N] [--lengths \"256:8 8192:1\"]"
while [ $# -gt 0 ]; do
    case "$1" in
    --threads) threads="${2:?$usage}"; shift 2 ;;
    --steps) steps="${2:?$usage}"; shift 2 ;;
    --warmup) warmup="${2:?$usage}"; shift 2 ;;
    --rounds) rounds="${2:?$usage}"; shift 2 ;;
    --lengths) lengths="${2:?$usage}"; shift 2 ;;
    -h|--help) echo "$usage"; exit 0 ;;
    *) echo "$usage" >&2; exit 2 ;;
    esac
done
case "$threads$steps$warmup$rounds" in ''|*[!0-9]*) echo "--threads, --steps, --warmup and --rounds take non-negative integers" >&2; exit 2 ;; esac
[ "$rounds" -ge 1 ] || { echo "--rounds must be at least 1" >&2; exit 2; }
[ "$steps" -gt "$warmup" ] || { echo "--steps must exceed --warmup" >&2; exit 2; }
for l in $lengths; do
    case "$l" in [1-9]*:[1-9]*) ;; *) echo "--lengths: '$l' is not SEQ:MICRO_BATCH" >&2; exit 2 ;; esac
done
[ -x "$bin" ] || { echo "$bin is missing: run 'make -j2' in $root first" >&2; exit 1; }
[ -x /usr/bin/time ] || { echo "/usr/bin/time is missing (apt-get install time)" >&2; exit 1; }

. "$root/bench/llama20m.sh"
. "$root/bench/common.sh"
bench_start "$root"
echo "# bench_seq: $(date -u '+%Y-%m-%d %H:%M UTC'), mxtrain $rev, $cpu, $threads threads, $steps steps per run ($warmup warm-up), $rounds round(s)"

avail_kib=$(sed -n 's/^MemAvailable:[[:space:]]*\([0-9]*\) kB/\1/p' /proc/meminfo)
rows=()
for round in $(seq "$rounds"); do
for l in $lengths; do
    T=${l%%:*} B=${l##*:}
    { llama20m_yaml "$tmp/data/train_*.bin" "$steps" | sed "s/max_position_embeddings: .*/max_position_embeddings: $T/"
      echo "  log_interval: 1"
      echo "  metrics_path: $tmp/s$T.$round.jsonl"; } > "$tmp/s$T.yaml"
    if [ ${#rows[@]} -gt 0 ]; then   # the peak predicted from the first run's
        need_mib=$(( (rss0 + (act0 * T * B / tok0 - act0) * 1024) / 1024 ))
        if [ "$need_mib" -gt $((avail_kib / 1024 * 9 / 10)) ]; then
            echo "    seq $T: skipped, predicted peak $need_mib MiB against $((avail_kib / 1024)) MiB available"
            continue
        fi
    fi
    load=$(cut -d' ' -f1-3 /proc/loadavg)
    OMP_NUM_THREADS=$threads /usr/bin/time -f "maxrss_kib %M" "$bin" train "$tmp/s$T.yaml" > "$tmp/s$T.log" 2>&1 ||
        { tail -5 "$tmp/s$T.log" >&2; exit 1; }
    act=$(sed -n 's/.*activations \([0-9.]*\) MiB.*/\1/p' "$tmp/s$T.log" | tail -1)
    rss=$(sed -n 's/^maxrss_kib //p' "$tmp/s$T.log")
    [ ${#rows[@]} -gt 0 ] || { rss0=$rss; act0=${act%.*}; tok0=$((T * B)); }
    rows+=("$round $T $B $load|$act|$rss|$tmp/s$T.$round.jsonl")
done
done
"$py" - "$warmup" "${rows[@]}" <<'PY'
import json, statistics, sys
warmup, rows = int(sys.argv[1]), sys.argv[2:]
runs = {}   # seq -> [(round, B, load, act, rss, step, tokens)]
for r in rows:
    head, act, rss, path = r.split("|")
    rnd, T, B, *load = head.split()
    recs = [json.loads(l) for l in open(path)]
    st = statistics.median(x["step_s"] for x in recs[warmup:])
    runs.setdefault(int(T), []).append((int(rnd), B, " ".join(load), act, int(rss), st, recs[-1]["tokens"]))
print("| seq | micro-batch | load avg before (first round) | step s (fastest round) | tokens/s | tokens/s against the first | the same, each round | activations MiB | peak RSS MiB |")
print("|---|---|---|---|---|---|---|---|---|")
first = None
for T, rs in runs.items():
    tps = {rnd: tok / st for rnd, _, _, _, _, st, tok in rs}
    first = first or tps
    best = max(tps.values())
    per = " ".join(f"{tps[k] / first[k]:.2f}" for k in sorted(tps) if k in first)
    _, B, load, act, _, _, _ = rs[0]
    print(f"| {T} | {B} | {load} | {min(x[5] for x in rs):.3f} | {best:.0f} | {best / max(first.values()):.2f} | {per} | {act} | {max(x[4] for x in rs) / 1024:.0f} |")
PY
