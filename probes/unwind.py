"""User-space stack unwinding with .eh_frame, for code built without frame pointers.

Distro libraries (glibc, libstdc++) omit frame pointers, so the kernel's frame-pointer walk from
a fault or an allocation inside them loses the application's caller. The probes copy the user
registers (ip, sp, bp) and a bounded slice of the user stack at the event; this module replays the
call-frame rules of each function's FDE over that copy: CFA = rule register + offset, the return
address and saved rbp at their CFA offsets, named by x86-64 DWARF register numbers (system/arch.py)."""

from __future__ import annotations

import struct
from dataclasses import dataclass

from memdiag.system.arch import DWARF_BP as RBP
from memdiag.system.arch import DWARF_RA as RA
from memdiag.system.arch import DWARF_SP as RSP

from .elf import elf_info
from .procmaps import AddressSpace

MAX_FRAMES = 64


@dataclass(frozen=True)
class Unwound:
    addresses: list[int]
    complete: bool  # False when the walk stopped for lack of stack bytes or rules
    stopped: str  # why the walk stopped
    cfas: tuple[int, ...] = ()  # frame i spans [cfas[i-1] (sp for the first), cfas[i])
    bp: int | None = None  # rbp as the last frame had it (restored from its callees' saved copies)


class StackSlice:
    def __init__(self, base: int, data: bytes):
        self.base, self.data = base, data

    def read_u64(self, address: int) -> int | None:
        off = address - self.base
        if off < 0 or off + 8 > len(self.data):
            return None
        return struct.unpack_from("<Q", self.data, off)[0]


def unwind(space: AddressSpace, ip: int, sp: int, bp: int, stack: StackSlice) -> Unwound:
    regs = {RSP: sp, RBP: bp}
    addresses = [ip]
    pc = ip
    first = True
    cfas: list[int] = []

    def done(complete: bool, why: str) -> Unwound:
        return Unwound(addresses, complete, why, tuple(cfas), regs[RBP])

    while len(addresses) < MAX_FRAMES:
        mapping = space.find(pc)
        if mapping is None or not mapping.is_file:
            return done(False, "address outside any file mapping (JIT or bad frame)")
        elf = elf_info(space.file_path(mapping))
        bias = elf.bias(mapping) if elf else None
        if elf is None or bias is None:
            return done(False, f"cannot read {mapping.path}")
        # A return address points after the call; look up the call itself (pc - 1).
        row = elf.cfi_row(pc - bias - (0 if first else 1))
        first = False
        if row is None:
            return done(False, f"no .eh_frame rule for this address in {mapping.path}")
        cfa_rule = row["cfa"]
        if cfa_rule.expr is not None or cfa_rule.reg not in regs:
            return done(False, "CFA expression not supported (PLT stub or signal frame)")
        cfa = regs[cfa_rule.reg] + cfa_rule.offset
        cfas.append(cfa)
        ra_rule = row.get(RA)
        if ra_rule is None or ra_rule.type == "UNDEFINED":  # the outermost frame (_start, clone)
            return done(True, "end of stack")
        if ra_rule.type != "OFFSET":
            return done(False, "return address rule not supported")
        ra = stack.read_u64(cfa + ra_rule.arg)
        if ra is None:
            return done(False, "stack copy exhausted")
        bp_rule = row.get(RBP)
        if bp_rule is not None and bp_rule.type == "OFFSET":
            saved = stack.read_u64(cfa + bp_rule.arg)
            if saved is None:
                return done(False, "stack copy exhausted")
            regs[RBP] = saved
        regs[RSP] = cfa
        if ra == 0:
            return done(True, "end of stack")
        addresses.append(ra)
        pc = ra
    return done(False, f"more than {MAX_FRAMES} frames")


def frame_pointer_walk(bp: int | None, floor: int, stack: StackSlice, is_code, limit: int = MAX_FRAMES) -> list[int]:
    """Return addresses up an rbp chain in the stack copy, from a frame whose rbp is `bp`: what code
    without call-frame rules but with frame pointers leaves (V8's builtins and JIT frames). Each
    rbp must lie above the last (from `floor`, the frame's own sp), 8-aligned, inside the copy, and
    each return address be code (is_code): the walk stops at the first that is not."""
    out: list[int] = []
    while bp and len(out) < limit:
        if bp < floor or bp % 8:
            break
        ra, caller_bp = stack.read_u64(bp + 8), stack.read_u64(bp)
        if ra is None or caller_bp is None or not is_code(ra):
            break
        out.append(ra)
        floor, bp = bp + 16, caller_bp
    return out
