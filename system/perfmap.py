"""A JIT's perf map: /tmp/perf-PID.map, the names a runtime writes for the code it generates
(`START SIZE NAME` lines, hexadecimal), the convention Linux perf reads. Node writes it under
`--perf-basic-prof` (V8's names: `JS:*handleOrder /srv/app.js:17:21`, `Builtin:ArrayPrototypePush`);
a HotSpot JVM when told Compiler.perfmap (probes/jvm/perfmap.py; it writes 0x before the numbers and a
return type before the method: `boolean java.util.ArrayList.add(java.lang.Object)`), or with
perf-map-agent; .NET with DOTNET_PerfMapEnabled=1. It is read through the process's root (a
container's /tmp) under the pid the process's own namespace gives it, the pid the runtime wrote
into the name.

Entries are appended as code is generated, and code moved or collected leaves its old entries:
of the entries covering an address, the one written last names it."""

from __future__ import annotations

import bisect
import os
import re
from array import array
from dataclasses import dataclass
from pathlib import Path

from . import safefile
from ._parse import read_text
from .process import effective_uid, innermost_pid

# Bounds on a file the target writes (any user can fill their own /tmp/perf-PID.map). The newest
# entries are the ones that name live code, so a larger file is read from its end. 16 MiB is
# ~200,000 V8 entries (80 bytes a line), more than a JVM's whole code cache (Compiler.perfmap of a
# large service: ~10 MiB). What a map costs memdiag: the bytes read, kept (a name is decoded when
# looked up), and 32 bytes an entry in arrays: at most 16 MiB + 250,000 x 32 B = 24 MiB held. A
# maximal map (1 GiB) raised memdiag's peak RSS by 27 MiB, 39 with numpy's import, in 0.2-0.3 s
# (tests/unit/test_hostile_symbol_inputs.py); the reader before this kept 64 MiB as objects: +540 MiB.
MAX_BYTES = 16 << 20
MAX_LINES = 250_000  # the newest lines read: a map of short lines ("0 1 x") is 2.8M lines in 16 MiB
MAX_NAME = 1024  # bytes of a name kept: a Java signature is rarely over 300; the rest is the target's text
_CUT = "…"  # marks a name cut at MAX_NAME
# `START SIZE NAME`, HotSpot writes 0x before both numbers; numbers past 64 bits are no address
_ENTRY = re.compile(rb"^[ \t]*(?:0x)?([0-9a-fA-F]{1,16}) (?:0x)?([0-9a-fA-F]{1,16}) ([^\n]*\S)", re.M)
_LINE = re.compile(r"^(?:0x)?([0-9a-fA-F]{1,16}) (?:0x)?([0-9a-fA-F]{1,16}) (.+)$")
# V8's code names: a kind, a tier mark (~ interpreted or baseline-compiled, ^ Sparkplug, + Maglev,
# * TurboFan), the function's name (empty for an anonymous one), its script and line:column
_V8_JS = re.compile(r"^(?:JS|LazyCompile|Function|Script):(?P<tier>[~^+*]?)(?P<fn>\S*)(?: (?P<src>.+?))?$")
_OVERLAP_SCAN = 32  # entries before an address checked for the newest one covering it
# entries past which the map is sorted in numpy: Python's sort of 500,000 keeps ~40 MiB of int
# objects for a moment (its keys and the order), numpy's 8 bytes an entry
_SORT_IN_NUMPY = 65_536


@dataclass(frozen=True)
class JitSymbol:
    start: int
    size: int
    name: str  # as the runtime wrote it
    order: int  # its line in the file: a later entry wins over an earlier one at the same code

    def function(self) -> tuple[str, str | None]:
        """(function, source) as a person reads it: V8's `JS:*handleOrder /srv/app.js:17:21` is
        (handleOrder, app.js:17), an anonymous one `(anonymous at app.js:9)` (each its own: a verdict
        that names "(anonymous)" names no code); other names are kept as written, without a source."""
        m = _V8_JS.match(self.name)
        if m is None:
            return self.name, None
        source = _source(m["src"]) if m["src"] else None
        return m["fn"] or (f"(anonymous at {source})" if source else "(anonymous)"), source


def _source(src: str) -> str:
    """`/srv/app.js:17:21` -> `app.js:17`; Node's own modules keep their name (`node:internal/timers:569`)."""
    parts = src.rsplit(":", 2)
    if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
        path, line = parts[0], parts[1]
    elif len(parts) >= 2 and parts[-1].isdigit():
        path, line = src.rsplit(":", 1)
    else:
        path, line = src, ""
    shown = path if path.startswith("node:") else os.path.basename(path)
    return f"{shown}:{line}" if line else shown


