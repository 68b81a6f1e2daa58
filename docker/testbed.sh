#!/usr/bin/env bash
# The Docker testbed: the emx-node image (docker/build-image.sh, cached), N
# containers (default 3) on a bridge network of their own, each running emxd
# on a DPDK tap bridged to its eth0 (EMX_DOCKER_PORT=af_packet: on eth0
# through net_af_packet) with MACs learnt at run time, then the
# cluster check through `docker exec ... emxctl`:
#   1. every node echoes eager and rendezvous messages off every other, byte-exact;
#   2. the last container is stopped (docker stop: SIGTERM, and emxd must exit
#      0): the others report it down within the liveness deadline and keep
#      exchanging among themselves;
#   3. it is started again: it rejoins with a new epoch, and checks pass again.
# Before the check, with the tap port, n1's tap gets DPDK's MAC back as when
# DPDK starts the port, and the entrypoint must take it back at once.
# Everything is removed at the end, also after a failure or Ctrl-C, unless
# EMX_KEEP is set: then the containers stay up for a look, and the script says
# how to reach them and how to remove them. What a run killed outright
# (SIGKILL, a test runner's timeout) left, containers and network labelled
# with its pid, the next run removes once that pid is gone; kept runs stay.
#
# Usage: [EMX_KEEP=1] [EMX_DOCKER_PORT=tap|af_packet] docker/testbed.sh [N]
set -euo pipefail
N=${1:-3}
cd "$(dirname "$0")/.."
command -v docker >/dev/null \
    || { echo "docker testbed: no docker command here: install Docker (with compose)" >&2; exit 1; }
# What docker says is the reason: a daemon not running, or a socket this user
# may not use.
if ! why=$(docker info 2>&1 >/dev/null); then
    echo "docker testbed: no Docker engine answers here: ${why:-docker info failed}" >&2
    case "$why" in
        *"permission denied"*) echo "  (add this user to the docker group and log in again, or run as root)" >&2 ;;
        *"Cannot connect"*|*"Is the docker daemon running"*) echo "  (start it: systemctl start docker)" >&2 ;;
    esac
    exit 1
fi
# Compose v2 (the docker plugin) or v1 (Debian's docker-compose).
if docker compose version >/dev/null 2>&1; then
    COMPOSE=(docker compose)
elif command -v docker-compose >/dev/null; then
    COMPOSE=(docker-compose)
else
    echo "docker testbed: needs Docker Compose (the docker compose plugin, or docker-compose)" >&2
    exit 1
fi
[ "$N" -ge 2 ] 2>/dev/null || { echo "docker testbed: N must be a number >= 2" >&2; exit 1; }

# shellcheck source=scripts/cluster-check.sh
. scripts/cluster-check.sh

# What runs killed outright left (not kept ones, nor live runs'): containers,
# networks and work directories, each named or labelled with its run's pid
# (see run_over). Only this user's runs in this pid namespace are looked at:
# the Docker engine may serve other users, and containers whose pids mean
# something else.
OWNER="$(id -u):$(readlink /proc/self/ns/pid 2>/dev/null || echo unknown)"
stale() { [[ $1 =~ ^[0-9]+$ ]] && [ -z "$2" ] && run_over "$1"; }
sweep() { # docker ps -a | docker network ls, and how to remove one
    local what=$1 rm=$2 id pid keep owner
    docker $what --filter label=emx.testbed --filter "label=emx.owner=$OWNER" \
        --format '{{.ID}} {{.Label "emx.testbed"}} {{.Label "emx.owner"}} {{.Label "emx.keep"}}' \
        | while read -r id pid owner keep; do
            if stale "$pid" "$keep"; then docker $rm "$id" >/dev/null 2>&1 || true; fi
        done
}
sweep "ps -a" "rm -f" || echo "testbed: could not list leftover containers; none removed" >&2
sweep "network ls" "network rm" || echo "testbed: could not list leftover networks; none removed" >&2
for dir in /tmp/emx-docker.*.*; do
    [ -d "$dir" ] && [ -O "$dir" ] || continue
    old=${dir#/tmp/emx-docker.}
    old=${old%%.*}
    if stale "$old" "$([ -e "$dir/kept" ] && echo kept)"; then rm -rf "$dir" 2>/dev/null || true; fi
done

# This tree's image, by its content tag: another tree's build may move latest.
IMAGE=$(bash docker/build-image.sh | tail -n 1)
[[ $IMAGE =~ ^emx-node:[0-9a-f]+$ ]] || { echo "docker testbed: docker/build-image.sh gave no image tag" >&2; exit 1; }

# Each node's DPDK port: a tap device, which the image's entrypoint bridges
# to the container's eth0, or eth0 itself through an af_packet socket
# (EMX_DOCKER_PORT=af_packet).
if [ "${EMX_DOCKER_PORT:-tap}" = tap ] && [ ! -c /dev/net/tun ]; then
    echo "docker testbed: no /dev/net/tun on this machine: using af_packet on eth0 instead of a tap" >&2
    EMX_DOCKER_PORT=af_packet
fi
case "${EMX_DOCKER_PORT:-tap}" in
    tap) PORT="net_tap0,iface=emxtap" ;;
    af_packet) PORT="net_af_packet0,iface=eth0,qpairs=1" ;;
    *) echo "docker testbed: EMX_DOCKER_PORT is tap or af_packet" >&2; exit 1 ;;
