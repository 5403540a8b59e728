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

import contextlib
import os
import re
import struct
import time
from dataclasses import dataclass
from enum import Enum

from memdiag.system import identity
from memdiag.system.ledger import AnonPart
from memdiag.system.units import fmt_bytes

from ..mapping import Mapping, parse_maps, read_maps

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
MAX_LIBC_DATA = 1 << 20  # libc's writable data is tens of KiB: a writable "libc" mapping larger is not read
MAX_LIBC_DATA_MAPPINGS = 8  # libc's own are two or three (.data, .got, relro)


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


def _libc_data(mem: Memory, mappings: tuple[Mapping, ...]):
    """(mapping, its bytes, its words) of each writable mapping named as libc's, bounded: one of more
    than MAX_LIBC_DATA (a target's own file named libc.so.x, of any size) is never read, and at most
    MAX_LIBC_DATA_MAPPINGS are."""
    seen = 0
    for m in mappings:
        if "w" not in m.perms or not _is_libc(m) or m.end - m.start > MAX_LIBC_DATA:
            continue
        seen += 1
        if seen > MAX_LIBC_DATA_MAPPINGS:
            return
        data = mem.read(m.start, m.end - m.start)
        if data is not None:
            yield m, data, memoryview(data[: len(data) // 8 * 8]).cast("Q")


def _main_arena(mem: Memory, mappings: tuple[Mapping, ...], heap: Mapping, budget: _Budget | None = None) -> int | None:
    """main_arena's fastbins' address, found in libc's writable data, or None (also where the
    budget, if given, is spent: each candidate looked at is a read of the target's)."""
    for m, _data, words in _libc_data(mem, mappings):
        for i in range(len(words) - 1):
            top = words[i]
            if not heap.start <= top < heap.end or top % 16:
                continue
            if budget is not None and not budget.spend():
                return None
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


def _bins_look_right(words, first: int, bins_at: int, heap: Mapping) -> bool:
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
            st = os.fstat(f.fileno())
            # read once per file (its banner search is ~2.5 ms, and a scan asks under the target's stop):
            # a file changed since has another ctime, which no process can set back
            key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
            if key not in _MINORS:
                found = re.search(rb"release version 2\.(\d+)", f.read(MAX_LIBC_BYTES))
                if len(_MINORS) >= MAX_MINORS_KEPT:
                    _MINORS.clear()
                _MINORS[key] = int(found.group(1)) if found else None
            return _MINORS[key]
    except OSError:
        return None


_MINORS: dict[tuple[int, ...], int | None] = {}  # glibc_minor's answers by the file's identity
MAX_MINORS_KEPT = 64  # distinct libc files (containers' images) remembered


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


# --- What the allocator holds: its arenas' memory, their free chunks and tops (the process ledger's
# anonymous memory "by who holds it"). main_arena found as above; each arena's malloc_state read
# (2.27+): after `next` come next_free, attached_threads, system_mem (what the arena took from the
# system) and max_system_mem. Every bin (a doubly linked list through each free chunk's fd, ending
# at the bin's own header) and fastbin is followed, each free chunk's size read from its header.
# The target runs on: a list may change under the walk (a link followed into a chunk handed out
# since); the figures are estimates, bounded in chunks and time, and a walk cut short is said.
SYSTEM_MEM_AFTER_FASTBINS = NEXT_AFTER_FASTBINS + 24
HP_FLAGS_SINCE = 35  # malloc_par gained thp_pagesize, hp_pagesize and hp_flags
MAX_FREE_CHUNKS = 20_000  # chunks followed on all lists of all arenas at most (~2 us each)
MAX_WALK_SECONDS = 0.05  # of CPU, once a window, its heaps' page map included (~9 ms a GiB); the target runs on
PAGE = 4096


@dataclass(frozen=True)
class ArenaStats:
    """glibc malloc's own bookkeeping, read from the target's memory now (bytes)."""

    minor: int  # glibc 2.minor
    arenas: int  # arenas read (main_arena and the list after it)
    system: int  # what the arenas took from the system (system_mem, summed): their brk heap and heaps
    free: (
        int  # free chunks on their bins and fastbins, and in the main thread's tcache: their pages resident or swapped
    )
    top: int  # their top chunks (the unused end of each heap) ...
    top_resident: int  # ... of which resident (pagemap): a top's pages may never have been touched
    complete: bool  # every list followed to its end within the bounds (else free is a lower bound)
    free_chunks: int  # free chunks counted
    mmapped: int | None = None  # blocks it mmapped on their own (mp_.mmapped_mem: mapped, not all resident)
    n_mmaps: int | None = None  # how many (mp_.n_mmaps); None: mp_ not found
    resident: int | None = None  # the arenas' heaps' pages resident (pagemap); None: not read

    @property
    def in_use(self) -> int | None:
        """Blocks handed out, resident (estimate: the heaps' resident pages less the free chunks' and
        the tops'); None where free is a lower bound or the heaps' pages were not read."""
        if not self.complete or self.resident is None:
            return None
        return max(0, self.resident - self.free - self.top_resident)


class _Budget:
    """Chunks and CPU time (this thread's, system calls included) a walk may spend: the reader's own
    cost, not the wall clock, so that a walk on a loaded host is not cut short by waiting for a CPU."""

    def __init__(self, chunks: int, seconds: float):
        self.chunks, self.until = chunks, time.thread_time() + seconds

    def spend(self) -> bool:
        self.chunks -= 1
        return self.chunks >= 0 and (self.chunks % 256 or time.thread_time() < self.until)


def _chunk_size(mem: Memory, chunk: int) -> int | None:
    raw = mem.word(chunk + 8)
    if raw is None:
        return None
    size = raw & ~SIZE_BITS
    return size if MIN_CHUNK <= size <= MAX_CHUNK and size % 16 == 0 else None


def _bins_free(mem: Memory, bins_at: int, budget: _Budget, pagemap: _PageMap | None = None) -> tuple[int, int, bool]:
    """Resident bytes and count of the chunks on an arena's bins (unsorted, small, large: a chunk of
    two pages or more counted by its pages resident, _free_resident), and whether every list was
    followed to its end (False: a link that leads to no chunk, a page map not read, or the budget
    spent: what was counted until then is a lower bound)."""
    words = mem.read(bins_at, NBINS_WORDS * 8)
    if words is None:
        return 0, 0, False
    heads = struct.unpack(f"<{NBINS_WORDS}Q", words)
    total = count = 0
    for b in range(NBINS_WORDS // 2):
        own = bins_at + 16 * b - 16  # the bin read as a chunk: its fd at own + 16
        chunk = heads[2 * b]
        while chunk != own:
            if not chunk or chunk % 16 or not budget.spend():
                return total, count, False
            got = mem.read(chunk + 8, 16)  # size, fd
            if got is None:
                return total, count, False
            raw, fd = struct.unpack("<QQ", got)
            size = raw & ~SIZE_BITS
            if not MIN_CHUNK <= size <= MAX_CHUNK or size % 16:
                return total, count, False
            held = _free_resident(pagemap, chunk, size, budget)
            if held is None:
                return total, count, False
            total, count, chunk = total + held, count + 1, fd
    return total, count, True


def _fastbins_free(mem: Memory, fastbins_at: int, mangled: bool, budget: _Budget) -> tuple[int, int, bool]:
    heads = mem.read(fastbins_at, NFASTBINS * 8)
    if heads is None:
        return 0, 0, False
    total = count = 0
    for chunk in struct.unpack(f"<{NFASTBINS}Q", heads):
        while chunk:
            if chunk % 16 or not budget.spend():
                return total, count, False
            got = mem.read(chunk + 8, 16)
            if got is None:
                return total, count, False
            raw, stored = struct.unpack("<QQ", got)
            size = raw & ~SIZE_BITS
            if not MIN_CHUNK <= size <= FASTBIN_MAX_CHUNK:
                return total, count, False
            total, count = total + size, count + 1
            chunk = ((chunk + HEADER) >> 12) ^ stored if mangled else stored
    return total, count, True


def _tcache_free(mem: Memory, heap: Mapping) -> tuple[int, int]:
    """The main thread's tcache: its counts by bin (chunk sizes 32, 48, ...); other threads' caches
    are not found here (their chunks count as in use)."""
    raw = mem.word(heap.start + 8)
    if raw is None or (raw & ~SIZE_BITS) not in TCACHE_STRUCT_SIZES:
        return 0, 0
    width = TCACHE_STRUCT_SIZES[raw & ~SIZE_BITS]
    got = mem.read(heap.start + HEADER, TCACHE_BINS * width)
    if got is None:
        return 0, 0
    counts = struct.unpack(f"<{TCACHE_BINS}{'H' if width == 2 else 'B'}", got)
    return sum(n * (MIN_CHUNK + 16 * i) for i, n in enumerate(counts)), sum(counts)


PAGEMAP_WINDOW = 1 << 13  # pages of pagemap read at a time (64 KiB of entries, 32 MiB of memory)
# an entry's last byte with bit 63 set: present. Swapped pages (bit 62) are not counted: the split is
# of RssAnon, which has none of them
_PRESENT_TOP = bytes(b for b in range(256) if b & 0x80)


MAX_KEPT_PAGES = 1 << 22  # pages of heaps whose pagemap is kept for the free chunks' counts (4 MiB: 16 GiB)


class _PageMap:
    """The process's pagemap, open, and what was read of it kept where asked (one byte a page: its
    entry's last): a heap's pages read once serve its top and every free chunk in it, where a pread
    per chunk cost ~25 us (a 1 GiB heap's 4,000 free chunks were past the walk's CPU budget)."""

    def __init__(self, fd: int):
        self.fd, self.kept, self.kept_pages = fd, [], 0

    def counted(self, first: int, last: int) -> int | None:
        """Present pages in [first, last) from what was kept, or None: not kept."""
        for at, tops in self.kept:
            if at <= first and last <= at + len(tops):
                window = tops[first - at : last - at]
                return len(window) - len(window.translate(None, _PRESENT_TOP))
        return None


def _resident(pagemap: _PageMap | None, start: int, end: int, budget: _Budget, keep: bool = False) -> int | None:
    """Bytes of [start, end) resident, from the process's pagemap (8 bytes a page), read a
    window at a time, each window charged to the budget (or counted from what was kept: keep, for a
    heap); None: not read (no pagemap, or the budget spent). The first and last page, shared with what
    lies beside, count in proportion."""
    if pagemap is None:
        return None
    first, last = start // PAGE, (end + PAGE - 1) // PAGE
    pages = pagemap.counted(first, last)
    if pages is not None:
        return min(end - start, pages * PAGE)
    keep = keep and pagemap.kept_pages + (last - first) <= MAX_KEPT_PAGES
    pages, kept = 0, []
    for at in range(first, last, PAGEMAP_WINDOW):
        if not budget.spend():
            return None
        n = min(PAGEMAP_WINDOW, last - at)
        try:
            got = os.pread(pagemap.fd, n * 8, at * 8)
        except OSError:
            return None
        if len(got) != n * 8:
            return None
        tops = got[7::8]  # counted in C: the entries whose last byte has bit 63 set
        pages += len(tops) - len(tops.translate(None, _PRESENT_TOP))
        if keep:
            kept.append(tops)
    if keep:
        pagemap.kept.append((first, b"".join(kept)))
        pagemap.kept_pages += last - first
    return min(end - start, pages * PAGE)


def _free_resident(pagemap: _PageMap | None, chunk: int, size: int, budget: _Budget) -> int | None:
    """A free chunk's resident bytes: the whole pages inside it as pagemap says (malloc_trim and the
    kernel may have dropped them, and a block freed may never have had them touched), the rest of it
    (its header, the parts of pages shared with its neighbours) by size. A chunk of under two pages:
    its size. None: not read."""
    inner_start = (chunk + HEADER + 32 + PAGE - 1) // PAGE * PAGE  # its header and links are written
    inner_end = (chunk + size) // PAGE * PAGE
    if inner_end - inner_start < PAGE or size < 2 * PAGE:
        return size
    held = _resident(pagemap, inner_start, inner_end, budget)
    return None if held is None else size - (inner_end - inner_start) + held


def _mmapped(
    mem: Memory, mappings: tuple[Mapping, ...], heap: Mapping, minor: int, budget: _Budget
) -> tuple[int, int] | None:
    """mp_'s mmapped_mem and n_mmaps, found in libc's writable data by its shape: sbrk_base (the
    [heap]'s start) follows mmapped_mem and max_mmapped_mem, with tcache_bins (at most 64) and
    tcache_count (at most 65,535) after it (2.26 on); before them the ints n_mmaps, n_mmaps_max,
    max_n_mmaps, no_dyn_threshold (2.35 on: after hp_flags, the five padded to three words)."""
    ints_at = -5 * 8 + 4 if minor >= HP_FLAGS_SINCE else -4 * 8  # n_mmaps, from sbrk_base's word
    for _m, data, words in _libc_data(mem, mappings):
        for i in range(4, len(words) - 4):
            if words[i] != heap.start:
                continue
            if not budget.spend():
                return None
            mapped, peak, bins, count = words[i - 2], words[i - 1], words[i + 1], words[i + 3]
            n_mmaps, most, max_n = struct.unpack_from("<iii", data, i * 8 + ints_at)
            shaped = mapped <= peak and mapped % PAGE == 0 and 0 < bins <= TCACHE_BINS and count <= 0xFFFF
            if shaped and 0 <= n_mmaps <= max_n and most > 0 and (n_mmaps == 0) == (mapped == 0):
                return mapped, n_mmaps
    return None


HEAP_MAX = 64 << 20  # a thread arena's heap (HEAP_MAX_SIZE, 64-bit): its top lies within one


@contextlib.contextmanager
def _pagemap(pid: int):
    """The process's pagemap, open for the read (None: not readable: no page is then counted resident)."""
    try:
        fd = os.open(f"/proc/{pid}/pagemap", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        yield None
        return
    try:
        yield _PageMap(fd)
    finally:
        os.close(fd)


def _top_fits(mappings: tuple[Mapping, ...], heap: Mapping, top: int, size: int, main: bool) -> bool:
    """A top chunk lies in its heap: main_arena's ends the [heap]; another arena's lies within one
    mapping and one heap of HEAP_MAX (a hostile or torn pointer is not followed into the address space)."""
    if main:
        return heap.start <= top and top + size == heap.end
    m = next((m for m in mappings if m.start <= top < m.end), None)
    return m is not None and top + size <= m.end and size <= HEAP_MAX


MAX_HEAPS = 4096  # heaps of one thread arena followed at most (HEAP_MAX each: 256 GiB)


def _heaps_resident(
    mem: Memory,
    pagemap: _PageMap | None,
    mappings: tuple[Mapping, ...],
    heap: Mapping,
    arena: int,
    top: int,
    main: bool,
    budget: _Budget,
) -> int | None:
    """The resident bytes of an arena's heaps: main_arena's the [heap]; another's its heaps of HEAP_MAX,
    from the one its top lies in back through each heap_info's prev (ar_ptr, prev, size: each heap's
    ar_ptr this arena, within one mapping, each once). None: not read (a heap not found, the budget)."""
    if main:
        return _resident(pagemap, heap.start, heap.end, budget, keep=True)
    if not top:
        return None
    total, at, seen = 0, top & ~(HEAP_MAX - 1), set()
    while at:
        if at in seen or len(seen) >= MAX_HEAPS or not budget.spend():
            return None
        seen.add(at)
        got = mem.read(at, 24)
        if got is None:
            return None
        owner, prev, size = struct.unpack("<QQQ", got)
        m = next((m for m in mappings if m.start <= at < m.end), None)
        if owner != arena or m is None or size > HEAP_MAX or at + size > m.end:
            return None
        held = _resident(pagemap, at, at + size, budget, keep=True)
        if held is None:
            return None
        total, at = total + held, prev
    return total


def read_arena_stats(pid: int) -> ArenaStats | None:
    """glibc malloc's arenas in the process now; None: not glibc (2.27+), or main_arena not found.
    The caller checks the process is the same one before and after (system/identity.py)."""
    maps = read_maps(pid)
    if maps is None:
        return None
    mappings = tuple(maps)
    minor = glibc_minor(pid, mappings)
    heap = next((m for m in mappings if m.path == "[heap]"), None)
    if minor is None or minor < MIN_MINOR or heap is None:
        return None
    try:
        mem = Memory(pid)
    except OSError:
        return None
    budget = _Budget(MAX_FREE_CHUNKS, MAX_WALK_SECONDS)
    with mem, _pagemap(pid) as pagemap:
        fastbins_at = _main_arena(mem, mappings, heap, budget)
        if fastbins_at is None:
            return None
        system = free = top = top_resident = chunks = arenas = 0
        resident: int | None = 0
        complete = True
        arena, seen = fastbins_at, set()
        while True:
            if arena in seen or len(seen) >= MAX_ARENAS or not budget.spend():
                complete = False  # a list that does not come back to main_arena (a loop), or too long
                break
            seen.add(arena)
            arenas += 1
            state = mem.read(arena + TOP_AFTER_FASTBINS, 8)
            sys_mem = mem.word(arena + SYSTEM_MEM_AFTER_FASTBINS)
            if state is None or sys_mem is None:
                complete = False
                break
            system += sys_mem
            top_chunk = struct.unpack("<Q", state)[0]
            size = _chunk_size(mem, top_chunk) if top_chunk else None
            main = arena == fastbins_at
            fits = size is not None and _top_fits(mappings, heap, top_chunk, size, main)
            held = _heaps_resident(
                mem, pagemap, mappings, heap, arena - FASTBINS_AT, top_chunk if fits else 0, main, budget
            )
            resident = None if held is None or resident is None else resident + held
            if fits:
                top += size
                held = _resident(pagemap, top_chunk, top_chunk + size, budget)
                if held is None:
                    complete = False  # its pages not read: none of it counted resident
                top_resident += held or 0
            elif top_chunk:
                complete = False  # a top that is no chunk within its heap: not counted
            for walked, found, ok in (
                _bins_free(mem, arena + BINS_AFTER_FASTBINS, budget, pagemap),
                _fastbins_free(mem, arena, minor >= MANGLED_SINCE, budget),
            ):
                free, chunks, complete = free + walked, chunks + found, complete and ok
            nxt = mem.word(arena + NEXT_AFTER_FASTBINS)
            if nxt is None:
                complete = False
                break
            if not nxt or nxt + FASTBINS_AT == fastbins_at:
                break
            arena = nxt + FASTBINS_AT
        cached, n = _tcache_free(mem, heap)
        mmapped = _mmapped(mem, mappings, heap, minor, budget)
    return ArenaStats(
        minor=minor,
        arenas=arenas,
        system=system,
        free=free + cached,
        top=top,
        top_resident=top_resident,
        complete=complete,
        free_chunks=chunks + n,
        mmapped=mmapped[0] if mmapped is not None else None,
        n_mmaps=mmapped[1] if mmapped is not None else None,
        resident=resident,
    )


SOURCE = "glibc malloc's arenas (read from its memory)"


def _other_allocators(pid: int) -> list[str]:
    """Allocator libraries other than glibc's mapped in the process (by file name): where one serves
    malloc, what it holds is none of glibc's arenas."""
    from ..allocator import KNOWN_ALLOCATORS

    maps = read_maps(pid) or ()
    names = {m.path.rsplit("/", 1)[-1] for m in maps if m.is_file}
    return sorted(n for n in names if any(k in n for k in KNOWN_ALLOCATORS))


def anon_parts(pid: int) -> tuple[list[AnonPart], list[str]]:
    """The process's anonymous memory glibc's malloc holds, as parts of its ledger's split, and
    what was not read (said, never a zero). The caller checks the process's identity around it."""
    others = [f"{n} is mapped: what it allocates is not read (in the residual)" for n in _other_allocators(pid)]
    try:
        stats = read_arena_stats(pid)
    except (OSError, MemoryError, ValueError, OverflowError, struct.error) as e:  # one line, never a lost report
        return [], [f"glibc malloc: not read ({type(e).__name__}: {e})", *others]
    if stats is None:
        return [], [
            "glibc malloc: not read (no glibc 2.27 or later, no brk heap, or its main_arena not found)",
            *others,
        ]
    if stats.mmapped is not None:
        big = (
            f"glibc malloc: {stats.n_mmaps} block(s) of 128 KiB and more it mmapped on their own, "
            f"{fmt_bytes(stats.mmapped)} mapped (mp_): their resident part is in the residual"
        )
    else:
        big = "glibc malloc: blocks of 128 KiB and more it mmaps on their own are not read (in the residual)"
    unread = [big, *others]
    parts = []
    if stats.in_use is not None:
        label = f"malloc: blocks in use, resident ({stats.arenas} arena(s)' heaps less free chunks and tops)"
        parts.append(AnonPart(key="allocator_in_use", label=label, bytes=stats.in_use, estimate=True, source=SOURCE))
    else:
        unread.append("glibc malloc: blocks in use not said (its free lists' walk was cut short)")
    held = "free chunks it holds, resident (bins, fastbins, the main thread's cache)"
    if not stats.complete:
        held += ", at least: the walk was cut short"
    parts.append(
        AnonPart(key="allocator_free", label=f"malloc: {held}", bytes=stats.free, estimate=True, source=SOURCE)
    )
    top = "malloc: the unused top of its heaps, resident"
    parts.append(AnonPart(key="allocator_top", label=top, bytes=stats.top_resident, estimate=True, source=SOURCE))
    return parts, unread
