#!/bin/bash
# The tables of docs/scaling.md, computed by `mxtrain plan` (never by hand): Qwen3-30B-A3B
# (examples/qwen3_30b_a3b.yaml) at 8, 64 and 512 ranks in several layouts, per-rank memory
# by category and per-step traffic by kind. Rewrites the part of docs/scaling.md between
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

# The layouts: ranks, then the arguments of `mxtrain plan` that choose the layout.
layouts=(
    "8|--dp 1"
    "8|--dp 2"
    "64|--dp 1"
    "64|--dp 8"
    "512|--dp 8"
    "512|--dp 64"
)
i=0
for l in "${layouts[@]}"; do
    ranks=${l%%|*} args=${l#*|}
    # shellcheck disable=SC2086  # the layout's arguments are words
    "$bin" plan "$cfg" --json --ranks "$ranks" $args > "$tmp/$i.json"
    i=$((i + 1))
done

/usr/bin/python3 - "$tmp" "$i" > "$tmp/tables.md" <<'PY'
import json, sys
tmp, n = sys.argv[1], int(sys.argv[2])
runs = [json.load(open(f"{tmp}/{i}.json")) for i in range(n)]
GiB = 2.0 ** 30
def g(b): return f"{b / GiB:.2f}"
def layout(r):
    l = r["layout"]
    s = f"{l['ranks']} ranks: {l['data_parallel_size']} x {l['fully_shard_parallel_size']}"
    return s
print("Per rank, GiB (activations not included: they depend on the micro-batch, not on the layout):")
print()
print("| layout (replicas x FSDP group) | master weights | gradients | optimizer | MX shards | gather buffers | total |")
print("|---|---|---|---|---|---|---|")
for r in runs:
    p = r["per_step"]
    parts = [p["mem_master_bytes"], p["mem_grad_bytes"], p["mem_optimizer_bytes"], p["mem_mx_shard_bytes"],
             p["mem_gathered_bytes"]]
    print(f"| {layout(r)} | " + " | ".join(g(b) for b in parts) + f" | {g(sum(parts))} |")
print()
print("Per step and rank, GiB (one micro-batch; all-gathers count the whole gathered tensors, as the")
print("FSDP counters do; reduce-scatters and all-reduces in `reduce_dtype` fp32):")
print()
print("| layout | all-gather, bf16 weights | all-gather, MXFP8 on-demand | of which MX codes + scales | reduce-scatter | replica all-reduce |")
print("|---|---|---|---|---|---|")
for r in runs:
    p = r["per_step"]
    bf16 = p["ag_bf16_equiv_bytes"] + p["ag_param_bytes"]
    mx = p["ag_mx_data_bytes"] + p["ag_mx_scale_bytes"]
    print(f"| {layout(r)} | {g(bf16)} | {g(p['ag_bytes'])} | {g(mx)} | {g(p['rs_bytes'])} | {g(p['ar_bytes'])} |")
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
