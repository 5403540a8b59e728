"""The process-wide record of the first SIGINT or SIGTERM a command received, and the phase the main
thread was in: the bottom layer, since the CLI, the engine and every probe's wait poll it. And the
deadline that holds when the main thread cannot poll it: blocked in a read that never returns (an
open() of a FIFO a target planted) or looping in a parser, a command still ends within a second of
the signal (the Deadline thread below)."""

from __future__ import annotations

import os
import select
import signal
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager

# How long after the first SIGINT/SIGTERM the main thread has to show it saw it (a wait, a tick, a
# check of interrupted(): every wait ticks at 50 ms) before the command is ended where it stands: a
# main thread that has not looked by then is blocked in a call that does not return or in a loop
# that does not look, and the promise is an end within a second of the signal.
NOTICE_GRACE_S = 0.6
# How long a stop that did start (the main thread saw the signal) may take to detach its probes,
# release a stopped target and write the partial report before the command is ended anyway: the
# slowest measured here took 0.41 s from the signal to the exit (SIGINT with memleak attached, its
# partial report written; 0.28 s during a reach scan of 512 MiB), so seven times that for a loaded
# node; a stop blocked in its own cleanup (a join of a thread stuck in a read, a report's read of a
# planted file) ends here.
STOP_GRACE_S = 3.0
# Once nothing of memdiag's is attached to or stopped in the target any more (the diagnosis or the
# probe has returned: probes detached, the scan's stop released), what is left of a stop is its
# report, rendered from what was already read and written into the folder the user gave: it costs
# the target nothing, and a slow machine may take more than STOP_GRACE_S for it (under qemu's tcg,
# as in the second-kernel lane, Python runs tens of times slower). It is given this long from the
# release.
WRITE_GRACE_S = 30.0
_HANDLED = (signal.SIGINT, signal.SIGTERM)


class Interruption:
    """The first SIGINT or SIGTERM a command received, and the phase it came in. Process-wide,
    as signal handlers are (they run in the main thread). The handler only records: every wait
    polls it and ends early, every detach and release still runs to its end, so a signal never
    cuts a cleanup short; a second one changes nothing (a third exits at once: the kernel then
    detaches every probe and ptrace stop with the process's file descriptors and threads)."""

    EXIT_NOW_AFTER = 3

    def __init__(self) -> None:
        self.signum: int | None = None
        self.phase: str | None = None
        self.at: float | None = None  # time.monotonic() of the first signal
        self.count = 0
        self.phases: list[str] = []  # the main thread's phases, innermost last
        self.holds: list[bool] = []  # whether each phase holds anything in the target (phase())
        self.held = True  # whether the phases at the first signal held anything in the target
        self.installed = False
        self.noticed = threading.Event()  # the main thread saw the signal: a clean stop is under way
        self.released_at: float | None = None  # time.monotonic() when the target was let go (target_released)

    @property
    def caught(self) -> bool:
        """A signal came. Asked by the main thread, it also says the stop is under way (the Deadline
        then grants the clean stop its longer grace)."""
        if self.signum is None:
            return False
        if main_thread():
            self.noticed.set()
        return True

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else ""

    def reset(self) -> None:
        self.signum = self.phase = self.at = self.released_at = None
        self.held = True
        self.count = 0
        self.noticed.clear()

    def record(self, signum: int) -> None:
        self.count += 1
        if self.signum is None:
            self.signum, self.at = signum, time.monotonic()
            self.phase = self.phases[-1] if self.phases else "starting"
            self.held = any(self.holds) or not self.phases  # read by the Deadline once noticed
        elif self.count >= self.EXIT_NOW_AFTER:
            os._exit(128 + signum)

    def wait(self, seconds: float, tick: float = 0.05, sleep=None) -> bool:
        """Sleep up to seconds, ending early on a signal (time.sleep resumes after a handler).
        True when a signal came. sleep(s): how each tick is slept (time.sleep by default); a true
        answer ends the wait early too (a target's pidfd said it exited: identity.sleep)."""
        end = time.monotonic() + seconds
        while not self.caught:
            left = end - time.monotonic()
            if left <= 0:
                return False
            if sleep is None:
                time.sleep(min(tick, left))
            elif sleep(min(tick, left)):
                return False
        return True


