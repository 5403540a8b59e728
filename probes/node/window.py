"""V8's heap over the whole window, read with every sample of it (the Node runtime face's sample):
its committed size, the writable mappings V8 placed below 64 TiB (system/v8memory.py), from
/proc/PID/maps (no page-table walk, unlike the nodeheap probe's smaps), and the facts the playbook
reads of it.

The facts read its floor: at each sample, the least V8 held committed from then on. V8 maps pages
for a large object (a Map's or an array's backing store, copied as it grows) and unmaps them at the
next collection, and sizes its young generation up and down, so the committed size rises and falls
within a window whatever the program keeps; what every later collection still left committed only
climbs where the old generation does, that is where the program keeps what it allocated. Five reads
of smaps over 8 s (nodeheap) called a Map of closures that grew 1 MB/s "levelled". V8 sizes its
young generation up in a few large steps (to 16 MiB a semispace), once, as a program's allocation
rate asks: a JSON churn's committed heap stepped up 32 MiB in the last 3 s of a window. So what the
playbook reads is whether the floor grew in each third of the window (node.v8_heap_floor_steady):
retention keeps adding old-generation pages, a step is once, and a bounded structure stops. (Its
shape, node.v8_heap_floor_trend, can read "levelled" for a heap that kept growing: a collection that
compacts the old generation near the window's end lowers the floor of every sample before it; the
kit's Map of closures read so once.)"""

from __future__ import annotations

import itertools
from pathlib import Path

from memdiag.system._parse import Fact
from memdiag.system.trends import MIN_GROWTH_BYTES, growth_trend

from ..face import FactDef

MIN_POINTS = 4

FACTS = (
    FactDef("node.v8_heap_committed", "bytes", "V8's heap committed at the window's last sample (from maps)"),
    FactDef("node.v8_heap_floor_growth", "bytes",
            "how much the least V8's heap held committed from each sample on grew over the window: what its "
            "collections kept"),
    FactDef("node.v8_heap_floor_trend", "string",
            "the shape of that floor over the window: climbing (the old generation keeps what the program "
            "allocates), levelled, flat"),
    FactDef("node.v8_heap_floor_steady", "bool",
            "that floor grew in each third of the window (a heap that keeps what it allocates), not in a "
            "step (V8 sizing its young generation up) nor only while a bounded structure filled; or, where V8 "
            "collected seldom, each collection (one in the first half, one in the last third) left more than the "
            "one before", figure=False),
)  # fmt: skip


class V8HeapSample(Fact):
    mapped: int  # bytes V8 mapped writable for its heap (committed)


def read_sample(pid: int, proc_root: Path = Path("/proc")) -> V8HeapSample | None:
    from memdiag.system.v8memory import read_v8_heap_ranges

    ranges = read_v8_heap_ranges(pid, proc_root)
    return None if ranges is None else V8HeapSample(mapped=sum(end - start for start, end in ranges))


def _points(samples) -> list[tuple[float, int]]:
    return [(t, s.mapped) for t, s in samples if isinstance(s, V8HeapSample)]


def floor(values: list[int]) -> list[int]:
    """At each point, the least value from it on."""
    out, low = [], None
    for v in reversed(values):
        low = v if low is None else min(low, v)
        out.append(low)
    return out[::-1]


def facts_of(samples, _pid: int | None) -> dict:
    points = _points(samples)
    if not points:
        return {}
    f: dict = {"node.v8_heap_committed": points[-1][1]}
    if len(points) >= MIN_POINTS:
        low = floor([v for _, v in points])
        f["node.v8_heap_floor_growth"] = low[-1] - low[0]
        f["node.v8_heap_floor_trend"] = growth_trend([(t, v) for (t, _), v in zip(points, low, strict=True)]).shape
        t0, span = points[0][0], points[-1][0] - points[0][0]
        cuts = [0, *(next(i for i, (t, _) in enumerate(points) if t >= t0 + k * span / 3) for k in (1, 2)), -1]
        thirds = all(low[b] - low[a] > MIN_GROWTH_BYTES for a, b in itertools.pairwise(cuts))
        f["node.v8_heap_floor_steady"] = thirds or _kept_more_at_each_collection(points, t0, span)
    return f


def _kept_more_at_each_collection(points: list[tuple[float, int]], t0: float, span: float) -> bool:
    """Where V8 collected seldom (a busy host: fewer idle-time collections), a third may hold no
    collection at all, and a collection late in the window pins the floor of every sample before it:
    the kit's Map of closures, under load, fell to 12.4 MiB at 6.6 s and to 32.2 MiB at 29.6 s of 40 s
    and read not steady for its middle third. What each collection left (the committed size just after
    it fell) is then read itself: at least two, one in the window's first half and one in its last third,
    each higher than the one before. A step of the young generation between two collections reads as
    growth here (two collections cannot tell them apart); a third collection that kept no more does not."""
    after = [(t, v) for (_, prev), (t, v) in itertools.pairwise(points) if prev - v > MIN_GROWTH_BYTES]
    if len(after) < 2 or after[0][0] > t0 + span / 2 or after[-1][0] < t0 + 2 * span / 3:
        return False
    return all(b - a > MIN_GROWTH_BYTES for (_, a), (_, b) in itertools.pairwise(after))


def series(samples, t0: float) -> dict[str, list[tuple[float, float]]]:
    """V8's committed heap, and its floor (what the facts read: its change is node.v8_heap_floor_growth,
    so the figure a verdict quotes is a row of the report's Trends table)."""
    points = _points(samples)
    if not points:
        return {}
    at = [round(t - t0, 3) for t, _ in points]
    low = floor([v for _, v in points])
    return {
        "v8_heap": [(t, v) for t, (_, v) in zip(at, points, strict=True)],
        "v8_heap_floor": list(zip(at, low, strict=True)),
    }
