"""The reachability scan on the real kernel, on real processes: leaked blocks are the ones nothing
points at, held ones are anchored with the root named, and nothing that is only in flight (in a
register, another thread's stack, a list being rewritten) is ever called leaked."""

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from memdiag.probes import memleak
from memdiag.probes.memleak import reach
from memdiag.system import arch
from memdiag.system.target import Target

MiB = 1 << 20
JEMALLOC = arch.library("libjemalloc.so.2")


def _scan(w, seconds: float = 6, allowed_ms: float | None = None):
    r = memleak.run(Target.for_pid(w.pid), seconds, series_interval=1.0, scan_reach=True, reach_allowed_ms=allowed_ms)
    assert r.status == "ok", r.reason
    assert r.reach_scan is not None and r.reach_scan.status == "ran", r.reach_scan
    assert r.reach_scan.paused_ms is not None and r.reach_scan.paused_ms > 0
    assert _state(w.pid) in ("S", "R")  # running again
    return r


def _stack(r, function: str):
    found = [s for s in r.stacks if function in s.functions]
    assert found, [s.functions[:3] for s in r.stacks]
    return found[0]


def test_error_branch_leak_is_leaked_one_in_seven(workload):
    w = workload("errleak", "2000", "7")
    r = _scan(w)
    s = _stack(r, "process_order")
    assert s.reach.anchored_count <= 2  # at most an order in flight on the stack
    assert s.reach.leaked_count == s.outstanding_count - s.reach.anchored_count
    # the books stopped with the target at the scan: every leaked block is one the stack did not free
    assert s.allocs - s.frees == s.outstanding_count
    assert 6.0 <= s.allocs / s.reach.leaked_count <= 8.0
    assert r.leak_stack() is s
    assert _stack(r, "handle_request").outstanding_count <= 1


def test_leaked_list_is_leaked_and_only_heads_unreferenced(workload):
    w = workload("leaklist", "50")
    r = _scan(w)
    s = _stack(r, "new_node")
    batches = s.reach.leaked_count / 16
    assert s.reach.leaked_count > 1000
    # nodes point at each other: only the head of each leaked list has nothing pointing at it
    assert abs(s.reach.unreferenced_count - batches) <= 1
    assert r.reach_scan.references >= s.reach.leaked_count - s.reach.unreferenced_count


def test_registry_is_anchored_by_the_global_array(workload):
    w = workload("registry", "1000")
    r = _scan(w)
    s = _stack(r, "register_entry")
    why = (s.outstanding_count, s.reach, r.reach_scan.describe())  # CI failed here once, unseen: say it all
    assert s.reach.leaked_count == 0, why
    assert s.reach.anchored_count == s.outstanding_count > 1000, why
    assert s.reach.anchor == "`registry` in registry's .bss", why
    assert s.reach.anchor_kind == "static" and s.reach.anchor_bytes == s.outstanding_bytes, why


def test_bounded_cache_is_anchored(workload):
    w = workload("cache", "16", "2")
    r = _scan(w, seconds=5)
    s = _stack(r, "cache_insert")
    assert s.reach.leaked_count == 0 and s.reach.anchored_count == s.outstanding_count > 100
    # the ring was calloc()ed before memleak attached: walked by its chunk header, a link from the
    # global that holds it (it was "memory memdiag did not see allocated ([heap])")
    assert s.reach.anchor_kind == "static" and s.reach.anchor == "`ring` in cache's .bss", s.reach


def test_cplusplus_new_leak(workload):
    w = workload("errleak_cpp", "2000", "7")
    r = _scan(w)
    s = _stack(r, "OrderDesk::take(long)")
    assert "operator new(unsigned long)" in s.functions
    assert 6.0 <= s.allocs / s.reach.leaked_count <= 8.0
    assert (
        _stack(r, "OrderDesk::quote(long)").reach is None or _stack(r, "OrderDesk::quote(long)").reach.leaked_count == 0
    )


@pytest.mark.parametrize(("rate", "size"), [("2000", "1024"), ("300", "65536")])
def test_jemalloc_leak(workload, rate, size):
    """1 KiB orders share page-sized slabs, 64 KiB ones are extents of their own: jemalloc's record of
    every extent pointed at the first (a quarter of the leak anchored) and at every one of the second
    (all of it anchored: the leak was invisible)."""
    w = workload("errleak", rate, "7", size, env={"LD_PRELOAD": JEMALLOC})
    r = _scan(w)
    assert r.allocator == "jemalloc"
    s = _stack(r, "process_order")
    # jemalloc's records of its extents point at each page-sized slab's first 1 KiB region (a quarter of
    # the leak was anchored there) and its thread caches keep stale slots for regions they handed out:
    # neither is a root, so the leak is 1 in 7, as under glibc
    assert s.reach.anchored_count <= 2, s.reach  # at most an order in flight on the stack
    assert 6.5 <= s.allocs / s.reach.leaked_count <= 7.5
    assert r.reach_scan.allocator_metadata_bytes > 0
    assert "jemalloc's base blocks" in r.reach_scan.describe() and "stale slots" in r.reach_scan.describe()


