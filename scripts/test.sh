#!/usr/bin/env bash
# The whole test suite, from a fresh machine: install and start every real
# server (scripts/services.sh up), export their URLs, then run every test of
# every crate with every backend feature, then the facade's URL tests with no
# backend feature. Extra arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/services.sh up
while IFS='=' read -r key value; do
    export "$key=$value"
done < <(scripts/services.sh env)

status=0
cargo test --workspace --all-features --no-fail-fast "$@" || status=$?
# The facade with no backend compiled in: URLs of a missing backend give
# InvalidUrl naming the feature, and never show a password.
cargo test -p distlock --no-default-features --no-fail-fast \
    --test connect --test credentials "$@" || status=$?
exit "$status"
