"""The seam of tests/serve/test_worker_deadline.py: a runner for serve's diagnosis process that blocks
in a real open() of a FIFO nobody writes (as a target's planted `release` file or perf map blocked
memdiag's reader) for the one PID named in MEMDIAG_TEST_HANG_PID, and diagnoses any other target."""

from __future__ import annotations

import os

from memdiag.diagnose.workflow import diagnose


def diagnose_or_hang(target, window, **kw):
    if str(target.pid) == os.environ.get("MEMDIAG_TEST_HANG_PID"):
        with open(os.environ["MEMDIAG_TEST_HANG_FIFO"]) as f:  # no writer: blocks in the kernel
            f.read()
    return diagnose(target, window, **kw)
