"""memleak's plan(): allocation tracing priced site by site before it attaches, against the budget.

Each counted entry point's rate (ratecount.py: a bounded count, malloc and its kin first) times what
a call through its probe costs on this host (meter.py: an emulated or single-stepped trap, a return
probe, memleak's programs; costs.py measures them once per kernel and CPU), over the time it would
be attached with its detach, plus what the count itself cost, as a share of the window, against
the budget. The count's cost is spent whatever the decision: a row of the probe table. Within
budget memleak attaches for the whole time asked (one burst); over it, for as long as the budget
pays for where that is long enough for a trend (MIN_TRACE_S); shorter than that, the playbook says
what runs instead (its rule on the `alloc.tracing` fact)."""

from __future__ import annotations

from dataclasses import dataclass, field

from memdiag.system.target import Target

from ..allocator import ALLOCATING, Allocator, find_allocator
from ..cpython.price import walk_ns
from ..face import Budget, Context, Plan, Spent
from .costs import Costs, host_costs
from .meter import Price, detach_seconds, price, trap_ns
from .ratecount import COUNTED, Rates, estimate_call_rates
from .reach.pause import reserve_ms
from .trend import MIN_POINTS

# The shortest trace worth attaching: the series is read once a second at the most often, and a
# stack's shape needs MIN_POINTS readings of it (fewer is "unknown", neither leak nor cache)
MIN_TRACE_S = float(MIN_POINTS + 1)
# The shortest trace where the reachability scan ends it: the scan, not a trend, tells leak from held
# there (blocks born in the trace, outstanding and unreachable at its end); half a second is tens of
# thousands of calls at the rates that are priced out of a whole window (100k/s glibc, 10k/s jemalloc)
MIN_BURST_S = 0.5
# How long a count that saw no call at all is repeated for: at pymalloc's ~4 arena mmaps a second a
# 1.25 s count misses them all once in e^5 (<1%) of diagnoses, against e^1 for the first quarter second;
# and it spans a whole second, so a program allocating once a second in one burst is always seen
RECOUNT_S = 1.25
COUNT_STEP = "ratecount"  # the probe table's row of the rate count
COUNT_METHOD = "one uprobe per entry point, each count stopped after ~1,000 calls or 0.25 s"
NOT_PER_PROCESS = "allocation tracing is priced per process, not for a cgroup or the whole system"
NOT_PRICED = "could not price allocation tracing (no allocator found or the count failed)"


@dataclass(frozen=True)
class Schedule:
    """How memleak would be attached: `bursts` runs of `seconds` each, every one ended by a detach.
    Full tracing is one burst for the whole time asked."""

    seconds: float
    bursts: int = 1

    @property
    def attached_s(self) -> float:
        """The time its probes trap the target: every burst, and the detach that ends each."""
        return self.bursts * (self.seconds + detach_seconds())


class MemleakPlan(Plan):
    """The budget decision (state: full, fallback or unknown) and what the run needs of it."""

    call_rate: float | None = None  # allocating calls (malloc, operator new, mallocx) per second
    cost_ns: float | None = None  # what tracing costs the target per malloc call, all sites together
    attached_percent: float | None = None  # share of a CPU while memleak is attached
    sites: str | None = None  # the price site by site
    allocator: str | None = None  # the allocator it would trace (None: none found, or not a process)
    costs: Costs | None = None  # this host's trap costs: the run measures what it costs with them
    site_rates: dict[str, float] | None = None  # calls per second by entry point, hottest attached first
    schedule: Schedule | None = None
    scan_ms: float | None = None  # the pause kept for the reachability scan that ends the trace (an estimate)

    @property
    def choice(self) -> str:
        return self.state


def plan_facts(plan: Plan | None) -> dict:
    """What the rules see of the decision: `alloc.tracing` (full, fallback, unknown; none when memleak
    was not priced, so the fallback rule is false, not missing) says whether memleak attaches."""
    if not isinstance(plan, MemleakPlan):
        return {"alloc.tracing": "none", "alloc.allocator": None}
    return {
        "alloc.rate": plan.call_rate,
        "alloc.tracing_percent": plan.estimated_percent,
        "alloc.tracing": plan.state,
        "alloc.allocator": plan.allocator,
    }


def decision(state: str, reason: str, spent: list[Spent] | None = None, **fields) -> MemleakPlan:
    """A plan with its facts filled in, as the trail and the Overhead section say it."""
    of = "allocation tracing" if state == "full" else "allocation tracing, not attached"
    kept = {"spent": spent or [], **fields}
    bare = MemleakPlan(go=state == "full", state=state, reason=reason, estimate_of=of, **kept)
    return bare.model_copy(update={"facts": plan_facts(bare)})


