"""Narrowed allocation tracing: the blocks one function's own calls to the allocator return, and
which of them are still allocated at the end, with no probe on malloc.

Where memleak is priced out (a hot allocator: every malloc and free traps), a page-fault profile
still names the function whose pages grow. Its own calls to the allocator are few: a uprobe after
each (callsites.py) records the block and the caller's stack (bpf/sites.c). Which blocks are still
allocated at the end, and how large, is then read:
- under glibc, from its chunk headers (glibcheap.py): nothing else traps;
- under another allocator (jemalloc: no header memdiag reads), from the allocator's free entry
  points, traced from before the first site is armed until the scan has read the books with the
  target stopped (traced() keeps them attached while its caller scans), so a block still in the
  books was never freed. The size is the one asked for, kept by a probe on each call instruction.
  Every free of the process traps then: the price counts each by whether the kernel emulates the
  instruction its probe sits on (jemalloc's free, at its first branch: 0.62 µs a call here).
Those blocks are what a reachability scan then tells leaked from held."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from memdiag.system import arch, identity
from memdiag.system.signals import interrupted

from .. import bpfstats
from ..allocator import BPF_FUNCTION, Placement, find_allocator, is_emulated
from ..base import bpf_stats, detach_all, load, program_stats
from ..elf import ElfInfo, elf_info
from ..face import StackReach
from ..growth import RawStack, Spaces, StackGrowth, merge_stacks
from ..procmaps import AddressSpace
from ..symtab import Symbol
from .callsites import CallSite, call_sites, wrapper_sites
from .glibcheap import Memory, State, read_heap, state, usable_size
from .reach import Blocks, ReachScan

PROGRAM = "sites"
FUNCTION = b"site_return"
# the call probe's program by the callee's arguments (bpf/sites.c site_call_*); a callee not here
# (strdup) gets no call probe and its blocks' size is not known; a wrapper's own calls are probed
# instead of the call to it (sizing_sites)
SIZE_PROGRAM = {
    **dict.fromkeys(("malloc", "_Znwm", "_Znam", "_ZnwmRKSt9nothrow_t", "_ZnamRKSt9nothrow_t", "valloc", "pvalloc",
                     "mallocx"), b"site_call_rdi"),
    **dict.fromkeys(("realloc", "rallocx", "aligned_alloc", "memalign"), b"site_call_rsi"),
    "calloc": b"site_call_rdi_rsi",
    "reallocarray": b"site_call_rsi_rdx",
}  # fmt: skip
# the allocator's entry points that free the block they are handed (bpf/memleak.c's programs for them)
FREEING = ("free_enter", "realloc_enter", "reallocarray_enter")
CONSISTENCY = {
    "headers": "every thread stopped with ptrace (seize + interrupt) while the traced blocks' chunk headers were "
    "read again and memory scanned, then resumed",
    "frees": "every thread stopped with ptrace (seize + interrupt) while the books, kept by the free probes "
    "still attached, were read and memory scanned, then resumed",
}
TICK_S = 0.5  # how often a trace with a watch asks it whether to stop (its cost so far)
# ... and in its first second, before the rate of its cost is known: flat out under jemalloc every
# free traps, and half a second of that cost the target what the scan's pause was kept for
FIRST_TICK_S, FIRST_TICKS_UNTIL = 0.1, 1.0


def tick_s(attached: float) -> float:
    """How long until the watch is asked again, `attached` seconds into the trace."""
    return FIRST_TICK_S if attached < FIRST_TICKS_UNTIL else TICK_S


class SitesRefused(Exception):
    """The narrowed trace cannot run on this target: why, in one line."""


@dataclass(frozen=True)
class Block:
    address: int
    size: int | None  # glibc: the chunk's usable bytes; otherwise the bytes asked for (None: not known)
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
    run: tuple[int, int] | None = None  # the programs' (runs, run time in ns); None: not kept
    stopped: bool = False  # the watch stopped it before its time
    allocator: str = "glibc"  # memleak's name for the target's allocator
    liveness: str = "headers"  # how a block is known still allocated: "headers" (glibc's) or "frees" (traced)
    kinds: dict[str, bool] = field(default_factory=dict)  # per count that is a trap: emulated, or single-stepped
    frees: list[str] = field(default_factory=list)  # the free entry points traced (liveness "frees")
    sizing: list[CallSite] = field(default_factory=list)  # the calls whose size argument is kept (liveness "frees")
    _books: Callable[[], dict[int, int]] | None = None  # while attached: address -> ts of the blocks not freed
    reread_stopped: bool = False  # a scan read the blocks' state with the target stopped

    def live(self) -> list[Block]:
        return [b for b in self.blocks if b.state == State.ALLOCATED]

    def reread(self, pid: int) -> list[Block]:
        """The blocks' state now (the scan calls it with the target stopped): glibc's headers read
        again, or the books as the free probes, still attached, left them."""
        if self.liveness == "headers":
            self.blocks = _reread(pid, self.blocks)
        elif self._books is not None:
            self.blocks = _still(self.blocks, self._books())
        self.reread_stopped = True
        return self.blocks


Watch = Callable[[dict, dict, float], bool]  # (counts so far, kinds, seconds attached) -> stop now


def counts(bpf) -> dict[str, int]:
    """bpf/sites.c's stats by name, read while attached or after."""
    return bpfstats.read(bpf, bpfstats.SITES)


