"""What every BPF probe shares: loading a bpf/<name>.c with options as cflags, aiming it at the
target, a bounded run that stops on timeout, SIGINT/SIGTERM or the target's exit, and its cost
(events, BPF run time where kernel.bpf_stats_enabled offers it, kernel memory of its maps). The
result types every probe returns are the face's (probes/face.py)."""

from __future__ import annotations

import contextlib
import ctypes as ct
import os
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memdiag.system import clock, identity
from memdiag.system.signals import INTERRUPTION, interrupted, main_thread, signals_caught, target_released
from memdiag.system.target import Target

from . import bpfsys as sys_
from . import compiler, kernel
from .bpfobj import Program
from .face import Cost, ProbeResult
from .kernel import Availability
from .registry import target_mode


class ProbeUnavailable(Exception):
    """The kernel lacks what the probe needs; the reason says what."""


def require(*checks: Availability) -> None:
    for check in checks:
        if not check.available:
            raise ProbeUnavailable(check.reason)


def load(name: str, defines: dict[str, int | str]) -> Program:
    """Load bpf/<name>.c built with its options as -D defines (compiled once, then cached), and
    the pid namespace processes are named in when memdiag runs in one of its own."""
    require(kernel.bpf_runtime())
    try:
        return Program(compiler.compiled(name, {**defines, **kernel.namespace_defines()}))
    except compiler.CompilerUnavailable as e:
        raise ProbeUnavailable(str(e)) from None


def require_visible(target: Target) -> None:
    """In a pid namespace of memdiag's own, BPF names only the processes of that namespace: a
    target in a namespace below it (a container in the container) cannot be seen by tracing."""
    ns = kernel.pid_namespace()
    if ns is None or target.kind == "system":
        return
    pids = target.pids()
    outside = sorted(p for p in pids if kernel.pid_namespace_of(p) not in (ns[1], None))
    if outside and len(outside) == len(pids):
        who = f"PID {outside[0]}" if target.kind == "pid" else f"all {len(outside)} processes of {target.describe()}"
        raise ProbeUnavailable(
            f"{who} runs in a pid namespace nested below memdiag's: BPF can name only the processes of "
            "memdiag's own pid namespace, so tracing cannot see the target; run memdiag in the target's "
            "pid namespace or the host's"
        )


def set_targets(bpf, pids: set[int], table: str = "targets") -> None:
    t = bpf[table]
    for pid in pids:
        t[ct.c_uint(pid)] = ct.c_ubyte(1)


def _fdinfo(fd: int) -> dict[str, str]:
    try:
        text = Path(f"/proc/self/fdinfo/{fd}").read_text()
    except OSError:
        return {}
    return {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in text.splitlines())}


def measure_cost(bpf, events: int) -> Cost:
    stats = program_stats(bpf)  # None or empty: the kernel kept no run time
    run_ns = sum(ns for _, ns in stats.values()) if stats else None
    run_cnt = sum(count for count, _ in stats.values()) if stats else None
    memlock = 0
    for table in getattr(bpf, "tables", {}).values():
        memlock += int(_fdinfo(table.map_fd).get("memlock", 0) or 0)
    return Cost(events=events, bpf_run_ns=run_ns, bpf_run_count=run_cnt, map_bytes=memlock or None)


def program_stats(bpf) -> dict[str, tuple[int, int]] | None:
    """Per program: (runs, run time in ns) as the kernel counts them; None when it keeps no
    counts (kernel.bpf_stats_enabled is off)."""
    if not _stats_enabled():
        return None
    out: dict[str, tuple[int, int]] = {}
    for fn in getattr(bpf, "funcs", {}).values():
        info = _fdinfo(fn.fd)
        if "run_time_ns" in info:
            count, run_ns = out.get(fn.name, (0, 0))
            out[fn.name] = (count + int(info.get("run_cnt", 0)), run_ns + int(info["run_time_ns"]))
    return out


_STATS = Path("/proc/sys/kernel/bpf_stats_enabled")


