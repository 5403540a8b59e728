"""A probe's result as text for the terminal (`memdiag probe NAME`). Every string in the result
(comm, paths, frames, reasons) is shown with its control characters visible: it is the target's to choose."""

from __future__ import annotations

import time

from memdiag.probes.base import ProbeResult
from memdiag.system.units import fmt_bytes, fmt_duration

from .text import flattened


def _header(r: ProbeResult) -> list[str]:
    lines = [f"{r.name}: {r.status}" + (f" ({r.reason})" if r.reason else "")]
    if r.method:
        lines.append(f"  method: {r.method}")
    lines.append(f"  target: {r.target}, {fmt_duration(r.duration_s)} traced")
    if r.interrupted:
        lines.append("  interrupted: stopped by a signal before the end of its window")
    if r.backed_off:
        lines.append("  stopped early: it cost more than its overhead budget allows")
    if r.target_exited_at:
        lines.append(f"  target exited at {time.strftime('%H:%M:%S', time.localtime(r.target_exited_at))}")
    cost = [f"{r.cost.events:,} events"]
    if r.cost.bpf_run_ns is not None:
        cost.append(f"BPF run time {r.cost.bpf_run_ns / 1e6:.1f} ms")
    if r.cost.map_bytes:
        cost.append(f"maps {fmt_bytes(r.cost.map_bytes)}")
    tracing = getattr(r, "tracing_cost", None)
    if tracing is not None and tracing.measured_ns is not None:
        cost.append(
            f"the target's time {tracing.measured_ns / 1e6:.1f} ms over {fmt_duration(tracing.attached_s)} "
            f"attached ({tracing.percent_of(tracing.attached_s):.2f}%: hits x trap cost + BPF run time)"
        )
    lines.append("  cost: " + ", ".join(cost))
    lost = {k: v for k, v in r.lost.items() if v}
    if lost:
        lines.append("  lost (not recorded): " + ", ".join(f"{k} {v:,}" for k, v in lost.items()))
    return lines


def _stack(frames: list[str], indent: str = "      ", depth: int = 8) -> list[str]:
    out = [indent + f for f in frames[:depth]]
    if len(frames) > depth:
        out.append(indent + f"... {len(frames) - depth} more frames")
    return out


def _reach(r) -> str:
    anchor = f"; most from {r.anchor} ({fmt_bytes(r.anchor_bytes)})" if r.anchor else ""
    return (
        f"at the scan: leaked {r.leaked_count:,} blocks ({fmt_bytes(r.leaked_bytes)}, {r.unreferenced_count:,} "
        f"unreferenced), anchored {r.anchored_count:,} ({fmt_bytes(r.anchored_bytes)}){anchor}"
    )


