"""One diagnosis of `memdiag serve`, in a process of its own (`python -m memdiag.diagnose.serve.child`):
the worker (worker.py) starts it per incident and kills it at its deadline, so a target that makes a
diagnosis hang (a read that never returns, a parse that never ends) costs one incident, not the node's
every later one; and whatever memory the diagnosis takes is given back when the process ends.

Its request comes on stdin, pickled by the worker (the same memdiag, the parent that started it: the
playbook as loaded at serve's start, which is no JSON); its answer goes to stdout: the line `report`
and the Report as JSON (report.json's content), or the line `error` and the failure as "Type:
message". Anything else the diagnosis prints goes to stderr (serve's log)."""

from __future__ import annotations

import ctypes
import importlib
import os
import pickle
import signal
import sys
from dataclasses import dataclass, field

PR_SET_PDEATHSIG = 1  # prctl(2): a signal for this process when the thread that started it ends
DEFAULT_RUNNER = "memdiag.diagnose.workflow:diagnose"
REPORT, ERROR = "report", "error"  # the first line of the answer


@dataclass
class Request:
    target: object  # a Target
    window: float
    budget: float
    rules: object = None  # a Playbook, a list of Rules, or None (the shipped playbook)
    given: dict | None = None
    runner: str = DEFAULT_RUNNER  # module:function called as diagnose() is (tests name a seam)
    parent: int = field(default_factory=os.getpid)


def _die_with_parent(parent: int) -> None:
    """Killed when serve's worker thread ends (serve stopped or killed): a diagnosis never outlives
    the server that asked for it, whose next start re-queues the incident."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # it ended before the line above
        os._exit(1)


def main() -> int:
    try:
        request: Request = pickle.load(sys.stdin.buffer)
    except (EOFError, pickle.UnpicklingError):
        # serve stopped while it handed the request over (the playbook pickled in it is ~120 KiB, more
        # than a pipe holds, so the write waits on this read): there is no one to answer, and its next
        # start re-queues the incident; nothing to say in its log
        return 1
    _die_with_parent(request.parent)
    answer = os.fdopen(os.dup(1), "w")  # the answer's own; what a library prints goes to the log
    os.dup2(2, 1)
    module, _, name = request.runner.partition(":")
    run = getattr(importlib.import_module(module), name)
    try:
        report = run(
            request.target, request.window, budget_percent=request.budget, rules=request.rules, given=request.given
        )
        out = f"{REPORT}\n{report.model_dump_json()}"
    except Exception as e:  # noqa: BLE001 (the worker records it as the incident's failure)
        out = f"{ERROR}\n{type(e).__name__}: {e}"
    answer.write(out)
    answer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
