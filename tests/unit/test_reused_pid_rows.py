"""A pid target whose number another process took during the window (issue 42, "never name another
process"): the report's table of the target's processes lists the target, never the newcomer that
now holds its pid (seen through the real CLI: "Processes (the target) | PID 42 (atknew) | – (started
in the window)" after the target leak exited and atknew took pid 42 in a pid namespace)."""

from memdiag.diagnose.evidence import process_rows
from memdiag.diagnose.observe import Observation
from memdiag.diagnose.target import Target
from memdiag.system.process import ProcessMemory

MiB = 1 << 20
T0 = 1_800_000_000.0


def _proc(comm: str, start: int, rss: int) -> ProcessMemory:
    return ProcessMemory(pid=42, comm=comm, cmdline=[comm], rss=rss, majflt=0, start_ticks=start)


def _obs(last: ProcessMemory) -> Observation:
    return Observation(
        target=Target(kind="pid", pid=42, comm="leak", cmdline=["leak"], start_ticks=100), requested_s=10,
        started=T0, ended=T0 + 10, snapshots=[], oom_kills=[], processes_first={42: _proc("leak", 100, 2 * MiB)},
        processes_last={42: last}, memdiag_pid=4000,
    )  # fmt: skip


def test_the_newcomer_holding_the_targets_pid_is_not_a_row_of_the_target():
    assert process_rows(_obs(_proc("atknew", 250, 3 * MiB))) == []


def test_the_target_itself_is_still_its_row():
    rows = process_rows(_obs(_proc("leak", 100, 5 * MiB)))
    assert [(r.pid, r.comm, r.rss_first, r.rss_last) for r in rows] == [(42, "leak", 2 * MiB, 5 * MiB)]
