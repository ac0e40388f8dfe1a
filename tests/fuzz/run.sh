#!/bin/bash
# Runs libFuzzer targets of the fuzz build (FUZZ_BUILD, default build-fuzz; built by
# `make fuzz`), each for SECONDS: first its regression inputs (tests/fuzz/regressions/TARGET/,
# each run once), then fuzzing from its seed corpus tests/fuzz/TARGET/ (left as it is: new
# inputs go to a scratch corpus). Targets: those named, or all of tests/fuzz/fuzz_*.c.
#
# Fails on any crash, sanitizer report, leak, input taking over 10 s, or failed check of the
# target; the input that did it is kept as FUZZ_BUILD/artifacts/TARGET/crash-* (or leak-*,
# timeout-*) and the log is FUZZ_BUILD/logs/TARGET.log. Prints one line per target: inputs
# run, coverage (cov: edges, ft: features) and corpus size at the end.
#   tests/fuzz/run.sh 20              # every target, 20 s each (what make check runs)
#   tests/fuzz/run.sh 300 safetensors # one target, 5 minutes
set -u
cd "$(dirname "$0")/../.."
secs=${1:-}
[[ "$secs" =~ ^[1-9][0-9]*$ ]] || { echo "usage: tests/fuzz/run.sh SECONDS [TARGET ...]" >&2; exit 2; }
shift
fb=${FUZZ_BUILD:-build-fuzz}
fb=$(cd "$fb" 2>/dev/null && pwd) || { echo "FAIL fuzz: no fuzz build ${FUZZ_BUILD:-build-fuzz} (make fuzz)"; exit 1; }
here=$(pwd)   # absolute paths: a target may change directory
if [ $# -eq 0 ]; then
    for src in tests/fuzz/fuzz_*.c; do
        t=${src#tests/fuzz/fuzz_}
        set -- "$@" "${t%.c}"
    done
fi
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
failed=0
for t in "$@"; do
    bin=$fb/fuzz/fuzz_$t
    if [ ! -x "$bin" ] || [ ! -d "tests/fuzz/$t" ]; then
        echo "FAIL fuzz $t: no $bin or no seed corpus tests/fuzz/$t (make fuzz builds the targets)"
        failed=1
        continue
    fi
    mkdir -p "$fb/artifacts/$t" "$fb/logs"
    log=$fb/logs/$t.log
    : >"$log"
    if compgen -G "tests/fuzz/regressions/$t/*" >/dev/null; then
        if ! "$bin" "$here/tests/fuzz/regressions/$t"/* >>"$log" 2>&1; then
            echo "FAIL fuzz $t: a regression input fails again (tests/fuzz/regressions/$t/); $log:"
            grep -E 'ERROR|fuzz check failed|Running:' "$log" | tail -5 | sed 's/^/    /'
            failed=1
            continue
        fi
    fi
    work=$(mktemp -d /tmp/mxt_fuzz_XXXXXX)
    "$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="$fb/artifacts/$t/" "$work" "$here/tests/fuzz/$t" >>"$log" 2>&1
    rc=$?
    rm -rf "$work"
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    last=$(grep -E '^#[0-9]+' "$log" | tail -1)
    cov=$(grep -oE 'cov: [0-9]+ ft: [0-9]+ corp: [0-9]+' <<<"$last")
    if [ "$rc" -ne 0 ]; then
        echo "FAIL fuzz $t: exit status $rc after ${runs:-?} inputs; the input: $(ls -t "$fb/artifacts/$t" | head -1); $log:"
        grep -E 'ERROR|fuzz check failed|SUMMARY' "$log" | head -5 | sed 's/^/    /'
        failed=1
    else
        echo "ok   fuzz $t: ${secs} s, ${runs:-?} inputs, $cov, 0 crashes"
    fi
done
exit "$failed"
