"""A JIT's perf map: /tmp/perf-PID.map, the names a runtime writes for the code it generates
(`START SIZE NAME` lines, hexadecimal), the convention Linux perf reads. Node writes it under
`--perf-basic-prof` (V8's names: `JS:*handleOrder /srv/app.js:17:21`, `Builtin:ArrayPrototypePush`);
a HotSpot JVM when told Compiler.perfmap (probes/jit.py; it writes 0x before the numbers and a
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
from dataclasses import dataclass
from pathlib import Path

from ._parse import read_text
from .process import innermost_pid

MAX_BYTES = 64 << 20  # a perf map larger than this is read from its end: the newest entries
_LINE = re.compile(r"^(?:0x)?([0-9a-fA-F]+) (?:0x)?([0-9a-fA-F]+) (.+)$")  # HotSpot writes 0x before both
# V8's code names: a kind, a tier mark (~ interpreted or baseline-compiled, ^ Sparkplug, + Maglev,
# * TurboFan), the function's name (empty for an anonymous one), its script and line:column
_V8_JS = re.compile(r"^(?:JS|LazyCompile|Function|Script):(?P<tier>[~^+*]?)(?P<fn>\S*)(?: (?P<src>.+?))?$")
_OVERLAP_SCAN = 32  # entries before an address checked for the newest one covering it


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
    """One perf map's entries, by address."""

    def __init__(self, path: str, symbols: list[JitSymbol], size: int, truncated: bool):
        self.path, self.size, self.truncated = path, size, truncated
        self.symbols = sorted(symbols, key=lambda s: (s.start, s.order))
        self.starts = [s.start for s in self.symbols]

    def lookup(self, address: int) -> JitSymbol | None:
        i = bisect.bisect_right(self.starts, address)
        covering = [s for s in self.symbols[max(0, i - _OVERLAP_SCAN) : i] if s.start <= address < s.start + s.size]
        return max(covering, key=lambda s: s.order) if covering else None


def parse_perf_map(text: str) -> list[JitSymbol]:
    out = []
    for n, line in enumerate(text.splitlines()):
        m = _LINE.match(line.strip())
        if m:
            out.append(JitSymbol(start=int(m[1], 16), size=int(m[2], 16), name=m[3], order=n))
    return out


def perf_map_path(pid: int, proc_root: Path = Path("/proc")) -> Path:
    """Where the process's perf map is, seen from here: its root's /tmp, named by its own pid."""
    status = read_text(proc_root / str(pid) / "status") or ""
    own = innermost_pid(status) or pid
    return proc_root / str(pid) / "root" / "tmp" / f"perf-{own}.map"


def read_perf_map(pid: int, proc_root: Path = Path("/proc")) -> PerfMap | None:
    """The process's perf map, or None when it has none (the runtime was not asked to write one)."""
    path = perf_map_path(pid, proc_root)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            truncated = size > MAX_BYTES
            if truncated:
                f.seek(size - MAX_BYTES)
            raw = f.read(MAX_BYTES)
    except OSError:
        return None
    text = raw.decode(errors="replace")
    if truncated:
        text = text.split("\n", 1)[-1]  # the first line read is cut
    return PerfMap(str(path), parse_perf_map(text), size, truncated)


def perf_map_grew(pm: PerfMap) -> bool:
    """The file has more in it than when it was read (the runtime named more code since)."""
    try:
        return os.stat(pm.path).st_size > pm.size
    except OSError:
        return False
