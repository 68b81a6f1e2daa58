#!/bin/sh
# The container's first program. With EMX_TAP set (the default image runs
# emxd on `net_tap0,iface=$EMX_TAP`), it joins that tap device to eth0 with a
# Linux bridge as soon as DPDK has made it, so that the tap's frames reach the
# container network; then it becomes emxd (exec: emxd is PID 1 and gets
# docker stop's SIGTERM itself).
if [ -n "${EMX_TAP:-}" ]; then
    (
        # Wait until DPDK has started the port, which brings the tap up. Not
        # just until the tap exists: DPDK creates it first and sets its MAC
        # a moment later, which would undo the change below (then the
        # bridge keeps the port's frames to itself, and the node goes silent).
        i=0
        until case "$(ip link show "$EMX_TAP" 2>/dev/null)" in
            *[\<,]UP[,\>]*) true ;;
            *) false ;;
        esac; do
            i=$((i + 1))
            [ "$i" -le 600 ] || { echo "entrypoint: $EMX_TAP not up after 30 s" >&2; exit 1; }
            sleep 0.05
        done
        # A bridge keeps frames for its ports' own MACs to itself, and DPDK's
        # port uses the tap's MAC: give the kernel side of the tap another
        # one (eth0's with a different first octet), so that frames for
        # DPDK's MAC are forwarded into the tap.
        read -r mac < /sys/class/net/eth0/address
        ip link set "$EMX_TAP" address "0a:${mac#???}"
        ip link add emxbr type bridge 2>/dev/null || true
        ip link set emxbr up
        ip link set eth0 master emxbr
        ip link set "$EMX_TAP" master emxbr
        ip link set "$EMX_TAP" up
    ) &
fi
exec /usr/local/bin/emxd "$@"
