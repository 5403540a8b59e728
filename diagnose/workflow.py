"""One diagnosis end to end: observe the counters, triage them, assemble the Report."""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from .evidence import build_counters
from .observe import Observation, observe
from .report import Overhead, ProbeStatus, Report, TargetInfo, Window
from .snapshot import Snapshot
from .target import Target
from .triage import triage

DEFAULT_BUDGET_PERCENT = 2.0

# The probes the full workflow escalates to. Until they are built, the report lists each as
# not run and says why, so a reader knows what the verdict does not rest on.
PLANNED_PROBES = ("faults", "memleak", "brkstack", "mmapsnoop", "oomkill", "swapin", "vmscan", "drsnoop")


def memdiag_version() -> str:
    try:
        return version("memdiag")
    except PackageNotFoundError:
        return "unknown"


def target_info(target: Target) -> TargetInfo:
    return TargetInfo(
        kind=target.kind,
        description=target.describe(),
        pid=target.pid,
        comm=target.comm,
        cmdline=target.cmdline,
        cgroup=target.cgroup.path if target.cgroup else None,
        cgroup_version=target.cgroup.version if target.cgroup else None,
    )


def report_from(obs: Observation, budget_percent: float = DEFAULT_BUDGET_PERCENT) -> Report:
    counters = build_counters(obs)
    result = triage(obs, counters)
    return Report(
        memdiag_version=memdiag_version(),
        target=target_info(obs.target),
        window=Window(
            started=obs.started,
            ended=obs.ended,
            requested_s=obs.requested_s,
            samples=len(obs.snapshots),
            target_exited_at=obs.exited_at,
        ),
        verdict=result.verdict,
        findings=result.findings,
        next_steps=result.next_steps,
        caveats=result.caveats,
        probes=[
            ProbeStatus(
                name=name,
                status="not-run",
                reason="counters-only diagnosis: BPF probes are not part of this version yet",
            )
            for name in PLANNED_PROBES
        ],
        # Reading /proc once a second costs the target nothing measurable; no probe ran.
        overhead=Overhead(budget_percent=budget_percent, estimated_percent=0.0, measured_percent=None),
        counters=counters,
    )


def diagnose(
    target: Target,
    duration: float,
    interval: float | None = None,
    budget_percent: float = DEFAULT_BUDGET_PERCENT,
    on_sample: Callable[[Snapshot, float], None] | None = None,
    proc_root: Path = Path("/proc"),
) -> Report:
    obs = observe(target, duration, interval, on_sample=on_sample, proc_root=proc_root)
    return report_from(obs, budget_percent)
