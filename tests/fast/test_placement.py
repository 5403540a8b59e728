"""Uprobe placement (probes/allocator.py) on synthetic code: prologues written byte by byte into a
real shared object (the system assembler and linker), read back by the real ElfInfo and decoded by
capstone. The probe goes on the first instruction the kernel emulates that every call reaches with
its arguments intact; a return probe stays at +0; anything that moves the stack, writes an
argument or branches ends the search at +0. No root: nothing is attached."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from memdiag.probes.allocator import _lands_at, place
from memdiag.probes.elf import ElfInfo

ENDBR64, TEST_RDI, JE_16, PUSH_RBX, PUSH_RBP, NOP = "f3 0f 1e fa", "48 85 ff", "74 10", "53", "55", "90"
MOV_RDI_RAX, MOV_RAX_RDI, SUB_RSP_8, XOR_EAX, PUSH_R12 = "48 89 c7", "48 89 f8", "48 83 ec 08", "31 c0", "41 54"
MOV_RCX_RDI, SHR_RAX_26, JNE_32, JMP_RAX = "48 89 f9", "48 c1 e8 1a", "0f 85 8a 00 00 00", "ff e0"

# function -> its code (hex bytes); every one ends in ret (c3) after padding
PROLOGUES = {
    "free": f"{ENDBR64} {TEST_RDI} {JE_16} {PUSH_RBX}",  # glibc's shape: the null check skipped
    "munmap": f"{MOV_RDI_RAX} {PUSH_RBX}",  # the argument overwritten before the push
    "_ZdlPv": f"{SUB_RSP_8} {PUSH_RBX}",  # the stack moved by other than a push
    "dallocx": f"{NOP} {PUSH_RBX}",
    "sdallocx": f"{MOV_RAX_RDI} {PUSH_R12}",  # the argument only read
    "malloc": f"{PUSH_RBP} {PUSH_RBX}",  # a return probe: +0, which is emulated
    "calloc": f"{TEST_RDI} {PUSH_RBX}",  # a return probe on an instruction stepped out of line
    "mremap": f"{PUSH_RBX}",  # hidden: not the dynamic linker's to bind
    # jemalloc 5.3's free: the argument copied and shifted (its rtree key) up to its first branch
    "_ZdaPv": f"{MOV_RAX_RDI} {MOV_RCX_RDI} {SHR_RAX_26} {JNE_32} {PUSH_RBX}",
    "_ZdaPvm": f"{JMP_RAX} {PUSH_RBX}",  # an indirect jump: stepped, and the search ends there
}


@pytest.fixture(scope="module")
def lib(tmp_path_factory) -> ElfInfo:
    if shutil.which("gcc") is None:
        pytest.fail("gcc is needed to assemble the synthetic library (scripts/setup.sh installs it)")
    d = tmp_path_factory.mktemp("placement")
    src = [".text"]
    for name, code in PROLOGUES.items():
        visibility = f".hidden {name}" if name == "mremap" else f".globl {name}"
        body = ", ".join(f"0x{b}" for b in code.split())
        src += [visibility, f".type {name}, @function", f"{name}:", f".byte {body}", ".fill 24, 1, 0x90", "ret"]
        src += [f".size {name}, .-{name}"]
    # operator new[] that only forwards to operator new (libjemalloc's shape), after an endbr64
    src += [".globl _Znwm", ".type _Znwm, @function", "_Znwm:", ".Lnew:", "push %rbx", "ret", ".size _Znwm, .-_Znwm"]
    src += [".globl _Znam", ".type _Znam, @function", "_Znam:", "endbr64", "jmp .Lnew", ".size _Znam, .-_Znam"]
    (d / "lib.s").write_text("\n".join(src) + "\n")
    out = d / "libsynthetic.so"
    subprocess.run(["gcc", "-shared", "-nostdlib", "-o", str(out), str(d / "lib.s")], check=True)
    info = ElfInfo(str(out))
    yield info
    info._file.close()


def _at(lib: ElfInfo, function: str, exported_only: bool = True):
    p = place(lib, lib.path, function, exported_only=exported_only)
    assert p is not None, function
    return p.offset, p.instruction, p.emulated, p.return_probe


def test_free_skips_its_null_check_to_the_push(lib):
    assert _at(lib, "free") == (9, "push rbx", True, False)
    assert place(lib, lib.path, "free").describe() == "free+9 (push rbx: emulated) in libsynthetic.so"


def test_an_argument_read_is_passed_an_argument_written_is_not(lib):
    assert _at(lib, "sdallocx") == (3, "push r12", True, False)
    assert _at(lib, "munmap") == (0, "mov rdi, rax", False, False)


def test_the_stack_moved_by_a_sub_keeps_the_probe_at_zero(lib):
    assert _at(lib, "_ZdlPv") == (0, "sub rsp, 8", False, False)


def test_a_relative_branch_is_emulated_and_every_call_reaches_it(lib):
    assert _at(lib, "_ZdaPv") == (10, "jne 0x{:x}".format(lib.symbol_named("_ZdaPv").address + 16 + 0x8A), True,
                                  False)  # fmt: skip
    assert _at(lib, "_ZdaPvm") == (0, "jmp rax", False, False)


def test_an_emulated_first_instruction_is_taken_at_once(lib):
    assert _at(lib, "dallocx") == (0, "nop", True, False)


def test_a_return_probe_stays_at_zero_emulated_or_not(lib):
    assert _at(lib, "malloc") == (0, "push rbp", True, True)
    assert _at(lib, "calloc") == (0, "test rdi, rdi", False, True)
    assert "single-stepped" in place(lib, lib.path, "calloc").describe()


def test_a_hidden_function_is_placed_only_when_asked_for_unexported_ones(lib):
    assert place(lib, lib.path, "mremap") is None
    assert _at(lib, "mremap", exported_only=False) == (0, "push rbx", True, True)
    assert place(lib, lib.path, "realloc") is None  # not defined here at all


def test_a_function_that_only_jumps_lands_where_it_jumps(lib):
    new, new_array = lib.symbol_named("_Znwm"), lib.symbol_named("_Znam")
    assert _lands_at(lib, new_array.address) == new.address  # past its endbr64
    assert _lands_at(lib, lib.symbol_named("free").address) is None  # code of its own


def test_the_synthetic_bytes_are_where_the_symbols_say(lib):
    # the fixture itself: what place() decoded is what was written
    for name, code in PROLOGUES.items():
        sym = lib.symbol_named(name)
        raw = bytes.fromhex(code.replace(" ", ""))
        assert lib.read_at(sym.address, len(raw)) == raw, name


def test_the_uprobe_file_offset_is_where_the_chosen_instruction_lies(lib):
    from memdiag.probes.bpfobj import _file_offset
    from memdiag.probes.bpfsys import BpfError

    p = place(lib, lib.path, "free")
    offset = _file_offset(lib.path.encode(), b"free", p.offset, None)
    with open(lib.path, "rb") as f:
        f.seek(offset)
        assert f.read(1) == bytes.fromhex(PUSH_RBX)  # the push the placement chose, in the file itself
    assert _file_offset(lib.path.encode(), b"", 0, lib.symbol_named("malloc").address) == offset - 9 - (
        lib.symbol_named("free").address - lib.symbol_named("malloc").address
    )
    with pytest.raises(BpfError, match="^nosuch not found in "):
        _file_offset(lib.path.encode(), b"nosuch", 0, None)
    with pytest.raises(BpfError, match="^0x7fff0000 is outside the loadable segments of "):
        _file_offset(lib.path.encode(), b"", 0, 0x7FFF0000)
