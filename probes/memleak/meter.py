"""What allocation tracing costs the target, priced per probe site before attaching and measured
while attached.

Every uprobe hit is a trap, and what a trap costs depends on where the probe sits: an
instruction the kernel emulates (a push: ~0.5-1.3 µs here) or one it must single-step out of line
(~16 µs: jemalloc's malloc+0 and free+0), plus a return probe where the result is needed (the
kernel hijacks the return address: a second trap). The BPF program then runs on top of the trap.
So the price of a site is trap(kind) [+ return trap] + the programs' own run time, each measured
on this host (costs.py), times that site's call rate (ratecount.py).

While memleak is attached, the cost is measured rather than estimated, two ways: the kernel's
count and run time of each program (BPF stats), with each program's hits priced at its site's
trap; and the target's own CPU time (utime + stime: traps are charged to the trapping thread)
against its rate before the attach. The probes' count is the figure reported and enforced,
raised to the CPU clock's where that is larger, up to twice the count (the CPU clock also moves
with the target's own load)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from memdiag.system.process import cpu_seconds
from memdiag.system.units import fmt_ns

from ..allocator import BPF_FUNCTION, Placement
from ..base import program_stats
from ..bpfobj import multi_links
from ..face import TracingCost
from .costs import Costs

RETURN_PROGRAM = "alloc_return"  # bpf/memleak.c: every return probe runs it
# How long a hot probe goes on trapping once detaching starts (bpfobj.detach_all). Perf-event uprobes
# close one per grace period (~100 ms here), hottest first: malloc, its return probe and free stop
# within about three. uprobe_multi links (6.6+) close together, in one grace period each: memleak's
# 12 in 55 ms here.
DETACH_S = 0.3
DETACH_LINKS_S = 0.1


def detach_seconds() -> float:
    """DETACH_S, or DETACH_LINKS_S once this kernel attached memleak's probes as links."""
    return DETACH_LINKS_S if multi_links() else DETACH_S


# The cost is checked once a tick of the probe's wait (base: 0.5 s): detaching when the next check
# would find it over keeps the target within its budget (at 10 thousand calls/s on a host where
# memleak costs 1.8% of the target, waiting for the check past the allowance measured 2.06% for 2%).
CHECK_S = 0.5
# A trace of a few checks' length (the shortened one a reachability scan ends, down to half a
# second) is checked this often instead: the first check at 0.5 s came after such a trace had run
# out, and what the target really paid (its own CPU: 1.90% of a 30 s window for a 0.5 s trace at
# 100k calls/s, priced at 1.41% by its probes' hits) had eaten the pause kept for the scan.
SHORT_CHECK_S = 0.1
SHORT_TRACE_S = 4 * CHECK_S


def check_s(duration: float) -> float:
    """How often the meter checks a trace planned for `duration` seconds."""
    return SHORT_CHECK_S if duration <= SHORT_TRACE_S else CHECK_S


CPU_TRUST = 2.0
NOT_WALKING = ("free_enter", "munmap_enter")  # the programs of bpf/memleak.c that never walk Python frames


def trap_ns(placement: Placement, costs: Costs) -> float:
    """The trap of the entry probe alone."""
    return costs.emulated_ns if placement.emulated else costs.stepped_ns


def site_ns(placement: Placement, costs: Costs, walk_ns: float = 0.0) -> float:
    """What one call through this site costs the target with memleak attached; walk_ns: what the
    Python frame walk adds to an allocation's program (a CPython target: probes/cpython/price.py)."""
    program = BPF_FUNCTION[placement.function]
    ns = trap_ns(placement, costs) + costs.program_ns.get(program, costs.program_ns.get("malloc_enter", 0.0))
    if program not in NOT_WALKING:
        ns += walk_ns
    if placement.return_probe:
        ns += costs.return_ns + costs.program_ns.get(RETURN_PROGRAM, 0.0)
    return ns


@dataclass
class SitePrice:
    placement: Placement
    per_s: float | None  # calls per second; None: not counted
    ns: float  # per call
    walk_ns: float = 0.0  # of which the Python frame walk (a CPython target)

    @property
    def ns_per_s(self) -> float:
        return (self.per_s or 0.0) * self.ns

    def describe(self) -> str:
        how = "emulated" if self.placement.emulated else "single-stepped"
        ret = " + return probe" if self.placement.return_probe else ""
        rate = f"{self.per_s:,.0f}/s" if self.per_s is not None else "not counted"
        walk = f" (the Python frame walk {fmt_ns(self.walk_ns)} of it)" if self.walk_ns else ""
        return f"{self.placement.function}+{self.placement.offset} ({how}{ret}) {rate} x {fmt_ns(self.ns)}{walk}"


