"""The Report of one diagnosis, assembled from what the engine returned (EngineResult): the probe
table in the registry's order with each probe's own rows, the stacks, the probes' sections, the
overhead section, findings, next steps, caveats. Every probe is read through its face."""

from __future__ import annotations

from memdiag.probes.face import Face, Plan, ProbeStatus, Section, percent_of_window
from memdiag.probes.registry import REGISTRY
from memdiag.probes.runtime import Frames
from memdiag.system.target import Target

from .culprit import Classes, language_of, split_frame
from .factset import probe_figures
from .observe import Observation
from .report import Finding, Overhead, Report, StackReport, TargetInfo, Window
from .verdict import EngineResult
from .version import memdiag_version


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


def _spent_rows(plans: dict[str, Plan], window_s: float) -> list[ProbeStatus]:
    """Steps that cost the target before any probe ran (the rate count a plan made)."""
    return [
        ProbeStatus(
            name=s.step,
            status="ok",
            reason=s.reason,
            method=s.method,
            duration_s=s.seconds,
            events=s.events,
            overhead_percent=percent_of_window(s.ns, window_s),
            on_target=True,
        )
        for plan in plans.values()
        for s in plan.spent
    ]


def _how(face: Face) -> dict:
    """What a probe's row says of it beyond its run: no BPF (reads), a host-wide program, its stacks' kind."""
    spec = REGISTRY.spec(face.name)
    kind = face.stacks.kind if face.stacks is not None else None
    return {"reads": not spec.bpf, "host_wide": spec.host_wide, "stacks": kind}


def _probe_rows(result: EngineResult, window_s: float) -> list[ProbeStatus]:
    """Each probe's rows, in the registry's order, run or not (and why not)."""
    figures = probe_figures(result.facts)
    rows: list[ProbeStatus] = []
    for face in REGISTRY.faces():
        asked = [t for t in result.trail if t.kind == "probe" and t.name == face.name]
        why = asked[-1].reason if asked else "no rule asked for it"
        r, plan = result.results.get(face.name), result.plans.get(face.name)
        how = _how(face)  # the report carries what its readers say of the probe: its cost's measure, its stacks
        rows += [
            row.model_copy(update=how) if row.name == face.name else row
            for row in face.table(r, plan, window_s, figures, why)
        ]
    return rows


def _stacks(result: EngineResult, classes: Classes) -> tuple[list[StackReport], list[str], str | None]:
    """The stacks the report shows, allocation stacks first; the flame graph's folded lines from
    the first probe that has any (memleak's outstanding bytes, else pages faulted in), and its name."""
    out: list[StackReport] = []
    folded: list[str] = []
    folded_probe: str | None = None
    for face in REGISTRY.stack_faces():
        r = result.results.get(face.name)
        shown = face.stacks.of(r) if r is not None and face.stacks is not None else []
        if not shown:
            continue
        for s in shown[: face.stacks.shown]:  # type: ignore[union-attr]
            out.append(
                StackReport(
                    probe=face.name,
                    frames=s.frames,
                    bytes=s.bytes,
                    count=s.count,
                    series=s.series,
                    series_s=s.series_s,
                    detail=s.detail,
                    reach=s.reach,
                    frame_kinds=classes.name(s.frames, s.forwards or None).kinds,
                )
            )
        if not folded:
            folded = face.stacks.folded(r)  # type: ignore[union-attr]
            folded_probe = face.name if folded else None
    return out, folded, folded_probe


def _ran(result: EngineResult) -> list[tuple[Face, object]]:
    """(face, result) of each probe that ran, in the registry's order."""
    return [(face, result.results[face.name]) for face in REGISTRY.faces() if face.name in result.results]


def assemble(result: EngineResult, budget_percent: float) -> Report:
    """The Report: the window, the verdict, the probe table, stacks, overhead and the trail."""
    obs, tri = result.observation, result.triage
    window_s = max(obs.ended - obs.started, 1e-9)
    probes = _spent_rows(result.plans, window_s) + _probe_rows(result, window_s)
    stacks, folded, folded_probe = _stacks(result, result.classes)
    ran = _ran(result)
    reasons = [p.reason for p in result.plans.values()]
    return Report(
        memdiag_version=memdiag_version(),
        target=target_info(obs.target, result.facts),
        window=Window(
            started=obs.started,
            ended=obs.ended,
            requested_s=obs.requested_s,
            samples=len(obs.snapshots),
            target_exited_at=obs.exited_at,
            target_pid_reused=obs.pid_reused,
            target_execd_at=obs.execd_at,
            target_exec=obs.exec_exe,
            thinned=obs.thinned,
            thinned_before_s=obs.thinned_before_s,
        ),
        verdict=result.verdict,
        interrupted=result.interruption,
        findings=_findings(result),
        next_steps=result.advice,  # the playbook's, each key once (rules.engine.advice_of)
        caveats=tri.caveats + _stack_caveats(stacks) + [c for face, r in ran for c in face.caveats(r)],
        probes=probes,
        overhead=_overhead(budget_percent, result, probes, window_s),
        budget_decision="; ".join(reasons) if reasons else None,
        trail=result.trail,
        stacks=stacks,
        sections=_runtime_sections(obs) + [s for face, r in ran for s in face.sections(r)],
        folded=folded,
        folded_probe=folded_probe,
        counters=result.counters,
        cycles=result.cycles,
        interim=result.interim,
    )


