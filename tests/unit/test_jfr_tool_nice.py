"""The jfr tool's confinement from a memdiag that already runs niced past the tool's niceness (issue
42 rerun through the real CLI: `nice memdiag --pid JVM` and serve under deploy/memdiag.service's
Nice=10, whose worker thread adds 10: the tool's child, nobody by then, could not lower its niceness to
TOOL_NICE, so the Popen failed, "internal error: SubprocessError: Exception occurred in preexec_fn",
exit 1 and no report). Needs root (the tool runs as nobody)."""

import os
import subprocess
import sys

from memdiag.probes.jvm.tool import TOOL_NICE

CHILD = """
import os, sys
from memdiag.probes.jvm.tool import run_confined
os.nice(int(sys.argv[1]))
code, out, err = run_confined(["/bin/cat", "/proc/self/stat"], timeout_s=10)
print(code, out.decode().rsplit(")", 1)[1].split()[16])
"""


def _niceness_of_tool(nice: int) -> str:
    r = subprocess.run([sys.executable, "-c", CHILD, str(nice)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


def test_a_memdiag_niced_past_the_tool_runs_it_at_its_own_niceness(root_required):
    code, nice = _niceness_of_tool(TOOL_NICE + 5)
    assert (code, int(nice)) == ("0", min(19, TOOL_NICE + 5 + os.getpriority(os.PRIO_PROCESS, 0)))


def test_a_memdiag_at_the_default_niceness_nices_the_tool(root_required):
    code, nice = _niceness_of_tool(0)
    assert (code, int(nice)) == ("0", max(TOOL_NICE, os.getpriority(os.PRIO_PROCESS, 0)))
