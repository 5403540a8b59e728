"""report.md: the verdict first, then the evidence, what to run next, probes, overhead, caveats.
The evidence's counter tables are written by counters_md.py."""

from __future__ import annotations

from memdiag.probes.frame import clone_label
from memdiag.rules.catalog import FACTS
from memdiag.system.units import fmt_bytes, fmt_duration, fmt_number, fmt_rate, format_quantity

from ..report import Report
from .counters_md import counter_evidence
from .mdtable import table, utc
from .sparkline import sparkline
from .text import code, flattened, prose


def _reach_line(r) -> str:
    """One stack's blocks at the reachability scan: leaked, anchored and by what."""
    anchor = f", most of it ({fmt_bytes(r.anchor_bytes)}) reachable from {r.anchor}" if r.anchor else ""
    return (
        f"at the scan: **leaked** {fmt_number(r.leaked_count)} blocks ({fmt_bytes(r.leaked_bytes)}; "
        f"{fmt_number(r.unreferenced_count)} not pointed at by another leaked block) · **anchored** "
        f"{fmt_number(r.anchored_count)} blocks ({fmt_bytes(r.anchored_bytes)}){prose(anchor)}"
    )


_KIND_NOTES = {
    "allocator": "allocator",
    "wrapper": "wrapper",
    "guessed-wrapper": "wrapper, guessed",
    "runtime": "runtime",
    "interpreter": "interpreter",
    "culprit": "culprit",
}


def _kind_note(kind: str) -> str:
    """What a frame is, after it: passed over (allocator, wrapper, runtime) or the one named."""
    note = _KIND_NOTES.get(kind)
    return f" *({note})*" if note else ""


def _culprit_stack(c) -> str:
    """The stack from the leaf to two frames past the named one (at least five), each marked."""
    kinds = c.frame_kinds
    named = next((i for i, k in enumerate(kinds) if k == "culprit"), None)  # else an interpreter frame
    named = next((i for i, k in enumerate(kinds) if k == "interpreter"), None) if named is None else named
    shown = max(5, named + 3) if named is not None else 5
    parts = []
    for i, frame in enumerate(c.stack[:shown]):
        kind = kinds[i] if i < len(kinds) else ""
        text = f"**{code(frame)}**" if i == named else code(frame)
        parts.append(text + _kind_note(kind if i != named or kind == "interpreter" else ""))
    more = len(c.stack) - shown
    return " ← ".join(parts) + (f" ← … {more} more" if more > 0 else "")


def _overhead_lines(o, probes=()) -> list[str]:
    window = f" over the {fmt_duration(o.window_s)} window" if o.window_s else ""
    lines = ["## Overhead", "", f"- Budget: {o.budget_percent:g}% of the target's time{window}"]
    if o.estimated_percent is not None:
        of = f" ({o.estimate_of})" if o.estimate_of else ""
        lines += [f"- Estimated before attaching{of}: {o.estimated_percent:.2f}%"]
    if o.measured_percent is None:
        return lines + ["- Measured: nothing to measure (no probe attached; counters read from /proc)"]
    lines += [f"- Measured on the target: {o.measured_percent:.2f}% (the probe table's overhead column, summed)"]
    if o.tracing_probes_percent is not None or o.tracing_cpu_percent is not None:
        parts = []
        if o.tracing_probes_percent is not None:
            parts.append(f"its probes' hits x trap cost + BPF run time {o.tracing_probes_percent:.2f}%")
        if o.tracing_cpu_percent is not None:
            parts.append(f"the target's CPU time above its rate before the attach {o.tracing_cpu_percent:.2f}%")
        how = "the first counts, raised to the second up to twice it"
        lines += [f"- Allocation tracing, measured two ways ({how}): {'; '.join(parts)}"]
    for name, what, percent, cpu in o.measured_otherwise:
        beside = f"; beside it, the target's CPU time above its rate before, {cpu:.2f}%" if cpu is not None else ""
        shown = f"{percent:.2f}%" if percent is not None else "not measured"
        lines += [f"- {name}: {what}, {shown}{beside}"]
    # the rows not measured on the target itself: their overhead is their BPF run time, or for a
    # reader of the target's memory (no BPF) the time its reads held the target's memory map
    shown = [p for p in probes if not p.on_target and p.overhead_percent]
    readers = [p.name for p in shown if p.reads]
    if readers:
        lines += [
            f"- {', '.join(readers)}: memdiag's time reading the target's memory or maps (nothing stopped): an "
            "upper bound of the time they held its memory map for reading"
        ]
    others = [p.name for p in shown if not p.reads]
    wide = [p.name for p in shown if not p.reads and p.host_wide]
    if others:
        every = (
            f" (every syscall on the host for {' and '.join(wide)}, which filter inside the program)" if wide else ""
        )
        lines += [
            f"- {', '.join(others)}: their BPF run time for every process they fire for{every}: "
            "an upper bound of the target's share"
        ]
    return lines


