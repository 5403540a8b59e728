"""The nodeheap probe: a Node.js process's memory over the window, V8's heap against memory outside
it (system/v8memory.py: from /proc/PID/smaps, nothing asked of the process), and whether the
process writes a perf map (`node --perf-basic-prof`), without which its JavaScript frames cannot
be named in native stacks.

It never opens the inspector and never signals the process: SIGUSR1 would open Node's inspector
port, so the advice for a heap snapshot is a restart with a flag, never a signal by memdiag."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from memdiag.system._parse import Model
from memdiag.system.clock import wall
from memdiag.system.perfmap import perf_map_path, perf_map_size
from memdiag.system.target import Target
from memdiag.system.units import fmt_duration

from ..face import Cost, Face, ProbeResult, pid_only, plain
from ..reader import reads_cost
from ..registry import REGISTRY
from . import view as nodeview

INTERVAL_S = 2.0  # smaps walks every page table of the process: a read every two seconds


class NodeHeapResult(ProbeResult):
    name: str = "nodeheap"
    version: str | None = None  # Node's
    times: list[float] = []  # seconds from the first read
    v8_mapped: list[int] = []  # V8's heap, committed (≈ process.memoryUsage().heapTotal)
    v8_resident: list[int] = []
    native_resident: list[int] = []  # malloc'd memory (array buffers' contents among it), thread stacks
    jit_resident: list[int] = []
    perf_map: str | None = None  # the perf map's path as the target sees it, when it writes one
    perf_map_bytes: int = 0
    read_seconds: float = 0.0  # memdiag's time reading smaps, over the run


class PerfMapState(Model):
    path: str  # as the target names it (/tmp/perf-PID.map in its own namespace)
    size: int


def requirements() -> list:
    return []


def perf_map_state(pid: int, proc_root: Path = Path("/proc")) -> PerfMapState | None:
    size = perf_map_size(pid, proc_root)  # opened as the symbolizer opens it: a link or FIFO is no map
    if size is None:
        return None
    return PerfMapState(path=f"/tmp/{perf_map_path(pid, proc_root).name}", size=size)


def run(target: Target, seconds: float, interval: float = INTERVAL_S, clock: Callable[[], float] = time.monotonic):
    started = wall()
    base = NodeHeapResult(status="unavailable", target=target.describe(), started=started)
    if target.kind != "pid" or target.pid is None:
        return base.model_copy(update={"reason": "reads one Node.js process: give --pid"})
    runtime = REGISTRY.recognise(target.pid)
    if runtime is None or runtime.name != "node":
        return base.model_copy(update={"reason": f"PID {target.pid} does not run Node.js"})
    # here, not at the top: the registry imports this face for every target, native ones included
    from memdiag.system.v8memory import read_v8_memory

    times, v8m, v8r, native, jit = [], [], [], [], []
    spent, end, t0 = 0.0, clock() + seconds, clock()
    while True:
        before = time.perf_counter()
        m = read_v8_memory(target.pid)
        spent += time.perf_counter() - before
        if m is None:
            break
        times.append(round(clock() - t0, 3))
        v8m.append(m.v8_mapped)
        v8r.append(m.v8_resident)
        native.append(m.native_resident)
        jit.append(m.jit_resident)
        left = end - clock()
        if left <= 0 or not target.alive():
            break
        time.sleep(min(interval, left))
    pm = perf_map_state(target.pid)
    status = "ok" if times and target.alive() else ("partial" if times else "error")
    how = (
        f"a perf map ({pm.path})"
        if pm
        else "no perf map it could read (started without --perf-basic-prof, or what is at its name is "
        "not the process's own regular file: a link, a FIFO or another user's is refused)"
    )
    return base.model_copy(
        update={
            "status": status,
            "reason": f"{len(times)} reads of smaps in {fmt_duration(spent)}; {how}"
            + ("" if status == "ok" else "; the target exited"),
            "cost": Cost(events=len(times)),
            "method": "/proc/PID/smaps: V8's heap pages (anonymous, below 64 TiB) against malloc'd memory",
            "version": runtime.version,
            "times": times,
            "v8_mapped": v8m,
            "v8_resident": v8r,
            "native_resident": native,
            "jit_resident": jit,
            "perf_map": pm.path if pm else None,
            "perf_map_bytes": pm.size if pm else 0,
            "read_seconds": round(spent, 6),
            "duration_s": wall() - started,
        }
    )


FACE = Face(
    name="nodeheap",
    summary="a Node.js process's V8 heap against the memory outside it (one process)",
    needs=pid_only("reads one Node.js process: give -p PID"),
    run=plain(run),
    result=NodeHeapResult,
    describe=nodeview.describe,
    facts=nodeview.FACTS,
    facts_of=nodeview.facts_of,
    sections=nodeview.sections,
    measured=reads_cost,
)
