"""The verdict of a diagnosis: the playbook's conclusion on the facts, with its culprit (the
process or cgroup, and the stack it rests on, named past allocators and wrappers), the same
verdict said to be partial when a signal cut the diagnosis short, and EngineResult: everything a
diagnosis gathered and concluded, which the Report is assembled from."""

from __future__ import annotations

from memdiag.probes.face import Plan, ProbeResult, Stack, TrailItem
from memdiag.probes.registry import REGISTRY
from memdiag.rules.engine import Conclusion, Outcome, conclude, winner_of
from memdiag.rules.model import Rule
from memdiag.system._parse import Model
from memdiag.system.signals import INTERRUPTION
from memdiag.system.target import Target
from memdiag.system.units import fmt_duration
from pydantic import ConfigDict

from .culprit import Classes
from .observe import Observation
from .report import Counters, Culprit, CycleRecord, Interrupted, Verdict
from .triage import Triage

PARTIAL_CONFIDENCE = 0.5  # at most this sure of a verdict a signal cut short


class EngineResult(Model):
    """What one diagnosis gathered and concluded: everything the Report is assembled from."""

    model_config = ConfigDict(arbitrary_types_allowed=True, frozen=True)

    observation: Observation
    counters: Counters
    triage: Triage
    facts: dict
    verdict: Verdict
    findings: list[tuple[str, str]]  # the playbook's findings: (rule id, rendered text)
    finding_keys: dict[str, str] = {}  # rule id -> its finding's key (the fact it states, else the rule)
    advice: list[str]  # the playbook's advice, rendered
    results: dict[str, ProbeResult]  # by probe name, the probes that ran
    plans: dict[str, Plan] = {}  # by probe name, the plans probes made before they ran (or not)
    trail: list[TrailItem]
    interruption: Interrupted | None = None  # a signal ended the diagnosis early
    classes: Classes  # the frame classes the culprit was named with
    cycles: list[CycleRecord] = []  # a long window's cycles, each as it was recorded
    interim: str | None = None  # the window still runs: how far it is ("cycle 3 of 24")


def verdict_of(
    outcomes: list[tuple[Rule, Outcome]],
    facts: dict,
    target: Target,
    tri: Triage,
    results: dict[str, ProbeResult],
    classes: Classes,
) -> tuple[Conclusion, Verdict]:
    """What the fired rules say (findings, next steps), and the verdict of the highest-priority one."""
    c = conclude(outcomes, facts)
    action = c.winner.then.verdict if c.winner is not None else None
    kind = action.kind if action is not None else "inconclusive"
    culprit = culprit_of(kind, target, tri, results, classes)
    if action is None or c.summary is None:  # a playbook without a floor (the shipped one has `no-conclusion`)
        return c, Verdict(kind="inconclusive", summary="no playbook rule concluded", confidence=0.0, culprit=culprit)
    verdict = Verdict(
        kind=action.kind,
        summary=c.summary,
        confidence=action.confidence,
        culprit=culprit,
        rule=c.winner.id if c.winner else None,
        because=c.because,
    )
    return c, verdict


def culprit_of(kind: str, target: Target, tri: Triage, results: dict[str, ProbeResult], classes: Classes) -> Culprit:
    """Who: the OOM kill's victim, a cgroup's grower, else the target; and the stack the verdict
    rests on, with its first frame worth reading. A healthy verdict names none: nothing is to blame
    (a report once said "Culprit: PID 500" under "stable at 100 MiB")."""
    if kind == "healthy":
        return Culprit()
    base = Culprit(pid=target.pid, comm=target.comm, cgroup=target.cgroup.path if target.cgroup else None)
    if kind == "oom" and "oom" in tri.culprits:
        return tri.culprits["oom"]
    if "growth" in tri.culprits and target.kind != "pid":
        base = tri.culprits["growth"]
    stack = stack_for(kind, results)
    if stack is None:
        return base
    named = classes.name(stack.frames, stack.forwards or None)
    return base.model_copy(
        update={
            "stack": stack.frames,
            "function": named.function,
            "source": named.source,
            "clone": named.clone,
            "frame_kinds": named.kinds,
            "guessed": named.guessed,
        }
    )


def stack_for(kind: str, results: dict[str, ProbeResult]) -> Stack | None:
    """The stack the verdict rests on: allocation stacks before event stacks, each probe's own
    choice for this kind of verdict (memleak: the stack nothing points at, for a leak); a stack
    whose frames only sample the paths it stands for (Stack.sampled) gives way to the next probe's."""
    sampled = None
    for face in REGISTRY.stack_faces():
        r = results.get(face.name)
        if r is not None and face.stacks is not None:
            stack = face.stacks.culprit_of(r, kind)
            if stack is not None and not stack.sampled:
                return stack
            sampled = sampled or stack
    return sampled


def rule_steps(outcomes: list[tuple[Rule, Outcome]], at_s: float) -> list[TrailItem]:
    """Every rule's outcome for the trail; a verdict rule that fired and did not conclude says which did."""
    best = winner_of(outcomes)
    steps = []
    for rule, o in outcomes:
        reason = o.reason
        if best is not None and rule is not best and o.state == "fired" and rule.then.verdict is not None:
            reason = f"{reason}; outranked by {best.id}" if reason else f"outranked by {best.id}"
        steps.append(TrailItem(kind="rule", name=rule.id, state=o.state, reason=reason, source=rule.source, at_s=at_s))
    return steps


def partial_verdict(verdict: Verdict, cut: Interrupted) -> Verdict:
    """The verdict a signal cut short: said to be partial, its confidence halved (at most 50%)."""
    return verdict.model_copy(
        update={
            "summary": f"PARTIAL: interrupted by {cut.signal} during {cut.phase}, so not everything was "
            f"gathered; from what was: {verdict.summary}",
            "confidence": round(min(verdict.confidence / 2, PARTIAL_CONFIDENCE), 2),
        }
    )


def interruption(
    obs: Observation,
    window_s: float,
    results: dict[str, ProbeResult],
    trail: list[TrailItem],
    rules_cut: bool,
    at_s: float,
) -> Interrupted:
    """What the signal cost the diagnosis: where it came and what was not gathered."""
    missing = []
    seen = obs.ended - obs.started
    if seen < window_s - 0.5:
        missing.append(f"the counters after {fmt_duration(seen)} of the {fmt_duration(window_s)} window")
    for name, r in results.items():
        if r.interrupted:
            missing.append(f"{name}: stopped after {fmt_duration(r.duration_s)} of its time")
        missing += REGISTRY.face(name).missed(r)
    missing += [f"{t.name}: not run" for t in trail if t.kind == "probe" and "interrupted the" in t.reason]
    if rules_cut:
        missing.append("any probe the rules would have asked for later")
    return Interrupted(
        signal=INTERRUPTION.signal_name,
        phase=INTERRUPTION.phase or "unknown",
        at_s=round(at_s, 2),
        not_gathered=missing,
    )
