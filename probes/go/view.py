"""How the goheap probe shows in a diagnosis: its facts (go.*: the heap profile's trend by stack,
the goroutines' by what they run), its stacks (in-use bytes by Go allocation stack), its report
sections (the heap profile, the goroutines) and its lines under `memdiag probe goheap`."""

from __future__ import annotations

from memdiag.system.trends import MIN_GROWTH_BYTES
from memdiag.system.units import fmt_bytes, fmt_number

from ..face import FactDef, Namer, Section, Stack, Stacks
from ..text import stack_lines
from .trend import sampled_shape

TOP_SHOWN = 8

FACTS = (
    FactDef("go.profile", "string",
            "the Go heap profile: on, compiled-out (the program never references runtime.MemProfile, so the "
            "linker switched sampling off), rate-zero (the program set MemProfileRate to 0), unknown"),
    FactDef("go.unreadable", "string", "why the Go runtime could not be read (an unsupported Go version ...)"),
    FactDef("go.version", "string", "the Go toolchain the program was built with: go1.19.8"),
    FactDef("go.stripped", "bool", "the binary has no symbol table (its runtime located from its own code)"),
    FactDef("go.gc_cycles", "number", "GCs completed while goheap read (the heap profile moves at each)"),
    FactDef("go.gcs_seen", "number",
            "GCs seen completing while goheap read, profile on or not: its cycle count, or else how often "
            "the GC pacer's live count or goal changed between reads (at least this many)"),
    FactDef("go.heap_inuse", "bytes", "in-use bytes of the heap profile at the last GC read (estimated from samples)"),
    FactDef("go.heap_growth", "bytes", "how much that grew over the GCs read"),
    FactDef("go.heap_trend", "string", "the shape of the heap profile's in-use bytes: climbing, levelled, flat ..."),
    FactDef("go.top_function", "string", "the program's function of the allocation stack whose in-use bytes grew most"),
    FactDef("go.top_growth", "bytes", "how much that stack's in-use bytes grew over the GCs read (estimated)"),
    FactDef("go.top_rate", "bytes_per_s", "that growth per second"),
    FactDef("go.top_inuse", "bytes", "that stack's in-use bytes at the last GC read (estimated)"),
    FactDef("go.top_share", "percent", "that stack's share of what grew in the heap profile (at most 100%)"),
    FactDef("go.top_trend", "string", "the shape of that stack's in-use bytes: climbing, levelled, flat ..."),
    FactDef("go.largest_function", "string", "the program's function of the stack holding the most in-use bytes"),
    FactDef("go.largest_inuse", "bytes", "what it holds at the last GC read (estimated)"),
    FactDef("go.gogc", "number", "GOGC the program runs with, read from its GC pacer (-1: the GC is off)"),
    FactDef("go.heap_marked", "bytes", "what the last GC marked live: the runtime's own count, exact"),
    FactDef("go.heap_marked_trend", "string", "the shape of that over the reads: climbing, levelled, flat ..."),
    FactDef("go.heap_goal", "bytes",
            "the heap goal as the last GC ended: the heap grows to it between collections (live x (1 + GOGC/100))"),
    FactDef("go.heap_retained", "bytes",
            "what the Go heap holds from the OS at the last read: in-use spans and free ones not yet returned"),
    FactDef("go.runtime_mapped", "bytes",
            "all the Go runtime holds from the OS at the last read, heap and not (what its memory limit counts)"),
    FactDef("go.beyond_runtime", "bytes",
            "anonymous resident memory beyond all the Go runtime holds (cgo and C libraries, C threads' stacks)"),
    FactDef("go.beyond_runtime_growth", "bytes", "how much that grew over the reads"),
    FactDef("go.beyond_runtime_trend", "string", "the shape of that over the reads: climbing, levelled, flat ..."),
    FactDef("go.goroutines", "number", "the program's own goroutines at the last read (the runtime's not counted)"),
    FactDef("go.goroutines_growth", "number", "how many more than at the first read"),
    FactDef("go.goroutines_trend", "string", "the shape of the goroutine count: climbing, levelled, flat ..."),
    FactDef("go.goroutine_top_growth", "number", "growth of the goroutine group that grew most"),
    FactDef("go.goroutine_top_trend", "string", "the shape of that group's count"),
    FactDef("go.goroutine_top_function", "string", "what that group's goroutines run (their start function)"),
    FactDef("go.goroutine_top_creator", "string", "the go statement that started them: main.serve (main.go:27)"),
    FactDef("go.goroutine_top_wait", "string", "what they wait on: chan receive, select, IO wait ..."),
    FactDef("go.goroutine_top_waiting", "string",
            "the program's frame they are parked in: main.awaitReply (main.go:20)"),
)  # fmt: skip


