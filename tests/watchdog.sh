#!/bin/bash
# The watchdog on every wait (parallel.timeout_s, SPEC §6), on 2 ranks under mpi_run:
#  - one rank stopped mid-run (SIGSTOP: it keeps its sockets open and answers nothing, the
#    case MPI itself never notices) ends the job within 30 s with a non-zero exit and
#    mxtrain's message from the waiting rank naming itself, the collective it waited in and
#    what for; while it waits that rank sleeps rather than spins (under 0.5 s of CPU in 1.5 s);
#    the stopped rank is gone afterwards. (A rank killed outright is noticed by MPI's
#    launcher: tests/fsdp.sh checks that with kill -9.)
# tests/run: launches MPI ranks
. "$(dirname "$0")/common.bash"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"   # Open MPI's (see fsdp.sh)
export OMPI_MCA_btl_vader_single_copy_mechanism=none

write_tokens "$tmp/train.bin" 50000 7919 1
cat > "$tmp/w.yaml" <<YAML
$(tiny_llama_model)
data:
  data_path: $tmp/train.bin
  seq_length: 16
parallel:
  timeout_s: 3
training:
  micro_batch_size: 2
  lr: 1.0e-3
  train_iters: 1000000
  log_interval: 1000000
  metrics_path: $tmp/w.jsonl
YAML

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null; }
# start_job LOG: the training job in the background (job=its launcher's pid), once it has
# trained 3 steps; rank0, rank1 = the ranks' pids
start_job() {
    rm -f "$tmp/w.jsonl"
    mpi_run -np 2 "$bin" train "$tmp/w.yaml" >"$1" 2>&1 &
    job=$!
    for _ in $(seq 300); do
        [ -f "$tmp/w.jsonl" ] && [ "$(wc -l < "$tmp/w.jsonl")" -ge 3 ] && break
        kill -0 $job 2>/dev/null || break
        sleep 0.1
    done
    [ -f "$tmp/w.jsonl" ] && [ "$(wc -l < "$tmp/w.jsonl")" -ge 3 ] || { kill -9 $job; fail "the job did not train: $(tail -3 "$1")"; }
    rank0="" rank1=""
    for p in $(pgrep -f "mxtrain train $tmp/w.yaml"); do
        case "$(mpi_rank_of "$p")" in 0) rank0=$p ;; 1) rank1=$p ;; esac
    done
    [ -n "$rank0" ] && [ -n "$rank1" ] || { kill -9 $job; fail "could not find the ranks' processes"; }
}
# ended_within SECONDS: whether the job's launcher exited within SECONDS (then status = its exit code)
ended_within() {
    local i
    for i in $(seq $(($1 * 10))); do
        kill -0 $job 2>/dev/null || { wait $job; status=$?; return 0; }
        sleep 0.1
    done
    return 1
}
cleanup_ranks() { for p in "$rank0" "$rank1"; do kill -CONT "$p" 2>/dev/null; kill -9 "$p" 2>/dev/null; done; kill -9 $job 2>/dev/null; }

# SIGSTOP of rank 1: rank 0 waits, sleeping, and its watchdog ends the job after 3 s.
start_job "$tmp/stop.log"
t0=$SECONDS
kill -STOP "$rank1"
sleep 0.5
c0=$(cpu_ticks "$rank0")
sleep 1.5
c1=$(cpu_ticks "$rank0")
ended_within 30 || { cleanup_ranks; fail "the job still runs 30 s after rank 1 was stopped: $(tail -3 "$tmp/stop.log")"; }
echo "    job ended $((SECONDS - t0)) s after SIGSTOP of rank 1 (exit $status)"
[ "$status" -ne 0 ] || fail "the job exited 0 after rank 1 was stopped"
[ -n "$c0" ] && [ -n "$c1" ] || fail "rank 0 ended before its watchdog could fire: $(tail -3 "$tmp/stop.log")"
hz=$(getconf CLK_TCK)
[ $((c1 - c0)) -lt $((hz / 2)) ] || fail "rank 0 used $((c1 - c0)) of $hz ticks per second of CPU in 1.5 s of waiting: it spins"
grep -Eq "^mxtrain train: rank 0: no progress for 3 s in MPI_I[a-z_]+ \(.+\): a peer rank may have died, stopped, or lost its network \(the limit is parallel.timeout_s\)$" "$tmp/stop.log" ||
    { cat "$tmp/stop.log"; fail "no watchdog message from rank 0 naming the collective"; }
grep "^mxtrain train: rank 0: no progress" "$tmp/stop.log" | sed 's/^/    /'
for _ in $(seq 30); do kill -0 "$rank1" 2>/dev/null || break; sleep 0.1; done   # (a zombie until reaped)
if kill -0 "$rank1" 2>/dev/null; then cleanup_ranks; fail "the stopped rank 1 outlived the job"; fi

exit 0
