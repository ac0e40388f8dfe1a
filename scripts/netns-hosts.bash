# Two hosts made as network namespaces on this machine, joined by a data and a management
# link, and a launcher for ranks on both (docs/distributed.md, "Across hosts"): for
# tests/hosts.sh and bench/bench_ep.sh --hosts. Sourced by a script that defines fail
# MESSAGE (print it, exit non-zero), tmp (its scratch directory) and mpi_impl (openmpi or
# mpich), and calls netns_hosts_down from its EXIT trap. Needs root and iproute2's ip.
#
# netns_hosts_up makes the hosts and sets ha, hb (the namespaces), ipa, ipb (the hosts'
# names: their management addresses), nic, mgt (the data and management interfaces, the
# same name on both hosts) and the ssh stand-in $tmp/agent.
# across PROGRAM ARGS: 2 ranks, one per host (PER_HOST=n: n per host, ranks 0..n-1 on host
# a), launched from host a (itself entered as the agent enters a host), ending after
# ACROSS_TIMEOUT seconds (default 120).

netns_hosts_down() {
    local ns pids
    for ns in ${ha:-} ${hb:-}; do
        pids=$(ip netns pids $ns 2>/dev/null)
        [ -n "$pids" ] && kill -9 $pids 2>/dev/null
        ip netns del $ns 2>/dev/null
    done
}

netns_hosts_up() {
    # Names unique to this run, so that parallel runs do not clash (interface names <= 15 chars).
    # Two links, as on a cluster: the management network the launcher starts and controls the
    # ranks over (mxmgt0, 10.231.1.0/24; the hosts' names are these addresses) and the data
    # network MPI's traffic takes (mxnet0, 10.231.0.0/24).
    id=$$
    ha=mxh${id}a hb=mxh${id}b
    ipa=10.231.1.1 ipb=10.231.1.2
    nic=mxnet0 mgt=mxmgt0
    command -v ip >/dev/null || fail "this needs iproute2's ip (apt-get install iproute2)"
    err=$(ip netns add $ha 2>&1) || fail "cannot make network namespaces (ip netns add: $err): this needs root"
    ip netns add $hb || fail "ip netns add $hb failed"
    for link in 0:$nic 1:$mgt; do
        net=${link%%:*} name=${link#*:}
        ip link add mxv${id}a$net type veth peer name mxv${id}b$net || fail "cannot make a veth pair"
        ip link set mxv${id}a$net netns $ha && ip link set mxv${id}b$net netns $hb || fail "cannot move the veths into the namespaces"
        for h in a b; do
            ns=$(eval echo \$h$h) n=$([ $h = a ] && echo 1 || echo 2)
            ip -n $ns link set mxv${id}$h$net name $name && ip -n $ns addr add 10.231.$net.$n/24 dev $name &&
                ip -n $ns link set $name up && ip -n $ns link set lo up || fail "cannot configure host $h"
        done
    done
    echo "    hosts: $ha and $hb, a data link ($nic, 10.231.0.0/24) and a management link ($mgt, 10.231.1.0/24)"

    # The ssh stand-in: AGENT [ssh options] HOST COMMAND... runs COMMAND on HOST: in its network
    # namespace, and in IPC and UTS namespaces of its own with the namespace's name as host
    # name, so that MPI sees another machine (UCX, MPICH's transport, would otherwise take the
    # shared memory of the machine under the namespaces for the way between the hosts).
    cat > "$tmp/agent" <<SH
#!/bin/sh
while [ \$# -gt 0 ]; do case "\$1" in -o|-l|-p|-i) shift 2 ;; -*) shift ;; *) break ;; esac; done
host=\$1; shift
case "\$host" in $ipa) ns=$ha ;; $ipb) ns=$hb ;; *) echo "agent: unknown host \$host" >&2; exit 255 ;; esac
exec ip netns exec \$ns unshare --ipc --uts /bin/sh -c "hostname \$ns && \$*"
SH
    chmod +x "$tmp/agent"
}

across() {
    local n=${PER_HOST:-1}
    if [ "$mpi_impl" = mpich ]; then
        timeout ${ACROSS_TIMEOUT:-120} "$tmp/agent" $ipa mpiexec.mpich -hosts $ipa:$n,$ipb:$n -launcher ssh -launcher-exec "$tmp/agent" -iface $mgt \
            -genv UCX_NET_DEVICES $nic -np $((2 * n)) "$@"
    else
        timeout ${ACROSS_TIMEOUT:-120} "$tmp/agent" $ipa mpirun --allow-run-as-root --host $ipa:$n,$ipb:$n -np $((2 * n)) --mca plm_rsh_agent "$tmp/agent" \
            --mca btl tcp,self --mca btl_tcp_if_include $nic --mca oob_tcp_if_include $mgt \
            -x OMP_NUM_THREADS -x OMP_WAIT_POLICY -x ASAN_OPTIONS "$@"
    fi
}