_held = [0]  # bpf_stats() contexts holding a BPF_ENABLE_STATS fd (the sysctl does not show those)
_held_lock = threading.Lock()  # serve runs diagnoses in worker threads


def _stats_enabled() -> bool:
    if _held[0]:
        return True
    try:
        return _STATS.read_text().strip() == "1"
    except OSError:
        return False


@contextmanager
def bpf_stats():
    """BPF run-time accounting on for the run (it costs two clock reads per program run): through
    BPF_ENABLE_STATS, held by an fd (the kernel counts holders: concurrent runs do not turn it off
    under each other); on kernels before 5.8, the sysctl, put back afterwards."""
    try:
        fd = sys_.enable_stats()
    except OSError:
        fd = None
    if fd is not None:
        with _held_lock:
            _held[0] += 1
        try:
            yield
        finally:
            with _held_lock:
                _held[0] -= 1
            os.close(fd)
        return
    try:
        before = _STATS.read_text().strip()
    except OSError:
        yield
        return
    changed = False
    if before != "1":
        try:
            _STATS.write_text("1")
            changed = True
        except OSError:
            pass
    try:
        yield
    finally:
        if changed:
            with contextlib.suppress(OSError):
                _STATS.write_text(before)


class Stop:
    """Why a run ended, and when the target exited or exec'd if it did (system/identity.py)."""

    def __init__(self, watch_signals: bool = False) -> None:
        self.watch_signals = watch_signals
        self.backed_off = False
        self.target_exited_at: float | None = None
        self.target_execd_at: float | None = None
        self.target_exec: str | None = None  # the executable it exec'd
        self.change: identity.Change | None = None

    @property
    def interrupted(self) -> bool:
        return self.watch_signals and interrupted()

    def saw(self, change: identity.Change | None) -> None:
        """The target is not the process resolved any more (None: a cgroup target's folder is gone)."""
        self.change = change
        if change is not None and change.kind == "execd":
            self.target_execd_at, self.target_exec = change.at, change.exe
        else:
            self.target_exited_at = change.at if change is not None else clock.wall()


@contextmanager
def stop_on_signals():
    """SIGINT/SIGTERM end the run cleanly (the caller still detaches and reports). Signal handlers
    belong to the main thread; in a worker thread (memdiag serve) the run ends by its deadline."""
    if not main_thread():
        yield Stop()
        return
    with signals_caught():
        yield Stop(watch_signals=True)


SIGNAL_SLICE_S = 0.05  # a signal ends a wait within this (INTERRUPTION.wait's own tick)


def run_for(
    duration: float,
    target: Target,
    stop: Stop,
    tick: float = 0.5,
    on_tick: Callable[[float], None] | None = None,
) -> float:
    """Wait out the window; end early on a signal or when the target is gone: exited (at once:
    the wait is on its pidfd), exec'd or its pid another process's (within a tick). Returns
    seconds run."""
    start = time.monotonic()
    while True:
        elapsed = time.monotonic() - start
        if elapsed >= duration or stop.interrupted:
            return elapsed
        if not target.alive():
            stop.saw(target.changed())
            return elapsed
        if on_tick is not None and on_tick(elapsed):
            stop.backed_off = True  # the caller asked to stop early (over its overhead budget)
            return elapsed
        pause = min(tick, max(0.0, duration - elapsed))
        if stop.watch_signals:  # a signal ends the wait at once, not at the next tick
            INTERRUPTION.wait(pause, SIGNAL_SLICE_S, sleep=lambda s: identity.sleep(target, s))
        else:
            identity.sleep(target, pause)


def unavailable(name: str, target: Target, reason: str) -> dict:
    return dict(name=name, status="unavailable", reason=reason, target=target.describe(), started=clock.wall())


def _control(bpf, value: int) -> None:
    """Arm (1) or disarm (0) a program that has a `control` array: it ignores events while
    disarmed, so its books stay consistent while probes attach and detach one by one."""
    try:
        control = bpf[b"control"]
    except KeyError:  # this program has none
        return
    control[ct.c_int(0)] = ct.c_uint(value)


