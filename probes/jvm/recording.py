"""A flight recording's memory events (`jfr print --json`), read into typed samples, and what they
say: which class the JVM keeps, allocated where, held by what.

Old-object samples are objects the JVM sampled at allocation and that were still alive when the
recording stopped; each has its allocation stack and, where the JVM found it within its cutoff,
its chain of references from a GC root (object <- the field or array slot that holds it <- ...
<- the root: a class's static field, a thread's local variable, a JNI handle). Samples without a
chain were not reached from a root: garbage the collector had not freed yet (or the search ran
out of time). Grouped by class, allocation site and anchor, the rooted ones say what is held; how
far back their allocations go says whether it is retained (sampled objects from the recording's
start are still held: nothing lets go) or turned over (every sampled object older than some age
is gone: a bounded set, as a cache keeps)."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from datetime import datetime, timezone

from memdiag.system._parse import Model
from pydantic import ConfigDict

# Frames of the JDK's own code: an allocation site is named by the first frame past them (the
# caller of ArrayList.grow, HashMap.resize, Arrays.copyOf), as a native culprit is past malloc.
JDK_PACKAGES = ("java.", "javax.", "jdk.", "sun.", "com.sun.")
_PRIMITIVES = {"B": "byte", "C": "char", "D": "double", "F": "float", "I": "int", "J": "long", "S": "short"}
_PRIMITIVES.update({"Z": "boolean", "V": "void"})
_DURATION = re.compile(r"^PT(?:(?P<h>[\d.]+)H)?(?:(?P<m>[\d.]+)M)?(?:(?P<s>[\d.]+)S)?$")
_STATIC = 0x0008  # ACC_STATIC


class _Frozen(Model):
    model_config = ConfigDict(frozen=True)


class JavaFrame(_Frozen):
    method: str  # OrderService.processBatch(int)
    line: int | None = None
    kind: str = ""  # Interpreted, JIT compiled, Inlined, Native

    def __str__(self) -> str:
        return f"{self.method} line: {self.line}" if self.line is not None and self.line >= 0 else self.method

    @property
    def jdk(self) -> bool:
        return self.method.startswith(JDK_PACKAGES)


class OldSample(_Frozen):
    allocated_at: float  # seconds since the epoch
    cls: str  # byte[], java.util.HashMap$Node
    array_length: int | None = None
    frames: list[JavaFrame] = []
    chain: list[str] = []  # from the object up: "java.lang.Object[] [421]", "java.util.ArrayList.elementData", ...
    anchor: str | None = None  # the root that holds it: OrderService.retryQueue, a thread's local variable
    root: str | None = None  # the root in words: "a stack variable of thread main", "JNI Global / ..."
    holder_detail: str | None = None  # what the JVM said of the object nearest the root: "Size: 3037"


class AllocSample(_Frozen):
    at: float
    cls: str
    weight: int  # bytes allocated in the thread since the previous sample: what this sample stands for
    frames: list[JavaFrame] = []


class HeapPoint(_Frozen):
    at: float
    gc_id: int
    after: bool  # after the collection (False: before)
    used: int


class Collection(_Frozen):
    at: float
    gc_id: int
    name: str
    cause: str
    pause_s: float


class Recorded(_Frozen):
    """What one recording holds of memdiag's events."""

    old: list[OldSample] = []
    allocations: list[AllocSample] = []
    heap: list[HeapPoint] = []
    collections: list[Collection] = []
    direct_buffers: int | None = None  # bytes of direct buffers in use, at the last statistics event
    heap_range: tuple[int, int] | None = None  # the heap's reserved address range (GCHeapSummary)


def class_name(internal: str | None) -> str:
    """The JVM's internal name as Java writes it: [B -> byte[], java/util/HashMap$Node -> java.util.HashMap$Node."""
    if not internal:
        return "?"
    dims = len(internal) - len(internal.lstrip("["))
    base = internal[dims:]
    if dims and base in _PRIMITIVES:
        name = _PRIMITIVES[base]
    elif dims and base.startswith("L") and base.endswith(";"):
        name = base[1:-1]
    else:
        name = base
    return name.replace("/", ".") + "[]" * dims


def _params(descriptor: str) -> list[str]:
    """A method descriptor's parameter types by their simple names: (I[BLjava/lang/String;) -> int, byte[], String."""
    inside = descriptor[1 : descriptor.find(")")] if descriptor.startswith("(") else ""
    out, i = [], 0
    try:
        while i < len(inside):
            dims = 0
            while inside[i] == "[":
                dims, i = dims + 1, i + 1
            if inside[i] == "L":
                end = inside.index(";", i)
                name, i = inside[i + 1 : end].rsplit("/", 1)[-1], end + 1
            else:
                name, i = _PRIMITIVES.get(inside[i], inside[i]), i + 1
            out.append(name + "[]" * dims)
    except (IndexError, ValueError):  # a malformed descriptor: no parameter list rather than a wrong one
        return []
    return out


