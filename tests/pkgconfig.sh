#!/bin/bash
# An outside program links against the library of this checkout through build/mxtrain.pc.
set -u
build="${BUILD:-build}"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cat > "$dir/outside.c" <<'C'
#include <stdio.h>
#include <mxtrain/mx.h>
#include <mxtrain/plan.h>
int main(void) {
    float x[40];
    for (int i = 0; i < 40; i++) x[i] = (float)i;
    uint8_t q[40], s[2];
    int rc = mx_quantize_f32(x, 1, 40, MX_ROWWISE, MX_E4M3, MX_SCALE_FLOOR, q, s);
    mx_recipe r;
    int rr = mx_recipe_parse("mxfp8", &r, NULL);
    printf("%d %d %d %d\n", rc, rr, s[0], q[39]);
    return 0;
}
C
flags=$(PKG_CONFIG_PATH="$build" pkg-config --cflags --libs --static mxtrain) || { echo "    pkg-config failed"; exit 1; }
cc=$(PKG_CONFIG_PATH="$build" pkg-config --variable=cc mxtrain)
$cc "$dir/outside.c" -o "$dir/outside" $flags || { echo "    linking with: $flags failed"; exit 1; }
out=$("$dir/outside") || { echo "    outside program failed"; exit 1; }
# s[0]: block 0 (0..31) has amax 31 = 1.94 * 2^4, so the floor scale is 2^(4-8): code 123.
# q[39]: block 1 (32..39) has amax 39 = 1.22 * 2^5, scale 2^-3; 39 * 8 = 312 lies above the
# midpoint 304 of the E4M3 neighbours 288 and 320, so it becomes 320 = 0x7A = 122.
[ "$out" = "0 0 123 122" ] || { echo "    outside program printed '$out', want '0 0 123 122'"; exit 1; }
