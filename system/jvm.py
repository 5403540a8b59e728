"""What a HotSpot JVM's own counters say about its memory (system/hsperfdata.py reads them), and
where its resident memory lies: the Java heap, or outside it (metaspace, JIT code, thread stacks,
native allocations by libjvm or JNI code), from the counters and /proc/PID/smaps.

The heap in /proc/PID/smaps: HotSpot reserves the whole heap (-Xmx) as one address range and
commits parts of it; what maps shows is a run of anonymous mappings (committed rw-p and reserved
---p, and the CDS archive's object regions mapped from classes.jsa at its top) whose span is the
heap's maximum size, which the counters give. ZGC maps it from a memfd named java_heap instead.
Where no such run is found, the heap's resident size is unknown (None), never guessed. Metaspace
is taken from the counters (its committed bytes); JIT code is the anonymous executable mappings
(HotSpot's code cache is rwx on x86-64); a thread's stack is the mapping its stack pointer is in
(/proc/PID/task/TID/syscall gives it for a thread blocked in a system call, as every idle JVM
thread is); mapped files (libjvm's code, the modules image) are counted apart."""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Iterable
from pathlib import Path

from ._parse import Fact, kib_to_bytes, lines_of, parse_file, read_text
from .hsperfdata import PerfData, perfdata_absence, read_perfdata

_HOTSPOT_LIB = "libjvm.so"
_OPENJ9_LIB = "libj9vm"  # OpenJ9 ships a libjvm.so too; its VM is libj9vm29.so
HEAP_GAP = 2 << 20  # gaps inside the heap's range, where the JVM unmapped what it did not need
# The class-data-sharing archive maps its archived Java objects into the top of the heap's range
# (classes.jsa, rw-p): part of the heap
_CDS_ARCHIVE = ".jsa"


MAX_MAPS_LINES = 1 << 17  # a process maps at most vm.max_map_count (65,530 by default) regions


def jvm_library(maps: str | Iterable[str]) -> str | None:
    """The HotSpot library a process maps executable (libjvm.so), or None: not HotSpot (native,
    another runtime, or OpenJ9, which maps a libjvm.so beside its own libj9vm). Read line by line,
    at most MAX_MAPS_LINES: a file path in a mapping may be 4 KiB long, the file hundreds of MiB."""
    found = None
    for line in itertools.islice(lines_of(maps), MAX_MAPS_LINES):
        fields = line.split(None, 5)
        if len(fields) < 6 or "x" not in fields[1]:
            continue
        name = fields[5].strip().rsplit("/", 1)[-1]
        if name.startswith(_OPENJ9_LIB):
            return None
        if name == _HOTSPOT_LIB:
            found = fields[5].strip()
    return found


def read_jvm_library(pid: int, proc_root: Path = Path("/proc")) -> str | None:
    return parse_file(proc_root / str(pid) / "maps", jvm_library)


class Space(Fact):
    generation: str  # young, old (G1), new (Serial, Parallel), Heap (Shenandoah)
    name: str  # eden, s0, s1, old, space, Heap
    used: int
    committed: int
    max: int


class Collector(Fact):
    name: str  # "G1 young collection pauses", "Serial full collection pauses", ...
    invocations: int
    time_s: float  # accumulated pause time
    full: bool  # a full collection (the whole heap, every application thread stopped)
    # the pauses of a concurrent cycle (G1's remark and cleanup: "G1 concurrent cycle pauses"), which
    # move no object: what the heap holds after one is what the collection before it left
    concurrent: bool = False


