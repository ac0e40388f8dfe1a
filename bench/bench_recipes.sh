#!/bin/bash
# The recipe comparison: the README's main job (the tiny Qwen3-MoE of
# examples/qwen3_moe_mxfp8.yaml, the guide's plan, 2 ranks, Debian's fortunes corpus) trained
# for the same steps on the same data in bf16 and with each recipe, every other setting as
# the example has it. The converters are the recipe family's two (`quantize.linear.F`,
# `quantize.moe.F`), so the experts' grouped GEMMs are quantized too. Per run, from rank 0's
# metrics (training.metrics_path):
#   - the last validation loss and the mean train loss of the last 50 steps, each / bf16's;
#   - the median step time after the warm-up steps / bf16's (bf16 runs first and last, the
#     ratio is against the mean of the two: the machine's speed drifts);
#   - CPU time per step on one rank and one thread / bf16's (steadier than wall time), in
#     rounds that run each recipe right after bf16: the fastest round's, the medians' ratio
#     and the median of the ratios of the pairs (the goal's measure);
#   - the bytes all-gathered per step and rank / bf16's;
#   - rank 0's peak RSS and its predicted peak.
# Goals (issue 24): every recipe within 2% of bf16's loss, its step within 1.15x of bf16's.
# Prints a Markdown table with the CPU model and the load average before each run, and draws
# the loss curves of every run into one PNG with `mxtrain plot`.
#
#   bench/bench_recipes.sh [--steps N] [--rounds N] [--recipes "mxfp8 tensorwise ..."] [--plot FILE]
#
# Run from anywhere after `make -j2`. --steps: optimizer steps per run (default 400, the
# validation loss every 100); --rounds: rounds of the CPU-time runs (default 3); --recipes:
# the recipes after bf16 (default: every alias `mxtrain plan` accepts, listed below); --plot:
# the PNG (default docs/recipes.png). About 6 s a run on 2 quiet Zen 5 cores, and 50 s a
# round of CPU-time runs.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="$root/build/mxtrain"
py=/usr/bin/python3

steps=400
rounds=3
recipes="mxfp8 mxfp8-32x32 tensorwise hif8 blockwise"
plot="$root/docs/recipes.png"
usage="usage: bench/bench_recipes.sh [--steps N] [--rounds N] [--recipes \"mxfp8 tensorwise ...\"] [--plot FILE]"
while [ $# -gt 0 ]; do
    case "$1" in
    --steps) steps="${2:?$usage}"; shift 2 ;;
    --rounds) rounds="${2:?$usage}"; shift 2 ;;
    --recipes) recipes="${2:?$usage}"; shift 2 ;;
    --plot) plot="${2:?$usage}"; shift 2 ;;
    -h|--help) echo "$usage"; exit 0 ;;
    *) echo "$usage" >&2; exit 2 ;;
    esac
done
case "$steps" in ''|*[!0-9]*) echo "--steps takes a positive integer, not '$steps'" >&2; exit 2 ;; esac
[ "$steps" -ge 100 ] || { echo "--steps must be at least 100 (the validation interval), not $steps" >&2; exit 2; }
case "$rounds" in ''|0|*[!0-9]*) echo "--rounds takes a positive integer, not '$rounds'" >&2; exit 2 ;; esac
[ -x "$bin" ] || { echo "$bin is missing: run 'make -j2' in $root first" >&2; exit 1; }
command -v mpirun > /dev/null || { echo "mpirun is missing (OpenMPI: scripts/setup)" >&2; exit 1; }

. "$root/bench/common.sh"
bench_start "$root"
example="$root/examples/qwen3_moe_mxfp8.yaml"
results="$tmp/results.tsv"   # name load jsonl
: > "$results"

family() {   # the converter family of a recipe name
    case "${1,,}" in
    *hif8*) echo hif8 ;;
    mxfp8*|*_mx-*|*_mx_*) echo mx ;;
    *) echo float8 ;;
    esac
}

