#!/bin/bash
# Training across hosts over TCP, for real (docs/distributed.md, "Across hosts"): two hosts
# made as network namespaces on this machine (with IPC and UTS namespaces of their own),
# joined by two veth pairs (a data and a management network; the addresses exist inside the
# namespaces only), one rank on each, the MPI launcher started on host a and entering host b
# through an ssh stand-in (ip netns exec), MPI's traffic over TCP on the data link only
# (Open MPI: btl tcp,self and btl_tcp_if_include; MPICH: UCX's TCP on UCX_NET_DEVICES):
#  - the losses are exactly those of the same job on shared memory, and the link's byte
#    counters show that at least the gathered weights crossed it;
#  - the data link taken down mid-run (ip link set down, inside host b) ends the job within
#    30 s with the watchdog's message naming the rank and the collective it waited in, and
#    nothing of it is left on either host (the launcher ends the ranks over the management
#    link; see docs/distributed.md for one link carrying both);
#  - expert parallelism (EP = 2, one host each), and HSDP with EP laid out as on a cluster
#    (2 ranks a host: FSDP and EP within a host, replicas across), give the losses of the
#    same jobs on shared memory;
#  - the last checkpoint resumes over the link, up again, and finishes with the losses of
#    the uninterrupted run, exactly.
# Needs root and `ip netns` (iproute2); without them it fails, saying so.
# tests/run: launches MPI ranks
. "$(dirname "$0")/common.bash"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"   # Open MPI's (see fsdp.sh)
export OMPI_MCA_btl_vader_single_copy_mechanism=none

. "$(dirname "$0")/../scripts/netns-hosts.bash"
trap 'netns_hosts_down; rm -rf "$tmp"' EXIT
netns_hosts_up
bytes() { ip netns exec $1 cat /sys/class/net/$nic/statistics/$2_bytes; }
# finished LOG: a run across the hosts that exited non-zero still trained to its end if it
# is MPICH's and the only trouble came after its summary, in MPI_Finalize: Debian 12's
# MPICH 4.0.2 over UCX 1.13's TCP transport often hangs there (one rank waits in its UCX
# disconnect for a peer already in the final PMI barrier); mxtrain then leaves without it
# after timeout_s, which Hydra reports as a failure (docs/distributed.md, MPICH).
finished() {
    [ "$mpi_impl" = mpich ] && grep -q "^done: " "$1" && ! grep -q "^mxtrain train: rank" "$1" || return 1
    echo "    (MPICH: MPI_Finalize did not return after the run's end; mxtrain left without it)"
}

"$bin" prepare --out "$tmp/data" >/dev/null 2>&1 || fail "prepare failed"
write_config() {   # write_config FILE STEPS EXTRA_TRAINING [EXTRA_PARALLEL]
    cat > "$1" <<YAML
model:
  model_type: qwen3_moe
  vocab_size: 257
  hidden_size: 64
  intermediate_size: 96
  num_hidden_layers: 2
  num_attention_heads: 4
  num_key_value_heads: 1
  head_dim: 16
  max_position_embeddings: 64
  num_experts: 4
  num_experts_per_tok: 2
  moe_intermediate_size: 32
  mlp_only_layers: [0]
data:
  data_path: $tmp/data/train_*.bin
  seq_length: 32
parallel:
  timeout_s: 3
${4:-}
training:
  micro_batch_size: 2
  seed: 5
  lr: 3.0e-3
  lr_decay_style: constant
  train_iters: $2
  log_interval: 1000000
  metrics_path: $1.jsonl
  quantization_plan:
    recipe_name: mxfp8
    apply_modules: ['model.layers.{*}']
    ignored_modules: ['*gate']
$3
YAML
}

# the same job on shared memory and across the hosts
write_config "$tmp/shm.yaml" 24 ""
mpi_run -np 2 "$bin" train "$tmp/shm.yaml" >"$tmp/shm.log" 2>&1 || { tail -3 "$tmp/shm.log"; fail "the shared-memory run failed"; }
write_config "$tmp/tcp.yaml" 24 ""
rx0=$(bytes $ha rx)
across "$bin" train "$tmp/tcp.yaml" >"$tmp/tcp.log" 2>&1 || finished "$tmp/tcp.log" ||
    { grep -v "^step" "$tmp/tcp.log" | tail -20; fail "the run across hosts failed"; }
