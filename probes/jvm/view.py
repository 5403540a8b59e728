"""What the flight recording adds to a diagnosis, its face (probes/face.py): the facts the playbook
reads (jfr.*), its row, its Java stacks (the held objects' allocation stacks, Java methods with
their lines), its report section (what holds the heap, what allocates), caveats and a trail step
for the stop's pause. The probe itself is probes/jvm/probe.py; its plan probes/jvm/plan.py."""

from __future__ import annotations

from memdiag.system.target import Target
from memdiag.system.units import fmt_bytes, fmt_duration, fmt_rate

from ..face import Context, Face, FactDef, Option, Plan, Section, Stack, Stacks, TracingCost, TrailItem, pid_only
from .recording import Held
from .result import JfrResult

# The registry imports this face for every target, a native one too: the recorder (probe.py) and
# its price (plan.py) load when a JVM is asked about, not here. Measured, the JVM's two faces cost a
# native target's diagnosis 1.15 MiB resident with them imported here, 0.4 MiB without (and their
# models' deferred build, recording.py).


def run(target: Target, ctx: Context) -> JfrResult:
    from .probe import run as record

    return record(target, ctx)


def plan(target: Target, ctx: Context) -> Plan:
    from .plan import plan as price

    return price(target, ctx)


def rows(r, p, ctx):
    """A JVM probe's row; none at all for a target it was never asked about (a process that is no JVM)."""
    if r is None and p is None and ctx.row.reason == "no rule asked for it":
        return []
    return [ctx.row]


FACTS = (
    FactDef("jfr.plan", "string", "the recording's plan: full, over-budget, no-tool or refused", figure=False),
    FactDef("jfr.not_run", "string", "why no recording ran (the attach refused, over the budget, no jfr tool)"),
    FactDef("jfr.pays", "string", "the command whose budget or window pays for the recording (over the budget)"),
    FactDef("jfr.held_class", "string", "the class the JVM holds most of (old-object samples still reachable)"),
    FactDef("jfr.held_site", "string", "the Java method and line that allocated them (past the JDK's own frames)"),
    FactDef("jfr.held_anchor", "string", "what holds them: a static field (OrderService.retryQueue) or another root"),
    FactDef("jfr.held_detail", "string", "what the JVM said of the holder nearest the root (Size: 3037)"),
    FactDef("jfr.held_by", "string", "the anchor with what the JVM said of it: LruCache.cache (Size: 4000)"),
    FactDef("jfr.held_samples", "number", "its old-object samples still reachable at the stop"),
    FactDef("jfr.held_share", "percent", "their share of every reachable old-object sample"),
    FactDef(
        "jfr.held_kept", "percent", "of its class and site's samples that outlived a collection, the share still held"
    ),
    FactDef("jfr.held_oldest", "seconds", "the age of the oldest of them still held at the stop"),
    FactDef("jfr.held_span", "percent", "how far back into the recording the held samples go (100%: its start)"),
    FactDef(
        "jfr.held_size_first", "number", "the holder's entries at the first look (what the JVM says of a collection)"
    ),
    FactDef("jfr.held_size_last", "number", "the holder's entries at the stop"),
    FactDef(
        "jfr.held_grew",
        "bool",
        "the holder had more entries at the stop than at the first look (unknown: no size said)",
    ),
    FactDef("jfr.held_change", "string", "the holder's size at both looks in words, or which look said none and why"),
    FactDef("jfr.looks_apart", "seconds", "the time between the first look at the holders and the stop"),
    FactDef("jfr.alloc_class", "string", "the class allocated most, by the allocation samples' weight"),
    FactDef("jfr.alloc_site", "string", "the Java method and line that allocates it"),
    FactDef("jfr.alloc_rate", "bytes_per_s", "what the allocation samples stand for, per second of the recording"),
    FactDef("jfr.recorded", "seconds", "how long the recording ran"),
    FactDef("jfr.pause", "seconds", "the JVM's safepoint time while the recording stopped (the paths to GC roots)"),
    FactDef("jfr.unrooted", "number", "old-object samples no root reaches at the stop (garbage not yet freed)"),
)


def facts_of(r: JfrResult | None, p, _name) -> dict:
    f: dict = dict(p.facts) if p is not None else {}
    if r is None or r.status not in ("ok", "partial"):
        if r is not None:
            f["jfr.not_run"] = r.reason
        return f
    f.update({"jfr.recorded": r.recorded_s, "jfr.pause": r.stop_pause_s, "jfr.unrooted": r.unrooted})
    if not r.held:
        f["jfr.not_run"] = "the recording ran, and no sampled object was still reachable at its stop"
    if r.held:
        top = r.held[0]
        f.update(
            {
                "jfr.held_class": top.cls,
                "jfr.held_site": top.site,
                "jfr.held_anchor": top.anchor,
                "jfr.held_detail": top.holder_detail,
                "jfr.held_by": f"{top.anchor} ({top.holder_detail})" if top.holder_detail else top.anchor,
                "jfr.held_samples": top.samples,
                "jfr.held_share": top.share,
                "jfr.held_kept": top.kept_percent,
                "jfr.held_oldest": top.oldest_age_s,
                "jfr.held_span": top.span_percent,
            }
        )
        f.update(_sizes(r, top))
    if r.allocating:
        a = r.allocating[0]
        f.update({"jfr.alloc_class": a.cls, "jfr.alloc_site": a.site})
        f["jfr.alloc_rate"] = r.alloc_bytes / r.recorded_s if r.recorded_s else None
    return f


