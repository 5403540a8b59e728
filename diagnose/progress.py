"""Live progress on a terminal: the step, elapsed and remaining time, what is seen so far.
Silent when --quiet or when stderr is not a terminal."""

from __future__ import annotations

import sys
from typing import TextIO

from memdiag.system.units import fmt_bytes, fmt_duration

from .render.text import plain
from .snapshot import Snapshot


class Progress:
    def __init__(self, duration: float, enabled: bool, stream: TextIO = sys.stderr):
        self.duration, self.enabled, self.stream = duration, enabled, stream
        self.first: Snapshot | None = None

    def step(self, text: str) -> None:
        if self.enabled:
            self.stream.write(f"\r\x1b[K{plain(text)}")  # the step may name the target (its comm)
            self.stream.flush()

    def on_sample(self, snap: Snapshot, elapsed: float) -> None:
        if not self.enabled:
            return
        if self.first is None:
            self.first = snap
        seen = []
        if snap.process is not None and self.first.process is not None:
            grew = (snap.process.rss or 0) - (self.first.process.rss or 0)
            seen.append(f"RSS {fmt_bytes(snap.process.rss)} ({'+' if grew >= 0 else ''}{fmt_bytes(grew)})")
        if snap.cgroup is not None:
            limit = f" / {fmt_bytes(snap.cgroup.effective_limit)}" if snap.cgroup.effective_limit else ""
            seen.append(f"cgroup {fmt_bytes(snap.cgroup.usage)}{limit}")
        seen.append(f"MemAvailable {fmt_bytes(snap.meminfo.mem_available)}")
        left = max(0.0, self.duration - elapsed)
        self.step(f"sampling counters  {fmt_duration(elapsed)} elapsed, {fmt_duration(left)} left  " + ", ".join(seen))

    def done(self) -> None:
        if self.enabled:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
