"""The facts rules read: a flat {name: value} computed from the counters, and from each probe's
result by its face (probes/face.py), in the units the catalog (memdiag.rules.catalog) gives.
Unknown stays None."""

from __future__ import annotations

import shlex

from memdiag.probes.face import Namer, Plan, ProbeResult
from memdiag.probes.registry import REGISTRY
from memdiag.probes.runtime import Samples
from memdiag.system.runtime import Runtime
from memdiag.system.target import Target
from memdiag.system.trends import Trend, counter_rate, growth_trend

from .culprit import Classes, default_classes
from .evidence import (
    build_counters,
    cgroup_psi_stall_percent,
    cgroup_split,
    own_pids,
    psi_stall_percent,
    refaults,
    thp_collapses,
    window_seconds,
)
from .ledgers import ledger_facts
from .observe import Observation
from .report import TARGET_SERIES, Counters
from .triage import (
    Triage,
    kills_during,
    limit_hits,
    memory_base,
    memory_level,
    memory_measure,
    memory_shape,
    triage,
)


def app_function(frames: list[str], forwards: list[bool] | None = None, classes: Classes | None = None) -> str | None:
    """The culprit's function: the first frame (from the leaf) past allocator entry points,
    allocation wrappers and runtime code (the playbook's `wrappers:` list, memdiag.diagnose.culprit)."""
    return (classes or default_classes()).name(frames, forwards).label


def target_facts(t: Target, runtime: Runtime | None, samples: Samples) -> dict:
    """Facts about a process target that commands in advice need (its pid, command line, runtime),
    and what its runtime's face says of it over the window's samples (probes/runtime.py)."""
    if t.kind != "pid" or t.pid is None:
        return {"target.runtime": "unknown"}  # a cgroup or the system may run anything
    f = {
        "target.pid": str(t.pid),
        "target.command": shlex.join(t.cmdline) if t.cmdline else None,
        "target.runtime": runtime.name if runtime else "none",
        "target.runtime_detail": runtime.describe() if runtime else None,
    }
    face = REGISTRY.runtime(runtime.name) if runtime else None
    if face is not None:
        f.update(face.facts_of(samples, t.pid))
    return f


def counter_facts(obs: Observation, counters: Counters, budget_percent: float) -> dict:
    f: dict = {
        "target.kind": obs.target.kind,
        "target.exited": obs.exited_at is not None,
        "target.execd": obs.execd_at is not None,
        "target.exec": obs.exec_exe,
        "budget.percent": budget_percent,
        "window.seconds": window_seconds(obs),
        "window.samples": len(obs.snapshots),
        "memory.shape": memory_shape(counters),
        "memory.sawtooth_base": memory_base(counters),
        # before any sample too: the fallback rules (too few samples, exited early) ask for them
        "oom.kills": len(counters.oom_kills),
        "oom.kills_in_window": kills_during(obs, counters),
        "oom.cgroup_limit": counters.oom_kills[-1].cgroup_oom if counters.oom_kills else None,
    }
    if not obs.snapshots:
        return f
    f.update(_system_facts(obs, counters))
    f["memory.level"] = memory_level(counters)
    f["memory.measure"] = memory_measure(counters)
    f["memory.thp_collapses"] = thp_collapses(obs)
    f.update(_process_facts(obs, counters))
    f.update(_cgroup_facts(obs, counters))
    f.update(ledger_facts(counters.ledgers, counters.shm, obs, counters.sysv))
    if counters.slab_top:
        top = counters.slab_top[0]
        f["slab.top_cache"], f["slab.top_cache_growth"] = top.name, top.last_bytes - top.first_bytes
    # what the target paid in the window: the playbook's target-pays anchor weighs it with its limit hits
    f["pressure.target_major_faults"] = sum(r.majflt_delta or 0 for r in counters.processes)
    f["pressure.target_swap"] = _target_swap(obs, f.get("system.swap_used"))
    return f