rx=$(( $(bytes $ha rx) - rx0 ))
compare_runs --in --keys "loss grad_norm" "$tmp/shm.yaml.jsonl" "$tmp/tcp.yaml.jsonl" 0 || fail "losses across hosts differ from shared memory"
[ "$(wc -l < "$tmp/tcp.yaml.jsonl")" = 24 ] || fail "the run across hosts did not log 24 steps"
# what host a received must hold host b's half of every all-gather (ag_bytes counts both halves)
$py - "$tmp/tcp.yaml.jsonl" "$rx" <<'PY' || fail "the traffic did not cross the link"
import json, sys
half = sum(json.loads(l)["ag_bytes"] for l in open(sys.argv[1])) // 2
rx = int(sys.argv[2])
assert rx >= half, (rx, half)
print(f"    host a received {rx} bytes over the link (at least {half}: host b's half of the gathers)")
PY

# expert parallelism across the hosts (EP = 2: each host computes 2 of the 4 experts, the
# routed tokens cross the link both ways): the losses of the same EP job on shared memory
write_config "$tmp/ep_shm.yaml" 6 "" "  expert_parallel_size: 2"
mpi_run -np 2 "$bin" train "$tmp/ep_shm.yaml" >"$tmp/ep_shm.log" 2>&1 || { tail -3 "$tmp/ep_shm.log"; fail "the EP run on shared memory failed"; }
write_config "$tmp/ep_tcp.yaml" 6 "" "  expert_parallel_size: 2"
across "$bin" train "$tmp/ep_tcp.yaml" >"$tmp/ep_tcp.log" 2>&1 || finished "$tmp/ep_tcp.log" ||
    { grep -v "^step" "$tmp/ep_tcp.log" | tail -20; fail "the EP run across hosts failed"; }
compare_runs --in --keys "loss grad_norm" "$tmp/ep_shm.yaml.jsonl" "$tmp/ep_tcp.yaml.jsonl" 0 || fail "EP losses across hosts differ from shared memory"
$py - "$tmp/ep_tcp.yaml.jsonl" <<'PY' || fail "no tokens were dispatched across the hosts"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 6 and all(r["dispatch_bytes"] > 0 and r["combine_bytes"] > 0 for r in rows), rows
print(f"    EP = 2 across the hosts: the losses of shared memory; {sum(r['dispatch_bytes'] for r in rows)} bytes dispatched")
PY

# HSDP with EP as a cluster lays it out: 2 ranks on each host, an FSDP group and an EP group
# per host (consecutive ranks), the two hosts replicas of each other (data_parallel_size 2):
# only the replica all-reduce of the gradients crosses the link; the losses of shared memory
write_config "$tmp/hsdp_shm.yaml" 6 "" "  data_parallel_size: 2
  expert_parallel_size: 2"
mpi_run -np 4 "$bin" train "$tmp/hsdp_shm.yaml" >"$tmp/hsdp_shm.log" 2>&1 || { tail -3 "$tmp/hsdp_shm.log"; fail "the HSDP run on shared memory failed"; }
write_config "$tmp/hsdp_tcp.yaml" 6 "" "  data_parallel_size: 2
  expert_parallel_size: 2"
rx0=$(bytes $ha rx)
PER_HOST=2 across "$bin" train "$tmp/hsdp_tcp.yaml" >"$tmp/hsdp_tcp.log" 2>&1 || finished "$tmp/hsdp_tcp.log" ||
    { grep -v "^step" "$tmp/hsdp_tcp.log" | tail -20; fail "the HSDP run across hosts failed"; }
