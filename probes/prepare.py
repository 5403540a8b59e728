"""The programs a diagnosis loads with their default options, so they can be compiled ahead of
time: by `memdiag prepare` (set-up runs it), and in the background while a diagnosis takes its
first look at the counters. A warm cache means no compiler in the diagnosing process at all."""

from __future__ import annotations

from . import compiler
from .kernel import namespace_defines
from .registry import REGISTRY


def programs(target_kind: str) -> list[tuple[str, dict[str, int | str]]]:
    """(program, options) for each probe the engine may run on a target of this kind."""
    return REGISTRY.programs(target_kind)


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
