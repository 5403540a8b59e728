"""The goheap probe: a Go program's own heap profile and goroutines, read over the window from
outside (probes/go/memory.py): in-use bytes by allocation stack at each GC the window saw, and the
live goroutines by what they run, who started them and what they wait on. No BPF, nothing
written into the target; the binary's own function table names the frames, inlined calls too.

When the heap profile is off, says why: the linker switched it off (the program never references
runtime.MemProfile: no runtime/pprof, no net/http/pprof), or the program set MemProfileRate to 0.
Goroutines are read either way."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from memdiag.system._parse import Model
from memdiag.system.clock import wall
from memdiag.system.target import Target
from memdiag.system.units import fmt_bytes, fmt_duration

from ..face import Cost, Face, ProbeResult, pid_only
from ..reader import reads_cost
from . import view as goview

if TYPE_CHECKING:  # the reader of a Go program's memory is imported when one is read (run)
    from .memory import GoProcess, GoSnapshot
    from .pclntab import GoFrame, GoTable

BACKED_OFF = "stopped early: the next read would take its reads' time past what the budget leaves"
INTERVAL_S = 1.0
# With the heap profile off, the goroutines' trend (four reads at least) is all there is to read:
# the rest of the window is left to the probes that can name the code (page faults)
PROFILE_OFF_READS = 5  # one read a second: the profile moves at GCs, goroutines at any time
TOP_GROUPS = 8


class GoStack(Model):
    """One allocation stack of the heap profile, its in-use bytes at each point of the result."""

    frames: list[str]  # leaf first: "main.rememberFailure (main.go:21, inlined) [orderd]"
    functions: list[str]  # the frames' Go function names
    inuse_bytes: list[int]  # estimated (sampled counts scaled as pprof does), one per point
    inuse_objects: int  # estimated, at the last point
    alloc_bytes: int  # estimated, allocated since the process started, at the last point
    freed_bytes: int = 0  # estimated, freed between the first point and the last
    recovered: bool = False  # its leaf frame was read from the call site (the profile had dropped it)


class GoroutineGroup(Model):
    function: str  # what they run (their start function)
    created_by: str  # the go statement's frame: "main.serve (main.go:27)"
    wait: str  # what they wait on: "chan receive", or "running or runnable"
    waiting_in: str | None = None  # the program's frame they are parked in: "main.awaitReply (main.go:21)"
    counts: list[int]  # one per read


class GoHeapResult(ProbeResult):
    name: str = "goheap"
    version: str | None = None  # the toolchain's: go1.19.8
    found_by: str | None = None  # how the runtime's variables were located: symbol table, the runtime's code
    stripped: bool | None = None
    profile: str = "unknown"  # on | compiled-out (the linker) | rate-zero (the program set it) | unknown
    rate: int | None = None  # MemProfileRate at the last read (bytes per sample)
    times: list[float] = []  # seconds from the first read, one per point (the reads where a GC had completed)
    cycles: list[int] = []  # the GC cycle each point is as of
    heap_inuse: list[int] = []  # the profile's in-use bytes, all stacks (estimated), one per point
    stacks: list[GoStack] = []  # largest growth over the points first
    profile_complete: bool = True  # False: a bucket list was cut short (its length or unreadable memory)
    read_times: list[float] = []  # seconds from the first read, every read
    goroutines: list[int] = []  # the program's own goroutines (not the runtime's), every read
    goroutines_total: list[int] = []  # with the runtime's own
    groups: list[GoroutineGroup] = []  # largest growth first, the top few
    goroutines_complete: bool = True
    # the GC pacer's exact counts (runtime.gcController) and the process's anonymous RSS, every read
    pacer_times: list[float] = []  # seconds from the first read
    pacer_cycles: list[int] = []  # the GC cycle each of those reads is as of
    gogc: int | None = None  # GOGC the program runs with at the last read (-1: off)
    heap_goal: list[int] = []  # the heap goal as the GC before the read ended
    heap_marked: list[int] = []  # what that GC marked live
    heap_retained: list[int] = []  # what the heap held from the OS (in-use spans and free ones not returned)
    runtime_mapped: list[int] = []  # all the runtime held from the OS (heap, stacks, its own metadata)
    rss_anon: list[int] = []  # the process's anonymous resident bytes
    read_bytes: int = 0  # what the reads took from the target's memory, over the run
    read_seconds: float = 0.0  # the reader's own time in those reads
    module: str = ""  # the executable's name, for frames


def requirements() -> list:
    return []  # no kernel feature: /proc/PID/mem, as root or the target's owner with ptrace rights


def run(
    target: Target,
    seconds: float,
    interval: float = INTERVAL_S,
    clock: Callable[[], float] = time.monotonic,
    allowance_ns: float | None = None,
):
    """Read the target's heap profile and goroutines every `interval` for `seconds`; stop early
    (backed off) once the reads' time, what they may have cost the target at most, would pass
    allowance_ns (what the budget leaves; None: no budget)."""
    # here, not at the top: the registry imports this face for every target, native ones included
    from .memory import GoProcess, GoUnreadable

    started = wall()
    base = GoHeapResult(status="unavailable", target=target.describe(), started=started, method="")
    if target.kind != "pid" or target.pid is None:
        return base.model_copy(update={"reason": "reads one Go process: give --pid"})
    try:
        proc = GoProcess(target.pid)
    except GoUnreadable as e:
        return base.model_copy(update={"reason": str(e)})
    try:
        snaps, why = _read(proc, target, seconds, interval, clock, allowance_ns)
    finally:
        proc.close()
    result = summarize(proc, snaps, started)
    status = "ok" if not why else ("partial" if snaps else "error")
    reason = _profile_reason(result) + (f"; {why}" if why else "")
    reason += (
        f"; read {fmt_bytes(result.read_bytes)} of its memory in {fmt_duration(result.read_seconds)} "
        "(nothing stopped or written)"
    )
    cost = Cost(events=proc.memory.reads)
    update = {"status": status, "reason": reason, "duration_s": wall() - started, "cost": cost}
    update["backed_off"] = why == BACKED_OFF
    update["target"] = base.target
    return result.model_copy(update=update)


def _read(
    proc: GoProcess, target: Target, seconds: float, interval: float, clock, allowance_ns: float | None
) -> tuple[list, str]:
    from .memory import GoUnreadable

    snaps: list[GoSnapshot] = []
    end = clock() + seconds
    kept = None  # the GC cycle of the last read whose buckets were kept
    while True:
        try:
            snap = proc.snapshot()
        except GoUnreadable as e:
            return snaps, str(e)
        # The profile is published at GCs: a read in the cycle of the last one kept repeats its
        # buckets, which only _points' first read of each cycle uses. Dropped here, memdiag's memory
        # grows with the GCs the window saw, not with its reads (one a second; thousands of buckets each)
        if snap.rate > 0 and snap.cycle == kept:
            snap.buckets = []
        elif snap.rate > 0:
            kept = snap.cycle
        snaps.append(snap)
        if len(snaps) == 1 and snaps[0].rate == 0:  # no heap profile: goroutines only, for less of the window
            end = min(end, clock() + max(PROFILE_OFF_READS * interval, seconds / 3))
        left = end - clock()
        if left <= 0:
            return snaps, ""
        if not target.alive():
            return snaps, "the target exited"
        spent = proc.memory.seconds * 1e9
        if allowance_ns is not None and spent + spent / len(snaps) > allowance_ns:  # the next read would pass it
            return snaps, BACKED_OFF
        time.sleep(min(interval, left))


def _profile_reason(r: GoHeapResult) -> str:
    how = f"{r.version}, {'stripped, ' if r.stripped else ''}its runtime located from {r.found_by}"
    if r.profile == "compiled-out":
        return (
            f"{how}; heap profile off: the program never references runtime.MemProfile, so the linker switched "
            "the runtime's allocation sampling off (runtime.disableMemoryProfiling); goroutines read, for a third "
            "of its time"
        )
    if r.profile == "rate-zero":
        off = "heap profile off: the program set runtime.MemProfileRate to 0"
        return f"{how}; {off}; goroutines read, for a third of its time"
    gcs = r.cycles[-1] - r.cycles[0] if r.cycles else 0
    return f"{how}; heap profile sampled once per {fmt_bytes(r.rate)} allocated on average, {gcs} GC(s) completed"


def summarize(proc: GoProcess, snaps: list[GoSnapshot], started: float) -> GoHeapResult:
    """The result from a run's snapshots: a point of the heap profile per GC the reads saw."""
    module = proc.executable.rsplit("/", 1)[-1]
    last = snaps[-1] if snaps else None
    profile = "unknown"
    if last is not None:
        profile = "on" if last.rate > 0 else ("compiled-out" if not proc.profiling_linked else "rate-zero")
    points = _points(snaps)
    t0 = snaps[0].at if snaps else started
    heap, stacks = _stacks(proc.table, points, module)
    groups, users, totals = _goroutines(proc, snaps)
    paced = [s for s in snaps if s.pacer is not None and s.rss_anon is not None]
    m = proc.memory
    return GoHeapResult(
        status="ok",
        started=started,
        version=proc.version,
        found_by=proc.found_by,
        stripped=proc.stripped,
        profile=profile,
        rate=last.rate if last else None,
        times=[round(p.at - t0, 3) for p in points],
        cycles=[p.cycle for p in points],
        heap_inuse=heap,
        stacks=stacks,
        profile_complete=all(s.complete for s in snaps),
        read_times=[round(s.at - t0, 3) for s in snaps],
        goroutines=users,
        goroutines_total=totals,
        groups=groups,
        goroutines_complete=all(s.goroutines is None or s.goroutines.complete for s in snaps),
        pacer_times=[round(s.at - t0, 3) for s in paced],
        pacer_cycles=[s.cycle for s in paced],
        gogc=paced[-1].pacer.gc_percent if paced else None,  # type: ignore[union-attr]
        heap_goal=[s.pacer.heap_goal for s in paced],  # type: ignore[union-attr]
        heap_marked=[s.pacer.heap_marked for s in paced],  # type: ignore[union-attr]
        heap_retained=[s.pacer.retained for s in paced],  # type: ignore[union-attr]
        runtime_mapped=[s.pacer.mapped_ready for s in paced],  # type: ignore[union-attr]
        rss_anon=[s.rss_anon for s in paced],  # type: ignore[misc]
        read_bytes=m.bytes_read,
        read_seconds=round(m.seconds, 6),
        method=f"/proc/PID/mem reads of the Go runtime's heap profile and goroutines (located from {proc.found_by})",
        module=module,
    )