def traps_ns(n: dict[str, int], kinds: dict[str, bool], emulated_ns: float, stepped_ns: float) -> float:
    """What the traps counted in n cost the target, each kind at its instruction's price."""
    return sum(n.get(k, 0) * (emulated_ns if e else stepped_ns) for k, e in kinds.items())


def emulated(elf: ElfInfo, sites: list[CallSite], at_call: bool = False) -> list[bool]:
    """Per site: whether the kernel emulates the instruction its probe sits on (a push, a nop, a
    relative call or branch) or single-steps it out of line (most after a call: the mov or test
    that reads the block). at_call: the call instruction itself (a call rel32 is emulated)."""
    md = arch.disassembler()
    out = []
    for s in sites:
        at = s.call_address if at_call else s.return_address
        ins = next(md.disasm(elf.read_at(at, 16) or b"", at), None)
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
    """traced() with nothing done while its probes are attached: the books as the trace left them."""
    with traced(pid, function, seconds, watch) as t:
        pass
    return t


@contextmanager
def traced(pid: int, function: str, seconds: float, watch: Watch | None = None) -> Iterator[SiteTrace]:
    """Trace function's calls to the allocator in pid for seconds, then yield the books. Under
    glibc every probe is detached by then; otherwise the free probes stay attached until the block
    ends (a scan inside it reads exact books: SiteTrace.reread), and the counts, run time and
    stacks are completed as it ends. watch(counts, kinds, seconds attached), asked every
    tick_s(): True stops the trace there (its cost)."""
    t, space, path, frees = _planned(pid, function)
    bpf = load(PROGRAM, {})
    spaces = Spaces()
    spaces.same = lambda p: identity.check_pid(p) is None  # a read of pid once it is not the target is dropped
    spaces.refresh([pid])
    try:
        with bpf_stats():  # the programs' run time, counted while they are attached
            _attach(bpf, pid, space, path, t, frees)
            _wait(bpf, t, seconds, watch)
            if not frees:
                detach_all(bpf)  # nothing more is recorded: the books are read as they stand
            t.calls = {(k.tgid, k.stack_id, k.ip): v.value for k, v in bpf["calls"].items()}
            try:
                t.blocks = _read_blocks(bpf, pid, t.liveness)
            except OSError as e:  # the target exited (or its memory went) during the trace
                raise SitesRefused(f"PID {pid} could not be read after the trace: {e.strerror or e}") from None
            if frees:
                t._books = lambda: _books(bpf)
            yield t
            if frees:
                if not t.reread_stopped:
                    t.blocks = _still(t.blocks, _books(bpf))  # no scan read them: as they are at the detach
                detach_all(bpf)
            t.stats = counts(bpf)
            run = program_stats(bpf)  # every program of bpf/sites.c, summed
            if run is not None:
                t.run = (sum(r for r, _ in run.values()), sum(ns for _, ns in run.values()))
            if identity.check_pid(pid) is not None:  # exited or exec'd: its /proc is no more the target's
                spaces.orphan(pid)
            t.stacks = _stacks(bpf, t.live(), spaces)
    finally:
        t._books = None
        bpf.cleanup()  # the maps' and programs' descriptors: memdiag serve lives on


def _planned(pid: int, function: str) -> tuple[SiteTrace, AddressSpace, str, list[Placement]]:
    """The trace planned before anything loads: module, file, frees to trace, sites, how they trap; or SitesRefused."""
    found = module_of(pid, function)
    if found is None:
        raise SitesRefused(f"no module PID {pid} maps defines {function}")
    space, module, elf, sym = found
    alloc = find_allocator(pid, space)
    if alloc is None:
        raise SitesRefused(f"PID {pid} allocates with no allocator memdiag knows: its blocks' state cannot be read")
    frees: list[Placement] = []
    if alloc.name != "glibc":  # libc is mapped under jemalloc too: not its heap, so its frees are traced
        frees = [p for p in alloc.placements if BPF_FUNCTION.get(p.function) in FREEING]
        if not frees:
            raise SitesRefused(f"PID {pid} allocates with {alloc.name}, whose free memdiag cannot trace")
    sites = call_sites(elf, sym) or wrapper_sites(elf, sym)
    if not sites:
        raise SitesRefused(f"{function} calls no allocator, nor a wrapper of one in {os.path.basename(module)}")
    path = space.inode_path(space.first_mapping_of(module))
    if path is None:
        raise SitesRefused(f"{module} is not the file PID {pid} maps")
    t = SiteTrace(function, module, sites, 0.0, {}, allocator=alloc.name, liveness="frees" if frees else "headers")
    t.emulated = emulated(elf, sites)
    t.kinds = {"hits": all(t.emulated)}
    if frees:
        t.sizing = sizing_sites(elf, sites)
        t.kinds["call_hits"] = all(emulated(elf, t.sizing, at_call=True))
        t.kinds |= {"frees_emulated": True, "frees_stepped": False}
        t.frees = [p.describe() for p in frees]
    return t, space, path, frees


