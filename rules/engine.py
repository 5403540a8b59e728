"""Evaluate rules against facts. Three-valued: a condition over a fact nobody could measure is
neither true nor false, and the rule is `skipped` with the missing facts named. Outcomes are a
closed set — fired, not-fired, skipped, error — each with its evidence; one broken rule never
stops the others."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from memdiag.system._parse import Model
from memdiag.system.units import format_quantity
from pydantic import ConfigDict

from .catalog import FACTS
from .model import BECAUSE, TEMPLATE, AllOf, AnyOf, Comparison, Condition, NotOf, Present, Rule, VerdictAction

State = Literal["fired", "not-fired", "skipped", "error"]


class Outcome(Model):
    model_config = ConfigDict(frozen=True)

    rule: str
    source: str
    state: State
    reason: str  # why: the facts and values that decided, what was missing, or the error
    evidence: dict[str, str] = {}


def _cmp(op: str, a, b) -> bool:
    return {
        ">": lambda: a > b,
        ">=": lambda: a >= b,
        "<": lambda: a < b,
        "<=": lambda: a <= b,
        "==": lambda: a == b,
        "!=": lambda: a != b,
    }[op]()


def evaluate(cond: Condition, facts: dict, used: dict[str, object], missing: set[str]) -> bool | None:
    """True, False, or None when it depends on a missing fact."""
    if isinstance(cond, Comparison):
        value = facts.get(cond.fact)
        used[cond.fact] = value
        if value is None:
            missing.add(cond.fact)
            return None
        return _cmp(cond.op, value, cond.value)
    if isinstance(cond, Present):
        used[cond.present] = facts.get(cond.present)
        return facts.get(cond.present) is not None
    if isinstance(cond, NotOf):
        inner = evaluate(cond.not_, facts, used, missing)
        return None if inner is None else not inner
    parts = [evaluate(c, facts, used, missing) for c in (cond.all if isinstance(cond, AllOf) else cond.any)]
    if isinstance(cond, AllOf):
        if any(p is False for p in parts):
            return False
        return None if any(p is None for p in parts) else True
    if isinstance(cond, AnyOf):
        if any(p is True for p in parts):
            return True
        return None if any(p is None for p in parts) else False
    raise TypeError(cond)


def show(name: str, facts: dict) -> str:
    return format_quantity(facts.get(name), FACTS[name].kind)


def render(text: str, facts: dict, because: str | None = None) -> str:
    """A template with {fact} placeholders, each shown in its unit, in one pass (a value that
    itself holds braces, a process named `{x}`, is never substituted again); a verdict's summary
    may also quote {because} (see because_of)."""

    def one(m: re.Match) -> str:
        name = m.group(1)
        return because if name == BECAUSE and because is not None else show(name, facts)

    return TEMPLATE.sub(one, text)


def because_of(verdict: VerdictAction, findings: dict[str, str], evidence: str) -> str:
    """The findings of the verdict's `because` rules that fired (findings: rule id -> rendered
    text), in the order the verdict lists them; when none of them fired (a site rule whose own
    condition is not one of theirs), the facts that decided the verdict's own rule (evidence)."""
    quoted = [findings[name] for name in verdict.because if name in findings]
    return "; ".join(quoted) if quoted else evidence


def run_rule(rule: Rule, facts: dict) -> Outcome:
    used: dict[str, object] = {}
    missing: set[str] = set()
    try:
        result = evaluate(rule.when, facts, used, missing)
    except Exception as e:  # a rule must never abort the diagnosis
        return Outcome(rule=rule.id, source=rule.source, state="error", reason=f"{type(e).__name__}: {e}")
    evidence = {name: show(name, facts) for name in used}
    if result is None:
        return Outcome(
            rule=rule.id,
            source=rule.source,
            state="skipped",
            reason="missing " + ", ".join(sorted(missing)),
            evidence=evidence,
        )
    shown = ", ".join(f"{k} = {v}" for k, v in evidence.items())
    return Outcome(
        rule=rule.id, source=rule.source, state="fired" if result else "not-fired", reason=shown, evidence=evidence
    )


def run_rules(rules: list[Rule], facts: dict) -> list[tuple[Rule, Outcome]]:
    return [(rule, run_rule(rule, facts)) for rule in rules]


def advice_of(fired: list[Rule], facts: dict) -> list[str]:
    """The next steps of the fired rules, in rule order, each key once (see model.Advice)."""
    steps: dict[str, str] = {}
    for rule in fired:
        for key, text in rule.then.advice_items(rule.id):
            steps.setdefault(key, render(text, facts))
    return list(steps.values())


@dataclass(frozen=True)
class Conclusion:
    """What the fired rules say together: the winning verdict rule (None when no verdict rule
    fired), its rendered summary, every fired finding (rule id, text) and the next steps."""

    winner: Rule | None
    summary: str | None
    findings: list[tuple[str, str]]
    advice: list[str]
    because: list[str]  # the winner's `because` rules that fired: those its summary quotes
    finding_keys: dict[str, str] = field(default_factory=dict)  # rule id -> its finding's key (Then.finding_key)


def winner_of(outcomes: list[tuple[Rule, Outcome]]) -> Rule | None:
    """The fired verdict rule of the highest priority: the one that concludes."""
    verdicts = [r for r, o in outcomes if o.state == "fired" and r.then.verdict is not None]
    return max(verdicts, key=lambda r: r.then.verdict.priority) if verdicts else None  # type: ignore[union-attr]


def conclude(outcomes: list[tuple[Rule, Outcome]], facts: dict) -> Conclusion:
    fired = [rule for rule, o in outcomes if o.state == "fired"]
    findings = [(r.id, render(r.then.finding, facts)) for r in fired if r.then.finding]
    best = winner_of(outcomes)
    action = best.then.verdict if best is not None else None
    decided = next((o.reason for r, o in outcomes if r is best), "")
    summary = render(action.summary, facts, because_of(action, dict(findings), decided)) if action else None
    quoted = [name for name in action.because if name in dict(findings)] if action else []
    keys = {r.id: r.then.finding_key(r.id) for r in fired if r.then.finding}
    return Conclusion(best, summary, findings, advice_of(fired, facts), quoted, keys)