class JvmCounters(Fact):
    """One reading of a JVM's counters (hsperfdata), in bytes and seconds."""

    clock_s: float | None  # the JVM's own clock at its last counter update (sun.os.hrt.ticks)
    vm: str | None = None  # java.vm.name: OpenJDK 64-Bit Server VM
    version: str | None = None  # java.vm.version
    java_home: str | None = None  # java.home, as the JVM sees its file system
    spec_version: str | None = None  # java.vm.specification.version: the feature version ("17")
    vm_args: str | None = None  # the options it started with (java.rt.vmArgs)
    command: str | None = None  # main class or jar and its arguments (sun.rt.javaCommand)
    attach_supported: bool | None = None  # sun.rt.jvmCapabilities' first flag (off: -XX:+DisableAttachMechanism)
    policy: str | None = None  # the collector: GarbageFirst, Copy:MSC, ParScav:MSC, ...
    spaces: list[Space] = []
    collectors: list[Collector] = []
    heap_used: int | None = None
    heap_committed: int | None = None
    heap_max: int | None = None
    # What survives collections: every space but eden (old and survivors), which only a collection
    # fills (and G1's humongous objects, allocated in old directly). None: the heap has no eden
    # (ZGC, Shenandoah: one space; read it just after a collection instead).
    after_gc_used: int | None = None
    metaspace_used: int | None = None
    metaspace_committed: int | None = None
    metaspace_max: int | None = None
    class_space_used: int | None = None
    gc_count: int = 0
    full_gc_count: int = 0
    evacuations: int = 0  # collections that moved objects: every collector's but a concurrent cycle's pauses
    gc_time_s: float = 0.0
    last_cause: str | None = None  # why the last collection ran: G1 Evacuation Pause, Allocation Failure ...
    safepoints: int | None = None
    safepoint_time_s: float | None = None  # time the application threads were stopped, GC pauses included
    threads: int | None = None


# Collectors whose generations each span the whole heap (their maxCapacity is the heap's maximum):
# the heap's maximum is their largest, not their sum.
_OVERLAPPING = ("GarbageFirst",)
# The counters' own numbers of generations and of spaces in one, clamped: HotSpot's collectors have
# at most 3 generations (Serial, Parallel: young, old, and the old permanent one) and 3 spaces in
# one (eden, two survivors); a file claiming 2^63-1 would spin the loops for ever.
MAX_GENERATIONS = 8
MAX_SPACES = 8


def jvm_counters(perf: PerfData) -> JvmCounters:
    """What the counters say, in bytes and seconds."""
    n, t = perf.number, perf.text
    freq = n("sun.os.hrt.frequency") or 0
    ticks = n("sun.os.hrt.ticks")

    def secs(v: int | None) -> float | None:
        return v / freq if v is not None and freq > 0 else None

    spaces = _spaces(perf)
    collectors = _collectors(perf, freq)
    caps = t("sun.rt.jvmCapabilities")
    policy = t("sun.gc.policy.name")
    gens = _generations(perf)
    heap_max = None
    if gens:
        maxes = [g[1] for g in gens]
        heap_max = max(maxes) if policy in _OVERLAPPING else sum(maxes)
    eden = any(s.name == "eden" for s in spaces)
    return JvmCounters(
        clock_s=secs(ticks),
        vm=t("java.property.java.vm.name"),
        version=t("java.property.java.vm.version"),
        java_home=t("java.property.java.home"),
        spec_version=t("java.property.java.vm.specification.version"),
        vm_args=t("java.rt.vmArgs"),
        command=t("sun.rt.javaCommand"),
        attach_supported=(caps[0] == "1") if caps else None,
        policy=policy,
        spaces=spaces,
        collectors=collectors,
        heap_used=sum(s.used for s in spaces) if spaces else None,
        heap_committed=sum(g[0] for g in gens) if gens else None,
        heap_max=heap_max,
        after_gc_used=sum(s.used for s in spaces if s.name != "eden") if eden else None,
        metaspace_used=n("sun.gc.metaspace.used"),
        metaspace_committed=n("sun.gc.metaspace.capacity"),
        metaspace_max=n("sun.gc.metaspace.maxCapacity"),
        class_space_used=n("sun.gc.compressedclassspace.used"),
        gc_count=sum(c.invocations for c in collectors),
        full_gc_count=sum(c.invocations for c in collectors if c.full),
        evacuations=sum(c.invocations for c in collectors if not c.concurrent),
        gc_time_s=sum(c.time_s for c in collectors),
        last_cause=t("sun.gc.lastCause"),
        safepoints=n("sun.rt.safepoints"),
        safepoint_time_s=secs(n("sun.rt.safepointTime")),
        threads=n("java.threads.live"),
    )


