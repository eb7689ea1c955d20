#!/usr/bin/env bash
# The conformance suites, the fault tests and the network fault matrix of
# every backend, RUNS times in a row (default 20), stopping at the first
# failed run. With --build-beside, a from-scratch build of the workspace runs
# beside them the whole time, as on a developer's busy machine.
#
#   scripts/services.sh up
#   scripts/soak.sh [RUNS] [--build-beside] [--streams K]
#
# A fault test kills, freezes or cuts off only its own backend's servers,
# so each backend's test binaries form a lane that runs one binary after
# another. With --streams K (default 1: everything one after another) the
# lanes are shared out among K streams that run side by side, the largest
# lanes (by test count) first, each to the stream with the least so far. A
# binary that uses several backends' servers (the migration suite) runs
# once the streams are done, and so does one that uses several servers of
# one crate (the SQL network matrix: Postgres and MySQL); these strike no
# server themselves, so they run side by side.
#
# The test binaries are built once and copied, so nothing rebuilds them
# between runs; run N's output goes to target/soak/run-N/STREAM.log, with
# each binary's time after it.
set -euo pipefail
cd "$(dirname "$0")/.."

runs=20
load=0
streams=1
usage() {
    echo "usage: scripts/soak.sh [RUNS] [--build-beside] [--streams K]" >&2
    exit 2
}
while [ $# -gt 0 ]; do
    case "$1" in
        --build-beside) load=1 ;;
        --streams) shift; [[ "${1:-}" =~ ^[1-9][0-9]*$ ]] || usage; streams=$1 ;;
        [0-9]*) runs="$1" ;;
        *) usage ;;
    esac
    shift
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
            lane = name.split("_")[0]
            if lane not in ("sqlite", "postgres", "mysql"):
                lane = "shared"
        elif package.startswith("lock-"):
            lane = package[len("lock-"):]
        else:
            lane = "shared"
        print(lane, name, os.path.dirname(m["manifest_path"]), m["executable"], sep="\t")
' | sort > "$out/tests.tsv"

mapfile -t tests < "$out/tests.tsv"
for t in "${tests[@]}"; do
    IFS=$'\t' read -r _ name _ exe <<< "$t"
    cp "$exe" "$out/bin/$name"
done

# stream<TAB>lane, every lane but "shared" in one of the streams.
while IFS=$'\t' read -r lane name _ _; do
    printf '%s\t%s\n' "$lane" "$("$out/bin/$name" --list 2>/dev/null | grep -c ': test$' || true)"
done < "$out/tests.tsv" |
    python3 -c '
import sys
streams = int(sys.argv[1])
size = {}
for line in sys.stdin:
    lane, count = line.split("\t")
    if lane != "shared":
        size[lane] = size.get(lane, 0) + int(count)
load = [0] * streams
for lane in sorted(size, key=lambda l: (-size[l], l)):
    s = load.index(min(load))
    load[s] += size[lane]
    print(s + 1, lane, sep="\t")
' "$streams" > "$out/streams.tsv"

echo "soak: ${#tests[@]} test binaries in $streams stream(s), $runs runs$([ "$load" = 1 ] && echo ', a build beside')"

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

# Run the binary NAME (built from the package in DIR), appending to LOG,
# with its seconds after it.
run_binary() {
    local log=$1 name=$2 dir=$3 began
    echo "=== $name" >> "$log"
    began=$(date +%s)
    if ! (cd "$dir" && "$out/bin/$name") >> "$log" 2>&1; then
        echo "=== $name FAILED after $(( $(date +%s) - began )) s" >> "$log"
        return 1
    fi
    echo "=== $name ok in $(( $(date +%s) - began )) s" >> "$log"
}

# Run the binaries of the given lanes one after another, appending to LOG.
# Fails at the first failing binary.
run_lanes() {
    local log=$1 lane t tlane name dir
    shift
    for lane in "$@"; do
        for t in "${tests[@]}"; do
            IFS=$'\t' read -r tlane name dir _ <<< "$t"
            [ "$tlane" = "$lane" ] || continue
            run_binary "$log" "$name" "$dir" || return 1
        done
    done
}

for run in $(seq 1 "$runs"); do
    start=$(date +%s)
    dir="$out/run-$run"
    mkdir -p "$dir"
    pids=()
    for s in $(seq 1 "$streams"); do
        # shellcheck disable=SC2046
        run_lanes "$dir/stream-$s.log" $(awk -F'\t' -v s="$s" '$1 == s { print $2 }' "$out/streams.tsv") &
        pids+=("$!")
    done
    failed=0
    for pid in "${pids[@]}"; do
        wait "$pid" || failed=1
    done
    if [ "$failed" = 0 ]; then
        # The shared binaries strike no server themselves (no fault verbs:
        # only their own proxies), so they run side by side.
        pids=()
        for t in "${tests[@]}"; do
            IFS=$'\t' read -r tlane name tdir _ <<< "$t"
            [ "$tlane" = shared ] || continue
            run_binary "$dir/shared-$name.log" "$name" "$tdir" &
            pids+=("$!")
        done
        for pid in "${pids[@]}"; do
            wait "$pid" || failed=1
        done
    fi
    if [ "$failed" = 1 ]; then
        echo "soak: run $run FAILED after $(( $(date +%s) - start )) s; see $dir"
        grep -E "^=== .* FAILED|^test .* FAILED|panicked" "$dir"/*.log | head -20
        exit 1
    fi
    passed=$(cat "$dir"/*.log | grep -c '^test .* ok$' || true)
    echo "soak: run $run ok: $passed tests in $(( $(date +%s) - start )) s"
done
echo "soak: $runs consecutive runs green"
