"""How often tracepoints fire, counted for a short bounded time without attaching any program: one
counting perf event (PERF_TYPE_TRACEPOINT, the tracepoint's id from tracefs events/SYS/NAME/id, no
sampling, no buffer) per online CPU for the whole host, and one per thread of a process for its own
share, optionally filtered as ftrace filters (`id == 41 || id == 3` on raw_syscalls:sys_enter: the
calls a probe records). Host-wide probes (fdstack, kmemstack) are priced from these rates before
they attach (probes/hostwide.py): their programs run for every one of these events on the host.

A counting event adds a counter's increment to each hit (no BPF, nothing copied out); the kernel
still builds the tracepoint's record for it, the cost of a plain perf tracepoint event."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import struct
import time
from pathlib import Path

from memdiag.system._parse import Model

from . import bpfsys, kernel

MAX_THREADS = 256  # threads of the target counted one by one; more: the first ones, and it says so
_IOC_SET_FILTER = 0x40082406  # _IOW('$', 6, char *)


class TracepointCount(Model):
    """Events per tracepoint ("kmem:kfree") over `seconds`: the host's (every CPU) and a process's."""

    seconds: float
    host: dict[str, int]
    target: dict[str, int] = {}  # of the process's threads (filtered where a filter was given)
    threads: int = 0  # the process's threads counted
    threads_left: int = 0  # threads over MAX_THREADS, not counted
    unfiltered: list[str] = []  # tracepoints whose target filter the kernel refused: every event counted

    def host_per_s(self, tp: str) -> float:
        return self.host.get(tp, 0) / self.seconds if self.seconds > 0 else 0.0

    def target_per_s(self, tp: str) -> float:
        return self.target.get(tp, 0) / self.seconds if self.seconds > 0 else 0.0


def tracepoint_id(tp: str, root: Path | None = None) -> int | None:
    """The id of "sys:name" under tracefs (what PERF_TYPE_TRACEPOINT's config is), None when absent."""
    category, _, name = tp.partition(":")
    root = root or kernel.tracefs_root()
    if root is None:
        return None
    try:
        return int((root / "events" / category / name / "id").read_text())
    except (OSError, ValueError):
        return None


def _threads(pid: int) -> list[int]:
    try:
        return sorted(int(t) for t in os.listdir(f"/proc/{pid}/task") if t.isdigit())
    except OSError:
        return []


def _read(fd: int) -> int:
    data = os.read(fd, 8)
    return struct.unpack("Q", data)[0] if len(data) == 8 else 0


def count(
    tracepoints: tuple[str, ...],
    seconds: float,
    pids: tuple[int, ...] = (),
    filters: dict[str, str] | None = None,
    own: tuple[str, ...] | None = None,
) -> TracepointCount | str:
    """Count each tracepoint's events for `seconds` on every CPU, and those of `own` (default: all)
    in the threads of pids (the target's processes; filters: a tracepoint's ftrace filter for
    their count). A TracepointCount, or why not (one line: a tracepoint missing, perf_event_open
    refused)."""
    ids = {tp: tracepoint_id(tp) for tp in tracepoints}
    missing = [tp for tp, i in ids.items() if i is None]
    if missing:
        return f"no tracepoint {', '.join(missing)} under tracefs"
    cpus = _online() or sorted(os.sched_getaffinity(0))
    threads = [t for pid in sorted(pids) for t in _threads(pid)]
    counted, left = threads[:MAX_THREADS], max(0, len(threads) - MAX_THREADS)
    host: list[tuple[str, int]] = []
    mine: list[tuple[str, int]] = []
    unfiltered: set[str] = set()
    try:
        for tp, tp_id in ids.items():
            for cpu in cpus:
                host.append((tp, bpfsys.perf_event_open(bpfsys.PERF_TYPE_TRACEPOINT, tp_id, pid=-1, cpu=cpu, period=0)))
            for tid in counted if own is None or tp in own else ():
                try:
                    fd = bpfsys.perf_event_open(bpfsys.PERF_TYPE_TRACEPOINT, tp_id, pid=tid, cpu=-1, period=0)
                except OSError as e:
                    if e.errno == errno.ESRCH:
                        continue  # the thread ended meanwhile
                    raise
                mine.append((tp, fd))
                if filters and tp in filters:
                    try:
                        fcntl.ioctl(fd, _IOC_SET_FILTER, filters[tp].encode() + b"\0")
                    except OSError:
                        unfiltered.add(tp)
        start = time.monotonic()
        before = [_read(fd) for _, fd in host + mine]
        time.sleep(seconds)
        after = [_read(fd) for _, fd in host + mine]
        spanned = time.monotonic() - start
    except OSError as e:
        return f"could not count {', '.join(tracepoints)}: {e}"
    finally:
        for _, fd in host + mine:
            with contextlib.suppress(OSError):
                os.close(fd)
    deltas = [b - a for a, b in zip(before, after, strict=True)]
    by_host: dict[str, int] = dict.fromkeys(tracepoints, 0)
    by_target: dict[str, int] = dict.fromkeys(own if own is not None else tracepoints, 0) if pids else {}
    for (tp, _), d in zip(host, deltas[: len(host)], strict=True):
        by_host[tp] += d
    for (tp, _), d in zip(mine, deltas[len(host) :], strict=True):
        by_target[tp] += d
    return TracepointCount(
        seconds=spanned,
        host=by_host,
        target=by_target,
        threads=len(counted),
        threads_left=left,
        unfiltered=sorted(unfiltered),
    )


def _online() -> list[int]:
    """The online CPUs (/sys/devices/system/cpu/online: "0-1,4"), [] when unreadable."""
    try:
        text = Path("/sys/devices/system/cpu/online").read_text().strip()
    except OSError:
        return []
    cpus: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        with contextlib.suppress(ValueError):
            cpus += list(range(int(lo), int(hi or lo) + 1))
    return cpus
