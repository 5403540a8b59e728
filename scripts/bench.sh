#!/usr/bin/env bash
# Benchmarks on this machine (root): memdiag against bcc's memleak, per-event costs, accuracy.
# Rewrites BENCHMARKS.md. BENCH_RUNS=N sets the runs per figure (default 3); --only slowdown|own|costs|scenarios|reach|loop|long|jvm|nonheap|recorder|accuracy|anon
# rewrites that section alone (1, 2, 3, 4, 5, 6, 7: long, a 6 h window, BENCH_LONG to change it, 8: jvm, 9, 10, or 11: the
# labelled corpus, `--only accuracy [--runs N] [--incident NAME]... [--outcomes FILE]`, docs/accuracy.md; 12: anon, reading glibc malloc's arenas); `loop` alone
# is --only loop (the alert loop, section 6).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
[ "${1:-}" = loop ] && set -- --only loop
# --test: the alert loop (section 6) runs Debian's Prometheus, process-exporter and Alertmanager
"$here/scripts/setup.sh" --test
exec "$here/.venv/bin/python" "$here/scripts/bench.py" "$@"
