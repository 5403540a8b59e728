"""A HotSpot JVM's own instruments, driven by memdiag: its attach socket (attach.py), a flight
recording of its memory events (jfr.py), read with a jfr tool of the host's that memdiag trusts
(tool.py), and what the recording says (recording.py)."""

from __future__ import annotations

from memdiag.system.jvm import read_jvm_sample
from memdiag.system.ledger import AnonPart
from memdiag.system.runtime import Runtime, is_jvm_module, jvm_version

from ..face import FactDef
from ..runtime import RuntimeFace, Samples, Seen
from .counters import jvm_facts, jvm_rows, jvm_sections, jvm_series


def _mark(pid: int) -> object:
    """The application threads' run-queue delay at the window's start."""
    from .meter import app_mark  # light, but keeps the face's imports to what every target needs

    return app_mark(pid)


def _recognise(seen: Seen) -> Runtime | None:
    """libjvm.so mapped: the version from the JDK's release file, read inside the target's root."""
    if seen.path is None:
        return None
    version, detail = jvm_version(seen.path, seen.root, seen.ids)
    return Runtime(name="jvm", label="JVM", version=version, module=seen.path, detail=detail)


# Its own counters (hsperfdata, read without attaching) and its RSS split (smaps), with every sample
_FACTS = [
    ("jvm.counters", "bool", "the JVM's counters could be read (false: jvm.counters_missing says why)"),
    ("jvm.counters_missing", "string", "why a JVM has no counters memdiag can read (-XX:-UsePerfData, ...)"),
    ("jvm.heap_max", "bytes", "the Java heap's maximum size (-Xmx)"),
    ("jvm.heap_committed", "bytes", "the Java heap the JVM has committed, at the end"),
    ("jvm.heap_used", "bytes", "the Java heap in use, at the end"),
    (
        "jvm.live_set",
        "bytes",
        "the Java heap in use just after the last collection (the live set, garbage G1 has not marked included)",
    ),
    ("jvm.live_set_first", "bytes", "the same after the window's first collection"),
    ("jvm.live_set_growth", "bytes", "change of the live set over the window"),
    ("jvm.live_set_rate", "bytes_per_s", "growth rate of the live set"),
    (
        "jvm.live_set_shape",
        "string",
        "the live set after collections: climbing, levelled, sawtooth, flat, shrinking or unknown",
    ),
    ("jvm.live_set_percent", "percent", "the live set as a share of the heap's maximum"),
    ("jvm.gc_count", "number", "collections during the window"),
    ("jvm.full_gc_count", "number", "full collections (the whole heap) during the window"),
    ("jvm.gc_share", "percent", "share of the window spent in collection pauses"),
    ("jvm.gc_share_recent", "percent", "the same over the latest third of the window"),
    ("jvm.last_cause", "string", "why the last collection ran (G1 Evacuation Pause, Allocation Failure, ...)"),
    ("jvm.metaspace", "bytes", "committed metaspace (class metadata), at the end"),
    ("jvm.metaspace_growth", "bytes", "change of committed metaspace over the window"),
    ("jvm.heap_rss", "bytes", "resident memory inside the Java heap's address range, at the end"),
    ("jvm.heap_rss_growth", "bytes", "change of that resident memory over the window"),
    (
        "jvm.outside_rss",
        "bytes",
        "resident memory outside the Java heap (native: metaspace, JIT code, stacks, mallocs)",
    ),
    ("jvm.outside_rss_growth", "bytes", "change of the resident memory outside the Java heap"),
    ("jvm.heap_growth_share", "percent", "share of the RSS growth that is inside the Java heap (when the RSS grew)"),
]


def jvm_resident(samples: Samples, _pid: int) -> list[AnonPart]:
    """The anonymous parts of the latest sample's RSS split (system/jvm.py split_memory): its file
    pages and the rest it cannot name are left to the residual. Metaspace is what the JVM has
    committed, an estimate of what is resident."""
    last = next((s for _t, s in reversed(samples) if s is not None and s.memory is not None), None)
    if last is None:
        return []
    m, src = last.memory, "the JVM's counters and its mappings"
    parts = [
        ("runtime_heap", "Java heap, resident", m.heap, False),
        ("runtime_metaspace", "metaspace, committed (estimate)", m.metaspace, True),
        ("runtime_code", "JIT-compiled code (code cache), resident", m.code, False),
        ("runtime_stacks", f"thread stacks ({m.stack_count} found), resident", m.stacks, False),
    ]
    return [AnonPart(key=k, label=lab, bytes=b, estimate=e, source=src) for k, lab, b, e in parts if b is not None]


RUNTIME = RuntimeFace(
    name="jvm",
    display="JVM",
    maps=is_jvm_module,
    recognise=_recognise,
    sample=read_jvm_sample,
    resident=jvm_resident,
    facts=tuple(FactDef(name, kind, help) for name, kind, help in _FACTS),  # type: ignore[arg-type]
    facts_of=jvm_facts,
    rows=jvm_rows,
    series=jvm_series,
    labels={
        "jvm.live_set": "JVM live set (after collections)",
        "heap_max": "Java heap maximum (-Xmx)",
        "heap_committed": "Java heap committed",
        "heap_used": "Java heap in use",
        "metaspace_committed": "metaspace committed",
        "gc_count": "collections",
        "full_gc_count": "full collections",
        "live_set_percent": "live set (after the last collection) of the maximum",
        "gc_share": "collection pauses, share of the window",
        "gc_share_recent": "collection pauses, share of its latest third",
        "heap_growth_share": "share of the RSS growth in the heap",
        "heap_rss": "resident in the heap's range",
        "outside_rss": "resident outside the heap",
    },
    sections=jvm_sections,
    mark=_mark,
    perf_map="a JVM's memdiag asks for itself",  # probes/jvm/perfmap.py
)
