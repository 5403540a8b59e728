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

import contextlib
import ctypes as ct
import errno
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from memdiag.system import arch
from memdiag.system.units import fmt_duration, fmt_mib, fmt_speed
from pydantic import BaseModel

# numpy's bundled OpenBLAS starts a thread per core at import; the scan does no linear algebra.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from .elf import elf_info
from .procmaps import AddressSpace, Mapping, parse_maps
from .stacks import Symbolizer, demangle
from .unwind import StackSlice, unwind

PAGE = os.sysconf("SC_PAGE_SIZE")
# Bytes read and filtered at a time: the scan's buffers are bounded by this. Measured here: 256 KiB
# to 1 MiB scan at 1.7-2.1 GiB/s, 2 MiB at 0.9, 4 MiB at 0.8 (the buffer and its temporaries stay
# in the CPU's cache below that).
CHUNK = 512 << 10
PAGEMAP_WINDOW = 1 << 16  # pages of /proc/PID/pagemap read at a time (512 KiB: 256 MiB of address space)
MAX_EDGES = 4_000_000  # block-to-block references kept (8 bytes each); past it the scan gives up
D_STATE_WAIT_S = 0.2  # how long a thread may stay in uninterruptible sleep before the scan gives up
STOP_TIMEOUT_S = 1.0  # a thread that does not stop in this time (uninterruptible sleep) aborts the scan
SAMPLE_CHUNKS = 16  # chunks of the target's memory matched while it runs, to price the pause
SWAP_READ_BYTES_PER_S = 50 << 20  # reading swapped pages back: random 4 KiB reads of a virtual disk
FIXED_MS = 2.0  # listing the mappings and the threads under the stop (measured: ~1 ms)
STOP_MS_PER_THREAD = 0.3  # seizing, interrupting, waiting for and detaching one thread (measured: 0.1-0.2)
SKIPPED_PATHS = ("[vvar]", "[vvar_vclock]", "[vsyscall]", "[vdso]")

# Roots, in the order an anchor is credited: a named variable before a stack before memory memdiag
# could not attribute (an anchor is what a reader can go and look at).
TIER_STATIC, TIER_TLS, TIER_STACK, TIER_REGISTER, TIER_UNTRACKED, TIER_NONE = 0, 1, 2, 3, 4, 9
ANCHOR_KIND = {
    TIER_STATIC: "static",
    TIER_TLS: "tls",
    TIER_STACK: "stack",
    TIER_REGISTER: "register",
    TIER_UNTRACKED: "untracked",
}
ROOTS = (
    "registers and stacks (from the stack pointer up) of every thread, modules' .data/.bss, and all other "
    "readable writable memory outside the tracked blocks (heap allocated before memleak attached or held "
    "free by the allocator counts as live: a leak can be missed, never invented)"
)
CONSISTENCY = (
    "every thread stopped with ptrace (seize + interrupt) while memleak's table was read and memory scanned, "
    "then resumed"
)

# ptrace(2) requests and the register set (NT_PRSTATUS; its layout by machine: arch.USER_REGS)
PTRACE_DETACH, PTRACE_GETREGSET, PTRACE_SEIZE, PTRACE_INTERRUPT = 17, 0x4204, 0x4206, 0x4207
PTRACE_EVENT_STOP, NT_PRSTATUS, WALL = 128, 1, 0x40000000

_libc = ct.CDLL(None, use_errno=True)
_libc.ptrace.restype = ct.c_long
_libc.ptrace.argtypes = [ct.c_long, ct.c_long, ct.c_void_p, ct.c_void_p]


class StackReach(BaseModel):
    """One allocation stack's outstanding blocks, by what still points at them."""

    leaked_count: int = 0
    leaked_bytes: int = 0
    unreferenced_count: int = 0  # leaked, and no other block points at them either
    anchored_count: int = 0
    anchored_bytes: int = 0
    anchor: str | None = None  # the root that holds most of the anchored bytes
    anchor_kind: str | None = None  # static | stack | register | tls | untracked | runtime (a global it names)
    anchor_bytes: int = 0


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


