#!/bin/bash
# safetensors across the language boundary, both ways: an independent Python reader
# (struct + json + numpy, bf16 via torch) checks a file the C writer made, and the C reader
# loads a file Python wrote in the Hugging Face layout (F32, BF16, F16, F64, a scalar,
# metadata, data in HF's dtype-size order).
set -u
here=$(cd "$(dirname "$0")" && pwd)
pyrun="$here/py/run"   # Python, through tests/run's fork server when there is one
bin="${BUILD:-build}/tests/test_safetensors"
fail() { echo "    $*"; exit 1; }
[ -x "$bin" ] || fail "$bin is not built"
dir=$(mktemp -d /tmp/mxt_st_oracle_XXXXXX)
trap 'rm -rf "$dir"' EXIT

"$pyrun" "$here/py/safetensors_oracle.py" write "$dir" || fail "the Python writer failed"
out=$(MXT_ORACLE_DIR="$dir" "$bin" 2>&1)
rc=$?
printf '%s\n' "$out" | sed 's/^/    /'
[ "$rc" -eq 0 ] || fail "test_safetensors in oracle mode exited $rc"
grep -q '^# tally 2 0$' <<<"$out" || fail "test_safetensors in oracle mode did not pass both oracle tests"
"$pyrun" "$here/py/safetensors_oracle.py" check "$dir" || fail "the Python reader rejected the C-written file"
exit 0