def test_blocks_held_in_other_threads_are_not_leaked(workload):
    w = workload("threads", "500")
    r = _scan(w)
    held = _stack(r, "hold_in_registers")
    assert held.reach is None or held.reach.leaked_count == 0
    leaky = _stack(r, "leaky_step")
    assert leaky.reach.leaked_count > 100
    assert r.reach_scan.threads == 4


@pytest.mark.parametrize("attempt", [1, 2])
def test_pointers_rewritten_in_a_tight_loop_are_never_leaked(workload, attempt):
    w = workload("shuffle", "4096")
    r = _scan(w, seconds=4)
    s = _stack(r, "add_node")
    assert s.reach.leaked_count == 0
    assert s.reach.anchored_count == s.outstanding_count > 100
    # Which root is credited depends on the instant of the stop: the lists' heads (.bss), nodes
    # allocated before memleak attached (untracked), or a register or local that points into a
    # run of nodes behind an untracked one (free_oldest walks the lists with interior pointers).
    assert s.reach.anchor is not None and s.reach.anchor_bytes > 0, s.reach


@pytest.mark.alone  # a scan's speed on this host: the machine to itself
def test_a_one_gib_target_is_priced_skipped_over_budget_and_measured_when_allowed(workload):
    w = workload("bigheap", "1024")
    r = memleak.run(Target.for_pid(w.pid), 3, scan_reach=True, reach_allowed_ms=50)
    scan = r.reach_scan
    assert scan.status == "skipped" and scan.paused_ms is None
    assert scan.planned_bytes >= 1 << 30, scan.reason  # the whole heap, walked or (cut short) estimated
    if "walking the page map" in scan.reason:  # the walk alone passed 50 ms (a fresh machine's CI did)
        assert "of anonymous memory resident to scan (its RssAnon, an estimate)" in scan.reason
    else:
        assert scan.priced_ms > 50 and "> 50 ms allowed" in scan.reason and "MiB of writable memory" in scan.reason
        assert "(sampled on the target)" in scan.reason
    assert all(s.reach is None for s in r.stacks)
    r = _scan(w, seconds=3, allowed_ms=10_000)
    scan = r.reach_scan
    assert scan.scanned_bytes >= 1 << 30
    # the speed stated is the scan's own (how fast is this host's memory: BENCHMARKS.md section 5, not
    # a test: CI's alone phase once scanned at 0.97 GiB/s where 1.2-1.5 are usual): its time within the pause
    assert 0 < scan.scanned_bytes / scan.speed_bytes_per_s * 1000 <= scan.paused_ms
    assert scan.paused_ms < 10_000
    assert _stack(r, "leak_slowly").reach.leaked_count > 10


def test_scan_needs_a_process(workload):
    r = memleak.run(Target(kind="system"), 1, kernel_mode=True, scan_reach=True)
    assert r.reach_scan is not None and r.reach_scan.status == "skipped"
    assert "process target" in r.reach_scan.reason


@pytest.mark.alone  # a sub-second bound on this host's clock: the machine to itself
def test_the_pause_stops_at_its_limit_and_the_target_runs_on(workload, monkeypatch):
    """A price can be wrong (the target's memory changed since it was sampled): the scan gives up at
    the pause allowed, resumes the target, and concludes nothing from a partial scan."""
    w = workload("bigheap", "1024")
    real_price = reach.price

    def underpriced(*args):
        p = real_price(*args)
        return dataclasses.replace(p, speed=p.speed * 100, fixed_ms=0.0)

    monkeypatch.setattr(reach, "price", underpriced)
    r = memleak.run(Target.for_pid(w.pid), 3, scan_reach=True, reach_allowed_ms=60)
    scan = r.reach_scan
    assert scan.status == "failed" and "stopped at the 60 ms pause allowed" in scan.reason, scan
    assert 60 <= scan.paused_ms < 60 + 250  # one chunk past the limit at most, on a loaded machine
    assert all(s.reach is None for s in r.stacks)
    assert _state(w.pid) in ("S", "R")


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def test_growth_held_in_thread_local_storage_names_the_variable(workload):
    w = workload("tlsheld", "1000")
    r = _scan(w, seconds=4)
    s = _stack(r, "keep_in_tls")
    assert s.reach.leaked_count == 0 and s.reach.anchored_count == s.outstanding_count > 1000
    assert s.reach.anchor_kind == "tls"
    assert s.reach.anchor == f"`mine` (thread-local) in the thread-local storage of thread {w.pid} (main thread)"


