"""report.html: one self-contained page to look at. The verdict first, coloured by its kind; a chart of
the target's memory over the window with its ledger's lines, its runtime's own series and the shown
stacks' outstanding bytes (uPlot); the probes' timeline (what ran when, what it cost); the growth
stacks as an interactive flame graph (d3-flame-graph: zoom, search, tooltips); then the Markdown
report, rendered by markdown-it-py, with a table of contents and its all-zero counter rows folded.

The libraries are vendored in assets/ (versions and licences in assets/README.md) and inlined: the
page fetches nothing, and its Content-Security-Policy lets it fetch nothing and run no script but
its own (by hash). The report's data enters as JSON in a <script type="application/json"> block,
escaped so no string of the target's (a frame, a comm) ends the block; everything else the target
names is HTML-escaped here, or set as text by the scripts."""

from __future__ import annotations

import base64
import hashlib
import html
import json
import math
import re
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from markdown_it import MarkdownIt
from markdown_it.token import Token
from memdiag.probes.frame import clone_label

from ..report import TARGET_SERIES, Report, StackReport
from .text import one_line

if TYPE_CHECKING:
    from ..serve.scene import Scene

ASSETS = Path(__file__).parent / "assets"
SCRIPTS = ("uPlot.iife.min.js", "d3-selection.min.js", "d3-flamegraph.min.js", "report.js")
STYLES = ("uPlot.min.css", "d3-flamegraph.css")
LEDGER_LINES = 6  # the ledger's lines drawn: those that moved most over the window
# what a folded line's number counts, by the probe that wrote growth.folded (else bytes)
FOLDED_UNITS = {"faults": "page faults", "fdstack": "descriptors"}

_STYLE = """
body{font:15px/1.5 system-ui,sans-serif;max-width:1200px;margin:1.5em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:2px 8px;text-align:left}
th{background:#f3f3f3}code{background:#f5f5f5;padding:0 3px}h1{font-size:1.5em;margin:.2em 0}
h2{border-bottom:1px solid #ddd}section{margin:1.5em 0}
.verdict{border-left:8px solid var(--c);background:var(--bg);padding:.6em 1em;border-radius:4px}
.verdict .kind{display:inline-block;background:var(--c);color:#fff;font-weight:bold;padding:0 .6em;border-radius:3px;
text-transform:uppercase;letter-spacing:.05em}.verdict p{margin:.4em 0}.verdict .summary{font-size:1.1em}
.k-leak{--c:#b3261e;--bg:#fdecea}.k-oom{--c:#7b1fa2;--bg:#f6e9f9}.k-growth{--c:#d35400;--bg:#fdf0e6}
.k-pressure{--c:#b7950b;--bg:#fcf8e3}.k-cache{--c:#1565c0;--bg:#e8f1fc}.k-healthy{--c:#2e7d32;--bg:#eaf5eb}
.k-inconclusive{--c:#616161;--bg:#f1f1f1}
nav.toc{columns:2;font-size:.9em;background:#fafafa;border:1px solid #eee;padding:.3em 1em}nav.toc ul{margin:0}
nav.toc li.h3{margin-left:1.2em}.note{color:#555;font-size:.9em}
.tl{width:100%}.tl td{vertical-align:middle}.tl .track{position:relative;height:14px;background:#f4f4f4;min-width:400px}
.tl .load{position:absolute;top:3px;height:8px;background:#bbb}
.tl .run{position:absolute;top:0;height:14px;background:#1565c0}
.tl .mark{position:absolute;top:-2px;width:3px;height:18px;background:#d35400}
#flame-controls input{width:22em}#flame-details{min-height:1.5em;font-size:.9em;color:#333}
details.quiet>summary{color:#555;cursor:pointer}
"""


@cache
def _asset(name: str) -> str:
    return (ASSETS / name).read_text(encoding="utf-8")


