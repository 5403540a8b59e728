"""Pricing the pause before the target is stopped, on the target itself: the resident bytes of its
writable mappings over the speed of matching a sample of them against its blocks, swapped bytes at
swap speed, and the fixed part; and refusing a scan whose reading back of swap could push the target
into the OOM killer. Every time here is the pricing thread's own CPU time (time.thread_time, system
calls included): the price runs at memdiag's own (niced) priority while the target runs, and the scan
it stands for runs at real-time priority under the stop (boost.py), so the work, not the waits for a
CPU on a busy host, is what is priced."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from pathlib import Path

from memdiag.system import identity
from memdiag.system.units import fmt_duration, fmt_mib

from ...mapping import MAX_CODE_MAPPINGS, MAX_DATA_MAPPINGS
from ...procmaps import AddressSpace
from . import untraced
from .match import Matcher
from .model import CHUNK, PAGE, Blocks, ScanAborted
from .regions import present_runs, readable_regions, static_tls_bytes
from .stop import thread_ids

# The most mappings a scan reads (every one, under the stop): as many as the symbolizer keeps
MAX_SCAN_MAPPINGS = MAX_CODE_MAPPINGS + MAX_DATA_MAPPINGS
SAMPLE_CHUNKS = 16  # chunks of the target's memory matched while it runs, to price the pause
SWAP_READ_BYTES_PER_S = 50 << 20  # reading swapped pages back: random 4 KiB reads of a virtual disk
FIXED_MS = 2.0  # listing the mappings and the threads under the stop (measured: ~1 ms)
STOP_MS_PER_THREAD = 0.3  # seizing, interrupting, waiting for and detaching one thread (measured: 0.1-0.2)


# Before memleak attaches there are no blocks to sample the speed against: the reserve for the scan
# that ends a shortened trace uses a prior between the 0.3 GiB/s of a pointer-dense redis and the
# 1.6-1.7 GiB/s of a heap of 64 KiB blocks measured here (BENCHMARKS.md section 5), an estimate
PRIOR_BYTES_PER_S = 1 << 30


def _resident_anon(pid: int) -> int | None:
    """pid's resident anonymous bytes (RssAnon), or None."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    return next((int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("RssAnon:")), None)


def reserve_ms(pid: int) -> float | None:
    """An estimate, before memleak attaches, of the pause a scan of pid at the trace's end would
    cost: its resident anonymous memory at PRIOR_BYTES_PER_S, and the fixed part. None: unknown."""
    anon = _resident_anon(pid)
    if anon is None:
        return None
    return FIXED_MS + STOP_MS_PER_THREAD * len(thread_ids(pid)) + anon / PRIOR_BYTES_PER_S * 1000


@dataclass
class Price:
    planned_bytes: int
    swapped_bytes: int
    speed: float | None  # bytes a second, sampled on the target's own memory against its blocks
    fixed_ms: float  # stopping the threads, reading the table, walking the page map
    blocks: int
    tls_bytes: int
    refused: str | None = None  # why the scan must not run whatever it costs
    links: bool = False  # glibc's chunks allocated before the trace walked and followed (untraced.py)
    links_ms: float = 0.0  # the walk of those chunks, timed while the target ran: part of fixed_ms
    links_unpaid_ms: float | None = None  # that walk left out for its price: the pause allowed did not pay for it

    @property
    def ms(self) -> float | None:
        if not self.speed:
            return None
        swap_ms = self.swapped_bytes / SWAP_READ_BYTES_PER_S * 1000
        return self.fixed_ms + (self.planned_bytes - self.swapped_bytes) / self.speed * 1000 + swap_ms


def fitted(est: Price, allowed_ms: float | None) -> Price:
    """The price of the scan that fits the pause allowed: where the walk of glibc's chunks from before
    the trace is what passes it, the scan without that walk (those chunks' words roots, as a scan read
    them before untraced.py: a holder older than the trace is then not named through them), said as
    such; else est unchanged. A small heap's walk can be most of its price (a 5 MiB heap of 12 blocks
    churned at 100k calls/s: ~27 ms of walk beside ~4 ms of reading, against the 23 ms memleak's trace
    left), and a scan without it still tells leak from held for every block born in the trace."""
    over = allowed_ms is not None and est.ms is not None and est.ms > allowed_ms
    if not over or not est.links or est.ms - est.links_ms > allowed_ms:
        return est
    return replace(est, links=False, fixed_ms=est.fixed_ms - est.links_ms, links_ms=0.0, links_unpaid_ms=est.links_ms)


