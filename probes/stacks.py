"""User stacks: symbolization (function+offset and module; unknown frames kept and counted),
recovery of the frames that a frame-pointer walk loses, and folded output for flame graphs."""

from __future__ import annotations

import functools
import os
import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from memdiag.system.perfmap import PerfMap, perf_map_grew

from .codefacts import remembered
from .elf import elf_info, note_module
from .frame import Frame, split_clone
from .go.stacks import go_frames
from .procmaps import AddressSpace
from .unwind import StackSlice, frame_pointer_walk, unwind

# Rust's legacy mangling is the Itanium ABI's with a hash as the last component (`17h` and 16 hex
# digits): read by a Rust demangler, it is the path without the hash (claims::settle_claim), where
# a C++ demangler leaves the hash on (claims::settle_claim::h0123456789abcdef)
_RUST_LEGACY = re.compile(r"^_ZN.*17h[0-9a-f]{16}E$")


# a demangled name is cut here: a 159-byte Rust v0 symbol's back-references expand to a million
# characters, and every reader of a frame (the culprit's, the renderers') then pays for them
MAX_DEMANGLED = 4096


def _cut(name: str) -> str:
    return name if len(name) <= MAX_DEMANGLED else name[:MAX_DEMANGLED] + "…"


@functools.lru_cache(maxsize=65536)
def demangle(name: str) -> str:
    return _cut(_demangle(name))


def _demangle(name: str) -> str:
    """Names as people read them: C++'s (Itanium ABI) OrderBook::record(long), Rust's (legacy
    `_ZN...17h<hash>E` and v0 `_R...`) claims::settle_claim."""
    if name.startswith("_R") or _RUST_LEGACY.match(name):
        # here: a native module (rustc-demangle's algorithm, ~1.3 MiB resident), for Rust names only
        import multi_demangle

        try:
            return multi_demangle.demangle_symbol(name) or name  # a name it cannot read comes back as it is
        except Exception:  # noqa: BLE001  (the name is the binary's: whatever the demangler makes of it)
            return name
    if not name.startswith("_Z"):
        return name
    import cxxfilt  # here: it maps libstdc++ and its demangler (0.85 MiB resident), for C++ names only

    try:
        return cxxfilt.demangle(name)
    except (cxxfilt.InvalidName, OSError):
        return name


