#!/bin/bash
# mxtrain generate:
#  - greedy decoding identical, token for token (up to 40 new tokens, at least 32 before
#    an end-of-text in one sequence of each model at least; the others stop at it), to a plain PyTorch decoding with a KV cache of the same weights in fp32
#    (tests/py/generate_ref.py, which decodes each prompt alone): Llama (grouped-query,
#    attention biases, tied embeddings), Qwen3 (q/k norms), Qwen3-MoE; two prompts of
#    different lengths decoded together, and one streamed; from a checkpoint, its save
#    directory and its `mxtrain export` directory;
#  - sampling: top-k 1 and a tiny top-p are greedy; a seed repeats its text, another seed
#    gives other text; bf16 and a quantization plan run;
#  - a checkpoint that carries a tokenizer.json (data.tokenizer; trained on text `prepare
#    --tokenizer` made): the prompt encoded as prepare encodes a document, and the text of
#    the same greedy tokens as PyTorch's, decoded by the reference's own byte-level table;
#  - bad options, prompts and checkpoints: one line on stderr, nothing on stdout, non-zero exit.
. "$(dirname "$0")/common.bash"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
ref="$(dirname "$0")/py/generate_ref.py"

write_tokens "$tmp/tokens.bin" 20000 7919
model() {   # model TYPE EXTRA: a 257-token model; weights spread wide (initializer_range 0.5) so that
            # the most probable token leads the next by far more than fp32 rounding moves logits
    cat <<YAML
model:
  model_type: $1
  vocab_size: 257
  hidden_size: 32
  intermediate_size: 48
  num_hidden_layers: 2
  num_attention_heads: 4
  num_key_value_heads: 2
  head_dim: 8
  max_position_embeddings: 64
  initializer_range: 0.5
$2
data:
  data_path: $tmp/tokens.bin
  seq_length: 16
parallel:
  fsdp_plan:
    param_dtype: fp32
training:
  micro_batch_size: 2
  lr: 1.0e-5
  train_iters: 1
  save: $tmp/$1
YAML
}
model llama "  attention_bias: true
  tie_word_embeddings: true" > "$tmp/llama.yaml"
model qwen3 "" > "$tmp/qwen3.yaml"
model qwen3_moe "  num_experts: 4
  num_experts_per_tok: 2
  moe_intermediate_size: 16
  norm_topk_prob: true
  mlp_only_layers: [0]" > "$tmp/qwen3_moe.yaml"

for m in llama qwen3 qwen3_moe; do
    "$bin" train "$tmp/$m.yaml" > "$tmp/$m.train" 2>&1 || fail "$m: train failed: $(cat "$tmp/$m.train")"
    ck="$tmp/$m/iter_0000001"
    "$pyrun" "$ref" "$ck" 40 "Once upon a time" "Q:" > "$tmp/$m.want" 2> "$tmp/$m.ref" ||
        fail "$m: the PyTorch reference failed: $(cat "$tmp/$m.ref")"
    [ "$(grep -c '^generate_ref: \(3[2-9]\|40\) tokens' "$tmp/$m.ref")" -ge 1 ] ||
        fail "$m: the reference ended both sequences before 32 tokens: $(cat "$tmp/$m.ref")"
    "$bin" generate "$ck" --prompt "Once upon a time" --prompt "Q:" --max-new-tokens 40 > "$tmp/$m.got" 2> "$tmp/$m.err" ||
        fail "$m: generate failed: $(cat "$tmp/$m.err")"
    cmp -s "$tmp/$m.got" "$tmp/$m.want" ||
        fail "$m: two prompts decoded together differ from PyTorch's: $(od -An -tu1 "$tmp/$m.got" | head -3) against $(od -An -tu1 "$tmp/$m.want" | head -3)"
    grep -q "^mxtrain generate: .*tokens/s$" "$tmp/$m.err" || fail "$m: no tokens/s on stderr: $(cat "$tmp/$m.err")"
    # one prompt, streamed; from the save directory (its latest checkpoint)
    "$pyrun" "$ref" "$ck" 40 "Hello" > "$tmp/$m.want1" 2>/dev/null || fail "$m: the reference failed"
    "$bin" generate "$tmp/$m" --prompt "Hello" --max-new-tokens 40 > "$tmp/$m.got1" 2> "$tmp/$m.err" ||
        fail "$m: generate failed: $(cat "$tmp/$m.err")"
    cmp -s "$tmp/$m.got1" "$tmp/$m.want1" || fail "$m: one prompt differs from PyTorch's"
done

