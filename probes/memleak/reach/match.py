"""Matching the target's memory against the blocks: every pointer-aligned word that points inside a
block references it (a subtraction and a compare over a chunk with numpy, a binary search for the
few candidates); each block keeps the best root that points at it, and block-to-block references
are kept for the graph."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from memdiag.system import identity

from . import allocmeta
from .model import CHUNK, PAGE, TIER_NONE, TIER_REGISTER, TIER_STACK, TIER_UNTRACKED, Blocks, ScanAborted
from .regions import Region, present_runs
from .stop import Thread

MAX_EDGES = 4_000_000  # block-to-block references kept (8 bytes each); past it the scan gives up
# references from chunks handed out before memleak attached (untraced.py) kept at most: past it they
# are dropped and every word of those chunks counts as a root again (as before they were walked)
MAX_UNTRACED_EDGES = 4_000_000


@dataclass
class Found:
    """What the memory says about the blocks (indices into the sorted Blocks)."""

    root_tier: object  # numpy int8 per block: the best root tier that points into it
    root_addr: object  # numpy uint64 per block: that root word's address (0 for a register)
    root_region: object  # numpy int32 per block: the region of that word (-1 for a register)
    root_tid: object  # numpy int64 per block: the thread whose register it was
    edges: list = field(default_factory=list)  # numpy (src block, dst block) int32 pairs per chunk
    edge_count: int = 0
    untraced_edges: int = 0  # of them, from chunks memleak did not trace (not in edge_count)
    graph: bool = True  # the untraced chunks' references all kept (else their words are roots)
    loose_addr: object = None  # numpy uint64 per block: a word inside an untraced chunk pointing at it
    loose_region: object = None  # numpy int32 per block: that word's region
    scanned: int = 0
    swapped: int = 0
    unreadable: int = 0

    def credit(self, dst, tier: int, addrs, region: int, tid: int = 0) -> None:
        """Blocks dst pointed at from a root of this tier: kept where it is the best root so far.
        On a stack, the outermost frame that holds a pointer is credited (stacks are read from the
        stack pointer up): an inner frame's copy is more often a stale slot than the owner."""
        better = (self.root_tier[dst] >= tier) if tier == TIER_STACK else (self.root_tier[dst] > tier)
        dst = dst[better]
        self.root_tier[dst] = tier
        self.root_addr[dst] = addrs[better] if addrs is not None else 0
        self.root_region[dst] = region
        self.root_tid[dst] = tid

    def loose(self, dst, addrs, region: int) -> None:
        """Blocks dst pointed at from inside untraced chunks: roots, should those chunks' references be dropped."""
        first = self.loose_addr[dst] == 0
        self.loose_addr[dst[first]] = addrs[first]
        self.loose_region[dst[first]] = region

    def as_roots(self, untraced) -> None:
        """The untraced chunks' references dropped: every word in them that points at a block is a
        root of memory memdiag did not see allocated, as it was before they were walked."""
        import numpy as np

        src_ok = [e[~untraced[e[:, 0]]] for e in self.edges]
        self.edges = src_ok
        hit = np.flatnonzero(self.loose_addr != 0)
        for region in np.unique(self.loose_region[hit]).tolist():
            dst = hit[self.loose_region[hit] == region]
            self.credit(dst, TIER_UNTRACKED, self.loose_addr[dst], region)