def _frame(raw: dict) -> JavaFrame:
    method = raw.get("method") or {}
    owner = class_name((method.get("type") or {}).get("name"))
    name = method.get("name") or "?"
    line = raw.get("lineNumber")
    return JavaFrame(
        method=f"{owner}.{name}({', '.join(_params(method.get('descriptor') or ''))})",
        line=line if isinstance(line, int) else None,
        kind=raw.get("type") or "",
    )


def _frames(values: dict) -> list[JavaFrame]:
    stack = values.get("stackTrace") or {}
    return [_frame(f) for f in stack.get("frames") or []]


def parse_time(text: str | None) -> float:
    """An event's startTime (ISO 8601, nanoseconds, Z) as seconds since the epoch."""
    if not text:
        return 0.0
    text = text.rstrip("Z")
    whole, _, frac = text.partition(".")
    base = datetime.fromisoformat(whole).replace(tzinfo=timezone.utc).timestamp()
    return base + (float("0." + frac) if frac.isdigit() else 0.0)


def parse_duration(text: str | None) -> float:
    """An ISO 8601 duration (PT0.042904314S) in seconds; 0 when absent or unreadable."""
    m = _DURATION.match(text or "")
    if not m:
        return 0.0
    return sum(float(m[k] or 0) * f for k, f in (("h", 3600), ("m", 60), ("s", 1)))


def _chain(obj: dict | None) -> tuple[list[str], str | None, str | None]:
    """(links from the object up, the anchor, what the JVM said of the object nearest the root)."""
    links: list[str] = []
    anchor = detail = None
    while obj:
        ref = obj.get("referrer")
        holder = (ref or {}).get("object")
        if not ref or not holder:
            break
        holder_type = class_name((holder.get("type") or {}).get("name"))
        skipped = ref.get("skip") or 0
        if skipped:
            links.append(f"... {skipped} more")
        field = ref.get("field")
        array = ref.get("array")
        if field:
            static = bool((field.get("modifiers") or 0) & _STATIC)
            owner = _class_of_mirror(holder) if holder_type == "java.lang.Class" and static else holder_type
            links.append(f"{owner}.{field.get('name')}")
            if static and holder_type == "java.lang.Class":
                anchor = f"{owner}.{field.get('name')}"
        elif array:
            links.append(f"{holder_type} [{array.get('index')}]")
        if holder_type != "java.lang.Class":  # a class mirror says only its name; its field names it already
            detail = holder.get("description") or detail
        obj = holder
    return links, anchor, detail


def _class_of_mirror(mirror: dict) -> str:
    """The class a java.lang.Class object stands for (its description: "Class Name: OrderService")."""
    desc = mirror.get("description") or ""
    return desc.split("Class Name:", 1)[1].strip() if "Class Name:" in desc else "java.lang.Class"


def _root_words(root: dict) -> str:
    """A GC root as a reader says it: "a stack variable of thread main", "a JNI global (...)"."""
    system, kind, desc = root.get("system") or "", root.get("type") or "", root.get("description") or ""
    if system == "Threads":
        thread = desc.split("Thread Name:", 1)[1].strip() if "Thread Name:" in desc else desc
        return f"a {kind.lower() or 'root'} of thread {thread}".strip()
    words = " / ".join(x for x in (system, kind) if x) or "a GC root"
    return f"{words} ({desc})" if desc else words


def _old(values: dict) -> OldSample:
    obj = values.get("object") or {}
    links, anchor, detail = _chain(obj)
    root = values.get("root")
    root_text = _root_words(root) if root else None
    if root and anchor is None and links:
        anchor = f"{links[-1]}, from {root_text}"
    return OldSample(
        allocated_at=parse_time(values.get("allocationTime")),
        cls=class_name((obj.get("type") or {}).get("name")),
        array_length=values.get("arrayElements"),
        frames=_frames(values),
        chain=links,
        anchor=anchor if root else None,
        root=root_text,
        holder_detail=detail if root else None,
    )


def parse_recording(text: str) -> Recorded:
    """The events of `jfr print --json` output."""
    events = (json.loads(text).get("recording") or {}).get("events") or []
    old, allocs, heap, gcs = [], [], [], []
    direct = heap_range = None
    for e in events:
        kind, v = e.get("type"), e.get("values") or {}
        if kind == "jdk.OldObjectSample":
            old.append(_old(v))
        elif kind == "jdk.ObjectAllocationSample":
            cls = class_name((v.get("objectClass") or {}).get("name"))
            allocs.append(
                AllocSample(
                    at=parse_time(v.get("startTime")), cls=cls, weight=int(v.get("weight") or 0), frames=_frames(v)
                )
            )
        elif kind == "jdk.GCHeapSummary":
            space = v.get("heapSpace") or {}
            if space.get("start") is not None and space.get("reservedEnd") is not None:
                heap_range = (int(space["start"]), int(space["reservedEnd"]))
            heap.append(
                HeapPoint(
                    at=parse_time(v.get("startTime")),
                    gc_id=int(v.get("gcId") or 0),
                    after=v.get("when") == "After GC",
                    used=int(v.get("heapUsed") or 0),
                )
            )
        elif kind == "jdk.GarbageCollection":
            gcs.append(
                Collection(
                    at=parse_time(v.get("startTime")),
                    gc_id=int(v.get("gcId") or 0),
                    name=v.get("name") or "",
                    cause=v.get("cause") or "",
                    pause_s=parse_duration(v.get("sumOfPauses")),
                )
            )
        elif kind == "jdk.DirectBufferStatistics":
            direct = int(v.get("memoryUsed") or 0)
    return Recorded(
        old=old, allocations=allocs, heap=heap, collections=gcs, direct_buffers=direct, heap_range=heap_range
    )


