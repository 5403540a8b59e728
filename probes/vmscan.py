"""vmscan: page reclaim as latency — direct reclaim, memcg reclaim, slab shrinking and kswapd,
with latency histograms and pages reclaimed, from the vmscan tracepoints (system-wide: reclaim
is a property of the machine or the cgroup, not of one process)."""

from __future__ import annotations

from memdiag.system._parse import Model
from memdiag.system.target import Target

from . import kernel
from .base import Run, run_probe
from .face import Face, ProbeResult, plain

KINDS = ("direct", "memcg", "slab", "kswapd")
FILTERED = False  # reclaim is a host matter: counted for every process, whatever the target
TRACEPOINTS = (
    "mm_vmscan_direct_reclaim_begin",
    "mm_vmscan_direct_reclaim_end",
    "mm_vmscan_memcg_reclaim_begin",
    "mm_vmscan_memcg_reclaim_end",
    "mm_shrink_slab_start",
    "mm_shrink_slab_end",
    "mm_vmscan_kswapd_wake",
    "mm_vmscan_kswapd_sleep",
)


class ReclaimLatency(Model):
    kind: str
    events: int
    total_ms: float  # thread time, summed over the threads that reclaimed (THREAD_TIME)
    pages_reclaimed: int
    histogram_us: dict[str, int]  # "lo-hi" microseconds -> count (log2 buckets)


class VmscanResult(ProbeResult):
    reclaim: list[ReclaimLatency] = []
    kswapd_wakeups: int = 0


def requirements() -> list[kernel.Availability]:
    return [kernel.tracepoint("vmscan", tp) for tp in TRACEPOINTS]


# Reclaim is timed per thread, begin to end: concurrent reclaimers each count their own time (a
# swapping hog's threads reported 6.2 s of reclaim inside a 5 s trace on one CPU, waiting on swap
# I/O side by side), and slab shrinking runs inside direct, cgroup and kswapd reclaim, so its time
# is part of theirs. Said beside the figures, so no one adds them up as the machine's time.
THREAD_TIME = (
    "  times are thread time, summed over every thread that reclaimed (they can exceed the trace); "
    "slab shrinking runs inside the other kinds, so its time is part of theirs, not added to it"
)


def describe(r: VmscanResult, top: int) -> list[str]:
    """The result's lines under its header in `memdiag probe vmscan`: reclaim by kind, its histogram."""
    lines = [f"  kswapd wake-ups: {r.kswapd_wakeups:,}", THREAD_TIME]
    for x in r.reclaim:
        lines.append(
            f"  {x.kind:<7} {x.events:>8,} events {x.total_ms:>10.1f} ms of thread time  {x.pages_reclaimed:,} pages"
        )
        for bucket, n in x.histogram_us.items():
            lines.append(f"      {bucket:>14} us {n:>8,}")
    return lines


def bucket_label(slot: int) -> str:
    lo = 0 if slot == 0 else 1 << (slot - 1)
    return f"{lo}-{(1 << slot) - 1}"


def run(target: Target, duration: float) -> VmscanResult:
    def collect(bpf, _elapsed: float) -> dict:
        hist: dict[int, dict[str, int]] = {i: {} for i in range(len(KINDS))}
        for k, v in sorted(bpf["hist"].items(), key=lambda kv: (kv[0].kind, kv[0].slot)):
            hist[k.kind][bucket_label(k.slot)] = v.value
        reclaim = [
            ReclaimLatency(
                kind=kind,
                events=bpf["events"][i].value,
                total_ms=bpf["totals_ns"][i].value / 1e6,
                pages_reclaimed=bpf["reclaimed"][i].value,
                histogram_us=hist[i],
            )
            for i, kind in enumerate(KINDS)
        ]
        return {
            "reclaim": reclaim,
            "kswapd_wakeups": bpf["kswapd_wakes"][0].value,
            "events": sum(r.events for r in reclaim),
        }

    return run_probe(
        Run(
            "vmscan",
            VmscanResult,
            requirements(),
            {},
            collect,
            "vmscan tracepoints (system-wide)",
            filtered=FILTERED,
        ),
        target,
        duration,
    )  # type: ignore[return-value]


FACE = Face(
    name="vmscan",
    summary="page reclaim as latency: direct, memcg, slab shrinking and kswapd",
    run=plain(run),
    result=VmscanResult,
    describe=describe,
)
