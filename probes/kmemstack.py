"""kmemstack: the kernel's slab allocations made in the target's context and still outstanding at
the end, by kernel stack (the allocation site: d_alloc for a dentry, sock_alloc_inode for a socket)
and by the user stack of the target's code whose system call made them. Kernel slab that grows
while no heap does (negative dentries left by lookups of names that do not exist, sockets or timers
a service keeps, a kernel-side leak) is named as memleak -K names it, with the code that asked.

kmem tracepoints (bpf/kmemstack.c): an allocation in the target's tgid records the object under
its stack key with bytes_alloc and the cache it came from; a free of a recorded object, by any task
(dentries are freed from RCU callbacks and by reclaim), forgets it. Allocations made by kernel
threads on the target's behalf (a kworker, the network softirq on another CPU) are not its.

Its price is the host's, not the target's: the programs run for every slab allocation and free on
the host, and its row reports their BPF run time (host_wide). Measured on 6.18 here (2 CPUs, ~170k
slab allocations and frees a second from the host's other work, kernel.bpf_stats_enabled): ~50 ns
per allocation of another process (the tgid filter), ~70 ns per kfree and ~210 ns per
kmem_cache_free (the outstanding table's lookup, most of them RCU batches), ~2.5 us per allocation
of the target (both stacks walked, the object recorded): ~5% of one CPU on that host. So a diagnosis
prices it before it attaches (PRICING, probes/hostwide.py): the kmem tracepoints counted for half a
second with no program attached, times this host's cost per event."""

from __future__ import annotations

from fnmatch import fnmatchcase

from memdiag.system._parse import Model
from memdiag.system.target import Target
from memdiag.system.units import fmt_bytes, fmt_number

from . import bpfstats, hostwide, kernel
from .base import Run, run_probe
from .face import Face, FactDef, ProbeResult, Stack, Stacks
from .growth import EventStacks, RawStack, StackGrowth
from .stacks import Frame, folded
from .text import stack_lines

METHOD = "tracepoints kmem:kmem_cache_alloc/kmalloc/kmem_cache_free/kfree, kernel stacks + .eh_frame unwinding"
MAX_OBJS = 262_144  # outstanding objects the program's table holds (its MAX_OBJS); more are counted, not kept
MAX_KEYS = 4_096  # stack keys (kernel stack x user stack) it keeps books for
TRACEPOINTS = ("kmem_cache_alloc", "kmalloc", "kmem_cache_free", "kfree")
KERNEL = "kernel"  # the module kernel frames are named with: "d_alloc+0x2a [kernel]"
KMALLOC_MAX_CACHE = 8192  # larger kmallocs come from the page allocator (KMALLOC_MAX_CACHE_SIZE, 4 KiB pages)
# The allocator's own frames, passed over when the kernel function that allocated is named: slab's
# entry points (6.10+ add _noprof), kmalloc's wrappers, the helpers that only copy into memory they
# allocate (kmemdup, kstrdup), and a new slab's own bookkeeping (alloc_slab_obj_exts: the cgroup
# vector of a slab page, allocated while a dentry's slab is refilled, is the dentry's caller's).
ALLOCATOR = (
    "kmem_cache_alloc*", "__kmem_cache_alloc*", "kmalloc*", "__kmalloc*", "kmalloc_trace*", "__do_kmalloc*",
    "slab_alloc*", "__slab_alloc*", "___slab_alloc*", "kvmalloc*", "__kvmalloc*", "kvzalloc*", "kzalloc*",
    "krealloc*", "kmemdup*", "kstrdup*", "kstrndup*", "alloc_pages*", "__alloc_pages*", "__alloc_frozen_pages*",
    "get_page_from_freelist", "allocate_slab", "new_slab", "alloc_slab_page", "alloc_slab_obj_exts",
    "bpf_trace_run*", "perf_trace_*", "trace_event_raw_event_*",
)  # fmt: skip