def _generations(perf: PerfData) -> list[tuple[int, int]]:
    """(committed, max) of each generation."""
    out = []
    for g in range(min(MAX_GENERATIONS, max(0, perf.number("sun.gc.policy.generations") or 4))):
        cap, mx = perf.number(f"sun.gc.generation.{g}.capacity"), perf.number(f"sun.gc.generation.{g}.maxCapacity")
        if cap is not None and mx is not None:
            out.append((cap, mx))
    return out


def _spaces(perf: PerfData) -> list[Space]:
    out = []
    for g in range(MAX_GENERATIONS):
        gen = perf.text(f"sun.gc.generation.{g}.name")
        if gen is None:
            break
        for s in range(min(MAX_SPACES, max(0, perf.number(f"sun.gc.generation.{g}.spaces") or 0))):
            base = f"sun.gc.generation.{g}.space.{s}."
            used = perf.number(base + "used")
            if used is None:
                continue
            out.append(
                Space(
                    generation=gen,
                    name=perf.text(base + "name") or f"space {s}",
                    used=used,
                    committed=perf.number(base + "capacity") or 0,
                    max=perf.number(base + "maxCapacity") or 0,
                )
            )
    return out


def _collectors(perf: PerfData, freq: int) -> list[Collector]:
    out = []
    for c in range(8):
        name = perf.text(f"sun.gc.collector.{c}.name")
        if name is None:
            continue
        ticks = perf.number(f"sun.gc.collector.{c}.time") or 0
        out.append(
            Collector(
                name=name,
                invocations=perf.number(f"sun.gc.collector.{c}.invocations") or 0,
                time_s=ticks / freq if freq > 0 else 0.0,
                full=" full " in f" {name.lower()} ",
                concurrent=" concurrent " in f" {name.lower()} ",
            )
        )
    return out


# --- where the resident memory is -------------------------------------------------------------


class Region(Fact):
    start: int
    end: int
    perms: str
    path: str  # "" anonymous
    rss: int
    swap: int = 0


class JvmMemory(Fact):
    """A JVM's resident memory split by what holds it (bytes). `heap` None: the heap's range was
    not found in smaps; `other` is then None too."""

    rss: int  # the sum of the mappings' resident sizes (smaps)
    heap: int | None  # resident pages of the Java heap's range
    heap_range: tuple[int, int] | None = None
    code: int  # anonymous executable mappings: JIT-compiled code (the code cache)
    stacks: int  # the mappings holding a thread's stack
    stack_count: int = 0  # the threads whose stack was found
    metaspace: int | None  # committed metaspace (from the counters)
    files: int = 0  # mapped files: libjvm's and the libraries' code, the modules image, the CDS archive
    other: int | None  # the rest: native allocations (malloc: libjvm, JNI code), GC data, direct buffers

    @property
    def outside(self) -> int | None:
        """Resident memory outside the Java heap."""
        return self.rss - self.heap if self.heap is not None else None


def parse_smaps(text: str | Iterable[str]) -> list[Region]:
    """The mappings of /proc/PID/smaps with their Rss and Swap."""
    out: list[Region] = []
    head: list[str] | None = None
    rss = swap = 0

    def flush() -> None:
        if head is not None and len(head) > 1:
            lo, _, hi = head[0].partition("-")
            path = head[5].strip() if len(head) > 5 else ""
            with contextlib.suppress(ValueError):  # a line not in the kernel's form is no mapping
                out.append(Region(start=int(lo, 16), end=int(hi, 16), perms=head[1], path=path, rss=rss, swap=swap))

    for line in lines_of(text):
        first = line.split(None, 1)[0] if line.strip() else ""
        if "-" in first and not first.endswith(":"):
            flush()
            head, rss, swap = line.split(None, 5), 0, 0
        elif first == "Rss:":
            rss = kib_to_bytes(line[len(first) :]) or 0
        elif first == "Swap:":
            swap = kib_to_bytes(line[len(first) :]) or 0
    flush()
    return out


