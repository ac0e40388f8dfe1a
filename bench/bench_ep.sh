#!/bin/bash
# Expert parallelism's exchanges beside compute: the ~33M Qwen3-MoE of bench/moe33m.sh
# (16 experts, top-2, every layer MoE) on 2 ranks with expert_parallel_size 2 (each rank 8
# experts, 1 thread, OMP_WAIT_POLICY=passive), trained with `parallel.ep_plan.overlap: true`
# (the default: the router's and the experts' weight gradients computed while the
# backward's all-to-alls are in flight, the saved MX planes while the forward combine is)
# against `false` (every exchange waited for where it starts, the baseline), in bf16 and
# with the MXFP8 plan on every linear layer and the experts. Runs alternate between the two
# settings. Measures, from rank 0's per-step metrics: the median step time after the
# warm-up and the median time spent waiting in collectives (comm_s), and checks that both
# settings gave the same losses bit for bit. Prints Markdown for docs/benchmarks.md with
# the CPU model and the load average before each run.
#
# --hosts RATE runs the two ranks on two hosts instead: network namespaces on this machine
# (scripts/netns-hosts.bash, as tests/hosts.sh makes them; needs root), MPI's traffic over
# TCP on a data link whose sending side an htb class holds to RATE (tc's units: 2gbit,
# 500mbit), so that the exchanges take the time a link of that speed takes.
#
#   bench/bench_ep.sh [--steps N] [--warmup N] [--repeats N] [--precision "bf16 mxfp8"] [--hosts RATE]
#
# Run from anywhere after `make -j2`; about 4 minutes with the defaults on 2 cores (about
# twice that with --hosts 2gbit).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="$root/build/mxtrain"
py=/usr/bin/python3
steps=8
warmup=2
repeats=2
precisions="bf16 mxfp8"
rate=""
usage="usage: bench/bench_ep.sh [--steps N] [--warmup N] [--repeats N] [--precision \"bf16 mxfp8\"] [--hosts RATE]"
while [ $# -gt 0 ]; do
    case "$1" in
    --steps) steps="${2:?$usage}"; shift 2 ;;
    --warmup) warmup="${2:?$usage}"; shift 2 ;;
    --repeats) repeats="${2:?$usage}"; shift 2 ;;
    --precision) precisions="${2:?$usage}"; shift 2 ;;
    --hosts) rate="${2:?$usage}"; shift 2 ;;
    -h|--help) echo "$usage"; exit 0 ;;
    *) echo "$usage" >&2; exit 2 ;;
    esac
done
case "$steps$warmup" in ''|*[!0-9]*) echo "--steps and --warmup take non-negative integers" >&2; exit 2 ;; esac
case "$repeats" in ''|*[!0-9]*|0) echo "--repeats takes a positive integer, not '$repeats'" >&2; exit 2 ;; esac
[ "$steps" -gt "$warmup" ] || { echo "--steps must exceed --warmup" >&2; exit 2; }
for p in $precisions; do
    case "$p" in bf16|mxfp8) ;; *) echo "--precision: '$p' is not allowed (allowed: bf16, mxfp8)" >&2; exit 2 ;; esac
done
[[ -z "$rate" || "$rate" =~ ^[1-9][0-9]*[kmg]?bit$ ]] ||
    { echo "--hosts: '$rate' is not a rate (allowed: a positive number with kbit, mbit or gbit, as in 2gbit)" >&2; exit 2; }
[ -x "$bin" ] || { echo "$bin is missing: run 'make -j2' in $root first" >&2; exit 1; }
command -v mpirun > /dev/null || { echo "mpirun is missing (Open MPI: scripts/setup)" >&2; exit 1; }

. "$root/bench/moe33m.sh"
. "$root/bench/common.sh"
bench_start "$root"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive ASAN_OPTIONS=""
where="shared memory"
if [ -n "$rate" ]; then
    fail() { echo "bench_ep: $*" >&2; exit 1; }
    mpi_impl=openmpi
    . "$root/scripts/netns-hosts.bash"
    trap 'netns_hosts_down; rm -rf "$tmp"' EXIT
    netns_hosts_up > /dev/null
    for ns in $ha $hb; do   # each host's sending side of the data link held to the rate
        ip netns exec $ns tc qdisc add dev $nic root handle 1: htb default 10 &&
            ip netns exec $ns tc class add dev $nic parent 1: classid 1:10 htb rate $rate ceil $rate burst 256k \
                cburst 256k 2>/dev/null || fail "tc could not hold the data link of $ns to $rate"
    done
    where="two namespace hosts, TCP over a data link held to $rate (htb)"
fi
echo "# bench_ep: $(date -u '+%Y-%m-%d %H:%M UTC'), mxtrain $rev, $cpu, $(nproc --all) CPUs, $(mpirun --version 2>&1 | head -1), 2 ranks x 1 thread on $where, EP 2, $steps steps per run ($warmup warm-up), $repeats runs per setting"

write_config() {   # write_config NAME PRECISION OVERLAP
    local plan=""
    [ "$2" = mxfp8 ] && plan="  quantization_plan:
    recipe_name: mxfp8
    apply_modules: ['model.layers.{*}']
    ignored_modules: ['*gate']
    quant_converters: ['quantize.linear.mx', 'quantize.moe.mx']"
    cat > "$tmp/$1.yaml" <<YAML
parallel:
  expert_parallel_size: 2
  ep_plan:
    overlap: $3
  fsdp_plan:
    param_dtype: bf16
    reduce_dtype: fp32
$(moe33m_yaml "$tmp/data/train_*.bin" "$steps")
  log_interval: 1
  metrics_path: $tmp/$1.jsonl
$plan
YAML
}

echo
echo "| precision | ep_plan.overlap | run | load before | median step s | median comm_s | tokens/s (2 ranks) |"
echo "|---|---|---|---|---|---|---|"
for p in $precisions; do
    for r in $(seq "$repeats"); do
        for o in true false; do
            name="$p.$o.$r"
            write_config "$name" "$p" "$o"
            l=$(cut -d' ' -f1-3 /proc/loadavg)
            if [ -n "$rate" ]; then
                ACROSS_TIMEOUT=900 across "$bin" train "$tmp/$name.yaml" > "$tmp/$name.log" 2>&1
            else
                mpirun --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS -x OMP_WAIT_POLICY \
                    "$bin" train "$tmp/$name.yaml" > "$tmp/$name.log" 2>&1
            fi || { tail -20 "$tmp/$name.log" >&2; echo "$name failed" >&2; exit 1; }
            "$py" - "$tmp/$name.jsonl" "$warmup" "$p" "$o" "$r" "$l" "$((2 * B * T))" <<'PY'
import json, statistics, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
w = int(sys.argv[2])
st = statistics.median(r["step_s"] for r in recs[w:])
cs = statistics.median(r["comm_s"] for r in recs[w:])
print(f"| {sys.argv[3]} | {sys.argv[4]} | {sys.argv[5]} | {sys.argv[6]} | {st:.3f} | {cs:.3f} | {int(sys.argv[7]) / st:.0f} |")
PY
        done
        "$py" - "$tmp/$p.true.$r.jsonl" "$tmp/$p.false.$r.jsonl" <<'PY' || { echo "$p run $r: overlap changed the losses" >&2; exit 1; }
import json, sys
a, b = ([(r["loss"], r["grad_norm"]) for r in map(json.loads, open(p)) if "loss" in r] for p in sys.argv[1:3])
assert a == b and a, (a, b)
PY
    done
done
echo
echo "Both settings gave the same losses and gradient norms, bit for bit, in every pair of runs."
