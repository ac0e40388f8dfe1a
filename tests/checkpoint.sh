#!/bin/bash
# Checkpoint holes of killed or failed saves, on one process:
#  - a latest pointer that cannot be written fails the save with the system's reason, and
#    publishes nothing (no iter_N that `load` could not find);
#  - what a killed save leaves (.tmp_iter_N, a temporary latest file, a moved-aside
#    .old_iter_N) is cleaned at the next start, a moved-aside checkpoint put back;
#  - a save directory whose latest file is missing loads its newest complete iter_N;
#  - training.keep_latest_k keeps the newest checkpoints of the run's steps, removes the
#    older ones (an earlier run's among them) and leaves those of later steps; a checkpoint
#    it cannot remove fails the save with the directory and the reason, after the new one
#    is published; a killed removal's leftover is cleaned at the next start.
. "$(dirname "$0")/common.bash"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive

write_tokens "$tmp/tokens.bin" 20000 7919

# the latest file cannot be written (here: a directory in its place) on the first save
mkdir -p "$tmp/ck1/latest_checkpointed_iteration.txt/x"
tiny_llama_config "$tmp/a.yaml" 2 "  save: $tmp/ck1"
out=$("$bin" train "$tmp/a.yaml" 2>&1) && fail "a save whose latest file cannot be written succeeded"
err=$(grep -v "^step\|^mxtrain train: $tmp\|^precision:" <<<"$out")
[ "$(wc -l <<<"$err")" -eq 1 ] || fail "not one error line: $out"
grep -q "mxtrain train: training.save: .*ck1/latest_checkpointed_iteration.txt: is a directory" <<<"$err" ||
    fail "the error does not say why the latest file failed: $err"
ls -A "$tmp/ck1" | grep -q "iter_" && fail "a checkpoint was published without its latest file: $(ls -A "$tmp/ck1")"

# leftovers of killed saves: a half-written .tmp_iter_N, a temporary latest file, the
# checkpoint latest names moved aside while its step was saved again (iter_4 then missing:
# it must be back before it is loaded), and one moved aside whose iter_N is in place
tiny_llama_config "$tmp/b.yaml" 4 "  save: $tmp/ck2
  save_interval: 2"
"$bin" train "$tmp/b.yaml" > /dev/null 2>&1 || fail "training with checkpoints failed"
mkdir "$tmp/ck2/.tmp_iter_0000006" && echo garbage > "$tmp/ck2/.tmp_iter_0000006/model.safetensors"
echo 6 > "$tmp/ck2/.latest_checkpointed_iteration.txt.tmp-12ab"
mv "$tmp/ck2/iter_0000004" "$tmp/ck2/.old_iter_0000004"
cp -r "$tmp/ck2/iter_0000002" "$tmp/ck2/.old_iter_0000002"
tiny_llama_config "$tmp/c.yaml" 5 "  save: $tmp/ck2
  load: $tmp/ck2"
"$bin" train "$tmp/c.yaml" > "$tmp/c.log" 2>&1 || fail "resuming next to leftovers failed: $(tail -2 "$tmp/c.log")"
left=$(ls -A "$tmp/ck2" | grep "^\.")
[ -z "$left" ] || fail "leftovers of killed saves were not removed: $left"
grep -q "resumed from $tmp/ck2/iter_0000004 at step 4" "$tmp/c.log" || fail "did not resume from the put-back iter_0000004"
[ "$(cat "$tmp/ck2/latest_checkpointed_iteration.txt")" = 5 ] || fail "latest is not 5"

# no latest file (a job killed between publishing iter_N and latest): the newest iter_N loads
rm "$tmp/ck2/latest_checkpointed_iteration.txt"
tiny_llama_config "$tmp/d.yaml" 6 "  load: $tmp/ck2"
"$bin" train "$tmp/d.yaml" > "$tmp/d.log" 2>&1 || fail "loading without a latest file failed: $(tail -2 "$tmp/d.log")"
grep -q "resumed from $tmp/ck2/iter_0000005 at step 5" "$tmp/d.log" || fail "did not resume from the newest: $(cat "$tmp/d.log")"

# keep_latest_k 2: resumed at step 4 and saved every step to 7, next to ck2's iter_2 (an
# earlier run's) and a later step's iter_9 (left by a run past this one's steps): iter_6,
# iter_7 and iter_9 stay
mv "$tmp/ck2/iter_0000005" "$tmp/ck2/iter_0000009"
tiny_llama_config "$tmp/k.yaml" 7 "  save: $tmp/ck2
  load: $tmp/ck2/iter_0000004
  save_interval: 1
  keep_latest_k: 2"
"$bin" train "$tmp/k.yaml" > "$tmp/k.log" 2>&1 || fail "training with keep_latest_k failed: $(tail -2 "$tmp/k.log")"
[ "$(ls -A "$tmp/ck2" | tr '\n' ' ')" = "iter_0000006 iter_0000007 iter_0000009 latest_checkpointed_iteration.txt " ] ||
    fail "keep_latest_k 2 left: $(ls -A "$tmp/ck2")"
[ "$(cat "$tmp/ck2/latest_checkpointed_iteration.txt")" = 7 ] || fail "latest is not 7 after keep_latest_k"
# one that cannot be removed (a directory inside it, which is not a checkpoint's)
mkdir -p "$tmp/ck2/iter_0000006/notes"
tiny_llama_config "$tmp/k2.yaml" 9 "  save: $tmp/ck2
  load: $tmp/ck2
  save_interval: 1
  keep_latest_k: 1"
out=$("$bin" train "$tmp/k2.yaml" 2>&1) && fail "a checkpoint that cannot be removed was not an error"
err=$(grep -v "^step\|^mxtrain train: $tmp\|^resumed\|^precision:" <<<"$out")
[ "$(grep -c . <<<"$err")" -eq 1 ] || fail "not one error line: $out"
grep -q "^mxtrain train: training.keep_latest_k: cannot remove the old checkpoint '$tmp/ck2/iter_0000006' (Directory not empty)$" <<<"$err" ||
    fail "the error does not name the checkpoint and the reason: $err"
[ "$(cat "$tmp/ck2/latest_checkpointed_iteration.txt")" = 8 ] || fail "step 8 was not published before the removal failed"
half=$(ls -d "$tmp"/ck2/.tmp_iter_0000006.*/notes 2>/dev/null)   # the run's staging name: .tmp_iter_N.RUN_ID
[ -d "$half" ] || fail "the half-removed checkpoint is not under its temporary name: $(ls -A "$tmp/ck2")"
rmdir "$half"   # the next start removes the rest
"$bin" train "$tmp/k2.yaml" > "$tmp/k3.log" 2>&1 || fail "the run after a failed removal failed: $(tail -2 "$tmp/k3.log")"
[ "$(ls -A "$tmp/ck2" | tr '\n' ' ')" = "iter_0000009 latest_checkpointed_iteration.txt " ] ||
    fail "keep_latest_k 1 at step 9 left: $(ls -A "$tmp/ck2")"
exit 0
