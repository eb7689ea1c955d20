#!/usr/bin/env bash
# Random inputs for every URL parser, outside the test suite:
#   scripts/fuzz.sh [N] [SEED]
# runs N inputs (default 1 000 000) through the shared URL parser, the
# redaction, every backend's Config::from_url and the name check, in
# release mode; it fails if any panicked or showed a password.
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo run --quiet --release --features full --example fuzz_urls -- "${1:-1000000}" "${2:-1}"