def heap_range(regions: list[Region], heap_max: int | None) -> tuple[int, int] | None:
    """The Java heap's address range: a run of anonymous mappings (small gaps allowed) whose span
    is the heap's maximum size; or ZGC's java_heap memfd mappings. None: not found."""
    memfd = [r for r in regions if "java_heap" in r.path]
    if memfd:
        return min(r.start for r in memfd), max(r.end for r in memfd)
    if not heap_max:
        return None
    tolerance = max(HEAP_GAP, heap_max // 100)
    best = None
    for lo, hi in _anonymous_runs(regions):
        miss = abs((hi - lo) - heap_max)
        if miss <= tolerance and (best is None or miss < best[0]):
            best = (miss, lo, hi)
    return (best[1], best[2]) if best else None


def _anonymous_runs(regions: list[Region]) -> list[tuple[int, int]]:
    runs: list[list[int]] = []
    for r in sorted(regions, key=lambda r: r.start):
        if r.path and not r.path.endswith(_CDS_ARCHIVE):
            runs.append([-1, -1])  # a named mapping ends a run
            continue
        if runs and runs[-1][1] >= 0 and r.start - runs[-1][1] <= HEAP_GAP:
            runs[-1][1] = r.end
        else:
            runs.append([r.start, r.end])
    return [(lo, hi) for lo, hi in runs if lo >= 0]


def split_memory(
    regions: list[Region], counters: JvmCounters | None, stack_pointers: list[int], main_stack: bool = True
) -> JvmMemory:
    """The resident memory of a JVM split into heap, JIT code, thread stacks, metaspace and the rest."""
    rss = sum(r.rss for r in regions)
    rng = heap_range(regions, counters.heap_max if counters else None)
    heap = sum(r.rss for r in regions if rng and rng[0] <= r.start < rng[1]) if rng else None
    code = sum(r.rss for r in regions if not r.path and "x" in r.perms and not _inside(r, rng))
    holding = [r for r in regions if any(r.start <= sp < r.end for sp in stack_pointers) and not _inside(r, rng)]
    if main_stack:
        holding += [r for r in regions if r.path == "[stack]" and r not in holding]
    stacks = sum(r.rss for r in holding)
    files = sum(r.rss for r in regions if r.path.startswith("/") and not _inside(r, rng) and r not in holding)
    meta = counters.metaspace_committed if counters else None
    other = rss - heap - code - stacks - files - (meta or 0) if heap is not None else None
    return JvmMemory(
        rss=rss,
        heap=heap,
        heap_range=rng,
        code=code,
        stacks=stacks,
        stack_count=len(holding),
        metaspace=meta,
        files=files,
        other=max(0, other) if other is not None else None,
    )


def _inside(r: Region, rng: tuple[int, int] | None) -> bool:
    return rng is not None and rng[0] <= r.start < rng[1]


def thread_stack_pointers(pid: int, proc_root: Path = Path("/proc")) -> list[int]:
    """The stack pointer of each thread blocked in a system call (/proc/PID/task/TID/syscall:
    `nr args... sp pc`; "running" for one on a CPU)."""
    out = []
    try:
        tids = os.listdir(proc_root / str(pid) / "task")
    except OSError:
        return out
    for tid in tids:
        fields = (read_text(proc_root / str(pid) / "task" / tid / "syscall") or "").split()
        if len(fields) >= 3 and fields[0].lstrip("-").isdigit():
            try:
                out.append(int(fields[-2], 16))
            except ValueError:
                continue
    return out


def read_jvm_memory(pid: int, counters: JvmCounters | None, proc_root: Path = Path("/proc")) -> JvmMemory | None:
    """The JVM's resident memory split now; None: its smaps cannot be read (gone, no permission)."""
    regions = parse_file(proc_root / str(pid) / "smaps", parse_smaps)  # line by line: ~1 KiB a mapping
    if regions is None:
        return None
    return split_memory(regions, counters, thread_stack_pointers(pid, proc_root))


class JvmSample(Fact):
    """One reading of a JVM: its counters and where its resident memory is. counters None: it keeps
    none memdiag can read (`missing` says why)."""

    counters: JvmCounters | None = None
    memory: JvmMemory | None = None
    missing: str | None = None


def read_jvm_sample(pid: int, proc_root: Path = Path("/proc")) -> JvmSample:
    """The JVM's counters and its RSS split, now."""
    perf = read_perfdata(pid, proc_root)
    if perf is None:
        return JvmSample(missing=perfdata_absence(pid, proc_root))
    counters = jvm_counters(perf)
    return JvmSample(counters=counters, memory=read_jvm_memory(pid, counters, proc_root))