class Symbolizer:
    """Addresses of one process to frames. Failed look-ups are counted, not hidden. jit: a HotSpot
    JVM may be asked for its perf map (probes/jvm/perfmap.py, through its attach socket), for stacks read
    while the process runs; other JITs' maps are read as they are."""

    def __init__(self, space: AddressSpace | None, jit: bool = False):
        self.space = space
        self.failed = 0
        self.ask_jvm = jit
        self.perf_map: PerfMap | None = None  # the process's JIT names, read at the first JIT address

    def frame(self, address: int) -> Frame:
        mapping = self.space.find(address) if self.space else None
        if mapping is None:
            self.failed += 1
            return Frame(address=address)
        if not mapping.is_file:
            jit = self._jit_frame(address) if mapping.executable and not mapping.path else None
            if jit is not None:
                return jit
            self.failed += 1
            return Frame(address=address, module=mapping.path or "[anon]")
        elf = elf_info(self.space.file_path(mapping))
        bias = elf.bias(mapping) if elf else None
        hit = elf.lookup(address - bias) if elf and bias is not None else None
        if hit is None:
            self.failed += 1
            return Frame(address=address, module=mapping.path)
        sym, off = hit
        name, clone = split_clone(sym.name)  # process_order.isra.0: GCC's copy of process_order
        return Frame(address=address, function=demangle(name), offset=off, module=mapping.path, clone=clone)

    def line_request(self, frame: Frame, leaf: bool) -> tuple[str, str, tuple[int, int], int] | None:
        """What to ask of the line reader (probes/linechild.py) for this frame's file:line: the
        file, the module as mapped, its identity and the ELF address, or None where it has no
        line to look up. leaf: the address is where the code was (the stack's first frame); a
        caller's is the return address, the instruction after the call, whose line may be the
        next one."""
        if frame.function is None or frame.source is not None or frame.offset is None:
            return None  # unnamed, or named with its line already (Go), or no native frame
        mapping = self.space.find(frame.address) if self.space else None
        if mapping is None or not mapping.is_file:
            return None
        elf = elf_info(self.space.file_path(mapping))
        bias = elf.bias(mapping) if elf else None
        if elf is None or bias is None:
            return None
        return elf.path, mapping.path, elf.identity, frame.address - bias - (0 if leaf else 1)

    def _jit_frame(self, address: int) -> Frame | None:
        """Code a JIT generated, named by the runtime's perf map (Node under --perf-basic-prof);
        the map is read again when an address is not in it and the file has grown since."""
        if self.space is None:
            return None
        pm = self.perf_map
        if pm is None or (pm.lookup(address) is None and perf_map_grew(pm)):
            # here: it imports the JVM's attach (probes/jvm/), for JIT frames only
            from .jvm.perfmap import jit_perf_map

            pm = self.perf_map = jit_perf_map(self.space.pid, Path(self.space.proc or "/proc").parent, self.ask_jvm)
        hit = pm.lookup(address) if pm is not None else None
        if hit is None:
            return None
        function, source = hit.function()
        if source and source.startswith("node:") and not function.startswith("(anonymous"):  # Node's own JavaScript
            function = f"{source.rsplit(':', 1)[0]}.{function}"
        where = f"JS function at {source}" if source else "JIT code"
        return Frame(address=address, function=function, module=pm.path, source=where)

    def frames(self, addresses: Iterable[int]) -> list[Frame]:
        """One frame per address, or, in a Go executable, the frames its function table gives it:
        the calls the compiler inlined there, then the function (gostacks.go_frames)."""
        out: list[Frame] = []
        for i, a in enumerate(addresses):
            mapping = self.space.find(a) if self.space else None
            go = go_frames(self.space, mapping, a, leaf=i == 0) if mapping is not None and mapping.is_file else None
            out += go if go else [self.frame(a)]
        return out

    def forwards(self, address: int) -> bool:
        """The function at address reads as only forwarding an allocation (probes/forwarders.py)."""
        mapping = self.space.find(address) if self.space else None
        if mapping is None or not mapping.is_file:
            return False
        elf = elf_info(self.space.file_path(mapping))
        bias = elf.bias(mapping) if elf else None
        hit = elf.lookup(address - bias) if elf and bias is not None else None
        return hit is not None and _forwards_cached(elf, hit[0])


@functools.lru_cache(maxsize=16384)
def _forwards_cached(elf, sym) -> bool:
    def read() -> bool:
        from . import forwarders  # capstone: only for a function not read before (probes/codefacts.py)

        return forwarders.forwards(elf, sym)

    return remembered(elf, f"forwards {sym.address:#x} {sym.size}", read)


def release() -> None:
    """Let go of every file read for names (elf_info's parsed files and their unwind tables, the
    forwarder reads) and hand the memory freed back to the system: for once a report holds every
    name it needs, before it is rendered. The renderers and markdown-it add ~2 MiB when a report is
    written, which made the writing memdiag's peak (60.8 MiB on the kit's leak, 58-59 MiB before
    it); these caches give back ~2 MiB (measured there)."""
    import ctypes
    import gc

    from .elf import forget

    forget()
    _forwards_cached.cache_clear()
    gc.collect()
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)  # glibc's: free pages inside the heap too
    if trim is not None:
        trim(0)


def _executable(space: AddressSpace, address: int) -> bool:
    """Code: an executable mapping of a file, or an anonymous one (a JIT's code: V8's, a JVM's,
    whose frames keep frame pointers and a perf map may name)."""
    m = space.find(address)
    return m is not None and m.executable and (m.is_file or not m.path)


