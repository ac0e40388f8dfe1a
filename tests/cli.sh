#!/bin/bash
# The CLI answers good and bad input as documented: exit 0 with the demo's table, exit 2
# with a one-line message naming the option and what is allowed, for every misuse.
set -u
bin="${BUILD:-build}/mxtrain"
fail() { echo "    $*"; exit 1; }

out=$("$bin" demo --rows 64 --cols 100 2>&1) || fail "demo on 64x100 failed: $out"
for fmt in "E4M3   floor" "E4M3   rceil" "E5M2   floor" "E5M2   rceil"; do
    grep -q "^$fmt " <<<"$out" || fail "demo output lacks a '$fmt' row: $out"
done
# rceil never saturates: the saturated column of both rceil rows is 0
awk '$2 == "rceil" && $5 != 0 { bad = 1 } END { exit bad }' <<<"$out" || fail "rceil saturated something: $out"

expect_usage_error() {   # expect_usage_error "what must appear" args...
    local want=$1; shift
    local err
    err=$("$bin" "$@" 2>&1 >/dev/null)
    local rc=$?
    [ "$rc" -eq 2 ] || fail "mxtrain $*: exit $rc, want 2"
    grep -qF -- "$want" <<<"$err" || fail "mxtrain $*: message lacks '$want': $err"
}
expect_usage_error "--rows: '0' is not allowed (allowed: an integer from 1 to" demo --rows 0
expect_usage_error "--cols: 'abc' is not allowed" demo --cols abc
expect_usage_error "--seed: '-4' is not allowed" demo --seed -4
expect_usage_error "unknown option '--bogus'" demo --bogus
expect_usage_error "--rows needs a value" demo --rows
expect_usage_error "unknown command 'frobnicate' (allowed:" frobnicate
expect_usage_error "usage: mxtrain" 
"$bin" --help | grep -q "usage: mxtrain" || fail "--help does not print usage"
"$bin" demo --help | grep -q "usage: mxtrain demo" || fail "demo --help does not print usage"
exit 0
