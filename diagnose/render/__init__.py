"""Renderers: each takes a Report and returns text (the pprof profiles: bytes). None of them reads /proc."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..report import Report

if TYPE_CHECKING:
    from ..serve.scene import Scene


def render_all(report: Report, scene: Scene | None = None) -> dict[str, str | bytes]:
    """Every file of a report folder, by name; scene: the flight recorder's account of the kill an
    incident's diagnosis follows (memdiag serve), charted in report.html."""
    # The renderers are imported when a report is written, not with the package (render.text is
    # imported at start): they and markdown-it-py are 2.3 MiB of memdiag's resident memory, measured,
    # which the diagnosis, the reachability scan included, then runs without.
    from .flamegraph import render_flamegraph
    from .html import render_html
    from .jsonout import render_json
    from .markdown import render_markdown
    from .pprof import render_pprof
    from .window import render_window

    md = render_markdown(report)
    files: dict[str, str | bytes] = {
        "report.md": md,
        "report.json": render_json(report),
        "report.html": render_html(report, md, scene),
        "growth.folded": "".join(f"{line}\n" for line in report.folded),
        "growth.svg": render_flamegraph(report.folded, title=f"memory growth — {report.target.description}"),
    }
    files |= render_pprof(report)  # the same stacks for go tool pprof, Pyroscope, speedscope
    if report.cycles:  # a long window's curve, beside the report and shown in it
        files["window.svg"] = render_window(report)
    return files
