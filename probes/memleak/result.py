"""memleak's result: outstanding allocations by stack with their series and what the reachability
scan found of them, big allocations, what tracing cost; and the result in words (`memdiag probe`)."""

from __future__ import annotations

from memdiag.system._parse import Model
from memdiag.system.units import fmt_bytes, fmt_duration
from pydantic import Field

from ..cpython.frames import PythonReading, reading_lines
from ..face import ProbeResult, StackReach, TracingCost
from ..frame import Frame
from ..text import stack_lines
from .reach import ReachScan


class LeakStack(Model):
    frames: list[str]
    functions: list[str | None]
    forwards: list[bool] = []  # per frame: its code only forwards an allocation (probes/forwarders.py)
    pid: int
    method: str
    unknown_frames: int = 0
    outstanding_bytes: int
    outstanding_count: int
    allocs: int
    frees: int
    alloc_bytes: int
    freed_bytes: int
    oldest_age_s: float | None = None
    series: list[int] = []  # outstanding bytes at each of MemleakResult.series_times
    reach: StackReach | None = None  # what still points at its blocks (the scan ran)
    # a CPython target's pymalloc arenas, mapped by several Python lines (cpython/frames.py ARENAS):
    # its frames are those of the line that mapped the most, which is not the line that fills them
    arenas: bool = False
    # its native frames as symbolized (leaf first), for their file:line once the stacks shown are
    # known (stacks.sourced); not part of the result
    native: list[Frame] = Field(default=[], exclude=True)


class BigAlloc(Model):
    pid: int
    comm: str
    size: int
    address: int
    when: float
    frames: list[str] = []


class MemleakResult(ProbeResult):
    mode: str = "user"
    allocator: str | None = None
    allocator_module: str | None = None
    placements: list[str] = []
    missing_entry_points: list[str] = []
    attach_errors: list[str] = []
    sample_every: int = 1
    min_size: int = 0
    max_size: int | None = None
    series_times: list[float] = []  # seconds since the probe attached
    stacks: list[LeakStack] = []
    folded: list[str] = []
    big_allocations: list[BigAlloc] = []
    outstanding_allocations: int = 0
    reach_scan: ReachScan | None = None  # None: no scan was asked for
    tracing_cost: TracingCost | None = None  # what tracing cost the target, measured (costs given)
    python: PythonReading | None = None  # the Python frames walked at each allocation (CPython targets)

    def leak_stack(self) -> LeakStack | None:
        """The stack with the most leaked bytes (nothing points at them), if the scan found any."""
        scanned = [s for s in self.stacks if s.reach is not None and s.reach.leaked_bytes > 0]
        return max(scanned, key=lambda s: s.reach.leaked_bytes) if scanned else None  # type: ignore[union-attr]


def describe(r: MemleakResult, top: int) -> list[str]:
    """The result's lines under its header in `memdiag probe memleak` (and reach): where the probes
    went, the stacks with outstanding blocks and what the scan found of them, big allocations."""
    lines = [f"  allocator: {r.allocator}" + (f" ({r.allocator_module})" if r.allocator_module else "")]
    lines += [f"    probe on {p}" for p in r.placements]
    lines += reading_lines(r.python)
    if r.missing_entry_points:
        lines.append("    not in this process: " + ", ".join(r.missing_entry_points))
    lines += [f"    could not attach: {e}" for e in r.attach_errors]
    for s in r.stacks[:top]:
        age = f", oldest {fmt_duration(s.oldest_age_s)}" if s.oldest_age_s is not None else ""
        trend = " -> ".join(fmt_bytes(v) for v in s.series[-6:])
        lines.append(
            f"  {fmt_bytes(s.outstanding_bytes)} outstanding in {s.outstanding_count:,} allocations "
            f"({s.allocs:,} allocs, {s.frees:,} frees{age}) PID {s.pid}:"
        )
        lines += stack_lines(s.frames)
        if trend:
            lines.append(f"      outstanding: {trend}")
        if s.reach is not None:
            lines.append(f"      {_reach_line(s.reach)}")
    if r.reach_scan is not None:
        lines.append(f"  reachability scan: {r.reach_scan.describe()}")
    for b in r.big_allocations[:top]:
        lines.append(f"  big allocation {fmt_bytes(b.size)} by PID {b.pid} ({b.comm}):")
        lines += stack_lines(b.frames)
    return lines


def _reach_line(r: StackReach) -> str:
    anchor = f"; most from {r.anchor} ({fmt_bytes(r.anchor_bytes)})" if r.anchor else ""
    return (
        f"at the scan: leaked {r.leaked_count:,} blocks ({fmt_bytes(r.leaked_bytes)}, {r.unreferenced_count:,} "
        f"unreferenced), anchored {r.anchored_count:,} ({fmt_bytes(r.anchored_bytes)}){anchor}"
    )
