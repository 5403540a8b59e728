"""The rule file format, as strict data: unknown keys are refused, facts are resolved against the
catalog and literals checked against the fact's unit when the file is loaded.

A playbook file:

    rules:
      - id: rss-climbing                     # unique across every loaded file
        description: RSS still climbing
        when: process.rss_rate > 256KiB/s    # or {all: [...]}, {any: [...]}, {not: ...}, {present: fact}
        then:
          finding: RSS grows {process.rss_rate}
          probes: [{name: faults, duration: 10s}]
          verdict: {kind: growth, summary: "...", confidence: 0.6, priority: 20}
          advice: ["...", {key: find-growth, text: "..."}]   # a key: the step once, whichever rules give it
    wrappers:                                # frames passed over when the culprit is named
      - {function: "xmalloc", kind: wrapper, note: "our allocation wrapper"}
"""

from __future__ import annotations

import difflib
import re
from typing import Annotated, Literal

from memdiag.probes.registry import REGISTRY
from memdiag.system._parse import Model
from memdiag.system.units import KIND_NAMES, Kind, parse_quantity
from pydantic import ConfigDict, Discriminator, Field, Tag, field_validator, model_validator

from .catalog import facts

_COMPARISON = re.compile(r"^\s*([a-z_][a-z0-9_.]*)\s*(>=|<=|==|!=|>|<)\s*(.+?)\s*$")
TEMPLATE = re.compile(r"\{([a-z_][a-z0-9_.]*)\}")
BECAUSE = "because"  # the one placeholder that is not a fact: a verdict's fired `because` findings


class _Strict(Model):
    model_config = ConfigDict(extra="forbid", frozen=True)


# Facts that carried a decision made in Python; the playbook's rules make it now (issue 14). A
# probe's own are its face's (Face.retired).
REMOVED_FACTS = {
    "summary.stable": "the shipped rule `stable` decides it (window.samples, memory.shape)",
    "summary.too_few": "the shipped rule `too-few-samples` decides it (window.samples)",
    "summary.exited": "the shipped rules `exited` and `exited-too-early` decide it (target.exited)",
    "pressure.target_pays": "the playbook's anchor target-pays decides it (target.kind, cgroup.limit_hits, "
    "pressure.target_major_faults)",
    "summary.pressure": "a pressure verdict is written from pressure.where, the sign rules that fired ({because}) "
    "and summary.pressure_context",
}


def known_fact(name: str) -> str:
    removed = {**REMOVED_FACTS, **REGISTRY.retired_facts()}
    if name in removed:
        raise ValueError(f"fact `{name}` was removed: {removed[name]}")
    if name not in facts():
        close = difflib.get_close_matches(name, facts(), n=1)
        hint = f"; did you mean `{close[0]}`?" if close else ""
        raise ValueError(f"unknown fact `{name}`{hint}")
    return name


def _compatible(fact_kind: Kind, literal_kind: Kind) -> bool:
    if fact_kind == literal_kind:
        return True
    # a bare number compares with counts and with anything numeric written without a unit
    return literal_kind == "number" and fact_kind not in ("string", "bool")


class Comparison(_Strict):
    fact: str
    op: Literal[">", ">=", "<", "<=", "==", "!="]
    value: float | str | bool
    text: str

    @classmethod
    def parse(cls, text: str) -> Comparison:
        m = _COMPARISON.match(text)
        if not m:
            name = text.strip()
            known_fact(name)
            if facts()[name].kind != "bool":
                raise ValueError(f"`{text}` is not a comparison (write: FACT OP VALUE, e.g. process.rss > 1GiB)")
            return cls(fact=name, op="==", value=True, text=text)
        name, op, raw = m.groups()
        known_fact(name)
        kind = facts()[name].kind
        value, literal_kind = parse_quantity(raw.strip("'\""))
        if raw.lower() in ("true", "false") and kind == "bool":
            value, literal_kind = raw.lower() == "true", "bool"
        if not _compatible(kind, literal_kind):
            raise ValueError(f"fact `{name}` is {KIND_NAMES[kind]}; {raw!r} is {KIND_NAMES[literal_kind]}")
        if kind in ("string", "bool") and op not in ("==", "!="):
            raise ValueError(f"fact `{name}` is {KIND_NAMES[kind]}: only == and != apply")
        return cls(fact=name, op=op, value=value, text=text)  # type: ignore[arg-type]


class AllOf(_Strict):
    all: list[Condition] = Field(min_length=1)


class AnyOf(_Strict):
    any: list[Condition] = Field(min_length=1)


class NotOf(_Strict):
    not_: Condition = Field(alias="not")


class Present(_Strict):
    present: str

    @field_validator("present")
    @classmethod
    def _known(cls, v: str) -> str:
        return known_fact(v)


Condition = Comparison | AllOf | AnyOf | NotOf | Present


def parse_condition(raw: object) -> Condition:
    """YAML into a condition: a comparison string, or one of all/any/not/present."""
    if isinstance(raw, str):
        return Comparison.parse(raw)
    if isinstance(raw, dict) and len(raw) == 1:
        ((key, value),) = raw.items()
        if key == "all" and isinstance(value, list):
            return AllOf(all=[parse_condition(v) for v in value])
        if key == "any" and isinstance(value, list):
            return AnyOf(any=[parse_condition(v) for v in value])
        if key == "not":
            return NotOf(**{"not": parse_condition(value)})
        if key == "present":
            return Present(present=value)
    raise ValueError(
        "a condition is a comparison string or one of {all: [...]}, {any: [...]}, {not: ...}, {present: FACT}"
    )


def template_facts(text: str) -> list[str]:
    return TEMPLATE.findall(text)