class ReachScan(BaseModel):
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
    speed_bytes_per_s: float | None = None  # measured in this scan
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
        return (
            f"ran {at}paused the target {self.paused_ms:.1f} ms ({priced}{allowed}) to read "
            f"{fmt_mib(self.scanned_bytes)} of writable memory in {self.regions} mappings{speed}{swapped}; "
            f"{self.threads} thread(s), "
            f"{self.blocks:,} outstanding blocks checked, {self.references:,} references between them; "
            f"{self.consistency}"
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


@dataclass
class Thread:
    tid: int
    regs: bytes
    sp: int
    ip: int
    bp: int
    tp: int | None = None  # the thread pointer (x86-64 fs_base): its TLS lies just below it
    stack: bytes = b""  # its stack from sp - red zone up, copied while stopped (to name frames)
    stack_base: int = 0


@dataclass
class Region:
    start: int
    end: int
    tier: int
    mapping: Mapping
    tid: int | None = None  # a thread's stack
    module: str | None = None  # a module's writable data (file path as the process sees it)


@dataclass
class Found:
    """What the memory says about the blocks (indices into the sorted Blocks)."""

    root_tier: object  # numpy int8 per block: the best root tier that points into it
    root_addr: object  # numpy uint64 per block: that root word's address (0 for a register)
    root_region: object  # numpy int32 per block: the region of that word (-1 for a register)
    root_tid: object  # numpy int64 per block: the thread whose register it was
    edges: list = field(default_factory=list)  # numpy (src block, dst block) int32 pairs per chunk
    edge_count: int = 0
    scanned: int = 0
    swapped: int = 0
    unreadable: int = 0


class ScanAborted(Exception):
    """The scan could not finish; the message says why."""


# --- stopping the target -------------------------------------------------------------------


def _ptrace(request: int, tid: int, addr: int = 0, data: int = 0) -> None:
    if _libc.ptrace(request, tid, ct.c_void_p(addr), ct.c_void_p(data)) < 0:
        err = ct.get_errno()
        raise OSError(err, os.strerror(err))


class _IoVec(ct.Structure):
    _fields_ = [("base", ct.c_void_p), ("len", ct.c_size_t)]


def _regs(tid: int) -> bytes:
    buf = ct.create_string_buffer(1024)
    iov = _IoVec(ct.cast(buf, ct.c_void_p), len(buf))
    _ptrace(PTRACE_GETREGSET, tid, NT_PRSTATUS, ct.addressof(iov))
    return buf.raw[: iov.len]


def _tids(pid: int) -> set[int]:
    """The threads that can be stopped (a zombie thread, e.g. a leader that called
    pthread_exit, refuses PTRACE_SEIZE and has no memory of its own to point from)."""
    try:
        tids = {int(t) for t in os.listdir(f"/proc/{pid}/task")}
    except OSError:
        return set()
    return {t for t in tids if _state(pid, t) not in ("Z", "X", None)}


def _state(pid: int, tid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _status_field(pid: int, tid: int, name: str) -> str | None:
    try:
        with open(f"/proc/{pid}/task/{tid}/status") as f:
            for line in f:
                if line.startswith(name + ":"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def _check_stoppable(pid: int) -> None:
    """Refuse before stopping anything: a thread traced by another tool (a debugger, strace), or
    in uninterruptible sleep for longer than a disk read (it would not stop in time)."""
    tids = _tids(pid)
    for tid in tids:
        tracer = _status_field(pid, tid, "TracerPid")
        if tracer not in (None, "0"):
            comm = _status_field(int(tracer), int(tracer), "Name") or "?"
            raise ScanAborted(f"thread {tid} is traced by PID {tracer} ({comm}): a debugger or tracer holds it")
    deadline = time.monotonic() + D_STATE_WAIT_S
    while any(_state(pid, t) == "D" for t in tids):
        if time.monotonic() > deadline:
            stuck = [t for t in tids if _state(pid, t) == "D"]
            raise ScanAborted(f"thread {stuck[0]} stays in uninterruptible sleep (D): it could not be stopped in time")
        time.sleep(0.005)


def _wait_stopped(tid: int, deadline: float) -> int | None:
    """Wait for a seized thread's stop; the signal to give back at detach (0 for none), or None
    when the thread is gone."""
    while True:
        try:
            got, status = os.waitpid(tid, os.WNOHANG | WALL)
        except ChildProcessError:
            return None
        if got == tid:
            if os.WIFEXITED(status) or os.WIFSIGNALED(status):
                return None
            if os.WIFSTOPPED(status):
                sig = os.WSTOPSIG(status)
                if status >> 16 == PTRACE_EVENT_STOP:
                    return 0
                return sig  # a signal-delivery stop (SIGTRAP too): the signal is handed back at detach
        if time.monotonic() > deadline:
            raise ScanAborted(f"thread {tid} did not stop within {STOP_TIMEOUT_S:g} s (uninterruptible sleep?)")
        time.sleep(0.0001)


@contextlib.contextmanager
def stopped(pid: int):
    """Every thread of pid stopped with ptrace for the duration; yields their Threads. New
    threads created while stopping are stopped too (the set is re-read until it is stable)."""
    layout = arch.USER_REGS.get(arch.MACHINE)
    if layout is None:
        raise ScanAborted(f"memdiag does not know the register layout of {arch.MACHINE}")
    sp_i, tp_i, ip_i, bp_i, n_words = layout
    seized: dict[int, int] = {}  # tid -> signal to hand back
    threads: list[Thread] = []
    try:
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while True:
            new = _tids(pid) - set(seized)
            if not new:
                break
            for tid in sorted(new):
                try:
                    _ptrace(PTRACE_SEIZE, tid)
                    _ptrace(PTRACE_INTERRUPT, tid)
                except OSError as e:
                    if e.errno == errno.ESRCH:
                        seized[tid] = -1  # exited meanwhile
                        continue
                    raise ScanAborted(f"cannot stop thread {tid}: {e.strerror} (traced by a debugger?)") from None
                sig = _wait_stopped(tid, deadline)
                seized[tid] = -1 if sig is None else sig
        if not any(s >= 0 for s in seized.values()):
            raise ScanAborted("the target exited")
        for tid, sig in seized.items():
            if sig < 0:
                continue
            raw = _regs(tid)
            if len(raw) != n_words * 8:  # a 32-bit (compat) task hands out its own, smaller set
                raise ScanAborted(f"a 32-bit target: memdiag reads {arch.MACHINE} registers only")
            words = [int.from_bytes(raw[i : i + 8], "little") for i in range(0, len(raw) - 7, 8)]
            tp = words[tp_i] if tp_i is not None else None
            threads.append(Thread(tid, raw, words[sp_i], words[ip_i], words[bp_i], tp))
        yield threads
    finally:
        for tid, sig in seized.items():
            if sig >= 0:
                with contextlib.suppress(OSError):
                    _ptrace(PTRACE_DETACH, tid, 0, sig)


# --- what to read ----------------------------------------------------------------------------


def _regions(space: AddressSpace, threads: list[Thread], tls_bytes: int = 0, blocks=None) -> list[Region]:
    """Readable, writable mappings, each with the root tier its words count as."""
    stacks = _stack_mappings(space, threads, blocks)
    out: list[Region] = []
    previous: Mapping | None = None
    for m in space.mappings:
        prev, previous = previous, m
        if "r" not in m.perms or "w" not in m.perms or m.path in SKIPPED_PATHS:
            continue
        if m.path.startswith("/dev/") and not m.path.startswith(("/dev/zero", "/dev/shm/")):
            continue  # device memory: reading it may have effects
        if m.start in stacks:
            t = stacks[m.start]
            out.append(Region(max(m.start, t.sp - arch.RED_ZONE), m.end, TIER_STACK, m, tid=t.tid))
        elif m.is_file and "s" not in m.perms:
            out.append(Region(m.start, m.end, TIER_STATIC, m, module=m.path))
        elif not m.path and prev is not None and prev.is_file and "w" in prev.perms and prev.end == m.start:
            # .bss past the file's pages: only as far as the segment's p_memsz reaches; an anonymous
            # mapping the kernel happened to place right after it is not the module's
            bss_end = min(m.end, _segment_end(space, prev) or m.start)
            if bss_end > m.start:
                out.append(Region(m.start, bss_end, TIER_STATIC, m, module=prev.path))
            if bss_end < m.end:
                out.append(Region(bss_end, m.end, TIER_UNTRACKED, m))
        else:
            out.append(Region(m.start, m.end, TIER_UNTRACKED, m))
    return _split_tls(out, threads, tls_bytes) if threads and tls_bytes else out


def _stack_mappings(space: AddressSpace, threads: list[Thread], blocks) -> dict[int, Thread]:
    """Mappings that are one thread's stack and nothing else, by start: only there is the memory
    below the stack pointer dead. A stack pointer in the heap (a coroutine's malloc()ed stack, a
    sigaltstack), two threads in one mapping, or tracked blocks inside it: the mapping is read whole."""
    import numpy as np

    by_mapping: dict[int, list[Thread]] = {}
    for t in threads:
        m = space.find(t.sp)
        if m is not None:
            by_mapping.setdefault(m.start, []).append(t)
    out = {}
    for start, ts in by_mapping.items():
        m = space.find(start)
        if m is None or len(ts) != 1 or m.is_file or m.path not in ("", "[stack]"):
            continue
        if blocks is not None and len(blocks.starts):
            inside = (blocks.starts > np.uint64(m.start)) & (blocks.starts < np.uint64(m.end))
            if inside.any():  # a tracked block strictly inside: this memory is a heap too
                continue
        out[start] = ts[0]
    return out


def _segment_end(space: AddressSpace, mapping: Mapping) -> int | None:
    """Where the loaded segment that a module's mapping belongs to ends in memory (p_memsz)."""
    elf = elf_info(space.file_path(mapping))
    bias = elf.bias(mapping) if elf is not None else None
    if elf is None or bias is None:
        return None
    vaddr = mapping.start - bias
    for seg in elf.loads:
        if seg["p_vaddr"] <= vaddr < seg["p_vaddr"] + seg["p_memsz"]:
            end = bias + seg["p_vaddr"] + seg["p_memsz"]
            return -(-end // PAGE) * PAGE
    return None


def _runs(pagemap_fd: int | None, start: int, end: int, tick: Callable[[], None] = lambda: None):
    """(start, end, swapped pages) of the resident or swapped stretches of [start, end). tick is
    called for every window of the page map (a huge sparse mapping is mostly windows)."""
    import numpy as np

    first = start // PAGE * PAGE
    if pagemap_fd is None:  # no pagemap: read everything
        yield start, end, 0
        return
    for w in range(first, end, PAGEMAP_WINDOW * PAGE):
        tick()
        w_end = min(end, w + PAGEMAP_WINDOW * PAGE)
        n = (w_end - w + PAGE - 1) // PAGE
        raw = os.pread(pagemap_fd, n * 8, w // PAGE * 8)
        pm = np.frombuffer(raw, dtype=np.uint64, count=len(raw) // 8)
        present = (pm >> np.uint64(62)) != 0  # bit 63 present, bit 62 swapped
        if not present.any():
            continue
        swapped = ((pm >> np.uint64(62)) & np.uint64(1)).astype(bool)
        edge = np.diff(np.concatenate(([False], present, [False])).astype(np.int8))
        for a, b in zip(np.flatnonzero(edge == 1), np.flatnonzero(edge == -1), strict=True):
            lo, hi = max(start, w + int(a) * PAGE), min(w_end, w + int(b) * PAGE)
            if lo < hi:
                yield lo, hi, int(swapped[a:b].sum())


# --- the scan --------------------------------------------------------------------------------


class _Matcher:
    """Finds, in a buffer of words, those that point into a block: a subtraction and one compare
    over the whole buffer (numpy), then a binary search for the few that fall in the blocks' span."""

    def __init__(self, blocks: Blocks):
        import numpy as np

        self.np = np
        self.starts = blocks.starts
        self.ends = blocks.ends if blocks.ends is not None else blocks.starts + blocks.sizes
        self.lo = np.uint64(int(blocks.starts[0]))
        self.span = np.uint64(int(self.ends.max()) - int(blocks.starts[0]))
        self.tmp = np.empty(CHUNK // 8, dtype=np.uint64)

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
        return pos[ok], idx[ok]

    def owner(self, addresses) -> object:
        """The block that holds each address, or -1."""
        np = self.np
        idx = np.searchsorted(self.starts, addresses, side="right") - 1
        inside = (idx >= 0) & (addresses < self.ends[np.maximum(idx, 0)])
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


def _scan(pid: int, blocks: Blocks, regions: list[Region], threads: list[Thread], stop_check) -> Found:
    import numpy as np

    n = len(blocks.starts)
    found = Found(
        root_tier=np.full(n, TIER_NONE, dtype=np.int8),
        root_addr=np.zeros(n, dtype=np.uint64),
        root_region=np.full(n, -1, dtype=np.int32),
        root_tid=np.zeros(n, dtype=np.int64),
    )
    match = _Matcher(blocks)

    def credit(dst, tier: int, addrs, region: int, tid: int = 0) -> None:
        # On a stack, the outermost frame that holds a pointer is credited (stacks are read from the
        # stack pointer up): an inner frame's copy is more often a stale slot than the owner.
        better = (found.root_tier[dst] >= tier) if tier == TIER_STACK else (found.root_tier[dst] > tier)
        dst = dst[better]
        found.root_tier[dst] = tier
        found.root_addr[dst] = addrs[better] if addrs is not None else 0
        found.root_region[dst] = region
        found.root_tid[dst] = tid

    for t in threads:
        words = np.frombuffer(t.regs[: len(t.regs) // 8 * 8], dtype=np.uint64)
        _pos, dst = match.hits(words)
        credit(dst, TIER_REGISTER, None, -1, t.tid)
    buf = np.empty(CHUNK // 8, dtype=np.uint64)
    mem = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
    try:
        pagemap: int | None = os.open(f"/proc/{pid}/pagemap", os.O_RDONLY)
    except OSError:
        pagemap = None
    stacks = {t.tid: t for t in threads}
    try:
        for ri, r in enumerate(regions):
            for lo, hi, swapped in _runs(pagemap, r.start, r.end, lambda: stop_check(found.scanned)):
                found.swapped += swapped * PAGE
                for at in range(lo, hi, CHUNK):
                    stop_check(found.scanned)
                    size = min(CHUNK, hi - at)
                    got = _read(mem, buf, at, size, found)
                    if r.tier == TIER_STACK and r.tid is not None and at == lo:  # to name frames later
                        stacks[r.tid].stack, stacks[r.tid].stack_base = bytes(buf.view(np.uint8)[:got]), at
                    words = buf[: got // 8]
                    pos, dst = match.hits(words)
                    if not pos.size:
                        continue
                    src_addr = np.uint64(at) + pos.astype(np.uint64) * np.uint64(8)
                    src = match.owner(src_addr)
                    # a stack or static data is a root even inside a tracked mapping (a thread stack
                    # mmap()ed after memleak attached)
                    inside = (src >= 0) if r.tier == TIER_UNTRACKED else np.zeros(len(src), dtype=bool)
                    credit(dst[~inside], r.tier, src_addr[~inside], ri)
                    if inside.any():
                        pairs = np.unique(np.stack((src[inside], dst[inside]), axis=1).astype(np.int32), axis=0)
                        found.edges.append(pairs)
                        found.edge_count += len(pairs)
                        if found.edge_count > MAX_EDGES:
                            raise ScanAborted(f"more than {MAX_EDGES:,} references between tracked blocks")
    finally:
        os.close(mem)
        if pagemap is not None:
            os.close(pagemap)
    return found


# --- from references to leaked / anchored ----------------------------------------------------


def _reachability(n: int, found: Found) -> tuple:
    """(anchored bool per block, seed block per anchored block, referenced-by-a-block per block)."""
    import numpy as np

    edges = np.concatenate(found.edges) if found.edges else np.zeros((0, 2), dtype=np.int32)
    edges = edges[edges[:, 0] != edges[:, 1]]  # a block pointing into itself anchors nothing
    referenced = np.zeros(n, dtype=bool)
    referenced[edges[:, 1]] = True
    order = np.argsort(edges[:, 0], kind="stable")
    src, dst = edges[order, 0], edges[order, 1]
    first = np.searchsorted(src, np.arange(n + 1))
    seed_of = np.full(n, -1, dtype=np.int64)
    dst_list = dst.tolist()
    first_list = first.tolist()
    # Credit each anchored block to the best root that reaches it: seeds by tier, breadth first.
    for tier in sorted(ANCHOR_KIND):
        seeds = np.flatnonzero((found.root_tier == tier) & (seed_of < 0))
        queue = deque()
        for s in seeds.tolist():
            seed_of[s] = s
            queue.append(s)
        while queue:
            b = queue.popleft()
            for d in dst_list[first_list[b] : first_list[b + 1]]:
                if seed_of[d] < 0:
                    seed_of[d] = seed_of[b]
                    queue.append(d)
    return seed_of >= 0, seed_of, referenced


def _frame_name(space: AddressSpace, t: Thread, address: int, symbolizer: Symbolizer) -> str | None:
    """The function whose frame holds a stack address, by .eh_frame unwinding of the copy."""
    if not t.stack or not arch.supported():  # .eh_frame replayed with x86-64 registers
        return None
    result = unwind(space, t.ip, t.sp, t.bp, StackSlice(t.stack_base, t.stack))
    low = t.sp
    for pc, cfa in zip(result.addresses, result.cfas, strict=False):
        if low - arch.RED_ZONE <= address < cfa:
            return symbolizer.frame(pc).function
        low = cfa
    return None


def _label(
    block: int, found: Found, regions: list[Region], threads: dict[int, Thread], space, symbolizer
) -> tuple[str, str]:
    """(kind, name) of the root that anchors a seed block."""
    tier = int(found.root_tier[block])
    kind = ANCHOR_KIND[tier]
    if tier == TIER_REGISTER:
        return kind, f"a register of thread {int(found.root_tid[block])}"
    r = regions[int(found.root_region[block])]
    addr = int(found.root_addr[block])
    if tier == TIER_STACK and r.tid is not None:
        main = " (main thread)" if r.tid == space.pid else ""
        fn = _frame_name(space, threads[r.tid], addr, symbolizer)
        return kind, f"the stack of thread {r.tid}{main}" + (f", in {fn}()" if fn else "")
    if tier == TIER_STATIC and r.module is not None:
        return kind, _static_name(space, r, addr)
    if tier == TIER_TLS and r.tid is not None:
        main = " (main thread)" if r.tid == space.pid else ""
        var = _tls_name(space, threads[r.tid], addr)
        return kind, (f"{var} in " if var else "") + f"the thread-local storage of thread {r.tid}{main}"
    where = r.mapping.path or f"anonymous memory at {r.mapping.start:#x}"
    return kind, f"memory memdiag did not see allocated ({where})"


def _runtime_label(block: int, found: Found, blocks: Blocks, namer) -> tuple[str, str] | None:
    """The holder of a seed block in the runtime's terms, where a word outside the tracked blocks
    (untracked heap, a module's data) holds it and the runtime names that word's object."""
    if namer is None or int(found.root_tier[block]) not in (TIER_UNTRACKED, TIER_STATIC):
        return None
    name = namer(int(found.root_addr[block]), int(blocks.starts[block]), int(blocks.sizes[block]))
    return ("runtime", name) if name else None


def _tls_name(space: AddressSpace, t: Thread, addr: int) -> str | None:
    """The executable's thread-local variable at addr (its TLS block sits right below the thread
    pointer in variant II), as "`name` (thread-local)"."""
    exe = space.mappings[0].path if space.mappings and space.mappings[0].is_file else None
    elf = elf_info(space.file_path(space.mappings[0])) if exe else None
    seg = _tls_segment(elf) if elf is not None else None
    if seg is None or t.tp is None:
        return None
    size = -(-seg["p_memsz"] // max(seg["p_align"], 1)) * max(seg["p_align"], 1)
    offset = addr - (t.tp - size)
    if not 0 <= offset < seg["p_memsz"]:
        return None
    sym = elf.tls_object_at(offset)
    return f"`{demangle(sym.name)}` (thread-local)" if sym is not None else None


def _tls_segment(elf):
    return next((seg for seg in elf.loads_and_tls() if seg["p_type"] == "PT_TLS"), None)


def _static_tls_bytes(space: AddressSpace) -> int:
    """The size of a thread's static TLS: every loaded module's PT_TLS segment, aligned, plus
    glibc's surplus."""
    total = arch.TLS_SURPLUS
    for path in space.modules():
        m = space.first_mapping_of(path)
        elf = elf_info(space.file_path(m)) if m is not None else None
        seg = _tls_segment(elf) if elf is not None else None
        if seg is not None:
            align = max(seg["p_align"], 1)
            total += -(-seg["p_memsz"] // align) * align
    return total


def _split_tls(regions: list[Region], threads: list[Thread], tls_bytes: int) -> list[Region]:
    """Carve each thread's static TLS and control block out of the mapping that holds its thread
    pointer, never below its stack pointer (live frames stay stack)."""
    import bisect

    for t in threads:
        if t.tp is None:
            continue
        starts = [r.start for r in regions]
        i = bisect.bisect_right(starts, t.tp - 1) - 1
        if i < 0 or not regions[i].start <= t.tp - 1 < regions[i].end:
            continue
        r = regions[i]
        floor = t.sp if r.mapping.start <= t.sp < r.mapping.end else r.mapping.start
        lo, hi = max(r.start, t.tp - tls_bytes, floor), min(r.end, t.tp + arch.TCB_BYTES)
        if lo >= hi or r.tier == TIER_STATIC:  # a module's own data keeps its symbols
            continue
        parts = [Region(r.start, lo, r.tier, r.mapping, r.tid, r.module)] if r.start < lo else []
        parts.append(Region(lo, hi, TIER_TLS, r.mapping, tid=t.tid))
        if hi < r.end:
            parts.append(Region(hi, r.end, r.tier, r.mapping, r.tid, r.module))
        regions[i : i + 1] = parts
    return regions


def _static_name(space: AddressSpace, r: Region, addr: int) -> str:
    """A module's writable data by the variable that holds addr: "`registry` in registry's .bss"."""
    base = os.path.basename(r.module or "")
    mappings = [m for m in space.mappings if m.path == r.module]
    elf = elf_info(space.file_path(mappings[0])) if mappings else None
    bias = next((b for m in mappings if (b := elf.bias(m)) is not None), None) if elf is not None else None
    if elf is None or bias is None:
        return f"{base}'s writable data"
    sym = elf.object_at(addr - bias)
    section = elf.section_of(addr - bias) or "data"
    if sym is None:
        return f"{base}'s {section} (no symbol)"
    return f"`{demangle(sym[0].name)}` in {base}'s {section}"


def _per_group(blocks: Blocks, anchored, seed_of, referenced, labels: dict[int, tuple[str, str]]) -> dict:
    import numpy as np

    out: dict[int, StackReach] = {}
    sizes = blocks.sizes.astype(np.int64)
    for g in np.unique(blocks.groups).tolist():
        mine = blocks.groups == g
        held = mine & anchored
        lost = mine & ~anchored
        r = StackReach(
            leaked_count=int(lost.sum()),
            leaked_bytes=int(sizes[lost].sum()),
            unreferenced_count=int((lost & ~referenced).sum()),
            anchored_count=int(held.sum()),
            anchored_bytes=int(sizes[held].sum()),
        )
        if r.anchored_count:
            by_anchor: dict[tuple[str, str], int] = {}
            for b, size in zip(np.flatnonzero(held).tolist(), sizes[held].tolist(), strict=True):
                key = labels[int(seed_of[b])]
                by_anchor[key] = by_anchor.get(key, 0) + size
            (kind, name), held_bytes = max(by_anchor.items(), key=lambda kv: kv[1])
            r = r.model_copy(update={"anchor": name, "anchor_kind": kind, "anchor_bytes": held_bytes})
        out[g] = r
    return out


# --- the whole step --------------------------------------------------------------------------


@dataclass
class Price:
    planned_bytes: int
    swapped_bytes: int
    speed: float | None  # bytes a second, sampled on the target's own memory against its blocks
    fixed_ms: float  # stopping the threads, reading the table, walking the page map
    blocks: int
    tls_bytes: int
    refused: str | None = None  # why the scan must not run whatever it costs

    @property
    def ms(self) -> float | None:
        if not self.speed:
            return None
        swap_ms = self.swapped_bytes / SWAP_READ_BYTES_PER_S * 1000
        return self.fixed_ms + (self.planned_bytes - self.swapped_bytes) / self.speed * 1000 + swap_ms


def price(pid: int, blocks: Blocks, read_ms: float, limit_ms: float | None) -> Price | None:
    """What a scan of pid would pause it, estimated while it runs: the resident bytes of its
    writable mappings (pagemap) over the speed of matching a sample of them (up to SAMPLE_CHUNKS
    chunks spread over the whole) against its current blocks; swapped bytes at swap speed; plus
    the fixed part, the page-map walk timed here included (it is done again during the stop). The
    sample sees the target's own pointer density: a pointer-dense heap matches several times slower
    than a sparse one (measured: 0.3 GiB/s on redis, 2 GiB/s on a heap of strings)."""
    import numpy as np

    space = AddressSpace.of(pid)
    if space is None:
        return None
    tls_bytes = _static_tls_bytes(space)
    fixed = FIXED_MS + 2 * read_ms + STOP_MS_PER_THREAD * len(_tids(pid))  # the table is read again
    if not len(blocks.starts):
        return Price(0, 0, None, fixed, 0, tls_bytes)
    t0 = time.monotonic()

    def walk_tick() -> None:
        if limit_ms is not None and (time.monotonic() - t0) * 1000 > limit_ms:
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
        for r in _regions(space, []):
            for lo, hi, sw in _runs(pagemap, r.start, r.end, walk_tick):
                runs.append((lo, hi))
                swapped += sw * PAGE
    except ScanAborted as e:
        planned = sum(hi - lo for lo, hi in runs)
        return Price(planned, swapped, None, fixed, len(blocks.starts), tls_bytes, refused=str(e))
    finally:
        if pagemap is not None:
            os.close(pagemap)
    fixed += (time.monotonic() - t0) * 1000
    planned = sum(hi - lo for lo, hi in runs)
    refused = _swap_refusal(pid, swapped)
    stride = max(CHUNK, planned // SAMPLE_CHUNKS)
    match, buf = _Matcher(blocks.sort()), np.empty(CHUNK // 8, dtype=np.uint64)
    sampled, seconds, offset = 0, 0.0, 0
    try:
        mem = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
    except OSError:
        return None
    try:
        for lo, hi in runs:
            for at in range(lo + (-offset) % stride, hi, stride):
                t = time.perf_counter()
                try:
                    got = os.preadv(mem, [memoryview(buf).cast("B")[: min(CHUNK, hi - at)]], at)
                except OSError:
                    continue
                pos, _dst = match.hits(buf[: got // 8])
                if pos.size:
                    match.owner(np.uint64(at) + pos.astype(np.uint64) * np.uint64(8))
                seconds += time.perf_counter() - t
                sampled += got
            offset += hi - lo
    finally:
        os.close(mem)
    speed = sampled / seconds if seconds > 0 and sampled else None
    return Price(planned, swapped, speed, fixed, len(blocks.starts), tls_bytes, refused)


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


def scan(
    pid: int,
    read_blocks: Callable[[bool], Blocks],
    allowed_ms: float | None,
    interrupted: Callable[[], bool] = lambda: False,
    namer: Callable[[int, int, int], str | None] | None = None,
) -> tuple[ReachScan, dict[int, StackReach]]:
    """Price, stop, read the blocks, scan, resume, classify. read_blocks(final) returns the
    outstanding blocks: once while the target runs (final False, to price the scan), once with it
    stopped (final True: the probe's books stop there). allowed_ms: the longest pause allowed (None:
    no limit); the scan gives up, resumes the target and concludes nothing when it gets there, or
    when interrupted() says so (SIGINT, SIGTERM). namer(word address, block start, size): the holder
    of a block in the runtime's own terms (a CPython global: probes/cpython/holder.py), or None."""
    import numpy  # noqa: F401  (imported before the table read is timed: the import is not part of a pause)

    t = time.monotonic()
    ahead = read_blocks(False)
    est = price(pid, ahead, (time.monotonic() - t) * 1000, allowed_ms)
    if est is None:
        return ReachScan(status="failed", reason="the target is gone"), {}
    info = dict(planned_bytes=est.planned_bytes, priced_ms=est.ms, allowed_ms=allowed_ms)
    if not est.blocks:
        return ReachScan(status="ran", reason="no outstanding block to check: the target was not stopped", **info), {}
    if est.refused:
        return ReachScan(status="skipped", reason=est.refused, **info), {}
    if allowed_ms is not None and est.ms is not None and est.ms > allowed_ms:
        swap = f", {fmt_mib(est.swapped_bytes)} of it in swap," if est.swapped_bytes else ""
        why = (
            f"reading {est.planned_bytes / 2**20:,.0f} MiB of writable memory{swap} at {fmt_speed(est.speed)} "
            f"(sampled on the target) and {est.blocks:,} blocks would pause the target "
            f"~{fmt_duration(est.ms / 1000)} > {fmt_duration(allowed_ms / 1000)} allowed "
            "(a larger --budget, a longer --duration or --max-pause lets it run)"
        )
        return ReachScan(status="skipped", reason=why, **info), {}
    try:
        _check_stoppable(pid)
    except ScanAborted as e:
        return ReachScan(status="failed", reason=str(e), **info), {}
    box: dict = {}
    # In a thread of its own that ends with the stop: when a tracer thread exits, the kernel
    # detaches every tracee it still holds (exit_ptrace), also one that never reached its stop or
    # died meanwhile (a zombie goes back to its parent), so nothing is left traced, whatever fails.
    worker = threading.Thread(
        target=_stop_and_scan, args=(pid, read_blocks, allowed_ms, interrupted, est, box), name="memdiag-reach"
    )
    worker.start()
    worker.join()
    if "error" in box:
        e = box["error"]
        reason = str(e) if isinstance(e, ScanAborted) else f"reading the target's memory failed: {e}"
        return ReachScan(status="failed", reason=reason, paused_ms=box.get("paused_ms"), **info), {}
    if "empty" in box:
        return ReachScan(status="ran", reason="no outstanding block", paused_ms=box["paused_ms"], **info), {}
    if not _alive(pid):
        why = "the target exited during the scan: nothing is concluded from it"
        return ReachScan(status="failed", reason=why, paused_ms=box["paused_ms"], **info), {}
    return _classify(box, info, namer)


def _stop_and_scan(pid, read_blocks, allowed_ms, interrupted, est: Price, box: dict) -> None:
    t0 = time.monotonic()

    def stop_check(done: int) -> None:
        if interrupted():
            raise ScanAborted("interrupted: the target was resumed and nothing is concluded from a partial scan")
        spent = (time.monotonic() - t0) * 1000
        if allowed_ms is not None and spent > allowed_ms:
            raise ScanAborted(
                f"stopped at the {fmt_duration(allowed_ms / 1000)} pause allowed, after {fmt_mib(done)} of "
                f"{fmt_mib(est.planned_bytes)} (the target was resumed; a partial scan concludes nothing)"
            )

    try:
        with stopped(pid) as threads:
            blocks = read_blocks(True)
            if not len(blocks.starts):
                box["empty"] = True
                return
            blocks = blocks.sort()
            space = AddressSpace(pid, parse_maps(Path(f"/proc/{pid}/maps").read_text()), root=f"/proc/{pid}/root")
            regions = _regions(space, threads, est.tls_bytes, blocks)
            t_scan = time.monotonic()
            found = _scan(pid, blocks, regions, threads, stop_check)
            scan_s = time.monotonic() - t_scan
        box.update(threads=threads, blocks=blocks, space=space, regions=regions, found=found, scan_s=scan_s)
    except Exception as e:  # handed to the caller's thread; the stop ends with this thread either way
        box["error"] = e
    finally:
        box["paused_ms"] = (time.monotonic() - t0) * 1000


def _alive(pid: int) -> bool:
    return _state(pid, pid) not in (None, "Z", "X")


def _classify(box: dict, info: dict, namer=None) -> tuple[ReachScan, dict[int, StackReach]]:
    """Leaked or anchored per block, the anchors named, per group; after the target runs again."""
    import numpy as np

    blocks, found, threads, space, regions = box["blocks"], box["found"], box["threads"], box["space"], box["regions"]
    anchored, seed_of, referenced = _reachability(len(blocks.starts), found)
    by_tid = {t.tid: t for t in threads}
    symbolizer = Symbolizer(space)
    labels = {}
    for seed in np.unique(seed_of[anchored]).tolist():
        try:
            labels[seed] = _runtime_label(seed, found, blocks, namer) or _label(
                seed, found, regions, by_tid, space, symbolizer
            )
        except Exception:  # a malformed module must not cost the result: the tier still says what held it
            labels[seed] = (ANCHOR_KIND[int(found.root_tier[seed])], "a root memdiag could not name")
    per_group = _per_group(blocks, anchored, seed_of, referenced, labels)
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
            blocks=len(blocks.starts),
            references=found.edge_count,
            speed_bytes_per_s=found.scanned / scan_s if scan_s > 0 else None,
            **info,
        ),
        per_group,
    )
