"""Where a runtime keeps the program's objects in memory of its own, the shipped playbook judges
that memory as a whole, never one of the stacks that happened to map a piece of it: a CPython
target's pymalloc arenas (whose line page faults name) and a Node target's V8 heap (whose young
generation's pages level off at their bound while the heap climbs)."""

from memdiag.rules.engine import conclude, run_rules
from memdiag.rules.loader import load_playbooks, shipped_playbooks

MiB = 1 << 20
RULES = load_playbooks(shipped_playbooks())
SCANNED = {
    "target.kind": "pid",
    "budget.percent": 2.0,
    "summary.growth": "RSS grows",
    "target.name": "PID 1 (x)",
    "process.rss_shape": "climbing",
    "process.rss_growth": 26 * MiB,
    "memory.shape_while_traced": "climbing",
    "reach.scanned": True,
    "reach.leaked_count": 0,
    "reach.leaked_ratio": 0.0,
    "reach.anchored_ratio": 100.0,
    "memleak.top_entry": "mmap",
    "memleak.top_outstanding": 11 * MiB,
    "memleak.top_rate": 700_000.0,
    "memleak.top_free_ratio": 0.0,
}


def _winner(facts: dict) -> tuple[str, str]:
    c = conclude(run_rules(RULES, facts), facts)
    return c.winner.id, c.summary


def test_python_arenas_that_climb_are_growth_named_by_the_line_page_faults_name():
    facts = {
        **SCANNED,
        "target.runtime": "cpython",
        "target.python_frames": "read",
        "memleak.top_trend": "climbing",
        "memleak.top_function": "main (app.py:22)",  # the line that mapped the most arenas: a counter
        "reach.anchor": "`__main__.EVENTS` (a list)",
        "reach.anchor_kind": "static",
        "reach.anchored_bytes": 11 * MiB,
    }
    fired = {r.id for r, o in run_rules(RULES, facts) if o.state == "fired"}
    assert "python-arenas-name-the-line" in fired  # page faults asked for
    rule, summary = _winner({**facts, "faults.top_function": "record_event (app.py:12)"})
    assert rule == "python-arenas-held", summary
    assert summary.startswith("PID 1 (x): record_event (app.py:12) keeps making Python objects")
    assert "`__main__.EVENTS` (a list)" in summary and "main (app.py:22)" not in summary
    # no page faults read: the arenas' own stack names what it can, held growth still
    rule, summary = _winner(facts)
    assert rule == "growth-held" and "`__main__.EVENTS` (a list)" in summary, summary


def test_a_node_v8_heap_that_climbs_is_growth_whatever_its_page_mappings_did():
    facts = {
        **SCANNED,
        "target.runtime": "node",
        "memleak.top_trend": "levelled",  # the young generation's pages, grown to their bound
        "memleak.top_function": "unknown",
        "reach.anchor": "memory memdiag did not see allocated ([heap])",
        "reach.anchor_kind": "untracked",
        "reach.anchored_bytes": 5 * MiB,
        "node.v8_heap_trend": "climbing",
        "node.v8_heap_growth": 6 * MiB,
        "node.v8_heap": 15 * MiB,
        "node.native_trend": "flat",
        "node.outside_share": 1.3,
        "node.perf_map": False,
    }
    rule, summary = _winner(facts)
    assert rule == "node-v8-heap-grows", summary
    assert "growth in V8's heap" in summary and "unknown" not in summary
    assert "Which JavaScript function keeps them is not named" in summary
    # V8's pages climbing while traced are no holder either: "unknown keeps adding blocks" named none
    rule, summary = _winner({**facts, "memleak.top_trend": "climbing"})
    assert rule == "node-v8-heap-grows", summary
    # memory outside V8's heap is most of the growth: not this rule's to say
    rule, _ = _winner({**facts, "node.outside_share": 80.0})
    assert rule != "node-v8-heap-grows"
    # V8's heap read flat: the young generation's pages at their bound are what they look like
    rule, _ = _winner({**facts, "node.v8_heap_trend": "flat", "node.v8_heap_growth": 0})
    assert rule == "cache-held"
