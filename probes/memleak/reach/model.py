"""What the reachability scan reports and works on: its result (ReachScan), the candidate blocks, the
roots' tiers, and how two stack keys' figures merge."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

from memdiag.system._parse import Model
from memdiag.system.units import fmt_duration, fmt_mib, fmt_speed

from ...face import StackReach

PAGE = os.sysconf("SC_PAGE_SIZE")
# Bytes read and filtered at a time: the scan's buffers are bounded by this. Measured here: 256 KiB
# to 1 MiB scan at 1.7-2.1 GiB/s, 2 MiB at 0.9, 4 MiB at 0.8 (the buffer and its temporaries stay
# in the CPU's cache below that).
CHUNK = 512 << 10
# Roots, in the order an anchor is credited: a named variable before a stack before memory memdiag
# could not attribute (an anchor is what a reader can go and look at). Last, a runtime's own static
# data: an interpreter's allocator records and caches point at every arena it keeps (CPython's
# `arenas` array and usedpools), so credited before the objects that hold the program's data they
# named the interpreter's bookkeeping as the holder ("`arenas` in libpython3.11.so.1.0's .bss" for a
# list of tuples, whenever the array grew while memleak traced).
TIER_STATIC, TIER_TLS, TIER_STACK, TIER_REGISTER, TIER_UNTRACKED, TIER_RUNTIME, TIER_NONE = 0, 1, 2, 3, 4, 5, 9
ANCHOR_KIND = {
    TIER_STATIC: "static",
    TIER_TLS: "tls",
    TIER_STACK: "stack",
    TIER_REGISTER: "register",
    TIER_UNTRACKED: "untracked",
    TIER_RUNTIME: "static",
}
ROOTS = (
    "registers and stacks (from the stack pointer up) of every thread, modules' .data/.bss, and all other "
    "readable writable memory outside the tracked blocks (heap allocated before memleak attached or held "
    "free by the allocator counts as live: a leak can be missed, never invented; under glibc, chunks allocated "
    "before memleak attached are first followed as links from the other roots, which names a global through "
    "them) but the allocator's own "
    "records of its extents where memdiag recognises them (jemalloc's base blocks, CPython's arena records); "
    "an interpreter's own static data only where no other root holds a block"
)
CONSISTENCY = (
    "every thread stopped with ptrace (seize + interrupt) while memleak's table was read and memory scanned, "
    "then resumed"
)


def merged(a: StackReach | None, b: StackReach | None) -> StackReach | None:
    """One stack's figures from two stack keys that symbolize alike."""
    if a is None or b is None:
        return a or b
    anchor = a if a.anchor_bytes >= b.anchor_bytes else b
    return StackReach(
        leaked_count=a.leaked_count + b.leaked_count,
        leaked_bytes=a.leaked_bytes + b.leaked_bytes,
        unreferenced_count=a.unreferenced_count + b.unreferenced_count,
        anchored_count=a.anchored_count + b.anchored_count,
        anchored_bytes=a.anchored_bytes + b.anchored_bytes,
        anchor=anchor.anchor,
        anchor_kind=anchor.anchor_kind,
        anchor_bytes=a.anchor_bytes + b.anchor_bytes if a.anchor == b.anchor else anchor.anchor_bytes,
    )


