"""Stopping every thread of the target with ptrace (seize + interrupt, waited for) for the scan, and
resuming them: the target's registers and memory are one instant's while it is stopped. Refused
before anything stops when a debugger or tracer holds a thread or one stays in uninterruptible sleep.
The stop itself is held by a process of its own (holder.py), which resumes the target at the stop's
deadline even when memdiag is stuck, starved or stopped."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from memdiag.system import arch

from . import holder
from .holder import thread_ids, thread_state
from .model import ScanAborted

D_STATE_WAIT_S = 0.2  # how long a thread may stay in uninterruptible sleep before the scan gives up
# How long past the pause allowed (--max-pause) the holder keeps the target stopped before it resumes
# it on its own: the scan's own check gives up at the allowance, between two chunks of its read, and
# then resumes the target at once; the margin covers that last chunk and the release, so the holder's
# clock only acts when memdiag cannot (stuck in a read, starved, stopped).
RELEASE_MARGIN_S = 0.5
# memdiag's own clock on the holder, past the holder's: a holder that is itself stopped or starved
# is killed, and the kernel resumes the tracees of an exiting tracer.
KILL_MARGIN_S = 0.5
# A stop with no allowance (--max-pause unset in `memdiag probe`) still ends: the longest pause any
# --max-pause could allow (its option's ceiling, a day).
NO_LIMIT_HOLD_S = 86_400.0
HOLDER_START_S = 10.0  # for the holder to exit once asked (its whole start measured here: 10 ms, 10 MiB)
_HOLDER = Path(holder.__file__)


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


def _own_threads(pid: int, seized: list[int]) -> None:
    """Every thread seized is one of pid's: an id listed may have gone, with its thread, to a thread
    of another process before the seize (ids are pids). Asked with them all stopped."""
    try:
        tids = {int(t) for t in os.listdir(f"/proc/{pid}/task")}
    except OSError:
        tids = set()
    strangers = sorted(t for t in seized if t not in tids)
    if strangers:
        raise ScanAborted(f"thread {strangers[0]} was seized but is not a thread of PID {pid} (its id was reused)")


@contextlib.contextmanager
def stopped(
    pid: int, allowed_ms: float | None = None, same: Callable[[], None] | None = None, times: dict | None = None
):
    """Every thread of pid stopped with ptrace for the duration; yields their Threads. The holder
    process holds the stop (seizing new threads created while stopping too) and resumes the target
    allowed_ms + RELEASE_MARGIN_S after the stop began even if this thread never leaves the block;
    then ScanAborted, as what was read meanwhile is no one instant's. same() raises ScanAborted
    unless pid is still the target process (system/identity.py): asked before the holder seizes
    anything and once every thread is seized, before anything is read; a change lets every seized
    thread go at once (the finally's release). times, a dict if given, gets the holder's
    "stopped_at" and "resumed_at" (time.monotonic: when its first seize began, when it let the last
    thread go), the pause the target paid: the holder's own start (10-20 ms here) is not part of it."""
    if same is not None:
        same()
    layout = arch.USER_REGS.get(arch.MACHINE)
    if layout is None:
        raise ScanAborted(f"memdiag does not know the register layout of {arch.MACHINE}")
    sp_i, tp_i, ip_i, bp_i, n_words = layout
    hold_s = (NO_LIMIT_HOLD_S if allowed_ms is None else allowed_ms / 1000) + RELEASE_MARGIN_S
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", str(_HOLDER), str(pid), f"{hold_s:.3f}"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a terminal's Ctrl-C is memdiag's to handle: it releases the stop itself
    )
    # memdiag's clock on the holder: killed past its own deadline (a stopped or starved holder)
    killer = threading.Timer(hold_s + KILL_MARGIN_S, _kill, args=(proc,))
    killer.daemon = True
    killer.start()
    released: dict = {}
    try:
        said = _line(proc)
        if "threads" not in said:
            raise ScanAborted(said.get("refused") or "the stop's holder ended before the target was stopped")
        if times is not None:
            times["stopped_at"] = _clock(said.get("stopped_at"))
        if same is not None:  # stopped threads do not exec; the threads seized are the target's, or none are read
            same()
            _own_threads(pid, [tid for tid, _ in said["threads"]])
        threads: list[Thread] = []
        for tid, raw_hex in said["threads"]:
            raw = bytes.fromhex(raw_hex)
            if len(raw) != n_words * 8:  # a 32-bit (compat) task hands out its own, smaller set
                raise ScanAborted(f"a 32-bit target: memdiag reads {arch.MACHINE} registers only")
            words = [int.from_bytes(raw[i : i + 8], "little") for i in range(0, len(raw) - 7, 8)]
            tp = words[tp_i] if tp_i is not None else None
            threads.append(Thread(tid, raw, words[sp_i], words[ip_i], words[bp_i], tp))
        yield threads
    finally:
        released = _release(proc)
        killer.cancel()
        if times is not None:
            times["resumed_at"] = _clock(released.get("resumed_at"))
    if released.get("released") != "asked":
        raise ScanAborted(
            f"the target was resumed at the stop's deadline ({hold_s:g} s: --max-pause and a margin) before "
            "the scan ended; a partial scan concludes nothing"
        )


def _clock(value) -> float | None:
    """A time.monotonic() reading the holder reported, or None."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _line(proc: subprocess.Popen) -> dict:
    """The holder's next message ({} when it ended without one)."""
    line = proc.stdout.readline() if proc.stdout else ""
    try:
        said = json.loads(line) if line else {}
    except ValueError:
        return {}
    return said if isinstance(said, dict) else {}


def _release(proc: subprocess.Popen) -> dict:
    """Ask the holder to resume the target; its answer ({} if it was gone or killed)."""
    with contextlib.suppress(OSError):  # BrokenPipeError: it ended already
        proc.stdin.write("release\n")
        proc.stdin.close()
    said = _line(proc)
    try:
        proc.wait(HOLDER_START_S)
    except subprocess.TimeoutExpired:
        _kill(proc)
        proc.wait()
    proc.stdout.close()
    return said


def _kill(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGKILL)


def alive(pid: int) -> bool:
    return thread_state(pid, pid) not in (None, "Z", "X")
