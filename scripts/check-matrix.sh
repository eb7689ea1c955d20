#!/usr/bin/env bash
# The full history-check matrix: every backend with a server (and SQLite) ×
# the nemeses that make sense for it, each run for DURATION, then the same
# as leader elections (`--election`: candidates and observers) on every
# backend that offers them, and as semaphores (`--permits 2`) on every
# backend that offers them, then as lock sets (`--set 2`) on every
# backend, then as reader-writer locks (`--rw 0.5`) on every backend that
# offers them, then one Markdown table of all runs.
#
#   scripts/check-matrix.sh [DURATION] [OUT_DIR] [FILTER]
#
# DURATION defaults to 60s; OUT_DIR to target/check-matrix (one directory
# per run with its logs and report.json, and matrix.md); FILTER is a
# substring of the run labels to keep (e.g. `postgres`, `kill-server`,
# `election`, `permits`, `set-` or `rw-`).
# Exits non-zero if any run fails. The servers are started as in the test
# suite (scripts/services.sh up) and every run leaves them all up.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${1:-60s}
OUT=${2:-target/check-matrix}
FILTER=${3:-}

scripts/services.sh up
while IFS='=' read -r key value; do export "$key=$value"; done < <(scripts/services.sh env)
cargo build -q -p lock-check
BIN=target/debug/lock-check
mkdir -p "$OUT"

HOLDER="none kill-holder pause-holder"
SINGLE="$HOLDER kill-server pause-server"
CLUSTER="$HOLDER kill-minority"
REDLOCK_SERVERS="redlock1 redlock2 redlock3 redlock4 redlock5"
# label | URL | nemeses | servers
CASES=(
    "redis|$DISTLOCK_TEST_REDIS_URL|$SINGLE|redis"
    "redis-sentinel|$DISTLOCK_TEST_REDIS_SENTINEL_URL|$HOLDER failover|"
    "redis-sentinel-replicas1|$DISTLOCK_TEST_REDIS_SENTINEL_URL?replicas=1|failover|"
    "redis-cluster|$DISTLOCK_TEST_REDIS_CLUSTER_URL|$HOLDER cluster-failover|"
    "redis-cluster-replicas1|$DISTLOCK_TEST_REDIS_CLUSTER_URL?replicas=1|cluster-failover|"
    "redlock|$DISTLOCK_TEST_REDLOCK_URL|$CLUSTER|$REDLOCK_SERVERS"
    "postgres-row|$DISTLOCK_TEST_POSTGRES_URL?mode=row|$SINGLE|postgres"
    "postgres-advisory|$DISTLOCK_TEST_POSTGRES_URL?mode=advisory|$SINGLE|postgres"
    "mysql-row|$DISTLOCK_TEST_MYSQL_URL?mode=row|$SINGLE|mysql"
    "mysql-advisory|$DISTLOCK_TEST_MYSQL_URL?mode=advisory|$SINGLE|mysql"
    "sqlite|sqlite://$PWD/$OUT/sqlite-locks.db|$HOLDER|"
    "etcd|$DISTLOCK_TEST_ETCD_URL|$SINGLE|etcd"
    "etcd-cluster|$DISTLOCK_TEST_ETCD_CLUSTER_URL|$CLUSTER|etcd1 etcd2 etcd3"
    "zookeeper|$DISTLOCK_TEST_ZK_URL|$SINGLE|zk"
    "zookeeper-ensemble|$DISTLOCK_TEST_ZK_ENSEMBLE_URL|$CLUSTER|zk1 zk2 zk3"
    "nats|$DISTLOCK_TEST_NATS_URL|$SINGLE|nats"
    "nats-cluster|$DISTLOCK_TEST_NATS_CLUSTER_URL|$CLUSTER|nats1 nats2 nats3"
)

# The cases whose backend offers leader election (a holder record).
ELECTIONS="redis redis-sentinel redis-cluster redlock postgres-row postgres-advisory mysql-row mysql-advisory sqlite etcd etcd-cluster zookeeper zookeeper-ensemble nats nats-cluster"
# The backends that offer reader-writer locks.
RW_LOCKS="redis redis-sentinel redis-cluster redlock postgres-row postgres-advisory mysql-row mysql-advisory sqlite etcd etcd-cluster zookeeper zookeeper-ensemble nats nats-cluster"
# The cases whose backend offers semaphores (`capabilities().semaphore`).
SEMAPHORES="redis redis-sentinel redis-cluster postgres-row postgres-advisory mysql-row mysql-advisory sqlite etcd etcd-cluster zookeeper zookeeper-ensemble nats nats-cluster"

status=0
dirs=()
# run_case PREFIX CASE [lock-check run options…]
run_case() {
    local prefix=$1 case=$2
    shift 2
    local label url nemeses servers
    IFS='|' read -r label url nemeses servers <<<"$case"
    for nemesis in $nemeses; do
        run="$prefix$label-$nemesis"
        [[ -z $FILTER || $run == *"$FILTER"* ]] || continue
        args=("$@")
        for s in $servers; do args+=(--server "$s"); done
        echo "== $run" >&2
        rm -rf "${OUT:?}/$run"
        if ! "$BIN" run --url "$url" --dir "$OUT/$run" --duration "$DURATION" \
            --name "matrix/$run" --nemesis "$nemesis" "${args[@]}" >"$OUT/$run.txt" 2>&1; then
            status=1
            echo "   FAILED: see $OUT/$run.txt" >&2
        fi
        [ -f "$OUT/$run/report.json" ] && dirs+=("$OUT/$run")
    done
}
for case in "${CASES[@]}"; do
    run_case "" "$case"
done
for case in "${CASES[@]}"; do
    [[ " $ELECTIONS " == *" ${case%%|*} "* ]] && run_case election- "$case" --election
done
for case in "${CASES[@]}"; do
    [[ " $SEMAPHORES " == *" ${case%%|*} "* ]] && run_case permits- "$case" --permits 2
done
for case in "${CASES[@]}"; do
    run_case set- "$case" --set 2
done
for case in "${CASES[@]}"; do
    [[ " $RW_LOCKS " == *" ${case%%|*} "* ]] && run_case rw- "$case" --rw 0.5
done
"$BIN" table "${dirs[@]}" >"$OUT/matrix.md"
echo "table: $OUT/matrix.md" >&2
exit $status
