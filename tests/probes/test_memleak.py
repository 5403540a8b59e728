"""memleak on the real kernel: the leaking function on top, churn not listed as outstanding,
every allocator entry point, jemalloc, C++, the cache's series levelling off."""

import os
import subprocess
import time

from memdiag.probes import memleak
from memdiag.system import arch
from memdiag.system.target import Target

JEMALLOC = arch.library("libjemalloc.so.2")

MiB = 1 << 20


def _by_function(result, name):
    return [s for s in result.stacks if name in s.functions]


def test_names_the_leak_and_not_the_churn(workload):
    w = workload("leak", "2048")
    r = memleak.run(Target.for_pid(w.pid), 5, series_interval=1.0)
    assert r.status == "ok", r.reason
    assert r.allocator == "glibc"
    top = r.stacks[0]
    assert "leak_order_history" in top.functions
    assert top.frees == 0 and top.outstanding_count == top.allocs > 1000
    assert top.outstanding_bytes > 5 * MiB
    assert top.oldest_age_s is not None and top.oldest_age_s > 3
    series = top.series
    assert len(series) == len(r.series_times) >= 5
    assert all(b >= a for a, b in zip(series, series[1:], strict=False)) and series[-1] > series[1]
    churn = _by_function(r, "handle_request")
    assert churn and churn[0].frees >= churn[0].allocs - 100  # freed: not a leak
    assert churn[0].outstanding_bytes < 0.01 * top.outstanding_bytes
    # free's probe sits after its NULL check, on the push the kernel emulates
    assert any(p.startswith("free+") and "emulated" in p and not p.startswith("free+0") for p in r.placements)
    assert r.lost["allocs_dropped"] == 0 and r.cost.map_bytes > 0


def test_cache_series_levels_off(workload):
    w = workload("cache", "16", "2")  # 16 MiB in 2 s, then evicts as it inserts
    r = memleak.run(Target.for_pid(w.pid), 7, series_interval=1.0)
    cache = _by_function(r, "cache_insert")[0]
    assert cache.frees > 1000  # it frees as it inserts once full
    s = cache.series
    assert s[-1] - s[-3] < 0.05 * s[-1]  # flat at the end
    assert 10 * MiB < s[-1] < 20 * MiB


def test_every_entry_point(workload):
    w = workload("bigalloc", "20")
    r = memleak.run(Target.for_pid(w.pid), 3, snoop_min=1 << 20)
    assert r.status == "ok", r.reason
    named = {fn for s in r.stacks for fn in s.functions if fn and fn.startswith("via_")}
    assert named == {
        "via_malloc",
        "via_calloc",
        "via_realloc",
        "via_reallocarray",
        "via_posix_memalign",
        "via_aligned_alloc",
        "via_memalign",
        "via_valloc",
        "via_pvalloc",
        "via_mmap",
    }
    sizes = {
        next(f for f in s.functions if f and f.startswith("via_")): s
        for s in r.stacks
        if any(f and f.startswith("via_") for f in s.functions)
    }
    assert sizes["via_calloc"].outstanding_bytes == 2000 * sizes["via_calloc"].outstanding_count
    assert sizes["via_posix_memalign"].outstanding_bytes == 4000 * sizes["via_posix_memalign"].outstanding_count
    assert sizes["via_mmap"].outstanding_bytes == 65536 * sizes["via_mmap"].outstanding_count
    moved = sizes["via_realloc"]
    assert moved.outstanding_count == 1 and moved.allocs > 20  # realloc moves; it never duplicates
    assert r.lost["failed_allocs"] == 0
    bigs = [b for b in r.big_allocations if "big_buffer" in " ".join(b.frames)]
    assert bigs and all(b.size == 2 << 20 and b.comm == "bigalloc" for b in bigs)


def test_size_filter_and_sampling(workload):
    w = workload("bigalloc", "20")
    r = memleak.run(Target.for_pid(w.pid), 3, min_size=6000, max_size=8000)
    seen = {f for s in r.stacks for f in s.functions if f and f.startswith("via_")}
    assert seen == {"via_memalign", "via_valloc", "via_pvalloc"}  # 6000, 7000, 8000 bytes
    w2 = workload("leak", "4096")
    r2 = memleak.run(Target.for_pid(w2.pid), 3, sample_every=10)
    top = r2.stacks[0]
    assert "leak_order_history" in top.functions
    assert r2.lost["allocs_dropped"] == 0 and r2.sample_every == 10
    assert 100 < top.allocs < 600  # ~3000 allocations, one in ten kept


def test_jemalloc_target(root_required):
    from kit import Workload

    w = Workload("leak", "2048", env={"LD_PRELOAD": JEMALLOC}).start()
    try:
        r = memleak.run(Target.for_pid(w.pid), 3)
    finally:
        w.stop()
    assert r.status == "ok", r.reason
    assert r.allocator == "jemalloc" and r.allocator_module.endswith("libjemalloc.so.2")
    assert "leak_order_history" in r.stacks[0].functions
    assert r.stacks[0].frames[0].startswith("malloc+0x0 [libjemalloc.so.2]")
    assert not r.attach_errors


