#!/usr/bin/env bash
# The comparison of backends in distlock-cli/README.md: `distlock compare` on the project's
# own servers (scripts/services.sh), every backend side by side, 5 s per
# workload, one task and eight tasks; the table on stdout and the report
# (report.json, report.csv, latency.svg, handoffs.svg, fairness.svg) in OUT.
#
#   scripts/compare-report.sh [OUT]
#
# OUT defaults to docs/compare. Takes about two minutes after the build.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-docs/compare}

scripts/services.sh up
while IFS='=' read -r key value; do export "$key=$value"; done < <(scripts/services.sh env)
cargo build -q --release -p distlock-cli
DB=$(mktemp -d)
trap 'rm -rf "$DB"' EXIT

target/release/distlock compare \
    --url "redis=$DISTLOCK_TEST_REDIS_URL" \
    --url "redlock=$DISTLOCK_TEST_REDLOCK_URL" \
    --url "pg-row=$DISTLOCK_TEST_POSTGRES_URL" \
    --url "pg-advisory=$DISTLOCK_TEST_POSTGRES_URL?mode=advisory" \
    --url "mysql-row=$DISTLOCK_TEST_MYSQL_URL" \
    --url "mysql-advisory=$DISTLOCK_TEST_MYSQL_URL?mode=advisory" \
    --url "etcd=$DISTLOCK_TEST_ETCD_URL" \
    --url "zookeeper=$DISTLOCK_TEST_ZK_URL" \
    --url "sqlite=sqlite://$DB/locks.db" \
    --tasks 1,8 --duration 5s --out "$OUT"