def sizing_sites(elf: ElfInfo, sites: list[CallSite]) -> list[CallSite]:
    """The call instructions whose arguments give each site's block size: the site's own call to
    the allocator, or, for a call to a wrapper (xmalloc), the wrapper's own calls to it. The
    wrapper's probe traps for its every caller, and the size it keeps is taken by the next traced
    return on that thread: where the wrapper hands a traced caller a block without calling the
    allocator on that path, the block gets the size of the thread's last untraced call to it."""
    out: list[CallSite] = []
    for s in sites:
        if s.callee in SIZE_PROGRAM:
            out.append(s)
            continue
        callee = elf.symbol_named(s.callee)
        inner = call_sites(elf, callee) if callee is not None else []
        out += [c for c in inner if c.callee in SIZE_PROGRAM and c not in out]
    return out


def _attach(bpf, pid: int, space: AddressSpace, path: str, t: SiteTrace, frees: list[Placement]) -> None:
    """The free probes first (a block freed after its site is armed is then always seen), then the
    call probes and the sites; each group one batch (uprobe_multi links where the kernel has them)."""
    groups: list[list[tuple]] = []
    if frees:
        group = []
        for p in frees:
            where = space.inode_path(space.first_mapping_of(p.module))
            if where is None:
                raise SitesRefused(f"{p.module} is not the file PID {pid} maps")
            fn = b"site_free_emulated" if p.emulated else b"site_free_stepped"
            group.append((where, fn, p.symbol_address + p.offset, p))
        groups.append(group)
        group = [(path, SIZE_PROGRAM[s.callee], s.call_address, s) for s in t.sizing]
        groups.append(group)
    groups.append([(path, FUNCTION, s.return_address, s) for s in t.sites])
    for group in groups:
        with bpf.uprobe_batch() as refused:
            for where, fn, addr, tag in group:
                bpf.attach_uprobe(name=where.encode(), fn_name=fn, addr=addr, pid=pid, tag=tag)
        if refused:
            raise SitesRefused(f"the kernel refused a probe for {t.function}: {refused[0][1]}")


def _wait(bpf, t: SiteTrace, seconds: float, watch: Watch | None) -> None:
    started = time.monotonic()
    while (left := seconds - (time.monotonic() - started)) > 0:
        time.sleep(min(tick_s(time.monotonic() - started), left))
        if interrupted():  # a signal: the trace so far is read and scanned as it stands
            break
        if watch is not None and watch(counts(bpf), t.kinds, time.monotonic() - started):
            t.stopped = True
            break
    t.seconds = time.monotonic() - started
    t.stats = counts(bpf)


def _books(bpf) -> dict[int, int]:
    return {k.value: v.ts_ns for k, v in bpf["blocks"].items()}


def _still(blocks: list[Block], books: dict[int, int]) -> list[Block]:
    """The blocks as the books hold them: one still there (the same call's: its time) was never freed."""
    return [
        Block(b.address, b.size, State.ALLOCATED if books.get(b.address) == b.ts_ns else State.FREE, b.ts_ns, b.key)
        for b in blocks
    ]


def _read_blocks(bpf, pid: int, liveness: str) -> list[Block]:
    raw = [(k.value, v.ts_ns, v.size, (v.key.tgid, v.key.stack_id, v.key.ip)) for k, v in bpf["blocks"].items()]
    if liveness == "frees":  # in the books: not freed since its call
        return [Block(address, size or None, State.ALLOCATED, ts, key) for address, ts, size, key in raw]
    return _reread(pid, [Block(address, None, State.UNKNOWN, ts, key) for address, ts, _size, key in raw])


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
    points at them) or held and by what. Everything else in the process is a root, but for the
    allocator's own records (reach/allocmeta.py)."""
    import numpy as np

    from . import reach

    keys = list(dict.fromkeys(b.key for b in t.blocks))
    group = {k: i for i, k in enumerate(keys)}

    def read_blocks(final: bool) -> Blocks:
        live = [b for b in t.reread(pid) if b.state == State.ALLOCATED] if final else t.live()
        blocks = Blocks(
            np.array([b.address for b in live], dtype=np.uint64),
            np.array([b.size or 1 for b in live], dtype=np.uint64),
            np.array([group[b.key] for b in live], dtype=np.int64),
        )
        return blocks.glibc_bounded() if t.liveness == "headers" else blocks

    result, per_group = reach.scan(pid, read_blocks, allowed_ms, interrupted=interrupted, allocator=t.allocator)
    result = result.model_copy(update={"consistency": CONSISTENCY[t.liveness]})
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