def _container_lines(report: Report) -> list[str]:
    """The target in its container's and pod's terms: names, ids, image, limit and OOM kills."""
    t, lines = report.target, []
    c = t.container
    if c is not None:
        named = f"**{prose(c.name)}**, " if c.name else ""
        image = f", image {code(c.image)}" if c.image else ""
        lines += [f"- Container: {named}id {code(c.id[:12])} (full {code(c.id)}), {c.runtime}{image}"]
    pod = t.pod
    uid = pod.uid if pod is not None else (c.pod_uid if c is not None else None)
    name = pod.name if pod is not None else (c.pod if c is not None else None)
    namespace = pod.namespace if pod is not None else (c.namespace if c is not None else None)
    if uid or name:
        shown = code(f"{namespace}/{name}" if namespace else name) + " " if name else ""
        qos = f", {pod.qos}" if pod is not None and pod.qos else ""
        lines += [f"- Pod: {shown}(uid {code(uid or 'unknown')}{qos})"]
    if c is None and pod is not None and pod.containers:
        members = [f"{code(m.name)} ({m.short_id})" if m.name else code(m.short_id) for m in pod.containers]
        lines += [f"- Containers of the pod: {', '.join(members)}"]
    holder = c if c is not None else pod
    if holder is not None:
        limit = fmt_bytes(holder.limit_bytes) if holder.limit_bytes is not None else "none"
        # the counters are those of the target's own cgroup: beside another cgroup's path (a pod's, its
        # largest process being in one of its containers) they would be untrue
        own = report.target.cgroup == holder.cgroup
        rows = report.counters.rows if own else []
        kills = next((r.last for r in rows if r.scope == "cgroup" and r.name == "oom_kill"), None)
        killed = f", OOM kills {fmt_number(kills)} (the cgroup's counter)" if kills is not None else ""
        whose = "Container" if c is not None else "Pod"
        lines += [f"- {whose} memory: limit {limit}{killed}, cgroup {code(holder.cgroup)}"]
    if c is not None and c.host_pid is not None:
        row = next((r for r in report.counters.processes if r.pid == c.host_pid), None)
        inside = f", PID {row.ns_pid} in the container" if row and row.ns_pid not in (None, row.pid) else ""
        lines += [f"- Main process: PID {c.host_pid} on the host{inside}"]
    return lines


def _probe_figures(report: Report) -> list[str]:
    """What each probe measured that the rules read, and what it could not record (lost)."""
    rows = []
    for p in report.probes:
        for name, value in p.figures.items():
            kind = FACTS[name].kind if name in FACTS else "number"
            rows.append([p.name, f"`{name}`", format_quantity(value, kind)])
        rows += [[p.name, f"lost: {cause}", fmt_number(n)] for cause, n in p.lost.items()]
    if not rows:
        return []
    return ["### Probe figures", ""] + table(["probe", "figure", "value"], rows) + [""]


def _culprit_lines(culprit) -> list[str]:
    who = []
    if culprit.pid is not None:
        who.append(f"PID {culprit.pid}" + (f" ({prose(culprit.comm)})" if culprit.comm else ""))
    if culprit.cgroup:
        who.append(f"cgroup {code(culprit.cgroup)}")
    if culprit.function:
        at = f" at {code(culprit.source)}" if culprit.source else ""
        clone = f" ({prose(clone_label(culprit.clone))})" if culprit.clone else ""
        who.append(f"function **{code(culprit.function)}**{at}{clone}")
    if culprit.stack:
        who.append("stack " + _culprit_stack(culprit))
    lines = [f"- Culprit: {', '.join(who)}"] if who else []
    if culprit.guessed:
        lines += [
            "- A frame marked *wrapper, guessed* was passed over because its code only forwards what the "
            "allocator returned (read from its instructions, not from the playbook's `wrappers:` list)"
        ]
    return lines


