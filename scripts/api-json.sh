#!/usr/bin/env bash
# Build the rustdoc JSON of every published crate, with every feature, in
# TARGET/api/doc/CRATE.json (TARGET: $CARGO_TARGET_DIR or ./target), for
# the public-API snapshot test (facade-tests/tests/public_api.rs), which runs this
# script. rustdoc's JSON output is unstable: RUSTC_BOOTSTRAP=1 lets the
# stable toolchain write it. Prints the crates, one per line.
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}/api"
for krate in lock-core lock-layers lock-sql lock-redis lock-redlock lock-etcd lock-zk lock-nats distlock; do
    RUSTC_BOOTSTRAP=1 cargo rustdoc --quiet --lib --all-features -p "$krate" \
        --target-dir "$target" -- -Z unstable-options --output-format json >&2
    echo "$krate"
done
