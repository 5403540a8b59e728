"""Node: V8's heap against the memory outside it (heap.py, its face; view.py: its facts, rows and
sections), and V8's heap over the whole window (window.py: read with every sample)."""

from __future__ import annotations

from memdiag.system.ledger import AnonPart
from memdiag.system.runtime import Runtime, is_node_module, node_versions

from ..runtime import RuntimeFace, Samples, Seen
from .window import FACTS as WINDOW_FACTS


def _recognise(seen: Seen) -> Runtime | None:
    """node or libnode.so mapped: Node's and V8's versions from the strings compiled into it."""
    if seen.path is None:
        return None
    node, v8 = node_versions(seen.mapped) if seen.mapped is not None else (None, None)
    return Runtime(name="node", label="Node.js", version=node, module=seen.path, detail=f"V8 {v8}" if v8 else None)


def _resident(_samples: Samples, pid: int) -> list[AnonPart]:
    """V8's heap and generated code, resident, from smaps as V8 lays them out (system/v8memory.py):
    its anonymous mappings below 64 TiB, and its code range. Array buffers' contents are malloc'd
    (the allocator's parts, or the residual)."""
    from memdiag.system.v8memory import read_v8_memory

    m = read_v8_memory(pid)
    if m is None:
        return []
    src = "V8's mappings (smaps)"
    return [
        AnonPart(key="runtime_heap", label="V8 heap, resident", bytes=m.v8_resident, source=src),
        AnonPart(key="runtime_code", label="V8 generated code, resident", bytes=m.jit_resident, source=src),
    ]


def _sample(pid: int, proc_root):
    from .window import read_sample

    return read_sample(pid, proc_root)


def _facts_of(samples, pid):
    from .window import facts_of

    return facts_of(samples, pid)


def _series(samples, t0):
    from .window import series

    return series(samples, t0)


RUNTIME = RuntimeFace(
    name="node",
    display="Node.js",
    maps=is_node_module,
    recognise=_recognise,
    sample=_sample,
    facts=WINDOW_FACTS,
    facts_of=_facts_of,
    series=_series,
    labels={"v8_heap": "V8's heap, committed (maps)", "v8_heap_floor": "V8's heap left after collections (its floor)"},
    perf_map="node --perf-basic-prof",
    resident=_resident,
)
