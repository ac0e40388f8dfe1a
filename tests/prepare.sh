#!/bin/bash
# mxtrain prepare: usage errors exit 2, a missing input exits 1 with one line and writes
# nothing, and the default run over Debian's fortunes gives exactly the shards an
# independent Python re-implementation of the documented rules expects (documents split at
# "%" lines, EOT 256 before each, document i to val when floor((i+1)f+.5) > floor(if+.5)),
# with the printed counts and unigram entropy.
set -u
bin="$(cd "${BUILD:-build}" && pwd)/mxtrain"   # absolute: the script changes directory
py=/usr/bin/python3
fortunes=/usr/share/games/fortunes
fail() { echo "    $*"; exit 1; }
tmp=$(mktemp -d /tmp/mxt_prepare_XXXXXX)
trap 'rm -rf "$tmp"' EXIT

"$bin" prepare --help | grep -q "usage: mxtrain prepare" || fail "prepare --help does not print usage"

expect_usage_error() {   # expect_usage_error "what must appear" args...
    local want=$1; shift
    local err
    err=$("$bin" "$@" 2>&1 >/dev/null)
    local rc=$?
    [ "$rc" -eq 2 ] || fail "mxtrain $*: exit $rc, want 2"
    grep -qF -- "$want" <<<"$err" || fail "mxtrain $*: message lacks '$want': $err"
    grep -q "usage: mxtrain prepare" <<<"$err" || fail "mxtrain $*: no usage printed: $err"
}
expect_usage_error "unknown option '--bogus'" prepare --bogus
expect_usage_error "--val-fraction needs a value" prepare --val-fraction
expect_usage_error "--val-fraction: '1.5' is not allowed (allowed: a number from 0 up to, not including, 1)" prepare --val-fraction 1.5
expect_usage_error "--val-fraction: 'abc' is not allowed" prepare --val-fraction abc
expect_usage_error "--out needs a value" prepare some.txt --out
expect_usage_error "--shard-tokens: '0' is not allowed" prepare --shard-tokens 0

# A missing input: one line on stderr, exit 1, no output directory.
printf 'hello\n' >"$tmp/a.txt"
err=$("$bin" prepare --out "$tmp/none" "$tmp/a.txt" "$tmp/missing.txt" 2>&1 >/dev/null)
rc=$?
[ "$rc" -eq 1 ] || fail "missing input: exit $rc, want 1"
[ "$(printf '%s\n' "$err" | wc -l)" -eq 1 ] || fail "missing input: more than one line: $err"
grep -qF "mxtrain prepare: $tmp/missing.txt: cannot open (No such file or directory)" <<<"$err" || fail "missing input: $err"
[ ! -e "$tmp/none" ] || fail "missing input: output was created"

# The default corpus.
[ -d "$fortunes" ] || fail "$fortunes is missing: scripts/setup installs Debian's fortunes package"
out=$(cd "$tmp" && "$bin" prepare --out "$tmp/data" 2>&1) || fail "prepare on the default corpus failed: $out"
printf '%s\n' "$out" | sed 's/^/    /'
[ "$(ls -A "$tmp/data")" = "$(printf 'train_000000.bin\nval_000000.bin')" ] || fail "unexpected files: $(ls -A "$tmp/data")"
# Without --out the default corpus goes where every example config reads it.
(cd "$tmp" && "$bin" prepare >/dev/null 2>&1) || fail "prepare with no arguments failed"
for ex in examples/*.yaml; do
    grep -q 'mxtrain prepare --tokenizer' "$ex" && continue   # says how its own data is made
    pat=$(sed -n 's/^ *data_path: *//p' "$ex")
    (cd "$tmp" && compgen -G "$pat" >/dev/null) || fail "$ex reads $pat, which plain 'prepare' does not write"
done
cmp -s "$tmp/data/train_000000.bin" "$tmp/data/fortunes/train_000000.bin" || fail "plain prepare wrote other train tokens"
rm -rf "$tmp/data/fortunes"
"$py" - "$fortunes" "$tmp/data" "$out" <<'PY' || fail "the Python oracle disagrees"
import math, os, re, struct, sys
import numpy as np

src, data, out = sys.argv[1], sys.argv[2], sys.argv[3]
docs = []
files = sorted(f for f in os.listdir(src)
               if not f.startswith(".") and not f.endswith((".dat", ".u8")) and os.path.isfile(os.path.join(src, f)))
for f in files:
    cur = []
    for line in open(os.path.join(src, f), "rb").read().splitlines(keepends=True):
        if line.rstrip(b"\n") in (b"%", b"%\r"):
            docs.append(b"".join(cur)); cur = []
        else:
            cur.append(line)
    docs.append(b"".join(cur))
docs = [d for d in docs if d.strip(b" \t\n\r\f\v")]
f = 0.05
train, val, ntr, nva = [], [], 0, 0
for i, d in enumerate(docs):
    is_val = math.floor((i + 1) * f + 0.5) > math.floor(i * f + 0.5)
    (val if is_val else train).append(np.concatenate([[256], np.frombuffer(d, np.uint8)]).astype(np.uint16))
    nva += is_val; ntr += not is_val
train, val = np.concatenate(train), np.concatenate(val)

def shard(path):
    b = open(path, "rb").read()
    magic, version, count = struct.unpack("<3i", b[:12])
    assert (magic, version) == (20240520, 1), (magic, version)
    assert struct.unpack("<253i", b[12:1024]) == (0,) * 253
    assert len(b) == 1024 + 2 * count, (len(b), count)
    return np.frombuffer(b[1024:], np.uint16)

for name, want in (("train", train), ("val", val)):
    got = shard(os.path.join(data, name + "_000000.bin"))
    if not np.array_equal(got, want):
        k = int(np.argmax(got[:len(want)] != want[:len(got)])) if len(got) and len(want) else 0
        sys.exit(f"    {name}: {len(got)} tokens vs {len(want)} expected, first difference at {k}")
m = re.search(r"prepared (\d+) documents \((\d+) train, (\d+) val\) from (\d+) files: wrote (\d+) train tokens to "
              r"\S+/train_000000.bin and (\d+) val tokens to \S+/val_000000.bin", out)
assert m, out
assert tuple(map(int, m.groups())) == (len(docs), ntr, nva, len(files), len(train), len(val)), (m.groups(), len(docs), ntr, nva, len(files))
p = np.bincount(train, minlength=257) / len(train)
p = p[p > 0]
h = float(-(p * np.log2(p)).sum())
m = re.search(r"unigram entropy of the train tokens: ([\d.]+) bits = ([\d.]+) nats per token", out)
assert m, out
assert abs(float(m.group(1)) - h) < 6e-5 and abs(float(m.group(2)) - h * math.log(2)) < 6e-5, (m.groups(), h)
print(f"    oracle: {len(docs)} documents, {len(train)} + {len(val)} tokens, entropy {h:.4f} bits: match")
PY
exit 0