INTERRUPTION = Interruption()


def _on_signal(signum, frame) -> None:
    INTERRUPTION.record(signum)


def main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextmanager
def signals_caught():
    """SIGINT and SIGTERM recorded (INTERRUPTION) instead of ending the process, for as long as
    the context lasts; the outermost one installs the handler and starts a fresh record. Signal
    handlers belong to the main thread: in a worker thread (memdiag serve) nothing changes."""
    if not main_thread() or INTERRUPTION.installed:
        yield INTERRUPTION
        return
    INTERRUPTION.reset()
    old = {s: signal.getsignal(s) for s in _HANDLED}
    for s in old:
        signal.signal(s, _on_signal)
    INTERRUPTION.installed = True
    deadline = Deadline(INTERRUPTION)
    try:
        yield INTERRUPTION
    finally:
        deadline.close()
        INTERRUPTION.installed = False
        for s, h in old.items():
            signal.signal(s, h)


@contextmanager
def phase(name: str, holds: bool = True):
    """Name what the main thread is doing, for a report to say where a signal interrupted it.
    holds=False: nothing of memdiag's is attached to or stopped in the target during it (reading
    counters), so a stop that comes then has only its report left to write (Deadline)."""
    if not main_thread():
        yield
        return
    INTERRUPTION.phases.append(name)
    INTERRUPTION.holds.append(holds)
    try:
        yield
    finally:
        INTERRUPTION.phases.pop()
        INTERRUPTION.holds.pop()


def target_released() -> None:
    """Nothing of memdiag's is attached to or stopped in the target any more: a stop under way
    (or one that comes later) is given WRITE_GRACE_S from now to write its report."""
    if main_thread() and INTERRUPTION.installed:
        INTERRUPTION.released_at = time.monotonic()


def interrupted() -> bool:
    """A signal came (only ever in the main thread's command: never in memdiag serve's workers)."""
    return INTERRUPTION.installed and INTERRUPTION.caught


