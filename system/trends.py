"""Trends from a series of readings: growth rate, whether growth is still going on or has
levelled off, and counter rates. Pure functions of numbers; no /proc here.

"Still climbing" is decided on the latest third of the window against the earlier growth: a
leak keeps its pace, a cache filling to its bound slows to nothing. A segment counts as
growing only when its growth stands out of the series' own noise (twice the residual spread
around the fitted line) and exceeds a floor of a few pages, so allocator jitter is not growth.
"Levelled" needs a level end (the last samples within the floor of each other): a series still
moving at its end is not level for "0 s". One that fell and grew again (a process OOM-killed and
restarted, a cgroup emptied and refilled) is a sawtooth, whatever its ends say. A sawtooth's troughs
(where each fall ended) and peaks (where each began) say whether it is bounded: troughs that come
back to the same base, under peaks that do not rise, are memory taken and given back (a batch, a
GC cycle); troughs that rise out of their own noise are growth in steps with partial frees."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import ConfigDict

from ._parse import Model

# Below this, a change in resident memory is allocator and page-cache jitter, not growth.
MIN_GROWTH_BYTES = 256 * 1024
# A segment growing at under this share of the fastest earlier pace has "levelled off".
LEVEL_OFF_RATIO = 0.25

Shape = Literal["climbing", "levelled", "sawtooth", "flat", "shrinking", "unknown"]
# a sawtooth's base: "level" (its troughs came back within the floor of the lowest earlier one and
# no peak rose above the earlier ones), "rising" (they did not); None: no sawtooth, or one fall only
Base = Literal["level", "rising"]


class Trend(Model):
    model_config = ConfigDict(frozen=True)

    shape: Shape
    first: float | None = None
    last: float | None = None
    low: float | None = None
    peak: float | None = None
    delta: float | None = None
    seconds: float | None = None
    rate_per_s: float | None = None  # least-squares slope over the whole window
    recent_rate_per_s: float | None = None  # slope over the latest third
    recent_seconds: float | None = None  # how long that latest third is
    peak_rate_per_s: float | None = None  # fastest slope over any third of the window
    levelled_for_s: float | None = None  # how long the end of the series has stayed level
    troughs: list[float] | None = None  # a sawtooth's: the low each fall reached, in order
    peaks: list[float] | None = None  # a sawtooth's: the high each fall began from, in order
    base: Base | None = None  # whether a sawtooth's troughs and peaks stayed put (two falls or more)


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope (units per second) of (t, value) points."""
    n = len(points)
    if n < 2:
        return 0.0
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    den = sum((t - mt) ** 2 for t, _ in points)
    if den == 0:
        return 0.0
    return sum((t - mt) * (v - mv) for t, v in points) / den


def _residual_spread(points: list[tuple[float, float]]) -> float:
    n = len(points)
    if n < 3:
        return 0.0
    k = slope(points)
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    residuals = [v - (mv + k * (t - mt)) for t, v in points]
    return math.sqrt(sum(r * r for r in residuals) / (n - 2))


def _grows(points: list[tuple[float, float]], floor: float) -> bool:
    if len(points) < 2:
        return False
    rise = slope(points) * (points[-1][0] - points[0][0])
    return rise > max(floor, 2 * _residual_spread(points))


