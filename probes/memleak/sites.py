"""Narrowed allocation tracing: the blocks one function's own calls to the allocator return, and
which of them are still allocated at the end, with no probe on malloc or free.

Where memleak is priced out (a hot allocator: every malloc and free traps), a page-fault profile
still names the function whose pages grow. Its own calls to the allocator are few: a uprobe after
each (callsites.py) records the block and the caller's stack (bpf/sites.c), and at the end the
allocator's chunk headers say which blocks are still allocated and how large (glibcheap.py). Those
blocks are what a reachability scan then tells leaked from held.

Only glibc's headers are read: under another allocator the trace refuses (its blocks' liveness
would be a guess)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from memdiag.system import arch
from memdiag.system.signals import interrupted

from ..allocator import find_allocator, is_emulated
from ..base import bpf_stats, detach_all, load, program_stats
from ..elf import ElfInfo, Symbol, elf_info
from ..face import StackReach
from ..growth import RawStack, Spaces, StackGrowth, merge_stacks
from ..procmaps import AddressSpace
from .callsites import CallSite, call_sites, wrapper_sites
from .glibcheap import Memory, State, read_heap, state, usable_size
from .reach import Blocks, ReachScan

PROGRAM = "sites"
FUNCTION = b"site_return"
# bpf/sites.c enum site_stat, in its order
STAT_NAMES = ("hits", "null", "stack_errors", "blocks_dropped", "samples_dropped", "calls_dropped")
CONSISTENCY = (
    "every thread stopped with ptrace (seize + interrupt) while the traced blocks' chunk headers were read "
    "again and memory scanned, then resumed"
)
TICK_S = 0.5  # how often a trace with a watch asks it whether to stop (its cost so far)


class SitesRefused(Exception):
    """The narrowed trace cannot run on this target: why, in one line."""


@dataclass(frozen=True)
class Block:
    address: int
    size: int | None  # the chunk's usable bytes (None: not read)
    state: State
    ts_ns: int
    key: tuple  # (tgid, stack_id, ip): its stack's key


@dataclass
class SiteTrace:
    function: str
    module: str
    sites: list[CallSite]
    seconds: float  # attached
    stats: dict[str, int]
    blocks: list[Block] = field(default_factory=list)
    stacks: list[StackGrowth] = field(default_factory=list)  # the still-allocated blocks, by stack
    calls: dict[tuple, int] = field(default_factory=dict)  # per stack key: its calls that returned a block
    emulated: list[bool] = field(default_factory=list)  # per site: the kernel emulates its instruction
    run: tuple[int, int] | None = None  # the program's (runs, run time in ns); None: not kept
    stopped: bool = False  # the watch stopped it before its time

    def live(self) -> list[Block]:
        return [b for b in self.blocks if b.state == State.ALLOCATED]


Watch = Callable[[object, float], bool]


def hits(bpf) -> int:
    """Calls traced so far (bpf/sites.c SS_HITS), read while attached."""
    return bpf["stats"][STAT_NAMES.index("hits")].value


def emulated(elf: ElfInfo, sites: list[CallSite]) -> list[bool]:
    """Per site: whether the kernel emulates the instruction its probe sits on (a push, a nop) or
    single-steps it out of line (most: the mov or test that reads the block)."""
    md = arch.disassembler()
    out = []
    for s in sites:
        ins = next(md.disasm(elf.read_at(s.return_address, 16) or b"", s.return_address), None)
        out.append(ins is not None and is_emulated(ins))
    return out


def module_of(pid: int, function: str) -> tuple[AddressSpace, str, ElfInfo, Symbol] | None:
    """The mapped file (executable or library) of pid that defines function, read, with its symbol."""
    space = AddressSpace.of(pid)
    if space is None:
        return None
    for module in space.modules():
        elf = elf_info(space.file_path(space.first_mapping_of(module)))
        sym = elf.symbol_named(function) if elf is not None else None
        if elf is not None and sym is not None:
            return space, module, elf, sym
    return None


def trace(pid: int, function: str, seconds: float, watch: Watch | None = None) -> SiteTrace:
    """Trace function's calls to the allocator in pid for seconds; the blocks they returned, read.
    watch(bpf, seconds attached), asked every TICK_S: True stops the trace there (its cost)."""
    found = module_of(pid, function)
    if found is None:
        raise SitesRefused(f"no module PID {pid} maps defines {function}")
    space, module, elf, sym = found
    alloc = find_allocator(pid, space)
    if alloc is None or alloc.name != "glibc":  # libc is mapped under jemalloc too: not its heap
        which = alloc.name if alloc is not None else "no allocator memdiag knows"
        raise SitesRefused(f"PID {pid} allocates with {which}, not glibc: its blocks' state cannot be read")
    sites = call_sites(elf, sym) or wrapper_sites(elf, sym)
    if not sites:
        raise SitesRefused(f"{function} calls no allocator, nor a wrapper of one in {os.path.basename(module)}")
    path = space.inode_path(space.first_mapping_of(module))
    if path is None:
        raise SitesRefused(f"{module} is not the file PID {pid} maps")
    bpf = load(PROGRAM, {})
    spaces = Spaces()
    spaces.refresh([pid])
    try:
        with bpf_stats():  # the program's run time, counted while it is attached
            return _traced(bpf, pid, function, seconds, watch, (module, path, elf, sites), spaces)
    finally:
        bpf.cleanup()  # the maps' and programs' descriptors: memdiag serve lives on


def _traced(
    bpf, pid: int, function: str, seconds: float, watch: Watch | None, found: tuple, spaces: Spaces
) -> SiteTrace:
    """Attach at every site, wait (asking the watch), detach, then read the books."""
    module, path, elf, sites = found
    with bpf.uprobe_batch() as refused:
        for s in sites:
            bpf.attach_uprobe(name=path.encode(), fn_name=FUNCTION, addr=s.return_address, pid=pid, tag=s)
    if refused:
        raise SitesRefused(f"the kernel refused a probe at {function}: {refused[0][1]}")
    started = time.monotonic()
    stopped = False
    while (left := seconds - (time.monotonic() - started)) > 0:
        time.sleep(min(TICK_S, left))
        if interrupted():  # a signal: the trace so far is read and scanned as it stands
            break
        if watch is not None and watch(bpf, time.monotonic() - started):
            stopped = True
            break
    attached = time.monotonic() - started
    detach_all(bpf)  # nothing more is recorded: the books are read as they stand
    stats = dict(zip(STAT_NAMES, (bpf["stats"][i].value for i in range(len(STAT_NAMES))), strict=True))
    out = SiteTrace(function, module, sites, attached, stats, stopped=stopped)
    out.emulated = emulated(elf, sites)
    run = program_stats(bpf)
    out.run = run.get(FUNCTION.decode()) if run is not None else None
    out.calls = {(k.tgid, k.stack_id, k.ip): v.value for k, v in bpf["calls"].items()}
    try:
        out.blocks = _read_blocks(bpf, pid)
    except OSError as e:  # the target exited (or its memory went) during the trace
        raise SitesRefused(f"PID {pid} could not be read after the trace: {e.strerror or e}") from None
    out.stacks = _stacks(bpf, out.live(), spaces)
    return out


def _read_blocks(bpf, pid: int) -> list[Block]:
    raw = [(k.value, v.ts_ns, (v.key.tgid, v.key.stack_id, v.key.ip)) for k, v in bpf["blocks"].items()]
    return _reread(pid, [Block(address, None, State.UNKNOWN, ts, key) for address, ts, key in raw])


def _stacks(bpf, live: list[Block], spaces: Spaces) -> list[StackGrowth]:
    """The live blocks by stack, each stack named as faults names its own (.eh_frame from the copy)."""
    by_key: dict[tuple, list[Block]] = {}
    for b in live:
        by_key.setdefault(b.key, []).append(b)
    stack_table, samples = bpf["stacks"], bpf["samples"]
    keys = {(k.tgid, k.stack_id, k.ip): k for k in samples}
    raw = []
    for key, blocks in by_key.items():
        tgid, stack_id, ip = key
        fp = list(stack_table.walk(stack_id)) if stack_id >= 0 else [ip]
        regs = data = None
        k = keys.get(key)
        if k is not None:
            s = samples[k]
            regs, data = (s.regs.ip, s.regs.sp, s.regs.bp), bytes(bytearray(s.data)[: s.len])
        total = sum(b.size or 0 for b in blocks)
        raw.append(RawStack(pid=tgid, fp_stack=fp, regs=regs, stack=data, count=len(blocks), bytes=total, key=key))
    stacks, _failed = merge_stacks(raw, spaces)
    return stacks


def reach_of(pid: int, t: SiteTrace, allowed_ms: float | None = None) -> tuple[ReachScan, dict[tuple, StackReach]]:
    """The reachability scan (reach.scan) of the trace's blocks still allocated, their state read
    again once the target is stopped (the same instant as the scan): per stack key, leaked (nothing
    points at them) or held and by what. Everything else in the process is a root."""
    import numpy as np

    from . import reach

    keys = list(dict.fromkeys(b.key for b in t.blocks))
    group = {k: i for i, k in enumerate(keys)}

    def read_blocks(final: bool) -> Blocks:
        live = [b for b in _reread(pid, t.blocks) if b.state == State.ALLOCATED] if final else t.live()
        return Blocks(
            np.array([b.address for b in live], dtype=np.uint64),
            np.array([b.size or 1 for b in live], dtype=np.uint64),
            np.array([group[b.key] for b in live], dtype=np.int64),
        ).glibc_bounded()

    result, per_group = reach.scan(pid, read_blocks, allowed_ms, interrupted=interrupted, allocator="glibc")
    result = result.model_copy(update={"consistency": CONSISTENCY})
    return result, {keys[g]: r for g, r in per_group.items()}


def _reread(pid: int, blocks: list[Block]) -> list[Block]:
    with Memory(pid) as mem:
        heap = read_heap(mem, Path(f"/proc/{pid}/maps").read_text())
        out = []
        for b in blocks:
            st = state(mem, heap, b.address)
            out.append(
                Block(b.address, usable_size(mem, b.address) if st == State.ALLOCATED else None, st, b.ts_ns, b.key)
            )
        return out
