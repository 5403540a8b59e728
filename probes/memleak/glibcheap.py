"""Is a block glibc's malloc handed out still allocated? Read from the allocator's own chunk headers
and free lists in the target's memory, with no call to free traced.

This is what lets allocation tracing follow a block without trapping every free (a hot program's
free is as hot as its malloc): the block's address was seen returned, and its state is read later.

glibc (2.26 on, x86-64) keeps a 16-byte header before every block: the previous chunk's size (when
that one is free) and the chunk's own size, whose low bits are PREV_INUSE (the chunk before is in
use), IS_MMAPPED and NON_MAIN_ARENA. A chunk is free when:
- it was mmapped (IS_MMAPPED: 128 KiB and more by default) and its pages are unmapped;
- the chunk after it has PREV_INUSE clear: free chunks in the small, large and unsorted bins, and
  chunks merged into a neighbour or the top;
- it sits in a thread's cache (tcache, 2.26+: chunks of up to 0x410 bytes): PREV_INUSE stays set,
  and the entry's second word is the cache's key (2.29+: a random per-process value since 2.34, the
  thread's tcache before), which glibc itself compares to detect a double free;
- it sits in a fastbin (chunks of up to 0x80 bytes once their tcache bin is full): PREV_INUSE stays
  set; found by walking each arena's fastbin lists (singly linked, the links mangled since 2.32:
  stored = (address of the link >> 12) ^ next).
The tcache key is learned from the main thread's cache (tcache_perthread_struct, the first chunk of
the [heap]: its entries point at free chunks, whose key words agree). main_arena is found in libc's
writable data by its shape: its bins are pairs of words that, while a bin is empty, both point 16
bytes before themselves, and its top points at the chunk that ends the [heap].

A block freed and handed out again reads as allocated: its address then belongs to whoever holds it
now (which the reachability scan tells). Where the header is not one (a pointer that was never a
block's, memory unreadable) or a small chunk's fastbins were not found, the answer is unknown."""

from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass
from enum import Enum

from memdiag.system import identity

from ..mapping import Mapping, parse_maps

PREV_INUSE, IS_MMAPPED, NON_MAIN_ARENA = 1, 2, 4
SIZE_BITS = PREV_INUSE | IS_MMAPPED | NON_MAIN_ARENA
HEADER = 16  # prev_size and size, before the user's pointer (64-bit)
MIN_CHUNK = 32
MAX_CHUNK = 1 << 44  # no heap chunk is larger: a header claiming more is not one
TCACHE_MAX_CHUNK = 0x410  # the largest chunk tcache keeps (tcache_max_bytes' default, 1032 bytes asked)
FASTBIN_MAX_CHUNK = 0xB0  # the largest fastbin chunk possible (M_MXFAST's bound, 160 bytes asked: 80 * 8 / 4)
TCACHE_BINS = 64
# tcache_perthread_struct with its header: uint16 counts[64] + entries[64] (2.30+), char counts before
TCACHE_STRUCT_SIZES = {0x290: 2, 0x250: 1}
NFASTBINS = 10
NBINS_WORDS = 254  # bins[NBINS * 2 - 2]
# main_arena's layout (malloc_state, 2.27+): mutex, flags, have_fastchunks, then fastbinsY[10], top,
# last_remainder, bins[254], binmap[4], next (the next arena's start; main_arena's own when alone)
TOP_AFTER_FASTBINS = NFASTBINS * 8
BINS_AFTER_FASTBINS = TOP_AFTER_FASTBINS + 16
NEXT_AFTER_FASTBINS = BINS_AFTER_FASTBINS + NBINS_WORDS * 8 + 16
FASTBINS_AT = 0x10  # after mutex, flags and have_fastchunks (2.27+)
MIN_MINOR = 27  # the layouts read here: tcache with have_fastchunks in the arena
MANGLED_SINCE = 32  # safe-linking: tcache and fastbin links stored mangled
GLOBAL_KEY_SINCE = 34  # the tcache key a random value for the process (before: the thread's cache)
KEY_SINCE = 29  # tcache entries have a key word at all
MAX_ARENAS = 1024  # 8 per core by default: a list longer than this is not one
MAX_FASTBIN_WALK = 100_000  # chunks per fastbin list followed at most
MAX_LIBC_BYTES = 16 << 20  # glibc's libc.so.6 is ~2 MiB; its banner is never read past this


class State(str, Enum):
    ALLOCATED = "allocated"
    FREE = "free"
    UNKNOWN = "unknown"


