"""The machine-specific facts memdiag relies on, in one place: memdiag supports x86-64 only.

Elsewhere it refuses once, with one line, instead of crashing: kernel.bpf_runtime() (which every
probe's load and `memdiag prepare` check) gives refusal() as the reason no probe can run, and the
diagnosis goes on with the counters from /proc and /sys, which are the same on every machine. What
makes the probes x86-64 only:

- the BPF programs read struct pt_regs by x86-64 field names (bpf/memdiag.h: the user ip, sp and
  bp; the syscall arguments in di, si, dx, r10) and filter raw syscalls by x86-64 numbers
  (syscall_defines(), passed to the compiler as -D NR_BRK=... so C and Python share no bare number);
- user-space unwinding replays .eh_frame rules with x86-64 DWARF register numbers (DWARF_*);
- uprobe placement and the forwarder test read x86-64 machine code (disassembler(); the probes
  match capstone's x86 instruction ids themselves);
- the reachability scan reads NT_PRSTATUS register sets (USER_REGS, which knows aarch64 too) and
  skips the x86-64 SysV red zone below the stack pointer (RED_ZONE); it finds threads' TLS by the
  x86-64 layout (TLS variant II: TCB_BYTES, TLS_SURPLUS), which aarch64's register set does not give;
- distro libraries live in the Debian multiarch folder (LIB_DIRS).

The bpf(2) and perf_event_open(2) numbers are known for aarch64 as well (SYSCALLS), so the
calls that load prepared programs name the machine they do not know rather than a wrong number."""

from __future__ import annotations

import os
from typing import NamedTuple

MACHINE = os.uname().machine  # what `uname -m` says: x86_64, aarch64, ...
SUPPORTED = "x86_64"

# System call numbers (arch/x86/entry/syscalls/syscall_64.tbl; include/uapi/asm-generic/unistd.h for
# arm64). brk/mmap/munmap and the descriptor calls are what the raw-syscall probes filter on; only
# x86-64's are given.
# setresuid/setresgid are called raw to change one thread's credentials (glibc's wrappers change
# every thread's): a JVM's attach socket is spoken to as the JVM's own user.
SYSCALLS = {
    "x86_64": {
        "bpf": 321,
        "perf_event_open": 298,
        "brk": 12,
        "mmap": 9,
        "munmap": 11,
        "setresuid": 117,
        "setresgid": 119,
        "openat2": 437,
        # the calls that create the descriptors fdstack follows, and close()
        "socket": 41,
        "socketpair": 53,
        "accept": 43,
        "accept4": 288,
        "pipe": 22,
        "pipe2": 293,
        "eventfd": 284,
        "eventfd2": 290,
        "epoll_create": 213,
        "epoll_create1": 291,
        "inotify_init": 253,
        "inotify_init1": 294,
        "memfd_create": 319,
        "timerfd_create": 283,
        "signalfd": 282,
        "signalfd4": 289,
        "close": 3,
        # the calls that make shared memory shmwriter follows, and the unlinks that remove files
        "open": 2,
        "openat": 257,
        "creat": 85,
        "shmget": 29,
        "unlink": 87,
        "unlinkat": 263,
    },
    "aarch64": {"bpf": 280, "perf_event_open": 241, "setresuid": 147, "setresgid": 149, "openat2": 437},
}
RAW_SYSCALLS = ("brk", "mmap", "munmap")  # passed to BPF as NR_BRK, NR_MMAP, NR_MUNMAP
# fdstack's: the calls that create sockets, pipes, eventfds ... and close() (NR_SOCKET, NR_CLOSE, ...)
FD_SYSCALLS = ("socket", "socketpair", "accept", "accept4", "pipe", "pipe2", "eventfd", "eventfd2", "epoll_create",
               "epoll_create1", "inotify_init", "inotify_init1", "memfd_create", "timerfd_create", "signalfd",
               "signalfd4", "close")  # fmt: skip
# shmwriter's: the calls that create files, memfds and System V segments, and unlink (NR_OPENAT, ...)
SHM_SYSCALLS = ("open", "openat", "openat2", "creat", "memfd_create", "shmget", "unlink", "unlinkat")


class RegLayout(NamedTuple):
    """Indices of 8-byte words in the NT_PRSTATUS register set (the kernel's user_regs_struct)."""

    sp: int  # stack pointer
    tp: int | None  # thread pointer (x86-64 fs_base); None where it is not in this set
    ip: int  # instruction pointer
    bp: int  # frame pointer
    words: int  # size of the set


USER_REGS = {
    "x86_64": RegLayout(sp=19, tp=21, ip=16, bp=4, words=27),
    "aarch64": RegLayout(sp=31, tp=None, ip=32, bp=29, words=34),
}

# x86-64 DWARF register numbers (SysV psABI, figure 3.36), as .eh_frame rules name them
DWARF_BP, DWARF_SP, DWARF_RA = 6, 7, 16
RED_ZONE = 128  # x86-64 SysV: a leaf function may keep data this far below the stack pointer
# x86-64 (TLS variant II): a thread's static TLS lies just below its thread pointer, the thread
# control block (glibc's struct pthread, 2,304 bytes in 2.36) at and above it. The static TLS is the
# modules' PT_TLS segments plus the surplus glibc keeps for dlopen()ed ones (1,664 bytes in 2.36).
TCB_BYTES = 2304
TLS_SURPLUS = 1664

MULTIARCH = {"x86_64": "x86_64-linux-gnu", "aarch64": "aarch64-linux-gnu"}  # Debian's library triplets
LIB_DIRS = tuple(f"{root}/{MULTIARCH.get(MACHINE, MACHINE + '-linux-gnu')}" for root in ("/lib", "/usr/lib"))


def supported(machine: str | None = None) -> bool:
    return (machine or MACHINE) == SUPPORTED


def refusal(machine: str | None = None) -> str:
    """The one sentence memdiag's probes give on a machine other than x86-64."""
    return f"memdiag's BPF probes support x86-64 only; this machine is {machine or MACHINE}"


def syscall_number(name: str, machine: str | None = None) -> int | None:
    """A system call's number on this machine, None when memdiag does not know it."""
    return SYSCALLS.get(machine or MACHINE, {}).get(name)


def syscall_defines(machine: str | None = None, names: tuple[str, ...] = RAW_SYSCALLS) -> dict[str, int]:
    """-D options for the raw-syscall probes' programs: NR_BRK, NR_MMAP, NR_MUNMAP, or those of
    `names` (FD_SYSCALLS for fdstack); empty off x86-64."""
    machine = machine or MACHINE
    if not supported(machine):
        return {}
    return {f"NR_{name.upper()}": SYSCALLS[machine][name] for name in names}


def library(name: str) -> str:
    """Where the distro installs a shared library (in /usr/lib's multiarch folder)."""
    return f"{LIB_DIRS[1]}/{name}"


def disassembler():
    """A capstone disassembler for this machine's code (x86-64), with instruction details on."""
    import capstone  # only the uprobe-placement paths disassemble; the readers of /proc never do

    md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    md.detail = True
    return md
