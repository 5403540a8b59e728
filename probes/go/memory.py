"""A Go process read from outside: its heap profile (the runtime's own sampled buckets: in-use
bytes by allocation stack) and its goroutines, read from /proc/PID/mem with no cooperation from
the target (nothing is written to it, nothing is stopped), as Coroot's node agent reads
runtime.mbuckets; the stacks named with the binary's own function table, inlined calls included;
and beside them the GC pacer's exact counts (runtime.gcController) and the process's RssAnon.

What a read costs the target: /proc/PID/mem takes the target's memory-map lock for reading, as its
own page faults do; only its mmap/munmap wait on a read in progress. The reader's own time and the
bytes it read are kept, to be reported as the probe's price.

Heap profile semantics (runtime/mprof.go): allocations are sampled one per MemProfileRate bytes
on average; each bucket's `active` record is the profile as of the last completed GC (frees are
known only once a GC has swept), so in-use bytes move only when a GC completes: the GC cycle
counter is read beside them. Sampled counts are scaled to an estimate as pprof does
(1 / (1 - e^(-average size / rate)))."""

from __future__ import annotations

import math
import os
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path

from memdiag.system import clock, identity
from memdiag.system.process import read_rss_anon
from memdiag.system.runtime import read_go_build

from .layout import Layout, UnsupportedGo, find_variables, layout_for
from .pclntab import GoTable, PclntabError, go_table

CHUNK = 64 << 10  # the memory reader's unit: bucket records and g structs sit together in the runtime's arenas
MAX_BUCKETS = 200_000  # a bucket list longer than this is not read to its end (said so)
MAX_GOROUTINES = 500_000


def standard_library(function: str) -> bool:
    """A function of Go's standard library: its package path's first element has no dot, as the go
    command tells standard packages from others (main is the program's): internal/poll.runtime_pollWait,
    net/http.(*conn).serve; not main.serve nor github.com/x/y.f."""
    slash = function.rfind("/", 0, function.find("(") if "(" in function else len(function))
    package = function[: function.index(".", slash + 1)] if "." in function[slash + 1 :] else function
    return package != "main" and "." not in package.split("/", 1)[0]


class GoUnreadable(Exception):
    """The process's Go runtime cannot be read; the message is the one line to show."""


class Memory:
    """Reads of another process's memory through /proc/PID/mem, in chunks kept for one snapshot."""

    def __init__(self, pid: int):
        try:
            self.fd = identity.open_mem(pid)
        except OSError as e:
            raise GoUnreadable(f"cannot open /proc/{pid}/mem: {e.strerror}") from None
        self.chunks: dict[int, bytes] = {}
        self.bytes_read = 0
        self.reads = 0
        self.seconds = 0.0

    def close(self) -> None:
        os.close(self.fd)

    def forget(self) -> None:
        """Drop the kept chunks: the next snapshot reads the target afresh."""
        self.chunks.clear()

    def _chunk(self, base: int) -> bytes:
        got = self.chunks.get(base)
        if got is None:
            started = time.perf_counter()
            try:
                got = os.pread(self.fd, CHUNK, base)
            except OSError:
                got = b""  # unmapped at its start: reads fall back to exact ones
            self.seconds += time.perf_counter() - started
            self.reads += 1
            self.bytes_read += len(got)
            self.chunks[base] = got
        return got

    def read(self, addr: int, size: int) -> bytes | None:
        """size bytes at addr, or None where the target has no such memory."""
        out = bytearray()
        at = addr
        while len(out) < size:
            base = at - at % CHUNK
            chunk = self._chunk(base)
            piece = chunk[at - base : at - base + size - len(out)]
            if not piece:
                return self.exact(addr, size)
            out += piece
            at += len(piece)
        return bytes(out)

    def exact(self, addr: int, size: int) -> bytes | None:
        started = time.perf_counter()
        try:
            raw = os.pread(self.fd, size, addr)
        except OSError:
            raw = b""
        self.seconds += time.perf_counter() - started
        self.reads += 1
        self.bytes_read += len(raw)
        return raw if len(raw) == size else None

    def word(self, addr: int) -> int | None:
        raw = self.read(addr, 8)
        return struct.unpack("<Q", raw)[0] if raw else None


@dataclass(slots=True)
class Bucket:
    stack: tuple[int, ...]  # return PCs, leaf first (inlined calls already have their own, as callers() records)
    size: int  # the allocation size of this bucket
    allocs: int
    frees: int
    alloc_bytes: int
    free_bytes: int


@dataclass
class Goroutines:
    total: int  # not dead, system ones included (runtime.NumGoroutine's count)
    user: int
    # (startpc, gopc, wait reason, where it waits: the first frame of the program's own, a return PC) -> count
    groups: dict[tuple[int, int, int, int], int] = field(default_factory=dict)
    complete: bool = True  # False: more than MAX_GOROUTINES, the rest not read