def _points(snaps: list[GoSnapshot]) -> list[GoSnapshot]:
    """The first read, then the first read after each GC that completed (the profile is published
    at GCs: reads between them repeat it)."""
    out: list[GoSnapshot] = []
    for s in snaps:
        if s.rate > 0 and (not out or s.cycle != out[-1].cycle):
            out.append(s)
    return out


@dataclass
class _Acc:
    """One stack's figures while its buckets are summed (estimated bytes)."""

    series: list[float]
    objects: float = 0.0  # in use at the last point
    allocated: float = 0.0  # since the start, at the last point
    freed: list[float] = field(default_factory=lambda: [0.0, 0.0])  # since the start, at the first and last point


def _stacks(table: GoTable, points: list[GoSnapshot], module: str) -> tuple[list[int], list[GoStack]]:
    """In-use bytes per stack at each point (buckets of one stack and several sizes summed)."""
    from .memory import scaled

    keys: dict[tuple[int, ...], _Acc] = {}
    last = len(points) - 1
    for i, p in enumerate(points):
        for b in p.buckets:
            objects, inuse = scaled(b.allocs - b.frees, b.alloc_bytes - b.free_bytes, p.rate)
            acc = keys.setdefault(b.stack, _Acc(series=[0.0] * len(points)))
            acc.series[i] += inuse
            if i in (0, last):
                acc.freed[i and 1] += scaled(b.frees, b.free_bytes, p.rate)[1]
            if i == last:
                acc.objects += objects
                acc.allocated += scaled(b.allocs, b.alloc_bytes, p.rate)[1]
    heap = [round(sum(a.series[i] for a in keys.values())) for i in range(len(points))]
    stacks = []
    for stack, a in keys.items():
        frames, functions, recovered = symbolize(table, stack, module)
        stacks.append(
            GoStack(
                frames=frames,
                functions=functions,
                inuse_bytes=[round(v) for v in a.series],
                inuse_objects=round(a.objects),
                alloc_bytes=round(a.allocated),
                freed_bytes=round(max(0.0, a.freed[1] - a.freed[0])),
                recovered=recovered,
            )
        )
    stacks.sort(
        key=lambda s: (s.inuse_bytes[-1] - s.inuse_bytes[0] if s.inuse_bytes else 0, s.alloc_bytes), reverse=True
    )
    return heap, stacks


