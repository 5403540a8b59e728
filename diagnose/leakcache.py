"""Leak, cache or growth, for one allocation stack, from memleak's series of outstanding bytes and
its allocation and free counts.

- leak: outstanding bytes keep climbing to the end of the window and the stack frees little of
  what it allocates (under half), while the process's resident memory climbs too: a leak never
  levels off, and it shows in RSS;
- cache: outstanding bytes grew and levelled off, or churn at a bound (the stack frees about as
  much as it allocates once full);
- growth: climbing but freeing much, or too little time or too few samples to tell: the trend is
  given with how long to keep watching.
Allocations made before the probe attached are invisible to it: a cache full before the probe
started shows a climb while it turns over, which is why RSS must climb for a leak."""

from __future__ import annotations

from typing import Literal

from memdiag.system.units import fmt_duration
from pydantic import BaseModel

from .trends import growth_trend

Shape = Literal["leak", "cache", "growth", "none"]
LEAK_MAX_FREE_RATIO = 0.5
MIN_POINTS = 4


class StackTrend(BaseModel):
    shape: Shape
    rate_per_s: float | None = None
    free_ratio: float | None = None
    confidence: float = 0.0
    reason: str = ""
    watch_more_s: float | None = None


def classify(
    times: list[float], series: list[int], alloc_bytes: int, freed_bytes: int, process_shape: str | None
) -> StackTrend:
    points = list(zip(times, series, strict=False))
    free_ratio = freed_bytes / alloc_bytes if alloc_bytes else None
    if len(points) < MIN_POINTS or not series or max(series) == 0:
        span = points[-1][0] - points[0][0] if len(points) > 1 else 0.0
        return StackTrend(
            shape="none" if not series or max(series) == 0 else "growth",
            free_ratio=free_ratio,
            reason=f"{len(points)} samples over {fmt_duration(span)}: too few to tell",
            watch_more_s=max(10.0, 2 * span),
        )
    tr = growth_trend(points)
    rate = tr.recent_rate_per_s if tr.shape == "climbing" else tr.rate_per_s
    if tr.shape == "climbing":
        rss_climbs = process_shape in (None, "climbing", "unknown")
        if (free_ratio or 0.0) < LEAK_MAX_FREE_RATIO and rss_climbs:
            conf = min(0.95, 0.6 + 0.02 * (tr.seconds or 0))
            return StackTrend(
                shape="leak",
                rate_per_s=rate,
                free_ratio=free_ratio,
                confidence=conf,
                reason=f"outstanding bytes climbed through the whole window and only "
                f"{100 * (free_ratio or 0):.0f}% of what it allocated was freed",
            )
        why = (
            "it frees much of what it allocates"
            if (free_ratio or 0) >= LEAK_MAX_FREE_RATIO
            else "the process's resident memory does not climb: tracked blocks replace ones allocated "
            "before the probe (a full cache turning over)"
        )
        if (free_ratio or 0) >= LEAK_MAX_FREE_RATIO and not rss_climbs:
            return StackTrend(
                shape="cache", rate_per_s=rate, free_ratio=free_ratio, confidence=0.6, reason=f"churns: {why}"
            )
        return StackTrend(
            shape="growth",
            rate_per_s=rate,
            free_ratio=free_ratio,
            confidence=0.5,
            reason=f"outstanding bytes climb but {why}",
            watch_more_s=2 * (tr.seconds or 10),
        )
    if tr.shape == "levelled":
        return StackTrend(
            shape="cache",
            rate_per_s=rate,
            free_ratio=free_ratio,
            confidence=0.75,
            reason=f"outstanding bytes grew then levelled off for {fmt_duration(tr.levelled_for_s)}",
        )
    if tr.shape == "flat" and free_ratio is not None and free_ratio > 0.9 and series[-1] > 0:
        return StackTrend(
            shape="cache",
            rate_per_s=rate,
            free_ratio=free_ratio,
            confidence=0.6,
            reason="churns at a bound: frees as much as it allocates",
        )
    return StackTrend(shape="none", rate_per_s=rate, free_ratio=free_ratio, reason=f"outstanding bytes {tr.shape}")
