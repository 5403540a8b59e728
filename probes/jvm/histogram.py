"""The probe `histogram`: the JVM's own class histogram (jcmd GC.class_histogram) at the start of
its time and at its end, through the attach socket: which classes' live objects grew, by bytes and
count. Each look is a full collection at a safepoint (the JVM counts only what is live after it),
so both looks are exact live sets, the target paused for each.

It is what names the class where the flight recording is over the budget: JFR's first start in a
JVM costs 1.77 s of the target's CPU here (BENCHMARKS.md section 8), three times the default 2% of a
30 s window, while a look at a heap of a few hundred MiB costs tens of milliseconds. It names no
allocation site and no holder (the recording's old-object samples do): the verdict says so.

Priced before it runs (probes/jvm/costs.py: the CPU and pause per GiB of heap in use, this host's
measurements of the JVM's build, else the priors), twice, against what the budget leaves; refused
where one look's pause would pass --max-pause. Measured on the target while it runs: the CPU of the
threads doing the collection and the attach listener (probes/jvm/meter.py), raised to the process's
CPU above its rate before, up to twice, and each look's pause from the JVM's safepoint counters.
Nothing stays in the JVM but what any jcmd leaves (its attach listener)."""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING

from memdiag.system import clock
from memdiag.system.target import Target
from memdiag.system.units import fmt_bytes, fmt_duration

from ..base import Stop, run_for, stop_on_signals
from ..face import Context, Face, FactDef, Plan, ProbeResult, Section, TracingCost, TrailItem, _Frozen, pid_only
from . import costs
from .attach import LISTENER_STARTED, AttachRefused, Jvm, jcmd, listener_running
from .recording import class_name
from .view import rows

if TYPE_CHECKING:  # the meter, the plan's and the recorder's helpers load when a JVM is looked at
    from .meter import Meter

COMMAND = "GC.class_histogram"
KEEP = 10  # classes kept: those whose live bytes grew most
# a full collection's threads as comm keeps them (G1 and Parallel: "GC Thread#N"; the safepoint's
# operation runs in the VM thread)
LOOK_THREADS = ("VM Thread", "GC Thread", "G1 ")
_ROW = re.compile(r"^\s*\d+:\s+(\d+)\s+(\d+)\s+(\S+)")
_TOTAL = re.compile(r"^Total\s+(\d+)\s+(\d+)")


class Histogram(_Frozen):
    """One look: each class's live instances and bytes, and the totals the JVM printed."""

    classes: dict[str, tuple[int, int]] = {}  # class -> (instances, bytes)
    instances: int = 0
    bytes: int = 0


def _java_name(name: str) -> str:
    """The histogram's names are Java's already but for arrays: [B -> byte[], [Ljava.lang.Object; -> ..."""
    return class_name(name) if name.startswith("[") else name


def parse_histogram(text: str) -> Histogram | None:
    """GC.class_histogram's table; None when the answer holds none (an error, a refusal)."""
    classes: dict[str, tuple[int, int]] = {}
    total = None
    for line in text.splitlines():
        m = _ROW.match(line)
        if m:
            name = _java_name(m.group(3))
            n, b = classes.get(name, (0, 0))  # hidden classes of one name: counted together
            classes[name] = (n + int(m.group(1)), b + int(m.group(2)))
            continue
        t = _TOTAL.match(line.strip())
        if t:
            total = (int(t.group(1)), int(t.group(2)))
    if not classes:
        return None
    instances, size = total or (sum(n for n, _ in classes.values()), sum(b for _, b in classes.values()))
    return Histogram(classes=classes, instances=instances, bytes=size)


class ClassGrowth(_Frozen):
    """One class at both looks."""

    cls: str
    instances_first: int
    instances_last: int
    bytes_first: int
    bytes_last: int

    @property
    def grew(self) -> int:
        return self.bytes_last - self.bytes_first

    @property
    def added(self) -> int:
        return self.instances_last - self.instances_first


def grown(first: Histogram, last: Histogram, keep: int = KEEP) -> list[ClassGrowth]:
    """The classes whose live bytes grew most between the looks, most first."""
    out = []
    for cls in first.classes.keys() | last.classes.keys():
        n0, b0 = first.classes.get(cls, (0, 0))
        n1, b1 = last.classes.get(cls, (0, 0))
        if b1 > b0:
            out.append(ClassGrowth(cls=cls, instances_first=n0, instances_last=n1, bytes_first=b0, bytes_last=b1))
    return sorted(out, key=lambda c: (-c.grew, c.cls))[:keep]


