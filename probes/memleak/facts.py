"""memleak's facts: the heaviest stack's outstanding bytes and their trend (memleak.*), what the
reachability scan says of the leak stack and of the heaviest one (reach.*, figures of the probe
table's reach row), and the budget decision (alloc.*, from its plan: no row of their own)."""

from __future__ import annotations

from memdiag.system.trends import growth_trend

from ..face import FactDef, Namer, Plan
from .plan import plan_facts
from .result import MemleakResult
from .trend import stack_trend

FACTS = (
    FactDef("alloc.rate", "per_s", "allocating calls (malloc, operator new ...) per second, from a bounded count",
            figure=False),
    FactDef("alloc.tracing_percent", "percent",
            "tracing every allocation priced before attaching: share of the window", figure=False),
    FactDef("alloc.tracing", "string",
            "memleak priced against the budget: full, fallback, unknown, or none (not priced)", figure=False),
    FactDef("alloc.allocator", "string",
            "the allocator the target calls: glibc, jemalloc, tcmalloc, static, ... (when priced)", figure=False),
    FactDef("memleak.top_outstanding", "bytes", "outstanding bytes of the heaviest stack"),
    FactDef("memleak.top_rate", "bytes_per_s", "growth of the heaviest stack's outstanding bytes"),
    FactDef("memleak.top_free_ratio", "percent", "share of its allocated bytes the heaviest stack freed"),
    FactDef("memleak.top_function", "string", "the application function of the heaviest stack"),
    FactDef("memleak.top_entry", "string",
            "how the heaviest stack allocates: malloc, calloc, ... or mmap (mappings)"),
    FactDef("memleak.top_trend", "string",
            "climbing, levelled, flat, shrinking, sawtooth or unknown (too few samples): the heaviest stack's "
            "outstanding bytes"),
    # the reachability scan (after memleak): what still points at the outstanding blocks
    FactDef("reach.scanned", "bool",
            "the reachability scan ran (false: it was skipped or failed; see reach.not_run_reason)", row="reach"),
    FactDef("reach.not_run_reason", "string", "why no reachability scan ran", row="reach"),
    FactDef("reach.paused", "seconds", "how long the scan stopped the target (measured)", row="reach"),
    FactDef("reach.leaked_bytes", "bytes",
            "bytes nothing points at, of the stack with the most of them (the leak stack)", row="reach"),
    FactDef("reach.leaked_count", "number", "blocks nothing points at, of the leak stack", row="reach"),
    FactDef("reach.unreferenced_count", "number",
            "of those, blocks no other leaked block points at either", row="reach"),
    FactDef("reach.leaked_ratio", "percent",
            "share of the leak stack's outstanding bytes that nothing points at", row="reach"),
    FactDef("reach.leak_function", "string", "the application function of the leak stack", row="reach"),
    FactDef("reach.leak_trend", "string",
            "climbing, levelled, flat or shrinking: the leak stack's outstanding bytes", row="reach"),
    FactDef("reach.leak_rate", "bytes_per_s", "bytes the leak stack leaked per second of the probe", row="reach"),
    FactDef("reach.leak_share", "string",
            "how often its allocations leak: '1 in 7 allocations', 'nearly every allocation (4 of 5)', "
            "'every allocation' (none freed)", row="reach"),
    FactDef("reach.anchored_bytes", "bytes", "bytes of the heaviest stack the program still points at", row="reach"),
    FactDef("reach.anchored_ratio", "percent",
            "share of the heaviest stack's outstanding bytes still pointed at", row="reach"),
    FactDef("reach.anchor", "string", "the root that holds most of the heaviest stack's anchored bytes", row="reach"),
    FactDef("reach.anchor_kind", "string",
            "what kind of root that is: static, stack, register, tls, or untracked (memory memdiag did not see "
            "allocated: heap from before the probe, or the allocator's own, where stale pointers can remain)",
            row="reach"),
)  # fmt: skip

_MAPPING_CALLS = {"mmap", "mmap64", "__mmap", "mremap", "__mremap"}


