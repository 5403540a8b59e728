"""A short, bounded count of allocator calls: attach one uprobe on the target's malloc, count for
at most a quarter of a second, and stop at once when the count passes a bound (a hot allocator
then pays for about a thousand traps only). Returns calls per second."""

from __future__ import annotations

import time

from pydantic import BaseModel

from .allocator import find_allocator
from .base import ProbeUnavailable, load


class RateEstimate(BaseModel):
    function: str
    module: str
    calls: int
    seconds: float
    observed_per_s: float  # while the counting probe slowed every call
    per_s: float  # corrected for that slowdown: the rate without any probe
    stopped_early: bool


def estimate_call_rate(
    pid: int, function: str = "malloc", max_seconds: float = 0.25, max_calls: int = 1000, trap_ns: float | None = None
) -> RateEstimate | None:
    """trap_ns: what one probe hit costs on this host; the count itself slows the target by that
    much per call, so the untraced rate is observed / (1 - observed x trap_ns).

    max_calls: a thousand calls put the rate within a few percent, enough to compare it with a
    budget. The count costs the target a burst of a few milliseconds whatever the bound: measured
    on bench_alloc at 10 thousand allocations/s, 2-8 ms with bounds of 300, 1,000 or 3,000 calls
    (the first hits and the breakpoint's installation, not the count, dominate)."""
    alloc = find_allocator(pid)
    if alloc is None:
        return None
    placement = next((p for p in alloc.placements if p.function == function), None)
    if placement is None:
        return None
    try:
        bpf = load("ratecount", {})
    except ProbeUnavailable:
        return None
    try:
        bpf.attach_uprobe(
            name=placement.module.encode(),
            sym=function.encode(),
            sym_off=placement.offset,
            fn_name=b"count_call",
            pid=pid,
        )
        start = time.monotonic()
        calls = bpf["calls"]
        # The first hits pay one-off set-up (the kernel's out-of-line slot page): measure from the
        # first poll on, not from the attach.
        time.sleep(0.005)
        t0, n0 = time.monotonic(), calls[0].value
        while True:
            time.sleep(0.005)
            elapsed = time.monotonic() - start
            n = calls[0].value
            if n - n0 >= max_calls or elapsed >= max_seconds:
                break
        t1 = time.monotonic()
        n = calls[0].value
        bpf.detach_all()
    finally:
        bpf.cleanup()
    seconds = max(t1 - t0, 1e-6)
    observed = (n - n0) / seconds
    busy = observed * (trap_ns or 0.0) / 1e9  # share of the target's time spent in the probe
    # Trap-bound (the probe took nearly all its time): the true rate is higher than anything
    # measurable this way; the observed rate is a lower bound, which is enough to refuse tracing.
    per_s = observed / (1 - busy) if busy < 0.9 else observed
    return RateEstimate(
        function=function,
        module=placement.module,
        calls=n,
        seconds=seconds,
        observed_per_s=observed,
        per_s=per_s,
        stopped_early=n - n0 >= max_calls,
    )