def _heading(report: Report) -> list[str]:
    """Title, verdict, interruption, culprit, target and window."""
    v, t, w = report.verdict, report.target, report.window
    cut = report.interrupted
    partial = " (partial: interrupted)" if cut is not None else ""
    if report.interim is not None:
        partial = f" (so far: {report.interim}; the window still runs)"
    lines = [f"# memdiag: {v.kind}{partial} — {prose(t.description)}", ""]
    lines += [f"**Verdict ({v.kind}, confidence {v.confidence:.0%}{partial}):** {prose(v.summary)}", ""]
    if cut is not None:
        lines += [
            f"- **Interrupted** by {cut.signal} during {prose(cut.phase)}, {fmt_duration(cut.at_s)} into the "
            "diagnosis: "
            "this report is partial and its verdict rests only on what was gathered before"
        ]
        lines += [f"- Not gathered: {prose('; '.join(cut.not_gathered) or 'nothing')}"]
    lines += _culprit_lines(v.culprit)
    target_line = f"- Target: {prose(t.description)}"
    if t.cmdline:
        target_line += f" — {code(' '.join(t.cmdline)[:200])}"
    if t.cgroup and t.kind == "pid":
        target_line += f" — memory cgroup {code(t.cgroup)} (v{t.cgroup_version})"
    lines += [target_line]
    if t.runtime_detail:
        lines += [f"- Runtime: {prose(t.runtime_detail)}"]
    lines += _container_lines(report)
    thinned = ""
    if w.thinned:
        thinned = (
            f"; {w.thinned:,} older samples dropped to bound memdiag's memory, all in the first "
            f"{fmt_duration(w.thinned_before_s)}: the older, the coarser"
        )
    lines += [
        f"- Window: {utc(w.started)} to {utc(w.ended)} ({fmt_duration(w.ended - w.started)} of "
        f"{fmt_duration(w.requested_s)} asked, {w.samples} samples{thinned})"
    ]
    if w.target_exited_at is not None:
        reused = "; its pid then belonged to another process, which memdiag left alone" if w.target_pid_reused else ""
        lines += [f"- Target exited at {utc(w.target_exited_at)}{reused}"]
    if w.target_execd_at is not None:
        lines += [
            f"- Target exec'd {code(w.target_exec or 'another program')} at {utc(w.target_execd_at)}: the program "
            "diagnosed ended there, and nothing of the new one was observed"
        ]
    return lines


def _verification(report: Report) -> list[str]:
    """memdiag verify: the earlier report's culprits, each fixed or still leaking, and new growth."""
    v = report.verification
    if v is None:
        return []
    lines = ["", "## Verification", "", f"**{v.status}**: {prose(v.summary)}", ""]
    lines += [
        f"- Baseline: {code(v.baseline)} — {prose(v.baseline_target)}, verdict {v.baseline_verdict}"
        + (f" naming {code(v.baseline_function)}" if v.baseline_function else ""),
        f"- Found again by {prose(v.found_by)}",
        f"- Memory of the whole target: {fmt_rate(v.rss_rate_before)} over {fmt_duration(v.window_before_s)} "
        f"before, {fmt_rate(v.rss_rate_after)} over {fmt_duration(v.window_after_s)} now",
        "",
    ]
    if v.stacks:
        rows = [
            [
                code(r.function or "?"),
                r.status,
                fmt_rate(r.before_rate) if r.before_rate is not None else "—",
                fmt_rate(r.after_rate) if r.after_rate is not None else "—",
                _count(r.before_leaked),
                _count(r.after_leaked),
                r.after_shape or r.note or "—",
            ]
            for r in v.stacks
        ]
        header = ["stack", "status", "outstanding before", "now", "leaked before", "now", "its bytes now"]
        lines += table(header, rows) + [""]
    return lines


def _count(n: int | None) -> str:
    return f"{n:,}" if n is not None else "—"


def _clock(seconds: float) -> str:
    """A moment of the window, as a clock reads it from its start: 0:00:30, 6:00:00."""
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def _cycles(report: Report) -> list[str]:
    """A long window, cycle by cycle: the target's memory at each cycle's end and the allocation
    stacks its probes recorded (window.svg draws the same figures)."""
    if not report.cycles:
        return []
    rows = []
    for c in report.cycles:
        stacks = "; ".join(
            f"{code(s.function or '?')} {fmt_bytes(s.bytes)}"
            + (f" ({s.leaked_count:,} blocks leaked)" if s.leaked_count else "")
            for s in c.stacks
            if s.bytes or s.leaked_count
        )
        rows.append(
            [
                str(c.index + 1),
                f"{_clock(c.start_s)}–{_clock(c.end_s)}",
                fmt_bytes(c.memory),
                ", ".join(c.probes) or "—",
                stacks or "—",
            ]
        )
    header = ["cycle", "from–to", "memory at its end", "probes", "allocation stacks (outstanding at the cycle's end)"]
    return (
        ["### The window, cycle by cycle", "", "![memory over the window](window.svg)", ""] + table(header, rows) + [""]
    )


