"""How memleak shows in the report: its stacks (outstanding blocks, with their series and what the
scan found), the reachability scan as a row of the probe table and a step of the trail, the
caveat the scan's roots call for, and what an interrupted run did not gather."""

from __future__ import annotations

from memdiag.system.units import fmt_number

from ..cpython.frames import caveats as python_caveats
from ..face import ProbeStatus, RowContext, Stack, Stacks, TracingCost, TrailItem
from .reach import ReachScan
from .result import LeakStack, MemleakResult

SCAN_METHOD = "all threads stopped (ptrace), writable memory read and matched against memleak's blocks"


def stack(s: LeakStack, series_s: list[float] | None = None) -> Stack:
    return Stack(
        frames=s.frames,
        functions=s.functions,
        forwards=s.forwards,
        bytes=s.outstanding_bytes,
        count=s.outstanding_count,
        pid=s.pid,
        detail=f"{fmt_number(s.outstanding_count)} allocations outstanding, "
        f"{fmt_number(s.allocs)} allocs, {fmt_number(s.frees)} frees"
        + (
            "; pymalloc's arenas, whichever Python line mapped them (shown: the line that mapped the most)"
            if s.arenas
            else ""
        ),
        series=s.series,
        series_s=series_s[: len(s.series)] if series_s else [],
        reach=s.reach,
    )


def culprit(r: MemleakResult, verdict_kind: str) -> Stack | None:
    """A leak rests on the stack whose blocks nothing points at, as the leak rule read it; a leak,
    cache or growth otherwise on the heaviest stack (a CPython target's arenas: a sample, which an
    event stack outranks); any other verdict on no allocation stack."""
    leak = r.leak_stack() if verdict_kind == "leak" else None
    if leak is not None:
        return stack(leak, r.series_times)
    if verdict_kind in ("leak", "cache", "growth") and r.stacks:
        top = stack(r.stacks[0], r.series_times)
        # a CPython target's arenas: the line that mapped the most is not the one filling them; the
        # stacks that count pages as they are touched (faults) name it where they ran
        return top.model_copy(update={"sampled": True}) if r.stacks[0].arenas else top
    return None


STACKS = Stacks(
    kind="allocations",
    shown=5,
    of=lambda r: [stack(s, r.series_times) for s in r.stacks],
    folded=lambda r: r.folded,
    culprit=culprit,
    space="inuse_space",
    counted="inuse_objects",
)


def rows(r: MemleakResult | None, _plan, ctx: RowContext) -> list[ProbeStatus]:
    """memleak's row, then the reachability scan's: its cost is the pause it caused."""
    return with_scan_row(r.reach_scan if r is not None else None, ctx, ctx.figures.get("reach", {}))


def with_scan_row(
    scan: ReachScan | None, ctx: RowContext, figures: dict[str, float], method: str = SCAN_METHOD
) -> list[ProbeStatus]:
    """A tracing probe's row, then its reachability scan's (memleak's, the narrowed trace's)."""
    if scan is None:
        return [ctx.row]
    paused = scan.paused_ms
    return [
        ctx.row,
        ProbeStatus(
            name="reach",
            status="ok" if scan.status == "ran" else ("not-run" if scan.status == "skipped" else "error"),
            reason=scan.describe(),
            method=method,
            duration_s=(paused or 0) / 1000,
            events=scan.blocks,
            overhead_percent=100 * paused / 1000 / ctx.window_s if paused is not None else None,
            figures=figures,
            on_target=True,
        ),
    ]


def keep_most_leaked(older, newer, leak_stack):
    """Of two cycles' runs, the one whose scan found the most leaked bytes (in its leak_stack(run)):
    a leak seen in one cycle of a long window stays the window's evidence; where neither found
    any, the newer."""

    def leaked(r) -> int:
        s = leak_stack(r) if r.status in ("ok", "partial") else None
        return s.reach.leaked_bytes if s is not None and s.reach is not None else 0

    return older if leaked(older) > leaked(newer) else newer


def trail(r: MemleakResult) -> list[TrailItem]:
    scan = r.reach_scan
    if scan is None:
        return []
    return [TrailItem(kind="scan", name="reach", state=scan.status, reason=scan.describe())]


def missed(r: MemleakResult) -> list[str]:
    scan = r.reach_scan
    if r.interrupted and (scan is None or scan.status != "ran"):
        return ["the reachability scan (which outstanding blocks are leaked, which still anchored)"]
    return []


def caveats(r: MemleakResult) -> list[str]:
    scan = r.reach_scan
    python = python_caveats(r.python)
    if scan is not None and scan.status in ("failed", "skipped"):
        # no holder and no leak can be named without it: the trail's line alone left users asking why
        paused = f" (the target was paused {scan.paused_ms:.0f} ms for it)" if scan.paused_ms else ""
        return python + [
            f"The reachability scan {scan.status}: {scan.reason}{paused}. Without it no holder of the blocks "
            "is named and a leak is told from held memory by the trend alone; --max-pause and --budget allow "
            "a longer scan"
        ]
    if scan is None or scan.status != "ran":
        return python
    return python + [
        f"Leaked versus anchored is conservative: the roots were {scan.roots}. Blocks whose only pointer "
        "is held by the kernel or stored encoded would look leaked; frees memleak does not hook (a custom "
        "allocator's own free) make freed blocks look leaked."
    ]


def measured(r: MemleakResult) -> TracingCost | None:
    return r.tracing_cost
