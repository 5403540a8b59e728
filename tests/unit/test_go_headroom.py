"""A Go process's RSS against its runtime's own counts: the facts are goview's (from a goheap
result), the judgment the shipped playbook's. RSS that climbs into memory the runtime already holds
(its heap filling toward the GC's goal) beside a flat live set is a bounded heap; anonymous memory
that climbs past all the runtime holds is not the Go heap's, and the cache verdict does not stand."""

from memdiag.probes.go.heap import GoHeapResult, GoStack
from memdiag.probes.go.view import facts_of
from memdiag.rules.engine import conclude, run_rules
from memdiag.rules.loader import load_playbooks, shipped_playbooks

MiB = 1 << 20
SHIPPED = load_playbooks(shipped_playbooks())
T = [float(t) for t in range(0, 13)]
# a cache's profile: about 94 MiB in use at every GC, what is replaced freed
CACHE = GoStack(
    frames=["main.(*cache).fetch (main.go:24) [gocache]"], functions=["main.(*cache).fetch"],
    inuse_bytes=[94 * MiB] * len(T), inuse_objects=6000, alloc_bytes=2000 * MiB, freed_bytes=1900 * MiB,
)  # fmt: skip


def _result(rss_anon: list[int]) -> GoHeapResult:
    return GoHeapResult(
        status="ok", version="go1.19.8", found_by="its symbol table", stripped=False, profile="on", rate=512 << 10,
        times=T, cycles=list(range(10, 10 + len(T))), heap_inuse=[94 * MiB] * len(T), stacks=[CACHE],
        pacer_times=T, gogc=100, heap_goal=[190 * MiB] * len(T), heap_marked=[95 * MiB] * len(T),
        heap_retained=[188 * MiB] * len(T), runtime_mapped=[204 * MiB] * len(T), rss_anon=rss_anon, module="gocache",
    )  # fmt: skip


def _judge(rss_anon: list[int]):
    facts = facts_of(_result(rss_anon), None, lambda frames, forwards: None)
    facts.update({"target.name": "PID 1 (gocache)", "process.rss_shape": "climbing", "process.rss_growth": 92 * MiB})
    outcomes = run_rules(SHIPPED, facts)
    return facts, {r.id for r, o in outcomes if o.state == "fired"}, conclude(outcomes, facts)


def test_rss_that_climbs_into_what_the_runtime_holds_is_the_heaps_headroom():
    # touched as the heap grows toward its goal: 105 MiB to 197 MiB, under the 204 MiB the runtime holds
    facts, fired, c = _judge([int((105 + min(t, 5) * 18.4) * MiB) for t in T])
    assert facts["go.beyond_runtime"] == 0 and facts["go.beyond_runtime_trend"] == "flat"
    assert c.winner.id == "go-heap-cache-headroom" and c.winner.then.verdict.kind == "cache", c.summary
    assert "the heap's goal is 190 MiB at GOGC=100" in c.summary and "main.(*cache).fetch" in c.summary
    assert "go-beyond-runtime-growth" not in fired


def test_anonymous_memory_past_all_the_runtime_holds_is_not_a_cache():
    # the same heap, and 4 MiB a second more from 4 MiB under what the runtime holds
    # (a cgo library's malloc): 44 MiB past it at the end
    facts, fired, c = _judge([int((200 + 4 * t) * MiB) for t in T])
    assert facts["go.beyond_runtime_trend"] == "climbing" and facts["go.beyond_runtime_growth"] == 44 * MiB
    assert "go-beyond-runtime-growth" in fired
    assert not fired & {"go-heap-cache", "go-heap-cache-headroom"}, c.summary


def test_a_stacks_share_is_of_what_grew_never_over_all_of_it():
    """prometheus: one stack grew 549 KiB while others let go of about as much; its share of the net
    4.2 KiB change came out 13137.4%. A share is of what grew: at most 100%."""
    grew = GoStack(
        frames=["tsdb.newStripeSeries (head.go:1) [prometheus]"], functions=["tsdb.newStripeSeries"],
        inuse_bytes=[0] * 12 + [549 << 10], inuse_objects=10, alloc_bytes=549 << 10, freed_bytes=0,
    )  # fmt: skip
    shrank = CACHE.model_copy(update={"inuse_bytes": [94 * MiB] * 12 + [94 * MiB - (545 << 10)]})
    r = _result([100 * MiB] * len(T)).model_copy(
        update={"stacks": [grew, shrank], "heap_inuse": [94 * MiB] * 12 + [94 * MiB + (4 << 10)]}
    )
    facts = facts_of(r, None, lambda frames, forwards: None)
    assert facts["go.top_share"] == 100.0


