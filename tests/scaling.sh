#!/bin/bash
# docs/scaling.md's tables are what `mxtrain plan` computes for Qwen3-30B-A3B now
# (scripts/scaling.sh --check), and the plan's per-rank master weights for it equal, on 8
# and 64 ranks, the sharding rule of docs/distributed.md applied here to the shapes of its
# config.json: every tensor's rows in pieces of 32 x ceil(R / 32 F) rows, 4 bytes an element
# (fused experts whose rows per expert are a multiple of 32 as one tensor of E x R rows,
# others expert by expert), which at 64 ranks pads them by under 2%.
. "$(dirname "$0")/common.bash"
# tests/run: the first build only
BUILD="$build" scripts/scaling.sh --check || fail "docs/scaling.md is stale: run scripts/scaling.sh"
for F in 8 64; do
    "$bin" plan examples/qwen3_30b_a3b.yaml --json --ranks "$F" --dp 1 > "$tmp/plan.json" || fail "plan on $F ranks failed"
    "$py" - "$F" "$tmp/plan.json" <<'PY' || fail "plan on $F ranks: master weights per rank differ from the sharding rule"
import json, sys
F, got = int(sys.argv[1]), json.load(open(sys.argv[2]))["per_step"]["mem_master_bytes"]
c = json.load(open("examples/qwen3_30b_a3b/config.json"))
C, L, V, E, FE = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"], c["num_experts"], c["moe_intermediate_size"]
H, KV, D = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
def rows(R): return 32 * -(-R // (32 * F))     # one rank's piece of R rows
def cut(g, r, k): return (1, g * r, k) if g > 1 and r % 32 == 0 else (g, r, k)
t = [(1, V, C), (1, V, C), (1, C, 1)]           # (groups, rows, cols): embed_tokens, lm_head, norm
for _ in range(L):                              # norms, q k v o, q/k norms, norm, router, experts
    t += [(1, C, 1), (1, H * D, C), (1, KV * D, C), (1, KV * D, C), (1, C, H * D), (1, D, 1), (1, D, 1),
          (1, C, 1), (1, E, C), (E, 2 * FE, C), (E, C, FE)]
want = 4 * sum(g * rows(r) * k for g, r, k in map(lambda x: cut(*x), t))
unpadded = 4 * sum(g * r * k for g, r, k in t) / F
print(f"    {F} ranks: {got} bytes of master weights per rank (rule: {want}; unpadded {unpadded:.0f}, x{got / unpadded:.3f})")
sys.exit(0 if got == want and got <= 1.02 * unpadded else 1)
PY
done
