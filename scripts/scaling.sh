#!/bin/bash
# The tables of docs/scaling.md, computed by `mxtrain plan` (never by hand): Qwen3-30B-A3B
# (examples/qwen3_30b_a3b.yaml) at 8, 64 and 512 ranks in FSDP, HSDP and EP layouts (EP with
# bf16 and with MXFP8 token dispatch), per-rank memory by category and per-step traffic by kind. Rewrites the part of docs/scaling.md between
# its "scaling.sh: begin" and "scaling.sh: end" lines; with --check, changes nothing and
# fails if that part is not what the plan computes now (tests/scaling.sh runs it so).
#
#   scripts/scaling.sh [--check]        (from anywhere, after `make -j2`)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
bin="${BUILD:-build}/mxtrain"
doc=docs/scaling.md
cfg=examples/qwen3_30b_a3b.yaml
check=false
case "${1:-}" in
    "") ;;
    --check) check=true ;;
    *) echo "usage: scripts/scaling.sh [--check]" >&2; exit 2 ;;
esac
[ -x "$bin" ] || { echo "scripts/scaling.sh: $bin is missing: run 'make -j2' first" >&2; exit 1; }
grep -q '^<!-- scaling.sh: begin' "$doc" && grep -q '^<!-- scaling.sh: end' "$doc" ||
    { echo "scripts/scaling.sh: $doc has no 'scaling.sh: begin/end' lines" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# the plan of a CPU without a native bf16 matmul on every machine (the vocabulary tables' unit
# buffers, the products' workspace depend on it): the tables do not change with the machine
export ONEDNN_MAX_CPU_ISA=AVX2

# The layouts: ranks, replicas (parallel.data_parallel_size: the FSDP group is ranks / it),
# expert parallel size (1: none).
layouts=(
    "8 1 1" "8 2 1" "8 1 8"
    "64 1 1" "64 8 1" "64 8 8" "64 1 8" "64 1 64"
    "512 8 1" "512 64 1" "512 64 8" "512 8 64"
)
i=0
for l in "${layouts[@]}"; do
    read -r ranks dp ep <<<"$l"
    for wire in bf16 mxfp8; do   # the token dispatch's dtype (EP only)
        [ "$ep" -gt 1 ] || [ $wire = bf16 ] || continue
        if [ "$ep" -gt 1 ]; then
            sed "s/^parallel:/parallel:\n  expert_parallel_size: $ep\n  ep_plan:\n    dispatch_dtype: $wire/" "$cfg" > "$tmp/cfg.yaml"
        else
            cp "$cfg" "$tmp/cfg.yaml"
        fi
        "$bin" plan "$tmp/cfg.yaml" --json --ranks "$ranks" --dp "$dp" > "$tmp/$i.$wire.json"
    done
    i=$((i + 1))
done

/usr/bin/python3 - "$tmp" "$i" > "$tmp/tables.md" <<'PY'
import json, os, sys
tmp, n = sys.argv[1], int(sys.argv[2])
runs = [json.load(open(f"{tmp}/{i}.bf16.json")) for i in range(n)]
mx = [json.load(open(f"{tmp}/{i}.mxfp8.json")) if os.path.exists(f"{tmp}/{i}.mxfp8.json") else None for i in range(n)]
GiB = 2.0 ** 30
def g(b): return f"{b / GiB:.2f}"
def layout(r):
    l, ep = r["layout"], r.get("expert_parallel", {}).get("expert_parallel_size", 1)
    return f"{l['ranks']}: {l['data_parallel_size']} x {l['fully_shard_parallel_size']}" + (f", EP {ep}" if ep > 1 else "")
print("Per rank, GiB (activations not included: they depend on the micro-batch, not on the layout):")
print()
print("| ranks: replicas x FSDP group | master weights | gradients | optimizer | MX shards | gather buffers | total |")
print("|---|---|---|---|---|---|---|")
for r in runs:
    p = r["per_step"]
    parts = [p["mem_master_bytes"], p["mem_grad_bytes"], p["mem_optimizer_bytes"], p["mem_mx_shard_bytes"],
             p["mem_gathered_bytes"]]
    print(f"| {layout(r)} | " + " | ".join(g(b) for b in parts) + f" | {g(sum(parts))} |")
print()
print("Weights and gradients per step and rank, GiB (one micro-batch; all-gathers count the whole")
print("gathered tensors, as the FSDP counters do; reduce-scatters and all-reduces in `reduce_dtype` fp32):")
print()
print("| layout | all-gather, bf16 weights | all-gather, MXFP8 on-demand | of which MX codes + scales | reduce-scatter | replica all-reduce |")
print("|---|---|---|---|---|---|")
for r in runs:
    p = r["per_step"]
    bf16 = p["ag_bf16_equiv_bytes"] + p["ag_param_bytes"]
    planes = p["ag_mx_data_bytes"] + p["ag_mx_scale_bytes"]
    print(f"| {layout(r)} | {g(bf16)} | {g(p['ag_bytes'])} | {g(planes)} | {g(p['rs_bytes'])} | {g(p['ar_bytes'])} |")
print()
print("Tokens per step and rank, GiB (micro-batch 1 x 4096 tokens, top-8 of 128 experts: 32768 routed")
print("rows a layer; routing decides the bytes, so the plan gives uniform routing, (EP - 1) / EP of the rows")
print("leaving their rank, and the worst case; dispatch = forward rows to the experts + backward output")
print("gradients, combine = the way back, fp32):")
print()
print("| layout | dispatch, bf16 rows (uniform / worst) | dispatch, MXFP8 rows (uniform / worst) | combine (uniform / worst) |")
print("|---|---|---|---|")
for r, m in zip(runs, mx):
    if not m: continue
    b, q = r["expert_parallel"], m["expert_parallel"]
    print(f"| {layout(r)} | {g(b['dispatch_uniform_bytes'])} / {g(b['dispatch_worst_bytes'])} | "
          f"{g(q['dispatch_uniform_bytes'])} / {g(q['dispatch_worst_bytes'])} | "
          f"{g(b['combine_uniform_bytes'])} / {g(b['combine_worst_bytes'])} |")
PY

{
    sed '/^<!-- scaling.sh: begin/q' "$doc"
    cat "$tmp/tables.md"
    sed -n '/^<!-- scaling.sh: end/,$p' "$doc"
} > "$tmp/doc.md"
if $check; then
    diff -u "$doc" "$tmp/doc.md" >&2 ||
        { echo "scripts/scaling.sh: $doc is not what mxtrain plan computes now: run scripts/scaling.sh" >&2; exit 1; }
else
    cp "$tmp/doc.md" "$doc"
fi
