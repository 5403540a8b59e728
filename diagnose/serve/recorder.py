"""The flight recorder of `memdiag serve`: every memory cgroup and the processes in it, sampled at a
steady cadence for as long as the server runs, so that an OOM kill nobody was watching is explained
by what grew before it (scene.py), and an alert's diagnosis can start from the minutes before it.

What it keeps, per cgroup: usage, limit and the cgroup ledger's lines in four parts (anonymous, page
cache, shared memory, kernel: system/ledger.py); per process: RSS, anonymous and file-backed, and for
a JVM its own heap counters (hsperfdata: used, after GC, maximum). Each series holds the last
FINE_POINTS samples (a quarter of an hour at the default 5 s) and, before them, a point a minute for
the hour: bounded memory (fixed arrays of 8-byte values), whatever the server's uptime. A cgroup or
process that ends keeps its series for the look-back (the victim of a kill is gone when its kill is
read; its container often too), the oldest ended dropped first past the caps.

Where a process climbs steadily toward its cgroup's limit (else the host's available memory) within
the look-back's hour, a short sample of its page faults by stack names the code touching the new
pages: `memdiag probe faults` in a process of its own (the BPF compiler's memory is given back when
it ends), one at a time, once per process per FAULT_COOLDOWN_S. Nothing is attached to a process
that is not growing.

Everything read is the kernel's (cgroup files, /proc/PID/stat and statm) or parsed with bounds
(hsperfdata, system/hsperfdata.py); nothing a target controls is executed or followed."""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
import threading
import time
from array import array
from collections.abc import Callable
from pathlib import Path

from memdiag.probes.faults import FaultsResult
from memdiag.probes.growth import heaviest_function
from memdiag.system import clock
from memdiag.system._parse import fs_text
from memdiag.system.cgroup import (
    _bytes_or_unlimited,
    cgroup_folders,
    locate_memory_cgroup,
    memory_hierarchy,
)
from memdiag.system.hsperfdata import perfdata_behind_fuse, read_perfdata
from memdiag.system.jvm import jvm_counters, read_jvm_library
from memdiag.system.ledger import cgroup_families
from memdiag.system.meminfo import read_meminfo
from memdiag.system.process import stat_identity
from memdiag.system.tmpfs import read_shm_mounts
from memdiag.system.trends import MIN_GROWTH_BYTES, growth_trend

from ..factset import namer
from .scene import Point, Scene, explain

EVERY_S = 5.0
FINE_POINTS = 180  # the last quarter of an hour at 5 s
COARSE_EVERY_S = 60.0
# A cgroup whose usage has not moved by a byte since the last round (most of a host's are idle) keeps
# the split and limit its memory.stat said then, read again at least this often (a limit changed on
# an idle cgroup is seen within it): memory.stat is most of what a round costs the kernel and us
STAT_AGAIN_S = 30.0
COARSE_POINTS = 61  # the hour, a point a minute (its last ones overlap the fine ring's)
HORIZON_S = 3600.0
MAX_CGROUPS = 2000
LISTED = 50  # processes of a cgroup GET /cgroups?path= lists by default (at most MAX_LISTED)
MAX_LISTED = 1000
MAX_PROCESSES = 4096
MAX_PIDS_READ = 8192  # processes listed in one cgroup.procs read at most
CG_FIELDS = ("usage", "limit", "anon", "file", "shmem", "kernel")
PROC_FIELDS = ("rss", "anon", "file", "heap_used", "heap_after_gc", "heap_max")
UNKNOWN = -1
# the fault sample: how long, how often per process, and when a climb merits one
FAULT_SAMPLE_S = 5.0
FAULT_COOLDOWN_S = 600.0
TREND_POINTS = 36  # the climb judged over the last three minutes at the default cadence
FAULT_GAP_S = 60.0  # between two fault samples on the host, whoever they were of
FAULT_MIN_POINTS = 4  # 15 s at the default cadence: a kill a minute away is sampled in time
SHM_WALK_EVERY_S = 60.0  # a cgroup whose shared memory climbs has its tmpfs files walked this often at most
PAGE = os.sysconf("SC_PAGE_SIZE")