class Matcher:
    """Finds, in a buffer of words, those that point into a block: a subtraction and one compare
    over the whole buffer (numpy), then a binary search for the few that fall in the blocks' span."""

    def __init__(self, blocks: Blocks, pymalloc: bool = False, untraced=None):
        import numpy as np

        self.untraced = untraced  # numpy bool per block: a chunk memleak did not trace (untraced.py), or None

        self.np = np
        self.starts = blocks.starts
        self.ends = blocks.ends if blocks.ends is not None else blocks.starts + blocks.sizes
        # a word is a block's up to the size it was asked for: glibc's last usable word of a 24-byte
        # block is the next chunk's prev_size, outside where a pointer counts as into it (glibc_bounded),
        # yet the program's own (a std::unordered_map node's value: every product was "held" by it as
        # a root of memory memdiag did not see allocated)
        self.owner_ends = np.maximum(self.ends, blocks.starts + blocks.sizes)
        self.lo = np.uint64(int(blocks.starts[0]))
        self.span = np.uint64(int(self.ends.max()) - int(blocks.starts[0]))
        self.tmp = np.empty(CHUNK // 8, dtype=np.uint64)
        self.pymalloc = pymalloc  # a CPython target: its allocator's arena records are no references

    def hits(self, words) -> tuple:
        """(positions of the words that point into a block, which block each)."""
        np = self.np
        tmp = self.tmp[: len(words)]
        np.subtract(words, self.lo, out=tmp)  # wraps below lo: one unsigned compare tests both ends
        pos = np.flatnonzero(tmp < self.span)
        if not pos.size:
            return pos, pos
        vals = words[pos]
        idx = np.searchsorted(self.starts, vals, side="right") - 1
        ok = (idx >= 0) & (vals < self.ends[np.maximum(idx, 0)])
        pos, idx = pos[ok], idx[ok]
        if self.pymalloc and pos.size:
            rec = pos[allocmeta.pymalloc_records(words, pos, idx, self.starts, self.ends)]
            if rec.size:  # the record's address, pool_address and freepools words all point into the arena
                keep = ~np.isin(pos, np.concatenate([rec + k for k in allocmeta.ARENA_RECORD_INTO]))
                pos, idx = pos[keep], idx[keep]
        return pos, idx

    def owner(self, addresses) -> object:
        """The block that holds each address, or -1."""
        np = self.np
        idx = np.searchsorted(self.starts, addresses, side="right") - 1
        inside = (idx >= 0) & (addresses < self.owner_ends[np.maximum(idx, 0)])
        return np.where(inside, idx, -1)


def _read(mem: int, buf, at: int, size: int, found: Found) -> int:
    """Read [at, at + size) into buf; a page that cannot be read is zeros (counted unreadable), the
    rest of the chunk is still read."""
    view = memoryview(buf).cast("B")
    done = 0
    while done < size:
        try:
            got = os.preadv(mem, [view[done:size]], at + done)
        except OSError:
            got = 0
        if got <= 0:
            skip = min(PAGE - (at + done) % PAGE, size - done)
            view[done : done + skip] = bytes(skip)
            found.unreadable += skip
            done += skip
            continue
        done += got
    found.scanned += size
    return size


def scan_memory(
    pid: int,
    blocks: Blocks,
    regions: list[Region],
    threads: list[Thread],
    stop_check,
    pymalloc: bool = False,
    untraced=None,
) -> Found:
    """What the memory says about blocks; untraced (a bool per block) marks the chunks memleak did
    not trace, whose words are references (kept up to MAX_UNTRACED_EDGES) rather than roots."""
    import numpy as np

    n = len(blocks.starts)
    found = Found(
        root_tier=np.full(n, TIER_NONE, dtype=np.int8),
        root_addr=np.zeros(n, dtype=np.uint64),
        root_region=np.full(n, -1, dtype=np.int32),
        root_tid=np.zeros(n, dtype=np.int64),
        loose_addr=np.zeros(n, dtype=np.uint64),
        loose_region=np.full(n, -1, dtype=np.int32),
    )
    match = Matcher(blocks, pymalloc, untraced)
    for t in threads:
        words = np.frombuffer(t.regs[: len(t.regs) // 8 * 8], dtype=np.uint64)
        _pos, dst = match.hits(words)
        found.credit(dst, TIER_REGISTER, None, -1, t.tid)
    buf = np.empty(CHUNK // 8, dtype=np.uint64)
    mem = identity.open_mem(pid, os.O_RDONLY)
    try:
        pagemap: int | None = os.open(f"/proc/{pid}/pagemap", os.O_RDONLY)
    except OSError:
        pagemap = None
    stacks = {t.tid: t for t in threads}
    try:
        for ri, r in enumerate(regions):
            for lo, hi, swapped in present_runs(pagemap, r.start, r.end, lambda: stop_check(found.scanned)):
                found.swapped += swapped * PAGE
                for at in range(lo, hi, CHUNK):
                    stop_check(found.scanned)
                    size = min(CHUNK, hi - at)
                    got = _read(mem, buf, at, size, found)
                    if r.tier == TIER_STACK and r.tid is not None and at == lo:  # to name frames later
                        stacks[r.tid].stack, stacks[r.tid].stack_base = bytes(buf.view(np.uint8)[:got]), at
                    _match_chunk(found, match, r, ri, at, buf[: got // 8])
    finally:
        os.close(mem)
        if pagemap is not None:
            os.close(pagemap)
    return found


def _match_chunk(found: Found, match: Matcher, r: Region, ri: int, at: int, words) -> None:
    """One chunk's words that point into blocks: a root's credit, or an edge between two blocks."""
    import numpy as np

    pos, dst = match.hits(words)
    if not pos.size:
        return
    src_addr = np.uint64(at) + pos.astype(np.uint64) * np.uint64(8)
    src = match.owner(src_addr)
    # a stack or static data is a root even inside a tracked mapping (a thread stack mmap()ed after
    # memleak attached)
    inside = (src >= 0) if r.tier == TIER_UNTRACKED else np.zeros(len(src), dtype=bool)
    if match.untraced is not None and inside.any():
        via = inside & match.untraced[np.maximum(src, 0)]  # words of a chunk memleak did not trace
        if via.any():
            found.loose(dst[via], src_addr[via], ri)
            if not found.graph:  # its references dropped (MAX_UNTRACED_EDGES): its words are roots
                inside = inside & ~via
    found.credit(dst[~inside], r.tier, src_addr[~inside], ri)
    # block-to-block references, each pair once: a block pointing into itself anchors nothing
    # (graph.py), and CPython's objects point at one another inside one pymalloc arena for most of
    # its words. One sort of (src << 32 | dst) keys, not numpy's unique(axis=0) (a row-wise sort:
    # 97.5 ms against 2.2 ms for 65,536 pairs here, which held a Python heap's scan to ~46 MiB/s)
    other = inside & (src != dst)
    if other.any():
        keys = np.unique((src[other].astype(np.int64) << 32) | dst[other].astype(np.int64))
        pairs = np.stack(((keys >> 32).astype(np.int32), (keys & 0xFFFFFFFF).astype(np.int32)), axis=1)
        found.edges.append(pairs)
        from_untraced = int(match.untraced[pairs[:, 0]].sum()) if match.untraced is not None else 0
        found.untraced_edges += from_untraced
        found.edge_count += len(pairs) - from_untraced
        if found.untraced_edges > MAX_UNTRACED_EDGES and found.graph:
            found.graph = False
            found.as_roots(match.untraced)
        if found.edge_count > MAX_EDGES:
            raise ScanAborted(f"more than {MAX_EDGES:,} references between tracked blocks")
