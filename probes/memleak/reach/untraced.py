"""Blocks glibc handed out before memleak attached, by their own chunk headers: the links of a path
from a root to the blocks memleak saw allocated.

A holder's structure is often older than the trace: a global std::unordered_map's bucket array
and the nodes of its first entries, a tree's upper nodes, a list's head. Scanned as plain memory
memdiag did not see allocated, every word of them was a root, so each block they point at was
"held by memory memdiag did not see allocated ([heap])" and the global that holds the whole was
never named. Walked as blocks, they are links: `g_catalog` in .bss points at its bucket array, the
array at the nodes, the nodes at the products.

glibc (x86-64) keeps a 16-byte header before every chunk (glibcheap.py): the previous chunk's size
and the chunk's own, whose low three bits are flags. The main arena's chunks tile the [heap] from
its first byte to the top chunk, so walking the sizes from its start finds every chunk, in use or
free; a header that does not fit (a size under 32, not a multiple of 16, past the heap's end) ends
the walk, and the rest of the heap stays plain memory (as it was: potentially live, conservative).
A chunk of its own mapping (IS_MMAPPED, 128 KiB and up by default) begins its anonymous mapping with
prev_size 0 and a size of whole pages that ends inside it; adjacent ones share one mapping and are
walked alike. Arenas of other threads (heaps of their own, 64 MiB-aligned) are not walked: their
memory stays plain memory, as before.

A chunk's words, as a block's, run from its user pointer to the next chunk's size word (its last
word is the next chunk's prev_size while it is in use); a pointer counts as into it up to its chunk's
end, so the allocator's own links to the next chunk's header (bins, top) are into nothing. Chunks
memleak traced are left out (they are blocks already). A free chunk (the next chunk's PREV_INUSE
clear: bins and the top; a tcache entry, by its key word; a fastbin's, on its list: glibcheap.py)
holds stale words and the allocator's own caches point at it (the tcache's entries, from the
thread's `tcache` variable): it is no link from the roots, only potentially live in the second wave.
The walk is bounded: at most MAX_CHUNKS chunks, and the scan's own clock
(tick, between windows) stops it at the pause allowed."""

from __future__ import annotations

import os
from array import array
from collections.abc import Callable
from dataclasses import dataclass

from memdiag.system import identity

from ...procmaps import Mapping
from .. import glibcheap  # at import, not in the walk: its first import was timed in the scan's price (9-14 ms)

HEADER = 16
MIN_CHUNK = 32
SIZE_BITS = 7
IS_MMAPPED = 2
PAGE = 4096
MAX_CHUNKS = 1 << 20  # chunks walked at most (16 MiB of arrays): past it the rest stays plain memory
WINDOW = 1 << 20  # bytes of the heap read at a time for the walk
TICK_CHUNKS = 1024  # mmapped chunks' headers read between two looks at the clock (~1 ms of preads)


@dataclass
class Untraced:
    """The chunks found: user start and end (numpy uint64, sorted), and how the walk went."""

    starts: object
    ends: object  # where a pointer stops counting as into it: the chunk's end
    owned: object = None  # where its words end: the next chunk's size word
    free: object = None  # numpy bool: a free chunk (no link from the roots)
    heap_bytes: int = 0  # bytes of [heap] the walk covered
    complete: bool = True  # every chunk of the [heap] walked (no bad header, no bound reached)

    def __len__(self) -> int:
        return len(self.starts)


def find(
    pid_mem: int,
    mappings: list[Mapping],
    traced_starts,
    tick: Callable[[], None] = lambda: None,
    tcache_key: int | None = None,
    fastbin_free: frozenset[int] = frozenset(),
) -> Untraced:
    """The chunks of the [heap] and of anonymous mappings that begin with an mmapped chunk, less
    those starting at a traced block (traced_starts: sorted numpy uint64 user pointers). tcache_key
    and fastbin_free (glibcheap.read_heap): what tells a cached free chunk from one in use."""
    import numpy as np

    # 8 bytes a chunk (a list of ints costs 40): 1 Mi chunks, 24 MiB of memdiag's
    starts, sizes, keys = array("Q"), array("Q"), array("Q")  # keys: a tcache entry's key word
    heap_bytes, complete, top = 0, True, set()
    for m in mappings:
        if "r" not in m.perms or "w" not in m.perms or m.is_file:
            continue
        if m.path == "[heap]":
            walked, whole = _walk_heap(pid_mem, m, starts, sizes, keys, tick)
            heap_bytes += walked
            complete = complete and whole
            if whole and starts:
                top.add(starts[-1])
        elif not m.path:
            _walk_mmapped(pid_mem, m, starts, sizes, keys, tick)
        if len(starts) >= MAX_CHUNKS:
            complete = False
            break
    s = np.frombuffer(starts, dtype=np.uint64).copy() if starts else np.zeros(0, dtype=np.uint64)
    raw = np.frombuffer(sizes, dtype=np.uint64).copy() if sizes else np.zeros(0, dtype=np.uint64)
    size = raw & ~np.uint64(SIZE_BITS)
    e = s - np.uint64(HEADER) + size
    owned = np.minimum(e + np.uint64(8), _ends_of(mappings, s))
    free = np.zeros(len(s), dtype=bool)
    if len(s):
        # the next chunk's PREV_INUSE clear: free (binned); only where the next is the one walked next
        nxt_prev_inuse = np.concatenate((raw[1:] & np.uint64(1), [np.uint64(1)])).astype(bool)
        follows = np.concatenate((s[1:] == e[:-1] + np.uint64(HEADER), [False]))
        free |= follows & ~nxt_prev_inuse & ((raw & np.uint64(IS_MMAPPED)) == 0)
        free |= np.isin(s, np.array(sorted(top), dtype=np.uint64))
        if tcache_key is not None:
            free |= np.frombuffer(keys, dtype=np.uint64) == np.uint64(tcache_key)
        if fastbin_free:
            free |= np.isin(s - np.uint64(HEADER), np.array(sorted(fastbin_free), dtype=np.uint64))
    if len(traced_starts) and len(s):
        # a traced block is a block already; a chunk with one inside it (the walk misled) is left out
        at = np.searchsorted(traced_starts, s)
        nxt = traced_starts[np.minimum(at, len(traced_starts) - 1)]
        traced = (at < len(traced_starts)) & (nxt < owned)
        s, e, owned, free = s[~traced], e[~traced], owned[~traced], free[~traced]
    order = s.argsort(kind="stable")
    return Untraced(s[order], e[order], owned[order], free[order], heap_bytes, complete)


