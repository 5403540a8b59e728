"""CPython targets read in Python's terms: the interpreter's layout by version (layout.py), where it
sits in a process (target.py), its memory read from outside and priced (memory.py), code objects to
function and file:line (code.py), the frames the BPF walk recorded at an event to a mixed
Python/native stack (frames.py), and a held block named by the Python object and the global that
hold it (holder.py). Nothing is ever written into the target."""

from __future__ import annotations

import re

from memdiag.system.runtime import Runtime, cpython_module_minor, cpython_version

from ..face import FactDef
from ..runtime import Frames, RuntimeFace, Samples, Seen

MODULE, STDLIB_MODULE = "python", "python stdlib"  # a Python frame's module, as the wrappers list sees it
# A Python frame as frames.py prints it: `qualname (file:line) [python]` (read before a native
# frame's pattern: it has a Go frame's shape too)
_FRAME = re.compile(r"^(?P<fn>.+) \((?P<file>.+?)(?::(?P<line>\d+))?\) \[(?P<mod>python(?: stdlib)?)\]$")
# the interpreter's own binary or library (python3.11, libpython3.11.so.1.0): its unnamed frames are
# what the Python frames above them stand for; any other library's are the program's to name
_INTERPRETER = re.compile(r"(lib)?python\d")


def _recognise(seen: Seen) -> Runtime | None:
    """libpython3.X.so or python3.X mapped: its exact version from the file's Py_Version (3.11+),
    else the 3.X its name says."""
    minor = cpython_module_minor((seen.path or "").rsplit("/", 1)[-1])
    if minor is None or seen.path is None:
        return None
    exact = cpython_version(seen.mapped) if seen.mapped is not None else None
    return Runtime(name="cpython", label="CPython", version=exact or minor, module=seen.path)


def _unnamed(interpreted: dict[str, int]) -> str:
    """Why frames of a stack whose Python frames were read are [unknown]. Debian's python3.11 has no
    .symtab (nm: "no symbols"; 2,207 dynamic ones): its static functions (the arena allocator,
    list_resize) are unnamed, and the Python frames above them say what the program ran: no rebuild
    of the interpreter is needed to name it."""
    unread = sum(n for mod, n in interpreted.items() if mod in (MODULE, STDLIB_MODULE))
    said = []
    if unread < sum(interpreted.values()):
        said.append(
            "the interpreter's own functions without a symbol, which the Python frames above them stand "
            "for (the interpreter's debug-symbols package names them)"
        )
    if unread:
        said.append("Python frames whose code object could not be read (gone by the time it was read)")
    return "; ".join(said)


def _facts_of(_samples: Samples, pid: int | None) -> dict:
    from .target import frames_readable  # reads the interpreter's memory: only for a CPython target

    return {"target.python_frames": frames_readable(pid) if pid is not None else None}


RUNTIME = RuntimeFace(
    name="cpython",
    display="CPython",
    maps=lambda base: cpython_module_minor(base) is not None,
    recognise=_recognise,
    facts=(
        FactDef(
            "target.python_frames",
            "string",
            "read: the probes name a CPython target's Python frames; else why not (unsupported version 3.10.13)",
        ),
    ),
    facts_of=_facts_of,
    frames=Frames(
        language="Python",
        pattern=_FRAME,
        modules=(MODULE, STDLIB_MODULE),
        interpreter=_INTERPRETER,
        unnamed=_unnamed,
    ),
)
