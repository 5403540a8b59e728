"""report.json: the Report model as JSON (the same content as report.md)."""

from __future__ import annotations

from ..report import Report


def render_json(report: Report) -> str:
    return report.model_dump_json(indent=2) + "\n"
