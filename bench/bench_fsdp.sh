#!/bin/bash
# FSDP over MPI: the ~20M-parameter Llama of bench/bench_train.sh (sequence 256, micro-batch
# 8, byte-level vocabulary 257, Debian's fortunes corpus from `mxtrain prepare`) trained with
# the MXFP8 plan of examples/qwen3_moe_mxfp8.yaml under three all-gather settings of the
# converted weights:
#   - bf16     enable_fsdp_low_precision_all_gather: false (weights gathered in param_dtype);
#   - on-demand  MXFP8 planes gathered, only the plane each pass needs;
#   - all      MXFP8 planes gathered, both planes at once;
# each on N=1 rank (one process, OMP_NUM_THREADS=2, gradient_accumulation_steps 2) and on
# N=2 ranks (mpirun -np 2, OMP_NUM_THREADS=1 and OMP_WAIT_POLICY=passive per rank,
# accumulation 1), so the global batch (16 sequences, 4096 tokens) and the cores used are
# the same. Measures, from the per-step JSON metrics of rank 0 (training.metrics_path):
#   - tokens/s (global tokens / median step time after the warm-up steps) and N=2 / N=1;
#   - per-rank state memory (master weights + gradients + AdamW state) and N=2 / N=1;
#   - per-rank MX weight shards, gather buffers and activations; peak RSS of rank 0;
#   - all-gather bytes per step and rank by kind (weights in param_dtype, MX codes, MX
#     scales), what bf16 would have gathered for the converted weights, reduce-scatter
#     bytes, and the share of step time spent waiting in collectives.
# Goals: per-rank state memory at N=2 <= 0.55x of N=1; N=2 tokens/s >= 0.85x of N=1.
# Prints Markdown for docs/benchmarks.md with the CPU model and the load average before
# each run. Other work on the machine moves step times by tens of percent: look at the load
# and "CPU got" columns before reading the ratios.
#
#   bench/bench_fsdp.sh [--steps N] [--warmup N] [--settings "bf16 on-demand all"]
#
# Run from anywhere after `make -j2`. --steps: optimizer steps per run (default 8);
# --warmup: leading steps left out of the median (default 2); --settings: which gather
# settings to run. Takes about 12 minutes with the defaults on 2 cores.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="$root/build/mxtrain"
py=/usr/bin/python3

steps=8
warmup=2
settings="bf16 on-demand all"
usage="usage: bench/bench_fsdp.sh [--steps N] [--warmup N] [--settings \"bf16 on-demand all\"]"
while [ $# -gt 0 ]; do
    case "$1" in
    --steps) steps="${2:?$usage}"; shift 2 ;;
    --warmup) warmup="${2:?$usage}"; shift 2 ;;
    --settings) settings="${2:?$usage}"; shift 2 ;;
    -h|--help) echo "$usage"; exit 0 ;;
    *) echo "$usage" >&2; exit 2 ;;
    esac
done
case "$steps$warmup" in ''|*[!0-9]*) echo "--steps and --warmup take non-negative integers" >&2; exit 2 ;; esac
[ "$steps" -gt "$warmup" ] || { echo "--steps must exceed --warmup" >&2; exit 2; }
for s in $settings; do
    case "$s" in bf16|on-demand|all) ;; *) echo "--settings: unknown setting '$s' (bf16, on-demand, all)" >&2; exit 2 ;; esac
done
[ -x "$bin" ] || { echo "$bin is missing: run 'make -j2' in $root first" >&2; exit 1; }
command -v mpirun > /dev/null || { echo "mpirun is missing (OpenMPI: scripts/setup)" >&2; exit 1; }
[ -x /usr/bin/time ] || { echo "/usr/bin/time is missing (apt-get install time)" >&2; exit 1; }

# The model: ~20M parameters (sizes and config sections shared with the other benchmark)
. "$root/bench/llama20m.sh"
GLOBAL_SEQS=16   # global batch in sequences: B x ranks x accumulation

