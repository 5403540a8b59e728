"""BENCHMARKS.md section 9: what the probes of memory no heap holds cost (fdstack: descriptors by the
stack that created them; kmemstack: the kernel's slab allocations by kernel and user stack; shmwriter:
tmpfs files, memfds and System V segments by the stack that made them). All run host-wide programs
(every syscall's entry or exit; every slab allocation and free on the host), so
their price is their BPF run time, whoever's task it runs in: measured once with a target that does
what the probe traces at a set rate, once with an idle target (the host's own traffic alone), and
the difference per traced event estimated from the two."""

from __future__ import annotations

import shutil
import statistics
import uuid
from pathlib import Path

from bench_common import median_range
from kit import Workload
from memdiag.probes import fdstack, kmemstack, shmwriter
from memdiag.system.target import Target

SECONDS = 5.0
# its anchor is linked from docs/probes/*.md: kept as it was when shmwriter's rows joined it
TITLE = "## 9. Memory no heap holds: what fdstack and kmemstack cost"


def _one(probe, args: tuple[str, ...] | None) -> dict:
    """One probe run on a workload (args) or on an idle process (None): its BPF books."""
    with Workload(*(args or ("idle",))) as w:
        r = probe.run(Target.for_pid(w.pid), SECONDS)
    c = r.cost
    return {
        "runs": c.bpf_run_count or 0,
        "run_ns": c.bpf_run_ns or 0,
        "events": c.events,
        "seconds": r.duration_s or SECONDS,
        "status": r.status,
    }


def _rows(name: str, probe, args: tuple[str, ...], what: str, runs: int) -> list[str]:
    busy = [_one(probe, args) for _ in range(runs)]
    idle = [_one(probe, None) for _ in range(runs)]
    F = "{:.0f}"

    def per_run(rs: list[dict]) -> list[float]:
        return [r["run_ns"] / r["runs"] for r in rs if r["runs"]]

    def share(rs: list[dict]) -> list[float]:
        return [100 * r["run_ns"] / (r["seconds"] * 1e9) for r in rs]

    floor = statistics.median(per_run(idle)) if per_run(idle) else 0.0
    # what a traced event costs beyond a program run that filters it out: an estimate from the two
    per_event = [(r["run_ns"] - r["runs"] * floor) / r["events"] for r in busy if r["events"]]
    return [
        f"| {name} | {what} | {median_range([r['runs'] / r['seconds'] for r in busy], F)} | "
        f"{median_range(per_run(busy), F)} | {median_range([r['events'] / r['seconds'] for r in busy], F)} | "
        f"{median_range(per_event, F)} | {median_range(share(busy), '{:.2f}%')} |",
        f"| {name} | idle target (the host's own traffic) | "
        f"{median_range([r['runs'] / r['seconds'] for r in idle], F)} | "
        f"{median_range(per_run(idle), F)} | – | – | {median_range(share(idle), '{:.2f}%')} |",
    ]


def nonheap_section(runs: int) -> list[str]:
    rows = _rows(
        "fdstack",
        fdstack,
        ("fdleak", "200", "5"),
        "fdleak: 200 sessions/s (a socket pair, a pipe, an eventfd each)",
        runs,
    )
    rows += _rows(
        "kmemstack", kmemstack, ("lookups", "/var/tmp", "2000"), "lookups: 2,000 stats of missing names/s", runs
    )
    spool = Path("/dev/shm") / f"memdiag-bench-{uuid.uuid4().hex[:8]}"  # the spooler's files, removed after
    spool.mkdir()
    try:
        rows += _rows(
            "shmwriter",
            shmwriter,
            ("spooler", str(spool), "200", "16384", "2"),
            "spooler: 200 tmpfs files/s made (16 KiB each), half unlinked",
            runs,
        )
    finally:
        shutil.rmtree(spool, ignore_errors=True)
    return [
        TITLE,
        "",
        f"Each probe run {SECONDS:.0f} s, {runs} times (median, min–max), on a workload that does what it traces and "
        "on an idle process. All attach host-wide programs (fdstack: the raw syscall tracepoints, every "
        "syscall's entry and exit on the host; kmemstack: the kmem tracepoints, every slab allocation and "
        "free on the host; shmwriter: every syscall's exit), filtered to the target inside the program, so "
        "what they cost is their BPF run time (kernel.bpf_stats_enabled), paid by whichever task made the "
        "call, and it grows with the host's "
        "traffic as well as the target's. A diagnosis reports it as the probe's overhead. Per traced event: "
        "(run time - program runs x the idle run's ns per run) / traced events, an estimate.",
        "",
        "| probe | target | program runs/s | ns per program run | traced events/s "
        "| ns per traced event (estimate) | share of one CPU |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
    ]
