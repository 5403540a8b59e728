"""The plan() of a host-wide probe (fdstack, kmemstack, shmwriter): priced before it attaches, against the budget.

Their programs run for every event of their tracepoints on the host (every syscall's entry and exit;
every slab allocation and free) and filter the target inside, so what they cost falls on whichever
task made the call, on every CPU, not on the target alone. The price: how often those tracepoints
fire now, counted for half a second by counting perf events on the tracepoints themselves
(probes/tpcount.py: no program attached), times what one event costs their programs on this host,
plus the target's own events that the programs record (a stack walk, a table update) times what
recording one adds. Over the time the probe would run, as a share of the window, against the
budget: a share of one CPU's time over the window, as the probe table reports a host-wide probe's
BPF run time (probes/face.py overhead_percent) and the Overhead section sums it. Within it the probe
runs for its time; over it, for the seconds the budget pays for (MIN_TRACE_S at least, as memleak's
shortened trace); less, not at all, and its facts (`NAME.plan`, `.price_percent`, `.not_run`) say
so to the rules.

What one filtered event costs each program, and what recording one of the target's adds, are
measured on this host by `memdiag prepare` (measure(): the programs loaded with an empty targets
map, then with this process as the target, while it makes the calls; the kernel's BPF statistics
give their run time), kept in /var/lib/memdiag/hostwide-costs.json per kernel, CPU and program
text. A diagnosis never attaches them to measure (that is what it is pricing): where prepare did not
measure, it prices with each probe's priors (BENCHMARKS.md section 9) and says so."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import platform
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from memdiag.system import arch
from memdiag.system._parse import Model
from memdiag.system.target import Target

from . import tpcount
from .face import Budget, Context, FactDef, Plan
from .tpcount import TracepointCount

CACHE = Path("/var/lib/memdiag/hostwide-costs.json")
SCHEMA = 2  # a cache of an older layout is measured again
MIN_TRACE_S = 2.0  # the shortest trace a shortened plan runs: a leak at a few a second shows in it
COUNT_S = 0.5  # how long the tracepoints are counted: slab frees come in RCU batches, a quarter second is lumpy
PRIORS_SAID = "priors from BENCHMARKS.md section 9 (`memdiag prepare` has not measured them on this host)"
MEASURED_SAID = "measured on this host by `memdiag prepare`"
TARGET_SAID = "a prior from BENCHMARKS.md section 9"

# (tracepoints, seconds, the target's pids, filters of their count, the tracepoints counted in them)
Counter = Callable[
    [tuple[str, ...], float, tuple[int, ...], dict[str, str] | None, tuple[str, ...]], TracepointCount | str
]


def syscall_filter(names: tuple[str, ...]) -> dict[str, str]:
    """The target's count of raw_syscalls:sys_enter kept to the calls a program records (an ftrace
    filter on the syscall's number); none off x86-64, where every call of the target is counted."""
    numbers = sorted(set(arch.syscall_defines(names=names).values()))
    return {"raw_syscalls:sys_enter": " || ".join(f"id == {n}" for n in numbers)} if numbers else {}


@dataclass(frozen=True)
class Pricing:
    """How one host-wide probe is priced: the tracepoints its programs run on, which program runs
    for each (a syscall runs fdstack's two), the target's events it records and what recording one
    adds, and the priors of what a filtered event costs each program."""

    probe: str
    tracepoints: tuple[str, ...]  # counted host-wide
    programs: dict[str, tuple[str, ...]]  # tracepoint -> the programs (BPF function names) each event runs
    priors_ns: dict[str, float]  # program -> ns per run, filtering out another process's event (a prior)
    recorded: tuple[str, ...]  # the tracepoints counted in the target's threads: events its programs record
    recorded_ns: float  # what recording one of the target's events adds (a prior, BENCHMARKS.md section 9)
    recorded_what: str  # "descriptor calls", "slab allocations"
    event_what: str  # "syscalls", "slab allocations and frees"
    filters: Callable[[], dict[str, str]] = dict  # tracepoint -> ftrace filter of the target's count

    def fact(self, name: str) -> str:
        return f"{self.probe}.{name}"

    def facts(self) -> tuple[FactDef, ...]:
        return (
            FactDef(
                self.fact("plan"),
                "string",
                f"{self.probe}'s plan before it attaches: full (within the budget), shortened (run for the "
                "seconds the budget pays for), over-budget or unknown (its tracepoints could not be counted): "
                "it runs when full or shortened",
                figure=False,
            ),
            FactDef(
                self.fact("price_percent"),
                "percent",
                f"what {self.probe} was priced at before attaching: its programs' run time on the host's CPUs over "
                "the time it would run, as a share of one CPU over the window (an estimate)",
            ),
            FactDef(
                self.fact("not_run"),
                "string",
                f"why {self.probe} was not attached: its price against the budget, or why it could not be priced",
            ),
        )


