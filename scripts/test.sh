#!/usr/bin/env bash
# The whole test suite, from a fresh machine: install and start every real
# server (scripts/services.sh up), export their URLs, then run every test of
# every crate with every backend feature. Extra arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/services.sh up
while IFS='=' read -r key value; do
    export "$key=$value"
done < <(scripts/services.sh env)

cargo test --workspace --all-features --no-fail-fast "$@"
