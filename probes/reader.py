"""What a probe that reads the target from outside (its memory, its smaps: no BPF, no trap, nothing
stopped) costs the target, at most: the time its reads held the target's memory map for reading.
The target's own page faults share that lock; only its mmap and munmap wait on a read in progress."""

from __future__ import annotations

from .face import ProbeResult, TracingCost


def reads_cost(r: ProbeResult) -> TracingCost | None:
    """The reads' time (the result's read_seconds) as the probe's measured cost, when it ran."""
    if r.status not in ("ok", "partial"):
        return None
    return TracingCost(attached_s=r.duration_s, measured_ns=getattr(r, "read_seconds", 0.0) * 1e9)