# The example with the recipe (and its family's converters) in place of mxfp8, or without
# the quantization_plan block for bf16; the run's own metrics file, no checkpoints.
write_config() {   # write_config NAME RECIPE
    local f
    f=$(family "$2")
    "$py" - "$example" "$2" "$f" > "$tmp/$1.yaml" <<'PY'
import sys
src, recipe, fam = sys.argv[1:4]
out, skip = [], False
for line in open(src):
    s = line.strip()
    if s.startswith("quantization_plan:"):
        if recipe == "bf16":
            skip = True
            continue
    elif skip and line.startswith("    "):
        continue
    else:
        skip = False
    if s.startswith(("save:", "save_interval:", "metrics_path:", "plot_path:")):
        continue
    if s.startswith("recipe_name:"):
        line = f"    recipe_name: {recipe}\n"
    if s.startswith("quant_converters:"):
        line = f"    quant_converters: ['quantize.linear.{fam}', 'quantize.moe.{fam}']\n"
    out.append(line)
sys.stdout.write("".join(out))
PY
}

load() { cut -d' ' -f1-3 /proc/loadavg; }
echo "# bench_recipes: $(date -u '+%Y-%m-%d %H:%M UTC'), mxtrain $rev, $cpu, $(nproc) CPUs, $steps steps per run"

# Every name is checked before the first run, so a typo costs no training.
for r in $recipes; do
    write_config check "$r"
    "$bin" plan "$tmp/check.yaml" > "$tmp/check.log" 2>&1 || { echo "--recipes: $(grep -m1 . "$tmp/check.log")" >&2; exit 2; }
done

# bf16 runs first and again last: the machine's speed drifts, and the two bf16 steps show by
# how much (the ratios take their mean)
for r in bf16 $recipes bf16-again; do
    write_config "$r" "${r%-again}"
    l=$(load)
    echo "run: $r, load average $l" >&2
    if ! (cd "$tmp" && mpirun --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS=1 "$bin" train "$tmp/$r.yaml" \
          --data.data_path "$tmp/data/train_*.bin" --data.val_data_path "$tmp/data/val_*.bin" \
          --training.train_iters "$steps" --training.eval_interval 100 --training.log_interval 100 \
          --training.metrics_path "$tmp/$r.jsonl") > "$tmp/run.log" 2>&1; then
        echo "$r failed:" >&2
        tail -20 "$tmp/run.log" >&2
        exit 1
    fi
    printf '%s\t%s\t%s\n' "$r" "$l" "$tmp/$r.jsonl" >> "$results"
done

# CPU time per step, steadier than wall time on a shared machine: one rank, one thread, the
# CPU seconds (user + system) of a 120-step run less those of a 20-step run, over 100; in
# rounds (--rounds), each running every recipe right after a bf16 run, since a VM's speed may
# change between runs: each recipe's fastest round, its median, and the median of its ratios
# to the bf16 run before it (a pair sees the same speed but when a change falls between them)
cputimes="$tmp/cpu.tsv"   # name cpu_s_per_step (one line per run: bf16, a recipe, bf16, ...)
for ((round = 1; round <= rounds; round++)); do
    echo "CPU time, round $round of $rounds, load average $(load)" >&2
    for r in $recipes; do
        for name in bf16 "$r"; do
            "$py" - "$name" "$bin" "$tmp" >> "$cputimes" <<'PY'