def _findings(result: EngineResult) -> list[Finding]:
    """The counters' findings, then the playbook's, one per key: a rule whose finding is one of
    the counters' readings (rss-climbing: "{summary.growth}") is keyed by that fact, which the
    triage finding that states it (with the series as evidence) has said already."""
    findings = list(result.triage.findings)
    said = {result.triage.keys.get(f.id, f.id) for f in findings}
    keys = result.finding_keys
    return findings + [
        Finding(id=rule, summary=text) for rule, text in result.findings if text and keys.get(rule, rule) not in said
    ]


def _overhead(budget: float, result: EngineResult, probes: list[ProbeStatus], window_s: float) -> Overhead:
    """The Overhead section: the plans' own estimate, and the sum of the probe table's overhead
    column (each row measured on the target), with what the probes measured two ways apart."""
    rows = [p.overhead_percent for p in probes if p.overhead_percent is not None]
    estimate = next((p for p in result.plans.values() if p.estimate_of is not None), None)
    ran = [(face.name, m) for face, r in _ran(result) if (m := face.measured(r)) is not None]
    otherwise = [
        (name, m.measure, percent_of_window(m.measured_ns or 0.0, window_s), percent_of_window(m.cpu_ns, window_s))
        for name, m in ran
        if m.measure is not None
    ]
    measured = [m for _name, m in ran if m.measure is None]
    probes_ns = [m.probes_ns for m in measured if m.probes_ns is not None]
    cpu_ns = [m.cpu_ns for m in measured if m.cpu_ns is not None]
    return Overhead(
        budget_percent=budget,
        estimated_percent=estimate.estimated_percent if estimate else None,
        estimate_of=estimate.estimate_of if estimate else None,
        measured_percent=sum(rows) if rows else None,
        tracing_probes_percent=percent_of_window(sum(probes_ns), window_s) if probes_ns else None,
        tracing_cpu_percent=percent_of_window(sum(cpu_ns), window_s) if cpu_ns else None,
        window_s=window_s,
        measured_otherwise=otherwise,
    )


def _runtime_sections(obs: Observation) -> list[Section]:
    """The sections of the target's runtime's own counters (its face's), before any probe's."""
    face = obs.runtime_face()
    return face.sections(obs.runtime_samples()) if face is not None else []


def _perf_maps() -> str:
    """How each runtime that compiles code at run time has its perf map written (its face's words)."""
    return "; ".join(face.perf_map for face in REGISTRY.runtime_faces() if face.perf_map)


def _stack_caveats(stacks: list[StackReport]) -> list[str]:
    jit = native = 0
    # [unknown] frames of stacks whose frames of a runtime's language were read, by language and module
    interpreted: dict[Frames, dict[str, int]] = {}
    for s in stacks:
        split = [split_frame(f) for f in s.frames]
        lang = next((language_of(mod) for fn, mod in split if fn is not None and language_of(mod)), None)
        for frame, (_fn, mod) in zip(s.frames, split, strict=True):
            if not frame.startswith("[unknown]"):
                continue
            # "[unknown] [[anon]]": code in anonymous executable memory, which only a JIT writes (V8,
            # HotSpot): no build flag or debug package names it, the runtime's perf map does
            if frame.startswith("[unknown] [[anon"):
                jit += 1
            elif lang and mod is not None and (mod in lang.modules or lang.interpreter.match(mod)):
                counts = interpreted.setdefault(lang, {})
                counts[mod] = counts.get(mod, 0) + 1
            else:
                native += 1
    out = []
    if jit:
        out.append(
            f"{jit} stack frame(s) are [unknown] in anonymous executable memory: code a JIT compiler generated "
            f"at run time, which no symbol table names; the runtime's perf map does ({_perf_maps()})"
        )
    for lang, counts in interpreted.items():
        where = ", ".join(f"{n} in {mod}" for mod, n in sorted(counts.items()))
        out.append(
            f"{sum(counts.values())} frame(s) of stacks whose {lang.language} frames were read are [unknown] "
            f"({where}): {lang.unnamed(counts)}"
        )
    if native:
        out.append(
            f"{native} stack frame(s) are [unknown]: frames without symbols or frame pointers; build "
            "with -fno-omit-frame-pointer and install debug info (-dbg/-dbgsym packages) to name them"
        )
    return out
