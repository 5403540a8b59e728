"""One reading of every counter that concerns a target, taken at one moment."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from memdiag.system import clock, identity
from memdiag.system._parse import Model
from memdiag.system.cgroup import BadCgroup, CgroupMemory, read_cgroup_memory
from memdiag.system.fds import read_fd_types
from memdiag.system.meminfo import MemInfo, read_meminfo
from memdiag.system.process import ProcessGone, ProcessMemory, read_process
from memdiag.system.psi import Psi, read_memory_pressure
from memdiag.system.vmstat import VmStat, read_vmstat
from pydantic import ConfigDict

from .target import Target


class Snapshot(Model):
    model_config = ConfigDict(frozen=True)

    t: float  # CLOCK_MONOTONIC seconds
    wall: float  # seconds since the epoch
    meminfo: MemInfo
    vmstat: VmStat
    psi: Psi | None = None
    process: ProcessMemory | None = None
    cgroup: CgroupMemory | None = None
    # the target's runtime's own counters, as its face's sample() read them (a JVM's hsperfdata)
    runtime: Any = None
    fds: dict[str, int] | None = None  # a process target's descriptors by type (system/fds.py)


class TargetExited(Exception):
    """The target process is gone: exited (change.kind exited or reused) or exec'd another program
    (change.kind execd: the process lives on as something memdiag was not asked about)."""

    def __init__(self, pid: int, change: identity.Change | None = None):
        super().__init__(change.describe() if change is not None else f"process {pid} exited")
        self.pid = pid
        self.change = change


def read_target_cgroup(target: Target) -> CgroupMemory | None:
    """The target's memory cgroup counters now, whether or not its process still runs (read once
    more as the window ends: a pid killed at its cgroup's limit is counted by the cgroup's oom_kill
    after its last sample); None without a cgroup or once it is gone."""
    if target.cgroup is None:
        return None
    try:
        return read_cgroup_memory(target.cgroup)
    except BadCgroup:
        return None


def take_snapshot(
    target: Target, proc_root: Path = Path("/proc"), runtime: Callable[[int, Path], Any] | None = None
) -> Snapshot:
    """Raise TargetExited when the target process is gone (or its pid was reused). runtime: the
    sample() of the target's runtime face (probes/runtime.py), whose own counters are read too."""
    process = None
    if target.kind == "pid" and target.pid is not None:
        try:
            process = read_process(target.pid, proc_root)
        except ProcessGone:
            raise TargetExited(target.pid) from None
        reused = target.start_ticks is not None and process.start_ticks != target.start_ticks
        if reused or process.state == "Z" or process.rss is None:
            raise TargetExited(target.pid, target.changed())
        change = target.changed()  # after the read: it was of the target only if the target is still the same
        if change is not None:
            raise TargetExited(target.pid, change)
    cgroup = read_target_cgroup(target)
    return Snapshot(
        t=time.monotonic(),
        wall=clock.wall(),
        meminfo=read_meminfo(proc_root),
        vmstat=read_vmstat(proc_root),
        psi=read_memory_pressure(proc_root),
        process=process,
        cgroup=cgroup,
        runtime=runtime(target.pid, proc_root) if runtime is not None and target.pid is not None else None,
        fds=read_fd_types(target.pid, proc_root) if process is not None and target.pid is not None else None,
    )
