#!/bin/bash
# A run that cannot fit is refused before it starts (training.memory_check): the memory a
# rank would hold, predicted before anything is allocated, against what the host has
# available. A config whose activations alone are several times this machine's memory is
# refused at once with one line naming the prediction, its largest part and what is
# available, exit status 1, and no output file; `plan` prints the same prediction; with
# training.memory_check: false the run goes on to its allocations (and is refused there,
# where the kernel's overcommit heuristic refuses one larger than the machine). With a
# quantization plan, plan also says what it saves against the same config in bf16.
. "$(dirname "$0")/common.bash"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive

write_tokens "$tmp/tokens.bin" 4000 7
mem_kib=$(sed -n 's/^MemTotal:[[:space:]]*\([0-9]*\) kB/\1/p' /proc/meminfo)
# the activations of a token, from plan on a micro-batch that fits; then micro-batches of
# 65536 tokens, enough of them for about 4x the machine's memory (at most 2^24 tokens)
tiny_llama_config "$tmp/big.yaml" 3 "  save: $tmp/ckpt
  plot_path: $tmp/big.png"
"$bin" plan "$tmp/big.yaml" --json > "$tmp/plan.json" 2>"$tmp/plan.err" || fail "plan failed: $(cat "$tmp/plan.err")"
per_token=$($py -c 'import json, sys; print(json.load(open(sys.argv[1]))["per_step"]["mem_activation_bytes"] // 32)' \
    "$tmp/plan.json")
seq=65536
batch=$(( mem_kib * 1024 * 4 / (per_token * seq) + 1 ))
[ $batch -le 256 ] || { echo "    skipped: this machine's memory needs more than 2^24 tokens of the test's model"; exit 0; }
sed -i -e "s/max_position_embeddings: 16/max_position_embeddings: $seq/" -e "s/seq_length: 16/seq_length: $seq/" \
    -e "s/micro_batch_size: 2/micro_batch_size: $batch/" "$tmp/big.yaml"

# plan: the activations, and the whole, above the machine's memory
"$bin" plan "$tmp/big.yaml" --json > "$tmp/plan.json" 2>"$tmp/plan.err" || fail "plan failed: $(cat "$tmp/plan.err")"
$py - "$tmp/plan.json" "$mem_kib" <<'PY' || fail "plan's prediction is not above the machine's memory"
import json, sys
p, mem = json.load(open(sys.argv[1])), int(sys.argv[2]) * 1024
act, total = p["per_step"]["mem_activation_bytes"], p["memory"]["predicted_bytes"]
assert act > 2 * mem and total > act, (act, total, mem)
PY

start=$SECONDS
"$bin" train "$tmp/big.yaml" >"$tmp/out" 2>"$tmp/err"
rc=$?
[ $rc -eq 1 ] || fail "train exited $rc, want 1: $(tail -2 "$tmp/err")"
[ $((SECONDS - start)) -le 20 ] || fail "the refusal took $((SECONDS - start)) s: it should come before any work"
[ "$(wc -l < "$tmp/err")" -eq 1 ] || fail "want one line on stderr, got: $(cat "$tmp/err")"
for want in "training.memory_check: this run needs about" "(activations" "is available per rank (" \
    "lower training.micro_batch_size ($batch) or data.seq_length ($seq)" "training.memory_check: false"; do
    grep -qF "$want" "$tmp/err" || fail "the refusal does not say '$want': $(cat "$tmp/err")"
done
[ ! -e "$tmp/ckpt" ] && [ ! -e "$tmp/big.png" ] && [ ! -e "$tmp/big.yaml.jsonl" ] ||
    fail "the refused run left files: $(ls "$tmp")"
echo "    refused at once: $(cut -c1-150 "$tmp/err")..."

# the same config, small enough: the check lets it through
sed -e "s/seq_length: $seq/seq_length: 16/" -e "s/micro_batch_size: $batch/micro_batch_size: 2/" "$tmp/big.yaml" \
    > "$tmp/small.yaml"
"$bin" train "$tmp/small.yaml" >"$tmp/out" 2>"$tmp/err" || fail "a run that fits was refused: $(cat "$tmp/err")"

# what the guide's plan saves against bf16 at the same settings, as plan says it: the two
# totals are the predictions of the config and of the same config without its plan
plan_section="  quantization_plan:
    recipe_name: mxfp8
    apply_modules: ['model.layers.{*}']
    quant_converters: ['quantize.linear.mx']
    enable_fsdp_low_precision_all_gather: true"
