"""The shape of a series a Go runtime estimates from samples (its heap profile's in-use bytes, at
each GC), told from the sampling's own noise by the slope's standard error, not by a floor.

The runtime samples one allocation per MemProfileRate bytes on average (a Poisson process) and
scales each sample up, so an estimate resting on B bytes of objects that are replaced (frees, new
allocations drawn anew) varies by about sqrt(B * rate): a bounded cache of 94 MiB read between
80.2 and 108.7 MiB over twelve GCs at 512 KiB. What is never freed keeps its samples, so a held
set's estimate only grows as it does. A least-squares slope counts as a trend when it stands out
of the noise: more than t (Student's, 97.5%, n - 2 degrees of freedom) standard errors from zero,
the noise being the larger of the series' own scatter around the line and the sampling's model.
Exact counts (goroutines) take the same test with no model noise."""

from __future__ import annotations

import math

from memdiag.system.trends import LEVEL_OFF_RATIO, slope

MIN_POINTS = 4
# Student's t at 97.5% (two-sided 95%) by degrees of freedom; 1.96 past the table
_T = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23, 15: 2.13, 20: 2.09}


def _t(df: int) -> float:
    known = [d for d in _T if d <= df]
    return _T[max(known)] if known and df <= 20 else 1.96


def _fit(points: list[tuple[float, float]], model_var: float) -> tuple[float, float]:
    """(slope, its standard error) of points, the noise the larger of residuals and model."""
    b = slope(points)
    n = len(points)
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    sxx = sum((t - mt) ** 2 for t, _ in points)
    if sxx == 0:
        return 0.0, math.inf
    resid = sum((v - (mv + b * (t - mt))) ** 2 for t, v in points) / max(n - 2, 1)
    return b, math.sqrt(max(resid, model_var) / sxx)


def sampled_shape(
    times: list[float], series: list[float], replaced: float = 0.0, rate: int = 0, least: float = 0.0
) -> str:
    """climbing, levelled (rose, then stopped), flat, shrinking or unknown (fewer than four points).
    replaced: bytes replaced while the series ran (their samples redrawn), rate: bytes per sample
    (0: an exact count); least: a change under this is none whatever the slope (two samples'
    worth for an estimate, a couple for a count)."""
    if len(series) < MIN_POINTS:
        return "unknown"
    points = list(zip(times, series, strict=False))
    model_var = rate * max(0.0, min(replaced, max(series)))  # the estimate's own variance, per point
    b, se = _fit(points, model_var)
    span = times[-1] - times[0]
    if abs(b) * span <= least or abs(b) <= _t(len(points) - 2) * se:
        return "flat"
    if b < 0:
        return "shrinking"
    # levelled: the latest half rises at under a quarter of the whole's pace (the counters' own
    # LEVEL_OFF_RATIO), slower beyond its noise (a cache filled, then held); a program merely
    # slowed down (a busy host: 1.9 MiB/s, then 1.2) still climbs
    later = points[len(points) // 2 :] if len(points) >= 6 else points[-3:]
    b_late, se_late = _fit(later, model_var)
    stopped = b_late < LEVEL_OFF_RATIO * b and b - b_late > _t(len(later) - 2) * se_late
    return "levelled" if stopped else "climbing"
