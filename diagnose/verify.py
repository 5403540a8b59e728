"""The workflow's last step: after a fix, the same service diagnosed again over the same period and
compared with an earlier report, stack by stack and for the whole process.

The earlier report (its report.json, read back as the Report it was written from) says what grew
and where: the verdict's culprit and every stack whose outstanding bytes climbed or whose blocks
nothing pointed at. The service is found again by what that report recorded, since a restart gave
it a new pid: its container's name, its command line, its executable, its cgroup, its comm. Each
earlier culprit is then *still leaking* (the new run concluded growth on the same function, or its
stack again has blocks nothing points at, or outstanding bytes that climb), *fixed* (its stack is
gone from the outstanding allocations, or there but levelled with nothing leaked), and a growing
stack the earlier report did not name is *new growth*. No threshold decides: the evidence is the
new run's own verdict (the playbook's), its reachability scan and the trend of each stack."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from memdiag.probes.frame import split_clone
from memdiag.system.processes import read_all_processes
from memdiag.system.trends import LEVEL_OFF_RATIO, MIN_GROWTH_BYTES, growth_trend
from memdiag.system.units import fmt_rate
from pydantic import ValidationError

from .culprit import split_frame
from .errors import UsageError
from .report import Report, StackComparison, StackReport, Verification
from .target import Target, cgroup_target, container_target, pid_target, with_container

MAX_REPORT_BYTES = 64 << 20  # a day's window with every sample kept stays far below this
GROWING = ("leak", "growth")
# How a status reads for scripts: memdiag verify exits with it (0 fixed; docs/verify.md).
EXIT_CODES = {"fixed": 0, "still-leaking": 3, "new-growth": 4, "inconclusive": 5}
_PASSED_OVER = {"allocator", "wrapper", "guessed-wrapper", "runtime", "unknown"}
SIGNATURE_FRAMES = 4  # the culprit and its callers: enough to tell two paths into one function apart


def read_baseline(folder: Path) -> Report:
    """The earlier report in folder (its report.json), or one line saying why it cannot be used."""
    path = folder / "report.json"
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_REPORT_BYTES + 1)
    except FileNotFoundError:
        raise UsageError(f"--baseline {folder}: no report.json there (name a folder memdiag wrote)") from None
    except OSError as e:
        raise UsageError(f"--baseline {folder}: cannot read {path} ({e.strerror or e})") from None
    if len(data) > MAX_REPORT_BYTES:
        raise UsageError(f"--baseline {folder}: {path} is over {MAX_REPORT_BYTES >> 20} MiB: not a memdiag report")
    try:
        return Report.model_validate_json(data)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "the top level"
        raise UsageError(
            f"--baseline {folder}: {path} is not a report of this memdiag version ({where}: {first['msg']})"
        ) from None


def baseline_facts(base: Report) -> dict:
    """What the rules of the new diagnosis know of the earlier one (the playbook's verify rules
    trace allocations whatever the counters say, to follow its stacks)."""
    return {"verify.baseline_kind": base.verdict.kind, "verify.baseline_function": base.verdict.culprit.function}


def find_service(base: Report) -> tuple[Target, str]:
    """The service the earlier report diagnosed, as it runs now, and how it was found."""
    t = base.target
    if t.container is not None and t.container.name:
        try:
            return container_target(t.container.name), f"its container's name, {t.container.name}"
        except UsageError:
            pass  # the container is gone: its process may still run under another name
    if t.kind == "cgroup" and t.cgroup:
        return cgroup_target(t.cgroup), f"its cgroup, {t.cgroup}"
    if t.kind == "system":
        return Target(kind="system"), "the whole system, as before"
    return _find_process(base)


def _find_process(base: Report) -> tuple[Target, str]:
    t = base.target
    procs = read_all_processes()
    ways = [
        ("its command line", lambda p: bool(t.cmdline) and p.cmdline == t.cmdline),
        ("its executable and arguments", lambda p: bool(t.cmdline) and p.cmdline[1:] == t.cmdline[1:]
         and Path(p.cmdline[0]).name == Path(t.cmdline[0]).name if p.cmdline else False),
        ("its name", lambda p: bool(t.comm) and p.comm == t.comm),
    ]  # fmt: skip
    said = " ".join(t.cmdline) or t.comm or t.description
    for how, same in ways:
        found = sorted(pid for pid, p in procs.items() if same(p))
        if len(found) == 1:
            return with_container(pid_target(found[0])), f"{how} ({said}): PID {found[0]}"
        if len(found) > 1:
            listed = ", ".join(f"PID {pid}" for pid in found[:8])
            raise UsageError(f"--baseline: {len(found)} processes match {how} ({said}): {listed}; name one with --pid")
    raise UsageError(f"--baseline: no process runs as {said} now; name the service with --pid, --cgroup or --container")


def signature(frames: list[str], kinds: list[str]) -> tuple[str, ...]:
    """A stack as function names, from its first frame worth reading up: what stays the same when
    the program is rebuilt (offsets and load addresses do not)."""
    names = []
    for i, frame in enumerate(frames):
        if i < len(kinds) and kinds[i] in _PASSED_OVER and not names:
            continue
        fn, _module = split_frame(frame)  # the function alone: no offset, file:line or clone detail
        names.append(split_clone(fn)[0] if fn else frame)  # a report of before clones were folded too
        if len(names) == SIGNATURE_FRAMES:
            break
    return tuple(names)


class _Seen:
    """One stack of a report: its signature, growth over its probe's run and what the scan found."""

    def __init__(self, s: StackReport, seconds: float | None):
        self.stack = s
        self.key = signature(s.frames, s.frame_kinds)
        self.function = self.key[0] if self.key else None
        self.leaked = s.reach.leaked_count if s.reach is not None else None
        points = list(zip(_times(len(s.series), seconds), s.series, strict=False))
        self.trend = growth_trend(points) if len(points) >= 3 and seconds else None
        self.rate = (s.series[-1] - s.series[0]) / seconds if s.series and seconds else None

    @property
    def growing(self) -> bool:
        return bool(self.leaked) or (self.trend is not None and self.trend.shape == "climbing")


