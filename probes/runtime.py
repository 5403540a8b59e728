"""The face of a language runtime: everything one runtime (a JVM, CPython, Go, Node) adds to a
diagnosis, declared in one place, as a probe's face does (probes/face.py). The diagnosis asks the
target's runtime face and names no runtime; the rule catalog reads runtime facts through the
registry (probes/registry.py, RUNTIMES), as it reads probe facts.

A runtime is not a probe: it is what the target runs, told from its mappings or its executable
before the window starts. Its face says how it is recognised, which of its own counters are read
with every sample of the window (a JVM's hsperfdata), the facts, rows, series and sections those
yield, and what the report's target line calls it. Its probes (a JVM's flight recorder, Go's heap
profile) are probes like any other, with a face each, registered in PROBES; rules ask for them
where `target.runtime` names the runtime.

Adding a runtime
----------------
1. A package probes/NAME/ whose __init__.py defines `RUNTIME = RuntimeFace(name="NAME", ...)`.
   Keep __init__.py light (each of its probes' modules imports it): import heavy modules inside the
   functions the face names.
2. One entry in probes/registry.py: `RuntimeSpec("NAME")` in RUNTIMES. The list's order is the
   order of recognition: a process's executable mappings are read in address order and the first
   one a runtime's `maps` claims decides; where none does, each runtime's `recognise` is asked of
   the executable, in the list's order.
3. Rules that read its facts, and ask for its probes.
4. tests/unit/test_runtime_conformance.py shows it done for a toy runtime: one package and one
   list entry, and its facts reach the rules and its rows, series and sections every report format.
Nothing in diagnose/ or rules/ changes.

The face, field by field (only `name` and `display` are required)
-----------------------------------------------------------------
name       what `target.runtime` says and rules compare: "jvm".
display    how a person names it: "JVM" (the report's target line, its counters table).
maps       maps(file name) -> bool: an executable mapping of this file is the runtime's code
           (libjvm.so), by the name alone: no file opened. None: no mapping tells it (Go).
recognise  recognise(Seen) -> Runtime | None: the runtime and its version, from the mapping `maps`
           claimed (seen.path, its bytes through seen.mapped) or, when no mapping was claimed, from
           the executable (seen.exe). Read only through system/'s bounded readers: these are the
           target's files. None: not this runtime (a mapping `maps` claimed is its runtime still,
           its version unknown: return Runtime with version None).
mark       mark(pid) -> anything: the runtime's counters at the window's start, taken once by the
           engine and handed to its probes (Context.runtime_mark), so that a probe started later
           measures its cost above the target's rates before it (a JVM: its application threads'
           run-queue delay). None: no probe of it needs one.
sample     sample(pid, proc_root) -> a model | None: its own counters, read with every sample of
           the window (a JVM's hsperfdata and its RSS split). None (the field): it has none.
facts      its catalog entries, FactDef(name, kind, help): facts under a namespace of its own
           (jvm.*), or about the target that only it can say (target.python_frames).
facts_of   facts_of(Samples, pid) -> {fact: value}: only facts it declared; unknown is None, and a
           fact it cannot say is left out. Samples: (monotonic seconds, sample) of every sample of
           the window where sample() read something.
rows       rows(Samples) -> [RuntimeRow]: its counters table (titled "<display> counters").
series     series(Samples, t0) -> {name: [(seconds from t0, value)]}: series of its own beside the
           target's memory, for the Trends table and the window chart.
labels     {row or series name: how the report names it}: "heap_max": "Java heap maximum (-Xmx)";
           a row or series without one is shown by its name.
resident   resident(Samples, pid) -> [AnonPart]: what of the process's anonymous memory (RssAnon)
           its own figures account for (system/ledger.py AnonPart: key runtime_*, label, bytes,
           estimate), asked once as the window closes, with a sample() read then (Samples of one,
           or none without sample): a JVM's Java heap, metaspace, JIT code, thread stacks from its
           sample; Go's heap spans from its GC pacer, V8's heap from smaps, read then by the pid.
           Only anonymous memory (its files' pages are not), none counted twice; empty: it could
           not say (the report names it). None (the field): it has no figures for this split.
sections   sections(Samples) -> [Section]: report sections of its own ("Java heap").
frames     Frames: how its probes print a frame of the program's own language among native ones
           (`handle_order (/srv/orders.py:42) [python]`), so that a culprit is named in that language
           and the interpreter's own frames under it are passed over. None: its probes print none.
perf_map   how the code it compiles at run time gets named (a perf map: "node --perf-basic-prof"),
           for the caveat on stack frames in anonymous executable memory; empty: it compiles none.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from memdiag.system.ledger import AnonPart
from memdiag.system.runtime import Runtime

from .face import FactDef, Section, _Frozen

Samples = list[tuple[float, Any]]  # (monotonic seconds, what the runtime's sample() read then)


@dataclass(frozen=True)
class Seen:
    """What recognition has of a process: the executable mapping a runtime's `maps` claimed (its
    path as maps shows it, its very inode through map_files), or none; the process's root, its
    effective ids (a file it could not read is not read for it), and its executable."""

    pid: int
    path: str | None  # the claimed mapping's path; None when no mapping was claimed
    mapped: Path | None  # /proc/PID/map_files/SPAN of that mapping
    root: Path  # /proc/PID/root
    ids: tuple[int, int] | None  # its effective uid and gid
    exe: Path  # /proc/PID/exe
    exe_path: str | None  # the path of its first executable mapping (the program, for Go)


class RuntimeRow(_Frozen):
    """One line of a runtime's counters table, in the unit named; None = unknown."""

    name: str
    unit: Literal["bytes", "count", "percent", "per_s", "bytes_per_s", "pages_per_s"]
    first: float | None = None
    last: float | None = None


