"""Turn an Observation into the report's counters: the table, trends, series and OOM records."""

from __future__ import annotations

from memdiag.system.cgroup import memcg_matches
from memdiag.system.kmsg import OomKill
from memdiag.system.trends import Trend, counter_rate, growth_trend

from .ledgers import build_ledgers, build_oom_ledger, build_shm, new_segments
from .observe import Observation
from .report import TARGET_SERIES, CounterRow, Counters, ProcessRow, SlabGrowth

# vmstat counters shown as rates, with their unit
_VMSTAT_RATES = {
    "pswpin": "pages_per_s",
    "pswpout": "pages_per_s",
    "pgfault": "per_s",
    "pgmajfault": "per_s",
    "pgscan_kswapd": "pages_per_s",
    "pgscan_direct": "pages_per_s",
    "pgsteal_kswapd": "pages_per_s",
    "pgsteal_direct": "pages_per_s",
    "allocstall": "per_s",
    "oom_kill": "per_s",
    "workingset_refault_anon": "pages_per_s",
    "workingset_refault_file": "pages_per_s",
}
_MEMINFO_ROWS = (
    "mem_total",
    "mem_available",
    "mem_free",
    "cached",
    "buffers",
    "anon_pages",
    "shmem",
    "slab",
    "sreclaimable",
    "sunreclaim",
    "swap_total",
    "swap_free",
    "committed_as",
    "commit_limit",
)
_PROCESS_BYTES = ("rss", "rss_anon", "rss_file", "rss_shmem", "vm_swap", "vm_hwm", "vm_size", "pss")
_CGROUP_BYTES = ("usage", "effective_limit", "high", "max_usage", "swap_usage", "swap_limit")
_CGROUP_COUNTS = ("failcnt", "oom", "oom_kill")


def window_seconds(obs: Observation) -> float:
    s = obs.snapshots
    return s[-1].t - s[0].t if len(s) >= 2 else 0.0


def series(obs: Observation) -> dict[str, list[tuple[float, float]]]:
    out: dict[str, list[tuple[float, float]]] = {}
    if not obs.snapshots:
        return out
    t0 = obs.snapshots[0].t

    def add(name: str, t: float, value: float | None) -> None:
        if value is not None:
            out.setdefault(name, []).append((round(t - t0, 3), float(value)))

    for s in obs.snapshots:
        if s.process is not None:
            add("process.rss", s.t, s.process.rss)
            add("process.rss_anon", s.t, s.process.rss_anon)
            add("process.vm_swap", s.t, s.process.vm_swap)
        if s.cgroup is not None:
            add("cgroup.usage", s.t, s.cgroup.usage)
        add("system.mem_available", s.t, s.meminfo.mem_available)
    face = obs.runtime_face()
    if face is not None and obs.snapshots:  # the runtime's own (a live set after each collection)
        out.update(face.series(obs.runtime_samples(), obs.snapshots[0].t))
    return out


def trends(
    named_series: dict[str, list[tuple[float, float]]], collapses: dict[float, int] | None = None
) -> dict[str, Trend]:
    """Each series' trend; the target's own memory (RSS, a cgroup's usage) read past huge-page collapses."""
    out = {name: growth_trend(points) for name, points in named_series.items()}
    for name in TARGET_SERIES:
        if collapses and name in out and out[name].shape != "climbing":
            healed = growth_trend(collapse_healed(named_series[name], collapses))
            if healed.shape != out[name].shape:
                out[name] = out[name].model_copy(
                    update={"shape": healed.shape, "levelled_for_s": healed.levelled_for_s}
                )
    return out


HUGE_PAGE = 2 << 20  # what one collapse by khugepaged maps (x86-64, arm64 with 4 KiB pages)


def collapse_counts(obs: Observation) -> dict[float, int]:
    """Huge pages khugepaged had collapsed by each sample (its time into the window, as series() has
    it): the target's cgroup's own count (memory.stat thp_collapse_alloc, cgroup v2) where every sample
    has one, else the host's (vmstat thp_collapse_alloc). Empty: the kernel counts none."""
    s = obs.snapshots
    if not s:
        return {}
    t0 = s[0].t
    if all(x.cgroup is not None and "thp_collapse_alloc" in x.cgroup.stat for x in s):
        return {round(x.t - t0, 3): x.cgroup.stat["thp_collapse_alloc"] for x in s}
    if all(x.vmstat.get("thp_collapse_alloc") is not None for x in s):
        return {round(x.t - t0, 3): x.vmstat.get("thp_collapse_alloc") for x in s}
    return {}