def plan(target: Target, ctx: Context) -> MemleakPlan:
    """Price memleak for ctx.seconds (what it would run) against ctx.budget."""
    if target.kind != "pid" or target.pid is None:
        return decision("fallback", NOT_PER_PROCESS)
    if (change := target.changed()) is not None:
        return decision("unknown", f"{change.describe()}: not priced, nothing attached")
    budget = ctx.budget or Budget(percent=100.0, window_s=ctx.seconds)
    costs = host_costs()
    alloc = find_allocator(target.pid)
    allocator = alloc.name if alloc is not None else None
    rates = None
    if costs is not None and alloc is not None:
        traps = {p.function: trap_ns(p, costs) for p in alloc.placements}
        rates = estimate_call_rates(target.pid, trap_ns=traps, alloc=alloc, functions=ALLOCATING)
    if (change := target.changed()) is not None:  # what was read and counted may be another process's
        return decision("unknown", f"{change.describe()}: not priced, nothing attached")
    if costs is None or alloc is None or rates is None:
        return decision("unknown", NOT_PRICED, allocator=allocator)
    scan = reserve_ms(target.pid)
    if scan is not None and ctx.max_pause_ms is not None and scan > ctx.max_pause_ms:
        scan = None  # the scan would be refused at the end: no shortened trace may rest on it
    pricing = _Pricing(
        budget, Schedule(ctx.seconds), costs, allocator, walk_ns=walk_ns(target.pid, costs), scan_ms=scan
    )
    pricing.spend(rates)
    first_step = [p for p in alloc.placements if p.function in ALLOCATING]
    prefix = " and ".join(r.function for r in rates.counts) + " alone: "
    first = pricing.decide(price(first_step, rates.per_s(), costs, pricing.walk_ns), rates, prefix)
    if first.state != "full":
        return first
    return pricing.every_site(target.pid, alloc, traps, rates)