def _sizes(r: JfrResult, top: Held) -> dict:
    """The holder at both looks: its entries then and now, whether it grew, in words (and, where
    one look has no size, which one and why)."""
    apart = (r.stopped_at - r.looked_at) if r.looked_at and r.stopped_at else None
    f: dict = {"jfr.looks_apart": apart, "jfr.held_size_first": top.size_first, "jfr.held_size_last": top.size_last}
    last, first = top.size_last, top.size_first
    if last is None:
        f["jfr.held_change"] = "the JVM said no size of it at the stop"
        return f
    if not r.looked or apart is None:
        # under load the recording can stop (its budget, the window) before the look, or the dump fail
        why = "its dump failed" if r.looked_at else "the recording stopped before it"
        f["jfr.held_change"] = f"{last:,} entries at the stop; no first look to compare ({why})"
        return f
    if first is None:
        f["jfr.held_change"] = (
            f"{last:,} entries at the stop; none of its sampled objects were held at the first look, "
            f"{fmt_duration(apart)} earlier"
        )
        return f
    f["jfr.held_grew"] = last > first
    if last == first:
        f["jfr.held_change"] = f"{last:,} entries at both looks, {fmt_duration(apart)} apart"
    else:
        f["jfr.held_change"] = f"{last:,} entries, from {first:,} {fmt_duration(apart)} earlier"
    return f


def _allocated(r: JfrResult, h: Held) -> int:
    """What the allocation samples of the held group's class and site stand for."""
    return sum(a.bytes for a in r.allocating if a.cls == h.cls and a.site == h.site)


def stacks(r: JfrResult) -> list[Stack]:
    """The held groups' allocation stacks (Java frames), most samples first."""
    out = []
    for h in r.held:
        frames = [str(f) for f in h.frames]
        out.append(
            Stack(
                frames=frames,
                functions=[f.method for f in h.frames],
                bytes=_allocated(r, h),
                count=h.samples,
                pid=None,
                detail=f"{h.cls} allocated during the recording; {h.samples} sampled objects still held by {h.anchor}"
                f" ({h.let_go} let go), the oldest {fmt_duration(h.oldest_age_s)} old",
            )
        )
    return out


def _folded(r: JfrResult) -> list[str]:
    return [
        ";".join(reversed([f"{h.cls}", *(f.method for f in h.frames)])).replace(" ", "_") + f" {h.samples}"
        for h in r.held
    ]


def _culprit(r: JfrResult, kind: str) -> Stack | None:
    """A growth, cache or pressure verdict on a JVM rests on what its heap holds; a leak is native."""
    if kind not in ("growth", "cache", "pressure"):
        return None
    shown = stacks(r)
    return shown[0] if shown else None


def sections(r: JfrResult) -> list[Section]:
    if r.status not in ("ok", "partial"):
        return []
    lines = [
        f"flight recording of {fmt_duration(r.recorded_s)} ({r.tool}): {r.old_samples} old-object samples "
        f"({r.unrooted} reached from no root: garbage not yet freed), {r.alloc_samples} allocation samples standing "
        f"for {fmt_bytes(r.alloc_bytes)} ({fmt_rate(r.alloc_bytes / r.recorded_s if r.recorded_s else None)})",
        _cost_line(r),
    ]
    if r.direct_buffers is not None:
        lines.append(f"direct buffers in use: {fmt_bytes(r.direct_buffers)}")
    rows = [
        [
            h.cls,
            h.site or "unknown",
            h.anchor,
            _size_cell(h),
            f"{h.samples} ({h.share:.0f}%)",
            f"{h.kept_percent:.0f}%",
            fmt_duration(h.oldest_age_s),
            " <- ".join(h.chain),
        ]
        for h in r.held
    ]
    out = [
        Section(
            probe="jfr",
            title="Java heap: what holds it",
            lines=lines,
            header=[
                "class",
                "allocated at",
                "held by",
                "its entries (first look, stop)",
                "samples held",
                "kept",
                "oldest",
                "chain (object up to root)",
            ],
            rows=rows,
        )
    ]
    if r.allocating:
        per = r.recorded_s or 1.0
        out.append(
            Section(
                probe="jfr",
                title="Java heap: what allocates",
                header=["class", "allocated at", "bytes", "rate"],
                rows=[[a.cls, a.site or "unknown", fmt_bytes(a.bytes), fmt_rate(a.bytes / per)] for a in r.allocating],
            )
        )
    return out