# --- what it says ------------------------------------------------------------------------------


def site(frames: list[JavaFrame]) -> JavaFrame | None:
    """The allocation site: the first frame past the JDK's own code (or the first frame)."""
    return next((f for f in frames if not f.jdk), frames[0] if frames else None)


class Held(_Frozen):
    """Old-object samples of one class, allocated at one site and held by one anchor."""

    cls: str
    site: str | None  # OrderService.processBatch(int) line: 10
    anchor: str
    frames: list[JavaFrame]  # the allocation stack of its most recent sample
    chain: list[str]  # the reference chain of that sample, from the object up to the root
    holder_detail: str | None = None
    samples: int
    share: float  # of the rooted samples, percent
    # samples of the same class and site that outlived a collection and were then let go (no path
    # to a root at the stop: garbage not yet freed): what the holder turned over
    let_go: int = 0
    oldest_age_s: float  # the oldest sample still held, as old as it was when the recording stopped
    span_percent: float  # how far back into the recording the held samples go (100: to its start)
    # the holder's size ("Size: N", what the JVM says of a collection) at the first look and at the stop
    size_first: int | None = None
    size_last: int | None = None

    @property
    def kept_percent(self) -> float:
        """Of this class and site's samples that outlived a collection, the share still held."""
        return 100 * self.samples / (self.samples + self.let_go)


def held(rec: Recorded, started: float, stopped: float) -> list[Held]:
    """The rooted old-object samples grouped by (class, site, anchor), most samples first."""
    groups: dict[tuple, list[OldSample]] = defaultdict(list)
    for s in rec.old:
        if s.anchor is None:
            continue
        top = site(s.frames)
        groups[(s.cls, str(top) if top else None, s.anchor)].append(s)
    rooted = sum(len(v) for v in groups.values())
    dropped: dict[tuple, int] = defaultdict(int)
    for s in rec.old:
        if s.anchor is None:
            top = site(s.frames)
            dropped[(s.cls, str(top) if top else None)] += 1
    length = max(stopped - started, 1e-9)
    out = []
    for (cls, where, anchor), samples in groups.items():
        first = min(s.allocated_at for s in samples)
        newest = max(samples, key=lambda s: s.allocated_at)
        out.append(
            Held(
                cls=cls,
                site=where,
                anchor=anchor,
                frames=newest.frames,
                chain=newest.chain,
                holder_detail=newest.holder_detail,
                samples=len(samples),
                share=100 * len(samples) / rooted,
                let_go=dropped.get((cls, where), 0),
                oldest_age_s=max(0.0, stopped - first),
                span_percent=max(0.0, min(100.0, 100 * (stopped - max(first, started)) / length)),
            )
        )
    return sorted(out, key=lambda h: (-h.samples, h.cls))


def holder_size(detail: str | None) -> int | None:
    """The entries of a collection as the JVM describes its holder: "Size: 3037" -> 3037."""
    if not detail or not detail.startswith("Size:"):
        return None
    digits = detail.split(":", 1)[1].strip().replace(",", "")
    return int(digits) if digits.isdigit() else None


def with_sizes(last: list[Held], first: list[Held]) -> list[Held]:
    """The stop's groups with their holder's size at both looks (the first look's group of the same
    anchor; None where the JVM said no size at either)."""
    earlier = {}
    for h in first:
        earlier.setdefault(h.anchor, holder_size(h.holder_detail))
    return [h.model_copy(update={"size_first": earlier.get(h.anchor), "size_last": holder_size(h.holder_detail)})
            for h in last]  # fmt: skip


class Allocating(_Frozen):
    """Allocation samples of one class at one site: what they stand for, in bytes per second."""

    cls: str
    site: str | None
    frames: list[JavaFrame]
    bytes: int
    samples: int


def allocating(rec: Recorded) -> list[Allocating]:
    groups: dict[tuple, list[AllocSample]] = defaultdict(list)
    for s in rec.allocations:
        top = site(s.frames)
        groups[(s.cls, str(top) if top else None)].append(s)
    out = [
        Allocating(cls=c, site=w, frames=v[-1].frames, bytes=sum(s.weight for s in v), samples=len(v))
        for (c, w), v in groups.items()
    ]
    return sorted(out, key=lambda a: -a.bytes)


def after_gc(rec: Recorded) -> list[tuple[float, int]]:
    """(time, heap used) just after each collection, in order."""
    return sorted((p.at, p.used) for p in rec.heap if p.after)
