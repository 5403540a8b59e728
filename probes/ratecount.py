"""A short, bounded count of allocator calls: attach one uprobe on the target's malloc, count for
at most a quarter of a second, and stop at once when the count passes a bound (a hot allocator
then pays for a few thousand traps only). Returns calls per second."""

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
    per_s: float
    stopped_early: bool


def estimate_call_rate(
    pid: int, function: str = "malloc", max_seconds: float = 0.25, max_calls: int = 5000
) -> RateEstimate | None:
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
        while True:
            time.sleep(0.005)
            elapsed = time.monotonic() - start
            n = calls[0].value
            if n >= max_calls or elapsed >= max_seconds:
                break
        for k in list(bpf.uprobe_fds):
            bpf.detach_uprobe_event(k)
        elapsed = time.monotonic() - start
        n = calls[0].value
    finally:
        bpf.cleanup()
    return RateEstimate(
        function=function,
        module=placement.module,
        calls=n,
        seconds=elapsed,
        per_s=n / elapsed if elapsed > 0 else 0.0,
        stopped_early=n >= max_calls,
    )