class HistogramPlan(Plan):
    jvm: Jvm | None = None
    build: str | None = None
    used: int = 0  # the bytes priced by: what survived the last collections (else the heap in use)
    look: costs.LookPrice | None = None


class HistogramResult(ProbeResult):
    build: str | None = None
    looked_at: list[float] = []  # epoch seconds of each look
    live_first: int | None = None  # live bytes at each look (the histogram's total)
    live_last: int | None = None
    classes: list[ClassGrowth] = []
    pauses_s: list[float | None] = []  # each look's safepoint time (the JVM's counters)
    look_cpu_s: list[float] = []  # each look's CPU in the collection's threads
    measured_ns: float | None = None
    process_ns: float | None = None
    heap_used: int = 0  # the bytes the plan priced by (HistogramPlan.used)
    listener_started: bool = False  # memdiag's SIGQUIT started the JVM's attach listener


def _refused(reason: str) -> HistogramPlan:
    return HistogramPlan(
        go=False, state="refused", reason=reason, facts={"histogram.plan": "refused", "histogram.not_run": reason}
    )


def plan(target: Target, ctx: Context) -> HistogramPlan:
    """Two looks' price for ctx.seconds (never raises; a refusal says why)."""
    from .plan import attachable

    found = attachable(target, "a class histogram is a JVM's own: one process (--pid, or a container's JVM)")
    if isinstance(found, str):
        return _refused(found)
    jvm, counters = found
    if counters is None or counters.heap_used is None:
        return _refused(
            "the JVM keeps no counters (-XX:-UsePerfData): the heap in use, which prices a look, is unknown"
        )
    # A full collection's work is marking and moving what survives, not the garbage beside it: priced
    # by what survived the last collections (a churning cache's heap in use swings to its maximum
    # between them: 1 GiB priced two looks at 2.2 s where each cost 0.02-0.04 s here). Where the heap
    # has no eden (ZGC, Shenandoah), by the heap in use.
    survived = counters.after_gc_used is not None
    basis = counters.after_gc_used if survived else counters.heap_used
    look = costs.histogram_price(counters.version, basis)
    source = "as measured on this JVM build here" if look.measured_here else "an estimate measured elsewhere"
    of = "that survived the last collections" if survived else "in use"
    what = (
        f"two class histograms, each a full collection of a heap with {fmt_bytes(basis)} {of}: "
        f"{look.cpu_s * 1000:.0f} ms of the target's CPU and a {look.pause_s * 1000:.0f} ms pause each ({source})"
    )
    common = dict(jvm=jvm, build=counters.version, used=basis, look=look)
    if ctx.max_pause_ms is not None and look.pause_s * 1000 > ctx.max_pause_ms:
        why = f"{what}: a pause over --max-pause {ctx.max_pause_ms:g} ms"
        facts = {"histogram.plan": "over-pause", "histogram.not_run": why}
        return HistogramPlan(go=False, state="over-pause", reason=why, facts=facts, **common)
    if ctx.budget is None:
        return HistogramPlan(go=True, state="full", reason=what, facts={"histogram.plan": "full"}, **common)
    total_ns = 2 * look.cpu_s * 1e9
    percent = 100 * total_ns / (ctx.budget.window_s * 1e9)
    estimate = dict(estimated_percent=percent, estimate_of="two class histograms (full collections)")
    if total_ns > ctx.budget.allowance_ns:
        why = f"{what} = {percent:.2f}% of the {ctx.budget.window_s:.0f} s window, over what the budget leaves"
        facts = {"histogram.plan": "over-budget", "histogram.not_run": why}
        return HistogramPlan(go=False, state="over-budget", reason=why, facts=facts, **estimate, **common)
    why = f"{what} = {percent:.2f}% of the {ctx.budget.window_s:.0f} s window <= budget {ctx.budget.percent:g}%"
    return HistogramPlan(go=True, state="full", reason=why, facts={"histogram.plan": "full"}, **estimate, **common)


def _look(jvm: Jvm, meter: Meter, timeout_s: float, out: dict) -> Histogram:
    from .plan import read_counters
    from .probe import safepoint_delta

    # the step before the look closes first: the collector's threads also run the target's own
    # young collections between the looks (counted, they made one look cost 3.2 s per GiB)
    meter.close_step()
    before = read_counters(jvm.pid)
    out["looked_at"].append(clock.wall())
    reply = jcmd(jvm, COMMAND, timeout_s=timeout_s)
    out["look_cpu_s"].append(meter.close_step(LOOK_THREADS))
    out["pauses_s"].append(safepoint_delta(before, read_counters(jvm.pid)))
    found = parse_histogram(reply.output) if reply.ok else None
    if found is None:
        raise RuntimeError(f"the JVM answered {COMMAND} with no histogram: {reply.output.strip()[:200]!r}")
    return found


