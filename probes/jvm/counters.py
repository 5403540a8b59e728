"""A JVM target's heap over the window, from its own counters (hsperfdata) and its RSS split
(smaps), read with every sample of the window (the JVM's runtime face, probes/jvm/__init__.py):
the facts the playbook reads (jvm.*), the counters table, the live set's series and the report's
section on them. Facts only; what they mean is the playbook's.

The live set is what the heap holds just after collections: every space but eden (old and
survivors, which only a collection fills), as the counters say at each sample; for a heap of one
space (ZGC, Shenandoah), its use at the samples that follow a collection. Under G1 it includes
old objects that died since the last marking (the flight recorder tells those apart). The GC share
is the time of collection pauses over the window's time; where the RSS grew, the share of that
growth inside the heap's address range says whether the growth is the Java heap's or native."""

from __future__ import annotations

from memdiag.system.jvm import JvmCounters, JvmMemory, JvmSample
from memdiag.system.trends import growth_trend
from memdiag.system.units import fmt_bytes

from ..face import Section
from ..runtime import RuntimeRow


def _counted(samples: list[tuple[float, JvmSample]]) -> list[tuple[float, JvmCounters]]:
    return [(t, j.counters) for t, j in samples if j.counters is not None]


def live_points(counted: list[tuple[float, JvmCounters]]) -> list[tuple[float, float]]:
    """(time, bytes in use after the collection) at each sample that follows a collection: one
    point per collection seen (the readings between two collections repeat the last, which a
    trend would take for a level). With spaces apart, only collections that moved objects count:
    a G1 remark pause left the 2 MiB/s leak's last point repeated to the byte (47,370,752 seven
    seconds apart), and the live set "levelled"."""
    out: list[tuple[float, float]] = []
    previous: JvmCounters | None = None
    for t, c in counted:
        first = previous is None
        if c.after_gc_used is not None:
            collected = c.evacuations > (0 if previous is None else previous.evacuations)
        else:
            collected = c.gc_count > (0 if previous is None else previous.gc_count)
        previous = c
        if not collected:
            continue
        if c.after_gc_used is not None:  # at the first sample: what the last collection before it left
            out.append((t, float(c.after_gc_used)))
        elif not first and c.heap_used is not None:  # one space (ZGC, Shenandoah): its use just after
            out.append((t, float(c.heap_used)))
    return out


def _share(part: float | None, whole: float | None) -> float | None:
    return 100 * part / whole if part is not None and whole else None


def _gc_share(counted: list[tuple[float, JvmCounters]]) -> float | None:
    if len(counted) < 2 or counted[-1][0] <= counted[0][0]:
        return None
    (t0, a), (t1, b) = counted[0], counted[-1]
    return 100 * max(0.0, b.gc_time_s - a.gc_time_s) / (t1 - t0)


