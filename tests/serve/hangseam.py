"""The seam of tests/serve/test_worker_deadline.py: a runner for serve's diagnosis process that blocks
in a real open() of a FIFO nobody writes (as a target's planted `release` file or perf map blocked
memdiag's reader) for the one PID named in MEMDIAG_TEST_HANG_PID, and diagnoses any other target. With
MEMDIAG_TEST_HANG_PATH it first looks that path up, where SIGKILL cannot end the wait (a FUSE folder
whose server never answers and holds the folder's lock with a lookup of its own)."""

from __future__ import annotations

import os

from memdiag.diagnose.workflow import diagnose


def diagnose_or_hang(target, window, **kw):
    if str(target.pid) == os.environ.get("MEMDIAG_TEST_HANG_PID"):
        if os.environ.get("MEMDIAG_TEST_HANG_PATH"):  # a FUSE folder's lookup, its lock held by the server's own
            os.path.exists(os.environ["MEMDIAG_TEST_HANG_PATH"])
        with open(os.environ["MEMDIAG_TEST_HANG_FIFO"]) as f:  # no writer: blocks in the kernel
            f.read()
    return diagnose(target, window, **kw)