def _observe(target: Target, ctx: Context, p: HistogramPlan, stop: Stop, out: dict) -> None:
    from .meter import Meter

    assert p.jvm is not None and p.look is not None
    meter = Meter(p.jvm.pid, ctx.cpu_rate or 0.0)
    out["listener_started"] = not listener_running(p.jvm)
    timeout = max(10.0, 5 * p.look.pause_s)
    begun = time.monotonic()
    first = _look(p.jvm, meter, timeout, out)
    # the second look ends the time given: it starts that look's priced pause (and a second) before
    left = ctx.seconds - (time.monotonic() - begun) - (p.look.pause_s + 1.0)
    run_for(max(0.0, left), target, stop)
    out.update(interrupted=stop.interrupted, target_exited_at=stop.target_exited_at)
    out.update(target_execd_at=stop.target_execd_at, target_exec=stop.target_exec)
    if stop.change is None and stop.target_exited_at is None:  # no second look at what holds its pid now
        last = _look(p.jvm, meter, timeout, out)
        out.update(live_first=first.bytes, live_last=last.bytes, classes=grown(first, last))
    meter.close_step()
    out["measured_ns"], out["process_ns"] = meter.so_far() * 1e9, meter.process_s() * 1e9
    out["cost"] = {"events": len(out["looked_at"])}  # the looks: what the header counts as its reads
    out["duration_s"] = time.monotonic() - begun


def run(target: Target, ctx: Context) -> HistogramResult:
    """Two looks, ctx.seconds apart at most (its plan made first when run alone)."""
    p = ctx.plan if isinstance(ctx.plan, HistogramPlan) else plan(target, ctx)
    base = dict(name="histogram", target=target.describe(), started=clock.wall(), method=f"jcmd {COMMAND}, twice")
    if not p.go or p.jvm is None:
        return HistogramResult(status="unavailable", reason=p.reason, **base)
    out: dict = {"build": p.build, "heap_used": p.used, "looked_at": [], "pauses_s": [], "look_cpu_s": []}
    try:
        with stop_on_signals() as stop:
            _observe(target, ctx, p, stop, out)
        out["status"] = "ok" if out.get("live_last") is not None and not out.get("interrupted") else "partial"
    except (AttachRefused, RuntimeError, OSError) as e:
        out.update(status="error" if out["looked_at"] else "unavailable", reason=str(e))
    _remember(out)
    return HistogramResult(**base, **out)


def _remember(out: dict) -> None:
    """This host's per-GiB figures for the next price, from the looks measured."""
    gib = (out.get("heap_used") or 0) / (1 << 30)
    pauses = [s for s in out.get("pauses_s", []) if s is not None]
    if out.get("status") != "ok" or gib <= 0 or not pauses:
        return
    costs.remember(
        out.get("build"),
        {"look_cpu_per_gib": max(out["look_cpu_s"]) / gib, "look_pause_per_gib": max(pauses) / gib},
    )


def measured(r: HistogramResult) -> TracingCost | None:
    if r.measured_ns is None:
        return None
    return TracingCost(attached_s=r.duration_s, cpu_ns=r.process_ns, measured_ns=r.measured_ns)


# --- its face ------------------------------------------------------------------------------------

FACTS = (
    FactDef("histogram.plan", "string", "the class histograms' plan: full, over-budget, over-pause or refused",
            figure=False),
    FactDef("histogram.not_run", "string", "why no class histogram was taken"),
    FactDef("histogram.apart", "seconds", "the time between the two looks"),
    FactDef("histogram.live_first", "bytes", "the live objects' bytes at the first look (after its full collection)"),
    FactDef("histogram.live_last", "bytes", "the live objects' bytes at the second look"),
    FactDef("histogram.live_grew", "bytes", "what the live objects grew by between the looks (negative: shrank)"),
    FactDef("histogram.live_growth", "percent", "that growth as a share of the first look's live bytes"),
    FactDef("histogram.top_class", "string", "the class whose live bytes grew most between the looks"),
    FactDef("histogram.top_grew", "bytes", "what its live objects grew by"),
    FactDef("histogram.top_added", "number", "its live objects added between the looks"),
    FactDef("histogram.top_share", "percent", "its share of what the live objects grew by"),
    FactDef("histogram.top_rate", "bytes_per_s", "its growth per second between the looks"),
    FactDef("histogram.pause", "seconds", "the longer of the two looks' pauses (the JVM's safepoint time)"),
)  # fmt: skip