class Ring:
    """The last n samples of `width` values each (UNKNOWN for a value not read), oldest dropped."""

    def __init__(self, n: int, width: int):
        self.n, self.width = n, width
        self.t = array("d", bytes(8 * n))
        self.v = array("q", bytes(8 * n * width))
        self.head = self.count = 0

    def push(self, t: float, values: tuple[int, ...]) -> None:
        i = self.head
        self.t[i] = t
        self.v[i * self.width : (i + 1) * self.width] = array("q", values)
        self.head = (i + 1) % self.n
        self.count = min(self.count + 1, self.n)

    def items(self) -> list[tuple[float, tuple[int, ...]]]:
        start = (self.head - self.count) % self.n
        out = []
        for k in range(self.count):
            i = (start + k) % self.n
            out.append((self.t[i], tuple(self.v[i * self.width : (i + 1) * self.width])))
        return out

    def last_t(self) -> float | None:
        return self.t[(self.head - 1) % self.n] if self.count else None

    @property
    def nbytes(self) -> int:
        return self.t.itemsize * len(self.t) + self.v.itemsize * len(self.v)


class Series:
    """A fine ring of the latest samples and a coarse one (a point a minute) for the hour before."""

    def __init__(self, fields: tuple[str, ...]):
        self.fields = fields
        self.fine = Ring(FINE_POINTS, len(fields))
        self.coarse = Ring(COARSE_POINTS, len(fields))

    def push(self, t: float, values: dict[str, int | None]) -> None:
        row = tuple(_int64(values.get(f)) for f in self.fields)
        last = self.coarse.last_t()
        if last is None or t - last >= COARSE_EVERY_S:
            self.coarse.push(t, row)
        self.fine.push(t, row)

    def points(self, since: float = 0.0) -> list[Point]:
        """(wall time, fields) oldest first: the coarse points older than the fine ones, then those."""
        fine = self.fine.items()
        first_fine = fine[0][0] if fine else float("inf")
        rows = [r for r in self.coarse.items() if r[0] < first_fine] + fine
        return [(t, {f: (None if x == UNKNOWN else x) for f, x in zip(self.fields, row, strict=True)})
                for t, row in rows if t >= since]  # fmt: skip

    def recent(self, field: str, n: int) -> list[tuple[float, float]]:
        """(time, value) of one field over the last n samples, unknown ones left out: what each round
        reads of every series, so no point is built that is not needed."""
        r, k = self.fine, self.fields.index(field)
        out = []
        for j in range(max(0, r.count - n), r.count):
            i = (r.head - r.count + j) % r.n
            x = r.v[i * r.width + k]
            if x != UNKNOWN:
                out.append((r.t[i], float(x)))
        return out

    def rise(self, field: str, n: int) -> int | None:
        """How much one field rose over the last n samples (its latest less the one n before, or the
        oldest kept where fewer): the round's cheap first look at every series, None where there is
        a single sample or either value is unknown."""
        r, k = self.fine, self.fields.index(field)
        n = min(n, r.count - 1)
        if n < 1:
            return None
        now, then = (r.head - 1) % r.n, (r.head - 1 - n) % r.n
        a, b = r.v[then * r.width + k], r.v[now * r.width + k]
        return None if UNKNOWN in (a, b) else b - a

    def last(self) -> dict[str, int | None] | None:
        """The latest sample's fields."""
        r = self.fine
        if not r.count:
            return None
        i = (r.head - 1) % r.n
        row = r.v[i * r.width : (i + 1) * r.width]
        return {f: (None if x == UNKNOWN else x) for f, x in zip(self.fields, row, strict=True)}

    @property
    def nbytes(self) -> int:
        return self.fine.nbytes + self.coarse.nbytes


class ProcessSeries(Series):
    def __init__(self, pid: int, comm: str, start: int, cgroup: str, jvm: bool):
        super().__init__(PROC_FIELDS)
        self.pid, self.comm, self.start, self.cgroup, self.jvm = pid, comm, start, cgroup, jvm
        self.ended: float | None = None
        self.faults: dict | None = None  # the last fault sample of it
        self.sampled_at: float | None = None


