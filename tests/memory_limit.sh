#!/bin/bash
# Running out of memory is a message, never a crash: under address-space limits from far too
# small to enough (ulimit -v, in a subshell), `mxtrain train` on the main job's model (a
# Qwen3-MoE with the MXFP8 plan) and on a dense bf16 Llama, `plan` and `export`, either work or
# exit 1 with one line on stderr, which, when it is out of memory, says how much was asked for. Before the fix, the MoE run died by SIGSEGV inside oneDNN's primitive
# creation at 90-120 MB (and on several threads, at a GEMM's first run). Sanitizer builds reserve terabytes of shadow memory, which no
# ulimit -v allows: there the test only checks that it is one.
. "$(dirname "$0")/common.bash"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
if grep -qa __asan_init "$bin"; then
    echo "    skipped: a sanitizer build cannot run under ulimit -v"
    exit 0
fi

# an out-of-memory line says how much was asked for, or, where a library allocates out of
# sight (jansson, libyaml, glob), what was being made and by which
oom_line_ok() {
    ! grep -qi "out of memory" "$1" || grep -Eq "[0-9.]+ (bytes|KiB|MiB|GiB)|[0-9]+ x [0-9]+|\((jansson|libyaml)|glob\(3\)" "$1"
}

"$bin" prepare --out "$tmp/data" >/dev/null 2>&1 || fail "prepare failed"
sed -e "s|data/fortunes/|$tmp/data/|" -e "s|checkpoints/qwen3_moe_mxfp8/|$tmp/|" -e 's/train_iters: 1000/train_iters: 3/' -e '/^  save/d' \
    examples/qwen3_moe_mxfp8.yaml > "$tmp/moe.yaml"
sed -e "s|data/fortunes/|$tmp/data/|" -e 's/train_iters: 200/train_iters: 3/' examples/llama_tiny.yaml > "$tmp/dense.yaml"

# the dense run on 2 threads: OpenMP threads and their allocations count too (a thread that
# cannot be created is libgomp's one line, "libgomp: Thread creation failed: ...")
for cfg in moe dense; do
    ok=0 refused=0
    threads=1
    [ $cfg = dense ] && threads=2
    # 64 MB: the dynamic loader alone fits; 400 MB: the whole run fits
    for kb in $(seq 64000 6000 160000) 400000; do
        ( ulimit -v $kb; OMP_NUM_THREADS=$threads exec "$bin" train "$tmp/$cfg.yaml" ) >"$tmp/out" 2>"$tmp/err"
        rc=$?
        # LLVM's libomp (the clang build) aborts when it cannot create a thread, after its own
        # message: the runtime's answer, not a crash of ours; anything else is a failure
        if [ $rc -eq 134 ] && grep -q "^OMP: Error #34: System unable to allocate necessary resources for OMP thread" "$tmp/err"; then
            refused=$((refused + 1))
            continue
        fi
        [ $rc -lt 128 ] || fail "$cfg under ulimit -v $kb: killed by signal $((rc - 128)): $(tail -2 "$tmp/out")"
        if [ $rc -eq 0 ]; then
            grep -q "^memory per rank" "$tmp/out" || fail "$cfg under ulimit -v $kb: exit 0 without the summary"
            ok=$((ok + 1))
            continue
        fi
        # 127: the dynamic loader could not map a library (before mxtrain runs), one line too
        [ $rc -eq 1 ] || [ $rc -eq 127 ] || fail "$cfg under ulimit -v $kb: exit $rc (allowed: 0 or 1): $(cat "$tmp/err")"
        [ "$(grep -c . "$tmp/err")" -eq 1 ] || fail "$cfg under ulimit -v $kb: not one line on stderr: $(cat "$tmp/err")"
        ! grep -q "rank 0" "$tmp/err" || fail "$cfg under ulimit -v $kb: a single process names its rank: $(cat "$tmp/err")"
        oom_line_ok "$tmp/err" || fail "$cfg under ulimit -v $kb: no size in the out-of-memory line: $(cat "$tmp/err")"
        refused=$((refused + 1))
    done
    [ $ok -ge 1 ] && [ $refused -ge 1 ] || fail "$cfg: $ok runs trained, $refused were refused (want some of each)"
    echo "    $cfg: $ok limits trained, $refused gave one line"
done

# `plan` and `export` need little memory, so they fail in a narrow band just above what the
# dynamic loader needs (found by bisection): every 8 KB from there until 10 limits have
# worked, each either works or exits 1 with one line (the OpenMP runtime's own line counts
# too: "libgomp: Out of memory allocating 8 bytes")
"$bin" train "$tmp/dense.yaml" --training.save "$tmp/ck" --training.save_interval 3 >/dev/null 2>&1 || fail "a checkpoint to export"
lowest_loading() {   # the lowest limit (KB) at which mxtrain reaches main: the dynamic loader maps the
    # libraries and sets up their thread-local storage (a limit just below fails with 127, or
    # by SIGSEGV inside the loader, before any of mxtrain's code runs)
    local lo=16000 hi=400000 mid
    while [ $((hi - lo)) -gt 8 ]; do
        mid=$(((lo + hi) / 2))
        if ( ulimit -v $mid; exec "$bin" version ) >/dev/null 2>&1; then hi=$mid; else lo=$mid; fi
    done
    echo $hi
}
for cmd in plan export; do
    if [ $cmd = plan ]; then args=(plan "$tmp/moe.yaml"); else args=(export "$tmp/ck" --out "$tmp/exported" --max-shard-size 1MB); fi
    start=$(lowest_loading)
    rm -rf "$tmp/exported"
    ok=0 refused=0 kb=$start
    while [ $ok -lt 10 ]; do
        [ $kb -le $((start + 4000)) ] || fail "$cmd: no limit from $start KB to $kb KB was enough 10 times"
        lim=$kb kb=$((kb + 8))
        ( ulimit -v $lim; exec "$bin" "${args[@]}" ) >"$tmp/out" 2>"$tmp/err"
        rc=$?
        rm -rf "$tmp/exported"
        [ $rc -eq 0 ] && { ok=$((ok + 1)); continue; }
        [ $rc -eq 134 ] && grep -q "^OMP: Error #" "$tmp/err" && { refused=$((refused + 1)); continue; }   # libomp's own line
        if [ $rc -eq 139 ] && ! [ -s "$tmp/err" ]; then   # the loader's band: where it maps differs by run (ASLR)
            loads=1
            for try in 1 2 3; do ( ulimit -v $lim; exec "$bin" version ) >/dev/null 2>&1 || loads=0; done
            [ $loads -eq 0 ] && continue
        fi
        [ $rc -eq 1 ] || [ $rc -eq 127 ] || fail "$cmd under ulimit -v $lim: exit $rc (allowed: 0 or 1): $(cat "$tmp/err")"
        [ "$(grep -c . "$tmp/err")" -eq 1 ] || fail "$cmd under ulimit -v $lim: not one line on stderr: $(cat "$tmp/err")"
        oom_line_ok "$tmp/err" || fail "$cmd under ulimit -v $lim: no size in the out-of-memory line: $(cat "$tmp/err")"
        refused=$((refused + 1))
    done
    echo "    $cmd: $refused limits gave one line (from $start KB)"
done
exit 0
