"""The facts rules read: a flat {name: value} computed from the counters and from each probe's
result, in the units the catalog (memdiag.rules.catalog) gives. Unknown stays None."""

from __future__ import annotations

import shlex

from memdiag.probes.registry import REGISTRY
from memdiag.system.runtime import Runtime

from .culprit import Classes, default_classes
from .evidence import psi_stall_percent, window_seconds
from .leakcache import stack_trend
from .observe import Observation
from .report import Counters
from .trends import counter_rate, growth_trend
from .triage import kills_during, limit_hits, memory_level, memory_shape


def app_function(frames: list[str], forwards: list[bool] | None = None, classes: Classes | None = None) -> str | None:
    """The culprit's function: the first frame (from the leaf) past allocator entry points,
    allocation wrappers and runtime code (the playbook's `wrappers:` list, memdiag.diagnose.culprit)."""
    return (classes or default_classes()).name(frames, forwards).label


def target_facts(kind: str, pid: int | None, cmdline: list[str], runtime: Runtime | None) -> dict:
    """Facts about a process target that commands in advice need: its pid, command line, runtime."""
    if kind != "pid" or pid is None:
        return {"target.runtime": "unknown"}  # a cgroup or the system may run anything
    return {
        "target.pid": str(pid),
        "target.command": shlex.join(cmdline) if cmdline else None,
        "target.runtime": runtime.name if runtime else "none",
        "target.runtime_detail": runtime.describe() if runtime else None,
    }


def counter_facts(obs: Observation, counters: Counters, budget_percent: float) -> dict:
    f: dict = {
        "target.kind": obs.target.kind,
        "target.exited": obs.exited_at is not None,
        "budget.percent": budget_percent,
        "window.seconds": window_seconds(obs),
        "window.samples": len(obs.snapshots),
        "memory.shape": memory_shape(counters),
        # before any sample too: the fallback rules (too few samples, exited early) ask for them
        "oom.kills": len(counters.oom_kills),
        "oom.kills_in_window": kills_during(obs, counters),
        "oom.cgroup_limit": counters.oom_kills[-1].cgroup_oom if counters.oom_kills else None,
    }
    if not obs.snapshots:
        return f
    first, last, secs = obs.snapshots[0], obs.snapshots[-1], window_seconds(obs)
    m = last.meminfo
    f.update(
        {
            "system.mem_total": m.mem_total,
            "system.mem_available": m.mem_available,
            "system.mem_available_percent": m.available_percent,
            "system.swap_total": m.swap_total,
            "system.swap_used": m.swap_used,
            "system.swapin_rate": counter_rate(first.vmstat.get("pswpin"), last.vmstat.get("pswpin"), secs),
            "system.swapout_rate": counter_rate(first.vmstat.get("pswpout"), last.vmstat.get("pswpout"), secs),
            "system.majfault_rate": counter_rate(first.vmstat.get("pgmajfault"), last.vmstat.get("pgmajfault"), secs),
            "system.direct_reclaim_rate": counter_rate(
                first.vmstat.get("allocstall"), last.vmstat.get("allocstall"), secs
            ),
            "system.psi_some": psi_stall_percent(obs, "some"),
            "system.psi_full": psi_stall_percent(obs, "full"),
        }
    )
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
    f["memory.level"] = memory_level(counters)

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

    cg = obs.last_cgroup  # read once more at the window's end, as the counter table has it
    if cg is not None:
        f.update({"cgroup.usage": cg.usage, "cgroup.limit": cg.effective_limit, "cgroup.oom_kills": cg.oom_kill})
        if cg.effective_limit and cg.usage is not None:
            f["cgroup.usage_percent"] = 100.0 * cg.usage / cg.effective_limit
        if (hits := limit_hits(obs)) is not None:
            f["cgroup.limit_hits"] = hits
        usage = counters.trends.get("cgroup.usage")
        if usage is not None:
            f["cgroup.usage_rate"] = usage.recent_rate_per_s if usage.shape == "climbing" else usage.rate_per_s
            f["cgroup.usage_shape"] = usage.shape
    # what the target paid in the window: the playbook's target-pays anchor weighs it with its limit hits
    f["pressure.target_major_faults"] = sum(r.majflt_delta or 0 for r in counters.processes)
    f["pressure.target_swap"] = _target_swap(obs, f.get("system.swap_used"))
    return f


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


