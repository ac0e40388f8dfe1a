#!/bin/bash
# The save directory (training.save) at the start of a run, before step 1:
#  - one that cannot be written (a read-only tmpfs, mounted in a mount namespace of this
#    test's own: as root a chmod would not stop writes) is refused with the system's reason,
#    on one process and on 2 ranks (not reported as "not one shared directory");
#  - a second run into a directory a live run holds is refused with one line naming the
#    holder's host and pid, however many start at once, and exactly one of runs started
#    together runs; the lock goes when the run ends;
#  - a lock file left by a dead run (a dead pid on this host, its lock not held) is taken
#    over; one held by a live process is not;
#  - a run without training.load into a directory that holds checkpoints is refused, saying
#    how to resume or start afresh;
#  - a latest_checkpointed_iteration.txt that is not exactly a step number ('10abc', a
#    number past 18 digits) is refused naming the file.
# tests/run: launches MPI ranks
if [ -z "${MXT_SAVE_DIR_NS:-}" ]; then
    if [ "$(id -u)" -eq 0 ]; then ns=(unshare --mount --propagation private); else ns=(unshare --user --map-root-user --mount); fi
    MXT_SAVE_DIR_NS=1 exec "${ns[@]}" bash "$0" "$@"
fi
. "$(dirname "$0")/common.bash"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"   # Open MPI's (see fsdp.sh)
ro="$tmp/ro"
mkdir "$ro"
trap 'kill $(jobs -p) 2>/dev/null; umount "$ro" 2>/dev/null; rm -rf "$tmp"' EXIT   # this shell's own jobs only
host=$(uname -n)