class CgroupSeries(Series):
    def __init__(self, path: str):
        super().__init__(CG_FIELDS)
        self.path = path
        self.ended: float | None = None
        self.shm_files: list[tuple[str, int, int]] = []
        self.shm_walked: float | None = None
        self.sampled_at: float | None = None  # the last fault sample of a process of it
        self.stat_at: float | None = None  # when its memory.stat was last read (STAT_AGAIN_S)


def _int64(x: int | None) -> int:
    """A value as the rings keep it: UNKNOWN for None, and within int64 (a JVM's counters are the
    target's to write: two spaces of 2^62 bytes would overflow the array)."""
    return UNKNOWN if x is None else max(0, min(int(x), (1 << 63) - 1))


def _read(path: str, limit: int) -> str | None:
    """A kernel file's first `limit` bytes (one read: cgroup and proc files answer whole), None when
    it cannot be read; bytes that are not UTF-8 replaced. The recorder reads thousands a round."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, limit).decode(errors="replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def _number(text: str | None) -> int | None:
    text = text.strip() if text else ""
    return int(text) if text.isdigit() else None


_KEY_VALUE = re.compile(r"^(\S+) (\d+)$", re.MULTILINE)  # in C: hundreds of memory.stat files a round


def _numbers(text: str | None) -> dict[str, int]:
    """`key value` lines (memory.stat) as a dict; a line of another form skipped."""
    return {key: int(value) for key, value in _KEY_VALUE.findall(text or "")}


def _procs(fs: str) -> list[int]:
    """The processes of a cgroup folder itself (not of those below it), at most MAX_PIDS_READ."""
    pids = (_read(fs + "/cgroup.procs", MAX_PIDS_READ * 8) or "").split()[:MAX_PIDS_READ]
    return [int(p) for p in pids if p.isdigit()]


def read_statm(pid: int, proc: Path) -> tuple[int, int] | None:
    """(resident, shared) bytes from /proc/PID/statm: shared is RssFile + RssShmem."""
    text = _read(f"{proc}/{pid}/statm", 256)
    parts = text.split() if text else []
    if len(parts) < 3 or not (parts[1].isdigit() and parts[2].isdigit()):
        return None
    return int(parts[1]) * PAGE, int(parts[2]) * PAGE


class Recorder:
    """The recorder's state and its sampling thread (start/stop); tick() takes one round, for tests."""

    def __init__(
        self,
        every_s: float = EVERY_S,
        proc: Path = Path("/proc"),
        wall: Callable[[], float] = clock.wall,
        fault_sampler: Callable[[int, str], dict | None] | None = None,
        faults: bool = True,
        busy: Callable[[], bool] = lambda: False,
    ):
        """busy: whether a diagnosis runs now (the budget is the host's: no fault sample beside it)."""
        found = memory_hierarchy(proc)
        self.version, self.mount = (found[0], Path(found[1].mount_point)) if found else (None, None)
        self.root = found[1].mount_point.rstrip("/") if found else ""
        self.every_s, self.proc, self.wall = every_s, proc, wall
        self.cgroups: dict[str, CgroupSeries] = {}
        self.processes: dict[int, ProcessSeries] = {}
        self.skipped: dict = {"cgroups_capped": False, "processes": 0, "unreadable": 0}  # at the last round
        self.ticks, self.cpu_s, self.last_tick_s = 0, 0.0, 0.0
        self.last_round_at = time.monotonic()  # a round that never ends is a recorder stuck (health())
        self.samples = 0
        self._last_sample_at: float | None = None
        self._busy = busy
        own = locate_memory_cgroup(os.getpid(), proc)
        self._own_cgroup = own.path if own is not None else None  # memdiag's own: never sampled
        self._sample = fault_sampler or sample_faults
        self._faults = faults
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._sampling: threading.Thread | None = None
        self._thread: threading.Thread | None = None
        self.error: str | None = None if self.mount is not None else "no memory cgroup hierarchy mounted"

    def start(self) -> Recorder:
        if self.mount is not None:
            self._thread = threading.Thread(target=self._loop, name="memdiag-recorder", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            try:
                self.tick()
            except Exception as e:  # noqa: BLE001 (a folder gone mid-walk, an odd file: the recorder goes on)
                print(f"memdiag serve: the recorder's round failed: {e}", file=sys.stderr, flush=True)
            self._stop.wait(max(0.0, self.every_s - (time.monotonic() - began)))

    def tick(self) -> None:
        """One round: every cgroup and its processes read once. Each is read on its own: what one
        cgroup or process makes fail (an odd file, a folder gone mid-walk) costs that one alone, and
        the round always ends (its ended series marked, the oldest dropped past the caps)."""
        if self.mount is None:
            return
        cpu0, t = time.thread_time(), self.wall()
        seen_cg: set[str] = set()
        seen_pid: set[int] = set()
        skipped_pid = failed = 0
        capped = False
        for folder in itertools.chain(["/"], cgroup_folders(self.mount)):  # walked as it is read
            if len(seen_cg) >= MAX_CGROUPS:
                capped = True  # the rest of the tree is not walked: said in its cost
                break
            fs = self.root + folder.rstrip("/")
            path = fs_text(folder)  # the key and what is shown: a name that is no UTF-8, escaped
            with self._lock:
                series = self.cgroups.get(path)
            try:
                values = self._cgroup_values(fs, path, series, t)
            except (OSError, ValueError, OverflowError):
                failed += 1
                continue
            if values is None:
                continue
            seen_cg.add(path)
            with self._lock:
                if series is None:
                    series = self.cgroups[path] = CgroupSeries(path)
                    series.stat_at = t
                series.ended = None
                series.push(t, values)
            if path == "/":
                continue  # the root's processes are the host's: too many to keep, and no limit kills them
            for pid in _procs(fs):
                if len(seen_pid) >= MAX_PROCESSES:
                    skipped_pid += 1
                    continue
                try:
                    if self._process(pid, path, t):
                        seen_pid.add(pid)
                except (OSError, ValueError, OverflowError):
                    failed += 1
        with self._lock:
            self._end(t, seen_cg, seen_pid)
            self.skipped = {"cgroups_capped": capped, "processes": skipped_pid, "unreadable": failed}
        self._walk_shm(t)
        if self._faults:
            self._maybe_sample(t)
        self.ticks += 1
        self.last_round_at = time.monotonic()
        self.last_tick_s = time.thread_time() - cpu0
        self.cpu_s += self.last_tick_s

    def _cgroup_values(self, fs: str, path: str, known: CgroupSeries | None, t: float) -> dict[str, int | None] | None:
        v1 = self.version == 1
        usage = _number(_read(fs + ("/memory.usage_in_bytes" if v1 else "/memory.current"), 64))
        if usage is None:  # the root of v2 has no memory.current: its usage is the host's
            return None
        last = known.last() if known is not None and known.ended is None else None
        fresh = known is not None and known.stat_at is not None and t - known.stat_at < STAT_AGAIN_S
        if last is not None and last["usage"] == usage and fresh:
            return last  # not a byte moved: its split and limit as read last (STAT_AGAIN_S)
        if known is not None:
            known.stat_at = t
        stat = _numbers(_read(fs + "/memory.stat", 1 << 16))
        kmem = _number(_read(fs + "/memory.kmem.usage_in_bytes", 64)) if v1 else None
        if path == "/":
            limit = None
        elif v1:  # v1's memory.stat says the lowest limit of it and its parents: no file more to read
            h = stat.get("hierarchical_memory_limit")
            limit = h if h is not None and h < 1 << 60 else None
        else:
            limit = _bytes_or_unlimited(_read(fs + "/memory.max", 64))
        return {"usage": usage, "limit": limit, **cgroup_families(2 if not v1 else 1, stat, kmem)}

    def _process(self, pid: int, cgroup: str, t: float) -> bool:
        """One process's sample; its stat read every round (comm and start time: a pid reused, or a
        program exec'd with a new name, starts a series of its own or renames it)."""
        stat = _read(f"{self.proc}/{pid}/stat", 4096)
        fields = stat_identity(stat) if stat else None
        if fields is None:
            return False
        comm, start = fields
        known = self.processes.get(pid)
        if known is None or known.start != start or known.cgroup != cgroup:
            known = ProcessSeries(pid, comm, start, cgroup, self._jvm(pid))
            with self._lock:
                self.processes[pid] = known
        elif known.comm != comm:  # exec'd (an entrypoint script that execs java): what it runs now
            known.comm, known.jvm = comm, self._jvm(pid)
        known.ended = None
        statm = read_statm(pid, self.proc)
        if statm is None:
            return False
        rss, shared = statm
        values: dict[str, int | None] = {"rss": rss, "anon": rss - shared, "file": shared}
        if known.jvm:
            perf = read_perfdata(pid, self.proc)
            if perf is not None:
                c = jvm_counters(perf)
                values.update(heap_used=c.heap_used, heap_after_gc=c.after_gc_used, heap_max=c.heap_max)
        with self._lock:
            known.push(t, values)
        return True

    def _jvm(self, pid: int) -> bool:
        """A HotSpot JVM whose counters can be read without crossing a FUSE mount of its own."""
        return read_jvm_library(pid, self.proc) is not None and not perfdata_behind_fuse(pid, self.proc)

    def _end(self, t: float, cgroups: set[str], pids: set[int]) -> None:
        """Series not seen this round end now; ended ones past the look-back are dropped, and past the
        caps (twice the live ones) the longest ended first, once a round."""
        for table, seen, cap in ((self.cgroups, cgroups, MAX_CGROUPS), (self.processes, pids, MAX_PROCESSES)):
            for key, s in list(table.items()):
                if key in seen:
                    continue
                if s.ended is None:
                    s.ended = t
                elif t - s.ended > HORIZON_S:
                    del table[key]
            over = len(table) - 2 * cap
            if over > 0:
                ended = sorted((s.ended, k) for k, s in table.items() if s.ended is not None)
                for _ended, key in ended[:over]:
                    del table[key]

    def _walk_shm(self, t: float) -> None:
        """The tmpfs files of a cgroup whose shared memory climbs, as its largest process sees them (a
        container's /dev/shm is its own), at most once a minute per cgroup: the scene names them."""
        for s in list(self.cgroups.values()):
            if s.ended is not None or (s.shm_walked is not None and t - s.shm_walked < SHM_WALK_EVERY_S):
                continue
            n = max(3, int(SHM_WALK_EVERY_S / self.every_s))
            # most cgroups: nothing more computed than this subtraction
            if s.fine.count < 3 or (s.rise("shmem", n - 1) or 0) <= MIN_GROWTH_BYTES:
                continue
            pts = s.recent("shmem", n)
            if growth_trend(pts).shape != "climbing":
                continue
            members = [p for p in self.processes.values() if p.cgroup == s.path and p.ended is None]
            pid = max(members, key=lambda p: (p.last() or {}).get("rss") or 0).pid if members else None
            s.shm_walked = t
            # the fullest tmpfs it sees by its use (statvfs), then that one walked, the others not
            seen = read_shm_mounts(pid, self.proc) if pid is not None else None
            mounts = read_shm_mounts(pid, self.proc, walk=True, only=seen[0].mount_point) if seen else None
            if mounts:
                top = mounts[0]
                s.shm_files = [
                    (f"{top.mount_point.rstrip('/')}/{p.pattern}", p.files, p.bytes) for p in top.patterns[:3]
                ]

    def _maybe_sample(self, t: float) -> None:
        """A fault sample of the steadiest climber heading for its limit within the hour, if none runs."""
        if self._sampling is not None and self._sampling.is_alive() or self._busy():
            return
        if self._last_sample_at is not None and t - self._last_sample_at < FAULT_GAP_S:
            return
        best = None
        for p in list(self.processes.values()):
            if p.ended is not None or p.cgroup == self._own_cgroup:
                continue
            # once per process, and per cgroup, a cooldown: pids that come and go get no sample each
            cg = self.cgroups.get(p.cgroup)
            if any(x is not None and t - x < FAULT_COOLDOWN_S for x in (p.sampled_at, cg and cg.sampled_at)):
                continue
            # the last few samples first (most processes do not grow: nothing more is computed for them),
            # then the trend over the last TREND_POINTS
            if p.fine.count < FAULT_MIN_POINTS or (p.rise("rss", FAULT_MIN_POINTS - 1) or 0) <= MIN_GROWTH_BYTES:
                continue
            trend = growth_trend(p.recent("rss", TREND_POINTS))
            if trend.shape != "climbing" or not trend.rate_per_s or trend.rate_per_s <= 0:
                continue
            room = self._room(p)
            if room is None or room / trend.rate_per_s > HORIZON_S:
                continue
            if best is None or trend.rate_per_s > best[0]:
                best = (trend.rate_per_s, p)
        if best is None:
            return
        p = best[1]
        p.sampled_at = self._last_sample_at = t
        if (cg := self.cgroups.get(p.cgroup)) is not None:
            cg.sampled_at = t
        self._sampling = threading.Thread(
            target=self._take_sample, args=(p,), name="memdiag-recorder-faults", daemon=True
        )
        self._sampling.start()

    def _room(self, p: ProcessSeries) -> int | None:
        """Memory left before a kill: the least room under a limit of its cgroup or one above it (a
        podman container's limit is on its scope, a service's on its slice), else the host's
        MemAvailable."""
        rooms = []
        parts = p.cgroup.strip("/").split("/")
        for k in range(len(parts), 0, -1):
            s = self.cgroups.get("/" + "/".join(parts[:k]))
            last = s.last() if s is not None else None
            if last and last.get("limit") and last.get("usage") is not None:
                rooms.append(max(0, last["limit"] - last["usage"]))  # type: ignore[operator]
        return min(rooms) if rooms else read_meminfo(self.proc).mem_available

    def _take_sample(self, p: ProcessSeries) -> None:
        """The sample, kept only if the process is the one chosen before and after it (its start time)."""
        try:
            found = self._sample(p.pid, p.comm) if self._same(p) else None
        except Exception as e:  # noqa: BLE001 (a sample that fails is said, and the recorder goes on)
            found = {"error": str(e)}
        if found is None or not self._same(p):
            return
        found = {**found, "at": self.wall(), "pid": p.pid}
        with self._lock:
            p.faults = found
            self.samples += 1

    def _same(self, p: ProcessSeries) -> bool:
        stat = _read(f"{self.proc}/{p.pid}/stat", 4096)
        fields = stat_identity(stat) if stat else None
        return fields is not None and fields[1] == p.start

    def health(self) -> str | None:
        """A problem for /healthz: rounds that stopped (a read that never returns holds the thread)."""
        if self.mount is None or self._thread is None:
            return None
        late = time.monotonic() - self.last_round_at
        if late > 3 * self.every_s + 30:
            return f"the flight recorder's last round ended {late:.0f} s ago (a round every {self.every_s:g} s)"
        return None

    # --- reads of what it kept ---

    def index(self) -> dict:
        """Every cgroup it keeps, with its latest values: GET /cgroups."""
        with self._lock:
            rows = []
            for path, s in sorted(self.cgroups.items()):
                rows.append({"path": path, "ended": s.ended, **(s.last() or {})})
            return {**self.cost(), "cgroups": rows}

    def cost(self) -> dict:
        with self._lock:
            held = sum(s.nbytes for s in self.cgroups.values()) + sum(s.nbytes for s in self.processes.values())
            return {
                "every_s": self.every_s,
                "rounds": self.ticks,
                "cpu_s": round(self.cpu_s, 3),
                "last_round_cpu_s": round(self.last_tick_s, 4),
                "series_bytes": held,
                "cgroups_kept": len(self.cgroups),
                "processes_kept": len(self.processes),
                "not_recorded": dict(self.skipped),
                "fault_samples": self.samples,
                "last_round_s_ago": round(time.monotonic() - self.last_round_at, 1),
            }

    def lookback(self, path: str, since: float = 0.0, processes: int = LISTED) -> dict | None:
        """A cgroup's series and its processes': GET /cgroups?path=... (since: a time as they are
        printed, to the millisecond; processes: the live ones largest first, then the latest ended,
        at most this many, the total said)."""
        since -= 0.0005
        with self._lock:
            s = self.cgroups.get(path)
            if s is None:
                return None
            every = [p for p in self.processes.values() if p.cgroup == path]
            live = sorted((p for p in every if p.ended is None), key=lambda p: -((p.last() or {}).get("rss") or 0))
            ended = sorted((p for p in every if p.ended is not None), key=lambda p: -(p.ended or 0))
            procs = (live + ended)[:processes]
            return {
                "processes_total": len(every),
                "path": path,
                "every_s": self.every_s,
                "ended": s.ended,
                "fields": list(CG_FIELDS),
                "points": [[round(t, 3), *v.values()] for t, v in s.points(since)],
                "shm_files": s.shm_files,
                "processes": [
                    {
                        "pid": p.pid,
                        "comm": p.comm,
                        "ended": p.ended,
                        "jvm": p.jvm,
                        "fields": list(PROC_FIELDS),
                        "points": [[round(t, 3), *v.values()] for t, v in p.points(since)],
                        "faults": p.faults,
                    }
                    for p in procs
                ],
            }

    def scene(self, cgroup: str | None, victim_pid: int | None, victim_comm: str, when: float, limit: int | None,
              victim_name: str = "the victim", host_oom: bool = False) -> Scene | None:  # fmt: skip
        """What the recorder saw grow before a kill at `when` in `cgroup` (the one whose limit was hit;
        host_oom: the host ran out, and `cgroup` is the victim's, its limit not the cause)."""
        with self._lock:
            s = self.cgroups.get(cgroup) if cgroup else None
            if s is None:
                return None
            since = when - HORIZON_S
            cg_points = s.points(since)
            victim = self.processes.get(victim_pid) if victim_pid is not None else None
            if victim is not None and (not victim_comm or victim.comm[:15] != victim_comm[:15]):
                victim = None  # its pid is another process's now
            v_points = victim.points(since) if victim is not None else []
            faults = victim.faults if victim is not None and victim.faults and "function" in victim.faults else None
            shm = list(s.shm_files)
        return explain(cg_points, v_points, when, self.every_s, limit, faults, shm, victim_name, host_oom)


def sample_faults(pid: int, comm: str, seconds: float = FAULT_SAMPLE_S) -> dict | None:
    """`memdiag probe faults` on the process for `seconds`, in a process of its own (memdiag's own
    Python and code): the application function its faults name most, with that function's share."""
    cmd = [sys.executable, "-c", "import sys; from memdiag.diagnose.cli import entry; sys.exit(entry())"]
    cmd += ["probe", "faults", "--pid", str(pid), "--duration", f"{seconds:g}", "--json", "--top", "20"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60, check=False)
    except subprocess.TimeoutExpired:
        return {"error": "the fault sample did not end in time"}
    try:
        r = FaultsResult.model_validate(json.loads(out.stdout))
    except ValueError:
        return {"error": (out.stderr.strip().splitlines() or ["no answer"])[-1][:200]}
    if r.status not in ("ok", "partial") or not r.stacks:
        return {"error": r.reason or "no faults sampled", "events": r.cost.events}
    name = namer()
    fn = heaviest_function(r.stacks, name)
    total = r.cost.events or sum(s.count for s in r.stacks)  # every fault counted, not the stacks shown
    mine = sum(s.count for s in r.stacks if name(s.frames, []) == fn)
    return {
        "function": fn,
        "share": 100.0 * mine / total if total else None,
        "faults": sum(s.count for s in r.stacks),
        "seconds": seconds,
    }
