"""The ptrace stop of the reachability scan, held by a process of its own: it seizes and interrupts
every thread of the target, hands their registers to memdiag, and resumes them when memdiag says so,
when memdiag is gone, or at the stop's deadline, whichever comes first. memdiag (stop.stopped) reads
the target's memory meanwhile through /proc/PID/mem, which needs no tracer.

Why a process: ptrace ties a tracee to the one thread that seized it, and only that thread can
detach it; a stop held by memdiag's scanning thread lasted as long as that thread was stuck, starved
or stopped (a SIGSTOP to memdiag kept the target stopped as long). This process keeps its own clock,
so a frozen memdiag cannot hold the target past the deadline; and when this process ends in any way
(memdiag kills it at the deadline if it is frozen itself), the kernel detaches every tracee of the
exiting tracer and they run on (exit_ptrace).

Standard library only, run by path (`python -I -S holder.py PID HOLD_S`): nothing of memdiag's is
imported, so it starts in tens of milliseconds. Its protocol, one JSON line each way: it writes
{"threads": [[tid, registers in hex], ...], "stopped_at": t} or {"refused": why} once the target is
stopped; memdiag writes any line (or closes the pipe) to release it; it answers {"released": "asked"
| "deadline", "held_s": seconds, "resumed_at": t} and exits. Each t is CLOCK_MONOTONIC (time.monotonic,
the same clock in every process) when the first seize began and when the last thread was let go: the
pause the target paid, without this process's own start."""

from __future__ import annotations

import contextlib
import ctypes as ct
import errno
import json
import os
import select
import sys
import time

STOP_TIMEOUT_S = 1.0  # a thread that does not stop in this time (uninterruptible sleep) aborts the scan

# ptrace(2) requests and the register set (NT_PRSTATUS)
PTRACE_DETACH, PTRACE_GETREGSET, PTRACE_SEIZE, PTRACE_INTERRUPT = 17, 0x4204, 0x4206, 0x4207
PTRACE_EVENT_STOP, NT_PRSTATUS, WALL = 128, 1, 0x40000000
REGSET_BYTES = 1024  # room for any machine's NT_PRSTATUS set (x86-64's is 216 bytes)

_libc = ct.CDLL(None, use_errno=True)
_libc.ptrace.restype = ct.c_long
_libc.ptrace.argtypes = [ct.c_long, ct.c_long, ct.c_void_p, ct.c_void_p]


class Refused(Exception):
    """The target could not be stopped; the message says why (memdiag's ScanAborted)."""


def _ptrace(request: int, tid: int, addr: int = 0, data: int = 0) -> None:
    if _libc.ptrace(request, tid, ct.c_void_p(addr), ct.c_void_p(data)) < 0:
        err = ct.get_errno()
        raise OSError(err, os.strerror(err))


class _IoVec(ct.Structure):
    _fields_ = [("base", ct.c_void_p), ("len", ct.c_size_t)]


def _regs(tid: int) -> bytes:
    buf = ct.create_string_buffer(REGSET_BYTES)
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
            raise Refused(f"thread {tid} did not stop within {STOP_TIMEOUT_S:g} s (uninterruptible sleep?)")
        time.sleep(0.0001)


def seize_all(pid: int, seized: dict[int, int]) -> None:
    """Stop every thread of pid, recording in seized tid -> the signal to hand back at detach (-1:
    gone). New threads created while stopping are stopped too (the set is re-read until stable)."""
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
                raise Refused(f"cannot stop thread {tid}: {e.strerror} (traced by a debugger?)") from None
            sig = _wait_stopped(tid, deadline)
            seized[tid] = -1 if sig is None else sig
    if not any(s >= 0 for s in seized.values()):
        raise Refused("the target exited")


def detach_all(seized: dict[int, int]) -> None:
    for tid, sig in seized.items():
        if sig >= 0:
            with contextlib.suppress(OSError):
                _ptrace(PTRACE_DETACH, tid, 0, sig)


def _say(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def hold(pid: int, hold_s: float) -> None:
    """Stop pid, hand over the registers, hold until asked, memdiag's end, or hold_s from now."""
    start = time.monotonic()
    deadline = start + hold_s
    with contextlib.suppress(OSError):  # memdiag runs niced: its holder's clock must not be starved
        os.setpriority(os.PRIO_PROCESS, 0, 0)
    seized: dict[int, int] = {}
    try:
        stopped_at = time.monotonic()
        try:
            seize_all(pid, seized)
            threads = [[tid, _regs(tid).hex()] for tid, sig in seized.items() if sig >= 0]
        except (Refused, OSError) as e:
            _say({"refused": str(e) if isinstance(e, Refused) else f"reading registers: {e.strerror}"})
            return
        _say({"threads": threads, "stopped_at": stopped_at})
        ready, _, _ = select.select([sys.stdin], [], [], max(deadline - time.monotonic(), 0.0))
        how = "asked" if ready else "deadline"  # a line, or the end of the pipe: memdiag is gone
    finally:
        detach_all(seized)
    _say({"released": how, "held_s": round(time.monotonic() - start, 3), "resumed_at": time.monotonic()})


if __name__ == "__main__":
    try:
        hold(int(sys.argv[1]), float(sys.argv[2]))
    except BrokenPipeError:  # memdiag gone: nothing to tell, and the target was resumed (hold's finally)
        os._exit(0)