class ProbeRequest(_Strict):
    name: Literal[REGISTRY.names]  # type: ignore[valid-type]  # the probe registry's names, in its order
    duration: str | None = None  # e.g. 15s; default: what is left of the window
    # its own options (probes/face.py Option), each given by a fact: {function: faults.top_function};
    # a fact unknown when the rule fires leaves the probe not run, and the trail says which
    given: dict[str, str] = {}
    # a fact naming one process of a cgroup target (cgroup.top_grower_pid): the probe is priced and
    # run on that process instead of the cgroup, as on a pid target; unknown: not run, as for given
    process: str | None = None

    @model_validator(mode="after")
    def _given(self) -> ProbeRequest:
        if self.process is not None:
            known_fact(self.process)
        options = {o.dest for o in REGISTRY.face(self.name).options}
        for option, fact in self.given.items():
            if option not in options:
                known = ", ".join(sorted(options)) or "none"
                raise ValueError(f"probe {self.name} has no option `{option}` (its options: {known})")
            known_fact(fact)
        return self

    @field_validator("duration")
    @classmethod
    def _seconds(cls, v: str | None) -> str | None:
        if v is not None and parse_quantity(v)[1] != "seconds":
            raise ValueError(f"duration {v!r} is not a duration (e.g. 15s)")
        return v

    @property
    def seconds(self) -> float | None:
        return float(parse_quantity(self.duration)[0]) if self.duration else None  # type: ignore[arg-type]


class VerdictAction(_Strict):
    kind: Literal["leak", "cache", "growth", "pressure", "oom", "healthy", "inconclusive"]
    summary: str
    confidence: float = Field(ge=0, le=1)
    priority: int = 0  # the highest-priority verdict that fires wins
    # rules whose findings, those that fired, the summary quotes as {because}: the verdict names the
    # signs that crossed their thresholds, not every figure that moved
    because: list[Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9_.-]*$")]] = []

    @model_validator(mode="after")
    def _because_quoted(self) -> VerdictAction:
        quoted = BECAUSE in template_facts(self.summary)
        if len(set(self.because)) < len(self.because):
            raise ValueError("`because` names a rule twice")
        if quoted and not self.because:
            raise ValueError("the summary quotes {because}: list the rules it quotes in `because`")
        if self.because and not quoted:
            raise ValueError("`because` lists rules the summary never quotes: put {because} in the summary")
        return self


class Advice(_Strict):
    """A next step with a key: rules that give the same key give the step once (the first fired
    rule's wording). A plain string is keyed by its rule, so two rules never merge it by its text."""

    key: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]*$")
    text: str


def _step_kind(v: object) -> str:
    return "keyed" if isinstance(v, (dict, Advice)) else "text"


# a next step: a string, or {key, text}; told apart by shape so an error names only the one meant
Step = Annotated[Annotated[str, Tag("text")] | Annotated[Advice, Tag("keyed")], Discriminator(_step_kind)]


class Then(_Strict):
    finding: str | None = None
    probes: list[ProbeRequest] = []
    verdict: VerdictAction | None = None
    advice: list[Step] = []

    def finding_key(self, rule_id: str) -> str:
        """What its finding says, as a key: the fact it states when it is that fact alone
        ("{summary.growth}": the counters' reading, which their own finding states too), else its rule."""
        whole = TEMPLATE.fullmatch((self.finding or "").strip())
        return whole.group(1) if whole else rule_id

    def advice_items(self, rule_id: str) -> list[tuple[str, str]]:
        """(key, text) of each next step: its own key, else the rule's id and its place."""
        return [(a.key, a.text) if isinstance(a, Advice) else (f"{rule_id}#{i}", a) for i, a in enumerate(self.advice)]

    @model_validator(mode="after")
    def _templates(self) -> Then:
        steps = [a.text if isinstance(a, Advice) else a for a in self.advice]
        for text in [self.finding or "", *steps]:
            for name in template_facts(text):
                if name == BECAUSE:
                    raise ValueError("{because} quotes other rules' findings: only a verdict's summary may hold it")
                known_fact(name)
        for name in template_facts(self.verdict.summary if self.verdict else ""):
            if name != BECAUSE:  # checked by the verdict itself
                known_fact(name)
        if not (self.finding or self.probes or self.verdict or self.advice):
            raise ValueError("`then` needs at least one of finding, probes, verdict, advice")
        return self


class Rule(_Strict):
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]*$")
    description: str = ""
    when: Condition
    then: Then
    source: str = ""  # file:line, filled by the loader

    @field_validator("when", mode="before")
    @classmethod
    def _condition(cls, v: object) -> object:
        if isinstance(v, (Comparison, AllOf, AnyOf, NotOf, Present)):
            return v
        return parse_condition(v)


FrameKind = Literal["allocator", "wrapper", "runtime", "interpreter"]


class FrameClass(_Strict):
    """One entry of a playbook's `wrappers:` list: frames that are not the code a user should read
    when a stack is named. `function` and `module` are globs (fnmatch) on the demangled function
    name and on the module's file name; an entry with both matches frames that meet both.
    allocator / wrapper / runtime frames are passed over when the culprit is named; interpreter
    frames are named (nothing native is closer to the program) and the report says what they are."""

    function: str | None = None
    module: str | None = None
    kind: FrameKind
    note: str = ""
    source: str = ""  # file:line, filled by the loader

    @model_validator(mode="after")
    def _one_pattern(self) -> FrameClass:
        if not (self.function or self.module):
            raise ValueError("a wrappers entry needs `function` or `module` (a glob)")
        return self


class Playbook(_Strict):
    rules: list[Rule]
    wrappers: list[FrameClass] = []


for _m in (AllOf, AnyOf, NotOf):
    _m.model_rebuild()