def thp_collapses(obs: Observation) -> int | None:
    """Huge pages collapsed during the window (the counts collapse_counts reads); None: not counted."""
    counts = collapse_counts(obs)
    if not counts:
        return None
    values = list(counts.values())
    return max(0, values[-1] - values[0])


def collapse_healed(points: list[tuple[float, float]], collapses: dict[float, int]) -> list[tuple[float, float]]:
    """The series with each fall that a collapse explains put back: between two samples where
    khugepaged collapsed n huge pages, a fall of at most n x 2 MiB is the collapse (a stock kernel
    with THP `always` dipped a steady leak's cgroup 1 MiB for a sample), not the target shrinking.
    A fall larger than that, or one with no collapse beside it, stays."""
    if not points:
        return []
    out, offset = [points[0]], 0.0
    for (t0, v0), (t1, v1) in zip(points, points[1:], strict=False):
        a, b = collapses.get(t0), collapses.get(t1)
        n = (b - a) if a is not None and b is not None else 0
        fall = v0 - v1
        if fall > 0 and n > 0 and fall <= n * HUGE_PAGE:
            offset += fall
        out.append((t1, v1 + offset))
    return out


def _stall_percent(first, last, kind: str, secs: float) -> float | None:
    """Share of secs (percent) during which some/all tasks stalled on memory, between two PSI readings."""
    if first is None or last is None:
        return None
    a, b = getattr(first, kind), getattr(last, kind)
    if a is None or b is None or secs <= 0:
        return None
    return max(0.0, min(100.0, 100.0 * (b.total_us - a.total_us) / (secs * 1e6)))


def psi_stall_percent(obs: Observation, kind: str) -> float | None:
    """Share of the window (percent) during which some/all tasks stalled on memory, from the
    host's PSI totals at both ends: exact for the window, unlike the kernel's 10 s average."""
    s = obs.snapshots
    if len(s) < 2:
        return None
    return _stall_percent(s[0].psi, s[-1].psi, kind, window_seconds(obs))


def cgroup_psi_stall_percent(obs: Observation, kind: str) -> float | None:
    """The same from the target's cgroup's own memory.pressure (cgroup v2): the stall its tasks paid.
    None on v1 (no per-cgroup PSI) or without a cgroup."""
    s = obs.snapshots
    if len(s) < 2 or s[0].cgroup is None or s[-1].cgroup is None:
        return None
    return _stall_percent(s[0].cgroup.pressure, s[-1].cgroup.pressure, kind, window_seconds(obs))


def _rows(obs: Observation) -> list[CounterRow]:
    s = obs.snapshots
    if not s:
        return []
    return _process_rows(obs) + _cgroup_rows(obs) + _system_rows(obs)


def _pair(scope, name: str, unit, first, last, secs: float | None = None) -> CounterRow:
    """One counter at both ends of the window (its rate over the window when secs is given)."""
    a, b = getattr(first, name), getattr(last, name)
    rate = counter_rate(a, b, secs) if secs is not None else None
    return CounterRow(scope=scope, name=name, unit=unit, first=a, last=b, rate_per_s=rate)


def _process_rows(obs: Observation) -> list[CounterRow]:
    first, last, secs = obs.snapshots[0].process, obs.snapshots[-1].process, window_seconds(obs)
    if first is None or last is None:
        return []
    rows = [_pair("process", name, "bytes", first, last) for name in _PROCESS_BYTES]
    rows.append(_pair("process", "threads", "count", first, last))
    return rows + [_pair("process", name, "per_s", first, last, secs) for name in ("minflt", "majflt")]


