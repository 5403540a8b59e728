"""Sample a target's counters over a window: the raw material of the counters triage. One way to
make an Observation: what the window says so far (the engine's rounds) and at its end are built
by the same Sampler from the same readings."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from memdiag.probes.registry import REGISTRY
from memdiag.probes.runtime import RuntimeFace, Samples
from memdiag.system import clock, identity
from memdiag.system._parse import Model
from memdiag.system.cgroup import CgroupMemory
from memdiag.system.fds import read_memfds
from memdiag.system.kmsg import OomKill, read_oom_kills
from memdiag.system.ledger import AnonPart
from memdiag.system.process import ProcessGone, ProcessMemory, read_process
from memdiag.system.processes import read_all_processes
from memdiag.system.slab import SlabCache, read_slabinfo
from memdiag.system.smaps import read_smaps_split
from memdiag.system.sockdiag import SocketMemory, read_socket_memory
from memdiag.system.swaps import SwapDevice, read_swaps
from memdiag.system.sysvshm import ShmSegment, read_ipc_namespace, read_sysv_shm
from memdiag.system.target import Target
from memdiag.system.tmpfs import ShmMount, read_shm_mounts
from pydantic import ConfigDict

from .snapshot import Snapshot, TargetExited, read_target_cgroup, take_snapshot

T = TypeVar("T")


class ClosingRead(Model):
    """A process target's memory read once as the window closed, together with what is read only
    then (its mappings, its runtime's and allocator's figures): the totals those details add up to,
    at the moment they were read, which is not the last sample's."""

    model_config = ConfigDict(frozen=True)

    t: float  # monotonic seconds, before the details were read
    process: ProcessMemory  # its status then: the totals the details are of
    anon_after: int | None = None  # RssAnon once more after them: how much it moved while they were read
    anon_parts: list[AnonPart] = []  # its anonymous memory by who holds it (runtime, allocator)
    anon_unread: list[str] = []  # the sources of that split that did not say, and why


class Observation(Model):
    model_config = ConfigDict(frozen=True)

    target: Target
    runtime: str | None = None  # the name of the target's runtime face, whose samples the snapshots carry
    requested_s: float
    started: float
    ended: float
    snapshots: list[Snapshot]
    exited_at: float | None = None
    # the target exec'd another program then (exe: which): the process lives on, the program
    # diagnosed does not; the window ends there as at an exit (system/identity.py)
    execd_at: float | None = None
    exec_exe: str | None = None
    pid_reused: bool = False  # it exited and another process already holds its pid
    interrupted: bool = False
    oom_kills: list[OomKill] | None = None  # everything still in the kernel log at the end
    slab_first: list[SlabCache] | None = None
    slab_last: list[SlabCache] | None = None
    swaps: list[SwapDevice] | None = None
    shm_first: list[ShmMount] | None = None  # the tmpfs mounts the target sees, walked at the start
    shm_last: list[ShmMount] | None = None  # ... and at the end
    sockets_first: SocketMemory | None = None  # a process target's sockets at the start (system/sockdiag.py)
    sockets_last: SocketMemory | None = None
    sysv_first: list[ShmSegment] | None = None  # System V shared memory segments at the start
    sysv_last: list[ShmSegment] | None = None  # ... and at the end
    # the target's processes whose IPC namespace is not memdiag's (their segments are not in sysv_*),
    # of those read at the end; None: not read
    sysv_unread: int | None = None
    memfds_last: list[tuple[str, int]] | None = None  # a process target's memfds at the end (name, bytes)
    smaps_last: dict[str, list[tuple[str, int]]] | None = None  # its RSS by mapping at the end (system/smaps.py)
    closing: ClosingRead | None = None  # a process target's memory as the window closed, read with the detail
    processes_first: dict[int, ProcessMemory] = {}
    processes_last: dict[int, ProcessMemory] = {}
    memdiag_pid: int | None = None  # the diagnosing process: it and its children are never in a list of suspects
    # the cgroup read once more when the window ended (the target exited, the time was up, a signal):
    # a kill that ended a pid target is counted by memory.events after the last sample had been taken
    cgroup_closing: CgroupMemory | None = None
    # samples dropped to keep a long window's memory bounded (Sampler.MAX_SAMPLES), all of them
    # older than thinned_before (seconds into the window): the older, the coarser
    thinned: int = 0
    thinned_before_s: float | None = None

    def runtime_face(self) -> RuntimeFace | None:
        """The face of the target's runtime, or None (native code, a cgroup, the system)."""
        return REGISTRY.runtime(self.runtime)

    def runtime_samples(self) -> Samples:
        """(monotonic seconds, what the runtime's sample() read) of every sample that read something."""
        return [(s.t, s.runtime) for s in self.snapshots if s.runtime is not None]

    @property
    def last_cgroup(self) -> CgroupMemory | None:
        """The cgroup's counters at the window's end: the closing read, else the last sample's."""
        if self.cgroup_closing is not None:
            return self.cgroup_closing
        return self.snapshots[-1].cgroup if self.snapshots else None


