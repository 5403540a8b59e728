"""A probe's result as text for the terminal (`memdiag probe NAME`). Every string in the result
(comm, paths, frames, reasons) is shown with its control characters visible: it is the target's to choose."""

from __future__ import annotations

import time

from memdiag.probes.face import ProbeResult
from memdiag.probes.registry import REGISTRY
from memdiag.system.units import fmt_bytes, fmt_duration

from .text import flattened, plain


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
    if r.target_execd_at:
        at = time.strftime("%H:%M:%S", time.localtime(r.target_execd_at))
        lines.append(f"  target exec'd {plain(r.target_exec or 'another program')} at {at}")
    reader = not REGISTRY.spec(r.name).bpf  # it reads the target's memory or maps: no BPF, no trap
    cost = [f"{r.cost.events:,} {'reads' if reader else 'events'}"]
    if r.cost.bpf_run_ns is not None:
        cost.append(f"BPF run time {r.cost.bpf_run_ns / 1e6:.1f} ms")
    if r.cost.map_bytes:
        cost.append(f"maps {fmt_bytes(r.cost.map_bytes)}")
    face = REGISTRY.face(r.name)
    tracing = face.measured(r)
    if tracing is not None and tracing.measured_ns is not None and reader and face.on_target:
        # a command the runtime runs (a recording, a histogram): its CPU, measured on the target
        what = tracing.measure or "the target's CPU time"
        cost.append(
            f"{what} {tracing.measured_ns / 1e6:.1f} ms over {fmt_duration(tracing.attached_s)} "
            f"({tracing.percent_of(tracing.attached_s):.2f}%: measured on the target)"
        )
    elif tracing is not None and tracing.measured_ns is not None and reader:
        cost.append(
            f"memdiag's time in those reads {tracing.measured_ns / 1e6:.1f} ms over {fmt_duration(tracing.attached_s)} "
            f"({tracing.percent_of(tracing.attached_s):.2f}%: an upper bound of how long they held its memory map)"
        )
    elif tracing is not None and tracing.measured_ns is not None:
        cost.append(
            f"the target's time {tracing.measured_ns / 1e6:.1f} ms over {fmt_duration(tracing.attached_s)} "
            f"attached ({tracing.percent_of(tracing.attached_s):.2f}%: hits x trap cost + BPF run time)"
        )
    lines.append("  cost: " + ", ".join(cost))
    lost = {k: v for k, v in r.lost.items() if v}
    if lost:
        lines.append("  lost (not recorded): " + ", ".join(f"{k} {v:,}" for k, v in lost.items()))
    return lines


def render_probe(r: ProbeResult, top: int = 10) -> str:
    """The header every probe shares, then the lines its face's describe() gives (probes/face.py)."""
    r = flattened(r)  # no ESC, newline or other control character from outside reaches the terminal
    lines = _header(r) + REGISTRY.face(r.name).describe(r, top)
    return "\n".join(lines) + "\n"
