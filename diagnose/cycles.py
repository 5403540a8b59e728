"""A long window watched in cycles: the workflow's "observe for a business cycle". A window of
hours is cut into cycles; in each the rules run on the counters so far and the probes they ask
for run again, within the budget's share of that cycle, so allocation tracing is spread over the
whole window in short runs rather than spent at its start. What each cycle's probes saw is kept as
a small record (the target's memory at its end, its heaviest allocation stacks with what nothing
pointed at), which the report draws as the window's curve; the probes' full results are not kept
beyond their cycle, except the one each probe's face says speaks most for the window (Face.keep).

From the records come the facts a playbook rule reads across cycles (`window.cycles`,
`window.cycles_leaking`, ...): a stack whose blocks nothing points at cycle after cycle is a leak
even when the last cycle was quiet (a leak that grows only at night), a cache fills and levels
whatever the phase."""

from __future__ import annotations

import math
from collections import deque

from memdiag.probes.face import ProbeResult, TrailItem
from memdiag.probes.registry import REGISTRY
from memdiag.system.signals import interrupted, phase

from .culprit import Classes
from .observe import Observation
from .report import CycleRecord, CycleStack

LONG_WINDOW_S = 600.0  # a window this long or longer is watched in cycles (unless --cycle says)
CYCLES = 24  # how many, by default: a day in hours
MIN_CYCLE_S = 60.0  # the shortest default cycle: a first look, a price and a probe's run fit in it
STACKS_KEPT = 3  # allocation stacks kept per cycle, heaviest first
# cycles whose trail (budget decisions, probe runs, scans) stays in full past the first: the rest is
# counted. A cycle's trail is ~1 KiB of report.json and 3-4 lines of report.md: a day in --cycle 60
# would be 1,440 cycles and ~5,000 lines, every one rewritten each cycle (measured: 57 cycles of 10 s,
# 85 KiB of trail and 200 lines of report.md)
TRAIL_CYCLES_KEPT = 3
# the report rewritten after the first cycle, then at most once this often: a rewrite renders the whole
# report (hundreds of KiB of JSON, Markdown and HTML) and much of what a render frees stayed in memdiag's
# heap, fragmented. Measured (10 s cycles, 4 samples/s, past the samples' bound): memdiag's anon RSS grew
# 1.5 MiB/min with a rewrite every cycle, 0.7 MiB/min with none (300-580 s into the window). That was
# before memdiag's threads shared one malloc arena (cli.one_malloc_arena), which was most of the creep
INTERIM_EVERY_S = 60.0


def watch(engine, sampler) -> None:
    """A long window in cycles (engine: diagnose.engine.Engine): in each, rules and probes as in a
    short window (each probe at most once a cycle, within the budget's share of the cycle), then a
    record of what it saw and the window so far told to engine.on_cycle (after the first cycle, then
    at most every INTERIM_EVERY_S); the next cycle starts where this one ends. At the end, each
    probe's result is the one its face kept for the window."""
    index, start, told = 0, 0.0, None
    trail = TrailFold(engine.trail)
    while sampler.alive() and not interrupted() and start < engine.duration:
        end = min(start + engine.cycle_s, engine.duration)
        mark = engine.begin_cycle(end)
        engine.rounds(sampler)
        with phase(f"counters (cycle {index + 1})", holds=False):
            sampler.wait(max(0.0, end - engine.elapsed()), interrupted)
        obs = sampler.so_far()
        seen = record(index, start, engine.elapsed(), obs, engine.results, engine.classes)
        engine.end_cycle(seen, trail.add(index, engine.trail[mark:]))
        index, start = index + 1, end
        due = told is None or engine.elapsed() - told >= INTERIM_EVERY_S
        if engine.on_cycle is not None and due and sampler.alive() and not interrupted():
            told = engine.elapsed()
            engine.on_cycle(engine.interim(obs, f"cycle {index} of {math.ceil(engine.duration / engine.cycle_s)}"))
    engine.end_cycles()


