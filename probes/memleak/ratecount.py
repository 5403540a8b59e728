"""A short, bounded count of allocator calls per entry point: one uprobe on each of the target's
busiest entry points (malloc, free, calloc, realloc), placed where memleak would place it, counted
for at most a quarter of a second and stopped at once when a count passes its bound (a hot
allocator then pays for about a thousand traps only). Returns calls per second per entry point.

Each probe's close waits for an RCU grace period (~100 ms here) after removing its breakpoint,
and the probes still in place keep trapping meanwhile: measured on a target calling malloc and
free flat out, free took 105,791 hits while malloc's probe was being closed. So the engine counts
malloc alone first and counts the others only when malloc has not already priced tracing out."""

from __future__ import annotations

import time

from memdiag.system._parse import Model

from ..allocator import ALLOCATING, Allocator, find_allocator
from ..base import ProbeUnavailable, load
from ..compiler import CompileError
from ..procmaps import AddressSpace

# The entry points a program calls often enough to matter for the price (C++'s new and delete
# where an allocator library defines them); the rest (memalign, valloc, mmap, ...) are rare in
# practice, and memleak measures every site once attached.
COUNTED = (
    *ALLOCATING,
    "free",
    "calloc",
    "realloc",
    "_ZdlPv",
    "_ZdlPvm",
    "_ZdaPv",
    "_ZdaPvm",
    "sdallocx",
    "mmap",
    "munmap",
    "mremap",
)


class RateEstimate(Model):
    function: str
    module: str
    calls: int
    seconds: float
    observed_per_s: float  # while the counting probes slowed every call
    per_s: float  # corrected for that slowdown: the rate without any probe
    stopped_early: bool


class Rates(Model):
    """The count of every counted entry point, over one shared stretch of time."""

    allocator: str
    counts: list[RateEstimate]
    cost_ns: float = 0.0  # what the count cost the target: every hit, attach to detach, x its trap
    hits: int = 0  # every hit, attach to detach
    probes_s: float = 0.0  # how long the counting probes were in place

    def per_s(self) -> dict[str, float]:
        return {r.function: r.per_s for r in self.counts}

    def of(self, function: str) -> RateEstimate | None:
        return next((r for r in self.counts if r.function == function), None)

    def plus(self, other: Rates | None) -> Rates:
        if other is None:
            return self
        return Rates(
            allocator=self.allocator,
            counts=self.counts + other.counts,
            cost_ns=self.cost_ns + other.cost_ns,
            hits=self.hits + other.hits,
            probes_s=self.probes_s + other.probes_s,
        )


MIN_COUNT_S = 0.05  # five periods of a 100 Hz loop: what the count spans at least
MAX_CALLS_FACTOR = 10  # unless this many times max_calls came first (a hot allocator pays ~14 ms here)


def estimate_call_rates(
    pid: int,
    trap_ns: dict[str, float] | None = None,
    max_seconds: float = 0.25,
    max_calls: int = 1000,
    alloc: Allocator | None = None,
    functions: tuple[str, ...] = COUNTED,
) -> Rates | None:
    """trap_ns: what a hit costs the target at each entry point's counting probe; the count
    itself slows the target by that much per call, so the untraced rate of the whole is
    observed / (1 - busy), busy being the share of its time the counting probes took.

    max_calls: a thousand calls put the rate within a few percent, enough to compare it with a
    budget. The count costs the target a burst of a few milliseconds whatever the bound: measured
    on bench_alloc at 10 thousand allocations/s, 2-8 ms with bounds of 300, 1,000 or 3,000 calls
    (the first hits and the breakpoint's installation, not the count, dominate). The count spans
    MIN_COUNT_S at least, unless MAX_CALLS_FACTOR times max_calls come first: a program allocating
    in batches (bench_alloc at 100k/s: a thousand calls every 10 ms) was priced at 243k/s from the
    one batch the count caught, against 107k/s in another run."""
    space = AddressSpace.of(pid)
    alloc = alloc or find_allocator(pid, space)
    if alloc is None or space is None:
        return None
    sites = [p for f in functions for p in alloc.placements if p.function == f]
    if not sites:
        return None
    try:
        return _count(pid, space, alloc, sites, trap_ns or {}, max_seconds, max_calls)
    except (ProbeUnavailable, CompileError, OSError):  # the target exited, a file is gone: no price
        return None


def _attach(bpf, pid: int, space: AddressSpace, sites: list) -> None:
    """One counting probe per site, on the very file this process maps (AddressSpace.inode_path),
    as memleak places them: one link per site's program, attached together."""
    with bpf.uprobe_batch() as refused:
        for slot, p in enumerate(sites):
            path = space.inode_path(space.first_mapping_of(p.module))
            if path is None:
                raise OSError(f"{p.module} is not the file PID {pid} maps")
            bpf.attach_uprobe(
                name=path.encode(),
                sym=p.function.encode(),
                sym_off=p.offset,
                fn_name=f"count_site_{slot}".encode(),
                pid=pid,
            )
    if refused:
        raise refused[0][1]


def _count(
    pid: int,
    space: AddressSpace,
    alloc: Allocator,
    sites: list,
    trap_ns: dict[str, float],
    max_seconds: float,
    max_calls: int,
) -> Rates:
    bpf = load("ratecount", {})
    try:
        placed = time.monotonic()
        _attach(bpf, pid, space, sites)
        calls = bpf["calls"]
        # The first hits pay one-off set-up (the kernel's out-of-line slot page): measure from
        # the first poll on, not from the attach.
        start = time.monotonic()
        time.sleep(0.005)
        t0, n0 = time.monotonic(), [calls[i].value for i in range(len(sites))]
        while True:
            time.sleep(0.005)
            n = [calls[i].value for i in range(len(sites))]
            counted = max(b - a for a, b in zip(n0, n, strict=True))
            spanned = time.monotonic() - start
            if counted >= max_calls and spanned >= MIN_COUNT_S or counted >= MAX_CALLS_FACTOR * max_calls:
                break
            if spanned >= max_seconds:
                break
        t1 = time.monotonic()
        n = [calls[i].value for i in range(len(sites))]
        bpf.detach_all()  # every site at once: the hottest stops trapping within one grace period
        total = [calls[i].value for i in range(len(sites))]  # with the hits while detaching
    finally:
        bpf.cleanup()
    seconds = max(t1 - t0, 1e-6)
    observed = [(b - a) / seconds for a, b in zip(n0, n, strict=True)]
    busy = sum(o * trap_ns.get(p.function, 0.0) for o, p in zip(observed, sites, strict=True)) / 1e9
    # Trap-bound (the probes took nearly all its time): the true rates are higher than anything
    # measurable this way; the observed rates are lower bounds, which is enough to refuse tracing.
    scale = 1 / (1 - busy) if busy < 0.9 else 1.0
    counts = [
        RateEstimate(
            function=p.function,
            module=p.module,
            calls=b - a,
            seconds=seconds,
            observed_per_s=o,
            per_s=o * scale,
            stopped_early=b - a >= max_calls,
        )
        for p, a, b, o in zip(sites, n0, n, observed, strict=True)
    ]
    paid = sum(t * trap_ns.get(p.function, 0.0) for t, p in zip(total, sites, strict=True))
    return Rates(allocator=alloc.name, counts=counts, cost_ns=paid, hits=sum(total), probes_s=time.monotonic() - placed)
