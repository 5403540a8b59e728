"""memleak's tracing run: outstanding allocations by stack, and how they evolve — the raw material
of leak versus cache.

User mode: uprobes on the allocator the target really uses (probes/allocator.py), per pid, on
emulated instructions where the prologue has one. Kernel mode: the kmem tracepoints. Per stack:
outstanding bytes and count, allocations and frees, the age of the oldest outstanding allocation,
and a series of outstanding bytes sampled every few seconds. Sampling (1 in N), size filters and
a snoop mode for single large allocations. Every map is bounded or grows with use; what did not
fit is counted and reported. At the end, with the probes still attached, the reachability scan
(reach/) may stop the target and say what still points at the outstanding blocks. The tables are
read back, and their stacks named, in tables.py."""

from __future__ import annotations

import ctypes as ct
import os
import time
from dataclasses import dataclass, field

from memdiag.system import clock
from memdiag.system.signals import phase
from memdiag.system.target import Target

from .. import bpfstats
from ..allocator import BPF_FUNCTION, ENTRY_POINTS, find_allocator
from ..base import Run, run_probe
from ..cpython.frames import PythonStacks
from ..face import TracingCost
from ..growth import Spaces
from ..stacks import Frame, folded, sourced
from .costs import Costs
from .meter import CHECK_S, Meter, check_s, detach_seconds
from .options import build_options, requirements
from .reach import Blocks, ReachScan, fitted, price, scan
from .reach.anchors import v8_namer
from .result import MemleakResult
from .tables import BigAllocEvent, big_alloc, key_tuple, leak_stacks, outstanding_blocks, sample_series


def run(
    target: Target,
    duration: float,
    *,
    kernel_mode: bool = False,
    sample_every: int = 1,
    min_size: int = 0,
    max_size: int | None = None,
    snoop_min: int = 0,
    series_interval: float = 2.0,
    functions: list[str] | None = None,
    top: int = 20,
    costs: Costs | None = None,
    site_rates: dict[str, float] | None = None,
    allowance_ns: float | None = None,
    cpu_baseline: float | None = None,
    scan_reach: bool = False,
    reach_allowed_ms: float | None = None,
    scan_kept_ms: float = 0.0,
) -> MemleakResult:
    """functions: attach only these entry points (a narrower, cheaper set), default all.
    costs (this host's, costs.py): measure what tracing costs the target as it runs
    (result.tracing_cost). site_rates: calls per second by entry point (the rate count), to attach
    (and so detach) the hottest first and to price a program shared by several sites by the
    sites' hits. allowance_ns: detach early once that measured cost, with what detaching
    will add, reaches this many ns of the target's time. cpu_baseline: the target's CPU seconds per
    second before the attach, to measure its added CPU time (a pid target).
    scan_reach: at the end, with the probes still attached, stop the target and scan its memory
    for what points at the outstanding blocks (reach/), if the pause fits
    reach_allowed_ms (None: no limit) and what is left of the allowance; scan_kept_ms of it are
    kept for that scan (the early detach comes that much sooner)."""
    if target.kind == "system" and not kernel_mode:
        return MemleakResult(
            name="memleak",
            status="unavailable",
            target=target.describe(),
            started=clock.wall(),
            reason="user-space allocation tracing needs a process or cgroup target "
            "(use the kernel mode for system-wide kernel allocations)",
        )
    session = _Session(
        target=target,
        kernel_mode=kernel_mode,
        sample_every=sample_every,
        min_size=min_size,
        max_size=max_size,
        snoop_min=snoop_min,
        series_interval=series_interval,
        wanted=[f for f in ENTRY_POINTS if functions is None or f in functions],
        top=top,
        costs=costs,
        site_rates=site_rates,
        allowance_ns=allowance_ns,
        scan_reach=scan_reach,
        reach_allowed_ms=reach_allowed_ms,
        scan_kept_ns=scan_kept_ms * 1e6 if scan_reach else 0.0,
        spaces=Spaces(),
        meter=Meter(target.pid if target.kind == "pid" else None, cpu_baseline),
    )
    return session.run(duration)