def json_for_script(value: object) -> str:
    """JSON a <script type="application/json"> block can hold whatever its strings are: no '<', '>'
    or '&' as such (so no '</script>' and no '<!--'), no raw line separators."""
    text = json.dumps(value, ensure_ascii=True, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


# --- the data the scripts draw -----------------------------------------------------------------


def _stack_label(s: StackReport) -> str:
    """A stack by its culprit frame (the first of the program's code), else its first frame."""
    at = s.frame_kinds.index("culprit") if "culprit" in s.frame_kinds else 0
    return one_line(s.frames[at]) if s.frames else s.probe


def chart_data(report: Report) -> tuple[dict | None, list[str]]:
    """uPlot's aligned data (x: seconds into the window; one values list per line, None where a line
    has no sample) and notes on what is not drawn and why."""
    c, notes = report.counters, []
    lines: list[tuple[str, str, list[tuple[float, float]]]] = []  # (label, kind, points)
    memory = next(((n, c.series[n]) for n in TARGET_SERIES if c.series.get(n)), None)
    if memory is not None:
        name, points = memory
        lines.append((c.labels.get(name, name.replace(".", " ").replace("rss", "RSS")), "total", points))
        # the ledger of the same total: its lines were read at the same samples as the series
        scope = "process" if name == "process.rss" else "cgroup"
        led = next((x for x in c.ledgers if x.scope == scope), None)
        times = [t for t, _ in points]
        if led is not None:
            rows = [r for r in led.rows if r.summed and r.series and any(r.series)]
            aligned = [r for r in rows if len(r.series) == len(times)]
            if len(aligned) < len(rows):
                notes.append(f"{len(rows) - len(aligned)} line(s) of the ledger missed samples: not drawn")
            aligned.sort(key=lambda r: -(max(r.series) - min(r.series)))
            for r in aligned[:LEDGER_LINES]:
                lines.append((f"ledger: {one_line(r.label)}", "ledger", list(zip(times, r.series, strict=True))))
            if len(aligned) > LEDGER_LINES:
                notes.append(f"the ledger's {len(aligned) - LEDGER_LINES} line(s) that moved least: not drawn")
    else:
        notes.append("the report has no series of the target's memory")
    for name, label in c.labels.items():  # the runtime's own series (JVM live set, Go in-use, V8 heap)
        if c.series.get(name):
            lines.append((one_line(label), "runtime", c.series[name]))
    lines += _stack_lines(report, notes)
    if not lines:
        return None, notes
    xs = sorted({round(t, 3) for _, _, pts in lines for t, _ in pts})
    at = {t: i for i, t in enumerate(xs)}
    series = []
    for label, kind, pts in lines:
        values: list[float | None] = [None] * len(xs)
        dropped = 0
        for t, v in pts:
            # a runtime's series is read from the target's memory: a NaN or an infinity there is
            # no point to draw, and JSON has no word for it (the page would be lost)
            finite = math.isfinite(v)
            values[at[round(t, 3)]] = v if finite else None
            dropped += not finite
        if dropped:
            notes.append(f"{label}: {dropped} sample(s) not a finite number: not drawn")
        series.append({"label": label, "kind": kind, "values": values})
    return {"x": xs, "series": series}, notes


def _stack_lines(report: Report, notes: list[str]) -> list[tuple[str, str, list[tuple[float, float]]]]:
    """Each shown stack's outstanding bytes, placed on the window's clock by its probe's attach."""
    rows = {p.name: p for p in report.probes}
    out = []
    for s in report.stacks:
        if not s.series:
            continue
        row = rows.get(s.probe)
        if not any(s.series):
            continue  # nothing outstanding at any sample: a line along zero says nothing
        if row is None or row.attached is None or len(s.series_s) != len(s.series):
            notes.append(f"{_stack_label(s)}: its series has no times on the window's clock: not drawn")
            continue
        t0 = row.attached - report.window.started
        points = [(t0 + t, float(v)) for t, v in zip(s.series_s, s.series, strict=True)]
        out.append((f"{_stack_label(s)} outstanding ({s.probe})", "stack", points))
    if not any(s.series for s in report.stacks):
        notes.append("no stack of the report has a series of outstanding bytes over time")
    return out


def flame_data(folded: list[str]) -> dict | None:
    """growth.folded as d3-flame-graph's tree: name, value (the frame's total), the number of
    stacks through it, children."""
    root: dict = {"name": "all", "value": 0, "stacks": 0, "c": {}}
    for line in folded:
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit() or not int(count):
            continue
        n = int(count)
        node = root
        node["value"] += n
        node["stacks"] += 1
        for frame in stack.split(";"):
            node = node["c"].setdefault(frame, {"name": one_line(frame), "value": 0, "stacks": 0, "c": {}})
            node["value"] += n
            node["stacks"] += 1
    if not root["value"]:
        return None

    def out(node: dict) -> dict:
        kids = sorted(node["c"].values(), key=lambda k: -k["value"])
        return {k: node[k] for k in ("name", "value", "stacks")} | {"children": [out(k) for k in kids]}

    return out(root)


def scene_data(scene: Scene) -> dict | None:
    """The flight recorder's samples before a kill (serve/scene.py) as uPlot's aligned data: the
    cgroup's usage and limit and the victim's RSS, x in seconds before the kill."""
    if not scene.usage_series and not scene.victim_series:
        return None
    xs = sorted({t for t, *_ in scene.usage_series} | {t for t, _ in scene.victim_series})
    at = {t: i for i, t in enumerate(xs)}
    usage: list[float | None] = [None] * len(xs)
    limit: list[float | None] = [None] * len(xs)
    rss: list[float | None] = [None] * len(xs)
    for t, u, lim in scene.usage_series:
        usage[at[t]], limit[at[t]] = u, lim
    for t, r in scene.victim_series:
        rss[at[t]] = r
    series = [{"label": "cgroup usage", "kind": "total", "values": usage}]
    if any(v is not None for v in limit):
        series.append({"label": "cgroup limit", "kind": "limit", "values": limit})
    if any(v is not None for v in rss):
        series.append({"label": "the victim's RSS", "kind": "ledger", "values": rss})
    return {"x": xs, "series": series, "xlabel": "seconds before the kill"}


# --- the page's parts in HTML ------------------------------------------------------------------


def _verdict(report: Report) -> str:
    v, e = report.verdict, html.escape
    cul = v.culprit
    lines = [f'<p class="summary">{e(one_line(v.summary))}</p>']
    if cul.function or cul.stack:
        who = f" in PID {cul.pid} ({e(one_line(cul.comm or ''))})" if cul.pid is not None else ""
        fn = cul.function or (cul.stack[0] if cul.stack else "")
        guess = " (a wrapper passed over from its code alone)" if cul.guessed else ""
        at = f" at <code>{e(one_line(cul.source))}</code>" if cul.source and cul.function else ""
        clone = f" ({e(clone_label(one_line(cul.clone)))})" if cul.clone and cul.function else ""
        lines.append(
            f'<p class="culprit">Culprit: <code id="culprit">{e(one_line(fn))}</code>{at}{clone}{who}{guess}</p>'
        )
    lines.append(
        f'<p class="note">confidence {v.confidence:.0%}' + (f"; rule {e(one_line(v.rule))}" if v.rule else "") + "</p>"
    )
    if report.interrupted is not None:
        lines.append(f'<p class="note">interrupted by {e(report.interrupted.signal)}: a partial report</p>')
    return (
        f'<section class="verdict k-{e(v.kind)}" id="verdict"><span class="kind">{e(v.kind)}</span>'
        + "".join(lines)
        + "</section>"
    )


def _timeline(report: Report) -> str:
    """The probes that ran, each a bar on the window's clock: loading (grey), then traced (blue),
    with the step that recorded its result (orange); its measured cost beside it."""
    t0 = report.window.started
    span = max(report.window.ended - t0, 1e-9)
    recorded = {t.name: t.at_s for t in report.trail if t.kind in ("probe", "scan") and t.state != "not-run"}
    rows, e = [], html.escape

    def pct(t: float) -> float:
        return max(0.0, min(100.0, 100.0 * t / span))

    for p in report.probes:
        if p.status in ("not-run", "unavailable") or (p.started is None and p.name not in recorded):
            continue
        bars, when = [], ""
        if p.started is not None:
            start = p.started - t0
            on = (p.attached - t0) if p.attached is not None else start
            run = p.duration_s or 0.0
            bars.append(f'<div class="load" style="left:{pct(start):.2f}%;width:{pct(on) - pct(start):.2f}%"></div>')
            bars.append(f'<div class="run" style="left:{pct(on):.2f}%;width:{pct(on + run) - pct(on):.2f}%"></div>')
            when = f"started {start:.1f} s, attached {on:.1f} s, traced {run:.1f} s"
        elif p.duration_s is not None:
            when = f"ran {p.duration_s:.2f} s"
        if p.name in recorded:
            bars.append(f'<div class="mark" style="left:{pct(recorded[p.name]):.2f}%"></div>')
            when += ("; " if when else "") + f"recorded at {recorded[p.name]:.1f} s"
        cost = f"{p.overhead_percent:.3f}%" if p.overhead_percent is not None else "not measured"
        tip = e(f"{p.name}: {when}; cost {cost} of a CPU over the window")
        rows.append(
            f'<tr><td>{e(p.name)}</td><td>{e(p.status)}</td><td class="track-cell"><div class="track" title="{tip}">'
            f"{''.join(bars)}</div></td><td>{e(when)}</td><td>{e(cost)}</td></tr>"
        )
    if not rows:
        return '<p class="note">No probe ran: the diagnosis read counters only.</p>'
    return (
        f'<table class="tl" id="probe-timeline"><tr><th>probe</th><th>status</th><th>0 s … {span:.0f} s of the window'
        "</th><th>when</th><th>measured cost (of one CPU over the window)</th></tr>" + "".join(rows) + "</table>"
        '<p class="note">grey: loading and aiming; blue: attached and tracing; orange: when its result was recorded '
        "(after its collection and any reachability scan).</p>"
    )


# --- the Markdown body ------------------------------------------------------------------------

_SPARK_MOVED = re.compile("[▂▃▄▅▆▇█]")


def _quiet_cell(text: str) -> bool:
    """A cell that says nothing: no figure but zero (or none), no sparkline that ever rose."""
    return not re.search(r"[1-9]", text) and not _SPARK_MOVED.search(text)


def _slug(text: str, used: set[str]) -> str:
    base = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "section"
    slug, n = base, 2
    while slug in used:
        slug, n = f"{base}-{n}", n + 1
    used.add(slug)
    return slug


def _rows(tokens: list[Token]) -> list[tuple[int, int]]:
    """(start, end) token indexes of each body row of one table's tokens."""
    out, start, body = [], None, False
    for i, t in enumerate(tokens):
        if t.type == "tbody_open":
            body = True
        elif t.type == "tr_open" and body:
            start = i
        elif t.type == "tr_close" and body and start is not None:
            out.append((start, i + 1))
    return out


def _fold_table(md: MarkdownIt, tokens: list[Token], env: dict) -> str:
    """One table; where it is a counters' table (first and last columns), its rows that are zero
    throughout are folded into a <details> below it (the whole table when all are)."""
    body = next((i for i, t in enumerate(tokens) if t.type == "tbody_open"), len(tokens))  # none: no rows
    header = [t.content.strip() for t in tokens[:body] if t.type == "inline"]
    rows = _rows(tokens)
    if not rows or not {"first", "last"} <= set(header):
        return md.renderer.render(tokens, md.options, env)
    quiet = []
    for a, b in rows:
        cells = [t.content for t in tokens[a:b] if t.type == "inline"]
        quiet.append(len(cells) > 1 and all(_quiet_cell(x) for x in cells[1:]))
    if not any(quiet):
        return md.renderer.render(tokens, md.options, env)
    head_end = rows[0][0]

    def table(keep: list[bool]) -> str:
        kept = [t for (a, b), k in zip(rows, keep, strict=True) if k for t in tokens[a:b]]
        return md.renderer.render(tokens[:head_end] + kept + tokens[rows[-1][1] :], md.options, env)

    n = sum(quiet)
    folded = f'<details class="quiet"><summary>{n} row(s) zero throughout</summary>{table(quiet)}</details>'
    return (table([not q for q in quiet]) if n < len(rows) else "") + folded


def render_body(markdown_text: str) -> tuple[str, list[tuple[int, str, str]], str]:
    """The Markdown as HTML (its title apart), its sections' headings with ids, and the title."""
    md = MarkdownIt("commonmark", {"html": False}).enable("table")
    env: dict = {}
    tokens = md.parse(markdown_text, env)
    toc, used, out, title = [], set(), [], ""
    i = 0
    while i < len(tokens):
        t = tokens[i]
        if t.type == "heading_open" and t.tag == "h1" and not title:
            title = md.renderer.render(tokens[i : i + 3], md.options, env)
            i += 3
            continue
        if t.type == "heading_open" and t.tag in ("h2", "h3"):
            text = tokens[i + 1].content
            t.attrSet("id", _slug(text, used))
            toc.append((int(t.tag[1]), str(t.attrGet("id")), text))
        if t.type == "table_open":
            end = next(j for j in range(i, len(tokens)) if tokens[j].type == "table_close") + 1
            out.append(_fold_table(md, tokens[i:end], env))
            i = end
            continue
        # a block's tokens: up to the next heading or table, rendered together
        j = i + 1
        while j < len(tokens) and tokens[j].type not in ("heading_open", "table_open"):
            j += 1
        out.append(md.renderer.render(tokens[i:j], md.options, env))
        i = j
    return "".join(out), toc, title


def _toc(entries: list[tuple[int, str, str]]) -> str:
    items = "".join(
        f'<li class="h{level}"><a href="#{e_id}">{html.escape(text)}</a></li>' for level, e_id, text in entries
    )
    return f'<nav class="toc" id="toc"><ul>{items}</ul></nav>'


# --- the page ---------------------------------------------------------------------------------


def _sha256(text: str) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode()


def _scene_part(scene: Scene | None, chart: dict | None) -> tuple[str, list[tuple[int, str, str]]]:
    """The section of a kill incident's page: what the flight recorder saw before the kill."""
    if scene is None:
        return "", []
    shown = '<div id="scene-chart"></div>' if chart is not None else '<p class="note">No samples kept.</p>'
    return (
        f'<section><h2 id="before-the-kill">Before the kill (the flight recorder)</h2>'
        f"<p>{html.escape(one_line(scene.text))}</p>{shown}</section>",
        [(2, "before-the-kill", "Before the kill (the flight recorder)")],
    )


def render_scene_page(title: str, summary: str, scene: Scene) -> str:
    """The page of a kill incident that ran no diagnosis (memdiag serve: nothing ran in the cgroup
    after the kill, or the queue was full): its summary and what the flight recorder saw before it."""
    e = html.escape
    scene_chart = scene_data(scene)
    scene_html, _toc_entries = _scene_part(scene, scene_chart)
    data = {"chart": None, "scene": scene_chart, "flame": None, "unit": "bytes"}
    scripts = [_asset(n) for n in SCRIPTS]
    csp = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src " + " ".join(
        f"'{_sha256(s)}'" for s in scripts
    )
    return "".join(
        [
            '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">',
            f'<meta http-equiv="Content-Security-Policy" content="{e(csp)}">',
            f"<title>{e(one_line(title))}</title>",
            f"<style>{_STYLE}{''.join(_asset(n) for n in STYLES)}</style></head><body>\n",
            f"<h1>{e(one_line(title))}</h1>",
            '<section class="verdict k-oom" id="verdict"><span class="kind">oom</span>'
            f'<p class="summary">{e(one_line(summary))}</p></section>',
            scene_html,
            f'<script type="application/json" id="memdiag-data">{json_for_script(data)}</script>\n',
            *(f"<script>{s}</script>\n" for s in scripts),
            "</body></html>\n",
        ]
    )


