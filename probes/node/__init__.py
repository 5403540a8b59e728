"""Node: V8's heap against the memory outside it (heap.py, its face; view.py: its facts, rows and
sections)."""

from __future__ import annotations

from memdiag.system.runtime import Runtime, is_node_module, node_versions

from ..runtime import RuntimeFace, Seen


def _recognise(seen: Seen) -> Runtime | None:
    """node or libnode.so mapped: Node's and V8's versions from the strings compiled into it."""
    if seen.path is None:
        return None
    node, v8 = node_versions(seen.mapped) if seen.mapped is not None else (None, None)
    return Runtime(name="node", label="Node.js", version=node, module=seen.path, detail=f"V8 {v8}" if v8 else None)


RUNTIME = RuntimeFace(
    name="node", display="Node.js", maps=is_node_module, recognise=_recognise, perf_map="node --perf-basic-prof"
)