def test_cpp_under_jemalloc_is_traced_through_its_operator_new(workload):
    """Debian's libjemalloc exports operator new and delete: a C++ program preloading it never
    calls malloc. Its new[] and most deletes only jump to new and free: probed once, there."""
    from memdiag.probes.allocator import find_allocator

    w = workload("errleak_cpp", "200", "7", env={"LD_PRELOAD": JEMALLOC})
    alloc = find_allocator(w.pid)
    assert "_Znam -> _Znwm" in alloc.forwarded and "_ZdlPv -> free" in alloc.forwarded
    assert not any(p.function in ("_Znam", "_ZdlPv") for p in alloc.placements)
    r = memleak.run(Target.for_pid(w.pid), 3, series_interval=1.0)
    assert r.status == "ok" and r.allocator == "jemalloc", r.reason
    take = next(s for s in r.stacks if "OrderDesk::take(long)" in s.functions)
    assert take.functions[0] == "operator new(unsigned long)" and take.frees > 100
    assert 0 < take.outstanding_count < take.allocs  # one in seven is never deleted
    quote = next(s for s in r.stacks if "OrderDesk::quote(long)" in s.functions)
    assert quote.outstanding_count <= 2 and quote.frees > 100  # deleted: the deletes are seen


def test_cpp_operator_new(workload):
    w = workload("cppleak", "2048")
    r = memleak.run(Target.for_pid(w.pid), 3)
    top = r.stacks[0]
    assert top.functions[1] == "operator new(unsigned long)"
    assert top.functions[2] == "OrderBook::record(long)"  # the caller of new, not skipped
    quote = _by_function(r, "OrderBook::quote(long)")
    assert quote and quote[0].frees >= quote[0].allocs - 50


def test_kernel_mode(workload):
    r = memleak.run(Target(kind="system"), 2, kernel_mode=True)
    assert r.status in ("ok", "partial"), r.reason
    assert r.mode == "kernel" and r.cost.events > 0
    assert any(f and ("alloc" in f or "kmem" in f or "page" in f) for s in r.stacks for f in s.functions)


def test_user_mode_needs_a_target():
    r = memleak.run(Target(kind="system"), 1)
    assert r.status == "unavailable" and "needs a process or cgroup" in r.reason


def test_its_uprobes_go_in_as_links_where_the_kernel_has_them_and_one_by_one_elsewhere(workload, monkeypatch):
    """One uprobe_multi link per program, file and direction (6.6+), attached and detached
    together; a kernel without them gets one perf event per uprobe. Either way the same probes
    record the same books: the leak on top, every entry point placed."""
    from memdiag.probes import bpfobj

    w = workload("leak", "2048")
    linked = memleak.run(Target.for_pid(w.pid), 3)
    monkeypatch.setattr(bpfobj, "_MULTI", [False])  # as on a kernel before 6.6
    alone = memleak.run(Target.for_pid(w.pid), 3)
    release = tuple(int(x) for x in os.uname().release.split(".")[:2])
    if release >= (6, 6):
        assert "uprobe_multi link" in linked.method, linked.method
    assert "one perf event per uprobe" in alone.method, alone.method
    for r in (linked, alone):
        assert r.status == "ok", r.reason
        assert "leak_order_history" in r.stacks[0].functions and r.stacks[0].frees == 0
    assert linked.placements == alone.placements
    assert linked.detach_s is not None and alone.detach_s is not None
    print(f"detach: {linked.detach_s * 1000:.0f} ms as links, {alone.detach_s * 1000:.0f} ms one by one")
    if release >= (6, 6):  # one grace period for all of them, not one per probe (2.3 s one by one)
        assert linked.detach_s < 0.5, linked.detach_s


def test_a_program_allocating_once_a_second_is_priced_not_sent_to_the_fallback(workload):
    """bigalloc at one round a second: its calls come in one burst the quarter-second count misses
    three times in four; the count repeated for longer sees it, so memleak is priced and attaches
    (a fallback would name no allocation stack). A program that never allocates still falls back."""
    from memdiag.probes.face import Budget, Context
    from memdiag.probes.memleak.plan import plan

    ctx = Context(seconds=12.0, budget=Budget(percent=2.0, window_s=30.0))
    w = workload("bigalloc", "1")
    for _ in range(3):  # three prices, each from its own counts
        p = plan(Target.for_pid(w.pid, "bigalloc"), ctx)
        assert p.state == "full", p.reason
        assert p.site_rates and sum(p.site_rates.values()) > 0, p.site_rates
    with subprocess.Popen(["sleep", "60"]) as idle:  # libc's, and not one call to it while asleep
        try:
            time.sleep(0.2)
            p = plan(Target.for_pid(idle.pid, "sleep"), ctx)
        finally:
            idle.kill()
    assert p.state == "fallback", p.reason
    assert "nor in 1.2" in p.reason and "more of counting them all together" in p.reason, p.reason
