#!/bin/bash
# mxtrain plot: two overlaid runs give a PNG (signature, 800x500 in its IHDR chunk); the
# points gnuplot plots are exactly the files' records (a wrapper on PATH keeps the script
# mxtrain sends gnuplot; real gnuplot replays it under `set table` at full precision, and
# Python compares every curve, title and point with its own reading of the JSONL: train
# "loss" and "val_loss" by step, last record of a step wins); the trainer's own metrics file
# plots; null values (a run that wrote a non-finite loss) are gaps between the finite points;
# every bad input is one line, exit 1, and no PNG (nor temporary file) is left.
. "$(dirname "$0")/common.bash"
real_gnuplot=$(command -v gnuplot) || fail "gnuplot is missing: scripts/setup installs Debian's gnuplot-nox"

# Run A (bf16): trainer-like records, validation records every 10 steps, a blank line, another
# kind of record, and a resumed tail (steps 21..30 again, appended, other values).
# Run B (mxfp8): train records only, as a trainer without validation writes.
"$py" - "$tmp" <<'PY' || fail "could not write the metrics files"
import json, random, sys
tmp = sys.argv[1]
rnd = random.Random(5)
with open(f"{tmp}/bf16.jsonl", "w") as f:
    for s in range(1, 31):
        f.write(json.dumps({"step": s, "loss": 5 * rnd.random() + 1, "lr": 1e-3, "tokens": 256}) + "\n")
        if s % 10 == 0:
            f.write(json.dumps({"step": s, "val_loss": 5 * rnd.random() + 1}) + "\n")
    f.write("\n" + json.dumps({"event": "resumed", "from": 20}) + "\n")
    for s in range(21, 31):
        f.write(json.dumps({"step": s, "loss": rnd.random()}) + "\n")
    f.write(json.dumps({"step": 30, "val_loss": 0.25}) + "\n")
with open(f"{tmp}/mxfp8.jsonl", "w") as f:
    for s in range(1, 41):
        f.write(json.dumps({"step": s, "loss": rnd.uniform(1, 6), "grad_norm": 1.0}) + "\n")
PY

# gnuplot as mxtrain runs it, keeping what it is sent.
mkdir -p "$tmp/keep" "$tmp/fake"
cat >"$tmp/keep/gnuplot" <<SH
#!/bin/sh
cat >"$tmp/sent.gp" && exec "$real_gnuplot" <"$tmp/sent.gp"
SH
chmod +x "$tmp/keep/gnuplot"

check_plot() {   # check_plot PNG LABEL_A LABEL_B: the PNG and the points against the files
    local png=$1
    [ -s "$png" ] || fail "no PNG at $png"
    "$real_gnuplot" -e "set table '$tmp/table.txt'; set format x '%.17g'; set format y '%.17g'" "$tmp/sent.gp" \
        >/dev/null 2>"$tmp/gp.err" || fail "the script sent to gnuplot does not replay: $(cat "$tmp/gp.err")"
    "$py" - "$png" "$tmp/table.txt" "$tmp/bf16.jsonl" "$2" "$tmp/mxfp8.jsonl" "$3" <<'PY' || fail "plotted points differ from the records"
import json, re, struct, sys
png, table, *runs = sys.argv[1:]
with open(png, "rb") as f:
    head = f.read(24)
assert head[:8] == b"\x89PNG\r\n\x1a\n", f"not a PNG signature: {head[:8]!r}"
assert head[12:16] == b"IHDR", "no IHDR chunk first"
w, h = struct.unpack(">II", head[16:24])
assert (w, h) == (800, 500), f"PNG is {w}x{h}, want 800x500"

want = []   # (title, [(step, value)]) in plot order
for path, label in zip(runs[0::2], runs[1::2]):
    train, val = {}, {}
    for line in open(path):
        if not line.strip():
            continue
        r = json.loads(line)
        if "loss" in r: train[r["step"]] = r["loss"]
        if "val_loss" in r: val[r["step"]] = r["val_loss"]
    if train: want.append((f"{label} train", sorted(train.items())))
    if val: want.append((f"{label} val", sorted(val.items())))

got, cur = [], None
for line in open(table):
    m = re.match(r'# Curve title: "(.*)"$', line.rstrip("\n"))
    if m:
        cur = (m.group(1), [])
        got.append(cur)
    elif line.strip() and not line.startswith("#"):
        x, y, kind = line.split()
        assert kind == "i", f"point {x} {y} outside the plot range ({kind})"
        cur[1].append((int(x), float(y)))
assert [t for t, _ in got] == [t for t, _ in want], f"curves {[t for t, _ in got]}, want {[t for t, _ in want]}"
for (t, g), (_, e) in zip(got, want):
    assert g == e, f"{t}: plotted {g[:4]}..., want {e[:4]}..."
print(f"    {len(got)} curves, {sum(len(p) for _, p in got)} points exactly as in the files; {w}x{h} PNG")
PY
}