esac

TAP=""
DEVICES=""
if [ "${EMX_DOCKER_PORT:-tap}" = tap ]; then
    TAP=emxtap
    DEVICES='"/dev/net/tun:/dev/net/tun"'
fi
if [ -n "${EMX_KEEP:-}" ] && ! [[ $EMX_KEEP =~ ^[A-Za-z0-9._-]+$ ]]; then
    echo "docker testbed: EMX_KEEP is a word (letters, digits, . _ -)" >&2
    exit 1
fi
# The pid-namespace inode too: two runs in containers that share the host's
# Docker may have the same pid, and compose would take one's project for the
# other's (recreating its nodes, then removing them).
PROJECT="emxtb$$p$(stat -L -c %i /proc/self/ns/pid 2>/dev/null || echo 0)"
WORK=$(mktemp -d "/tmp/emx-docker.$$.XXXXXX")
DEADLINE_MS=1000
# Labels on what the run makes: its pid and owner (for the sweep above), and
# whether it is kept (EMX_KEEP's value).
LABELS="emx.testbed: \"$$\", emx.owner: \"$OWNER\""
if [ -n "${EMX_KEEP:-}" ]; then
    LABELS="$LABELS, emx.keep: \"$EMX_KEEP\""
    echo "$EMX_KEEP" > "$WORK/kept"
fi
say() { echo "testbed: $*"; }
compose() { "${COMPOSE[@]}" -p "$PROJECT" -f "$WORK/compose.yml" "$@"; }

