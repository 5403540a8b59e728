"""window.svg: a long window's curve — the target's memory over the whole window (the counters'
series, as the Trends table has them, and a JVM's live set after each collection); per cycle, the
bytes each allocation stack's trace in that cycle left outstanding at the cycle's end (a dot, filled
where nothing pointed at its blocks); and for a stack that leaked, its leaked bytes summed cycle
after cycle (a solid line: blocks nothing points at are never freed), so a leak that grows in some
phases and a cache that fills and levels are seen apart. Self-contained SVG."""

from __future__ import annotations

import html
import zlib

from memdiag.system.units import fmt_bytes

from ..report import Report

WIDTH, HEIGHT, PAD_L, PAD_R, PAD_T, PAD_B = 1000, 360, 70, 200, 30, 40
SERIES = ("process.rss", "cgroup.usage")  # the target's own memory, as the Trends table names it
# what a runtime says it holds, drawn beside it: a JVM's live set after each collection
RUNTIME_SERIES = ("jvm.live_set",)
MAX_FUNCTIONS = 5  # stacks drawn, the heaviest over the window first


def _color(name: str) -> str:
    h = zlib.crc32(name.encode())
    return f"hsl({h % 360},65%,40%)"


def render_window(report: Report) -> str:
    """The chart, or a one-line SVG saying there is none (a window watched in one go)."""
    title = f"memory over the window — {report.target.description}"
    memory = next(((n, report.counters.series[n]) for n in SERIES if report.counters.series.get(n)), None)
    stacks = _stack_points(report)
    if not report.cycles or (memory is None and not stacks):
        return (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="40"><text x="10" y="25" '
            f'font-family="sans-serif" font-size="14">{html.escape(title)}: no cycles recorded</text></svg>\n'
        )
    span = max(report.window.ended - report.window.started, report.cycles[-1].end_s, 1.0)
    cumulated = {fn: _cumulated(pts) for fn, pts in stacks.items() if any(leaked for _, _, leaked in pts)}
    runtime = [(n, report.counters.series[n]) for n in RUNTIME_SERIES if report.counters.series.get(n)]
    values = ([v for _, v in memory[1]] if memory else []) + [b for pts in stacks.values() for _, b, _ in pts]
    values += [v for _, pts in runtime for _, v in pts]
    values += [b for pts in cumulated.values() for _, b in pts]
    peak = max([*values, 1.0])
    plot_w, plot_h = WIDTH - PAD_L - PAD_R, HEIGHT - PAD_T - PAD_B

    def x(t: float) -> float:
        return PAD_L + plot_w * t / span

    def y(v: float) -> float:
        return PAD_T + plot_h * (1 - v / peak)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif" '
        'font-size="11">',
        f'<text x="{PAD_L}" y="18" font-size="14">{html.escape(title)}</text>',
        f'<line x1="{PAD_L}" y1="{PAD_T + plot_h}" x2="{PAD_L + plot_w}" y2="{PAD_T + plot_h}" stroke="#999"/>',
        f'<line x1="{PAD_L}" y1="{PAD_T}" x2="{PAD_L}" y2="{PAD_T + plot_h}" stroke="#999"/>',
        f'<text x="{PAD_L - 4}" y="{PAD_T + 4}" text-anchor="end">{fmt_bytes(peak)}</text>',
        f'<text x="{PAD_L - 4}" y="{PAD_T + plot_h}" text-anchor="end">0</text>',
    ]
    step = max(1, len(report.cycles) // 8)
    for c in report.cycles[::step] + [report.cycles[-1]]:  # the cycles' ends, as a clock from the start
        out.append(f'<text x="{x(c.end_s):.1f}" y="{HEIGHT - 12}" text-anchor="middle">{_clock(c.end_s)}</text>')
    for c in report.cycles:  # cycle boundaries
        out.append(f'<line x1="{x(c.start_s):.1f}" y1="{PAD_T}" x2="{x(c.start_s):.1f}" y2="{PAD_T + plot_h}" '
                   'stroke="#eee"/>')  # fmt: skip
    legend = []
    if memory is not None:
        pts = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in memory[1])
        out.append(f'<polyline fill="none" stroke="#222" stroke-width="1.5" points="{pts}"/>')
        legend.append((memory[0], "#222", False))
    for name, pts in runtime:
        line = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in pts)
        out.append(f'<polyline fill="none" stroke="#06c" stroke-width="1.5" points="{line}"/>')
        legend.append((name, "#06c", False))
    for fn, pts in stacks.items():
        color = _color(fn)
        out.append(f'<polyline fill="none" stroke="{color}" stroke-dasharray="4 3" points="'
                   + " ".join(f"{x(t):.1f},{y(b):.1f}" for t, b, _ in pts) + '"/>')  # fmt: skip
        for t, b, leaked in pts:
            fill = color if leaked else "white"
            tip = f"{fn}: {fmt_bytes(b)} outstanding at {_clock(t)}" + (", leaked" if leaked else "")
            out.append(f'<circle cx="{x(t):.1f}" cy="{y(b):.1f}" r="4" fill="{fill}" stroke="{color}">'
                       f"<title>{html.escape(tip)}</title></circle>")  # fmt: skip
        legend.append((fn, color, True))
        if fn in cumulated:
            pts_c = " ".join(f"{x(t):.1f},{y(b):.1f}" for t, b in cumulated[fn])
            out.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{pts_c}"/>')
            legend.append((f"{fn}, leaked so far", color, False))
    for i, (name, color, dots) in enumerate(legend):
        ly = PAD_T + 14 * i + 6
        out.append(f'<line x1="{WIDTH - PAD_R + 10}" y1="{ly}" x2="{WIDTH - PAD_R + 30}" y2="{ly}" stroke="{color}"'
                   + (' stroke-dasharray="4 3"' if dots else "") + "/>")  # fmt: skip
        out.append(f'<text x="{WIDTH - PAD_R + 34}" y="{ly + 4}">{html.escape(name[:28])}</text>')
    notes = ("dots: outstanding at a cycle's end", "of that cycle's trace; filled: leaked")
    for i, note in enumerate(notes):
        out.append(f'<text x="{WIDTH - PAD_R + 10}" y="{PAD_T + 14 * (len(legend) + i) + 12}">{note}</text>')
    out.append("</svg>\n")
    return "\n".join(out)


def _clock(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def _cumulated(points: list[tuple[float, int, bool]]) -> list[tuple[float, int]]:
    """A leaking stack's leaked bytes summed cycle after cycle (its bytes in the cycles that leaked)."""
    total, out = 0, []
    for t, b, leaked in points:
        total += b if leaked else 0
        out.append((t, total))
    return out


def _stack_points(report: Report) -> dict[str, list[tuple[float, int, bool]]]:
    """Per function (the heaviest over the window), its bytes at each cycle's end that recorded it."""
    totals: dict[str, int] = {}
    for c in report.cycles:
        for s in c.stacks:
            if s.function:
                totals[s.function] = totals.get(s.function, 0) + s.bytes
    top = sorted((fn for fn, n in totals.items() if n > 0), key=lambda fn: -totals[fn])[:MAX_FUNCTIONS]
    out: dict[str, list[tuple[float, int, bool]]] = {fn: [] for fn in top}
    for c in report.cycles:
        for s in c.stacks:
            if s.function in out:
                out[s.function].append((c.end_s, s.bytes, bool(s.leaked_count)))
    return out
