"""reach: is anything still pointing at memleak's outstanding blocks?

A conservative reachability scan of a live process, the way vmware/chap classifies the
allocations of a core file and LeakSanitizer the heap at exit, but on the running target with
memleak's allocation stacks. A block is *anchored* when a root points into it (any pointer-sized,
pointer-aligned word whose value falls inside [start, start + size)), or an anchored block does;
*leaked* otherwise; *unreferenced* when leaked and no other block points at it either.

Roots: every thread's registers; each thread's stack from its stack pointer (less the x86-64
red zone) up, which holds its TLS too; modules' writable data (.data, .bss and the anonymous
mapping after it); and every other readable, writable mapping outside the tracked blocks. That
last part is the heap memdiag did not see allocated (before memleak attached) and memory the
allocator holds free: it is counted as potentially live, so a block it points at is anchored. The
scan can therefore miss a leak (a stale pointer in freed memory), never invent one. Pages neither
resident nor swapped hold zeros or the file's own bytes and are not read (/proc/PID/pagemap);
swapped pages are read (that pages them in: counted in the result); device mappings are skipped.

Consistency: every thread is stopped (PTRACE_SEIZE + PTRACE_INTERRUPT, waited for) before
memleak's block table is read and memory is scanned, and resumed right after: blocks, registers
and pointers are one instant's. A thread stopped inside malloc or free is between two table
updates that have not happened yet, so nothing half-done is a candidate. If memdiag dies while
the target is stopped, the kernel detaches and the target runs on. The pause is priced before
(bytes to read x this host's measured scan speed) and measured."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from memdiag.system import identity
from memdiag.system.target import Target
from memdiag.system.units import fmt_duration, fmt_mib, fmt_speed

# numpy's bundled OpenBLAS starts a thread per core at import; the scan does no linear algebra.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from ...face import StackReach
from ...procmaps import AddressSpace, parse_maps
from ...stacks import Symbolizer
from . import allocmeta, untraced
from .anchors import label, runtime_label
from .boost import scan_priority
from .graph import reachability, stack_figures
from .match import scan_memory
from .model import ANCHOR_KIND, TIER_NONE, TIER_UNTRACKED, Blocks, ReachScan, ScanAborted, merged
from .pause import MAX_SCAN_MAPPINGS, Price, fitted, price
from .regions import readable_regions
from .stop import alive, check_stoppable, stopped

JOIN_TICK_S = 0.05  # how often the waiting thread looks for a signal (the engine's waits tick alike)

__all__ = ["Blocks", "ReachScan", "StackReach", "fitted", "merged", "price", "scan"]


def scan(
    pid: int,
    read_blocks: Callable[[bool], Blocks],
    allowed_ms: float | None,
    interrupted: Callable[[], bool] = lambda: False,
    namer: Callable[[int, int, int], str | None] | None = None,
    allocator: str | None = None,
    runtime_modules: frozenset[str] = frozenset(),
    target: Target | None = None,
) -> tuple[ReachScan, dict[int, StackReach]]:
    """Price, stop, read the blocks, scan, resume, classify. read_blocks(final) returns the
    outstanding blocks: once while the target runs (final False, to price the scan), once with it
    stopped (final True: the probe's books stop there). allowed_ms: the longest pause allowed (None:
    no limit); the scan gives up, resumes the target and concludes nothing when it gets there, or
    when interrupted() says so (SIGINT, SIGTERM). namer(word address, block start, size): the holder
    of a block in the runtime's own terms (a CPython global: probes/cpython/holder.py), or None.
    allocator: memleak's name for the target's allocator, whose own metadata is no root (allocmeta).
    runtime_modules: the modules of the target's CPython, whose data are roots last and whose
    allocator's arena records are no references (allocmeta.pymalloc_records). target: the process
    pid is (system/identity.py): before it is priced, before its threads are seized and once they
    are, it must still be that process, or nothing is stopped, read or concluded."""
    import numpy  # noqa: F401  (imported before the table read is timed: the import is not part of a pause)

    def same() -> None:
        change = target.changed() if target is not None else identity.check_pid(pid)
        if change is not None:
            raise ScanAborted(f"{change.describe()}: the scan stopped and concluded nothing")

    links = allocator == "glibc" and not runtime_modules  # a runtime's heap names its own holders
    # priced at memdiag's own priority while the target runs: how much work the price does is the
    # target's to set (its outstanding blocks), so it never preempts the host's tasks; it is timed by
    # this thread's CPU time, which waiting for a CPU on a busy host does not inflate (boost.py)
    est = _priced(pid, read_blocks, allowed_ms, same, links)
    if isinstance(est, ReachScan):
        return est, {}
    est = fitted(est, allowed_ms)
    info = dict(planned_bytes=est.planned_bytes, priced_ms=est.ms, allowed_ms=allowed_ms)
    if est.links_unpaid_ms is not None:
        info["untraced_unpaid_ms"] = est.links_unpaid_ms
    refused = _not_stopped(est, allowed_ms, info)
    if refused is not None:
        return refused, {}
    try:
        check_stoppable(pid)
        same()
    except ScanAborted as e:
        return ReachScan(status="failed", reason=str(e), **info), {}
    box: dict = {}
    # The stop is held by a process of its own (stop.stopped: holder.py), which resumes the target at
    # --max-pause and a margin even if this thread is stuck, and whose end in any way resumes it too
    # (the kernel detaches every tracee of an exiting tracer: exit_ptrace).
    worker = threading.Thread(
        target=_stop_and_scan,
        args=(pid, read_blocks, allowed_ms, interrupted, est, box, allocator, runtime_modules, same),
        name="memdiag-reach",
    )
    _run_waited(worker, interrupted)
    return _concluded(pid, target, box, info, namer)


def _priced(
    pid: int,
    read_blocks: Callable[[bool], Blocks],
    allowed_ms: float | None,
    same: Callable[[], None],
    links: bool = False,
) -> Price | ReachScan:
    """The scan priced while the target runs (its blocks read once, timed), or the result saying why
    not; links: glibc's chunks allocated before the trace will be walked and followed (untraced.py)."""
    try:
        same()
        t = time.thread_time()
        ahead = read_blocks(False)
        est = price(pid, ahead, (time.thread_time() - t) * 1000, allowed_ms, links)
        same()  # what the price read (maps, page map, a sample of memory) was the target's
    except ScanAborted as e:
        return ReachScan(status="failed", reason=str(e))
    if est is None:
        return ReachScan(status="failed", reason="the target is gone")
    return est