# Priced before it attaches (probes/hostwide.py): its programs run for every slab allocation and free
# of the host. Priors, where `memdiag prepare` did not measure this host: the figures above (~50 ns
# per allocation of another process, ~70 per kfree, ~210 per kmem_cache_free), and ~2.5 us more per
# allocation of the target (BENCHMARKS.md section 9: 1,285 ns per traced event, an allocation and
# its free about one each).
PRICING = hostwide.Pricing(
    probe="kmemstack",
    tracepoints=tuple(f"kmem:{tp}" for tp in TRACEPOINTS),
    programs={f"kmem:{tp}": (f"tracepoint__kmem__{tp}",) for tp in TRACEPOINTS},
    priors_ns={
        "tracepoint__kmem__kmem_cache_alloc": 50.0,
        "tracepoint__kmem__kmalloc": 50.0,
        "tracepoint__kmem__kmem_cache_free": 210.0,
        "tracepoint__kmem__kfree": 70.0,
    },
    recorded=("kmem:kmem_cache_alloc", "kmem:kmalloc"),
    recorded_ns=2500.0,
    recorded_what="slab allocations",
    event_what="slab allocations and frees",
)


class KmemStack(StackGrowth):
    """One kernel allocation site reached from one user stack (count, bytes: its objects still
    outstanding at the end). frames/functions are the user stack's, leaf first."""

    kernel_frames: list[str]  # leaf first: "kmem_cache_alloc_lru_noprof+0x1f0 [kernel]", "__d_alloc+0x2a [kernel]"
    kernel_functions: list[str | None]
    cache: str  # "dentry", "kmalloc-64", "kmalloc-cg-192" (the size class of its first kmalloc)
    allocs: int
    frees: int  # of its objects, by any task
    alloc_bytes: int
    accounted: int = 0  # allocations charged to a memory cgroup (SLAB_ACCOUNT caches, __GFP_ACCOUNT)
    untracked: int = 0  # allocations the table of outstanding objects had no room for


class CacheTotal(Model):
    """The objects of one cache over every stack."""

    cache: str
    allocs: int
    frees: int
    outstanding: int
    outstanding_bytes: int


class KmemResult(ProbeResult):
    stacks: list[KmemStack] = []
    folded: list[str] = []
    by_cache: list[CacheTotal] = []
    allocs: int = 0  # slab allocations the target made during the run
    frees: int = 0  # of those, freed during the run
    outstanding: int = 0
    outstanding_bytes: int = 0
    objs_dropped: int = 0  # allocated when the table of outstanding objects was full: never counted outstanding
    table_room: int = MAX_OBJS


def cache_names() -> kernel.Availability:
    """kmem_cache_alloc names its cache (`name`, Linux 6.2) and kmalloc says `bytes_alloc`."""
    root = kernel.tracefs_root()
    try:
        fmt = (root / "events" / "kmem" / "kmem_cache_alloc" / "format").read_text() if root else ""
    except OSError:
        fmt = ""
    if "__data_loc char[] name" in fmt:
        return kernel.Availability(available=True, reason="kmem_cache_alloc names its cache")
    return kernel.Availability(
        available=False, reason="kmem:kmem_cache_alloc does not name its cache on this kernel (Linux 6.2 or later)"
    )


def requirements() -> list[kernel.Availability]:
    return [*(kernel.tracepoint("kmem", tp) for tp in TRACEPOINTS), cache_names()]


def build_options() -> dict[str, int | str]:
    """The room of the program's tables; whether this kernel's tracepoint names the cache (the program
    reads the field only where it exists: before 6.2 it must still compile, for `memdiag prepare`)."""
    return {"MAX_OBJS": MAX_OBJS, "MAX_KEYS": MAX_KEYS, "CACHE_NAMES": int(cache_names().available)}


def _key(k) -> tuple:
    """A counts key as a hashable tuple."""
    return (k.tgid, k.stack_id, k.ip, k.at_sp, k.kstack_id)


