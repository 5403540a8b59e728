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
    exit 1
fi
exit $rc
