#!/bin/bash
# The library exports only prefixed names: mx_ / MX_ (public) and mxi_ (internal). Anything
# else it defines globally would collide with a program that links it and defines the same
# name; such functions must be static or take the prefix.
set -u
build="${BUILD:-build}"
lib="$build/libmxtrain.a"
[ -f "$lib" ] || { echo "    no $lib"; exit 1; }
# unprefixed ARCHIVE: the global symbols ARCHIVE defines without a prefix, one per line;
# those the compiler makes itself are not names a program could define (OpenMP reductions'
# `.gomp_critical_user_...`, AddressSanitizer's `__odr_asan.NAME` beside each global NAME)
unprefixed() {
    nm -g --defined-only "$1" | awk 'NF == 3 && $2 ~ /^[A-Z]$/ {print $3}' | grep -v '^\(mx_\|mxi_\|MX_\|MXI_\)' |
        grep -v '^\.\|^__odr_asan\.' | sort -u
}
# the check itself catches an unprefixed global (and leaves a static alone)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
printf 'int stray_global(void) { return 1; }\nstatic int kept(void) { return 2; }\nint mxi_fine(void) { return kept(); }\n' > "$dir/t.c"
cc -c "$dir/t.c" -o "$dir/t.o" && ar rcs "$dir/t.a" "$dir/t.o" || { echo "    could not build the probe"; exit 1; }
[ "$(unprefixed "$dir/t.a")" = stray_global ] || { echo "    the check missed stray_global in a probe archive"; exit 1; }
bad=$(unprefixed "$lib")
count=$(nm -g --defined-only "$lib" | awk 'NF == 3 && $2 ~ /^[A-Z]$/' | wc -l)
[ "$count" -gt 100 ] || { echo "    nm found only $count global symbols in $lib"; exit 1; }
[ -z "$bad" ] || { echo "    $lib exports unprefixed globals (make them static or prefix mxi_):"; echo "$bad" | sed 's/^/      /'; exit 1; }
echo "    $count global symbols, all prefixed"