def frame_text(f: GoFrame, module: str) -> str:
    where = f" ({f.file.rsplit('/', 1)[-1]}:{f.line}{', inlined' if f.inlined else ''})" if f.file and f.line else ""
    if not where and f.inlined:
        where = " (inlined)"
    return f"{f.function}{where} [{module}]"


def symbolize(table: GoTable, stack: tuple[int, ...], module: str) -> tuple[list[str], list[str], bool]:
    """A bucket's frames, leaf first, each PC's innermost frame (the runtime recorded a PC per
    inlined call), with the frame the profile skipped put back where the program called mallocgc
    itself (GoTable.called_from)."""
    frames, functions, recovered = [], [], False
    if stack:
        callee = table.called_from(stack[0])
        if callee is not None and not callee.function.startswith("runtime."):
            caller = table.frame(stack[0] - 1)
            at = f"called at {caller.file.rsplit('/', 1)[-1]}:{caller.line}" if caller and caller.file else "called"
            kind = ", inlined" if callee.inlined else ""
            frames.append(f"{callee.function} ({at}{kind}) [{module}]")
            functions.append(callee.function)
            recovered = True
    for pc in stack:
        f = table.frame(pc - 1)
        if f is None:
            frames.append(f"[unknown] [{module}]")
            functions.append("")
            continue
        frames.append(frame_text(f, module))
        functions.append(f.function)
    return frames, functions, recovered