class Deadline:
    """Ends the process when a command does not stop after SIGINT/SIGTERM: NOTICE_GRACE_S for the
    main thread to see the signal, STOP_GRACE_S for the clean stop it then makes; past either, one
    line on stderr and exit 128 + the signal's number, without the report.

    Python runs a signal's handler only in the main thread and between bytecodes: a main thread
    blocked in open() of a FIFO restarts the call after the handler (PEP 475) and blocks again, or
    never runs the handler at all when the kernel gave the signal to another thread. So the signal
    is taken here from the interpreter's wakeup fd, which its C-level handler writes in whatever
    thread the signal landed, into a thread of its own that blocks in a read without the GIL.
    Ending the process is what releases everything memdiag holds: the kernel closes the BPF links
    and perf events with the descriptors (the uprobes go with them) and detaches every tracee of an
    exiting tracer, running (a ptrace-stopped target resumes); the third signal's immediate exit has
    always relied on the same. A main thread looping in C code that never releases the GIL keeps
    this thread from running too; memdiag's parsers of target data are Python."""

    def __init__(self, interruption: Interruption):
        self.interruption = interruption
        self._read, self._write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._done = threading.Event()
        self._previous = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        self._thread = threading.Thread(target=self._watch, name="memdiag-deadline", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """The command ended (or its signal handling did): nothing more to enforce."""
        self._done.set()
        signal.set_wakeup_fd(self._previous)
        os.close(self._write)  # the watching thread reads the end of the pipe and returns
        self._thread.join()
        os.close(self._read)

    def _watch(self) -> None:
        # the signals land in the other threads: the main one, blocked in a system call, is then
        # interrupted (EINTR) and runs the handler, which it would not if this thread took them
        signal.pthread_sigmask(signal.SIG_BLOCK, _HANDLED)
        signum = self._next_signal(None, pending=True)
        if signum is None or self._done.is_set():
            return
        first = time.monotonic()
        noticed = self._until(lambda: self.interruption.noticed.is_set(), first + NOTICE_GRACE_S)
        if self._done.is_set():
            return
        if not noticed:
            self._end(signum, f"it did not stop within {NOTICE_GRACE_S:g} s (blocked in a read or a loop)")
        self._until(lambda: False, lambda: self._stop_ends(first))
        if not self._done.is_set():
            if self.interruption.released_at is None and self.interruption.held:
                self._end(signum, f"its stop did not finish within {STOP_GRACE_S:g} s")
            self._end(signum, f"its report was not written within {WRITE_GRACE_S:g} s of the target's release")

    def _stop_ends(self, first: float) -> float:
        """When a stop that began at first (monotonic) is ended: STOP_GRACE_S after the signal, or
        WRITE_GRACE_S after the target was released, whichever is later."""
        released = self.interruption.released_at
        if released is None and not self.interruption.held:
            # a signal while only counters were read (nothing attached or stopped): what is left of
            # the stop is its report, which a slow machine (qemu's tcg, a loaded node) takes long for
            released = first
        return max(first + STOP_GRACE_S, released + WRITE_GRACE_S if released is not None else first)

    def _next_signal(self, until: float | None, pending: bool = False) -> int | None:
        """The next SIGINT/SIGTERM read from the wakeup fd (until a monotonic time, or for ever);
        None at the end of the pipe or the time. pending: also a signal the kernel has held pending
        for NOTICE_GRACE_S, which no handler ran for (read from /proc/self/status every PENDING_TICK_S):
        the kernel gives a signal to the main thread, and one asleep in a killable wait (a FUSE or
        NFS request that is never answered) is not woken for it, so the C handler never writes the fd
        (measured: a SIGTERM pending 20 s, until the target's FUSE server was killed)."""
        since: dict[int, float] = {}
        while True:
            left = None if until is None else max(until - time.monotonic(), 0.0)
            if pending:
                left = PENDING_TICK_S if left is None else min(left, PENDING_TICK_S)
            ready, _, _ = select.select([self._read], [], [], left)
            if not ready:
                if pending and not self._done.is_set():
                    now, held = time.monotonic(), _pending_signals()
                    since = {s: since.get(s, now) for s in held}
                    stuck = [s for s, t in since.items() if now - t >= NOTICE_GRACE_S]
                    if stuck:
                        self._end(
                            stuck[0], f"it did not take the signal within {NOTICE_GRACE_S:g} s (blocked in the kernel)"
                        )
                if until is None or time.monotonic() < until:
                    continue
                return None
            try:
                data = os.read(self._read, 64)
            except BlockingIOError:
                continue
            if not data:
                return None
            for signum in data:
                if signum in _HANDLED:
                    return signum

    def _until(self, check, until: float | Callable[[], float]) -> bool:
        """Wait for check() (or the end of the command) until a monotonic time (or the time until()
        says, asked again at each tick), counting the signals that come meanwhile: the third ends
        the command at once, as Interruption.record does where the main thread runs its handler.
        Whether check() came true."""
        limit = until if callable(until) else (lambda: until)
        count = 1
        while not (check() or self._done.is_set()):
            if time.monotonic() >= limit():
                return False
            signum = self._next_signal(min(limit(), time.monotonic() + _TICK_S))
            if signum is not None:
                count += 1
                if count >= Interruption.EXIT_NOW_AFTER:
                    self._end(signum, "a third signal")
        return check()

    def _end(self, signum: int, why: str) -> None:
        itp = self.interruption
        phases = list(itp.phases)  # the main thread's, as it stands
        where = itp.phase or (phases[-1] if phases else "starting")
        name = signal.Signals(signum).name
        line = f"memdiag: interrupted by {name} during {where}; {why}: ended without a report\n"
        os.write(2, line.encode(errors="replace"))  # not sys.stderr: the main thread may hold its lock
        os._exit(128 + signum)


_TICK_S = 0.05  # how often the deadline looks whether the main thread saw the signal
PENDING_TICK_S = 0.2  # how often it looks for a signal the kernel holds pending (a read of /proc/self/status)


def _pending_signals() -> list[int]:
    """SIGINT/SIGTERM pending for the process (ShdPnd) or its main thread (SigPnd)."""
    held = 0
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(("ShdPnd:", "SigPnd:")):
                    held |= int(line.split()[1], 16)
    except (OSError, ValueError, IndexError):
        return []
    return [s for s in _HANDLED if held >> (s - 1) & 1]