@dataclass
class Price:
    """Allocation tracing priced site by site: ns of the target's time per second attached."""

    sites: list[SitePrice] = field(default_factory=list)

    @property
    def ns_per_s(self) -> float:
        return sum(s.ns_per_s for s in self.sites)

    @property
    def percent(self) -> float:
        """Share of one CPU's time while attached."""
        return self.ns_per_s / 1e9 * 100

    def describe(self) -> str:
        counted = [s for s in self.sites if s.per_s]
        return " + ".join(s.describe() for s in sorted(counted, key=lambda s: -s.ns_per_s)) or "no calls counted"

    def uncounted(self) -> list[str]:
        return [s.placement.function for s in self.sites if s.per_s is None]


def price(placements: list[Placement], rates: dict[str, float], costs: Costs, walk_ns: float = 0.0) -> Price:
    sites = []
    for p in placements:
        walks = walk_ns if BPF_FUNCTION[p.function] not in NOT_WALKING else 0.0
        sites.append(SitePrice(p, rates.get(p.function), site_ns(p, costs, walk_ns), walks))
    return Price(sites)


class LiveCost:
    """memleak's cost so far, measured: each program's hits (the kernel's run count) priced at the
    trap of the site(s) it is attached to, plus the programs' own run time. A program on several
    sites (free_enter on free and operator delete; malloc_enter on malloc and operator new) is
    priced at its sites' traps weighted by their counted rates; with none counted, at the dearest."""

    def __init__(self, placements: list[Placement], costs: Costs, rates: dict[str, float] | None = None):
        self.costs = costs
        by_program: dict[str, list[Placement]] = {}
        for p in placements:
            by_program.setdefault(BPF_FUNCTION[p.function], []).append(p)
        self.trap = {program: _weighted_trap(sites, costs, rates or {}) for program, sites in by_program.items()}
        if any(p.return_probe for p in placements):
            self.trap[RETURN_PROGRAM] = costs.return_ns

    def ns(self, bpf) -> float | None:
        """None: the kernel keeps no run counts (kernel.bpf_stats_enabled could not be set)."""
        stats = program_stats(bpf)
        if stats is None:
            return None
        default = self.costs.emulated_ns
        return sum(run_ns + count * self.trap.get(name, default) for name, (count, run_ns) in stats.items())


def _weighted_trap(sites: list[Placement], costs: Costs, rates: dict[str, float]) -> float:
    weights = [(rates.get(p.function) or 0.0, trap_ns(p, costs)) for p in sites]
    total = sum(w for w, _ in weights)
    if total <= 0:
        return max(t for _, t in weights)
    return sum(w * t for w, t in weights) / total


class Meter:
    """Reads TracingCost while a probe runs: started before the attach, so attaching counts."""

    def __init__(self, pid: int | None, cpu_baseline: float | None):
        self.pid, self.baseline = pid, cpu_baseline
        self.t0 = time.monotonic()
        self.cpu0 = cpu_seconds(pid) if pid is not None else None

    def read(
        self,
        bpf,
        placements: list[Placement],
        costs: Costs,
        rates: dict[str, float] | None = None,
        paused_s: float = 0.0,
    ) -> TracingCost:
        return self.cost(LiveCost(placements, costs, rates).ns(bpf), paused_s)

    def cost(self, probes_ns: float | None, paused_s: float = 0.0) -> TracingCost:
        """What the probes cost the target so far: their own count (probes_ns: hits x trap + run
        time; None: the kernel keeps no counts), checked against the target's CPU clock."""
        attached = time.monotonic() - self.t0
        cpu_ns = None
        if self.pid is not None and self.baseline is not None and self.cpu0 is not None:
            now = cpu_seconds(self.pid)
            # a stopped target (the reachability scan) uses no CPU: its rate applies to the rest
            if now is not None:
                cpu_ns = max(0.0, (now - self.cpu0 - self.baseline * max(attached - paused_s, 0.0)) * 1e9)
        if probes_ns is None:
            measured = cpu_ns
        elif cpu_ns is None:
            measured = probes_ns
        else:
            # The CPU clock sees what the trap model might miss, but also the target's own load
            # changing (a busy multi-threaded server's jitter alone is tens of ms a second): it may
            # raise the figure up to CPU_TRUST times the probes' own count, no further.
            measured = max(probes_ns, min(cpu_ns, CPU_TRUST * probes_ns))
        return TracingCost(attached_s=attached, probes_ns=probes_ns, cpu_ns=cpu_ns, measured_ns=measured)
