"""Narrowed allocation tracing (probes/memleak/sites.py) on the real kernel: uprobes only after one
function's own calls to the allocator, the blocks they return read back from glibc's chunk headers
at the end, with no probe on malloc or free; under jemalloc, with its frees traced."""

import pytest
from memdiag.probes.memleak import sites
from memdiag.probes.memleak.glibcheap import State
from memdiag.system import arch

JEMALLOC = arch.library("libjemalloc.so.2")


def test_a_leaking_functions_blocks_are_all_still_allocated_with_its_stack(workload):
    w = workload("leak", "400")  # 100 records of 4 KiB a second from leak_order_history
    t = sites.trace(w.pid, "leak_order_history", 2.0)
    assert [s.callee for s in t.sites] == ["malloc"]
    live = t.live()
    # every record it allocated in the 2 s is still allocated, and each is at least its 4 KiB
    assert len(live) == len(t.blocks) >= 100, t.stats
    assert all(b.size is not None and b.size >= 4096 - 16 for b in live)
    # only its own calls trapped: no malloc, no free (handle_request churns 4 times as many)
    assert t.stats["hits"] == len(t.blocks) + t.stats["null"] <= 400
    top = t.stacks[0]
    assert top.functions[0] == "leak_order_history" and "main" in top.functions, top.frames
    assert top.count == len(live) and top.bytes == sum(b.size for b in live)


def test_a_function_that_frees_what_it_allocates_leaves_nothing_allocated(workload):
    w = workload("leak", "400")
    t = sites.trace(w.pid, "handle_request", 2.0)
    assert t.stats["hits"] >= 40  # it ran, 40 times a second or more
    assert t.blocks and t.live() == [], [(hex(b.address), b.state) for b in t.blocks]
    assert {b.state for b in t.blocks} == {State.FREE}


def test_a_function_that_allocates_through_no_call_of_its_own_is_refused_in_one_line(workload):
    w = workload("leak", "400")
    with pytest.raises(sites.SitesRefused, match="main calls no allocator, nor a wrapper of one in leak"):
        sites.trace(w.pid, "main", 1.0)


def test_a_function_that_allocates_through_a_wrapper_is_traced_at_its_calls_to_it(workload):
    """wrapleak's process_order gets each order from xmalloc and drops 1 in 7 on an error branch:
    its calls to xmalloc are traced, and what is left unreachable is a seventh of them."""
    w = workload("wrapleak", "2000", "7")
    t = sites.trace(w.pid, "process_order", 3.0)
    assert [s.callee for s in t.sites] == ["xmalloc"]
    assert t.stats["hits"] >= 2000
    scan, by_key = sites.reach_of(w.pid, t)
    assert scan.status == "ran", scan.reason
    leaked = sum(r.leaked_count for r in by_key.values())
    assert 5.0 <= t.stats["hits"] / leaked <= 9.0, (t.stats["hits"], leaked)  # 1 in 7, give or take the ends
    assert sum(r.anchored_count for r in by_key.values()) <= 2  # the rest are freed, not held


def test_the_scan_calls_a_leaking_functions_blocks_leaked(workload):
    w = workload("leak", "400")
    t = sites.trace(w.pid, "leak_order_history", 2.0)
    scan, by_key = sites.reach_of(w.pid, t)
    assert scan.status == "ran" and scan.paused_ms > 0, scan
    leaked = sum(r.leaked_count for r in by_key.values())
    assert leaked == len(t.live()) >= 100 and sum(r.anchored_count for r in by_key.values()) == 0


def test_the_scan_names_what_holds_a_registrys_blocks(workload):
    w = workload("registry", "2000")
    t = sites.trace(w.pid, "register_entry", 2.0)
    scan, by_key = sites.reach_of(w.pid, t)
    assert scan.status == "ran", scan
    held = [r for r in by_key.values() if r.anchored_count]
    assert held and sum(r.leaked_count for r in by_key.values()) == 0
    assert "registry" in held[0].anchor, held[0]


def _jemalloc() -> dict:
    if JEMALLOC is None:
        pytest.fail("needs libjemalloc2 (scripts/setup.sh --test installs it)")
    return {"LD_PRELOAD": JEMALLOC}


def test_under_jemalloc_its_frees_keep_the_books_and_the_scan_reads_them_exact(workload):
    """jemalloc keeps no header memdiag reads: its free entry points are traced (free on its first
    branch, emulated), the size comes from the call's own probe, and the free probes stay attached
    until the scan has read the books with the target stopped."""
    w = workload("leak", "400", env=_jemalloc())
    with sites.traced(w.pid, "leak_order_history", 2.0) as t:
        assert t.liveness == "frees" and t.allocator == "jemalloc"
        assert any(f.startswith("free+") and "emulated" in f and not f.startswith("free+0") for f in t.frees)
        live = t.live()
        assert len(live) == len(t.blocks) >= 100 and {b.size for b in live} == {4096}  # as asked
        scan, by_key = sites.reach_of(w.pid, t)
    assert scan.status == "ran", scan.reason
    assert "free probes still attached" in scan.consistency
    leaked = sum(r.leaked_count for r in by_key.values())
    assert leaked >= 100 and sum(r.anchored_count for r in by_key.values()) == 0
    # handle_request churns four frees a record: the frees were counted, and none was a traced block's
    assert t.stats["frees_emulated"] + t.stats["frees_stepped"] >= 4 * t.stats["hits"] and t.stats["freed"] == 0
    assert t.stats["call_hits"] >= t.stats["hits"] - 1  # each call's size kept (a call in flight at the end)
    assert t.stacks[0].functions[0] == "leak_order_history" and t.stacks[0].bytes == 4096 * len(t.live())


def test_under_jemalloc_a_function_that_frees_what_it_allocates_leaves_nothing(workload):
    w = workload("leak", "400", env=_jemalloc())
    t = sites.trace(w.pid, "handle_request", 2.0)
    assert t.stats["hits"] >= 40 and t.stats["freed"] >= t.stats["hits"] - 1, t.stats
    assert t.blocks == [] or {b.state for b in t.blocks} == {State.FREE}


def test_under_jemalloc_a_wrappers_one_in_seven_is_read_from_its_frees(workload):
    w = workload("wrapleak", "2000", "7", env=_jemalloc())
    with sites.traced(w.pid, "process_order", 3.0) as t:
        scan, by_key = sites.reach_of(w.pid, t)
    assert scan.status == "ran", scan.reason
    leaked = sum(r.leaked_count for r in by_key.values())
    assert leaked and 5.0 <= t.stats["hits"] / leaked <= 9.0, (t.stats, leaked)
    assert sum(r.anchored_count for r in by_key.values()) <= 2
    # the size is xmalloc's own call's (its first argument): a struct order, 1024 bytes
    assert t.live() and {b.size for b in t.live()} == {1024}


def test_a_target_that_exits_during_the_trace_is_said_in_one_line(workload):
    import threading

    w = workload("leak", "400")
    threading.Timer(0.5, w.stop).start()
    with pytest.raises(sites.SitesRefused, match=f"PID {w.pid} could not be read after the trace"):
        sites.trace(w.pid, "leak_order_history", 1.5)
