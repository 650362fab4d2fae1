# Shared by the measurement scripts that start their own Redis (scripts/bench,
# scripts/bench-one, scripts/callgrind-load): sourced, not run. Every process listens on
# 127.0.0.1 only, and everything started is stopped, and the work directory removed, on
# exit.

# bench_lib_start NAME: a work directory ($WORK), the process list ($PIDS) the exit trap
# stops, and the clock tick ($TICK) of /proc/PID/stat.
bench_lib_start() {
    WORK="$(mktemp -d "/tmp/tollgate-$1.XXXXXX")"
    PIDS=()
    TICK=$(getconf CLK_TCK)
    trap bench_lib_cleanup EXIT
}

bench_lib_cleanup() {
    local pid
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$WORK"
}

# A loopback port nobody listens on (bash's /dev/tcp connect fails), below Linux's
# ephemeral range (32768-60999) with its cluster bus port (+10000) too: a port an
# outgoing connection holds is not listened on, yet cannot be bound, and redis-server
# then never comes up.
free_port() {
    local port
    while :; do
        port=$(( 10000 + RANDOM % 12000 ))
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            echo "$port"; return
        fi
    done
}

# wait_until SECONDS COMMAND...: retry until it succeeds, or fail.
wait_until() {
    local deadline=$(( SECONDS + $1 )); shift
    until "$@" >/dev/null 2>&1; do
        [ "$SECONDS" -lt "$deadline" ] || { echo "timed out: $*" >&2; return 1; }
        sleep 0.1
    done
}

# start_redis PORT [redis-server args...]: started, answering PING.
start_redis() {
    local port="$1"; shift
    mkdir -p "$WORK/redis/$port"
    redis-server --bind 127.0.0.1 --port "$port" --dir "$WORK/redis/$port" --save '' \
        --appendonly no --protected-mode yes --logfile "$WORK/redis/$port/redis.log" "$@" &
    PIDS+=($!)
    wait_until 10 redis-cli -p "$port" ping
}

# start_cluster: 6 nodes, 3 masters and 3 replicas, converged; their ports in
# $CLUSTER_PORTS, $CLUSTER_MASTERS and $CLUSTER_REPLICAS.
start_cluster() {
    local port nodes=()
    CLUSTER_PORTS=() CLUSTER_MASTERS=() CLUSTER_REPLICAS=()
    for _ in 1 2 3 4 5 6; do
        port=$(free_port)
        start_redis "$port" --cluster-enabled yes --cluster-config-file nodes.conf \
            --cluster-node-timeout 5000
        CLUSTER_PORTS+=("$port"); nodes+=("127.0.0.1:$port")
    done
    redis-cli --cluster create "${nodes[@]}" --cluster-replicas 1 --cluster-yes \
        >"$WORK/cluster-create.log"
    for port in "${CLUSTER_PORTS[@]}"; do
        wait_until 30 bash -c "redis-cli -p $port cluster info | grep -q cluster_state:ok"
        if redis-cli -p "$port" role | head -1 | grep -q master; then
            CLUSTER_MASTERS+=("$port")
        else
            CLUSTER_REPLICAS+=("$port")
        fi
    done
}

# cpu_ticks PID: utime+stime so far, in clock ticks.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# redis_cpu PORT...: used_cpu_user+used_cpu_sys (seconds), summed over the ports.
redis_cpu() {
    local port total=0
    for port in "$@"; do
        total=$(redis-cli -p "$port" info cpu | tr -d '\r' | awk -F: -v t="$total" \
            '/^used_cpu_(user|sys):/ {t += $2} END {printf "%.6f", t}')
    done
    echo "$total"
}

# script_stats PORT...: "calls usec" of every script call kind (EVAL, EVALSHA, FCALL and
# their _RO forms), summed over the ports.
script_stats() {
    local port
    for port in "$@"; do redis-cli -p "$port" info commandstats; done | tr -d '\r' |
        awk -F'[:,=]' '/^cmdstat_(eval|evalsha|fcall)(_ro)?:/ {c += $3; u += $5} END {print c + 0, u + 0}'
}

# command_stats PORT...: "incrby_calls incrby_usec expire_calls expire_usec", summed over
# the ports. Commands a script runs count too, and a replica counts what it copies: pass
# the masters.
command_stats() {
    local port
    for port in "$@"; do redis-cli -p "$port" info commandstats; done | tr -d '\r' |
        awk -F'[:,=]' '/^cmdstat_incrby:/ {ic += $3; iu += $5}
                       /^cmdstat_expire:/ {ec += $3; eu += $5}
                       END {print ic + 0, iu + 0, ec + 0, eu + 0}'
}
