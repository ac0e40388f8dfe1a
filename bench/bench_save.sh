#!/bin/bash
# Checkpoint writes on 2 ranks: every rank writing its own rows into the files
# (training.save_parallel: true, the default) against rank 0 gathering and writing every
# tensor itself (save_parallel: false, the baseline), for the ~20M-parameter Llama of
# bench/bench_train.sh (or the 33M Qwen3-MoE with --model moe). Each run trains 2 steps and
# saves after the last; runs alternate between the two modes. Measures the save's wall time
# (the "saved DIR in S s" line) and each rank's peak resident memory (/usr/bin/time), and
# checks that both modes wrote the same bytes. Prints Markdown for docs/benchmarks.md with
# the CPU model and the load average before each run.
#
#   bench/bench_save.sh [--model dense|moe] [--repeats N]
#
# Run from anywhere after `make -j2`; about a minute with the defaults on 2 cores.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="$root/build/mxtrain"
model=dense
repeats=3
usage="usage: bench/bench_save.sh [--model dense|moe] [--repeats N]"
while [ $# -gt 0 ]; do
    case "$1" in
    --model) model="${2:?$usage}"; shift 2 ;;
    --repeats) repeats="${2:?$usage}"; shift 2 ;;
    -h|--help) echo "$usage"; exit 0 ;;
    *) echo "$usage" >&2; exit 2 ;;
    esac
done
case "$model" in dense|moe) ;; *) echo "--model: '$model' (allowed: dense, moe)" >&2; exit 2 ;; esac
case "$repeats" in ''|*[!0-9]*|0) echo "--repeats takes a positive integer, not '$repeats'" >&2; exit 2 ;; esac
[ -x "$bin" ] || { echo "$bin is missing: run 'make -j2' in $root first" >&2; exit 1; }
command -v mpirun > /dev/null || { echo "mpirun is missing (Open MPI: scripts/setup)" >&2; exit 1; }
[ -x /usr/bin/time ] || { echo "/usr/bin/time is missing (apt-get install time)" >&2; exit 1; }

. "$root/bench/llama20m.sh"
[ "$model" = moe ] && . "$root/bench/moe33m.sh"
. "$root/bench/common.sh"
bench_start "$root"

write_config() {   # write_config MODE
    {
        echo "parallel:"
        echo "  fully_shard_parallel_size: auto"
        if [ "$model" = moe ]; then moe33m_yaml "$tmp/data/train_*.bin" 2; else llama20m_yaml "$tmp/data/train_*.bin" 2; fi
        echo "  save: $tmp/ck-$1"
        echo "  save_parallel: $([ "$1" = ranks ] && echo true || echo false)"
    } > "$tmp/$1.yaml"
}
write_config ranks
write_config rank0

echo "# bench_save: $(date -u '+%Y-%m-%d %H:%M UTC'), mxtrain $rev, $cpu, $(nproc) CPUs, model $model, $repeats runs per mode"
echo
echo "| mode | run | load before | save s | rank 0 peak RSS MiB | rank 1 peak RSS MiB |"
echo "|---|---|---|---|---|---|"
for r in $(seq "$repeats"); do
    for mode in ranks rank0; do
        rm -rf "$tmp/ck-$mode"
        l=$(cut -d' ' -f1-3 /proc/loadavg)
        # each rank under its own /usr/bin/time, its report named by the rank
        mpirun --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS=1 -x OMP_WAIT_POLICY=passive \
            sh -c 'exec /usr/bin/time -f %M -o "$0.$OMPI_COMM_WORLD_RANK" "$@"' "$tmp/rss" "$bin" train "$tmp/$mode.yaml" \
            > "$tmp/$mode.log" 2>&1 || { tail -20 "$tmp/$mode.log" >&2; exit 1; }
        s=$(sed -n 's/^saved .* in \([0-9.]*\) s$/\1/p' "$tmp/$mode.log" | tail -1)
        r0=$(tail -1 "$tmp/rss.0") r1=$(tail -1 "$tmp/rss.1")
        echo "| $([ $mode = ranks ] && echo 'every rank its rows' || echo 'rank 0 writes alone') | $r | $l | $s | $((r0 / 1024)) | $((r1 / 1024)) |"
    done
done
for f in model optimizer; do
    cmp -s "$tmp/ck-ranks/iter_0000002/$f.safetensors" "$tmp/ck-rank0/iter_0000002/$f.safetensors" ||
        { echo "the two modes wrote different $f.safetensors" >&2; exit 1; }
done
echo
echo "Both modes wrote the same bytes ($(du -sh "$tmp/ck-ranks/iter_0000002" | cut -f1) per checkpoint)."
