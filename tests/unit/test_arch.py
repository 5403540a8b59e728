"""The architecture facts live in system/arch.py: C and Python share names, never bare numbers,
and a machine other than x86-64 gets one sentence, not a crash."""

import re
from pathlib import Path

from memdiag.probes import brkstack, fdstack, kernel, mmapsnoop
from memdiag.system import arch

BPF = Path(__file__).resolve().parents[2] / "bpf"


def test_every_syscall_number_the_programs_filter_on_comes_from_python():
    used = {m for path in BPF.glob("*.c") for m in re.findall(r"\bNR_[A-Z0-9_]+\b", path.read_text())}
    fd_calls = {f"NR_{name.upper()}" for name in (*arch.FD_SYSCALLS, *arch.SHM_SYSCALLS)}
    assert used == {"NR_BRK", "NR_MMAP", "NR_MUNMAP"} | fd_calls
    defined = set(arch.syscall_defines("x86_64")) | set(arch.syscall_defines("x86_64", arch.FD_SYSCALLS))
    assert used <= defined | set(arch.syscall_defines("x86_64", arch.SHM_SYSCALLS))
    numbers = {"NR_BRK": 12, "NR_MMAP": 9, "NR_MUNMAP": 11}
    assert brkstack.build_options() == numbers and mmapsnoop.build_options() == {**numbers, "PY_FRAMES": 1}
    fd = fdstack.build_options()
    assert (fd["NR_SOCKETPAIR"], fd["NR_PIPE2"], fd["NR_CLOSE"], fd["MAX_FDS"]) == (53, 293, 3, fdstack.MAX_FDS)


def test_pt_regs_fields_are_named_only_in_the_shared_header():
    for path in BPF.glob("*.c"):
        bare = re.findall(r"(?:regs|ctx)->(?:di|si|dx|r8|r9|r10|ip|sp|bp|ax)\b", path.read_text())
        assert not bare, f"{path.name} reads x86-64 pt_regs fields by name: {bare} (use memdiag.h)"


def test_other_machines_are_refused_in_one_sentence(monkeypatch):
    assert arch.supported("x86_64") and not arch.supported("aarch64")
    assert arch.syscall_defines("aarch64") == {}
    assert arch.syscall_number("bpf", "aarch64") == 280 and arch.syscall_number("brk", "aarch64") is None
    assert arch.USER_REGS["aarch64"].tp is None and arch.USER_REGS["x86_64"].sp == 19
    monkeypatch.setattr(arch, "MACHINE", "aarch64")
    for check in (kernel.bpf_runtime(), kernel.raw_syscall_tracepoints()):
        assert not check.available
        assert check.reason == "memdiag's BPF probes support x86-64 only; this machine is aarch64"


def test_library_paths_are_the_multiarch_folder():
    assert arch.library("libjemalloc.so.2") == "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
    assert Path(arch.library("libbcc.so.0")).exists()
