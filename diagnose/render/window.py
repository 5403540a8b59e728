"""window.svg: a long window's curve — the target's memory over the whole window (the counters'
series, as the Trends table has them, and its runtime's own series, such as a live set after each
collection); per cycle, the bytes each allocation stack's trace in that cycle left outstanding at
the cycle's end (a dot, filled where nothing pointed at its blocks); and for a stack that leaked,
its leaked bytes summed cycle after cycle (a solid line: blocks nothing points at are never freed),
so a leak that grows in some phases and a cache that fills and levels are seen apart.
Self-contained SVG."""

from __future__ import annotations

import html
import zlib

from memdiag.system.units import fmt_bytes

from ..report import TARGET_SERIES, Report

WIDTH, HEIGHT, PAD_L, PAD_R, PAD_T, PAD_B = 1000, 360, 70, 200, 30, 40
MAX_FUNCTIONS = 5  # stacks drawn, the heaviest over the window first


def _color(name: str) -> str:
    h = zlib.crc32(name.encode())
    return f"hsl({h % 360},65%,40%)"


class _Scale:
    """Seconds into the window and bytes, to the plot's pixels."""

    def __init__(self, span: float, peak: float):
        self.span, self.peak = span, peak
        self.w, self.h = WIDTH - PAD_L - PAD_R, HEIGHT - PAD_T - PAD_B

    def x(self, t: float) -> float:
        return PAD_L + self.w * t / self.span

    def y(self, v: float) -> float:
        return PAD_T + self.h * (1 - v / self.peak)

    def line(self, pts) -> str:
        return " ".join(f"{self.x(t):.1f},{self.y(v):.1f}" for t, v in pts)


def render_window(report: Report) -> str:
    """The chart, or a one-line SVG saying there is none (a window watched in one go)."""
    title = f"memory over the window — {report.target.description}"
    memory = next(((n, report.counters.series[n]) for n in TARGET_SERIES if report.counters.series.get(n)), None)
    stacks = _stack_points(report)
    if not report.cycles or (memory is None and not stacks):
        return (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="40"><text x="10" y="25" '
            f'font-family="sans-serif" font-size="14">{html.escape(title)}: no cycles recorded</text></svg>\n'
        )
    span = max(report.window.ended - report.window.started, report.cycles[-1].end_s, 1.0)
    cumulated = {fn: _cumulated(pts) for fn, pts in stacks.items() if any(leaked for _, _, leaked in pts)}
    # what the target's runtime says it holds (its face's series, which it labels), drawn beside it
    runtime = [(n, report.counters.series[n]) for n in report.counters.labels if report.counters.series.get(n)]
    values = ([v for _, v in memory[1]] if memory else []) + [b for pts in stacks.values() for _, b, _ in pts]
    values += [v for _, pts in runtime for _, v in pts]
    values += [b for pts in cumulated.values() for _, b in pts]
    scale = _Scale(span, max([*values, 1.0]))
    out = _frame(report, title, scale)
    legend: list[tuple[str, str, bool]] = []
    for name, pts in ([memory] if memory is not None else []) + runtime:
        color = "#222" if name in TARGET_SERIES else "#06c"
        out.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{scale.line(pts)}"/>')
        legend.append((name, color, False))
    for fn, pts in stacks.items():
        out += _stack_marks(fn, pts, cumulated.get(fn), scale)
        legend.append((fn, _color(fn), True))
        if fn in cumulated:
            legend.append((f"{fn}, leaked so far", _color(fn), False))
    out += _legend(legend)
    out.append("</svg>\n")
    return "\n".join(out)


def _frame(report: Report, title: str, scale: _Scale) -> list[str]:
    """The title, the axes with their scale, the cycles' ends as a clock and their boundaries."""
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif" '
        'font-size="11">',
        f'<text x="{PAD_L}" y="18" font-size="14">{html.escape(title)}</text>',
        f'<line x1="{PAD_L}" y1="{PAD_T + scale.h}" x2="{PAD_L + scale.w}" y2="{PAD_T + scale.h}" stroke="#999"/>',
        f'<line x1="{PAD_L}" y1="{PAD_T}" x2="{PAD_L}" y2="{PAD_T + scale.h}" stroke="#999"/>',
        f'<text x="{PAD_L - 4}" y="{PAD_T + 4}" text-anchor="end">{fmt_bytes(scale.peak)}</text>',
        f'<text x="{PAD_L - 4}" y="{PAD_T + scale.h}" text-anchor="end">0</text>',
    ]
    step = max(1, len(report.cycles) // 8)
    for c in report.cycles[::step] + [report.cycles[-1]]:  # the cycles' ends, as a clock from the start
        out.append(f'<text x="{scale.x(c.end_s):.1f}" y="{HEIGHT - 12}" text-anchor="middle">{_clock(c.end_s)}</text>')
    for c in report.cycles:  # cycle boundaries
        out.append(f'<line x1="{scale.x(c.start_s):.1f}" y1="{PAD_T}" x2="{scale.x(c.start_s):.1f}" '
                   f'y2="{PAD_T + scale.h}" stroke="#eee"/>')  # fmt: skip
    return out


def _stack_marks(fn: str, pts, cumulated, scale: _Scale) -> list[str]:
    """One stack: its bytes at each cycle's end (dashed, a dot each, filled where leaked), and for a
    stack that leaked its leaked bytes summed so far (solid)."""
    color = _color(fn)
    out = [f'<polyline fill="none" stroke="{color}" stroke-dasharray="4 3" points="'
           + scale.line((t, b) for t, b, _ in pts) + '"/>']  # fmt: skip
    for t, b, leaked in pts:
        fill = color if leaked else "white"
        tip = f"{fn}: {fmt_bytes(b)} outstanding at {_clock(t)}" + (", leaked" if leaked else "")
        out.append(f'<circle cx="{scale.x(t):.1f}" cy="{scale.y(b):.1f}" r="4" fill="{fill}" stroke="{color}">'
                   f"<title>{html.escape(tip)}</title></circle>")  # fmt: skip
    if cumulated is not None:
        out.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{scale.line(cumulated)}"/>')
    return out


def _legend(legend: list[tuple[str, str, bool]]) -> list[str]:
    out = []
    for i, (name, color, dots) in enumerate(legend):
        ly = PAD_T + 14 * i + 6
        out.append(f'<line x1="{WIDTH - PAD_R + 10}" y1="{ly}" x2="{WIDTH - PAD_R + 30}" y2="{ly}" stroke="{color}"'
                   + (' stroke-dasharray="4 3"' if dots else "") + "/>")  # fmt: skip
        out.append(f'<text x="{WIDTH - PAD_R + 34}" y="{ly + 4}">{html.escape(name[:28])}</text>')
    notes = ("dots: outstanding at a cycle's end", "of that cycle's trace; filled: leaked")
    for i, note in enumerate(notes):
        out.append(f'<text x="{WIDTH - PAD_R + 10}" y="{PAD_T + 14 * (len(legend) + i) + 12}">{note}</text>')
    return out


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
