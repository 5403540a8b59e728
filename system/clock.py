"""The wall clock of a diagnosis: the host's time read once (at import, and again where a window
starts) and carried forward on the monotonic clock. Every stamp a diagnosis compares with another
(the window's start and end, a probe's start and duration, a target's exit, a kernel timestamp
turned into wall time) comes from here, so a step of the host's clock during a window (NTP, a
virtual machine's clock resynchronised) neither stretches the window nor reorders its stamps.
Found in stop 35's CI: a hot-allocator diagnosis whose pytest call took under 32 s of monotonic
time reported a window 61 s long (its rules ran at 30 s on the engine's own clock); every stamp
of its window had been read with time.time(). A stamp can then be off the host's clock by the
steps since the anchor (within one window, at most what the clock stepped meanwhile)."""

from __future__ import annotations

import time

_offset = time.time() - time.monotonic()


def anchor() -> None:
    """Read the host's clock again: at the start of a window (`memdiag serve` runs for days, its
    diagnoses one at a time, each anchored afresh)."""
    global _offset
    _offset = time.time() - time.monotonic()


def wall() -> float:
    """Seconds since the epoch, on the monotonic clock since the last anchor."""
    return _offset + time.monotonic()


def wall_of(monotonic: float) -> float:
    """A time.monotonic() reading as wall time on the same anchor."""
    return _offset + monotonic


def boot_offset() -> float:
    """What to add to a CLOCK_MONOTONIC timestamp (the kernel's log, a BPF program's
    bpf_ktime_get_ns) to put it on this wall clock."""
    return _offset + time.monotonic() - time.clock_gettime(time.CLOCK_MONOTONIC)