def disarm(bpf) -> None:
    """Freeze a program's books where they are: it ignores events from now on."""
    _control(bpf, 0)


def detach_all(bpf: Program) -> None:
    """Detach every program but keep the maps open for reading."""
    _control(bpf, 0)
    bpf.detach_all()


ATTACHED: list[Callable[[str], None]] = []  # told a probe's name once it is attached and armed (`memdiag probe`)


def attached(name: str) -> None:
    for hook in ATTACHED:
        hook(name)


@dataclass
class Run:
    """One BPF probe run as run_probe drives it: its program, and the steps of its own.

    collect(bpf, elapsed) returns the result's own fields, plus optionally "lost", "status",
    "reason", "method" and "events". spaces (a growth.Spaces) is kept fresh while the target runs.
    filtered: the program keeps a `targets` map of tgids (TARGET_MODE 1) unless the target is the
    whole system. attach(bpf, pids) attaches what bcc does not attach by itself, at the start and
    again for processes that join a cgroup target. on_tick(bpf, elapsed) runs every tick_s (twice a
    second unless the run asks otherwise) while the probe is attached; returning True ends the run
    early (backed off, e.g. over budget).
    ready is set once everything is attached. before_detach(bpf, elapsed, interrupted) runs at the
    end with everything still attached and armed (memleak's reachability scan reads its table there)."""

    name: str
    result: type[ProbeResult]
    requirements: list[Availability]
    defines: dict[str, int | str]
    collect: Callable[..., dict]
    method: str = ""
    filtered: bool = True
    spaces: Any = None
    attach: Callable[..., None] | None = None
    on_tick: Callable[..., bool] | None = None
    ready: threading.Event | None = None
    before_detach: Callable[..., None] | None = None
    tick_s: float = 0.5  # how often on_tick runs while attached


def run_probe(run: Run, target: Target, duration: float) -> ProbeResult:
    """The life of one probe run: check, load, aim at the target, wait, collect, detach. A process
    target is checked to be the process resolved before anything is aimed at it and again once
    everything is attached (a run aimed at another process is detached and says so); a run it
    outlives keeps what was gathered before it exited, and one it exec'd during keeps nothing (the
    old image's memory went with it: its blocks were freed, not leaked)."""
    started = clock.wall()
    change = target.changed()
    if change is not None:
        return _not_the_target(run, target, started, change, "before the probe was aimed at it: nothing was traced")
    mode = target_mode(target.kind, run.filtered)
    loaded = _load(run, target, mode, started)
    if isinstance(loaded, ProbeResult):
        return loaded
    bpf = loaded
    if run.spaces is not None and target.kind == "pid":
        run.spaces.same = lambda pid: pid != target.pid or target.alive()
    try:
        pids = target.pids()
        try:
            _aim(run, bpf, mode, pids)
            identity.check(target)  # the attach raced with an exit or exec: what it caught is not the target's
        except identity.TargetChanged as e:
            detach_all(bpf)
            return _not_the_target(run, target, started, e.change, "while the probe was attached: it was detached")
        attached = clock.wall()
        window = _window(run, bpf, target, mode, pids, duration)
    finally:
        bpf.cleanup()
    return _result(run, target, started, window, attached)


EXECD_DROPPED = (
    "what was traced of the image before is dropped (its memory went with the exec: freed, not leaked) "
    "and nothing of the new program is traced"
)


@dataclass
class _Window:
    """How a run's window ended: its Stop, seconds run, the detach's time, exec'd or not, fields collected, cost."""

    stop: Stop
    elapsed: float
    detach_s: float
    execd: bool
    fields: dict
    cost: Cost


