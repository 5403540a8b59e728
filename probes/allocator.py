"""Which allocator a process really uses, and where to put each uprobe.

The allocator is found the way the dynamic linker resolves ``malloc``: a preloaded or linked
allocator library (jemalloc, tcmalloc, mimalloc ...) first, then the executable itself (static
binaries, custom allocators), then libc. Each entry point comes from the first module that
defines it; one that no module defines is skipped, not fatal (jemalloc has no pvalloc or mmap).

Placement: a uprobe on an instruction the kernel cannot emulate is single-stepped out of line,
about 13 times dearer than an emulated one on this project's test machine (free+0 is `test
%rdi,%rdi` in glibc 2.36: ~9,800 ns; free+9, a push: ~730 ns). So the prologue is decoded (with
capstone) and the probe goes on the first emulated instruction (push of a register, nop) that every
call still reaches with its arguments intact; where there is none, on +0, and the report says so."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from memdiag.system import arch

from .codefacts import remembered
from .elf import ElfInfo, elf_info, passing_elf_info
from .procmaps import AddressSpace

KNOWN_ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc", "hoard", "snmalloc", "scudo")

# entry point -> (argument registers the BPF program reads, needs a return probe)
ENTRY_POINTS: dict[str, tuple[tuple[str, ...], bool]] = {
    "malloc": (("rdi",), True),
    "calloc": (("rdi", "rsi"), True),
    "realloc": (("rdi", "rsi"), True),
    "reallocarray": (("rdi", "rsi", "rdx"), True),
    "posix_memalign": (("rdi", "rsi", "rdx"), True),
    "aligned_alloc": (("rdi", "rsi"), True),
    "memalign": (("rdi", "rsi"), True),
    "valloc": (("rdi",), True),
    "pvalloc": (("rdi",), True),
    "free": (("rdi",), False),
    "mmap": (("rdi", "rsi"), True),
    "munmap": (("rdi",), False),
    "mremap": (("rdi", "rsi", "rdx"), True),
}
# Entry points of an allocator library's own (jemalloc, tcmalloc ...), probed only where such a
# library defines them: Debian's libjemalloc exports C++'s operator new and delete, so a C++
# program that preloads it never calls malloc at all (measured: 0 events on errleak_cpp), and its
# *allocx API is what some programs call directly. Under glibc, libstdc++'s operator new calls
# malloc, which is probed already: probing it too would double every C++ allocation's traps.
_NEW = (
    "_Znwm",
    "_Znam",
    "_ZnwmRKSt9nothrow_t",
    "_ZnamRKSt9nothrow_t",
    "_ZnwmSt11align_val_t",
    "_ZnamSt11align_val_t",
    "_ZnwmSt11align_val_tRKSt9nothrow_t",
    "_ZnamSt11align_val_tRKSt9nothrow_t",
)
_DELETE = (
    "_ZdlPv",
    "_ZdaPv",
    "_ZdlPvm",
    "_ZdaPvm",
    "_ZdlPvRKSt9nothrow_t",
    "_ZdaPvRKSt9nothrow_t",
    "_ZdlPvSt11align_val_t",
    "_ZdaPvSt11align_val_t",
    "_ZdlPvmSt11align_val_t",
    "_ZdaPvmSt11align_val_t",
    "_ZdlPvSt11align_val_tRKSt9nothrow_t",
    "_ZdaPvSt11align_val_tRKSt9nothrow_t",
)
LIBRARY_ENTRY_POINTS: dict[str, tuple[tuple[str, ...], bool]] = {
    **{name: (("rdi",), True) for name in _NEW},
    **{name: (("rdi",), False) for name in _DELETE},
    "mallocx": (("rdi",), True),
    "rallocx": (("rdi", "rsi"), True),
    "dallocx": (("rdi",), False),
    "sdallocx": (("rdi",), False),
}
ENTRY_POINTS.update(LIBRARY_ENTRY_POINTS)
# The BPF function for each entry point (bpf/memleak.c).
BPF_FUNCTION = {
    "malloc": "malloc_enter",
    "calloc": "calloc_enter",
    "realloc": "realloc_enter",
    "reallocarray": "reallocarray_enter",
    "posix_memalign": "posix_memalign_enter",
    "aligned_alloc": "aligned_alloc_enter",
    "memalign": "aligned_alloc_enter",
    "valloc": "valloc_enter",
    "pvalloc": "valloc_enter",
    "free": "free_enter",
    "mmap": "mmap_enter",
    "munmap": "munmap_enter",
    "mremap": "mremap_enter",
    **{name: "malloc_enter" for name in _NEW},  # size first, pointer returned
    **{name: "free_enter" for name in _DELETE},  # pointer first
    "mallocx": "malloc_enter",
    "rallocx": "realloc_enter",  # (pointer, size), like realloc
    "dallocx": "free_enter",
    "sdallocx": "free_enter",
}
# The entry points that hand out new memory, for counting how often the target allocates.
ALLOCATING = ("malloc", "_Znwm", "_Znam", "mallocx")
# Registers are 64-bit views; a write to any alias (edi, di) clobbers the argument.
_ALIASES = {
    "rdi": ("rdi", "edi", "di", "dil"),
    "rsi": ("rsi", "esi", "si", "sil"),
    "rdx": ("rdx", "edx", "dx", "dl", "dh"),
}
_SCAN_BYTES = 64


@dataclass(frozen=True)
class Placement:
    function: str
    module: str  # path of the module that defines it
    symbol_address: int
    offset: int  # bytes from the function's start
    instruction: str  # what the probe sits on
    emulated: bool
    return_probe: bool

    def describe(self) -> str:
        how = "emulated" if self.emulated else "single-stepped"
        return f"{self.function}+{self.offset} ({self.instruction}: {how}) in {os.path.basename(self.module)}"


def is_emulated(ins) -> bool:
    """Instructions arch/x86/kernel/uprobes.c emulates instead of single-stepping them: a push of
    a general register (push_setup_xol_ops), a one-byte nop, and the relative branches
    (branch_setup_xol_ops: jmp rel8/rel32, call rel32, the conditional jumps 70-7f and 0f 80-8f),
    none with an operand-size prefix (66), which the kernel refuses. jemalloc 5.3's free runs
    nine movs, shifts, ands and a cmp before its first branch: at free+0 a call cost 9.1 µs here,
    at that jne 0.62 µs (its thread-cache fast path, Debian's libjemalloc2)."""
    from capstone import x86_const as x86

    code = bytes(ins.bytes)
    if ins.group(x86.X86_GRP_BRANCH_RELATIVE) and 0x66 not in ins.prefix:
        op = code.lstrip(bytes([0xF2, 0xF3, 0x2E, 0x3E]))  # bnd/notrack and hint prefixes, as the kernel skips them
        if op[:1] in (b"\xeb", b"\xe9", b"\xe8") or 0x70 <= op[0] <= 0x7F:
            return True
        if op[:1] == b"\x0f" and len(op) > 1 and 0x80 <= op[1] <= 0x8F:
            return True
    if ins.id == x86.X86_INS_PUSH and ins.operands and ins.operands[0].type == x86.X86_OP_REG:
        return ins.operands[0].reg not in (
            x86.X86_REG_CS,
            x86.X86_REG_DS,
            x86.X86_REG_ES,
            x86.X86_REG_SS,
            x86.X86_REG_FS,
            x86.X86_REG_GS,
        )
    return ins.id == x86.X86_INS_NOP and ins.size == 1


def _writes(ins, regs: tuple[str, ...]) -> bool:
    _, written = ins.regs_access()
    return any(ins.reg_name(w) in _ALIASES[r] for r in regs for w in written)


def placed(elf: ElfInfo, path: str, function: str, exported_only: bool = True) -> Placement | None:
    """place(), remembered per file (probes/codefacts.py): decoded only in a file not read before."""

    def read() -> list | None:
        p = place(elf, path, function, exported_only)
        return None if p is None else [p.symbol_address, p.offset, p.instruction, p.emulated, p.return_probe]

    fact = remembered(elf, f"place {function} {int(exported_only)}", read)
    return None if fact is None else Placement(function, path, *fact)


def place(elf: ElfInfo, path: str, function: str, exported_only: bool = True) -> Placement | None:
    """Where function's probe goes in elf, read from its first instructions."""
    sym = elf.symbol_named(function, exported_only=exported_only)
    if sym is None:
        return None
    import capstone
    from capstone import x86_const as x86

    args, ret = ENTRY_POINTS[function]
    code = elf.read_at(sym.address, _SCAN_BYTES) or b""
    md = arch.disassembler()
    first = None
    expect_null_branch = False
    # A uretprobe needs the entry probe at +0 (the kernel hijacks the return address there), so
    # functions with a return probe may move only when +0 itself is emulated; it stays at +0.
    for ins in md.disasm(code, sym.address):
        if first is None:
            first = ins
            if ret:
                break
        if expect_null_branch and ins.id in (x86.X86_INS_JE, x86.X86_INS_JNE):
            # free(NULL) (delete of a null pointer) returns at once; skipping that path loses nothing.
            expect_null_branch = False
            continue
        if is_emulated(ins):
            # a branch taken here is the probe's own instruction: every call still reaches it
            return Placement(
                function,
                path,
                sym.address,
                ins.address - sym.address,
                f"{ins.mnemonic} {ins.op_str}".strip(),
                True,
                ret,
            )
        if ins.group(capstone.CS_GRP_JUMP) or ins.group(capstone.CS_GRP_CALL) or ins.group(capstone.CS_GRP_RET):
            break
        if BPF_FUNCTION[function] == "free_enter" and ins.id == x86.X86_INS_TEST and ins.op_str in ("rdi, rdi",):
            expect_null_branch = True
            continue
        if _writes(ins, args) or ins.id in (x86.X86_INS_SYSCALL,):
            break
        reads_rsp = any(r in (x86.X86_REG_RSP, x86.X86_REG_ESP) for r in ins.regs_access()[1])
        if reads_rsp:
            break  # the stack pointer moved by something other than a push: keep the unwind exact
    if first is None:
        return None
    text = f"{first.mnemonic} {first.op_str}".strip()
    return Placement(function, path, sym.address, 0, text, is_emulated(first), ret)


@dataclass(frozen=True)
class Allocator:
    name: str  # glibc, jemalloc, static (the executable), ...
    module: str
    placements: list[Placement]
    missing: list[str]  # entry points no loaded module defines
    forwarded: list[str] = field(default_factory=list)  # "_Znam -> _Znwm": covered by that one's probe


def _lands_at(elf: ElfInfo, address: int) -> int | None:
    """Where a function that only jumps elsewhere lands (libjemalloc's new[] is `jmp new`, its
    delete `jmp free@plt`; a CET build puts endbr64 first): the address, resolving a PLT stub to
    the function its slot is bound to in this same file. None when it does not just jump."""
    from capstone import x86_const as x86

    md = arch.disassembler()
    jump = None
    for ins in md.disasm(elf.read_at(address, 32) or b"", address):
        if ins.id in (x86.X86_INS_ENDBR64, x86.X86_INS_NOP):
            continue
        jump = ins
        break
    if jump is None or jump.id != x86.X86_INS_JMP or not jump.operands or jump.operands[0].type != x86.X86_OP_IMM:
        return None
    target = jump.operands[0].imm
    stub = next(md.disasm(elf.read_at(target, 16) or b"", target), None)  # a PLT stub: jmp *slot(%rip)?
    if stub is None or stub.id != x86.X86_INS_JMP or not stub.operands:
        return target
    op = stub.operands[0]
    if op.type != x86.X86_OP_MEM or op.mem.base != x86.X86_REG_RIP:
        return target
    name = elf.plt_slots().get(stub.address + stub.size + op.mem.disp)
    sym = elf.symbol_named(name) if name else None
    return sym.address if sym is not None else None


def _covered(elf: ElfInfo, p: Placement, placements: list[Placement]) -> Placement | None:
    """The placed probe a call to p's function runs into anyway (it jumps to that function at or
    before the probe, and the same BPF program would record it): probing p too would trap twice."""
    if p.offset != 0:
        return None
    landing = remembered(elf, f"lands {p.symbol_address:#x}", lambda: _lands_at(elf, p.symbol_address))
    if landing is None:
        return None
    return next(
        (
            q
            for q in placements
            if q.module == p.module
            and q.symbol_address <= landing <= q.symbol_address + q.offset
            and BPF_FUNCTION[q.function] == BPF_FUNCTION[p.function]
        ),
        None,
    )


def _allocator_name(path: str, exe: str) -> str:
    base = os.path.basename(path)
    for known in KNOWN_ALLOCATORS:
        if known in base:
            return known
    if path == exe:
        return "the executable (static or custom allocator)"
    if base.startswith("libc.so") or base.startswith("libc-"):
        return "glibc"
    return base


def _search_order(pid: int, space: AddressSpace) -> tuple[str, list[str]]:
    """The executable, and the modules in the order an entry point is looked for: a known
    allocator library first, then the executable, then the rest as mapped."""
    try:
        exe = os.readlink(f"/proc/{pid}/exe").removesuffix(" (deleted)")
    except OSError:
        exe = ""
    modules = space.modules()
    ordered = [m for m in modules if any(k in os.path.basename(m) for k in KNOWN_ALLOCATORS)]
    ordered += [m for m in modules if m == exe]
    ordered += [m for m in modules if m not in ordered]
    return exe, ordered


def allocator_module(pid: int) -> str | None:
    """The module find_allocator chooses (the first, in its order, where malloc can be placed),
    without placing every other entry point, and without keeping the files it read in elf_info's
    cache. The host's cost key asks it of memdiag itself, whose extension modules are mapped below
    its C library: find_allocator kept 17 of its files parsed (python3.11's symbols, ~90 KiB of
    pyelftools' structures each), 2.5 MiB of memdiag's resident memory, measured."""
    space = AddressSpace.of(pid)
    if space is None:
        return None
    exe, ordered = _search_order(pid, space)
    for module in ordered:
        mapping = space.first_mapping_of(module)
        path = space.file_path(mapping) if mapping else None
        elf = passing_elf_info(path) if path else None
        try:
            if elf is not None and placed(elf, module, "malloc", exported_only=module != exe) is not None:
                return module
        finally:
            if elf is not None:
                elf.close()
    return None


def find_allocator(pid: int, space: AddressSpace | None = None) -> Allocator | None:
    space = space or AddressSpace.of(pid)
    if space is None:
        return None
    exe, ordered = _search_order(pid, space)
    placements: list[Placement] = []
    missing: list[str] = []
    forwarded: list[str] = []
    chosen = None
    for function in ENTRY_POINTS:
        library_only = function in LIBRARY_ENTRY_POINTS
        for module in ordered:
            # an allocator library's own, or the executable's when it is the allocator (linked in)
            own = any(k in os.path.basename(module) for k in KNOWN_ALLOCATORS) or module == exe == chosen
            if library_only and not own:
                continue
            mapping = space.first_mapping_of(module)
            elf = elf_info(space.file_path(mapping)) if mapping else None
            if elf is None:
                continue
            # The executable's own functions count even unexported (a static binary's malloc).
            p = placed(elf, module, function, exported_only=module != exe)
            into = _covered(elf, p, placements) if p is not None else None
            if into is not None:
                forwarded.append(f"{function} -> {into.function}")  # its probe would trap a second time
                break
            if p is not None:
                # Aliases (aligned_alloc = memalign in glibc) share one probe: one trap per call.
                if not any(q.module == p.module and q.symbol_address == p.symbol_address for q in placements):
                    placements.append(p)
                if function == "malloc":
                    chosen = module
                break
        else:
            if not library_only:  # an allocator library's extras are not missing from glibc
                missing.append(function)
    if chosen is None:
        return None
    return Allocator(_allocator_name(chosen, exe), chosen, placements, missing, forwarded)
