"""The probe `jfr`: the JVM's own flight recorder, started through its attach socket for the time
the diagnosis gives it, stopped, read and removed (probes/jvm/jfr.py), priced before it starts
(probes/jvm/plan.py) and measured on the target while it runs (probes/jvm/meter.py): what the application
paid, its threads' run-queue delay above its rate before and the JVM's safepoints while memdiag's
commands ran (the start, the first look, the stop, from its counters); beside it the CPU time of
the JVM threads doing the recording's work (the start JIT-compiles JFR's code the first time) and
the process's CPU time above its rate before.
It backs off, stopping early, when what it measured would pass what the budget leaves.

What it says (probes/jvm/view.py): which class the JVM keeps, the Java stack that allocated it and
the chain of references that holds it, from the old-object samples still alive at the stop; the
sites that allocate the most, from the allocation samples; the heap after each collection."""

from __future__ import annotations

import dataclasses
import os
import time

from memdiag.system import clock
from memdiag.system.jvm import JvmCounters
from memdiag.system.process import cpu_seconds
from memdiag.system.target import Target

from ..base import Stop, run_for, stop_on_signals
from ..face import Context
from . import costs
from .attach import AttachRefused
from .jfr import MID, Recording, print_json
from .meter import STARTING, STOPPING, Meter, app_mark
from .plan import JfrPlan, plan, read_counters
from .recording import after_gc, allocating, held, parse_recording, with_sizes
from .result import JfrResult

THROTTLE_PER_S = 100  # allocation samples a second (JFR's default settings: 150/s; profile: 300/s)
KEEP_GROUPS = 8
# Of the time given, what stopping and reading take (JFR.stop 15-50 ms here, the jfr tool 0.4-0.6 s):
# the recording stops this much earlier, so the probe ends within its time.
READ_RESERVE_S = 1.5
# JFR's first start goes on after JFR.start answers: its JIT compilers work on JFR's code for about a
# second more here. What the target spends that long after the answer counts as the start's.
SETTLE_S = 2.0
# Run alone, the rates before are watched this long before the recording is priced and started (the
# meter takes a second of them at least).
BASELINE_S = 1.05
# The first look at the holders (a dump of the recording so far), this far into the recording: the
# holders' sizes then and at the stop say whether they grew or stayed at a bound.
LOOK_AT = 0.4


def run(target: Target, ctx: Context) -> JfrResult:
    """Record for ctx.seconds (its plan made first when run alone), read, clean up."""
    p = ctx.plan if isinstance(ctx.plan, JfrPlan) else plan(target, ctx)
    if p.jvm is not None and ctx.alone and ctx.runtime_mark is None:  # priced again with the rates before
        ctx = rates_before(p.jvm.pid, ctx)
        p = plan(target, ctx)
    base = dict(name="jfr", target=target.describe(), started=clock.wall(), method="JFR through the attach socket")
    if not p.go or p.jvm is None:
        return JfrResult(status="unavailable", reason=p.reason, **base)
    rec = Recording(p.jvm, planned_s=ctx.seconds, throttle_per_s=THROTTLE_PER_S, cutoff_ms=p.cutoff_ms)
    out: dict = {"build": p.build, "cold_start": p.cold, "cutoff_ms": p.cutoff_ms, "tool": p.tool.how if p.tool else ""}
    try:
        with stop_on_signals() as stop:
            _record(target, ctx, p, rec, stop, out)
    except (AttachRefused, RuntimeError, OSError) as e:
        out.update(status="error" if out.get("started_at") else "unavailable", reason=str(e))
    finally:
        rec.close()
        out["notes"] = out.get("notes", []) + rec.notes
    out["listener_started"] = rec.listener_was_there is False
    out.setdefault("status", "error")
    _remember(out)
    return JfrResult(**base, **out)


def rates_before(pid: int, ctx: Context) -> Context:
    """Run alone (no diagnosis watched the target before): the target's CPU rate and its application
    threads' run-queue delay over BASELINE_S before anything is sent to it, so that the plan prices
    its share of the CPUs and the meter takes the delay above its rate."""
    mark, cpu = app_mark(pid), cpu_seconds(pid)
    time.sleep(BASELINE_S)
    now = cpu_seconds(pid)
    rate = (now - cpu) / (time.monotonic() - mark.at) if now is not None and cpu is not None else None
    return dataclasses.replace(ctx, runtime_mark=mark, cpu_rate=rate)


