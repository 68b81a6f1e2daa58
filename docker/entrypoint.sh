#!/bin/sh
# The container's first program. With EMX_TAP set (the default image runs
# emxd on `net_tap0,iface=$EMX_TAP`), it joins that tap device to eth0 with a
# Linux bridge once DPDK has started the port, so that the tap's frames reach
# the container network; then it becomes emxd (exec: emxd is PID 1 and gets
# docker stop's SIGTERM itself).
#
# A bridge keeps frames for its ports' own MACs to itself, and DPDK's port
# uses the tap's MAC: so the kernel side of the tap gets another one (eth0's
# with a different first octet), and frames for DPDK's MAC are forwarded
# into the tap. DPDK puts its MAC back on the tap whenever it starts the
# port (rte_eth_dev_start restores the port's MAC just after it brings the
# tap up), so a change made once can be undone a moment later; the node then
# gets only broadcast frames and its peers go silent. The watcher below
# therefore follows the tap's netlink events for the container's lifetime
# and makes the change again each time, within milliseconds.
if [ -n "${EMX_TAP:-}" ]; then
    read -r eth0_mac < /sys/class/net/eth0/address
    tap_mac="0a:${eth0_mac#???}"
    tap=/sys/class/net/$EMX_TAP
    # Idempotent: nothing until DPDK has brought the tap up, then the MAC
    # and the bridge, whichever is missing.
    own_tap() {
        [ -r "$tap/flags" ] && read -r flags < "$tap/flags" || return 0
        [ $((flags & 1)) = 1 ] || return 0 # IFF_UP
        read -r mac < "$tap/address"
        [ "$mac" = "$tap_mac" ] || ip link set "$EMX_TAP" address "$tap_mac"
        if [ ! -e /sys/class/net/emxbr ]; then
            ip link add emxbr type bridge 2>/dev/null || true
            ip link set emxbr up
        fi
        [ -e /sys/class/net/eth0/master ] || ip link set eth0 master emxbr
        [ -e "$tap/master" ] || ip link set "$EMX_TAP" master emxbr
    }
    (
        # Every link event (there are few: lo, eth0, the tap, the bridge),
        # plus a tick each second for changes made before the monitor
        # listened.
        {
            while :; do echo tick; sleep 1; done &
            exec ip -o monitor link
        } | while read -r _; do own_tap; done
    ) &
fi
exec /usr/local/bin/emxd "$@"