def _window(run: Run, bpf: Program, target: Target, mode: int, pids: set[int], duration: float) -> _Window:
    """The window with everything attached: waited out tick by tick, then the last look, the detach, the collect."""
    with bpf_stats(), stop_on_signals() as stop:

        def tick(elapsed: float) -> bool:
            if target.kind == "cgroup":  # processes come and go in a cgroup
                new = target.pids() - pids
                _aim(run, bpf, mode, new, first=False)
                pids.update(new)
            if run.spaces is not None:
                run.spaces.refresh(pids)
            return bool(run.on_tick(bpf, elapsed)) if run.on_tick is not None else False

        elapsed = run_for(duration, target, stop, tick=run.tick_s, on_tick=tick)
        if stop.change is not None:
            disarm(bpf)  # nothing more is recorded: a newcomer with its pid is no target
            if run.spaces is not None:
                run.spaces.orphan(stop.change.pid)
        if run.before_detach is not None and not stop.interrupted and stop.change is None:
            run.before_detach(bpf, elapsed, lambda: stop.interrupted)
        detached = time.monotonic()
        detach_all(bpf)  # the counts stop moving before they are read: tables agree
        detach_s = time.monotonic() - detached
        if stop.interrupted:  # nothing attached nor stopped: what is left of the stop is collecting and the report
            target_released()
        execd = stop.change is not None and stop.change.kind == "execd"
        fields = {} if execd else run.collect(bpf, elapsed)
        cost = measure_cost(bpf, events=fields.pop("events", 0))
    return _Window(stop, elapsed, detach_s, execd, fields, cost)


def _result(run: Run, target: Target, started: float, window: _Window, attached: float) -> ProbeResult:
    """The run's result from how its window ended, with what the target's exit or exec left of it."""
    stop, fields = window.stop, window.fields
    if window.execd:
        fields = dict(status="partial", reason=f"{stop.change.describe()}: {EXECD_DROPPED}")  # type: ignore[union-attr]
    elif stop.change is not None:
        said = f"{stop.change.describe()}: what was traced before is kept"
        fields["reason"] = f"{fields['reason']}; {said}" if fields.get("reason") else said
    return run.result(
        name=run.name,
        status=fields.pop("status", "ok"),
        reason=fields.pop("reason", ""),
        method=fields.pop("method", run.method),
        target=target.describe(),
        started=started,
        attached=attached,
        duration_s=window.elapsed,
        target_exited_at=stop.target_exited_at,
        target_execd_at=stop.target_execd_at,
        target_exec=stop.target_exec,
        interrupted=stop.interrupted,
        backed_off=stop.backed_off,
        detach_s=window.detach_s,
        lost=fields.pop("lost", {}),
        cost=window.cost,
        **fields,
    )


def _not_the_target(run: Run, target: Target, started: float, change: identity.Change, when: str) -> ProbeResult:
    """The result of a run whose target was gone (exited, exec'd, pid reused) before or while
    it was aimed: nothing it might have gathered is kept."""
    at = (
        dict(target_execd_at=change.at, target_exec=change.exe)
        if change.kind == "execd"
        else dict(target_exited_at=change.at)
    )
    return run.result(
        name=run.name,
        status="unavailable",
        reason=f"{change.describe()}, {when}",
        target=target.describe(),
        started=started,
        **at,
    )


def _load(run: Run, target: Target, mode: int, started: float) -> Program | ProbeResult:
    """The program loaded for the target, or the result that says why it could not be."""
    try:
        require(*run.requirements, kernel.pid_translation())
        require_visible(target)
        return load(run.name, {"TARGET_MODE": mode, **run.defines})
    except ProbeUnavailable as e:
        return run.result(**unavailable(run.name, target, str(e)))
    except (compiler.CompileError, OSError) as e:  # compiling, or the kernel refused a map or program
        return run.result(
            name=run.name, status="error", reason=f"loading failed: {e}", target=target.describe(), started=started
        )


def _aim(run: Run, bpf: Program, mode: int, pids: set[int], first: bool = True) -> None:
    """The program aimed at these processes (its targets map, their address spaces, what the probe
    attaches itself); the first time, armed and announced."""
    if mode == 1:
        set_targets(bpf, pids)
    if run.spaces is not None and first:
        run.spaces.refresh(pids)
    if run.attach is not None and (first or pids):
        run.attach(bpf, pids)
    if first:
        _control(bpf, 1)
        if run.ready is not None:
            run.ready.set()
        attached(run.name)