def test_a_stack_in_the_heap_is_not_dead_memory(workload):
    """The coroutine's stack pointer is inside [heap]: what lies below it is other blocks, not
    a dead stack, so the two blocks held there by the registry array are anchored."""
    w = workload("coroutine", "300")  # keep_pair() runs 3 s after start, while memleak is attached
    r = _scan(w, seconds=5)
    kept = [s for s in r.stacks if "keep_pair" in s.functions]  # two call sites, two stacks
    assert sum(s.outstanding_count for s in kept) == 2
    assert sum(s.reach.anchored_count for s in kept) == 2 and sum(s.reach.leaked_count for s in kept) == 0
    assert _stack(r, "drop_one").reach.leaked_count > 100


def test_small_glibc_blocks_are_not_anchored_by_the_next_chunk(workload):
    """A 24-byte block's last word is the next chunk's header under glibc: pointers the allocator
    keeps to that chunk (bins, the top chunk) must not anchor it."""
    w = workload("errleak", "2000", "7", "8")  # malloc(16 + 8)
    r = _scan(w)
    s = _stack(r, "process_order")
    assert 6.0 <= s.allocs / s.reach.leaked_count <= 8.0, s.reach


def test_a_traced_target_is_left_alone(workload):
    import subprocess
    import time

    w = workload("errleak", "2000", "7")
    tracer = subprocess.Popen(["strace", "-q", "-o", "/dev/null", "-p", str(w.pid)])
    try:
        deadline = time.monotonic() + 30
        while f"TracerPid:\t{tracer.pid}\n" not in Path(f"/proc/{w.pid}/status").read_text():
            assert time.monotonic() < deadline, "strace never attached"
            time.sleep(0.05)  # until strace has attached: the kernel says so in TracerPid
        r = memleak.run(Target.for_pid(w.pid), 2, scan_reach=True)
        scan = r.reach_scan
        assert scan.status == "failed" and scan.paused_ms is None
        assert f"is traced by PID {tracer.pid} (strace)" in scan.reason
    finally:
        tracer.terminate()
        tracer.wait()
    assert _state(w.pid) in ("S", "R")


def test_call_paths_through_one_wrapper_stay_apart_without_frame_pointers(workload):
    """-O2 C++ without frame pointers: take() leaks 1 in 5 Sessions through operator new, append()
    holds every Entry through operator new. Booked to one stack they read as 30% leaked (not a leak);
    apart, take()'s stack is the leak and append()'s is held."""
    w = workload("cxxpaths", "2000", flags=["-O2", "-fomit-frame-pointer"])
    r = _scan(w)
    take = _stack(r, "take(long)")
    assert "append(long)" not in take.functions
    assert take.reach.anchored_count <= 2 and 4.0 <= take.allocs / take.reach.leaked_count <= 6.0
    held = [s for s in r.stacks if "append(long)" in s.functions and "take(long)" not in s.functions]
    assert sum(s.reach.anchored_count for s in held) >= 100 and sum(s.reach.leaked_count for s in held) == 0


def test_python_arenas_are_held_by_the_global_not_by_pymalloc_records(workload):
    # 80,000 small objects a second: pymalloc's array of arena records grows by realloc while
    # memleak traces (so it is a tracked block, and the arrays it left behind keep their records),
    # and the eval loop's C frames point at the newest arena. Both once named the holder of every
    # arena ("`arenas` in libpython's .bss", "the stack of thread N, in clock_nanosleep()").
    w = workload("pysmall", "80000")
    r = _scan(w)
    arenas = [s for s in r.stacks if s.frames and s.frames[0].startswith("mmap") and s.reach]
    held = sum(s.reach.anchored_bytes for s in arenas)
    assert held >= 8 * MiB, [(s.frames[:3], s.reach) for s in r.stacks]
    named = sum(s.reach.anchor_bytes for s in arenas if s.reach.anchor == "`__main__.seen` (a list)")
    assert named * 10 >= held * 9, [(s.reach.anchor, s.reach.anchor_bytes) for s in arenas]


def test_a_niced_memdiag_on_a_busy_host_scans_within_the_pause_allowed(workload, monkeypatch):
    """memdiag runs niced (10) so its work yields to the services it watches; while the target is
    stopped, though, its threads wait on the scan. On a host busy with four CPU-bound processes a
    core, a niced scan was priced and paused at 1/40 of its speed (a 10 MiB tcmalloc heap matched at
    50 MiB/s, or no byte read before the pause allowed ran out): it ran at real-time priority."""
    import os
    import subprocess
    import sys

    from memdiag.probes.memleak import session

    w = workload("bigheap", "128")
    real_scan = session.scan

    def on_a_busy_host(*args, **kw):
        nice = os.getpriority(os.PRIO_PROCESS, 0)
        busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(4 * (os.cpu_count() or 1))]
        try:
            os.setpriority(os.PRIO_PROCESS, 0, 10)  # memdiag's own niceness (diagnose/commands/run.py)
            return real_scan(*args, **kw)
        finally:
            os.setpriority(os.PRIO_PROCESS, 0, nice)
            for p in busy:
                p.kill()
                p.wait()

    monkeypatch.setattr(session, "scan", on_a_busy_host)
    r = _scan(w, seconds=4, allowed_ms=1000)  # --max-pause's default
    scan = r.reach_scan
    assert scan.scanned_bytes >= 128 * MiB and scan.paused_ms < 1000
    assert scan.priority == "real-time priority (SCHED_FIFO 1)", scan.priority
    assert "memdiag's scan at real-time priority" in scan.describe()
    assert _stack(r, "leak_slowly").reach.leaked_count > 0


