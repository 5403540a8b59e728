"""The accuracy scorer's arithmetic (scripts/accuracy_score.py) on a fixed table of outcomes, and the
corpus it scores (bench/accuracy/corpus.yaml) read and checked: no diagnosis runs here."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

from accuracy_score import (  # noqa: E402
    POSITIVE,
    Label,
    Outcome,
    is_named,
    judge,
    label_of,
    load_corpus,
    render,
    score,
)

LEAK = Label("leak", names=("post_payment",))
GROWTH = Label("growth", names=("open_session",), holder="session_table")
CACHE = Label("cache", names=("open_session",), also=("healthy",))
HEALTHY = Label("healthy")


def _o(incident: str, label: Label, kind: str, named: bool = False, seconds: float = 31.0) -> Outcome:
    return Outcome(incident, label, kind, named, seconds, rule=None if kind == "none" else f"rule-of-{kind}")


# Three runs of five incidents: a leak found every time; a growth once taken for a leak; a cache
# once called healthy (allowed) and once a leak (not); a healthy one always right; one with no report.
TABLE = [
    *(_o("ledger", LEAK, "leak", True, 30) for _ in range(3)),
    _o("sessions", GROWTH, "growth", True, 31),
    _o("sessions", GROWTH, "leak", False, 32),
    _o("sessions", GROWTH, "growth", True, 33),
    _o("lru", CACHE, "cache", True, 31),
    _o("lru", CACHE, "healthy", False, 31),
    _o("lru", CACHE, "leak", True, 31),
    *(_o("churn", HEALTHY, "healthy", False, 31) for _ in range(3)),
    _o("gone", HEALTHY, "none", False, 5),
]


def test_precision_and_recall_per_kind_count_runs_and_allowed_alternatives():
    s = score(TABLE)
    leak, growth, cache, healthy = (s.per_kind[k] for k in ("leak", "growth", "cache", "healthy"))
    # leak given 5 times (3 ledger, 1 sessions, 1 lru), right 3; labelled 3, found 3
    assert (leak["given"], leak["right"], leak["precision"]) == (5, 3, 3 / 5)
    assert (leak["labelled"], leak["found"], leak["recall"]) == (3, 3, 1.0)
    assert (growth["precision"], growth["recall"]) == (1.0, 2 / 3)
    # the lru's "healthy" run is right (its label allows it): it counts for healthy's precision and
    # for cache's recall
    assert (cache["given"], cache["precision"], cache["labelled"], cache["recall"]) == (1, 1.0, 3, 2 / 3)
    assert (healthy["given"], healthy["right"], healthy["precision"]) == (4, 4, 1.0)
    # churn's 3 runs right, the run without a report wrong: 3 of 4
    assert (healthy["labelled"], healthy["found"], healthy["recall"]) == (4, 3, 3 / 4)
    assert s.per_kind["oom"]["precision"] is None and s.per_kind["oom"]["recall"] is None
    assert (s.runs, s.incidents, s.right) == (13, 5, 10)


def test_culprit_share_stability_misses_and_negatives_called_leak():
    s = score(TABLE)
    # runs of incidents with something to name: ledger 3, sessions 3, lru 2 (its right "healthy" run
    # has nothing to name); named 3 + 2 + 2
    assert (s.culprit_runs, s.named) == (8, 7)
    # stable: ledger and churn (3 runs each of one kind); sessions and lru flip; "gone" ran once
    assert (s.multi, s.stable) == (4, 2)
    assert [m[0] for m in s.misses] == ["sessions", "lru", "gone"]
    assert s.misses[1][2] == ["cache", "healthy", "leak"]
    assert s.negatives_called_leak == ["lru"]
    assert s.seconds == [30, 30, 30, 31, 32, 33, 31, 31, 31, 31, 31, 31]  # no report, no time


def test_rendered_section_states_the_figures_and_the_misses():
    lines = render(score(TABLE), TABLE, 3, "2026-12-07 18:00 UTC")
    text = "\n".join(lines)
    assert lines[0] == "## 11. Accuracy on a labelled corpus"
    assert "| leak | 3 | 5 | 60% (3/5) | 100% (3/3) |" in text
    assert "| cache | 3 | 1 | 100% (1/1) | 67% (2/3) |" in text
    assert "Culprit named (the label's function or resource, and its holder where one exists): 88% (7/8)" in text
    assert "Stable (the same kind in every run): 50% (2/4) of incidents." in text
    assert "Negatives called a leak: lru." in text
    assert "| lru | cache/healthy | cache 1/3, healthy 1/3, leak 1/3 | rule-of-leak |" in text
    assert "| gone | healthy | none 1/1 | – |" in text
    assert "31 s (median; 30–33 s)" in text


def test_one_run_each_says_stability_was_not_measured():
    one = [_o("ledger", LEAK, "leak", True), _o("churn", HEALTHY, "healthy")]
    text = "\n".join(render(score(one), one, 1, "now"))
    assert "Stable (the same kind in every run): – of incidents (one run each: not measured)." in text


def test_named_needs_a_name_and_the_holder_and_fills_in_the_pid():
    assert is_named(GROWTH, "open_session keeps adding blocks ... reachable from `session_table`", {})
    assert not is_named(GROWTH, "open_session keeps adding blocks, held by something", {})
    assert not is_named(GROWTH, "main keeps adding blocks reachable from `session_table`", {})
    oom = Label("oom", names=("{pid}",))
    assert is_named(oom, "the OOM killer took PID 4242 (oomhog)", {"pid": "4242"})
    assert not is_named(oom, "the OOM killer took PID 4243 (oomhog)", {"pid": "4242"})
    assert not is_named(HEALTHY, "anything at all", {})


def test_judge_reads_a_reports_verdict_and_culprit():
    report = {
        "verdict": {
            "kind": "leak",
            "summary": "ledger leaks",
            "rule": "leak-unreachable",
            "culprit": {"function": "post_payment", "stack": ["malloc", "post_payment", "main"]},
        }
    }
    o = judge("ledger", LEAK, report, 31.2, {})
    assert (o.kind, o.named, o.rule, o.seconds) == ("leak", True, "leak-unreachable", 31.2)
    missing = judge("ledger", LEAK, None, 4.0, {})
    assert (missing.kind, missing.named) == ("none", False)


def test_the_corpus_is_spread_as_issue_50_asks():
    incidents = load_corpus()
    labels = {i["name"]: label_of(i) for i in incidents}
    positives = [n for n, lab in labels.items() if lab.kind in POSITIVE]
    assert len(incidents) >= 40
    assert len(incidents) - len(positives) >= len(positives)
    assert {lab.kind for lab in labels.values()} >= {"leak", "growth", "cache", "healthy", "oom", "pressure"}
    allocators = {i.get("allocator", "glibc") for i in incidents}
    assert allocators == {"glibc", "jemalloc", "tcmalloc", "mimalloc"}
    programs = ROOT / "bench" / "accuracy" / "programs"
    suffixes = set()
    for inc in incidents:
        for prog in [inc.get("program"), (inc.get("client") or {}).get("program")]:
            if prog:
                path = programs / prog
                assert path.exists(), f"{inc['name']}: {path} is missing"
                suffixes.add(path.suffix or "go")
        assert labels[inc["name"]].why, f"{inc['name']}: a label says why"
    assert suffixes >= {".c", ".cc", ".rs", ".py", ".js", ".java", "go"}
    assert sum("command" in i for i in incidents) >= 2  # programs of the distribution


def test_a_corpus_with_a_kind_memdiag_has_not_is_refused(tmp_path):
    bad = tmp_path / "corpus.yaml"
    bad.write_text("incidents:\n  - {name: x, program: ledger.c, label: {kind: leaky}}\n")
    with pytest.raises(ValueError, match="leaky is no verdict kind"):
        load_corpus(bad)