class Memory:
    """Reads of another process's memory (/proc/PID/mem); None where it is not readable."""

    def __init__(self, pid: int):
        self.pid = pid
        self.fd = identity.open_mem(pid)

    def read(self, address: int, size: int) -> bytes | None:
        try:
            got = os.pread(self.fd, size, address)
        except (OSError, OverflowError):
            return None
        return got if len(got) == size else None

    def word(self, address: int) -> int | None:
        got = self.read(address, 8)
        return struct.unpack("<Q", got)[0] if got is not None else None

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> Memory:
        return self

    def __exit__(self, *_exc) -> None:
        self.close()


@dataclass(frozen=True)
class Heap:
    """What telling a free chunk from an allocated one needs beyond its headers, learned once."""

    mappings: tuple[Mapping, ...]
    minor: int | None  # glibc 2.minor (None: not glibc, or its version not found)
    tcache_key: int | None  # every tcache entry's second word (None: no entry seen to learn it from)
    fastbin_free: frozenset[int] | None  # chunk addresses on every arena's fastbins (None: main_arena not found)
    arenas: int = 0  # arenas whose fastbins were walked

    def mapped(self, address: int) -> Mapping | None:
        return next((m for m in self.mappings if m.start <= address < m.end), None)


def read_heap(mem: Memory, maps_text: str) -> Heap:
    """The tcache key and the fastbins' free chunks of the process mem reads, its maps as read with it."""
    return heap_of(mem, tuple(parse_maps(maps_text)))


def heap_of(mem: Memory, mappings: tuple[Mapping, ...]) -> Heap:
    """read_heap() for mappings already parsed."""
    minor = glibc_minor(mem.pid, mappings)
    heap = next((m for m in mappings if m.path == "[heap]"), None)
    if minor is None or minor < MIN_MINOR or heap is None:
        return Heap(mappings, minor, None, None)
    key = _tcache_key(mem, heap)
    fast, arenas = None, 0
    arena = _main_arena(mem, mappings, heap)
    if arena is not None:
        fast, arenas = _fastbin_chunks(mem, arena, mangled=minor >= MANGLED_SINCE)
    return Heap(mappings, minor, key, fast, arenas)


def state(mem: Memory, heap: Heap, pointer: int) -> State:
    """The block at pointer (as malloc returned it): allocated, free, or unknown."""
    chunk = pointer - HEADER
    if pointer % 16 or heap.mapped(chunk) is None:
        return State.FREE if heap.mapped(pointer) is None and pointer % 16 == 0 else State.UNKNOWN
    head = mem.read(chunk, HEADER)
    if head is None:
        return State.UNKNOWN
    prev_size, raw = struct.unpack("<QQ", head)
    size = raw & ~SIZE_BITS
    if size < MIN_CHUNK or size % 16 or size > MAX_CHUNK:
        return State.UNKNOWN
    if raw & IS_MMAPPED:  # its own mapping, from its start (chunk - prev_size) to the chunk's end
        start = chunk - prev_size
        m = heap.mapped(start)
        return State.ALLOCATED if m is not None and m.end >= chunk + size else State.UNKNOWN
    after = mem.word(chunk + size + 8)
    if after is None:
        return State.UNKNOWN
    if not after & PREV_INUSE:
        return State.FREE
    if size <= TCACHE_MAX_CHUNK:
        second = mem.word(pointer + 8)
        if heap.minor is None or heap.minor < KEY_SINCE or second is None:
            return State.UNKNOWN  # a cached chunk cannot be told from an allocated one
        if heap.minor >= GLOBAL_KEY_SINCE:
            if heap.tcache_key is None:
                return State.UNKNOWN
            if second == heap.tcache_key:
                return State.FREE
        elif _is_tcache_struct(mem, second):
            return State.FREE  # before 2.34 the key is the freeing thread's own cache
    if size <= FASTBIN_MAX_CHUNK:
        if heap.fastbin_free is None:
            return State.UNKNOWN
        if chunk in heap.fastbin_free:
            return State.FREE
    return State.ALLOCATED