# Two runs, default labels (file names).
out=$(PATH="$tmp/keep:$PATH" "$bin" plot "$tmp/bf16.jsonl" "$tmp/mxfp8.jsonl" --out "$tmp/loss.png" 2>&1) ||
    fail "plot failed: $out"
[ "$out" = "wrote $tmp/loss.png (2 runs)" ] || fail "unexpected output: $out"
check_plot "$tmp/loss.png" bf16 mxfp8
# Labels (one with a quote, which gnuplot strings escape) and a title.
out=$(PATH="$tmp/keep:$PATH" "$bin" plot "$tmp/bf16.jsonl" "$tmp/mxfp8.jsonl" --label "it's A" --title 'T "x"' \
      --out "$tmp/loss.png" 2>&1) || fail "plot with labels failed: $out"
check_plot "$tmp/loss.png" "it's A" mxfp8
grep -qF "set title 'T \"x\"'" "$tmp/sent.gp" || fail "no title in the script"
[ -z "$(ls -A "$tmp" | grep '\.tmp-')" ] || fail "temporary files left: $(ls -A "$tmp")"

# The trainer's own metrics file plots (a 3-step tiny Llama on a made-up corpus).
for i in $(seq 1 200); do echo "line $i of a small corpus for the plot test, with some words."; done >"$tmp/corpus.txt"
"$bin" prepare --val-fraction 0 --out "$tmp/data" "$tmp/corpus.txt" >/dev/null 2>&1 || fail "prepare failed"
cat >"$tmp/tiny.yaml" <<YAML
model: {model_type: llama, vocab_size: 257, hidden_size: 32, intermediate_size: 64, num_hidden_layers: 1,
        num_attention_heads: 2, num_key_value_heads: 1, max_position_embeddings: 32}
data: {data_path: $tmp/data/train_*.bin, seq_length: 32}
training: {micro_batch_size: 2, train_iters: 3, lr: 1.0e-3, log_interval: 1, metrics_path: $tmp/trained.jsonl}
YAML
OMP_NUM_THREADS=1 "$bin" train "$tmp/tiny.yaml" >"$tmp/train.log" 2>&1 || fail "training failed: $(tail -3 "$tmp/train.log")"
out=$(PATH="$tmp/keep:$PATH" "$bin" plot "$tmp/trained.jsonl" --out "$tmp/trained.png" 2>&1) ||
    fail "plotting the trainer's metrics failed: $out"
"$py" - "$tmp/trained.jsonl" "$tmp/sent.gp" <<'PY' || fail "the trainer's losses are not what was plotted"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
want = [(r["step"], r["loss"]) for r in recs if "loss" in r]
lines = open(sys.argv[2]).read().split("$train0 << EOD\n", 1)[1].split("EOD\n", 1)[0].splitlines()
got = [(int(a), float(b)) for a, b in (l.split() for l in lines)]
assert len(want) == 3 and got == want, f"{got} != {want}"
PY

# Nulls: the finite points are drawn, in segments that a null's step breaks (a blank line in
# gnuplot's data); a null before the first or after the last finite point breaks nothing; a
# resumed run's finite record replaces a null of the same step.
"$py" - "$tmp/gaps.jsonl" <<'PY' || fail "could not write the metrics file with nulls"
import json, sys
with open(sys.argv[1], "w") as f:
    for s in range(1, 21):
        f.write(json.dumps({"step": s, "loss": None if s in (1, 6, 7, 12, 20) else 5 - 0.1 * s}) + "\n")
        if s % 5 == 0:
            f.write(json.dumps({"step": s, "val_loss": None if s == 10 else 5 - 0.09 * s}) + "\n")
    f.write(json.dumps({"step": 12, "loss": 3.75}) + "\n")
