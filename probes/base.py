"""What every probe shares: its target, its typed result, loading a bpf/<name>.c with options as
cflags, a bounded run that stops on timeout, SIGINT/SIGTERM or the target's exit, and its cost
(events, BPF run time where kernel.bpf_stats_enabled offers it, kernel memory of its maps)."""

from __future__ import annotations

import contextlib
import ctypes as ct
import os
import signal
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

from memdiag.system.cgroup import cgroup_pids
from pydantic import BaseModel, ConfigDict

from . import bpfsys as sys_
from . import compiler, kernel
from .bpfobj import Program
from .kernel import Availability

ProbeState = Literal["ok", "partial", "unavailable", "error"]


class ProbeUnavailable(Exception):
    """The kernel lacks what the probe needs; the reason says what."""


class ProbeTarget(BaseModel):
    model_config = ConfigDict(frozen=True)

    kind: Literal["pid", "cgroup", "system"]
    pid: int | None = None
    cgroup_fs: str | None = None  # the cgroup's directory (v1 or v2)
    cgroup_path: str | None = None  # its path in the hierarchy, as /proc/PID/cgroup and the kernel log say
    description: str = "the whole system"

    @classmethod
    def for_pid(cls, pid: int) -> ProbeTarget:
        return cls(kind="pid", pid=pid, description=f"PID {pid}")

    @classmethod
    def for_cgroup(cls, fs_path: str, path: str) -> ProbeTarget:
        return cls(kind="cgroup", cgroup_fs=fs_path, cgroup_path=path, description=f"cgroup {path}")

    def pids(self) -> set[int]:
        if self.kind == "pid" and self.pid is not None:
            return {self.pid}
        if self.kind == "cgroup" and self.cgroup_fs is not None:
            return set(cgroup_pids(Path(self.cgroup_fs)))  # a v2 container's processes may be one folder down
        return set()

    def alive(self) -> bool:
        if self.kind == "pid":
            return self.pid is not None and _pid_alive(self.pid)
        if self.kind == "cgroup":
            return self.cgroup_fs is not None and Path(self.cgroup_fs).is_dir()
        return True


def _pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except (OSError, IndexError):
        return False


class Cost(BaseModel):
    events: int = 0
    bpf_run_ns: int | None = None  # None: kernel.bpf_stats_enabled not available
    bpf_run_count: int | None = None
    map_bytes: int | None = None  # kernel memory held by the probe's maps (fdinfo memlock)


class ProbeResult(BaseModel):
    """Fields every probe reports; each probe's result adds its own data."""

    name: str
    status: ProbeState
    reason: str = ""
    method: str = ""
    target: str = ""
    started: float = 0.0
    duration_s: float = 0.0
    target_exited_at: float | None = None
    interrupted: bool = False
    backed_off: bool = False  # stopped early because it cost more than allowed
    detach_s: float | None = None  # how long detaching its programs took (each probe waits out a grace period)
    lost: dict[str, int] = {}
    cost: Cost = Cost()


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


def require_visible(target: ProbeTarget) -> None:
    """In a pid namespace of memdiag's own, BPF names only the processes of that namespace: a
    target in a namespace below it (a container in the container) cannot be seen by tracing."""
    ns = kernel.pid_namespace()
    if ns is None or target.kind == "system":
        return
    pids = target.pids()
    outside = sorted(p for p in pids if kernel.pid_namespace_of(p) not in (ns[1], None))
    if outside and len(outside) == len(pids):
        who = f"PID {outside[0]}" if target.kind == "pid" else f"all {len(outside)} processes of {target.description}"
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


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextmanager
def signals_caught():
    """SIGINT and SIGTERM recorded (INTERRUPTION) instead of ending the process, for as long as
    the context lasts; the outermost one installs the handler and starts a fresh record. Signal
    handlers belong to the main thread: in a worker thread (memdiag serve) nothing changes."""
    if not _main_thread() or INTERRUPTION.installed:
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
    if not _main_thread():
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


class Stop:
    """Why a run ended, and when the target exited if it did."""

    def __init__(self, watch_signals: bool = False) -> None:
        self.watch_signals = watch_signals
        self.backed_off = False
        self.target_exited_at: float | None = None

    @property
    def interrupted(self) -> bool:
        return self.watch_signals and interrupted()


@contextmanager
def stop_on_signals():
    """SIGINT/SIGTERM end the run cleanly (the caller still detaches and reports). Signal handlers
    belong to the main thread; in a worker thread (memdiag serve) the run ends by its deadline."""
    if not _main_thread():
        yield Stop()
        return
    with signals_caught():
        yield Stop(watch_signals=True)


