#!/usr/bin/env bash
# What a failover costs a Redis lock, measured: lock-check runs under the
# `failover` nemesis (kill the Sentinel group's master, the Sentinels
# promote a replica, the old master rejoins as a replica) through Sentinel,
# and under `cluster-failover` (kill the master of the lock's slot, the
# cluster promotes its replica, the old master rejoins as a replica) on the
# Redis Cluster, each without and with `replicas=1`, and Redlock under
# `kill-minority` for comparison, then one Markdown table of the runs (lock-check's `table`).
#
#   scripts/failover-matrix.sh [DURATION] [OUT_DIR]
#
# DURATION defaults to 60s; OUT_DIR to target/failover-matrix (a directory
# per run with its logs and report.json, and failover.md). The table's
# `in time (running)` column counts grants made while an earlier holder
# was running and still believed it held the lock; `fencing failures`
# writes the fenced register accepted after a newer holder's; `token order`
# grants whose token did not rise; `nemesis actions` the failovers
# (`failed_over`). Exits non-zero if a run fails.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${1:-60s}
OUT=${2:-target/failover-matrix}

scripts/services.sh up
while IFS='=' read -r key value; do export "$key=$value"; done < <(scripts/services.sh env)
cargo build -q -p lock-check
BIN=target/debug/lock-check
mkdir -p "$OUT"

# label | URL | nemesis | servers
CASES=(
    "sentinel|$DISTLOCK_TEST_REDIS_SENTINEL_URL|failover|"
    "sentinel-replicas1|$DISTLOCK_TEST_REDIS_SENTINEL_URL?replicas=1|failover|"
    "cluster|$DISTLOCK_TEST_REDIS_CLUSTER_URL|cluster-failover|"
    "cluster-replicas1|$DISTLOCK_TEST_REDIS_CLUSTER_URL?replicas=1|cluster-failover|"
    "redlock|$DISTLOCK_TEST_REDLOCK_URL|kill-minority|redlock1 redlock2 redlock3 redlock4 redlock5"
)
status=0
dirs=()
for case in "${CASES[@]}"; do
    IFS='|' read -r label url nemesis servers <<<"$case"
    args=()
    for s in $servers; do args+=(--server "$s"); done
    echo "== $label" >&2
    rm -rf "${OUT:?}/$label"
    if ! "$BIN" run --url "$url" --dir "$OUT/$label" --duration "$DURATION" \
        --name "failover/$label" --nemesis "$nemesis" "${args[@]}" >"$OUT/$label.txt" 2>&1; then
        status=1
        echo "   FAILED: see $OUT/$label.txt" >&2
    fi
    [ -f "$OUT/$label/report.json" ] && dirs+=("$OUT/$label")
done
"$BIN" table "${dirs[@]}" >"$OUT/failover.md"
echo "table: $OUT/failover.md" >&2
exit $status
