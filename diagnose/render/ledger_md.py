"""report.md's ledgers: each total (the process's RSS, its cgroup's usage, the host's MemTotal) with
the lines it is made of at the window's start and end, each line's change and share of the total's
change, the residual as a line of its own; the figures beside it (working set, page tables, kernel
stacks); the process's descriptors by type; the tmpfs mounts and the files that fill them."""

from __future__ import annotations

from memdiag.system.ledger import ANON_RESIDUAL_LABEL
from memdiag.system.units import fmt_bytes

from ..ledgers import fmt_signed, shares_meaningful
from ..report import LedgerReport, LedgerRow, Report
from .mdtable import table
from .sparkline import sparkline
from .text import one_line, prose

_HEADS = {"process": "the process's RSS", "cgroup": "its cgroup's usage", "host": "the host's MemTotal"}


def _heading(level: str, what: str, led: LedgerReport) -> list[str]:
    """A heading naming no text of the target's (a comm, a cgroup's name: said on the line below it,
    escaped, where it cannot open a heading or a table of its own)."""
    return [f"{level} {what}", "", f"Of {prose(one_line(led.subject))}.", ""]


def _share(row: LedgerRow, total: int | None) -> str:
    g = row.growth
    if g is None or not total or not row.summed:
        return ""
    return f"{100 * g / total:.0f}%"


def _detail(row: LedgerRow) -> str:
    return ", ".join(f"{one_line(name)} {fmt_bytes(n)}" for name, n in row.parts)  # names of the target's


def _row(row: LedgerRow, total: int | None) -> list[str]:
    label = row.label + (" (estimate)" if row.estimate and "estimate" not in row.label else "")
    if not row.summed:
        label = f"beside: {label}"
    return [
        label,
        fmt_bytes(row.first),
        fmt_bytes(row.last),
        fmt_signed(row.growth),
        _share(row, total),
        f"`{sparkline([float(v) for v in row.series])}`" if len(row.series) > 1 else "",
        _detail(row),
    ]


def _one(led: LedgerReport) -> list[str]:
    growth = led.total_growth if shares_meaningful(led) else None  # no share where the total barely moved
    rows = [_row(r, growth) for r in led.rows if r.summed]
    total = [
        f"= {led.total_label} (the sum)",
        fmt_bytes(led.total_first),
        fmt_bytes(led.total_last),
        fmt_signed(led.total_growth),
        "100%" if growth else "",
        "",
        "",
    ]
    rows.append(total)
    rows += [_row(r, growth) for r in led.rows if not r.summed]
    head = ["line", "first", "last", "change", "share of change", "trend", "detail (at the end)"]
    lines = _heading("###", f"Ledger: {_HEADS[led.scope]}", led) + table(head, rows) + [""]
    if led.unknown:
        lines += [f"Not said by this kernel's counters (unknown, not zero): {', '.join(led.unknown)}.", ""]
    return lines + _detail_moment(led) + _anon_split(led) + _descriptors(led)


def _detail_moment(led: LedgerReport) -> list[str]:
    """When the detail column was read (once, as the window closed, after the last sample) and the
    lines' values then: what its parts add up to, not the `last` column's."""
    if led.detail_at_s is None:
        return []
    t = led.detail_totals
    said = [f"{led.total_label} {fmt_bytes(t.get('total'))}"]
    said += [f"{r.label} {fmt_bytes(t[r.key])}" for r in led.rows if r.key in t and r.key != "total"]
    return [
        f"The detail column was read as the window closed, {led.detail_at_s:.1f} s into it (after the last sample); "
        f"the lines were then: {', '.join(said)}.",
        "",
    ]


def _anon_split(led: LedgerReport) -> list[str]:
    """The anonymous memory by who holds it: each part with its source, the residual, what was not read."""
    s = led.anon_split
    if s is None:
        return []

    def share(n: int | None) -> str:
        return f"{100 * n / s.total:.0f}%" if n is not None and s.total else ""

    rows = [
        [
            p.label + (" (estimate)" if p.estimate and "estimate" not in p.label else ""),
            fmt_bytes(p.bytes),
            share(p.bytes),
            p.source,
        ]
        for p in sorted(s.parts, key=lambda p: -p.bytes)
    ]
    rows.append(
        [
            ANON_RESIDUAL_LABEL,
            fmt_bytes(s.residual) if s.residual is not None else "unknown",
            share(s.residual),
            "the rest",
        ]
    )
    rows.append(
        ["= anonymous memory (the sum)", fmt_bytes(s.total), "100%" if s.total else "", "RssAnon, read with the parts"]
    )
    at = f", {s.at_s:.1f} s into the window" if s.at_s is not None else ""
    moved = f" RssAnon moved by {fmt_signed(s.moved)} while they were read." if s.moved else ""
    lines = _heading("####", "Its anonymous memory by who holds it", led)
    lines += [f"Read once as the window closed{at}, with the process's anonymous memory then.{moved}", ""]
    lines += table(["part", "bytes", "share", "source"], rows) + [""]
    if s.residual is not None and s.residual < 0:
        lines += ["The parts exceed the anonymous memory: their estimates overcount by the residual.", ""]
    if s.unread:
        lines += ["Not read (in the residual, unknown rather than zero): " + "; ".join(s.unread) + ".", ""]
    return lines


