#!/usr/bin/env bash
# The namespace testbed: N nodes (default 3), each a network namespace joined
# to one Linux bridge by a veth pair, each running emxd over net_af_packet on
# its eth0 with MACs learnt at run time. Then the cluster check:
#   1. every node echoes eager and rendezvous messages off every other, byte-exact;
#   2. the last node is stopped (SIGTERM; it must exit 0): the others report
#      it down within the liveness deadline and keep exchanging among themselves;
#   3. it is started again: it rejoins with a new epoch, and checks pass again;
#   4. all of it through emxctl;
#   5. n1 is cut off from the bridge until it and the others have given each
#      other up, then joined again: every node sees every other up again,
#      with no restart, and checks pass.
# Everything is torn down at the end, also after a failure or Ctrl-C.
#
# Usage (as root): scripts/testbed-netns.sh [N]
# EMXD and EMXCTL may name prebuilt binaries; otherwise they are built.
set -euo pipefail
N=${1:-3}
# Given paths are the caller's: made absolute before the cd below (a bare
# name is a command on PATH).
abs() { case $1 in */*) realpath -m -- "$1" ;; *) printf '%s' "$1" ;; esac; }
EMXD=${EMXD:+$(abs "$EMXD")}
EMXCTL=${EMXCTL:+$(abs "$EMXCTL")}
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "testbed-netns: needs root (network namespaces); run with sudo" >&2; exit 1; }
command -v ip >/dev/null || { echo "testbed-netns: install iproute2" >&2; exit 1; }
[ "$N" -ge 2 ] 2>/dev/null || { echo "testbed-netns: N must be a number >= 2" >&2; exit 1; }

if [ -z "${EMXD:-}" ] || [ -z "${EMXCTL:-}" ]; then
    # Into this checkout's target/, where the binaries are looked for below,
    # whatever target directory the environment names.
    build=(cargo build --release --quiet -p emx-daemon --bin emxd --bin emxctl --target-dir "$PWD/target")
    if [ -n "${SUDO_USER:-}" ] && [ "$SUDO_USER" != root ]; then
        # Under sudo: built as the user who ran it, with their Rust (sudo's
        # PATH has no ~/.cargo/bin) and without leaving root-owned files in
        # their target/.
        sudo -u "$SUDO_USER" -H bash -lc 'cd "$1" && shift && "$@"' _ "$PWD" "${build[@]}"
    else
        command -v cargo >/dev/null || { echo "testbed-netns: cargo not found: install Rust, or give EMXD and EMXCTL" >&2; exit 1; }
        "${build[@]}"
    fi
    # (One given stays: only the missing one comes from the build.)
    EMXD=${EMXD:-$PWD/target/release/emxd}
    EMXCTL=${EMXCTL:-$PWD/target/release/emxctl}
fi

TAG="emxt$$"
BR="${TAG}br"
WORK=$(mktemp -d "/tmp/emx-testbed.$$.XXXXXX")
DEADLINE_MS=1000
declare -A PID
# What this run made, the only things its cleanup removes: a name taken by
# another run (two runs of one pid in different pid namespaces sharing the
# host's network) fails this run without tearing that one down.
MADE=()

say() { echo "testbed: $*"; }

# Whether process $1 runs (a zombie, exited and not yet reaped, does not).
alive() {
    local st
    st=$(cut -d' ' -f3 "/proc/$1/stat" 2>/dev/null) || return 1
    [ -n "$st" ] && [ "$st" != Z ]
}

# Waits for emxd $1, told to stop, to exit: up to 10 s, then it is killed
# (a teardown used to wait for ever on one that did not stop). Its status.
reap() {
    local t=0 rc=0
    while alive "$1" && [ $t -lt 100 ]; do sleep 0.1; t=$((t + 1)); done
    if alive "$1"; then
        say "emxd (pid $1) did not exit within 10 s of SIGTERM: killed"
        kill -KILL "$1" 2>/dev/null || true
    fi
    wait "$1" 2>/dev/null || rc=$?
    return "$rc"
}

cleanup() {
    local rc=$?
    # A second Ctrl-C must not cut the teardown short (it ended the wait for
    # the daemons and exited, before anything was removed).
    trap '' INT TERM
    for i in "${!PID[@]}"; do kill -TERM "${PID[$i]}" 2>/dev/null || true; done
    for i in "${!PID[@]}"; do reap "${PID[$i]}" || true; done
    for made in "${MADE[@]}"; do
        case $made in
            ns:*) ip netns del "${made#ns:}" 2>/dev/null || true ;;
            link:*) ip link del "${made#link:}" 2>/dev/null || true ;;
        esac
    done
    if [ "$rc" != 0 ]; then
        say "FAILED; daemon logs:"
        tail -n 20 "$WORK"/*.log 2>/dev/null || true
    fi
    rm -rf "$WORK"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# shellcheck source=scripts/cluster-check.sh
. scripts/cluster-check.sh

# What a run killed outright (SIGKILL, a test runner's timeout) left, named
# after its pid, removed once that run is over (see run_over); a live run's
# is left alone: its namespaces with the emxd still running in them (a
# namespace outlives its name while a process is in it, and so does the veth
# into it), its bridge and veths, and its work directory.
stale_pid() { [[ $1 =~ ^emxt([0-9]+)(n[0-9]+|br|v[0-9]+)$ ]] && run_over "${BASH_REMATCH[1]}"; }
for ns in $(ip netns list | awk '{print $1}'); do
    if stale_pid "$ns"; then
        ip netns pids "$ns" 2>/dev/null | xargs -r kill -KILL 2>/dev/null || true
        ip netns del "$ns" 2>/dev/null || true
    fi
done
for link in $(ip -o link show | awk -F': ' '{print $2}' | cut -d@ -f1); do
    if stale_pid "$link"; then ip link del "$link" 2>/dev/null || true; fi
done
for dir in /tmp/emx-testbed.*.*; do
    pid=${dir#/tmp/emx-testbed.}
    pid=${pid%%.*}
    if [ "$dir" != "$WORK" ] && [[ $pid =~ ^[0-9]+$ ]] && run_over "$pid"; then rm -rf "$dir"; fi
done

cluster_file 9 "net_af_packet0,iface=eth0,qpairs=1" text > "$WORK/cluster.toml"

say "making $N namespaces on bridge $BR"
ip link add "$BR" type bridge
MADE+=("link:$BR")
ip link set "$BR" up
for i in $(seq 1 "$N"); do
    ns="${TAG}n$i"
    ip netns add "$ns"
    MADE+=("ns:$ns")
    # (The veth goes with its namespace.)
    ip link add "${TAG}v$i" type veth peer name eth0 netns "$ns"
    ip link set "${TAG}v$i" master "$BR" up
    ip -n "$ns" link set lo up
    ip -n "$ns" link set eth0 up
done

start() {
    local i=$1
    ip netns exec "${TAG}n$i" "$EMXD" --config "$WORK/cluster.toml" --node "n$i" \
        --control "$WORK/n$i.sock" >>"$WORK/n$i.log" 2>&1 &
    PID[$i]=$!
}
ctl() { local i=$1; shift; "$EMXCTL" --control "$WORK/n$i.sock" "$@"; }
wait_socket() {
    for _ in $(seq 1 200); do [ -S "$WORK/n$1.sock" ] && return 0; sleep 0.05; done
    say "emxd n$1 did not open its control socket"; return 1
}

wait_up() {
    wait_socket "$1"
    ctl "$1" wait --state up --within 30 >/dev/null
}
stop_node() {
    local rc=0
    kill -TERM "${PID[$1]}"
    reap "${PID[$1]}" || rc=$?
    unset "PID[$1]"
    [ "$rc" = 0 ] || { say "emxd n$1 exited $rc on SIGTERM"; return 1; }
}
start_node() { start "$1"; }
# Cuts node I off the bridge (its port down), or joins it again.
partition() {
    case "$2" in
        cut) ip link set "${TAG}v$1" down ;;
        heal) ip link set "${TAG}v$1" up ;;
    esac
}

for i in $(seq 1 "$N"); do start "$i"; done
cluster_check
