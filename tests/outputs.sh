#!/bin/bash
# Output files of a killed write: a write killed half-way (here by SIGXFSZ under ulimit -f)
# leaves its hidden temporary file `.NAME.tmp-XXXX` and no NAME; the next write of the same
# output removes it. Only temporary files of that output, named exactly so and held by no
# live writer (a writer keeps its temporary file locked) are removed: the temporary file of
# a running writer, those of other outputs and look-alike names stay.
. "$(dirname "$0")/common.bash"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
cfg=examples/llama_tiny.yaml
mkdir "$tmp/out"
out="$tmp/out/w.safetensors"

{ ( ulimit -f 64; exec "$bin" init "$cfg" --out "$out" ) >/dev/null 2>&1; } 2>/dev/null
rc=$?
[ $rc -gt 128 ] || fail "init under ulimit -f 64 was not killed (exit $rc)"
[ ! -e "$out" ] || fail "a killed init left $out"
stale=$(cd "$tmp/out" && ls -A | grep -E '^\.w\.safetensors\.tmp-[0-9a-f]+$')
[ "$(wc -l <<<"$stale")" -eq 1 ] && [ -n "$stale" ] || fail "expected one temporary file of the killed init, found: $(ls -A "$tmp/out")"

# look-alikes, another output's temporary file, and one a live writer holds (locked)
keep=(".w.safetensors.tmp-xyz" ".w.safetensors.tmp-abc123x" ".w.safetensors.tmp-12345678901" "w.safetensors.tmp-abc"
      ".w.safetensors.tmp-" ".v.safetensors.tmp-abc123" ".w.safetensors.tmp-abc.d")
for f in "${keep[@]}"; do echo x > "$tmp/out/$f"; done
live=".w.safetensors.tmp-1234abcd"
echo x > "$tmp/out/$live"
flock "$tmp/out/$live" sleep 60 &
holder=$!
for _ in $(seq 50); do flock -n "$tmp/out/$live" true 2>/dev/null || break; sleep 0.1; done
flock -n "$tmp/out/$live" true 2>/dev/null && fail "could not hold the lock of $live"

"$bin" init "$cfg" --out "$out" >/dev/null || fail "init after the killed one failed"
kill $holder 2>/dev/null; wait $holder 2>/dev/null
[ -s "$out" ] || fail "init wrote no $out"
[ ! -e "$tmp/out/$stale" ] || fail "the killed init's $stale is still there"
for f in "${keep[@]}" "$live"; do [ -e "$tmp/out/$f" ] || fail "$f was removed, but it is not a stale temporary file of $out"; done
[ "$(ls -A "$tmp/out" | wc -l)" -eq $(( ${#keep[@]} + 2 )) ] || fail "unexpected files: $(ls -A "$tmp/out")"

"$bin" prepare --out "$tmp/data" > /dev/null || fail "prepare failed"
run_cfg() {   # run_cfg METRICS PLOT -> a 2-step tiny config
    sed -e "s|data/fortunes/|$tmp/data/|" -e '/^ *save:/d' -e '/^ *load:/d' -e '/^ *metrics_path:/d' -e '/^ *plot_path:/d' \
        -e 's/^\( *\)train_iters:.*/\1train_iters: 2/' -e '/eval_interval\|eval_iters\|val_data_path/d' "$cfg"
    printf '  metrics_path: %s\n  plot_path: %s\n' "$1" "$2"
}
run_cfg "$tmp/m/a/metrics.jsonl" "$tmp/p/b/loss.png" > "$tmp/dirs.yaml"
"$bin" train "$tmp/dirs.yaml" > "$tmp/dirs.log" 2>&1 || { cat "$tmp/dirs.log"; fail "training into new directories failed"; }
[ "$(wc -l < "$tmp/m/a/metrics.jsonl")" -eq 2 ] || fail "no 2 metrics lines in the directory training made"
[ -s "$tmp/p/b/loss.png" ] || fail "no plot in the directory training made"
echo x > "$tmp/file"
for key in metrics plot; do
    if [ $key = metrics ]; then run_cfg "$tmp/file/metrics.jsonl" "$tmp/p/loss.png"; else run_cfg "$tmp/m/m.jsonl" "$tmp/file/loss.png"; fi > "$tmp/bad.yaml"
    out=$("$bin" train "$tmp/bad.yaml" 2>&1) && fail "training.${key}_path under a file was accepted"
    grep -q "training.${key}_path: .*$tmp/file/.*(Not a directory)" <<<"$out" || fail "training.${key}_path under a file: $out"
    [ "$(grep -c . <<<"$out")" -eq 1 ] || fail "training.${key}_path under a file: not one line: $out"
done
exit 0