def _cgroup_rows(obs: Observation) -> list[CounterRow]:
    first = obs.snapshots[0].cgroup
    last = obs.last_cgroup  # read once more at the window's end: a kill after the last sample counts
    if first is None or last is None:
        return []
    rows = [_pair("cgroup", name, "bytes", first, last) for name in _CGROUP_BYTES]
    rows += [_pair("cgroup", name, "count", first, last) for name in _CGROUP_COUNTS]
    for name, key in cgroup_split(last).items():  # its memory.stat: anonymous and page cache
        rows.append(CounterRow(scope="cgroup", name=name, unit="bytes", first=first.stat.get(key), last=last.stat[key]))
    if (pair := refaults(obs)) is not None:
        rate = counter_rate(pair[0], pair[1], window_seconds(obs))
        rows.append(
            CounterRow(
                scope="cgroup",
                name="workingset_refault_file",
                unit="count",
                first=pair[0],
                last=pair[1],
                rate_per_s=rate,
            )
        )
    for kind in ("some", "full"):  # its own PSI (v2)
        if (stall := cgroup_psi_stall_percent(obs, kind)) is not None:
            rows.append(CounterRow(scope="cgroup", name=f"psi_{kind}_window", unit="percent", last=stall))
    return rows


def refaults(obs: Observation) -> tuple[int, int] | None:
    """The cgroup's file refaults (pages read back soon after reclaim evicted them) at the first and the
    last sample: v2 workingset_refault_file, v1 total_workingset_refault_file; None: not counted."""
    a, b = obs.snapshots[0].cgroup, obs.snapshots[-1].cgroup
    if a is None or b is None:
        return None
    key = next((k for k in ("total_workingset_refault_file", "workingset_refault_file") if k in b.stat), None)
    return (a.stat[key], b.stat[key]) if key is not None and key in a.stat else None


def cgroup_split(cg) -> dict[str, str]:
    """The memory.stat keys of a cgroup's anonymous memory and page cache: v2's anon and file,
    v1's hierarchical total_rss and total_cache (else rss and cache); only those it has."""
    pairs = (("anon", ("anon", "total_rss", "rss")), ("file", ("file", "total_cache", "cache")))
    out = {}
    for name, keys in pairs:
        key = next((k for k in keys if k in cg.stat), None)
        if key is not None:
            out[name] = key
    return out


def _system_rows(obs: Observation) -> list[CounterRow]:
    first, last, secs = obs.snapshots[0], obs.snapshots[-1], window_seconds(obs)
    rows = [_pair("system", name, "bytes", first.meminfo, last.meminfo) for name in _MEMINFO_ROWS]
    for name, unit in _VMSTAT_RATES.items():
        a, b = first.vmstat.get(name), last.vmstat.get(name)
        if a is None and b is None:
            continue
        rows.append(
            CounterRow(scope="system", name=name, unit=unit, first=a, last=b, rate_per_s=counter_rate(a, b, secs))
        )  # type: ignore[arg-type]
    for kind in ("some", "full"):
        line = last.psi and getattr(last.psi, kind)
        if line is not None:
            rows.append(CounterRow(scope="system", name=f"psi_{kind}_avg10", unit="percent", last=line.avg10))
            rows.append(CounterRow(scope="system", name=f"psi_{kind}_avg60", unit="percent", last=line.avg60))
        stall = psi_stall_percent(obs, kind)
        if stall is not None:
            rows.append(CounterRow(scope="system", name=f"psi_{kind}_window", unit="percent", last=stall))
    face = obs.runtime_face()
    if face is not None:  # its own counters table
        rows += [CounterRow(scope="runtime", **r.model_dump()) for r in face.rows(obs.runtime_samples())]
    return rows


def _in_cgroup(kill: OomKill, cgroup_path: str) -> bool:
    return memcg_matches(kill.task_memcg, cgroup_path) or memcg_matches(kill.oom_memcg, cgroup_path)


