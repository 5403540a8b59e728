"""The Report of one diagnosis, assembled from what the engine returned (EngineResult): the probe
table in the registry's order, the stacks, the overhead section, findings, next steps, caveats."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from memdiag.probes.base import ProbeResult
from memdiag.probes.registry import REGISTRY
from memdiag.system.units import fmt_number

from .culprit import Classes
from .engine import BudgetDecision, EngineResult
from .factset import probe_figures
from .report import Finding, Overhead, ProbeStatus, Report, StackReport, TargetInfo, Window
from .target import Target


def memdiag_version() -> str:
    try:
        return version("memdiag")
    except PackageNotFoundError:
        return "unknown"


def target_info(target: Target, facts: dict | None = None) -> TargetInfo:
    facts = facts or {}
    return TargetInfo(
        kind=target.kind,
        description=target.describe(),
        pid=target.pid,
        comm=target.comm,
        cmdline=target.cmdline,
        cgroup=target.cgroup.path if target.cgroup else None,
        cgroup_version=target.cgroup.version if target.cgroup else None,
        container=target.container,
        pod=target.pod,
        runtime=facts.get("target.runtime"),
        runtime_detail=facts.get("target.runtime_detail"),
    )


def _percent(ns: float | None, window_s: float) -> float | None:
    """The target's time (ns) as a share of the window; None stays None (not measured)."""
    return None if ns is None else 100 * ns / (window_s * 1e9)


def _overhead_percent(r: ProbeResult, window_s: float) -> float | None:
    """What a probe cost the target over the whole window: for memleak, as measured on the target
    while it ran (probes/overhead.py); for the others, their BPF run time (tracepoints trap nothing)."""
    if window_s <= 0:
        return None
    tracing = getattr(r, "tracing_cost", None)
    if tracing is not None and tracing.measured_ns is not None:
        return tracing.percent_of(window_s)
    if r.cost.events == 0 and not r.cost.bpf_run_ns:
        return 0.0 if r.status in ("ok", "partial") else None
    if r.cost.bpf_run_ns is None:
        return None  # the kernel kept no run time: unknown, not free
    return _percent(r.cost.bpf_run_ns, window_s)


def _one_off_rows(
    one_offs: list[tuple[str, float, float, int]], counted: set[str], window_s: float
) -> list[ProbeStatus]:
    """Steps that cost the target before any probe ran (the rate count that prices memleak)."""
    return [
        ProbeStatus(
            name=step,
            status="ok",
            reason=f"counted calls to {', '.join(sorted(counted))} to price allocation tracing",
            method="one uprobe per entry point, each count stopped after ~1,000 calls or 0.25 s",
            duration_s=seconds,
            events=events,
            overhead_percent=_percent(ns, window_s),
        )
        for step, seconds, ns, events in one_offs
    ]


def _scan_status(ml: ProbeResult | None, window_s: float) -> ProbeStatus | None:
    """The reachability scan as a row of the probe table: its cost is the pause it caused."""
    scan = getattr(ml, "reach_scan", None)
    if scan is None:
        return None
    ran = scan.status == "ran"
    return ProbeStatus(
        name="reach",
        status="ok" if ran else ("not-run" if scan.status == "skipped" else "error"),
        reason=scan.describe(),
        method="all threads stopped (ptrace), writable memory read and matched against memleak's blocks",
        duration_s=(scan.paused_ms or 0) / 1000,
        events=scan.blocks,
        overhead_percent=100 * scan.paused_ms / 1000 / window_s if scan.paused_ms is not None else None,
    )


def _stacks(results: dict[str, ProbeResult], classes: Classes) -> tuple[list[StackReport], list[str]]:
    out: list[StackReport] = []
    folded: list[str] = []
    ml = results.get("memleak")
    if ml is not None and getattr(ml, "stacks", None):
        for s in ml.stacks[:5]:
            out.append(
                StackReport(
                    probe="memleak",
                    frames=s.frames,
                    bytes=s.outstanding_bytes,
                    series=s.series,
                    detail=f"{fmt_number(s.outstanding_count)} allocations outstanding, "
                    f"{fmt_number(s.allocs)} allocs, {fmt_number(s.frees)} frees",
                    reach=s.reach,
                    frame_kinds=classes.name(s.frames, s.forwards).kinds,
                )
            )
        folded = ml.folded
    for spec in REGISTRY.event_stacks():
        name, what = spec.name, spec.stack_events
        r = results.get(name)
        if r is None or not getattr(r, "stacks", None):
            continue
        for s in r.stacks[:3]:
            out.append(
                StackReport(
                    probe=name,
                    frames=s.frames,
                    bytes=s.bytes,
                    detail=f"{fmt_number(s.count)} {what}",
                    frame_kinds=classes.name(s.frames).kinds,
                )
            )
        if not folded:
            folded = r.folded  # faults: pages actually touched, the classic memory-growth flame graph
    return out, folded


