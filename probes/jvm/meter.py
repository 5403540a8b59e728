"""What a flight recording costs the target, measured on the target two ways, as memleak's cost is:

- the CPU time of the JVM's threads that do the recording's work (/proc/PID/task/TID/stat): JFR's
  own threads (JFR Recorder Thread, JFR Periodic Tasks) and the attach listener that runs memdiag's
  commands, throughout; while JFR starts, the JIT compiler threads too (the first start in a JVM
  compiles JFR's own code: most of its ~1 s here); while it stops, the VM thread (the stop's
  safepoint operation: the search of paths to GC roots). What the application threads pay for the
  allocation samples is not in them;
- the whole process's CPU time above its rate before the probe (utime + stime), which includes
  that, and also moves with the target's own load.

A histogram's figure (probes/jvm/histogram.py) is that one: the first, raised to the second where
that is larger, up to twice the first.

A recording's figure is what the application pays, and the two CPU measures stay beside it:
- its threads' (every thread that is not the JVM's own: compiler, GC, VM, JFR, attach, signal,
  reference and cleaner threads) time runnable but waiting for a CPU (/proc/PID/task/TID/schedstat:
  the kernel's run-queue delay), above their rate before: where JFR's start compiles its code on
  cores the application needs, this is what the application lost to it; on idle cores it is near
  nothing, however much CPU the compiler threads used;
- the JVM's time in safepoints (its counters: the application threads stopped) while memdiag's
  commands ran (the start, the first look, the stop: probes/jvm/probe.py), counted once: the time
  the application stood still for them. What JFR adds to each collection's own pause (its events
  at a collection, the old-object sampler's weak references) is not in it: the JVM's safepoint time
  above its rate before was tried, and on a heap whose collections lengthen by themselves (one
  filling towards -Xmx) it charged their growth to the recording: 9.96% of the window against 1.93%
  without it (BENCHMARKS.md section 8's HeapThrash at --budget 10, one run each), the recording
  then stopped early at the budget.
The delay's rate before is the one from the window's start (the runtime's mark, taken by the
engine) to the probe's; without one nothing is subtracted and the figure is an upper bound (run
alone, the probe watches the target for a second first).
The CPU the application threads spend writing allocation samples is not in it (JFR's throttle keeps
them to 100 a second); the process's CPU above its rate, beside it, includes that."""

from __future__ import annotations

import itertools
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


# The threads read of a target, at most (the kernel lists them by tid, so every look reads the same
# ones while they live): a target's thread count is its own, and each is read at every tick.
MAX_THREADS = 16384


def tasks(base: Path) -> list[str]:
    """The first MAX_THREADS thread ids under /proc/PID/task (none where it is gone)."""
    try:
        with os.scandir(base) as entries:
            return [e.name for e in itertools.islice(entries, MAX_THREADS)]
    except OSError:
        return []


def thread_times(pid: int, proc_root: Path = Path("/proc")) -> dict[int, tuple[str, float]]:
    """Each thread's name and CPU seconds (utime + stime)."""
    out: dict[int, tuple[str, float]] = {}
    base = proc_root / str(pid) / "task"
    for tid in tasks(base):
        try:
            text = (base / tid / "stat").read_text()
        except OSError:
            continue
        name = text[text.find("(") + 1 : text.rfind(")")]
        rest = text[text.rfind(")") + 2 :].split()
        if len(rest) > 12:
            out[int(tid)] = (name, (int(rest[11]) + int(rest[12])) / _CLK_TCK)
    return out


# The JVM's own threads, as comm keeps their names (15 characters): HotSpot's compiler, GC, VM,
# JFR and service threads, and the JDK's reference, finalizer and cleaner threads. Every other
# thread is the application's (its main thread is "java", the launcher's name).
JVM_OWN = (
    *ALWAYS,
    *STARTING,
    *STOPPING,
    "VM Periodic Tas",
    "GC Thread",
    "G1 ",
    "Parallel GC Thr",
    "ConcGC",
    "ZDirector",
    "ZDriver",
    "ZStat",
    "ZUncommitter",
    "ZUnmapper",
    "ZWorker",
    "ZRuntimeWorker",
    "Shenandoah",
    "Signal Dispatch",
    "Service Thread",
    "Monitor Deflati",
    "Notification Th",
    "Sweeper thread",
    "Reference Handl",
    "Finalizer",
    "Common-Cleaner",
)


@dataclass(frozen=True)
class AppMark:
    """The application threads' run-queue delay at one moment: what a recording's cost is measured from."""

    at: float  # monotonic seconds
    wait_s: float  # its threads' run-queue delay, summed (schedstat), those alive now
    threads: int  # how many application threads


def _schedstat_wait(path: Path) -> float | None:
    try:
        fields = path.read_text().split()
    except OSError:
        return None
    return int(fields[1]) / 1e9 if len(fields) > 1 and fields[1].isdigit() else None


def app_mark(pid: int, proc_root: Path = Path("/proc")) -> AppMark:
    """The application threads' run-queue delay now (every thread not the JVM's own, by name)."""
    at = time.monotonic()
    base = proc_root / str(pid) / "task"
    wait, threads = 0.0, 0
    for tid in tasks(base):
        try:
            name = (base / tid / "comm").read_text().rstrip("\n")
        except OSError:
            continue
        if name.startswith(JVM_OWN):
            continue
        waited = _schedstat_wait(base / tid / "schedstat")
        if waited is not None:
            wait, threads = wait + waited, threads + 1
    return AppMark(at=at, wait_s=wait, threads=threads)


def rate_known(since: AppMark | None, a: AppMark) -> bool:
    """A second or more between the window's start and the probe's: a rate before to subtract."""
    return since is not None and a.at - since.at >= 1.0


def waited(since: AppMark | None, a: AppMark, b: AppMark) -> float:
    """From mark a to mark b, the application threads' run-queue delay above its rate from `since`
    to a (where known; else nothing is subtracted: an upper bound)."""
    rate = 0.0
    if since is not None and rate_known(since, a):
        rate = max(0.0, (a.wait_s - since.wait_s) / (a.at - since.at))
    return max(0.0, b.wait_s - a.wait_s - rate * (b.at - a.at))


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

    since: AppMark | None = None  # the window's start (the engine's mark): the application's rates before
    app0: AppMark = field(init=False)  # the probe's start

    def __post_init__(self) -> None:
        self.cpu0 = cpu_seconds(self.pid) or 0.0
        self.marks.append(thread_times(self.pid))
        self.app0 = app_mark(self.pid)

    def app_wait_s(self) -> float:
        """Since the probe began, the application threads' run-queue delay above its rate before."""
        return waited(self.since, self.app0, app_mark(self.pid))

    @property
    def has_rates(self) -> bool:
        return rate_known(self.since, self.app0)

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