cleanup() {
    local rc=$? out
    # A second Ctrl-C must not cut the teardown short (it ended the wait for
    # the daemons and exited, before anything was removed).
    trap '' INT TERM
    if [ "$rc" != 0 ]; then
        say "FAILED; container logs:"
        compose logs --tail 20 2>/dev/null || true
    fi
    if [ -n "${EMX_KEEP:-}" ]; then
        # $WORK keeps the compose file the commands below need.
        say "kept (EMX_KEEP): project $PROJECT, files in $WORK"
        say "  look: ${COMPOSE[*]} -p $PROJECT -f $WORK/compose.yml exec n1 emxctl --control /run/emx/emxd.sock peers"
        say "  remove: ${COMPOSE[*]} -p $PROJECT -f $WORK/compose.yml down --volumes --timeout 5 && rm -rf $WORK"
    elif out=$(compose down --volumes --timeout 5 2>&1); then
        rm -rf "$WORK"
    else
        # $WORK keeps the compose file that removes what is left.
        say "could not remove project $PROJECT: $out"
        say "  remove: ${COMPOSE[*]} -p $PROJECT -f $WORK/compose.yml down --volumes --timeout 5 && rm -rf $WORK"
        say "  (or leave it to the next run's sweep)"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The cluster file: like config/examples/docker.toml, for N nodes.
cluster_file 3 "$PORT" json > "$WORK/cluster.toml"
chmod 644 "$WORK/cluster.toml"

# The compose file: docker/compose.yml is this for N = 3.
{
    printf 'version: "3.8"\nservices:\n'
    for i in $(seq 1 "$N"); do
        cat <<YAML
  n$i:
    image: $IMAGE
    pull_policy: never
    hostname: n$i
    environment:
      EMX_NODE: n$i
      EMX_TAP: $TAP
    command: ["--control", "/run/emx/emxd.sock"]
    cap_add: [NET_RAW, NET_ADMIN, IPC_LOCK]
    devices: [$DEVICES]
    stop_signal: SIGTERM
    stop_grace_period: 10s
    networks: [emx]
    labels: { $LABELS }
YAML
    done
    printf 'networks:\n  emx:\n    driver: bridge\n    labels: { %s }\n' "$LABELS"
} > "$WORK/compose.yml"

ctl() { local i=$1; shift; compose exec -T "n$i" /usr/local/bin/emxctl --control /run/emx/emxd.sock "$@"; }
# Node $1's container, running or not.
cid_of() {
    docker ps -a -q --filter "label=com.docker.compose.project=$PROJECT" \
        --filter "label=com.docker.compose.service=n$1"
}
running() { [ "$(docker inspect -f '{{.State.Running}}' "$(cid_of "$1")")" = true ]; }
wait_up() {
    for _ in $(seq 1 200); do
        running "$1" || { say "n$1 stopped"; return 1; }
        ctl "$1" status >/dev/null 2>&1 && break
        sleep 0.1
    done
    ctl "$1" wait --state up --within 30 >/dev/null
}

stop_node() {
    local cid rc
    compose stop -t 10 "n$1" >/dev/null
    cid=$(cid_of "$1")
    rc=$(docker inspect -f '{{.State.ExitCode}}' "$cid")
    [ "$rc" = 0 ] || { say "emxd in n$1 exited $rc on SIGTERM"; return 1; }
}
start_node() { compose start "n$1" >/dev/null; }

# DPDK puts its own MAC back on the tap whenever it starts the port, which
# would leave the bridge keeping the node's unicast frames to itself (see
# docker/entrypoint.sh). Do what DPDK does, on n1, and check that the
# entrypoint's watcher takes the tap's MAC back at once; the cluster check
# after it fails if n1 stopped getting its frames.
tap_mac_is_repaired() {
    local mac i
    mac=$(ctl 1 status | sed -n 's/.*, mac \([0-9a-f:]*\),.*/\1/p')
    [ -n "$mac" ] || { say "no MAC in n1's status"; return 1; }
    compose exec -T n1 ip link set "$TAP" address "$mac"
    local link
    for i in $(seq 1 50); do
        # (A failed exec says nothing of the tap: it must not read as
        # taken back.)
        link=$(compose exec -T n1 ip -o link show "$TAP") || { say "n1: cannot read the tap's MAC"; return 1; }
        case "$link" in
            *"link/ether $mac "*) sleep 0.1 ;;
            *"link/ether "*) say "n1: the tap's MAC was taken back from DPDK's after ${i}00 ms at most"; return 0 ;;
            *) say "n1: no MAC in the tap's link: $link"; return 1 ;;
        esac
    done
    say "n1: the tap kept DPDK's MAC ($mac) for 5 s"
    return 1
}

say "project $PROJECT: starting $N containers of $IMAGE"
# Compose v1 ignores pull_policy: an image gone since the build (another
# tree's build-image prunes old ones) would send it to a registry.
docker image inspect "$IMAGE" >/dev/null 2>&1 \
    || { echo "docker testbed: image $IMAGE is gone since it was built; run again" >&2; exit 1; }
compose up --no-start >/dev/null 2>&1 || compose up --no-start
# The cluster file goes in by copy, not by a bind mount of $WORK: a Docker
# that cannot see this machine's /tmp (snap's, whose /tmp is its own, or one
# outside this container) gets it too.
for i in $(seq 1 "$N"); do
    docker cp "$WORK/cluster.toml" "$(cid_of "$i"):/etc/emx/cluster.toml" >/dev/null
done
compose start >/dev/null 2>&1 || compose start
if [ -n "$TAP" ]; then
    wait_up 1
    tap_mac_is_repaired
fi
cluster_check
