"""memleak: outstanding allocations by stack, how they evolve, and what still points at them —
the raw material of leak versus cache. Its face (below) and its parts:

  session.py   the tracing run (uprobes on the target's allocator, or the kmem tracepoints);
               tables.py: its BPF tables read back (blocks, series, stacks named and merged)
  plan.py      its price before it attaches: the rate count (ratecount.py) times this host's trap
               costs (costs.py: calibration; meter.py: the price per site and the meter that
               measures the real cost while attached, detaching over the allowance)
  reach/       the reachability scan of its outstanding blocks, at the end of its run
  facts.py     its facts (memleak.*, reach.*, alloc.*); view.py: its stacks, rows, trail, caveats
  result.py    its result, and the result in words (`memdiag probe memleak`)"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memdiag.system.target import Target

from ..face import Context, Face, Option
from . import view
from .costs import host_costs
from .facts import FACTS, facts_of
from .options import build_options, requirements
from .plan import MemleakPlan, plan
from .ratecount import estimate_call_rates
from .result import BigAlloc, LeakStack, MemleakResult, describe
from .session import hotness, run

__all__ = [
    "FACE", "BigAlloc", "LeakStack", "MemleakPlan", "MemleakResult", "build_options", "describe", "hotness",
    "requirements", "run",
]  # fmt: skip


def _run(target: Target, ctx: Context) -> MemleakResult:
    """In a diagnosis: as planned (the host's costs and the call rates, to measure its cost and
    detach over what the budget leaves), its series sampled ten times, then the reachability scan
    within the pause allowed. Alone (`memdiag probe memleak` / `reach`): with its options."""
    if ctx.alone:
        return _run_alone(target, ctx)
    p = ctx.plan if isinstance(ctx.plan, MemleakPlan) else None
    costs = p.costs if p is not None else None
    seconds = ctx.seconds
    if p is not None and p.schedule is not None:  # the time the budget pays for, where shorter
        seconds = min(seconds, p.schedule.seconds)
    return run(
        target,
        seconds,
        series_interval=max(1.0, seconds / 10),
        costs=costs,
        site_rates=p.site_rates if p is not None else None,
        allowance_ns=ctx.budget.allowance_ns if costs is not None and ctx.budget is not None else None,
        cpu_baseline=ctx.cpu_rate,
        scan_reach=True,
        reach_allowed_ms=ctx.max_pause_ms,
        scan_kept_ms=(p.scan_ms or 0.0) if p is not None else 0.0,
    )


def _run_alone(target: Target, ctx: Context) -> MemleakResult:
    o = ctx.options
    kernel = bool(o.get("kernel"))
    pause = o.get("max_pause")
    if pause is None and ctx.budget is not None:  # the default budget's share of the run
        pause = ctx.budget.percent / 100 * ctx.seconds * 1000
    costs = None if kernel else host_costs()  # the target's time it cost, measured
    return run(
        target,
        ctx.seconds,
        kernel_mode=kernel,
        sample_every=o.get("sample_every", 1),
        min_size=o.get("min_size", 0),
        max_size=o.get("max_size"),
        snoop_min=o.get("snoop", 0),
        top=o.get("top", 20),
        costs=costs,
        # a program on several sites (free_enter on free and operator delete) is priced by its
        # sites' counted calls, as in a diagnosis: at the dearest site's trap it read 1.7x the truth
        site_rates=_counted_rates(target) if costs is not None else None,
        scan_reach=bool(o.get("scan_reach")),
        reach_allowed_ms=pause,
    )


def _counted_rates(target: Target) -> dict[str, float] | None:
    """The short rate count a diagnosis's plan makes (ratecount.py: a quarter of a second at most,
    about a thousand traps), of every counted entry point; None where it cannot count."""
    if target.kind != "pid" or target.pid is None:
        return None
    rates = estimate_call_rates(target.pid)
    return rates.per_s() if rates is not None else None


def _refuse(options: Mapping[str, Any]) -> str | None:
    max_size, min_size = options.get("max_size"), options.get("min_size") or 0
    if max_size is not None and max_size < min_size:
        return "--max-size is smaller than --min-size"
    return None


def _needs(kind: str, options: Mapping[str, Any]) -> str | None:
    if kind == "system" and not options.get("kernel"):
        return "traces the user-space allocations of a process or cgroup: give -p PID or --cgroup PATH (or --kernel)"
    return None


OPTIONS = (
    Option("--sample-every", "count", "trace 1 in N allocations", default=1),
    Option("--min-size", "size", "ignore smaller allocations", default=0),
    Option("--max-size", "size", "ignore larger allocations"),
    Option("--snoop", "size", "also list single allocations of at least SIZE (e.g. 1MiB)", default=0),
    Option("--kernel", "flag", "kernel allocations (kmem tracepoints)", default=False),
    Option(
        "--max-pause",
        "milliseconds",
        "skip the scan if it would stop the target longer (default: 2%% of --duration)",
        group="reach",
    ),
)


def _keep(older: MemleakResult, newer: MemleakResult) -> MemleakResult:
    """Of two cycles' runs, the one whose scan found the most leaked bytes (a leak seen in one
    cycle of a long window stays the window's evidence); where neither found any, the newer."""
    return view.keep_most_leaked(older, newer, MemleakResult.leak_stack)


FACE = Face(
    name="memleak",
    summary="outstanding allocations by stack (--kernel: the kernel's slab allocations)",
    needs=_needs,
    run=_run,
    result=MemleakResult,
    describe=describe,
    facts=FACTS,
    retired=(
        (
            "memleak.top_shape",
            "the playbook's anchors trend-leak and trend-cache decide it from memleak.top_trend, "
            "memleak.top_free_ratio and process.rss_shape",
        ),
    ),
    facts_of=facts_of,
    rows=view.rows,
    stacks=view.STACKS,
    caveats=view.caveats,
    trail=view.trail,
    missed=view.missed,
    measured=view.measured,
    on_target=True,
    plan=plan,
    planning="counting allocator calls",
    options=OPTIONS,
    refuse=_refuse,
    keep=_keep,
)
