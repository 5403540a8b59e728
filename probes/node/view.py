"""How the nodeheap probe shows in a diagnosis: its facts (node.*: V8's heap against memory outside
it, whether a perf map names the JavaScript), its report section and its `memdiag probe` lines."""

from __future__ import annotations

from memdiag.system.trends import growth_trend
from memdiag.system.units import fmt_bytes

from ..face import FactDef, Namer, Section

MIN_POINTS = 3

FACTS = (
    FactDef("node.v8_heap", "bytes", "V8's heap, committed (process.memoryUsage().heapTotal), at the last read"),
    FactDef("node.v8_heap_growth", "bytes", "how much V8's committed heap grew over the reads"),
    FactDef("node.v8_heap_trend", "string", "the shape of V8's committed heap: climbing, levelled, flat ..."),
    FactDef("node.native", "bytes",
            "memory outside V8's heap, resident: malloc'd (array buffers' and Buffers' contents among it), thread "
            "stacks"),
    FactDef("node.native_growth", "bytes", "how much the memory outside V8's heap grew over the reads"),
    FactDef("node.native_trend", "string", "the shape of the memory outside V8's heap"),
    FactDef("node.outside_share", "percent", "the share of the growth (V8's heap and outside it) that is outside"),
    FactDef("node.perf_map", "bool", "the process writes a perf map (started with --perf-basic-prof)", figure=False),
    FactDef("node.perf_map_path", "string", "its perf map, as the process names it: /tmp/perf-PID.map"),
)  # fmt: skip


def _shape(times: list[float], series: list[int]) -> str:
    if len(series) < MIN_POINTS:
        return "unknown"
    return growth_trend(list(zip(times, series, strict=False))).shape


def facts_of(r, _plan, _name: Namer) -> dict:
    if r is None or r.status not in ("ok", "partial") or not r.times:
        return {}
    v8 = r.v8_mapped[-1] - r.v8_mapped[0]
    native = r.native_resident[-1] - r.native_resident[0]
    grown = max(v8, 0) + max(native, 0)
    return {
        "node.v8_heap": r.v8_mapped[-1],
        "node.v8_heap_growth": v8,
        "node.v8_heap_trend": _shape(r.times, r.v8_mapped),
        "node.native": r.native_resident[-1],
        "node.native_growth": native,
        "node.native_trend": _shape(r.times, r.native_resident),
        "node.outside_share": 100 * max(native, 0) / grown if grown > 0 else None,
        "node.perf_map": r.perf_map is not None,
        "node.perf_map_path": r.perf_map,
    }


def sections(r) -> list[Section]:
    if r.status not in ("ok", "partial") or not r.times:
        return []
    rows = [
        [label, fmt_bytes(series[0]), fmt_bytes(series[-1]), fmt_bytes(series[-1] - series[0])]
        for label, series in (
            ("V8's heap, committed", r.v8_mapped),
            ("V8's heap, resident", r.v8_resident),
            ("outside it: malloc'd, thread stacks (resident)", r.native_resident),
            ("V8's generated code (resident)", r.jit_resident),
        )
    ]
    lines = [
        r.reason,
        "V8's heap: the anonymous mappings V8 places at random addresses below 64 TiB; outside it: [heap] and the "
        "other anonymous memory, where malloc keeps array buffers' and Buffers' contents",
    ]
    return [
        Section(
            probe="nodeheap", title="Node.js memory", lines=lines, header=["", "first", "last", "change"], rows=rows
        )
    ]


def describe(r, _top: int) -> list[str]:
    return ["  " + " | ".join(row) for sec in sections(r) for row in sec.rows]
