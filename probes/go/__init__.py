"""Go: the runtime's own heap profile buckets and memory statistics read from a live program
(heap.py, its face; view.py: its facts, rows and sections), the function table and the runtime's
variables by version (pclntab.py, layout.py, memory.py), goroutine stacks (stacks.py) and the
trend of sampled figures (trend.py)."""

from __future__ import annotations

from memdiag.system.ledger import AnonPart
from memdiag.system.runtime import Runtime, read_go_build

from ..runtime import RuntimeFace, Samples, Seen


def _recognise(seen: Seen) -> Runtime | None:
    """The build info the Go linker writes into the executable: the toolchain and the main module."""
    build = read_go_build(seen.exe)
    if build is None:
        return None
    detail = f"module {build.main_module}" if build.main_module else None
    module = seen.exe_path or str(seen.exe)
    return Runtime(name="go", label="Go", version=build.version.removeprefix("go"), module=module, detail=detail)


def _resident(_samples: Samples, pid: int) -> list[AnonPart]:
    """Go's heap from its GC pacer (runtime.gcController, read once: memory.py): spans in use, and
    free spans it keeps and has not returned to the OS. Estimates of what is resident (a span's
    pages are resident once touched). Goroutine stacks are not read here (in the residual)."""
    from .memory import GoProcess, GoUnreadable

    try:
        go = GoProcess(pid)
    except (GoUnreadable, OSError):
        return []
    try:
        pacer = go.pacer()
    finally:
        go.close()
    if pacer is None:
        return []
    src = "Go's GC pacer (runtime.gcController)"
    return [
        AnonPart(key="runtime_heap", label="Go heap: spans in use", bytes=pacer.heap_in_use, estimate=True, source=src),
        AnonPart(
            key="runtime_heap_free",
            label="Go heap: free spans it keeps (not returned to the OS)",
            bytes=pacer.heap_free,
            estimate=True,
            source=src,
        ),
    ]


# No mapping tells a Go program (its runtime is linked into the executable): its build info does.
RUNTIME = RuntimeFace(name="go", display="Go", recognise=_recognise, resident=_resident)