def jvm_facts(samples: list[tuple[float, JvmSample]], _pid: int | None = None) -> dict:
    """The jvm.* facts of a JVM target over its samples; {} without any."""
    if not samples:
        return {}
    counted = _counted(samples)
    if not counted:
        return {"jvm.counters": False, "jvm.counters_missing": samples[-1][1].missing}
    first, last = counted[0][1], counted[-1][1]
    live = growth_trend(live_points(counted))
    third = counted[-max(2, len(counted) // 3) :]
    f: dict = {
        "jvm.counters": True,
        "jvm.heap_max": last.heap_max,
        "jvm.heap_committed": last.heap_committed,
        "jvm.heap_used": last.heap_used,
        "jvm.live_set": live.last,
        "jvm.live_set_first": live.first,
        "jvm.live_set_growth": live.delta,
        "jvm.live_set_rate": live.rate_per_s,
        "jvm.live_set_shape": live.shape,
        "jvm.live_set_percent": _share(live.last, last.heap_max),
        "jvm.gc_count": last.gc_count - first.gc_count,
        "jvm.full_gc_count": last.full_gc_count - first.full_gc_count,
        "jvm.gc_share": _gc_share(counted),
        "jvm.gc_share_recent": _gc_share(third),
        "jvm.last_cause": last.last_cause,
        "jvm.metaspace": last.metaspace_committed,
        "jvm.metaspace_growth": _delta(first.metaspace_committed, last.metaspace_committed),
    }
    f.update(_rss_split_facts([j.memory for _, j in samples if j.memory is not None]))
    return f


def _delta(a: int | None, b: int | None) -> int | None:
    return b - a if a is not None and b is not None else None


def _rss_split_facts(mems: list[JvmMemory]) -> dict:
    """Where the RSS went between the first and the last sample: inside the heap's range or not."""
    if not mems or mems[0].heap is None or mems[-1].heap is None:
        return {}
    a, b = mems[0], mems[-1]
    grew = b.rss - a.rss
    heap = b.heap - a.heap  # type: ignore[operator]
    return {
        "jvm.heap_rss": b.heap,
        "jvm.heap_rss_growth": heap,
        "jvm.outside_rss": b.outside,
        "jvm.outside_rss_growth": grew - heap,
        "jvm.heap_growth_share": 100 * heap / grew if grew > 0 else None,
    }


# --- the report's tables ---------------------------------------------------------------------------


def jvm_series(samples: list[tuple[float, JvmSample]], t0: float) -> dict[str, list[tuple[float, float]]]:
    """The live set after each collection, for the Trends table (seconds from t0, the window's first sample)."""
    points = live_points(_counted(samples))
    return {"jvm.live_set": [(round(t - t0, 3), v) for t, v in points]} if points else {}


def jvm_rows(samples: list[tuple[float, JvmSample]]) -> list[RuntimeRow]:
    """The JVM counters table: the figures the jvm.* facts state."""
    counted = _counted(samples)
    if not counted:
        return []
    a, b = counted[0][1], counted[-1][1]
    f = jvm_facts(samples)
    rows = [
        RuntimeRow(name=n, unit="bytes", first=getattr(a, n), last=getattr(b, n))
        for n in ("heap_max", "heap_committed", "heap_used", "metaspace_committed")
    ]
    rows += [
        RuntimeRow(name=n, unit="count", first=getattr(a, n), last=getattr(b, n)) for n in ("gc_count", "full_gc_count")
    ]
    rows += [
        RuntimeRow(name=n, unit="percent", last=f.get(f"jvm.{n}"))
        for n in ("live_set_percent", "gc_share", "gc_share_recent", "heap_growth_share")
    ]
    mems = [j.memory for _, j in samples if j.memory is not None]
    if mems and mems[0].heap is not None and mems[-1].heap is not None:
        rows += [
            RuntimeRow(name="heap_rss", unit="bytes", first=mems[0].heap, last=mems[-1].heap),
            RuntimeRow(name="outside_rss", unit="bytes", first=mems[0].outside, last=mems[-1].outside),
        ]
    return rows


_PARTS = (
    ("Java heap", "heap"),
    ("JIT-compiled code", "code"),
    ("thread stacks", "stacks"),
    ("metaspace (committed)", "metaspace"),
    ("mapped files (libjvm, modules, CDS)", "files"),
    ("other native (malloc: libjvm, JNI; GC data, direct buffers)", "other"),
)


def jvm_sections(samples: list[tuple[float, JvmSample]]) -> list[Section]:
    """Which JVM, and where its resident memory is, first and last sample (none without samples)."""
    if not samples:
        return []
    counted = _counted(samples)
    if not counted:
        return [Section(probe="counters", title="Java heap", lines=[f"no JVM counters: {samples[-1][1].missing}"])]
    last = counted[-1][1]
    lines = [
        f"{last.vm or 'JVM'} {last.version or ''}, collector {last.policy or 'unknown'}; its counters are in the JVM "
        "counters table, the live set after each collection in the Trends"
    ]
    mems = [j.memory for _, j in samples if j.memory is not None]
    if not mems or mems[0].heap is None or mems[-1].heap is None:
        lines.append("the heap's address range was not found in smaps: the RSS is not split")
        return [Section(probe="counters", title="Java heap", lines=lines)]
    rows = [
        [label, fmt_bytes(getattr(mems[0], key)), fmt_bytes(getattr(mems[-1], key)), _change(mems, key)]
        for label, key in _PARTS
    ]
    rows.append(["RSS (smaps)", fmt_bytes(mems[0].rss), fmt_bytes(mems[-1].rss), _change(mems, "rss")])
    return [
        Section(
            probe="counters",
            title="Java heap: where the RSS is",
            lines=lines,
            header=["resident", "first", "last", "change"],
            rows=rows,
        )
    ]


def _change(mems: list[JvmMemory], key: str) -> str:
    a, b = getattr(mems[0], key), getattr(mems[-1], key)
    if a is None or b is None:
        return "unknown"
    return ("+" if b >= a else "") + fmt_bytes(b - a)
