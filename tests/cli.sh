#!/bin/bash
# The CLI answers good and bad input as documented: exit 0 with the demo's table, exit 2
# with a one-line message naming the option (or variable) and what is allowed, for every misuse.
# Output that cannot be written (standard output on /dev/full, or closed) is an error: a
# message on standard error and a non-zero exit, never exit 0.
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
# MXTRAIN_KERNEL, and its older name MXTRAIN_MX_KERNEL: a kernel the CPU runs is used (the
# demo names it), any other value is refused before anything runs, by a message naming the
# variable that holds it. Which kernels run here: the CPU's flags as Linux lists them.
flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)
has() { for f in "$@"; do grep -qw -- "$f" <<<"$flags" || return 1; done; }
demo_with() {   # demo_with [VAR=VALUE ...]: the demo on 64x64 with only these kernel variables set
    local vars=()
    while [ $# -gt 0 ] && [[ $1 == *=* ]]; do vars+=("$1"); shift; done
    env -u MXTRAIN_KERNEL -u MXTRAIN_MX_KERNEL "${vars[@]}" "$bin" demo --rows 64 --cols 64 "$@"
}
best=ref; has avx2 fma bmi2 && best=avx2; has avx2 fma bmi2 avx512f avx512bw avx512dq avx512vl && best=avx512
for var in MXTRAIN_KERNEL MXTRAIN_MX_KERNEL; do
    for k in ref avx2 avx512; do
        case $k in
            ref) runs=1 ;;
            avx2) has avx2 fma bmi2 && runs=1 || runs=0 ;;
            avx512) has avx2 fma bmi2 avx512f avx512bw avx512dq avx512vl && runs=1 || runs=0 ;;
        esac
        if [ "$runs" = 1 ]; then
            out=$(demo_with "$var=$k" 2>&1) || fail "$var=$k: demo failed: $out"
            grep -q "^kernel $k," <<<"$out" || fail "$var=$k: the demo does not use it: $out"
        else
            err=$(demo_with "$var=$k" 2>&1 >/dev/null) && fail "$var=$k ran on a CPU without it"
            grep -qF "$var: '$k' cannot run here: " <<<"$err" || fail "$var=$k: unclear message: $err"
            echo "    $var=$k refused here, as it must be: $err"
        fi
    done
    err=$(demo_with "$var=avx1024" 2>&1 >/dev/null); rc=$?
    [ "$rc" -eq 2 ] || fail "$var=avx1024: exit $rc, want 2"
    grep -qF "$var: 'avx1024' is not a kernel (allowed: auto, ref, avx2, avx512" <<<"$err" || fail "$var=avx1024: $err"
    # empty or auto: the best kernel the CPU runs
    for v in "" auto; do
        out=$(demo_with "$var=$v" 2>&1)
        grep -q "^kernel $best," <<<"$out" || fail "$var='$v': want kernel $best: $out"
    done
done
out=$(demo_with 2>&1)
grep -q "^kernel $best," <<<"$out" || fail "neither variable set: want kernel $best: $out"
# both set: MXTRAIN_KERNEL wins, also over a value of the older name that would be refused;
# an empty MXTRAIN_KERNEL counts as unset
out=$(demo_with MXTRAIN_KERNEL=ref MXTRAIN_MX_KERNEL=$best 2>&1)
grep -q "^kernel ref," <<<"$out" || fail "MXTRAIN_KERNEL=ref MXTRAIN_MX_KERNEL=$best: want kernel ref: $out"
out=$(demo_with MXTRAIN_KERNEL=$best MXTRAIN_MX_KERNEL=avx1024 2>&1) ||
    fail "MXTRAIN_KERNEL=$best MXTRAIN_MX_KERNEL=avx1024: refused: $out"
grep -q "^kernel $best," <<<"$out" || fail "MXTRAIN_KERNEL=$best MXTRAIN_MX_KERNEL=avx1024: want kernel $best: $out"
err=$(demo_with MXTRAIN_KERNEL=avx1024 MXTRAIN_MX_KERNEL=ref 2>&1 >/dev/null) && fail "MXTRAIN_KERNEL=avx1024 ran"
grep -qF "MXTRAIN_KERNEL: 'avx1024' is not a kernel" <<<"$err" || fail "MXTRAIN_KERNEL=avx1024 MXTRAIN_MX_KERNEL=ref: $err"
err=$(demo_with MXTRAIN_KERNEL= MXTRAIN_MX_KERNEL=avx1024 2>&1 >/dev/null) && fail "MXTRAIN_MX_KERNEL=avx1024 ran"
grep -qF "MXTRAIN_MX_KERNEL: 'avx1024' is not a kernel" <<<"$err" || fail "MXTRAIN_KERNEL= MXTRAIN_MX_KERNEL=avx1024: $err"
"$bin" --help | grep -q "usage: mxtrain" || fail "--help does not print usage"
for args in "version" "--help" "demo --rows 64 --cols 100" "plan examples/llama_tiny.yaml"; do
    err=$("$bin" $args 2>&1 >/dev/full) && fail "mxtrain $args > /dev/full exited 0"
    [ "$err" = "mxtrain: cannot write to standard output (No space left on device)" ] || fail "mxtrain $args > /dev/full: $err"
done
err=$("$bin" version 2>&1 >&-) && fail "mxtrain version with standard output closed exited 0"
[ "$err" = "mxtrain: cannot write to standard output (Bad file descriptor)" ] || fail "mxtrain version >&-: $err"
"$bin" version 2>/dev/full >/dev/null || fail "mxtrain version with nothing for standard error failed"
"$bin" demo --help | grep -q "usage: mxtrain demo" || fail "demo --help does not print usage"
exit 0
