"""What the Python frame walk (bpf/pyframes.h) will add to each traced allocation of a CPython
target, before memleak attaches: the deepest of its threads' Python stacks now, read from its
memory, times the walk's cost a frame on this host, plus its fixed part (probes/calibrate.py
measures both on memdiag itself, a CPython). 0 where the target runs no CPython memdiag reads or the
host has no such figures: memleak's measured cost, which includes the walk, still holds it to the
budget."""

from __future__ import annotations

from ..procmaps import AddressSpace
from .frames import MAX_THREADS
from .memory import Memory
from .target import PythonProcess, locate

MAX_DEPTH = 1000  # frames counted on one thread (a cycle in a torn chain stops there)
WALK_STEPS = 40  # the most frames the walk steps through: PY_MAX_FRAMES + PY_SHIM_STEPS (bpf/pyframes.h)


def deepest_stack(proc: PythonProcess, mem: Memory) -> int:
    """The most Python frames any thread of the process has now (shim frames included: the walk
    steps over them too)."""
    lay = proc.layout
    interp = mem.u64(proc.interpreters_head)
    tstate = mem.u64(interp + lay.interp_threads_head) if interp else None
    deepest = 0
    for _ in range(MAX_THREADS):
        if not tstate:
            break
        frame = mem.u64(tstate + lay.tstate_frame)
        if frame and lay.cframe_current_frame is not None:
            frame = mem.u64(frame + lay.cframe_current_frame)
        depth = 0
        while frame and depth < MAX_DEPTH:
            depth += 1
            frame = mem.u64(frame + lay.frame_previous)
        deepest = max(deepest, depth)
        tstate = mem.u64(tstate + lay.tstate_next)
    return deepest


def walk_ns(pid: int, costs) -> float:
    """ns the walk adds to one allocation of pid (costs: the host's, probes/calibrate.Costs)."""
    if costs is None or costs.python_walk_ns is None or costs.python_frame_ns is None:
        return 0.0
    with Memory(pid) as mem:
        proc, _why = locate(pid, AddressSpace.of(pid), mem)
        if proc is None:
            return 0.0
        depth = min(deepest_stack(proc, mem), WALK_STEPS)  # deeper stacks cost the walk no more
    return costs.python_walk_ns + costs.python_frame_ns * depth
