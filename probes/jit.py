"""Names of JIT-compiled code in native stacks: perf maps, the text file `/tmp/perf-<pid>.map`
that JITs write for Linux perf (one line per compiled method: start, size, name, in hex), read
through the process's own root under the pid its namespace gives it.

A HotSpot JVM (17+) writes its map on request: `Compiler.perfmap` through the attach socket (a
snapshot of the code cache then: methods compiled later are not in it). memdiag asks for it only
when a stack of a JVM has frames in anonymous executable memory, removes the file afterwards when
it was not there before, and keeps the map for that process for a short while (the probes of one
diagnosis share it). Other JITs that keep the file themselves (node --perf-basic-prof) are read
as they are. Where no map can be had, `note` says why and the frames stay [unknown]."""

from __future__ import annotations

import bisect
import contextlib
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from memdiag.system.jvm import read_jvm_library
from memdiag.system.process import innermost_pid

from .jvm.attach import AttachRefused, describe_target, jcmd

MAX_MAP = 64 << 20  # a perf map of a large service is a few MiB; beyond this it is not read
KEEP_S = 60.0  # one map serves every probe of a diagnosis (JIT code moves little in a minute)


@dataclass(frozen=True)
class PerfMap:
    starts: list[int]
    ends: list[int]
    names: list[str]
    source: str  # where it came from, in words

    def lookup(self, address: int) -> tuple[str, int] | None:
        """(name, offset) of the compiled method holding address."""
        i = bisect.bisect_right(self.starts, address) - 1
        if i >= 0 and address < self.ends[i]:
            return self.names[i], address - self.starts[i]
        return None

    def __len__(self) -> int:
        return len(self.starts)


def parse_perf_map(text: str, source: str = "") -> PerfMap:
    """`START SIZE NAME` lines (hex, with or without 0x); malformed lines are skipped."""
    rows = []
    for line in text.splitlines():
        parts = line.split(None, 2)
        if len(parts) < 3:
            continue
        try:
            start, size = int(parts[0], 16), int(parts[1], 16)
        except ValueError:
            continue
        if size > 0:
            rows.append((start, start + size, _short(parts[2].strip())))
    rows.sort()
    return PerfMap([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows], source)


def _short(name: str) -> str:
    """HotSpot writes `<return type> <class>.<method>(<parameter types>)`: the return type goes,
    as Java stacks print methods."""
    head, paren, rest = name.partition("(")
    if paren and " " in head:
        head = head.rsplit(" ", 1)[1]
    return head + paren + rest


def _map_path(pid: int, proc_root: Path) -> Path:
    status = (proc_root / str(pid) / "status").read_text()
    nspid = innermost_pid(status) or pid
    return proc_root / str(pid) / "root" / "tmp" / f"perf-{nspid}.map"


def _read(path: Path) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        return os.read(fd, MAX_MAP).decode("utf-8", "replace")
    finally:
        os.close(fd)


@dataclass
class _Entry:
    at: float
    map: PerfMap | None
    note: str


_CACHE: dict[tuple[int, int | None], _Entry] = {}
_LOCK = threading.Lock()
NOTES: dict[int, str] = {}  # pid -> what the last look-up said (the report's JVM section shows it)


def jit_map(pid: int, proc_root: Path = Path("/proc")) -> PerfMap | None:
    """The JIT's map of this process (asked of a HotSpot JVM, else its own file), or None."""
    key = (pid, _start_ticks(proc_root / str(pid)))
    with _LOCK:
        hit = _CACHE.get(key)
        if hit is not None and time.monotonic() - hit.at < KEEP_S:
            return hit.map
        found, note = _fetch(pid, proc_root)
        _CACHE[key] = _Entry(time.monotonic(), found, note)
        NOTES[pid] = note
        return found


def _start_ticks(proc: Path) -> int | None:
    with contextlib.suppress(OSError, IndexError, ValueError):
        return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[19])
    return None


def _fetch(pid: int, proc_root: Path) -> tuple[PerfMap | None, str]:
    try:
        path = _map_path(pid, proc_root)
    except OSError:
        return None, f"PID {pid} is gone"
    if read_jvm_library(pid, proc_root) is None:
        text = _read(path)
        if text is None:
            return None, "no perf map of its JIT (/tmp/perf-PID.map) to name JIT-compiled frames"
        found = parse_perf_map(text, f"its JIT's own perf map ({len(text.splitlines())} lines)")
        return found, f"JIT-compiled frames named from {found.source}"
    return _from_jvm(pid, path, proc_root)


def _from_jvm(pid: int, path: Path, proc_root: Path) -> tuple[PerfMap | None, str]:
    existed = path.exists()
    started = time.monotonic()
    try:
        reply = jcmd(describe_target(pid, proc_root), "Compiler.perfmap", timeout_s=10)
    except AttachRefused as e:
        return None, f"JIT-compiled Java frames stay [unknown]: {e}"
    if not reply.ok or "Unknown diagnostic command" in reply.output:
        return None, "JIT-compiled Java frames stay [unknown]: this JVM has no Compiler.perfmap (JDK 17 and later do)"
    took = time.monotonic() - started
    text = _read(path)
    if not existed:
        with contextlib.suppress(OSError):
            os.unlink(path)
    if text is None:
        return None, "JIT-compiled Java frames stay [unknown]: the JVM wrote no perf map"
    found = parse_perf_map(text, f"the JVM's perf map (Compiler.perfmap, {took * 1000:.0f} ms)")
    return found, f"JIT-compiled Java frames named from {found.source}: {len(found):,} compiled methods"


@dataclass
class JitNames:
    """What a symbolizer found of JIT-compiled frames for one process."""

    pid: int
    map: PerfMap | None = None
    asked: bool = False
    named: int = 0
    unnamed: int = 0

    def lookup(self, address: int) -> tuple[str, int] | None:
        if not self.asked:
            self.asked = True
            self.map = jit_map(self.pid)
        hit = self.map.lookup(address) if self.map is not None else None
        if hit is None:
            self.unnamed += 1
        else:
            self.named += 1
        return hit
