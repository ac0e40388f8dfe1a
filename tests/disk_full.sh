#!/bin/bash
# A full disk, for real: a small tmpfs mounted in a mount namespace of this test's own (as
# root, or as a user through a user namespace), which holds one checkpoint and a half.
#  - A save that runs out of space fails with the system's reason and the file it wrote,
#    on one process, on 2 ranks writing their own rows (save_parallel) and on 2 ranks where
#    rank 0 writes alone, streaming tensor by tensor (save_parallel: false): its writes fail
#    part-way through the files it laid out. The job ends on every rank, publishes nothing,
#    leaves no temporary checkpoint, and the checkpoint before it stays the latest, whole:
#    a run that loads it finishes with the losses of an uninterrupted run.
#  - `mxtrain export`, `init` and `prepare` into a full disk, and a metrics file on one: a
#    one-line error naming the file and the reason, a non-zero exit, no output left.
# tests/run: launches MPI ranks
if [ -z "${MXT_DISK_FULL_NS:-}" ]; then
    if [ "$(id -u)" -eq 0 ]; then ns=(unshare --mount --propagation private); else ns=(unshare --user --map-root-user --mount); fi
    MXT_DISK_FULL_NS=1 exec "${ns[@]}" bash "$0" "$@"
fi
. "$(dirname "$0")/common.bash"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"   # Open MPI's (see fsdp.sh)
full="$tmp/full"
mkdir "$full"
trap 'umount "$full" 2>/dev/null; rm -rf "$tmp"' EXIT

write_tokens "$tmp/tokens.bin" 20000 7919
write_config() {   # write_config FILE STEPS SAVE_DIR EXTRA_TRAINING: saving every step to SAVE_DIR
    tiny_llama_config "$1" "$2" "  save_interval: 1
  save: $3
${4:-}"
}
# errors LOG: the lines of mxtrain's own messages that are not progress
errors() { grep "^mxtrain train: " "$1" | grep -v "^mxtrain train: $tmp/.*parameters"; }

# the references: 3 steps on 1 and on 2 ranks into a roomy directory; one checkpoint's size
write_config "$tmp/ref1.yaml" 3 "$tmp/ref1"
"$bin" train "$tmp/ref1.yaml" > "$tmp/ref1.log" 2>&1 || { cat "$tmp/ref1.log"; fail "the reference run failed"; }
write_config "$tmp/ref2.yaml" 3 "$tmp/ref2"
mpi_run -np 2 "$bin" train "$tmp/ref2.yaml" > "$tmp/ref2.log" 2>&1 || { cat "$tmp/ref2.log"; fail "the 2-rank reference run failed"; }
kb=$(du -sk "$tmp/ref1/iter_0000001" | cut -f1)
mount -t tmpfs -o size=$((kb * 3 / 2))k tmpfs "$full" || fail "cannot mount a tmpfs at $full"

for mode in serial parallel rank0; do
    rm -rf "${full:?}"/*
    ck="$full/$mode"
    case $mode in
        serial) run=("$bin"); extra=""; ref="$tmp/ref1" ;;
        parallel) run=(mpi_run -np 2 "$bin"); extra="  save_parallel: true"; ref="$tmp/ref2" ;;
        rank0) run=(mpi_run -np 2 "$bin"); extra="  save_parallel: false"; ref="$tmp/ref2" ;;
    esac
    write_config "$tmp/$mode.yaml" 3 "$ck" "$extra"
    "${run[@]}" train "$tmp/$mode.yaml" > "$tmp/$mode.log" 2>&1 &&
        fail "$mode: a save into a full disk succeeded: $(tail -3 "$tmp/$mode.log")"
    err=$(errors "$tmp/$mode.log")
    grep -Eq "training.save: cannot write '$ck/\.tmp_iter_0000002\.[0-9a-f]{13}/(model|optimizer)\.safetensors' \(No space left on device\)" <<<"$err" ||
        fail "$mode: the error does not name the file and the reason: $err"
    if [ $mode = rank0 ]; then
        grep -Eq "rank 1: training.save: rank 0 could not write '$ck/\.tmp_iter_0000002\.[0-9a-f]{13}'" <<<"$err" ||
            fail "$mode: rank 1 does not say why it stops: $err"
    fi
    # (an ended job's lock file may be left when another rank ended the job first: stale, the next run takes it over)
    [ "$(ls -A "$ck" | grep -vx '\.mxtrain\.lock')" = "$(printf 'iter_0000001\nlatest_checkpointed_iteration.txt')" ] ||
        fail "$mode: expected iter_0000001 and its latest file alone, found: $(ls -A "$ck")"
    [ "$(cat "$ck/latest_checkpointed_iteration.txt")" = 1 ] || fail "$mode: latest is not 1"
    cmp -s "$ck/iter_0000001/model.safetensors" "$ref/iter_0000001/model.safetensors" ||
        fail "$mode: the checkpoint before the full disk is not the reference's"
done
# the surviving checkpoint resumes (moved to a roomy directory): the uninterrupted losses
cp -r "$full/rank0" "$tmp/resumed"
write_config "$tmp/resume.yaml" 3 "$tmp/resumed" "  load: $tmp/resumed"
mpi_run -np 2 "$bin" train "$tmp/resume.yaml" > "$tmp/resume.log" 2>&1 || { cat "$tmp/resume.log"; fail "resuming failed"; }
[ "$(count_steps "$tmp/ref2.yaml.jsonl")" -eq 3 ] || fail "no 3 losses in the reference's metrics"
compare_runs --from 2 "$tmp/ref2.yaml.jsonl" "$tmp/resume.yaml.jsonl" 0 || fail "the resumed losses differ"

# the other writers: fill the disk to its last byte, then write
rm -rf "${full:?}"/*
dd if=/dev/zero of="$full/fill" bs=4k 2>/dev/null
one_error() {   # one_error WHAT OUTPUT PATTERN
    [ "$(grep -c . <<<"$2")" -eq 1 ] || fail "$1: not one line: $2"
    grep -Eq "$3" <<<"$2" || fail "$1: $2 (expected: $3)"
    [ "$(ls -A "$full")" = fill ] || fail "$1 left files: $(ls -A "$full")"
}
out=$("$bin" export "$tmp/ref1" --out "$full/hf" 2>&1) && fail "export into a full disk succeeded"
one_error export "$out" "^mxtrain export: .*$full/\.hf\.tmp-export/.*No space left on device"
out=$("$bin" init "$tmp/ref1.yaml" --out "$full/w.safetensors" 2>&1) && fail "init into a full disk succeeded"
one_error init "$out" "^mxtrain init: .*$full/.*No space left on device"
out=$("$bin" prepare "$tmp/ref1.yaml" --out "$full/data" 2>&1) && fail "prepare into a full disk succeeded"
rmdir "$full/data" 2>/dev/null   # the directory it made: empty
one_error prepare "$out" "^mxtrain prepare: $full/data/train_000000.bin: write failed \(No space left on device\); no file was written$"
write_config "$tmp/m.yaml" 2 "$tmp/m" ""
sed -i "s|metrics_path: .*|metrics_path: $full/m.jsonl|" "$tmp/m.yaml"
"$bin" train "$tmp/m.yaml" > "$tmp/m.log" 2>&1 && fail "training with its metrics on a full disk succeeded"
rm -f "$full/m.jsonl"   # an append-only log: what fitted stays
err=$(errors "$tmp/m.log")
one_error metrics "$err" "^mxtrain train: training.metrics_path: writing '$full/m.jsonl' failed \(No space left on device\)$"
exit 0
