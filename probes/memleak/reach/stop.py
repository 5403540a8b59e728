"""Stopping every thread of the target with ptrace (seize + interrupt, waited for) for the scan, and
resuming them: the target's registers and memory are one instant's while it is stopped. Refused
before anything stops when a debugger or tracer holds a thread or one stays in uninterruptible sleep."""

from __future__ import annotations

import contextlib
import ctypes as ct
import errno
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from memdiag.system import arch

from .model import ScanAborted

D_STATE_WAIT_S = 0.2  # how long a thread may stay in uninterruptible sleep before the scan gives up
STOP_TIMEOUT_S = 1.0  # a thread that does not stop in this time (uninterruptible sleep) aborts the scan


# ptrace(2) requests and the register set (NT_PRSTATUS; its layout by machine: arch.USER_REGS)
PTRACE_DETACH, PTRACE_GETREGSET, PTRACE_SEIZE, PTRACE_INTERRUPT = 17, 0x4204, 0x4206, 0x4207
PTRACE_EVENT_STOP, NT_PRSTATUS, WALL = 128, 1, 0x40000000

_libc = ct.CDLL(None, use_errno=True)
_libc.ptrace.restype = ct.c_long
_libc.ptrace.argtypes = [ct.c_long, ct.c_long, ct.c_void_p, ct.c_void_p]


@dataclass
class Thread:
    tid: int
    regs: bytes
    sp: int
    ip: int
    bp: int
    tp: int | None = None  # the thread pointer (x86-64 fs_base): its TLS lies just below it
    stack: bytes = b""  # its stack from sp - red zone up, copied while stopped (to name frames)
    stack_base: int = 0


def _ptrace(request: int, tid: int, addr: int = 0, data: int = 0) -> None:
    if _libc.ptrace(request, tid, ct.c_void_p(addr), ct.c_void_p(data)) < 0:
        err = ct.get_errno()
        raise OSError(err, os.strerror(err))


class _IoVec(ct.Structure):
    _fields_ = [("base", ct.c_void_p), ("len", ct.c_size_t)]


def _regs(tid: int) -> bytes:
    buf = ct.create_string_buffer(1024)
    iov = _IoVec(ct.cast(buf, ct.c_void_p), len(buf))
    _ptrace(PTRACE_GETREGSET, tid, NT_PRSTATUS, ct.addressof(iov))
    return buf.raw[: iov.len]


def thread_ids(pid: int) -> set[int]:
    """The threads that can be stopped (a zombie thread, e.g. a leader that called
    pthread_exit, refuses PTRACE_SEIZE and has no memory of its own to point from)."""
    try:
        tids = {int(t) for t in os.listdir(f"/proc/{pid}/task")}
    except OSError:
        return set()
    return {t for t in tids if thread_state(pid, t) not in ("Z", "X", None)}