@dataclass(frozen=True)
class Frames:
    """A runtime's frames of the program's own language, as its probes print them beside native
    frames (diagnose/culprit.py reads them: the culprit named in that language, the interpreter's
    own frames under it passed over, its caller named above a native culprit)."""

    language: str  # how the program's language is called: "called from Python handle_order (...)"
    pattern: re.Pattern[str]  # one frame, with groups fn, file, line (optional) and mod
    modules: tuple[str, ...]  # the module names its frames carry, as the wrappers list sees them
    interpreter: re.Pattern[str]  # the interpreter's own binary or library, matched at the name's start
    # the caveat on [unknown] frames of stacks whose frames of this language were read:
    # {module: how many} -> the sentence's reason (the count and modules are said before it)
    unnamed: Callable[[dict[str, int]], str]


def _none(*_args) -> Any:
    return None


def _nothing(*_args) -> list:
    return []


def _no_facts(*_args) -> dict:
    return {}


@dataclass(frozen=True)
class RuntimeFace:
    name: str
    display: str
    maps: Callable[[str], bool] | None = None
    recognise: Callable[[Seen], Runtime | None] = _none
    sample: Callable[[int, Path], Any] | None = None
    facts: tuple[FactDef, ...] = ()
    facts_of: Callable[[Samples, int | None], dict] = _no_facts
    rows: Callable[[Samples], list[RuntimeRow]] = _nothing
    series: Callable[[Samples, float], dict[str, list[tuple[float, float]]]] = _no_facts
    labels: Mapping[str, str] = field(default_factory=dict)
    sections: Callable[[Samples], list[Section]] = _nothing
    resident: Callable[[Samples, int], list[AnonPart]] | None = None
    frames: Frames | None = None
    perf_map: str = ""
    mark: Callable[[int], Any] | None = None

    def claims(self, path: str) -> bool:
        """Whether an executable mapping of this path is the runtime's code (by its file name)."""
        return self.maps is not None and self.maps(path.rsplit("/", 1)[-1])