def too_many_mappings(maps) -> str | None:
    """Why the scan is not run for a process with more mappings than memdiag keeps (a number the
    process chooses, vm.max_map_count allowing): the scan must read every one of them while the
    target is stopped, and 660,000 cost memdiag +224 MiB and 1.4 s of that stop; None: it may run."""
    dropped = getattr(maps, "dropped", 0)
    if not dropped and not getattr(maps, "unread", False):
        return None
    return (
        f"the target has {len(maps) + dropped:,} mappings or more, past the {MAX_SCAN_MAPPINGS:,} a scan reads "
        "within memdiag's memory bound: not stopped, not scanned"
    )


def price(pid: int, blocks: Blocks, read_ms: float, limit_ms: float | None, links: bool = False) -> Price | None:
    """What a scan of pid would pause it, estimated while it runs: the resident bytes of its
    writable mappings (pagemap) over the speed of matching a sample of them (up to SAMPLE_CHUNKS
    chunks spread over the whole) against its current blocks; swapped bytes at swap speed; plus
    the fixed part, the page-map walk timed here included (it is done again during the stop); links:
    the walk of glibc's chunks allocated before the trace timed too, and the sample matched against
    them as well (their references are followed, untraced.py: a pointer-dense heap's scan slows). The
    sample sees the target's own pointer density: a pointer-dense heap matches several times slower
    than a sparse one (measured: 0.3 GiB/s on redis, 2 GiB/s on a heap of strings)."""
    space = AddressSpace.of(pid)
    if space is None:
        return None
    tls_bytes = static_tls_bytes(space)
    fixed = FIXED_MS + 2 * read_ms + STOP_MS_PER_THREAD * len(thread_ids(pid))  # the table is read again
    if not len(blocks.starts):
        return Price(0, 0, None, fixed, 0, tls_bytes)
    too_many = too_many_mappings(space.mappings)
    if too_many is not None:
        return Price(0, 0, None, fixed, len(blocks.starts), tls_bytes, refused=too_many)
    t0 = time.thread_time()
    runs, swapped, too_long = _walk(pid, space, limit_ms)
    planned = sum(hi - lo for lo, hi in runs)
    if too_long is not None:
        # the walk stopped part way: what it saw is not what a scan would read. The resident
        # anonymous memory stands for that (an estimate; a cold run here walked 256 MiB of a 1 GiB heap)
        resident = _resident_anon(pid)
        if resident is not None and resident > planned:
            planned = resident
            too_long += f"; ~{fmt_mib(resident)} of anonymous memory resident to scan (its RssAnon, an estimate)"
        return Price(planned, swapped, None, fixed, len(blocks.starts), tls_bytes, refused=too_long)
    fixed += (time.thread_time() - t0) * 1000
    refused = _swap_refusal(pid, swapped)
    sampled, links_ms = blocks, 0.0
    if links:  # walked while the target runs: a torn header ends the walk early, an estimate
        t0 = time.thread_time()

        def walk_tick() -> None:
            if limit_ms is not None and (time.thread_time() - t0) * 1000 > limit_ms:
                raise ScanAborted("walking glibc's chunks took longer than the pause left")

        try:
            sampled, _links, _free = untraced.linked(pid, blocks, space.mappings, walk_tick)
            links_ms = (time.thread_time() - t0) * 1000
            fixed += links_ms
        except ScanAborted:  # not walked under the stop either: its words are roots, as before
            links = False
        except OSError:
            return None
    speed = _sampled_speed(pid, sampled, runs, max(CHUNK, planned // SAMPLE_CHUNKS))
    if speed is False:
        return None
    return Price(planned, swapped, speed or None, fixed, len(blocks.starts), tls_bytes, refused, links, links_ms)


def _walk(pid: int, space: AddressSpace, limit_ms: float | None) -> tuple[list[tuple[int, int]], int, str | None]:
    """The resident or swapped stretches of the writable mappings, the bytes in swap, and why the
    walk stopped short (it took longer than the pause left), from the page map."""
    t0 = time.thread_time()

    def walk_tick() -> None:
        if limit_ms is not None and (time.thread_time() - t0) * 1000 > limit_ms:
            # the pause the budget leaves can be well under a millisecond (memleak spent the rest)
            left = fmt_duration(limit_ms / 1000) if limit_ms > 0 else "none"
            raise ScanAborted(
                f"walking the page map of its writable mappings alone took longer than the pause left ({left})"
            )

    try:
        pagemap: int | None = os.open(f"/proc/{pid}/pagemap", os.O_RDONLY)
    except OSError:
        pagemap = None
    runs: list[tuple[int, int]] = []
    swapped = 0
    try:
        for r in readable_regions(space, []):
            for lo, hi, sw in present_runs(pagemap, r.start, r.end, walk_tick):
                runs.append((lo, hi))
                swapped += sw * PAGE
    except ScanAborted as e:
        return runs, swapped, str(e)
    finally:
        if pagemap is not None:
            os.close(pagemap)
    return runs, swapped, None


def _sampled_speed(pid: int, blocks: Blocks, runs: list[tuple[int, int]], stride: int) -> float | bool:
    """Bytes a second of matching chunks `stride` apart against the blocks (0.0: nothing sampled;
    False: the target's memory cannot be opened)."""
    import numpy as np

    match, buf = Matcher(blocks.sort()), np.empty(CHUNK // 8, dtype=np.uint64)
    sampled, seconds, offset = 0, 0.0, 0
    try:
        mem = identity.open_mem(pid, os.O_RDONLY)
    except OSError:
        return False
    try:
        for lo, hi in runs:
            for at in range(lo + (-offset) % stride, hi, stride):
                t = time.thread_time()
                try:
                    got = os.preadv(mem, [memoryview(buf).cast("B")[: min(CHUNK, hi - at)]], at)
                except OSError:
                    continue
                pos, _dst = match.hits(buf[: got // 8])
                if pos.size:
                    match.owner(np.uint64(at) + pos.astype(np.uint64) * np.uint64(8))
                seconds += time.thread_time() - t
                sampled += got
            offset += hi - lo
    finally:
        os.close(mem)
    return sampled / seconds if seconds > 0 and sampled else 0.0


def _swap_refusal(pid: int, swapped: int) -> str | None:
    """Reading a swapped page brings it back in, charged to the target's memory cgroup: refuse
    when that could push the cgroup (or the host) over its limit (seen: a 1 GiB target with 790 MB
    in swap under a 256 MiB limit was OOM-killed by the scan)."""
    if not swapped:
        return None
    room = _cgroup_headroom(pid)
    host = _mem_available()
    for what, free in (("its memory cgroup", room), ("the host (MemAvailable)", host)):
        if free is not None and swapped > free // 2:
            return (
                f"{fmt_mib(swapped)} of the target is in swap and {what} has {fmt_mib(free)} free: reading it back "
                "could push the target into reclaim or the OOM killer"
            )
    return None


def _cgroup_headroom(pid: int) -> int | None:
    """The least room (limit less usage) of the target's memory cgroup and its ancestors, v1 or v2."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    best: int | None = None
    for line in lines:
        _id, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            base, limit_f, usage_f = Path("/sys/fs/cgroup/memory"), "memory.limit_in_bytes", "memory.usage_in_bytes"
        elif controllers == "":
            base = next(
                (
                    b
                    for b in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified"))
                    if (b / "cgroup.controllers").exists()
                ),
                None,
            )
            if base is None:
                continue
            limit_f, usage_f = "memory.max", "memory.current"
        else:
            continue
        node = base / path.lstrip("/")
        while True:
            try:
                limit_text = (node / limit_f).read_text().strip()
                usage = int((node / usage_f).read_text())
                if limit_text != "max" and int(limit_text) < 1 << 60:
                    room = max(0, int(limit_text) - usage)
                    best = room if best is None else min(best, room)
            except (OSError, ValueError):
                pass
            if node == base or node.parent == node:
                break
            node = node.parent
    return best


def _mem_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
