"""Naming the root that anchors a block: a global by its ELF symbol ("`registry` in registry's .bss"),
a thread-local variable by its TLS symbol, a thread's stack frame by .eh_frame unwinding, a register;
or, where the runtime can say (runtime_label), the runtime's own holder: a CPython global, V8's heap."""

from __future__ import annotations

import bisect
import os
from collections.abc import Callable

from memdiag.system import arch

from ...elf import elf_info
from ...procmaps import AddressSpace
from ...stacks import Symbolizer, demangle
from ...unwind import StackSlice, unwind
from .match import Found
from .model import ANCHOR_KIND, TIER_REGISTER, TIER_RUNTIME, TIER_STACK, TIER_STATIC, TIER_TLS
from .regions import Region, tls_segment
from .stop import Thread


def _frame_name(space: AddressSpace, t: Thread, address: int, symbolizer: Symbolizer) -> str | None:
    """The function whose frame holds a stack address, by .eh_frame unwinding of the copy."""
    if not t.stack or not arch.supported():  # .eh_frame replayed with x86-64 registers
        return None
    result = unwind(space, t.ip, t.sp, t.bp, StackSlice(t.stack_base, t.stack))
    low = t.sp
    for pc, cfa in zip(result.addresses, result.cfas, strict=False):
        if low - arch.RED_ZONE <= address < cfa:
            return symbolizer.frame(pc).function
        low = cfa
    return None


def label(
    block: int, found: Found, regions: list[Region], threads: dict[int, Thread], space, symbolizer
) -> tuple[str, str]:
    """(kind, name) of the root that anchors a seed block."""
    tier = int(found.root_tier[block])
    kind = ANCHOR_KIND[tier]
    if tier == TIER_REGISTER:
        return kind, f"a register of thread {int(found.root_tid[block])}"
    r = regions[int(found.root_region[block])]
    addr = int(found.root_addr[block])
    if tier == TIER_STACK and r.tid is not None:
        main = " (main thread)" if r.tid == space.pid else ""
        fn = _frame_name(space, threads[r.tid], addr, symbolizer)
        return kind, f"the stack of thread {r.tid}{main}" + (f", in {fn}()" if fn else "")
    if tier in (TIER_STATIC, TIER_RUNTIME) and r.module is not None:
        return kind, _static_name(space, r, addr)
    if tier == TIER_TLS and r.tid is not None:
        main = " (main thread)" if r.tid == space.pid else ""
        var = _tls_name(space, threads[r.tid], addr)
        return kind, (f"{var} in " if var else "") + f"the thread-local storage of thread {r.tid}{main}"
    where = r.mapping.path or f"anonymous memory at {r.mapping.start:#x}"
    return kind, f"memory memdiag did not see allocated ({where})"


def runtime_label(block: int, found: Found, blocks, namer) -> tuple[str, str] | None:
    """The holder of a seed block in the runtime's terms, where the runtime names the object of the
    word that holds it (untracked heap, a module's data) or what the block itself holds (a pymalloc
    arena: the global holding most of its objects). A stack word is tried too: the newest arena is
    pointed at from the eval loop's C frames (the int it just made), and credited to the stack it
    claimed every arena its objects link to ("the stack of thread N, in clock_nanosleep()" for a
    list of tuples); a register names nothing the runtime knows."""
    if namer is None or int(found.root_tier[block]) == TIER_REGISTER:
        return None
    name = namer(int(found.root_addr[block]), int(blocks.starts[block]), int(blocks.sizes[block]))
    return ("runtime", name) if name else None


def v8_namer(pid: int) -> Callable[[int, int, int], str | None] | None:
    """For a Node target: a word in V8's heap names its block's holder "JavaScript objects in V8's
    heap" (an ArrayBuffer or a Buffer points at its contents, malloc'd outside the heap), where the
    scan alone would say "memory memdiag did not see allocated". None for any other target."""
    from memdiag.system.v8memory import read_v8_heap_ranges  # Node's reader, here: only a scan asks

    # V8 maps and unmaps its pages as it collects: where they are before the scan stops the target,
    # and once more after it resumes for a page mapped in between
    found = read_v8_heap_ranges(pid)
    if found is None:
        return None
    ranges = sorted(found)
    reread = False

    def inside(word: int) -> bool:
        at = bisect.bisect_right(ranges, (word, 1 << 64)) - 1
        return at >= 0 and ranges[at][0] <= word < ranges[at][1]

    def name(word: int, start: int, size: int) -> str | None:
        nonlocal reread
        if not inside(word) and not reread:
            reread = True
            ranges[:] = sorted(set(ranges) | set(read_v8_heap_ranges(pid) or ()))
        return "JavaScript objects in V8's heap" if inside(word) else None

    return name


def _tls_name(space: AddressSpace, t: Thread, addr: int) -> str | None:
    """The executable's thread-local variable at addr (its TLS block sits right below the thread
    pointer in variant II), as "`name` (thread-local)"."""
    exe = space.mappings[0].path if space.mappings and space.mappings[0].is_file else None
    elf = elf_info(space.file_path(space.mappings[0])) if exe else None
    seg = tls_segment(elf) if elf is not None else None
    if seg is None or t.tp is None:
        return None
    size = -(-seg["p_memsz"] // max(seg["p_align"], 1)) * max(seg["p_align"], 1)
    offset = addr - (t.tp - size)
    if not 0 <= offset < seg["p_memsz"]:
        return None
    sym = elf.tls_object_at(offset)
    return f"`{demangle(sym.name)}` (thread-local)" if sym is not None else None


def _static_name(space: AddressSpace, r: Region, addr: int) -> str:
    """A module's writable data by the variable that holds addr: "`registry` in registry's .bss"."""
    base = os.path.basename(r.module or "")
    mappings = [m for m in space.mappings if m.path == r.module]
    elf = elf_info(space.file_path(mappings[0])) if mappings else None
    bias = next((b for m in mappings if (b := elf.bias(m)) is not None), None) if elf is not None else None
    if elf is None or bias is None:
        return f"{base}'s writable data"
    sym = elf.object_at(addr - bias)
    section = elf.section_of(addr - bias) or "data"
    if sym is None:
        return f"{base}'s {section} (no symbol)"
    return f"`{demangle(sym[0].name)}` in {base}'s {section}"
