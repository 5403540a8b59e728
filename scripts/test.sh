#!/usr/bin/env bash
# The whole test suite, on the real kernel, with all set-up done first (what .ci/run calls).
# Extra arguments go to pytest (e.g. scripts/test.sh -k cgroup), and then the lane is left out.
#
# A whole-suite run (no arguments) has these parts (docs/development.md: where the time goes, and the
# budget, 45 min on CI's 2-core machine):
#   1. the second-kernel lane (scripts/vm.sh: Debian's stock kernel, cgroup v2 only, under qemu) starts
#      in the background, niced: one emulated machine, about one core for 11-17 min;
#   2. meanwhile, two pytest runs side by side: the tests marked `hostwide` (they change or read what
#      the whole host shares: OOM kills, swap, host pressure; one at a time), and every other test
#      not marked `alone`;
#   3. once all of that is done, the tests marked `alone` (they measure the target's time or
#      overhead, or watch the whole host, and so have the machine to themselves).
# MEMDIAG_LANE=off leaves the lane out (and says so). The lane always runs in a whole-suite run: its
# failure, or its skip where nothing may skip, fails the run.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
started=$(date +%s)
"$here/scripts/setup.sh" --test
cd "$here"
"$here/.venv/bin/ruff" check --quiet .
set_up=$(($(date +%s) - started))
# Nothing may skip on a machine that has what the tests need (root, BPF, cgroups).
export MEMDIAG_NO_SKIP="${MEMDIAG_NO_SKIP:-1}"
# Each run's figures, per file and per test (tests/suitetime.py), kept for docs/development.md
stamp=$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$here/.test-times"
times_dir="$here/.test-times"

lane="${MEMDIAG_LANE:-on}"
case "$lane" in on | off) ;; *) echo "test: MEMDIAG_LANE must be on or off, not '$lane'" >&2; exit 2 ;; esac

# pytest, its "no tests collected" (5) a failure: $1 names the part, the rest go to pytest
part() {
    local name=$1 prc
    shift
    set +e
    MEMDIAG_TEST_TIMES="$times_dir/$name-$stamp.json" "$here/.venv/bin/python" -m pytest "$@"
    prc=$?
    set -e
    if [ $prc -eq 5 ]; then
        echo "test: pytest collected no tests for the $name part; that is a failure, not a pass" >&2
        prc=1
    fi
    return $prc
}

rc=0
lane_s=0
host_s=0
alone_s=0
if [ "$lane" = off ] || [ $# -ne 0 ]; then
    main_started=$(date +%s)
    part main "$@" || rc=$?
    main_s=$(($(date +%s) - main_started))
    [ $# -ne 0 ] || echo "test: the second-kernel lane did not run: MEMDIAG_LANE=off (scripts/vm.sh runs it alone)"
else
    lane_log="$times_dir/lane-$stamp.log"
    lane_started=$(date +%s)
    # niced as memdiag itself is (NICENESS): the workloads the main suite drives keep their core
    (
        set +e
        nice -n 10 "$here/scripts/vm.sh" >"$lane_log" 2>&1
        echo $? >"$lane_log.rc"
        date +%s >"$lane_log.end"
    ) &
    lane_pid=$!
    # the lane's qemu and its copies go if this script is ended (vm.sh removes its own on a signal)
    trap 'pkill -TERM -P "$lane_pid" 2>/dev/null; wait "$lane_pid" 2>/dev/null' EXIT
    echo "test: the second-kernel lane runs beside the main suite (its log: $lane_log)"
    main_started=$(date +%s)
    host_log="$times_dir/hostwide-$stamp.log"
    (
        set +e
        part hostwide -m "hostwide and not alone" -p no:cacheprovider >"$host_log" 2>&1
        echo $? >"$host_log.rc"
        date +%s >"$host_log.end"
    ) &
    host_pid=$!
    trap 'pkill -TERM -P "$host_pid" 2>/dev/null; pkill -TERM -P "$lane_pid" 2>/dev/null; wait 2>/dev/null' EXIT
    echo "test: the hostwide tests run beside the others, one at a time (their log: $host_log)"
    part main -m "not hostwide and not alone" || rc=$?
    echo "test: the main suite's other tests are done; waiting for the hostwide ones"
    wait "$host_pid" || true
    main_s=$(($(date +%s) - main_started))
    cat "$host_log"
    hrc=$(cat "$host_log.rc" 2>/dev/null || echo 1)
    host_s=$(($(cat "$host_log.end" 2>/dev/null || date +%s) - main_started))
    rm -f "$host_log.rc" "$host_log.end"
    [ "$hrc" -eq 0 ] || [ $rc -ne 0 ] || rc=$hrc
    echo "test: waiting for the second-kernel lane"
    wait "$lane_pid" || true
    trap - EXIT
    cat "$lane_log"
    lrc=$(cat "$lane_log.rc" 2>/dev/null || echo 1)
    lane_s=$(($(cat "$lane_log.end" 2>/dev/null || date +%s) - lane_started))
    rm -f "$lane_log.rc" "$lane_log.end"
    if [ "$lrc" -eq 77 ] && [ "$MEMDIAG_NO_SKIP" != 1 ]; then
        echo "test: the second-kernel lane was skipped: qemu cannot run here (see the line above)" >&2
    elif [ "$lrc" -ne 0 ]; then
        echo "test: the second-kernel lane failed ($lrc)" >&2
        [ $rc -ne 0 ] || rc=1
    fi
    alone_started=$(date +%s)
    part alone -m alone || { r=$?; [ $rc -ne 0 ] || rc=$r; }
    alone_s=$(($(date +%s) - alone_started))
fi
total=$(($(date +%s) - started))
echo "test: wall time $((total / 60)) min $((total % 60)) s: set-up ${set_up} s, main suite ${main_s} s" \
    "(its hostwide tests ${host_s} s beside the others; the lane beside them: ${lane_s} s), tests run alone" \
    "${alone_s} s; the budget: 45 min (docs/development.md);" \
    "per file: $times_dir/*-$stamp.json"
exit $rc
