"""An allocator's own metadata, which is no root: memory the allocator keeps to find its extents
points at the program's blocks without holding them for the program.

jemalloc (5.x) keeps a record of every extent it manages (edata_t) in its "base" blocks, and each
record's e_addr is the extent's first byte: the first region of every slab and the whole of every
large allocation. Scanned as memory memdiag did not see allocated, those records anchored a quarter
of an error-branch leak's 1 KiB blocks (four regions to a page-sized slab, the first one pointed at)
and would anchor every leaked block of 16 KiB or more. The program is never handed base memory, so
nothing the program holds lives there.

Its thread caches keep, below each bin's stack head, the addresses of regions they handed out since
their last fill (cache_bin.h: the stack grows down; allocating reads *head++, freeing writes *--head):
those slots are stale, and pointed at the leak's most recent blocks. Each thread's cache bins sit in
its thread-local data (tsd_t, static TLS), 24-byte records {stack_head, nrequests, low_bits_low_water,
low_bits_full, low_bits_empty}; one bin's stack ends where the next one's begins.

A base block is recognised by its own header (jemalloc's base.c: base_block_t is {size, next,
edata}, mapped HUGEPAGE-aligned; its edata describes the block's unused tail, e_addr + e_bsize ==
block + size), read at every 2 MiB boundary of the untracked anonymous memory: five words whose
sizes and addresses must agree with each other and with the mapping. Memory that happens to match
would have to hold a 2 MiB-multiple, then two addresses inside itself whose sum with a third word
is exactly its own end; nothing else is assumed about the layout.

CPython's pymalloc keeps one record per arena (obmalloc.c's struct arena_object, unchanged from 2.5
to 3.13: {address, pool_address, uint nfreepools, uint ntotalpools, freepools, nextarena, prevarena})
in one array it grows with realloc: the record's first word is the arena's first byte, and the array
left behind by each realloc keeps its records until its memory is reused. Scanned as memory, they
anchored every arena a Python program filled, to the array or to whichever stack slot still held
it ("`arenas` in libpython3.11.so.1.0's .bss", "the stack of thread N, in clock_nanosleep()" for a
list of tuples that only a global held). A word is such a record's when it is exactly a block's
start and the next words are a pool address inside that block on a page boundary (pymalloc carves
pools from the first aligned one up) and two counts, free pools at most all pools, all pools at
most a page per pool of the block. Matched in the chunk being scanned (match.py), only for a
target whose CPython memdiag reads: a C program's own region records could look the same."""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

from .model import TIER_TLS, TIER_UNTRACKED
from .regions import Region

HUGEPAGE = 2 << 20  # x86-64's huge page: base blocks are mapped at this alignment (base.c base_map)
ARENA_RECORD_INTO = (0, 1, 3)  # an arena record's words that point into its arena: address, pool_address, freepools
ARENA_RECORD_PAGE = 4096  # pymalloc's pools are 4 KiB (to 3.9) or 16 KiB (3.10+): page-aligned either way
HEADER = struct.Struct("<QQQQQ")  # size, next, edata.e_bits, edata.e_addr, edata.e_bsize
MAX_BASE = 1 << 40  # a block size past this is not one
BIN = struct.Struct("<QQHHH")  # cache_bin_t: stack_head, tstats.nrequests, low_water, full, empty (low bits)
BIN_STRIDE = 24  # its size, padded
MIN_BINS = 8  # a run of at least this many records, each stack beginning where the last one ended
MAX_TLS_READ = 1 << 16


@dataclass(frozen=True)
class Metadata:
    """Address ranges the allocator keeps for itself, and what they are."""

    ranges: tuple[tuple[int, int], ...] = ()
    what: str = ""

    @property
    def bytes(self) -> int:
        return sum(hi - lo for lo, hi in self.ranges)


