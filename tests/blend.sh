#!/bin/bash
# Megatron's data blend, `data_path: [0.7, A, 0.3, B]`, in real runs on 2 ranks (the rows
# each batch takes are checked against Megatron's formula in tests/test_tokens.c):
#  - a run stopped at its step-3 checkpoint and resumed gives the losses of the run that went
#    on, bit for bit; the checkpoint holds the rows taken from each dataset (3 steps x 2
#    ranks x 2 rows in all, A's more than B's);
#  - a blend of one dataset reads the rows one stream of its shards reads: the same losses;
#  - data.shuffle: the same run stopped and resumed gives the same losses, which are not the
#    unshuffled run's;
#  - a validation blend evaluates; a stream's checkpoint does not resume a blend (one line).
# tests/run: launches MPI ranks
. "$(dirname "$0")/common.bash"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"   # Open MPI's (see fsdp.sh)

write_tokens "$tmp/tokens.bin" 20000 7919
write_tokens "$tmp/b.bin" 9000 13 1
blend="[0.7, $tmp/tokens.bin, 0.3, $tmp/b.bin]"
train2() {   # train2 CONFIG [--KEY VALUE ...]: 2 ranks
    local cfg=$1
    shift
    mpi_run -np 2 "$bin" train "$cfg" "$@" > "$cfg.log" 2>&1 || { tail -5 "$cfg.log"; fail "training $cfg $* failed"; }
}

tiny_llama_config "$tmp/full.yaml" 6 "  save: $tmp/full
  save_interval: 3"
train2 "$tmp/full.yaml" --data.data_path "$blend"
$py - "$tmp/full/iter_0000003/trainer_state.json" <<'PY' || fail "the checkpoint does not hold the blend's rows"
import json, sys
rows = json.load(open(sys.argv[1]))["data"]["rows"]
assert len(rows) == 2 and sum(rows) == 3 * 2 * 2 and rows[0] > rows[1], rows
PY
cp -r "$tmp/full" "$tmp/resumed"
rm -r "$tmp/resumed/iter_0000006"
echo 3 > "$tmp/resumed/latest_checkpointed_iteration.txt"
tiny_llama_config "$tmp/resume.yaml" 6 "  load: $tmp/resumed"
train2 "$tmp/resume.yaml" --data.data_path "$blend"
compare_runs --from 4 "$tmp/full.yaml.jsonl" "$tmp/resume.yaml.jsonl" 0 ||
    fail "resumed at step 3, the blend's losses differ"

for data in "$blend" "$tmp/tokens.bin"; do   # shuffled: a blend, and a stream
    rm -rf "$tmp/shuf" "$tmp/shuf.yaml.jsonl" "$tmp/shuf2.yaml.jsonl"
    tiny_llama_config "$tmp/shuf.yaml" 6 "  save: $tmp/shuf
  save_interval: 3"
    train2 "$tmp/shuf.yaml" --data.data_path "$data" --data.shuffle true
    rm -r "$tmp/shuf/iter_0000006"
    echo 3 > "$tmp/shuf/latest_checkpointed_iteration.txt"
    tiny_llama_config "$tmp/shuf2.yaml" 6 "  load: $tmp/shuf"
    train2 "$tmp/shuf2.yaml" --data.data_path "$data" --data.shuffle true
    compare_runs --from 4 "$tmp/shuf.yaml.jsonl" "$tmp/shuf2.yaml.jsonl" 0 ||
        fail "shuffled $data, resumed at step 3: other losses"
done
! compare_runs "$tmp/full.yaml.jsonl" "$tmp/shuf.yaml.jsonl" 0 >/dev/null || fail "data.shuffle changed nothing"

tiny_llama_config "$tmp/one.yaml" 4
train2 "$tmp/one.yaml" --data.data_path "[1, $tmp/tokens.bin]"
tiny_llama_config "$tmp/stream.yaml" 4
train2 "$tmp/stream.yaml"
compare_runs "$tmp/stream.yaml.jsonl" "$tmp/one.yaml.jsonl" 0 || fail "a blend of one dataset differs from its stream"

tiny_llama_config "$tmp/val.yaml" 2 "  eval_iters: 3"
train2 "$tmp/val.yaml" --data.val_data_path "[2, $tmp/b.bin, 1, $tmp/tokens.bin]"
grep -q '"val_loss": [0-9]' "$tmp/val.yaml.jsonl" || fail "no validation loss from a validation blend"

tiny_llama_config "$tmp/plain.yaml" 2 "  save: $tmp/plain"
train2 "$tmp/plain.yaml"
tiny_llama_config "$tmp/mixed.yaml" 4 "  load: $tmp/plain"
out=$("$bin" train "$tmp/mixed.yaml" --data.data_path "$blend" 2>&1) && fail "a stream's checkpoint resumed a blend"
[ "$(grep -c . <<<"$out")" -eq 1 ] || fail "resuming a blend from a stream: not one line: $out"
grep -q "the resume position is of one stream of shards, the data of a blend of 2 datasets" <<<"$out" ||
    fail "resuming a blend from a stream: $out"
exit 0