def probe_facts(results: dict, classes: Classes | None = None) -> dict:
    """Facts from the probes that ran (name -> result). classes: the playbook's wrappers (default:
    the shipped list), passed over when a stack's function is named."""
    classes = classes or default_classes()
    f: dict = {}
    faults = results.get("faults")
    if faults is not None and faults.status in ("ok", "partial") and faults.stacks:
        f["faults.top_bytes"] = faults.stacks[0].bytes
        f["faults.top_function"] = _heaviest_app(faults.stacks, "bytes", classes)
    brk = results.get("brkstack")
    if brk is not None and brk.status in ("ok", "partial"):
        f["brk.growth"] = brk.heap_growth
        f["brk.top_function"] = _heaviest_app(brk.stacks, "bytes", classes) if brk.stacks else None
    mm = results.get("mmapsnoop")
    if mm is not None and mm.status in ("ok", "partial"):
        f["mmap.anon_bytes"] = sum(s.bytes for s in mm.stacks if s.kind.startswith("anon"))
        f["mmap.top_function"] = _heaviest_app(mm.stacks, "bytes", classes) if mm.stacks else None
    ml = results.get("memleak")
    if ml is not None and ml.status in ("ok", "partial") and ml.stacks:
        top = ml.stacks[0]
        trend = stack_trend(ml.series_times, top.series, top.alloc_bytes, top.freed_bytes)
        f.update(
            {
                "memleak.top_outstanding": top.outstanding_bytes,
                "memleak.top_rate": trend.rate_per_s,
                "memleak.top_free_ratio": 100 * trend.free_ratio if trend.free_ratio is not None else None,
                "memleak.top_function": app_function(top.frames, top.forwards, classes),
                "memleak.top_entry": _entry(top.functions),
                "memleak.top_trend": trend.shape,
            }
        )
    if ml is not None and ml.status in ("ok", "partial"):
        f.update(reach_facts(ml, classes))
    sw = results.get("swapin")
    if sw is not None and sw.status == "ok" and sw.processes and sw.duration_s:
        f["swapin.top_rate"] = sw.processes[0].swapins / sw.duration_s
    dr = results.get("drsnoop")
    if dr is not None and dr.status == "ok":
        f["reclaim.stall_time"] = sum(p.total_ms for p in dr.processes) / 1000.0
    return f


# Which probe each namespace of probe facts comes from (the row of the probe table that shows them).
_FACT_PROBES = REGISTRY.fact_rows()


def probe_figures(facts: dict) -> dict[str, dict[str, float]]:
    """The numeric probe facts by probe: what the report's probe table shows, so that a verdict
    or finding quoting one quotes a figure of the table."""
    out: dict[str, dict[str, float]] = {}
    for name, value in facts.items():
        probe = _FACT_PROBES.get(name.split(".", 1)[0])
        if probe and isinstance(value, int | float) and not isinstance(value, bool):
            out.setdefault(probe, {})[name] = value
    return out


def _series_shape(times: list[float], series: list[int]) -> str:
    """The shape of a stack's outstanding bytes over the probe (climbing, levelled, ...)."""
    return growth_trend(list(zip(times, series, strict=False))).shape


def reach_facts(ml, classes: Classes | None = None) -> dict:
    """What the reachability scan says about the stack with the most leaked bytes (the leak) and
    about the heaviest stack (what holds it)."""
    scan = ml.reach_scan
    if scan is None or scan.status != "ran":
        return {"reach.scanned": False, "reach.not_run_reason": scan.reason if scan else "no scan was asked for"}
    f: dict = {"reach.scanned": True, "reach.paused": (scan.paused_ms or 0) / 1000}
    if ml.stacks:
        top = ml.stacks[0]
        if top.reach is not None:
            held = top.reach.anchored_bytes + top.reach.leaked_bytes
            f["reach.anchored_bytes"] = top.reach.anchored_bytes
            f["reach.anchored_ratio"] = 100 * top.reach.anchored_bytes / held if held else None
            f["reach.anchor"] = top.reach.anchor
            f["reach.anchor_kind"] = top.reach.anchor_kind
    leak = ml.leak_stack()
    if leak is None:
        f.update({"reach.leaked_bytes": 0, "reach.leaked_count": 0, "reach.leaked_ratio": 0.0})
        return f
    r = leak.reach
    one_in = leak.allocs / r.leaked_count if r.leaked_count else None
    f.update(
        {
            "reach.leaked_bytes": r.leaked_bytes,
            "reach.leaked_count": r.leaked_count,
            "reach.unreferenced_count": r.unreferenced_count,
            "reach.leaked_ratio": 100 * r.leaked_bytes / (r.leaked_bytes + r.anchored_bytes),
            "reach.leak_function": app_function(leak.frames, leak.forwards, classes),
            "reach.leak_trend": _series_shape(ml.series_times, leak.series) if leak.series else None,
            "reach.leak_rate": (r.leaked_bytes / ml.duration_s) if ml.duration_s else None,
            "reach.leak_share": _share(one_in, leak.allocs),
        }
    )
    return f


def _share(one_in: float | None, allocs: int) -> str | None:
    """'1 in 7 allocations', or 'every allocation': how often the stack's allocations leak."""
    if one_in is None or not allocs:
        return None
    return "every allocation" if round(one_in) <= 1 else f"1 in {round(one_in):,} allocations"


_MAPPING_CALLS = {"mmap", "mmap64", "__mmap", "mremap", "__mremap"}


def _entry(functions: list[str | None]) -> str | None:
    """The allocator entry point of a stack (its leaf); every mmap alias reads as mmap."""
    leaf = functions[0] if functions else None
    return "mmap" if leaf in _MAPPING_CALLS else leaf


def _heaviest_app(stacks, weight: str, classes: Classes) -> str | None:
    """The application function that accounts for the most, summed over stacks."""
    totals: dict[str, int] = {}
    for s in stacks:
        fn = app_function(s.frames, getattr(s, "forwards", None), classes)
        if fn:
            totals[fn] = totals.get(fn, 0) + getattr(s, weight)
    return max(totals, key=totals.get) if totals else None  # type: ignore[arg-type]