class PerfMap:
    """One perf map's entries, by address: arrays of starts, sizes and line numbers, and each name
    as a span of the bytes read (a JitSymbol per entry cost ~400 bytes: 636 MB for a 1 GB map)."""

    def __init__(self, path: str, symbols: list[JitSymbol], size: int, truncated: bool):
        text = "".join(f"{s.start:x} {s.size:x} {s.name}\n" for s in sorted(symbols, key=lambda s: s.order))
        self._index(path, text.encode(errors="replace"), size, truncated, 0)

    @classmethod
    def from_bytes(cls, path: str, raw: bytes | bytearray, size: int, truncated: bool, begin: int = 0) -> PerfMap:
        """The map of a file's bytes from `begin` (the newest MAX_LINES lines of them)."""
        pm = cls.__new__(cls)
        pm._index(path, raw, size, truncated, max(begin, _newest_lines(raw)))
        return pm

    def _index(self, path: str, raw: bytes | bytearray, size: int, truncated: bool, begin: int) -> None:
        self.path, self.size, self.truncated = path, size, truncated
        self.rename = None  # a function applied to each name looked up (probes/jvm/perfmap.py: HotSpot's)
        self.where: tuple[str, str, int | None] | None = None  # (root, path in it, owner) when read from a process
        self._raw = raw
        starts, sizes, spans = array("Q"), array("Q"), array("Q")  # span: name's offset << 16 | its length
        for m in _ENTRY.finditer(raw, begin):
            at, end = m.start(3), min(m.end(3), m.start(3) + MAX_NAME + 1)  # MAX_NAME + 1: cut
            starts.append(int(m[1], 16))
            sizes.append(int(m[2], 16))
            spans.append(at << 16 | (end - at))
        self.count = len(starts)
        # by start, and among entries at one start in the order written (both sorts are stable)
        if len(starts) > _SORT_IN_NUMPY:
            import numpy as np  # here: a large map only (its import is ~12 MiB of memdiag's RSS)

            by = np.frombuffer(starts, dtype=np.uint64).argsort(kind="stable")
            self.starts, self._sizes, self._spans, self._orders = array("Q"), array("Q"), array("Q"), array("Q")
            for a, into in ((starts, self.starts), (sizes, self._sizes), (spans, self._spans)):
                into.frombytes(memoryview(np.frombuffer(a, dtype=np.uint64)[by]).cast("B"))
                del a[:]  # given back before the next is copied
            self._orders.frombytes(memoryview(by.astype(np.uint64)).cast("B"))
        else:
            order = sorted(range(len(starts)), key=starts.__getitem__)
            self.starts = array("Q", (starts[i] for i in order))
            self._sizes = array("Q", (sizes[i] for i in order))
            self._spans = array("Q", (spans[i] for i in order))
            self._orders = array("Q", order)

    def _symbol(self, i: int) -> JitSymbol:
        span = self._spans[i]
        at, n = span >> 16, span & 0xFFFF
        name = self._raw[at : at + min(n, MAX_NAME)].decode(errors="replace") + (_CUT if n > MAX_NAME else "")
        if self.rename is not None:
            name = self.rename(name)
        return JitSymbol(self.starts[i], self._sizes[i], name, self._orders[i])

    @property
    def symbols(self) -> list[JitSymbol]:
        """Every entry, by start (for tests and small maps: each one made here)."""
        return [self._symbol(i) for i in range(self.count)]

    def lookup(self, address: int) -> JitSymbol | None:
        i = bisect.bisect_right(self.starts, address)
        near = range(max(0, i - _OVERLAP_SCAN), i)
        covering = [j for j in near if self.starts[j] <= address < self.starts[j] + self._sizes[j]]
        return self._symbol(max(covering, key=self._orders.__getitem__)) if covering else None


def _newest_lines(raw: bytes | bytearray) -> int:
    """Where the newest MAX_LINES lines of raw begin."""
    if raw.count(b"\n") <= MAX_LINES:
        return 0
    at = len(raw)
    for _ in range(MAX_LINES + 1):
        at = raw.rfind(b"\n", 0, at)
    return at + 1


def parse_perf_map(text: str) -> list[JitSymbol]:
    out = []
    for n, line in enumerate(text.splitlines()):
        m = _LINE.match(line.strip())
        if m:
            out.append(JitSymbol(start=int(m[1], 16), size=int(m[2], 16), name=_capped(m[3]), order=n))
    return out