class HostCosts(Model):
    """ns per program run of each host-wide program, filtering out another process's event."""

    schema_version: int = SCHEMA
    host: str
    program_ns: dict[str, float]  # BPF function name -> ns per run
    recorded_ns: dict[str, float] = {}  # probe -> what recording one of the target's events adds
    runs: dict[str, int] = {}  # how many runs each figure is of


class HostWidePlan(Plan):
    """The decision (state: full, over-budget, unknown) and the figures it rests on."""

    host_per_s: dict[str, float] = {}  # tracepoint -> events per second on the host
    target_per_s: float | None = None  # the target's recorded events per second
    ns_per_s: float | None = None  # the programs' run time per second while attached
    attached_percent: float | None = None  # share of one CPU while attached
    costs_from: str = ""  # measured, or priors
    seconds: float | None = None  # shortened: how long the budget pays for it to run


# --- this host's costs -------------------------------------------------------------------------


@functools.cache
def _host_key() -> str:
    from .compiler import program_text, sha256

    cpu = ""
    with contextlib.suppress(OSError):
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        cpu = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "")
    h = sha256()
    for name in ("fdstack", "kmemstack"):
        with contextlib.suppress(OSError):
            h.update(program_text(name).encode())
    return f"{platform.release()} | {cpu} | {h.hexdigest()[:12]}"


def cached_costs(path: Path = CACHE) -> HostCosts | None:
    """The costs `memdiag prepare` measured on this kernel and CPU for these programs, None if none."""
    try:
        costs = HostCosts.model_validate(json.loads(path.read_text()))
    except (OSError, ValueError):
        return None
    return costs if costs.host == _host_key() and costs.schema_version == SCHEMA else None


def _syscalls(n: int) -> None:
    for _ in range(n):
        os.getppid()


def _slab(n: int) -> None:
    """Slab allocations and frees in this process: a pipe's two files, inode and ring, made and closed."""
    for _ in range(n):
        r, w = os.pipe()
        os.close(r)
        os.close(w)


def _run_stats(module, make: Callable[[int], None], n: int, target: bool) -> tuple[dict[str, tuple[int, int]], int]:
    """Each program's (runs, run ns) while this process makes n of its events, the programs loaded
    as a diagnosis loads them: with no target in their map (every event filtered out), or with this
    process as the target, armed (its events recorded). And how many allocations it recorded."""
    from . import bpfstats
    from .base import _control, bpf_stats, load, program_stats, set_targets

    bpf = load(module.__name__.rsplit(".", 1)[-1], {"TARGET_MODE": 1, **module.build_options()})
    try:
        if target:
            set_targets(bpf, {os.getpid()})
            _control(bpf, 1)
        with bpf_stats():
            before = program_stats(bpf) or {}
            make(n)
            after = program_stats(bpf) or {}
        allocs = bpfstats.read(bpf, bpfstats.KMEM)["allocs"] if module.__name__.endswith("kmemstack") else 0
    finally:
        bpf.cleanup()
    runs = {k: (c - before.get(k, (0, 0))[0], ns - before.get(k, (0, 0))[1]) for k, (c, ns) in after.items()}
    return runs, allocs


def _recorded_ns(runs: dict[str, tuple[int, int]], filtered: dict[str, float], recorded: int) -> float | None:
    """What recording one event adds: the programs' run time with this process the target, less
    what their runs would have cost filtered out, per event recorded."""
    if recorded <= 0 or any(k not in filtered for k in runs):
        return None
    extra = sum(ns for _c, ns in runs.values()) - sum(c * filtered[k] for k, (c, _ns) in runs.items())
    return max(0.0, extra / recorded)