def find(read: Callable[[int, int], bytes], regions: list[Region], allocator: str | None) -> Metadata:
    """The allocator's own metadata among the untracked regions (jemalloc's base blocks); read(address,
    size) reads the target's memory."""
    if allocator != "jemalloc":
        return Metadata()
    found: list[tuple[int, int]] = []
    stale: list[tuple[int, int]] = []
    for r in regions:
        if r.tier != TIER_UNTRACKED or r.mapping.is_file or r.mapping.path:
            continue
        a = -(-r.start // HUGEPAGE) * HUGEPAGE
        while a + HEADER.size <= r.end:
            size = _base_block(read, a, r.mapping.end)
            if size:
                found.append((a, a + size))
                a += size
            else:
                a += HUGEPAGE
    for r in regions:
        if r.tier == TIER_TLS:
            stale.extend(_stale_slots(read, r))
    what = []
    if found:
        n = len(found)
        what.append(
            f"jemalloc's base block{'s' if n != 1 else ''} ({n}: its records of every extent, which point at "
            "each slab's first region and each large block)"
        )
    if stale:
        what.append(f"its thread caches' stale slots ({len(stale)} bins: regions already handed out again)")
    return Metadata(tuple(found + stale), " and ".join(what))


def _stale_slots(read: Callable[[int, int], bytes], r: Region) -> list[tuple[int, int]]:
    """[lowest slot, stack head) of every cache bin in a run of records in a thread's TLS."""
    try:
        raw = read(r.start, min(r.end - r.start, MAX_TLS_READ))
    except OSError:
        return []
    recs = {}
    for off in range(0, len(raw) - BIN_STRIDE + 1, 8):
        rec = _bin(raw, off)
        if rec is not None:
            recs[off] = rec
    out: list[tuple[int, int]] = []
    taken = set()
    for off in sorted(recs):
        if off in taken:
            continue
        run = [off]
        while run[-1] + BIN_STRIDE in recs and recs[run[-1] + BIN_STRIDE][2] == recs[run[-1]][3]:
            run.append(run[-1] + BIN_STRIDE)  # the next bin's stack begins where this one's ends
        if len(run) < MIN_BINS:
            continue
        taken.update(run)
        out.extend((recs[o][0], recs[o][1]) for o in run if recs[o][0] < recs[o][1])
    return out


def _bin(raw: bytes, off: int) -> tuple[int, int, int, int] | None:
    """(lowest slot, head, full's low bits, empty's low bits) of a cache_bin_t record, or None."""
    head, _requests, water, full, empty = BIN.unpack_from(raw, off)
    if not head or head % 8 or head >> 47:
        return None
    cap = (empty - full) & 0xFFFF
    used = ((head & 0xFFFF) - full) & 0xFFFF
    if not cap or cap % 8 or used > cap or used % 8 or ((water - full) & 0xFFFF) > cap:
        return None
    return head - used, head, full, empty


def _base_block(read: Callable[[int, int], bytes], at: int, mapping_end: int) -> int:
    """The size of the jemalloc base block whose header is at `at`, or 0 when the words there are not one."""
    try:
        raw = read(at, HEADER.size)
    except OSError:
        return 0
    if len(raw) != HEADER.size:
        return 0
    size, nxt, _bits, addr, bsize = HEADER.unpack(raw)
    if not size or size % HUGEPAGE or size > MAX_BASE or at + size > mapping_end:
        return 0
    if nxt % HUGEPAGE:
        return 0
    if not at + HEADER.size <= addr <= at + size or addr + bsize != at + size:
        return 0
    return size


def pymalloc_records(words, pos, dst, starts, ends):
    """Of the hits at words[pos] (pointing into blocks dst), those that are the address word of one
    of pymalloc's arena records (a bool per hit): exactly the block's start, followed by a
    page-aligned pool address inside it and the counts nfreepools <= ntotalpools <= its pages."""
    import numpy as np

    ok = (pos + 2 < len(words)) & (words[pos] == starts[dst])
    if not ok.any():
        return ok
    at = np.minimum(pos + 1, len(words) - 2)
    lo, hi = starts[dst], ends[dst]
    pool, counts = words[at], words[at + 1]
    free, total = counts & np.uint64(0xFFFFFFFF), counts >> np.uint64(32)
    page = np.uint64(ARENA_RECORD_PAGE)
    return (
        ok
        & (pool >= lo)
        & (pool <= hi)
        & (pool % page == 0)
        & (total > 0)
        & (free <= total)
        & (total <= (hi - lo) // page)
    )


def carve(regions: list[Region], meta: Metadata) -> list[Region]:
    """The regions less the metadata's ranges (which are neither read nor counted as roots)."""
    if not meta.ranges:
        return regions
    out: list[Region] = []
    for r in regions:
        pieces = [(r.start, r.end)]
        for lo, hi in meta.ranges:
            nxt = []
            for s, e in pieces:
                if hi <= s or e <= lo:
                    nxt.append((s, e))
                    continue
                if s < lo:
                    nxt.append((s, lo))
                if hi < e:
                    nxt.append((hi, e))
            pieces = nxt
        out.extend(Region(s, e, r.tier, r.mapping, r.tid, r.module) for s, e in pieces)
    return out
