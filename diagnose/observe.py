"""Sample a target's counters over a window: the raw material of the counters triage."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from memdiag.system.cgroup import CgroupMemory
from memdiag.system.kmsg import OomKill, read_oom_kills
from memdiag.system.process import ProcessMemory
from memdiag.system.processes import read_all_processes
from memdiag.system.slab import SlabCache, read_slabinfo
from memdiag.system.swaps import SwapDevice, read_swaps
from pydantic import BaseModel, ConfigDict

from .snapshot import Snapshot, TargetExited, read_target_cgroup, take_snapshot
from .target import Target


class Observation(BaseModel):
    model_config = ConfigDict(frozen=True)

    target: Target
    requested_s: float
    started: float
    ended: float
    snapshots: list[Snapshot]
    exited_at: float | None = None
    interrupted: bool = False
    oom_kills: list[OomKill] | None = None  # everything still in the kernel log at the end
    slab_first: list[SlabCache] | None = None
    slab_last: list[SlabCache] | None = None
    swaps: list[SwapDevice] | None = None
    processes_first: dict[int, ProcessMemory] = {}
    processes_last: dict[int, ProcessMemory] = {}
    memdiag_pid: int | None = None  # the diagnosing process: it and its children are never in a list of suspects
    # the cgroup read once more when the window ended (the target exited, the time was up, a signal):
    # a kill that ended a pid target is counted by memory.events after the last sample had been taken
    cgroup_closing: CgroupMemory | None = None

    @property
    def last_cgroup(self) -> CgroupMemory | None:
        """The cgroup's counters at the window's end: the closing read, else the last sample's."""
        if self.cgroup_closing is not None:
            return self.cgroup_closing
        return self.snapshots[-1].cgroup if self.snapshots else None


def default_interval(duration: float) -> float:
    """About one sample a second; at least ten samples in a short window."""
    return max(0.1, min(1.0, duration / 10))


def observe(
    target: Target,
    duration: float,
    interval: float | None = None,
    on_sample: Callable[[Snapshot, float], None] | None = None,
    proc_root: Path = Path("/proc"),
    sink: list[Snapshot] | None = None,
    stop: threading.Event | None = None,
    first_sink: dict[int, ProcessMemory] | None = None,
) -> Observation:
    """Sample until the window ends, the target exits, the user interrupts (Ctrl-C) or stop is
    set. sink, when given, receives each snapshot as it is taken, and first_sink the process table
    read at the first (for a caller in another thread: the engine's rounds before the window ends)."""
    interval = interval or default_interval(duration)
    started_mono, started = time.monotonic(), time.time()
    snapshots: list[Snapshot] = []
    exited_at = None
    interrupted = False
    slab_first = read_slabinfo(proc_root)
    processes_first: dict[int, ProcessMemory] = {}
    try:
        while True:
            try:
                snap = take_snapshot(target, proc_root)
            except TargetExited:
                exited_at = time.time()
                break
            snapshots.append(snap)
            if sink is not None:
                sink.append(snap)
            if len(snapshots) == 1:
                # Every process, whatever the target: pressure is paid and caused host-wide.
                processes_first = read_all_processes(proc_root)
                if first_sink is not None:
                    first_sink.update(processes_first)
            elapsed = time.monotonic() - started_mono
            if on_sample is not None:
                on_sample(snap, elapsed)
            if elapsed >= duration or (stop is not None and stop.is_set()):
                break
            # Sleep to the next tick of the schedule, so sampling does not drift.
            next_tick = started_mono + interval * (int(elapsed / interval) + 1)
            pause = max(0.0, min(next_tick, started_mono + duration) - time.monotonic())
            if stop is not None:
                stop.wait(pause)
            else:
                time.sleep(pause)
    except KeyboardInterrupt:
        interrupted = True
    return Observation(
        target=target,
        requested_s=duration,
        started=started,
        ended=time.time(),
        snapshots=snapshots,
        exited_at=exited_at,
        interrupted=interrupted,
        oom_kills=read_oom_kills(),
        slab_first=slab_first,
        slab_last=read_slabinfo(proc_root),
        swaps=read_swaps(proc_root),
        processes_first=processes_first,
        processes_last=read_all_processes(proc_root) if snapshots else {},
        memdiag_pid=os.getpid(),
        cgroup_closing=read_target_cgroup(target) if snapshots else None,
    )
