# The cluster file and the cluster check, shared by scripts/testbed-netns.sh
# and docker/testbed.sh (sourced, not run). The caller sets N and DEADLINE_MS.
#
# run_over PID says whether the testbed run of that pid is over, so that the
# leftovers named after it may go: no such process, or a zombie (nothing may
# have reaped it yet), or this shell itself (nothing of this run exists yet
# when it sweeps: what carries its pid is an earlier run's).
#
# cluster_file ID PORT FORMAT prints a cluster file of N nodes n1..nN, with
# MACs learnt at run time, the DPDK port PORT on every node, the liveness
# deadline DEADLINE_MS, and log lines in FORMAT (text or json).
#
# For cluster_check the caller starts nodes n1..nN and defines:
#   say MSG           print a progress line
#   ctl I ARGS...     run emxctl against node I
#   wait_up I         wait until node I answers and sees every peer up
#   stop_node I       stop node I with SIGTERM; fail unless emxd exited 0
#   start_node I      start node I again
#   partition I cut|heal   (optional) cut node I off the others, or join it again
# The check:
#   1. every node echoes eager and rendezvous messages off every other, byte-exact;
#   2. the last node is stopped: every other reports it down within the
#      liveness deadline, and the rest keep exchanging among themselves;
#   3. it is started again and rejoins (with a new epoch); checks pass again;
#   4. status and peers of every node, through emxctl;
#   5. where the caller can partition: n1 is cut off until it and the others
#      have given each other up, then joined again: every node sees every
#      other up again (each greets the peers it gave up once per deadline),
#      with no restart, and checks pass.

run_over() {
    local st
    [ "$1" = $$ ] && return 0
    st=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
    st=${st##*) } # the state: the field after the last ')'
    [ "${st%% *}" = Z ]
}

cluster_file() {
    local id=$1 port=$2 format=$3 i
    cat <<TOML
[cluster]
id = $id

[protocol]
rto_initial_us = 2000
rto_min_us = 2000
keepalive_us = 100000
peer_timeout_us = ${DEADLINE_MS}000

[memory]
hugepages = "never"
memory_mb = 128
region_mb = 64

[logging]
level = "info"
format = "$format"
TOML
    for i in $(seq 1 "$N"); do
        printf '\n[[node]]\nid = %d\nname = "n%d"\nmac = "auto"\nport = "%s"\n' "$i" "$i" "$port"
    done
}

cluster_check() {
    local i j out secs
    for i in $(seq 1 "$N"); do wait_up "$i"; done
    say "all $N nodes see each other up"

    say "1. every node checks every other (1000 B eager, 1 MiB rendezvous)"
    for i in $(seq 1 "$N"); do ctl "$i" check --sizes 1000,1M; done

    say "2. stopping n$N"
    stop_node "$N"
    # Timed from the stop for every node: each wait starts when the one
    # before it ended, so its own "after" leaves that time out.
    local stopped now
    stopped=$(date +%s.%N)
    for i in $(seq 1 $((N - 1))); do
        out=$(ctl "$i" wait --peer "n$N" --state down --within 10)
        now=$(date +%s.%N)
        say "n$i: $out"
        secs=$(awk -v a="$stopped" -v b="$now" 'BEGIN { printf "%.3f", b - a }')
        [[ $secs =~ ^[0-9]+\.[0-9]+$ ]] || { say "cannot time n$i's wait: $secs"; return 1; }
        awk -v s="$secs" -v d="$DEADLINE_MS" 'BEGIN { exit !(s * 1000 <= d + 1000) }' \
            || { say "n$i saw n$N down ${secs}s after its stop, past the ${DEADLINE_MS} ms deadline"; return 1; }
    done
    if [ "$N" -gt 2 ]; then
        for i in $(seq 1 $((N - 1))); do
            for j in $(seq 1 $((N - 1))); do
                [ "$i" = "$j" ] || ctl "$i" check --peer "n$j" --sizes 1000,1M >/dev/null
            done
        done
        say "the other $((N - 1)) nodes still exchange among themselves"
    fi

    say "3. starting n$N again"
    start_node "$N"
    for i in $(seq 1 "$N"); do wait_up "$i"; done
    ctl "$N" check --sizes 1000,1M
    for i in $(seq 1 $((N - 1))); do ctl "$i" check --peer "n$N" --sizes 1000,1M >/dev/null; done
    say "n$N rejoined"

    say "4. status and peers of every node"
    for i in $(seq 1 "$N"); do ctl "$i" status; ctl "$i" peers; done

    if declare -F partition >/dev/null; then
        say "5. cutting n1 off until it and the others give each other up"
        partition 1 cut
        ctl 1 wait --peer n2 --state down --within 10 >/dev/null
        for i in $(seq 2 "$N"); do ctl "$i" wait --peer n1 --state down --within 10 >/dev/null; done
        partition 1 heal
        for i in $(seq 1 "$N"); do ctl "$i" wait --state up --within 15 >/dev/null; done
        ctl 1 check --sizes 1000,1M
        say "the partition healed without a restart"
    fi
    say "cluster check passed"
}