def usable_size(mem: Memory, pointer: int) -> int | None:
    """An allocated block's usable bytes: its chunk's size less the header word the chunk keeps in
    use (both words for an mmapped chunk). None: the header is not readable."""
    raw = mem.word(pointer - 8)
    if raw is None:
        return None
    return (raw & ~SIZE_BITS) - (HEADER if raw & IS_MMAPPED else HEADER // 2)


def _is_tcache_struct(mem: Memory, address: int) -> bool:
    raw = mem.word(address - 8)
    return raw is not None and (raw & ~SIZE_BITS) in TCACHE_STRUCT_SIZES and address % 16 == 0


def _tcache_key(mem: Memory, heap: Mapping) -> int | None:
    """The key word of the main thread's free tcache entries: the [heap]'s first chunk is its cache."""
    first = heap.start
    raw = mem.word(first + 8)
    if raw is None or (raw & ~SIZE_BITS) not in TCACHE_STRUCT_SIZES:
        return None
    count_size = TCACHE_STRUCT_SIZES[raw & ~SIZE_BITS]
    entries_at = first + HEADER + TCACHE_BINS * count_size
    got = mem.read(entries_at, TCACHE_BINS * 8)
    if got is None:
        return None
    keys = set()
    for entry in struct.unpack(f"<{TCACHE_BINS}Q", got):
        if entry and entry % 16 == 0:
            key = mem.word(entry + 8)
            if key is not None:
                keys.add(key)
    # every entry's key is the same value (2.34+) or this thread's cache (before): one value, else none
    return keys.pop() if len(keys) == 1 else None


def _main_arena(mem: Memory, mappings: tuple[Mapping, ...], heap: Mapping) -> int | None:
    """main_arena's fastbins' address, found in libc's writable data, or None."""
    for m in mappings:
        if "w" not in m.perms or not _is_libc(m):
            continue
        data = mem.read(m.start, m.end - m.start)
        if data is None:
            continue
        words = struct.unpack(f"<{len(data) // 8}Q", data[: len(data) // 8 * 8])
        for i in range(len(words) - 1):
            top = words[i]
            if not heap.start <= top < heap.end or top % 16:
                continue
            # top's chunk ends the [heap] (the brk end), and the bins follow it: the unsorted bin's
            # pair, when empty, points 16 bytes before itself; a full bin's into the heap
            size = mem.word(top + 8)
            if size is None or top + (size & ~SIZE_BITS) != heap.end:
                continue
            bins_at = m.start + (i + 2) * 8
            if not _bins_look_right(words, i + 2, bins_at, heap):
                continue
            return bins_at - BINS_AFTER_FASTBINS
    return None


def _bins_look_right(words: tuple[int, ...], first: int, bins_at: int, heap: Mapping) -> bool:
    empty = 0
    for b in range(NBINS_WORDS // 2):
        at = first + 2 * b
        if at + 1 >= len(words):
            return False
        fd, bk, own = words[at], words[at + 1], bins_at + 16 * b - 16
        if fd == bk == own:
            empty += 1
        elif not (heap.start <= fd < heap.end and heap.start <= bk < heap.end):
            return False
    return empty >= NBINS_WORDS // 4  # most bins of a heap are empty at any time


def _is_libc(m: Mapping) -> bool:
    """libc's own mappings (its file's name starts libc.so or libc-)."""
    return m.path.rsplit("/", 1)[-1].startswith(("libc.so", "libc-"))


def glibc_minor(pid: int, mappings: tuple[Mapping, ...]) -> int | None:
    """The minor version of the glibc mapped (36 for 2.36), read from its banner; None: none found."""
    libc = next((m for m in mappings if _is_libc(m) and m.is_file), None)
    if libc is None:
        return None
    try:  # the very file mapped (map_files), never a path the target could have relinked since
        with open(f"/proc/{pid}/map_files/{libc.start:x}-{libc.end:x}", "rb") as f:
            data = f.read(MAX_LIBC_BYTES)
    except OSError:
        return None
    found = re.search(rb"release version 2\.(\d+)", data)
    return int(found.group(1)) if found else None


def _fastbin_chunks(mem: Memory, fastbins_at: int, mangled: bool) -> tuple[frozenset[int] | None, int]:
    """Every chunk on every arena's fastbins, following main_arena's list of arenas."""
    found: set[int] = set()
    arena, arenas = fastbins_at, 0
    while arenas < MAX_ARENAS:
        heads = mem.read(arena, NFASTBINS * 8)
        if heads is None:
            return None, arenas
        for head in struct.unpack(f"<{NFASTBINS}Q", heads):
            if not _walk(mem, head, found, mangled):
                return None, arenas
        arenas += 1
        nxt = mem.word(arena + NEXT_AFTER_FASTBINS)
        if nxt is None:
            return None, arenas
        if not nxt or nxt + FASTBINS_AT == fastbins_at:
            return frozenset(found), arenas
        arena = nxt + FASTBINS_AT
    return None, arenas


def _walk(mem: Memory, head: int, found: set[int], mangled: bool) -> bool:
    """Follow one fastbin list from its head (a chunk address), links demangled where mangled."""
    chunk, steps = head, 0
    while chunk and steps < MAX_FASTBIN_WALK:
        if chunk % 16:
            return False
        found.add(chunk)
        link_at = chunk + HEADER
        stored = mem.word(link_at)
        if stored is None:
            return False
        chunk = (link_at >> 12) ^ stored if mangled else stored
        steps += 1
    return steps < MAX_FASTBIN_WALK
