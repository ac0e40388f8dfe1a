#!/bin/bash
# Output files of a killed write: a write killed half-way (here by SIGXFSZ under ulimit -f)
# leaves its hidden temporary file `.NAME.tmp-XXXX` and no NAME; the next write of the same
# output removes it. Only temporary files of that output, named exactly so and held by no
# live writer (a writer keeps its temporary file locked) are removed: the temporary file of
# a running writer, those of other outputs and look-alike names stay.
# Outputs that are not regular files: a device (a node of this test's own, /dev/full's
# numbers: never the machine's) and a FIFO are refused, left as they were, and nothing is
# written beside them; a symbolic link is followed (the file it names is replaced, the link
# stays); an output that is one of the command's inputs (init's config, grads' weights,
# training.plot_path = training.metrics_path) is refused (plot's own: tests/plot.sh).
# training.metrics_path and training.plot_path are held to the same rules before step 1: a
# FIFO or a device refused, a link followed, the config or a data file refused.
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

# -- outputs that are not regular files, links, and outputs that are inputs
mkdir "$tmp/sp"
if mknod "$tmp/sp/full" c 1 7 2>/dev/null; then   # root (CI); a user namespace cannot make one
    out=$("$bin" init "$cfg" --out "$tmp/sp/full" 2>&1) && fail "init --out a character device succeeded"
    [ "$out" = "mxtrain init: $tmp/sp/full: is a character device (allowed: a regular file, or a path where none exists yet)" ] ||
        fail "init --out a device: $out"
    [ -c "$tmp/sp/full" ] || fail "the device was replaced: $(ls -l "$tmp/sp/full")"
fi
mkfifo "$tmp/sp/fifo"
out=$(timeout 60 "$bin" init "$cfg" --out "$tmp/sp/fifo" 2>&1) && fail "init --out a FIFO succeeded"
[ "$out" = "mxtrain init: $tmp/sp/fifo: is a FIFO (allowed: a regular file, or a path where none exists yet)" ] ||
    fail "init --out a FIFO: $out"
[ -p "$tmp/sp/fifo" ] || fail "the FIFO was replaced"
[ "$(ls -A "$tmp/sp" | grep -cv '^full$\|^fifo$')" -eq 0 ] || fail "files left beside the refused outputs: $(ls -A "$tmp/sp")"
# a link, relative, to a file in another directory (made by the write), and a chain of two
mkdir "$tmp/sp/real"
ln -s real/w.safetensors "$tmp/sp/link"
ln -s link "$tmp/sp/link2"
"$bin" init "$cfg" --out "$tmp/sp/link2" > /dev/null || fail "init --out a symbolic link failed"
[ -L "$tmp/sp/link" ] && [ -L "$tmp/sp/link2" ] || fail "a symbolic link was replaced: $(ls -l "$tmp/sp")"
[ -f "$tmp/sp/real/w.safetensors" ] && [ ! -L "$tmp/sp/real/w.safetensors" ] || fail "the link's file was not written"
cmp -s "$tmp/sp/real/w.safetensors" "$tmp/out/w.safetensors" || fail "the file written through the link is not init's"
"$bin" init "$cfg" --out "$tmp/sp/link" > /dev/null || fail "init --out a link to an existing file failed"
[ -L "$tmp/sp/link" ] || fail "a symbolic link to an existing file was replaced"
# outputs that are inputs
cp "$cfg" "$tmp/sp/c.yaml"
out=$("$bin" init "$tmp/sp/c.yaml" --out "$tmp/sp/c.yaml" 2>&1); rc=$?
[ $rc -eq 2 ] && [ "$out" = "mxtrain init: --out: '$tmp/sp/c.yaml' is the input '$tmp/sp/c.yaml' (allowed: a path that is none of the command's inputs)" ] ||
    fail "init --out its config (exit $rc): $out"
cmp -s "$cfg" "$tmp/sp/c.yaml" || fail "init replaced its config"
cp "$tmp/out/w.safetensors" "$tmp/sp/w.safetensors"
out=$("$bin" grads "$cfg" --weights "$tmp/sp/w.safetensors" --tokens "$tmp/data/train_000000.bin" --out "$tmp/sp/real/../w.safetensors" 2>&1) &&
    fail "grads --out its weights succeeded"