def _shape(times: list[float], series: list[int], replaced: float, rate: int) -> str:
    return sampled_shape(times, series, replaced, rate, least=max(MIN_GROWTH_BYTES, 2 * rate))


def _count_shape(times: list[float], counts: list[int]) -> str:
    return sampled_shape(times, counts, least=2)


def _program_function(functions: list[str], frames: list[str], name: Namer) -> str | None:
    return name(frames, [False] * len(frames)) or next((f for f in functions if f), None)


def facts_of(r, _plan, name: Namer) -> dict:
    if r is None:
        return {}
    if r.status == "unavailable":
        return {"go.unreadable": r.reason} if r.reason else {}
    f: dict = {"go.profile": r.profile, "go.version": r.version, "go.stripped": r.stripped}
    f.update(_goroutine_facts(r))
    f.update(_pacer_facts(r))
    # each GC ends with a new live count and goal (equal to the byte twice running: not seen here)
    paced = list(zip(r.heap_marked, r.heap_goal, strict=False))
    changes = sum(1 for a, b in zip(paced, paced[1:], strict=False) if a != b)
    if r.profile != "on":
        if paced:
            f["go.gcs_seen"] = changes
        return f
    f["go.gc_cycles"] = r.cycles[-1] - r.cycles[0] if r.cycles else 0
    f["go.gcs_seen"] = max(f["go.gc_cycles"], changes)
    freed = sum(s.freed_bytes for s in r.stacks)
    if r.heap_inuse:
        f.update(
            {
                "go.heap_inuse": r.heap_inuse[-1],
                "go.heap_growth": r.heap_inuse[-1] - r.heap_inuse[0],
                "go.heap_trend": _shape(r.times, r.heap_inuse, freed, r.rate or 0),
            }
        )
    if r.stacks:
        f.update(_stack_facts(r, name))
    return f


def _stack_facts(r, name: Namer) -> dict:
    top = r.stacks[0]  # the most growth first
    growth = top.inuse_bytes[-1] - top.inuse_bytes[0]
    span = r.times[-1] - r.times[0] if len(r.times) > 1 else 0
    total = r.heap_inuse[-1] - r.heap_inuse[0] if r.heap_inuse else 0
    # what grew, not the net change: where other stacks let go as much, the net is near nothing and
    # a share of it is no share (prometheus: 549 KiB of growth over a net 4.2 KiB, "13137.4%")
    total = max(total, sum(max(0, s.inuse_bytes[-1] - s.inuse_bytes[0]) for s in r.stacks))
    largest = max(r.stacks, key=lambda s: s.inuse_bytes[-1])
    return {
        "go.top_function": _program_function(top.functions, top.frames, name),
        "go.top_growth": growth,
        "go.top_rate": growth / span if span else None,
        "go.top_inuse": top.inuse_bytes[-1],
        "go.top_share": 100 * growth / total if total > 0 and growth > 0 else None,
        "go.top_trend": _shape(r.times, top.inuse_bytes, top.freed_bytes, r.rate or 0),
        "go.largest_function": _program_function(largest.functions, largest.frames, name),
        "go.largest_inuse": largest.inuse_bytes[-1],
    }


def _pacer_facts(r) -> dict:
    """The GC's exact counts beside RSS: where RSS climbs with the heap's live set flat, the climb
    is the process touching memory the runtime already holds (its heap filling toward its goal,
    garbage between collections), or memory beyond all the runtime holds (cgo, C libraries).
    What the runtime holds is counted whether resident or not (it takes its heap's goal at once
    and touches it as it allocates), so only anonymous RSS past it is beyond it."""
    if not r.rss_anon:
        return {}
    beyond = _beyond_runtime(r)
    exact = {"least": MIN_GROWTH_BYTES}
    return {
        "go.gogc": r.gogc,
        "go.heap_marked": r.heap_marked[-1],
        "go.heap_marked_trend": sampled_shape(*_per_gc(r), **exact),
        "go.heap_goal": r.heap_goal[-1],
        "go.heap_retained": r.heap_retained[-1],
        "go.runtime_mapped": r.runtime_mapped[-1],
        "go.beyond_runtime": beyond[-1],
        "go.beyond_runtime_growth": beyond[-1] - beyond[0],
        "go.beyond_runtime_trend": sampled_shape(r.pacer_times, beyond, **exact),
    }


