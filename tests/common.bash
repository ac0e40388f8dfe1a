# Sourced by the shell tests that run `mxtrain`: the build under test ($BUILD, default
# build) and its binary as an absolute path, Debian's Python (the one with torch; $pyrun for
# a script file), a scratch
# directory removed on exit, and fail, which prints its message indented and fails the test.
set -u
build="${BUILD:-build}"
bin="$(cd "$build" && pwd)/mxtrain"
py=/usr/bin/python3
# a Python script (not stdin) that imports PyTorch: through tests/run's fork server when there is one
pyrun="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/py/run"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "    $*"; exit 1; }

# MPI, for the tests that launch ranks: the build's binary links either Open MPI or MPICH
# (make MPI=mpich), whose launchers differ. mpi_run [LAUNCHER ARGS] PROGRAM ARGS runs the
# matching one with what every test needs: as root, ranks beyond the cores, and
# OMP_NUM_THREADS, OMP_WAIT_POLICY and ASAN_OPTIONS passed to every rank (Hydra passes the
# whole environment by default; Open MPI only what -x names and its own OMPI_* variables).
# mpi_rank_of PID prints the MPI rank of a launched process, from its environment.
mpi_impl=openmpi
if ldd "$bin" 2>/dev/null | grep -q 'libmpich\.so'; then mpi_impl=mpich; fi
mpi_run() {
    if [ "$mpi_impl" = mpich ]; then
        mpiexec.mpich "$@"
    else
        mpirun --allow-run-as-root --oversubscribe -x OMP_NUM_THREADS -x OMP_WAIT_POLICY -x ASAN_OPTIONS "$@"
    fi
}
mpi_rank_of() {
    tr '\0' '\n' < "/proc/$1/environ" 2>/dev/null | sed -n 's/^\(OMPI_COMM_WORLD_RANK\|PMI_RANK\)=//p' | head -1
}

