#!/bin/bash
# Text samples while training (training.sample_interval, sample_tokens, sample_prompt):
#  - a run with a sample every 2 steps and after the last has the metrics of a run without
#    samples, bit for bit (sampling takes none of the run's random numbers or data), on 1
#    rank, on 2 (FSDP: rank 0 gathers the weights) and on 2 with expert parallelism;
#  - the last sample is the text `mxtrain generate` writes for the last checkpoint with the
#    sampling the docs name (temperature 1, top-k 40, seed training.seed + step), so the
#    gathered weights are the checkpoint's;
#  - only rank 0 prints; a prompt longer than the model's positions is one line at start.
# tests/run: launches MPI ranks
. "$(dirname "$0")/common.bash"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"   # Open MPI's (see fsdp.sh)

write_tokens "$tmp/tokens.bin" 20000 7919
config() {   # config NAME EXTRA-TRAINING-LINES [EXTRA-PARALLEL-LINES]
    cat > "$tmp/$1.yaml" <<YAML
model:
  model_type: qwen3_moe
  vocab_size: 257
  hidden_size: 32
  intermediate_size: 48
  num_hidden_layers: 2
  num_attention_heads: 4
  num_key_value_heads: 2
  head_dim: 8
  max_position_embeddings: 64
  num_experts: 4
  num_experts_per_tok: 2
  moe_intermediate_size: 16
data:
  data_path: $tmp/tokens.bin
  seq_length: 16
parallel:
  timeout_s: 300
${3:-}
training:
  micro_batch_size: 2
  lr: 3.0e-3
  train_iters: 4
  seed: 77
  metrics_path: $tmp/$1.jsonl
$2
YAML
}
last_sample() {   # the text of the last sample in log $1 after prompt $2 (bytes, with a final newline)
    "$py" - "$1" "$2" <<'PY'
import sys
log, prompt = open(sys.argv[1], "rb").read(), sys.argv[2].encode()
head = b"sample at step 4:\n" + prompt
at = log.rindex(head) + len(head)
sys.stdout.buffer.write(log[at:log.index(b"\ndone: ", at)] + b"\n")
PY
}
for setup in "1 " "2 " "2   expert_parallel_size: 2"; do
    ranks=${setup%% *} par=${setup#* }
    name="r$ranks${par:+ep}"
    config "$name" "  sample_interval: 2
  sample_prompt: \"Q: \"
  save: $tmp/$name.ck" "$par"
    config "${name}_off" "  sample_tokens: 0" "$par"
    train_on "$ranks" "$tmp/$name.yaml"
    train_on "$ranks" "$tmp/${name}_off.yaml"
    compare_runs "$tmp/${name}_off.jsonl" "$tmp/$name.jsonl" 0 || fail "$name: samples changed the training"
    [ "$(grep -c '^sample at step [24]:$' "$tmp/$name.yaml.log")" = 2 ] ||
        fail "$name: not one sample at steps 2 and 4: $(grep '^sample' "$tmp/$name.yaml.log")"
    ! grep -q '^sample' "$tmp/${name}_off.yaml.log" || fail "$name: sample_tokens 0 printed a sample"
    last_sample "$tmp/$name.yaml.log" "Q: " > "$tmp/$name.sample"
    "$bin" generate "$tmp/$name.ck/iter_0000004" --prompt "Q: " --max-new-tokens 128 --temperature 1 --top-k 40 \
        --seed 81 2>/dev/null | "$py" -c 'import sys; sys.stdout.buffer.write(sys.stdin.buffer.read().rstrip(b"\n") + b"\n")' \
        > "$tmp/$name.generated" || fail "$name: generate failed"
    cmp -s "$tmp/$name.sample" "$tmp/$name.generated" ||
        fail "$name: the last sample is not generate's text: $(od -An -c "$tmp/$name.sample" | head -2) against $(od -An -c "$tmp/$name.generated" | head -2)"
done

# A prompt the model cannot take is refused at start, in one line.
long=$(head -c 70 /dev/zero | tr '\0' a)
config long "  sample_prompt: $long"
"$bin" train "$tmp/long.yaml" > "$tmp/long.out" 2> "$tmp/long.err" && fail "a 70-byte prompt was accepted"
[ "$(cat "$tmp/long.err")" = "mxtrain train: training.sample_prompt: 70 bytes and the end-of-text token before them exceed model.max_position_embeddings 64 (allowed: a shorter prompt)" ] ||
    fail "long prompt: $(cat "$tmp/long.err")"
echo "train_sample: ok"