def _per_gc(r) -> tuple[list[float], list[int]]:
    """(times, marked bytes) once per GC: the marked count is the last GC's, and reads between two
    GCs repeat it; counted at every read, a GC read three times weighs three points and a bounded
    cache's few GCs read as a trend (99.2, 99.2, 99.2, 99.6, 99.6, 99.6 MiB: "climbing")."""
    times: list[float] = []
    marked: list[int] = []
    last = None
    for t, cycle, m in zip(r.pacer_times, r.pacer_cycles or [None] * len(r.pacer_times), r.heap_marked, strict=True):
        if cycle is None or cycle != last:
            times.append(t)
            marked.append(m)
        last = cycle
    return times, marked


def _beyond_runtime(r) -> list[int]:
    """Anonymous RSS past all the runtime holds, at each read (0 where it is within it)."""
    return [max(0, rss - held) for rss, held in zip(r.rss_anon, r.runtime_mapped, strict=True)]


def _goroutine_facts(r) -> dict:
    if not r.goroutines:
        return {}
    f: dict = {
        "go.goroutines": r.goroutines[-1],
        "go.goroutines_growth": r.goroutines[-1] - r.goroutines[0],
        "go.goroutines_trend": _count_shape(r.read_times, r.goroutines),
    }
    if r.groups:
        g = r.groups[0]
        f.update(
            {
                "go.goroutine_top_growth": g.counts[-1] - g.counts[0],
                "go.goroutine_top_trend": _count_shape(r.read_times, g.counts),
                "go.goroutine_top_function": g.function,
                "go.goroutine_top_creator": g.created_by,
                "go.goroutine_top_wait": g.wait,
                "go.goroutine_top_waiting": g.waiting_in,
            }
        )
    return f


# --- stacks ------------------------------------------------------------------------------------
def stack(s, module: str = "") -> Stack:
    allocated = f", {fmt_bytes(s.alloc_bytes)} allocated since the start" if s.alloc_bytes else ""
    return Stack(
        frames=s.frames,
        functions=s.functions,
        bytes=s.inuse_bytes[-1] if s.inuse_bytes else 0,
        count=s.inuse_objects,
        detail=f"{fmt_number(s.inuse_objects)} objects in use at the last GC read (estimated from the runtime's "
        f"samples){allocated}",
        series=s.inuse_bytes,
    )


def culprit(r, verdict_kind: str) -> Stack | None:
    """A growth or a leak rests on the stack that grew most; a cache on the largest holder."""
    if not r.stacks or verdict_kind not in ("growth", "leak", "cache"):
        return None
    if verdict_kind == "cache":
        return stack(max(r.stacks, key=lambda s: s.inuse_bytes[-1]))
    top = r.stacks[0]
    # a stack that did not grow explains no growth (a trial's prometheus: a start-up allocation,
    # "change 0 B" over no completed GC, was named the culprit of its RSS growth)
    return stack(top) if top.inuse_bytes and top.inuse_bytes[-1] > top.inuse_bytes[0] else None


def folded(r) -> list[str]:
    """The in-use bytes as a flame graph's input: root first, the leaf last, one line a stack."""
    out = []
    for s in r.stacks:
        if s.inuse_bytes and s.inuse_bytes[-1] > 0:
            out.append(";".join(reversed([f or "?" for f in s.functions])) + f" {s.inuse_bytes[-1]}")
    return out


def _shown_first(r) -> list[Stack]:
    """The stacks by growth, with the largest holder among the shown (a cache's verdict names it)."""
    ordered = list(r.stacks)
    if ordered:
        at = max(range(len(ordered)), key=lambda i: ordered[i].inuse_bytes[-1] if ordered[i].inuse_bytes else 0)
        if at >= SHOWN:
            ordered.insert(SHOWN - 1, ordered.pop(at))
    return [stack(s) for s in ordered]


SHOWN = 3
# in use at the last GC read, as the runtime's sampled profile estimates it
STACKS = Stacks(
    kind="allocations",
    shown=SHOWN,
    of=_shown_first,
    folded=folded,
    culprit=culprit,
    space="inuse_space",
    counted="inuse_objects",
)


