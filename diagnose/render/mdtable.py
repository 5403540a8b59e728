"""What every part of report.md is written with: its tables (each cell prose, a '|' in it escaped,
so nothing from outside ends a cell or a row early) and its moments (UTC)."""

from __future__ import annotations

import time

from .text import one_line, prose


def utc(ts: float | None) -> str:
    if ts is None:
        return "unknown"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    # one_line: a cell may quote a target's file or process name, and a newline would end the row
    out += ["| " + " | ".join(prose(one_line(cell)).replace("|", "\\|") for cell in row) + " |" for row in rows]
    return out