def growth_trend(points: list[tuple[float, float]], floor: float = MIN_GROWTH_BYTES) -> Trend:
    """Classify a series of (t, bytes): climbing, levelled (grew, then stopped), flat, shrinking."""
    if len(points) < 3:
        return Trend(shape="unknown", first=points[0][1] if points else None, last=points[-1][1] if points else None)
    values = [v for _, v in points]
    seconds = points[-1][0] - points[0][0]
    third = max(3, len(points) // 3)
    windows = [points[i : i + third] for i in range(0, len(points) - third + 1)]
    peak_rate = max(slope(w) for w in windows)
    recent = points[-third:]
    recent_rate = slope(recent)
    delta = values[-1] - values[0]
    base = dict(
        first=values[0],
        last=values[-1],
        low=min(values),
        peak=max(values),
        delta=delta,
        seconds=seconds,
        rate_per_s=slope(points),
        recent_rate_per_s=recent_rate,
        recent_seconds=recent[-1][0] - recent[0][0],
        peak_rate_per_s=peak_rate,
    )
    spread = max(values) - min(values)
    if spread <= floor:
        return Trend(shape="flat", levelled_for_s=seconds, **base)
    climbing = _grows(recent, floor) and recent_rate >= LEVEL_OFF_RATIO * peak_rate
    # climbing to new highs, whatever fell on the way: higher than anything before the latest third
    # (a Go heap rising back from a GC to the peak it reached before, 6.8 to 6.8 MiB, is no new high)
    new_high = max(values[-third:]) - max(values[:-third] or values[:1]) > floor
    if climbing and values[-1] >= max(values) - floor and new_high:
        return Trend(shape="climbing", **base)
    if _fell_and_rose(values, floor):  # climbing again below an earlier peak: a kill or a flush between
        peaks, troughs = _falls(points, floor)
        shape = _base(peaks, troughs, floor)
        return Trend(shape="sawtooth", peaks=[v for _, v in peaks], troughs=[v for _, v in troughs], base=shape, **base)
    if climbing:
        return Trend(shape="climbing", **base)
    if delta > floor:
        level = _level_duration(points, floor)
        # Slower than before but still moving at the end: not level, so still climbing.
        return Trend(shape="levelled", levelled_for_s=level, **base) if level > 0 else Trend(shape="climbing", **base)
    if delta < -floor:
        return Trend(shape="shrinking", **base)
    return Trend(shape="flat", levelled_for_s=seconds, **base)


def _fell_and_rose(values: list[float], floor: float) -> bool:
    """The series fell more than the floor below an earlier peak, then rose more than the floor again."""
    peak, low, fell = values[0], values[0], False
    for v in values[1:]:
        if not fell:
            peak = max(peak, v)
            if peak - v > floor:
                fell, low = True, v
        elif v - low > floor:
            return True
        else:
            low = min(low, v)
    return False


Point = tuple[float, float]


def _falls(points: list[Point], floor: float) -> tuple[list[Point], list[Point]]:
    """Each fall of more than the floor that the series rose again from (more than the floor): the
    peak it began from and the trough it reached, as (t, value)."""
    peaks: list[Point] = []
    troughs: list[Point] = []
    peak, low, falling = points[0], points[0], False
    for p in points[1:]:
        if not falling:
            peak = max(peak, p, key=lambda q: q[1])
            if peak[1] - p[1] > floor:
                falling, low = True, p
        elif p[1] - low[1] > floor:  # rose again: that fall is over
            peaks.append(peak)
            troughs.append(low)
            falling, peak = False, p
        elif p[1] < low[1]:
            low = p
    return peaks, troughs  # a fall the series ended in is left out: its low may not be its trough


def _base(peaks: list[Point], troughs: list[Point], floor: float) -> Base | None:
    """Rising where the troughs rise (by more than the floor, with a slope that stands out of their
    own scatter) or the last trough stands more than the floor above every earlier one (a step that
    partial frees leave behind), or the peaks rise so (a high that keeps rising); level otherwise:
    memory given back to the same base, up to the same high. A peak is only where a sample caught
    the rise (a batch of a second or two is read anywhere on its way up: 13.6, 17.6 then 49.6 MiB of
    one 48 MiB batch), so no single peak above the earlier ones says it rose. One fall says nothing
    of a base."""
    if len(troughs) < 2:
        return None
    if _rises(troughs, floor) or _above_earlier(troughs, floor) or _rises(peaks, floor):
        return "rising"
    return "level"


# Student's t at 95% (two-sided) by degrees of freedom: troughs are few (one a fall), too few for
# twice their residual spread to stand for their noise as it does for a series read every second
# (three troughs of a Go program's RSS jittering by 0.8 MiB around one base passed it as rising)
T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23}


def _rises(points: list[Point], floor: float) -> bool:
    """The least-squares rise over the points is over the floor and its slope is told from zero at
    95% confidence (its t statistic over Student's t): a trend, not scatter."""
    n = len(points)
    if n < 3:
        return False
    k = slope(points)
    if k * (points[-1][0] - points[0][0]) <= floor:
        return False
    mt = sum(t for t, _ in points) / n
    spread = _residual_spread(points) / math.sqrt(sum((t - mt) ** 2 for t, _ in points))
    return spread == 0 or k / spread > T95.get(n - 2, 2.0)


def _above_earlier(points: list[Point], floor: float) -> bool:
    return points[-1][1] - max(v for _, v in points[:-1]) > floor


def _level_duration(points: list[tuple[float, float]], floor: float) -> float:
    """Seconds at the end of the series during which the value stayed within the floor of its last."""
    last_t, last_v = points[-1]
    start = last_t
    for t, v in reversed(points):
        if abs(v - last_v) > floor:
            break
        start = t
    return last_t - start


def counter_rate(first: int | None, last: int | None, seconds: float) -> float | None:
    """Per-second rate of a cumulative counter; None when unknown. A reset counts from zero."""
    if first is None or last is None or seconds <= 0:
        return None
    delta = last - first if last >= first else last
    return delta / seconds