rx=$(( $(bytes $ha rx) - rx0 ))
compare_runs --in --keys "loss grad_norm" "$tmp/hsdp_shm.yaml.jsonl" "$tmp/hsdp_tcp.yaml.jsonl" 0 || fail "HSDP losses across hosts differ from shared memory"
$py - "$tmp/hsdp_tcp.yaml.jsonl" "$rx" <<'PY' || fail "the replica all-reduce did not cross the link"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
ar, rx = sum(r["ar_bytes"] for r in rows), int(sys.argv[2])
assert len(rows) == 6 and ar > 0 and rx >= ar, (ar, rx)   # host a's 2 ranks each get their shard's sum
print(f"    HSDP 2 x 2 with EP 2 across the hosts (2 ranks each): the losses of shared memory; host a received {rx} bytes (rank 0 all-reduced {ar})")
PY

# the link down mid-run: the watchdog ends the job
write_config "$tmp/down.yaml" 100000 "  save: $tmp/ckpt
  save_interval: 4"
across "$bin" train "$tmp/down.yaml" >"$tmp/down.log" 2>&1 &
job=$!
for _ in $(seq 300); do
    [ -f "$tmp/down.yaml.jsonl" ] && [ "$(wc -l < "$tmp/down.yaml.jsonl")" -ge 5 ] && break
    kill -0 $job 2>/dev/null || break
    sleep 0.1
done
[ -f "$tmp/ckpt/latest_checkpointed_iteration.txt" ] || { kill -9 $job; fail "no checkpoint before the link went down: $(tail -3 "$tmp/down.log")"; }
ip -n $hb link set $nic down || fail "cannot take the data link down"
t0=$SECONDS
ended=""
for _ in $(seq 300); do kill -0 $job 2>/dev/null || { ended=1; break; }; sleep 0.1; done
[ -n "$ended" ] || { cat "$tmp/down.log"; fail "the job still runs 30 s after the link went down"; }
wait $job && fail "the job exited 0 after the link went down"
echo "    job ended $((SECONDS - t0)) s after the link went down"
for _ in $(seq 100); do [ -z "$(ip netns pids $ha)$(ip netns pids $hb)" ] && break; sleep 0.1; done
[ -z "$(ip netns pids $ha)$(ip netns pids $hb)" ] ||
    fail "processes of the job are left on the hosts: $(ps -o pid=,comm= -p "$(ip netns pids $ha) $(ip netns pids $hb)" | tr '\n' ' ')"
grep -Eq "^mxtrain train: rank [01]: no progress for 3 s in MPI_I[a-z_]+ \(.+\): a peer rank may have died, stopped, or lost its network" "$tmp/down.log" ||
    { cat "$tmp/down.log"; fail "no watchdog message naming the rank and the collective"; }
grep "^mxtrain train: rank [01]: no progress" "$tmp/down.log" | sed 's/^/    /'

# the link up again: resume from the last checkpoint and finish 4 steps later
ip -n $hb link set $nic up || fail "cannot bring the link up"
last=$(cat "$tmp/ckpt/latest_checkpointed_iteration.txt")
[ "$last" -ge 4 ] || fail "latest checkpoint is step $last (want at least 4)"
ref="$tmp/shm.yaml.jsonl"
if [ $((last + 4)) -gt 24 ]; then   # a fast machine ran past the reference: a longer one (a constant lr, so the same steps)
    write_config "$tmp/shm_long.yaml" $((last + 4)) ""
    mpi_run -np 2 "$bin" train "$tmp/shm_long.yaml" >"$tmp/shm_long.log" 2>&1 || { tail -3 "$tmp/shm_long.log"; fail "the longer shared-memory run failed"; }
    ref="$tmp/shm_long.yaml.jsonl"
fi
write_config "$tmp/resume.yaml" $((last + 4)) "  load: $tmp/ckpt"
across "$bin" train "$tmp/resume.yaml" >"$tmp/resume.log" 2>&1 || finished "$tmp/resume.log" ||
    { grep -v "^step" "$tmp/resume.log" | tail -20; fail "the resumed run failed"; }
grep -q "resumed from .* at step $last" "$tmp/resume.log" || fail "no resume line: $(head -3 "$tmp/resume.log")"
compare_runs --in --keys "loss grad_norm" "$ref" "$tmp/resume.yaml.jsonl" 0 || fail "the resumed run differs from the uninterrupted one"
echo "    resumed at step $last and finished step $((last + 4)) with the uninterrupted run's losses"
exit 0