def assemble(result: EngineResult, budget_percent: float) -> Report:
    """The Report: the window, the verdict, the probe table, stacks, overhead and the trail."""
    obs, tri = result.observation, result.triage
    window_s = max(obs.ended - obs.started, 1e-9)
    d = result.budget_decision
    probes = _one_off_rows(result.one_offs, result.counted, window_s) + _probe_rows(result, window_s)
    stacks, folded = _stacks(result.results, result.classes)
    findings = list(tri.findings)
    said = {f.summary for f in findings}
    # id: the rule's; a rule that quotes a counters' sentence (rss-climbing: {summary.growth}) adds
    # nothing the triage finding, which carries the series as evidence, has not said
    findings += [Finding(id=rule, summary=text) for rule, text in result.findings if text and text not in said]
    return Report(
        memdiag_version=memdiag_version(),
        target=target_info(obs.target, result.facts),
        window=Window(
            started=obs.started,
            ended=obs.ended,
            requested_s=obs.requested_s,
            samples=len(obs.snapshots),
            target_exited_at=obs.exited_at,
        ),
        verdict=result.verdict,
        interrupted=result.interruption,
        findings=findings,
        next_steps=result.advice,  # the playbook's, each key once (rules.engine.advice_of)
        caveats=tri.caveats + _stack_caveats(stacks) + _scan_caveats(result.results.get("memleak")),
        probes=probes,
        overhead=_overhead(budget_percent, d, probes, result.results.get("memleak"), window_s),
        budget_decision=d.reason if d else None,
        trail=result.trail,
        stacks=stacks,
        folded=folded,
        counters=result.counters,
    )


def _probe_rows(result: EngineResult, window_s: float) -> list[ProbeStatus]:
    """A row per probe of the registry, run or not (and why not), the reach scan after memleak."""
    figures = probe_figures(result.facts)
    d = result.budget_decision
    probes = []
    for name in REGISTRY.names:
        r = result.results.get(name)
        if r is None:
            asked = [t for t in result.trail if t.kind == "probe" and t.name == name]
            why = asked[-1].reason if asked else "no rule asked for it"
            if name == "memleak" and d is not None and d.choice != "full":
                why = f"not attached: {d.reason}"
            probes.append(ProbeStatus(name=name, status="not-run", reason=why))
            continue
        probes.append(
            ProbeStatus(
                name=name,
                status=r.status,
                reason=_reason(r),
                method=r.method,
                duration_s=r.duration_s,
                events=r.cost.events,
                overhead_percent=_overhead_percent(r, window_s),
                map_bytes=r.cost.map_bytes,
                lost={k: v for k, v in r.lost.items() if v},
                figures=figures.get(name, {}),
            )
        )
    scan_row = _scan_status(result.results.get("memleak"), window_s)
    if scan_row is not None:
        scan_row = scan_row.model_copy(update={"figures": figures.get("reach", {})})
        probes.insert(next(i for i, p in enumerate(probes) if p.name == "memleak") + 1, scan_row)
    return probes


def _overhead(
    budget: float, d: BudgetDecision | None, probes: list[ProbeStatus], ml: ProbeResult | None, window_s: float
) -> Overhead:
    """The Overhead section: the budget decision's own estimate, and the sum of the probe table's
    overhead column (each row measured on the target), with memleak's two measurements apart."""
    rows = [p.overhead_percent for p in probes if p.overhead_percent is not None]
    tracing = getattr(ml, "tracing_cost", None)

    return Overhead(
        budget_percent=budget,
        estimated_percent=d.estimated_percent if d else None,
        estimate_of=None
        if d is None
        else ("allocation tracing" if d.choice == "full" else "allocation tracing, not attached"),
        measured_percent=sum(rows) if rows else None,
        tracing_probes_percent=_percent(tracing.probes_ns, window_s) if tracing else None,
        tracing_cpu_percent=_percent(tracing.cpu_ns, window_s) if tracing else None,
        window_s=window_s,
    )


def _reason(r: ProbeResult) -> str:
    """The probe's reason; "see lost" only where the lost figures are (the probe table's column)."""
    reason = r.reason or "ran"
    return reason if any(r.lost.values()) else reason.replace(" (see lost)", "")


def _scan_caveats(ml: ProbeResult | None) -> list[str]:
    scan = getattr(ml, "reach_scan", None)
    if scan is None or scan.status != "ran":
        return []
    return [
        f"Leaked versus anchored is conservative: the roots were {scan.roots}. Blocks whose only pointer "
        "is held by the kernel or stored encoded would look leaked; frees memleak does not hook (a custom "
        "allocator's own free) make freed blocks look leaked."
    ]


def _stack_caveats(stacks: list[StackReport]) -> list[str]:
    unknown = sum(f.startswith("[unknown]") for s in stacks for f in s.frames)
    if not unknown:
        return []
    return [
        f"{unknown} stack frame(s) are [unknown]: frames without symbols or frame pointers; build with "
        "-fno-omit-frame-pointer and install debug info (-dbg/-dbgsym packages) to name them"
    ]
