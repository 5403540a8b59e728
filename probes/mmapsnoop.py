"""mmapsnoop: mmap() calls by user stack with length and kind (anonymous or file-backed, private
or shared, writable), and munmap() per process: the reservations that precede resident memory."""

from __future__ import annotations

from memdiag.system import arch
from memdiag.system._parse import Model
from memdiag.system.target import Target
from memdiag.system.units import fmt_bytes

from . import bpfstats, kernel
from .base import Run, run_probe
from .cpython.frames import PythonReading, reading_lines
from .cpython.frames import caveats as python_caveats
from .face import Face, FactDef, ProbeResult, plain
from .growth import (
    EventStacks,
    RawStack,
    StackGrowth,
    event_stacks,
    heaviest_function,
)
from .text import event_stack_lines

METHOD = "raw tracepoint sys_enter (mmap/munmap), kernel stacks + .eh_frame unwinding"


class MapStack(StackGrowth):
    kind: str  # "anon private rw", "file shared ro", ...


class Unmaps(Model):
    pid: int
    calls: int
    bytes: int


class MmapResult(ProbeResult):
    stacks: list[MapStack] = []
    folded: list[str] = []
    unmaps: list[Unmaps] = []
    mapped_bytes: int = 0
    unmapped_bytes: int = 0
    python: PythonReading | None = None  # the Python frames walked at each mmap (CPython targets)


def kind_name(kind: int) -> str:
    return " ".join(("file" if kind & 1 else "anon", "shared" if kind & 2 else "private", "rw" if kind & 4 else "ro"))


def requirements() -> list[kernel.Availability]:
    return [kernel.raw_syscall_tracepoints()]


def describe(r: MmapResult, top: int) -> list[str]:
    """The result's lines under its header in `memdiag probe mmapsnoop`."""
    mapped = f"  mapped {fmt_bytes(r.mapped_bytes)}, unmapped {fmt_bytes(r.unmapped_bytes)}"
    return [*event_stack_lines(r, top, "calls"), mapped, *reading_lines(r.python)]


def build_options() -> dict[str, int | str]:
    """The syscall numbers the program compares the raw tracepoint's id with; the Python frames of
    CPython targets (pymalloc's arenas are mmap()ed)."""
    return {**arch.syscall_defines(), "PY_FRAMES": 1}


def run(target: Target, duration: float, top: int = 50) -> MmapResult:
    run = EventStacks(python=True)

    def collect(bpf, _elapsed: float) -> dict:
        stats = bpfstats.read(bpf, bpfstats.STACK)
        by_kind: dict[int, list[RawStack]] = {}
        for key, raw in run.raw(bpf, lambda v: v.calls, lambda v: v.bytes):
            by_kind.setdefault(key.kind, []).append(raw)
        stacks: list[MapStack] = []
        failed = 0
        for kind, raw in by_kind.items():  # an mmap and an munmap of one stack are two stacks
            merged, f = run.merge(raw)
            failed += f
            stacks += [MapStack(kind=kind_name(kind), **s.model_dump()) for s in merged]
        stacks.sort(key=lambda s: s.bytes, reverse=True)
        unmaps = [Unmaps(pid=k.value, calls=v.calls, bytes=v.bytes) for k, v in bpf["unmaps"].items()]
        return {
            "events": stats["events"],
            "unmaps": unmaps,
            "mapped_bytes": sum(s.bytes for s in stacks),
            "unmapped_bytes": sum(u.bytes for u in unmaps),
            **run.fields(stats, stacks, failed, top, weight="bytes"),
        }

    spec = Run("mmapsnoop", MmapResult, requirements(), build_options(), collect, METHOD,
               spaces=run.spaces, attach=run.attach())  # fmt: skip
    return run_probe(spec, target, duration)  # type: ignore[return-value]


def facts_of(r: MmapResult | None, _plan, name) -> dict:
    if r is None or r.status not in ("ok", "partial"):
        return {}
    return {
        "mmap.anon_bytes": sum(s.bytes for s in r.stacks if s.kind.startswith("anon")),
        "mmap.top_function": heaviest_function(r.stacks, name) if r.stacks else None,
    }


FACE = Face(
    name="mmapsnoop",
    summary="mmap() calls by user stack with length and kind, munmap() per process",
    run=plain(run),
    result=MmapResult,
    describe=describe,
    caveats=lambda r: python_caveats(r.python),
    facts=(
        FactDef("mmap.anon_bytes", "bytes", "anonymous memory mapped during the probe"),
        FactDef("mmap.top_function", "string", "the function that mapped the most"),
    ),
    facts_of=facts_of,
    stacks=event_stacks("mmap() calls", "mmap_calls"),
)
