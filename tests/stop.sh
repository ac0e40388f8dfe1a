#!/bin/bash
# Stopping early, as Megatron-LM does, with a checkpoint to resume from (docs/training.md,
# "Stopping early"):
#  - training.exit_interval 3 over 8 steps: three runs (stop after 3, resume, stop after 6,
#    resume, finish) give the losses of one uninterrupted run, exactly;
#  - training.exit_duration_in_mins, passed after the first step, stops 2 ranks there;
#  - training.exit_signal_handler: SIGTERM to one process, SIGTERM to one of 2 ranks (the
#    other stops with it, at the same step), SIGUSR1 to the MPI launcher (which forwards it):
#    each run stops after the step under way with exit status 0, saying why, and its
#    checkpoint resumes to the loss the uninterrupted run has at the next step.
# tests/run: launches MPI ranks
. "$(dirname "$0")/common.bash"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"   # Open MPI's (see fsdp.sh)

write_tokens "$tmp/tokens.bin" 20000 7919

# exit_interval: three runs against one
tiny_llama_config "$tmp/ref.yaml" 8 ""
"$bin" train "$tmp/ref.yaml" > "$tmp/ref.log" 2>&1 || { cat "$tmp/ref.log"; fail "the uninterrupted run failed"; }
[ "$(count_steps "$tmp/ref.yaml.jsonl")" -eq 8 ] || fail "no 8 losses in the uninterrupted run's metrics"
tiny_llama_config "$tmp/int.yaml" 8 "  save: $tmp/int
  exit_interval: 3"
for stop in 3 6 8; do
    "$bin" train "$tmp/int.yaml" > "$tmp/int.log" 2>&1 || { cat "$tmp/int.log"; fail "the run to step $stop failed"; }
    [ "$(cat "$tmp/int/latest_checkpointed_iteration.txt")" = $stop ] || fail "the run to step $stop saved no checkpoint there"
    if [ $stop -lt 8 ]; then
        grep -q "^stopping after step $stop of 8: training.exit_interval 3; training.load resumes it" "$tmp/int.log" ||
            fail "the run to step $stop does not say why it stopped: $(grep -v '^step' "$tmp/int.log")"
    else
        ! grep -q "^stopping" "$tmp/int.log" || fail "the last run says it stopped early"
    fi
    grep -q "^  load:" "$tmp/int.yaml" || sed -i "s|^  save: .*|&\n  load: $tmp/int|" "$tmp/int.yaml"
done
compare_runs "$tmp/ref.yaml.jsonl" "$tmp/int.yaml.jsonl" 0 || fail "stopped and resumed at steps 3 and 6, the losses differ"

# exit_duration_in_mins: passed after any step, so 2 ranks stop after their first
tiny_llama_config "$tmp/dur.yaml" 8 "  save: $tmp/dur
  exit_duration_in_mins: 1.0e-9"
mpi_run -np 2 "$bin" train "$tmp/dur.yaml" > "$tmp/dur.log" 2>&1 || { cat "$tmp/dur.log"; fail "the run with exit_duration_in_mins failed"; }
grep -q "^stopping after step 1 of 8: [0-9.]* minutes, past training.exit_duration_in_mins 1e-09" "$tmp/dur.log" ||
    fail "2 ranks past exit_duration_in_mins did not stop after step 1: $(grep -v '^step' "$tmp/dur.log")"
[ "$(cat "$tmp/dur/latest_checkpointed_iteration.txt")" = 1 ] || fail "no checkpoint of step 1 after exit_duration_in_mins"

# exit_signal_handler: a signal once 3 steps are done (the metrics file has 3 lines)
tiny_llama_config "$tmp/sig.yaml" 100000 "  save: $tmp/sig
  exit_signal_handler: true
  log_interval: 1000"
# signal_run NAME SIGNAL WHO LAUNCH...: WHO is "launcher" or an MPI rank to signal
signal_run() {
    local name=$1 sig=$2 who=$3
    shift 3
    rm -rf "$tmp/sig" "$tmp/sig.yaml.jsonl"
    "$@" train "$tmp/sig.yaml" > "$tmp/$name.log" 2>&1 &
    local launcher=$! target="" i
    for i in $(seq 600); do [ "$(cat "$tmp/sig.yaml.jsonl" 2>/dev/null | wc -l)" -ge 3 ] && break; sleep 0.1; done
    if [ "$who" = launcher ]; then   # the launcher, under the subshell that runs mpi_run
        target=$(pgrep -P $launcher | head -1)
        [ -n "$target" ] || target=$launcher
    else
        for p in $(pgrep -f "mxtrain train $tmp/sig.yaml"); do [ "$(mpi_rank_of "$p")" = "$who" ] && target=$p; done
    fi
    [ -n "$target" ] || { kill -9 $launcher; fail "$name: no process to signal"; }
    kill -"$sig" "$target"
    wait $launcher
    local rc=$?
    [ $rc -eq 0 ] || fail "$name: exit status $rc after SIG$sig: $(tail -5 "$tmp/$name.log")"
    local step
    step=$(sed -n "s/^stopping after step \([0-9]*\) of 100000: SIG$sig (training.exit_signal_handler); training.load resumes it.*/\1/p" "$tmp/$name.log")
    [ -n "$step" ] || fail "$name: no line saying the run stopped on SIG$sig: $(grep -v '^step' "$tmp/$name.log")"
    [ "$(cat "$tmp/sig/latest_checkpointed_iteration.txt")" = "$step" ] || fail "$name: no checkpoint of step $step"
    [ "$(count_steps "$tmp/sig.yaml.jsonl")" -eq "$step" ] || fail "$name: not $step steps in the metrics"
    signal_step=$step
}
signal_run one TERM launcher "$bin"
# the checkpoint resumes: step N+1 after the signal is step N+1 of a run stopped there by exit_interval
step=$signal_step
sed -e "s|^  save: .*|  load: $tmp/sig\n  exit_interval: 1|" -e "s|metrics_path: .*|metrics_path: $tmp/resume.yaml.jsonl|" \
    "$tmp/sig.yaml" > "$tmp/resume.yaml"
"$bin" train "$tmp/resume.yaml" > "$tmp/resume.log" 2>&1 || { cat "$tmp/resume.log"; fail "resuming after SIGTERM failed"; }
sed -e "s|^  save: .*|  exit_interval: $((step + 1))|" -e "s|metrics_path: .*|metrics_path: $tmp/straight.yaml.jsonl|" \
    "$tmp/sig.yaml" > "$tmp/straight.yaml"
"$bin" train "$tmp/straight.yaml" > "$tmp/straight.log" 2>&1 || { cat "$tmp/straight.log"; fail "the run to step $((step + 1)) failed"; }
compare_runs --from $((step + 1)) "$tmp/straight.yaml.jsonl" "$tmp/resume.yaml.jsonl" 0 ||
    fail "resumed after SIGTERM at step $step, the loss of step $((step + 1)) differs"

signal_run rank1 TERM 1 mpi_run -np 2 "$bin"
signal_run launcher USR1 launcher mpi_run -np 2 "$bin"
exit 0
