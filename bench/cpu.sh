# Sourced by the benchmark scripts: bench_cpu prints the CPU a benchmark ran on, as their
# Markdown names it: the model name (lscpu's, else /proc/cpuinfo's), family, model, clock
# and which of the instruction sets mxtrain chooses its kernels among the CPU has.
bench_cpu() {
    local name simd
    field() { sed -n "s/^$1[[:space:]]*: //p" /proc/cpuinfo | head -1; }
    name=$(lscpu 2>/dev/null | sed -n 's/^Model name:[[:space:]]*//p' | head -1)
    simd=$(field flags | tr ' ' '\n' | grep -E '^(avx2|fma|f16c|avx512f|avx512_bf16|amx_bf16)$' | tr '\n' ' ')
    echo "${name:-$(field 'model name')} (family $(field 'cpu family'), model $(field model), $(field 'cpu MHz' | cut -d. -f1) MHz; ${simd% })"
}