@dataclass(frozen=True)
class PacerCounts:
    """The GC pacer's counts at one read (bytes; gc_percent as GOGC)."""

    gc_percent: int
    heap_goal: int
    heap_marked: int
    heap_in_use: int
    heap_free: int
    mapped_ready: int

    @property
    def retained(self) -> int:
        """What the heap holds from the OS: in-use spans and free ones not yet returned."""
        return self.heap_in_use + self.heap_free


@dataclass
class GoSnapshot:
    at: float  # clock.wall()
    rate: int  # MemProfileRate now
    cycle: int  # GC cycles the heap profile has seen (mProfCycle's count, from the process start)
    buckets: list[Bucket]
    goroutines: Goroutines | None
    complete: bool = True  # False: the bucket list was cut at MAX_BUCKETS or ran into unreadable memory
    pacer: PacerCounts | None = None  # None: runtime.gcController not located (a stripped binary) or unreadable
    rss_anon: int | None = None  # the process's anonymous resident bytes at the read (RssAnon)


def scaled(count: int, size: int, rate: int) -> tuple[float, float]:
    """pprof's scaleHeapSample: (objects, bytes) estimated from sampled counts."""
    if count <= 0 or size <= 0:
        return 0.0, 0.0
    if rate <= 1:
        return float(count), float(size)
    scale = 1 / (1 - math.exp(-(size / count) / rate))
    return count * scale, size * scale