def render_probe(r: ProbeResult, top: int = 10) -> str:
    r = flattened(r)  # no ESC, newline or other control character from outside reaches the terminal
    lines = _header(r)
    name = r.name
    if name in ("faults", "brkstack", "mmapsnoop"):
        for p in getattr(r, "per_process", [])[:top]:
            lines.append(f"  PID {p.pid:>7} {p.comm:<16} {p.faults:>9,} faults  {fmt_bytes(p.bytes)}")
        for s in r.stacks[:top]:  # type: ignore[attr-defined]
            what = f"{s.count:,} faults" if name == "faults" else f"{s.count:,} calls"
            kind = f" {s.kind}" if hasattr(s, "kind") else ""
            lines.append(f"  {fmt_bytes(s.bytes)}{kind} ({what}) PID {s.pid} via {s.method}:")
            lines += _stack(s.frames)
        if name == "mmapsnoop":
            lines.append(f"  mapped {fmt_bytes(r.mapped_bytes)}, unmapped {fmt_bytes(r.unmapped_bytes)}")  # type: ignore[attr-defined]
    elif name == "memleak":
        lines.append(f"  allocator: {r.allocator}" + (f" ({r.allocator_module})" if r.allocator_module else ""))  # type: ignore[attr-defined]
        for p in r.placements:  # type: ignore[attr-defined]
            lines.append(f"    probe on {p}")
        if r.missing_entry_points:  # type: ignore[attr-defined]
            lines.append("    not in this process: " + ", ".join(r.missing_entry_points))  # type: ignore[attr-defined]
        for e in r.attach_errors:  # type: ignore[attr-defined]
            lines.append(f"    could not attach: {e}")
        for s in r.stacks[:top]:  # type: ignore[attr-defined]
            age = f", oldest {fmt_duration(s.oldest_age_s)}" if s.oldest_age_s is not None else ""
            trend = " -> ".join(fmt_bytes(v) for v in s.series[-6:])
            lines.append(
                f"  {fmt_bytes(s.outstanding_bytes)} outstanding in {s.outstanding_count:,} allocations "
                f"({s.allocs:,} allocs, {s.frees:,} frees{age}) PID {s.pid}:"
            )
            lines += _stack(s.frames)
            if trend:
                lines.append(f"      outstanding: {trend}")
            if s.reach is not None:
                lines.append(f"      {_reach(s.reach)}")
        if r.reach_scan is not None:  # type: ignore[attr-defined]
            lines.append(f"  reachability scan: {r.reach_scan.describe()}")  # type: ignore[attr-defined]
        for b in r.big_allocations[:top]:  # type: ignore[attr-defined]
            lines.append(f"  big allocation {fmt_bytes(b.size)} by PID {b.pid} ({b.comm}):")
            lines += _stack(b.frames)
    elif name == "oomkill":
        for k in r.kills:  # type: ignore[attr-defined]
            scope = "cgroup OOM" if k.cgroup_oom else ("system OOM" if k.cgroup_oom is False else "OOM")
            lines.append(
                f"  {scope}: killed {k.victim()}, anon RSS {fmt_bytes(k.anon_rss)}; "
                f"trigger {k.trigger()}; memcg {k.memcg or k.victim_cgroup}, "
                f"limit {fmt_bytes(k.limit)}; host MemAvailable {fmt_bytes(k.mem_available)}"
            )
            if k.outside_namespace:
                lines.append(f"    {k.outside_namespace}")
            lines += _stack(k.trigger_kernel_stack, depth=6)
        if not r.kills:  # type: ignore[attr-defined]
            lines.append("  no OOM kill")
    elif name == "swapin":
        for p in r.processes[:top]:  # type: ignore[attr-defined]
            lines.append(
                f"  PID {p.pid:>7} {p.comm:<16} {p.swapins:>8,} swap-ins  "
                f"{p.file_major_faults:,} file major faults  cgroup {p.cgroup}"
            )
            for g in p.regions[:3]:
                lines.append(f"      {g.start:#x}-{g.end:#x} {g.mapping}: {g.faults:,}")
        for c in r.swap_calls:  # type: ignore[attr-defined]
            lines.append(f"  {c.call} {c.path} by PID {c.pid} ({c.comm})")
        for d in r.swap_devices:  # type: ignore[attr-defined]
            lines.append(f"  swap {d.filename}: {fmt_bytes(d.used)} of {fmt_bytes(d.size)} used")
    elif name == "vmscan":
        lines.append(f"  kswapd wake-ups: {r.kswapd_wakeups:,}")  # type: ignore[attr-defined]
        for x in r.reclaim:  # type: ignore[attr-defined]
            lines.append(f"  {x.kind:<7} {x.events:>8,} events {x.total_ms:>10.1f} ms  {x.pages_reclaimed:,} pages")
            for bucket, n in x.histogram_us.items():
                lines.append(f"      {bucket:>14} us {n:>8,}")
    elif name == "drsnoop":
        for p in r.processes[:top]:  # type: ignore[attr-defined]
            lines.append(
                f"  PID {p.pid:>7} {p.comm:<16} {p.count:>6,} reclaims ({p.memcg_count:,} memcg) "
                f"{p.total_ms:.1f} ms total, max {p.max_ms:.2f} ms, {p.pages_reclaimed:,} pages"
            )
    return "\n".join(lines) + "\n"
