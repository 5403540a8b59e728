"""The bytecode relocation (probes/bpfobj.py, Program._insns) on hand-made instructions: every
map reference the compiler left (ld_imm64 with BPF_PSEUDO_MAP_FD or BPF_PSEUDO_MAP_VALUE) gets
the fd of the map this process created in its place; every other instruction, including a plain
64-bit constant that happens to hold the same number, is left byte for byte. No root: the
relocation is run on a Program whose maps are only numbers (no map is created)."""

from __future__ import annotations

import struct

import pytest
from memdiag.probes.bpfobj import Program
from memdiag.probes.bpfsys import BpfError, _cpu_list


def insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


def ld_imm64(dst: int, src: int, imm: int, high: int = 0) -> bytes:
    """The two-slot load: src 1 = map fd, 2 = map value, 0 = a plain constant (imm | high << 32)."""
    return insn(0x18, dst, src, 0, imm) + insn(0, 0, 0, 0, high)


MOV_R0_0, EXIT = insn(0xB7, 0, 0, 0, 0), insn(0x95)


def program(code: bytes, fd_of: dict[int, int]) -> Program:
    p = Program.__new__(Program)  # no __init__: it would create the maps (root); the fds are given
    p.compiled = {"name": "synthetic", "functions": {"f": code.hex()}}
    p._fd_of = fd_of
    p.funcs = {}
    return p


def slots(code: bytes) -> list[tuple[int, int, int, int]]:
    """(opcode, regs, off, imm) of every 8-byte slot."""
    return [struct.unpack_from("<BBhi", code, i) for i in range(0, len(code), 8)]


def test_map_fds_and_map_values_take_this_process_fds():
    code = ld_imm64(1, 1, 3) + MOV_R0_0 + ld_imm64(2, 2, 4, high=16) + EXIT
    out = program(code, {3: 41, 4: 42})._insns("f")
    assert len(out) == len(code)
    assert slots(out) == [
        (0x18, 0x11, 0, 41),  # r1 = map fd 3 -> 41
        (0, 0, 0, 0),
        (0xB7, 0, 0, 0),
        (0x18, 0x22, 0, 42),  # r2 = value of map 4 -> 42, its offset (the second slot) kept
        (0, 0, 0, 16),
        (0x95, 0, 0, 0),
    ]


def test_a_plain_constant_and_other_instructions_are_left_alone():
    # a 64-bit constant 3 (src 0), and a 32-bit move of 3: neither is a map reference
    code = ld_imm64(1, 0, 3, high=3) + insn(0xB7, 2, 0, 0, 3) + ld_imm64(3, 1, 3) + EXIT
    out = program(code, {3: 99})._insns("f")
    assert out[:24] == code[:24]
    assert slots(out)[3] == (0x18, 0x13, 0, 99) and out[32:] == code[32:]


def test_the_second_slot_of_a_load_is_never_read_as_an_instruction():
    # the high half of a constant whose bytes look like a map load: skipped as the load's second slot
    fake = struct.unpack("<i", bytes([0x18, 0x11, 0, 0]))[0]
    code = insn(0x18, 1, 0, 0, 7) + insn(0, 0, 0, 0, fake) + EXIT
    assert program(code, {})._insns("f") == code


def test_a_map_the_compiler_did_not_describe_is_refused_by_name():
    code = MOV_R0_0 + ld_imm64(1, 1, 5) + EXIT
    with pytest.raises(BpfError, match="^f: bytecode refers to a map the compiler did not describe$"):
        program(code, {3: 41})._insns("f")


def test_a_function_the_program_lacks_is_named():
    with pytest.raises(BpfError, match=r"^no function g in synthetic\.c$"):
        program(EXIT, {}).load_func("g", 2)


@pytest.mark.parametrize(
    ("text", "cpus"),
    [("0\n", [0]), ("0-3\n", [0, 1, 2, 3]), ("0-1,4,6-7\n", [0, 1, 4, 6, 7])],
)
def test_cpu_lists_as_the_kernel_writes_them(text, cpus):
    assert _cpu_list(text) == cpus