USER_METHOD = "uprobes on the target's allocator (per pid), user stacks + .eh_frame unwinding"
REPRICE_S = 1.0  # how often the scan's pause is priced again while traced (_reprice_scan)


def _attached_as(bpf) -> str:
    """How the uprobes went in: uprobe_multi links (6.6+: detached together) or perf events."""
    if bpf.links:
        return f"attached as {bpf.links} uprobe_multi link{'s' if bpf.links != 1 else ''}"
    return "attached as one perf event per uprobe (no uprobe_multi links on this kernel)"


def _no_placements() -> dict:
    return {"placements": [], "missing": [], "errors": [], "allocator": None, "module": None}


@dataclass
class _Session:
    """One run's options and what its four steps share; run_probe calls attach (again for
    processes that join a cgroup), on_tick while attached, before_detach, then collect."""

    target: Target
    kernel_mode: bool
    sample_every: int
    min_size: int
    max_size: int | None
    snoop_min: int
    series_interval: float
    wanted: list[str]
    top: int
    costs: Costs | None
    site_rates: dict[str, float] | None
    allowance_ns: float | None
    scan_reach: bool
    reach_allowed_ms: float | None
    scan_kept_ns: float
    spaces: Spaces
    meter: Meter
    info: dict = field(default_factory=_no_placements)
    series_times: list[float] = field(default_factory=list)
    series: dict[tuple, list[int]] = field(default_factory=dict)
    big: list = field(default_factory=list)  # None first once the perf buffer is open, then the events
    last_sample: float | None = None
    scanned: dict = field(default_factory=dict)
    placed: list = field(default_factory=list)  # the placements attached, for pricing each program's hits
    python: PythonStacks = field(default_factory=PythonStacks)
    check_s: float = 0.5  # how often the meter checks the cost (meter.check_s of the trace's length)
    repriced_at: float | None = None  # when the scan's pause was last priced while traced
    planned_kept_ns: float = 0.0  # the plan's estimate of it, the floor of every pricing while traced

    def __post_init__(self) -> None:
        self.last_sample = -self.series_interval

    def run(self, duration: float) -> MemleakResult:
        k = self.kernel_mode
        defines = build_options(k, self.sample_every, self.min_size, self.max_size, self.snoop_min)
        method = "kmem tracepoints, kernel stacks" if k else USER_METHOD
        self.check_s = check_s(duration)
        probe = Run(
            "memleak",
            MemleakResult,
            requirements(k),
            defines,
            self.collect,
            method,
            spaces=self.spaces,
            attach=self.attach,
            on_tick=self.on_tick,
            before_detach=self.before_detach,
            tick_s=self.check_s,
        )
        return run_probe(probe, self.target, duration)  # type: ignore[return-value]

    def attach(self, bpf, pids: set[int]) -> None:
        if self.kernel_mode:
            return
        if not self.big and self.snoop_min:
            # bcc cannot build a ctypes class for a struct holding a struct: declared in tables.py.
            bpf["big"].open_perf_buffer(
                lambda cpu, data, size: self.big.append(BigAllocEvent.from_buffer_copy(ct.string_at(data, size)))
            )
            self.big.append(None)  # marker: buffer opened
        for pid in pids:
            self._attach_pid(bpf, pid)

    def _attach_pid(self, bpf, pid: int) -> None:
        info = self.info
        space = self.spaces.get(pid)
        alloc = find_allocator(pid, space)
        if alloc is None or space is None:
            info["errors"].append(f"PID {pid}: no allocator found in its mappings")
            return
        info["allocator"], info["module"] = alloc.name, alloc.module
        _set_text_range(bpf, pid, space)
        self.python.register(bpf, pid, space)
        info["missing"] = sorted(set(info["missing"]) | set(alloc.missing))
        asked = []
        # attached together as the batch ends (uprobe_multi links where the kernel has them)
        with bpf.uprobe_batch() as refused:
            for p in sorted(alloc.placements, key=lambda p: hotness(p.function, self.site_rates)):
                if p.function not in self.wanted:
                    continue
                path = space.inode_path(space.first_mapping_of(p.module))
                if path is None:  # the file this process maps is not reachable: no uprobe on a look-alike
                    info["errors"].append(f"{p.function}: {p.module} is not the file PID {pid} maps")
                    continue
                try:
                    bpf.attach_uprobe(
                        name=path.encode(),
                        sym=p.function.encode(),
                        sym_off=p.offset,
                        fn_name=BPF_FUNCTION[p.function].encode(),
                        pid=pid,
                        tag=p,
                    )
                    if p.return_probe:
                        bpf.attach_uretprobe(
                            name=path.encode(), sym=p.function.encode(), fn_name=b"alloc_return", pid=pid, tag=p
                        )
                except OSError as e:  # one entry point is not worth the run (its symbol, its file)
                    info["errors"].append(f"{p.function}: {e}")
                    continue
                asked.append(p)
        failed = {id(tag): e for tag, e in refused}
        for p in asked:
            if id(p) in failed:
                info["errors"].append(f"{p.function}: {failed[id(p)]}")
            elif p.describe() not in info["placements"]:
                info["placements"].append(p.describe())
                self.placed.append(p)

    def _spent_ns(self, bpf) -> float | None:
        return self.meter.read(bpf, self.placed, self.costs, self.site_rates).measured_ns

    def on_tick(self, bpf, elapsed: float) -> bool:
        """Sample the series; True (detach) once the measured cost reaches the allowance."""
        if self.snoop_min:
            bpf.perf_buffer_poll(timeout=0)
        if elapsed - self.last_sample >= self.series_interval:
            self.last_sample = elapsed
            sample_series(bpf, elapsed, self.series_times, self.series)
            for pid in self.python.targets:  # threads born in a target with a pid namespace of its own
                self.python.seed_threads(bpf, pid)
        if self.allowance_ns is not None and self.costs is not None and elapsed >= self.check_s:
            self._reprice_scan(bpf, elapsed)
            spent = self._spent_ns(bpf)
            # detaching keeps the hottest probes trapping for about a grace period more, and the next
            # check is a tick away: detach now if either would carry it past the allowance
            allowance = self.allowance_ns - self.scan_kept_ns  # the scan's pause kept (plan.py)
            if spent is not None and spent * (1 + (detach_seconds() + self.check_s) / elapsed) >= allowance:
                return True
        return False

    def _reprice_scan(self, bpf, elapsed: float) -> None:
        """The pause kept for the scan that ends the trace, priced again while traced, as the scan
        will price itself (its writable memory, its blocks, the table read): the latest pricing,
        never below the plan's, and nothing kept for a scan over --max-pause (it will not run: the
        trace is worth more). The plan's estimate is the target's size before the attach at a prior
        speed; a target that grows while traced, or whose scan is mostly fixed costs, outgrew it
        (bench_alloc at 10k/s under jemalloc: 7 ms kept, the scan priced 28 ms at the end with 24 ms
        left, so no scan and the verdict growth). At the first check, then once a second (memdiag's
        time, not the target's)."""
        if not self.scan_reach or self.target.kind != "pid" or self.target.pid is None:
            return
        if self.check_s < CHECK_S:  # a trace of a few checks: the plan priced its scan, and a look
            # here, with the probes attached, costs more than it can save (at 100k calls/s the looks'
            # wall time cost the target the scan's whole pause: no scan, growth)
            return
        if self.repriced_at is not None and elapsed - self.repriced_at < REPRICE_S:
            return
        # The first look reads the table into buffers it makes and parses every module's ELF headers
        # while it times its page-map walk, once (the scan's own pricing, later, finds them made):
        # priced cold, a CPython target's scan came to 690 ms (a 320 ms table read counted twice)
        # where it paused 24-26 ms, and memleak detached at 2.3 s of a 12 s trace. Priced warm.
        if self.repriced_at is None:
            self.planned_kept_ns = self.scan_kept_ns
        # at memdiag's own priority, timed by this thread's CPU time (the scan's, under the stop, runs at
        # real-time priority: reach/boost.py): a niced look on a busy host timed by the wall clock
        # priced the scan over --max-pause, kept nothing for it, and the trace spent the pause before
        # its first byte; real time here would let the target's outstanding blocks (the table read)
        # preempt every task of the host once a second. The page-map walk bounded by --max-pause as
        # the scan's own is (past it no scan runs anyway)
        for _warm_then_priced in range(2 if self.repriced_at is None else 1):
            t = time.thread_time()
            blocks = outstanding_blocks(bpf, self.target.pid, [], False)
            if self.info["allocator"] == "glibc":
                blocks = blocks.glibc_bounded()
            links = self.info["allocator"] == "glibc" and not self.python.own_modules(self.target.pid)
            est = price(self.target.pid, blocks, (time.thread_time() - t) * 1000, self.reach_allowed_ms, links)
        self.repriced_at = elapsed
        if est is None or est.ms is None:
            return
        est = fitted(est, self.reach_allowed_ms)  # the scan the stop will run: without the walk where only that fits
        if self.reach_allowed_ms is not None and est.ms > self.reach_allowed_ms:
            self.scan_kept_ns = 0.0  # as the plan does (plan.py): no trace rests on a scan refused
            return
        # the latest, not the largest: timed on a busy host, one look's fixed part came to 112 ms
        # between looks of 32-53 ms
        self.scan_kept_ns = max(self.planned_kept_ns, est.ms * 1e6)

    def before_detach(self, bpf, elapsed: float, interrupted) -> None:
        """The reachability scan, with the probes still attached, if asked for and affordable."""
        if not self.scan_reach:
            return
        target = self.target
        if self.kernel_mode or target.kind != "pid" or target.pid is None:
            why = "the reachability scan needs a process target (user-space allocations of one pid)"
            self.scanned["scan"] = ReachScan(status="skipped", reason=why)
            return
        keys: list[tuple] = []
        glibc = self.info["allocator"] == "glibc"

        def read(final: bool) -> Blocks:
            if final:
                self.scanned["at_ns"] = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
            blocks = outstanding_blocks(bpf, target.pid, keys if final else [], final)
            return blocks.glibc_bounded() if glibc else blocks

        allowed = self.reach_allowed_ms
        if self.allowance_ns is not None and self.costs is not None:
            spent = self._spent_ns(bpf) or 0.0
            left_ms = max(0.0, self.allowance_ns - spent * (1 + detach_seconds() / max(elapsed, 1e-3))) / 1e6
            allowed = left_ms if allowed is None else min(allowed, left_ms)
        with phase("reach scan (memleak attached, the target's threads stopped by ptrace)"):
            found, per_group = scan(
                target.pid,
                read,
                allowed,
                interrupted,
                self._namer(target.pid, bpf),
                self.info["allocator"],
                self.python.own_modules(target.pid),
                target=target,
            )
        self.scanned["scan"] = found.model_copy(update={"at_s": round(elapsed, 3)})
        self.scanned["per_key"] = {keys[g]: r for g, r in per_group.items()}

    def _namer(self, pid: int, bpf):
        """What names a held block in the runtime's terms: CPython's objects, V8's heap; or None."""
        return self.python.namer(pid, bpf) or v8_namer(pid)

    def _oldest(self, bpf) -> tuple[dict[tuple, int], int]:
        """The oldest outstanding allocation's timestamp per stack key, and how many are outstanding."""
        oldest: dict[tuple, int] = {}
        outstanding = 0
        for _addr, a in bpf["allocs"].items():
            outstanding += 1
            k = key_tuple(a.key)
            oldest[k] = min(oldest.get(k, a.ts_ns), a.ts_ns)
        return oldest, outstanding

    def _cost(self, bpf) -> TracingCost:
        return self.meter.read(bpf, self.placed, self.costs, self.site_rates, paused_s=_paused_s(self.scanned))

    def _status(self, stats: dict) -> tuple[str, str]:
        status, reason = "ok", ""
        if stats["allocs_dropped"] or stats["stacks_dropped"]:
            status, reason = "partial", "a table filled up: some allocations were not tracked (see lost)"
        if not self.kernel_mode and not self.info["placements"]:
            status, reason = "error", "no allocator entry point could be attached: " + "; ".join(self.info["errors"])
        return status, reason

    def collect(self, bpf, elapsed: float) -> dict:
        if self.snoop_min:
            bpf.perf_buffer_poll(timeout=0)
        sample_series(bpf, elapsed, self.series_times, self.series)
        stats = bpfstats.read(bpf, bpfstats.MEMLEAK)
        # ages at the instant the books stopped (the scan), else now
        now_ns = self.scanned.get("at_ns") or time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        oldest, outstanding = self._oldest(bpf)
        kernel_mode, info, scanned = self.kernel_mode, self.info, self.scanned
        stacks = leak_stacks(
            bpf, kernel_mode, self.spaces, self.series, self.python, oldest, now_ns, scanned.get("per_key", {})
        )
        # the stacks kept: their frames' file:line (DWARF line tables read for these alone)
        shown = stacks[: self.top]
        lined = sourced([(s.frames, s.native, self.spaces.get(s.pid)) for s in shown])
        stacks = [
            s.model_copy(update={"frames": frames}) if s.native else s for s, frames in zip(shown, lined, strict=True)
        ] + stacks[self.top :]
        bigs = [big_alloc(bpf, b, self.spaces, kernel_mode) for b in self.big if b is not None][:200]
        lost = {k: v for k, v in stats.items() if k not in ("allocs", "frees", "sampled_out", "nested")}
        lost["symbol_lookups_failed"] = sum(s.unknown_frames for s in stacks)
        status, reason = self._status(stats)
        return {
            "events": stats["allocs"] + stats["frees"],
            "status": status,
            "reason": reason,
            **({} if kernel_mode else {"method": f"{USER_METHOD}; {_attached_as(bpf)}"}),
            "lost": lost,
            "mode": "kernel" if kernel_mode else "user",
            "allocator": "kernel (kmem tracepoints)" if kernel_mode else info["allocator"],
            "allocator_module": info["module"],
            "placements": info["placements"],
            "missing_entry_points": info["missing"],
            "attach_errors": info["errors"],
            "sample_every": self.sample_every,
            "min_size": self.min_size,
            "max_size": self.max_size,
            "series_times": self.series_times,
            "stacks": stacks[: self.top],
            "folded": folded((([_frame_like(f) for f in s.functions]), s.outstanding_bytes) for s in stacks),
            "big_allocations": bigs,
            "outstanding_allocations": outstanding,
            "reach_scan": scanned.get("scan"),
            "tracing_cost": self._cost(bpf) if self.costs else None,
            "python": self.python.reading() if self.python.targets or self.python.refused else None,
        }


# Where no rate was counted: the entry points most programs call most, first.
_USUALLY_HOT = ("malloc", "free", "_Znwm", "_ZdlPvm", "_ZdlPv", "calloc", "realloc")


def hotness(function: str, rates: dict[str, float] | None) -> tuple:
    """Sort key, hottest first: counted rate, then the usual order, then the rest."""
    rate = (rates or {}).get(function)
    usual = _USUALLY_HOT.index(function) if function in _USUALLY_HOT else len(_USUALLY_HOT)
    return (-(rate or 0.0), usual)


def _paused_s(scanned: dict) -> float:
    scan = scanned.get("scan")
    return (scan.paused_ms or 0) / 1000 if scan is not None else 0.0


def _set_text_range(bpf, pid: int, space) -> None:
    """The executable's text for bpf/memleak.c's path fingerprint (frameless call paths)."""
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return
    text = [m for m in space.mappings if m.path == exe and m.executable]
    if text:
        texts = bpf["texts"]
        texts[ct.c_uint32(pid)] = texts.Leaf(min(m.start for m in text), max(m.end for m in text))


def _frame_like(function: str | None) -> Frame:
    return Frame(address=0, function=function)