def test_a_global_map_is_named_through_nodes_allocated_before_the_trace(workload):
    """g_index, a global std::map, was built before memleak attached: the records added while it
    traces hang in nodes under nodes no trace saw allocated. Those are walked by glibc's chunk headers
    as links, so the holder is the global, not "memory memdiag did not see allocated ([heap])"."""
    w = workload("prebuilt", "1000", "4000")
    r = _scan(w, seconds=4)
    # the Record, the 24-byte Entry that points at it from its last word (glibc's
    # next prev_size: a word of the Entry's, not a root), and the map's node
    kept = [s for s in r.stacks if "index_record(long)" in s.functions and s.reach]
    assert kept and sum(s.outstanding_count for s in kept) > 2000, [s.functions[:3] for s in r.stacks]
    for s in kept:
        assert s.reach.leaked_count == 0 and s.reach.anchored_count == s.outstanding_count, s.reach
        assert s.reach.anchor == "`g_index` in prebuilt's .bss", (s.functions[:3], s.reach)
        assert s.reach.anchor_kind == "static" and s.reach.anchor_bytes * 10 >= s.outstanding_bytes * 9, s.reach
    assert r.reach_scan.untraced_chunks > 4000 and "followed as links from the roots" in r.reach_scan.describe()


def test_the_price_runs_at_memdiags_own_priority_and_only_the_stop_at_real_time(workload):
    """The work of pricing is the target's to set (its outstanding blocks: the leak itself): done at
    real-time priority while the target runs, it preempted every task of the host. Priced at the
    thread's own policy (SCHED_OTHER), then real time only while the target is stopped."""
    import os

    w = workload("leak", "100")
    heap = next(m for m in _maps(w.pid) if m[2] == "[heap]")
    policies = {}

    def read_blocks(final: bool):
        policies[final] = os.sched_getscheduler(0)
        start = np.array([heap[0] + 4096], dtype=np.uint64)
        return reach.Blocks(start, np.array([64], dtype=np.uint64), np.array([0], dtype=np.int64))

    assert os.sched_getscheduler(0) == os.SCHED_OTHER
    scan, _groups = reach.scan(w.pid, read_blocks, 1000.0)
    assert scan.status == "ran", scan
    assert policies == {False: os.SCHED_OTHER, True: os.SCHED_FIFO}, policies
    assert os.sched_getscheduler(0) == os.SCHED_OTHER  # restored after the stop


def _maps(pid: int) -> list[tuple[int, int, str]]:
    out = []
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        parts = line.split()
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        out.append((lo, hi, parts[5] if len(parts) > 5 else ""))
    return out


def test_the_walk_of_mmapped_chunks_looks_at_the_clock(workload):
    """64 MiB tiled with fake one-page mmapped chunks' headers: 16 Ki preads, walked with the clock
    looked at every TICK_CHUNKS, so the scan's own tick stops it at the pause allowed (before: never
    looked at, past --max-pause)."""
    import os

    from memdiag.probes.memleak.reach import untraced
    from memdiag.probes.memleak.reach.model import ScanAborted
    from memdiag.probes.procmaps import parse_maps
    from memdiag.system import identity

    w = workload("hostilearena", "tiles")
    words = w.proc.stdout.readline().decode().split()
    assert words[0] == "tiles"
    at = int(words[1])
    tiled = [m for m in parse_maps(Path(f"/proc/{w.pid}/maps").read_text()) if m.start == at]
    assert len(tiled) == 1 and not tiled[0].path
    looks = []

    def tick() -> None:
        looks.append(1)
        if len(looks) > 2:
            raise ScanAborted("the pause allowed")

    fd = identity.open_mem(w.pid, os.O_RDONLY)
    try:
        with pytest.raises(ScanAborted):
            untraced.find(fd, tiled, np.zeros(0, dtype=np.uint64), tick)
        found = untraced.find(fd, tiled, np.zeros(0, dtype=np.uint64))  # with no clock: every tile
    finally:
        os.close(fd)
    assert len(found) == (64 << 20) // 4096