PY
out=$(PATH="$tmp/keep:$PATH" "$bin" plot "$tmp/gaps.jsonl" --out "$tmp/gaps.png" 2>&1) || fail "plotting nulls failed: $out"
"$py" - "$tmp/gaps.jsonl" "$tmp/sent.gp" <<'PY' || fail "the points with nulls are not what was plotted"
import json, sys
series = {"loss": {}, "val_loss": {}}
for line in open(sys.argv[1]):
    r = json.loads(line)
    for k in series:
        if k in r: series[k][r["step"]] = r[k]
sent = open(sys.argv[2]).read()
for k, block in (("loss", "$train0"), ("val_loss", "$val0")):
    want, seg = [], []
    for step, v in sorted(series[k].items()):
        if v is None:
            if seg: want.append(seg)
            seg = []
        else:
            seg.append((step, v))
    if seg: want.append(seg)
    text = sent.split(block + " << EOD\n", 1)[1].split("EOD\n", 1)[0]
    got = [[(int(a), float(b)) for a, b in (l.split() for l in part.splitlines() if l)]
           for part in text.split("\n\n") if part.strip()]
    assert got == want, f"{k}: segments {got}, want {want}"
assert "$train0 using 1:2 with linespoints" in sent, "a train line with gaps has no point marks"
PY
echo "    nulls: the finite points drawn, a gap at each null between them"

# Errors: one line naming the file and what is wrong, exit 1, the old PNG kept, nothing new.
cp "$tmp/loss.png" "$tmp/old.png"
: >"$tmp/empty.jsonl"
printf '{"step": 1, "loss": 2.5}\n{"step": 2, "loss": \n' >"$tmp/garbled.jsonl"
printf '{"step": 1, "lr": 0.1}\n' >"$tmp/noloss.jsonl"
printf '{"step": "3", "loss": 2.5}\n' >"$tmp/badstep.jsonl"
printf '{"step": 3, "loss": "low"}\n' >"$tmp/badloss.jsonl"
printf '[1, 2]\n' >"$tmp/array.jsonl"
printf '{"step": 1, "loss": null}\n{"step": 1, "val_loss": null}\n' >"$tmp/allnull.jsonl"
mkfifo "$tmp/fifo.jsonl"
expect_error() {   # expect_error "message" args...: run mxtrain, one line, exit 1, old.png untouched
    local want=$1; shift
    local err rc
    err=$("$@" 2>&1 >/dev/null)
    rc=$?
    [ "$rc" -eq 1 ] || fail "$*: exit $rc, want 1 ($err)"
    [ "$(printf '%s\n' "$err" | wc -l)" -eq 1 ] || fail "$*: more than one line: $err"
    grep -qF -- "$want" <<<"$err" || fail "$*: message lacks '$want': $err"
    cmp -s "$tmp/loss.png" "$tmp/old.png" || fail "$*: the previous PNG was changed"
    [ ! -e "$tmp/new.png" ] || fail "$*: a PNG was written"
    [ -z "$(ls -A "$tmp" | grep '\.tmp-')" ] || fail "$*: temporary file left: $(ls -A "$tmp")"
}
p() { echo "mxtrain plot: $tmp/$1"; }
expect_error "$(p missing.jsonl): cannot open the metrics file: No such file or directory" \
    "$bin" plot "$tmp/bf16.jsonl" "$tmp/missing.jsonl" --out "$tmp/new.png"
expect_error "$(p empty.jsonl): empty file, no loss records" "$bin" plot "$tmp/empty.jsonl" --out "$tmp/loss.png"
expect_error "$(p garbled.jsonl):2: not a JSON line" "$bin" plot "$tmp/garbled.jsonl" --out "$tmp/loss.png"
expect_error "$(p noloss.jsonl): no loss records" "$bin" plot "$tmp/noloss.jsonl" --out "$tmp/loss.png"
expect_error "$(p badstep.jsonl):1: a loss record whose \"step\" is a string (allowed: an integer >= 0)" \
    "$bin" plot "$tmp/badstep.jsonl" --out "$tmp/loss.png"
