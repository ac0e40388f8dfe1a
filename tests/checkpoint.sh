#!/bin/bash
# Checkpoint holes of killed or failed saves, on one process:
#  - a latest pointer that cannot be written fails the save with the system's reason, and
#    publishes nothing (no iter_N that `load` could not find);
#  - what a killed save leaves (.tmp_iter_N, a temporary latest file, a moved-aside
#    .old_iter_N) is cleaned at the next start, a moved-aside checkpoint put back;
#  - a save directory whose latest file is missing loads its newest complete iter_N.
. "$(dirname "$0")/common.bash"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive

write_tokens "$tmp/tokens.bin" 20000 7919
write_config() {   # write_config FILE STEPS EXTRA_TRAINING
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
$3
YAML
}

# the latest file cannot be written (here: a directory in its place) on the first save
mkdir -p "$tmp/ck1/latest_checkpointed_iteration.txt/x"
write_config "$tmp/a.yaml" 2 "  save: $tmp/ck1"
out=$("$bin" train "$tmp/a.yaml" 2>&1) && fail "a save whose latest file cannot be written succeeded"
err=$(grep -v "^step\|^mxtrain train: $tmp" <<<"$out")
[ "$(wc -l <<<"$err")" -eq 1 ] || fail "not one error line: $out"
grep -q "mxtrain train: training.save: .*ck1/latest_checkpointed_iteration.txt: is a directory" <<<"$err" ||
    fail "the error does not say why the latest file failed: $err"
ls -A "$tmp/ck1" | grep -q "iter_" && fail "a checkpoint was published without its latest file: $(ls -A "$tmp/ck1")"

# leftovers of killed saves: a half-written .tmp_iter_N, a temporary latest file, the
# checkpoint latest names moved aside while its step was saved again (iter_4 then missing:
# it must be back before it is loaded), and one moved aside whose iter_N is in place
write_config "$tmp/b.yaml" 4 "  save: $tmp/ck2
  save_interval: 2"
"$bin" train "$tmp/b.yaml" > /dev/null 2>&1 || fail "training with checkpoints failed"
mkdir "$tmp/ck2/.tmp_iter_0000006" && echo garbage > "$tmp/ck2/.tmp_iter_0000006/model.safetensors"
echo 6 > "$tmp/ck2/.latest_checkpointed_iteration.txt.tmp-12ab"
mv "$tmp/ck2/iter_0000004" "$tmp/ck2/.old_iter_0000004"
cp -r "$tmp/ck2/iter_0000002" "$tmp/ck2/.old_iter_0000002"
write_config "$tmp/c.yaml" 5 "  save: $tmp/ck2
  load: $tmp/ck2"
"$bin" train "$tmp/c.yaml" > "$tmp/c.log" 2>&1 || fail "resuming next to leftovers failed: $(tail -2 "$tmp/c.log")"
left=$(ls -A "$tmp/ck2" | grep "^\.")
[ -z "$left" ] || fail "leftovers of killed saves were not removed: $left"
grep -q "resumed from $tmp/ck2/iter_0000004 at step 4" "$tmp/c.log" || fail "did not resume from the put-back iter_0000004"
[ "$(cat "$tmp/ck2/latest_checkpointed_iteration.txt")" = 5 ] || fail "latest is not 5"

# no latest file (a job killed between publishing iter_N and latest): the newest iter_N loads
rm "$tmp/ck2/latest_checkpointed_iteration.txt"
write_config "$tmp/d.yaml" 6 "  load: $tmp/ck2"
"$bin" train "$tmp/d.yaml" > "$tmp/d.log" 2>&1 || fail "loading without a latest file failed: $(tail -2 "$tmp/d.log")"
grep -q "resumed from $tmp/ck2/iter_0000005 at step 5" "$tmp/d.log" || fail "did not resume from the newest: $(cat "$tmp/d.log")"
exit 0
