"""The part shared by the probes that attribute memory growth to user stacks (faults, brkstack,
mmapsnoop): address spaces kept fresh while the target runs, the post-processing of (key -> count,
bytes, stack id, saved sample) into symbolized, merged stacks (EventStacks: the run each of them
makes), and their face's stacks and facts."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from memdiag.system._parse import Model
from memdiag.system.units import fmt_number
from pydantic import Field

from .cpython.frames import PyFrame, PythonStacks, mixed
from .face import Namer, Stack, Stacks
from .procmaps import AddressSpace
from .stacks import Frame, Symbolizer, folded, recover, sourced

T = TypeVar("T")


class StackGrowth(Model):
    """One user stack with what it accounts for (pages faulted in, bytes reserved ...)."""

    frames: list[str]  # leaf first: "function+0x1a [module]", "[unknown] [module]"
    functions: list[str | None]  # the same frames' function names, None where unknown
    count: int
    bytes: int
    pid: int
    method: str  # how the stack was recovered: eh_frame, frame pointers, ...
    unknown_frames: int = 0
    # the callers' keys of the raw stacks merged into it (RawStack.key), for the caller's own tables;
    # not part of the stack as the report shows it
    keys: list[tuple] = Field(default=[], exclude=True)
    # its native frames as symbolized (leaf first), for their file:line once the stacks shown are
    # known (stacks.sourced); not part of the result either
    native: list[Frame] = Field(default=[], exclude=True)


class Spaces:
    """Address spaces of the traced processes, refreshed while they live so that libraries
    loaded late are known, and kept after they exit so their stacks can still be symbolized.
    same(pid): whether pid is still the process traced, asked after each read (a read of a
    process that exited or exec'd meanwhile may be another's: dropped); run_probe sets it for a
    process target (system/identity.py)."""

    def __init__(self) -> None:
        self.by_pid: dict[int, AddressSpace] = {}
        self.same: Callable[[int], bool] | None = None
        self.orphaned: set[int] = set()

    def refresh(self, pids: Iterable[int]) -> None:
        for pid in pids:
            if pid in self.orphaned:
                continue
            space = AddressSpace.of(pid)
            if space is not None and (self.same is None or self.same(pid)):
                self.by_pid[pid] = space

    def get(self, pid: int) -> AddressSpace | None:
        if pid not in self.by_pid:
            self.refresh([pid])
        return self.by_pid.get(pid)

    def orphan(self, pid: int) -> None:
        """pid is not the process traced any more: its mappings as last read stay (its stacks are
        named by them), its /proc entries are never read again (procmaps.AddressSpace.orphan)."""
        self.orphaned.add(pid)
        space = self.by_pid.get(pid)
        if space is not None:
            space.orphan()


class RawStack(Model):
    pid: int
    fp_stack: list[int]
    regs: tuple[int, int, int] | None = None
    stack: bytes | None = None
    count: int
    bytes: int
    key: tuple = ()  # the caller's key for it (memleak's per-stack table entry)
    python: list[PyFrame] = []  # the Python frames the walk recorded with it (bpf/pyframes.h)


@dataclass
class Symbolized:
    """One raw stack recovered and named: its addresses, frames, how it was recovered, and the
    symbolizer of its process (which also reads a frame's code: Symbolizer.forwards)."""

    raw: RawStack
    addresses: list[int]
    frames: list[Frame]
    method: str
    symbolizer: Symbolizer


def symbolize(raw: Iterable[RawStack], spaces: Spaces) -> Iterator[Symbolized]:
    """Recover each stack (.eh_frame where frame pointers fail) and name its frames, with one
    symbolizer per process."""
    symbolizers: dict[int, Symbolizer] = {}
    for r in raw:
        space = spaces.get(r.pid)
        addresses, method = recover(space, r.fp_stack, r.regs, r.stack)
        sym = symbolizers.setdefault(r.pid, Symbolizer(space, jit=True))
        yield Symbolized(r, addresses, sym.frames(addresses), method, sym)


def merge_groups(items: Iterable[tuple[tuple, T]], combine: Callable[[T, T], T], weight: Callable[[T], int]) -> list[T]:
    """(group, item) pairs merged by group, combine(merged so far, next) folding each next one in,
    heaviest first: the one merge of the stacks that name alike (the same frames of one process, or
    a CPython target's same Python call path), whatever books each probe keeps of them."""
    merged: dict[tuple, T] = {}
    for group, item in items:
        merged[group] = combine(merged[group], item) if group in merged else item
    return sorted(merged.values(), key=weight, reverse=True)


def merge_stacks(raw: Iterable[RawStack], spaces: Spaces, group=None) -> tuple[list[StackGrowth], int]:
    """Recover, symbolize and merge stacks; returns them heaviest first and the failed look-ups.
    group(pid, frames): what stacks merge by (default: their frames; a CPython target's Python call
    path, probes/cpython/frames.py)."""
    symbolizers: dict[int, Symbolizer] = {}

    def named() -> Iterator[tuple[tuple, StackGrowth]]:
        for s in symbolize(raw, spaces):
            r, frames = s.raw, s.frames
            symbolizers[r.pid] = s.symbolizer
            names, functions = mixed([str(f) for f in frames], [f.function for f in frames], r.python)
            unknown = sum(1 for f in frames if not f.known)
            one = StackGrowth(frames=names, functions=functions, count=r.count, bytes=r.bytes, pid=r.pid,
                              method=s.method, unknown_frames=unknown, keys=[r.key], native=frames)  # fmt: skip
            yield (r.pid, group(r.pid, names) if group else tuple(names)), one

    stacks = merge_groups(named(), _summed, lambda s: s.bytes)
    return stacks, sum(s.failed for s in symbolizers.values())


def _summed(m: StackGrowth, item: StackGrowth) -> StackGrowth:
    """Two stacks that name alike as one: counted together, the heavier's frames standing for it."""
    if item.bytes > m.bytes:
        update = {"frames": item.frames, "functions": item.functions, "method": item.method, "native": item.native}
        m = m.model_copy(update=update)
    return m.model_copy(
        update={"count": m.count + item.count, "bytes": m.bytes + item.bytes, "keys": [*m.keys, *item.keys]}
    )


class EventStacks:
    """The run every event-stack probe makes (faults, mmapsnoop, brkstack, fdstack): the target's address
    spaces kept fresh, and where its program records them (PY_FRAMES) the Python frames of CPython
    targets; its samples read from the program's `counts` table as RawStacks, merged by stack (by
    Python call path in a CPython target), and the fields every such result has."""

    def __init__(self, python: bool = False):
        self.spaces = Spaces()
        self.python = PythonStacks() if python else None

    def attach(self, enabled: bool = True) -> Callable | None:
        """What the run does once the program is attached: register each CPython target's layout."""
        return self.python.attacher(self.spaces, enabled=enabled) if self.python is not None else None

    def raw(self, bpf, count: Callable[[Any], int], nbytes: Callable[[Any], int]) -> Iterator[tuple[Any, RawStack]]:
        """(key, RawStack) of each counted key; count(value) and nbytes(value) read its figures."""
        for key, v, fp, regs, data in read_samples(bpf, bpf["counts"]):
            py = self.python.frames(bpf, key, key.tgid) if self.python is not None else []
            stack = RawStack(
                pid=key.tgid, fp_stack=fp, regs=regs, stack=data, count=count(v), bytes=nbytes(v), python=py
            )
            yield key, stack

    def merge(self, raw: Iterable[RawStack]) -> tuple[list[StackGrowth], int]:
        """The stacks merged, heaviest first, and the symbol look-ups that failed (merge_stacks)."""
        return merge_stacks(raw, self.spaces, self.python.group if self.python is not None else None)

    def fields(self, stats: dict[str, int], stacks: list, failed: int, top: int, weight: str = "count") -> dict:
        """The fields every event-stack result has: its heaviest stacks, the flame graph's folded
        lines, what was lost, and (Python frames walked) what reading them took; the reader closed."""
        kept = stacks[:top]  # their frames' file:line: DWARF line tables read for the stacks kept alone
        lined = sourced([(s.frames, s.native, self.spaces.get(s.pid)) for s in kept])
        shown = [s.model_copy(update={"frames": f}) if s.native else s for s, f in zip(kept, lined, strict=True)]
        out = {"stacks": shown, "folded": folded_lines(stacks, weight), "lost": stack_losses(stats, failed)}
        if self.python is not None:
            out["python"] = self.python.reading() if self.python.targets or self.python.refused else None
            self.python.close()
        return out


def folded_lines(stacks: Iterable[StackGrowth], weight: str = "count") -> list[str]:
    return folded(
        ([Frame(address=0, function=f, module=None) for f in s.functions], getattr(s, weight)) for s in stacks
    )


def read_samples(bpf, counts_table):
    """(key, value, frame-pointer stack, regs, stack bytes) for each counted key; the key has
    tgid, stack_id and ip, and the program keeps its first sample in `samples`."""
    stack_table, samples = bpf["stacks"], bpf["samples"]
    for key, value in counts_table.items():
        fp = list(stack_table.walk(key.stack_id)) if key.stack_id >= 0 else [key.ip]
        regs = data = None
        try:
            s = samples[key]
            regs = (s.regs.ip, s.regs.sp, s.regs.bp)
            data = bytes(bytearray(s.data)[: s.len])
        except KeyError:
            pass
        yield key, value, fp, regs, data


def stack_losses(stats: dict[str, int], failed_lookups: int) -> dict[str, int]:
    """What a stack-sampling probe could not record, from its `stats` array by name (faults.c,
    brkstack.c, mmapsnoop.c alike: bpfstats.STACK)."""
    return {
        "stack_errors": stats["stack_errors"],
        "samples_dropped": stats["samples_dropped"],
        "keys_dropped": stats["keys_dropped"],
        "symbol_lookups_failed": failed_lookups,
    }


def heaviest_function(stacks: Iterable[StackGrowth], name: Namer) -> str | None:
    """The application function that accounts for the most bytes, summed over stacks."""
    totals: dict[str, int] = {}
    for s in stacks:
        fn = name(s.frames, [])
        if fn:
            totals[fn] = totals.get(fn, 0) + s.bytes
    return max(totals, key=totals.get) if totals else None  # type: ignore[arg-type]


def event_stacks(counted: str, sample: str, folded_by: Literal["bytes", "count"] = "bytes", shown: int = 3) -> Stacks:
    """The face's stacks of a probe that counts events by stack (counted: "page faults", "brk() calls";
    sample: their pprof sample type, "faults"; folded_by: what its folded lines weigh, as its run's fields)."""

    def of(r) -> list[Stack]:
        return [
            Stack(
                frames=s.frames,
                functions=s.functions,
                bytes=s.bytes,
                count=s.count,
                pid=s.pid,
                detail=f"{fmt_number(s.count)} {counted}",
            )
            for s in r.stacks
        ]

    return Stacks(kind="events", shown=shown, of=of, folded=lambda r: r.folded, counted=sample, folded_by=folded_by)
