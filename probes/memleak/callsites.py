"""Where a function calls the allocator, read from its machine code (capstone): each call's return
address, where the block's address is in rax and the caller's frame is the top of the stack.

A uprobe there traps only when that function allocates. That is what narrows allocation tracing
to the code a page-fault profile named, where a probe on malloc itself would trap on every call of
a hot program (at over a million calls a second the target loses most of its time to the traps).

A call is to the allocator when its target is one of the returning entry points: directly (a
static build, or a call within the allocator's own module), through a PLT stub (`jmp *slot(%rip)`,
with `endbr64` and `bnd` first in CET builds' .plt.sec) or through the GOT (-fno-plt: `call
*slot(%rip)`), the slot's relocation naming the function. A tail call (`jmp malloc@plt`) returns
to the function's caller, not here, and is left out: the caller's own call site is the one to trap."""

from __future__ import annotations

from dataclasses import dataclass

from capstone import x86_const as x86
from memdiag.system import arch

from ..elf import ElfInfo
from ..forwarders import forwards
from ..symtab import Symbol

# The entry points that hand back a block in rax (posix_memalign returns it through memory)
RETURNING = ("malloc", "calloc", "realloc", "_Znwm", "_Znam", "_ZnwmRKSt9nothrow_t", "_ZnamRKSt9nothrow_t",
             "aligned_alloc", "memalign", "valloc", "pvalloc", "reallocarray", "strdup", "strndup",
             "mallocx", "rallocx")  # fmt: skip
MAX_FUNCTION_BYTES = 1 << 20  # a symbol claiming more is not one function's code


@dataclass(frozen=True)
class CallSite:
    caller: str  # the function, as its symbol names it
    callee: str  # the allocator's entry point called
    call_address: int  # the call instruction (the ELF's virtual address)
    return_address: int  # the instruction after it: rax holds the block there


def call_sites(elf: ElfInfo, sym: Symbol, callees: tuple[str, ...] = RETURNING) -> list[CallSite]:
    """The calls from sym's code to callees, in address order."""
    return [CallSite(sym.name, name, at, ret) for at, ret, name in _calls(elf, sym) if name in callees]


def wrapper_sites(elf: ElfInfo, sym: Symbol) -> list[CallSite]:
    """The calls from sym's code to a wrapper of the allocator one level down: a function of the
    same file that calls the allocator itself and only forwards what it returned (forwarders.py:
    xmalloc, a project's ticket_alloc; not a function that fills the block, such as the kit's
    handle_request, which main calls). What the wrapper returns is the block."""
    found, wraps = [], {}
    for at, ret, name in _calls(elf, sym):
        if name is None or name in RETURNING:
            continue
        if name not in wraps:
            callee = elf.symbol_named(name)
            wraps[name] = callee is not None and bool(call_sites(elf, callee)) and forwards(elf, callee)
        if wraps[name]:
            found.append(CallSite(sym.name, name, at, ret))
    return found


def _calls(elf: ElfInfo, sym: Symbol) -> list[tuple[int, int, str | None]]:
    """(call address, return address, the called function's name or None) of each call in sym."""
    if not 0 < sym.size <= MAX_FUNCTION_BYTES:
        return []
    code = elf.read_at(sym.address, sym.size)
    if code is None:
        return []
    md = arch.disassembler()
    slots = elf.got_slots()
    out = []
    for ins in md.disasm(code, sym.address):
        if ins.id != x86.X86_INS_CALL or not ins.operands:
            continue
        op = ins.operands[0]
        name = None
        if op.type == x86.X86_OP_IMM:
            name = _named_target(elf, md, op.imm, slots)
        elif op.type == x86.X86_OP_MEM and op.mem.base == x86.X86_REG_RIP and op.mem.index == 0:
            name = slots.get(ins.address + ins.size + op.mem.disp)
        out.append((ins.address, ins.address + ins.size, name))
    return out


def _named_target(elf: ElfInfo, md, target: int, slots: dict[int, str]) -> str | None:
    """What a direct call lands in: a PLT stub's bound function, or the symbol at the target."""
    for ins in md.disasm(elf.read_at(target, 16) or b"", target):
        if ins.id == x86.X86_INS_ENDBR64:
            continue
        if ins.id == x86.X86_INS_JMP and ins.operands:
            op = ins.operands[0]
            if op.type == x86.X86_OP_MEM and op.mem.base == x86.X86_REG_RIP and op.mem.index == 0:
                return slots.get(ins.address + ins.size + op.mem.disp)
        break
    at = elf.lookup(target)
    if at is None or at[1] != 0:
        return None
    return at[0].name.split("@")[0]
