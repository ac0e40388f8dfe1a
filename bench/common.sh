# Sourced by the benchmark scripts that run `mxtrain`.

# The CPU a benchmark ran on, as their Markdown names it: the model name (lscpu's, else
# /proc/cpuinfo's), family, model, clock and which of the instruction sets mxtrain chooses
# its kernels among the CPU has.
bench_cpu() {
    local name simd
    field() { sed -n "s/^$1[[:space:]]*: //p" /proc/cpuinfo | head -1; }
    name=$(lscpu 2>/dev/null | sed -n 's/^Model name:[[:space:]]*//p' | head -1)
    simd=$(field flags | tr ' ' '\n' | grep -E '^(avx2|fma|f16c|avx512f|avx512_bf16|amx_bf16)$' | tr '\n' ' ')
    echo "${name:-$(field 'model name')} (family $(field 'cpu family'), model $(field model), $(field 'cpu MHz' | cut -d. -f1) MHz; ${simd% })"
}

# bench_start ROOT: a scratch directory $tmp (removed on exit) with a private copy of $bin
# (other work may rebuild build/ while a benchmark runs) and the prepared corpus in
# $tmp/data; $rev and $cpu name the revision and the CPU.
bench_start() {
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    cp "$bin" "$tmp/mxtrain"
    bin="$tmp/mxtrain"
    rev=$(git -C "$1" describe --always --dirty 2>/dev/null || echo "unknown revision")
    cpu=$(bench_cpu)
    "$bin" prepare --out "$tmp/data" > "$tmp/prepare.log" 2>&1 || { cat "$tmp/prepare.log" >&2; exit 1; }
}
