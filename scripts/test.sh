#!/usr/bin/env bash
# The whole test suite, from a fresh machine: install and start every real
# server (scripts/services.sh up, beside the build), export their URLs, then run every test of
# every crate with every backend feature, then the facade's URL tests with no
# backend feature. Extra arguments go to `cargo nextest run`.
#
# Tests run with cargo-nextest (.config/nextest.toml), each in a process of
# its own and test binaries of independent backends side by side, in three
# phases so that no test meets a server that another test has killed or
# paused:
#
#   1. shared servers: every test that only uses the servers or none
#      (conformance, network faults through a proxy, scale, the facade, the
#      CLI, the migration rollout, unit tests);
#   2. one server group at a time: the fault binaries, which stop, kill and
#      pause servers, each on its own servers, side by side;
#   3. the history matrix (server nemeses on every backend), alone.
#
# The public-API snapshot test (facade-tests/tests/public_api.rs) needs every crate's
# rustdoc JSON, built in a target directory of its own
# (scripts/api-json.sh): that build runs beside the test build, and the
# test, after the phases, finds it done.
#
# Then the doctests (nextest does not run them), and the facade with no
# backend compiled in.
set -euo pipefail
cd "$(dirname "$0")/.."

command -v cargo-nextest >/dev/null || cargo install --locked cargo-nextest
# The build needs protoc (etcd's client) and nothing else the servers
# bring: it is installed first, and the servers install and start beside
# the build, whose work is the CPU's, not the network's.
scripts/services.sh build-deps
services_log=$(mktemp)
scripts/services.sh up > "$services_log" 2>&1 &
services=$!

faults='binary(/_faults$/)'
matrix='binary(ci_matrix)'
api='binary(public_api)'

status=0
phase() {
    local name=$1 threads=$2 filter=$3
    shift 3
    local started=$SECONDS
    echo "=== phase: $name" >&2
    cargo nextest run --workspace --all-features --no-fail-fast \
        --test-threads "$threads" -E "$filter" "$@" || status=1
    echo "=== phase $name: $((SECONDS - started)) s" >&2
    # Each test's time, kept per phase (nextest writes one file per run).
    local junit="${CARGO_TARGET_DIR:-target}/nextest/default/junit.xml"
    [ ! -f "$junit" ] || cp "$junit" "${junit%.xml}-${name// /-}.xml"
}

started=$SECONDS
api_log=$(mktemp)
scripts/api-json.sh > /dev/null 2> "$api_log" &
api_json=$!
cargo nextest run --workspace --all-features --no-run
echo "=== build: $((SECONDS - started)) s" >&2
services_up=0
wait "$services" || services_up=$?
cat "$services_log" >&2
rm -f "$services_log"
[ "$services_up" -eq 0 ] || { echo "scripts/services.sh up failed" >&2; exit 1; }
while IFS='=' read -r key value; do
    export "$key=$value"
done < <(scripts/services.sh env)
wait "$api_json" || { cat "$api_log" >&2; status=1; }
rm -f "$api_log"
phase "shared servers" 6 "not ($faults | $matrix | $api)" "$@"
phase "fault binaries" 6 "$faults" "$@"
# Alone, as under `cargo test`: its holder-kill checks are timed, and load
# beside it lengthens the nemesis's kill-to-log window.
phase "history matrix" 3 "$matrix" "$@"
phase "public API" 1 "$api" "$@"

started=$SECONDS
cargo test --workspace --all-features --doc || status=1
echo "=== doctests: $((SECONDS - started)) s" >&2
started=$SECONDS
# The facade with no backend compiled in: URLs of a missing backend give
# InvalidUrl naming the feature, and never show a password.
cargo test -p distlock --no-default-features --no-fail-fast \
    --test connect --test credentials || status=1
# The facade with MySQL alone, built as a user who picks that one feature
# builds it: no other backend's and no dev-dependency's features reach the
# crates it shares (it once needed `hex`'s `alloc`, which the workspace's
# builds and any test build turn on through other crates).
cargo build -p distlock --no-default-features --features mysql || status=1
echo "=== feature subsets: $((SECONDS - started)) s" >&2
exit "$status"
