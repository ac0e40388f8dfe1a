#!/bin/bash
# What `mxtrain train` and `prepare` say, checked word for word where a message is easy to get
# wrong or to leave out: train warns about plan patterns that select nothing exactly as `plan`
# does; the token-count limit names its keys; plural agreement; no "rank 0:" prefix on a
# single process; a config nested 200,000 levels deep is refused with the limit (before
# libyaml, whose parser would take minutes over it).
# tests/run: launches MPI ranks
. "$(dirname "$0")/common.bash"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive

"$bin" prepare --out "$tmp/data" >/dev/null 2>&1 || fail "prepare failed"
sed -e "s|data/fortunes/|$tmp/data/|" -e "s|checkpoints/qwen3_moe_mxfp8/|$tmp/|" -e 's/train_iters: 1000/train_iters: 1/' -e '/^  save/d' \
    examples/qwen3_moe_mxfp8.yaml > "$tmp/moe.yaml"

# Patterns that select nothing: the same warnings from plan and from train (a typo in
# apply_modules, another in ignored_modules), on stderr, and the run still trains.
sed -e "s/apply_modules: \['model.layers.{\*}'\]/apply_modules: ['model.layers.{*}', 'model.layer.{*}']/" \
    -e "s/ignored_modules: \['\*lm_head', '\*gate'\]/ignored_modules: ['*lm_haed', '*gate']/" "$tmp/moe.yaml" > "$tmp/typo.yaml"
grep -q "model.layer.{\*}" "$tmp/typo.yaml" && grep -q "lm_haed" "$tmp/typo.yaml" || fail "could not write the typo config"
"$bin" plan "$tmp/typo.yaml" 2>"$tmp/plan.err" >/dev/null || fail "plan failed: $(cat "$tmp/plan.err")"
"$bin" train "$tmp/typo.yaml" 2>"$tmp/train.err" >/dev/null || fail "train failed: $(cat "$tmp/train.err")"
la=$(grep -n "apply_modules" "$tmp/typo.yaml" | cut -d: -f1) li=$(grep -n "ignored_modules" "$tmp/typo.yaml" | cut -d: -f1)
want="warning: apply_modules pattern 'model.layer.{*}' (line $la) selects no module
warning: ignored_modules pattern '*lm_haed' (line $li) matches no module"
[ "$(cat "$tmp/plan.err")" = "$want" ] || fail "plan's warnings: $(cat "$tmp/plan.err")"
[ "$(cat "$tmp/train.err")" = "$want" ] || fail "train's warnings differ from plan's: $(cat "$tmp/train.err")"
"$bin" train "$tmp/moe.yaml" 2>"$tmp/clean.err" >/dev/null || fail "train failed: $(cat "$tmp/clean.err")"
[ ! -s "$tmp/clean.err" ] || fail "train warned about a plan whose patterns all select something: $(cat "$tmp/clean.err")"

# Delayed scaling's keys with a recipe that scales from the current amax: one line naming the
# key, its value and the recipes it goes with, and exit 1.
sed 's/^    recipe_name: mxfp8$/    recipe_name: mxfp8\n    margin: 2/' "$tmp/moe.yaml" > "$tmp/margin.yaml"
lg=$(grep -n "margin: 2" "$tmp/margin.yaml" | cut -d: -f1)
[ -n "$lg" ] || fail "could not write the margin config"
err=$("$bin" train "$tmp/margin.yaml" 2>&1 >/dev/null) && fail "margin was accepted with mxfp8"
[ "$err" = "mxtrain train: $tmp/margin.yaml:$lg: training.quantization_plan.margin: 2 (an integer): delayed scaling's key, but recipe 'mxfp8' scales from the current amax (allowed: only with delayed, delayed_hif8_pertensor or a delayed_per_tensor_* recipe)" ] ||
    fail "margin with mxfp8: $err"

