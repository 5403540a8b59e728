"""report.json: the Report model as JSON (the same content as report.md)."""

from __future__ import annotations

from ..report import Report
from .text import json_text


def render_json(report: Report) -> str:
    # the same values, with control and format characters (bidi overrides) as \\u escapes: a viewer
    # of the file shows no text reordered by a target's comm or arguments
    return json_text(report.model_dump_json(indent=2)) + "\n"
