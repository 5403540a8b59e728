"""report.md's counter evidence, the figures read from /proc and /sys over the window: the sampled
series' trends, the counter tables (process, cgroup, system, the runtime's), the target's processes,
its OOM kills, the kernel's slab caches and the swap devices."""

from __future__ import annotations

from memdiag.system.meminfo import MEMINFO_KEYS
from memdiag.system.units import fmt_bytes, fmt_number, fmt_rate

from ..report import CounterRow, Report
from .ledger_md import ledger_evidence
from .mdtable import table, utc
from .sparkline import sparkline

_SERIES_LABELS = {
    "process.rss": "process RSS",
    "process.rss_anon": "process anon RSS",
    "process.vm_swap": "process swap",
    "cgroup.usage": "cgroup usage",
    "system.mem_available": "system MemAvailable",
}

# Counter names as the kernel files and tools call them.
_COUNTER_LABELS = {
    "rss": "RSS (VmRSS)",
    "rss_anon": "RSS anon (RssAnon)",
    "rss_file": "RSS file (RssFile)",
    "rss_shmem": "RSS shmem (RssShmem)",
    "vm_swap": "swapped out (VmSwap)",
    "vm_hwm": "peak RSS (VmHWM)",
    "vm_size": "VSZ (VmSize)",
    "pss": "PSS",
    "threads": "threads",
    "minflt": "minor faults",
    "majflt": "major faults",
    "usage": "usage",
    "effective_limit": "limit (lowest up the tree)",
    "high": "high",
    "max_usage": "peak usage",
    "swap_usage": "swap usage",
    "swap_limit": "swap limit",
    "failcnt": "limit hits (failcnt / events max)",
    "workingset_refault_file": "file pages refaulted (workingset_refault_file)",
    "oom": "OOM events",
    "oom_kill": "OOM kills",
    "anon": "anonymous (memory.stat)",
    "file": "page cache (memory.stat)",
    **MEMINFO_KEYS,  # system rows: the /proc/meminfo names themselves
    "psi_some_avg10": "PSI some avg10",
    "psi_some_avg60": "PSI some avg60",
    "psi_full_avg10": "PSI full avg10",
    "psi_full_avg60": "PSI full avg60",
    "psi_some_window": "PSI some over the window",
    "psi_full_window": "PSI full over the window",
}


def _cell(row: CounterRow, value: float | None) -> str:
    if value is None:
        return "–"
    if row.unit == "bytes":
        return fmt_bytes(value)
    if row.unit == "percent":
        return f"{value:.1f}%"
    return fmt_number(value)


def _rate(row: CounterRow) -> str:
    if row.rate_per_s is None:
        if row.first is None or row.last is None or row.last == row.first:
            return ""
        sign = "+" if row.last > row.first else ""
        if row.unit == "bytes":
            return f"{sign}{fmt_bytes(row.last - row.first)}"
        return f"{sign}{fmt_number(row.last - row.first)}" if row.unit == "count" else ""
    suffix = {"pages_per_s": " pages/s", "bytes_per_s": " B/s"}.get(row.unit, "/s")
    return f"{fmt_number(row.rate_per_s)}{suffix}"


def _process_cell(r, in_container: bool) -> str:
    inside = f", PID {r.ns_pid} in the container" if in_container and r.ns_pid not in (None, r.pid) else ""
    return f"PID {r.pid} ({r.comm}){inside}"


def _processes(report: Report) -> list[str]:
    """The target's processes the lists quote (largest, fastest growing, paying in major faults)."""
    rows = report.counters.processes
    if not rows:
        return []
    t = report.target
    scope = {"pid": "the target", "cgroup": "in the cgroup", "system": "memdiag's own left out"}[t.kind]
    if t.kind == "cgroup" and (t.container is not None or t.pod is not None):
        scope = "in the container" if t.container is not None else "in the pod"
    in_container = t.container is not None or t.pod is not None
    cells = [
        [
            _process_cell(r, in_container),
            fmt_bytes(r.rss_first) if r.rss_first is not None else "– (started in the window)",
            fmt_bytes(r.rss_last),
            f"{'+' if r.growth > 0 else ''}{fmt_bytes(r.growth)}",
            fmt_number(r.majflt_delta) if r.majflt_delta is not None else "–",
        ]
        for r in rows
    ]
    head = ["process", "RSS first", "RSS last", "change", "major faults"]
    return [f"### Processes ({scope})", ""] + table(head, cells) + [""]


