#!/bin/bash
# The fuzz targets of this build (BUILD/fuzz/, each linked with tests/fuzz/replay_main.c)
# over their seed corpora and the regression inputs of every crash fuzzing found
# (tests/fuzz/regressions/TARGET/): no crash, no sanitizer report in the ASan build, every
# target's checks hold. The fuzzing itself is tests/fuzz/run.sh (make check runs it).
. "$(dirname "$0")/common.bash"
n=0
for src in tests/fuzz/fuzz_*.c; do
    t=${src#tests/fuzz/fuzz_}
    t=${t%.c}
    inputs=("tests/fuzz/$t")
    [ -d "tests/fuzz/regressions/$t" ] && inputs+=("tests/fuzz/regressions/$t")
    out=$(OMP_NUM_THREADS=1 "$build/fuzz/fuzz_$t" "${inputs[@]}" 2>&1) || fail "fuzz_$t failed on ${inputs[*]}: $(tail -5 <<<"$out")"
    echo "    $t: $out"
    n=$((n + 1))
done
[ "$n" -ge 7 ] || fail "only $n fuzz targets"