class ReachScan(Model):
    """How the scan went: whether it ran, what it cost the target, how it was made consistent."""

    status: Literal["ran", "skipped", "failed"]
    reason: str = ""
    at_s: float | None = None  # seconds after the probe attached
    paused_ms: float | None = None  # measured: first thread stopped to last thread resumed
    priced_ms: float | None = None  # the estimate the budget was checked against
    allowed_ms: float | None = None
    planned_bytes: int | None = None
    scanned_bytes: int = 0
    swapped_bytes: int = 0  # read from swap, so paged back in by the scan
    unreadable_bytes: int = 0
    regions: int = 0
    threads: int = 0
    blocks: int = 0
    references: int = 0  # block-to-block references found
    allocator_metadata_bytes: int = 0  # the allocator's own records, neither read nor roots (allocmeta)
    allocator_metadata: str = ""  # what they were
    speed_bytes_per_s: float | None = None  # measured in this scan
    priority: str = ""  # what memdiag's scan ran at while the target was stopped (boost.py)
    untraced_chunks: int = 0  # chunks glibc handed out before memleak attached, walked as links (untraced.py)
    untraced_as_roots: bool = False  # their references past MAX_UNTRACED_EDGES: their words counted as roots
    untraced_unpaid_ms: float | None = None  # their walk (priced so) left out: the pause allowed did not pay for it
    buffer_bytes: int = CHUNK
    consistency: str = CONSISTENCY
    roots: str = ROOTS

    def describe(self) -> str:
        """One sentence: what the scan paused, read and checked and how it stayed consistent, or
        why it did not run."""
        if self.status != "ran":
            paused = f"; paused the target {self.paused_ms:.1f} ms" if self.paused_ms else ""
            return f"{self.status}: {self.reason}{paused}"
        if self.reason:  # ran, and found nothing to check
            paused = f"; paused the target {self.paused_ms:.1f} ms" if self.paused_ms is not None else ""
            return f"ran: {self.reason}{paused}"
        priced = f"priced {fmt_duration(self.priced_ms / 1000)}" if self.priced_ms is not None else "not priced"
        allowed = f", allowed {fmt_duration(self.allowed_ms / 1000)}" if self.allowed_ms is not None else ""
        speed = f" (scan {fmt_speed(self.speed_bytes_per_s)})" if self.speed_bytes_per_s else ""
        swapped = f", {fmt_mib(self.swapped_bytes)} of it paged in from swap" if self.swapped_bytes else ""
        at = f"{self.at_s:.1f} s into memleak: " if self.at_s is not None else ""
        meta = (
            f"; {fmt_mib(self.allocator_metadata_bytes)} of {self.allocator_metadata} not counted as roots"
            if self.allocator_metadata_bytes
            else ""
        )
        if self.untraced_chunks:
            meta += f"; {self.untraced_chunks:,} chunks glibc handed out before memleak attached " + (
                "were found, their words counted as roots (too many references to follow)"
                if self.untraced_as_roots
                else "followed as links from the roots"
            )
        if self.untraced_unpaid_ms is not None:
            meta += (
                f"; glibc's chunks handed out before memleak attached were not walked (priced "
                f"{fmt_duration(self.untraced_unpaid_ms / 1000)}, past the pause allowed): their words counted as "
                "roots, so a holder older than the trace is not named through them"
            )
        return (
            f"ran {at}paused the target {self.paused_ms:.1f} ms ({priced}{allowed}) to read "
            f"{fmt_mib(self.scanned_bytes)} of writable memory in {self.regions} mappings{speed}{swapped}; "
            f"{self.threads} thread(s), "
            f"{self.blocks:,} outstanding blocks checked, {self.references:,} references between them{meta}; "
            f"{self.consistency}" + (f"; memdiag's scan at {self.priority}" if self.priority else "")
        )


@dataclass
class Blocks:
    """Candidate blocks: start address, size and an integer group (the caller's stack) each."""

    starts: object  # numpy uint64, sorted on return from sort()
    sizes: object  # numpy uint64
    groups: object  # numpy int64
    ends: object = None  # numpy uint64: where a pointer stops counting as into the block (start + size)

    def sort(self) -> Blocks:
        order = self.starts.argsort(kind="stable")
        ends = self.ends[order] if self.ends is not None else None
        return Blocks(self.starts[order], self.sizes[order], self.groups[order], ends)

    def glibc_bounded(self) -> Blocks:
        """glibc keeps the next chunk's header inside the last word of a block whose size is 1-8
        past a multiple of 16 (its usable size is the chunk size less 8): the allocator's own
        pointers to that chunk (bins, the top chunk) would land inside the block. Under glibc a
        block ends where its chunk does: start - 16 + max(32, (size + 8 + 15) & ~15)."""
        import numpy as np

        chunk = np.maximum(np.uint64(32), (self.sizes + np.uint64(23)) & ~np.uint64(15))
        ends = np.minimum(self.starts + self.sizes, self.starts - np.uint64(16) + chunk)
        return Blocks(self.starts, self.sizes, self.groups, np.maximum(ends, self.starts + np.uint64(1)))


class ScanAborted(Exception):
    """The scan could not finish; the message says why."""