def render_html(report: Report, markdown_text: str, scene: Scene | None = None) -> str:
    """The page of a report whose Markdown is markdown_text; scene: the flight recorder's account of
    the OOM kill an incident's diagnosis followed (memdiag serve), charted first."""
    e = html.escape
    body, toc, title_h1 = render_body(markdown_text)
    chart, chart_notes = chart_data(report)
    flame = flame_data(report.folded)
    probe = report.stacks[0].probe if report.stacks else ""
    scene_chart = scene_data(scene) if scene is not None else None
    scene_html, scene_toc = _scene_part(scene, scene_chart)
    data = {"chart": chart, "scene": scene_chart, "flame": flame, "unit": FOLDED_UNITS.get(probe, "bytes")}
    scripts = [_asset(n) for n in SCRIPTS]
    csp = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src " + " ".join(
        f"'{_sha256(s)}'" for s in scripts
    )
    title = f"memdiag: {report.verdict.kind} — {report.target.description}"
    window_s = report.window.ended - report.window.started
    notes = "".join(f"<li>{e(n)}</li>" for n in chart_notes)
    chart_part = (
        '<div id="memory-chart"></div>' if chart is not None else '<p class="note">Nothing to draw over the window.</p>'
    )
    flame_part = (
        '<div id="flame-controls"><input id="flame-search" type="search" placeholder="search a function">'
        ' <button id="flame-reset" type="button">reset zoom</button></div><div id="flame-details"></div>'
        '<div id="flame-graph"></div>'
        f'<p class="note">From growth.folded ({e(probe)}): a frame\'s width is its {e(data["unit"])}; '
        "click a frame to zoom.</p>"
        if flame is not None
        else '<p class="note">No growth stacks were recorded.</p>'
    )
    parts = [
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{e(csp)}">',
        f"<title>{e(one_line(title))}</title>",
        f"<style>{_STYLE}{''.join(_asset(n) for n in STYLES)}</style></head><body>\n",
        title_h1 or f"<h1>{e(one_line(title))}</h1>",
        _verdict(report),
        _toc(
            [
                *scene_toc,
                (2, "memory-over-time", "Memory over the window"),
                (2, "probes-timeline", "Probes' timeline"),
                (2, "growth-stacks", "Growth stacks"),
                *toc,
            ]
        ),
        scene_html,
        f'<section><h2 id="memory-over-time">Memory over the window ({window_s:.0f} s)</h2>{chart_part}'
        f'<ul class="note">{notes}</ul></section>',
        f'<section><h2 id="probes-timeline">Probes\' timeline</h2>{_timeline(report)}</section>',
        f'<section><h2 id="growth-stacks">Growth stacks</h2>{flame_part}</section>',
        f'<section id="report-body">{body}</section>',
        f'<script type="application/json" id="memdiag-data">{json_for_script(data)}</script>\n',
        *(f"<script>{s}</script>\n" for s in scripts),
        "</body></html>\n",
    ]
    return "".join(parts)
