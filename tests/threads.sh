#!/bin/bash
# OpenMP wait policy and thread placement: unless the user chose one, mxtrain's threads spin
# briefly, then sleep when they wait (GOMP_SPINCOUNT=10000 for libgomp, KMP_BLOCKTIME=0 for
# LLVM's libomp, set before the runtime loads by a re-exec), so a run sharing its cores does
# not collapse (libgomp's own default spins 300000 rounds); and a process that uses every CPU of its
# affinity mask alone binds one thread to each (OMP_PROC_BIND=true, OMP_PLACES=threads), so
# woken threads do not pile onto one core. A policy or placement the user set is kept; a
# process with fewer threads than CPUs, or beside other ranks on the host, is not bound.
# Checked in what the OpenMP runtime itself reports (OMP_DISPLAY_ENV=verbose): libgomp's
# spin count, or LLVM libomp's block time, and OMP_PROC_BIND.
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
case "$got" in spin=10000|blocktime=0) ;; *) fail "default: not a short spin, then sleep ($got)" ;; esac
got=$(policy OMP_WAIT_POLICY=active)
case "$got" in spin=0|blocktime=0|unknown*) fail "OMP_WAIT_POLICY=active was overridden ($got)" ;; esac
got=$(policy GOMP_SPINCOUNT=12345)
case "$got" in spin=12345|blocktime=*) ;; *) fail "GOMP_SPINCOUNT=12345 was overridden ($got)" ;; esac

bind() {   # bind ENV... -> the runtime's OMP_PROC_BIND, last report wins
    env -u OMP_WAIT_POLICY -u OMP_PROC_BIND -u OMP_PLACES -u OMP_NUM_THREADS -u OMPI_COMM_WORLD_LOCAL_SIZE \
        OMP_DISPLAY_ENV=verbose "$@" "$bin" version 2>&1 >/dev/null |
        sed -n "s/.*OMP_PROC_BIND = '\([A-Za-z,]*\)'.*/\1/p" | tail -1
}
cpus=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)   # GNU nproc counts OMP_NUM_THREADS too
want=FALSE
[ "$cpus" -ge 2 ] && want=TRUE
[ "$(bind)" = "$want" ] || fail "default on $cpus CPUs: OMP_PROC_BIND is '$(bind)', expected $want"
[ "$(bind OMP_NUM_THREADS="$cpus")" = "$want" ] || fail "OMP_NUM_THREADS=$cpus: OMP_PROC_BIND is '$(bind OMP_NUM_THREADS="$cpus")'"
[ "$(bind OMP_NUM_THREADS=1)" = FALSE ] || fail "OMP_NUM_THREADS=1 (fewer threads than CPUs) was bound"
[ "$(bind OMPI_COMM_WORLD_LOCAL_SIZE=2)" = FALSE ] || fail "a rank beside another on the host was bound"
[ "$(bind OMP_PROC_BIND=false)" = FALSE ] || fail "OMP_PROC_BIND=false was overridden"
[ "$(bind OMP_PROC_BIND=spread)" = SPREAD ] || fail "OMP_PROC_BIND=spread was overridden: '$(bind OMP_PROC_BIND=spread)'"
echo "    default: $(policy), OMP_PROC_BIND $(bind) on $cpus CPUs; OMP_WAIT_POLICY=active: $(policy OMP_WAIT_POLICY=active)"