def cache_of(name: str, size: int, accounted: bool) -> str:
    """The cache a key's objects come from: the one kmem_cache_alloc named, else the kmalloc size
    class of its first allocation (kmalloc-cg-N when charged to a cgroup)."""
    if name:
        return name
    if size > KMALLOC_MAX_CACHE:
        return "kmalloc-large (pages)"
    return f"kmalloc-{'cg-' if accounted else ''}{size}"


def is_allocator(function: str | None) -> bool:
    return function is None or any(fnmatchcase(function, p) for p in ALLOCATOR)


def allocating_function(functions: list[str | None]) -> str | None:
    """The first kernel function from the leaf that is not the allocator itself: the allocation site."""
    return next((f for f in functions if not is_allocator(f)), None)


def kernel_frames(bpf, kstack_id: int) -> list[str]:
    """A kernel stack's frames named by kallsyms, leaf first: "fn+0x1a [kernel]"."""
    if kstack_id < 0:
        return []
    named = (bpf.ksym(a, show_offset=True).decode(errors="replace") for a in bpf["stacks"].walk(kstack_id))
    return [f"{n} [{KERNEL}]" for n in named]


def _function(frame: str) -> str | None:
    fn = frame.rsplit(" [", 1)[0].split("+", 1)[0]
    return None if fn == "[unknown]" else fn


def stacks_of(run: EventStacks, bpf) -> tuple[list[KmemStack], int]:
    """Every stack key's books, merged by user stack within each kernel stack, most outstanding bytes
    first; and the symbol look-ups that failed."""
    books = {_key(k): v for k, v in bpf["counts"].items()}
    by_kstack: dict[int, list[RawStack]] = {}
    for key, raw in run.raw(bpf, lambda v: v.outstanding_count, lambda v: v.outstanding_bytes):
        by_kstack.setdefault(key.kstack_id, []).append(raw.model_copy(update={"key": _key(key)}))
    stacks: list[KmemStack] = []
    failed = 0
    for kstack_id, raw in by_kstack.items():  # one user stack reaching two allocation sites: two stacks
        merged, f = run.merge(raw)
        failed += f
        kframes = kernel_frames(bpf, kstack_id)
        stacks += [kmem_stack(s, kframes, [books[k] for k in s.keys if k in books]) for s in merged]
    stacks.sort(key=lambda s: (s.bytes, s.count), reverse=True)
    return stacks, failed


def kmem_stack(s: StackGrowth, kframes: list[str], books: list) -> KmemStack:
    """One merged stack with its keys' books summed (books: the program's struct kmem_books of each key)."""
    allocs = sum(b.allocs for b in books)
    accounted = sum(b.accounted for b in books)
    first = next((b for b in books if b.allocs), books[0]) if books else None
    name = bytes(first.cache).split(b"\0", 1)[0].decode(errors="replace") if first is not None else ""
    fields = s.model_dump() | {
        "count": sum(b.outstanding_count for b in books),
        "bytes": sum(b.outstanding_bytes for b in books),
        "keys": s.keys,
    }
    return KmemStack(
        **fields,
        kernel_frames=kframes,
        kernel_functions=[_function(f) for f in kframes],
        cache=cache_of(name, first.size if first is not None else 0, accounted > 0 and accounted == allocs),
        allocs=allocs,
        frees=sum(b.frees for b in books),
        alloc_bytes=sum(b.alloc_bytes for b in books),
        accounted=accounted,
        untracked=sum(b.untracked for b in books),
    )


def totals(stacks: list[KmemStack]) -> list[CacheTotal]:
    """The objects of each cache over every stack, most outstanding bytes first."""
    out: dict[str, CacheTotal] = {}
    for s in stacks:
        t = out.get(s.cache) or CacheTotal(cache=s.cache, allocs=0, frees=0, outstanding=0, outstanding_bytes=0)
        out[s.cache] = t.model_copy(
            update={"allocs": t.allocs + s.allocs, "frees": t.frees + s.frees, "outstanding": t.outstanding + s.count,
                    "outstanding_bytes": t.outstanding_bytes + s.bytes}
        )  # fmt: skip
    return sorted(out.values(), key=lambda t: (t.outstanding_bytes, t.allocs), reverse=True)