def _system_facts(obs: Observation, counters: Counters) -> dict:
    """The host's memory, swap, faults, reclaim, PSI, and its fastest grower (never memdiag)."""
    first, last, secs = obs.snapshots[0], obs.snapshots[-1], window_seconds(obs)
    m = last.meminfo

    def rate(name: str) -> float | None:
        return counter_rate(first.vmstat.get(name), last.vmstat.get(name), secs)

    f: dict = {
        "system.mem_total": m.mem_total,
        "system.mem_available": m.mem_available,
        "system.mem_available_percent": m.available_percent,
        "system.swap_total": m.swap_total,
        "system.swap_used": m.swap_used,
        "system.swapin_rate": rate("pswpin"),
        "system.swapout_rate": rate("pswpout"),
        "system.majfault_rate": rate("pgmajfault"),
        "system.direct_reclaim_rate": rate("allocstall"),
        "system.psi_some": psi_stall_percent(obs, "some"),
        "system.psi_full": psi_stall_percent(obs, "full"),
    }
    a, b = first.vmstat.get("oom_kill"), last.vmstat.get("oom_kill")
    f["system.oom_kills"] = (b - a) if a is not None and b is not None else None
    if first.meminfo.sunreclaim is not None and m.sunreclaim is not None:
        f["system.sunreclaim_growth"] = m.sunreclaim - first.meminfo.sunreclaim
    avail = counters.trends.get("system.mem_available")
    f["system.mem_available_rate"] = avail.rate_per_s if avail else None
    # the target's processes as the report's process table has them: never memdiag's own
    growth = [r.growth for r in counters.processes if r.rss_first is not None]
    f["system.top_grower_growth"] = max(growth) if growth else None
    top = max(counters.processes, key=lambda r: (r.growth, r.rss_last or 0)) if counters.processes else None
    f["system.top_grower_pid"] = str(top.pid) if top else None
    f["system.mem_available_shape"] = avail.shape if avail else "unknown"
    return f


def _process_facts(obs: Observation, counters: Counters) -> dict:
    """A pid target's RSS, its trend and its faults, and whether the OOM killer took it."""
    first, last, secs = obs.snapshots[0], obs.snapshots[-1], window_seconds(obs)
    f: dict = {}
    rss = counters.trends.get("process.rss")
    if rss is not None and last.process is not None:
        p0, p1 = first.process, last.process
        f.update(
            {
                "process.rss": p1.rss,
                "process.rss_anon": p1.rss_anon,
                "process.rss_growth": rss.delta,
                "process.rss_rate": rss.recent_rate_per_s if rss.shape == "climbing" else rss.rate_per_s,
                "process.rss_shape": rss.shape,
                "process.swap": p1.vm_swap,
                "process.vsz_growth": (p1.vm_size - p0.vm_size) if p1.vm_size and p0 and p0.vm_size else None,
                "process.majfault_rate": counter_rate(p0.majflt if p0 else None, p1.majflt, secs),
            }
        )
    elif obs.target.kind == "pid":
        f["process.rss_shape"] = rss.shape if rss else "unknown"
    f["process.oom_killed"] = (
        any(k.victim_pid == obs.target.pid for k in counters.oom_kills) if (obs.target.kind == "pid") else None
    )
    return f


def _cgroup_facts(obs: Observation, counters: Counters) -> dict:
    """The target's memory cgroup at the window's end (read once more then, as the counter table
    has it): usage against its limit, limit hits, OOM kills, its usage's trend."""
    cg = obs.last_cgroup
    if cg is None:
        return {}
    f: dict = {"cgroup.usage": cg.usage, "cgroup.limit": cg.effective_limit, "cgroup.oom_kills": cg.oom_kill}
    # whether what its counters say is the target's alone: a pid's cgroup may be a session's, shared
    f["cgroup.processes"] = len(set(cg.procs) - own_pids(obs))
    # the stall its own tasks paid (memory.pressure, v2; None on v1) and its memory by kind (memory.stat)
    f["cgroup.psi_some"] = cgroup_psi_stall_percent(obs, "some")
    f["cgroup.psi_full"] = cgroup_psi_stall_percent(obs, "full")
    split = cgroup_split(cg)
    f["cgroup.anon"] = cg.stat[split["anon"]] if "anon" in split else None
    f["cgroup.file"] = cg.stat[split["file"]] if "file" in split else None
    if cg.effective_limit and cg.usage is not None:
        f["cgroup.usage_percent"] = 100.0 * cg.usage / cg.effective_limit
    if (hits := limit_hits(obs)) is not None:
        f["cgroup.limit_hits"] = hits
    f.update(_refaults(obs))
    usage = counters.trends.get("cgroup.usage")
    if usage is not None:
        f["cgroup.usage_rate"] = usage.recent_rate_per_s if usage.shape == "climbing" else usage.rate_per_s
        f["cgroup.usage_shape"] = usage.shape
    f.update(_grower_facts(obs, counters, usage))
    return f


