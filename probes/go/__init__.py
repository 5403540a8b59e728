"""Go: the runtime's own heap profile buckets and memory statistics read from a live program
(heap.py, its face; view.py: its facts, rows and sections), the function table and the runtime's
variables by version (pclntab.py, layout.py, memory.py), goroutine stacks (stacks.py) and the
trend of sampled figures (trend.py)."""

from __future__ import annotations

from memdiag.system.runtime import Runtime, read_go_build

from ..runtime import RuntimeFace, Seen


def _recognise(seen: Seen) -> Runtime | None:
    """The build info the Go linker writes into the executable: the toolchain and the main module."""
    build = read_go_build(seen.exe)
    if build is None:
        return None
    detail = f"module {build.main_module}" if build.main_module else None
    module = seen.exe_path or str(seen.exe)
    return Runtime(name="go", label="Go", version=build.version.removeprefix("go"), module=module, detail=detail)


# No mapping tells a Go program (its runtime is linked into the executable): its build info does.
RUNTIME = RuntimeFace(name="go", display="Go", recognise=_recognise)