expect_error "$(p badloss.jsonl):1: \"loss\" is a string (allowed: a number or null)" "$bin" plot "$tmp/badloss.jsonl" --out "$tmp/loss.png"
expect_error "$(p allnull.jsonl): every loss is null (no finite \"loss\" or \"val_loss\" to draw)" \
    "$bin" plot "$tmp/allnull.jsonl" --out "$tmp/loss.png"
expect_error "$(p array.jsonl):1: the line holds an array, not a JSON object" "$bin" plot "$tmp/array.jsonl" --out "$tmp/loss.png"
printf '{"step": 1, "lo\\\r": 2}\n' >"$tmp/cr.jsonl"   # jansson quotes the bad escape, carriage return and all
expect_error "$(p cr.jsonl):1: not a JSON line: invalid escape near '\"lo\\\\r'" "$bin" plot "$tmp/cr.jsonl" --out "$tmp/loss.png"
err=$("$bin" plot "$tmp/cr.jsonl" --out "$tmp/loss.png" 2>&1)
[[ "$err" != *$'\r'* ]] || fail "a carriage return in the message: $err"
expect_error "$(p fifo.jsonl): not a regular file" timeout 10 "$bin" plot "$tmp/fifo.jsonl" --out "$tmp/loss.png"
expect_error "$(p keep): not a regular file" "$bin" plot "$tmp/keep" --out "$tmp/loss.png"
expect_error "$tmp/nodir/new.png: cannot create the output file in directory '$tmp/nodir' (No such file or directory)" \
    "$bin" plot "$tmp/bf16.jsonl" --out "$tmp/nodir/new.png"
expect_error "$(p keep): is a directory" "$bin" plot "$tmp/bf16.jsonl" --out "$tmp/keep"
expect_error "$(p bf16.jsonl): is the metrics file being plotted" "$bin" plot "$tmp/bf16.jsonl" --out "$tmp/bf16.jsonl"
# gnuplot missing, failing after half a PNG, succeeding without a PNG, or not reading its
# input at all (mxtrain must not die of SIGPIPE: a 20000-record file overflows the pipe).
expect_error "$(p loss.png): cannot draw the plot: gnuplot is not installed" \
    env PATH=/nonexistent "$bin" plot "$tmp/bf16.jsonl" --out "$tmp/loss.png"
printf '#!/bin/sh\ncat >/dev/null; printf "\\211PNG\\r\\n\\032\\n"; echo "line 12: boom" >&2; exit 1\n' >"$tmp/fake/gnuplot"
chmod +x "$tmp/fake/gnuplot"
expect_error "$(p loss.png): gnuplot failed (exit status 1): line 12: boom" \
    env PATH="$tmp/fake:$PATH" "$bin" plot "$tmp/bf16.jsonl" --out "$tmp/loss.png"
printf '#!/bin/sh\ncat >/dev/null; echo not a png\n' >"$tmp/fake/gnuplot"
expect_error "$(p new.png): gnuplot wrote no PNG image" env PATH="$tmp/fake:$PATH" "$bin" plot "$tmp/bf16.jsonl" --out "$tmp/new.png"
printf '#!/bin/sh\nexit 0\n' >"$tmp/fake/gnuplot"
seq 1 20000 | sed 's/.*/{"step": &, "loss": 1.5}/' >"$tmp/long.jsonl"
expect_error "$(p new.png): " env PATH="$tmp/fake:$PATH" "$bin" plot "$tmp/long.jsonl" --out "$tmp/new.png"

# Usage errors: exit 2.
for args in "--out $tmp/new.png" "$tmp/bf16.jsonl" "$tmp/bf16.jsonl --out" "$tmp/bf16.jsonl --label a --label b --out $tmp/new.png" \
            "$tmp/bf16.jsonl --bogus --out $tmp/new.png"; do
    # shellcheck disable=SC2086
    "$bin" plot $args >/dev/null 2>&1
    rc=$?
    [ "$rc" -eq 2 ] || fail "mxtrain plot $args: exit $rc, want 2"
done
[ ! -e "$tmp/new.png" ] || fail "a usage error wrote a PNG"
echo "    errors: one line each, exit 1, no PNG left"
