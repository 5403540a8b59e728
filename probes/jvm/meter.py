"""What a flight recording costs the target, measured on the target two ways, as memleak's cost is:

- the CPU time of the JVM's threads that do the recording's work (/proc/PID/task/TID/stat): JFR's
  own threads (JFR Recorder Thread, JFR Periodic Tasks) and the attach listener that runs memdiag's
  commands, throughout; while JFR starts, the JIT compiler threads too (the first start in a JVM
  compiles JFR's own code: most of its ~1 s here); while it stops, the VM thread (the stop's
  safepoint operation: the search of paths to GC roots). What the application threads pay for the
  allocation samples is not in them;
- the whole process's CPU time above its rate before the probe (utime + stime), which includes
  that, and also moves with the target's own load.

The figure reported and enforced is the first, raised to the second where that is larger, up to
twice the first."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from memdiag.system.process import cpu_seconds

ALWAYS = ("JFR ", "Attach Listener")  # thread names as comm keeps them (15 characters)
STARTING = ("C1 CompilerThre", "C2 CompilerThre")
STOPPING = ("VM Thread",)
CPU_TRUST = 2.0
_CLK_TCK = os.sysconf("SC_CLK_TCK")


def thread_times(pid: int, proc_root: Path = Path("/proc")) -> dict[int, tuple[str, float]]:
    """Each thread's name and CPU seconds (utime + stime)."""
    out: dict[int, tuple[str, float]] = {}
    base = proc_root / str(pid) / "task"
    try:
        tids = os.listdir(base)
    except OSError:
        return out
    for tid in tids:
        try:
            text = (base / tid / "stat").read_text()
        except OSError:
            continue
        name = text[text.find("(") + 1 : text.rfind(")")]
        rest = text[text.rfind(")") + 2 :].split()
        if len(rest) > 12:
            out[int(tid)] = (name, (int(rest[11]) + int(rest[12])) / _CLK_TCK)
    return out


def _delta(a: dict[int, tuple[str, float]], b: dict[int, tuple[str, float]], names: tuple[str, ...]) -> float:
    return sum(max(0.0, cpu - a.get(tid, (name, 0.0))[1]) for tid, (name, cpu) in b.items() if name.startswith(names))


@dataclass
class Meter:
    """The two measures from the moment the probe began."""

    pid: int
    rate: float  # the target's CPU seconds per second before any probe
    t0: float = field(default_factory=time.monotonic)
    cpu0: float = 0.0
    marks: list[dict[int, tuple[str, float]]] = field(default_factory=list)
    threads_s: float = 0.0  # the recording threads' CPU of the steps closed so far

    def __post_init__(self) -> None:
        self.cpu0 = cpu_seconds(self.pid) or 0.0
        self.marks.append(thread_times(self.pid))

    def close_step(self, extra: tuple[str, ...] = ()) -> float:
        """End a step (the start, the recording, the stop): its recording threads' CPU seconds."""
        now = thread_times(self.pid)
        step = _delta(self.marks[-1], now, ALWAYS + extra)
        self.marks.append(now)
        self.threads_s += step
        return step

    def process_s(self) -> float:
        """The process's CPU time above its rate before, since the probe began."""
        cpu = cpu_seconds(self.pid)
        return max(0.0, (cpu if cpu is not None else self.cpu0) - self.cpu0 - self.rate * (time.monotonic() - self.t0))

    def so_far(self, open_step: tuple[str, ...] = ()) -> float:
        """What is reported and enforced now: the threads' (the open step's too), raised to the
        process's up to twice."""
        threads = self.threads_s + _delta(self.marks[-1], thread_times(self.pid), ALWAYS + open_step)
        return max(threads, min(self.process_s(), CPU_TRUST * threads))