def _times(n: int, seconds: float | None) -> list[float]:
    """The series' sample times: evenly spread over the probe's run (memleak samples at a fixed step)."""
    return [seconds * i / (n - 1) for i in range(n)] if n > 1 and seconds else []


def _stacks(report: Report) -> list[_Seen]:
    runs = {p.name: p.duration_s for p in report.probes}
    traced = _allocation_probes(report)
    return [_Seen(s, runs.get(s.probe)) for s in report.stacks if s.probe in traced]


def _culprits(base: Report) -> list[_Seen]:
    """What the earlier report said grows: the verdict's stack and every stack that grew."""
    seen = _stacks(base)
    named = signature(base.verdict.culprit.stack, base.verdict.culprit.frame_kinds)
    out = [s for s in seen if s.growing or (base.verdict.kind in GROWING and s.key == named)]
    return out


def _match(before: _Seen, after: list[_Seen]) -> _Seen | None:
    """The same stack in the new report: its whole signature, else the same function."""
    return next((s for s in after if s.key == before.key), None) or next(
        (s for s in after if s.function == before.function), None
    )


def compare(base: Report, new: Report, baseline: Path, found_by: str) -> Verification:
    """Each earlier culprit fixed or still leaking, new growth where another stack grows, and the
    whole process's memory rate before and after."""
    after = _stacks(new)
    new_fn = new.verdict.culprit.function if new.verdict.kind in GROWING else None
    rows: list[StackComparison] = []
    matched: set[int] = set()
    for c in _culprits(base):
        m = _match(c, after)
        if m is not None:
            matched.add(id(m))
        still = (new_fn is not None and new_fn == c.function) or (m is not None and m.growing)
        rows.append(_row(c, m, "still-leaking" if still else "fixed", _traced(new)))
    named = {r.function for r in rows}
    for s in after:
        if id(s) not in matched and s.growing and s.function not in named:
            rows.append(_row(None, s, "new-growth", True))
    if new_fn is not None and new_fn not in {r.function for r in rows}:
        rows.append(
            StackComparison(function=new_fn, status="new-growth", note=f"the new run's {new.verdict.kind} verdict")
        )
    status = _status(rows, base, new)
    return Verification(
        status=status,
        summary=_summary(status, rows, base, new),
        baseline=str(baseline),
        baseline_target=base.target.description,
        baseline_verdict=base.verdict.kind,
        baseline_function=base.verdict.culprit.function,
        found_by=found_by,
        stacks=rows,
        rss_rate_before=_rss_rate(base),
        rss_rate_after=_rss_rate(new),
        window_before_s=base.window.ended - base.window.started,
        window_after_s=new.window.ended - new.window.started,
    )


def _allocation_probes(report: Report) -> set[str]:
    """The report's probes whose stacks are allocations outstanding (their bytes are what a leak keeps)."""
    return {p.name for p in report.probes if p.stacks == "allocations"}


def _traced(report: Report) -> bool:
    traced = _allocation_probes(report)
    return any(p.name in traced and p.status in ("ok", "partial") for p in report.probes)


def _row(before: _Seen | None, after: _Seen | None, status: str, traced: bool) -> StackComparison:
    one = before or after
    assert one is not None
    note = ""
    if after is None and status != "new-growth":
        note = "its stack holds no outstanding blocks now" if traced else "allocations were not traced now"
    return StackComparison(
        function=one.function,
        signature=list(one.key),
        status=status,  # type: ignore[arg-type]
        before_rate=before.rate if before else None,
        after_rate=after.rate if after else None,
        before_leaked=before.leaked if before else None,
        after_leaked=after.leaked if after else None,
        after_shape=after.trend.shape if after is not None and after.trend is not None else None,
        note=note,
    )


