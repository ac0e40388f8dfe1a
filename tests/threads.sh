#!/bin/bash
# OpenMP wait policy: unless the user chose one, mxtrain's threads sleep when they wait
# (OMP_WAIT_POLICY=passive, set before the runtime loads by a re-exec), so a run sharing its
# cores does not collapse; a policy the user set is kept. Checked in what the OpenMP runtime
# itself reports (OMP_DISPLAY_ENV=verbose): libgomp's spin count, or LLVM libomp's block time.
. "$(dirname "$0")/common.bash"

# The runtime's view, last report wins (the process before the re-exec reports too).
policy() {   # policy ENV... -> "spin=N" (libgomp) or "blocktime=N" (libomp)
    local out
    out=$(env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT -u KMP_BLOCKTIME -u KMP_LIBRARY OMP_DISPLAY_ENV=verbose "$@" \
          "$bin" version 2>&1 >/dev/null)
    local spin bt
    spin=$(sed -n "s/.*GOMP_SPINCOUNT = '\([0-9]*\)'.*/\1/p" <<<"$out" | tail -1)
    bt=$(sed -n "s/.*KMP_BLOCKTIME='\([0-9a-z]*\)'.*/\1/p" <<<"$out" | tail -1)
    if [ -n "$spin" ]; then echo "spin=$spin"; elif [ -n "$bt" ]; then echo "blocktime=$bt"; else echo "unknown: $out"; fi
}

got=$(policy)
case "$got" in spin=0|blocktime=0) ;; *) fail "default: threads still spin ($got)" ;; esac
got=$(policy OMP_WAIT_POLICY=active)
case "$got" in spin=0|blocktime=0|unknown*) fail "OMP_WAIT_POLICY=active was overridden ($got)" ;; esac
got=$(policy GOMP_SPINCOUNT=12345)
case "$got" in spin=12345|blocktime=*) ;; *) fail "GOMP_SPINCOUNT=12345 was overridden ($got)" ;; esac
echo "    default: $(policy); OMP_WAIT_POLICY=active: $(policy OMP_WAIT_POLICY=active)"