def _ends_of(mappings: list[Mapping], addresses):
    """The end of the mapping that holds each address (sorted mappings)."""
    import numpy as np

    los = np.array([m.start for m in mappings], dtype=np.uint64)
    his = np.array([m.end for m in mappings], dtype=np.uint64)
    at = np.maximum(np.searchsorted(los, addresses, side="right") - 1, 0)
    return his[at] if len(his) else addresses


def _walk_heap(fd: int, m: Mapping, starts: array, sizes: array, keys: array, tick) -> tuple[int, bool]:
    """Walk the main arena's chunks from the [heap]'s first byte; (bytes walked, whether to the end)."""
    chunk, buf_at, words = m.start, 0, None
    while chunk + HEADER <= m.end:
        if len(starts) >= MAX_CHUNKS:
            return chunk - m.start, False
        if words is None or chunk + MIN_CHUNK > buf_at + len(words) * 8:
            tick()
            try:
                raw = os.pread(fd, min(WINDOW, m.end - chunk), chunk)
            except OSError:
                return chunk - m.start, False
            if len(raw) < HEADER:
                return chunk - m.start, False
            buf_at, words = chunk, memoryview(raw[: len(raw) // 8 * 8]).cast("Q")
        at = (chunk - buf_at) // 8
        raw_size = words[at + 1]
        size = raw_size & ~SIZE_BITS
        if raw_size & IS_MMAPPED or size < MIN_CHUNK or size % 16 or chunk + size > m.end:
            return chunk - m.start, False
        starts.append(chunk + HEADER)
        sizes.append(raw_size)
        keys.append(words[at + 3] if at + 3 < len(words) else 0)
        chunk += size
    return m.end - m.start, True


def _walk_mmapped(fd: int, m: Mapping, starts: array, sizes: array, keys: array, tick=lambda: None) -> None:
    """The mmapped chunks that tile an anonymous mapping from its start, if it begins with one; the
    clock (tick) checked every TICK_CHUNKS headers, as the [heap]'s walk checks it every window: a
    mapping the target tiled with one-page fake headers is a pread each."""
    chunk, walked = m.start, 0
    while chunk + HEADER <= m.end and len(starts) < MAX_CHUNKS:
        if walked % TICK_CHUNKS == 0:
            tick()
        walked += 1
        try:
            raw = os.pread(fd, HEADER, chunk)
        except OSError:
            return
        if len(raw) != HEADER:
            return
        prev, size = int.from_bytes(raw[:8], "little"), int.from_bytes(raw[8:], "little")
        if prev or not size & IS_MMAPPED or size & 1:
            return
        if (size & ~SIZE_BITS) < PAGE or (size & ~SIZE_BITS) % PAGE or chunk + (size & ~SIZE_BITS) > m.end:
            return
        starts.append(chunk + HEADER)
        sizes.append(size)
        keys.append(0)
        chunk += size & ~SIZE_BITS


def joined(blocks, chunks: Untraced):
    """The blocks with the untraced chunks among them (group -1, or -2 when free), sorted; a bool per
    block marking those and one marking the free ones (None, None when there are none: the blocks as
    they were)."""
    import numpy as np

    from .model import Blocks

    if not len(chunks):
        return blocks, None, None
    ends = blocks.ends if blocks.ends is not None else blocks.starts + blocks.sizes
    # group -1 for a chunk in use, -2 for a free one
    kind = np.where(chunks.free, -2, -1).astype(blocks.groups.dtype)
    both = Blocks(
        np.concatenate((blocks.starts, chunks.starts)),
        np.concatenate((blocks.sizes, chunks.owned - chunks.starts)),
        np.concatenate((blocks.groups, kind)),
        np.concatenate((ends, chunks.ends)),
    ).sort()
    return both, both.groups < 0, both.groups == -2


def linked(pid: int, blocks, mappings, tick: Callable[[], None] = lambda: None):
    """joined() for the chunks of pid's heap found now (its memory read through /proc/PID/mem)."""
    mappings = list(mappings)
    try:
        with glibcheap.Memory(pid) as mem:
            heap = glibcheap.heap_of(mem, tuple(mappings))
    except OSError:
        heap = None
    fd = identity.open_mem(pid, os.O_RDONLY)
    try:
        chunks = find(
            fd,
            mappings,
            blocks.sort().starts,
            tick,
            heap.tcache_key if heap is not None else None,
            (heap.fastbin_free or frozenset()) if heap is not None else frozenset(),
        )
    finally:
        os.close(fd)
    return joined(blocks, chunks)