class _Session:
    """One recording's run: the meter's steps (start, recording, the first look, stop) and the
    figures they leave in `out`."""

    def __init__(self, target: Target, ctx: Context, p: JfrPlan, rec: Recording, out: dict):
        assert p.price is not None and target.pid is not None
        self.pid, self.p, self.rec, self.out = target.pid, p, rec, out
        self.meter = Meter(target.pid, ctx.cpu_rate or 0.0, since=ctx.runtime_mark)
        self.allowance_s = p.allowance_ns / 1e9 if p.allowance_ns is not None else None
        self.answered = 0.0
        self.look_at = 0.0  # when (monotonic) to take the first look
        self.recorded_cpu = 0.0

    def start(self, seconds: float) -> float:
        """Start the recording; how long to record (its stop and reading fit in the time given)."""
        self.out["started_at"] = clock.wall()
        before = read_counters(self.pid)
        self.rec.start()
        self.answered = time.monotonic()
        self.out["start_pause_s"] = safepoint_delta(before, read_counters(self.pid))
        left = seconds - (clock.wall() - self.out["started_at"])
        span = max(0.0, left - (READ_RESERVE_S if left > 2 * READ_RESERVE_S else 0.0))
        self.look_at = self.answered + LOOK_AT * span
        return span

    def tick(self, _elapsed: float) -> bool:
        """A tick of the run: close the start once settled, take the first look, and whether what it
        cost (and the stop still to pay, priced) would pass the allowance: True stops it early."""
        now = time.monotonic()
        starting = self.out.get("start_cpu_s") is None
        if starting and now - self.answered >= SETTLE_S:
            self.out["start_cpu_s"], starting = self.meter.close_step(STARTING), False
        if not starting and "looked_at" not in self.out and now >= self.look_at:
            self._look()
        if self.allowance_s is None:
            return False
        price = self.p.price
        assert price is not None
        return self.meter.app_wait_s() + self.paused() + price.stop_s * self.p.share + price.stop_pause_s > (
            self.allowance_s
        )

    def paused(self) -> float:
        """The safepoints of memdiag's commands so far (the start, the first look, the stop)."""
        return sum(self.out.get(k) or 0.0 for k in ("start_pause_s", "look_pause_s", "stop_pause_s"))

    def _look(self) -> None:
        """The first look: a dump of what the recording holds so far (its paths to GC roots too)."""
        self.recorded_cpu += self.meter.close_step()
        before = read_counters(self.pid)
        self.out["looked_at"] = clock.wall()
        self.out["looked"] = self.rec.dump() is not None
        self.out["look_cpu_s"] = self.meter.close_step(STOPPING)
        self.out["look_pause_s"] = safepoint_delta(before, read_counters(self.pid))

    def stop(self) -> None:
        out, meter = self.out, self.meter
        if out.get("start_cpu_s") is None:
            out["start_cpu_s"] = meter.close_step(STARTING)
        else:
            self.recorded_cpu += meter.close_step()
        out["record_cpu_s"] = self.recorded_cpu
        out["record_rate_s"] = max(0.0, time.monotonic() - self.answered - SETTLE_S)
        out["stopped_at"] = clock.wall()
        out["recorded_s"] = out["stopped_at"] - out["started_at"]
        before = read_counters(self.pid)
        path = self.rec.stop()
        out["stop_cpu_s"] = meter.close_step(STOPPING)
        out["stop_pause_s"] = safepoint_delta(before, read_counters(self.pid))
        out["threads_ns"], out["process_ns"] = meter.threads_s * 1e9, meter.process_s() * 1e9
        wait, pause = meter.app_wait_s(), self.paused()
        out.update(app_wait_ns=wait * 1e9, app_pause_ns=pause * 1e9, app_rates=meter.has_rates)
        out["measured_ns"] = (wait + pause) * 1e9
        out["duration_s"] = clock.wall() - out["started_at"]
        if path is None:
            raise RuntimeError("the JVM wrote no recording at JFR.stop")


def _record(target: Target, ctx: Context, p: JfrPlan, rec: Recording, stop: Stop, out: dict) -> None:
    session = _Session(target, ctx, p, rec, out)
    span = session.start(ctx.seconds)
    run_for(span, target, stop, on_tick=session.tick)
    out.update(interrupted=stop.interrupted, backed_off=stop.backed_off, target_exited_at=stop.target_exited_at)
    session.stop()
    assert p.tool is not None
    before = _children_cpu()
    final = parse_recording(print_json(p.tool, rec))
    first = parse_recording(print_json(p.tool, rec, MID)) if out.get("looked") else None
    out["read_cpu_s"] = _children_cpu() - before
    _read(final, first, out)


def _children_cpu() -> float:
    """memdiag's children's CPU seconds so far (the jfr tool's runs, once each has ended)."""
    t = os.times()
    return t.children_user + t.children_system


def safepoint_delta(a: JvmCounters | None, b: JvmCounters | None) -> float | None:
    if a is None or b is None or a.safepoint_time_s is None or b.safepoint_time_s is None:
        return None
    return max(0.0, b.safepoint_time_s - a.safepoint_time_s)


def _read(parsed, first, out: dict) -> None:
    """The stop's recording (and the first look's, for the holders' sizes then) into the result."""
    groups = held(parsed, out["started_at"], out["stopped_at"])
    if first is not None:
        groups = with_sizes(groups, held(first, out["started_at"], out["looked_at"]))
    allocs = allocating(parsed)
    out.update(
        status="partial" if out.get("interrupted") or out.get("backed_off") else "ok",
        held=groups[:KEEP_GROUPS],
        allocating=allocs[:KEEP_GROUPS],
        old_samples=len(parsed.old),
        unrooted=sum(1 for s in parsed.old if s.anchor is None),
        alloc_samples=len(parsed.allocations),
        alloc_bytes=sum(a.bytes for a in allocs),
        after_gc=after_gc(parsed),
        collections=len(parsed.collections),
        direct_buffers=parsed.direct_buffers,
    )
    out["cost"] = {"events": len(parsed.old) + len(parsed.allocations)}
    if not parsed.old:
        out["notes"] = ["no old-object sample survived to the stop (nothing sampled outlived a collection)"]


def _remember(out: dict) -> None:
    """This host's figures for the next price: only from a run that measured all of them."""
    if out.get("status") not in ("ok", "partial") or not out.get("recorded_s"):
        return
    kind = "cold_start_s" if out.get("cold_start") else "warm_start_s"
    rate_s = out.get("record_rate_s")
    costs.remember(
        out.get("build"),
        {
            kind: out.get("start_cpu_s"),
            "record_cpu_per_s": (out.get("record_cpu_s") or 0.0) / rate_s if rate_s else None,
            "stop_s": out.get("stop_cpu_s"),
            "start_pause_s": out.get("start_pause_s"),
            "stop_pause_s": out.get("stop_pause_s"),
        },
    )