# --- the report's sections -----------------------------------------------------------------------
def sections(r) -> list[Section]:
    if r.status not in ("ok", "partial"):
        return []
    out = []
    lines = [r.reason]
    if r.profile == "on" and r.heap_inuse:
        lines.append(
            f"in use by the heap profile's stacks (estimated): {fmt_bytes(r.heap_inuse[0])} at the first GC read, "
            f"{fmt_bytes(r.heap_inuse[-1])} at the last"
        )
    if r.rss_anon:
        lines.append(_pacer_line(r))
    else:  # the RSS beside the GC's own counts is then judged without them: say so
        why = (
            "the binary is stripped, and runtime.gcController is located by its symbol table"
            if r.stripped
            else f"runtime.gcController was not located or not readable in this {r.version} binary"
        )
        lines.append(f"the GC's own counts (live heap, goal, what the runtime holds) were not read: {why}")
    rows = [
        [
            _allocated_at(s.functions),
            fmt_bytes(s.inuse_bytes[0]),
            fmt_bytes(s.inuse_bytes[-1]),
            fmt_bytes(s.inuse_bytes[-1] - s.inuse_bytes[0]),
            fmt_bytes(s.alloc_bytes),
        ]
        for s in r.stacks[:TOP_SHOWN]
    ]
    header = ["allocated at", "in use, first GC", "in use, last GC", "change", "allocated since start"]
    out.append(Section(probe="goheap", title="Go heap profile", lines=lines, header=header if rows else [], rows=rows))
    if r.groups:
        g_rows = [
            [fmt_number(g.counts[0]), fmt_number(g.counts[-1]), g.function, g.created_by, g.wait, g.waiting_in or "–"]
            for g in r.groups[:TOP_SHOWN]
        ]
        g_lines = [
            f"the program's goroutines: {fmt_number(r.goroutines[0])} at the first read, "
            f"{fmt_number(r.goroutines[-1])} at the last ({fmt_number(r.goroutines_total[-1])} with the runtime's own)"
        ]
        out.append(
            Section(
                probe="goheap",
                title="Goroutines",
                lines=g_lines,
                header=["first", "last", "running", "started by", "waiting on", "parked in"],
                rows=g_rows,
            )
        )
    return out


def _pacer_line(r) -> str:
    gogc = "off" if r.gogc is not None and r.gogc < 0 else r.gogc
    beyond = _beyond_runtime(r)
    return (
        f"the GC's own counts (exact): live {fmt_bytes(r.heap_marked[0])} at the first read, "
        f"{fmt_bytes(r.heap_marked[-1])} at the last; goal {fmt_bytes(r.heap_goal[-1])} at GOGC={gogc}; "
        f"the heap holds {fmt_bytes(r.heap_retained[-1])} from the OS, the whole runtime "
        f"{fmt_bytes(r.runtime_mapped[-1])}; anonymous RSS {fmt_bytes(r.rss_anon[-1])}, "
        f"{fmt_bytes(beyond[-1])} of it beyond what the runtime holds ({fmt_bytes(beyond[0])} at the first read)"
    )


def _allocated_at(functions: list[str]) -> str:
    """The leaf, and past Go's runtime the program's first function: runtime.makeBucketArray <- main.add."""
    if not functions:
        return "?"
    own = next((f for f in functions if f and not f.startswith("runtime.")), None)
    return functions[0] if own in (None, functions[0]) else f"{functions[0]} ← {own}"


def describe(r, top: int) -> list[str]:
    """`memdiag probe goheap`'s lines under its header."""
    lines = []
    for s in r.stacks[:top]:
        series = " -> ".join(fmt_bytes(b) for b in s.inuse_bytes[:: max(1, len(s.inuse_bytes) // 6)])
        lines.append(f"  {fmt_bytes(s.inuse_bytes[-1] if s.inuse_bytes else 0)} in use (estimated), {series}:")
        lines += stack_lines(s.frames)
    for g in r.groups[:top]:
        where = f", parked in {g.waiting_in}" if g.waiting_in else ""
        lines.append(
            f"  {fmt_number(g.counts[-1])} goroutines ({fmt_number(g.counts[0])} at the first read) running "
            f"{g.function}, started by {g.created_by}, {g.wait}{where}"
        )
    return lines