def _cpu(seconds: float | None) -> str:
    """A CPU time as the kernel's clock gives it: in ticks of 10 ms (USER_HZ 100), never "0 s"."""
    if seconds is not None and seconds < 0.01:
        return "under 10 ms (a tick of the CPU clock)"
    return fmt_duration(seconds)


def _size_cell(h: Held) -> str:
    if h.size_first is None and h.size_last is None:
        return "not said"
    return f"{h.size_first if h.size_first is not None else '?'}, {h.size_last if h.size_last is not None else '?'}"


def _cost_line(r: JfrResult) -> str:
    start = "its first start in this JVM" if r.cold_start else "its start"
    above = "above their rate before" if r.app_rates else "all of it (no rate before was measured)"
    parts = [
        f"cost to the application: {(r.measured_ns or 0) / 1e6:.0f} ms (its threads waited "
        f"{(r.app_wait_ns or 0) / 1e6:.0f} ms for a CPU, {above}, and the JVM stood in safepoints "
        f"{(r.app_pause_ns or 0) / 1e6:.0f} ms for the start, the first look and the stop); "
        f"beside it, the JVM's threads doing the recording's work used {_cpu(r.start_cpu_s)} of CPU for {start}, "
        f"{_cpu(r.record_cpu_s)} recording, {_cpu(r.stop_cpu_s)} to stop (the process's CPU above its rate "
        f"before, {_cpu((r.process_ns or 0) / 1e9)})"
    ]
    if r.stop_pause_s is not None:
        parts.append(
            f"the stop paused it {fmt_duration(r.stop_pause_s)} (safepoints; paths to GC roots within {r.cutoff_ms} ms)"
        )
    if r.read_cpu_s is not None:
        parts.append(
            f"memdiag's own, not the target's: its jfr tool (a JVM of its own) read the recording in "
            f"{_cpu(r.read_cpu_s)} of CPU after the stop; where every CPU is busy the application waits for that too"
        )
    return "; ".join(parts)


def measured(r: JfrResult) -> TracingCost | None:
    if r.measured_ns is None:
        return None
    # no probes_ns: there is no trap to count (the report's "hits x trap cost" is memleak's measure)
    above = "above its rate before" if r.app_rates else "all of it, no rate before measured (an upper bound)"
    what = f"what the application paid (its threads' wait for a CPU, {above}, and the JVM's safepoints for memdiag)"
    return TracingCost(attached_s=r.duration_s, cpu_ns=r.process_ns, measured_ns=r.measured_ns, measure=what)


def caveats(r: JfrResult) -> list[str]:
    out = []
    if r.listener_started:
        from .attach import LISTENER_STARTED

        out.append(f"{LISTENER_STARTED}; the recording is stopped and its files removed")
    if r.cold_start and r.status in ("ok", "partial"):
        out.append(
            "JFR's own threads (JFR Recorder Thread, JFR Periodic Tasks) stay in the JVM, idle, once JFR has started"
        )
    return out + r.notes


def trail(r: JfrResult) -> list[TrailItem]:
    """The recording's two looks at the heap: each a safepoint that searched paths to GC roots."""
    steps = []
    if r.look_pause_s is not None:
        steps.append(f"first look (JFR.dump): the old objects' paths to GC roots in {fmt_duration(r.look_pause_s)}")
    if r.stop_pause_s is not None:
        steps.append(
            f"JFR.stop: the JVM wrote the recording and searched the old objects' paths to GC roots (cutoff "
            f"{r.cutoff_ms} ms) in {fmt_duration(r.stop_pause_s)} of safepoints"
        )
    return [TrailItem(kind="scan", name="jfr", state="ran", reason=step) for step in steps]


def describe(r: JfrResult, top: int) -> list[str]:
    lines = [f"  {line}" for s in sections(r) for line in s.lines]
    for h in r.held[:top]:
        lines.append(f"  {h.cls} allocated at {h.site}: {h.samples} held by {h.anchor} ({h.kept_percent:.0f}% kept)")
        lines += [f"      {f}" for f in h.frames[:6]]
        lines.append(f"      chain: {' <- '.join(h.chain)}")
    return lines


FACE = Face(
    name="jfr",
    summary="a JVM's flight recording: the held objects' allocation stacks (one process)",
    needs=pid_only("records one JVM: give -p PID"),
    run=run,
    result=JfrResult,
    describe=describe,
    facts=FACTS,
    facts_of=facts_of,
    rows=rows,
    # bytes: what the site's allocation samples stand for; count: its sampled objects still held
    stacks=Stacks(
        kind="allocations",
        shown=3,
        of=stacks,
        folded=_folded,
        culprit=_culprit,
        space="alloc_space",
        counted="held_samples",
        folded_by="count",
    ),
    caveats=caveats,
    sections=sections,
    trail=trail,
    measured=measured,
    on_target=True,
    plan=plan,
    planning="pricing the flight recording",
    options=(
        Option(
            "--budget-ms",
            "milliseconds",
            "what the application may pay for the recording: its threads' wait for a CPU and the JVM's "
            "safepoints (default: 2%% of --duration)",
        ),
    ),
)