def _capped(name: str) -> str:
    raw = name.encode(errors="replace")
    return name if len(raw) <= MAX_NAME else raw[:MAX_NAME].decode(errors="replace") + _CUT


def perf_map_path(pid: int, proc_root: Path = Path("/proc")) -> Path:
    """Where the process's perf map is, seen from here: its root's /tmp, named by its own pid."""
    status = read_text(proc_root / str(pid) / "status") or ""
    own = innermost_pid(status) or pid
    return proc_root / str(pid) / "root" / "tmp" / f"perf-{own}.map"


def perf_map_file(pid: int, proc_root: Path = Path("/proc")) -> tuple[str, str, int] | None:
    """(the process's root, its perf map's path inside it, the uid that must own it): the map is the
    runtime's own file, written by the process itself, so a file of another owner (a host /tmp is
    everyone's) or a link (the target's choice of any file, in its root or out of it) is refused.
    None: the process is gone or says no uid."""
    status = read_text(proc_root / str(pid) / "status") or ""
    owner = effective_uid(status)
    if owner is None:
        return None
    own = innermost_pid(status) or pid
    return str(safefile.proc_root(pid, proc_root)), f"/tmp/perf-{own}.map", owner


def _open(where: tuple[str, str, int]) -> int | None:
    root, path, owner = where
    try:
        rfd = safefile.open_root(root)
    except OSError:
        return None
    try:
        return safefile.open_in(rfd, path, follow_leaf=False, owner=owner)
    except OSError:  # missing, a link, a FIFO or device, another user's: no map
        return None
    finally:
        os.close(rfd)


def perf_map_size(pid: int, proc_root: Path = Path("/proc")) -> int | None:
    """The size of the process's perf map, as read_perf_map would open it; None: no such map."""
    where = perf_map_file(pid, proc_root)
    fd = _open(where) if where else None
    if fd is None:
        return None
    try:
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


def perf_map_exists(where: tuple[str, str, int] | None) -> bool:
    fd = _open(where) if where else None
    if fd is not None:
        os.close(fd)
    return fd is not None


def remove_perf_map(where: tuple[str, str, int] | None) -> None:
    """Remove the map memdiag had a runtime write (probes/jvm/perfmap.py), by name in its /tmp inside the
    process's root: never a file a link out of that root names."""
    if where is None:
        return
    root, path, _owner = where
    try:
        rfd = safefile.open_root(root)
    except OSError:
        return
    try:
        dfd = safefile.open_dir_in(rfd, os.path.dirname(path))
        try:
            os.unlink(os.path.basename(path), dir_fd=dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass
    finally:
        os.close(rfd)


def _read_tail(fd: int) -> tuple[int, bytearray]:
    """(the file's size, its last MAX_BYTES at most), read into one buffer: safefile.read_fd joins
    1 MiB chunks, which holds the bytes twice for a moment (64 MiB of memdiag's peak here)."""
    size = os.fstat(fd).st_size
    want = min(size, MAX_BYTES)
    os.lseek(fd, size - want, os.SEEK_SET)
    buf = bytearray(want)
    view, got = memoryview(buf), 0
    while got < want:
        n = os.readv(fd, [view[got:]])
        if n <= 0:
            break  # it shrank while being read
        got += n
    view.release()
    del buf[got:]
    return size, buf


def read_perf_map(pid: int, proc_root: Path = Path("/proc")) -> PerfMap | None:
    """The process's perf map, or None when it has none (the runtime was not asked to write one) or
    the file is not one the runtime wrote (perf_map_file). Its newest MAX_BYTES and MAX_LINES only;
    opened without blocking (a FIFO is refused at once)."""
    where = perf_map_file(pid, proc_root)
    fd = _open(where) if where else None
    if fd is None:
        return None
    try:
        size, raw = _read_tail(fd)
    except OSError:
        return None
    finally:
        os.close(fd)
    truncated = size > len(raw)
    begin = raw.find(b"\n") + 1 if truncated else 0  # the first line read is cut
    pm = PerfMap.from_bytes(str(perf_map_path(pid, proc_root)), raw, size, truncated, begin)
    pm.where = where
    return pm


def perf_map_grew(pm: PerfMap) -> bool:
    """The file has more in it than when it was read (the runtime named more code since)."""
    fd = _open(pm.where) if pm.where else None
    if fd is None:
        return False
    try:
        return os.fstat(fd).st_size > pm.size
    finally:
        os.close(fd)
