"""The accuracy scorer's arithmetic, apart from running anything: the corpus's labels
(bench/accuracy/corpus.yaml) read and checked, one diagnosis's report judged against its label,
and a table of outcomes turned into precision and recall per verdict kind, the share of culprits
named, the share of incidents stable across their runs, the time to verdict and the misses
(BENCHMARKS.md's accuracy section). scripts/bench_accuracy.py runs the incidents; this module only
counts, so tests/unit/test_accuracy_score.py checks it on a fixed table."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path

import yaml

KINDS = ("leak", "cache", "growth", "pressure", "oom", "healthy", "inconclusive")
POSITIVE = ("leak", "growth", "pressure", "oom")  # something is wrong; the rest are negatives
TITLE = "## 11. Accuracy on a labelled corpus"
CORPUS = Path(__file__).resolve().parent.parent / "bench" / "accuracy" / "corpus.yaml"


@dataclass(frozen=True)
class Label:
    kind: str
    names: tuple[str, ...] = ()  # any one of them named is the culprit named
    holder: str | None = None  # also to be named, where one exists
    also: tuple[str, ...] = ()  # other kinds the definitions allow for this incident
    why: str = ""

    @property
    def accepted(self) -> tuple[str, ...]:
        return (self.kind, *self.also)

    @property
    def has_culprit(self) -> bool:
        return bool(self.names or self.holder)


@dataclass(frozen=True)
class Outcome:
    """One run of one incident: the verdict memdiag gave and what it named."""

    incident: str
    label: Label
    kind: str  # the verdict's kind; "none" where memdiag wrote no report
    named: bool  # the label's culprit (a name and the holder, where one exists) in the verdict
    seconds: float  # memdiag's start to its exit
    rule: str | None = None
    summary: str = ""


def load_corpus(path: Path = CORPUS) -> list[dict]:
    """The incidents, each checked: a unique name, a label whose kinds are verdict kinds."""
    incidents = yaml.safe_load(path.read_text())["incidents"]
    seen: set[str] = set()
    for inc in incidents:
        name = inc["name"]
        if name in seen:
            raise ValueError(f"{path}: incident {name} twice")
        seen.add(name)
        label = label_of(inc)
        for kind in label.accepted:
            if kind not in KINDS:
                raise ValueError(f"{path}: {name}: {kind} is no verdict kind")
        if ("program" in inc) == ("command" in inc):
            raise ValueError(f"{path}: {name}: a program or a command, one of them")
    return incidents


def label_of(incident: dict) -> Label:
    raw = incident["label"]
    return Label(
        kind=raw["kind"],
        names=tuple(raw.get("names") or ()),
        holder=raw.get("holder"),
        also=tuple(raw.get("also") or ()),
        why=raw.get("why", ""),
    )


def verdict_text(report: dict) -> str:
    """What a report's verdict names: its summary, the culprit's function, pid, comm and stack."""
    v = report.get("verdict") or {}
    c = v.get("culprit") or {}
    parts = [v.get("summary", ""), c.get("function") or "", c.get("comm") or "", str(c.get("pid") or "")]
    return " ".join(parts + list(c.get("stack") or []))


def is_named(label: Label, text: str, subst: dict[str, str]) -> bool:
    """The label's culprit is named in text: one of its names (with {pid} and the like filled in)
    and its holder, where it has one. A label with nothing to name is never 'named'."""
    if not label.has_culprit:
        return False
    names = [n.format(**subst) for n in label.names]
    return (not names or any(n in text for n in names)) and (label.holder is None or label.holder in text)


def judge(incident: str, label: Label, report: dict | None, seconds: float, subst: dict[str, str]) -> Outcome:
    """One run's outcome from its report.json (None: memdiag wrote none)."""
    if report is None:
        return Outcome(incident, label, "none", False, seconds)
    v = report.get("verdict") or {}
    return Outcome(
        incident,
        label,
        v.get("kind", "none"),
        is_named(label, verdict_text(report), subst),
        seconds,
        v.get("rule"),
        v.get("summary", ""),
    )


def correct(o: Outcome) -> bool:
    return o.kind in o.label.accepted


@dataclass
class Score:
    runs: int  # outcomes counted
    incidents: int
    per_kind: dict[str, dict] = field(default_factory=dict)  # kind: given, right, labelled, found, precision, recall
    right: int = 0  # runs whose kind is accepted
    culprit_runs: int = 0  # runs of incidents with something to name (but a right "healthy")
    named: int = 0  # of those, the runs that named it
    stable: int = 0  # incidents whose runs all gave the same kind
    multi: int = 0  # incidents run more than once (stability means something)
    negatives_called_leak: list[str] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    misses: list[tuple[str, Label, list[str]]] = field(default_factory=list)  # incident, label, kinds given