[ "$out" = "mxtrain grads: --out: '$tmp/sp/real/../w.safetensors' is the input '$tmp/sp/w.safetensors' (allowed: a path that is none of the command's inputs)" ] ||
    fail "grads --out its weights: $out"
cmp -s "$tmp/sp/w.safetensors" "$tmp/out/w.safetensors" || fail "grads replaced its weights"
run_cfg "$tmp/sp/m2.jsonl" "$tmp/sp/m2.jsonl" > "$tmp/same.yaml"
out=$("$bin" train "$tmp/same.yaml" 2>&1) && fail "training.plot_path = training.metrics_path was accepted"
grep -qx "mxtrain train: training.plot_path: '$tmp/sp/m2.jsonl' is the run's training.metrics_path (allowed: a path of its own)" <<<"$out" ||
    fail "training.plot_path = training.metrics_path: $out"
# training.metrics_path and training.plot_path, refused at start (no step runs, no metrics line)
refused() {   # refused KEY PATH EXPECTED-LINE: a run with KEY at PATH stops before step 1 with that line
    if [ "$1" = metrics ]; then run_cfg "$2" "$tmp/sp/p.png"; else run_cfg "$tmp/sp/m3.jsonl" "$2"; fi > "$tmp/r.yaml"
    out=$(timeout 120 "$bin" train "$tmp/r.yaml" 2>&1) && fail "training.${1}_path $2 was accepted"
    [ "$out" = "$3" ] || fail "training.${1}_path $2: $out"
    [ ! -e "$tmp/sp/m3.jsonl" ] || fail "training.${1}_path $2: the metrics file was made"
}
refused metrics "$tmp/sp/fifo" \
    "mxtrain train: training.metrics_path: $tmp/sp/fifo: is a FIFO (allowed: a regular file, or a path where none exists yet)"
refused plot "$tmp/sp/fifo" \
    "mxtrain train: training.plot_path: $tmp/sp/fifo: is a FIFO (allowed: a regular file, or a path where none exists yet)"
[ -p "$tmp/sp/fifo" ] || fail "the FIFO was replaced"
if [ -c "$tmp/sp/full" ]; then
    refused metrics "$tmp/sp/full" "mxtrain train: training.metrics_path: $tmp/sp/full: is a character device (allowed: a regular file, or a path where none exists yet)"
    [ -c "$tmp/sp/full" ] || fail "the device was replaced: $(ls -l "$tmp/sp/full")"
fi
run_cfg "$tmp/sp/c.yaml" "$tmp/sp/p.png" > "$tmp/sp/c.yaml"
out=$("$bin" train "$tmp/sp/c.yaml" 2>&1) && fail "training.metrics_path = the config was accepted"
[ "$out" = "mxtrain train: training.metrics_path: '$tmp/sp/c.yaml' is the run's config file (allowed: a path of its own)" ] ||
    fail "training.metrics_path = the config: $out"
cp "$tmp/data/train_000000.bin" "$tmp/shard"
ln -s ../data/train_000000.bin "$tmp/sp/shard-link"
refused metrics "$tmp/sp/shard-link" "mxtrain train: training.metrics_path: '$tmp/sp/shard-link' is the run's data file '$tmp/data/train_000000.bin' (allowed: a path of its own)"
refused plot "$tmp/data/train_000000.bin" "mxtrain train: training.plot_path: '$tmp/data/train_000000.bin' is the run's data file '$tmp/data/train_000000.bin' (allowed: a path of its own)"
cmp -s "$tmp/shard" "$tmp/data/train_000000.bin" || fail "a refused run changed its data file"
# a link is followed: the metrics are written into the file it names, the link stays
ln -s real/m.jsonl "$tmp/sp/mlink"
run_cfg "$tmp/sp/mlink" "$tmp/sp/p.png" > "$tmp/link.yaml"
"$bin" train "$tmp/link.yaml" > "$tmp/link.log" 2>&1 || { cat "$tmp/link.log"; fail "training.metrics_path a link failed"; }
[ -L "$tmp/sp/mlink" ] && [ "$(wc -l < "$tmp/sp/real/m.jsonl")" -eq 2 ] || fail "training.metrics_path a link: $(ls -l "$tmp/sp" "$tmp/sp/real")"
exit 0