def _goroutines(proc: GoProcess, snaps: list[GoSnapshot]) -> tuple[list[GoroutineGroup], list[int], list[int]]:
    read = [s for s in snaps if s.goroutines is not None]
    users = [s.goroutines.user for s in read]  # type: ignore[union-attr]
    totals = [s.goroutines.total for s in read]  # type: ignore[union-attr]
    keys: set[tuple[int, int, int, int]] = set()
    for s in read:
        keys |= set(s.goroutines.groups)  # type: ignore[union-attr]
    series = {k: [s.goroutines.groups.get(k, 0) for s in read] for k in keys}  # type: ignore[union-attr]
    top = sorted(series.items(), key=lambda kv: (kv[1][-1] - kv[1][0], kv[1][-1]), reverse=True)[:TOP_GROUPS]
    groups = []
    for (start, gopc, wait, where), counts in top:
        run_f = proc.table.frame(start)
        made = proc.table.frame(gopc - 1) if gopc else None
        parked = proc.table.frame(where - 1) if where else None
        groups.append(
            GoroutineGroup(
                function=run_f.function if run_f else f"{start:#x}",
                created_by=made.label() if made else "unknown",
                wait=proc.wait_reason(wait),
                waiting_in=parked.label() if parked else None,
                counts=counts,
            )
        )
    return groups, users, totals


FACE = Face(
    name="goheap",
    summary="a Go program's own heap profile and goroutines, read from outside (one process)",
    needs=pid_only("reads one Go process: give -p PID"),
    run=lambda target, ctx: run(target, ctx.seconds, allowance_ns=ctx.budget.allowance_ns if ctx.budget else None),
    result=GoHeapResult,
    describe=goview.describe,
    facts=goview.FACTS,
    facts_of=goview.facts_of,
    stacks=goview.STACKS,
    sections=goview.sections,
    measured=reads_cost,
)
