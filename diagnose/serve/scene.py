"""What grew before an OOM kill, from the flight recorder's samples (recorder.py): pure functions of
the series the recorder kept for the cgroup whose limit was hit and for the victim, no /proc here.

The climb is measured from the last time the cgroup's usage was at its lowest in the look-back (a
service restarted after an earlier kill climbs from its restart), to the last sample before the
kill. Its parts are the cgroup ledger's lines (system/ledger.py) grouped as the recorder keeps
them: anonymous, page cache, shared memory, kernel, and the residual the lines leave, so that the
explanation accounts for the growth it explains. How it grew is told from the samples, not from
thresholds: steady (a climb the trend test calls climbing), a step (most of the growth between
two samples), or none the recorder could see (the usage far from the limit at the last sample:
the kill came from a burst between samples, a single large allocation or a neighbour)."""

from __future__ import annotations

import time

from memdiag.system._parse import Model
from memdiag.system.trends import MIN_GROWTH_BYTES, growth_trend
from memdiag.system.units import fmt_bytes

# The recorder's cgroup fields, as grouped from the ledger's lines (recorder.py)
PARTS = (("anon", "anonymous"), ("file", "page cache"), ("shmem", "shared memory (tmpfs, shm)"), ("kernel", "kernel"))
NO_GROWTH = ("none", "unknown")  # the shapes of a scene that saw nothing grow
STEP_SHARE = 0.8  # a climb whose growth came this much from one interval of the samples is a step


class ScenePart(Model):
    key: str
    label: str
    first: int | None = None
    last: int | None = None
    growth: int | None = None
    share: float | None = None  # percent of the usage's growth over the climb


class Scene(Model):
    """The recorder's account of a kill: the climb before it and what it was made of."""

    source: str = "recorder"
    every_s: float
    samples: int  # the cgroup's samples in the look-back
    looked_back_s: float  # from the first of them to the kill
    last_before_kill_s: float  # how old the last sample was at the kill
    shape: str  # steady, step, levelled, sawtooth, none (no growth it could see), unknown
    host_oom: bool = False  # the host ran out: the cgroup is the victim's, its limit not the cause
    unseen: int | None = None  # bytes under the limit at the last sample its pace would not have filled
    climb_samples: int = 0
    climb_every_s: float | None = None  # the samples' spacing over the climb (a minute in the coarse part)
    climb_from: float | None = None  # wall time the climb began (the last lowest usage)
    climb_s: float | None = None
    usage_first: int | None = None
    usage_last: int | None = None
    growth: int | None = None
    rate_per_s: float | None = None
    limit: int | None = None
    parts: list[ScenePart] = []
    top_part: str | None = None  # the key of the part that grew most
    victim_rss_first: int | None = None
    victim_rss_last: int | None = None
    victim_share: float | None = None  # percent of the cgroup's growth the victim's RSS grew
    jvm_heap_first: int | None = None  # the JVM's heap after GC (old and survivors) at the climb's start
    jvm_heap_last: int | None = None
    jvm_heap_max: int | None = None
    fault_function: str | None = None  # the recorder's fault sample of the victim, where it took one
    fault_share: float | None = None
    fault_at: float | None = None
    shm_files: list[tuple[str, int, int]] = []  # (pattern, files, bytes) of the tmpfs it filled, where read
    text: str = ""
    # the samples it rests on, for the incident's chart (report.html): seconds before the kill (<= 0)
    usage_series: list[tuple[float, int | None, int | None]] = []  # (t, the cgroup's usage, its limit)
    victim_series: list[tuple[float, int]] = []  # (t, the victim's RSS)

    @property
    def grew(self) -> bool:
        return self.shape not in NO_GROWTH


Point = tuple[float, dict[str, int | None]]


def _climb_start(points: list[Point]) -> int:
    """Index of the last sample at the look-back's lowest usage (within the floor of it)."""
    usage = [p[1].get("usage") for p in points]
    known = [u for u in usage if u is not None]
    if not known:
        return 0
    low = min(known)
    return max(i for i, u in enumerate(usage) if u is not None and u <= low + MIN_GROWTH_BYTES)