def measure(path: Path = CACHE) -> HostCosts | None:
    """Measure and keep this host's costs (`memdiag prepare`); None where the programs cannot load
    or the kernel keeps no run time. fdstack: getppid() calls, filtered; pipe(), close() and close()
    recorded (three calls each time). kmemstack: a pipe made and closed (its files, inode and ring),
    filtered, then recorded (per allocation recorded, with the free of each)."""
    from . import fdstack, kmemstack
    from .base import ProbeUnavailable
    from .compiler import CompileError

    stats: dict[str, tuple[int, int]] = {}
    recorded: dict[str, float] = {}
    try:
        fd_filtered, _ = _run_stats(fdstack, _syscalls, 100_000, target=False)
        kmem_filtered, _ = _run_stats(kmemstack, _slab, 20_000, target=False)
        stats = {**fd_filtered, **kmem_filtered}
        per_run = {k: ns / c for k, (c, ns) in stats.items() if c > 0}
        fd_rec, _ = _run_stats(fdstack, _slab, 5_000, target=True)
        kmem_rec, allocs = _run_stats(kmemstack, _slab, 5_000, target=True)
    except (ProbeUnavailable, CompileError, OSError):
        return None
    if not per_run:
        return None
    for probe, runs, events in (("fdstack", fd_rec, 3 * 5_000), ("kmemstack", kmem_rec, allocs)):
        ns = _recorded_ns(runs, per_run, events)
        if ns is not None:
            recorded[probe] = ns
    costs = HostCosts(
        host=_host_key(),
        program_ns=per_run,
        recorded_ns=recorded,
        runs={k: c for k, (c, _ns) in stats.items()},
    )
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(costs.model_dump_json())
        tmp.replace(path)
    return costs


# --- the price and the decision -------------------------------------------------------------------


def _percent(ns: float, window_s: float) -> float:
    return 100 * ns / (window_s * 1e9) if window_s > 0 else float("inf")


def decision(p: Pricing, state: str, reason: str, price: float | None = None, **fields) -> HostWidePlan:
    """A plan with its facts filled in (price: its estimated share of the window)."""
    facts: dict = {p.fact("plan"): state, p.fact("price_percent"): price}
    go = state in ("full", "shortened")
    if not go:
        facts[p.fact("not_run")] = reason
    of = f"{p.probe} on the host's CPUs" + ("" if go else ", not attached")
    return HostWidePlan(
        go=go, state=state, reason=reason, facts=facts, estimated_percent=price, estimate_of=of, **fields
    )