def _not_stopped(est: Price, allowed_ms: float | None, info: dict) -> ReachScan | None:
    """The result where the price leaves the target running (no block, refused, over the pause allowed); None: go on."""
    if not est.blocks:
        return ReachScan(status="ran", reason="no outstanding block to check: the target was not stopped", **info)
    if est.refused:
        return ReachScan(status="skipped", reason=est.refused, **info)
    if allowed_ms is not None and est.ms is not None and est.ms > allowed_ms:
        swap = f", {fmt_mib(est.swapped_bytes)} of it in swap," if est.swapped_bytes else ""
        why = (
            f"reading {est.planned_bytes / 2**20:,.0f} MiB of writable memory{swap} at {fmt_speed(est.speed)} "
            f"(sampled on the target) and {est.blocks:,} blocks would pause the target "
            f"~{fmt_duration(est.ms / 1000)} > {fmt_duration(allowed_ms / 1000)} allowed "
            "(a larger --budget, a longer --duration or --max-pause lets it run)"
        )
        return ReachScan(status="skipped", reason=why, **info)
    return None


def _run_waited(worker: threading.Thread, interrupted: Callable[[], bool]) -> None:
    """Run the stop and scan's thread, waiting for it a tick at a time."""
    worker.start()
    while worker.is_alive():
        # asked each tick, so a signal is seen here at once (the scan thread stops at it too): the
        # CLI's deadline (system/signals.py) then gives the stop its time rather than ending it
        interrupted()
        worker.join(JOIN_TICK_S)


def _concluded(
    pid: int, target: Target | None, box: dict, info: dict, namer: Callable[[int, int, int], str | None] | None
) -> tuple[ReachScan, dict[int, StackReach]]:
    """The result from the scan's box once the target runs again: failed, no block, target changed, or classified."""
    if "error" in box:
        e = box["error"]
        reason = str(e) if isinstance(e, ScanAborted) else f"reading the target's memory failed: {e}"
        return ReachScan(status="failed", reason=reason, paused_ms=box.get("paused_ms"), **info), {}
    if "empty" in box:
        return ReachScan(status="ran", reason="no outstanding block", paused_ms=box["paused_ms"], **info), {}
    change = target.changed() if target is not None else identity.check_pid(pid)
    if change is not None or not alive(pid):
        what = change.describe() if change is not None else "the target exited"
        why = f"{what} during the scan: nothing is concluded from it"
        return ReachScan(status="failed", reason=why, paused_ms=box["paused_ms"], **info), {}
    return _classify(box, info, namer)


def _stop_and_scan(
    pid,
    read_blocks,
    allowed_ms,
    interrupted,
    est: Price,
    box: dict,
    allocator=None,
    runtime_modules=frozenset(),
    same: Callable[[], None] | None = None,
) -> None:
    t0, times = time.monotonic(), {}

    def stop_check(done: int) -> None:
        if interrupted():
            raise ScanAborted("interrupted: the target was resumed and nothing is concluded from a partial scan")
        spent = (time.monotonic() - (times.get("stopped_at") or t0)) * 1000  # since the holder's first seize
        if allowed_ms is not None and spent > allowed_ms:
            raise ScanAborted(
                f"stopped at the {fmt_duration(allowed_ms / 1000)} pause allowed, after {fmt_mib(done)} of "
                f"{fmt_mib(est.planned_bytes)} (the target was resumed; a partial scan concludes nothing)"
            )

    try:
        with scan_priority(pid) as priority, stopped(pid, allowed_ms, same=same, times=times) as threads:
            box["priority"] = priority
            blocks = read_blocks(True)
            if not len(blocks.starts):
                box["empty"] = True
                return
            blocks = blocks.sort()
            # every mapping (not parse_maps' bounds): a region left out would make the blocks it holds look leaked
            maps = _every_mapping(pid)
            space = AddressSpace(pid, maps, root=f"/proc/{pid}/root")
            regions = readable_regions(space, threads, est.tls_bytes, blocks, runtime_modules)
            meta = _allocator_metadata(pid, regions, allocator)
            regions = allocmeta.carve(regions, meta)
            box["meta"] = meta
            t_scan = time.monotonic()
            links = None
            if est.links:
                blocks, links, box["free"] = untraced.linked(pid, blocks, maps, lambda: stop_check(0))
                box["untraced"] = int(links.sum()) if links is not None else 0
            found = scan_memory(
                pid, blocks, regions, threads, stop_check, pymalloc=bool(runtime_modules), untraced=links
            )
            box["links"] = links
            scan_s = time.monotonic() - t_scan
        box.update(threads=threads, blocks=blocks, space=space, regions=regions, found=found, scan_s=scan_s)
    except Exception as e:  # handed to the caller's thread; the stop ends with this thread either way
        box["error"] = e
    finally:
        box["paused_ms"] = _paused_ms(times, t0)