def _shape(points: list[Point], start: int) -> str:
    """How the usage grew from the climb's start to the last sample: none (within the floor), a step
    (most of it between two samples), steady (the trend test's climbing), else the trend's own word
    (levelled, sawtooth); unknown with fewer than two samples in all."""
    climb = [(t, float(v["usage"])) for t, v in points[start:] if v.get("usage") is not None]
    if not climb or len(points) < 2:
        return "unknown"
    growth = climb[-1][1] - climb[0][1]
    if growth <= MIN_GROWTH_BYTES or len(climb) < 2:
        return "none"
    steps = [b[1] - a[1] for a, b in zip(climb, climb[1:], strict=False)]
    if max(steps) >= STEP_SHARE * growth:
        return "step"
    trend = growth_trend(climb).shape
    return "steady" if trend == "climbing" else trend


def _unseen(scene: Scene, kill_t: float, last_t: float) -> int | None:
    """Bytes under the limit at the last sample that the climb's pace would not have filled by the
    kill: what came between the last sample and the kill, unseen (None: nothing unseen to say)."""
    if not scene.limit or scene.usage_last is None:
        return None
    pace = max(scene.rate_per_s or 0.0, 0.0) if scene.shape == "steady" else 0.0
    reached = scene.usage_last + pace * max(0.0, kill_t - last_t)
    return scene.limit - scene.usage_last if reached < 0.9 * scene.limit else None


def explain(
    cgroup: list[Point],
    victim: list[Point],
    kill_t: float,
    every_s: float,
    limit: int | None,
    faults: dict | None = None,
    shm_files: list[tuple[str, int, int]] | None = None,
    victim_name: str = "the victim",
    host_oom: bool = False,
) -> Scene | None:
    """The scene of a kill at kill_t from the recorder's points (wall time, fields), oldest first;
    None where it has no sample of the cgroup before the kill. host_oom: the host ran out, the
    cgroup is the victim's and its limit (if any) is not what was hit."""
    points = [p for p in cgroup if p[0] <= kill_t]
    if not points:
        return None
    start = _climb_start(points)
    first_t, first = points[start]
    last_t, last = points[-1]
    limit = None if host_oom else limit or last.get("limit")
    shape = _shape(points, start)
    u0, u1 = first.get("usage"), last.get("usage")
    growth = u1 - u0 if u0 is not None and u1 is not None else None
    scene = Scene(
        every_s=every_s,
        samples=len(points),
        looked_back_s=round(kill_t - points[0][0], 1),
        last_before_kill_s=round(kill_t - last_t, 1),
        shape=shape,
        climb_from=first_t if growth and growth > 0 else None,
        climb_s=round(last_t - first_t, 1),
        usage_first=u0,
        usage_last=u1,
        growth=growth,
        rate_per_s=growth / (last_t - first_t) if growth is not None and last_t > first_t else None,
        limit=limit,
        shm_files=shm_files or [],
        host_oom=host_oom,
        climb_samples=len(points) - start,
        climb_every_s=round((last_t - first_t) / (len(points) - start - 1), 1) if len(points) - start > 1 else None,
        usage_series=[(round(t - kill_t, 1), v.get("usage"), None if host_oom else v.get("limit")) for t, v in points],
        victim_series=[(round(t - kill_t, 1), v["rss"]) for t, v in victim if t <= kill_t and v.get("rss") is not None],
    )
    scene = scene.model_copy(update={"unseen": _unseen(scene, kill_t, last_t)})
    scene = _parts(scene, first, last)
    scene = _victim(scene, [p for p in victim if first_t <= p[0] <= kill_t])
    # a fault sample is cited where it was taken during the climb (an older one may name other code)
    if faults and (scene.climb_from is None or (faults.get("at") or 0) >= scene.climb_from - every_s):
        scene = scene.model_copy(
            update={
                "fault_function": faults.get("function"),
                "fault_share": faults.get("share"),
                "fault_at": faults.get("at"),
            }
        )
    return scene.model_copy(update={"text": scene_text(scene, victim_name)})


def _parts(scene: Scene, first: dict, last: dict) -> Scene:
    parts, summed = [], 0
    for key, label in PARTS:
        a, b = first.get(key), last.get(key)
        g = b - a if a is not None and b is not None else None
        summed += g or 0
        parts.append(ScenePart(key=key, label=label, first=a, last=b, growth=g))
    if scene.growth is not None:  # the usage's growth the parts leave: never absorbed into one of them
        parts.append(ScenePart(key="residual", label="residual", growth=scene.growth - summed))
    if scene.growth and scene.growth > 0:
        parts = [p.model_copy(update={"share": 100.0 * p.growth / scene.growth}) if p.growth is not None else p
                 for p in parts]  # fmt: skip
    grown = [p for p in parts if p.key != "residual" and p.growth]
    top = max(grown, key=lambda p: p.growth or 0).key if grown else None
    return scene.model_copy(update={"parts": parts, "top_part": top})


