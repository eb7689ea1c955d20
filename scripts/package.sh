#!/usr/bin/env bash
# `cargo package` for every published crate of the workspace (all but
# lock-check), as a release would: each crate's archive is built and, unless
# --no-verify is passed, compiled on its own from the archive, against the
# others' archives. Extra arguments go to `cargo package`.
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo package --workspace --exclude lock-check "$@"