def run_for(
    duration: float,
    target: ProbeTarget,
    stop: Stop,
    tick: float = 0.5,
    on_tick: Callable[[float], None] | None = None,
) -> float:
    """Wait out the window; end early on a signal or when the target is gone. Returns seconds run."""
    start = time.monotonic()
    while True:
        elapsed = time.monotonic() - start
        if elapsed >= duration or stop.interrupted:
            return elapsed
        if not target.alive():
            stop.target_exited_at = time.time()
            return elapsed
        if on_tick is not None and on_tick(elapsed):
            stop.backed_off = True  # the caller asked to stop early (over its overhead budget)
            return elapsed
        pause = min(tick, max(0.0, duration - elapsed))
        if stop.watch_signals:
            INTERRUPTION.wait(pause)  # a signal ends the wait at once, not at the next tick
        else:
            time.sleep(pause)


def unavailable(name: str, target: ProbeTarget, reason: str) -> dict:
    return dict(name=name, status="unavailable", reason=reason, target=target.description, started=time.time())


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


def target_mode(target_kind: str, filtered: bool = True) -> int:
    """TARGET_MODE of a program: 1 keeps a `targets` map of tgids, 0 sees every process."""
    return 1 if filtered and target_kind != "system" else 0


ATTACHED: list[Callable[[str], None]] = []  # told a probe's name once it is attached and armed (`memdiag probe`)


def attached(name: str) -> None:
    for hook in ATTACHED:
        hook(name)


def run_probe(
    result_cls: type[ProbeResult],
    name: str,
    target: ProbeTarget,
    duration: float,
    requirements: list[Availability],
    defines: dict[str, int | str],
    collect: Callable[..., dict],
    method: str,
    spaces=None,
    filtered: bool = True,
    attach: Callable[..., None] | None = None,
    on_tick: Callable[..., None] | None = None,
    ready: threading.Event | None = None,
    before_detach: Callable[..., None] | None = None,
) -> ProbeResult:
    """The life of one probe run: check, load, aim at the target, wait, collect, detach.

        collect(bpf, elapsed) returns the result's own fields, plus optionally "lost", "status",
        "reason" and "events". spaces (a growth.Spaces) is kept fresh while the target runs.
        filtered: the program keeps a `targets` map of tgids (TARGET_MODE 1) unless the target is
        the whole system. attach(bpf, pids) attaches what bcc does not attach by itself, at the start
        and again for processes that join a cgroup target. on_tick(bpf, elapsed) runs about twice a
        second while the probe is attached; returning True ends the run early (backed off, e.g. over
        budget). ready is set once everything is attached. before_detach(bpf, elapsed, interrupted) runs at the end
    with everything still attached and armed (memleak's reachability scan reads its table there)."""
    started = time.time()
    try:
        require(*requirements, kernel.pid_translation())
        require_visible(target)
    except ProbeUnavailable as e:
        return result_cls(**unavailable(name, target, str(e)))
    mode = target_mode(target.kind, filtered)
    try:
        bpf = load(name, {"TARGET_MODE": mode, **defines})
    except ProbeUnavailable as e:
        return result_cls(**unavailable(name, target, str(e)))
    except (compiler.CompileError, OSError) as e:  # compiling, or the kernel refused a map or program
        return result_cls(
            name=name, status="error", reason=f"loading failed: {e}", target=target.description, started=started
        )
    try:
        pids = target.pids()
        if mode == 1:
            set_targets(bpf, pids)
        if spaces is not None:
            spaces.refresh(pids)
        if attach is not None:
            attach(bpf, pids)
        _control(bpf, 1)
        if ready is not None:
            ready.set()
        attached(name)
        with bpf_stats(), stop_on_signals() as stop:

            def tick(elapsed: float) -> None:
                if target.kind == "cgroup":  # processes come and go in a cgroup
                    new = target.pids() - pids
                    if mode == 1:
                        set_targets(bpf, new)
                    if attach is not None and new:
                        attach(bpf, new)
                    pids.update(new)
                if spaces is not None:
                    spaces.refresh(pids)
                return bool(on_tick(bpf, elapsed)) if on_tick is not None else False

            elapsed = run_for(duration, target, stop, on_tick=tick)
            if before_detach is not None and not stop.interrupted:
                before_detach(bpf, elapsed, lambda: stop.interrupted)
            detached = time.monotonic()
            detach_all(bpf)  # the counts stop moving before they are read: tables agree
            detach_s = time.monotonic() - detached
            fields = collect(bpf, elapsed)
            cost = measure_cost(bpf, events=fields.pop("events", 0))
    finally:
        bpf.cleanup()
    return result_cls(
        name=name,
        status=fields.pop("status", "ok"),
        reason=fields.pop("reason", ""),
        method=fields.pop("method", method),
        target=target.description,
        started=started,
        duration_s=elapsed,
        target_exited_at=stop.target_exited_at,
        interrupted=stop.interrupted,
        backed_off=stop.backed_off,
        detach_s=detach_s,
        lost=fields.pop("lost", {}),
        cost=cost,
        **fields,
    )