def folded_lines(stacks: list[KmemStack]) -> list[str]:
    """The flame graph's lines: the user stack's functions, then the kernel's, by bytes outstanding."""
    frames = lambda s: [Frame(address=0, function=f, module=None) for f in s.kernel_functions + s.functions]  # noqa: E731
    return folded((frames(s), s.bytes) for s in stacks if s.bytes)


def run(target: Target, duration: float, top: int = 50) -> KmemResult:
    run = EventStacks()

    def collect(bpf, _elapsed: float) -> dict:
        stats = bpfstats.read(bpf, bpfstats.KMEM)
        stacks, failed = stacks_of(run, bpf)
        fields = run.fields(stats, stacks, failed, top, weight="bytes")
        fields["folded"] = folded_lines(stacks)
        fields["lost"] = {**fields["lost"], "kernel_stack_errors": stats["kstack_errors"],
                          "objs_dropped": stats["objs_dropped"]}  # fmt: skip
        return {
            "events": stats["allocs"] + stats["frees"],
            "by_cache": totals(stacks),
            "allocs": stats["allocs"],
            "frees": stats["frees"],
            "outstanding": sum(s.count for s in stacks),
            "outstanding_bytes": sum(s.bytes for s in stacks),
            "objs_dropped": stats["objs_dropped"],
            **fields,
        }

    spec = Run("kmemstack", KmemResult, requirements(), build_options(), collect, METHOD, spaces=run.spaces)
    return run_probe(spec, target, duration)  # type: ignore[return-value]


def describe(r: KmemResult, top: int) -> list[str]:
    """The result's lines under its header in `memdiag probe kmemstack`."""
    lines = [
        f"  slab allocations: {r.allocs:,} made, {r.frees:,} freed, {r.outstanding:,} outstanding at the end "
        f"({fmt_bytes(r.outstanding_bytes)})"
    ]
    lines += [
        f"    {t.cache:<20} {t.allocs:>9,} allocated {t.frees:>9,} freed {t.outstanding:>9,} outstanding "
        f"{fmt_bytes(t.outstanding_bytes):>10}"
        for t in r.by_cache[:top]
    ]
    for s in r.stacks[:top]:
        lines.append(
            f"  {fmt_bytes(s.bytes)} in {s.count:,} {s.cache} objects outstanding ({s.allocs:,} allocated, "
            f"{s.frees:,} freed{', charged to its cgroup' if s.accounted else ''}) PID {s.pid}:"
        )
        lines += stack_lines(s.kernel_frames, depth=6)
        lines.append(f"      -- user stack, via {s.method}:")
        lines += stack_lines(s.frames)
    return lines


def caveats(r: KmemResult) -> list[str]:
    out = [
        "kmemstack counts the slab allocations made in the target's own context (its system calls, its page "
        "faults, and interrupts that happened to arrive while it ran); allocations that kernel threads make on "
        "its behalf (writeback, a kworker, network receive on another CPU) are not counted, nor objects "
        "allocated before it started."
    ]
    if r.objs_dropped:
        out.append(
            f"{fmt_number(r.objs_dropped)} allocations were made once its table of outstanding objects was full "
            f"({r.table_room:,}): counted as allocated, never as outstanding."
        )
    return out


def top_stack(r: KmemResult) -> KmemStack | None:
    """The stack with the most bytes outstanding (None: everything was freed)."""
    return next((s for s in r.stacks if s.count > 0), None)