def _paused_ms(times: dict, t0: float) -> float:
    """How long the target was stopped, by the holder's clock (stop.stopped's times); where it said
    nothing, the whole stop from before the holder started (more than the target paid)."""
    start, end = times.get("stopped_at"), times.get("resumed_at")
    if start is not None and end is not None and end >= start:
        return (end - start) * 1000
    return (time.monotonic() - t0) * 1000


def _every_mapping(pid: int):
    """Every mapping of pid, read a line at a time, for the scan under the stop: ScanAborted past
    MAX_SCAN_MAPPINGS (the price refused such a process; it may have made more since)."""
    with open(f"/proc/{pid}/maps", errors="replace") as f:

        def lines():
            for n, line in enumerate(f):
                if n >= MAX_SCAN_MAPPINGS:
                    raise ScanAborted(
                        f"the target has more than {MAX_SCAN_MAPPINGS:,} mappings: the target was resumed, "
                        "nothing is concluded"
                    )
                yield line

        return parse_maps(lines(), bounded=False)


def _allocator_metadata(pid: int, regions, allocator: str | None) -> allocmeta.Metadata:
    fd = identity.open_mem(pid, os.O_RDONLY)
    try:
        return allocmeta.find(lambda at, size: os.pread(fd, size, at), regions, allocator)
    finally:
        os.close(fd)


def _classify(box: dict, info: dict, namer=None) -> tuple[ReachScan, dict[int, StackReach]]:
    """Leaked or anchored per block, the anchors named, per group; after the target runs again."""
    import numpy as np

    blocks, found, threads, space, regions = box["blocks"], box["found"], box["threads"], box["space"], box["regions"]
    links = box.get("links")
    late = links if links is not None and found.graph else None
    free = box.get("free") if late is not None else None
    anchored, seed_of, referenced = reachability(len(blocks.starts), found, late, free)
    traced = blocks.groups >= 0
    if late is not None:
        _late_roots(found, blocks, regions, seed_of, anchored & traced, late)
    by_tid = {t.tid: t for t in threads}
    symbolizer = Symbolizer(space)
    labels = {}
    for seed in np.unique(seed_of[anchored & traced]).tolist():
        try:
            labels[seed] = runtime_label(seed, found, blocks, namer) or label(
                seed, found, regions, by_tid, space, symbolizer
            )
        except Exception:  # a malformed module must not cost the result: the tier still says what held it
            labels[seed] = (ANCHOR_KIND[int(found.root_tier[seed])], "a root memdiag could not name")
    per_group = stack_figures(blocks, anchored, seed_of, referenced, labels)
    scan_s = box["scan_s"]
    return (
        ReachScan(
            status="ran",
            paused_ms=box["paused_ms"],
            scanned_bytes=found.scanned,
            swapped_bytes=found.swapped,
            unreadable_bytes=found.unreadable,
            regions=len(regions),
            threads=len(threads),
            blocks=int(traced.sum()),
            references=found.edge_count,
            untraced_chunks=box.get("untraced", 0),
            untraced_as_roots=not found.graph,
            speed_bytes_per_s=found.scanned / scan_s if scan_s > 0 else None,
            allocator_metadata_bytes=box["meta"].bytes,
            allocator_metadata=box["meta"].what,
            priority=box.get("priority", ""),
            **info,
        ),
        per_group,
    )


def _late_roots(found, blocks, regions, seed_of, held, late) -> None:
    """The untraced chunks that anchor traced blocks from the second walk (no root reaches them):
    roots of memory memdiag did not see allocated, at their own first byte, for their label."""
    import bisect

    import numpy as np

    starts = [r.start for r in regions]
    for seed in np.unique(seed_of[held]).tolist():
        if not late[seed] or found.root_tier[seed] != TIER_NONE:
            continue
        at = int(blocks.starts[seed])
        i = bisect.bisect_right(starts, at) - 1
        found.root_tier[seed] = TIER_UNTRACKED
        found.root_addr[seed] = at
        found.root_region[seed] = max(i, 0)
