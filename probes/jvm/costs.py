"""What a flight recording costs a JVM, as measured on the JVMs memdiag recorded on this host: the
target's CPU time to start JFR (its first start in a JVM loads and JIT-compiles JFR's own Java
code: 0.7-1.5 s here on OpenJDK 17.0.15, up to 2.9 s inside a busy test run; a later start
0.02-0.04 s), its CPU time per second while recording, and to stop (write the recording, search the
old objects' paths to GC roots). Kept per JVM build in /var/lib/memdiag/jvm-costs.json (the last
five measurements of each, their median priced: one run against a target whose own load rose
meanwhile reads high), so the next recording of a JVM of that build is priced from this host's own
figures. Until a build has been measured, the figures measured on this project's test host are the
estimate, said to be so."""

from __future__ import annotations

import contextlib
import json
import os
import statistics
from dataclasses import dataclass
from pathlib import Path

STORE = Path(os.environ.get("MEMDIAG_JVM_COSTS", "/var/lib/memdiag/jvm-costs.json"))
KEEP = 5
# Measured on the project's test host (2 vCPU, OpenJDK 17.0.15, issue 24): the estimate until a
# JVM build has been measured here. A cold start: the highest of three first starts; recording:
# OrderService's CPU over 10 s windows, 0.27 s recording against 0.17 and 0.24 s bare around it;
# a stop: the highest of JFR.stop's and JFR.dump's measured.
# The pauses (the JVM's safepoint time while the command ran): a start's, and a stop's or a dump's with its
# search of paths to GC roots on a small heap, measured on OrderService here (issue 45: 10-20 ms and
# 6-8 ms), rounded up.
PRIORS = {
    "cold_start_s": 1.31,
    "warm_start_s": 0.04,
    "record_cpu_per_s": 0.0065,
    "stop_s": 0.09,
    "start_pause_s": 0.02,
    "stop_pause_s": 0.01,
}
# A class histogram (jcmd GC.class_histogram) is a full collection at a safepoint: its CPU (the VM
# and GC threads) and its pause, per GiB of what survived the collections before it (the heap in use
# where the heap has no eden), each at least HISTOGRAM_FLOOR_S (a small heap's look costs the
# safepoint and the walk of the class table, not its bytes: 0.01-0.04 s of CPU at 18-46 MiB here).
# Measured on the project's test host (2 vCPU AMD EPYC, OpenJDK 17.0.15, G1; LruCache at 1,000-100,000
# lookups/s with 96-726 MiB surviving): 0.2-1.0 s of the process's CPU and 0.24-0.64 s of pause per
# GiB; the priors round the highest up. Kept under keys of their own ("look_*"): the figures an
# earlier measurement stored as histogram_* were per GiB in use and counted the target's young
# collections between the looks into the second (3.2 s per GiB, which priced the next JVM's looks
# out of the budget).
HISTOGRAM_PRIORS = {"look_cpu_per_gib": 1.1, "look_pause_per_gib": 0.7}
HISTOGRAM_FLOOR_S = 0.04
KINDS = tuple(PRIORS) + tuple(HISTOGRAM_PRIORS)


@dataclass(frozen=True)
class Price:
    start_s: float  # the target's CPU seconds to start the recording
    record_per_s: float  # its CPU seconds per second while it records
    stop_s: float
    measured_here: bool  # from this host's own measurements of this JVM build
    start_pause_s: float = PRIORS["start_pause_s"]  # the safepoints of a start, and of a stop or a dump
    stop_pause_s: float = PRIORS["stop_pause_s"]

    def total_s(self, seconds: float) -> float:
        return self.start_s + self.record_per_s * seconds + self.stop_s

    def cpu_s(self, seconds: float) -> float:
        """The JVM's CPU for a recording of `seconds` with its first look (a dump, priced as a stop)."""
        return self.total_s(seconds) + self.stop_s

    @property
    def pauses_s(self) -> float:
        """The safepoints of the start, the first look and the stop."""
        return self.start_pause_s + 2 * self.stop_pause_s

    def app_s(self, seconds: float, share: float) -> float:
        """What the application would pay for a recording of `seconds` with its first look: the
        JVM's CPU for it where it takes CPU the application's threads would have run on (`share`: of
        the CPUs it may use, the share its threads kept busy before), and the pauses."""
        return self.cpu_s(seconds) * share + self.pauses_s


def _load() -> dict:
    with contextlib.suppress(OSError, ValueError):
        data = json.loads(STORE.read_text())
        if isinstance(data, dict):
            return data
    return {}


def price(build: str | None, cold: bool) -> Price:
    """What a recording of this JVM build costs: the median of this host's measurements, else the priors."""
    mine = _load().get(build or "", {})
    figures = {kind: _median(mine, kind) for kind in PRIORS}
    start = "cold_start_s" if cold else "warm_start_s"
    return Price(
        start_s=_or_prior(figures, start),
        record_per_s=_or_prior(figures, "record_cpu_per_s"),
        stop_s=_or_prior(figures, "stop_s"),
        measured_here=figures[start] is not None and figures["record_cpu_per_s"] is not None,
        start_pause_s=_or_prior(figures, "start_pause_s"),
        stop_pause_s=_or_prior(figures, "stop_pause_s"),
    )


def _or_prior(figures: dict, kind: str) -> float:
    value = figures[kind]
    return value if value is not None else PRIORS[kind]


def remember(build: str | None, measured: dict[str, float]) -> None:
    """Keep this recording's measured figures for the next price (a failure to write is no error)."""
    if not build:
        return
    data = _load()
    mine = data.setdefault(build, {})
    for kind, value in measured.items():
        if kind in KINDS and value is not None and value >= 0:
            mine[kind] = ([*mine.get(kind, []), round(value, 6)])[-KEEP:]
    with contextlib.suppress(OSError):
        STORE.parent.mkdir(parents=True, exist_ok=True)
        tmp = STORE.with_name(STORE.name + f".{os.getpid()}")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, STORE)


@dataclass(frozen=True)
class LookPrice:
    """What one class histogram costs a JVM whose heap has `used` bytes in use."""

    cpu_s: float  # the target's CPU seconds (the collection's threads)
    pause_s: float  # the safepoint: the application stopped
    measured_here: bool


def _median(mine: dict, kind: str) -> float | None:
    """The median of one build's kept measurements of a kind (None: none kept)."""
    values = [v for v in mine.get(kind, []) if isinstance(v, int | float) and v >= 0]
    return statistics.median(values) if values else None


def histogram_price(build: str | None, used: int) -> LookPrice:
    """One look's price: this host's per-GiB figures of the build, else the priors, times the bytes priced by
    (what survived the last collections, else the heap in use)."""
    mine = _load().get(build or "", {})
    cpu, pause = _median(mine, "look_cpu_per_gib"), _median(mine, "look_pause_per_gib")
    gib = used / (1 << 30)
    return LookPrice(
        cpu_s=max(HISTOGRAM_FLOOR_S, gib * (cpu if cpu is not None else HISTOGRAM_PRIORS["look_cpu_per_gib"])),
        pause_s=max(HISTOGRAM_FLOOR_S, gib * (pause if pause is not None else HISTOGRAM_PRIORS["look_pause_per_gib"])),
        measured_here=cpu is not None and pause is not None,
    )