def _status(
    rows: list[StackComparison], base: Report, new: Report
) -> Literal["fixed", "still-leaking", "new-growth", "inconclusive"]:
    if any(r.status == "still-leaking" for r in rows):
        return "still-leaking"
    if any(r.status == "new-growth" for r in rows):
        return "new-growth"
    if not _traced(new) and new.verdict.kind not in ("healthy", "cache"):
        return "inconclusive"  # nothing says the earlier stacks are gone: allocations were not traced
    return "fixed"


def _summary(status: str, rows: list[StackComparison], base: Report, new: Report) -> str:
    parts = []
    for r in rows:
        fn = f"`{r.function}`" if r.function else "a stack"
        rates = f"outstanding {fmt_rate(r.before_rate)} before, {fmt_rate(r.after_rate)} now"
        if r.status == "still-leaking":
            parts.append(f"{fn} still leaks ({rates})" if r.after_rate is not None else f"{fn} still grows")
        elif r.status == "fixed":
            now = f"{fmt_rate(r.after_rate)} now" if r.after_rate is not None else r.note
            parts.append(f"{fn} is fixed (outstanding {fmt_rate(r.before_rate)} before, {now})")
        else:
            parts.append(
                f"{fn} grows now and did not before" + (f" ({fmt_rate(r.after_rate)})" if r.after_rate else "")
            )
    if status == "inconclusive":
        parts.append("allocations were not traced in the new run, so the earlier stacks could not be followed")
    if not rows:
        parts.append(f"the earlier report ({base.verdict.kind}) named no growing stack and none grows now")
    return "; ".join(parts) + f"; the new diagnosis: {new.verdict.kind}"


def _rss_rate(r: Report) -> float | None:
    t = r.counters.trends.get("process.rss") or r.counters.trends.get("cgroup.usage")
    return t.rate_per_s if t is not None else None


def compare_scene(scene: dict, new: Report, incident: str, victim: str, found_by: str) -> Verification:
    """The restarted service's diagnosis against what serve's flight recorder saw grow before the kill
    (serve/scene.py), where no earlier diagnosis of it exists: growing again (with the function the
    recorder's fault sample named, or another), or no longer growing at the pace that filled the limit
    over a window long enough for that pace to show; else inconclusive. The scene is one that saw
    growth (serve/worker.py's _scene_of)."""
    # one quantity before and after: the victim's RSS over the climb, the restarted process's RSS now
    first, last, climb = scene.get("victim_rss_first"), scene.get("victim_rss_last"), scene.get("climb_s")
    before = (last - first) / climb if first is not None and last is not None and climb else None
    rss = new.counters.trends.get("process.rss")
    after = rss.rate_per_s if rss is not None else None
    window = new.window.ended - new.window.started
    fn = scene.get("fault_function")
    new_fn = new.verdict.culprit.function if new.verdict.kind in GROWING else None
    rows = []
    if new.verdict.kind in GROWING:
        same = fn is None or new_fn is None or new_fn == fn
        status: Literal["fixed", "still-leaking", "new-growth", "inconclusive"] = (
            "still-leaking" if same else "new-growth"
        )
        rows.append(
            StackComparison(function=new_fn or fn, status=status, note=f"the new run's {new.verdict.kind} verdict")
        )
        said = f"it grows again ({new.verdict.kind}" + (f" in `{new_fn}`" if new_fn else "") + ")"
    elif (
        new.verdict.kind == "oom"
        and new.target.pid is not None
        and new.verdict.culprit.pid == new.target.pid
        and after is not None
        and after * window >= MIN_GROWTH_BYTES
    ):
        # the restarted process climbed until the kernel killed it again: the same end, seen in its
        # window (a growth under the trend code's floor is no climb; a target of no pid is no process)
        status, said = "still-leaking", "it grows again and was killed again at its limit"
    elif before and after is not None and window * before > 4 * MIN_GROWTH_BYTES and after < LEVEL_OFF_RATIO * before:
        status, said = "fixed", "it no longer grows at the pace that filled the limit"
    else:
        status, said = "inconclusive", "its window does not tell whether it grows the way it did"
    pace = f"{fmt_rate(before)} before the kill" if before is not None else "no climb of it recorded before the kill"
    now = f"{fmt_rate(after)} now" if after is not None else "unknown now"
    return Verification(
        status=status,
        summary=f"{said}: its RSS {pace}, {now}; the new diagnosis: {new.verdict.kind}",
        baseline=f"incident {incident} (the flight recorder's samples before the kill)",
        baseline_target=victim,
        baseline_verdict="oom",
        baseline_function=fn,
        found_by=found_by,
        stacks=rows,
        rss_rate_before=before,
        rss_rate_after=after,
        window_after_s=window,
    )
