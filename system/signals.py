"""The process-wide record of the first SIGINT or SIGTERM a command received, and the phase the main
thread was in: the bottom layer, since the CLI, the engine and every probe's wait poll it."""

from __future__ import annotations

import os
import signal
import threading
import time
from contextlib import contextmanager


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
        self.installed = False

    @property
    def caught(self) -> bool:
        return self.signum is not None

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else ""

    def reset(self) -> None:
        self.signum = self.phase = self.at = None
        self.count = 0

    def record(self, signum: int) -> None:
        self.count += 1
        if self.signum is None:
            self.signum, self.at = signum, time.monotonic()
            self.phase = self.phases[-1] if self.phases else "starting"
        elif self.count >= self.EXIT_NOW_AFTER:
            os._exit(128 + signum)

    def wait(self, seconds: float, tick: float = 0.05) -> bool:
        """Sleep up to seconds, ending early on a signal (time.sleep resumes after a handler).
        True when a signal came."""
        end = time.monotonic() + seconds
        while not self.caught:
            left = end - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(tick, left))
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
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for s in old:
        signal.signal(s, _on_signal)
    INTERRUPTION.installed = True
    try:
        yield INTERRUPTION
    finally:
        INTERRUPTION.installed = False
        for s, h in old.items():
            signal.signal(s, h)


@contextmanager
def phase(name: str):
    """Name what the main thread is doing, for a report to say where a signal interrupted it."""
    if not main_thread():
        yield
        return
    INTERRUPTION.phases.append(name)
    try:
        yield
    finally:
        INTERRUPTION.phases.pop()


def interrupted() -> bool:
    """A signal came (only ever in the main thread's command: never in memdiag serve's workers)."""
    return INTERRUPTION.installed and INTERRUPTION.caught