class TrailFold:
    """A long window's trail, bounded whatever the number of cycles: what came before the first
    cycle, the first cycle's steps and the last TRAIL_CYCLES_KEPT cycles' in full; each step of the
    cycles between is counted, one line per step and outcome at its first time, their own reasons
    not kept (what each of those cycles ran and saw is in the report's table of the window cycle by
    cycle)."""

    def __init__(self, before: list[TrailItem]):
        self.before = list(before)
        self.first: list[TrailItem] | None = None
        self.recent: deque[tuple[int, list[TrailItem]]] = deque()
        # (kind, name, state) -> [times, first cycle, last cycle, at_s of the first], shown in time order
        self.folded: dict[tuple[str, str, str], list] = {}

    def add(self, index: int, items: list[TrailItem]) -> list[TrailItem]:
        """Cycle `index`'s steps (0-based) added; the trail as it now stands."""
        if self.first is None:
            self.first = list(items)
        else:
            self.recent.append((index, list(items)))
            if len(self.recent) > TRAIL_CYCLES_KEPT:
                self._fold(*self.recent.popleft())
        return self.items()

    def _fold(self, index: int, items: list[TrailItem]) -> None:
        for t in items:
            f = self.folded.setdefault((t.kind, t.name, t.state), [0, index, index, t.at_s])
            f[0], f[2] = f[0] + 1, index

    def items(self) -> list[TrailItem]:
        folded = [
            TrailItem(
                kind=kind,  # type: ignore[arg-type]
                name=name,
                state=state,
                reason=f"{times} more time{'s' if times != 1 else ''} in "
                + (f"cycle {a + 1}" if a == b else f"cycles {a + 1}-{b + 1}")
                + f" (counted: the trail keeps the first cycle and the last {TRAIL_CYCLES_KEPT} in full)",
                at_s=at,
            )
            for (kind, name, state), (times, a, b, at) in sorted(self.folded.items(), key=lambda kv: kv[1][3])
        ]
        return self.before + (self.first or []) + folded + [t for _, items in self.recent for t in items]


def cycle_length(duration: float, asked: float | None = None) -> float | None:
    """The cycle a window is watched in: asked (--cycle), else none below LONG_WINDOW_S, else a
    CYCLES-th of the window, at least MIN_CYCLE_S."""
    if asked is not None:
        return asked if asked < duration else None
    if duration < LONG_WINDOW_S:
        return None
    return max(MIN_CYCLE_S, duration / CYCLES)


def record(
    index: int, start_s: float, end_s: float, obs: Observation, results: dict[str, ProbeResult], classes: Classes
) -> CycleRecord:
    """What one cycle saw: the target's memory at its end and its allocation stacks."""
    stacks: list[CycleStack] = []
    for face in REGISTRY.stack_faces():
        r = results.get(face.name)
        if r is None or face.stacks is None or face.stacks.kind != "allocations" or r.status not in ("ok", "partial"):
            continue
        for s in face.stacks.of(r)[:STACKS_KEPT]:
            named = classes.name(s.frames, s.forwards or None)
            stacks.append(
                CycleStack(
                    probe=face.name,
                    function=named.label,
                    bytes=s.bytes,
                    leaked_bytes=s.reach.leaked_bytes if s.reach is not None else None,
                    leaked_count=s.reach.leaked_count if s.reach is not None else None,
                )
            )
    return CycleRecord(
        index=index,
        start_s=round(start_s, 1),
        end_s=round(end_s, 1),
        memory=_memory_at_end(obs),
        probes=sorted(n for n, r in results.items() if r.status in ("ok", "partial")),
        stacks=stacks,
    )


def _memory_at_end(obs: Observation) -> int | None:
    """The target's own memory at the cycle's end: a process's RSS, a cgroup's usage."""
    if not obs.snapshots:
        return None
    last = obs.snapshots[-1]
    if last.process is not None:
        return last.process.rss
    cg = obs.last_cgroup
    return cg.usage if cg is not None else None


def cycle_facts(records: list[CycleRecord]) -> dict:
    """What the cycles say together, for the playbook (absent in a window without cycles)."""
    if not records:
        return {}
    traced = [r for r in records if r.stacks]
    leaking: dict[str, int] = {}
    for r in traced:
        for fn in {s.function for s in r.stacks if s.leaked_count and s.function}:
            leaking[fn] = leaking.get(fn, 0) + 1
    top = max(leaking, key=lambda fn: leaking[fn]) if leaking else None
    return {
        "window.cycles": len(records),
        "window.cycles_traced": len(traced),
        "window.cycles_leaking": sum(1 for r in traced if any(s.leaked_count for s in r.stacks)),
        "window.leak_function": top,
        "window.leak_function_cycles": leaking.get(top, 0) if top else 0,
    }


def kept(old: ProbeResult | None, new: ProbeResult) -> ProbeResult:
    """Of two cycles' results of one probe, the one its face says speaks for the window."""
    if old is None:
        return new
    keep = REGISTRY.face(new.name).keep
    return keep(old, new) if keep is not None else new
