#!/usr/bin/env bash
# The scale benchmark: one client process holds 1 000 and then 10 000
# auto-renewed locks (TTL 3 s) for HOLD on every backend, and one Markdown
# table reports locks held, spurious losses, memory, CPU, the servers' own
# request rates and the release time (see `lock-check scale --help`).
#
#   scripts/scale.sh [HOLD] [OUT]
#
# HOLD defaults to 60s; OUT (default target/scale.md) receives the table,
# OUT.json the figures. etcd and ZooKeeper sessions use the TTL (3 s);
# Postgres and MySQL run in advisory mode, whose uncontended locks share
# the client's two sessions (row mode keeps a connection per held lock).
# Exits non-zero if any lock was lost or a release failed.
set -euo pipefail
cd "$(dirname "$0")/.."
HOLD=${1:-60s}
OUT=${2:-target/scale.md}

scripts/services.sh up
while IFS='=' read -r key value; do export "$key=$value"; done < <(scripts/services.sh env)
cargo build -q --release -p lock-check
DB=$(mktemp -d)
trap 'rm -rf "$DB"' EXIT

with() { case $1 in *\?*) echo "$1&$2" ;; *) echo "$1?$2" ;; esac; }
URLS=(
    "memory://"
    "sqlite://$DB/scale.db"
    "$DISTLOCK_TEST_REDIS_URL"
    "$DISTLOCK_TEST_REDIS_SENTINEL_URL"
    "$DISTLOCK_TEST_REDIS_CLUSTER_URL"
    "$DISTLOCK_TEST_REDLOCK_URL"
    "$(with "$DISTLOCK_TEST_POSTGRES_URL" "mode=advisory")"
    "$(with "$DISTLOCK_TEST_MYSQL_URL" "mode=advisory")"
    "$(with "$DISTLOCK_TEST_ETCD_URL" "session_ttl_s=3")"
    "$(with "$DISTLOCK_TEST_ZK_URL" "session_timeout_ms=3000")"
    "$DISTLOCK_TEST_NATS_URL"
    "$DISTLOCK_TEST_NATS_CLUSTER_URL"
)
# One process per backend, so that each row's memory is its own.
status=0
: >"$OUT"
echo "[" >"$OUT.json"
first=1
for url in "${URLS[@]}"; do
    target/release/lock-check scale --url "$url" --locks 1000 --locks 10000 \
        --ttl 3s --hold "$HOLD" --json "$OUT.part.json" >"$OUT.part" || status=$?
    if [ "$first" = 1 ]; then cat "$OUT.part" >>"$OUT"; else tail -n +3 "$OUT.part" >>"$OUT"; fi
    [ "$first" = 1 ] || echo "," >>"$OUT.json"
    sed '1d;$d' "$OUT.part.json" >>"$OUT.json"
    first=0
done
echo "]" >>"$OUT.json"
rm -f "$OUT.part" "$OUT.part.json"
cat "$OUT"
exit "$status"
