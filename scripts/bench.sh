#!/usr/bin/env bash
# Benchmarks on this machine (root): memdiag against bcc's memleak, per-event costs, accuracy.
# Rewrites BENCHMARKS.md. BENCH_RUNS=N sets the runs per figure (default 3); --only slowdown|costs|reach
# rewrites that section alone (1, 3 or 5).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
"$here/scripts/setup.sh"
exec "$here/.venv/bin/python" "$here/scripts/bench.py" "$@"
