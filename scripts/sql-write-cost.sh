#!/usr/bin/env bash
# What one row write per grant costs the Postgres server, without any
# client library: the plain advisory lock and unlock a user writes by hand
# against the same lock feeding a token drawn in the same statement (from
# an unlogged sequence; from a row of an unlogged table, alone and with a
# holder record), on the test server of scripts/services.sh, with
# Postgres's own C client (pgbench, prepared statements), the variants
# interleaved round by round. (The SQL benchmarks compare the same floors
# on sqlx, for MariaDB too: `advisory floor` ÷ `advisory, no token`.)
#
#   scripts/sql-write-cost.sh [ROUNDS] [SECONDS]
#
# ROUNDS (default 6) of every variant, SECONDS (default 5) each. Prints
# each variant's ratio to the plain lock per round and the median. Scratch
# objects live in the test database under the prefix
# `distlock_write_cost_` and are dropped at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-6}
SECONDS_PER=${2:-5}

scripts/services.sh up >/dev/null
while IFS='=' read -r key value; do export "$key=$value"; done < <(scripts/services.sh env)
PG=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

# A holder record of the size distlock writes on default options (dlh1,
# the identity's length, an identity, the time): 55 bytes.
RECORD="'\\x646c683100327669726d20287069642031323334352c2062656e63682d6465616462656566636166656261626529000001930000000000'::bytea"
# No colon in the key: pgbench reads `:word` as a variable.
KEY="hashtextextended('distlock-write-cost', 0)"
T=distlock_write_cost
psql -qX "$DISTLOCK_TEST_POSTGRES_URL" <<SQL
CREATE UNLOGGED SEQUENCE IF NOT EXISTS ${T}_useq;
CREATE UNLOGGED TABLE IF NOT EXISTS ${T}_counters (name text PRIMARY KEY, token bigint NOT NULL, used_at timestamptz NOT NULL DEFAULT now(), holder bytea);
INSERT INTO ${T}_counters (name, token) VALUES ('n', 1) ON CONFLICT DO NOTHING;
SQL
unlock="SELECT pg_advisory_unlock($KEY);"
printf '%s\n%s\n' "SELECT pg_advisory_lock($KEY);" "$unlock" > "$dir/plain.sql"
printf '%s\n%s\n' "SELECT CASE WHEN pg_try_advisory_lock($KEY) THEN nextval('${T}_useq') END;" "$unlock" > "$dir/unlogged_sequence.sql"
printf '%s\n%s\n' "WITH l AS (SELECT pg_try_advisory_lock($KEY) AS got) UPDATE ${T}_counters SET token = token + 1 WHERE name = 'n' AND (SELECT got FROM l) RETURNING token;" "$unlock" > "$dir/token_row.sql"
printf '%s\n%s\n' "WITH l AS (SELECT pg_try_advisory_lock($KEY) AS got) UPDATE ${T}_counters SET token = token + 1, used_at = now(), holder = $RECORD WHERE name = 'n' AND (SELECT got FROM l) RETURNING token;" "$unlock" > "$dir/token_and_record_row.sql"

pg_variants="plain unlogged_sequence token_row token_and_record_row"
for r in $(seq "$ROUNDS"); do
    for v in $pg_variants; do
        lat=$("$PG/pgbench" -n -M prepared -c 1 -T "$SECONDS_PER" -f "$dir/$v.sql" "$DISTLOCK_TEST_POSTGRES_URL" 2>/dev/null |
            awk '/latency average/ {print $4}')
        echo "$r $v ${lat:?pgbench failed on $v}" >> "$dir/results"
    done
done
psql -qX "$DISTLOCK_TEST_POSTGRES_URL" -c "DROP TABLE ${T}_counters; DROP SEQUENCE ${T}_useq"

python3 - "$dir/results" <<'PY'
import collections, statistics, sys
variants = collections.defaultdict(list)
for line in open(sys.argv[1]):
    r, variant, value = line.split()
    variants[variant].append(float(value))
plain = variants["plain"]
print("postgres: each variant's cycle ÷ the plain lock's, per round (median)")
for variant, values in variants.items():
    ratios = [v / p for v, p in zip(values, plain)]
    print(f"  {variant:22} {' '.join(f'{x:.2f}' for x in ratios)}  ({statistics.median(ratios):.2f})")
PY