def score(outcomes: list[Outcome]) -> Score:
    """Precision and recall per kind, counted over runs: a run given kind K is right for K's
    precision when K is accepted for its incident (the label's kind or an allowed alternative); a
    run of an incident labelled K counts toward K's recall when its kind is accepted."""
    by_incident: dict[str, list[Outcome]] = {}
    for o in outcomes:
        by_incident.setdefault(o.incident, []).append(o)
    s = Score(runs=len(outcomes), incidents=len(by_incident))
    for kind in KINDS:
        given = [o for o in outcomes if o.kind == kind]
        labelled = [o for o in outcomes if o.label.kind == kind]
        right = sum(correct(o) for o in given)
        found = sum(correct(o) for o in labelled)
        s.per_kind[kind] = {
            "given": len(given),
            "right": right,
            "labelled": len(labelled),
            "found": found,
            "precision": right / len(given) if given else None,
            "recall": found / len(labelled) if labelled else None,
        }
    s.right = sum(correct(o) for o in outcomes)
    # a right "healthy" (a cache at its bound is flat too) has nothing to name: not counted
    with_culprit = [o for o in outcomes if o.label.has_culprit and not (o.kind == "healthy" and correct(o))]
    s.culprit_runs, s.named = len(with_culprit), sum(o.named for o in with_culprit)
    s.seconds = [o.seconds for o in outcomes if o.kind != "none"]
    for name, runs in by_incident.items():
        kinds = [o.kind for o in runs]
        if len(runs) > 1:
            s.multi += 1
            s.stable += len(set(kinds)) == 1
        label = runs[0].label
        if label.kind not in POSITIVE and "leak" in kinds:
            s.negatives_called_leak.append(name)
        if not all(correct(o) for o in runs):
            s.misses.append((name, label, kinds))
    return s


def _share(n: int, d: int) -> str:
    return f"{100 * n / d:.0f}% ({n}/{d})" if d else "–"


def render(s: Score, outcomes: list[Outcome], runs_each: int, when: str) -> list[str]:
    """BENCHMARKS.md's accuracy section from a score (and its outcomes, for the misses' detail)."""
    rows = []
    for kind in KINDS:
        k = s.per_kind[kind]
        if not k["given"] and not k["labelled"]:
            continue
        rows.append(
            f"| {kind} | {k['labelled']} | {k['given']} | {_share(k['right'], k['given'])} | "
            f"{_share(k['found'], k['labelled'])} |"
        )
    secs = s.seconds
    timing = f"{statistics.median(secs):.0f} s (median; {min(secs):.0f}–{max(secs):.0f} s)" if secs else "–"
    miss_rows = []
    for name, label, kinds in s.misses:
        given = ", ".join(f"{k} {kinds.count(k)}/{len(kinds)}" for k in sorted(set(kinds)))
        rule = next((o.rule for o in outcomes if o.incident == name and not correct(o)), None)
        accepted = "/".join(label.accepted)
        miss_rows.append(f"| {name} | {accepted} | {given} | {rule or '–'} |")
    lines = [
        TITLE,
        "",
        f"Measured {when}. The corpus of bench/accuracy/corpus.yaml ({s.incidents} incidents: programs written "
        "for it in C, C++, Rust, Python, Java, Go and Node under glibc, jemalloc, tcmalloc and mimalloc, "
        "memory no heap holds, OOM kills, pressure, and programs of the distribution; as many negatives as "
        f"positives), each run {runs_each} times with memdiag's defaults (`memdiag --pid PID` or `--cgroup`, "
        "nothing tuned), scored by scripts/bench_accuracy.py (docs/accuracy.md). A run is right when its "
        "verdict's kind is the label's or an alternative the label allows (said why in the corpus). "
        "Precision of a kind: of the runs given it, the share right; recall: of the runs of incidents "
        "labelled it, the share right.",
        "",
        "| kind | runs labelled | runs given | precision | recall |",
        "|---|---|---|---|---|",
        *rows,
        "",
        f"- Right kind: {_share(s.right, s.runs)} of runs.",
        f"- Culprit named (the label's function or resource, and its holder where one exists): "
        f"{_share(s.named, s.culprit_runs)} of the runs of incidents with one to name (a right healthy verdict "
        "excepted: it has nothing to name).",
        f"- Stable (the same kind in every run): {_share(s.stable, s.multi)} of incidents"
        + (" (one run each: not measured)." if not s.multi else "."),
        f"- Negatives called a leak: {', '.join(s.negatives_called_leak) or 'none'}.",
        f"- Time to verdict (memdiag's start to its exit): {timing}.",
        "",
    ]
    if miss_rows:
        lines += [
            "Misses (an incident with any run of a kind its label does not allow):",
            "",
            "| incident | label | verdicts given | rule of the first wrong run |",
            "|---|---|---|---|",
            *miss_rows,
            "",
        ]
    return lines
