"""The priority memdiag's scan runs at while the target is stopped for it: real time.

memdiag runs niced (diagnose/commands/run.py, systemd's Nice=10) so its own work yields the CPU to
the services it watches. While the target is stopped, though, its threads wait on the scan: a niced
scan on a busy host is a priority inversion, the target paused for as long as every other process's
work takes. Seen: a 10 MiB scan priced 16 ms, on a host with four CPU-bound processes per core,
matched at 50 MiB/s instead of 1.5 GiB/s, or did not read its first byte (the table read alone)
before the pause allowed ran out: the scan concluded nothing and the verdict flipped between leak and
growth from run to run. Nice alone cannot fix that: with autogroups (a session each) or a cgroup's CPU
weight, a thread's niceness only ranks it within its own group.

So the thread that stops the target and reads its memory runs as SCHED_FIFO at the lowest real-time
priority for the duration of the stop, then returns to what it was: the pause the target pays is the
scan's own work, as priced, whatever else the host runs. The pricing, while the target runs, stays at
memdiag's own priority (its work is set by the target: its outstanding blocks, the leak itself; at
real time it would preempt every task of the host), and is timed by the pricing thread's CPU time,
which the waits for a CPU on a busy host do not inflate (pause.py). It stays bounded: the scan gives up at
the pause allowed (--max-pause at most, checked between 512 KiB chunks), its holder process (which
inherits the policy when spawned, so its seize and release are prompt too) resumes the target at its
own deadline, and the kernel's real-time throttling (sched_rt_runtime_us) leaves other tasks their
share. Where real time is refused (no CAP_SYS_NICE, a cgroup with no real-time runtime), the thread
runs at the target's niceness or better, and the result says which."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

REALTIME_PRIORITY = 1  # the lowest SCHED_FIFO priority: above every normal task, below any real-time one


def _target_nice(pid: int | None) -> int:
    """The target's main thread's niceness (0 when it cannot be read)."""
    if pid is None:
        return 0
    try:
        return os.getpriority(os.PRIO_PROCESS, pid)
    except OSError:
        return 0


@contextlib.contextmanager
def scan_priority(pid: int | None = None) -> Iterator[str]:
    """Run the calling thread (and what it spawns) at real-time priority for the duration, restoring
    its policy and niceness after; yields what it runs at, in words. pid: the target, whose niceness
    the thread takes at least where real time is refused."""
    policy, param = os.sched_getscheduler(0), os.sched_getparam(0)
    nice = os.getpriority(os.PRIO_PROCESS, 0)  # per thread on Linux, as sched_setscheduler(0) is
    if policy in (os.SCHED_FIFO, os.SCHED_RR):
        yield f"real-time priority ({'SCHED_FIFO' if policy == os.SCHED_FIFO else 'SCHED_RR'} {param.sched_priority})"
        return
    said = ""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(REALTIME_PRIORITY))
        said = f"real-time priority (SCHED_FIFO {REALTIME_PRIORITY})"
    except OSError as e:
        want = min(nice, _target_nice(pid))
        try:
            if want < nice:
                os.setpriority(os.PRIO_PROCESS, 0, want)
            said = f"niceness {want} (real time refused: {e.strerror})"
        except OSError as e2:
            said = f"memdiag's own niceness {nice} (real time refused: {e.strerror}; niceness {want}: {e2.strerror})"
    try:
        yield said
    finally:
        with contextlib.suppress(OSError):
            os.sched_setscheduler(0, policy, param)
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, 0, nice)