class GoProcess:
    """One Go process's runtime, located once: its table, layout and variables."""

    def __init__(self, pid: int, proc_root: Path = Path("/proc")):
        self.pid = pid
        self.proc_root = proc_root
        exe = proc_root / str(pid) / "exe"
        build = read_go_build(exe)
        if build is None:
            raise GoUnreadable(f"PID {pid} is not a Go program memdiag can read (no Go build info in its executable)")
        self.version = build.version
        try:
            self.layout: Layout = layout_for(build.version)
            self.table: GoTable = go_table(str(exe))
        except (UnsupportedGo, PclntabError) as e:
            raise GoUnreadable(str(e)) from None
        try:  # the executable's own name (the target's path, inside its mount namespace)
            self.executable = os.readlink(exe).removesuffix(" (deleted)")
        except OSError:
            self.executable = str(exe)
        self.stripped = not self.table.symtab
        self.variables, self.found_by = find_variables(self.table, self.layout)
        missing = sorted(set(self.layout.recipes) - set(self.variables))
        if missing:
            raise GoUnreadable(f"the runtime's {', '.join(missing)} could not be located in this {self.version} binary")
        # the linker sets runtime.disableMemoryProfiling (and MemProfileRate's default to 0) when the
        # program never references runtime.MemProfile, and then drops the function itself
        self.profiling_linked = "runtime.MemProfile" in self.table.entries_of(["runtime.MemProfile"])
        self.pacer_at = self.table.symtab.get("runtime.gcController") if self.layout.pacer else None
        self.memory = Memory(pid)
        self.parked: dict[tuple[int, int, int], int] = {}  # (g, goid, waitsince) -> where it is parked
        self.stacks: dict[tuple[int, ...], tuple[int, ...]] = {}  # the buckets' stacks, each once

    def close(self) -> None:
        self.memory.close()

    def snapshot(self, goroutines: bool = True) -> GoSnapshot:
        m, v = self.memory, self.variables
        m.forget()
        rate = m.word(v["runtime.MemProfileRate"])
        cycle_raw = m.read(v["runtime.mProfCycle"], 4)
        if rate is None or cycle_raw is None:
            raise GoUnreadable(f"PID {self.pid}: the runtime's variables are not readable (the process exited?)")
        # mProfCycleHolder: the cycle shifted left by one, the low bit "flushed"
        cycle = struct.unpack("<I", cycle_raw)[0] >> 1
        buckets, complete = self._buckets()
        gs = self._goroutines() if goroutines else None
        return GoSnapshot(
            at=clock.wall(), rate=rate, cycle=cycle, buckets=buckets, goroutines=gs, complete=complete,
            pacer=self._pacer(), rss_anon=read_rss_anon(self.pid, self.proc_root),
        )  # fmt: skip

    def pacer(self) -> PacerCounts | None:
        """The GC pacer's counts now; None: not located (a stripped binary) or unreadable."""
        return self._pacer()

    def _pacer(self) -> PacerCounts | None:
        P = self.layout.pacer
        if P is None or self.pacer_at is None:
            return None
        raw = self.memory.read(self.pacer_at, P.read_size)
        if raw is None:
            return None

        def u64(off: int) -> int:
            return struct.unpack_from("<Q", raw, off)[0]

        return PacerCounts(
            gc_percent=struct.unpack_from("<i", raw, P.gc_percent)[0],
            heap_goal=u64(P.last_heap_goal),
            heap_marked=u64(P.heap_marked),
            heap_in_use=u64(P.heap_in_use),
            heap_free=u64(P.heap_free),
            mapped_ready=u64(P.mapped_ready),
        )

    def _buckets(self) -> tuple[list[Bucket], bool]:
        L, m = self.layout, self.memory
        out: list[Bucket] = []
        at = m.word(self.variables["runtime.mbuckets"]) or 0
        seen: set[int] = set()
        while at and len(out) < MAX_BUCKETS:
            if at in seen:
                return out, False
            seen.add(at)
            head = m.read(at, L.bucket_header)
            if head is None:
                return out, False
            _next, allnext, typ, _hash, size, nstk = struct.unpack("<6Q", head)
            if typ != L.mem_bucket or nstk > L.max_stack:
                return out, False  # not a memory bucket: the list is not what this layout says
            body = m.read(at + L.bucket_header, nstk * 8 + L.record_size)
            if body is None:
                return out, False
            stack = struct.unpack_from(f"<{nstk}Q", body)
            stack = self.stacks.setdefault(stack, stack)  # one tuple per stack over the run's reads
            allocs, frees, alloc_bytes, free_bytes = struct.unpack_from("<4Q", body, nstk * 8)
            out.append(Bucket(stack, size, allocs, frees, alloc_bytes, free_bytes))
            at = allnext
        return out, not at

    def _goroutines(self) -> Goroutines | None:
        L, m = self.layout, self.memory
        header = m.read(self.variables["runtime.allgs"], 24)
        if header is None:
            return None
        ptr, length, cap = struct.unpack("<3Q", header)
        if not ptr or length > cap:
            return None  # read mid-append: the next snapshot reads it again
        n = min(length, MAX_GOROUTINES)
        raw = m.read(ptr, 8 * n)
        if raw is None:
            return None
        total = user = 0
        groups: dict[tuple[int, int, int, int], int] = {}
        for gp in struct.unpack(f"<{n}Q", raw):
            g = m.read(gp, L.g_read) if gp else None
            if g is None:
                continue
            status = struct.unpack_from("<I", g, L.g_status)[0] & ~L.scan_bit
            if status in (0, L.dead):  # _Gidle, _Gdead: not a goroutine now
                continue
            total += 1
            start = struct.unpack_from("<Q", g, L.g_startpc)[0]
            if self.system_goroutine(start):
                continue
            user += 1
            where = self._parked(gp, g) if status == L.waiting else 0
            key = (start, struct.unpack_from("<Q", g, L.g_gopc)[0], g[L.g_waitreason], where)
            groups[key] = groups.get(key, 0) + 1
        return Goroutines(total=total, user=user, groups=groups, complete=n == length)

    def _parked(self, gp: int, g: bytes) -> int:
        """_parked_in, walked once per parked goroutine: one still parked since the same time (its
        g, id and waitsince unchanged) waits where it did (a leak's goroutines do not move)."""
        L = self.layout
        key = (gp, struct.unpack_from("<Q", g, L.g_goid)[0], struct.unpack_from("<q", g, L.g_waitsince)[0])
        where = self.parked.get(key)
        if where is None:
            if len(self.parked) > 4 * MAX_GOROUTINES:
                self.parked.clear()
            where = self.parked[key] = self._parked_in(g)
        return where

    def _parked_in(self, g: bytes, depth: int = 24) -> int:
        """Where a parked goroutine waits in the program's own code: the first return PC outside
        Go's standard library (else the first past the runtime), walking its frame pointers up
        from g.sched (gopark's frame, saved by mcall); 0 when neither is found within depth frames."""
        L = self.layout
        pc, bp = struct.unpack_from("<Q", g, L.g_sched_pc)[0], struct.unpack_from("<Q", g, L.g_sched_bp)[0]
        past_runtime = 0
        for _ in range(depth):
            frame = self.table.frame(pc - 1)
            if frame is None:
                break
            if not standard_library(frame.function):
                return pc
            if not past_runtime and not frame.function.startswith("runtime."):
                past_runtime = pc
            raw = self.memory.exact(bp, 16) if bp else None  # stacks lie apart: no chunk around them
            if raw is None:
                break
            bp, pc = struct.unpack("<QQ", raw)
        return past_runtime

    def system_goroutine(self, startpc: int) -> bool:
        """runtime.isSystemGoroutine: started in a runtime function other than runtime.main."""
        frame = self.table.frame(startpc)
        return frame is not None and frame.function.startswith("runtime.") and frame.function != "runtime.main"

    def wait_reason(self, code: int) -> str:
        reasons = self.layout.wait_reasons
        return (reasons[code] or "running or runnable") if code < len(reasons) else f"wait reason {code}"