# write_tokens FILE N MULT [JITTER]: an llm.c token shard (version 1) of N tokens over a
# vocabulary of 61, token i = (i x MULT mod 61, + (i / 97) mod 3 when JITTER is 1) mod 61.
write_tokens() {
    "$py" - "$@" <<'PY'
import sys, numpy as np
path, n, mult = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
i = np.arange(n)
toks = ((i * mult % 61 + (i // 97 % 3 if sys.argv[4:] == ["1"] else 0)) % 61).astype("<u2")
head = np.zeros(256, dtype="<i4"); head[:3] = (20240520, 1, len(toks))
with open(path, "wb") as f: f.write(head.tobytes()); f.write(toks.tobytes())
PY
}
# The model: section of the tests' tiny Llama (vocabulary 61, hidden 32, 2 layers, sequence 16).
tiny_llama_model() {
    printf 'model:\n  model_type: llama\n  vocab_size: 61\n  hidden_size: 32\n  intermediate_size: 48\n'
    printf '  num_hidden_layers: 2\n  num_attention_heads: 2\n  max_position_embeddings: 16\n'
}

# tiny_llama_config FILE STEPS EXTRA_TRAINING: a config of that model on $tmp/tokens.bin
# (sequence 16, micro-batch 2, lr 1e-3, STEPS steps, metrics in FILE.jsonl), the lines
# EXTRA_TRAINING added to its training section.
tiny_llama_config() {
    cat > "$1" <<YAML
$(tiny_llama_model)
data:
  data_path: $tmp/tokens.bin
  seq_length: 16
training:
  micro_batch_size: 2
  lr: 1.0e-3
  train_iters: $2
  metrics_path: $1.jsonl
${3:-}
YAML
}

# The model: section of the FSDP tests' model, whose sizes nothing divides evenly (hidden 80,
# 5 heads over 1 KV head of 16, sequence up to 64): uneven_model TYPE LAYERS, TYPE llama or
# qwen3_moe (5 experts of 40, top-2, renormalised, the load-balancing loss at 0.01, layer 0
# dense).
uneven_model() {
    printf 'model:\n  model_type: %s\n  vocab_size: 257\n  hidden_size: 80\n  intermediate_size: 100\n' "$1"
    printf '  num_hidden_layers: %s\n  num_attention_heads: 5\n  num_key_value_heads: 1\n  head_dim: 16\n' "$2"
    printf '  max_position_embeddings: 64\n'
    [ "$1" = qwen3_moe ] || return 0
    printf '  num_experts: 5\n  num_experts_per_tok: 2\n  moe_intermediate_size: 40\n  norm_topk_prob: true\n'
    printf '  output_router_logits: true\n  router_aux_loss_coef: 0.01\n  mlp_only_layers: [0]\n'
}
# train_on N CONFIG: train CONFIG on N ranks (N = 1: one process, no MPI), its output in
# CONFIG.log; a failure shows the log's end and fails the test.
train_on() {
    local log="$2.log"
    if [ "$1" = 1 ]; then "$bin" train "$2" >"$log" 2>&1; else mpi_run -np "$1" "$bin" train "$2" >"$log" 2>&1; fi ||
        { tail -5 "$log"; fail "training $2 on $1 ranks failed"; }
}

# compare_runs [--from STEP] [--in] [--keys "KEY ..."] A B TOL: the metrics files A and B
# (JSON lines of `mxtrain train`; the records with a loss) show the same training. A's steps
# from STEP on (default: all of them) are B's steps, in the same order, and at each step B's
# loss (with --keys: each KEY instead) is within a relative TOL of A's, |b - a| <= TOL |a|;
# TOL 0 means bit for bit (the same number as printed). With --in, each of B's steps need
# only be one of A's. B must have a step. When they differ, prints the first difference,
# indented, and returns 1.
compare_runs() {
    local from=0 within=0 keys=loss
    while [ $# -gt 3 ]; do
        case $1 in
            --from) from=$2; shift 2 ;;
            --in) within=1; shift ;;
            --keys) keys=$2; shift 2 ;;
            *) echo "    compare_runs: unknown option $1"; return 2 ;;
        esac
    done
    [ $# -eq 3 ] || { echo "    usage: compare_runs [--from STEP] [--in] [--keys \"KEY ...\"] A B TOL"; return 2; }
    "$py" - "$1" "$2" "$3" "$from" "$within" "$keys" <<'PY'
import json, sys
pa, pb, tol, first, within, keys = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1", sys.argv[6].split()
def records(path):
    return [r for r in map(json.loads, open(path)) if "loss" in r]
a, b = [r for r in records(pa) if r["step"] >= first], records(pb)
def differ(why):
    print(f"    B {pb} against A {pa}: {why}")
    sys.exit(1)
if not b:
    differ("no steps")
if within:
    by_step = {r["step"]: r for r in a}
    missing = [r["step"] for r in b if r["step"] not in by_step]
    if missing:
        differ(f"steps {missing} are not among A's")
    pairs = [(by_step[r["step"]], r) for r in b]
else:
    sa, sb = [r["step"] for r in a], [r["step"] for r in b]
    if sa != sb:
        differ(f"steps {sb}, A's {sa}" + (f" from step {first} on" if first else ""))
    pairs = list(zip(a, b))
for x, y in pairs:
    for k in keys:
        u, v = x[k], y[k]
        if tol == 0 and repr(u) != repr(v):
            differ(f"step {x['step']}: {k} {v!r}, A's {u!r} (bit for bit)")
        if tol != 0 and not abs(v - u) <= tol * abs(u):
            rel = abs(v - u) / abs(u) if u else float("inf")
            differ(f"step {x['step']}: {k} {v!r}, A's {u!r} (relative {rel:.2e} > {tol:g})")
PY
}
# count_steps METRICS: how many records with a loss (steps) a metrics file has
count_steps() { grep -c '"loss": ' "$1"; }

# recipe_config FILE RECIPE PARAM_DTYPE STEPS [EXTRA]: uneven_model's two-layer Qwen3-MoE
# trained on $tmp/tokens.bin (write_tokens) with that recipe, EXTRA more quantization_plan lines
recipe_config() {
    cat > "$1" <<YAML
$(uneven_model qwen3_moe 2)
data:
  data_path: $tmp/tokens.bin
  seq_length: 32
parallel:
  fsdp_plan:
    param_dtype: $3
training:
  micro_batch_size: 2
  lr: 3.0e-3
  train_iters: $4
  log_interval: 1
  metrics_path: $1.jsonl
  quantization_plan:
    recipe_name: $2
${5:-}
YAML
}
