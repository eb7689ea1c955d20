#!/usr/bin/env bash
# Every backend's benchmark, one after another, and one summary of their
# ratios. Each benchmark runs distlock beside the hand-written floor of the
# same guarantees and the peer libraries, interleaved in one process (see
# lock-testkit/src/bench/cycles.rs), so its ratios are measured side by
# side. Run it on an otherwise quiet machine all the same: the TCP segment
# counts are the whole host's, and load widens the p99s. Compare figures
# only within one benchmark's run.
#
#   scripts/bench.sh [BACKEND ...]     (redis redlock etcd postgres mysql sqlite zk;
#                                       default: all)
#
# Each benchmark's output goes to target/bench/BACKEND.txt, all of them to
# target/bench/report.txt; the summary (every "A ÷ B" line: p50, p99, client
# CPU and TCP segments per cycle; every contention run's hand-offs in round
# trips) is printed at the end and saved as target/bench/summary.txt. Exits
# non-zero if a benchmark failed (after running the others).
set -euo pipefail
cd "$(dirname "$0")/.."

all=(redis redlock etcd postgres mysql sqlite zk)
if [ $# -eq 0 ]; then backends=("${all[@]}"); else backends=("$@"); fi
for b in "${backends[@]}"; do
    case " ${all[*]} " in
        *" $b "*) ;;
        *) echo "scripts/bench.sh: unknown backend '$b' (one of: ${all[*]})" >&2; exit 2 ;;
    esac
done

scripts/services.sh up
while IFS='=' read -r key value; do export "$key=$value"; done < <(scripts/services.sh env)

# The package whose bench target BACKEND is.
package() {
    case $1 in
        postgres | mysql | sqlite) echo lock-sql ;;
        zk) echo lock-zk ;;
        *) echo "lock-$1" ;;
    esac
}

out=target/bench
failed=()
mkdir -p "$out"
: >"$out/report.txt"
: >"$out/summary.txt"
for b in "${backends[@]}"; do
    args=(-p "$(package "$b")" --all-features --bench "$b")
    echo "== $b: cargo bench ${args[*]}" | tee -a "$out/report.txt"
    if ! cargo bench -q "${args[@]}" 2>&1 | tee "$out/$b.txt"; then
        echo "== $b: FAILED" | tee -a "$out/$b.txt"
        failed+=("$b")
    fi
    cat "$out/$b.txt" >>"$out/report.txt"
    {
        echo "[$b]"
        grep -E ' ÷ |tasks, a client each|round trips' "$out/$b.txt" || true
    } >>"$out/summary.txt"
done

echo
echo "== summary (ratios within each backend's run)"
cat "$out/summary.txt"
if [ ${#failed[@]} -gt 0 ]; then
    echo "scripts/bench.sh: failed: ${failed[*]}" >&2
    exit 1
fi