def _findings(report: Report) -> list[str]:
    if not report.findings:
        return []
    return ["### Findings", ""] + [f"- **{prose(f.id)}**: {prose(f.summary)}" for f in report.findings] + [""]


def _stacks(report: Report) -> list[str]:
    if not report.stacks:
        return []
    lines = ["### Stacks", ""]
    for st in report.stacks:
        trend = f" — outstanding `{sparkline([float(v) for v in st.series])}`" if st.series else ""
        # a stack of events that hold no bytes of their own (descriptors) is headed by its count alone
        head = f"**{fmt_bytes(st.bytes)}** " if st.bytes else ""
        lines += [f"- {head}({st.probe}: {prose(st.detail)}){trend}"]
        if st.reach is not None:
            lines += [f"  - {_reach_line(st.reach)}"]
        kinds = st.frame_kinds
        lines += [
            f"  {i}. {code(frame)}{_kind_note(kinds[i - 1] if i <= len(kinds) else '')}"
            for i, frame in enumerate(st.frames[:8], 1)
        ]
        if len(st.frames) > 8:
            lines += [f"  - … {len(st.frames) - 8} more frames"]
    return lines + [""]


def _sections(report: Report) -> list[str]:
    """The probes' own parts of the evidence, each under its heading: its lines, then its table."""
    lines = []
    for sec in report.sections:
        lines += [f"### {prose(sec.title)}", ""]
        lines += [f"- {prose(line)}" for line in sec.lines]
        if sec.lines and sec.header:
            lines += [""]
        if sec.header:
            lines += table(sec.header, sec.rows)
        lines += [""]
    return lines


def _evidence(report: Report) -> list[str]:
    """What the verdict rests on: findings, stacks, the probes' sections, trends, counters, processes,
    OOM kills, slab, swap."""
    return (
        ["", "## Evidence", ""]
        + _findings(report)
        + _stacks(report)
        + _sections(report)
        + _cycles(report)
        + counter_evidence(report)
    )


def _next_steps(report: Report) -> list[str]:
    steps = [f"{i}. {prose(step)}" for i, step in enumerate(report.next_steps, 1)]
    return ["## What to run next", ""] + (steps or ["Nothing: no further step is needed."]) + [""]


def _trail(report: Report) -> list[str]:
    if not report.trail:
        return []
    shown = [t for t in report.trail if t.kind != "rule" or t.state in ("fired", "skipped", "error")]
    quiet = [t.name for t in report.trail if t.kind == "rule" and t.state == "not-fired"]
    # "why not a leak?" is answered by the rules that read the facts and did not fire: named here,
    # each with the facts it read in report.json's trail
    unfired = []
    if quiet:
        facts = "the facts each read are in report.json's trail"
        unfired = [f"- Rules that read their facts and did not fire ({len(quiet)}; {facts}): {', '.join(quiet)}", ""]
    return (
        ["## What memdiag ran and why", ""]
        + table(
            ["at", "step", "name", "outcome", "why"],
            [[f"{t.at_s:.0f} s", t.kind, t.name, t.state, t.reason] for t in shown],
        )
        + [""]
        + unfired
    )


def _probes(report: Report) -> list[str]:
    """The probes table, what they measured, and what they cost."""
    lines = ["## Probes", ""]
    lines += table(
        ["probe", "status", "method", "time", "events", "overhead", "reason"],
        [
            [
                p.name,
                p.status,
                p.method or "–",
                fmt_duration(p.duration_s) if p.duration_s is not None else "–",
                fmt_number(p.events) if p.events is not None else "–",
                f"{p.overhead_percent:.2f}%" if p.overhead_percent is not None else "–",
                p.reason,
            ]
            for p in report.probes
        ],
    ) + [""]
    lines += _probe_figures(report)
    lines += _overhead_lines(report.overhead, report.probes)
    if report.budget_decision:
        lines += [f"- Allocation tracing: {prose(report.budget_decision)}"]
    return lines + [""]


def _caveats(report: Report) -> list[str]:
    if not report.caveats:
        return []
    return ["## Caveats", ""] + [f"- {prose(c)}" for c in report.caveats] + [""]


def render_markdown(report: Report) -> str:
    report = flattened(report)  # nothing from outside breaks a line: no heading, row or block of its own
    lines = _heading(report) + _verification(report) + _evidence(report) + _next_steps(report) + _trail(report)
    lines += _probes(report) + _caveats(report)
    lines += ["---", f"memdiag {report.memdiag_version}", ""]
    return "\n".join(lines)
