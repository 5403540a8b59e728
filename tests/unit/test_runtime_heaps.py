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
        "node.v8_heap_floor_trend": "climbing",
        "node.v8_heap_floor_steady": True,
        "node.v8_heap_floor_growth": 9 * MiB,
        "node.v8_heap_committed": 18 * MiB,
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
    # V8's heap stepped up once (its young generation sized up), not in each half of the window:
    # the young generation's pages at their bound are what they look like
    rule, _ = _winner({**facts, "node.v8_heap_floor_steady": False})
    assert rule == "cache-held"


def test_the_arenas_line_gives_way_to_the_page_faults_line_as_the_culprit():
    """The verdict's stack: memleak's arenas stand for every line that mapped one (their frames a
    sample, the line that mapped the most), so the page faults' stack names the culprit where it
    ran; where it did not, the arenas' stack still does."""
    from memdiag.diagnose.verdict import stack_for
    from memdiag.probes.faults import FaultsResult
    from memdiag.probes.growth import StackGrowth
    from memdiag.probes.memleak.result import LeakStack, MemleakResult

    arena = ["mmap64+0x0 [libc.so.6]", "PyObject_Malloc+0xab [python3.11]", "main (/srv/app.py:22) [python]"]
    arenas = LeakStack(frames=arena, functions=["mmap64", "PyObject_Malloc", "main (app.py:22)"], pid=7,
                       method="fp", outstanding_bytes=11 * MiB, outstanding_count=11, allocs=11, frees=0,
                       alloc_bytes=11 * MiB, freed_bytes=0, arenas=True)  # fmt: skip
    memleak = MemleakResult(name="memleak", status="ok", stacks=[arenas])
    fault = ["_PyObject_Malloc+0x1 [python3.11]", "record_event (/srv/app.py:12) [python]"]
    faults = FaultsResult(name="faults", status="ok", stacks=[
        StackGrowth(frames=fault, functions=["_PyObject_Malloc", "record_event (app.py:12)"], count=949,
                    bytes=949 * 4096, pid=7, method="eh_frame")])  # fmt: skip
    assert stack_for("growth", {"memleak": memleak, "faults": faults}).frames == fault
    assert stack_for("growth", {"memleak": memleak}).frames == arena
    # one line's own stack is no sample: it stays the culprit before any event stack
    own = arenas.model_copy(update={"arenas": False})
    assert (
        stack_for("growth", {"memleak": memleak.model_copy(update={"stacks": [own]}), "faults": faults}).frames == arena
    )


def test_v8s_heap_floor_over_the_window_keeps_what_collections_left_and_tells_a_step_from_retention():
    """V8's committed heap rises and falls (large objects' pages unmapped at the next collection):
    the floor is what it kept from each sample on; steady where it grew in each third of the window."""
    from memdiag.probes.node.window import V8HeapSample, facts_of

    def samples(values):
        return [(float(t), V8HeapSample(mapped=v * MiB)) for t, v in enumerate(values)]

    # a Map's backing store copied as it grows: spikes over a climbing old generation
    kept = facts_of(samples([10, 14, 11, 12, 16, 13, 14, 18, 15, 16, 20, 17]), 7)
    assert kept["node.v8_heap_floor_trend"] == "climbing" and kept["node.v8_heap_floor_steady"] is True
    assert kept["node.v8_heap_floor_growth"] == 7 * MiB and kept["node.v8_heap_committed"] == 17 * MiB
    # a churn whose young generation V8 sized up once, at the window's end
    step = facts_of(samples([20] * 9 + [36, 52, 52]), 7)
    assert step["node.v8_heap_floor_steady"] is False
    # and once at its start; a structure that filled over two thirds of it and stopped
    assert facts_of(samples([10, 26, 42] + [42] * 9), 7)["node.v8_heap_floor_steady"] is False
    assert facts_of(samples([10, 12, 14, 16, 18, 20, 22, 24] + [24] * 4), 7)["node.v8_heap_floor_steady"] is False
    # a collection compacting the old generation near the end lowers the floor before it: its shape may
    # read levelled, yet it grew in each third
    compacted = facts_of(samples([10, 12, 14, 16, 18, 20, 22, 24, 26, 21, 22, 23]), 7)
    assert compacted["node.v8_heap_floor_steady"] is True
    # collected seldom (CI, a busy host: two collections in 40 s): the middle third held none and the
    # second collection pinned its floor; what each collection left rose, first half to last third
    seldom = [9, 14, 15, 15, 15, 26, 27, 12, 16, 16, 21, 21, 21, 22, 34, 36, 36, 36, 36, 36, 36, 57, 57, 57, 57,
              57, 57, 57, 57, 57, 32, 39, 41, 41, 46, 46, 46, 47, 57, 57, 57]  # fmt: skip
    assert facts_of(samples(seldom), 7)["node.v8_heap_floor_steady"] is True
    # not where a third collection kept no more than the second (a young generation's step between them),
    # nor where the collections were all early
    assert facts_of(samples(seldom[:38] + [32, 40, 41]), 7)["node.v8_heap_floor_steady"] is False
    early = [9, 14, 20, 12, 18, 24, 16] + [17] * 14
    assert facts_of(samples(early), 7)["node.v8_heap_floor_steady"] is False
