"""Which language runtime a process runs, from its executable mappings (/proc/PID/maps): the
interpreter's own code mapped executable. For an interpreter, native stacks name interpreter
functions (PyByteArray_Resize, _PyEval_EvalFrameDefault), never the program's own code, and the
language-level stack needs the language's own tools. CPython first: an executable mapping of
`libpython3.X.so` or of a `python3.X` binary (Debian's python3 links the interpreter in)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from ._parse import Fact, read_text

_CPYTHON = re.compile(r"^(?:lib)?python(?P<version>3\.\d+)[a-z]*(?:\.so[.\d]*|-[\w.-]+)?$")


class Runtime(Fact):
    name: Literal["cpython"]
    version: str
    module: str  # the mapped file holding the interpreter's code

    def describe(self) -> str:
        return f"CPython {self.version} ({self.module})"


def read_runtime(pid: int, proc_root: Path = Path("/proc")) -> Runtime | None:
    """The interpreter whose code the process maps executable, or None (native code, or gone)."""
    text = read_text(proc_root / str(pid) / "maps")
    if text is None:
        return None
    for line in text.splitlines():
        fields = line.split(None, 5)
        if len(fields) < 6 or "x" not in fields[1]:
            continue
        path = fields[5].strip()
        m = _CPYTHON.match(path.rsplit("/", 1)[-1])
        if m:
            return Runtime(name="cpython", version=m["version"], module=path)
    return None
