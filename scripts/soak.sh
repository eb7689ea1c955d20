#!/usr/bin/env bash
# The conformance suites, the fault tests and the network fault matrix of
# every backend, RUNS times in a row (default 20), stopping at the first
# failure. With --build-beside, a from-scratch build of the workspace runs
# beside them the whole time, as on a developer's busy machine.
#
#   scripts/services.sh up
#   scripts/soak.sh [RUNS] [--build-beside]
#
# The test binaries are built once and copied, so nothing rebuilds them
# between runs; each run's output goes to target/soak/run-N.log.
set -euo pipefail
cd "$(dirname "$0")/.."

runs=20
load=0
for arg in "$@"; do
    case "$arg" in
        --build-beside) load=1 ;;
        [0-9]*) runs="$arg" ;;
        *) echo "usage: scripts/soak.sh [RUNS] [--build-beside]" >&2; exit 2 ;;
    esac
done

while IFS='=' read -r key value; do
    export "$key=$value"
done < <(scripts/services.sh env)

out="$PWD/target/soak"
rm -rf "$out"
mkdir -p "$out/bin"

# name<TAB>package directory<TAB>executable, for every test target whose
# name says it is a conformance, fault, network or process test.
cargo test --workspace --all-features --no-run --message-format=json 2>/dev/null |
    python3 -c '
import json, os, re, sys
wanted = re.compile(r"(conformance|faults|network|processes)")
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") != "compiler-artifact" or not m.get("executable"):
        continue
    t = m["target"]
    if "test" in t["kind"] and wanted.search(t["name"]):
        print(t["name"], os.path.dirname(m["manifest_path"]), m["executable"], sep="\t")
' | sort > "$out/tests.tsv"

mapfile -t tests < "$out/tests.tsv"
echo "soak: ${#tests[@]} test binaries, $runs runs$([ "$load" = 1 ] && echo ', a build beside')"
for t in "${tests[@]}"; do
    IFS=$'\t' read -r name _ exe <<< "$t"
    cp "$exe" "$out/bin/$name"
done

if [ "$load" = 1 ]; then
    (
        while :; do
            rm -rf "$out/load-target"
            cargo build --workspace --all-features --quiet --target-dir "$out/load-target" \
                > /dev/null 2>&1 || true
        done
    ) &
    loader=$!
    trap 'kill -- -$loader 2>/dev/null || kill $loader 2>/dev/null || true; pkill -f "$out/load-target" || true' EXIT
fi

for run in $(seq 1 "$runs"); do
    start=$(date +%s)
    log="$out/run-$run.log"
    for t in "${tests[@]}"; do
        IFS=$'\t' read -r name dir _ <<< "$t"
        echo "=== $name" >> "$log"
        if ! (cd "$dir" && "$out/bin/$name") >> "$log" 2>&1; then
            echo "soak: run $run FAILED in $name after $(( $(date +%s) - start )) s; see $log"
            grep -E "^test .* FAILED|panicked" "$log" | head -20
            exit 1
        fi
    done
    passed=$(grep -c '^test .* ok$' "$log" || true)
    echo "soak: run $run ok: $passed tests in $(( $(date +%s) - start )) s"
done
echo "soak: $runs consecutive runs green"
