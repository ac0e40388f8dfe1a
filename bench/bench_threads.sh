#!/bin/bash
# GEMM and attention thread scaling on this CPU (bench/bench_gemm_threads.c: the 20.7M
# Llama's shapes, 1 and 2 threads) under three OpenMP settings, timed in the same run:
# sleeping waits with threads left to the scheduler (OMP_WAIT_POLICY=passive,
# OMP_PROC_BIND=false), sleeping waits with one thread bound to each CPU (what `mxtrain`
# chooses when it uses every CPU alone: docs/training.md#threads), and spinning waits
# (OMP_WAIT_POLICY=active). Prints Markdown for docs/benchmarks.md.
#
#   bench/bench_threads.sh [--reps N]      (run from anywhere after `make -j2`)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="$root/build/bench/bench_gemm_threads"
[ -x "$bin" ] || { echo "$bin is missing: run 'make -j2' in $root first" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
settings=("OMP_WAIT_POLICY=passive OMP_PROC_BIND=false"
          "OMP_WAIT_POLICY=passive OMP_PROC_BIND=true OMP_PLACES=threads"
          "OMP_WAIT_POLICY=active OMP_PROC_BIND=false")
echo "Machine: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1), $(nproc) CPUs; load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
for i in 0 1 2; do
    env -u OMP_PLACES ${settings[$i]} "$bin" "$@" > "$tmp/$i.tsv"
done
/usr/bin/python3 - "$tmp" <<'PY'
import sys
d = sys.argv[1]
runs = [[l.rstrip("\n").split("\t") for l in open(f"{d}/{i}.tsv")] for i in range(3)]
print("\nms per call, best of the reps; speedup = 1 thread / 2 threads (each setting's own 1-thread time)\n")
print("| case | calls/step | 1 thread | 2 threads, passive, unbound | 2 threads, passive, bound | 2 threads, active |")
print("|---|---|---|---|---|---|")
tot = [0.0] * 4
for rows in zip(*runs):
    name, per = rows[0][0], int(rows[0][3])
    bf16_row = "bf16 operands" in name   # the attention of a bf16 step instead of the fp32 row: not summed
    one = float(rows[1][1])
    cells = []
    for j, r in enumerate(rows):
        t1, t2 = float(r[1]), float(r[2])
        cells.append(f"{t2:.2f} ({t1 / t2:.2f}x)")
        tot[j + 1] += t2 * per * (not bf16_row)
    tot[0] += one * per * (not bf16_row)
    print(f"| {name} | {per} | {one:.2f} | " + " | ".join(cells) + " |")
print(f"| **per step** (fp32 attention) | | {tot[0]:.0f} | {tot[1]:.0f} | {tot[2]:.0f} | {tot[3]:.0f} |")
PY