def thread_state(pid: int, tid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _status_field(pid: int, tid: int, name: str) -> str | None:
    try:
        with open(f"/proc/{pid}/task/{tid}/status") as f:
            for line in f:
                if line.startswith(name + ":"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def check_stoppable(pid: int) -> None:
    """Refuse before stopping anything: a thread traced by another tool (a debugger, strace), or
    in uninterruptible sleep for longer than a disk read (it would not stop in time)."""
    tids = thread_ids(pid)
    for tid in tids:
        tracer = _status_field(pid, tid, "TracerPid")
        if tracer not in (None, "0"):
            comm = _status_field(int(tracer), int(tracer), "Name") or "?"
            raise ScanAborted(f"thread {tid} is traced by PID {tracer} ({comm}): a debugger or tracer holds it")
    deadline = time.monotonic() + D_STATE_WAIT_S
    while any(thread_state(pid, t) == "D" for t in tids):
        if time.monotonic() > deadline:
            stuck = [t for t in tids if thread_state(pid, t) == "D"]
            raise ScanAborted(f"thread {stuck[0]} stays in uninterruptible sleep (D): it could not be stopped in time")
        time.sleep(0.005)


def _wait_stopped(tid: int, deadline: float) -> int | None:
    """Wait for a seized thread's stop; the signal to give back at detach (0 for none), or None
    when the thread is gone."""
    while True:
        try:
            got, status = os.waitpid(tid, os.WNOHANG | WALL)
        except ChildProcessError:
            return None
        if got == tid:
            if os.WIFEXITED(status) or os.WIFSIGNALED(status):
                return None
            if os.WIFSTOPPED(status):
                sig = os.WSTOPSIG(status)
                if status >> 16 == PTRACE_EVENT_STOP:
                    return 0
                return sig  # a signal-delivery stop (SIGTRAP too): the signal is handed back at detach
        if time.monotonic() > deadline:
            raise ScanAborted(f"thread {tid} did not stop within {STOP_TIMEOUT_S:g} s (uninterruptible sleep?)")
        time.sleep(0.0001)


def _own_threads(pid: int, seized: dict[int, int]) -> None:
    """Every thread seized is one of pid's: an id listed may have gone, with its thread, to a thread
    of another process before the seize (ids are pids). Asked with them all stopped."""
    try:
        tids = {int(t) for t in os.listdir(f"/proc/{pid}/task")}
    except OSError:
        tids = set()
    strangers = sorted(t for t, sig in seized.items() if sig >= 0 and t not in tids)
    if strangers:
        raise ScanAborted(f"thread {strangers[0]} was seized but is not a thread of PID {pid} (its id was reused)")


@contextlib.contextmanager
def stopped(pid: int, same: Callable[[], None] | None = None):
    """Every thread of pid stopped with ptrace for the duration; yields their Threads. New
    threads created while stopping are stopped too (the set is re-read until it is stable).
    same() raises ScanAborted unless pid is still the target process (system/identity.py): asked
    before the first seize and once every thread is seized, before anything is read; a change
    lets every seized thread go at once."""
    layout = arch.USER_REGS.get(arch.MACHINE)
    if layout is None:
        raise ScanAborted(f"memdiag does not know the register layout of {arch.MACHINE}")
    sp_i, tp_i, ip_i, bp_i, n_words = layout
    seized: dict[int, int] = {}  # tid -> signal to hand back
    threads: list[Thread] = []
    try:
        if same is not None:
            same()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while True:
            new = thread_ids(pid) - set(seized)
            if not new:
                break
            for tid in sorted(new):
                try:
                    _ptrace(PTRACE_SEIZE, tid)
                    _ptrace(PTRACE_INTERRUPT, tid)
                except OSError as e:
                    if e.errno == errno.ESRCH:
                        seized[tid] = -1  # exited meanwhile
                        continue
                    raise ScanAborted(f"cannot stop thread {tid}: {e.strerror} (traced by a debugger?)") from None
                sig = _wait_stopped(tid, deadline)
                seized[tid] = -1 if sig is None else sig
        if not any(s >= 0 for s in seized.values()):
            raise ScanAborted("the target exited")
        if same is not None:  # stopped threads do not exec; the threads seized are the target's, or none are read
            same()
            _own_threads(pid, seized)
        for tid, sig in seized.items():
            if sig < 0:
                continue
            raw = _regs(tid)
            if len(raw) != n_words * 8:  # a 32-bit (compat) task hands out its own, smaller set
                raise ScanAborted(f"a 32-bit target: memdiag reads {arch.MACHINE} registers only")
            words = [int.from_bytes(raw[i : i + 8], "little") for i in range(0, len(raw) - 7, 8)]
            tp = words[tp_i] if tp_i is not None else None
            threads.append(Thread(tid, raw, words[sp_i], words[ip_i], words[bp_i], tp))
        yield threads
    finally:
        for tid, sig in seized.items():
            if sig >= 0:
                with contextlib.suppress(OSError):
                    _ptrace(PTRACE_DETACH, tid, 0, sig)


def alive(pid: int) -> bool:
    return thread_state(pid, pid) not in (None, "Z", "X")