def test_a_flat_heap_with_flat_rss_is_no_cache_and_the_largest_holder_is_among_the_stacks_shown():
    """An idle prometheus (a trial): the heap profile flat from the first GC read and RSS flat was
    called a cache, its holder a start-up allocation that the report's stacks did not show."""
    from memdiag.probes.go.view import STACKS

    facts = facts_of(_result([100 * MiB] * len(T)), None, lambda frames, forwards: None)
    facts.update({"target.name": "PID 1 (prometheus)", "process.rss_shape": "flat", "process.rss_growth": 0})
    fired = {r.id for r, o in run_rules(SHIPPED, facts) if o.state == "fired"}
    assert facts["go.heap_trend"] == "flat" and not fired & {"go-heap-cache", "go-heap-cache-headroom"}
    facts["process.rss_shape"] = "levelled"  # RSS that grew and levelled beside a flat heap: bounded
    assert "go-heap-cache" in {r.id for r, o in run_rules(SHIPPED, facts) if o.state == "fired"}
    small = [
        GoStack(frames=[f"main.f{i} (m.go:{i}) [p]"], functions=[f"main.f{i}"], inuse_bytes=[i << 10] * len(T),
                inuse_objects=1, alloc_bytes=i << 10, freed_bytes=0)
        for i in range(1, 6)
    ]  # fmt: skip
    r = _result([100 * MiB] * len(T)).model_copy(update={"stacks": [*small, CACHE]})  # the holder sorts last
    shown = [s.functions[0] for s in STACKS.of(r)[: STACKS.shown]]
    assert shown == ["main.f1", "main.f2", "main.(*cache).fetch"]


def test_a_stripped_binary_says_the_gcs_own_counts_were_not_read():
    from memdiag.probes.go.view import sections

    bare = _result([]).model_copy(update={"stripped": True, "pacer_times": [], "heap_goal": [], "heap_marked": []})
    lines = sections(bare)[0].lines
    assert any("the GC's own counts" in x and "were not read: the binary is stripped" in x for x in lines), lines
    lines = sections(_result([100 * MiB] * len(T)))[0].lines
    assert any(x.startswith("the GC's own counts (exact): live 95.0 MiB") for x in lines), lines


def _plateau(heap_marked: list[int]):
    r = _result([2600 * MiB] * len(T)).model_copy(
        update={"profile": "compiled-out", "stacks": [], "heap_inuse": [], "cycles": [], "times": [],
                "heap_marked": heap_marked, "heap_goal": [2 * m for m in heap_marked]}
    )  # fmt: skip
    facts = facts_of(r, None, lambda frames, forwards: None)
    plateau = "RSS of PID 1 (orders) grew 196 MiB then levelled off at 2.6 GiB for the last 7.0 s of 30 s"
    facts.update({"target.name": "PID 1 (orders)", "target.runtime": "go", "memory.shape": "levelled",
                  "process.rss_shape": "levelled", "summary.plateau": plateau, "oom.kills_in_window": 0})  # fmt: skip
    return facts, conclude(run_rules(SHIPPED, facts), facts)


def test_a_go_plateau_within_one_gc_cycle_is_no_cache():
    """A trial: a Go map that only grew (2.6 GiB, its heap profile compiled out, no GC while read)
    levelled for 7 s between collections and was called a bounded cache."""
    facts, c = _plateau([1400 * MiB] * len(T))
    assert facts["go.gcs_seen"] == 0
    assert c.winner.id == "go-plateau-between-gcs" and c.winner.then.verdict.kind == "inconclusive", c.summary
    assert "0 GCs completed while read" in c.summary and "the last GC marked 1.4 GiB live" in c.summary


def test_a_go_plateau_across_gcs_is_still_a_plateau():
    facts, c = _plateau([1400 * MiB] * 4 + [1401 * MiB] * 4 + [1400 * MiB] * 5)  # two GCs between reads
    assert facts["go.gcs_seen"] == 2
    assert c.winner.id == "plateau" and c.winner.then.verdict.kind == "cache", c.summary


def test_a_go_stack_that_did_not_grow_is_no_growths_culprit():
    """A trial's prometheus: its largest profile stack, a start-up allocation with no change over no
    completed GC, was named the culprit of the RSS growth."""
    from memdiag.probes.go.view import STACKS

    flat = _result([100 * MiB] * len(T))
    assert STACKS.culprit(flat, "growth") is None
    assert STACKS.culprit(flat, "cache").functions == ["main.(*cache).fetch"]  # a cache's is its largest holder
    grew = flat.model_copy(update={"stacks": [CACHE.model_copy(update={"inuse_bytes": [94 * MiB] * 12 + [99 * MiB]})]})
    assert STACKS.culprit(grew, "growth").bytes == 99 * MiB


def test_rss_that_rises_and_falls_beside_a_flat_live_set_is_the_heap_refilling():
    """CI: gocache's RSS fell from 199 to 127 MiB and grew again (the scavenger returning free
    pages, the heap refilling them), its live set flat over 5 GCs: it came out inconclusive."""
    facts = facts_of(_result([int((150 + (t % 6) * 8) * MiB) for t in T]), None, lambda frames, forwards: None)
    facts.update({"target.name": "PID 1 (gocache)", "process.rss_shape": "sawtooth"})
    c = conclude(run_rules(SHIPPED, facts), facts)
    assert c.winner.id == "go-heap-cache-sawtooth" and c.winner.then.verdict.kind == "cache", c.summary
    assert "RSS rose and fell while the live heap the GC marks stayed at 95.0 MiB" in c.summary
    facts["go.heap_marked_trend"] = "climbing"  # the live set climbing: no cache
    fired = {r.id for r, o in run_rules(SHIPPED, facts) if o.state == "fired"}
    assert "go-heap-cache-sawtooth" not in fired
