"""serve keeps the case: incidents of one service linked across restarts, and an earlier diagnosis
followed into a later one (memdiag verify's comparison, diagnose/verify.py).

A service is what stays the same when its process is restarted: its container's name (a pod's
container by namespace, pod and name), a cgroup target's cgroup, else a process by its name in its
cgroup (a systemd service keeps /system.slice/NAME.service across restarts). Every incident carries
that key; an incident lists the earlier ones of its service with their verdicts. A diagnosis is
compared with an earlier one of its service when it was asked to verify it (POST
/incidents/ID/verify), or, for the OOM watch's diagnosis of what runs after a kill, with the
service's latest diagnosis that found growth: whether the restarted process grows the same way."""

from __future__ import annotations

from pathlib import Path

from ..report import Report
from ..verify import GROWING, compare

RELATED = 10  # earlier incidents listed beside one


def service_key(target: dict | None) -> str | None:
    """The service of a stored target (an incident's, or a report's target), or None."""
    if not target:
        return None
    c = target.get("container") or {}
    if c.get("name"):
        pod = "/".join(p for p in (c.get("namespace"), c.get("pod")) if p)
        return f"container {pod + '/' if pod else ''}{c['name']}"
    cgroup = target.get("cgroup")
    kind = target.get("kind")
    if kind == "system":
        return "system"
    if kind == "pid" and target.get("comm"):
        return f"process {target['comm']} in {cgroup or '?'}"
    return f"cgroup {cgroup}" if cgroup else None


def report_service(report: Report) -> str | None:
    return service_key(report.target.model_dump())


def follow_up(report: Report, baseline: Report, folder: str, how: str) -> Report:
    """The report with the earlier one's culprits followed into it."""
    return report.model_copy(update={"verification": compare(baseline, report, Path(folder), how)})


def worth_following(baseline: Report) -> bool:
    """An earlier diagnosis names something to follow: growth, with the code that grows."""
    return baseline.verdict.kind in GROWING and baseline.verdict.culprit.function is not None