# Shapes no rate describes: a series that levelled off (a cache at its bound: once shown growing
# 64.8 MiB/min, its average over the window) or rose and fell. Their figures are where it levelled
# and between what it moved (first, last, the sentence of the finding); the rate stays in report.json.
_NO_RATE_SHAPES = ("levelled", "sawtooth")


def _trend_rate(tr) -> str:
    if tr.rate_per_s is None:
        return "–"
    if tr.shape in _NO_RATE_SHAPES:
        return f"– ({tr.shape})"
    return fmt_rate(tr.rate_per_s)


def _trends(report: Report) -> list[str]:
    trends = report.counters.trends
    if not trends:
        return []
    rows = []
    for name, tr in trends.items():
        values = [value for _, value in report.counters.series.get(name, [])]
        rows.append(
            [
                _SERIES_LABELS.get(name) or report.counters.labels.get(name, name),
                fmt_bytes(tr.first),
                fmt_bytes(tr.last),
                fmt_bytes(tr.delta) if tr.delta is not None else "–",
                _trend_rate(tr),
                f"{tr.shape} ({tr.base} base)" if tr.base else tr.shape,
                f"`{sparkline(values)}`" if values else "",
            ]
        )
    return ["### Trends", ""] + table(["series", "first", "last", "change", "rate", "shape", "trend"], rows) + [""]


def _counter_tables(report: Report) -> list[str]:
    lines = []
    runtime = report.counters.runtime or "Runtime"
    for scope, title in (
        ("process", "Process"),
        ("cgroup", "Memory cgroup"),
        ("system", "System"),
        ("runtime", runtime),
    ):
        scoped = [r for r in report.counters.rows if r.scope == scope]
        if not scoped:
            continue
        lines += [f"### {title} counters", ""]
        lines += table(
            ["counter", "first", "last", "change / rate"],
            [[_counter_label(report, r), _cell(r, r.first), _cell(r, r.last), _rate(r)] for r in scoped],
        ) + [""]
    return lines


def _counter_label(report: Report, row: CounterRow) -> str:
    """A counter as the kernel or the runtime's own face names it (a runtime's names are its own)."""
    labels = report.counters.labels if row.scope == "runtime" else _COUNTER_LABELS
    return labels.get(row.name, row.name)


def _oom_kills(report: Report) -> list[str]:
    if not report.counters.oom_kills:
        return []
    return (
        ["### OOM kills", ""]
        + table(
            ["time", "victim", "constraint", "memory cgroup", "trigger", "anon RSS", "file RSS"],
            [
                [
                    utc(k.when),
                    f"PID {k.victim_pid} ({k.victim_comm})",
                    k.constraint or "–",
                    k.oom_memcg or k.task_memcg or "–",
                    f"{k.trigger_comm} (PID {k.trigger_pid})" if k.trigger_pid else (k.trigger_comm or "–"),
                    fmt_bytes(k.anon_rss),
                    fmt_bytes(k.file_rss),
                ]
                for k in report.counters.oom_kills
            ],
        )
        + [""]
    )


def _slab(report: Report) -> list[str]:
    if not report.counters.slab_top:
        return []
    return (
        ["### Kernel slab caches (top growth)", ""]
        + table(
            ["cache", "first", "last", "change"],
            [
                [s.name, fmt_bytes(s.first_bytes), fmt_bytes(s.last_bytes), fmt_bytes(s.last_bytes - s.first_bytes)]
                for s in report.counters.slab_top
            ],
        )
        + [""]
    )


def _swap_devices(report: Report) -> list[str]:
    lines = ["### Swap devices", ""]
    if not report.counters.swap_devices:
        return lines + ["No swap is configured.", ""]
    return (
        lines
        + table(
            ["device", "type", "size", "used"],
            [
                [d["filename"], d["type"], fmt_bytes(d["size"]), fmt_bytes(d["used"])]
                for d in report.counters.swap_devices
            ],
        )
        + [""]
    )


def counter_evidence(report: Report) -> list[str]:
    """Trends, counters, processes, OOM kills, slab, swap: the evidence's part the counters make."""
    return (
        _trends(report)
        + ledger_evidence(report)
        + _counter_tables(report)
        + _processes(report)
        + _oom_kills(report)
        + _slab(report)
        + _swap_devices(report)
    )