def facts_of(r: KmemResult | None, plan, name) -> dict:
    priced = dict(plan.facts) if isinstance(plan, hostwide.HostWidePlan) else {}
    if r is None or r.status not in ("ok", "partial"):
        return priced
    top = top_stack(r)
    return priced | {
        "kmemstack.outstanding_bytes": r.outstanding_bytes,
        "kmemstack.outstanding_count": r.outstanding,
        "kmemstack.outstanding_rate": r.outstanding_bytes / r.duration_s if r.duration_s > 0 else None,
        "kmemstack.top_cache": top.cache if top is not None else None,
        "kmemstack.top_kernel_function": allocating_function(top.kernel_functions) if top is not None else None,
        "kmemstack.top_function": name(top.frames, []) if top is not None else None,
        "kmemstack.top_bytes": top.bytes if top is not None else 0,
        "kmemstack.top_count": top.count if top is not None else 0,
        "kmemstack.top_accounted": top.accounted > 0 if top is not None else None,
    }


def _stack(s: KmemStack, with_kernel: bool) -> Stack:
    site = allocating_function(s.kernel_functions) or "the kernel"
    return Stack(
        frames=s.kernel_frames + s.frames if with_kernel else s.frames,
        functions=s.kernel_functions + s.functions if with_kernel else s.functions,
        bytes=s.bytes,
        count=s.count,
        pid=s.pid,
        detail=f"{fmt_number(s.count)} {s.cache} objects outstanding ({fmt_bytes(s.bytes)}) allocated by "
        f"{site}, {fmt_number(s.allocs)} allocated, {fmt_number(s.frees)} freed",
    )


def stacks(r: KmemResult) -> list[Stack]:
    """The face's stacks: those with objects outstanding, kernel frames then the user stack's."""
    return [_stack(s, with_kernel=True) for s in r.stacks if s.count > 0]


def culprit(r: KmemResult, _verdict_kind: str) -> Stack | None:
    """The stack a verdict rests on: the top one's user stack (the code to read is the target's; the
    kernel's allocation site is in its detail)."""
    top = top_stack(r)
    return _stack(top, with_kernel=False) if top is not None else None


FACE = Face(
    name="kmemstack",
    summary="kernel slab allocations the target left outstanding, by kernel and user stack",
    run=lambda target, ctx: run(target, hostwide.run_seconds(ctx)),
    result=KmemResult,
    describe=describe,
    caveats=caveats,
    facts=(
        FactDef(
            "kmemstack.outstanding_bytes",
            "bytes",
            "slab memory the target's calls allocated during the probe and the kernel still held at its end",
        ),
        FactDef(
            "kmemstack.outstanding_count",
            "number",
            "slab objects the target's calls allocated during the probe and still held at its end",
        ),
        FactDef("kmemstack.outstanding_rate", "bytes_per_s", "slab memory left outstanding per second of the probe"),
        FactDef(
            "kmemstack.top_cache",
            "string",
            "the slab cache of the stack with the most bytes outstanding (dentry, kmalloc-64 ...)",
        ),
        FactDef(
            "kmemstack.top_kernel_function",
            "string",
            "the kernel function that allocated them (the first "
            "frame past the slab allocator: __d_alloc, sock_alloc_inode ...)",
        ),
        FactDef("kmemstack.top_function", "string", "the target's function whose system call allocated them"),
        FactDef("kmemstack.top_bytes", "bytes", "bytes that stack left outstanding"),
        FactDef("kmemstack.top_count", "number", "objects that stack left outstanding"),
        FactDef(
            "kmemstack.top_accounted",
            "bool",
            "whether that stack's objects are charged to the target's memory cgroup",
            figure=False,
        ),
        *PRICING.facts(),
    ),  # fmt: skip
    facts_of=facts_of,
    plan=lambda target, ctx: hostwide.plan(PRICING, target, ctx),
    planning=f"counting the host's slab allocations and frees on every CPU for {hostwide.COUNT_S:g} s",
    stacks=Stacks(
        kind="allocations",
        shown=3,
        of=stacks,
        folded=lambda r: r.folded,
        culprit=culprit,
        space="inuse_space",
        counted="inuse_objects",
    ),
)
