"""faults: page faults by user stack — where RSS grows, as pages actually touched.

Method: the raw tracepoint exceptions:page_fault_user (its arguments carry the user registers),
counted in the kernel per stack; one copy of the user stack per new stack lets user space unwind
glibc's frameless code with .eh_frame and name the application function that touched the pages.
With no target: faults per process across the system."""

from __future__ import annotations

import os

from memdiag.system._parse import Model
from memdiag.system.target import Target

from . import bpfstats, kernel
from .base import Run, run_probe
from .cpython.frames import PythonReading, reading_lines
from .cpython.frames import caveats as python_caveats
from .face import Face, FactDef, ProbeResult, plain
from .growth import EventStacks, StackGrowth, event_stacks, heaviest_function
from .text import event_stack_lines

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
METHOD = "raw tracepoint exceptions:page_fault_user, kernel stacks + .eh_frame unwinding"


class ProcessFaults(Model):
    pid: int
    comm: str
    faults: int
    bytes: int


class FaultsResult(ProbeResult):
    stacks: list[StackGrowth] = []
    folded: list[str] = []
    per_process: list[ProcessFaults] = []
    python: PythonReading | None = None  # the Python frames walked at each fault (CPython targets)


def requirements() -> list[kernel.Availability]:
    return [kernel.tracepoint("exceptions", "page_fault_user")]


def describe(r: FaultsResult, top: int) -> list[str]:
    """The result's lines under its header in `memdiag probe faults`."""
    return [*event_stack_lines(r, top, "faults"), *reading_lines(r.python)]


def build_options(target_kind: str) -> dict[str, int | str]:
    """Per-process counts only system-wide (the seeds' one-liner); per stack always, with the
    Python frames of CPython targets."""
    return {"PER_PROCESS": int(target_kind == "system"), "PY_FRAMES": int(target_kind != "system")}


def run(target: Target, duration: float, top: int = 50) -> FaultsResult:
    per_process = target.kind == "system"
    run = EventStacks(python=True)

    def collect(bpf, _elapsed: float) -> dict:
        stats = bpfstats.read(bpf, bpfstats.STACK)
        fields: dict = {"events": stats["events"]}
        if stats["keys_dropped"]:
            fields.update(status="partial", reason="count table full: some faults were not counted")
        if per_process:
            procs = [
                ProcessFaults(
                    pid=k.tgid, comm=k.comm.decode(errors="replace"), faults=v.value, bytes=v.value * PAGE_SIZE
                )
                for k, v in bpf["per_process"].items()
            ]
            fields.update(
                per_process=sorted(procs, key=lambda p: p.faults, reverse=True)[:top],
                method="raw tracepoint exceptions:page_fault_user, per process",
                lost={"keys_dropped": stats["keys_dropped"]},
            )
            return fields
        raw = [stack for _key, stack in run.raw(bpf, lambda v: v.value, lambda v: v.value * PAGE_SIZE)]
        stacks, failed = run.merge(raw)
        return fields | run.fields(stats, stacks, failed, top)

    spec = Run("faults", FaultsResult, requirements(), build_options(target.kind), collect, METHOD,
               spaces=run.spaces, attach=run.attach(enabled=not per_process))  # fmt: skip
    return run_probe(spec, target, duration)  # type: ignore[return-value]


def facts_of(r: FaultsResult | None, _plan, name) -> dict:
    if r is None or r.status not in ("ok", "partial"):
        return {}
    counted = {"faults.counted": sum(s.count for s in r.stacks)}  # it ran: a rule can read that it named nothing
    if not r.stacks:
        return counted
    return {
        **counted,
        "faults.top_bytes": r.stacks[0].bytes,
        "faults.top_function": heaviest_function(r.stacks, name),
    }


FACE = Face(
    name="faults",
    summary="page faults by user stack: where resident memory grows, as pages touched",
    run=plain(run),
    result=FaultsResult,
    describe=describe,
    caveats=lambda r: python_caveats(r.python),
    facts=(
        FactDef("faults.counted", "number", "page faults in the stacks kept (present once the probe ran)"),
        FactDef("faults.top_bytes", "bytes", "pages faulted in by the heaviest stack"),
        FactDef("faults.top_function", "string", "the application function of the heaviest fault stack"),
    ),
    facts_of=facts_of,
    stacks=event_stacks("page faults", "faults", folded_by="count"),
)
