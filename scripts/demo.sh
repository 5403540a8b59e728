#!/usr/bin/env bash
# The main job on a bundled demo: build a workload that leaks and one that fills a bounded cache,
# run `memdiag --pid` on each, print where the reports are. All set-up is done first.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
"$here/scripts/setup.sh"
duration="${DEMO_DURATION:-30}"
out="${DEMO_OUTPUT:-$here/demo-reports}"
build="$here/.build/demo"
mkdir -p "$build"
for w in leak cache; do
    cc -O1 -g -fno-omit-frame-pointer -Wall -o "$build/$w" "$here/tests/workloads/$w.c"
done

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

run_demo() {  # name, args...
    local name=$1; shift
    "$build/$name" "$@" >/dev/null &
    local pid=$!
    pids+=("$pid")
    echo "demo: $name (PID $pid): memdiag --pid $pid --duration $duration"
    "$here/.venv/bin/memdiag" --pid "$pid" --duration "$duration" --output "$out/$name"
    kill "$pid" 2>/dev/null || true
}

run_demo leak 2048           # leaks 2 MiB/s from leak_order_history()
run_demo cache 64 6          # fills a 64 MiB cache in 6 s, then churns at the bound
echo "demo: reports in $out/leak/report.md and $out/cache/report.md"
