"""Does a function only forward an allocation? Read from its machine code (capstone).

An allocation wrapper (xmalloc, a project's own my_alloc) calls the allocator and hands back what
it returned, perhaps after checking it for NULL, counting it or logging: it never writes through
the block. Code worth reading initialises the block (`o->id = id`) or stores it somewhere. So a
function is read as a forwarder when it is small, returns what a call returned (or tail-jumps), and
neither a memory access after a call uses the returned pointer (rax, or a register it was copied
to) as its base or index, nor a later call gets it as an argument (an initialiser would). So
wrappers that pass the block on (calloc-style memset, redis's malloc_usable_size accounting) are
not caught here: the playbook's list names those.
The sweep is linear (branches are not followed): a guess, which the report says it is, and which
the caller only applies to a frame whose callee in the stack is an allocator or a wrapper."""

from __future__ import annotations

import functools

import capstone
from capstone import x86_const as x86
from memdiag.system import arch

from .elf import ElfInfo
from .symtab import Symbol

MAX_BYTES = 320  # xmalloc is ~40 bytes, redis's zmalloc_usable ~120; a function that does more is not a wrapper
_CALLER_SAVED = {
    x86.X86_REG_RAX, x86.X86_REG_RCX, x86.X86_REG_RDX, x86.X86_REG_RSI, x86.X86_REG_RDI,
    x86.X86_REG_R8, x86.X86_REG_R9, x86.X86_REG_R10, x86.X86_REG_R11,
}  # fmt: skip
_ARGUMENTS = {x86.X86_REG_RDI, x86.X86_REG_RSI, x86.X86_REG_RDX, x86.X86_REG_RCX, x86.X86_REG_R8, x86.X86_REG_R9}


@functools.lru_cache(maxsize=1)
def _disassembler() -> capstone.Cs:
    return arch.disassembler()


def forwards(elf: ElfInfo, sym: Symbol) -> bool:
    """True when the function's code reads as only forwarding what a call returned."""
    if not 0 < sym.size <= MAX_BYTES:
        return False
    code = elf.read_at(sym.address, sym.size)
    if code is None:
        return False
    return _forwards(list(_disassembler().disasm(code, sym.address)))


def _forwards(instructions: list) -> bool:
    held: set[int] = set()  # registers that hold what the latest call returned
    calls = returns = 0
    for ins in instructions:
        if ins.group(capstone.CS_GRP_RET):
            returns += x86.X86_REG_RAX in held
            continue
        if ins.group(capstone.CS_GRP_CALL):
            if held & _ARGUMENTS:  # the block handed to other code (an initialiser): not only forwarded
                return False
            calls += 1
            held = (held - _CALLER_SAVED) | {x86.X86_REG_RAX}
            continue
        if ins.group(capstone.CS_GRP_JUMP) and ins.id == x86.X86_INS_JMP:
            tail = ins.operands[0].type == x86.X86_OP_IMM  # a tail call forwards by itself
            calls, returns = calls + tail, returns + tail
        if any(_uses_as_address(op, held) for op in ins.operands):
            return False
        held = _after(ins, held)
    return calls > 0 and returns > 0


def _uses_as_address(op, held: set[int]) -> bool:
    if op.type != x86.X86_OP_MEM or op.mem.base == x86.X86_REG_RIP:
        return False
    return op.mem.base in held or op.mem.index in held


def _after(ins, held: set[int]) -> set[int]:
    """held after one instruction: a register copy carries the pointer on; any other write drops it."""
    try:
        _read, written = ins.regs_access()
    except capstone.CsError:
        return held
    written = {_full(r) for r in written}
    if not written:
        return held
    ops = ins.operands
    copy = ins.id == x86.X86_INS_MOV and len(ops) == 2 and ops[1].type == x86.X86_OP_REG and _full(ops[1].reg) in held
    out = held - written
    if copy and ops[0].type == x86.X86_OP_REG:
        out.add(_full(ops[0].reg))
    return out


_FULL = {}
for _name in ("AX", "BX", "CX", "DX", "SI", "DI", "BP", "SP"):
    for _alias in (f"E{_name}", _name, f"{_name[0]}L" if _name[1] == "X" else f"{_name}L"):
        if hasattr(x86, f"X86_REG_{_alias}"):
            _FULL[getattr(x86, f"X86_REG_{_alias}")] = getattr(x86, f"X86_REG_R{_name}")
for _n in range(8, 16):
    for _suffix in ("D", "W", "B"):
        _FULL[getattr(x86, f"X86_REG_R{_n}{_suffix}")] = getattr(x86, f"X86_REG_R{_n}")


def _full(reg: int) -> int:
    """The 64-bit register a sub-register belongs to (eax -> rax)."""
    return _FULL.get(reg, reg)
