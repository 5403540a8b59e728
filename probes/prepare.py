"""The programs a diagnosis loads with their default options, so they can be compiled ahead of
time: by `memdiag prepare` (set-up runs it), and in the background while a diagnosis takes its
first look at the counters. A warm cache means no compiler in the diagnosing process at all."""

from __future__ import annotations

from . import brkstack, compiler, faults, memleak, mmapsnoop, oomkill, swapin, vmscan
from .base import target_mode
from .kernel import kprobes, namespace_defines


def programs(target_kind: str) -> list[tuple[str, dict[str, int | str]]]:
    """(program, options) for each probe the engine may run on a target of this kind."""
    mode = target_mode(target_kind)
    return [
        ("ratecount", {}),  # first: pricing memleak is the engine's first BPF step
        ("faults", {"TARGET_MODE": mode, **faults.build_options(target_kind)}),
        ("memleak", {"TARGET_MODE": mode, **memleak.build_options()}),
        ("brkstack", {"TARGET_MODE": mode, **brkstack.build_options()}),
        ("mmapsnoop", {"TARGET_MODE": mode, **mmapsnoop.build_options()}),
        ("oomkill", oomkill.build_options()),
        ("swapin", {"TARGET_MODE": mode, **swapin.build_options(kprobes().available)}),
        ("vmscan", {"TARGET_MODE": target_mode(target_kind, vmscan.FILTERED)}),
        ("drsnoop", {"TARGET_MODE": mode}),
    ]


def prepare(target_kinds: tuple[str, ...] = ("pid", "system")) -> tuple[int, int]:
    """Compile what is not cached yet. Returns (compiled now, already cached)."""
    wanted: list[tuple[str, dict[str, int | str]]] = []
    for kind in target_kinds:
        for p in programs(kind):
            if p not in wanted:
                wanted.append(p)
    # as base.load builds them: in a pid namespace of memdiag's own, with its numbers
    wanted = [(name, {**defines, **namespace_defines()}) for name, defines in wanted]
    todo = [p for p in wanted if compiler.cached(*p) is None]
    compiler.compile_many(todo)
    return len(todo), len(wanted) - len(todo)