@dataclass
class _Pricing:
    """One pricing's state: the budget, what memleak would run, what the counts cost so far."""

    budget: Budget
    schedule: Schedule
    costs: Costs
    allocator: str | None
    spent_ns: float = 0.0  # the counts' cost to the target
    count: Spent | None = None  # the counts, merged into one row
    counted: set[str] = field(default_factory=set)  # the entry points counted
    allocating: float = 0.0  # allocating calls per second
    walk_ns: float = 0.0  # what a CPython target's frame walk adds to one allocation (probes/cpython/price.py)
    scan_ms: float | None = None  # the pause kept for the scan ending a shortened trace (reach/pause.py)

    def spend(self, rates: Rates) -> None:
        """A count's cost to the target, kept for the probe table (one row for every count)."""
        self.spent_ns += rates.cost_ns
        self.counted.update(r.function for r in rates.counts)
        if not self.allocating:  # the allocating entry points' rate, whichever count had them
            self.allocating = sum(r.per_s for r in rates.counts if r.function in ALLOCATING)
        before = self.count
        self.count = Spent(
            step=COUNT_STEP,
            seconds=(before.seconds if before else 0.0) + rates.probes_s,
            ns=(before.ns if before else 0.0) + rates.cost_ns,
            events=(before.events if before else 0) + rates.hits,
            reason=f"counted calls to {', '.join(sorted(self.counted))} to price allocation tracing",
            method=COUNT_METHOD,
        )

    def every_site(self, pid: int, alloc: Allocator, traps: dict[str, float], rates: Rates) -> MemleakPlan:
        """The second step, when the allocating calls alone did not price memleak out: count the
        others (free, calloc, realloc, mmap ...) and price every site."""
        others = tuple(f for f in COUNTED if f not in ALLOCATING)
        more = estimate_call_rates(pid, trap_ns=traps, alloc=alloc, functions=others)
        if more is not None:
            self.spend(more)
        every, free_counted = rates.plus(more), more is not None
        if sum(r.calls for r in every.counts) == 0:
            # None in a quarter of a second is no proof the memory bypasses the allocator: a program
            # growing by pymalloc's 1 MiB arenas calls mmap ~4 times a second, and 1 diagnosis in 6
            # fell back on such a count here. A count that sees nothing costs the target nothing,
            # so every entry point is counted again, together and for longer, before the fallback.
            again = estimate_call_rates(pid, trap_ns=traps, alloc=alloc, functions=COUNTED, max_seconds=RECOUNT_S)
            if again is None:
                return self._fallback_no_calls(every, None)
            self.spend(again)
            if sum(r.calls for r in again.counts) == 0:
                return self._fallback_no_calls(every, again)
            every, free_counted = again, True
        per_s = every.per_s()
        if not free_counted:  # the second count failed: price each free as an allocation's (they pair up)
            per_s.setdefault("free", self.allocating)
        return self.decide(price(alloc.placements, per_s, self.costs, self.walk_ns), every, "", site_rates=per_s)

    def _fallback_no_calls(self, first: Rates, again: Rates | None) -> MemleakPlan:
        names = ", ".join(r.function for r in first.counts)
        module = first.counts[0].module.rsplit("/", 1)[-1]
        counted = f"{first.counts[0].seconds:.2f} s"
        if again is not None:
            counted += f", nor in {again.counts[0].seconds:.2f} s more of counting them all together"
        return decision(
            "fallback",
            f"no call to {names} in {counted}: the memory does not come through "
            f"{module} (direct brk/mmap, or a runtime with its own allocator)",
            self._spent(),
            call_rate=0.0,
            allocator=self.allocator,
            costs=self.costs,
        )

    def _spent(self) -> list[Spent]:
        return [self.count] if self.count is not None else []

    def _shortened(self, ns_per_s: float, spent: float) -> tuple[Schedule, str]:
        """What the budget pays for, the pause of the scan that ends the trace kept out of it: a
        shorter trace within it beats none, and its scan tells leak from held where a trend of a few
        seconds cannot (a 14 s alert window traced 6 s and left its scan 12 ms of the 112 it needed).
        The schedule asked where none fits, and the trail's words ({projected}: the share run)."""
        b, kept = self.budget, self.scan_ms or 0.0
        fits = (b.percent / 100 * b.window_s * 1e9 - spent - kept * 1e6) / ns_per_s - detach_seconds()
        fits = int(fits * 10) / 10
        shortest = MIN_BURST_S if self.scan_ms is not None else MIN_TRACE_S
        if fits >= self.schedule.seconds:
            return self.schedule, ""
        if fits < shortest:
            why = (
                f"under the {MIN_BURST_S:g} s a trace ended by the reachability scan needs"
                if self.scan_ms is not None
                else f"under the {MIN_TRACE_S:g} s a stack's trend needs (no scan can end it)"
            )
            return self.schedule, f"; the budget pays for {max(fits, 0.0):g} s of it, {why}"
        scan = f" with ~{kept:.0f} ms kept for the reachability scan at its end (an estimate)" if kept else ""
        said = f"; the budget pays for {fits:g} s of it{scan}: traced for those ({{projected:.2f}}% of the window)"
        if fits < MIN_TRACE_S:
            said += f", under the {MIN_TRACE_S:g} s a stack's trend needs: the scan alone tells leak from held"
        return Schedule(fits), said

    def decide(self, pr: Price, rates: Rates, prefix: str, site_rates: dict[str, float] | None = None) -> MemleakPlan:
        """Full tracing or not: the price's rate of cost over the time memleak would be attached
        with its detach, with what was spent already, as a share of the window, against the budget."""
        b, run_s = self.budget, self.schedule.seconds
        spent = b.spent_ns + self.spent_ns

        def share(schedule: Schedule) -> float:
            return 100 * (pr.ns_per_s * schedule.attached_s + spent) / (b.window_s * 1e9)

        projected = share(self.schedule)
        asked, schedule, shortened = projected, self.schedule, ""
        if projected > b.percent and schedule.bursts == 1 and pr.ns_per_s > 0:
            schedule, shortened = self._shortened(pr.ns_per_s, spent)
            projected = share(schedule)
            shortened = shortened.format(projected=projected)
        what = (
            f"{prefix}{pr.describe()} (rates counted over {rates.counts[0].seconds:.2f} s, corrected for the "
            f"count's own traps) = {pr.percent:.2f}% of a CPU while attached; over the {run_s:.0f} s it would "
            f"run and its detach, with the rate count's {spent / 1e6:.1f} ms, {asked:.2f}% of the "
            f"{b.window_s:.0f} s window"
        )
        rare = ", ".join(f for f in pr.uncounted() if not prefix)
        if rare:
            what += f" ({rare} not counted beforehand: measured once attached)"
        what += shortened
        within = projected <= b.percent
        reason = (
            f"{what} <= budget {b.percent:g}%"
            if within
            else f"{what} > budget {b.percent:g}%: every uprobe hit is a trap whatever the program does, so "
            "sampling or a size filter would not make it cheaper"
        )
        return decision(
            "full" if within else "fallback",
            reason,
            self._spent(),
            estimated_percent=projected,
            attached_percent=pr.percent,
            call_rate=self.allocating,
            cost_ns=pr.ns_per_s / self.allocating if self.allocating else None,
            sites=pr.describe(),
            allocator=self.allocator,
            costs=self.costs,
            site_rates=site_rates,
            schedule=schedule,
            scan_ms=self.scan_ms,
        )