def _victim(scene: Scene, points: list[Point]) -> Scene:
    rss = [(t, v.get("rss")) for t, v in points if v.get("rss") is not None]
    if not rss:
        return scene
    update: dict = {"victim_rss_first": rss[0][1], "victim_rss_last": rss[-1][1]}
    g = rss[-1][1] - rss[0][1]  # type: ignore[operator]
    if scene.growth and scene.growth > 0:
        update["victim_share"] = 100.0 * g / scene.growth
    heap = [v for _t, v in points if v.get("heap_after_gc") is not None]
    if heap:
        update.update(
            jvm_heap_first=heap[0]["heap_after_gc"],
            jvm_heap_last=heap[-1]["heap_after_gc"],
            jvm_heap_max=heap[-1].get("heap_max"),
        )
    return scene.model_copy(update=update)


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


def _signed(n: int | None) -> str:
    if n is None:
        return "unknown"
    return ("+" if n > 0 else "-" if n < 0 else "") + fmt_bytes(abs(n))


def scene_text(s: Scene, victim_name: str) -> str:
    """The scene in a sentence for the incident's summary: what the recorder saw, how, and which part."""
    seen = f"the recorder (its last sample {s.last_before_kill_s:g} s before the kill)"
    where = "the host ran out of memory (no cgroup limit hit); in the victim's cgroup, " if s.host_oom else ""
    if s.shape == "unknown" or s.usage_last is None:
        return f"{where}{seen} has too few readable samples of the cgroup to tell what grew"
    limit = f" of its {fmt_bytes(s.limit)} limit" if s.limit else ""
    if s.shape == "none":
        if s.unseen is not None:
            return (
                f"{where}no growth before the kill: {seen} saw the cgroup at {fmt_bytes(s.usage_last)}{limit}; the"
                f" {fmt_bytes(s.unseen)} that filled it came between samples (a single large allocation, or a burst)"
            )
        return (
            f"{where}no growth before the kill: over the {s.looked_back_s:g} s {seen} looked back, the cgroup's"
            f" usage never rose above its low; {fmt_bytes(s.usage_last)}{limit} at the last sample"
        )
    moved = sorted((p for p in s.parts if p.growth), key=lambda p: -abs(p.growth or 0))
    words = [
        f"{p.label} {_signed(p.growth)}" + (f" ({p.share:.0f}%)" if p.share is not None else "") for p in moved[:4]
    ]
    how = {"steady": "steadily", "step": "in a step"}.get(s.shape, f"({s.shape})")
    rate = f", {fmt_bytes(int(s.rate_per_s * 60))}/min" if s.rate_per_s and s.shape == "steady" else ""
    every = f"; {s.climb_samples} samples, {s.climb_every_s:g} s apart on average" if s.climb_every_s else ""
    out = (
        f"{where}before the kill {seen} saw the cgroup's usage climb {how} from {fmt_bytes(s.usage_first or 0)} to"
        f" {fmt_bytes(s.usage_last)}{limit} over {s.climb_s:g} s since {_clock(s.climb_from or 0)}{rate}{every}: "
        + "; ".join(words)
    )
    if s.unseen is not None:
        out += f"; the last {fmt_bytes(s.unseen)} to the limit came after the last sample, unseen"
    if s.victim_rss_last is not None:
        share = f", {s.victim_share:.0f}% of the cgroup's growth" if s.victim_share is not None else ""
        out += f"; {victim_name}'s RSS {fmt_bytes(s.victim_rss_first or 0)} -> {fmt_bytes(s.victim_rss_last)}{share}"
    if s.jvm_heap_last is not None:
        cap = f" of its {fmt_bytes(s.jvm_heap_max)} maximum (-Xmx)" if s.jvm_heap_max else ""
        out += (
            f"; the Java heap after GC (its own counters) {fmt_bytes(s.jvm_heap_first or 0)} ->"
            f" {fmt_bytes(s.jvm_heap_last)}{cap}"
        )
    if s.shm_files:
        pat, n, b = s.shm_files[0]
        out += f"; on the fullest tmpfs its largest process sees, the files {pat} number {n} ({fmt_bytes(b)})"
    if s.fault_function:
        share = f" ({s.fault_share:.0f}% of the faults sampled)" if s.fault_share is not None else ""
        at = f" at {_clock(s.fault_at)}" if s.fault_at else ""
        out += f"; the recorder's page-fault sample{at} named {s.fault_function}{share}"
    return out