def price(
    p: Pricing, counted: TracepointCount, ctx: Context, measured: HostCosts | None, whole_host: bool = False
) -> HostWidePlan:
    """The decision from a count: every event on the host times what it costs the programs, plus
    the target's recorded events times what recording adds, over ctx.seconds, against the budget.
    whole_host: every process is the target's, every event of the recorded tracepoints priced as
    recorded (an upper bound: the host's count is not filtered)."""
    budget = ctx.budget or Budget(percent=100.0, window_s=ctx.seconds)
    costs_from = MEASURED_SAID if measured is not None else PRIORS_SAID
    known = measured.program_ns if measured is not None else {}
    per_event = {tp: sum(known.get(f, p.priors_ns[f]) for f in p.programs[tp]) for tp in p.tracepoints}
    host_per_s = {tp: counted.host_per_s(tp) for tp in p.tracepoints}
    host_ns = sum(host_per_s[tp] * per_event[tp] for tp in p.tracepoints)
    per_s = counted.host_per_s if whole_host else counted.target_per_s
    target_per_s = sum(per_s(tp) for tp in p.recorded)
    recorded_ns = measured.recorded_ns.get(p.probe) if measured is not None else None
    recorded_from = MEASURED_SAID if recorded_ns is not None else TARGET_SAID
    recorded_ns = recorded_ns if recorded_ns is not None else p.recorded_ns
    target_ns = target_per_s * recorded_ns
    ns_per_s = host_ns + target_ns
    run_ns = ns_per_s * ctx.seconds
    projected = _percent(run_ns + budget.spent_ns, budget.window_s)
    events = ", ".join(f"{tp} {host_per_s[tp]:,.0f}/s x {per_event[tp]:,.0f} ns" for tp in p.tracepoints)
    what = (
        f"the host's {p.event_what} counted on every CPU over {counted.seconds:.2f} s with no program attached "
        f"({events}; per event: {costs_from})"
    )
    if whole_host:
        whose = f"every {', '.join(p.recorded)} event of the host, every process being a target (an upper bound)"
    else:
        left = f", {counted.threads_left} more not counted" if counted.threads_left else ""
        refused = f", every {', '.join(counted.unfiltered)} (its filter refused)" if counted.unfiltered else ""
        threads = f"{counted.threads} thread{'' if counted.threads == 1 else 's'} counted"
        whose = f"the target's {p.recorded_what} ({threads}{left}{refused})"
    what += f", and {whose} {target_per_s:,.0f}/s x {recorded_ns:,.0f} ns to record each ({recorded_from})"
    attached = _percent(ns_per_s, 1.0)
    what += (
        f" = {attached:.2f}% of one CPU while attached, paid by every process of the host whose calls run its "
        f"programs, not by the target alone; over the {ctx.seconds:.0f} s it would run"
        + (f", with {budget.spent_ns / 1e6:.1f} ms spent already" if budget.spent_ns else "")
        + f", {projected:.2f}% of one CPU over the {budget.window_s:.0f} s window (an estimate)"
    )
    fields = {
        "host_per_s": host_per_s,
        "target_per_s": target_per_s,
        "ns_per_s": ns_per_s,
        "attached_percent": attached,
        "costs_from": costs_from,
    }
    if projected <= budget.percent:
        return decision(p, "full", f"{what} <= budget {budget.percent:g}%", projected, **fields)
    # what the budget pays for: a shorter trace names the code as well (outstanding objects and
    # descriptors are counted from the attach), where it is long enough to see some made
    fits = int((budget.allowance_ns / ns_per_s if ns_per_s > 0 else 0.0) * 10) / 10
    if fits >= MIN_TRACE_S:
        shorter = _percent(ns_per_s * fits + budget.spent_ns, budget.window_s)
        said = (
            f"{what} > budget {budget.percent:g}%; the budget pays for {fits:g} s of it: traced for those "
            f"({shorter:.2f}% of the window)"
        )
        return decision(p, "shortened", said, shorter, seconds=fits, **fields)
    said = f"{what} > budget {budget.percent:g}%"
    if fits > 0:
        said += f"; the budget pays for {fits:g} s of it, under the {MIN_TRACE_S:g} s a trace needs"
    return decision(p, "over-budget", f"{said}: not attached", projected, **fields)


def run_seconds(ctx: Context) -> float:
    """How long the probe runs: what it is given, or less where its plan shortened it."""
    plan = ctx.plan
    if isinstance(plan, HostWidePlan) and plan.seconds is not None:
        return min(ctx.seconds, plan.seconds)
    return ctx.seconds


def plan(
    p: Pricing,
    target: Target,
    ctx: Context,
    counter: Counter | None = None,
    costs: Callable[[], HostCosts | None] = cached_costs,
) -> HostWidePlan:
    """Count the probe's tracepoints for COUNT_S (counter: tpcount.count unless a test gives its
    own) and price it against ctx.budget for ctx.seconds."""
    count = counter or tpcount.count
    if (change := target.changed()) is not None:
        return decision(p, "unknown", f"{change.describe()}: not priced, nothing attached")
    pids = tuple(sorted(target.pids())) if target.kind != "system" else ()
    counted = count(p.tracepoints, COUNT_S, pids, p.filters() if pids else None, p.recorded)
    if isinstance(counted, str):
        return decision(p, "unknown", f"could not price {p.probe}: {counted}; not attached")
    if (change := target.changed()) is not None:  # the threads counted may be another process's
        return decision(p, "unknown", f"{change.describe()}: not priced, nothing attached")
    return price(p, counted, ctx, costs(), whole_host=target.kind == "system")