def facts_of(r: MemleakResult | None, plan: Plan | None, name: Namer) -> dict:
    """The heaviest stack's trend, the scan's facts, then the budget decision's."""
    f: dict = {}
    ran = r is not None and r.status in ("ok", "partial")
    if ran and r.stacks:  # type: ignore[union-attr]
        f.update(top_facts(r, name))  # type: ignore[arg-type]
    if ran:
        f.update(reach_facts(r, name))  # type: ignore[arg-type]
    return {**f, **plan_facts(plan)}


def top_facts(r: MemleakResult, name: Namer) -> dict:
    top = r.stacks[0]
    trend = stack_trend(r.series_times, top.series, top.alloc_bytes, top.freed_bytes)
    return {
        "memleak.top_outstanding": top.outstanding_bytes,
        "memleak.top_rate": trend.rate_per_s,
        "memleak.top_free_ratio": 100 * trend.free_ratio if trend.free_ratio is not None else None,
        "memleak.top_function": name(top.frames, top.forwards),
        "memleak.top_entry": _entry(top.functions),
        "memleak.top_trend": trend.shape,
    }


def reach_facts(ml: MemleakResult, name: Namer) -> dict:
    """What the reachability scan says about the stack with the most leaked bytes (the leak) and
    about the heaviest stack (what holds it)."""
    scan = ml.reach_scan
    if scan is None or scan.status != "ran":
        return {"reach.scanned": False, "reach.not_run_reason": scan.reason if scan else "no scan was asked for"}
    f: dict = {"reach.scanned": True, "reach.paused": (scan.paused_ms or 0) / 1000}
    if ml.stacks:
        top = ml.stacks[0]
        if top.reach is not None:
            held = top.reach.anchored_bytes + top.reach.leaked_bytes
            f["reach.anchored_bytes"] = top.reach.anchored_bytes
            f["reach.anchored_ratio"] = 100 * top.reach.anchored_bytes / held if held else None
            f["reach.anchor"] = top.reach.anchor
            f["reach.anchor_kind"] = top.reach.anchor_kind
    leak = ml.leak_stack()
    if leak is None or leak.reach is None:
        f.update({"reach.leaked_bytes": 0, "reach.leaked_count": 0, "reach.leaked_ratio": 0.0})
        return f
    r = leak.reach
    f.update(
        {
            "reach.leaked_bytes": r.leaked_bytes,
            "reach.leaked_count": r.leaked_count,
            "reach.unreferenced_count": r.unreferenced_count,
            "reach.leaked_ratio": 100 * r.leaked_bytes / (r.leaked_bytes + r.anchored_bytes),
            "reach.leak_function": name(leak.frames, leak.forwards),
            "reach.leak_trend": _series_shape(ml.series_times, leak.series) if leak.series else None,
            "reach.leak_rate": (r.leaked_bytes / ml.duration_s) if ml.duration_s else None,
            "reach.leak_share": share_words(r.leaked_count, leak.allocs, leak.frees),
        }
    )
    return f


def _series_shape(times: list[float], series: list[int]) -> str:
    """The shape of a stack's outstanding bytes over the probe (climbing, levelled, ...)."""
    return growth_trend(list(zip(times, series, strict=False))).shape


def share_words(leaked: int, allocs: int, freed: int) -> str | None:
    """How often the stack's allocations leak, as the verdict says it ('... is never freed'):
    '1 in 7 allocations'; 'nearly every allocation (4 of 5)' where fewer than one in 1.5 was freed;
    'every allocation' only where none was. The leaked count is at most what was not freed: once
    4 leaked of 5 rounded to "every allocation is never freed" beside a stack showing one free."""
    if not leaked or not allocs:
        return None
    kept = max(1, min(leaked, allocs - max(freed, 0)))
    if kept >= allocs:
        return "every allocation"
    one_in = allocs / kept
    if one_in < 1.5:
        return f"nearly every allocation ({kept:,} of {allocs:,})"
    return f"1 in {round(one_in):,} allocations"


def _entry(functions: list[str | None]) -> str | None:
    """The allocator entry point of a stack (its leaf); every mmap alias reads as mmap."""
    leaf = functions[0] if functions else None
    return "mmap" if leaf in _MAPPING_CALLS else leaf