# A per_block recipe with blocks other than 1-128-128: one line naming the key, the recipe and
# the blocks allowed, and exit 1.
sed 's/^    recipe_name: mxfp8$/    recipe_name: dynamic_per_block-128-128-128_E4M3_E4M3_E4M3/' "$tmp/moe.yaml" > "$tmp/blocks.yaml"
lb=$(grep -n "recipe_name: dynamic_per_block" "$tmp/blocks.yaml" | cut -d: -f1)
[ -n "$lb" ] || fail "could not write the blocks config"
err=$("$bin" train "$tmp/blocks.yaml" 2>&1 >/dev/null) && fail "per_block blocks 128-128-128 were accepted"
[ "$err" = "mxtrain train: $tmp/blocks.yaml:$lb: training.quantization_plan.recipe_name: recipe 'dynamic_per_block-128-128-128_E4M3_E4M3_E4M3' is recognised but not supported yet: per_block blocks 128-128-128 are not implemented (allowed: 1-128-128); supported: dynamic_mx-1-1-32_*, dynamic_mx-1-32-32_* (aliases mxfp8, mxfp8-32x32), dynamic_per_tensor_* and delayed_per_tensor_* with E4M3/E5M2/HIF8 in each role (aliases tensorwise, delayed, hif8, delayed_hif8_pertensor), dynamic_per_channel_* and dynamic_per_channel_dgrad_w_per_tensor_* with E4M3/E5M2 (aliases rowwise, rowwise_with_gw_hp), dynamic_per_block-1-128-128_* with E4M3/E5M2 (alias blockwise)" ] ||
    fail "per_block 128-128-128: $err"

# The token-count limit names the two keys whose product it limits.
sed 's/micro_batch_size: 8/micro_batch_size: 100000000/' "$tmp/moe.yaml" > "$tmp/big.yaml"
lm=$(grep -n "micro_batch_size" "$tmp/big.yaml" | cut -d: -f1) ls=$(grep -n "seq_length" "$tmp/big.yaml" | cut -d: -f1)
err=$("$bin" train "$tmp/big.yaml" 2>&1 >/dev/null) && fail "a micro-batch of 12.8e9 tokens was accepted"
[ "$err" = "mxtrain train: $tmp/big.yaml:$lm: training.micro_batch_size: 100000000 x data.seq_length 128 (line $ls) = 12800000000 tokens per micro-batch (allowed: at most 16777216 = 2^24 tokens)" ] ||
    fail "token limit: $err"

# An error names the rank only when there are several: a single process's message has no
# "rank 0:" (the FSDP, MPI and checkpoint messages had one); on 2 ranks each says its rank.
sed 's/vocab_size: 257/vocab_size: 200/' "$tmp/moe.yaml" > "$tmp/vocab.yaml"
err=$("$bin" train "$tmp/vocab.yaml" 2>&1 >/dev/null) && fail "tokens beyond the vocabulary were accepted"
[ "$(grep -c . <<<"$err")" -eq 1 ] && grep -q "^mxtrain train: $tmp/data/train_000000.bin: token .* is out of range" <<<"$err" ||
    fail "single process: $err"
export OMPI_MCA_btl_vader_single_copy_mechanism=none ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
err=$(mpi_run -np 2 "$bin" train "$tmp/vocab.yaml" 2>&1 >/dev/null) &&
    fail "2 ranks: tokens beyond the vocabulary were accepted"
# the first rank to fail ends the job (MPI_Abort), so the other may be gone before it says
# anything: at least one rank speaks, each line with a rank, and only about this error
lines=$(grep "^mxtrain train: " <<<"$err")
[ -n "$lines" ] || fail "2 ranks: no message: $err"
while IFS= read -r l; do
    grep -Eq "^mxtrain train: rank [01]: $tmp/data/train_000000.bin: token .* is out of range" <<<"$l" ||
        fail "2 ranks: a message without its rank, or another error: $l"
done <<<"$lines"
# [ ] nested 200,000 deep: the depth limit's message, not a parse that takes minutes
{ printf 'model: '; head -c 200000 /dev/zero | tr '\0' '['; echo; } > "$tmp/deep.yaml"
err=$("$bin" plan "$tmp/deep.yaml" 2>&1) && fail "a config nested 200000 deep was accepted"
[ "$err" = "mxtrain plan: $tmp/deep.yaml:1: [ ] and { } nested deeper than 64 levels (allowed: at most 64)" ] ||
    fail "a config nested 200000 deep: $err"
exit 0