# BPE: a small byte-level BPE tokenizer (13 tokens: <|endoftext|> 7, <|im_start|> 8 that its
# template puts first), a model of its 13 tokens trained on text it encoded, and its
# checkpoint carrying it. "abc" is, as prepare encodes a document, 7 8 5 (tests/model_dir_tokenizer.sh)
tok="$tmp/tok"
mkdir -p "$tok" "$tmp/bpe_text"
cp tests/fuzz/tokenizer/qwen_style.json "$tok/tokenizer.json"
printf '{"eos_token": "<|endoftext|>"}\n' > "$tok/tokenizer_config.json"
for i in $(seq 40); do printf 'abc ab ca \303\251 cab abc%.0s' $(seq $i) > "$tmp/bpe_text/d$i.txt"; done
"$bin" prepare --tokenizer "$tok" --val-fraction 0 --out "$tmp/bpe_data" "$tmp"/bpe_text/*.txt > /dev/null 2>&1 ||
    fail "prepare --tokenizer failed"
sed -e "s|vocab_size: 257|vocab_size: 13|; s|data_path: .*|data_path: $tmp/bpe_data/train_*.bin\n  tokenizer: $tok|" \
    -e "s|save: $tmp/llama|save: $tmp/bpe|; s|train_iters: 1|train_iters: 3|" "$tmp/llama.yaml" > "$tmp/bpe.yaml"
"$bin" train "$tmp/bpe.yaml" > "$tmp/bpe.train" 2>&1 || fail "bpe: train failed: $(tail -3 "$tmp/bpe.train")"
[ -f "$tmp/bpe/iter_0000003/tokenizer.json" ] || fail "bpe: the checkpoint carries no tokenizer.json"
"$pyrun" "$ref" "$tmp/bpe/iter_0000003" 24 --ids 7 7,8,5 > "$tmp/bpe.want" 2> "$tmp/bpe.ref" ||
    fail "bpe: the PyTorch reference failed: $(cat "$tmp/bpe.ref")"
"$bin" generate "$tmp/bpe" --prompt "abc" --max-new-tokens 24 > "$tmp/bpe.got" 2> "$tmp/bpe.err" ||
    fail "bpe: generate failed: $(cat "$tmp/bpe.err")"
cmp -s "$tmp/bpe.got" "$tmp/bpe.want" ||
    fail "bpe: '$(cat "$tmp/bpe.got")' is not the reference's '$(cat "$tmp/bpe.want")' ($(cat "$tmp/bpe.ref"))"
[ "$(wc -c < "$tmp/bpe.want")" -gt 4 ] || fail "bpe: the reference's text is too short to tell: $(cat "$tmp/bpe.ref")"
# a tokenizer with more tokens than the model: one line, nothing on stdout
cp -r "$tmp/bpe/iter_0000003" "$tmp/bpe_small"
"$py" -c 'import json, sys; p = sys.argv[1]; c = json.load(open(p)); c["vocab_size"] = 10; json.dump(c, open(p, "w"))' \
    "$tmp/bpe_small/config.json"
out=$("$bin" generate "$tmp/bpe_small" --prompt "abc" 2>&1 >"$tmp/small.out") && fail "bpe: a tokenizer larger than the model was accepted"
[ "$(wc -l <<<"$out")" -eq 1 ] && grep -q "the tokenizer has 13 tokens, more than the model's vocab_size 10" <<<"$out" &&
    [ ! -s "$tmp/small.out" ] || fail "bpe: not one line for a tokenizer larger than the model: $out"

# An exported Hugging Face directory gives the same text as its checkpoint.
"$bin" export "$tmp/qwen3_moe" --out "$tmp/hf" > /dev/null || fail "export failed"
"$bin" generate "$tmp/hf" --prompt "Hello" --max-new-tokens 40 > "$tmp/hf.got" 2> "$tmp/hf.err" ||
    fail "generate from the exported directory failed: $(cat "$tmp/hf.err")"
cmp -s "$tmp/hf.got" "$tmp/qwen3_moe.want1" || fail "the exported directory's text differs"

# Prompts from a file, one a line: the same as the same --prompt options.
printf 'Once upon a time\nQ:\n' > "$tmp/prompts.txt"
"$bin" generate "$tmp/qwen3" --prompt-file "$tmp/prompts.txt" --max-new-tokens 40 > "$tmp/file.got" 2>/dev/null ||
    fail "--prompt-file failed"
cmp -s "$tmp/file.got" "$tmp/qwen3.want" || fail "--prompt-file differs from --prompt"

# Sampling: one candidate (top-k 1, or a top-p only the first reaches) is greedy; a seed
# repeats its text; another seed gives another.
ck="$tmp/qwen3/iter_0000001"
for opts in "--temperature 1 --top-k 1" "--temperature 2 --top-p 0.000001"; do
    "$bin" generate "$ck" --prompt Hello --max-new-tokens 40 $opts > "$tmp/s.got" 2>/dev/null || fail "$opts failed"
    cmp -s "$tmp/s.got" "$tmp/qwen3.want1" || fail "$opts is not greedy"
done
sample() { "$bin" generate "$ck" --prompt Hello --max-new-tokens 40 --temperature 1 --top-p 0.9 --top-k 50 --seed "$1" 2>/dev/null; }
[ "$(sample 1 | od -An -tx1)" = "$(sample 1 | od -An -tx1)" ] || fail "seed 1 gave two texts"
[ "$(sample 1 | od -An -tx1)" != "$(sample 2 | od -An -tx1)" ] || fail "seeds 1 and 2 gave one text"

# bf16 and a quantization plan run (their text is their own).
"$bin" generate "$ck" --prompt Hello --max-new-tokens 8 --dtype bf16 > /dev/null 2> "$tmp/bf16.err" ||
    fail "--dtype bf16 failed: $(cat "$tmp/bf16.err")"
grep -q "bf16" "$tmp/bf16.err" || fail "--dtype bf16 not reported: $(cat "$tmp/bf16.err")"
cat "$tmp/qwen3_moe.yaml" - > "$tmp/plan.yaml" <<'YAML'
  quantization_plan:
    recipe_name: mxfp8
    apply_modules: ['model.layers.{*}']
    ignored_modules: ['*gate']
    quant_converters: ['quantize.linear.mx', 'quantize.moe.mx']
YAML
"$bin" generate "$tmp/qwen3_moe" --plan "$tmp/plan.yaml" --prompt Hello --max-new-tokens 8 > /dev/null 2> "$tmp/plan.err" ||
    fail "--plan failed: $(cat "$tmp/plan.err")"
grep -q "with the quantization plan" "$tmp/plan.err" || fail "--plan not reported: $(cat "$tmp/plan.err")"

# Errors: one line, nothing on stdout, non-zero exit.
mkdir "$tmp/empty"
cp -r "$ck" "$tmp/v61" && sed -i 's/"vocab_size": 257/"vocab_size": 61/' "$tmp/v61/config.json"
: > "$tmp/none.txt"
long=$(head -c 80 /dev/zero | tr '\0' a)
"$bin" generate --help > "$tmp/usage" || fail "generate --help failed"
expect_error() {   # expect_error MESSAGE-PART ARGS...
    local want="$1"
    shift
    "$bin" generate "$@" > "$tmp/e.out" 2> "$tmp/e.err" && fail "accepted: $*"
    [ ! -s "$tmp/e.out" ] || fail "wrote to stdout on error: $*"
    # one line, then for a misused command line its usage
    tail -n +2 "$tmp/e.err" > "$tmp/e.rest"
    [ ! -s "$tmp/e.rest" ] || cmp -s "$tmp/e.rest" "$tmp/usage" || fail "not one line: $*: $(cat "$tmp/e.err")"
    head -1 "$tmp/e.err" | grep -q '^mxtrain generate: ' || fail "$*: $(head -1 "$tmp/e.err")"
    grep -qF -- "$want" "$tmp/e.err" || fail "$*: $(head -1 "$tmp/e.err") (wanted: $want)"
}
expect_error "missing CHECKPOINT" --prompt x
expect_error "missing --prompt or --prompt-file" "$ck"
expect_error "unknown option '--temp'" "$ck" --prompt x --temp 1
expect_error "--prompt needs a value" "$ck" --prompt
expect_error "--temperature: '-1' is not allowed" "$ck" --prompt x --temperature -1
expect_error "--temperature: 'nan' is not allowed" "$ck" --prompt x --temperature nan
expect_error "--top-k: 'x' is not allowed" "$ck" --prompt x --top-k x
expect_error "--top-p: '0' is not allowed" "$ck" --prompt x --top-p 0
expect_error "--top-p: '1.5' is not allowed" "$ck" --prompt x --top-p 1.5
expect_error "--max-new-tokens: '0' is not allowed" "$ck" --prompt x --max-new-tokens 0
expect_error "--seed: '-3' is not allowed" "$ck" --prompt x --seed -3
expect_error "--dtype: 'fp16' is not allowed" "$ck" --prompt x --dtype fp16
expect_error "$tmp/nowhere" "$tmp/nowhere" --prompt x
expect_error "$tmp/empty" "$tmp/empty" --prompt x
expect_error "vocab_size 61 is not the byte-level vocabulary" "$tmp/v61" --prompt x
expect_error "prompt 2: a prompt of 81 tokens (allowed: at most 64)" "$ck" --prompt x --prompt "$long"
expect_error "--prompt-file: $tmp/missing.txt" "$ck" --prompt-file "$tmp/missing.txt"
expect_error "--prompt-file: $tmp/none.txt: no prompt in it" "$ck" --prompt-file "$tmp/none.txt"
expect_error "$tmp/nowhere.yaml" "$ck" --prompt x --plan "$tmp/nowhere.yaml"
echo "generate: ok"