tiny_llama_config "$tmp/mx.yaml" 3 "$plan_section"
tiny_llama_config "$tmp/bf16.yaml" 3
for c in mx bf16; do
    "$bin" plan "$tmp/$c.yaml" --json > "$tmp/$c.json" 2>"$tmp/plan.err" || fail "plan failed: $(cat "$tmp/plan.err")"
done
"$bin" plan "$tmp/mx.yaml" > "$tmp/mx.txt" 2>"$tmp/plan.err" || fail "plan failed: $(cat "$tmp/plan.err")"
line=$(grep "^memory against bf16 with the same settings, per rank: " "$tmp/mx.txt") ||
    fail "plan does not say what the plan saves against bf16: $(grep '^memory' "$tmp/mx.txt")"
$py - "$tmp/mx.json" "$tmp/bf16.json" "$line" <<'PY' || fail "plan's comparison with bf16 is not the two predictions: $line"
import json, re, sys
mx, bf = (json.load(open(f)) for f in sys.argv[1:3])
run = lambda p: p["memory"]["predicted_bytes"] - p["memory"]["process_bytes"]   # each plan its own process
diff = lambda key: (mx["per_step"][key] - bf["per_step"][key]) / 2**20
want = f"MX shards {diff('mem_mx_shard_bytes'):+.1f} MiB, gather buffers {diff('mem_gathered_bytes'):+.1f} MiB, " \
       f"activations {diff('mem_activation_bytes'):+.1f} MiB; in all {(run(mx) - run(bf)) / 2**20:+.1f} MiB"
assert want in sys.argv[3], want
PY
grep -q "^memory against bf16" <("$bin" plan "$tmp/bf16.yaml" 2>/dev/null) && fail "plan compares a config without a plan with bf16"

# the prediction against the peak: train logs the peak it predicted at start beside the
# peak RSS (getrusage) of every step. On the example models (activations about 20 MiB) the
# process itself (libraries, oneDNN's kernels) is a third of it, and the prediction is 8-9%
# below the peak on one rank (on the bench configs 1-7%: docs/memory.md); held here to 15%,
# each category having its own exact test
for p in "" "$plan_section"; do
    c="$tmp/example${p:+_mx}.yaml"
    { sed -n '/^model:/,/^$/p' examples/qwen3_tiny.yaml
      printf 'data:\n  data_path: %s\n  seq_length: 128\ntraining:\n  micro_batch_size: 8\n  lr: 1.0e-3\n  train_iters: 3\n' "$tmp/tokens.bin"
      printf '  metrics_path: %s\n%s\n' "$c.jsonl" "$p"; } > "$c"
    "$bin" train "$c" > "$c.out" 2>&1 || fail "training $c failed: $(tail -2 "$c.out")"
done
if grep -qa __asan_init "$bin"; then
    echo "    the predicted peak against the peak RSS not compared: a sanitizer build (its shadow memory is in the RSS)"
else
$py - "$tmp/example.yaml.jsonl" "$tmp/example_mx.yaml.jsonl" <<'PY' || fail "the predicted peak is not within 15% of the peak RSS"
import json, sys
for path in sys.argv[1:]:
    r = [json.loads(l) for l in open(path) if '"loss"' in l][-1]
    ratio = r["mem_predicted_bytes"] / r["peak_mem_bytes"]
    print(f"    {path.split('/')[-1]}: predicted {r['mem_predicted_bytes'] >> 20} MiB, peak {r['peak_mem_bytes'] >> 20} MiB ({ratio:.3f})")
    assert 0.85 <= ratio <= 1.15, ratio
PY
fi

# memory_check: false skips the check: the allocation is what refuses the run then (one
# larger than the machine, under the kernel's heuristic overcommit; a sanitizer build
# reserves shadow memory instead, and a kernel that always overcommits would let it start)
if grep -qa __asan_init "$bin" || [ "$(cat /proc/sys/vm/overcommit_memory)" = 1 ]; then
    echo "    memory_check: false not run (a sanitizer build, or the kernel always overcommits)"
    exit 0
fi
"$bin" train "$tmp/big.yaml" --training.memory_check false >"$tmp/out" 2>"$tmp/err"
rc=$?
[ $rc -eq 1 ] || fail "with memory_check false: exit $rc, want 1: $(tail -2 "$tmp/err")"
grep -q "training.memory_check" "$tmp/err" && fail "with memory_check false the check still ran: $(cat "$tmp/err")"
grep -q "out of memory for the model" "$tmp/err" || fail "with memory_check false: $(cat "$tmp/err")"
echo "    memory_check: false: the allocation refused it: $(cat "$tmp/err")"
