#!/bin/bash
# `mxtrain prepare --tokenizer` refuses bad tokenizer files and options with one line (word
# for word below) naming the file or option, the value and what is allowed, exits non-zero
# and writes nothing: a missing path, a directory without tokenizer.json, malformed JSON, a
# model type and a normalizer it does not implement, a template token id outside the
# vocabulary, no end-of-document token, an --eod
# the tokenizer does not have, --eod without --tokenizer, --tokenizer without a value.
. "$(dirname "$0")/common.bash"
cd "$tmp" || fail "no scratch directory"
printf 'hello' > doc.txt
mkdir t empty
cp "$OLDPWD/tests/fuzz/tokenizer/qwen_style.json" t/tokenizer.json
"$py" - <<'PY'
import json
d = json.load(open("t/tokenizer.json"))
d["model"]["type"] = "WordPiece"
json.dump(d, open("wordpiece.json", "w"))
d = json.load(open("t/tokenizer.json"))
d["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u2581"}]}
json.dump(d, open("prepend.json", "w"))
d = json.load(open("t/tokenizer.json"))
n = max(d["model"]["vocab"].values()) + 1 + len(d.get("added_tokens") or [])
d["post_processor"] = {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}}],
                       "special_tokens": {"<s>": {"id": "<s>", "ids": [100000], "tokens": ["<s>"]}}}
json.dump(d, open("template.json", "w"))
PY
printf '{"model": {' > truncated.json

expect() {   # expect STATUS "MESSAGE" ARGS...: prepare ARGS fails with STATUS, MESSAGE its first line
    local want_rc=$1 want=$2 err rc
    shift 2
    err=$("$bin" prepare --out out "$@" 2>&1 >/dev/null)
    rc=$?
    [ "$rc" -eq "$want_rc" ] || fail "prepare $*: exit $rc, want $want_rc: $err"
    [ "$(head -1 <<<"$err")" = "$want" ] || fail "prepare $*: said '$(head -1 <<<"$err")', want '$want'"
    [ "$want_rc" -eq 2 ] || [ "$(wc -l <<<"$err")" -eq 1 ] || fail "prepare $*: more than one line: $err"
    [ ! -e out ] || fail "prepare $*: wrote out/"
}
allowed="allowed: a Hugging Face tokenizer.json, or a directory holding one"
expect 1 "mxtrain prepare: none.json: cannot open (No such file or directory; $allowed)" --tokenizer none.json doc.txt
expect 1 "mxtrain prepare: empty/tokenizer.json: cannot open (No such file or directory; $allowed)" --tokenizer empty doc.txt
expect 1 "mxtrain prepare: truncated.json:1: string or '}' expected near end of file" --tokenizer truncated.json doc.txt
expect 1 "mxtrain prepare: wordpiece.json: model type 'WordPiece' is not implemented (allowed: BPE)" --tokenizer wordpiece.json doc.txt
out=$("$bin" prepare --out out --tokenizer template.json doc.txt 2>&1 >/dev/null)
grep -q "^mxtrain prepare: template.json: post_processor TemplateProcessing: special token '<s>' has id 100000, outside the vocabulary (allowed: an id from 0 to [0-9]*)\$" <<<"$out" ||
    fail "a template id outside the vocabulary: '$out'"
[ ! -e out ] || fail "a template id outside the vocabulary: wrote out/"
expect 1 "mxtrain prepare: prepend.json: normalizer.normalizers[] type 'Prepend' is not implemented (allowed: NFC, NFD, NFKC, NFKD, a Sequence of one of them, or null)" \
    --tokenizer prepend.json doc.txt
expect 1 "mxtrain prepare: t/tokenizer.json has no end-of-document token (no tokenizer_config.json beside it naming an eos_token; allowed: --eod TOKEN)" \
    --tokenizer t doc.txt
expect 1 "mxtrain prepare: --eod '<|nope|>\\n' is not a token of t/tokenizer.json (allowed: one of its added tokens or vocabulary entries)" \
    --tokenizer t --eod "<|nope|>
" doc.txt
expect 2 "mxtrain prepare: --eod needs --tokenizer (byte-level tokens end documents with 256)" --eod x doc.txt
expect 2 "mxtrain prepare: --tokenizer needs a value" --tokenizer
# and the same tokenizer with --eod works
"$bin" prepare --out out --tokenizer t --eod '<|endoftext|>' --val-fraction 0 doc.txt >/dev/null 2>&1 || fail "--eod <|endoftext|> failed"
[ -s out/train_000000.bin ] || fail "no shard written"
