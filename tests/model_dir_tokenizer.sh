#!/bin/bash
# Tokenizer files in model directories: with data.tokenizer, a checkpoint holds the
# tokenizer's tokenizer.json, tokenizer_config.json and special_tokens_map.json (copies,
# byte for byte) and its config.json the BOS and EOS ids; `mxtrain export` takes them along;
# a run from that export (model_name_or_path, no data.tokenizer) copies them from there. A
# data.tokenizer without a tokenizer.json is refused in one line before training. And
# `prepare --tokenizer` on this small tokenizer writes the ids worked out by hand (uint16:
# a vocabulary of 13).
. "$(dirname "$0")/common.bash"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
tok="$tmp/tok"
mkdir -p "$tok"
cp tests/fuzz/tokenizer/qwen_style.json "$tok/tokenizer.json"   # <|endoftext|> 7, <|im_start|> 8
printf '{"eos_token": "<|endoftext|>", "bos_token": {"content": "<|im_start|>"}, "model_max_length": 1000000000000000019884624838656}\n' \
    > "$tok/tokenizer_config.json"
printf '{"eos_token": "<|endoftext|>"}\n' > "$tok/special_tokens_map.json"

# prepare: "abc abc" -> pieces "abc" " abc" -> abc (5), Ġ (3) abc (5); the template puts
# <|im_start|> (8) first; the end-of-document token <|endoftext|> (7) before the document.
printf 'abc abc' > "$tmp/doc.txt"
"$bin" prepare --tokenizer "$tok" --val-fraction 0 --out "$tmp/data" "$tmp/doc.txt" >/dev/null 2>&1 || fail "prepare failed"
got=$("$py" -c 'import sys, numpy as np; d = open(sys.argv[1], "rb").read(); h = np.frombuffer(d[:12], "<i4")
print(*h, *np.frombuffer(d[1024:], "<u2"))' "$tmp/data/train_000000.bin")
[ "$got" = "20240520 1 5 7 8 5 3 5" ] || fail "prepare wrote header and ids $got, want 20240520 1 5 7 8 5 3 5"

same_files() {   # same_files DIR: DIR's tokenizer files are those of $tok, config.json has the ids
    for f in tokenizer.json tokenizer_config.json special_tokens_map.json; do
        cmp -s "$tok/$f" "$1/$f" || fail "$1/$f is not a copy of $tok/$f"
    done
    "$py" -c 'import json, sys; c = json.load(open(sys.argv[1])); sys.exit(not (c["bos_token_id"] == 8 and c["eos_token_id"] == 7 and c["vocab_size"] == 61))' \
        "$1/config.json" || fail "$1/config.json lacks bos_token_id 8, eos_token_id 7: $(tail -4 "$1/config.json")"
}
write_tokens "$tmp/tokens.bin" 4000 7919
tiny_llama_config "$tmp/run.yaml" 2 "  save: $tmp/ck"
printf '  tokenizer: %s\n' "$tok" > "$tmp/tok.line"
sed -i "/^  seq_length:/r $tmp/tok.line" "$tmp/run.yaml"
train_on 1 "$tmp/run.yaml"
same_files "$tmp/ck/iter_0000002"
"$bin" export "$tmp/ck" --out "$tmp/hf" >/dev/null || fail "export failed"
same_files "$tmp/hf"

# from the exported directory: its tokenizer goes into the new run's checkpoints
cat > "$tmp/cont.yaml" <<YAML
model:
  model_name_or_path: $tmp/hf
data:
  data_path: $tmp/tokens.bin
  seq_length: 16
training:
  micro_batch_size: 2
  lr: 1.0e-3
  train_iters: 1
  save: $tmp/ck2
YAML
train_on 1 "$tmp/cont.yaml"
same_files "$tmp/ck2/iter_0000001"

sed "s|tokenizer: .*|tokenizer: $tmp/none|" "$tmp/run.yaml" > "$tmp/bad.yaml"
sed -i "s|save: .*|save: $tmp/ck3|" "$tmp/bad.yaml"
err=$("$bin" train "$tmp/bad.yaml" 2>&1 >/dev/null) && fail "a missing data.tokenizer was accepted"
[ "$err" = "mxtrain train: data.tokenizer: '$tmp/none' is not a tokenizer.json or a directory holding one (allowed: a Hugging Face tokenizer.json, a directory with one, or null)" ] ||
    fail "missing data.tokenizer: $err"
[ ! -e "$tmp/ck3/iter_0000002" ] || fail "a checkpoint was written"
