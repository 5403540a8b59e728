#!/usr/bin/env bash
# The whole test suite, on the real kernel, with all set-up done first (what .ci/run calls).
# Extra arguments go to pytest (e.g. scripts/test.sh -k cgroup).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
"$here/scripts/setup.sh" --test
cd "$here"
"$here/.venv/bin/ruff" check --quiet .
# Nothing may skip on a machine that has what the tests need (root, BPF, cgroups).
export MEMDIAG_NO_SKIP="${MEMDIAG_NO_SKIP:-1}"
set +e
"$here/.venv/bin/python" -m pytest "$@"
rc=$?
set -e
if [ $rc -eq 5 ]; then
    echo "test: pytest collected no tests; that is a failure, not a pass" >&2
    rc=1
fi
# The second-kernel lane (scripts/vm.sh: Debian's stock kernel, cgroup v2 only, under qemu) after the
# main suite: MEMDIAG_LANE=on or off (the default, until the lane has run green and its time is measured
# against CI's 90 minutes: the main suite alone took 49 min here). Only a whole-suite run takes it.
lane="${MEMDIAG_LANE:-off}"
case "$lane" in on | off) ;; *) echo "test: MEMDIAG_LANE must be on or off, not '$lane'" >&2; exit 2 ;; esac
if [ "$lane" = on ] && [ $# -eq 0 ]; then
    set +e
    "$here/scripts/vm.sh"
    lrc=$?
    set -e
    if [ $lrc -eq 77 ] && [ "$MEMDIAG_NO_SKIP" != 1 ]; then
        echo "test: the second-kernel lane was skipped: qemu cannot run here (see the line above)" >&2
    elif [ $lrc -ne 0 ]; then
        echo "test: the second-kernel lane failed ($lrc)" >&2
        [ $rc -ne 0 ] || rc=1
    fi
elif [ "$lane" = off ]; then
    echo "test: the second-kernel lane did not run: it is off by default (MEMDIAG_LANE=on runs it; scripts/vm.sh alone)"
fi
exit $rc