def recover(
    space: AddressSpace | None,
    fp_stack: list[int],
    regs: tuple[int, int, int] | None,
    stack: bytes | None,
) -> tuple[list[int], str]:
    """The best stack for one event and the method that produced it.

    fp_stack: the kernel's frame-pointer walk (ip first). regs: (ip, sp, bp) at the event.
    stack: the copy of user stack from sp. Order of preference: a complete .eh_frame unwind; a
    partial unwind joined to the frame-pointer walk where they meet, or else continued up the rbp
    chain from the rbp it restored for its last frame; the frame-pointer walk with
    the return address at sp restored as the caller of a frameless leaf."""
    if space is None or regs is None or stack is None:
        return fp_stack, "frame pointers"
    ip, sp, bp = regs
    result = unwind(space, ip, sp, bp, StackSlice(sp, stack))
    if result.complete:
        return result.addresses, "eh_frame"
    if len(result.addresses) > 1:
        tail = fp_stack[1:]
        # where they meet deepest: the frame-pointer walk's frames the unwind already has are not
        # repeated (a V8 stack unwound up to a builtin without call-frame info met it at its 2nd frame)
        joined = next((i for i in range(len(tail) - 1, -1, -1) if tail[i] in result.addresses), None)
        extra = tail[joined + 1 :] if joined is not None else []
        extra = _while_executable(space, extra)
        if extra:
            return result.addresses + extra, "eh_frame+frame pointers"
        # no meeting point (the kernel's walk began from an rbp that was no frame pointer: glibc's
        # malloc uses it as a register): walk the chain from the rbp the unwind restored for its
        # last frame (a V8 allocation unwound up to Builtins_CEntry went no further)
        floor = result.cfas[-1] if result.cfas else sp
        walked = frame_pointer_walk(result.bp, floor, StackSlice(sp, stack), lambda a: _executable(space, a))
        if walked:
            return result.addresses + walked, "eh_frame+frame pointers from its rbp"
        return result.addresses, "eh_frame (partial)"
    # No rules for the leaf: a frameless leaf's return address sits at sp.
    ra = StackSlice(sp, stack).read_u64(sp)
    if ra is not None and _executable(space, ra) and ra not in fp_stack[:2]:
        return [fp_stack[0] if fp_stack else ip, ra, *fp_stack[1:]], "frame pointers+leaf return address"
    return fp_stack or [ip], "frame pointers"


def _while_executable(space: AddressSpace, addresses: list[int]) -> list[int]:
    out = []
    for a in addresses:
        if not _executable(space, a):
            break
        out.append(a)
    return out


def sourced(stacks: list[tuple[list[str], list[Frame], AddressSpace | None]]) -> list[list[str]]:
    """Each stack's frames (as the probe named them, a runtime's frames among them) with file:line
    added to its native frames where a DWARF line table has it. A stack: (its frames, its native
    frames leaf first, its process's address space). For the stacks a report shows only; the
    lines are read in a process of memdiag's own under a memory and a time limit
    (probes/linechild.py), one for them all."""
    from .linechild import Request, lookup

    asks: dict[tuple[str, str, tuple[int, int]], dict[int, None]] = {}  # module -> its addresses, in order
    places: list[tuple[int, int, Frame, tuple, int]] = []  # (stack, frame position, frame, module, address)
    for n, (frames, native, space) in enumerate(stacks):
        if space is None or not native:
            continue
        symbolizer = Symbolizer(space)
        names = [str(f) for f in native]
        j = 0
        for pos, text in enumerate(frames):  # in order: a runtime's frames stand where the interpreter's were
            k = next((k for k in range(j, len(names)) if names[k] == text), None)
            if k is None:
                continue
            j = k + 1
            want = symbolizer.line_request(native[k], leaf=k == 0)
            if want is None:
                continue
            module, address = want[:3], want[3]
            asks.setdefault(module, {})[address] = None
            places.append((n, pos, native[k], module, address))
    out = [list(frames) for frames, _native, _space in stacks]
    if not asks:
        return out
    order = list(asks)
    answers = lookup([Request(m[0], m[1], m[2], tuple(asks[m])) for m in order])
    found: dict[tuple, dict[int, tuple[str, int] | None]] = {}
    for m, answer in zip(order, answers, strict=True):
        if answer.note:
            note_module(m[0], answer.note)
        if answer.lines is not None:
            found[m] = dict(zip(asks[m], answer.lines, strict=True))
    for n, pos, frame, module, address in places:
        at = found.get(module, {}).get(address)
        if at:
            out[n][pos] = str(frame.model_copy(update={"source": f"{at[0]}:{at[1]}"}))
    return out


def folded(stacks: Iterable[tuple[list[Frame], int]]) -> list[str]:
    """'root;...;leaf count' lines (Brendan Gregg's folded format), heaviest first."""
    counts: Counter[str] = Counter()
    for frames, count in stacks:
        names = [(f.function or f"[unknown {os.path.basename(f.module or '')}]".replace(" ]", "]")) for f in frames]
        counts[";".join(reversed(names)).replace(" ", "_")] += count
    return [f"{stack} {n}" for stack, n in counts.most_common()]
