"""brkstack: heap growth — brk() calls by user stack with the bytes of growth each caused.

Raw syscall tracepoints give the user registers at the call, so the stack is unwound through
glibc's frameless sbrk/sysmalloc with .eh_frame and names the code whose allocations grew the heap."""

from __future__ import annotations

import ctypes as ct
from pathlib import Path

from memdiag.system import arch
from memdiag.system.target import Target

from . import bpfstats, kernel
from .base import Run, run_probe
from .face import Face, FactDef, ProbeResult, plain
from .growth import (
    EventStacks,
    StackGrowth,
    event_stacks,
    heaviest_function,
)
from .procmaps import AddressSpace
from .text import event_stack_lines

METHOD = "raw tracepoints sys_enter/sys_exit (brk), kernel stacks + .eh_frame unwinding"


class BrkResult(ProbeResult):
    stacks: list[StackGrowth] = []
    folded: list[str] = []
    calls: int = 0
    heap_growth: int = 0


def requirements() -> list[kernel.Availability]:
    return [kernel.raw_syscall_tracepoints()]


def current_break(pid: int) -> int | None:
    """The program break now: the end of [heap], or start_brk (stat field 47) before any heap."""
    space = AddressSpace.of(pid)
    heap = space.first_mapping_of("[heap]") if space else None
    if heap is not None:
        return heap.end
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[47 - 3])
    except (OSError, IndexError, ValueError):
        return None


def describe(r: BrkResult, top: int) -> list[str]:
    """The result's lines under its header in `memdiag probe brkstack`."""
    return event_stack_lines(r, top, "calls")


def build_options() -> dict[str, int | str]:
    """The syscall numbers the program compares the raw tracepoint's id with."""
    return dict(arch.syscall_defines())


def run(target: Target, duration: float, top: int = 50) -> BrkResult:
    run = EventStacks()

    def seed(bpf, pids: set[int]) -> None:
        table = bpf["last_brk"]
        for pid in pids:
            brk = current_break(pid)
            if brk is not None:
                table[ct.c_uint(pid)] = ct.c_ulonglong(brk)

    def collect(bpf, _elapsed: float) -> dict:
        stats = bpfstats.read(bpf, bpfstats.STACK)
        stacks, failed = run.merge(raw for _key, raw in run.raw(bpf, lambda v: v.calls, lambda v: v.bytes))
        return {
            "events": stats["events"],
            "calls": stats["events"],
            "heap_growth": sum(s.bytes for s in stacks),
            **run.fields(stats, stacks, failed, top, weight="bytes"),
        }

    spec = Run("brkstack", BrkResult, requirements(), build_options(), collect, METHOD, spaces=run.spaces, attach=seed)
    return run_probe(spec, target, duration)  # type: ignore[return-value]


def facts_of(r: BrkResult | None, _plan, name) -> dict:
    if r is None or r.status not in ("ok", "partial"):
        return {}
    return {"brk.growth": r.heap_growth, "brk.top_function": heaviest_function(r.stacks, name) if r.stacks else None}


FACE = Face(
    name="brkstack",
    summary="brk() heap growth by user stack, with the bytes each call added",
    run=plain(run),
    result=BrkResult,
    describe=describe,
    facts=(
        FactDef("brk.growth", "bytes", "heap growth by brk() during the probe"),
        FactDef("brk.top_function", "string", "the function whose brk() calls grew the heap most"),
    ),
    facts_of=facts_of,
    stacks=event_stacks("brk() calls", "brk_calls"),
)
