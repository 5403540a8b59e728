"""A JVM target's heap over the window, from its own counters (hsperfdata, read with every sample:
diagnose/snapshot.py) and its RSS split (smaps): the facts the playbook reads (jvm.*) and the
report's section on them. Facts only; what they mean is the playbook's.

The live set is what the heap holds just after collections: every space but eden (old and
survivors, which only a collection fills), as the counters say at each sample; for a heap of one
space (ZGC, Shenandoah), its use at the samples that follow a collection. Under G1 it includes
old objects that died since the last marking (the flight recorder tells those apart). The GC share
is the time of collection pauses over the window's time; where the RSS grew, the share of that
growth inside the heap's address range says whether the growth is the Java heap's or native."""

from __future__ import annotations

from memdiag.probes.face import Section
from memdiag.system.jvm import JvmCounters, JvmMemory, JvmSample
from memdiag.system.trends import growth_trend
from memdiag.system.units import fmt_bytes, fmt_duration, fmt_rate

from .observe import Observation


def _samples(obs: Observation) -> list[tuple[float, JvmSample]]:
    return [(s.t, s.jvm) for s in obs.snapshots if s.jvm is not None]


def _counted(samples: list[tuple[float, JvmSample]]) -> list[tuple[float, JvmCounters]]:
    return [(t, j.counters) for t, j in samples if j.counters is not None]


def live_points(counted: list[tuple[float, JvmCounters]]) -> list[tuple[float, float]]:
    """(time, bytes in use after the collection) at each sample that follows a collection: one
    point per collection seen (the readings between two collections repeat the last, which a
    trend would take for a level)."""
    out: list[tuple[float, float]] = []
    previous: JvmCounters | None = None
    for t, c in counted:
        first = previous is None
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


def jvm_facts(obs: Observation) -> dict:
    """The jvm.* facts of a JVM target; {} for any other target."""
    samples = _samples(obs)
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


# --- the report's section -------------------------------------------------------------------------

_PARTS = (
    ("Java heap", "heap"),
    ("JIT-compiled code", "code"),
    ("thread stacks", "stacks"),
    ("metaspace (committed)", "metaspace"),
    ("mapped files (libjvm, modules, CDS)", "files"),
    ("other native (malloc: libjvm, JNI; GC data, direct buffers)", "other"),
)


def jvm_sections(obs: Observation) -> list[Section]:
    """The Java heap as its counters show it over the window (none for another target)."""
    samples = _samples(obs)
    if not samples:
        return []
    counted = _counted(samples)
    if not counted:
        return [Section(probe="counters", title="Java heap", lines=[f"no JVM counters: {samples[-1][1].missing}"])]
    f = jvm_facts(obs)
    last = counted[-1][1]
    seconds = counted[-1][0] - counted[0][0]
    lines = [
        f"{last.vm or 'JVM'} {last.version or ''} ({last.policy or 'collector unknown'}): heap "
        f"{fmt_bytes(last.heap_used)} in use, {fmt_bytes(last.heap_committed)} committed, at most "
        f"{fmt_bytes(last.heap_max)} (-Xmx)",
        _live_line(f),
        f"collections: {f['jvm.gc_count']} in {fmt_duration(seconds)} ({f['jvm.full_gc_count']} full), pauses "
        f"{_pct(f['jvm.gc_share'])} of the time ({_pct(f['jvm.gc_share_recent'])} over the latest third); last cause: "
        f"{last.last_cause or 'none'}",
        f"metaspace {fmt_bytes(last.metaspace_used)} in use, {fmt_bytes(last.metaspace_committed)} committed",
    ]
    mems = [j.memory for _, j in samples if j.memory is not None]
    if not mems or mems[-1].heap is None:
        lines.append("the heap's address range was not found in smaps: the RSS is not split")
        return [Section(probe="counters", title="Java heap", lines=lines)]
    if f.get("jvm.heap_growth_share") is not None:
        lines.append(
            f"of the RSS growth ({fmt_bytes(mems[-1].rss - mems[0].rss)}), {_pct(f['jvm.heap_growth_share'])} is "
            f"in the Java heap ({fmt_bytes(f['jvm.heap_rss_growth'])}) and {fmt_bytes(f['jvm.outside_rss_growth'])} "
            "outside it"
        )
    rows = [
        [label, fmt_bytes(getattr(mems[0], key)), fmt_bytes(getattr(mems[-1], key)), _change(mems, key)]
        for label, key in _PARTS
    ]
    rows.append(["RSS (smaps)", fmt_bytes(mems[0].rss), fmt_bytes(mems[-1].rss), _change(mems, "rss")])
    return [
        Section(
            probe="counters", title="Java heap", lines=lines, header=["resident", "first", "last", "change"], rows=rows
        )
    ]


def _live_line(f: dict) -> str:
    if f.get("jvm.live_set") is None:
        return "live set (in use after collections): no collection in the window"
    return (
        f"live set (in use after collections) {f['jvm.live_set_shape']}: {fmt_bytes(f['jvm.live_set_first'])} to "
        f"{fmt_bytes(f['jvm.live_set'])} ({_pct(f['jvm.live_set_percent'])} of the maximum), "
        f"{fmt_rate(f['jvm.live_set_rate'])}"
    )


def _pct(v: float | None) -> str:
    return "unknown" if v is None else f"{v:.1f}%"


def _change(mems: list[JvmMemory], key: str) -> str:
    a, b = getattr(mems[0], key), getattr(mems[-1], key)
    if a is None or b is None:
        return "unknown"
    return ("+" if b >= a else "") + fmt_bytes(b - a)