def _descriptors(led: LedgerReport) -> list[str]:
    a, b = led.counts_first, led.counts_last
    kinds = [k for k in b if k not in ("total", "more")] + [k for k in a if k not in b and k not in ("total", "more")]
    if not kinds:
        return []
    kinds.sort(key=lambda k: (-(b.get(k, 0) - a.get(k, 0)), -b.get(k, 0)))
    rows = [[k, str(a.get(k, 0)), str(b.get(k, 0)), f"{b.get(k, 0) - a.get(k, 0):+d}"] for k in kinds]
    n0, n1 = a.get("total", 0), b.get("total", 0)
    rows.append(["all", str(n0), str(n1), f"{n1 - n0:+d}"])
    more = ["More descriptors are open than were read (the read stops at 65,536).", ""] if b.get("more") else []
    head = ["type", "first", "last", "change"]
    return _heading("####", "Its descriptors", led) + table(head, rows) + [""] + more


def _shm(report: Report) -> list[str]:
    if not report.counters.shm:
        return []
    rows = []
    for m in report.counters.shm:
        change = fmt_signed(m.used_last - m.used_first) if m.used_first is not None else "–"
        pats = "; ".join(
            f"{p} {f1} files {fmt_bytes(b1)} ({f1 - f0:+d}, {fmt_signed(b1 - b0)})"
            for p, f0, f1, b0, b1 in m.patterns[:3]
        )
        size = fmt_bytes(m.size) if m.size else "–"
        rows.append(
            [one_line(m.mount_point), fmt_bytes(m.used_first), fmt_bytes(m.used_last), change, size, one_line(pats)]
        )
    head = ["tmpfs mount", "first", "last", "change", "size", "files by pattern (at the end; change)"]
    return ["### Shared memory in tmpfs", ""] + table(head, rows) + [""]


def _sysv(report: Report) -> list[str]:
    """The System V segments the target made in the window and left: no process's RSS counts them
    once detached."""
    if not report.counters.sysv:
        return []
    rows = [
        [str(g.shmid), "IPC_PRIVATE" if g.key == 0 else f"{g.key:#x}", fmt_bytes(g.size),
         fmt_bytes(g.rss) if g.rss is not None else "–", str(g.cpid), str(g.nattch)]
        for g in report.counters.sysv
    ]  # fmt: skip
    head = ["shmid", "key", "size", "resident", "creator (PID)", "attached"]
    return ["### System V segments made in the window, still there", ""] + table(head, rows) + [""]


def ledger_evidence(report: Report) -> list[str]:
    """The ledgers, then the tmpfs mounts."""
    out: list[str] = []
    for led in report.counters.ledgers:
        out += _one(led)
    if report.counters.oom_ledger is not None:
        out += _at_kill(report.counters.oom_ledger)
    return out + _shm(report) + _sysv(report)


def _at_kill(led: LedgerReport) -> list[str]:
    """The OOM cgroup's usage at the kill, from the kernel's own report: what filled it."""
    rows = []
    for r in led.rows:
        share = f"{100 * r.last / led.total_last:.0f}%" if r.summed and r.last and led.total_last else ""
        rows.append([r.label if r.summed else f"beside: {r.label}", fmt_bytes(r.last), share])
    rows.insert(
        sum(1 for r in led.rows if r.summed), [f"= {led.total_label} (the sum)", fmt_bytes(led.total_last), "100%"]
    )
    lines = _heading("###", "Ledger: the OOM cgroup's usage at the kill", led) + [
        "From the kernel's report of the kill.",
        "",
    ]
    lines += table(["line", "at the kill", "share"], rows) + [""]
    if led.unknown:
        lines += [f"Not said by this kernel's report (unknown, not zero): {', '.join(led.unknown)}.", ""]
    return lines