def relevant_oom_kills(obs: Observation) -> list[OomKill]:
    """Kills that concern the target: of its pid, in its cgroup (for a cgroup target, at any time
    the kernel log still remembers), or anywhere during the window (system target)."""
    kills = obs.oom_kills or []
    target = obs.target
    in_window = [k for k in kills if k.when is not None and k.when >= obs.started - 1.0]
    if target.kind == "pid":
        # A kill of this pid before the window was another process: the target was alive then.
        own = [k for k in in_window if k.victim_pid == target.pid]
        if own or target.cgroup is None or target.cgroup.path == "/":
            return own
        return [k for k in in_window if _in_cgroup(k, target.cgroup.path)]
    if target.kind == "cgroup" and target.cgroup is not None:
        return [k for k in kills if _in_cgroup(k, target.cgroup.path)]
    return in_window


def slab_top(obs: Observation, n: int = 5) -> list[SlabGrowth]:
    if obs.slab_first is None or obs.slab_last is None:
        return []
    before = {c.name: c.size_bytes for c in obs.slab_first}
    rows = [SlabGrowth(name=c.name, first_bytes=before.get(c.name, 0), last_bytes=c.size_bytes) for c in obs.slab_last]
    rows.sort(key=lambda r: (r.last_bytes - r.first_bytes, r.last_bytes), reverse=True)
    return rows[:n]


def own_pids(obs: Observation) -> set[int]:
    """memdiag's own process and its descendants (its BPF compiler child) seen in the window."""
    if obs.memdiag_pid is None:
        return set()
    parents = {p.pid: p.ppid for p in [*obs.processes_first.values(), *obs.processes_last.values()]}
    own = {obs.memdiag_pid}
    grew = True
    while grew:
        kids = {pid for pid, ppid in parents.items() if ppid in own} - own
        own |= kids
        grew = bool(kids)
    return own


def scope_pids(obs: Observation) -> set[int]:
    """The processes a list of the report may name: the target for a pid, the cgroup's members
    (at any sample) for a cgroup, every process for the system; never memdiag's own."""
    target = obs.target
    if target.kind == "pid":
        pids = {target.pid} if target.pid is not None else set()
    elif target.kind == "cgroup":
        pids = {pid for s in obs.snapshots if s.cgroup is not None for pid in s.cgroup.procs}
    else:
        pids = set(obs.processes_first) | set(obs.processes_last)
    return pids - own_pids(obs)


def process_rows(obs: Observation, n: int = 3) -> list[ProcessRow]:
    """The target's largest, fastest-growing and most major-faulting processes (n of each)."""
    rows = []
    target = obs.target
    # a pid target's number taken by another process (the target exited, issue 42): that process is
    # not the target and is never named as it
    held_by = target.start_ticks if target.kind == "pid" else None
    for pid in scope_pids(obs) & set(obs.processes_last):
        after, before = obs.processes_last[pid], obs.processes_first.get(pid)
        if held_by is not None and after.start_ticks is not None and after.start_ticks != held_by:
            continue
        if before is not None and before.start_ticks != after.start_ticks:
            before = None  # a reused pid: another process
        faults = None
        if before is not None and after.majflt is not None and before.majflt is not None:
            faults = after.majflt - before.majflt
        rows.append(
            ProcessRow(
                pid=pid,
                comm=after.comm,
                rss_first=before.rss if before else None,
                rss_last=after.rss,
                majflt_delta=faults,
                ns_pid=after.ns_pid,
            )
        )
    chosen: dict[int, ProcessRow] = {}
    for key in (lambda r: r.rss_last or 0, lambda r: r.growth, lambda r: r.majflt_delta or 0):
        for r in sorted(rows, key=key, reverse=True)[:n]:
            chosen.setdefault(r.pid, r)
    return sorted(chosen.values(), key=lambda r: r.rss_last or 0, reverse=True)


def build_counters(obs: Observation) -> Counters:
    named = series(obs)
    face = obs.runtime_face()
    kills = relevant_oom_kills(obs)
    return Counters(
        runtime=face.display if face is not None else None,
        labels=dict(face.labels) if face is not None else {},
        rows=_rows(obs),
        trends=trends(named, collapse_counts(obs)),
        series=named,
        oom_kills=kills,
        slab_top=slab_top(obs),
        processes=process_rows(obs),
        swap_devices=[d.model_dump() for d in obs.swaps or []],
        ledgers=build_ledgers(obs),
        shm=build_shm(obs),
        sysv=new_segments(obs),
        oom_ledger=build_oom_ledger(kills),
    )