def default_interval(duration: float) -> float:
    """About one sample a second; at least ten samples in a short window."""
    return max(0.1, min(1.0, duration / 10))


class Sampler:
    """The counters of one window, sampled until it ends, the target exits, the user interrupts
    (Ctrl-C) or stop() is called; run() in the caller's thread, or start() in one of its own.

    A window of hours would keep a sample a second (~11 KiB each, its cgroup's counters the
    most): past MAX_SAMPLES the older half is thinned to every other sample, so the recent part
    keeps the sampling interval and the older the coarser, the first sample always kept; how many
    were dropped, and before when, is in the Observation and the report."""

    MAX_SAMPLES = 720

    def __init__(
        self,
        target: Target,
        duration: float,
        interval: float | None = None,
        on_sample: Callable[[Snapshot, float], None] | None = None,
        proc_root: Path = Path("/proc"),
        runtime: RuntimeFace | None = None,
    ):
        """runtime: the target's runtime face (probes/runtime.py), whose own counters are sampled
        with the rest (the engine recognised it once, before the window)."""
        self.target, self.duration, self.proc_root = target, duration, proc_root
        self.runtime = runtime
        self.interval = interval or default_interval(duration)
        self.on_sample = on_sample
        self.snapshots: list[Snapshot] = []
        self.thinned, self.thinned_before_s = 0, None
        self.processes_first: dict[int, ProcessMemory] = {}  # every process, at the first sample
        self.slab_first: list[SlabCache] | None = None
        self.shm_first: list[ShmMount] | None = None
        self.sockets_first: SocketMemory | None = None
        self.sysv_first: list[ShmSegment] | None = None
        self.started = clock.wall()
        self.exited_at: float | None = None
        self.change: identity.Change | None = None
        self.interrupted = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Sampler:
        self._thread = threading.Thread(target=self.run, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def join(self, seconds: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(seconds)

    def wait(self, seconds: float | None, interrupted: Callable[[], bool]) -> None:
        """Wait for the sampling thread (at most seconds); interrupted() says a signal came: the
        counters end there."""
        end = None if seconds is None else time.monotonic() + seconds  # the sampler's own clock, real
        while self.alive() and (end is None or time.monotonic() < end):
            if interrupted():
                self.stop()
                return
            self.join(0.05 if end is None else max(0.0, min(0.05, end - time.monotonic())))

    def run(self) -> Observation:
        started_mono, self.started = time.monotonic(), clock.wall()
        self.slab_first = read_slabinfo(self.proc_root)
        self.shm_first = self._shm()
        self.sockets_first = self._sockets()
        self.sysv_first = read_sysv_shm(self.proc_root)  # one small file: its segments at the start
        try:
            while True:
                try:
                    snap = take_snapshot(self.target, self.proc_root, self.runtime.sample if self.runtime else None)
                except TargetExited as gone:
                    self.change = gone.change
                    if gone.change is None or gone.change.exited:
                        self.exited_at = gone.change.at if gone.change is not None else clock.wall()
                    break
                self._keep(snap)
                elapsed = time.monotonic() - started_mono
                if self.on_sample is not None:
                    self.on_sample(snap, elapsed)
                if elapsed >= self.duration or self._stop.is_set():
                    break
                # Sleep to the next tick of the schedule, so sampling does not drift.
                next_tick = started_mono + self.interval * (int(elapsed / self.interval) + 1)
                self._stop.wait(max(0.0, min(next_tick, started_mono + self.duration) - time.monotonic()))
        except KeyboardInterrupt:
            self.interrupted = True
        return self.so_far()

    def _keep(self, snap: Snapshot) -> None:
        if not self.snapshots:
            # Every process, whatever the target: pressure is paid and caused host-wide.
            self.processes_first = read_all_processes(self.proc_root)
        self.snapshots.append(snap)
        if len(self.snapshots) > self.MAX_SAMPLES:
            self._thin()

    def _thin(self) -> None:
        """Every other sample of the older half dropped (the first kept): bounded, and said."""
        half = len(self.snapshots) // 2
        older = self.snapshots[:half]
        kept = older[::2]
        self.thinned += len(older) - len(kept)
        self.thinned_before_s = older[-1].t - self.snapshots[0].t
        self.snapshots = kept + self.snapshots[half:]

    def _ipc_unread(self, root: Path) -> int | None:
        """How many of the target's processes at the last sample are in an IPC namespace not memdiag's."""
        mine = read_ipc_namespace("self", root)
        t = self.target
        if mine is None or t.kind == "system":
            return None
        last = self.snapshots[-1]
        pids = [t.pid] if t.kind == "pid" else list(last.cgroup.procs) if last.cgroup is not None else []
        spaces = [read_ipc_namespace(pid, root) for pid in pids if pid is not None]
        return sum(1 for ns in spaces if ns is not None and ns != mine)

    def _of_target(self, read: Callable[[int], T]) -> T | None:
        """read(pid) of a process target, kept only if the process is still the one diagnosed before
        and after it (not exited, exec'd or replaced by another with its pid); None otherwise."""
        t = self.target
        if t.kind != "pid" or t.pid is None or self.change is not None or t.changed() is not None:
            return None
        out = read(t.pid)
        return out if t.changed() is None else None

    def _closing(self, pid: int) -> tuple[ClosingRead, dict[str, list[tuple[str, int]]] | None] | None:
        """The process's status, then its mappings' split and its anonymous memory by holder (its
        runtime's own figures, read once more now; its native allocator's), then RssAnon again."""
        root = self.proc_root
        t = time.monotonic()
        try:
            process = read_process(pid, root)
        except ProcessGone:
            return None
        smaps = read_smaps_split(pid, root)
        parts: list[AnonPart] = []
        unread: list[str] = []
        face = self.runtime
        if face is not None and face.resident is None:
            unread.append(f"{face.display}: its own figures are not read for this split")
        elif face is not None and face.resident is not None:
            sample = face.sample(pid, root) if face.sample is not None else None
            said = face.resident([(time.monotonic(), sample)] if sample is not None else [], pid)
            parts += said
            if not said:
                unread.append(f"{face.display}: its own figures could not be read")
        got, missed = REGISTRY.allocator_parts(pid)
        parts += got
        unread += missed
        try:
            after = read_process(pid, root).rss_anon
        except ProcessGone:
            return None
        return ClosingRead(t=t, process=process, anon_after=after, anon_parts=parts, anon_unread=unread), smaps

    def _shm(self) -> list[ShmMount] | None:
        """The tmpfs mounts as the target sees them (a process's own mount table: a container's /dev/shm
        is its own), walked for their files; the host's for a cgroup or the system."""
        if self.target.kind != "pid":
            return read_shm_mounts(None, self.proc_root, walk=True)
        return self._of_target(lambda pid: read_shm_mounts(pid, self.proc_root, walk=True))

    def _sockets(self) -> SocketMemory | None:
        """A process target's sockets as the kernel's diagnostics see them (its own network namespace)."""
        return self._of_target(lambda pid: read_socket_memory(pid, self.proc_root))

    def so_far(self, closing: bool = False) -> Observation:
        """The window until now: its snapshots, the kernel log, slab, swap and the process tables.
        closing: the window's last look, which also reads what only the report shows and no rule
        reads (the process's mappings, its memfds, System V segments): once, not at every round."""
        root = self.proc_root
        closing_read = self._of_target(self._closing) if closing and self.snapshots else None
        return Observation(
            target=self.target,
            runtime=self.runtime.name if self.runtime else None,
            requested_s=self.duration,
            started=self.started,
            ended=clock.wall(),
            snapshots=list(self.snapshots),
            thinned=self.thinned,
            thinned_before_s=self.thinned_before_s,
            exited_at=self.exited_at,
            execd_at=self.change.at if self.change is not None and self.change.kind == "execd" else None,
            exec_exe=self.change.exe if self.change is not None and self.change.kind == "execd" else None,
            pid_reused=self.change is not None and self.change.kind == "reused",
            interrupted=self.interrupted,
            oom_kills=read_oom_kills(),
            slab_first=self.slab_first,
            slab_last=read_slabinfo(root),
            swaps=read_swaps(root),
            shm_first=self.shm_first,
            shm_last=self._shm() if self.snapshots else None,
            sockets_first=self.sockets_first,
            sockets_last=self._sockets() if self.snapshots else None,
            sysv_first=self.sysv_first,
            sysv_last=read_sysv_shm(root) if self.snapshots else None,  # one small file: the rules see it mid-window
            sysv_unread=self._ipc_unread(root) if self.snapshots else None,
            memfds_last=self._of_target(lambda pid: read_memfds(pid, root)) if closing and self.snapshots else None,
            smaps_last=closing_read[1] if closing_read is not None else None,
            closing=closing_read[0] if closing_read is not None else None,
            processes_first=dict(self.processes_first),
            processes_last=read_all_processes(root) if self.snapshots else {},
            memdiag_pid=os.getpid(),
            cgroup_closing=read_target_cgroup(self.target) if self.snapshots else None,
        )