. "$root/bench/common.sh"
bench_start "$root"
results="$tmp/results.tsv"   # setting ranks threads accum load jsonl cpu_percent
: > "$results"

load() { cut -d' ' -f1-3 /proc/loadavg; }
echo "# bench_fsdp: $(date -u '+%Y-%m-%d %H:%M UTC'), mxtrain $rev, $cpu, $(nproc) CPUs, $(mpirun --version 2>&1 | head -1), $steps steps per run ($warmup warm-up)"

write_config() {   # write_config NAME SETTING ACCUMULATION
    local lp=True mode=on-demand
    case "$2" in bf16) lp=False ;; all) mode=all ;; esac
    cat > "$tmp/$1.yaml" <<YAML
parallel:
  fully_shard_parallel_size: auto
  fsdp_plan:
    param_dtype: bf16
    reduce_dtype: fp32
    reshard_after_forward: true
$(llama20m_yaml "$tmp/data/train_*.bin" "$steps")
  gradient_accumulation_steps: $3
  log_interval: 1
  metrics_path: $tmp/$1.jsonl
  quantization_plan:
    recipe_name: mxfp8
    apply_modules: ['model.layers.{*}']
    ignored_modules: ['*lm_head', '*gate']
    quant_converters: ['quantize.linear.mx']
    enable_fsdp_low_precision_all_gather: $lp
    fsdp_low_precision_all_gather_mode: '$mode'
YAML
}

run() {   # run SETTING RANKS
    local s="$1" n="$2" t accum name l log="$tmp/run.log"
    t=$((2 / n)); [ "$t" -ge 1 ] || t=1
    accum=$((GLOBAL_SEQS / (B * n)))
    name="$s.$n"
    write_config "$name" "$s" "$accum"
    l=$(load)
    echo "run: $s, N=$n ($t thread(s) per rank, accumulation $accum), load average $l" >&2
    local cmd=(env OMP_NUM_THREADS="$t" "$bin" train "$tmp/$name.yaml")
    if [ "$n" -gt 1 ]; then
        cmd=(mpirun --allow-run-as-root --oversubscribe -np "$n" -x OMP_NUM_THREADS="$t" -x OMP_WAIT_POLICY=passive
             "$bin" train "$tmp/$name.yaml")
    fi
    if ! /usr/bin/time -v -o "$tmp/time.txt" "${cmd[@]}" > "$log" 2>&1; then
        echo "$s N=$n failed:" >&2
        tail -20 "$log" >&2
        exit 1
    fi
    grep -E '^(communication|converted weights|memory per rank|done:)' "$log" | sed 's/^/    /' >&2 || true
    local cpu_pct
    cpu_pct=$(sed -n 's/.*Percent of CPU this job got: //p' "$tmp/time.txt")
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$s" "$n" "$t" "$accum" "$l" "$tmp/$name.jsonl" "$cpu_pct" >> "$results"
    "$py" - "$tmp/$name.jsonl" "$warmup" "$cpu_pct" >&2 <<'PY'
import json, statistics, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
st = [r["step_s"] for r in recs[int(sys.argv[2]):]]
cs = [r["comm_s"] for r in recs[int(sys.argv[2]):]]
every = " ".join(f"{r['step_s']:.2f}" for r in recs)
print(f"    median step {statistics.median(st):.3f} s over {len(st)} timed steps (all: {every}); "
      f"comm_s: {' '.join(f'{x:.3f}' for x in cs)}; CPU {sys.argv[3]}")
PY
}

for s in $settings; do
    for n in 1 2; do
        run "$s" "$n"
    done
done

