"""What the scan reads: the target's readable, writable mappings, each with the root tier its words
count as (a thread's stack from its stack pointer up, its static TLS, a module's .data/.bss, memory
memdiag did not see allocated), and of each only the pages resident or swapped (/proc/PID/pagemap)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from memdiag.system import arch

from ...elf import elf_info
from ...procmaps import AddressSpace, Mapping
from .model import PAGE, TIER_RUNTIME, TIER_STACK, TIER_STATIC, TIER_TLS, TIER_UNTRACKED
from .stop import Thread

PAGEMAP_WINDOW = 1 << 16  # pages of /proc/PID/pagemap read at a time (512 KiB: 256 MiB of address space)
SKIPPED_PATHS = ("[vvar]", "[vvar_vclock]", "[vsyscall]", "[vdso]")


@dataclass
class Region:
    start: int
    end: int
    tier: int
    mapping: Mapping
    tid: int | None = None  # a thread's stack
    module: str | None = None  # a module's writable data (file path as the process sees it)


def readable_regions(
    space: AddressSpace, threads: list[Thread], tls_bytes: int = 0, blocks=None, runtime_modules=frozenset()
) -> list[Region]:
    """Readable, writable mappings, each with the root tier its words count as; the data of
    runtime_modules (an interpreter's own) counts after every other root."""
    stacks = _stack_mappings(space, threads, blocks)

    def static(path: str) -> int:
        return TIER_RUNTIME if path in runtime_modules else TIER_STATIC

    out: list[Region] = []
    previous: Mapping | None = None
    for m in space.mappings:
        prev, previous = previous, m
        if "r" not in m.perms or "w" not in m.perms or m.path in SKIPPED_PATHS:
            continue
        if m.path.startswith("/dev/") and not m.path.startswith(("/dev/zero", "/dev/shm/")):
            continue  # device memory: reading it may have effects
        if m.start in stacks:
            t = stacks[m.start]
            out.append(Region(max(m.start, t.sp - arch.RED_ZONE), m.end, TIER_STACK, m, tid=t.tid))
        elif m.is_file and "s" not in m.perms:
            out.append(Region(m.start, m.end, static(m.path), m, module=m.path))
        elif not m.path and prev is not None and prev.is_file and "w" in prev.perms and prev.end == m.start:
            # .bss past the file's pages: only as far as the segment's p_memsz reaches; an anonymous
            # mapping the kernel happened to place right after it is not the module's
            bss_end = min(m.end, _segment_end(space, prev) or m.start)
            if bss_end > m.start:
                out.append(Region(m.start, bss_end, static(prev.path), m, module=prev.path))
            if bss_end < m.end:
                out.append(Region(bss_end, m.end, TIER_UNTRACKED, m))
        else:
            out.append(Region(m.start, m.end, TIER_UNTRACKED, m))
    return _split_tls(out, threads, tls_bytes) if threads and tls_bytes else out


def _stack_mappings(space: AddressSpace, threads: list[Thread], blocks) -> dict[int, Thread]:
    """Mappings that are one thread's stack and nothing else, by start: only there is the memory
    below the stack pointer dead. A stack pointer in the heap (a coroutine's malloc()ed stack, a
    sigaltstack), two threads in one mapping, or tracked blocks inside it: the mapping is read whole."""
    import numpy as np

    by_mapping: dict[int, list[Thread]] = {}
    for t in threads:
        m = space.find(t.sp)
        if m is not None:
            by_mapping.setdefault(m.start, []).append(t)
    out = {}
    for start, ts in by_mapping.items():
        m = space.find(start)
        if m is None or len(ts) != 1 or m.is_file or m.path not in ("", "[stack]"):
            continue
        if blocks is not None and len(blocks.starts):
            inside = (blocks.starts > np.uint64(m.start)) & (blocks.starts < np.uint64(m.end))
            if inside.any():  # a tracked block strictly inside: this memory is a heap too
                continue
        out[start] = ts[0]
    return out


def _segment_end(space: AddressSpace, mapping: Mapping) -> int | None:
    """Where the loaded segment that a module's mapping belongs to ends in memory (p_memsz)."""
    elf = elf_info(space.file_path(mapping))
    bias = elf.bias(mapping) if elf is not None else None
    if elf is None or bias is None:
        return None
    vaddr = mapping.start - bias
    for seg in elf.loads:
        if seg["p_vaddr"] <= vaddr < seg["p_vaddr"] + seg["p_memsz"]:
            end = bias + seg["p_vaddr"] + seg["p_memsz"]
            return -(-end // PAGE) * PAGE
    return None


def present_runs(pagemap_fd: int | None, start: int, end: int, tick: Callable[[], None] = lambda: None):
    """(start, end, swapped pages) of the resident or swapped stretches of [start, end). tick is
    called for every window of the page map (a huge sparse mapping is mostly windows)."""
    import numpy as np

    first = start // PAGE * PAGE
    if pagemap_fd is None:  # no pagemap: read everything
        yield start, end, 0
        return
    for w in range(first, end, PAGEMAP_WINDOW * PAGE):
        tick()
        w_end = min(end, w + PAGEMAP_WINDOW * PAGE)
        n = (w_end - w + PAGE - 1) // PAGE
        raw = os.pread(pagemap_fd, n * 8, w // PAGE * 8)
        pm = np.frombuffer(raw, dtype=np.uint64, count=len(raw) // 8)
        present = (pm >> np.uint64(62)) != 0  # bit 63 present, bit 62 swapped
        if not present.any():
            continue
        swapped = ((pm >> np.uint64(62)) & np.uint64(1)).astype(bool)
        edge = np.diff(np.concatenate(([False], present, [False])).astype(np.int8))
        for a, b in zip(np.flatnonzero(edge == 1), np.flatnonzero(edge == -1), strict=True):
            lo, hi = max(start, w + int(a) * PAGE), min(w_end, w + int(b) * PAGE)
            if lo < hi:
                yield lo, hi, int(swapped[a:b].sum())


def tls_segment(elf):
    return next((seg for seg in elf.loads_and_tls() if seg["p_type"] == "PT_TLS"), None)


def static_tls_bytes(space: AddressSpace) -> int:
    """The size of a thread's static TLS: every loaded module's PT_TLS segment, aligned, plus
    glibc's surplus."""
    total = arch.TLS_SURPLUS
    for path in space.modules():
        m = space.first_mapping_of(path)
        elf = elf_info(space.file_path(m)) if m is not None else None
        seg = tls_segment(elf) if elf is not None else None
        if seg is not None:
            align = max(seg["p_align"], 1)
            total += -(-seg["p_memsz"] // align) * align
    return total


def _split_tls(regions: list[Region], threads: list[Thread], tls_bytes: int) -> list[Region]:
    """Carve each thread's static TLS and control block out of the mapping that holds its thread
    pointer, never below its stack pointer (live frames stay stack)."""
    import bisect

    for t in threads:
        if t.tp is None:
            continue
        starts = [r.start for r in regions]
        i = bisect.bisect_right(starts, t.tp - 1) - 1
        if i < 0 or not regions[i].start <= t.tp - 1 < regions[i].end:
            continue
        r = regions[i]
        floor = t.sp if r.mapping.start <= t.sp < r.mapping.end else r.mapping.start
        lo, hi = max(r.start, t.tp - tls_bytes, floor), min(r.end, t.tp + arch.TCB_BYTES)
        if lo >= hi or r.module is not None:  # a module's own data keeps its symbols
            continue
        parts = [Region(r.start, lo, r.tier, r.mapping, r.tid, r.module)] if r.start < lo else []
        parts.append(Region(lo, hi, TIER_TLS, r.mapping, tid=t.tid))
        if hi < r.end:
            parts.append(Region(hi, r.end, r.tier, r.mapping, r.tid, r.module))
        regions[i : i + 1] = parts
    return regions