def facts_of(r: HistogramResult | None, p: HistogramPlan | None, _name) -> dict:
    f: dict = dict(p.facts) if p is not None else {}
    if r is None or r.status != "ok" or r.live_first is None or r.live_last is None or len(r.looked_at) < 2:
        return f
    apart = r.looked_at[-1] - r.looked_at[0]
    grew = r.live_last - r.live_first
    pauses = [s for s in r.pauses_s if s is not None]
    f.update(
        {
            "histogram.apart": apart,
            "histogram.live_first": r.live_first,
            "histogram.live_last": r.live_last,
            "histogram.live_grew": grew,
            "histogram.live_growth": 100 * grew / r.live_first if r.live_first else None,
            "histogram.pause": max(pauses) if pauses else None,
        }
    )
    if r.classes:
        top = r.classes[0]
        f.update(
            {
                "histogram.top_class": top.cls,
                "histogram.top_grew": top.grew,
                "histogram.top_added": top.added,
                "histogram.top_share": 100 * top.grew / grew if grew > 0 else None,
                "histogram.top_rate": top.grew / apart if apart > 0 else None,
            }
        )
    return f


def sections(r: HistogramResult) -> list[Section]:
    if r.status != "ok" or r.live_first is None or r.live_last is None:
        return []
    apart = r.looked_at[-1] - r.looked_at[0]
    pauses = ", ".join(fmt_duration(s) if s is not None else "unknown" for s in r.pauses_s)
    lines = [
        f"two class histograms (jcmd {COMMAND}: each a full collection, so only live objects count), "
        f"{fmt_duration(apart)} apart: live objects {fmt_bytes(r.live_first)} then {fmt_bytes(r.live_last)}",
        f"cost to the target: {fmt_duration((r.measured_ns or 0) / 1e9)} of its CPU (the collections' threads, "
        f"raised to the process's CPU above its rate before, up to twice); paused {pauses} (its safepoints)",
        "the histograms name the class, not the code that allocates it or what holds it (the flight recording's "
        "old-object samples do, at a larger budget)",
    ]
    rows = [
        [c.cls, f"{c.instances_first:,}", f"{c.instances_last:,}", fmt_bytes(c.bytes_first), fmt_bytes(c.bytes_last),
         fmt_bytes(c.grew)]
        for c in r.classes
    ]  # fmt: skip
    header = ["class", "objects (first look)", "objects (second)", "bytes (first)", "bytes (second)", "grew"]
    return [Section(probe="histogram", title="Java heap: classes that grew", lines=lines, header=header, rows=rows)]


def caveats(r: HistogramResult) -> list[str]:
    if r.status not in ("ok", "partial", "error") or not r.looked_at:
        return []
    out = [
        f"memdiag's class histograms ran {len(r.looked_at)} full collection(s) in the JVM: the live set its counters "
        "show includes them"
    ]
    if r.listener_started:
        out.append(LISTENER_STARTED)
    return out


def trail(r: HistogramResult) -> list[TrailItem]:
    return [
        TrailItem(kind="scan", name="histogram", state="ran",
                  reason=f"{COMMAND} (a full collection): paused {fmt_duration(s) if s is not None else 'unknown'}")
        for s in r.pauses_s
    ]  # fmt: skip


def describe(r: HistogramResult, top: int) -> list[str]:
    lines = [f"  {line}" for s in sections(r) for line in s.lines]
    for c in r.classes[:top]:
        lines.append(f"  {c.cls}: +{fmt_bytes(c.grew)} ({c.added:+,} objects), {fmt_bytes(c.bytes_last)} live")
    return lines


FACE = Face(
    name="histogram",
    summary="a JVM's class histogram at its start and end: the classes that grew (one process)",
    needs=pid_only("reads one JVM: give -p PID"),
    run=run,
    result=HistogramResult,
    describe=describe,
    facts=FACTS,
    facts_of=facts_of,
    rows=rows,
    caveats=caveats,
    sections=sections,
    trail=trail,
    measured=measured,
    on_target=True,
    plan=plan,
    planning="pricing the class histograms",
)
