"""A HotSpot JVM's perf map, written on request: JIT-compiled Java frames in native stacks named as
Node's are (system/perfmap.py reads the file). HotSpot (17+) writes `/tmp/perf-<pid>.map` when told
`Compiler.perfmap` through its attach socket: a snapshot of its code cache then (methods compiled
later are not in it). memdiag asks only when a stack of a JVM has frames in anonymous executable
memory and the symbolizer was told it may (stacks read while the JVM runs: never inside a ptrace
stop, where its attach listener could not answer), keeps the map for that process for a short while
(the probes of one diagnosis share it), and removes the file afterwards when it was not there
before. Where no map can be had, `NOTES` says why and the frames stay [unknown]."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from memdiag.system.jvm import read_jvm_library
from memdiag.system.perfmap import PerfMap, perf_map_exists, perf_map_file, read_perf_map, remove_perf_map
from memdiag.system.process import start_ticks

from .attach import AttachRefused, describe_target, jcmd

KEEP_S = 60.0  # one map serves every probe of a diagnosis (JIT code moves little in a minute)

_CACHE: dict[tuple[int, int | None], tuple[float, PerfMap | None]] = {}
_LOCK = threading.Lock()
NOTES: dict[int, str] = {}  # pid -> what the last request said (named, or why not)


def short_name(name: str) -> str:
    """HotSpot writes `<return type> <class>.<method>(<parameter types>)`: the return type goes,
    as Java stacks print methods."""
    head, paren, rest = name.partition("(")
    method = head.rsplit(" ", 1)[-1]
    if paren and " " in head and "." in method:  # not a stub's name with a count: `StubRoutines (1)`
        return method + paren + rest
    return name


def jit_perf_map(pid: int, proc_root: Path = Path("/proc"), ask: bool = False) -> PerfMap | None:
    """The process's perf map: a HotSpot JVM's written on request when `ask` (cached), else the
    file its runtime keeps (Node under --perf-basic-prof), or None."""
    if not ask or read_jvm_library(pid, proc_root) is None:
        return read_perf_map(pid, proc_root)
    key = (pid, start_ticks(pid, proc_root))
    with _LOCK:
        hit = _CACHE.get(key)
        if hit is not None and time.monotonic() - hit[0] < KEEP_S:
            return hit[1]
        found = _from_jvm(pid, proc_root)
        _CACHE[key] = (time.monotonic(), found)
        return found


def _from_jvm(pid: int, proc_root: Path) -> PerfMap | None:
    where = perf_map_file(pid, proc_root)
    existed = perf_map_exists(where)
    started = time.monotonic()
    try:
        reply = jcmd(describe_target(pid, proc_root), "Compiler.perfmap", timeout_s=10)
    except AttachRefused as e:
        NOTES[pid] = f"JIT-compiled Java frames stay [unknown]: {e}"
        return None
    if not reply.ok or "Unknown diagnostic command" in reply.output:
        NOTES[pid] = "JIT-compiled Java frames stay [unknown]: this JVM has no Compiler.perfmap (JDK 17 and later do)"
        return None
    took = time.monotonic() - started
    found = read_perf_map(pid, proc_root)
    if not existed:
        remove_perf_map(where)
    if found is None:
        NOTES[pid] = "JIT-compiled Java frames stay [unknown]: the JVM wrote no perf map"
        return None
    found.rename = short_name  # each name as it is looked up (not every name of the map made now)
    NOTES[pid] = f"JIT-compiled Java frames named from the JVM's perf map (Compiler.perfmap, {took * 1000:.0f} ms)"
    return found
