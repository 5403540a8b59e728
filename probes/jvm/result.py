"""What the probe `jfr` returns. Apart from the probe (probes/jvm/probe.py), so that its face
(probes/jvm/view.py), which the registry imports for every target, a native one too, imports no
attach socket, recorder or price: those load when a JVM is recorded."""

from __future__ import annotations

from ..face import ProbeResult
from .recording import Allocating, Held


class JfrResult(ProbeResult):
    build: str | None = None  # the JVM's version
    recorded_s: float = 0.0
    started_at: float | None = None  # epoch seconds: the recording's start and stop
    stopped_at: float | None = None
    held: list[Held] = []  # the rooted old-object samples by class, site and anchor, most first
    allocating: list[Allocating] = []  # allocation samples by class and site, most bytes first
    old_samples: int = 0
    unrooted: int = 0  # old-object samples no root reaches (garbage not yet collected)
    alloc_samples: int = 0
    alloc_bytes: int = 0  # what the allocation samples stand for
    after_gc: list[tuple[float, int]] = []  # (epoch, heap used) just after each collection
    collections: int = 0
    direct_buffers: int | None = None
    cutoff_ms: int = 0
    cold_start: bool | None = None
    start_cpu_s: float | None = None  # the target's CPU time above its rate, each step
    record_cpu_s: float | None = None
    stop_cpu_s: float | None = None
    stop_pause_s: float | None = None  # the JVM's safepoint time while JFR.stop ran
    looked_at: float | None = None  # epoch seconds of the first look (the dump); None: none was taken
    looked: bool = False  # the first look's dump was written (its holders are read for their sizes then)
    look_cpu_s: float | None = None
    look_pause_s: float | None = None  # the JVM's safepoint time while the first look's dump ran
    # reported and enforced: what the application paid (probes/jvm/meter.py), and its two parts
    measured_ns: float | None = None
    app_wait_ns: float | None = None  # its threads' run-queue delay above their rate before
    app_rates: bool = False  # that rate was known (False: the whole delay counted, an upper bound)
    app_pause_ns: float | None = None  # the JVM's safepoints while memdiag's commands ran
    read_cpu_s: float | None = None  # memdiag's own: the jfr tool's CPU reading the recording (not the target's)
    start_pause_s: float | None = None  # the JVM's safepoint time while JFR.start ran
    threads_ns: float | None = None  # beside it: the JVM's threads doing the recording's work, their CPU time
    process_ns: float | None = None  # and the whole process's CPU time above its rate before
    record_rate_s: float = 0.0  # the part of the recording after the start had settled (its steady rate's)
    listener_started: bool = False  # memdiag's SIGQUIT started the JVM's attach listener
    tool: str = ""
    notes: list[str] = []
