#!/usr/bin/env bash
# The conformance suites, the fault tests and the network fault matrix of
# every backend, RUNS times in a row (default 20), stopping at the first
# failed run. With --build-beside, a from-scratch build of the workspace runs
# beside them the whole time, as on a developer's busy machine.
#
#   scripts/services.sh up
#   scripts/soak.sh [RUNS] [--build-beside] [--serial]
#
# A fault test kills, freezes or cuts off only its own backend's servers,
# so each backend's test binaries run in a lane of their own, one after
# another, and the lanes run side by side (more load, not less). A binary
# that uses several backends' servers (the migration suite) runs alone
# once the lanes are done. --serial runs every binary one after another.
#
# The test binaries are built once and copied, so nothing rebuilds them
# between runs; each run's output goes to target/soak/run-N/LANE.log.
set -euo pipefail
cd "$(dirname "$0")/.."

runs=20
load=0
serial=0
for arg in "$@"; do
    case "$arg" in
        --build-beside) load=1 ;;
        --serial) serial=1 ;;
        [0-9]*) runs="$arg" ;;
        *) echo "usage: scripts/soak.sh [RUNS] [--build-beside] [--serial]" >&2; exit 2 ;;
    esac
done

while IFS='=' read -r key value; do
    export "$key=$value"
done < <(scripts/services.sh env)

out="$PWD/target/soak"
rm -rf "$out"
mkdir -p "$out/bin"

# lane<TAB>name<TAB>package directory<TAB>executable, for every test target
# whose name says it is a conformance, fault, network or process test. The
# lane is the backend whose servers the binary uses; "shared" marks one that
# uses several.
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
        package = os.path.basename(os.path.dirname(m["manifest_path"]))
        name = t["name"]
        if package == "lock-sql":
            lane = "sqlite" if name.startswith("sqlite") else "postgres-mysql"
        elif package.startswith("lock-"):
            lane = package[len("lock-"):]
        else:
            lane = "shared"
        print(lane, name, os.path.dirname(m["manifest_path"]), m["executable"], sep="\t")
' | sort > "$out/tests.tsv"

mapfile -t tests < "$out/tests.tsv"
echo "soak: ${#tests[@]} test binaries, $runs runs$([ "$load" = 1 ] && echo ', a build beside')"
for t in "${tests[@]}"; do
    IFS=$'\t' read -r _ name _ exe <<< "$t"
    cp "$exe" "$out/bin/$name"
done
lanes=$(cut -f1 "$out/tests.tsv" | grep -vx shared | sort -u)
[ "$serial" = 1 ] && lanes=serial

# Run the binaries of one lane ("serial": all) one after another, appending
# to LOG; each binary's seconds are logged after it. Fails at the first
# failing binary.
run_lane() {
    local lane=$1 log=$2 t name dir began
    for t in "${tests[@]}"; do
        IFS=$'\t' read -r tlane name dir _ <<< "$t"
        [ "$lane" = serial ] || [ "$tlane" = "$lane" ] || continue
        echo "=== $name" >> "$log"
        began=$(date +%s)
        if ! (cd "$dir" && "$out/bin/$name") >> "$log" 2>&1; then
            echo "=== $name FAILED after $(( $(date +%s) - began )) s" >> "$log"
            return 1
        fi
        echo "=== $name ok in $(( $(date +%s) - began )) s" >> "$log"
    done
}

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
    dir="$out/run-$run"
    mkdir -p "$dir"
    pids=()
    for lane in $lanes; do
        run_lane "$lane" "$dir/$lane.log" &
        pids+=("$!")
    done
    failed=0
    for pid in "${pids[@]}"; do
        wait "$pid" || failed=1
    done
    if [ "$failed" = 0 ] && [ "$serial" = 0 ]; then
        run_lane shared "$dir/shared.log" || failed=1
    fi
    if [ "$failed" = 1 ]; then
        echo "soak: run $run FAILED after $(( $(date +%s) - start )) s; see $dir"
        grep -E "^=== .* FAILED|^test .* FAILED|panicked" "$dir"/*.log | head -20
        exit 1
    fi
    passed=$(cat "$dir"/*.log | grep -c '^test .* ok$' || true)
    slowest=$(grep -h '^=== .* ok in' "$dir"/*.log | sort -t' ' -k5 -n | tail -1 | sed 's/^=== //')
    echo "soak: run $run ok: $passed tests in $(( $(date +%s) - start )) s (slowest binary: $slowest)"
done
echo "soak: $runs consecutive runs green"