import resource, subprocess, sys
name, binary, tmp = sys.argv[1:4]
def cpu(steps):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([binary, "train", f"{tmp}/{name}.yaml", "--data.data_path", f"{tmp}/data/train_*.bin",
                    "--data.val_data_path", f"{tmp}/data/val_*.bin", "--training.train_iters", str(steps),
                    "--training.eval_interval", "1000", "--training.log_interval", "1000",
                    "--training.metrics_path", f"{tmp}/cpu_{name}.jsonl"],
                   cwd=tmp, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
print(f"{name}\t{(cpu(120) - cpu(20)) / 100:.6f}")
PY
        done
    done
done

files=() labels=()
while IFS=$'\t' read -r r _ f; do
    [ "$r" = bf16-again ] && continue   # the same losses as the first bf16 run
    files+=("$f"); labels+=(--label "$r")
done < "$results"
"$bin" plot "${files[@]}" "${labels[@]}" --title "examples/qwen3_moe_mxfp8.yaml, 2 ranks: bf16 and each recipe, $steps steps" \
    --out "$plot" >&2

"$py" - "$results" "$cpu" "$steps" "$cputimes" <<'PY'
import json, statistics, sys
results, cpu, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
cpu_runs, pairs, before = {}, {}, None
for l in open(sys.argv[4]):
    k, v = l.split()
    cpu_runs.setdefault(k, []).append(float(v))
    if k != "bf16":
        pairs.setdefault(k, []).append(float(v) / before)
    before = float(v)
cpu_s = {k: min(v) for k, v in cpu_runs.items()}              # the fastest round
cpu_med = {k: statistics.median(v) for k, v in cpu_runs.items()}
paired = {k: statistics.median(v) for k, v in pairs.items()}   # the median of the ratios to the bf16 run before
paired["bf16"] = 1.0
MiB = 1024 * 1024
rows = []
for line in open(results):
    name, load, path = line.rstrip("\n").split("\t")
    recs = [json.loads(l) for l in open(path)]
    train = [r for r in recs if "loss" in r]
    val = [r for r in recs if "val_loss" in r]
    warm = min(10, len(train) - 1)
    rows.append(dict(name=name, load=load.split()[0], val=val[-1]["val_loss"], vstep=val[-1]["step"],
                     train=statistics.fmean(r["loss"] for r in train[-50:]),
                     step=statistics.median(r["step_s"] for r in train[warm:]),
                     ag=train[-1]["ag_bytes"], rss=max(r["peak_mem_bytes"] for r in train) / MiB,
                     pred=train[-1]["mem_predicted_bytes"] / MiB))
base = dict(rows[0])
again = next(r for r in rows if r["name"] == "bf16-again")
base["step"] = (rows[0]["step"] + again["step"]) / 2   # the drift's middle
print(f"\nMachine: {cpu}\n")
print("| recipe | load avg before | val loss at %d | / bf16 | train loss, last 50 | / bf16 | step ms (median) | / bf16 "
      "| CPU ms/step, 1 rank (fastest) | / bf16 | median / bf16's | paired / bf16 | all-gathered KiB/step | / bf16 "
      "| peak RSS MiB (predicted) |" % base["vstep"])
print("|" + "---|" * 15)
for r in rows:
    c = cpu_s[r["name"].removesuffix("-again")]
    print(f"| {r['name']} | {r['load']} | {r['val']:.4f} | {r['val'] / base['val']:.4f} | {r['train']:.4f} | "
          f"{r['train'] / base['train']:.4f} | {1000 * r['step']:.1f} | {r['step'] / base['step']:.2f} | "
          f"{1000 * c:.1f} | {c / cpu_s['bf16']:.2f} | {cpu_med[r['name'].removesuffix('-again')] / cpu_med['bf16']:.2f} | "
          f"{paired[r['name'].removesuffix('-again')]:.2f} | {r['ag'] / 1024:.1f} | {r['ag'] / base['ag']:.3f} | {r['rss']:.0f} ({r['pred']:.0f}) |")
print(f"\nEach run: {steps} steps on 2 ranks (1 thread each) of examples/qwen3_moe_mxfp8.yaml as written but for the "
      "recipe and its family's two converters; step time is rank 0's, the median after the first 10 steps; bf16 ran "
      "first and again last, and step ratios are against the mean of its two medians. CPU ms/step: one rank, one "
      "thread, the CPU seconds of a 120-step run less a 20-step run's, over 100 (the machine's drift and the other "
      "rank's waits do not enter it), in %d rounds that run each recipe right after a bf16 run: the fastest "
      "round's, the ratio of the medians, and the median of each recipe's ratios to the bf16 run just before it "
      "(paired)." % len(pairs[rows[1]["name"]]))
print("\nGoals: loss within 2% of bf16's (val loss / bf16 <= 1.02), step within 1.15x of bf16's (CPU time per step, "
      "paired):")
for r in rows[1:-1]:
    lv, st = r["val"] / base["val"], paired[r["name"]]
    print(f"- {r['name']}: loss {lv:.4f} ({'met' if lv <= 1.02 else 'not met'}), step {st:.2f}x "
          f"({'met' if st <= 1.15 else 'not met'})")
PY