def _grower_facts(obs: Observation, counters: Counters, usage: Trend | None) -> dict:
    """A cgroup target's process that grew most (the report's process table, as its culprit is
    chosen) and its share of the cgroup's growth: where one process grew the cgroup, the probes that
    trace one process (allocations, the reachability scan) can be run on it."""
    if obs.target.kind != "cgroup" or not counters.processes:
        return {}
    top = max(counters.processes, key=lambda r: (r.growth, r.rss_last or 0))
    if top.rss_first is None or top.growth <= 0:
        return {}  # started during the window, or nothing grew: no grower to name
    grew = usage.delta if usage is not None else None
    return {
        "cgroup.top_grower_pid": str(top.pid),
        "cgroup.top_grower_growth": top.growth,
        "cgroup.top_grower_share": 100.0 * top.growth / grew if grew is not None and grew > 0 else None,
    }


def _refaults(obs: Observation) -> dict:
    """File pages of the cgroup read back after reclaim evicted them, over the window (the counter
    table's row workingset_refault_file)."""
    pair = refaults(obs)
    if pair is None:
        return {}
    return {"cgroup.refaults": pair[1] - pair[0], "cgroup.refault_rate": counter_rate(*pair, window_seconds(obs))}


def _target_swap(obs: Observation, system_swap: int | None) -> int | None:
    """The target's pages in swap at the window's end: a major fault of it can be a swap-in only
    when it has some (a cold file read faults too)."""
    if obs.target.kind == "pid":
        last = obs.snapshots[-1].process
        return last.vm_swap if last is not None else None
    if obs.target.kind == "cgroup":
        cg = obs.last_cgroup
        return cg.swap_usage if cg is not None else None
    return system_swap


def namer(classes: Classes | None = None) -> Namer:
    """How a probe's facts name a stack's function: the playbook's wrappers (default: the shipped list)."""
    classes = classes or default_classes()
    return lambda frames, forwards: classes.name(frames, forwards or None).label


def probe_facts(results: dict[str, ProbeResult], plans: dict[str, Plan], classes: Classes | None = None) -> dict:
    """Facts from every probe's face, run or not (a plan's facts stand before its run), in the
    registry's order."""
    name = namer(classes)
    f: dict = {}
    for face in REGISTRY.faces():
        f.update(face.facts_of(results.get(face.name), plans.get(face.name), name))
    return f


def probe_figures(facts: dict) -> dict[str, dict[str, float]]:
    """The numeric probe facts by row of the probe table: what it shows, so that a verdict or
    finding quoting one quotes a figure of the table."""
    rows = REGISTRY.figure_rows()
    out: dict[str, dict[str, float]] = {}
    for name, value in facts.items():
        row = rows.get(name)
        if row and isinstance(value, int | float) and not isinstance(value, bool):
            out.setdefault(row, {})[name] = value
    return out


def window_facts(
    obs: Observation,
    target: Target,
    budget_percent: float,
    runtime: Runtime | None,
    given: dict,
    results: dict[str, ProbeResult],
    plans: dict[str, Plan],
    classes: Classes,
) -> tuple[dict, Counters, Triage]:
    """Every fact of the window so far: the counters', what the caller knew beforehand (given), the
    target's, the counters' readings in words (summary.*), then each probe's; with the counters and
    their triage they were computed from."""
    counters = build_counters(obs)
    tri = triage(obs, counters)
    f = counter_facts(obs, counters, budget_percent)
    f.update(given)
    f["target.name"] = target.describe()
    f.update(target_facts(target, runtime, obs.runtime_samples()))
    f.update(tri.facts)
    f.update(probe_facts(results, plans, classes))
    f["memory.shape_while_traced"] = shape_while_traced(obs, counters, results)
    return f, counters, tri


def shape_while_traced(obs: Observation, counters: Counters, results: dict[str, ProbeResult]) -> str:
    """The target's own memory (RSS, a cgroup's usage) over the run of the probe that traced its
    allocations: what a stack's outstanding bytes are to be read against. Over the whole window a
    cache that filled before the trace reads "levelled" while, traced, its memory does not move."""
    run = next(
        (
            results[f.name]
            for f in REGISTRY.stack_faces()
            if f.stacks is not None and f.stacks.kind == "allocations" and f.name in results
        ),
        None,
    )
    series = next((counters.series[n] for n in TARGET_SERIES if counters.series.get(n)), None)
    if run is None or run.status not in ("ok", "partial") or series is None:
        return "unknown"
    start = run.started - obs.started
    points = [(t, v) for t, v in series if start <= t <= start + run.duration_s]
    return growth_trend(points).shape if len(points) >= 3 else "unknown"