write_tokens "$tmp/tokens.bin" 20000 7919
# config FILE SAVE_DIR STEPS [EXTRA]: the tiny model, saving to SAVE_DIR
config() { tiny_llama_config "$1" "$3" "  save: $2
${4:-}"; }
# errors LOG: mxtrain's error lines (not its progress)
errors() { grep "^mxtrain train: " "$1" | grep -v "^mxtrain train: $tmp/.*parameters"; }

# -- a save directory that cannot be written: refused before step 1, with the reason
mount -t tmpfs -o ro,size=1m tmpfs "$ro" || fail "cannot mount a read-only tmpfs at $ro"
config "$tmp/ro1.yaml" "$ro" 2
"$bin" train "$tmp/ro1.yaml" > "$tmp/ro1.log" 2>&1 && fail "training into a read-only save directory succeeded"
[ "$(errors "$tmp/ro1.log")" = "mxtrain train: training.save: cannot write in '$ro' (Read-only file system)" ] ||
    fail "1 rank: a read-only save directory: $(cat "$tmp/ro1.log")"
grep -q "^step" "$tmp/ro1.log" && fail "1 rank: steps ran before the read-only save directory was refused"
config "$tmp/ro2.yaml" "$ro" 2 "  save_parallel: true"
mpi_run -np 2 "$bin" train "$tmp/ro2.yaml" > "$tmp/ro2.log" 2>&1 && fail "2 ranks: training into a read-only save directory succeeded"
grep -qx "mxtrain train: rank 0: training.save: cannot write in '$ro' (Read-only file system)" "$tmp/ro2.log" ||
    fail "2 ranks: a read-only save directory: $(errors "$tmp/ro2.log")"
grep -q "^step\|not one shared directory" "$tmp/ro2.log" && fail "2 ranks: $(cat "$tmp/ro2.log")"
umount "$ro"

# -- a live run holds the directory: every other start is refused, naming it
ck="$tmp/ck"
config "$tmp/long.yaml" "$ck" 1000000 "  exit_signal_handler: true
  save_interval: 1000000"
"$bin" train "$tmp/long.yaml" > "$tmp/long.log" 2>&1 &
holder=$!
for _ in $(seq 600); do grep -q "^step" "$tmp/long.log" && break; kill -0 $holder 2>/dev/null || break; sleep 0.1; done
grep -q "^step" "$tmp/long.log" || fail "the long run did not start: $(cat "$tmp/long.log")"
[ "$(cut -d' ' -f1-4 "$ck/.mxtrain.lock")" = "host $host pid $holder" ] || fail "the lock file: $(cat "$ck/.mxtrain.lock")"
others=()
for i in 1 2 3 4; do "$bin" train "$tmp/long.yaml" > "$tmp/other$i.log" 2>&1 & others+=($!); done
for i in 1 2 3 4; do
    wait "${others[$((i - 1))]}" && fail "a second run into a held save directory ran"
    err=$(errors "$tmp/other$i.log")
    [ "$(grep -c . <<<"$err")" -eq 1 ] || fail "not one error line: $(cat "$tmp/other$i.log")"
    grep -q "^mxtrain train: training.save: '$ck' is in use by another run (host $host, pid $holder, run [0-9a-f]*; lock file $ck/.mxtrain.lock); wait for it to end or choose another training.save$" <<<"$err" ||
        fail "the refusal does not name the holder: $err"
done
kill -TERM $holder
wait $holder || fail "the long run failed after SIGTERM: $(tail -3 "$tmp/long.log")"
[ ! -e "$ck/.mxtrain.lock" ] || fail "the lock file outlived its run"
ls "$ck" | grep -q "^iter_" || fail "the long run saved no checkpoint"

# -- runs started together into a new directory: exactly one runs, the others are refused
ck2="$tmp/ck2"
config "$tmp/race.yaml" "$ck2" 1000000 "  exit_signal_handler: true
  save_interval: 1000000"
race=()
for i in 1 2 3 4 5; do "$bin" train "$tmp/race.yaml" > "$tmp/race$i.log" 2>&1 & race+=($!); done
refused=0 running=""
for _ in $(seq 1200); do   # until four have ended (a run that got the lock runs until told to stop)
    alive=()
    for p in "${race[@]}"; do kill -0 "$p" 2>/dev/null && alive+=("$p"); done
    [ ${#alive[@]} -le 1 ] && break
    sleep 0.1
done
[ ${#alive[@]} -eq 1 ] || fail "${#alive[@]} of 5 runs started together into one directory are running"
running=${alive[0]}
for i in 1 2 3 4 5; do
    p=${race[$((i - 1))]}
    [ "$p" = "$running" ] && continue
    wait "$p" && fail "run $i of the race exited 0 while another holds the directory"
    grep -q "^mxtrain train: training.save: '$ck2' is in use by another run (host $host, pid $running, run " "$tmp/race$i.log" &&
        refused=$((refused + 1))
done
[ $refused -eq 4 ] || fail "$refused of 4 runs were refused naming the holder $running: $(cat "$tmp"/race*.log | grep '^mxtrain train: training')"
kill -TERM "$running"
wait "$running" || fail "the run that won the race failed after SIGTERM"

# -- a stale lock: a dead pid of this host, its lock not held: taken over
sleep 0 & dead=$!
wait $dead
ck3="$tmp/ck3"
mkdir "$ck3"
echo "host $host pid $dead run 00000000dead0" > "$ck3/.mxtrain.lock"
config "$tmp/stale.yaml" "$ck3" 2
"$bin" train "$tmp/stale.yaml" > "$tmp/stale.log" 2>&1 || fail "a stale lock was not taken over: $(errors "$tmp/stale.log")"
[ ! -e "$ck3/.mxtrain.lock" ] || fail "the taken-over lock file outlived the run"
# a lock a live process holds (flock), naming another host: refused
ck4="$tmp/ck4"
mkdir "$ck4"
echo "host other-host pid 4242 run 0123456789abc" > "$ck4/.mxtrain.lock"
flock "$ck4/.mxtrain.lock" sleep 60 &
locker=$!
for _ in $(seq 50); do flock -n "$ck4/.mxtrain.lock" true 2>/dev/null || break; sleep 0.1; done
config "$tmp/held.yaml" "$ck4" 2
"$bin" train "$tmp/held.yaml" > "$tmp/held.log" 2>&1 && fail "a held lock was taken over"
grep -q "^mxtrain train: training.save: '$ck4' is in use by another run (host other-host, pid 4242, run 0123456789abc;" "$tmp/held.log" ||
    fail "a held lock: $(errors "$tmp/held.log")"
kill $locker

# -- a run without training.load into a directory with checkpoints: refused, saying how to go on
config "$tmp/again.yaml" "$ck3" 2
"$bin" train "$tmp/again.yaml" > "$tmp/again.log" 2>&1 && fail "a fresh run into a directory with checkpoints ran"
[ "$(errors "$tmp/again.log")" = "mxtrain train: training.save: '$ck3' already holds checkpoints (iter_0000002) and training.load is not set; set training.load: $ck3 to resume from them, or choose an empty directory (or remove them) to start afresh" ] ||
    [ "$(errors "$tmp/again.log")" = "mxtrain train: training.save: '$ck3' already holds checkpoints (latest_checkpointed_iteration.txt) and training.load is not set; set training.load: $ck3 to resume from them, or choose an empty directory (or remove them) to start afresh" ] ||
    fail "a fresh run into a directory with checkpoints: $(errors "$tmp/again.log")"
[ "$(cat "$ck3/latest_checkpointed_iteration.txt")" = 2 ] || fail "the refused run changed the latest file"
# resuming it (training.load: the save directory) is the normal way on
config "$tmp/resume.yaml" "$ck3" 3 "  load: $ck3"
"$bin" train "$tmp/resume.yaml" > "$tmp/resume.log" 2>&1 || fail "resuming failed: $(errors "$tmp/resume.log")"

# -- a latest file that is not exactly a step number: refused, naming the file
for text in 10abc 12345678901234567890123 "" "-3" "3 4"; do
    printf '%s\n' "$text" > "$ck3/latest_checkpointed_iteration.txt"
    "$bin" train "$tmp/resume.yaml" --training.train_iters 5 > "$tmp/latest.log" 2>&1 && fail "latest '$text' was accepted"
    [ "$(errors "$tmp/latest.log")" = "mxtrain train: training.load: $ck3/latest_checkpointed_iteration.txt holds '$text', not a step number (allowed: 1 to 18 digits)" ] ||
        fail "latest '$text': $(errors "$tmp/latest.log")"
done
exit 0