"$py" - "$results" "$warmup" "$cpu" "$steps" <<'PY'
import json, statistics, sys
results, warm, cpu, steps = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
MiB = 1024 * 1024
rows = {}
for line in open(results):
    s, n, t, accum, load, path, cpu_pct = line.rstrip("\n").split("\t")
    recs = [json.loads(l) for l in open(path)]
    timed = recs[warm:]
    st = [r["step_s"] for r in timed]
    med = statistics.median(st)
    last = recs[-1]
    rows[(s, int(n))] = dict(
        threads=int(t), accum=int(accum), load=load.split()[0], cpu=cpu_pct, timed=len(st), med=med,
        tps=last["tokens"] / med, tokens=last["tokens"],
        state=(last["mem_master_bytes"] + last["mem_grad_bytes"] + last["mem_optimizer_bytes"]) / MiB,
        mx=last["mem_mx_shard_bytes"] / MiB, gath=last["mem_gathered_bytes"] / MiB,
        act=last["mem_activation_bytes"] / MiB, rss=max(r["peak_mem_bytes"] for r in recs) / MiB,
        agp=last["ag_param_bytes"] / MiB, agd=last["ag_mx_data_bytes"] / MiB, ags=last["ag_mx_scale_bytes"] / MiB,
        ag=last["ag_bytes"] / MiB, agbf=last["ag_bf16_equiv_bytes"] / MiB, rs=last["rs_bytes"] / MiB,
        comm=100 * sum(r["comm_s"] for r in timed) / sum(st),
        loss=f"{recs[0]['loss']:.3f} -> {last['loss']:.3f}")
print(f"\nMachine: {cpu}\n")
print("| setting | N | threads x ranks | accum | load avg before | CPU got | step s (median) | tokens/s | N=2 / N=1 | "
      "state MiB (master+grads+optimizer) | N=2 / N=1 | MX shards MiB | gather buffers MiB | activations MiB | peak RSS MiB | "
      "all-gather MiB/step: param_dtype / MX codes / MX scales = total | bf16 would gather (converted) | reduce-scatter MiB/step | comm share | loss first -> last |")
print("|" + "---|" * 20)
names = {"bf16": "bf16 gather", "on-demand": "MXFP8 on-demand", "all": "MXFP8 all"}
for (s, n), r in rows.items():
    one = rows.get((s, 1))
    tr = f"{r['tps'] / one['tps']:.2f}" if n > 1 and one else "-"
    mr = f"{r['state'] / one['state']:.3f}" if n > 1 and one else "-"
    bf = f"{r['agbf']:.2f}" if s != "bf16" else "-"   # no MX gathers: nothing to compare
    print(f"| {names[s]} | {n} | {r['threads']} x {n} | {r['accum']} | {r['load']} | {r['cpu']} | {r['med']:.2f} | {r['tps']:.0f} | {tr} | "
          f"{r['state']:.1f} | {mr} | {r['mx']:.1f} | {r['gath']:.1f} | {r['act']:.1f} | {r['rss']:.0f} | "
          f"{r['agp']:.2f} / {r['agd']:.2f} / {r['ags']:.2f} = {r['ag']:.2f} | {bf} | {r['rs']:.2f} | {r['comm']:.1f} % | {r['loss']} |")
print(f"\nEvery run: {steps} optimizer steps of {next(iter(rows.values()))['tokens']} tokens (global batch of 16 sequences of 256), "
      f"the first {warm} left out of the median. Memory and bytes are per rank, from rank 0's metrics; peak RSS is rank 0's "
      "maximum resident set. With N=1 the all-gather and reduce-scatter are local copies but are counted the same way. "
      "comm share: time waiting in collectives / step time, over the timed steps. CPU got: /usr/bin/time's share of a core for "
      "the whole run (all ranks), 200% = both cores.")
print("\nGoals:")
for s in names:
    one, two = rows.get((s, 1)), rows.get((s, 2))
    if not (one and two):
        continue
    mr, tr = two["state"] / one["state"], two["tps"] / one["tps"]
    print(f"- {names[s]}: state memory N=2 / N=1 = {mr:.3f} (goal <= 0.55: {'met' if mr <= 0.55 else 'not met'}); "
          f"tokens/s N=2 / N=1 = {tr:.2f} (goal >= 0.85: {'met' if tr >= 0.85 else 'not met'})")
PY
