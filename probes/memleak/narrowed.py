"""sites: narrowed allocation tracing as a probe of the diagnosis, its face.

Where tracing every malloc and free is over the budget (a hot allocator), a page-fault profile
still names the function whose pages grow; the playbook then asks this probe for that function
(`given: {function: faults.top_function}`). It traps only that function's own calls to the
allocator (sites.py), reads which of their blocks are still allocated at the end (glibc: from its
chunk headers; jemalloc: no free of them seen, its frees traced), and scans the stopped target
for what still points at them (reach/): leaked, or held and by what, with how many of the
function's calls left a block behind.

Its cost is measured while attached: each hit priced at its instruction's trap on this host
(costs.py; the instruction after a call is mostly single-stepped, a call and jemalloc's free where
its probe sits are emulated) plus the programs' run time, checked against the target's CPU clock
(meter.Meter); it stops where the budget would be spent, a tick and the detach ahead, with the
scan's pause kept. Facts: sites.* (the leak rules' reach.* words, for this trace)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from memdiag.system import clock
from memdiag.system.process import read_rss_anon
from memdiag.system.target import Target
from memdiag.system.units import fmt_bytes, fmt_ns, fmt_number

from ..face import (
    Context,
    Face,
    FactDef,
    Namer,
    Option,
    ProbeResult,
    ProbeStatus,
    RowContext,
    Stack,
    StackReach,
    Stacks,
    TracingCost,
    TrailItem,
    pid_only,
)
from ..growth import StackGrowth, folded_lines
from .costs import Costs, host_costs
from .facts import share_words
from .meter import Meter, detach_seconds
from .reach import ReachScan
from .reach.pause import reserve_ms
from .view import keep_most_leaked, with_scan_row

if TYPE_CHECKING:  # sites.py reads machine code (capstone): imported when the probe runs, not at start
    from .sites import SiteTrace

METHOD = (
    "uprobes after the function's own calls to the allocator (none on malloc or free); blocks' state "
    "and size from glibc's chunk headers at the end"
)
METHOD_FREES = (
    "uprobes after the function's own calls to the allocator and on {allocator}'s free entry points (none on "
    "malloc); a block is still allocated when no free of it was seen, its size the one its call asked for"
)
SCAN_METHOD = "all threads stopped (ptrace), writable memory read and matched against the traced blocks still allocated"
NO_FUNCTION = "no function to trace: the playbook gives it (faults.top_function), or --function NAME"


class SiteStack(StackGrowth):
    """The still-allocated blocks of one stack at the end of the trace (count, bytes), the calls of
    that stack that returned a block while traced, and what the scan found pointing at them."""

    calls: int = 0
    reach: StackReach | None = None


class SitesResult(ProbeResult):
    name: str = "sites"
    function: str = ""
    module: str = ""
    allocator: str = ""
    liveness: str = ""  # "headers": glibc's chunk headers read; "frees": the allocator's frees traced
    sites: int = 0  # call sites probed
    single_stepped: int = 0  # of them, on an instruction the kernel single-steps
    calls: int = 0  # calls traced that returned a block
    live_count: int = 0  # their blocks still allocated at the end
    live_bytes: int = 0
    sized: bool = True  # every block still allocated has a known size (strdup's call keeps none)
    frees: int = 0  # frees of the process traced (liveness "frees")
    frees_traced: list[str] = []  # the free entry points probed, where each probe sits
    freed_count: int = 0  # their blocks free at the end (or handed out again to an untraced call)
    stacks: list[SiteStack] = []
    folded: list[str] = []
    reach_scan: ReachScan | None = None
    rss_growth: int | None = None  # the target's RssAnon at the end less at the attach
    tracing_cost: TracingCost | None = None
    trap_ns: float | None = None  # what one hit was priced at (the dearest site's trap + the program)


def _programs_ns(n: dict[str, int], program_ns: dict[str, float]) -> float:
    """The programs' run time before the kernel's count is read: each hit at what memleak's program
    of the same shape takes here (a site: a stack id and copy, as malloc_enter; a call or a free: a
    map update or delete, as free_enter)."""
    site, other = program_ns.get("malloc_enter", 0.0), program_ns.get("free_enter", 0.0)
    return n.get("hits", 0) * site + sum(n.get(k, 0) for k in ("call_hits", "frees_emulated", "frees_stepped")) * other


def _when(change) -> dict:
    """The result's fields that say when the target exited or exec'd (system/identity.py)."""
    if change.kind == "execd":
        return {"target_execd_at": change.at, "target_exec": change.exe}
    return {"target_exited_at": change.at}


class _Kept:
    """The pause kept for the scan that ends the trace, priced again at every look from the target's
    resident anonymous memory (reach/pause.py's reserve) and carried forward, at the rate it has
    grown since the trace began, to when the scan would stop the target. Kept once at the start, a
    target that grows while traced outgrew it: bench_alloc flat out grew from about 400 to 650 MiB
    during the trace, whose end then left 427 ms for a scan priced at 621 ms (no scan, the verdict
    growth), and under jemalloc a scan begun within what was left ran out of it after 8.7 of 10.2 MiB."""

    def __init__(self, pid: int, max_pause_ms: float | None):
        self.pid, self.cap = pid, max_pause_ms
        self.first = (time.monotonic(), reserve_ms(pid) or 0.0)
        self.latest = self.first[1]

    def ms(self, ahead_s: float) -> float:
        """What to keep, `ahead_s` seconds before the scan could stop the target."""
        now = time.monotonic()
        self.latest = max(self.first[1], reserve_ms(self.pid) or self.latest)
        grown = self.latest - self.first[1]
        kept = self.latest + (grown / (now - self.first[0]) * ahead_s if now > self.first[0] else 0.0)
        return min(kept, self.cap) if self.cap is not None else kept


def _run(target: Target, ctx: Context) -> SitesResult:
    """Trace ctx.options["function"] for ctx.seconds (less the scan), stopping where its measured
    cost and the scan's kept pause reach what the budget leaves; then the scan."""
    from .sites import SitesRefused, reach_of, traced

    started = clock.wall()
    base = SitesResult(status="unavailable", target=target.describe(), started=started, method=METHOD)
    function = ctx.options.get("function")
    refused = _refused(target, function)
    if refused is not None:
        return base.model_copy(update=refused)
    pid = target.pid
    costs = host_costs()
    if costs is None:
        return base.model_copy(update={"reason": "this host's trap costs could not be measured: no price"})
    metered = _Metered(target, pid, ctx, costs)
    scan, per_key = None, {}
    try:
        with traced(pid, function, ctx.seconds, watch=metered.watch) as t:
            if t.live():
                scan, per_key = reach_of(pid, t, metered.pause_allowed_ms(t))
    except SitesRefused as e:
        return base.model_copy(update={"reason": str(e), "duration_s": clock.wall() - started})
    if (change := target.changed()) is not None:  # what was traced and scanned may not be the target's
        why = f"{change.describe()} while {function} was traced: what was traced is dropped"
        return base.model_copy(update={"reason": why, "duration_s": clock.wall() - started, **_when(change)})
    return metered.result(base, function, t, scan, per_key)


def _refused(target: Target, function: str | None) -> dict | None:
    """Why nothing can be traced, checked before anything is measured (the result's fields); None: go on."""
    if target.kind != "pid" or target.pid is None:
        return {"reason": "traces one process's calls: give --pid"}
    if not function:
        return {"reason": NO_FUNCTION}
    if (change := target.changed()) is not None:
        return {"reason": f"{change.describe()}: nothing was traced", **_when(change)}
    return None


class _Metered:
    """What one trace's phases share, from before the attach to its result: the host's trap prices, the
    budget's allowance, the meter on the target's CPU clock, the pause kept for the scan, the RssAnon at the start."""

    def __init__(self, target: Target, pid: int, ctx: Context, costs: Costs):
        self.target, self.pid, self.costs = target, pid, costs
        self.keep = _Kept(pid, ctx.max_pause_ms)
        self.allowance = ctx.budget.allowance_ns if ctx.budget is not None else None
        self.max_pause_ms = ctx.max_pause_ms
        self.meter = Meter(pid, ctx.cpu_rate)
        self.rss0 = read_rss_anon(pid)

    def priced(self, n: dict[str, int], kinds: dict[str, bool], run_ns: int | None = None) -> float:
        """What the hits counted in n cost the target: their traps plus the programs' run time (run_ns, else priced)."""
        from .sites import traps_ns

        programs = run_ns if run_ns is not None else _programs_ns(n, self.costs.program_ns)
        return traps_ns(n, kinds, self.costs.emulated_ns, self.costs.stepped_ns) + programs

    def watch(self, n: dict[str, int], kinds: dict[str, bool], attached: float) -> bool:
        """sites.traced's watch: True stops the trace where its cost and the scan's kept pause reach the allowance."""
        from .sites import tick_s

        if not self.target.alive():  # exited or exec'd: the trace ends here, and is dropped below
            return True
        if self.allowance is None:
            return False
        spent = self.meter.cost(self.priced(n, kinds)).measured_ns or 0.0
        # the next check is a tick away, and the probes trap on until the scan stops the target (under
        # jemalloc its frees are traced until then): stop now if that, at the rate so far, would eat
        # the pause kept for the scan (bench_alloc at 100k/s under jemalloc: 0.1 s of cost a second;
        # checked only against what was spent, the scan was left no pause)
        until_scan = detach_seconds() + tick_s(attached)
        ahead = spent * until_scan / attached if attached > 0 else 0.0
        return spent + ahead + self.keep.ms(until_scan) * 1e6 >= self.allowance

    def pause_allowed_ms(self, t: SiteTrace) -> float | None:
        """The scan's pause: what the budget leaves after the trace, within the longest stop allowed (None: none)."""
        spent = self.meter.cost(self.priced(t.stats, t.kinds)).measured_ns or 0.0
        left_ms = (self.allowance - spent) / 1e6 if self.allowance is not None else None
        limits = [x for x in (left_ms, self.max_pause_ms) if x is not None]
        return max(0.0, min(limits)) if limits else None

    def result(
        self, base: SitesResult, function: str, t: SiteTrace, scan: ReachScan | None, per_key: dict
    ) -> SitesResult:
        """The result: the trace's books and the scan's, what they cost, and how the target's RSS grew."""
        run_ns = t.run[1] if t.run is not None else None  # None: the kernel kept no run time
        traps = self.priced(t.stats, t.kinds, run_ns)
        paused_s = (scan.paused_ms or 0.0) / 1000 if scan is not None else 0.0  # the pause: the scan's
        cost = self.meter.cost(traps, paused_s)
        live = t.live()
        rss1 = read_rss_anon(self.pid)
        stacks = [_stack(s, t, per_key) for s in t.stacks]
        partial = t.stats["blocks_dropped"] > 0
        frees = t.stats["frees_emulated"] + t.stats["frees_stepped"]
        costs = self.costs
        return base.model_copy(
            update={
                "status": "partial" if partial else "ok",
                "reason": _reason(function, t, frees, partial),
                "method": METHOD if t.liveness == "headers" else METHOD_FREES.format(allocator=t.allocator),
                "duration_s": t.seconds,
                "backed_off": t.stopped,
                "function": function,
                "module": t.module,
                "allocator": t.allocator,
                "liveness": t.liveness,
                "sites": len(t.sites),
                "single_stepped": sum(1 for e in t.emulated if not e),
                "calls": t.stats["hits"] - t.stats["null"],
                "frees": frees,
                "frees_traced": t.frees,
                "live_count": len(live),
                "live_bytes": sum(b.size or 0 for b in live),
                "sized": all(b.size is not None for b in live),
                "freed_count": len(t.blocks) - len(live),
                "stacks": stacks,
                "folded": folded_lines(stacks, weight="bytes"),
                "reach_scan": scan,
                "rss_growth": rss1 - self.rss0 if self.rss0 is not None and rss1 is not None else None,
                "tracing_cost": cost,
                # one site hit's price: its trap as counted (the dearest of the sites: hits are not told by site)
                "trap_ns": (costs.emulated_ns if t.kinds["hits"] else costs.stepped_ns)
                + costs.program_ns.get("malloc_enter", 0.0),
                "lost": {k: v for k, v in t.stats.items() if k.endswith("_dropped") or k == "stack_errors"},
                "cost": base.cost.model_copy(update={"events": t.stats["hits"] + frees, "bpf_run_ns": run_ns}),
            }
        )


def _reason(function: str, t: SiteTrace, frees: int, partial: bool) -> str:
    """The result's reason: what was traced, and whether it stopped early or its block table filled."""
    at = f"{len(t.sites)} site" + ("s" if len(t.sites) != 1 else "")
    return (
        f"{fmt_number(t.stats['hits'] - t.stats['null'])} calls of {function} traced at {at}"
        + (f", and {fmt_number(frees)} frees of the process" if t.liveness == "frees" else "")
        + ("; stopped early: its measured cost reached what the budget leaves" if t.stopped else "")
        + ("; the block table filled (see lost)" if partial else "")
    )


def _stack(s: StackGrowth, t: SiteTrace, per_key: Mapping[tuple, StackReach]) -> SiteStack:
    """One merged stack with its keys' calls and their scan results summed."""
    reaches = [per_key[k] for k in s.keys if k in per_key]
    reach = _sum_reach(reaches) if reaches else None
    return SiteStack(**s.model_dump(), keys=s.keys, calls=sum(t.calls.get(k, 0) for k in s.keys), reach=reach)


def _sum_reach(rs: list[StackReach]) -> StackReach:
    top = max(rs, key=lambda r: r.anchor_bytes)
    return StackReach(
        leaked_count=sum(r.leaked_count for r in rs),
        leaked_bytes=sum(r.leaked_bytes for r in rs),
        unreferenced_count=sum(r.unreferenced_count for r in rs),
        anchored_count=sum(r.anchored_count for r in rs),
        anchored_bytes=sum(r.anchored_bytes for r in rs),
        anchor=top.anchor,
        anchor_kind=top.anchor_kind,
        anchor_bytes=top.anchor_bytes,
    )


# --- facts -------------------------------------------------------------------------------------

FACTS = (
    FactDef("sites.function", "string", "the function whose own calls to the allocator were traced", figure=False),
    FactDef("sites.calls", "number", "its calls that returned a block while traced"),
    FactDef("sites.live_bytes", "bytes",
            "bytes of their blocks still allocated at the end (glibc: usable, from its headers; else as asked)"),
    FactDef("sites.leaked_count", "number", "blocks of the leak stack nothing points at (its scan)"),
    FactDef("sites.leaked_bytes", "bytes", "bytes of the leak stack nothing points at"),
    FactDef("sites.leaked_ratio", "percent", "share of the leak stack's still-allocated bytes nothing points at"),
    FactDef("sites.leak_function", "string", "the application function of the leak stack", figure=False),
    FactDef("sites.leak_share", "string",
            "how often its calls leak: '1 in 7 allocations', 'nearly every allocation (4 of 5)', "
            "'every allocation' (none freed)",
            figure=False),
    FactDef("sites.leak_rate", "bytes_per_s", "bytes the leak stack leaked per second traced"),
    FactDef("sites.anchored_ratio", "percent", "share of the heaviest stack's still-allocated bytes pointed at"),
    FactDef("sites.anchored_bytes", "bytes", "bytes of the heaviest stack the program still points at"),
    FactDef("sites.anchor", "string", "the root that holds most of the heaviest stack's anchored bytes",
            figure=False),
    FactDef("sites.anchor_kind", "string", "what kind of root that is (static, stack, register, tls, untracked)",
            figure=False),
    FactDef("sites.rss_growth", "bytes", "the target's resident anonymous memory growth while traced"),
    FactDef("sites.growth_share", "percent",
            "the traced blocks still allocated at the end as a share of that growth (over 100%: they reuse pages)"),
    FactDef("sites.growth_explained", "string",
            "what share of that growth the traced blocks still allocated account for, in words", figure=False),
)  # fmt: skip


def leak_stack(r: SitesResult) -> SiteStack | None:
    """The stack with the most bytes nothing points at."""
    leaked = [s for s in r.stacks if s.reach is not None and s.reach.leaked_count]
    return max(leaked, key=lambda s: s.reach.leaked_bytes) if leaked else None  # type: ignore[union-attr]


def _growth_share(r: SitesResult) -> float | None:
    """The traced blocks still allocated as a share of the RSS growth while traced (None: no growth)."""
    return 100 * r.live_bytes / r.rss_growth if r.rss_growth is not None and r.rss_growth > 0 else None


def _explained(r: SitesResult) -> str | None:
    """That share in words (the same value as the figure), and where the rest is."""
    if r.rss_growth is None:
        return None
    share = _growth_share(r)
    if share is None:
        return f"RSS did not grow while traced ({fmt_bytes(r.rss_growth)}): its blocks reused pages it had"
    rest = "" if share >= 80 else ": the rest is other code's, or pages the allocator touched for them"
    return (
        f"its blocks still allocated ({fmt_bytes(r.live_bytes)}) are {share:.0f}% of what RSS grew while traced "
        f"({fmt_bytes(r.rss_growth)}){rest}"
    )


def facts_of(r: SitesResult | None, _plan, name: Namer) -> dict:
    if r is None or r.status not in ("ok", "partial"):
        return {}
    f: dict[str, Any] = {
        "sites.function": r.function,
        "sites.calls": r.calls,
        "sites.live_bytes": r.live_bytes,
        "sites.rss_growth": r.rss_growth,
        "sites.growth_share": _growth_share(r),
        "sites.growth_explained": _explained(r),
    }
    if r.reach_scan is None or r.reach_scan.status != "ran":
        return f
    top = r.stacks[0] if r.stacks else None
    if top is not None and top.reach is not None:
        held = top.reach.anchored_bytes + top.reach.leaked_bytes
        f["sites.anchored_bytes"] = top.reach.anchored_bytes
        f["sites.anchored_ratio"] = 100 * top.reach.anchored_bytes / held if held else None
        f["sites.anchor"] = top.reach.anchor
        f["sites.anchor_kind"] = top.reach.anchor_kind
    leak = leak_stack(r)
    if leak is None or leak.reach is None:
        return {**f, "sites.leaked_count": 0, "sites.leaked_bytes": 0, "sites.leaked_ratio": 0.0}
    lr = leak.reach
    return {
        **f,
        "sites.leaked_count": lr.leaked_count,
        "sites.leaked_bytes": lr.leaked_bytes,
        "sites.leaked_ratio": 100 * lr.leaked_bytes / (lr.leaked_bytes + lr.anchored_bytes),
        "sites.leak_function": name(leak.frames, []),
        "sites.leak_share": share_words(lr.leaked_count, leak.calls, leak.calls - leak.count),
        "sites.leak_rate": lr.leaked_bytes / r.duration_s if r.duration_s else None,
    }


# --- how it shows ---------------------------------------------------------------------------------


def _stack_of(s: SiteStack) -> Stack:
    return Stack(
        frames=s.frames,
        functions=s.functions,
        bytes=s.bytes,
        count=s.count,
        pid=s.pid,
        detail=f"{fmt_number(s.count)} blocks still allocated of {fmt_number(s.calls)} calls traced",
        reach=s.reach,
    )


def _culprit(r: SitesResult, verdict_kind: str) -> Stack | None:
    leak = leak_stack(r) if verdict_kind == "leak" else None
    if leak is not None:
        return _stack_of(leak)
    return _stack_of(r.stacks[0]) if verdict_kind in ("leak", "cache", "growth") and r.stacks else None


STACKS = Stacks(
    kind="allocations",
    shown=3,
    of=lambda r: [_stack_of(s) for s in r.stacks],
    folded=lambda r: r.folded,
    culprit=_culprit,
    space="inuse_space",
    counted="inuse_objects",
)


def rows(r: SitesResult | None, _plan, ctx: RowContext) -> list[ProbeStatus]:
    """Its row, then the scan's (the pause is its cost), as memleak's."""
    return with_scan_row(r.reach_scan if r is not None else None, ctx, {}, SCAN_METHOD)


def trail(r: SitesResult) -> list[TrailItem]:
    scan = r.reach_scan
    return [] if scan is None else [TrailItem(kind="scan", name="reach", state=scan.status, reason=scan.describe())]


def caveats(r: SitesResult) -> list[str]:
    if r.status not in ("ok", "partial"):
        return []
    out = [
        f"Only {r.function}'s own calls to the allocator were traced ({r.sites} sites, each hit priced at "
        f"{fmt_ns(r.trap_ns or 0)}): blocks it gets through a wrapper, and other code's, are not in its stacks"
    ]
    if r.liveness == "frees":
        out.append(
            f"Under {r.allocator} a block's state is not read from the allocator: every free of the process was "
            f"traced too ({fmt_number(r.frees)}, at {', '.join(r.frees_traced)}), and a block no free was seen "
            "for is still allocated; one handed to realloc counts as freed"
        )
    if not r.sized:
        out.append(
            "Some blocks still allocated have no known size (a call whose size is no argument, as strdup's): "
            "their bytes count as 0"
        )
    if r.reach_scan is not None and r.reach_scan.status != "ran":
        out.append(f"The reachability scan of its blocks {r.reach_scan.status}: {r.reach_scan.reason}")
    return out


def describe(r: SitesResult, top: int) -> list[str]:
    """`memdiag probe sites`: what was traced, what is left, and what points at it."""
    if r.status not in ("ok", "partial"):
        return []
    lines = [
        f"{r.function} in {r.module}: {fmt_number(r.calls)} calls traced, {fmt_number(r.live_count)} blocks "
        f"({fmt_bytes(r.live_bytes)}) still allocated, {fmt_number(r.freed_count)} freed",
    ]
    if r.liveness == "frees":
        traced = ", ".join(r.frees_traced)
        lines.append(f"  {fmt_number(r.frees)} frees of the process traced ({r.allocator}): {traced}")
    for s in r.stacks[:top]:
        reach = ""
        if s.reach is not None:
            reach = f"; {fmt_number(s.reach.leaked_count)} leaked, {fmt_number(s.reach.anchored_count)} held"
            reach += f" (from {s.reach.anchor})" if s.reach.anchor else ""
        lines.append(f"  {fmt_bytes(s.bytes)} in {fmt_number(s.count)} blocks of {fmt_number(s.calls)} calls{reach}")
        lines += [f"    {f}" for f in s.frames[:8]]
    if r.reach_scan is not None:
        lines.append(f"scan: {r.reach_scan.describe()}")
    return lines


def _refuse(options: Mapping[str, Any]) -> str | None:
    return None if options.get("function") else "probe sites needs --function NAME (the function to trace)"


FACE = Face(
    name="sites",
    summary="one function's own calls to the allocator (--function NAME; one process)",
    needs=pid_only("traces one process's calls: give -p PID"),
    run=_run,
    result=SitesResult,
    describe=describe,
    facts=FACTS,
    facts_of=facts_of,
    rows=rows,
    stacks=STACKS,
    caveats=caveats,
    trail=trail,
    measured=lambda r: r.tracing_cost,
    on_target=True,
    options=(Option("--function", "function", "the function whose own calls to the allocator are traced"),),
    refuse=_refuse,
    keep=lambda older, newer: keep_most_leaked(older, newer, leak_stack),  # as memleak's
)
