"""The facts of one allocation stack's series (memleak's outstanding bytes, its allocated and
freed bytes) from which the playbook tells a leak's shape from a cache's where no reachability
scan ran (its anchors trend-leak and trend-cache): the series' shape, its rate, the share freed.

Allocations made before the probe attached are invisible to it: a cache full before the probe
started shows a climb while it turns over, which is why the playbook asks RSS to climb for a leak."""

from __future__ import annotations

from memdiag.system._parse import Model
from memdiag.system.trends import growth_trend

# A shape needs this many samples of the series (memleak reads it every ~2 s): fewer is "unknown",
# neither a leak's nor a cache's shape (a trend of two points is a line through them).
MIN_POINTS = 4


class StackTrend(Model):
    shape: str  # climbing, levelled, flat, shrinking, sawtooth, or unknown (too few samples)
    rate_per_s: float | None = None  # the recent rate while climbing, else over the series
    free_ratio: float | None = None  # freed / allocated bytes; None when nothing was allocated


def stack_trend(times: list[float], series: list[int], alloc_bytes: int, freed_bytes: int) -> StackTrend:
    free_ratio = freed_bytes / alloc_bytes if alloc_bytes else None
    points = list(zip(times, series, strict=False))
    if len(points) < MIN_POINTS:
        return StackTrend(shape="unknown", free_ratio=free_ratio)
    tr = growth_trend(points)
    rate = tr.recent_rate_per_s if tr.shape == "climbing" else tr.rate_per_s
    return StackTrend(shape=tr.shape, rate_per_s=rate, free_ratio=free_ratio)
