"""drsnoop: the tasks that had to stop and reclaim memory inside their allocation — how often,
for how long, how many pages — per process (direct and memcg reclaim tracepoints)."""

from __future__ import annotations

from memdiag.system._parse import Model
from memdiag.system.target import Target

from . import bpfstats, kernel
from .base import Run, run_probe
from .face import Face, FactDef, ProbeResult, plain
from .vmscan import TRACEPOINTS


class ProcessReclaim(Model):
    pid: int
    comm: str
    count: int
    memcg_count: int
    total_ms: float
    max_ms: float
    pages_reclaimed: int


class DrsnoopResult(ProbeResult):
    processes: list[ProcessReclaim] = []


def requirements() -> list[kernel.Availability]:
    return [kernel.tracepoint("vmscan", tp) for tp in TRACEPOINTS[:4]]


def describe(r: DrsnoopResult, top: int) -> list[str]:
    """The result's lines under its header in `memdiag probe drsnoop`: reclaim stalls by process."""
    return [
        f"  PID {p.pid:>7} {p.comm:<16} {p.count:>6,} reclaims ({p.memcg_count:,} memcg) "
        f"{p.total_ms:.1f} ms total, max {p.max_ms:.2f} ms, {p.pages_reclaimed:,} pages"
        for p in r.processes[:top]
    ]


def run(target: Target, duration: float) -> DrsnoopResult:
    def collect(bpf, _elapsed: float) -> dict:
        procs = [
            ProcessReclaim(
                pid=k.tgid,
                comm=k.comm.decode(errors="replace"),
                count=v.count,
                memcg_count=v.memcg_count,
                total_ms=v.total_ns / 1e6,
                max_ms=v.max_ns / 1e6,
                pages_reclaimed=v.pages,
            )
            for k, v in bpf["per_process"].items()
        ]
        procs.sort(key=lambda p: p.total_ms, reverse=True)
        stats = bpfstats.read(bpf, bpfstats.TABLE)
        return {"processes": procs, "events": stats["events"], "lost": {"table_full": stats["table_full"]}}

    return run_probe(
        Run(
            "drsnoop",
            DrsnoopResult,
            requirements(),
            {},
            collect,
            "vmscan direct/memcg reclaim tracepoints",
        ),
        target,
        duration,
    )  # type: ignore[return-value]


def facts_of(r: DrsnoopResult | None, _plan, _name) -> dict:
    if r is None or r.status != "ok":
        return {}
    return {"reclaim.stall_time": sum(p.total_ms for p in r.processes) / 1000.0}


FACE = Face(
    name="drsnoop",
    summary="tasks that stopped to reclaim memory: how often, how long, how many pages",
    run=plain(run),
    result=DrsnoopResult,
    describe=describe,
    facts=(FactDef("reclaim.stall_time", "seconds", "time tasks spent in direct or memcg reclaim during the probe"),),
    facts_of=facts_of,
)
